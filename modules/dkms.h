/* SPDX-License-Identifier: MIT */
/* Owns the API for everything the agent does with the `dkms` program (there is no library):
 * parsing `dkms status`, running `dkms autoinstall`/`dkms install` as a child process on sd-event
 * with a timeout and streamed output, turning dkms exit codes into sentences, and the synchronous
 * `--prepare-kernel` build. Library code: returns negative errno + a sentence, never logs.
 * Implementation: dkms.c (process), dkms-output.c (what the output means), dkms-status.c (status
 * parsing, string tables), dkms-sync.c (blocking front ends).
 *
 * The child runs in its own process group with an empty signal mask and LC_ALL=C (its messages are
 * matched); a build spawns make and gcc, so a timeout or cancel kills the whole group, never just
 * dkms, and whatever is left of the group when dkms exits is killed too. Completion is watched
 * through a pidfd io source rather than sd_event_add_child(), so nothing depends on SIGCHLD being
 * blocked process-wide; where pidfd_open() is unavailable (valgrind, old seccomp filters) a 50 ms
 * timer polls with WNOHANG instead.
 *
 * Exit codes say little: `dkms install` exits with the build's code (10 build failed, 7 built module
 * missing, 77 BUILD_EXCLUSIVE, 1 headers missing); dkms 3.0's `autoinstall` (Debian 12: 3.0.10)
 * exits 11 for *every* failure and prints no per-module summary, dkms 3.1 prints one ("… failed for
 * module(s) nvidia(10)"), and a failed install into a read-only /lib/modules exits 0. So the outcome
 * is made from dkms's own words first (tests/fixtures/dkms holds real 3.0.10 output): "Bad return
 * status for module build" + the make.log it names, "kernel headers for kernel … cannot be found",
 * "includes a BUILD_EXCLUSIVE directive", "Read-only file system", "No space left on device"; then
 * the per-module summary code; the exit code only when dkms said nothing recognisable. */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <systemd/sd-event.h>

#define DKMS_TIMEOUT_DEFAULT_USEC (30 * 60 * UINT64_C(1000000))   /* a GPU driver build is minutes */
#define DKMS_KILL_GRACE_DEFAULT_USEC (10 * UINT64_C(1000000))     /* SIGTERM → SIGKILL */
#define DKMS_PROGRESS_DEFAULT_USEC (10 * UINT64_C(1000000))       /* STATUS= refresh while building */

typedef struct DkmsOptions {
        const char *program;           /* dkms executable: a path, or a name looked up in $PATH;
                                        * NULL = "dkms" */
        const char *root;              /* host root; NULL = "/" */
        const char *modules_dir;       /* NULL = <root>/lib/modules (headers: <modules_dir>/KVER/build) */
        const char *dkms_dir;          /* NULL = <root>/var/lib/dkms (make.log, module discovery) */
        const char *module;            /* "NAME/VERSION": `dkms install NAME/VERSION -k KVER`;
                                        * NULL = `dkms autoinstall -k KVER` */
        uint64_t timeout_usec;         /* 0 = DKMS_TIMEOUT_DEFAULT_USEC */
        uint64_t kill_grace_usec;      /* 0 = DKMS_KILL_GRACE_DEFAULT_USEC */
        uint64_t progress_interval_usec; /* 0 = DKMS_PROGRESS_DEFAULT_USEC */
} DkmsOptions;

/* ---- dkms status ------------------------------------------------------------------------------ */

typedef enum DkmsModuleState {
        DKMS_MODULE_ADDED,             /* source registered, not built for this kernel */
        DKMS_MODULE_BUILT,             /* built, not installed into /lib/modules */
        DKMS_MODULE_INSTALLED,         /* also dkms 2.x/RHEL "installed-weak" */
        DKMS_MODULE_BROKEN,            /* dkms.conf or the source tree is missing */
        _DKMS_MODULE_STATE_MAX,
        _DKMS_MODULE_STATE_INVALID = -EINVAL,
} DkmsModuleState;

