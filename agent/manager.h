/* SPDX-License-Identifier: MIT */
/* Owns the Manager: the one object that holds every long-lived handle (event loop, bus, device
 * monitor, config, inventory, labels, stage results) and the stage engine's state. */
#pragma once

#include <stdbool.h>
#include <systemd/sd-bus.h>
#include <systemd/sd-device.h>
#include <systemd/sd-event.h>

#include "config.h"
#include "gpu-nvml-worker.h"
#include "gpu-nvml.h"
#include "label.h"
#include "probe.h"
#include "stage.h"

#define AGENT_BUS_NAME "org.gpunodeagent.Agent1"
#define AGENT_OBJECT_PATH "/org/gpunodeagent/Agent1"
#define AGENT_GPU_PATH_PREFIX "/org/gpunodeagent/Agent1/gpu"
#define AGENT_MANAGER_INTERFACE "org.gpunodeagent.Agent1.Manager"
#define AGENT_GPU_INTERFACE "org.gpunodeagent.Agent1.Gpu"

/* Overall state, also the gpu-node-agent.state label. */
typedef enum AgentState {
        AGENT_STARTING,  /* first pass not finished */
        AGENT_READY,     /* every stage done or skipped */
        AGENT_DEGRADED,  /* a stage failed, the node is partly usable */
        AGENT_FAILED,    /* probe failed: nothing is known about the node */
        _AGENT_STATE_MAX,
        _AGENT_STATE_INVALID = -EINVAL,
} AgentState;

typedef struct BusDirty BusDirty;
struct Manager;

/* The bus layer's side of the Manager (bus.h: manager_bus_ops, given by main.c). The manager, its
 * stages, health and the driver unload reach D-Bus only through it, with manager_mark_dirty() and the
 * others below, so that only bus-*.c (and main.c) include bus.h and the bus stays out of the include
 * cycles of agent/ (tests/layers). */
typedef struct ManagerBusOps {
        int (*connect)(struct Manager *m);
        void (*disconnect)(struct Manager *m);
        void (*mark_dirty)(struct Manager *m, const char *path, const char *interface, const char *property);
        void (*gpus_changed)(struct Manager *m, const Inventory *old);
        void (*nvml_changed)(struct Manager *m, const NvmlSnapshot *old);
        void (*stage_changed)(struct Manager *m, StageId id);
} ManagerBusOps;

typedef struct ManagerOptions {
        ConfigLoadOptions config;  /* strings owned by the caller, must outlive the Manager */
        bool oneshot;              /* run the stages once without D-Bus, then exit */
        int log_level;             /* --log-level, or -1 to take log.level from the config */
        const ManagerBusOps *bus;  /* NULL: no D-Bus (the unit tests' managers) */
} ManagerOptions;

