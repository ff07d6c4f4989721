/* SPDX-License-Identifier: MIT */
/* Owns the mig stage: at its first run, the recovery of an apply a crash interrupted (the journal); then
 * keeping the node at the selected MIG config (mig.config-file + mig.selected, or the last ApplyMigConfig)
 * — an idempotent apply that costs only NVML reads when nothing changed. After a change it re-reads NVML
 * and re-makes the device nodes (nvidia-caps), so that the cdi and labels stages after it in the same
 * pass describe the new MIG devices. */
#include "devices.h"
#include "log.h"
#include "manager.h"
#include "metrics.h"
#include "mig-manager.h"
#include "strv.h"

/* The recovery note (if any) in front of the stage message. */
static char *with_recovery(Manager *m, char *message) {
        _cleanup_free_ char *note = mig_manager_take_recovery_note(m->mig);
        char *full;

        if (!note)
                return message;
        full = strprintf("%s; %s", note, strna(message));
        free(message);
        return full;
}

/* After NVML writes: the snapshot, then the device nodes; CDI and labels follow in this pass. */
static char *refresh_after_change(Manager *m) {
        _cleanup_free_ char *error = NULL, *devices = NULL;
        _cleanup_strv_free_ char **problems = NULL;
        int r;

        r = manager_nvml_refresh(m, &error);
        if (r < 0)
                (void) strv_extendf(&problems, "re-reading NVML failed: %s", strna(error));
        r = manager_devices_refresh(m, &devices);
        if (r < 0)
                (void) strv_extendf(&problems, "re-making the device nodes failed: %s", strna(devices));
        return problems ? strv_join(problems, "; ") : NULL;
}

static void on_applied(MigManager *mm, const MigApplyOutcome *o, void *userdata) {
        Manager *m = userdata;
        _cleanup_free_ char *problems = NULL, *message = NULL;
        int r = o->error;

        if (o->changed)
                problems = refresh_after_change(m);
        message = with_recovery(m, strprintf("%s: %s: %s%s%s", o->config, o->state, strna(o->message),
                                             problems ? "; " : "", problems ? problems : ""));
        if (streq(o->state, "failed") && r >= 0)
                r = -EIO;
        metrics_count_mig_apply(m, o->state, o->changed);
        manager_stage_complete(m, STAGE_MIG, r < 0 ? r : STAGE_DONE, message);
}

static int apply_selected(Manager *m, char **ret_message) {
        _cleanup_free_ char *error = NULL;
        int r;

        if (m->config->mig.selected_from == MIG_SELECTED_FROM_NODE_LABEL) {
                /* The node label selects, as the GPU Operator's MIG manager does; the same apply path. */
                if (!m->kube_mig_config) {
                        *ret_message = with_recovery(m, strdup("no MIG configuration selected: the node label "
                                                               "nvidia.com/mig.config is not set (or not read yet)"));
                        return STAGE_SKIPPED;
                }
                r = mig_manager_apply(m->mig, m->kube_mig_config, NULL, false, on_applied, m, &error);
        } else
                r = mig_manager_apply_selected(m->mig, on_applied, m, &error);
        if (r == -ENODATA) {
                *ret_message = with_recovery(m, strdup("no MIG configuration selected (mig.selected)"));
                return STAGE_SKIPPED;
        }
        if (r < 0) {
                log_error("MIG: %s", strna(error));
                *ret_message = with_recovery(m, TAKE_PTR(error));
                return r;
        }
        if (streq_ptr(mig_manager_state(m->mig), "pending"))
                stage_labels_write_now(m);
        return STAGE_RUNNING;
}

static void on_recovered(MigManager *mm, const MigApplyOutcome *o, void *userdata) {
        Manager *m = userdata;
        _cleanup_free_ char *message = NULL, *problems = NULL;
        int r;

        if (o->changed && (problems = refresh_after_change(m)))
                log_warning("After the MIG journal recovery: %s", problems);
        r = apply_selected(m, &message);
        if (r != STAGE_RUNNING)
                manager_stage_complete(m, STAGE_MIG, r, message);
}

int stage_mig_run(Manager *m, char **ret_message) {
        _cleanup_free_ char *message = NULL;
        int r;

        if (!m->nvml_snapshot) {
                *ret_message = strdup("NVML is not available: no MIG management");
                return STAGE_SKIPPED;
        }
        if (!m->mig) {
                r = mig_manager_new(m, &m->mig);
                if (r < 0)
                        return r;
        }
        if (!m->nvml) {
                /* MIG reads before planning run in this process (the writes in NVML workers). Open NVML
                 * here only when there is MIG work: a selected config, or a journal to recover (recover
                 * says -ENODEV without a handle). */
                const char *name = NULL, *file = NULL;

                mig_manager_selected(m->mig, &name, &file);
                if (isempty(name) && !mig_manager_busy(m->mig)) {
                        r = mig_manager_recover(m->mig, on_recovered, m, &message);
                        if (r == 0)
                                return apply_selected(m, ret_message);
                        message = mfree(message);
                }
                r = manager_nvml_open_local(m, &message);
                if (r < 0) {
                        *ret_message = TAKE_PTR(message);
                        return r;
                }
        }
        if (mig_manager_busy(m->mig)) {
                *ret_message = strdup("a MIG apply requested over D-Bus is still running; checked again on the "
                                      "next pass");
                return -EBUSY;
        }

        r = mig_manager_recover(m->mig, on_recovered, m, &message);
        if (r == -ENODEV || r == -ENOTRECOVERABLE) {
                *ret_message = TAKE_PTR(message);
                return r;
        }
        if (r < 0)
                log_error("MIG journal: %s", strna(message));
        if (r > 0)
                return STAGE_RUNNING;
        return apply_selected(m, ret_message);
}
