/* SPDX-License-Identifier: MIT */
/* Owns running the `dkms` program through the child-process helper (spawn-child.c: own process
 * group, closed descriptors, pidfd, timeout that kills the whole group, non-blocking reap): the
 * arguments and environment, what its output lines mean so far, progress for STATUS=, and
 * cancellation. What the output means is dkms-output.c's; status parsing and the string tables are
 * dkms-status.c's; the blocking front ends are dkms-sync.c's. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dkms-internal.h"
#include "dkms.h"
#include "event-util.h"
#include "fileio.h"
#include "macro.h"
#include "spawn-child.h"
#include "strv.h"

extern char **environ;

#define STATUS_TIMEOUT_USEC (60 * UINT64_C(1000000))

typedef enum RunKind {
        RUN_BUILD,
        RUN_STATUS,
} RunKind;

struct DkmsRun {
        sd_event *event;
        RunKind kind;
        DkmsRunCallbacks cb;
        DkmsStatusHandler status_done;
        void *userdata;

        char *program;
        char *kver;
        DkmsOutput out;          /* what the output told so far */

        Spawn *child;            /* the running dkms, NULL once it ended */
        sd_event_source *progress_source;

        uint64_t started_usec, timeout_usec, kill_grace_usec, progress_usec;
        char *captured;          /* RUN_STATUS: the whole output */
        size_t captured_len;
        char *status_text;

        DkmsOutcome outcome;
        int exit_status;
};

bool dkms_run_is_running(const DkmsRun *run) {
        return run && spawn_is_running(run->child);
}

pid_t dkms_run_pid(const DkmsRun *run) {
        return run ? spawn_pid(run->child) : 0;
}

DkmsOutcome dkms_run_outcome(const DkmsRun *run) {
        return run ? run->outcome : _DKMS_OUTCOME_INVALID;
}

int dkms_run_exit_status(const DkmsRun *run) {
        return run ? run->exit_status : -1;
}

const char *dkms_run_kernel(const DkmsRun *run) {
        return run ? run->kver : NULL;
}

/* A kernel release or NAME/VERSION is passed as one argv word to dkms; refuse what could be read as
 * an option or a path. */
static bool word_ok(const char *s) {
        return !isempty(s) && s[0] != '-' && strlen(s) < 256 && !strpbrk(s, " \t\n\"'\\") &&
               !streq(s, ".") && !streq(s, "..");
}

static bool kver_ok(const char *s) {
        return word_ok(s) && !strchr(s, '/');
}

static bool module_ok(const char *s) {
        const char *slash;

        if (!word_ok(s))
                return false;
        slash = strchr(s, '/');
        return slash && slash != s && slash[1] && !strchr(slash + 1, '/');
}

static char *options_path(const DkmsOptions *o, const char *explicit, const char *below_root) {
        if (explicit)
                return strdup(explicit);
        return path_join(o && o->root ? o->root : "/", below_root);
}

/* The headers dkms needs: /lib/modules/KVER/build, a symlink to /usr/src/linux-headers-KVER that
 * dangles when only the image package is installed. */
static int check_headers(const char *kver, const DkmsOptions *o, char **ret_error) {
        _cleanup_free_ char *dir = options_path(o, o ? o->modules_dir : NULL, "lib/modules");
        _cleanup_free_ char *build = NULL;
        struct stat st;

        if (!dir)
                return -ENOMEM;
        build = strprintf("%s/%s/build", dir, kver);
        if (!build)
                return -ENOMEM;
        if (stat(build, &st) >= 0 && S_ISDIR(st.st_mode))
                return 0;

        if (ret_error)
                *ret_error = strprintf("Kernel headers for %s are not installed (%s is missing), so "
                                       "the NVIDIA module cannot be built for it; install them with: "
                                       "apt-get install linux-headers-%s",
                                       kver, build, kver);
        return -ENOPKG;
}

static void process_line(Spawn *child, const char *line, void *userdata) {
        DkmsRun *run = userdata;

        dkms_output_observe(&run->out, line);

        if (run->kind == RUN_STATUS) {
                size_t l = strlen(line);
                char *n = realloc(run->captured, run->captured_len + l + 2);
                if (n) {
                        memcpy(n + run->captured_len, line, l);
                        n[run->captured_len + l] = '\n';
                        n[run->captured_len + l + 1] = 0;
                        run->captured = n;
                        run->captured_len += l + 1;
                }
        }

        if (run->cb.line)
                run->cb.line(run, line, run->userdata);
}

