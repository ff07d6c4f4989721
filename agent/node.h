/* SPDX-License-Identifier: MIT */
/* Owns the Node: what the agent knows and holds about this host that the stages, health, metrics, the
 * MIG manager and the driver unload share (event loop, config, inventory, NVML snapshot, stage results,
 * the driver's and the fabric's handles in flight, …), and NodeOps, the few services they may ask of the
 * engine above them. The Manager (manager.h) embeds the Node and fills in the ops; nothing here includes
 * manager.h, so the stages and the rest sit below the manager and out of its include cycle (tests/layers,
 * docs/HACKING.md "Layers"). */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <systemd/sd-bus.h>
#include <systemd/sd-event.h>

#include "config.h"
#include "gpu-nvml-worker.h"
#include "gpu-nvml.h"
#include "label.h"
#include "probe.h"
#include "stage.h"

/* The names under which the node is published on D-Bus (by the bus layer; a stage names a property
 * that changed with node_mark_dirty()). */
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

const char *agent_state_to_string(AgentState s);
AgentState agent_state_from_string(const char *s);

typedef struct Node Node;

/* What the code below the manager may ask of it, filled in by manager.c (manager_node_ops). Call them
 * through the node_*() wrappers below. */
typedef struct NodeOps {
        /* Finishes a stage whose handler returned STAGE_RUNNING (it works from its own event sources, e.g.
         * a DKMS build): r as a handler's return value (STAGE_DONE, STAGE_SKIPPED or a negative errno). */
        void (*stage_complete)(Node *n, StageId id, int r, const char *message);
        /* A running stage's progress ("building nvidia 550.54.15 for 6.1.0-27-amd64: 2m10s"): STATUS= and
         * the Stages property, no state change. */
        void (*stage_progress)(Node *n, StageId id, const char *text);
        /* Asks for a full pass of the stages (coalesced; runs from the event loop). */
        void (*request_pass)(Node *n, const char *reason);
        /* D-Bus: a property changed (path NULL = the manager object; one PropertiesChanged per object and
         * interface per event loop iteration), the GPU list changed (old may be NULL), the NVML snapshot
         * changed (old and n->nvml_snapshot may be NULL). No-ops without a bus. */
        void (*mark_dirty)(Node *n, const char *path, const char *interface, const char *property);
        void (*gpus_changed)(Node *n, const Inventory *old);
        void (*nvml_changed)(Node *n, const NvmlSnapshot *old);
        /* The NVML workers (the nvml stage's, stage-table.h): kill them, or read through the MIG reader. */
        void (*nvml_stop)(Node *n, const char *why);
        int (*nvml_read_async)(Node *n, char *const *addresses, GpuNvmlJobFunc fn, GpuNvmlJobDone done,
                               void *userdata, char **ret_error);
        int (*nvml_read_input_async)(Node *n, const void *input, size_t len, GpuNvmlJobFunc fn,
                                     GpuNvmlJobDone done, void *userdata, char **ret_error);
        /* Re-writes the node_exporter textfile now (metrics.c): health counters changed. */
        void (*metrics_update)(Node *n);
        /* Writes the feature file now, outside a pass (the labels stage): a MIG apply began. */
        void (*labels_write_now)(Node *n);
        /* Whether we are taking the driver out, or hold it out (Unload(), a when-idle reload): no NVML
         * process may start meanwhile — it would open /dev/nvidia* and make the kernel refuse the removal. */
        bool (*driver_removing)(Node *n);
} NodeOps;

struct Node {
        const NodeOps *ops;              /* never NULL once the Manager is made */
        sd_event *event;
        sd_bus *bus;                     /* NULL with --oneshot */
        bool oneshot;                    /* --oneshot: one pass without D-Bus */

        Config *config;
        char *kernel_release;
        Inventory *inventory;            /* last successful probe, NULL before */
        struct GpuNvmlWorker *nvml_worker; /* the process that runs NVML for the nvml stage (gpu-nvml-worker.h) */
        struct MigProfileCache *mig_profiles; /* <paths.state>/mig-profiles as loaded for the MIG reader's fork */
        struct GpuNvmlWorker *nvml_reader; /* the MIG reads (before planning, after a change), a worker of
                                          * their own (stage-nvml.c); the daemon never loads NVML itself */
        void (*refresh_cb)(Node *n, int r, const char *error, void *userdata);
        void *refresh_userdata;          /* stage_nvml_refresh_async() in flight */
        NvmlSnapshot *nvml_snapshot;     /* last successful read, NULL while NVML is unavailable */
        char *cdi_spec_text;             /* last CDI spec written (or found current), NULL none */
        struct CdiMigMinorsCache *cdi_minors; /* the parsed mig-minors table, kept while the file is unchanged */
        char *devices_mig;               /* the MIG devices whose capability nodes the last successful devices
                                          * refresh made ("minor:gi:ci …"), NULL none yet (stage-devices.c) */

