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

#include "manager-bus.h"
#include "node.h"
#include "stage-table.h"

typedef struct ManagerOptions {
        ConfigLoadOptions config;  /* strings owned by the caller, must outlive the Manager */
        bool oneshot;              /* run the stages once without D-Bus, then exit */
        int log_level;             /* --log-level, or -1 to take log.level from the config */
        const ManagerBusOps *bus;  /* NULL: no D-Bus (the unit tests' managers) */
} ManagerOptions;

struct Manager {
        Node node;                       /* what the stages see (node.h); its event and bus are ours */
        sd_device_monitor *monitor;
        sd_event_source *sig_term, *sig_int, *sig_hup;
        sd_event_source *stage_source;   /* defer: runs the next stage of the pass */
        sd_event_source *retry_timer;    /* re-runs the pass after a failure, with backoff */
        sd_event_source *settle_timer;   /* coalesces device events into one pass */
        sd_event_source *coalesce_timer; /* a pass requested right after one ended: starts it later */
        uint64_t last_pass_end_usec;     /* CLOCK_MONOTONIC */
        BusDirty *bus_dirty;             /* the bus layer's own state, owned by bus-util.c */

        ManagerOptions options;
        char *config_error;              /* why the last load/reload failed, NULL if it did not */

        /* Remote configuration (manager-remote.c, config-remote.c). */
        struct ConfigRemoteFetcher *remote_fetcher;
        sd_event_source *remote_timer;   /* the next fetch */
        char *remote_url;                /* config.remote.url expanded, NULL when not configured */
        struct ConfigRemoteCache *remote_cache; /* the last good document, NULL none */
        bool remote_reloading;           /* the reload in progress was caused by a new document */
        char *remote_sig_url;            /* its signature's URL expanded, NULL when documents need none */
        struct ConfigRemoteCache *remote_pending; /* a changed document waiting for its signature */
        bool remote_sig_retry;           /* fetching document and signature again after a mismatch */
        bool config_error_remote;        /* config_error is about the remote document */

        /* mig.selected-from: node-label (manager-kube.c, kube-node.c); the value is node.kube_mig_config. */
        struct KubeNode *kube;

        StageId next_stage;              /* the one the stage source runs next */
        bool pass_active;
        bool pass_again;                 /* a pass was requested while one ran */
        bool pass_again_coalesced;       /* … by manager_request_pass_coalesced() only */
        unsigned retry_attempt;
        int exit_code;
};

#define MANAGER_PASS_MIN_INTERVAL_USEC (500 * USEC_PER_MSEC)

int manager_new(const ManagerOptions *o, Manager **ret);
Manager *manager_free(Manager *m);
DEFINE_CLEANUP_FUNC(Manager *, manager_free);

/* Loads the config, connects the bus (unless oneshot), installs signal handlers and the device
 * monitor, and schedules the first pass. */
int manager_startup(Manager *m);
/* Runs the event loop until SIGTERM/SIGINT (or, oneshot, the first pass); returns the exit code. */
int manager_run(Manager *m);


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


/* Through options.bus (no-ops without it): a property changed (path NULL = the manager object; one
 * PropertiesChanged per object and interface per event loop iteration), the GPU list changed (old may be
 * NULL), the NVML snapshot changed (old and m->node.nvml_snapshot may be NULL), a stage changed state.
 * The code below the manager calls them as node_mark_dirty() and so on (node.h). */
void manager_mark_dirty(Manager *m, const char *path, const char *interface, const char *property);
void manager_gpus_changed(Manager *m, const Inventory *old);
void manager_nvml_changed(Manager *m, const NvmlSnapshot *old);
void manager_stage_changed(Manager *m, StageId id);