typedef struct Manager {
        sd_event *event;
        sd_bus *bus;                     /* NULL with --oneshot */
        sd_device_monitor *monitor;
        sd_event_source *sig_term, *sig_int, *sig_hup;
        sd_event_source *stage_source;   /* defer: runs the next stage of the pass */
        sd_event_source *retry_timer;    /* re-runs the pass after a failure, with backoff */
        sd_event_source *refresh_timer;  /* re-writes the feature file before its expiry */
        sd_event_source *settle_timer;   /* coalesces device events into one pass */
        sd_event_source *coalesce_timer; /* a pass requested right after one ended: starts it later */
        uint64_t last_pass_end_usec;     /* CLOCK_MONOTONIC */
        /* AssertMigConfig/ExportMigConfig by unprivileged callers read NVML: at most
         * BUS_MIG_UNPRIVILEGED_BURST of them per BUS_MIG_UNPRIVILEGED_WINDOW_USEC (bus-mig.c). */
        uint64_t mig_read_window_usec;
        unsigned mig_read_count;
        BusDirty *bus_dirty;             /* owned by bus-util.c */

        ManagerOptions options;
        Config *config;
        char *config_error;              /* why the last load/reload failed, NULL if it did not */

        Inventory *inventory;            /* last successful probe, NULL before */
        struct GpuNvmlWorker *nvml_worker; /* the process that runs NVML for the nvml stage (gpu-nvml-worker.h) */
        struct MigProfileCache *mig_profiles; /* <paths.state>/mig-profiles as loaded for the MIG reader's fork */
        struct GpuNvmlWorker *nvml_reader; /* the MIG reads (before planning, after a change), a worker of
                                          * their own (stage-nvml.c); the daemon never loads NVML itself */
        void (*refresh_cb)(struct Manager *m, int r, const char *error, void *userdata);
        void *refresh_userdata;          /* manager_nvml_refresh_async() in flight */
        NvmlSnapshot *nvml_snapshot;     /* last successful read, NULL while NVML is unavailable */
        char *cdi_spec_text;             /* last CDI spec written (or found current), NULL none */
        struct CdiMigMinorsCache *cdi_minors; /* the parsed mig-minors table, kept while the file is unchanged */
        char *devices_mig;               /* the MIG devices whose capability nodes the last successful devices
                                          * refresh made ("minor:gi:ci …"), NULL none yet (stage-devices.c) */

        /* Driver lifecycle (stage-driver.c, stage-devices.c, stage-fabric.c). */
        struct ModuleContext *module_ctx;/* libkmod for the running kernel, created on first use */
        struct DkmsRun *dkms_run;        /* a DKMS build in flight, NULL otherwise */
        struct ModuleLoadJob *module_load; /* module inserts in flight in a child process (stage-driver.c) */
        struct ModuleChild *peermem_insert; /* nvidia-peermem's insert in flight in a child (stage-driver.c) */
        struct DriverRelease *reload_release; /* a when-idle reload waiting for our NVML processes (stage-driver.c) */
        struct ModuleChild *reload_removal; /* a when-idle reload's removal of the old modules in a child */
        char *dkms_state;                /* DkmsState property: "idle", "building …", "failed: …", "built …" */
        char *dkms_failed_fingerprint;   /* dkms_fingerprint() when the last build failed, NULL otherwise */
        char *dkms_failed_message;       /* … and what it said, for retries that do not run it again */
        int dkms_failed_error;
        bool driver_admin_unloaded;      /* nvidia was removed outside the agent: do not load it back */
        bool driver_was_live;            /* the driver stage last saw the core modules live */
        char **module_rows;              /* Modules property: "name\tstate\tdetail" per module, in load order */
        struct FabricOp *fabric_op;      /* a unit start in flight */
        struct FabricOp *imex_op;        /* nvidia-imex query/start of the consumers stage in flight */
        char **started_units;            /* units we started (stopped again by Unload()) */
        struct DriverUnload *unload;     /* Unload() in flight or done and holding (driver-unload.c) */

        /* MIG management (agent/mig/, stage-mig.c). */
        struct MigManager *mig;          /* owned by agent/mig; NULL until the mig stage first runs */
        LabelSet *labels;                /* last written label set, NULL when none */
        LabelKnownProduct *known_products; /* NVML's last product name per GPU (gpu-products.c) */
        size_t n_known_products;
        bool known_products_loaded;      /* read from the state directory (or found missing) */
        struct Health *health;           /* GPU health (health.c): event worker, checks, per-GPU faults */
        struct Metrics *metrics;         /* the node_exporter textfile (metrics.c) */

        /* Remote configuration (manager-remote.c, config-remote.c). */
        struct ConfigRemoteFetcher *remote_fetcher;
        sd_event_source *remote_timer;   /* the next fetch */
        char *remote_url;                /* config.remote.url expanded, NULL when not configured */
        struct ConfigRemoteCache *remote_cache; /* the last good document, NULL none */
        bool remote_reloading;           /* the reload in progress was caused by a new document */
        bool config_error_remote;        /* config_error is about the remote document */

        /* mig.selected-from: node-label (manager-kube.c, kube-node.c). */
        struct KubeNode *kube;
        char *kube_mig_config;           /* the node's nvidia.com/mig.config, NULL unset or not yet read */

        uint64_t labels_expiry_usec;     /* expiry written with them (CLOCK_REALTIME), 0 none */
        uint64_t labels_timestamp_sec;   /* gfd.timestamp: set at start-up and on each reload */
        char *kernel_release;

        StageResult stages[_STAGE_MAX];
        StageId current_stage;           /* running, or _STAGE_INVALID between passes */
        StageId next_stage;              /* the one the stage source runs next */
        bool pass_active;
        bool pass_again;                 /* a pass was requested while one ran */
        bool pass_again_coalesced;       /* … by manager_request_pass_coalesced() only */
        bool first_pass_done;
        AgentState state;
        unsigned retry_attempt;
        uint64_t n_passes;
        int exit_code;
} Manager;

#define MANAGER_PASS_MIN_INTERVAL_USEC (500 * USEC_PER_MSEC)

int manager_new(const ManagerOptions *o, Manager **ret);
Manager *manager_free(Manager *m);
DEFINE_CLEANUP_FUNC(Manager *, manager_free);

/* Loads the config, connects the bus (unless oneshot), installs signal handlers and the device
 * monitor, and schedules the first pass. */
int manager_startup(Manager *m);
/* Runs the event loop until SIGTERM/SIGINT (or, oneshot, the first pass); returns the exit code. */
int manager_run(Manager *m);

