/* SPDX-License-Identifier: MIT */
/* Owns the MigManager (see mig-manager.h): selection, the one apply in flight, journal recovery, the
 * mig.config/mig.config.state result, assert and export. This is where MIG events are logged. */
#include <stdlib.h>
#include <string.h>

#include "fileio.h"
#include "log.h"
#include "node.h"
#include "mig-cache.h"
#include "mig-config.h"
#include "mig-manager.h"
#include "mig-plan.h"
#include "gpu-nvml-worker.h"
#include "health.h"
#include "mig-state.h"
#include "mig-wire.h"
#include "strv.h"

typedef struct MigRead MigRead;

struct MigManager {
        Node *node;
        char *reset_program;          /* NULL = nvidia-smi */
        uint64_t reset_timeout_usec;  /* 0 = MIG_RESET_TIMEOUT_USEC */

        char *config_name;            /* mig.config */
        char *applying;               /* the config of the apply in flight */
        MigConfigState state;         /* mig.config.state, valid when config_name is set */
        char *message;
        char *unmanaged;              /* "GPUs 2, 3 are not covered by …" for the message, or NULL */

        MigApply *apply;
        MigApplyDone cb;
        void *userdata;

        /* The last explicit request, and the config values it overrode. */
        char *request_name, *request_file, *request_base_name, *request_base_file;

        MigChanged changed_cb;
        void *changed_userdata;

        MigRead *reads;               /* assert/export reads in NVML workers, in flight */

        /* The read before planning an apply (or a recovery), on the MIG reader; the apply starts when it
         * answers. At most one, and no apply while it runs (mig_manager_busy()). */
        struct {
                bool active;
                bool recovery;            /* the journal's GPUs, to plan their way back */
                char *name, *file;
                bool force, request;
                MigConfigFile *cf;
                const MigConfig *config;
                MigJournalContents *journal;
                char **addresses;         /* what is read (index = position) */
                MigPlan *built;           /* the plan, while the GPUs it changes are checked for processes */
                MigGpuState *states;      /* the states it was made from (the apply takes them) */
                size_t n_states;
                sd_event_source *defer;   /* delivers a refusal from the next iteration */
                MigApplyOutcome refusal;
                char *refusal_message;
                /* A request reports "pending" from its start; a refusal by the planner puts back: */
                bool reported;
                char *prev_name, *prev_message;
                MigConfigState prev_state;
        } plan;

        bool journal_checked;         /* recovery runs once per MigManager (= per start) */
        bool recovering;
        char *recovery_note;          /* what recovery found and did, until taken */
};

int mig_manager_new(Node *n, MigManager **ret) {
        MigManager *mm;
        const char *p = getenv("GNA_MIG_RESET_PROGRAM"), *t = getenv("GNA_MIG_RESET_TIMEOUT_MS");

        mm = calloc(1, sizeof *mm);
        if (!mm)
                return -ENOMEM;
        mm->node = n;
        if (p && *p && !(mm->reset_program = strdup(p))) {
                free(mm);
                return -ENOMEM;
        }
        if (t && *t)
                mm->reset_timeout_usec = strtoull(t, NULL, 10) * USEC_PER_MSEC;
        *ret = mm;
        return 0;
}

static void mig_reads_cancel(MigManager *mm);

/* Forgets the planning read (its answer, should one still come, is dropped: the reader's callback checks
 * plan.active). */
static void plan_done(MigManager *mm) {
        free(mm->plan.name);
        free(mm->plan.file);
        mig_config_file_free(mm->plan.cf);
        mig_journal_contents_free(mm->plan.journal);
        strv_free(mm->plan.addresses);
        mig_plan_free(mm->plan.built);
        mig_gpu_states_free(mm->plan.states, mm->plan.n_states);
        sd_event_source_disable_unref(mm->plan.defer);
        free(mm->plan.refusal_message);
        free(mm->plan.prev_name);
        free(mm->plan.prev_message);
        mm->plan = (typeof(mm->plan)) {};
}

MigManager *mig_manager_free(MigManager *mm) {
        if (!mm)
                return NULL;
        mig_apply_free(mm->apply);
        plan_done(mm);
        mig_reads_cancel(mm);
        free(mm->reset_program);
        free(mm->config_name);
        free(mm->applying);
        free(mm->message);
        free(mm->unmanaged);
        free(mm->request_name);
        free(mm->request_file);
        free(mm->request_base_name);
        free(mm->request_base_file);
        free(mm->recovery_note);
        return mfree(mm);
}

void mig_manager_set_changed_callback(MigManager *mm, MigChanged cb, void *userdata) {
        mm->changed_cb = cb;
        mm->changed_userdata = userdata;
}

const char *mig_manager_config(const MigManager *mm) {
        return mm ? mm->config_name : NULL;
}

const char *mig_manager_state(const MigManager *mm) {
        return mm && mm->config_name ? mig_config_state_to_string(mm->state) : NULL;
}

bool mig_manager_busy(const MigManager *mm) {
        return mm && (mm->apply || mm->plan.active);
}

static void set_result(MigManager *mm, const char *name, MigConfigState state, const char *message) {
        bool changed = !streq_ptr(mm->config_name, name) || mm->state != state;

        if (!streq_ptr(mm->config_name, name)) {
                free(mm->config_name);
                mm->config_name = name ? strdup(name) : NULL;
        }
        mm->state = state;
        if (message) {
                free(mm->message);
                mm->message = strdup(message);
        }
        if (changed && mm->changed_cb)
                mm->changed_cb(mm, mm->changed_userdata);
}

