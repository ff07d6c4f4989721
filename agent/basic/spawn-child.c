/* SPDX-License-Identifier: MIT */
/* Owns the child-process helper (see spawn-child.h; not spawn.h, which would shadow <spawn.h>): posix_spawn with its own process group and closed
 * descriptors, the pidfd (or poll) watch, the SIGTERM → SIGKILL → abandon escalation, line-by-line
 * output, and the background reaper that collects children nobody waits for any more. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/pidfd.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "event-util.h"
#include "fileio.h"
#include "spawn-child.h"

extern char **environ;

#define LINE_MAX_BYTES 4096
#define POLL_CHILD_USEC (50 * USEC_PER_MSEC)
#define POLL_CHILD_MAX_USEC (1 * USEC_PER_SEC)
#define REAPER_POLL_MIN_USEC (20 * USEC_PER_MSEC)
#define REAPER_POLL_MAX_USEC (10 * USEC_PER_SEC)
#define PIDFD_UNSUPPORTED(e) ((e) == ENOSYS || (e) == EPERM)

typedef enum SpawnPhase {
        PHASE_RUNNING,
        PHASE_TERM_SENT,
        PHASE_KILL_SENT,
} SpawnPhase;

struct Spawn {
        sd_event *event;
        SpawnOptions o;          /* env is not kept */
        pid_t pid;               /* also the process group id; 0 when it ended */
        int pidfd, pipe_fd;
        sd_event_source *exit_source;  /* pidfd io, or the poll timer */
        sd_event_source *pipe_source, *timer_source;
        SpawnPhase phase;
        bool timed_out;
        uint64_t started_usec;
        uint64_t poll_usec;      /* the poll interval without a pidfd, backing off */
        char buf[LINE_MAX_BYTES];
        size_t buf_len;
};

/* ---- the background reaper: a floating time source per child nobody waits for ---- */

typedef struct Orphan {
        pid_t pid;
        int kill_signal;
        uint64_t kill_at;        /* CLOCK_MONOTONIC; 0 once sent */
        uint64_t interval;
} Orphan;

/* When pid has exited: kills what is left of its group while the zombie still pins the group id, then
 * reaps it. Returns true when it is gone (or was never ours to reap). Never blocks. */
static bool try_reap(pid_t pid) {
        siginfo_t si = {};

        for (;;) {
                if (waitid(P_PID, pid, &si, WEXITED | WNOHANG | WNOWAIT) >= 0)
                        break;
                if (errno != EINTR)
                        return true; /* ECHILD: someone else reaped it */
        }
        if (si.si_pid != pid)
                return false;
        (void) kill(-pid, SIGKILL);
        while (waitid(P_PID, pid, &si, WEXITED | WNOHANG) < 0 && errno == EINTR)
                ;
        return true;
}

static void orphan_destroy(void *userdata) {
        Orphan *o = userdata;

        /* Reaped, or the loop goes away (shutdown): then a last kill and a last look; what is still stuck
         * in the kernel goes to init, which reaps it. */
        if (!try_reap(o->pid)) {
                (void) kill(-o->pid, SIGKILL);
                (void) try_reap(o->pid);
        }
        free(o);
}

static int on_orphan(sd_event_source *s, uint64_t usec, void *userdata) {
        Orphan *o = userdata;
        uint64_t next;

        if (o->kill_at && usec >= o->kill_at) {
                (void) kill(-o->pid, o->kill_signal);
                o->kill_at = 0;
        }
        if (try_reap(o->pid)) {
                /* Not floating any more, the loop's reference is dropped with it: freed after this
                 * dispatch, and orphan_destroy() finds the child gone. */
                (void) sd_event_source_set_enabled(s, SD_EVENT_OFF);
                (void) sd_event_source_set_floating(s, false);
                return 0;
        }
        o->interval = o->interval * 2 > REAPER_POLL_MAX_USEC ? REAPER_POLL_MAX_USEC : o->interval * 2;
        next = usec + o->interval;
        if (o->kill_at && o->kill_at < next)
                next = o->kill_at;
        (void) sd_event_source_set_time(s, next);
        return sd_event_source_set_enabled(s, SD_EVENT_ONESHOT);
}

/* Hands pid to the loop: kill_signal is sent to its group at kill_at (0: not again), and it is reaped
 * when it goes. Never blocks. */