/* Asks for a full pass of the stages (coalesced; runs from the event loop). One asked for while a pass
 * runs is queued (one, however many ask). */
void manager_request_pass(Manager *m, const char *reason);
/* The same for requests anyone may repeat at will (Reconcile()): one asked for within
 * MANAGER_PASS_MIN_INTERVAL_USEC of the end of the last pass starts at that interval, together with
 * everything asked for meanwhile: 1000 Reconcile() calls in a row cost a handful of passes. */
void manager_request_pass_coalesced(Manager *m, const char *reason);

/* Reloads the configuration transactionally: on success swaps it in and requests a pass; on failure
 * keeps the old one, stores the error in config_error (visible on D-Bus) and returns it. */
int manager_reload(Manager *m, char **ret_error);

/* Loads the configuration as config_load() does, with the last good remote document (config.remote)
 * merged in when there is one for the configured URL (manager-remote.c). */
int manager_config_load(Manager *m, Config **ret, char **ret_error);
/* After the configuration was (re)loaded: starts, re-targets or stops fetching the remote document. */
void manager_remote_update(Manager *m);
void manager_remote_done(Manager *m);
/* After the configuration was (re)loaded: starts or stops the Kubernetes node watch. */
void manager_kube_update(Manager *m);

/* The one stage transition function (STYLE.md rule 11). */
void manager_set_stage(Manager *m, StageId id, StageState state, int error, const char *message);

/* Finishes a stage whose handler returned STAGE_RUNNING (it works from its own event sources, e.g. a
 * DKMS build): r as a handler's return value (STAGE_DONE, STAGE_SKIPPED or a negative errno). */
void manager_stage_complete(Manager *m, StageId id, int r, const char *message);

/* A running stage's progress ("building nvidia 550.54.15 for 6.1.0-27-amd64: 2m10s"): STATUS= and the
 * Stages property, no state change. */
void manager_stage_progress(Manager *m, StageId id, const char *text);

/* Kills the NVML workers (their handles keep /dev/nvidia* open too); an nvml stage or a MIG read waiting
 * for one is answered with -ECANCELED and why. */
void manager_nvml_stop(Manager *m, const char *why);

/* Reads through fn (a GpuNvmlJobFunc of this program; its userdata is addresses) on the MIG reader, the
 * long-lived NVML worker of the MIG code: done is called from the loop. -ENODEV with a sentence while the
 * nvml stage has not found NVML answering, -EBUSY while a read is in flight. */
int manager_nvml_read_async(Manager *m, char *const *addresses, GpuNvmlJobFunc fn, GpuNvmlJobDone done,
                            void *userdata, char **ret_error);
/* The same with input bytes for fn (gpu_nvml_worker_read_input()): the MIG steps of an apply. */
int manager_nvml_read_input_async(Manager *m, const void *input, size_t len, GpuNvmlJobFunc fn, GpuNvmlJobDone done,
                                  void *userdata, char **ret_error);

/* Re-reads, on the MIG reader after a MIG change, only the GPUs a MIG write changed (pci_addresses; NULL:
 * every GPU) — a MIG write changes nothing else — and publishes the snapshot with them replaced (D-Bus,
 * m->nvml_snapshot; on failure NVML counts as unavailable until the next nvml stage); then cb (from the
 * loop) with the result. With mig_devices (the apply's jobs read every changed GPU's MIG mode and
 * devices right after their steps) nothing is read: those are put into the snapshot and cb is called
 * before this returns. Errors to start as manager_nvml_read_async(). */
typedef void (*ManagerRefreshDone)(Manager *m, int r, const char *error, void *userdata);
int manager_nvml_refresh_async(Manager *m, char *const *pci_addresses, const NvmlSnapshot *mig_devices,
                               ManagerRefreshDone cb, void *userdata,
                               char **ret_error);

/* Name of the Stage property: "starting", the running stage's name, or "ready" between passes. */
const char *manager_stage_name(const Manager *m);
bool manager_is_ready(const Manager *m);

/* Cancels the consumers stage's unit operation (stage-consumers.c). */
void manager_consumers_done(Manager *m);

const char *agent_state_to_string(AgentState s);

/* Through options.bus (no-ops without it): a property changed (path NULL = the manager object; one
 * PropertiesChanged per object and interface per event loop iteration), the GPU list changed (old may be
 * NULL), the NVML snapshot changed (old and m->nvml_snapshot may be NULL), a stage changed state. */
void manager_mark_dirty(Manager *m, const char *path, const char *interface, const char *property);
void manager_gpus_changed(Manager *m, const Inventory *old);
void manager_nvml_changed(Manager *m, const NvmlSnapshot *old);
void manager_stage_changed(Manager *m, StageId id);
AgentState agent_state_from_string(const char *s);
