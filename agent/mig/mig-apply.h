/* SPDX-License-Identifier: MIT */
/* Owns carrying out a MIG plan on the node (mig-apply.c: the asynchronous apply; mig-apply-gpu.c: the
 * NVML steps of one GPU and the plan back to a recorded layout):
 *
 *   journal begin → stop the hook units (over sd-bus, one after the other, only those active) → refuse if a
 *   GPU of the plan has compute processes (unless forced) → per GPU, in an NVML worker (o.library):
 *   destroy CIs, destroy GIs, set the MIG mode, reset the GPU when the mode is pending (a child process,
 *   mig.reset auto) or stop there with "reboot required" (never), create GIs with their placement, create
 *   CIs → start the stopped units again (always, in reverse order) → journal end.
 *
 * A step that fails rolls that GPU back to the layout it had before (destroy what was created, re-create
 * what was destroyed, the MIG mode back) and the apply goes on with the other GPUs; the result reports
 * the failure and the rollback's outcome; a call that hangs past the deadline or crashes the worker is
 * such a failure. With session_job the GPUs' steps run on one worker whose NVML is open already (the MIG
 * reader), else in a worker forked per run of steps. Library code: results are a negative errno plus
 * sentences; the caller logs. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <systemd/sd-bus.h>
#include <systemd/sd-event.h>

#include "gpu-nvml-internal.h"
#include "gpu-nvml-worker.h"
#include "mig-journal.h"
#include "mig-types.h"

#define MIG_RESET_PROGRAM_DEFAULT "nvidia-smi"
#define MIG_RESET_TIMEOUT_USEC (120 * USEC_PER_SEC)

/* nvidia.com/mig.config.state */
typedef enum MigConfigState {
        MIG_CONFIG_SUCCESS,         /* the node has the config's geometry */
        MIG_CONFIG_PENDING,         /* an apply is in flight */
        MIG_CONFIG_REBOOTING,       /* a MIG mode change waits for a GPU reset or reboot (mig.reset: never) */
        MIG_CONFIG_FAILED,
        _MIG_CONFIG_STATE_MAX,
        _MIG_CONFIG_STATE_INVALID = -EINVAL,
} MigConfigState;

const char *mig_config_state_to_string(MigConfigState s);
MigConfigState mig_config_state_from_string(const char *s);

typedef struct MigApply MigApply;
struct WireBuf;

typedef struct MigApplyOptions {
        sd_event *event;
        sd_bus *bus;                /* NULL (--oneshot): hook units are not stopped, which is logged */
        GpuNvml *nvml;              /* without library: must stay open until the apply finished or was freed */
        const char *library;        /* set: every NVML call runs in an NVML worker process that opens this
                                     * library (nvml unused); NULL: on nvml, in this process */
        uint64_t call_timeout_usec; /* the worker's per-call deadline (nvml.timeout); 0 = its default */
        /* Called before each worker is forked (with library): the owner shuts down and unloads any NVML
         * handle of its own, which a fork must not inherit initialised. */
        void (*release_nvml)(void *userdata);
        void *release_userdata;
        char **stop_units;          /* mig.hooks.stop-units */
        char **stopped_units;       /* already stopped by an earlier, interrupted apply: started at the end */
        bool reset_auto;            /* mig.reset */
        const char *reset_program;  /* run as PROGRAM -r -i <bus id>; NULL = MIG_RESET_PROGRAM_DEFAULT */
        uint64_t reset_timeout_usec;/* 0 = MIG_RESET_TIMEOUT_USEC */
        uint64_t unit_timeout_usec; /* 0 = the fabric layer's default */
        const char *journal_path;   /* NULL: no journal */
        bool force;                 /* apply even while compute processes run */
        bool restore;               /* a return to recorded layouts: a failing GPU is not rolled back again */
        /* With library: runs a MIG steps job (mig_gpu_steps_read() with its input bytes) on a worker whose
         * NVML is open already — the MIG reader — so that an apply is one NVML session instead of an
         * nvmlInit per job; < 0 (busy, no reader): the job gets a worker of its own, as without it. A
         * hang or crash there fails the GPU as in a job's worker (the worker names the call). */
        int (*session_job)(void *userdata, const void *input, size_t len, GpuNvmlJobFunc fn, GpuNvmlJobDone done,
                           void *done_userdata);
        void *session_userdata;
        /* The daemon's snapshot (read at each job's fork): the memory size of each GPU, which a job needs to
         * name the MIG devices it reads after its steps. NULL: the jobs do not read them. */
        NvmlSnapshot *const *snapshot;
        /* Called just before the apply starts a GPU reset: whoever holds the GPU open for the agent (the
         * NVML workers, the health event worker) must let go, since the driver refuses to reset a GPU
         * that any process has open. NULL: nobody is asked. */
        void (*gpu_reset_prepare)(const char *pci_address, void *userdata);
        /* Called after a GPU reset the apply ran finished successfully (NULL: nobody is told). */
        void (*gpu_reset)(const char *pci_address, void *userdata);
        void *gpu_reset_userdata;
} MigApplyOptions;

