/* SPDX-License-Identifier: MIT */
/* Owns the asynchronous MIG apply (see mig-apply.h): the phases (hook units down, busy check, one GPU per
 * event-loop iteration, hook units up), the GPU reset child process, the NVML writes in a worker process
 * (o.library: a forked worker per run of steps, with per-call deadlines; a hang or crash there fails the
 * GPU in words naming the call and is rolled back like any failed step), rollback of a failing GPU, the
 * journal's begin/end, and the result. With o.library every NVML call of the apply runs in such a worker
 * (the steps, the reads after them that the result line and a rollback need, the busy check); without
 * it (tests of the in-process path only) on o.nvml. */
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "string-table.h"
#include "fabric.h"
#include "fileio.h"
#include "gpu-nvml-worker.h"
#include "mig-apply.h"
#include "mig-state.h"
#include "spawn-child.h"
#include "strv.h"

/* SIGTERM → SIGKILL for a reset that overran its timeout. */
#define RESET_KILL_GRACE_USEC (2 * USEC_PER_SEC)

DEFINE_CLEANUP_FUNC(FabricOp *, fabric_op_free);

static const char *const config_state_table[_MIG_CONFIG_STATE_MAX] = {
        [MIG_CONFIG_SUCCESS] = "success",
        [MIG_CONFIG_PENDING] = "pending",
        [MIG_CONFIG_REBOOTING] = "rebooting",
        [MIG_CONFIG_FAILED] = "failed",
};

DEFINE_STRING_TABLE_LOOKUP(mig_config_state, MigConfigState, config_state_table, _MIG_CONFIG_STATE_MAX,
                           _MIG_CONFIG_STATE_INVALID)

typedef enum Phase {
        PHASE_STOP_UNITS,
        PHASE_BUSY,
        PHASE_GPUS,
        PHASE_START_UNITS,
        PHASE_DONE,
} Phase;

struct MigApply {
        MigApplyOptions o;            /* strings below are our copies */
        char **stop_units;
        char *reset_program;
        char *journal_path;
        char *library;

        MigPlan *plan;
        MigGpuState *before;
        size_t n_before;
        MigJournal *journal;
        MigApplyFinished cb;
        void *userdata;

        Phase phase;
        sd_event_source *defer;
        FabricOp *op;
        size_t unit_index;
        char **stopped;               /* hook units stopped, in stop order */
        size_t n_stopped_before;      /* of them, stopped by an earlier, interrupted apply */

        size_t gpu;                   /* plan->gpus index */
        MigGpuRun run, rollback_run;
        MigGpuPlan rollback;
        bool run_active, rolling_back;
        bool reset_done;              /* the current run had its reset: still pending now is a failure */
        char *gpu_error;

        GpuNvmlWorker *worker;        /* runs the NVML writes (o.library set), NULL: in-process */
        MigGpuStepsJob job;           /* the worker's input, read by it at the fork */
        bool job_answered;            /* the worker answered: job_r/job_error wait for gpu_step() */
        int job_r;
        char *job_error;
        MigGpuStepsAnswer answer;     /* what the last steps job read after its steps */
        bool rollback_read;           /* a read-only job reads the GPU to plan its rollback */
        unsigned *procs;              /* the busy job's answer, per plan GPU */

        Spawn *reset;                 /* the GPU reset child, NULL when none runs */
        char *reset_output;           /* the last non-empty line it printed */

        char **changed_gpus;          /* PCI addresses of the GPUs written to */
        NvmlSnapshot *mig_devices;    /* their MIG devices as the jobs read them after the steps */
        bool mig_devices_incomplete;  /* a GPU written to has none there: the caller reads them */
        char **lines;                 /* per GPU and per problem: the result message */
        char **log;
        int error;
        bool failed, rebooting, changed;
        bool halted;                  /* a rollback failed: no other GPU may be touched */
};

static void schedule(MigApply *a);

static void fail(MigApply *a, int r, char *line) {
        if (a->error == 0)
                a->error = r < 0 ? r : -EIO;
        a->failed = true;
        if (line) {
                (void) strv_extend(&a->log, line);
                (void) strv_consume(&a->lines, line);
        }
}

static void note(MigApply *a, char *line) {
        if (line)
                (void) strv_consume(&a->log, line);
}

static const MigGpuState *before_of(MigApply *a, const MigGpuPlan *p) {
        return mig_state_find(a->before, a->n_before, p->pci_address);
}