static void update_status_text(DkmsRun *run, uint64_t now) {
        char elapsed[32];

        dkms_format_elapsed(elapsed, sizeof elapsed, now > run->started_usec ? now - run->started_usec : 0);
        free(run->status_text);
        run->status_text = strprintf("building %s for %s: %s", run->out.label ?: "DKMS modules", run->kver, elapsed);
}

static int on_progress(sd_event_source *s, uint64_t usec, void *userdata) {
        DkmsRun *run = userdata;
        uint64_t due = usec;

        /* Count from when the tick was due, not when a busy loop got to it: the text says "2m10s",
         * not "2m10.3s", and the ticks do not drift. */
        (void) sd_event_source_get_time(s, &due);
        update_status_text(run, due);
        if (run->cb.progress && run->status_text)
                run->cb.progress(run, run->status_text, run->userdata);
        if (run->progress_source) /* unless the callback cancelled the run */
                (void) event_reset_time(run->event, &run->progress_source, CLOCK_MONOTONIC, due + run->progress_usec, 0,
                                        on_progress, run, "dkms-progress");
        return 0;
}

static void disconnect(DkmsRun *run) {
        run->progress_source = sd_event_source_disable_unref(run->progress_source);
        run->child = spawn_free(run->child);
}

/* dkms has gone (its lines were delivered first; what was left of its group is killed). */
static void child_exited(Spawn *child, const SpawnResult *res, void *userdata) {
        DkmsRun *run = userdata;
        _cleanup_free_ char *message = NULL;
        int r;

        disconnect(run);

        DkmsVerdict v = {
                .kver = run->kver,
                .status_run = run->kind == RUN_STATUS,
                .timed_out = res->timed_out,
                .timeout_usec = run->timeout_usec,
                .elapsed_usec = res->elapsed_usec,
                .exit_status = res->exit_status,
                .signal = res->signal,
        };
        run->exit_status = v.exit_status;
        run->outcome = dkms_output_outcome(&run->out, &v);
        message = dkms_output_message(&run->out, &v, &run->outcome);
        r = dkms_outcome_to_errno(run->outcome);

        if (run->kind == RUN_STATUS) {
                DkmsModule *l = NULL;
                size_t n = 0;

                if (r == 0 && dkms_status_parse(run->captured, &l, &n) < 0)
                        r = -ENOMEM;
                if (run->status_done) {
                        DkmsStatusHandler done = run->status_done;
                        run->status_done = NULL;
                        done(run, r, l, n, r < 0 ? message : NULL, run->userdata);
                }
                dkms_module_list_free(l, n);
                return;
        }

        if (run->cb.done) {
                void (*done)(DkmsRun *, int, const char *, void *) = run->cb.done;
                run->cb = (DkmsRunCallbacks) {};
                done(run, r, message, run->userdata); /* may free run: nothing after this */
        }
}

DkmsRun *dkms_run_free(DkmsRun *run) {
        if (!run)
                return NULL;
        (void) dkms_run_cancel(run);
        disconnect(run);
        sd_event_unref(run->event);
        free(run->program);
        free(run->kver);
        dkms_output_done(&run->out);
        free(run->captured);
        free(run->status_text);
        return mfree(run);
}

DEFINE_CLEANUP_FUNC(DkmsRun *, dkms_run_free);

int dkms_run_cancel(DkmsRun *run) {
        if (!run || !spawn_is_running(run->child))
                return -ESRCH;

        /* SIGTERM now; SIGKILL after the grace and the reap happen from the loop, without us. */
        (void) spawn_cancel(run->child);
        disconnect(run);
        run->outcome = DKMS_OUTCOME_CANCELLED;
        run->exit_status = -1;
        run->cb = (DkmsRunCallbacks) {};
        run->status_done = NULL;
        return 0;
}

static char **child_environment(void) {
        char **env = NULL;

        /* dkms and gcc messages in English: "No space left on device" is matched in the output. */
        for (char **e = environ; e && *e; e++)
                if (!startswith(*e, "LC_ALL=") && !startswith(*e, "LANGUAGE=") && strv_extend(&env, *e) < 0)
                        return strv_free(env);
        if (strv_extend(&env, "LC_ALL=C") < 0)
                return strv_free(env);
        return env;
}

