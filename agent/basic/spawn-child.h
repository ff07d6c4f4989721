/* SPDX-License-Identifier: MIT */
/* Owns running a program as a child process from the event loop: one helper for every program the agent
 * runs (dkms, the GPU reset, ...). The child gets its own process group, /dev/null on stdin, default
 * signal dispositions and an empty mask, and no descriptor of ours besides stdout/stderr (closefrom 3).
 * Its exit is watched through a pidfd on sd-event (a poll from 50 ms backing off to 1 s where pidfds are
 * unavailable, e.g. under valgrind); a timeout sends SIGTERM to the group, SIGKILL after a grace period, and if even that does not
 * end it (a process stuck in the kernel, in D state) the caller is told so after a further bound and the
 * process is left to a background reaper on the same loop. Every reap is waitid(WNOHANG): nothing here
 * ever blocks the loop waiting for a child. Base layer: depends only on libsystemd and macro/strv. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <systemd/sd-event.h>

#include "macro.h"

typedef struct Spawn Spawn;

typedef struct SpawnResult {
        int exit_status;          /* the exit code when it exited, else -1 */
        int signal;               /* the signal that ended it, else 0 */
        bool timed_out;           /* the timeout fired */
        bool abandoned;           /* it did not end even after SIGKILL: left to the background reaper */
        uint64_t elapsed_usec;
} SpawnResult;

typedef void (*SpawnLineHandler)(Spawn *s, const char *line, void *userdata);
/* Called once, when the leader is gone (or abandoned). May free s. */
typedef void (*SpawnExitHandler)(Spawn *s, const SpawnResult *result, void *userdata);

typedef struct SpawnOptions {
        char **env;                     /* NULL: our environment */
        uint64_t timeout_usec;          /* 0: none */
        uint64_t kill_grace_usec;       /* SIGTERM → SIGKILL; 0: SPAWN_KILL_GRACE_DEFAULT_USEC */
        uint64_t abandon_usec;          /* SIGKILL → give up waiting; 0: SPAWN_ABANDON_DEFAULT_USEC */
        bool capture;                   /* stdout+stderr to a pipe, passed to on_line line by line;
                                         * otherwise both go to /dev/null */
        SpawnLineHandler on_line;
        SpawnExitHandler on_exit;
        void *userdata;
        int kill_signal;                /* 0: SIGKILL. Tests put a harmless signal here to emulate a
                                         * process that SIGKILL cannot end quickly (D state). */
} SpawnOptions;

#define SPAWN_KILL_GRACE_DEFAULT_USEC (5 * USEC_PER_SEC)
#define SPAWN_ABANDON_DEFAULT_USEC (2 * USEC_PER_SEC)

/* Resolves a program name on $PATH (a name with a slash is checked as is) to an executable path:
 * -ENOENT when not found, so "not installed" is a clear start error also where an exec failure would
 * only show as exit 127 (valgrind). */
int spawn_find_program(const char *name, char **ret);

/* Starts argv (argv[0] is resolved with spawn_find_program()). The callbacks are called from e. On
 * failure nothing is left running. */
int spawn_start(sd_event *e, char *const *argv, const SpawnOptions *o, Spawn **ret);

/* The body of a forked child (spawn_fork()): fd is the descriptor passed in, at its own number (moved up
 * only if it was below 3); the return value is its exit status. */
typedef int (*SpawnChildFunc)(int fd, void *userdata);

/* Forks (without exec) a child that runs fn: the same process group, descriptor, signal and watch
 * treatment as spawn_start() — every descriptor but 0-2 and pass_fd closed, stdin /dev/null,
 * default signals, an empty mask — plus PR_SET_PDEATHSIG SIGKILL, so that it never outlives us. For
 * workers that run code which may crash or hang (the vendor library). o->capture is not supported. */
int spawn_fork(sd_event *e, int pass_fd, SpawnChildFunc fn, void *userdata, const SpawnOptions *o, Spawn **ret);

/* Ends it without a callback: SIGTERM to the group now; SIGKILL, reaping and cleanup follow from the loop
 * (a background source, also after spawn_free()). Never blocks. -ESRCH when it is not running. */
int spawn_cancel(Spawn *s);

/* Cancels a running child (as spawn_cancel()) and frees. NULL-safe. */
Spawn *spawn_free(Spawn *s);
DEFINE_CLEANUP_FUNC(Spawn *, spawn_free);

bool spawn_is_running(const Spawn *s);
pid_t spawn_pid(const Spawn *s);            /* also the process group id; 0 once it ended */
uint64_t spawn_started_usec(const Spawn *s); /* CLOCK_MONOTONIC */