static void reaper_adopt(sd_event *e, pid_t pid, int kill_signal, uint64_t kill_at) {
        _cleanup_(sd_event_source_unrefp) sd_event_source *s = NULL;
        Orphan *o;
        uint64_t now = 0;

        if (try_reap(pid))
                return;
        o = calloc(1, sizeof *o);
        if (!o)
                goto last_resort;
        *o = (Orphan) { .pid = pid, .kill_signal = kill_signal, .kill_at = kill_at, .interval = REAPER_POLL_MIN_USEC };
        (void) sd_event_now(e, CLOCK_MONOTONIC, &now);
        if (event_reset_time(e, &s, CLOCK_MONOTONIC, now + REAPER_POLL_MIN_USEC, 0, on_orphan, o, "spawn-reaper") < 0) {
                free(o);
                goto last_resort;
        }
        (void) sd_event_source_set_destroy_callback(s, orphan_destroy);
        if (sd_event_source_set_floating(s, true) < 0)
                return; /* s's cleanup destroys o: killed, then init reaps it */
        return;

last_resort:
        (void) kill(-pid, SIGKILL);
        (void) try_reap(pid);
}

/* ---- one child ---- */

bool spawn_is_running(const Spawn *s) {
        return s && s->pid > 0;
}

pid_t spawn_pid(const Spawn *s) {
        return s ? s->pid : 0;
}

uint64_t spawn_started_usec(const Spawn *s) {
        return s ? s->started_usec : 0;
}

static void disconnect(Spawn *s) {
        s->exit_source = sd_event_source_disable_unref(s->exit_source);
        s->pipe_source = sd_event_source_disable_unref(s->pipe_source);
        s->timer_source = sd_event_source_disable_unref(s->timer_source);
        if (s->pidfd >= 0)
                s->pidfd = (close(s->pidfd), -1);
        if (s->pipe_fd >= 0)
                s->pipe_fd = (close(s->pipe_fd), -1);
}

static void process_line(Spawn *s, const char *line) {
        if (s->o.on_line)
                s->o.on_line(s, line, s->o.userdata);
}

/* Reads what the pipe has now; returns 0 at EOF, 1 when it is empty for now, 2 when it stopped early
 * (more may be there: fairness towards the other event sources). */
static int read_pipe(Spawn *s) {
        for (unsigned rounds = 0; rounds < 16; rounds++) {
                ssize_t n = read(s->pipe_fd, s->buf + s->buf_len, sizeof(s->buf) - 1 - s->buf_len);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return errno == EAGAIN ? 1 : 0;
                }
                if (n == 0) {
                        if (s->buf_len > 0) {
                                s->buf[s->buf_len] = 0;
                                s->buf_len = 0;
                                process_line(s, s->buf);
                        }
                        return 0;
                }
                s->buf_len += n;

                char *start = s->buf, *nl;
                while ((nl = memchr(start, '\n', s->buf + s->buf_len - start))) {
                        *nl = 0;
                        process_line(s, start);
                        start = nl + 1;
                }
                s->buf_len -= start - s->buf;
                memmove(s->buf, start, s->buf_len);

                /* A line longer than the buffer is passed on in pieces rather than dropped. */
                if (s->buf_len == sizeof(s->buf) - 1) {
                        s->buf[s->buf_len] = 0;
                        s->buf_len = 0;
                        process_line(s, s->buf);
                }
        }
        return 2;
}

static int on_pipe(sd_event_source *es, int fd, uint32_t revents, void *userdata) {
        Spawn *s = userdata;

        if (read_pipe(s) == 0 && s->pipe_source)
                (void) sd_event_source_set_enabled(s->pipe_source, SD_EVENT_OFF);
        return 0;
}

static void finish(Spawn *s, const SpawnResult *res) {
        SpawnExitHandler cb = s->o.on_exit;

        s->o.on_exit = NULL;
        s->o.on_line = NULL;
        if (cb)
                cb(s, res, s->o.userdata); /* may free s: nothing after this */
}

static uint64_t elapsed(Spawn *s) {
        uint64_t now = 0;

        (void) sd_event_now(s->event, CLOCK_MONOTONIC, &now);
        return now > s->started_usec ? now - s->started_usec : 0;
}

static int start_polling(Spawn *s);

