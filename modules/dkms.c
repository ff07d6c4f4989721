/* SPDX-License-Identifier: MIT */
/* Owns running the `dkms` program: the child in its own process group, its output read line by
 * line from a pipe on sd-event, the timeout that kills the whole group, progress for STATUS=, and
 * cancellation. What the output means is dkms-output.c's; status parsing and the string tables are
 * dkms-status.c's; the blocking front ends are dkms-sync.c's. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/pidfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dkms-internal.h"
#include "dkms.h"
#include "fileio.h"
#include "macro.h"
#include "strv.h"

extern char **environ;

#define LINE_MAX_BYTES 4096
#define STATUS_TIMEOUT_USEC (60 * UINT64_C(1000000))
#define CANCEL_GRACE_USEC (1 * UINT64_C(1000000))
#define POLL_CHILD_USEC (50 * UINT64_C(1000))
#define PIDFD_UNSUPPORTED(e) ((e) == ENOSYS || (e) == EPERM)

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

        pid_t pid;               /* also the process group id */
        int pidfd;
        int pipe_fd;
        sd_event_source *pid_source, *pipe_source, *timeout_source, *kill_source, *progress_source;

        uint64_t started_usec, timeout_usec, kill_grace_usec, progress_usec;
        char buf[LINE_MAX_BYTES];
        size_t buf_len;
        char *captured;          /* RUN_STATUS: the whole output */
        size_t captured_len;
        char *status_text;

        bool timed_out;
        DkmsOutcome outcome;
        int exit_status;
};

bool dkms_run_is_running(const DkmsRun *run) {
        return run && run->pid > 0;
}