/* ---- the GPU reset child ---- */

static void on_reset_line(Spawn *child, const char *line, void *userdata) {
        MigApply *a = userdata;
        char *copy;

        if (isempty(line) || !(copy = strdup(line)))
                return;
        free(a->reset_output);
        a->reset_output = copy;
}

static void on_reset_exit(Spawn *child, const SpawnResult *res, void *userdata) {
        MigApply *a = userdata;
        const MigGpuPlan *p = &a->plan->gpus[a->gpu];
        _cleanup_free_ char *out = TAKE_PTR(a->reset_output);

        a->reset = spawn_free(a->reset);
        if (res->exit_status != 0) {
                free(a->gpu_error);
                a->gpu_error = res->timed_out
                        ? strprintf("GPU %u (%s): the GPU reset (%s -r -i) did not finish within %" PRIu64 "s%s",
                                    p->gpu, p->pci_address, a->reset_program,
                                    (a->o.reset_timeout_usec ?: MIG_RESET_TIMEOUT_USEC) / USEC_PER_SEC,
                                    res->abandoned ? " and does not end even after SIGKILL (stuck in the kernel)" : "")
                        : strprintf("GPU %u (%s): the GPU reset (%s -r -i) failed with %s %d%s%s", p->gpu,
                                    p->pci_address, a->reset_program,
                                    res->exit_status >= 0 ? "exit status" : "signal",
                                    res->exit_status >= 0 ? res->exit_status : res->signal,
                                    out ? ": " : "", out ?: "");
        } else {
                note(a, strprintf("GPU %u (%s): reset to activate the MIG mode change.", p->gpu, p->pci_address));
                if (a->o.gpu_reset)
                        a->o.gpu_reset(p->pci_address, a->o.gpu_reset_userdata);
        }
        schedule(a);
}

static int spawn_reset(MigApply *a, const char *pci_address, char **ret_error) {
        unsigned domain, bus, dev, fn;
        char bus_id[32];
        char *argv[] = { a->reset_program, (char *) "-r", (char *) "-i", bus_id, NULL };
        SpawnOptions o = {
                .timeout_usec = a->o.reset_timeout_usec ?: MIG_RESET_TIMEOUT_USEC,
                .kill_grace_usec = RESET_KILL_GRACE_USEC,
                .capture = true,
                .on_line = on_reset_line,
                .on_exit = on_reset_exit,
                .userdata = a,
        };
        int r;

        if (sscanf(pci_address, "%x:%x:%x.%x", &domain, &bus, &dev, &fn) != 4)
                return -EINVAL;
        snprintf(bus_id, sizeof bus_id, "%08X:%02X:%02X.%X", domain, bus, dev, fn);

        a->reset_output = mfree(a->reset_output);
        if (a->o.gpu_reset_prepare)
                a->o.gpu_reset_prepare(pci_address, a->o.gpu_reset_userdata);
        r = spawn_start(a->o.event, argv, &o, &a->reset);
        if (r < 0)
                *ret_error = strprintf("Cannot run %s to reset GPU %s: %s (install nvidia-smi, or reset the GPU "
                                       "yourself and apply again)", a->reset_program, pci_address,
                                       r == -ENOENT ? "not found" : strerror(-r));
        return r;
}

/* ---- the NVML writes in a worker ---- */

static void on_steps_done(GpuNvmlWorker *w, int r, const uint8_t *data, size_t len, const char *error,
                          void *userdata) {
        MigApply *a = userdata;
        const MigGpuPlan *p = &a->plan->gpus[a->gpu];
        MigGpuRun *run = a->rolling_back ? &a->rollback_run : &a->run;

        a->job_error = mfree(a->job_error);
        mig_gpu_steps_answer_done(&a->answer);
        if (r < 0) {
                /* A hang or a crash: the worker names the call; what it wrote before is in the journal.
                 * Its sentence becomes one clause of the result line: no full stop. */
                size_t n = error ? strlen(error) : 0;
                a->job_error = strprintf("GPU %u (%s): %.*s", p->gpu, p->pci_address,
                                         (int) (n > 0 && error[n - 1] == '.' ? n - 1 : n), strna(error));
        }
        else
                r = mig_gpu_steps_job_result(run, data, len, &a->answer, &a->job_error);
        a->job_r = r;
        a->job_answered = true;
        schedule(a);
}

