/* SPDX-License-Identifier: MIT */
/* Owns the MIG apply journal, <paths.state>/mig-journal: an append-only text file, one record per line,
 * each line fsync'd before the step it announces or right after the step it records, so that a crash or
 * power loss in the middle of an apply is seen at the next start together with the layout to return to.
 *
 *   begin config=all-balanced
 *   gpu pci=0000:07:00.0 index=0 mig=0 pending=0          the layout before, one line per GPU of the plan
 *   gi pci=0000:07:00.0 id=1 profile=9 start=0 size=4 cis=0:2,1:2    … and its instances (CI id:profile)
 *   unit name=kubelet.service                              a hook unit we stopped (to start again)
 *   step pci=… kind=create-gi profile=9 start=0 size=4 gi=2 ci=0 rc=0    one per NVML write, after it
 *   gpu-end pci=0000:07:00.0 result=done                   that GPU is consistent again
 *   halt pci=0000:07:00.0 left=…                          its rollback failed: the apply stopped here
 *   end state=success
 *
 * Values are percent-escaped outside [A-Za-z0-9._:+@/,-]. A journal without "end" is unfinished. Library
 * code: negative errno (plus a sentence for load), no logging. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "mig-types.h"

#define MIG_JOURNAL_FILE "mig-journal"

typedef struct MigJournal MigJournal;

/* Creates (replacing any old one) the journal at path and writes begin, the previous layouts and
 * fsyncs file and directory. */
int mig_journal_begin(const char *path, const char *config, const MigGpuState *previous, size_t n_previous,
                      MigJournal **ret);

/* Appends one record line (type then key=value pairs, already formatted) and fsyncs. */
int mig_journal_append(MigJournal *j, const char *type, const char *fmt, ...) _printf_(3, 4);
int mig_journal_step(MigJournal *j, const char *pci_address, const MigStep *s, unsigned gi_id, unsigned ci_id, int r);
int mig_journal_unit(MigJournal *j, const char *unit);
int mig_journal_gpu_end(MigJournal *j, const char *pci_address, const char *result);
/* Records that the apply stopped at this GPU because its rollback failed, with what is left on it. A
 * journal with a halt record is kept (no end): the next start reports it instead of rolling back. */
int mig_journal_halt(MigJournal *j, const char *pci_address, const char *left);

/* Writes end, fsyncs, and removes the file: nothing is left to recover. */
int mig_journal_end(MigJournal *j, const char *state);

/* Opens the journal's file again for appending, replacing the descriptor: for a forked NVML worker,
 * whose inherited descriptors are closed, that writes the step records of the MIG calls it makes. The
 * old descriptor is forgotten, not closed: call it only in such a worker. */
int mig_journal_reopen(MigJournal *j);

/* Opens an existing journal for appending (an NVML worker that records the steps it runs for the
 * daemon, which began the journal). */
int mig_journal_open_append(const char *path, MigJournal **ret);
/* The journal's file. */
const char *mig_journal_path(const MigJournal *j);

/* Closes without finishing (the file stays for the next start). NULL-safe. */
MigJournal *mig_journal_free(MigJournal *j);
DEFINE_CLEANUP_FUNC(MigJournal *, mig_journal_free);

/* What an unfinished journal says. */
typedef struct MigJournalContents {
        char *config;
        MigGpuState *previous;      /* layouts only (mig_state_copy_layout's subset) */
        size_t n_previous;
        char **finished;            /* PCI addresses with a gpu-end record */
        char **units;               /* hook units stopped */
        char **halted;              /* PCI addresses with a halt record (a failed rollback) */
        char *halted_left;          /* what the last halt record says is left on that GPU */
        size_t n_steps;
        bool ended;
        char *end_state;
} MigJournalContents;

/* Reads path. -ENOENT when there is none, and also for a journal without one whole record, which is
 * removed (its begin record never reached the disk, so nothing was changed); -EBADMSG with a sentence naming file and line when a line
 * cannot be understood (a torn last line, from a crash mid-write, is ignored). */
int mig_journal_load(const char *path, MigJournalContents **ret, char **ret_error);
MigJournalContents *mig_journal_contents_free(MigJournalContents *c);
DEFINE_CLEANUP_FUNC(MigJournalContents *, mig_journal_contents_free);

/* Removes the journal (and fsyncs the directory); 0 also when there is none. */
int mig_journal_remove(const char *path);