static int spawn_dkms(DkmsRun *run, char **argv, char **ret_error) {
        _cleanup_strv_free_ char **env = child_environment();
        SpawnOptions o = {
                .env = env,
                .timeout_usec = run->timeout_usec,
                .kill_grace_usec = run->kill_grace_usec,
                .capture = true,
                .on_line = process_line,
                .on_exit = child_exited,
                .userdata = run,
        };
        int r;

        if (!env)
                return -ENOMEM;
        r = spawn_start(run->event, argv, &o, &run->child);
        if (r < 0 && ret_error)
                *ret_error = r == -ENOENT
                        ? strprintf("Cannot run %s: not found; install the dkms package (or set the "
                                    "path of dkms)", argv[0])
                        : strprintf("Cannot run %s: %s", argv[0], strerror(-r));
        return r;
}

static int run_new(sd_event *e, RunKind kind, const char *kver, const DkmsOptions *o, DkmsRun **ret) {
        _cleanup_(dkms_run_freep) DkmsRun *run = NULL;

        run = calloc(1, sizeof(DkmsRun));
        if (!run)
                return -ENOMEM;
        run->kind = kind;
        run->outcome = _DKMS_OUTCOME_INVALID;
        run->exit_status = -1;
        run->event = sd_event_ref(e);
        run->program = strdup(o && o->program ? o->program : "dkms");
        run->out.dkms_dir = options_path(o, o ? o->dkms_dir : NULL, "var/lib/dkms");
        if (!run->program || !run->out.dkms_dir)
                return -ENOMEM;
        if (kver && !(run->kver = strdup(kver)))
                return -ENOMEM;
        run->timeout_usec = o && o->timeout_usec ? o->timeout_usec : DKMS_TIMEOUT_DEFAULT_USEC;
        if (kind == RUN_STATUS && run->timeout_usec > STATUS_TIMEOUT_USEC)
                run->timeout_usec = STATUS_TIMEOUT_USEC;
        run->kill_grace_usec = o && o->kill_grace_usec ? o->kill_grace_usec : DKMS_KILL_GRACE_DEFAULT_USEC;
        run->progress_usec = o && o->progress_interval_usec ? o->progress_interval_usec : DKMS_PROGRESS_DEFAULT_USEC;
        *ret = TAKE_PTR(run);
        return 0;
}

/* Spawns argv and attaches the progress ticks; on failure the child (if any) is gone again. */
static int run_attach(DkmsRun *run, char **argv, char **ret_error) {
        int r;

        r = spawn_dkms(run, argv, ret_error);
        if (r < 0)
                return r;
        run->started_usec = spawn_started_usec(run->child);

        if (run->kind == RUN_BUILD) {
                /* Ticks are counted from the start, so that the first one says "500ms" even when
                 * spawning took a moment on a loaded machine. */
                r = event_reset_time(run->event, &run->progress_source, CLOCK_MONOTONIC,
                                     run->started_usec + run->progress_usec, 0, on_progress, run, "dkms-progress");
                if (r < 0) {
                        (void) dkms_run_cancel(run);
                        if (ret_error)
                                *ret_error = strprintf("Cannot watch %s: %s", run->program, strerror(-r));
                        return r;
                }
        }
        return 0;
}

int dkms_run_start(sd_event *e, const char *kver, const DkmsOptions *o, const DkmsRunCallbacks *cb,
                   void *userdata, DkmsRun **ret, char **ret_error) {
        _cleanup_(dkms_run_freep) DkmsRun *run = NULL;
        int r;

        assert(e);
        assert(ret);

        if (!kver_ok(kver)) {
                if (ret_error)
                        *ret_error = strprintf("Invalid kernel release \"%s\": expected a name like "
                                               "6.1.0-57-amd64", strna(kver));
                return -EINVAL;
        }
        if (o && o->module && !module_ok(o->module)) {
                if (ret_error)
                        *ret_error = strprintf("Invalid DKMS module \"%s\": expected NAME/VERSION such as "
                                               "nvidia-current/535.261.03", o->module);
                return -EINVAL;
        }

        r = check_headers(kver, o, ret_error);
        if (r < 0)
                return r;

        r = run_new(e, RUN_BUILD, kver, o, &run);
        if (r < 0)
                return r;
        if (cb)
                run->cb = *cb;
        run->userdata = userdata;

        if (o && o->module) {
                const char *slash = strchr(o->module, '/');
                r = dkms_output_set_module(&run->out, o->module, slash - o->module, slash + 1, strlen(slash + 1));
                if (r < 0)
                        return r;
        }
        r = dkms_output_discover(&run->out);
        if (r < 0)
                return r;

        char *argv_install[] = { run->program, (char *) "install", (char *) o->module, (char *) "-k", run->kver, NULL };
        char *argv_auto[] = { run->program, (char *) "autoinstall", (char *) "-k", run->kver, NULL };
        r = run_attach(run, o && o->module ? argv_install : argv_auto, ret_error);
        if (r < 0)
                return r;

        update_status_text(run, run->started_usec);
        if (run->cb.progress && run->status_text)
                run->cb.progress(run, run->status_text, run->userdata);

        *ret = TAKE_PTR(run);
        return 0;
}