static int start_job(MigApply *a, GpuNvmlJobFunc fn, void *input, GpuNvmlJobDone done, int gpu) {
        /* The worker is a fork: it must not inherit a library this process has initialised (its state
         * would point at descriptors the fork closes). The owner releases its own handle here. */
        if (a->o.release_nvml)
                a->o.release_nvml(a->o.release_userdata);
        return gpu_nvml_worker_job(a->worker, a->o.library, gpu, a->o.call_timeout_usec, fn, input, done, a);
}

/* The GPU's memory size in the daemon's snapshot (0: unknown). */
static uint64_t memory_of(MigApply *a, const char *pci_address) {
        const NvmlSnapshot *s = a->o.snapshot ? *a->o.snapshot : NULL;

        for (size_t i = 0; s && i < s->n_gpus; i++)
                if (streq(s->gpus[i].pci_address, pci_address))
                        return s->gpus[i].memory_total_bytes;
        return 0;
}

/* The steps of run from run->next (none when read_only): like mig_gpu_run_steps(), or 2 when a worker
 * runs them (on_steps_done() schedules us again; a->answer then holds what it read after them). */
static int run_steps(MigApply *a, MigGpuRun *run, bool read_only, char **ret_error) {
        const MigGpuPlan *p = &a->plan->gpus[a->gpu];
        int r;

        if (a->job_answered) {
                a->job_answered = false;
                *ret_error = TAKE_PTR(a->job_error);
                return a->job_r;
        }
        if (!a->worker)
                return mig_gpu_run_steps(a->o.nvml, run, a->journal, ret_error);

        mig_gpu_steps_answer_done(&a->answer);
        a->job = (MigGpuStepsJob) {
                .run = run,
                .journal = a->journal,
                .restore_to = !a->rolling_back && !a->o.restore ? before_of(a, p) : NULL,
                .known = before_of(a, p),
                .read_only = read_only,
                .derive = !a->rolling_back,
                .memory_total_bytes = memory_of(a, p->pci_address),
                .seen = a->mig_devices,
                .before = a->before,
                .n_before = a->n_before,
        };
        if (a->o.session_job) {
                _cleanup_(wire_buf_done) WireBuf in = {};

                if (mig_gpu_steps_input(&a->job, &in) >= 0 &&
                    a->o.session_job(a->o.session_userdata, in.data, in.len, mig_gpu_steps_read, on_steps_done, a) >= 0)
                        return 2;
                /* Busy or not there: a worker of its own. */
        }
        r = start_job(a, mig_gpu_steps_job, &a->job, on_steps_done, (int) p->gpu);
        if (r < 0) {
                *ret_error = strprintf("GPU %u (%s): cannot start the NVML worker for the MIG change: %s", p->gpu,
                                       p->pci_address, strerror(-r));
                return r;
        }
        return 2;
}

/* ---- the busy check in a worker: compute processes per GPU of the plan ---- */

static int busy_job(GpuNvml *n, void *userdata, struct WireBuf *out, char **ret_error) {
        const MigPlan *plan = userdata;

        wire_put_u64(out, plan->n_gpus);
        for (size_t i = 0; i < plan->n_gpus; i++) {
                nvmlDevice_t d;
                unsigned procs = 0;

                if (mig_state_device(n, plan->gpus[i].pci_address, &d) < 0 || mig_state_processes(n, d, &procs) < 0)
                        procs = 0;
                wire_put_u32(out, procs);
        }
        return 0;
}

static void on_busy_done(GpuNvmlWorker *w, int r, const uint8_t *data, size_t len, const char *error,
                         void *userdata) {
        MigApply *a = userdata;
        WireReader rd = { .p = data, .left = len };

        free(a->procs);
        a->procs = NULL;
        a->job_error = mfree(a->job_error);
        if (r >= 0) {
                uint64_t n = wire_get_u64(&rd);
                if (rd.bad || n != a->plan->n_gpus || !(a->procs = calloc(n ?: 1, sizeof *a->procs)))
                        r = -EBADMSG;
                for (size_t i = 0; r >= 0 && i < n; i++)
                        a->procs[i] = wire_get_u32(&rd);
                if (rd.bad)
                        r = -EBADMSG;
        }
        if (r < 0)
                a->job_error = strprintf("Checking the GPUs for compute processes before the MIG change failed: %s; "
                                         "nothing was changed", error ?: strerror(-r));
        a->job_r = r;
        a->job_answered = true;
        schedule(a);
}

/* ---- one GPU ---- */

