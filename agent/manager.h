/* SPDX-License-Identifier: MIT */
/* Owns the Manager: the top of the daemon, the one object that holds every long-lived handle. It embeds
 * the Node (node.h: event loop, bus, config, inventory, NVML snapshot, stage results, … — what the stages
 * share) and fills in its ops; the rest is the engine's own: the pass scheduling, signals, the device
 * monitor, reload, the remote configuration, the Kubernetes node watch. */
#pragma once

#include <stdbool.h>
#include <systemd/sd-bus.h>
#include <systemd/sd-device.h>
#include <systemd/sd-event.h>

#include "node.h"
#include "stage-table.h"

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
        Node node;                       /* what the stages see (node.h); its event and bus are ours */
        sd_device_monitor *monitor;
        sd_event_source *sig_term, *sig_int, *sig_hup;
        sd_event_source *stage_source;   /* defer: runs the next stage of the pass */
        sd_event_source *retry_timer;    /* re-runs the pass after a failure, with backoff */
        sd_event_source *settle_timer;   /* coalesces device events into one pass */
        sd_event_source *coalesce_timer; /* a pass requested right after one ended: starts it later */
        uint64_t last_pass_end_usec;     /* CLOCK_MONOTONIC */
        /* AssertMigConfig/ExportMigConfig by unprivileged callers read NVML: at most
         * BUS_MIG_UNPRIVILEGED_BURST of them per BUS_MIG_UNPRIVILEGED_WINDOW_USEC (bus-mig.c). */
        uint64_t mig_read_window_usec;
        unsigned mig_read_count;
        BusDirty *bus_dirty;             /* owned by bus-util.c */

        ManagerOptions options;
        char *config_error;              /* why the last load/reload failed, NULL if it did not */

        /* Remote configuration (manager-remote.c, config-remote.c). */
        struct ConfigRemoteFetcher *remote_fetcher;
        sd_event_source *remote_timer;   /* the next fetch */
        char *remote_url;                /* config.remote.url expanded, NULL when not configured */
        struct ConfigRemoteCache *remote_cache; /* the last good document, NULL none */
        bool remote_reloading;           /* the reload in progress was caused by a new document */
        bool config_error_remote;        /* config_error is about the remote document */

        /* mig.selected-from: node-label (manager-kube.c, kube-node.c); the value is node.kube_mig_config. */
        struct KubeNode *kube;

        StageId next_stage;              /* the one the stage source runs next */
        bool pass_active;
        bool pass_again;                 /* a pass was requested while one ran */
        bool pass_again_coalesced;       /* … by manager_request_pass_coalesced() only */
        unsigned retry_attempt;
        int exit_code;
} Manager;

/* The Manager of a Node (every Node is a Manager's). */
static inline Manager *manager_from_node(Node *n) {
        return (Manager *) ((char *) n - offsetof(Manager, node));
}

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

/* Name of the Stage property: "starting", the running stage's name, or "ready" between passes. */
const char *manager_stage_name(const Manager *m);
bool manager_is_ready(const Manager *m);


/* Through options.bus (no-ops without it): a property changed (path NULL = the manager object; one
 * PropertiesChanged per object and interface per event loop iteration), the GPU list changed (old may be
 * NULL), the NVML snapshot changed (old and m->node.nvml_snapshot may be NULL), a stage changed state.
 * The code below the manager calls them as node_mark_dirty() and so on (node.h). */
void manager_mark_dirty(Manager *m, const char *path, const char *interface, const char *property);
void manager_gpus_changed(Manager *m, const Inventory *old);
void manager_nvml_changed(Manager *m, const NvmlSnapshot *old);
void manager_stage_changed(Manager *m, StageId id);
