/* SPDX-License-Identifier: MIT */
/* Owns the mig stage: at its first run, the recovery of an apply a crash interrupted (the journal); then
 * keeping the node at the selected MIG config (mig.config-file + mig.selected, or the last ApplyMigConfig)
 * — an idempotent apply that costs only NVML reads when nothing changed. After a change it re-reads NVML
 * and re-makes the device nodes (nvidia-caps), so that the cdi and labels stages after it in the same
 * pass describe the new MIG devices. */
#include "devices.h"
#include "log.h"
#include "stage-table.h"
#include "metrics.h"
#include "mig-manager.h"
#include "strv.h"

/* The recovery note (if any) in front of the stage message. */
static char *with_recovery(Node *n, char *message) {
        _cleanup_free_ char *note = mig_manager_take_recovery_note(n->mig);
        char *full;

        if (!note)
                return message;
        full = strprintf("%s; %s", note, strna(message));
        free(message);
        return full;
}

static int apply_selected(Node *n, char **ret_message);

/* After NVML writes: the snapshot (re-read on the MIG reader, an NVML worker), then the device nodes; CDI
 * and labels follow in this pass. What to do once that is done waits here. */
typedef struct AfterChange {
        Node *n;
        bool recovered;               /* after the journal recovery: apply the selection next */
        int r;
        char *message;                /* the apply's outcome line (not recovered) */
} AfterChange;

static void after_change_finish(AfterChange *ac, const char *refresh_error) {
        Node *n = ac->n;
        _cleanup_free_ char *devices = NULL, *message = NULL;
        _cleanup_strv_free_ char **problems = NULL;
        int r;

        if (refresh_error)
                (void) strv_extendf(&problems, "re-reading NVML failed: %s", refresh_error);
        r = stage_devices_refresh(n, &devices);
        if (r < 0)
                (void) strv_extendf(&problems, "re-making the device nodes failed: %s", strna(devices));
        _cleanup_free_ char *joined = problems ? strv_join(problems, "; ") : NULL;

        if (ac->recovered) {
                if (joined)
                        log_warning("After the MIG journal recovery: %s", joined);
                r = apply_selected(n, &message);
                if (r != STAGE_RUNNING)
                        node_stage_complete(n, STAGE_MIG, r, message);
        } else {
                message = with_recovery(n, strprintf("%s%s%s", strna(ac->message), joined ? "; " : "", joined ? joined : ""));
                node_stage_complete(n, STAGE_MIG, ac->r, message);
        }
        free(ac->message);
        free(ac);
}

static void on_refreshed(Node *n, int r, const char *error, void *userdata) {
        after_change_finish(userdata, r < 0 ? strna(error) : NULL);
}

static void after_change(Node *n, char *const *changed_gpus, const NvmlSnapshot *mig_devices, bool recovered,
                         int r, char *message) {
        _cleanup_free_ char *error = NULL;
        AfterChange *ac = calloc(1, sizeof *ac);

        if (!ac) {
                free(message);
                node_stage_complete(n, STAGE_MIG, -ENOMEM, NULL);
                return;
        }
        *ac = (AfterChange) { .n = n, .recovered = recovered, .r = r, .message = message };
        if (stage_nvml_refresh_async(n, changed_gpus, mig_devices, on_refreshed, ac, &error) < 0)
                after_change_finish(ac, strna(error));
}

static void on_applied(MigManager *mm, const MigApplyOutcome *o, void *userdata) {
        Node *n = userdata;
        _cleanup_free_ char *message = NULL;
        int r = o->error;

        if (o->refused) {
                message = with_recovery(n, strdup(strna(o->message)));
                node_stage_complete(n, STAGE_MIG, r < 0 ? r : -EIO, message);
                return;
        }
        message = strprintf("%s: %s: %s", o->config, o->state, strna(o->message));
        if (streq(o->state, "failed") && r >= 0)
                r = -EIO;
        metrics_count_mig_apply(n, o->state, o->changed);
        if (o->changed) {
                after_change(n, o->changed_gpus, o->mig_devices, false, r < 0 ? r : STAGE_DONE, TAKE_PTR(message));
                return;
        }
        message = with_recovery(n, TAKE_PTR(message));
        node_stage_complete(n, STAGE_MIG, r < 0 ? r : STAGE_DONE, message);
}