void mig_manager_selected(MigManager *mm, const char **ret_name, const char **ret_file) {
        const ConfigMig *c = &mm->node->config->mig;

        if (mm->request_name && streq_ptr(mm->request_base_name, c->selected) &&
            streq_ptr(mm->request_base_file, c->config_file)) {
                *ret_name = mm->request_name;
                *ret_file = mm->request_file ?: c->config_file;
                return;
        }
        *ret_name = c->selected ?: "";
        *ret_file = c->config_file;
}

static char *journal_path(MigManager *mm) {
        return path_join(mm->node->config->paths.state, MIG_JOURNAL_FILE);
}

static int gpu_addresses(MigManager *mm, char ***ret) {
        const Inventory *inv = mm->node->inventory;
        _cleanup_strv_free_ char **l = NULL;

        /* The inventory's GPU numbering (every NVIDIA GPU in PCI order, also those NVML cannot see) is
         * mig-parted's; without one, NVML's list. */
        *ret = NULL;
        if (!inv)
                return 0;
        for (size_t i = 0; i < inv->n_gpus; i++)
                if (strv_extend(&l, inv->gpus[i].address) < 0)
                        return -ENOMEM;
        if (!l && !(l = calloc(1, sizeof(char *))))
                return -ENOMEM;
        *ret = TAKE_PTR(l);
        return 0;
}

static int load_config(const char *file, const char *name, MigConfigFile **ret_file, const MigConfig **ret,
                       char **ret_error) {
        _cleanup_(mig_config_file_freep) MigConfigFile *f = NULL;
        int r;

        if (isempty(file)) {
                *ret_error = strdup("No MIG configuration file is set (mig.config-file).");
                return -ENOENT;
        }
        r = mig_config_file_load(file, &f, ret_error);
        if (r < 0)
                return r;
        r = mig_config_file_find(f, name, ret, ret_error);
        if (r < 0)
                return r;
        *ret_file = TAKE_PTR(f);
        return 0;
}

static char *unmanaged_note(const MigPlan *plan, const char *name) {
        _cleanup_strv_free_ char **l = NULL;

        if (plan->n_unmanaged == 0)
                return NULL;
        for (size_t i = 0; i < plan->n_unmanaged; i++)
                if (strv_extendf(&l, "%u", plan->unmanaged[i]) < 0)
                        return NULL;
        _cleanup_free_ char *joined = strv_join(l, ", ");
        return strprintf("GPU%s %s unmanaged (no entry of %s covers %s)", plan->n_unmanaged == 1 ? "" : "s",
                         strna(joined), name, plan->n_unmanaged == 1 ? "it" : "them");
}

static void on_apply_finished(MigApply *a, const MigApplyResult *res, void *userdata) {
        MigManager *mm = userdata;
        _cleanup_free_ char *message = NULL, *name = TAKE_PTR(mm->applying);
        const char *state = mig_config_state_to_string(res->state);
        _cleanup_free_ char *f1 = strprintf("MIG_CONFIG=%s", strna(name));
        _cleanup_free_ char *f2 = strprintf("MIG_CONFIG_STATE=%s", state);
        const char *fields[] = { f1, f2, NULL };
        MigApplyDone cb = mm->cb;
        void *ud = mm->userdata;

        STRV_FOREACH(l, res->log)
                log_info("%s", *l);
        message = mm->unmanaged ? strprintf("%s; %s", res->message, mm->unmanaged) : strdup(res->message);
        log_struct(res->state == MIG_CONFIG_FAILED ? LOG_ERR : LOG_INFO, f1 && f2 ? fields : NULL,
                   "MIG config %s: %s: %s", strna(name), state, strna(message));
        set_result(mm, name, res->state, message);
        if (mm->recovering) {
                char *note = strprintf("%s: %s", strna(mm->recovery_note), strna(message));
                free(mm->recovery_note);
                mm->recovery_note = note;
                mm->recovering = false;
        }

        /* res belongs to a: done with it. The callback may start the next apply. */
        _cleanup_strv_free_ char **changed_gpus = strv_copy(res->changed_gpus);
        _cleanup_(gpu_nvml_snapshot_freep) NvmlSnapshot *mig_devices = mig_apply_take_mig_devices(a);
        MigApplyOutcome o = {
                .error = res->error,
                .config = name,
                .state = state,
                .message = message,
                .changed = res->changed,
                .changed_gpus = changed_gpus, /* NULL (on OOM too): every GPU is re-read */
                .mig_devices = changed_gpus ? mig_devices : NULL,
        };
        mm->apply = mig_apply_free(a);
        mm->cb = NULL;
        mm->userdata = NULL;
        if (cb)
                cb(mm, &o, ud);
}

static void on_gpu_reset_prepare(const char *pci_address, void *userdata) {
        MigManager *mm = userdata;
        /* Our NVML processes hold /dev/nvidia* open; the driver refuses a reset while any process does
         * ("in use by another process"). The next read starts them again, the next pass the event worker. */
        log_info("GPU %s: closing the agent's NVML processes for its reset.", pci_address);
        node_nvml_stop(mm->node, "NVML was closed for a GPU reset (MIG mode change)");
        health_release_driver(mm->node->health);
}

static void on_gpu_reset(const char *pci_address, void *userdata) {
        MigManager *mm = userdata;
        /* The reset is the remedy for a fatal fault too: health forgets it and re-checks the GPU. */
        health_gpu_reset_by_agent(mm->node->health, pci_address);
}