/* Moves the one GpuInfo of devices into a->mig_devices. */
static void mig_devices_add(MigApply *a, NvmlSnapshot *devices) {
        GpuInfo *l;

        if (!a->mig_devices && !(a->mig_devices = calloc(1, sizeof *a->mig_devices))) {
                a->mig_devices_incomplete = true;
                return;
        }
        l = realloc(a->mig_devices->gpus, (a->mig_devices->n_gpus + 1) * sizeof *l);
        if (!l) {
                a->mig_devices_incomplete = true;
                return;
        }
        a->mig_devices->gpus = l;
        l[a->mig_devices->n_gpus++] = devices->gpus[0];
        devices->gpus[0] = (GpuInfo) {};
        devices->n_gpus = 0;
}

NvmlSnapshot *mig_apply_take_mig_devices(MigApply *a) {
        if (!a || a->mig_devices_incomplete || !a->changed)
                return NULL;
        return TAKE_PTR(a->mig_devices);
}

static void gpu_finish(MigApply *a, const char *result) {
        const MigGpuPlan *p = &a->plan->gpus[a->gpu];

        if (a->journal)
                (void) mig_journal_gpu_end(a->journal, p->pci_address, result);
        if (a->run.wrote || a->rollback_run.wrote) {
                a->changed = true;
                (void) strv_extend(&a->changed_gpus, p->pci_address);
                /* The job of the last steps read the GPU's MIG devices when all of them succeeded. */
                if (streq(result, "done") && !a->rollback_run.wrote && a->answer.devices)
                        mig_devices_add(a, a->answer.devices);
                else
                        a->mig_devices_incomplete = true;
        }
        mig_gpu_run_done(&a->run);
        mig_gpu_run_done(&a->rollback_run);
        mig_gpu_plan_done(&a->rollback);
        a->run_active = a->rolling_back = a->reset_done = false;
        a->gpu_error = mfree(a->gpu_error);
        a->gpu++;
}

static int start_rollback(MigApply *a, char **ret_error) {
        const MigGpuPlan *p = &a->plan->gpus[a->gpu];
        const MigGpuState *prev = before_of(a, p);
        _cleanup_(mig_gpu_state_done) MigGpuState now = {};
        int r;

        if (!prev)
                return -ENOENT;
        if (a->worker) {
                /* The plan back comes from the worker, which read the GPU after the failure. */
                if (a->answer.rollback_r == 0)
                        return 2; /* it could not say (a hang or crash): a read-only job asks again */
                if (a->answer.rollback_r < 0) {
                        *ret_error = strprintf("GPU %u (%s): cannot read it: %s", p->gpu, p->pci_address,
                                               strna(a->answer.rollback_error));
                        return -EIO;
                }
                a->rollback = a->answer.rollback;
                a->answer.rollback = (MigGpuPlan) {};
                a->answer.rollback_r = 0;
                r = mig_gpu_run_prepare(&a->rollback, &a->rollback_run);
                if (r < 0)
                        return r;
                a->rolling_back = true;
                a->reset_done = false;
                return 0;
        }
        r = mig_state_read_gpu(a->o.nvml, p->pci_address, p->gpu, &now, ret_error);
        if (r < 0)
                return r;
        r = mig_restore_plan(&now, prev, &a->rollback);
        if (r < 0)
                return r;
        r = mig_gpu_run_init(a->o.nvml, &a->rollback, &a->rollback_run);
        if (r < 0)
                return r;
        a->rolling_back = true;
        a->reset_done = false;
        return 0;
}

/* The rollback of the current GPU failed (or could not start): it is left half-done, so the apply stops
 * here. The journal records it and is kept, so that the next start reports it instead of trying again;
 * the message names the GPU and what is left on it. */
static void halt(MigApply *a, int r, const char *why) {
        const MigGpuPlan *p = &a->plan->gpus[a->gpu];
        _cleanup_(mig_gpu_state_done) MigGpuState now = {};
        _cleanup_free_ char *left = NULL;

        if (a->worker)
                left = a->answer.summary ? strdup(a->answer.summary) : NULL;
        else if (mig_state_read_gpu(a->o.nvml, p->pci_address, p->gpu, &now, NULL) >= 0)
                left = mig_state_layout_summary(&now);
        if (a->journal)
                (void) mig_journal_halt(a->journal, p->pci_address, left ?: "unknown (NVML cannot read it)");
        fail(a, r, strprintf("%s; GPU %u (%s) is left with %s: the apply stopped there and touched no other GPU",
                             why, p->gpu, p->pci_address, left ?: "a layout NVML cannot read"));
        a->halted = true;
        gpu_finish(a, "halted");
}