typedef struct DkmsModule {
        char *name;                    /* "nvidia-current" */
        char *version;                 /* "535.261.03" */
        char *kernel;                  /* NULL for "added"/"broken" lines */
        char *arch;                    /* NULL for "added"/"broken" lines */
        DkmsModuleState state;
        char *note;                    /* a "(WARNING! …)" or "(Original modules exist)" suffix, without
                                        * the parentheses; NULL when none */
} DkmsModule;

/* Parses `dkms status` output: dkms 3 ("name/ver, kver, arch: installed", "name/ver: added") and
 * dkms 2.x ("name, ver, kver, arch: installed", "name, ver: added"), with optional suffixes.
 * Lines that are not status lines (errors/warnings dkms mixes in) and unknown states are skipped.
 * Returns 0 (possibly with an empty list) or -ENOMEM; *ret is NULL-safe to free with
 * dkms_module_list_free(). */
int dkms_status_parse(const char *text, DkmsModule **ret, size_t *ret_n);
void dkms_module_list_free(DkmsModule *l, size_t n);

/* First entry for name (exact) and kernel (kernel NULL = any; "added"/"broken" entries have no
 * kernel and match only kernel NULL), or NULL. */
const DkmsModule *dkms_module_find(const DkmsModule *l, size_t n, const char *name, const char *kernel);

const char *dkms_module_state_to_string(DkmsModuleState s);
DkmsModuleState dkms_module_state_from_string(const char *s);

/* ---- running dkms ----------------------------------------------------------------------------- */

typedef enum DkmsOutcome {
        DKMS_OUTCOME_OK,               /* exit 0 */
        DKMS_OUTCOME_BUILD_FAILED,     /* exit 10: compiler error; see make.log */
        DKMS_OUTCOME_HEADERS_MISSING,  /* exit 11, or our own check: linux-headers-KVER not installed */
        DKMS_OUTCOME_MODULE_MISSING,   /* exit 7: the build did not produce the module dkms.conf names */
        DKMS_OUTCOME_EXCLUDED,         /* exit 77: BUILD_EXCLUSIVE excludes this kernel (e.g. RT) */
        DKMS_OUTCOME_DISK_FULL,        /* "No space left on device" in the output or make.log */
        DKMS_OUTCOME_READ_ONLY,        /* "Read-only file system": dkms could not write its tree or
                                        * /lib/modules (a service sandbox); dkms 3.0 exits 0 when only
                                        * the install into /lib/modules failed */
        DKMS_OUTCOME_TIMED_OUT,        /* our timeout killed the process group */
        DKMS_OUTCOME_CANCELLED,        /* dkms_run_cancel() */
        DKMS_OUTCOME_FAILED,           /* any other exit code or a signal */
        _DKMS_OUTCOME_MAX,
        _DKMS_OUTCOME_INVALID = -EINVAL,
} DkmsOutcome;

const char *dkms_outcome_to_string(DkmsOutcome o);   /* "ok", "build-failed", … (for D-Bus DkmsState) */
DkmsOutcome dkms_outcome_from_string(const char *s);
/* The negative errno a stage reports for an outcome: 0, -EIO, -ENOPKG, -ENOENT, -EOPNOTSUPP,
 * -ENOSPC, -EROFS, -ETIME, -ECANCELED, -EPROTO. */
int dkms_outcome_to_errno(DkmsOutcome o);

typedef struct DkmsRun DkmsRun;

typedef struct DkmsRunCallbacks {
        /* Every output line (stdout and stderr interleaved as dkms wrote them), in order, without the
         * newline. Optional. This and progress may cancel the run but must not free it. */
        void (*line)(DkmsRun *run, const char *line, void *userdata);
        /* Progress for STATUS=, e.g. "building nvidia-current 535.261.03 for 6.1.0-57-amd64: 2m10s";
         * called at start and then at most once per progress interval while the child runs. Optional. */
        void (*progress)(DkmsRun *run, const char *status, void *userdata);
        /* Exactly once, unless the run is cancelled or freed first: error is 0 or a negative errno
         * (dkms_outcome_to_errno()), message a sentence (also on success: what was built, how long).
         * The handler may free the run. */
        void (*done)(DkmsRun *run, int error, const char *message, void *userdata);
} DkmsRunCallbacks;