static int apply_selected(Node *n, char **ret_message) {
        _cleanup_free_ char *error = NULL;
        int r;

        if (n->config->mig.selected_from == MIG_SELECTED_FROM_NODE_LABEL) {
                /* The node label selects, as the GPU Operator's MIG manager does; the same apply path. A
                 * value that names no config of mig.config-file fails there (-ENOENT), before anything is
                 * touched; one that is not even a label value is refused here. */
                if (n->kube_mig_config_refused) {
                        error = strprintf("The node label nvidia.com/mig.config is '%s', which is not a valid label "
                                          "value (and so no config name of mig.config-file); nothing was applied.",
                                          n->kube_mig_config_refused);
                        if (!error)
                                return -ENOMEM;
                        mig_manager_refuse(n->mig, n->kube_mig_config_refused, error);
                        log_error("MIG: %s", error);
                        *ret_message = with_recovery(n, TAKE_PTR(error));
                        return -EINVAL;
                }
                if (!n->kube_mig_config) {
                        if (!n->kube_mig_config_read) {
                                *ret_message = with_recovery(n, strdup("no MIG configuration selected: the node label "
                                                                       "nvidia.com/mig.config is not read yet"));
                                return STAGE_SKIPPED;
                        }
                        /* Unset (removed): MIG is not managed, as with an empty mig.selected. */
                        mig_manager_unmanage(n->mig);
                        *ret_message = with_recovery(n, strdup("no MIG configuration selected: the node label "
                                                               "nvidia.com/mig.config is not set"));
                        return STAGE_SKIPPED;
                }
                r = mig_manager_apply(n->mig, n->kube_mig_config, NULL, false, on_applied, n, &error);
        } else
                r = mig_manager_apply_selected(n->mig, on_applied, n, &error);
        if (r == -ENODATA) {
                *ret_message = with_recovery(n, strdup("no MIG configuration selected (mig.selected)"));
                return STAGE_SKIPPED;
        }
        if (r < 0) {
                log_error("MIG: %s", strna(error));
                *ret_message = with_recovery(n, TAKE_PTR(error));
                return r;
        }
        /* mig.config.state=pending reaches the feature file when the GPUs have been read and the apply
         * starts (mig-manager.c, while the mig stage runs). */
        return STAGE_RUNNING;
}

static void on_recovered(MigManager *mm, const MigApplyOutcome *o, void *userdata) {
        Node *n = userdata;
        _cleanup_free_ char *message = NULL;
        int r;

        if (o->changed) {
                after_change(n, o->changed_gpus, o->mig_devices, true, 0, NULL);
                return;
        }
        r = apply_selected(n, &message);
        if (r != STAGE_RUNNING)
                node_stage_complete(n, STAGE_MIG, r, message);
}

int stage_mig_run(Node *n, char **ret_message) {
        _cleanup_free_ char *message = NULL;
        int r;

        if (!n->nvml_snapshot) {
                *ret_message = strdup("NVML is not available: no MIG management");
                return STAGE_SKIPPED;
        }
        if (!n->mig) {
                r = mig_manager_new(n, &n->mig);
                if (r < 0)
                        return r;
        }
        if (mig_manager_busy(n->mig)) {
                *ret_message = strdup("a MIG apply requested over D-Bus is still running; checked again on the "
                                      "next pass");
                return -EBUSY;
        }

        r = mig_manager_recover(n->mig, on_recovered, n, &message);
        if (r == -ENODEV || r == -ENOTRECOVERABLE) {
                *ret_message = TAKE_PTR(message);
                return r;
        }
        if (r < 0)
                log_error("MIG journal: %s", strna(message));
        if (r > 0)
                return STAGE_RUNNING;
        return apply_selected(n, ret_message);
}