/* Runs the current GPU as far as it goes now. Returns true when it is finished. */
static bool gpu_step(MigApply *a) {
        const MigGpuPlan *p = &a->plan->gpus[a->gpu];
        _cleanup_free_ char *err = NULL;
        int r;

        if (!a->run_active) {
                r = a->worker ? mig_gpu_run_prepare(p, &a->run) : mig_gpu_run_init(a->o.nvml, p, &a->run);
                if (r < 0) {
                        fail(a, r, strprintf("GPU %u (%s): NVML does not answer for it: %s", p->gpu, p->pci_address,
                                             strerror(-r)));
                        gpu_finish(a, "failed");
                        return true;
                }
                a->run_active = true;
        }

        for (;;) {
                MigGpuRun *run = a->rolling_back ? &a->rollback_run : &a->run;

                if (a->rollback_read) {
                        /* The steps failed in a way that left no reading of the GPU (a hang, a crash):
                         * read it now, in a fresh worker, to plan the rollback. */
                        r = run_steps(a, &a->run, true, &err);
                        if (r == 2)
                                return false;
                        a->rollback_read = false;
                        if (r >= 0)
                                r = start_rollback(a, &err);
                        if (r == 2)
                                r = -EIO;
                        if (r < 0) {
                                _cleanup_free_ char *why = strprintf("GPU %u (%s): cannot roll back to the previous "
                                                                     "layout: %s", p->gpu, p->pci_address,
                                                                     err ? err : strerror(-r));
                                halt(a, r, strna(why));
                                return true;
                        }
                        continue;
                }

                if (a->gpu_error)
                        r = -EIO; /* the reset failed */
                else {
                        r = run_steps(a, run, false, &err);
                        if (r == 2)
                                return false; /* on_steps_done() schedules us again */
                }

                if (r == MIG_GPU_RUN_NEEDS_RESET) {
                        if (!a->o.reset_auto) {
                                a->rebooting = true;
                                (void) strv_consume(&a->lines, strprintf(
                                        "GPU %u (%s): the MIG mode change waits for a GPU reset or a reboot "
                                        "(mig.reset: never)%s", p->gpu, p->pci_address,
                                        a->rolling_back ? " to finish the rollback" : ""));
                                gpu_finish(a, "rebooting");
                                return true;
                        }
                        if (a->reset_done) {
                                err = strprintf("GPU %u (%s): the MIG mode change is still pending after the GPU "
                                                "reset", p->gpu, p->pci_address);
                                r = -EIO;
                        } else {
                                r = spawn_reset(a, p->pci_address, &err);
                                if (r >= 0) {
                                        a->reset_done = true;
                                        return false; /* on_reset_exit() schedules us again */
                                }
                        }
                }
                if (r >= 0)
                        break;

                /* A failure: of the apply (roll back) or of the rollback (give up, report both). */
                if (!err && a->gpu_error)
                        err = TAKE_PTR(a->gpu_error);
                a->gpu_error = mfree(a->gpu_error);
                if (a->rolling_back || a->o.restore) {
                        _cleanup_free_ char *why = strprintf("%s%s", strna(err), a->rolling_back
                                                             ? "; the rollback to the previous layout failed too" : "");
                        halt(a, r, strna(why));
                        return true;
                }
                fail(a, r, TAKE_PTR(err));
                r = start_rollback(a, &err);
                if (r == 2) {
                        a->rollback_read = true;
                        continue;
                }
                if (r < 0) {
                        _cleanup_free_ char *why = strprintf("GPU %u (%s): cannot roll back to the previous layout: %s",
                                                             p->gpu, p->pci_address, err ? err : strerror(-r));
                        halt(a, r, strna(why));
                        return true;
                }
        }

        if (a->rolling_back) {
                (void) strv_consume(&a->lines, strprintf("GPU %u (%s): rolled back to the previous layout", p->gpu,
                                                         p->pci_address));
                gpu_finish(a, "rolled-back");
                return true;
        }

        _cleanup_(mig_gpu_state_done) MigGpuState now = {};
        _cleanup_free_ char *summary = NULL;
        if (a->worker)
                summary = a->answer.summary ? strdup(a->answer.summary) : NULL;
        else if (mig_state_read_gpu(a->o.nvml, p->pci_address, p->gpu, &now, NULL) >= 0)
                summary = mig_state_layout_summary(&now);
        (void) strv_consume(&a->lines, strprintf("GPU %u (%s): %s", p->gpu, p->pci_address, strna(summary)));
        gpu_finish(a, "done");
        return true;
}