/* The apply's MIG steps on the MIG reader (one NVML session for the apply). */
static int session_job(void *userdata, const void *input, size_t len, GpuNvmlJobFunc fn, GpuNvmlJobDone done,
                       void *done_userdata) {
        MigManager *mm = userdata;
        _cleanup_free_ char *error = NULL;

        return node_nvml_read_input_async(mm->node, input, len, fn, done, done_userdata, &error);
}

static MigApplyOptions apply_options(MigManager *mm, const char *journal, bool force) {
        const Config *c = mm->node->config;

        return (MigApplyOptions) {
                .event = mm->node->event,
                .bus = mm->node->bus,
                .library = c->nvml.library,
                .call_timeout_usec = c->nvml.timeout_usec,
                .stop_units = c->mig.stop_units,
                .reset_auto = c->mig.reset != 0,
                .reset_program = mm->reset_program,
                .reset_timeout_usec = mm->reset_timeout_usec,
                .unit_timeout_usec = c->fabric.timeout_usec,
                .journal_path = journal,
                .force = force,
                .snapshot = &mm->node->nvml_snapshot,
                .session_job = session_job,
                .session_userdata = mm,
                .gpu_reset_prepare = on_gpu_reset_prepare,
                .gpu_reset = on_gpu_reset,
                .gpu_reset_userdata = mm,
        };
}

static int replace(char **p, const char *s);

/* The request becomes the selection once it is known not to be one the planner rejected (nor a busy
 * GPU): the previous selection stays for those. */
static int remember_request(MigManager *mm, const char *name, const char *config_file) {
        const ConfigMig *c = &mm->node->config->mig;

        if (replace(&mm->request_name, name) < 0 || replace(&mm->request_file, config_file) < 0 ||
            replace(&mm->request_base_name, c->selected) < 0 || replace(&mm->request_base_file, c->config_file) < 0)
                return -ENOMEM;
        return 0;
}

static int on_refusal(sd_event_source *s, void *userdata);

static int on_refusal(sd_event_source *s, void *userdata) {
        MigManager *mm = userdata;
        MigApplyOutcome o = mm->plan.refusal;
        _cleanup_free_ char *message = TAKE_PTR(mm->plan.refusal_message), *config = NULL;
        MigApplyDone cb = mm->cb;
        void *ud = mm->userdata;

        config = mm->plan.name ? strdup(mm->plan.name) : NULL;
        o.config = config;
        o.message = message;
        plan_done(mm);
        mm->cb = NULL;
        mm->userdata = NULL;
        if (cb)
                cb(mm, &o, ud);
        return 0;
}

/* Ends the planning with outcome o (message taken), from the next loop iteration (we may be inside the
 * reader's callback); busy until then. */
static void plan_deliver(MigManager *mm, MigApplyOutcome o, char *message) {
        mm->plan.active = true;
        mm->plan.refusal = o;
        mm->plan.refusal_message = message;
        if (sd_event_add_defer(mm->node->event, &mm->plan.defer, on_refusal, mm) < 0)
                (void) on_refusal(NULL, mm);
        else
                (void) sd_event_source_set_description(mm->plan.defer, "mig-refusal");
}

/* Ends the planning with a refusal (nothing was changed), delivered from the next loop iteration (we may
 * be inside the reader's callback). */
static void plan_refuse(MigManager *mm, int r, char *message) {
        if (!message)
                message = strprintf("Cannot apply MIG config %s: %s.", strna(mm->plan.name), strerror(-r));
        /* NVML not answering is a reason the next pass may not have: the request stays selected. */
        if (mm->plan.request && (r == -ENODEV || r == -ETIMEDOUT || r == -EIO))
                (void) remember_request(mm, mm->plan.name, mm->plan.file);
        if (mm->plan.request && r == -EINVAL) {
                if (mm->plan.reported)
                        set_result(mm, mm->plan.prev_name, mm->plan.prev_state, mm->plan.prev_message);
        } else if (!mm->plan.recovery)
                set_result(mm, mm->plan.name, MIG_CONFIG_FAILED, message);
        log_error("MIG: %s", strna(message));
        plan_deliver(mm, (MigApplyOutcome) { .error = r, .state = "failed", .refused = true }, message);
}

static void plan_start(MigManager *mm, MigPlan *plan_in, MigGpuState *states, size_t n_states);

static void on_busy_read(GpuNvmlWorker *w, int r, const uint8_t *data, size_t len, const char *error,
                         void *userdata) {
        MigManager *mm = userdata;
        MigPlan *plan = TAKE_PTR(mm->plan.built);
        MigGpuState *states = TAKE_PTR(mm->plan.states);
        size_t n_states = mm->plan.n_states;
        _cleanup_free_ unsigned *procs = NULL;

        mm->plan.n_states = 0;
        if (!mm->plan.active || mm->plan.defer || !plan) {
                mig_plan_free(plan);
                mig_gpu_states_free(states, n_states);
                return;
        }
        if (r >= 0 && (r = mig_busy_job_result(data, len, plan->n_gpus, &procs)) < 0)
                error = "the NVML worker sent a malformed answer";
        if (r < 0) {
                mig_plan_free(plan);
                mig_gpu_states_free(states, n_states);
                plan_refuse(mm, r, strprintf("Checking the GPUs for compute processes before the MIG change failed: "
                                             "%s; nothing was changed", strna(error)));
                return;
        }
        for (size_t i = 0; i < plan->n_gpus; i++) {
                MigGpuState *g = (MigGpuState *) mig_state_find(states, n_states, plan->gpus[i].pci_address);
                if (g)
                        g->busy = procs[i] > 0;
        }
        plan_start(mm, plan, states, n_states);
}