pid_t dkms_run_pid(const DkmsRun *run) {
        return run ? run->pid : 0;
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

const char *dkms_run_status_text(const DkmsRun *run) {
        return run ? run->status_text : NULL;
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

static void process_line(DkmsRun *run, const char *line) {
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

/* Reads what the pipe has now; returns 0 at EOF, 1 when it is empty for now, 2 when it stopped
 * early (more may be there: fairness towards the other event sources). */
static int read_pipe(DkmsRun *run) {
        for (unsigned rounds = 0; rounds < 16; rounds++) {
                ssize_t n = read(run->pipe_fd, run->buf + run->buf_len, sizeof(run->buf) - 1 - run->buf_len);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return errno == EAGAIN ? 1 : 0;
                }
                if (n == 0) {
                        if (run->buf_len > 0) {
                                run->buf[run->buf_len] = 0;
                                run->buf_len = 0;
                                process_line(run, run->buf);
                        }
                        return 0;
                }
                run->buf_len += n;

                char *start = run->buf, *nl;
                while ((nl = memchr(start, '\n', run->buf + run->buf_len - start))) {
                        *nl = 0;
                        process_line(run, start);
                        start = nl + 1;
                }
                run->buf_len -= start - run->buf;
                memmove(run->buf, start, run->buf_len);

                /* A line longer than the buffer is passed on in pieces rather than dropped. */
                if (run->buf_len == sizeof(run->buf) - 1) {
                        run->buf[run->buf_len] = 0;
                        run->buf_len = 0;
                        process_line(run, run->buf);
                }
        }
        return 2;
}

static int on_pipe(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        DkmsRun *run = userdata;

        if (read_pipe(run) == 0 && run->pipe_source)
                (void) sd_event_source_set_enabled(run->pipe_source, SD_EVENT_OFF);
        return 0;
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
                (void) sd_event_source_set_time(run->progress_source, due + run->progress_usec);
        return 0;
}

static int on_kill(sd_event_source *s, uint64_t usec, void *userdata) {
        DkmsRun *run = userdata;

        (void) kill(-run->pid, SIGKILL);
        return 0;
}

static int on_timeout(sd_event_source *s, uint64_t usec, void *userdata) {
        DkmsRun *run = userdata;

        run->timed_out = true;
        (void) kill(-run->pid, SIGTERM);
        (void) sd_event_add_time(run->event, &run->kill_source, CLOCK_MONOTONIC, usec + run->kill_grace_usec,
                                 0, on_kill, run);
        return 0;
}

static void disconnect(DkmsRun *run) {
        run->pid_source = sd_event_source_disable_unref(run->pid_source);
        run->pipe_source = sd_event_source_disable_unref(run->pipe_source);
        run->timeout_source = sd_event_source_disable_unref(run->timeout_source);
        run->kill_source = sd_event_source_disable_unref(run->kill_source);
        run->progress_source = sd_event_source_disable_unref(run->progress_source);
        if (run->pidfd >= 0)
                run->pidfd = (close(run->pidfd), -1);
        if (run->pipe_fd >= 0)
                run->pipe_fd = (close(run->pipe_fd), -1);
}

/* The leader has exited (a zombie, so its pid cannot be reused yet): kill what is left of the group
 * (a make job that outlived dkms) and reap. Returns the waitid() status. */
static int reap(DkmsRun *run, siginfo_t *si) {
        (void) kill(-run->pid, SIGKILL);
        *si = (siginfo_t) {};
        while (waitid(P_PID, run->pid, si, WEXITED) < 0)
                if (errno != EINTR)
                        return -errno;
        run->pid = 0;
        return 0;
}

static void child_exited(DkmsRun *run) {
        _cleanup_free_ char *message = NULL;
        uint64_t now = 0;
        siginfo_t si;
        int r;

        /* Output written just before exiting is still in the pipe: deliver it before the verdict. Stop
         * at "nothing more now" rather than EOF: a straggler holding the pipe must not keep us. */
        if (run->pipe_fd >= 0 && run->pipe_source && sd_event_source_get_enabled(run->pipe_source, NULL) > 0)
                while (read_pipe(run) == 2)
                        ;

        r = reap(run, &si);
        disconnect(run);
        (void) sd_event_now(run->event, CLOCK_MONOTONIC, &now);

        DkmsVerdict v = {
                .kver = run->kver,
                .status_run = run->kind == RUN_STATUS,
                .timed_out = run->timed_out,
                .timeout_usec = run->timeout_usec,
                .elapsed_usec = now > run->started_usec ? now - run->started_usec : 0,
                .exit_status = r >= 0 && si.si_code == CLD_EXITED ? si.si_status : -1,
                .signal = r >= 0 && si.si_code != CLD_EXITED ? si.si_status : 0,
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

static int on_exit_child(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        child_exited(userdata);
        return 0;
}

/* Without pidfds: look every POLL_CHILD_USEC, without reaping (WNOWAIT) so child_exited() can still
 * kill the rest of the group while the leader's pid is pinned as a zombie. */
static int on_poll_child(sd_event_source *s, uint64_t usec, void *userdata) {
        DkmsRun *run = userdata;
        siginfo_t si = {};

        if (waitid(P_PID, run->pid, &si, WEXITED | WNOHANG | WNOWAIT) < 0 || si.si_pid == run->pid) {
                child_exited(run);
                return 0;
        }
        return sd_event_source_set_time(s, usec + POLL_CHILD_USEC);
}

DkmsRun *dkms_run_free(DkmsRun *run) {
        if (!run)
                return NULL;
        if (run->pid > 0)
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
        siginfo_t si = {};
        uint64_t waited = 0;

        if (!run || run->pid <= 0)
                return -ESRCH;

        (void) kill(-run->pid, SIGTERM);
        /* Poll rather than wait on the loop: this runs at shutdown, when the loop is being torn down. */
        for (;;) {
                si = (siginfo_t) {};
                if (waitid(P_PID, run->pid, &si, WEXITED | WNOHANG | WNOWAIT) < 0 && errno != EINTR)
                        break;
                if (si.si_pid == run->pid || waited >= CANCEL_GRACE_USEC)
                        break;
                (void) nanosleep(&(struct timespec) { .tv_nsec = 10 * 1000 * 1000 }, NULL);
                waited += 10 * USEC_PER_MSEC;
        }
        (void) reap(run, &si);
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

/* Finds the program ourselves rather than through posix_spawnp(): "not installed" must be a clear
 * start error everywhere, also where an exec failure only shows as exit 127 (valgrind). */
static int find_program(const char *name, char **ret) {
        _cleanup_free_ char *path = NULL;

        if (strchr(name, '/')) {
                if (access(name, X_OK) < 0)
                        return negative_errno();
                *ret = strdup(name);
                return *ret ? 0 : -ENOMEM;
        }
        path = strdup(getenv("PATH") ?: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
        if (!path)
                return -ENOMEM;
        for (char *dir = strtok(path, ":"); dir; dir = strtok(NULL, ":")) {
                _cleanup_free_ char *p = path_join(dir, name);
                if (!p)
                        return -ENOMEM;
                if (access(p, X_OK) == 0) {
                        *ret = TAKE_PTR(p);
                        return 0;
                }
        }
        return -ENOENT;
}

static int spawn(DkmsRun *run, char **argv, char **ret_error) {
        _cleanup_free_ char *exe = NULL;
        _cleanup_strv_free_ char **env = NULL;
        _cleanup_close_ int pipe_r = -1, pipe_w = -1, pidfd = -1;
        posix_spawn_file_actions_t fa;
        posix_spawnattr_t attr;
        sigset_t none, all;
        int fds[2], r;
        pid_t pid;

        r = find_program(argv[0], &exe);
        if (r < 0) {
                if (ret_error)
                        *ret_error = r == -ENOENT
                                ? strprintf("Cannot run %s: not found; install the dkms package (or set the "
                                            "path of dkms)", argv[0])
                                : strprintf("Cannot run %s: %s", argv[0], strerror(-r));
                return r;
        }

        env = child_environment();
        if (!env)
                return -ENOMEM;
        if (pipe2(fds, O_CLOEXEC) < 0)
                return negative_errno();
        pipe_r = fds[0];
        pipe_w = fds[1];
        if (fcntl(pipe_r, F_SETFL, O_NONBLOCK) < 0)
                return negative_errno();

        sigemptyset(&none);
        sigfillset(&all);
        posix_spawnattr_init(&attr);
        /* Own process group: the timeout kills dkms with everything it started. Default signal
         * handling and an empty mask: the daemon blocks SIGTERM for its signal sources. */
        posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
        posix_spawnattr_setpgroup(&attr, 0);
        posix_spawnattr_setsigmask(&attr, &none);
        posix_spawnattr_setsigdefault(&attr, &all);

        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
        posix_spawn_file_actions_adddup2(&fa, pipe_w, STDOUT_FILENO);
        posix_spawn_file_actions_adddup2(&fa, pipe_w, STDERR_FILENO);
        posix_spawn_file_actions_addclosefrom_np(&fa, 3);

        r = posix_spawn(&pid, exe, &fa, &attr, argv, env);
        posix_spawn_file_actions_destroy(&fa);
        posix_spawnattr_destroy(&attr);
        if (r != 0) {
                if (ret_error)
                        *ret_error = strprintf("Cannot run %s: %s", exe, strerror(r));
                return -r;
        }

        pidfd = pidfd_open(pid, 0);
        if (pidfd < 0 && PIDFD_UNSUPPORTED(errno))
                pidfd = -1; /* valgrind, seccomp'd containers: watched by polling instead */
        else if (pidfd < 0) {
                r = negative_errno();
                (void) kill(-pid, SIGKILL);
                (void) waitpid(pid, NULL, 0);
                if (ret_error)
                        *ret_error = strprintf("Cannot watch %s (pidfd_open): %s", argv[0], strerror(-r));
                return r;
        }

        run->pid = pid;
        run->pidfd = TAKE_FD(pidfd);
        run->pipe_fd = TAKE_FD(pipe_r);
        return 0;
}

static int run_new(sd_event *e, RunKind kind, const char *kver, const DkmsOptions *o, DkmsRun **ret) {
        _cleanup_(dkms_run_freep) DkmsRun *run = NULL;

        run = calloc(1, sizeof(DkmsRun));
        if (!run)
                return -ENOMEM;
        run->pidfd = run->pipe_fd = -1;
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

/* Spawns argv and attaches the sources; on failure the child (if any) is gone again. */
static int run_attach(DkmsRun *run, char **argv, char **ret_error) {
        int r;

        r = spawn(run, argv, ret_error);
        if (r < 0)
                return r;

        (void) sd_event_now(run->event, CLOCK_MONOTONIC, &run->started_usec);

        r = sd_event_add_io(run->event, &run->pipe_source, run->pipe_fd, EPOLLIN, on_pipe, run);
        if (r >= 0)
                /* Lines before the verdict: the pipe is served ahead of the exit notification. */
                r = sd_event_source_set_priority(run->pipe_source, SD_EVENT_PRIORITY_NORMAL - 1);
        if (r >= 0)
                r = run->pidfd >= 0
                        ? sd_event_add_io(run->event, &run->pid_source, run->pidfd, EPOLLIN, on_exit_child, run)
                        : sd_event_add_time_relative(run->event, &run->pid_source, CLOCK_MONOTONIC,
                                                     POLL_CHILD_USEC, 0, on_poll_child, run);
        if (r >= 0 && run->pidfd < 0)
                r = sd_event_source_set_enabled(run->pid_source, SD_EVENT_ON);
        if (r >= 0)
                r = sd_event_add_time_relative(run->event, &run->timeout_source, CLOCK_MONOTONIC,
                                               run->timeout_usec, 0, on_timeout, run);
        if (r >= 0 && run->kind == RUN_BUILD)
                r = sd_event_add_time_relative(run->event, &run->progress_source, CLOCK_MONOTONIC,
                                               run->progress_usec, 0, on_progress, run);
        if (r < 0) {
                (void) dkms_run_cancel(run);
                if (ret_error)
                        *ret_error = strprintf("Cannot watch %s: %s", run->program, strerror(-r));
                return r;
        }
        if (run->progress_source)
                (void) sd_event_source_set_enabled(run->progress_source, SD_EVENT_ON);
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
