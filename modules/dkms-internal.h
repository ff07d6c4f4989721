/* SPDX-License-Identifier: MIT */
/* Owns the seam between the dkms process runner (dkms.c) and the reading of what dkms said
 * (dkms-output.c): what one run's output has told so far, and the verdict made from it. Private to
 * modules/dkms*.c. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dkms.h"

#define DKMS_TAIL_LINES 5

typedef struct DkmsOutput {
        char *dkms_dir;          /* <root>/var/lib/dkms */
        char **registered;       /* "NAME VER" of every module in the DKMS tree, sorted */
        char *module;            /* "NAME/VER" being built: given, or learned from the output */
        char *label;             /* "NAME VER" (or several, comma-separated) for sentences */
        char *make_log;          /* the path dkms printed ("Consult … make.log") */
        char *failed_name;       /* autoinstall's summary: the first module that failed … */
        int failed_code;         /* … and its dkms exit code; 0 when none */
        char *tail[DKMS_TAIL_LINES];
        unsigned n_lines;
        bool saw_enospc;         /* "No space left on device" */
        bool saw_headers;        /* dkms's own "kernel headers … cannot be found" */
        bool saw_build_failed;   /* "Bad return status for module build" */
        bool saw_excluded;       /* "includes a BUILD_EXCLUSIVE directive" */
        char *read_only_path;    /* the first path dkms could not write: "Read-only file system" */
} DkmsOutput;

typedef struct DkmsVerdict {
        const char *kver;        /* NULL for `status` of all kernels */
        bool status_run;         /* `dkms status`, not a build */
        bool timed_out;
        bool cancelled;
        uint64_t timeout_usec;
        uint64_t elapsed_usec;
        int exit_status;         /* exit code, or -1 */
        int signal;              /* the signal that ended dkms, or 0 */
} DkmsVerdict;

void dkms_output_done(DkmsOutput *o);

/* Reads the DKMS tree so STATUS= can name what an autoinstall builds before dkms says so. */
int dkms_output_discover(DkmsOutput *o);

int dkms_output_set_module(DkmsOutput *o, const char *name, size_t name_len, const char *version,
                           size_t version_len);

/* One output line: remembers the tail and whatever it tells (module, make.log, ENOSPC, …). */
void dkms_output_observe(DkmsOutput *o, const char *line);

/* The outcome, reading the exit code through the output: dkms 3's autoinstall exits 11 for "one
 * or more modules failed" and names each module's own code; headers missing is 1, 11 or 21
 * depending on the version, but the message is always the same. */
DkmsOutcome dkms_output_outcome(DkmsOutput *o, const DkmsVerdict *v);

/* The sentence for an outcome (may look into make.log, and turn a build failure into DISK_FULL when
 * make.log says so: *outcome is updated). NULL on OOM. */
char *dkms_output_message(DkmsOutput *o, const DkmsVerdict *v, DkmsOutcome *outcome);