/* The leader has exited (a zombie, so its pid and group cannot be reused yet). */
static void leader_exited(Spawn *s) {
        SpawnResult res = { .exit_status = -1, .timed_out = s->timed_out };
        siginfo_t si = {};

        /* Output written just before exiting is still in the pipe: deliver it before the verdict. Stop at
         * "nothing more now" rather than EOF: a straggler holding the pipe must not keep us. */
        if (s->pipe_fd >= 0 && s->pipe_source && sd_event_source_get_enabled(s->pipe_source, NULL) > 0)
                while (read_pipe(s) == 2)
                        ;

        /* What is left of the group (a make job that outlived dkms, a grandchild holding the pipe). */
        (void) kill(-s->pid, SIGKILL);
        for (;;) {
                if (waitid(P_PID, s->pid, &si, WEXITED | WNOHANG) >= 0)
                        break;
                if (errno != EINTR) {
                        /* si_pid and si_status share a union in glibc's siginfo_t: set one by one. */
                        si = (siginfo_t) {};
                        si.si_pid = s->pid;
                        si.si_code = CLD_KILLED;
                        si.si_status = SIGKILL;
                        break;
                }
        }
        if (si.si_pid != s->pid) {
                /* Not reapable yet (its other threads are still exiting): look again shortly. */
                if (s->pidfd >= 0 && start_polling(s) >= 0)
                        return;
                si = (siginfo_t) { .si_code = CLD_KILLED, .si_status = SIGKILL };
                reaper_adopt(s->event, s->pid, 0, 0);
        }

        s->pid = 0;
        res.elapsed_usec = elapsed(s);
        if (si.si_code == CLD_EXITED)
                res.exit_status = si.si_status;
        else
                res.signal = si.si_status;
        disconnect(s);
        finish(s, &res);
}

static int on_pidfd(sd_event_source *es, int fd, uint32_t revents, void *userdata) {
        leader_exited(userdata);
        return 0;
}

/* Without pidfds: look every poll_usec (50 ms, backing off to 1 s), without reaping (WNOWAIT) so that
 * leader_exited() can still kill the rest of the group while the leader's pid is pinned as a zombie. */
static int on_poll(sd_event_source *es, uint64_t usec, void *userdata) {
        Spawn *s = userdata;
        siginfo_t si = {};

        if (waitid(P_PID, s->pid, &si, WEXITED | WNOHANG | WNOWAIT) < 0 || si.si_pid == s->pid) {
                if (s->pidfd >= 0)
                        s->pidfd = (close(s->pidfd), -1);
                leader_exited(s);
                return 0;
        }
        /* 50 ms at first, backing off to 1 s: a long-lived worker must not keep an idle loop awake. */
        s->poll_usec = s->poll_usec ? s->poll_usec * 2 : POLL_CHILD_USEC;
        if (s->poll_usec > POLL_CHILD_MAX_USEC)
                s->poll_usec = POLL_CHILD_MAX_USEC;
        (void) sd_event_source_set_time(es, usec + s->poll_usec);
        return sd_event_source_set_enabled(es, SD_EVENT_ONESHOT);
}

static int start_polling(Spawn *s) {
        s->exit_source = sd_event_source_disable_unref(s->exit_source);
        return event_reset_time_relative(s->event, &s->exit_source, CLOCK_MONOTONIC, POLL_CHILD_USEC, 0,
                                         on_poll, s, "spawn-poll");
}

static int on_timer(sd_event_source *es, uint64_t usec, void *userdata) {
        Spawn *s = userdata;
        SpawnResult res = { .exit_status = -1, .timed_out = true, .abandoned = true };

        switch (s->phase) {
        case PHASE_RUNNING:
                s->timed_out = true;
                (void) kill(-s->pid, SIGTERM);
                s->phase = PHASE_TERM_SENT;
                (void) sd_event_source_set_time(es, usec + s->o.kill_grace_usec);
                return sd_event_source_set_enabled(es, SD_EVENT_ONESHOT);
        case PHASE_TERM_SENT:
                (void) kill(-s->pid, s->o.kill_signal);
                s->phase = PHASE_KILL_SENT;
                (void) sd_event_source_set_time(es, usec + s->o.abandon_usec);
                return sd_event_source_set_enabled(es, SD_EVENT_ONESHOT);
        case PHASE_KILL_SENT:
                break;
        }

        /* SIGKILL did not end it within abandon_usec: stuck in the kernel. Tell the caller now and let
         * the reaper collect it whenever the kernel lets it go. */
        res.signal = SIGKILL;
        res.elapsed_usec = elapsed(s);
        reaper_adopt(s->event, s->pid, 0, 0);
        s->pid = 0;
        disconnect(s);
        finish(s, &res);
        return 0;
}