/* ---- hook units ---- */

/* The fabric callbacks' info and message live in op: it is freed only once they are used. */
static void on_unit_stopped(FabricOp *op, int r, const char *message, void *userdata) {
        MigApply *a = userdata;
        const char *unit = a->stop_units[a->unit_index];
        _unused_ _cleanup_(fabric_op_freep) FabricOp *done = TAKE_PTR(a->op);

        if (r < 0) {
                fail(a, r, strprintf("Stopping %s before the MIG change failed: %s; nothing was changed",
                                     unit, strna(message)));
                a->phase = PHASE_START_UNITS;
                a->unit_index = strv_length(a->stopped);
        } else {
                note(a, strprintf("Stopped %s for the MIG change.", unit));
                (void) strv_extend(&a->stopped, unit);
                if (a->journal)
                        (void) mig_journal_unit(a->journal, unit);
                a->unit_index++;
        }
        schedule(a);
}

static void on_unit_query(FabricOp *op, int r, const FabricUnitInfo *info, const char *message, void *userdata) {
        MigApply *a = userdata;
        const char *unit = a->stop_units[a->unit_index];
        _unused_ _cleanup_(fabric_op_freep) FabricOp *done = TAKE_PTR(a->op);

        if (r >= 0 && info->installed &&
            (streq_ptr(info->active_state, "active") || streq_ptr(info->active_state, "activating") ||
             streq_ptr(info->active_state, "reloading"))) {
                r = fabric_unit_stop(a->o.bus, unit, a->o.unit_timeout_usec, on_unit_stopped, a, &a->op);
                if (r >= 0)
                        return;
                message = strerror(-r);
        }
        if (r < 0) {
                on_unit_stopped(NULL, r, message, a);
                return;
        }
        /* Not running (or not installed): nothing to stop, and nothing to start afterwards. */
        a->unit_index++;
        schedule(a);
}

static void on_unit_started(FabricOp *op, int r, const char *message, void *userdata) {
        MigApply *a = userdata;
        const char *unit = a->stopped[a->unit_index];
        _unused_ _cleanup_(fabric_op_freep) FabricOp *done = TAKE_PTR(a->op);

        if (r < 0)
                fail(a, r, strprintf("Starting %s again after the MIG change failed: %s", unit, strna(message)));
        else
                note(a, strprintf("Started %s again.", unit));
        schedule(a);
}

/* ---- the phases ---- */

static void finish(MigApply *a) {
        _cleanup_free_ char *message = NULL;
        MigApplyResult res = {
                .state = a->failed ? MIG_CONFIG_FAILED : a->rebooting ? MIG_CONFIG_REBOOTING : MIG_CONFIG_SUCCESS,
                .error = a->error,
                .changed = a->changed,
                .changed_gpus = a->changed_gpus,
                .log = a->log,
        };

        if (a->journal) {
                /* After a halt the journal stays unfinished, with its halt record, for the next start. */
                if (!a->halted)
                        (void) mig_journal_end(a->journal, mig_config_state_to_string(res.state));
                a->journal = mig_journal_free(a->journal);
        }
        message = a->lines ? strv_join(a->lines, "; ") : strdup(a->plan->n_gpus == 0 ? "no change needed" : "done");
        res.message = message;
        if (a->cb) {
                MigApplyFinished cb = a->cb;
                a->cb = NULL;
                cb(a, &res, a->userdata); /* may free a */
        }
}