        /* Driver lifecycle (stage-driver.c, stage-devices.c, stage-fabric.c). */
        struct ModuleContext *module_ctx;/* libkmod for the running kernel, created on first use */
        struct DriverStage *driver_stage; /* the driver stage's own state (stage-driver.c), NULL before it ran */
        char *dkms_state;                /* DkmsState property: "idle", "building …", "failed: …", "built …" */
        bool driver_admin_unloaded;      /* nvidia was removed outside the agent: do not load it back */
        bool driver_was_live;            /* the driver stage last saw the core modules live */
        char **module_rows;              /* Modules property: "name\tstate\tdetail" per module, in load order */
        struct FabricOp *fabric_op;      /* a unit start in flight */
        struct FabricOp *imex_op;        /* nvidia-imex query/start of the consumers stage in flight */
        char **started_units;            /* units we started (stopped again by Unload()) */
        struct DriverUnload *unload;     /* Unload() in flight or done and holding (driver-unload.c) */

        /* MIG management (agent/mig/, stage-mig.c). */
        struct MigManager *mig;          /* owned by agent/mig; NULL until the mig stage first runs */
        char *kube_mig_config;           /* the node's nvidia.com/mig.config, NULL unset or not yet read
                                          * (mig.selected-from: node-label; manager-kube.c) */
        char *kube_mig_config_refused;   /* set instead: a value that is not a valid label value, printable */
        bool kube_mig_config_read;       /* the watch has reported the label (set, unset or refused) */
        LabelSet *labels;                /* last written label set, NULL when none */
        LabelKnownProduct *known_products; /* NVML's last product name per GPU (gpu-products.c) */
        size_t n_known_products;
        bool known_products_loaded;      /* read from the state directory (or found missing) */
        sd_event_source *refresh_timer;  /* re-writes the feature file before its expiry (stage-labels.c) */
        uint64_t labels_expiry_usec;     /* expiry written with them (CLOCK_REALTIME), 0 none */
        uint64_t labels_timestamp_sec;   /* gfd.timestamp: set at start-up and on each reload */
        struct Health *health;           /* GPU health (health.c): event worker, checks, per-GPU faults */
        struct Metrics *metrics;         /* the node_exporter textfile (metrics.c) */

        /* The passes, as the engine (manager-stage.c) runs them; read here, written there. */
        StageResult stages[_STAGE_MAX];
        StageId current_stage;           /* running, or _STAGE_INVALID between passes */
        bool first_pass_done;
        AgentState state;
        uint64_t n_passes;
};

static inline void node_stage_complete(Node *n, StageId id, int r, const char *message) {
        n->ops->stage_complete(n, id, r, message);
}

static inline void node_stage_progress(Node *n, StageId id, const char *text) {
        n->ops->stage_progress(n, id, text);
}

static inline void node_request_pass(Node *n, const char *reason) {
        n->ops->request_pass(n, reason);
}

static inline void node_mark_dirty(Node *n, const char *path, const char *interface, const char *property) {
        n->ops->mark_dirty(n, path, interface, property);
}

static inline void node_gpus_changed(Node *n, const Inventory *old) {
        n->ops->gpus_changed(n, old);
}

static inline void node_nvml_changed(Node *n, const NvmlSnapshot *old) {
        n->ops->nvml_changed(n, old);
}

/* Kills the NVML workers (their handles keep /dev/nvidia* open too); an nvml stage or a MIG read waiting
 * for one is answered with -ECANCELED and why. */
static inline void node_nvml_stop(Node *n, const char *why) {
        n->ops->nvml_stop(n, why);
}

/* Reads through fn (a GpuNvmlJobFunc of this program; its userdata is addresses) on the MIG reader, the
 * long-lived NVML worker of the MIG code: done is called from the loop. -ENODEV with a sentence while the
 * nvml stage has not found NVML answering, -EBUSY while a read is in flight. */
static inline int node_nvml_read_async(Node *n, char *const *addresses, GpuNvmlJobFunc fn, GpuNvmlJobDone done,
                                       void *userdata, char **ret_error) {
        return n->ops->nvml_read_async(n, addresses, fn, done, userdata, ret_error);
}

/* The same with input bytes for fn (gpu_nvml_worker_read_input()): the MIG steps of an apply. */
static inline int node_nvml_read_input_async(Node *n, const void *input, size_t len, GpuNvmlJobFunc fn,
                                             GpuNvmlJobDone done, void *userdata, char **ret_error) {
        return n->ops->nvml_read_input_async(n, input, len, fn, done, userdata, ret_error);
}

static inline void node_metrics_update(Node *n) {
        n->ops->metrics_update(n);
}

static inline void node_labels_write_now(Node *n) {
        n->ops->labels_write_now(n);
}

static inline bool node_driver_removing(Node *n) {
        return n->ops->driver_removing(n);
}

#define NODE_DRIVER_REMOVING_MESSAGE \
        "The NVIDIA driver is being removed (Unload() or a when-idle reload); the MIG layout can be read again " \
        "once the driver stage has loaded it."