int spawn_find_program(const char *name, char **ret) {
        _cleanup_free_ char *path = NULL;

        if (isempty(name))
                return -EINVAL;
        if (strchr(name, '/')) {
                if (access(name, X_OK) < 0)
                        return negative_errno();
                *ret = strdup(name);
                return *ret ? 0 : -ENOMEM;
        }
        path = strdup(getenv("PATH") ?: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
        if (!path)
                return -ENOMEM;
        for (char *save = NULL, *dir = strtok_r(path, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
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

static int do_spawn(Spawn *s, const char *exe, char *const *argv, char **env) {
        _cleanup_close_ int pipe_r = -1, pipe_w = -1;
        posix_spawn_file_actions_t fa;
        posix_spawnattr_t attr;
        sigset_t none, all;
        pid_t pid;
        int r;

        if (s->o.capture) {
                int fds[2];
                if (pipe2(fds, O_CLOEXEC) < 0)
                        return negative_errno();
                pipe_r = fds[0];
                pipe_w = fds[1];
                if (fcntl(pipe_r, F_SETFL, O_NONBLOCK) < 0)
                        return negative_errno();
        }

        sigemptyset(&none);
        sigfillset(&all);
        posix_spawnattr_init(&attr);
        /* Own process group: the timeout kills the program with everything it started. Default signal
         * handling and an empty mask: the daemon blocks the signals it handles through sd-event. */
        posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
        posix_spawnattr_setpgroup(&attr, 0);
        posix_spawnattr_setsigmask(&attr, &none);
        posix_spawnattr_setsigdefault(&attr, &all);

        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
        if (pipe_w >= 0) {
                posix_spawn_file_actions_adddup2(&fa, pipe_w, STDOUT_FILENO);
                posix_spawn_file_actions_adddup2(&fa, pipe_w, STDERR_FILENO);
        } else {
                posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
                posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
        }
        /* Every inherited descriptor, not only ours with O_CLOEXEC: a library's fd (NVML's, libkmod's)
         * or the bus socket must not live on in a program that may outlive us. */
        posix_spawn_file_actions_addclosefrom_np(&fa, 3);

        r = posix_spawn(&pid, exe, &fa, &attr, argv, env ?: environ);
        posix_spawn_file_actions_destroy(&fa);
        posix_spawnattr_destroy(&attr);
        if (r != 0)
                return -r;

        s->pid = pid;
        s->pipe_fd = TAKE_FD(pipe_r);
        s->pidfd = pidfd_open(pid, 0);
        if (s->pidfd < 0 && !PIDFD_UNSUPPORTED(errno)) {
                r = negative_errno();
                (void) kill(-pid, SIGKILL);
                reaper_adopt(s->event, pid, 0, 0);
                s->pid = 0;
                return r;
        }
        return 0;
}

static int spawn_new(sd_event *e, const SpawnOptions *o, Spawn **ret) {
        Spawn *s = calloc(1, sizeof *s);

        if (!s)
                return -ENOMEM;
        s->pidfd = s->pipe_fd = -1;
        s->event = sd_event_ref(e);
        if (o)
                s->o = *o;
        s->o.env = NULL;
        if (!s->o.kill_grace_usec)
                s->o.kill_grace_usec = SPAWN_KILL_GRACE_DEFAULT_USEC;
        if (!s->o.abandon_usec)
                s->o.abandon_usec = SPAWN_ABANDON_DEFAULT_USEC;
        if (!s->o.kill_signal)
                s->o.kill_signal = SIGKILL;
        *ret = s;
        return 0;
}

/* The child runs: attach the pipe, the exit watch and the timeout. */
static int attach(Spawn *s) {
        int r = 0;

        (void) sd_event_now(s->event, CLOCK_MONOTONIC, &s->started_usec);
        if (s->pipe_fd >= 0) {
                r = sd_event_add_io(s->event, &s->pipe_source, s->pipe_fd, EPOLLIN, on_pipe, s);
                if (r >= 0) {
                        (void) sd_event_source_set_description(s->pipe_source, "spawn-output");
                        /* Lines before the verdict: the pipe is served ahead of the exit notification. */
                        r = sd_event_source_set_priority(s->pipe_source, SD_EVENT_PRIORITY_NORMAL - 1);
                }
        }
        if (r >= 0)
                r = s->pidfd >= 0 ? sd_event_add_io(s->event, &s->exit_source, s->pidfd, EPOLLIN, on_pidfd, s)
                                  : start_polling(s);
        if (r >= 0 && s->o.timeout_usec > 0)
                r = event_reset_time(s->event, &s->timer_source, CLOCK_MONOTONIC,
                                     s->started_usec + s->o.timeout_usec, 0, on_timer, s, "spawn-timeout");
        if (r < 0)
                return r; /* spawn_free() cancels */
        (void) sd_event_source_set_description(s->exit_source, "spawn-exit");
        return 0;
}

int spawn_start(sd_event *e, char *const *argv, const SpawnOptions *o, Spawn **ret) {
        _cleanup_(spawn_freep) Spawn *s = NULL;
        _cleanup_free_ char *exe = NULL;
        int r;

        assert(e);
        assert(argv && argv[0]);
        assert(ret);

        r = spawn_find_program(argv[0], &exe);
        if (r < 0)
                return r;
        r = spawn_new(e, o, &s);
        if (r < 0)
                return r;
        r = do_spawn(s, exe, argv, o ? o->env : NULL);
        if (r < 0)
                return r;
        r = attach(s);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(s);
        return 0;
}

_noreturn_ static void child_run(int pass_fd, SpawnChildFunc fn, void *userdata) {
        struct sigaction dfl = { .sa_handler = SIG_DFL };
        sigset_t none;
        int null;

        /* Only async-signal-safe calls until fn: the parent may have had other threads. */
        (void) prctl(PR_SET_PDEATHSIG, SIGKILL);
        (void) setpgid(0, 0);
        for (int sig = 1; sig < NSIG; sig++)
                if (sig != SIGKILL && sig != SIGSTOP)
                        (void) sigaction(sig, &dfl, NULL);
        sigemptyset(&none);
        (void) sigprocmask(SIG_SETMASK, &none, NULL);

        /* pass_fd stays at its own number: moved to 3 it took the place of whatever the parent had there
         * (the loader opens LD_DEBUG_OUTPUT's file early, often as fd 3), and the loader's lines for the
         * child's dlopen() then went into our socket. Only one below 3 (stdin was closed) is moved up. */
        if (pass_fd < 3 && (pass_fd = fcntl(pass_fd, F_DUPFD, 3)) < 0)
                _exit(127);
        if ((pass_fd > 3 && close_range(3, (unsigned) pass_fd - 1, 0) < 0) ||
            close_range((unsigned) pass_fd + 1, ~0U, 0) < 0)
                for (int fd = 3; fd < 65536; fd++)
                        if (fd != pass_fd)
                                (void) close(fd);
        null = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (null >= 0 && null != STDIN_FILENO) {
                (void) dup2(null, STDIN_FILENO);
                (void) close(null);
        }
        _exit(fn(pass_fd, userdata));
}

int spawn_fork(sd_event *e, int pass_fd, SpawnChildFunc fn, void *userdata, const SpawnOptions *o, Spawn **ret) {
        _cleanup_(spawn_freep) Spawn *s = NULL;
        pid_t pid;
        int r;

        assert(e);
        assert(fn);
        assert(ret);
        assert(!o || !o->capture);

        r = spawn_new(e, o, &s);
        if (r < 0)
                return r;
        pid = fork();
        if (pid < 0)
                return negative_errno();
        if (pid == 0)
                child_run(pass_fd, fn, userdata);

        (void) setpgid(pid, pid); /* also here: no kill(-pid) may race the child's own setpgid() */
        s->pid = pid;
        s->pidfd = pidfd_open(pid, 0);
        if (s->pidfd < 0 && !PIDFD_UNSUPPORTED(errno)) {
                r = negative_errno();
                (void) kill(pid, SIGKILL);
                reaper_adopt(e, pid, 0, 0);
                s->pid = 0;
                return r;
        }
        r = attach(s);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(s);
        return 0;
}

int spawn_cancel(Spawn *s) {
        uint64_t now = 0;

        if (!s || s->pid <= 0)
                return -ESRCH;

        (void) kill(-s->pid, SIGTERM);
        (void) sd_event_now(s->event, CLOCK_MONOTONIC, &now);
        reaper_adopt(s->event, s->pid, s->o.kill_signal, now + s->o.kill_grace_usec);
        s->pid = 0;
        s->o.on_exit = NULL;
        s->o.on_line = NULL;
        disconnect(s);
        return 0;
}

Spawn *spawn_free(Spawn *s) {
        if (!s)
                return NULL;
        (void) spawn_cancel(s);
        disconnect(s);
        sd_event_unref(s->event);
        return mfree(s);
}