typedef struct MigApplyResult {
        MigConfigState state;       /* SUCCESS, REBOOTING or FAILED */
        int error;                  /* the first failure, 0 none */
        bool changed;               /* something was written through NVML */
        char **changed_gpus;        /* the PCI addresses of the GPUs written to */
        const char *message;        /* one line: what happened per GPU, failures and rollbacks */
        char **log;                 /* one line per notable event, for the log */
} MigApplyResult;

/* Called once, from the event loop, unless the apply is freed first. res is valid during the call. */
typedef void (*MigApplyFinished)(MigApply *a, const MigApplyResult *res, void *userdata);

/* Starts applying plan (taken, also on failure) to the GPUs whose states before are in before (taken:
 * they are the rollback targets and the journal's record). An empty plan is allowed (then nothing is
 * written and no unit stopped). Fails at once (nothing done, no callback) with -EBUSY and a sentence when a
 * GPU of the plan has compute processes and o->force is false, or when the journal cannot be written. */
int mig_apply_start(const MigApplyOptions *o, MigPlan *plan, MigGpuState *before, size_t n_before,
                    MigApplyFinished cb, void *userdata, MigApply **ret, char **ret_error);

/* After the result: the MIG mode and MIG devices of every GPU the apply wrote to, as its jobs read them
 * right after their steps (one GpuInfo per GPU, only those fields set), taken by the caller; NULL when a
 * GPU's were not read (a failure, a rollback, a reset still pending, no snapshot to name them by): the
 * caller then reads them. */
NvmlSnapshot *mig_apply_take_mig_devices(MigApply *a);

/* Cancels (kills a reset child, no callback; the journal stays for the next start) and frees. */
MigApply *mig_apply_free(MigApply *a);
DEFINE_CLEANUP_FUNC(MigApply *, mig_apply_free);

/* ---- one GPU (mig-apply-gpu.c) ---- */

typedef struct MigGpuRun {
        const MigGpuPlan *plan;
        nvmlDevice_t device;
        size_t next;                /* the next step */
        unsigned *created;          /* per step: id of the GI (CREATE_GI) or CI (CREATE_CI) it created */
        nvmlGpuInstance_t *gi_handles; /* per CREATE_GI step: the handle NVML gave, for the CIs created in it by
                                     * the same process (NULL when made elsewhere: looked up by id) */
        bool wrote;                 /* an NVML write succeeded */
        bool mode_changed;
} MigGpuRun;

#define MIG_GPU_RUN_NEEDS_RESET 1

int mig_gpu_run_init(GpuNvml *n, const MigGpuPlan *plan, MigGpuRun *ret);
void mig_gpu_run_done(MigGpuRun *run);

/* Runs steps from run->next: 0 when all are done, MIG_GPU_RUN_NEEDS_RESET when the MIG mode change waits for a
 * GPU reset (run->next is the step after it), or a negative errno with a sentence naming the GPU, step and
 * NVML's error. Every write is journaled when j is given. */
