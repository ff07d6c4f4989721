/* SPDX-License-Identifier: MIT */
/* Owns the MigManager: the long-lived MIG object of the agent (Node.mig). It ties together which
 * config is selected (mig.config-file + mig.selected, or the last ApplyMigConfig request), the apply in
 * flight (at most one), the recovery of an interrupted apply from the journal at the first run, and the
 * result the labels and D-Bus show: nvidia.com/mig.config and nvidia.com/mig.config.state. It also answers
 * assert (does the node match a config?) and export (the node's layout as a mig-parted config).
 *
 * Test-only knob: the environment variable GNA_MIG_RESET_PROGRAM, read once when the MigManager is made,
 * replaces "nvidia-smi" as the program that resets a GPU (`PROGRAM -r -i <bus id>`), and
 * GNA_MIG_RESET_TIMEOUT_MS replaces its timeout (MIG_RESET_TIMEOUT_USEC). */
#pragma once

#include <stdbool.h>

#include "mig-apply.h"

typedef struct Node Node;
typedef struct MigManager MigManager;

typedef struct MigApplyOutcome {
        int error;                  /* 0, or the negative errno of the first failure */
        const char *config;         /* the config name */
        const char *state;          /* "success", "rebooting" or "failed" */
        const char *message;        /* what happened, one line */
        bool changed;               /* MIG devices changed: CDI, device nodes and labels need a refresh */
        char *const *changed_gpus;  /* the PCI addresses of the GPUs that changed (valid during the call) */
        const NvmlSnapshot *mig_devices; /* their MIG mode and devices as the apply read them after its steps
                                     * (valid during the call); NULL: they need a re-read */
        bool refused;               /* nothing was started: the GPUs could not be read, the planner rejected
                                     * the config (-EINVAL), a GPU has compute processes (-EBUSY) */
} MigApplyOutcome;

/* Called once from the event loop, unless the MigManager is freed first. */
typedef void (*MigApplyDone)(MigManager *mm, const MigApplyOutcome *outcome, void *userdata);
/* Called whenever mig_manager_config()/mig_manager_state() change (for PropertiesChanged). */
typedef void (*MigChanged)(MigManager *mm, void *userdata);

int mig_manager_new(Node *n, MigManager **ret);
/* Cancels an apply in flight (its callback is not called; the journal stays and is recovered at the next
 * start). NULL-safe. */
MigManager *mig_manager_free(MigManager *mm);
DEFINE_CLEANUP_FUNC(MigManager *, mig_manager_free);

void mig_manager_set_changed_callback(MigManager *mm, MigChanged cb, void *userdata);

/* nvidia.com/mig.config: the config applied or being applied; NULL when MIG is not managed. */
const char *mig_manager_config(const MigManager *mm);
/* nvidia.com/mig.config.state: "success", "pending", "rebooting", "failed"; NULL when not managed. */
const char *mig_manager_state(const MigManager *mm);
bool mig_manager_busy(const MigManager *mm);

/* The selection the mig stage keeps the node at: the last mig_manager_apply() request while the config's
 * mig.selected/mig.config-file are unchanged since, else the config's. *ret_name "" = not managed. */
void mig_manager_selected(MigManager *mm, const char **ret_name, const char **ret_file);

/* Looks for an unfinished journal (an apply interrupted by a crash or power loss). Returns 0 when there is
 * none (or nothing to undo; *ret_message may still say what was found); 1 when a recovery runs (cb later):
 * every GPU the interrupted apply had not finished goes back to the layout it had before, and the hook
 * units it had stopped are started again; then the journal is removed. Negative errno + sentence on
 * failure; -ENOTRECOVERABLE (on every call, the journal is kept) when the journal records a halt (a
 * rollback that failed): nothing is rolled back or applied until an explicit apply replaces it. */
int mig_manager_recover(MigManager *mm, MigApplyDone cb, void *userdata, char **ret_message);
/* What the recovery found and did (the message above plus its outcome), once; NULL when nothing. The
 * journal is looked at once per MigManager: later calls of mig_manager_recover() return 0. */
char *mig_manager_take_recovery_note(MigManager *mm);

/* Applies the named config of config_file (NULL = mig.config-file) asynchronously; cb reports the
 * outcome, also for an empty plan. The request becomes the selection (see mig_manager_selected). Fails
 * at once, with nothing changed and no callback, with a sentence in *ret_error: -EBUSY an apply is
 * running, or a GPU of the plan has compute processes (unless force); -ENOENT no such config or file;
 * -EINVAL the config does not fit the GPUs (the planner's report); the NVML error when NVML cannot be
 * read. mig.config.state becomes "failed" for all but the first. */
int mig_manager_apply(MigManager *mm, const char *name, const char *config_file, bool force, MigApplyDone cb,
                      void *userdata, char **ret_error);

/* The mig stage's apply of mig_manager_selected(); -ENODATA when nothing is selected. */
int mig_manager_apply_selected(MigManager *mm, MigApplyDone cb, void *userdata, char **ret_error);

/* mig.selected-from: node-label. A selection refused before any config is looked up (a node label value
 * that is not a valid label value): mig.config.state becomes "failed" with the reason, shown under name
 * (for messages; never applied); nothing is touched. */
void mig_manager_refuse(MigManager *mm, const char *name, const char *message);
/* The node label is not set: MIG is not managed (any more), no mig.config labels; nothing is touched. */
void mig_manager_unmanage(MigManager *mm);

/* Assert (1 when the GPUs the named config covers have its layout, 0 when not; the report lists the
 * mismatches or says that all match) and export (the node's current layout as a mig-parted v1 file with
 * one config, "current": GPUs with the same layout merged into one entry — devices: all, a device-filter,
 * or an index list), with the NVML reads in a worker process (nothing waits for NVML on the loop): the config
 * is loaded at once (its errors, and -ENODEV while the nvml stage has not found NVML answering, return
 * here with *ret_error); then cb, from the loop, gets what the synchronous call would return (assert:
 * 1/0; export: 0; or a negative errno) with the report, the YAML or the reason — "nvmlDeviceGetMigMode
 * has not returned for 30 s" for a hang. In flight at mig_manager_free(): cb gets -ECANCELED. */
typedef void (*MigReportDone)(MigManager *mm, int r, const char *report, void *userdata);
int mig_manager_assert_async(MigManager *mm, const char *name, const char *config_file, MigReportDone cb,
                             void *userdata, char **ret_error);
int mig_manager_export_async(MigManager *mm, MigReportDone cb, void *userdata, char **ret_error);

/* Pure part of export, for the tests. */
int mig_export_yaml(const MigGpuState *gpus, size_t n_gpus, const char *config_name, char **ret_yaml);