static void plan_with_states(MigManager *mm, MigGpuState *states, size_t n_states) {
        _cleanup_(mig_plan_freep) MigPlan *plan = NULL;
        _cleanup_free_ char *error = NULL;
        _cleanup_strv_free_ char **busy_addresses = NULL;
        int r;

        r = mig_plan_build(mm->plan.config, states, n_states, &plan, &error);
        if (r < 0) {
                mig_gpu_states_free(states, n_states);
                plan_refuse(mm, r, TAKE_PTR(error));
                return;
        }
        if (mm->plan.force || plan->n_gpus == 0) {
                plan_start(mm, TAKE_PTR(plan), states, n_states);
                return;
        }
        /* Compute processes matter only on the GPUs the plan changes: asked for those alone, now, on the
         * MIG reader (a re-apply that changes nothing asks none). */
        for (size_t i = 0; i < plan->n_gpus; i++)
                if (strv_extend(&busy_addresses, plan->gpus[i].pci_address) < 0) {
                        mig_gpu_states_free(states, n_states);
                        plan_refuse(mm, -ENOMEM, NULL);
                        return;
                }
        mm->plan.built = TAKE_PTR(plan);
        mm->plan.states = states;
        mm->plan.n_states = n_states;
        r = node_nvml_read_async(mm->node, busy_addresses, mig_busy_job, on_busy_read, mm, &error);
        if (r < 0) {
                mm->plan.built = mig_plan_free(mm->plan.built);
                mig_gpu_states_free(mm->plan.states, mm->plan.n_states);
                mm->plan.states = NULL;
                mm->plan.n_states = 0;
                plan_refuse(mm, r, strprintf("Checking the GPUs for compute processes before the MIG change failed: "
                                             "%s; nothing was changed", strna(error)));
        }
}

static void plan_start(MigManager *mm, MigPlan *plan_in, MigGpuState *states, size_t n_states) {
        _cleanup_(mig_plan_freep) MigPlan *plan = plan_in;
        _cleanup_free_ char *journal = NULL, *error = NULL;
        _cleanup_free_ char *name = strdup(mm->plan.name);
        bool force = mm->plan.force, request = mm->plan.request;
        int r;

        if (!name) {
                mig_gpu_states_free(states, n_states);
                plan_refuse(mm, -ENOMEM, NULL);
                return;
        }
        free(mm->unmanaged);
        mm->unmanaged = unmanaged_note(plan, name);
        journal = journal_path(mm);
        if ((!plan->config_name && !(plan->config_name = strdup(name))) || !journal) {
                mig_gpu_states_free(states, n_states);
                plan_refuse(mm, -ENOMEM, NULL);
                return;
        }
        MigApplyOptions o = apply_options(mm, journal, force);
        size_t n_gpus = plan->n_gpus;
        r = mig_apply_start(&o, TAKE_PTR(plan), states, n_states, on_apply_finished, mm, &mm->apply, &error);
        if (r < 0) {
                plan_refuse(mm, r, TAKE_PTR(error));
                return;
        }
        if (request)
                (void) remember_request(mm, name, mm->plan.file);
        free(mm->applying);
        mm->applying = TAKE_PTR(name);
        plan_done(mm);
        if (n_gpus > 0) {
                log_info("Applying MIG config %s to %zu GPU%s.", mm->applying, n_gpus, n_gpus == 1 ? "" : "s");
                /* A pass re-checking a config that waits for a reboot keeps saying so: the re-check takes
                 * a worker's start per GPU, and mig.config.state must not flap to pending on every pass. */
                if (!(streq_ptr(mm->config_name, mm->applying) && mm->state == MIG_CONFIG_REBOOTING))
                        set_result(mm, mm->applying, MIG_CONFIG_PENDING, NULL);
                /* The mig stage's apply: consumers see mig.config.state=pending in the feature file while
                 * it runs, not only after it. */
                if (mm->node->current_stage == STAGE_MIG && streq_ptr(mig_manager_state(mm), "pending"))
                        node_labels_write_now(mm->node);
        }
}

static void recover_with_states(MigManager *mm, MigGpuState *states, size_t n_states);

static void on_plan_read(GpuNvmlWorker *w, int r, const uint8_t *data, size_t len, const char *error,
                         void *userdata) {
        MigManager *mm = userdata;
        MigGpuState *states = NULL;
        size_t n = 0;

        if (!mm->plan.active || mm->plan.defer)
                return;
        if (r >= 0 && (r = mig_states_job_result(data, len, &states, &n)) < 0)
                error = "the NVML worker sent a malformed answer";
        if (r < 0) {
                plan_refuse(mm, r, strprintf(mm->plan.recovery
                                             ? "An interrupted MIG apply was found, but its GPUs cannot be read: %s"
                                             : "Reading the MIG layout before the apply failed: %s", strna(error)));
                return;
        }
        /* The profile tables for the next start of the MIG reader (written only when they differ). */
        r = mig_profile_cache_save(mm->node->config->paths.state, mm->node->config->paths.proc,
                                   mm->node->nvml_snapshot, states, n);
        if (r < 0)
                log_debug("Cannot write the MIG profile cache: %s", strerror(-r));
        if (mm->plan.recovery)
                recover_with_states(mm, states, n);
        else
                plan_with_states(mm, states, n);
}

/* The MIG profile names a config asks for, each with the device filters of its entry
 * (mig_state_read_gpu_for(): "1g.5gb@0x20B010DE,0x20B210DE"). */
