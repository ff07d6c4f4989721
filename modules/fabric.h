/* SPDX-License-Identifier: MIT */
/* Owns talking to systemd about the driver's daemons (nvidia-persistenced, nvidia-fabricmanager):
 * whether a unit is installed and running, starting and stopping it over sd-bus
 * (org.freedesktop.systemd1.Manager StartUnit/StopUnit, mode "replace") and waiting for the job's
 * JobRemoved result, and watching a unit's ActiveState after it started. Everything is asynchronous
 * on the bus's sd-event loop (the bus must be attached to one): each call returns at once and its
 * callback runs later, exactly once, unless the operation is freed first (then never).
 *
 * Library code: results are a negative errno plus a sentence for the caller to log. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <systemd/sd-bus.h>

#define FABRIC_MANAGER_UNIT "nvidia-fabricmanager.service"
#define FABRIC_PERSISTENCED_UNIT "nvidia-persistenced.service"

/* Defaults when the options leave them 0. */
#define FABRIC_JOB_TIMEOUT_USEC (90ULL * 1000000ULL)
#define FABRIC_MANAGER_WATCH_USEC (10ULL * 1000000ULL)

typedef struct FabricOp FabricOp;

typedef struct FabricUnitInfo {
        const char *unit;
        bool installed;            /* LoadState is not "not-found" */
        const char *load_state;    /* "loaded", "not-found", "masked", … */
        const char *active_state;  /* "active", "inactive", "failed", "activating", … */
        const char *sub_state;     /* "running", "dead", "auto-restart", … */
} FabricUnitInfo;

/* r is 0 or a negative errno; message is a sentence (for failures always; on success it may say what
 * happened, e.g. "nvidia-persistenced.service is not installed; not started"), NULL otherwise.
 * Both are valid only during the call. The callback may free op. */
typedef void (*FabricDoneFunc)(FabricOp *op, int r, const char *message, void *userdata);
/* info is valid only during the call (NULL when r < 0). */
typedef void (*FabricQueryFunc)(FabricOp *op, int r, const FabricUnitInfo *info, const char *message, void *userdata);

typedef struct FabricStartOptions {
        uint64_t timeout_usec;    /* for the start job; 0 = FABRIC_JOB_TIMEOUT_USEC */
        /* After the job finished, keep watching the unit this long and fail if it leaves the
         * active state (crashes, exits, goes into auto-restart). 0 = done when the job is. */
        uint64_t watch_usec;
        /* A unit that is not installed fails with -ENOENT; otherwise it completes with r = 0 and
         * a message saying it was not started. */
        bool require_installed;
} FabricStartOptions;

/* LoadUnit + the unit's LoadState/ActiveState/SubState. -ENOENT is not an error here: a unit that
 * is not installed comes back with info->installed = false. */
int fabric_unit_query(sd_bus *bus, const char *unit, FabricQueryFunc callback, void *userdata, FabricOp **ret);

/* Starts unit and waits for the job (and opts->watch_usec beyond it). Failures: -ENOENT not
 * installed (with require_installed), -EIO job failed or the unit died while watched,
 * -ETIMEDOUT no job result within the timeout, -ECANCELED job canceled, -ENOLINK a dependency
 * failed, or the errno of the D-Bus error. opts may be NULL. */
int fabric_unit_start(sd_bus *bus, const char *unit, const FabricStartOptions *opts, FabricDoneFunc callback,
                      void *userdata, FabricOp **ret);

/* nvidia-fabricmanager.service: required to be installed, watched for FABRIC_MANAGER_WATCH_USEC (or
 * watch_usec when given) after it starts; any failure reads "nvidia-fabricmanager failed: GPUs on an
 * NVSwitch system are unusable until it runs; see journalctl -u nvidia-fabricmanager" plus what
 * happened. */
int fabric_manager_start(sd_bus *bus, uint64_t timeout_usec, uint64_t watch_usec, FabricDoneFunc callback,
                         void *userdata, FabricOp **ret);

/* Stops unit and waits for the job. A unit that is not installed (or not loaded) completes with
 * r = 0: there is nothing to stop. timeout 0 = FABRIC_JOB_TIMEOUT_USEC. */
int fabric_unit_stop(sd_bus *bus, const char *unit, uint64_t timeout_usec, FabricDoneFunc callback, void *userdata,
                     FabricOp **ret);

/* Watches unit until freed: callback(op, -EIO, "… stopped (ActiveState=failed) …") each time the
 * unit leaves the active state and callback(op, 0, NULL) each time it becomes active again. Unlike
 * the others it may be called many times. */
int fabric_unit_watch(sd_bus *bus, const char *unit, FabricDoneFunc callback, void *userdata, FabricOp **ret);

const char *fabric_op_unit(const FabricOp *op);

/* Cancels (no callback after this) and frees; NULL-safe. Does not cancel a systemd job. */
FabricOp *fabric_op_free(FabricOp *op);

/* Fabric manager must be exactly the driver's version ("550.127.05"); surrounding whitespace is
 * ignored. 0 when equal; -EPROTO with a message naming both versions and the fix otherwise;
 * -EINVAL when either is empty. */
int fabric_version_check(const char *fabricmanager_version, const char *driver_version, char **ret_message);