int mig_gpu_run_steps(GpuNvml *n, MigGpuRun *run, MigJournal *j, char **ret_error);

/* The run without an NVML handle (the device is looked up where the steps run). */
int mig_gpu_run_prepare(const MigGpuPlan *plan, MigGpuRun *ret);

/* The same steps in an NVML worker (gpu_nvml_worker_job()): the job's input is a MigGpuStepsJob in the
 * daemon's memory at the fork; the worker looks the device up on its own handle, reopens the journal (so
 * that every write is still recorded as it happens), runs the steps (none when read_only), reads the GPU
 * again, and answers with the steps' result, the run's progress (next step, created ids), the layout
 * summary and — when restore_to is given and the steps failed (or read_only) — the plan back to
 * restore_to. mig_gpu_steps_job_result() applies that to the daemon's run and returns what
 * mig_gpu_run_steps() would. */
typedef struct MigGpuStepsJob {
        const MigGpuRun *run;
        MigJournal *journal;        /* NULL: none */
        const MigGpuState *restore_to;
        const MigGpuState *known;   /* the GPU as read before the apply (NULL: unknown): the read after the
                                     * steps then covers only what they can have changed */
        bool read_only;
        bool derive;                /* known is the state the run's plan starts from (not a rollback's): when
                                     * every step succeeds, the layout after is derived from known and the
                                     * steps' answers instead of read */
        uint64_t memory_total_bytes;/* the GPU's memory (the nvml stage's snapshot), for the MIG device profile
                                     * names; 0: the MIG devices are not read by the job */
        /* The MIG devices earlier jobs of the apply read (NULL: none), and the GPUs' states before it (for
         * their models): a MIG device's attributes are those of its (GI, CI) profile on its GPU model, so
         * a profile another GPU of the model has shown is not asked again. */
        const NvmlSnapshot *seen;
        const MigGpuState *before;
        size_t n_before;
        bool journal_open;          /* journal is this process's own (not the fork's copy): no reopen */
} MigGpuStepsJob;

typedef struct MigGpuStepsAnswer {
        char *summary;              /* the GPU's layout after the steps; NULL when it could not be read */
        int rollback_r;             /* 1: rollback is the plan back to restore_to; 0: none asked; < 0 failed */
        MigGpuPlan rollback;
        char *rollback_error;       /* why not (rollback_r < 0) */
        NvmlSnapshot *devices;      /* after steps that all succeeded (and derive, memory_total_bytes): one
                                     * GpuInfo with the GPU's MIG mode and MIG devices, else NULL */
} MigGpuStepsAnswer;

int mig_gpu_steps_job(GpuNvml *n, void *userdata, struct WireBuf *out, char **ret_error);

/* The same job sent to a worker forked earlier (the MIG reader, whose NVML handle is open already):
 * mig_gpu_steps_input() writes job as bytes, mig_gpu_steps_read() (a read function of the worker,
 * gpu_nvml_worker_read_input()) runs it from them, journaling to the same file, and answers as
 * mig_gpu_steps_job() does. */
int mig_gpu_steps_input(const MigGpuStepsJob *job, struct WireBuf *out);
int mig_gpu_steps_read(GpuNvml *n, void *userdata, struct WireBuf *out, char **ret_error);
int mig_gpu_steps_job_result(MigGpuRun *run, const uint8_t *data, size_t len, MigGpuStepsAnswer *ret,
                             char **ret_error);
void mig_gpu_steps_answer_done(MigGpuStepsAnswer *a);

/* The plan that turns now into the layout of target (both of the same GPU): destroy the CIs and GIs target
 * lacks, the MIG mode, re-create target's GIs at their placements and their CIs. Empty when equal. */
int mig_restore_plan(const MigGpuState *now, const MigGpuState *target, MigGpuPlan *ret);

/* The MIG mode the GPU has now: current == want. */
int mig_gpu_mode_is(GpuNvml *n, nvmlDevice_t d, bool want, bool *ret);