static int config_profile_names(const MigConfig *c, char ***ret) {
        _cleanup_strv_free_ char **l = calloc(1, sizeof(char *));

        if (!l)
                return -ENOMEM;
        for (size_t i = 0; i < c->n_entries; i++) {
                const MigConfigEntry *e = &c->entries[i];
                _cleanup_free_ char *filters = e->device_filter ? strv_join(e->device_filter, ",") : NULL;

                if (e->device_filter && !filters)
                        return -ENOMEM;
                for (size_t k = 0; k < e->n_requests; k++) {
                        _cleanup_free_ char *w = NULL;

                        if (!e->requests[k].profile)
                                continue;
                        w = filters ? strprintf("%s@%s", e->requests[k].profile, filters)
                                    : strdup(e->requests[k].profile);
                        if (!w)
                                return -ENOMEM;
                        if (!strv_contains(l, w) && strv_consume(&l, TAKE_PTR(w)) < 0)
                                return -ENOMEM;
                }
        }
        *ret = TAKE_PTR(l);
        return 0;
}

static int plan_read(MigManager *mm, char **ret_error) {
        int r;

        /* Planning a config: the GI profile table only as far as its names need (a recovery plans back to a
         * recorded layout, by profile id: the whole table). */
        if (!mm->plan.recovery && mm->plan.config) {
                _cleanup_(wire_buf_done) WireBuf b = {};
                _cleanup_strv_free_ char **names = NULL;

                r = config_profile_names(mm->plan.config, &names);
                if (r < 0)
                        return r;
                mig_states_for_input(&b, mm->plan.addresses, names);
                if (b.oom)
                        return -ENOMEM;
                r = node_nvml_read_input_async(mm->node, b.data, b.len, mig_states_for_job, on_plan_read, mm,
                                               ret_error);
                if (r < 0)
                        return r;
                mm->plan.active = true;
                return 0;
        }
        r = node_nvml_read_async(mm->node, mm->plan.addresses, mig_states_job, on_plan_read, mm, ret_error);
        if (r < 0)
                return r;
        mm->plan.active = true;
        return 0;
}

/* request: an ApplyMigConfig() call rather than the configured selection. A request the planner
 * rejects (unknown config or profile, over capacity) changes nothing, not even the reported state:
 * the node keeps the geometry it has and the caller gets the error. The GPUs are read on the MIG reader
 * (an NVML worker): the plan and the apply follow from its answer. */
static int apply_internal(MigManager *mm, const char *name, const char *file, bool force, bool request,
                          MigApplyDone cb, void *userdata, char **ret_error) {
        _cleanup_(mig_config_file_freep) MigConfigFile *cf = NULL;
        const MigConfig *config = NULL;
        int r;

        if (mig_manager_busy(mm)) {
                *ret_error = strprintf("A MIG apply (%s) is already running; try again when it has finished.",
                                       strna(mm->applying ?: mm->plan.name ?: mm->config_name));
                return -EBUSY;
        }

        r = load_config(file, name, &cf, &config, ret_error);
        if (r >= 0) {
                plan_done(mm);
                mm->plan.cf = TAKE_PTR(cf);
                mm->plan.config = config;
                mm->plan.force = force;
                mm->plan.request = request;
                if (!(mm->plan.name = strdup(name)) || (file && !(mm->plan.file = strdup(file))))
                        r = -ENOMEM;
                if (r >= 0)
                        r = gpu_addresses(mm, &mm->plan.addresses);
                if (r >= 0)
                        r = plan_read(mm, ret_error);
                if (r < 0)
                        plan_done(mm);
        }
        /* A request is in flight from now on (ApplyMigConfig() callers watch MigConfigState); a config
         * that waits for a reboot keeps saying so. */
        if (r >= 0 && request && !(streq_ptr(mm->config_name, name) && mm->state == MIG_CONFIG_REBOOTING)) {
                mm->plan.reported = true;
                mm->plan.prev_state = mm->state;
                if ((mm->config_name && !(mm->plan.prev_name = strdup(mm->config_name))) ||
                    (mm->message && !(mm->plan.prev_message = strdup(mm->message))))
                        mm->plan.reported = false;
                else
                        set_result(mm, name, MIG_CONFIG_PENDING, NULL);
        }
        if (r < 0) {
                if (!*ret_error)
                        *ret_error = strprintf("Cannot apply MIG config %s: %s.", name, strerror(-r));
                if (!(request && (r == -EINVAL || r == -EBUSY)))
                        set_result(mm, name, MIG_CONFIG_FAILED, *ret_error);
                return r;
        }
        mm->cb = cb;
        mm->userdata = userdata;
        return 0;
}

static int replace(char **p, const char *s) {
        char *c = NULL;
        if (s && !(c = strdup(s)))
                return -ENOMEM;
        free(*p);
        *p = c;
        return 0;
}

int mig_manager_apply(MigManager *mm, const char *name, const char *config_file, bool force, MigApplyDone cb,
                      void *userdata, char **ret_error) {
        const char *file = config_file ?: mm->node->config->mig.config_file;
        int r;

        assert(mm && name && ret_error);
        *ret_error = NULL;

        r = apply_internal(mm, name, file, force, true, cb, userdata, ret_error);
        /* The request is what the node should have from now on, also when it failed for a reason the
         * next pass may not have (NVML down). A busy apply is not a new request, and neither is one the
         * planner rejected: the previous selection stays. Once the GPUs are read, plan_with_states() and
         * plan_refuse() decide the same. */
        if (r == -ENODEV && remember_request(mm, name, config_file) < 0)
                return -ENOMEM;
        return r;
}