static void advance(MigApply *a) {
        switch (a->phase) {

        case PHASE_STOP_UNITS:
                if (!a->o.bus) {
                        if (strv_length(a->stop_units) > 0)
                                note(a, strprintf("No D-Bus connection (--oneshot): the hook units (%s) are not "
                                                  "stopped around the MIG change.", strv_length(a->stop_units) == 1
                                                  ? a->stop_units[0] : "mig.hooks.stop-units"));
                        a->phase = PHASE_BUSY;
                        break;
                }
                if (a->unit_index < strv_length(a->stop_units)) {
                        int r = fabric_unit_query(a->o.bus, a->stop_units[a->unit_index], on_unit_query, a, &a->op);
                        if (r < 0)
                                on_unit_query(NULL, r, NULL, strerror(-r), a);
                        return;
                }
                a->phase = PHASE_BUSY;
                break;

        case PHASE_BUSY:
                /* The GPUs were read just before the plan (mig_apply_start() refuses a busy one): only when
                 * hook units were stopped since can that have changed, and only then is it asked again. */
                if (!a->o.force && a->worker && a->plan->n_gpus > 0 && strv_length(a->stopped) > a->n_stopped_before) {
                        if (!a->job_answered) {
                                int r = start_job(a, busy_job, a->plan, on_busy_done, -1);
                                if (r >= 0)
                                        return; /* on_busy_done() schedules us again */
                                a->job_r = r;
                                a->job_error = strprintf("Cannot start the NVML worker to check the GPUs for compute "
                                                         "processes: %s; nothing was changed", strerror(-r));
                        }
                        a->job_answered = false;
                        if (a->job_r < 0) {
                                fail(a, a->job_r, TAKE_PTR(a->job_error));
                                a->phase = PHASE_START_UNITS;
                                a->unit_index = strv_length(a->stopped);
                                break;
                        }
                }
                a->phase = PHASE_GPUS;
                for (size_t i = 0; !a->o.force && i < a->plan->n_gpus; i++) {
                        const MigGpuPlan *p = &a->plan->gpus[i];
                        nvmlDevice_t d;
                        unsigned procs = 0;

                        if (a->worker)
                                procs = a->procs ? a->procs[i] : 0;
                        else if (mig_state_device(a->o.nvml, p->pci_address, &d) < 0 ||
                                 mig_state_processes(a->o.nvml, d, &procs) < 0)
                                procs = 0;
                        if (procs == 0)
                                continue;
                        fail(a, -EBUSY, strprintf("GPU %u (%s) still has %u compute process%s after the hook units "
                                                  "stopped; nothing was changed (stop the workloads, or apply with "
                                                  "force)", p->gpu, p->pci_address, procs, procs == 1 ? "" : "es"));
                        a->phase = PHASE_START_UNITS;
                }
                a->unit_index = strv_length(a->stopped);
                break;

        case PHASE_GPUS:
                if (a->halted && a->gpu < a->plan->n_gpus) {
                        _cleanup_strv_free_ char **rest = NULL;
                        for (size_t i = a->gpu; i < a->plan->n_gpus; i++)
                                (void) strv_extendf(&rest, "%u", a->plan->gpus[i].gpu);
                        _cleanup_free_ char *list = strv_join(rest, ", ");
                        (void) strv_consume(&a->lines, strprintf("GPU%s %s not touched", strv_length(rest) == 1 ? "" : "s",
                                                                 strna(list)));
                        a->gpu = a->plan->n_gpus;
                }
                if (a->gpu < a->plan->n_gpus) {
                        if (!gpu_step(a))
                                return; /* a reset child or the NVML worker runs */
                        if (a->gpu < a->plan->n_gpus)
                                break;  /* the next GPU from the next iteration: D-Bus gets its turn */
                }
                a->phase = PHASE_START_UNITS;
                a->unit_index = strv_length(a->stopped);
                break;

        case PHASE_START_UNITS:
                if (a->unit_index > 0 && a->o.bus) {
                        a->unit_index--;
                        FabricStartOptions so = { .timeout_usec = a->o.unit_timeout_usec };
                        int r = fabric_unit_start(a->o.bus, a->stopped[a->unit_index], &so, on_unit_started, a, &a->op);
                        if (r < 0)
                                on_unit_started(NULL, r, strerror(-r), a);
                        return;
                }
                a->phase = PHASE_DONE;
                break;

        case PHASE_DONE:
                finish(a);
                return;
        }
        schedule(a);
}

static int on_defer(sd_event_source *s, void *userdata) {
        MigApply *a = userdata;

        (void) sd_event_source_set_enabled(s, SD_EVENT_OFF);
        advance(a);
        return 0;
}

static void schedule(MigApply *a) {
        (void) sd_event_source_set_enabled(a->defer, SD_EVENT_ONESHOT);
}