int dkms_status_start(sd_event *e, const char *kver, const DkmsOptions *o, DkmsStatusHandler done,
                      void *userdata, DkmsRun **ret, char **ret_error) {
        _cleanup_(dkms_run_freep) DkmsRun *run = NULL;
        int r;

        assert(e);
        assert(ret);

        if (kver && !kver_ok(kver)) {
                if (ret_error)
                        *ret_error = strprintf("Invalid kernel release \"%s\": expected a name like "
                                               "6.1.0-57-amd64", kver);
                return -EINVAL;
        }

        r = run_new(e, RUN_STATUS, kver, o, &run);
        if (r < 0)
                return r;
        run->status_done = done;
        run->userdata = userdata;

        char *argv_all[] = { run->program, (char *) "status", NULL };
        char *argv_k[] = { run->program, (char *) "status", (char *) "-k", run->kver, NULL };
        r = run_attach(run, kver ? argv_k : argv_all, ret_error);
        if (r < 0)
                return r;

        *ret = TAKE_PTR(run);
        return 0;
}

static int fingerprint_stat(char ***l, const char *what, const char *path) {
        struct stat st;

        if (stat(path, &st) < 0)
                return strv_extendf(l, "%s -", what);
        return strv_extendf(l, "%s %llu %lld.%09ld", what, (unsigned long long) st.st_ino,
                            (long long) st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
}

int dkms_fingerprint(const char *kver, const DkmsOptions *o, char **ret) {
        _cleanup_free_ char *modules = options_path(o, o ? o->modules_dir : NULL, "lib/modules"),
                            *dkms_dir = options_path(o, o ? o->dkms_dir : NULL, "var/lib/dkms"),
                            *usr_src = options_path(o, NULL, "usr/src"), *kdir = NULL, *build = NULL;
        _cleanup_strv_free_ char **l = NULL, **entries = NULL;
        _cleanup_closedir_ DIR *d = NULL;
        struct dirent *de;
        int r;

        if (!modules || !dkms_dir || !usr_src)
                return -ENOMEM;
        kdir = path_join(modules, kver);
        build = kdir ? path_join(kdir, "build") : NULL;
        if (!build)
                return -ENOMEM;
        r = strv_extendf(&l, "kernel %s program %s module %s", kver, o && o->program ? o->program : "dkms",
                         o && o->module ? o->module : "(autoinstall)");
        if (r >= 0)
                r = fingerprint_stat(&l, "headers", build);
        if (r >= 0)
                r = fingerprint_stat(&l, "modules", kdir);
        if (r >= 0)
                r = fingerprint_stat(&l, "usr/src", usr_src);
        if (r < 0)
                return r;

        d = opendir(dkms_dir);
        while (d && (de = readdir(d))) {
                _cleanup_closedir_ DIR *vd = NULL;
                _cleanup_free_ char *p = NULL;
                struct dirent *ve;

                if (de->d_name[0] == '.')
                        continue;
                p = path_join(dkms_dir, de->d_name);
                if (!p)
                        return -ENOMEM;
                vd = opendir(p);
                while (vd && (ve = readdir(vd))) {
                        _cleanup_free_ char *src = NULL, *conf = NULL, *what = NULL, *what_conf = NULL;

                        if (ve->d_name[0] == '.' || startswith(ve->d_name, "kernel-"))
                                continue;
                        src = strprintf("%s/%s/source", p, ve->d_name);
                        conf = strprintf("%s/%s/source/dkms.conf", p, ve->d_name);
                        what = strprintf("dkms %s/%s", de->d_name, ve->d_name);
                        what_conf = strprintf("dkms %s/%s dkms.conf", de->d_name, ve->d_name);
                        if (!src || !conf || !what || !what_conf)
                                return -ENOMEM;
                        if (fingerprint_stat(&entries, what, src) < 0 || fingerprint_stat(&entries, what_conf, conf) < 0)
                                return -ENOMEM;
                }
        }
        /* readdir order is the file system's: sort so that equal trees give equal strings. */
        strv_sort(entries);
        STRV_FOREACH(e, entries)
                if (strv_extend(&l, *e) < 0)
                        return -ENOMEM;
        *ret = strv_join(l, "\n");
        return *ret ? 0 : -ENOMEM;
}