int mig_manager_apply_selected(MigManager *mm, MigApplyDone cb, void *userdata, char **ret_error) {
        const char *name, *file;

        *ret_error = NULL;
        mig_manager_selected(mm, &name, &file);
        if (isempty(name)) {
                /* Not managed (any more): no mig.config labels. */
                set_result(mm, NULL, MIG_CONFIG_SUCCESS, NULL);
                return -ENODATA;
        }
        return apply_internal(mm, name, file, false, false, cb, userdata, ret_error);
}

void mig_manager_refuse(MigManager *mm, const char *name, const char *message) {
        set_result(mm, name, MIG_CONFIG_FAILED, message);
}

void mig_manager_unmanage(MigManager *mm) {
        set_result(mm, NULL, MIG_CONFIG_SUCCESS, NULL);
}

/* ---- recovery ---- */

static int recover_plan(MigManager *mm, MigJournalContents *c_taken, MigGpuState *now, size_t n_now,
                        MigApplyDone cb, void *userdata, char **ret_message);

int mig_manager_recover(MigManager *mm, MigApplyDone cb, void *userdata, char **ret_message) {
        _cleanup_(mig_journal_contents_freep) MigJournalContents *c = NULL;
        _cleanup_free_ char *path = journal_path(mm), *error = NULL;
        int r;

        *ret_message = NULL;
        if (!path)
                return -ENOMEM;
        /* Once per start, except that a journal appearing later can only be one an apply of this run
         * left behind on purpose: a halt (a failed rollback), which blocks every automatic apply. */
        if (mm->journal_checked && access(path, F_OK) < 0)
                return 0;
        bool first = !mm->journal_checked;
        r = mig_journal_load(path, &c, &error);
        mm->journal_checked = true;
        if (r == -ENOENT)
                return 0;
        if (r < 0) {
                /* Keep it for a person to look at, out of the way of the next apply. */
                _cleanup_free_ char *broken = strprintf("%s.broken", path);
                if (broken)
                        (void) rename(path, broken);
                *ret_message = strprintf("%s; moved to %s.broken, nothing was rolled back", strna(error), path);
                mm->recovery_note = strdup(*ret_message);
                return r;
        }
        if (c->ended) {
                (void) mig_journal_remove(path);
                return 0;
        }
        if (c->halted) {
                /* A rollback failed there: trying the same steps again, or applying mig.selected on the
                 * next pass or start, would only touch the GPUs more. A person decides: an explicit apply
                 * replaces the journal. Looked at on every pass, so removing the file is enough too. */
                *ret_message = strprintf("A MIG apply of config %s stopped because the rollback of GPU %s failed "
                                         "(left with %s); MIG is not changed until someone checks the GPUs "
                                         "('gpunodectl mig show') and applies a config ('gpunodectl mig apply "
                                         "NAME'), or removes %s.", c->config, c->halted[strv_length(c->halted) - 1],
                                         strna(c->halted_left), path);
                set_result(mm, c->config, MIG_CONFIG_FAILED, *ret_message);
                return -ENOTRECOVERABLE;
        }
        if (!first)
                return 0; /* not a halt: an apply cancelled at shutdown; the next start recovers it */
        if (!mm->node->nvml_snapshot) {
                mm->journal_checked = false;
                *ret_message = strprintf("An interrupted apply of MIG config %s was found, but NVML is not "
                                         "available to roll it back; it is tried again on the next pass.", c->config);
                return -ENODEV;
        }

        /* The GPUs it had not finished are read on the MIG reader; the plan back follows from the answer. */
        plan_done(mm);
        for (size_t i = 0; i < c->n_previous; i++)
                if (!strv_contains(c->finished, c->previous[i].pci_address) &&
                    strv_extend(&mm->plan.addresses, c->previous[i].pci_address) < 0)
                        return -ENOMEM;
        if (!mm->plan.addresses)
                return recover_plan(mm, TAKE_PTR(c), NULL, 0, cb, userdata, ret_message);
        mm->plan.recovery = true;
        mm->plan.journal = TAKE_PTR(c);
        if (!(mm->plan.name = strdup(mm->plan.journal->config)))
                return -ENOMEM;
        r = plan_read(mm, &error);
        if (r < 0) {
                mm->journal_checked = false;
                *ret_message = strprintf("An interrupted apply of MIG config %s was found, but the GPUs cannot be "
                                         "read: %s; it is tried again on the next pass.", mm->plan.name, strna(error));
                plan_done(mm);
                return r;
        }
        mm->cb = cb;
        mm->userdata = userdata;
        *ret_message = strprintf("An interrupted apply of MIG config %s was found; reading the GPUs it had not "
                                 "finished.", mm->plan.name);
        return 1;
}

/* The recovery's plan from the GPUs as they are now (now: NULL when none needed reading): 0 nothing to
 * undo (the journal is removed), 1 an apply back to the recorded layouts runs (cb later), < 0 failed. */