int mig_apply_start(const MigApplyOptions *o, MigPlan *plan, MigGpuState *before, size_t n_before,
                    MigApplyFinished cb, void *userdata, MigApply **ret, char **ret_error) {
        _cleanup_(mig_apply_freep) MigApply *a = NULL;
        MigGpuState *journaled = NULL;
        size_t n_journaled = 0;
        int r;

        assert(o && o->event && (o->nvml || o->library) && plan && cb && ret && ret_error);

        a = calloc(1, sizeof *a);
        if (!a) {
                mig_plan_free(plan);
                mig_gpu_states_free(before, n_before);
                return -ENOMEM;
        }
        a->plan = plan;
        a->before = before;
        a->n_before = n_before;
        a->o = *o;
        a->cb = cb;
        a->userdata = userdata;
        a->stop_units = strv_copy(o->stop_units);
        a->stopped = strv_copy(o->stopped_units);
        a->n_stopped_before = strv_length(a->stopped);
        a->reset_program = strdup(o->reset_program ?: MIG_RESET_PROGRAM_DEFAULT);
        if (!a->stop_units || !a->stopped || !a->reset_program ||
            (o->journal_path && !(a->journal_path = strdup(o->journal_path))))
                return -ENOMEM;
        a->o.stop_units = a->o.stopped_units = NULL;
        a->o.reset_program = a->reset_program;
        a->o.journal_path = a->journal_path;

        for (size_t i = 0; !o->force && i < plan->n_gpus; i++) {
                const MigGpuState *g = before_of(a, &plan->gpus[i]);
                if (g && g->busy) {
                        *ret_error = strprintf("GPU %u (%s) has compute processes running; nothing was changed. Stop "
                                               "the workloads on it, or apply with force.", g->index, g->pci_address);
                        return -EBUSY;
                }
        }

        r = sd_event_add_defer(o->event, &a->defer, on_defer, a);
        if (r < 0)
                return r;
        if (o->library) {
                if (!(a->library = strdup(o->library)))
                        return -ENOMEM;
                a->o.library = a->library;
                r = gpu_nvml_worker_new(o->event, &a->worker);
                if (r < 0)
                        return r;
        }
        (void) sd_event_source_set_description(a->defer, "mig-apply");

        if (plan->n_gpus == 0) {
                /* Nothing to change: no journal, no hooks, no writes (only units an interrupted apply left
                 * stopped are started again). */
                a->phase = PHASE_START_UNITS;
                a->unit_index = strv_length(a->stopped);
                *ret = TAKE_PTR(a);
                return 0;
        }

        if (a->journal_path) {
                journaled = calloc(plan->n_gpus, sizeof *journaled);
                if (!journaled)
                        return -ENOMEM;
                for (size_t i = 0; i < plan->n_gpus; i++) {
                        const MigGpuState *g = before_of(a, &plan->gpus[i]);
                        if (!g)
                                continue;
                        r = mig_state_copy_layout(g, &journaled[n_journaled]);
                        if (r < 0) {
                                mig_gpu_states_free(journaled, n_journaled);
                                return r;
                        }
                        n_journaled++;
                }
                r = mig_journal_begin(a->journal_path, plan->config_name, journaled, n_journaled, &a->journal);
                mig_gpu_states_free(journaled, n_journaled);
                for (size_t i = 0; r >= 0 && a->stopped[i]; i++)
                        r = mig_journal_unit(a->journal, a->stopped[i]);
                if (r < 0) {
                        *ret_error = strprintf("Cannot write the MIG journal %s: %s; nothing was changed.",
                                               a->journal_path, strerror(-r));
                        return r;
                }
        }

        a->phase = PHASE_STOP_UNITS;
        *ret = TAKE_PTR(a);
        return 0;
}

MigApply *mig_apply_free(MigApply *a) {
        if (!a)
                return NULL;
        spawn_free(a->reset);
        gpu_nvml_worker_free(a->worker); /* kills a worker in a call: the journal stays for the next start */
        free(a->job_error);
        mig_gpu_steps_answer_done(&a->answer);
        free(a->procs);
        free(a->library);
        free(a->reset_output);
        fabric_op_free(a->op);
        sd_event_source_disable_unref(a->defer);
        mig_journal_free(a->journal);
        mig_gpu_run_done(&a->run);
        mig_gpu_run_done(&a->rollback_run);
        mig_gpu_plan_done(&a->rollback);
        mig_plan_free(a->plan);
        mig_gpu_states_free(a->before, a->n_before);
        strv_free(a->stop_units);
        strv_free(a->stopped);
        free(a->reset_program);
        free(a->journal_path);
        free(a->gpu_error);
        strv_free(a->lines);
        strv_free(a->changed_gpus);
        gpu_nvml_snapshot_free(a->mig_devices);
        strv_free(a->log);
        return mfree(a);
}