/* Checks the kernel headers (<modules_dir>/KVER/build must be a directory) and, when present,
 * starts `dkms autoinstall -k KVER` (or `dkms install o->module -k KVER`) watched by e. Never
 * blocks. On failure to start returns a negative errno and a sentence in *ret_error: -ENOPKG
 * "Kernel headers for KVER are not installed …; install them with: apt-get install
 * linux-headers-KVER" (dkms was not run), -ENOENT when the program does not exist, -EINVAL for a
 * malformed kver/module. */
int dkms_run_start(sd_event *e, const char *kver, const DkmsOptions *o, const DkmsRunCallbacks *cb,
                   void *userdata, DkmsRun **ret, char **ret_error);

/* For shutdown or a superseded build: SIGTERM to the process group now; SIGKILL after the kill grace
 * and the reap follow from the event loop (spawn_cancel()). Never blocks. No callback is called
 * afterwards.
 * Returns 0, or -ESRCH when the run already finished. */
int dkms_run_cancel(DkmsRun *run);

/* Cancels a running child (as dkms_run_cancel()) and frees. NULL-safe; returns NULL. */
DkmsRun *dkms_run_free(DkmsRun *run);

bool dkms_run_is_running(const DkmsRun *run);
pid_t dkms_run_pid(const DkmsRun *run);              /* also the process group id; 0 when finished */
DkmsOutcome dkms_run_outcome(const DkmsRun *run);    /* _DKMS_OUTCOME_INVALID while running */
int dkms_run_exit_status(const DkmsRun *run);        /* dkms's exit code; -1 while running/by signal */
const char *dkms_run_kernel(const DkmsRun *run);

/* Starts `dkms status [-k KVER]` on e (output is small; default timeout 60 s) and calls done with
 * the parsed list (owned by the run: valid during the call only) or an error. */
typedef void (*DkmsStatusHandler)(DkmsRun *run, int error, const DkmsModule *modules, size_t n,
                                  const char *error_message, void *userdata);
int dkms_status_start(sd_event *e, const char *kver, const DkmsOptions *o, DkmsStatusHandler done,
                      void *userdata, DkmsRun **ret, char **ret_error);

/* What a build's outcome depends on besides dkms itself, as a string: the kernel release, the
 * program and module asked for, the headers (<modules_dir>/KVER/build: present, inode, mtime), the
 * modules directory's mtime, every registered NAME/VERSION in the DKMS tree with its source's and
 * dkms.conf's mtimes, and <root>/usr/src's mtime. Not the build directories a failed build leaves.
 * Equal fingerprints before and after a failure mean nothing a retry could pick up has changed. */
int dkms_fingerprint(const char *kver, const DkmsOptions *o, char **ret);

/* ---- synchronous helpers (they run their own private sd_event loop) ----------------------------- */

/* `gpu-node-agent --prepare-kernel KVER`: builds (does not load) the driver module for KVER. Checks
 * the headers first (missing: the same -ENOPKG sentence, dkms not run), then runs dkms as
 * dkms_run_start() would, its output copied to stderr. Returns 0 or the mapped negative errno with
 * the sentence in *ret_error. */
int dkms_prepare_kernel(const char *kver, const DkmsOptions *o, char **ret_error);

/* Runs `dkms status` (kver NULL: all kernels; otherwise `-k KVER`) and parses it. Blocks up to 60 s:
 * for the CLI and --prepare-kernel, not for the daemon's loop. */
int dkms_status(const char *kver, const DkmsOptions *o, DkmsModule **ret, size_t *ret_n, char **ret_error);

/* "0s", "250ms" (under a second), "45s", "2m10s", "1h02m03s". Returns buf. */
char *dkms_format_elapsed(char *buf, size_t size, uint64_t usec);