static int recover_plan(MigManager *mm, MigJournalContents *c_taken, MigGpuState *now, size_t n_now,
                        MigApplyDone cb, void *userdata, char **ret_message) {
        _cleanup_(mig_journal_contents_freep) MigJournalContents *c = c_taken;
        _cleanup_(mig_plan_freep) MigPlan *plan = NULL;
        _cleanup_free_ char *path = journal_path(mm), *error = NULL;
        MigGpuState *before = NULL;
        int r;

        if (!path) {
                mig_gpu_states_free(now, n_now);
                return -ENOMEM;
        }
        plan = calloc(1, sizeof *plan);
        if (!plan || !(plan->config_name = strdup(c->config)) || !(plan->gpus = calloc(c->n_previous ?: 1, sizeof *plan->gpus))) {
                mig_gpu_states_free(now, n_now);
                return -ENOMEM;
        }
        for (size_t i = 0; i < c->n_previous; i++) {
                MigGpuState *prev = &c->previous[i];
                MigGpuState *g = (MigGpuState *) mig_state_find(now, n_now, prev->pci_address);
                MigGpuPlan p = {};

                if (strv_contains(c->finished, prev->pci_address))
                        continue;
                if (!g) {
                        *ret_message = strprintf("An interrupted apply of MIG config %s was found, but NVML does not "
                                                 "list GPU %s", c->config, prev->pci_address);
                        mig_gpu_states_free(now, n_now);
                        return -ENODEV;
                }
                g->index = prev->index;
                r = mig_restore_plan(g, prev, &p);
                if (r < 0) {
                        mig_gpu_states_free(now, n_now);
                        return r;
                }
                if (p.n_steps == 0) {
                        mig_gpu_plan_done(&p);
                        continue;
                }
                plan->gpus[plan->n_gpus++] = p;
        }
        mig_gpu_states_free(now, n_now);

        if (plan->n_gpus == 0 && strv_length(c->units) == 0) {
                (void) mig_journal_remove(path);
                *ret_message = strprintf("An interrupted apply of MIG config %s was found (%zu step%s journaled); "
                                         "the GPUs it had not finished were still in their previous layout.",
                                         c->config, c->n_steps, c->n_steps == 1 ? "" : "s");
                log_warning("%s", *ret_message);
                mm->recovery_note = strdup(*ret_message);
                return 0;
        }

        /* The previous layouts are both the targets and the journal's record, should this be interrupted too. */
        before = TAKE_PTR(c->previous);
        MigApplyOptions o = apply_options(mm, path, true);
        o.stop_units = NULL;
        o.stopped_units = c->units;
        o.restore = true;
        r = mig_apply_start(&o, TAKE_PTR(plan), before, c->n_previous, on_apply_finished, mm, &mm->apply, &error);
        c->n_previous = 0;
        if (r < 0) {
                *ret_message = TAKE_PTR(error);
                return r;
        }
        mm->cb = cb;
        mm->userdata = userdata;
        free(mm->applying);
        mm->applying = strdup(c->config);
        *ret_message = strprintf("An interrupted apply of MIG config %s was found (%zu step%s journaled); rolling "
                                 "the GPUs it had not finished back to their previous layout.", c->config, c->n_steps,
                                 c->n_steps == 1 ? "" : "s");
        log_warning("%s", *ret_message);
        mm->recovery_note = strdup(*ret_message);
        mm->recovering = true;
        set_result(mm, c->config, MIG_CONFIG_PENDING, NULL);
        return 1;
}

/* The answer of the recovery's read: plan the way back, or say why not (the outcome's message). */
static void recover_with_states(MigManager *mm, MigGpuState *states, size_t n_states) {
        MigJournalContents *c = TAKE_PTR(mm->plan.journal);
        MigApplyDone cb = mm->cb;
        void *ud = mm->userdata;
        char *name = TAKE_PTR(mm->plan.name), *message = NULL;
        int r;

        mm->cb = NULL;
        mm->userdata = NULL;
        plan_done(mm);
        r = recover_plan(mm, c, states, n_states, cb, ud, &message);
        if (r > 0) {
                free(name);
                free(message);
                return;
        }
        if (r < 0) {
                log_error("MIG journal: %s", strna(message));
                free(mm->recovery_note);
                mm->recovery_note = message ? strdup(message) : NULL;
        }
        /* Nothing to undo, or it cannot be: the mig stage goes on with the selected config. */
        mm->plan.name = name;
        mm->cb = cb;
        mm->userdata = ud;
        plan_deliver(mm, (MigApplyOutcome) { .error = r < 0 ? r : 0, .state = r < 0 ? "failed" : "success",
                                             .refused = r < 0 }, message);
}

char *mig_manager_take_recovery_note(MigManager *mm) {
        return TAKE_PTR(mm->recovery_note);
}

/* ---- assert and export ---- */

/* The assert report for states (taken): 1 match, 0 not, < 0 with the reason in *ret_report. */
static int assert_report(const MigConfig *config, const char *name, MigGpuState *states, size_t n_states,
                         char **ret_report) {
        _cleanup_(mig_plan_freep) MigPlan *plan = NULL;
        _cleanup_strv_free_ char **lines = NULL;
        int r;

        r = mig_plan_build(config, states, n_states, &plan, ret_report);
        if (r < 0) {
                mig_gpu_states_free(states, n_states);
                return r;
        }

        for (size_t i = 0; i < plan->n_gpus; i++) {
                const MigGpuPlan *p = &plan->gpus[i];
                const MigGpuState *g = mig_state_find(states, n_states, p->pci_address);
                _cleanup_strv_free_ char **steps = NULL;
                _cleanup_free_ char *have = g ? mig_state_layout_summary(g) : NULL, *joined = NULL;

                for (size_t k = 0; k < p->n_steps; k++)
                        if (strv_consume(&steps, mig_step_to_string(&p->steps[k])) < 0)
                                goto oom;
                joined = strv_join(steps, ", ");
                if (strv_extendf(&lines, "GPU %u (%s) does not match %s: it has %s; applying it would: %s", p->gpu,
                                 p->pci_address, name, strna(have), strna(joined)) < 0)
                        goto oom;
        }
        if (plan->n_gpus == 0 && strv_extendf(&lines, "The GPUs match MIG config %s.", name) < 0)
                goto oom;
        if (plan->n_unmanaged > 0) {
                _cleanup_free_ char *note = unmanaged_note(plan, name);
                if (!note || strv_extend(&lines, note) < 0)
                        goto oom;
        }
        mig_gpu_states_free(states, n_states);
        *ret_report = strv_join(lines, "\n");
        return *ret_report ? plan->n_gpus == 0 : -ENOMEM;
oom:
        mig_gpu_states_free(states, n_states);
        return -ENOMEM;
}

/* ---- assert and export with the reads in an NVML worker ---- */

struct MigRead {
        MigManager *mm;
        MigRead *next;
        GpuNvmlWorker *worker;
        sd_event_source *defer;       /* frees us after the answer (not from inside the worker's callback) */
        char **addresses;             /* the job's input, in the worker's memory at the fork */
        bool answered;                /* cb was called; freed from the next iteration (defer) */
        MigConfigFile *cf;            /* assert: the loaded file and config; NULL: export */
        const MigConfig *config;
        char *name;
        MigReportDone cb;
        void *userdata;
};

static MigRead *mig_read_free(MigRead *rd) {
        if (!rd)
                return NULL;
        gpu_nvml_worker_free(rd->worker);
        sd_event_source_disable_unref(rd->defer);
        strv_free(rd->addresses);
        mig_config_file_free(rd->cf);
        free(rd->name);
        return mfree(rd);
}

static void mig_read_unlink(MigRead *rd) {
        for (MigRead **p = &rd->mm->reads; *p; p = &(*p)->next)
                if (*p == rd) {
                        *p = rd->next;
                        break;
                }
        rd->next = NULL;
}

static int on_read_free(sd_event_source *s, void *userdata) {
        MigRead *rd = userdata;

        mig_read_unlink(rd);
        mig_read_free(rd);
        return 0;
}

static void on_read_done(GpuNvmlWorker *w, int r, const uint8_t *data, size_t len, const char *error,
                         void *userdata) {
        MigRead *rd = userdata;
        _cleanup_free_ char *report = NULL;
        MigGpuState *states = NULL;
        size_t n = 0;

        rd->answered = true;
        if (r >= 0) {
                r = mig_states_job_result(data, len, &states, &n);
                if (r < 0)
                        report = strdup("the NVML worker sent a malformed answer");
        } else
                report = strdup(error ?: "NVML failed");
        if (r >= 0) {
                if (rd->cf)
                        r = assert_report(rd->config, rd->name, states, n, &report);
                else {
                        r = mig_export_yaml(states, n, "current", &report);
                        mig_gpu_states_free(states, n);
                }
        }
        rd->cb(rd->mm, r, report, rd->userdata);
        /* The worker is still in its callback: free from the next iteration. */
        if (sd_event_add_defer(rd->mm->node->event, &rd->defer, on_read_free, rd) < 0)
                return; /* out of memory: it stays listed, and goes with the MigManager */
        (void) sd_event_source_set_description(rd->defer, "mig-read-free");
}

static void mig_reads_cancel(MigManager *mm) {
        while (mm->reads) {
                MigRead *rd = mm->reads;

                mm->reads = rd->next;
                if (!rd->answered)
                        rd->cb(mm, -ECANCELED, "The agent is shutting down.", rd->userdata);
                mig_read_free(rd);
        }
}

static int start_read(MigManager *mm, MigConfigFile *cf, const MigConfig *config, const char *name,
                      MigReportDone cb, void *userdata, char **ret_error) {
        MigRead *rd;
        int r;

        if (!mm->node->nvml_snapshot) {
                mig_config_file_free(cf);
                *ret_error = strdup("NVML is not available (see the nvml stage); the MIG layout cannot be read.");
                return -ENODEV;
        }
        /* A reader of its own would open /dev/nvidia* while the driver is taken out, and keep it. */
        if (node_driver_removing(mm->node)) {
                mig_config_file_free(cf);
                *ret_error = strdup(NODE_DRIVER_REMOVING_MESSAGE);
                return -EBUSY;
        }
        rd = calloc(1, sizeof *rd);
        if (!rd) {
                mig_config_file_free(cf);
                return -ENOMEM;
        }
        *rd = (MigRead) { .mm = mm, .cf = cf, .config = config, .cb = cb, .userdata = userdata };
        r = gpu_addresses(mm, &rd->addresses);
        if (r >= 0 && name && !(rd->name = strdup(name)))
                r = -ENOMEM;
        if (r >= 0)
                r = gpu_nvml_worker_new(mm->node->event, &rd->worker);
        if (r >= 0) {
                r = gpu_nvml_worker_job(rd->worker, mm->node->config->nvml.library, -1,
                                        mm->node->config->nvml.timeout_usec, mig_states_job, rd->addresses,
                                        on_read_done, rd);
                if (r < 0)
                        *ret_error = strprintf("Cannot start the NVML worker to read the MIG layout: %s", strerror(-r));
        }
        if (r < 0) {
                mig_read_free(rd);
                return r;
        }
        rd->next = mm->reads;
        mm->reads = rd;
        return 0;
}

int mig_manager_assert_async(MigManager *mm, const char *name, const char *config_file, MigReportDone cb,
                             void *userdata, char **ret_error) {
        MigConfigFile *cf = NULL;
        const MigConfig *config = NULL;
        int r;

        *ret_error = NULL;
        r = load_config(config_file ?: mm->node->config->mig.config_file, name, &cf, &config, ret_error);
        if (r < 0)
                return r;
        return start_read(mm, cf, config, name, cb, userdata, ret_error);
}

int mig_manager_export_async(MigManager *mm, MigReportDone cb, void *userdata, char **ret_error) {
        *ret_error = NULL;
        return start_read(mm, NULL, NULL, NULL, cb, userdata, ret_error);
}
