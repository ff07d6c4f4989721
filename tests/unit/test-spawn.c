/* SPDX-License-Identifier: MIT */
/* Tests for agent/basic/spawn-child.c: exit status and output lines, closed descriptors, the process group, the
 * SIGTERM → SIGKILL timeout, a child that ignores SIGTERM, a stopped child, a grandchild that keeps the
 * output pipe open, a child SIGKILL cannot end (emulated), cancellation — and that the loop keeps its
 * beat through all of them (a 10 ms ticker never sees a gap of 100 ms). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <signal.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>
#include <cmocka.h>

#include "spawn-child.h"
#include "strv.h"
#include "test-load.h"

#define TICK_USEC (10 * USEC_PER_MSEC)
/* 100 ms, stretched on a busy machine up to 300 ms: still below the shortest blocking these tests could
 * catch (a synchronous wait for a child's 400 ms timeout and grace). */
#define MAX_GAP_USEC test_scaled_usec(100 * USEC_PER_MSEC, 300 * USEC_PER_MSEC)
/* An upper bound on a whole run, stretched the same way (the bounds are far below the timeouts they
 * tell apart: 10 s). */
#define WITHIN(usec) test_scaled_usec((usec), 5 * (usec))

typedef struct Result {
        bool done;
        SpawnResult res;
        char **lines;
        uint64_t last_tick, max_gap;
} Result;

static uint64_t now_usec(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * USEC_PER_SEC + ts.tv_nsec / 1000;
}

static void on_line(Spawn *s, const char *line, void *userdata) {
        Result *r = userdata;
        assert_return_code(strv_extend(&r->lines, line), 0);
}

static void on_exit_cb(Spawn *s, const SpawnResult *res, void *userdata) {
        Result *r = userdata;
        assert_false(r->done);
        r->done = true;
        r->res = *res;
}

static int on_tick(sd_event_source *es, uint64_t usec, void *userdata) {
        Result *r = userdata;
        uint64_t n = now_usec();

        if (r->last_tick && n - r->last_tick > r->max_gap)
                r->max_gap = n - r->last_tick;
        r->last_tick = n;
        (void) sd_event_source_set_time(es, usec + TICK_USEC);
        return sd_event_source_set_enabled(es, SD_EVENT_ONESHOT);
}

static sd_event_source *add_ticker(sd_event *e, Result *r) {
        sd_event_source *t = NULL;
        assert_return_code(sd_event_add_time_relative(e, &t, CLOCK_MONOTONIC, TICK_USEC, 0, on_tick, r), 0);
        return t;
}

static void run_until_done(sd_event *e, Result *r, uint64_t limit_usec) {
        uint64_t t0 = now_usec();
        while (!r->done && now_usec() - t0 < limit_usec)
                assert_return_code(sd_event_run(e, 50 * USEC_PER_MSEC), 0);
        assert_true(r->done);
}

static bool gone(pid_t pid) {
        siginfo_t si = {};
        /* Not ours any more (reaped) and not running. */
        return waitid(P_PID, pid, &si, WEXITED | WNOHANG | WNOWAIT) < 0 && errno == ECHILD && kill(pid, 0) < 0;
}

static void run_until_gone(sd_event *e, pid_t pid, uint64_t limit_usec) {
        uint64_t t0 = now_usec();
        while (!gone(pid) && now_usec() - t0 < limit_usec)
                assert_return_code(sd_event_run(e, 20 * USEC_PER_MSEC), 0);
        assert_true(gone(pid));
}

static void result_done(Result *r) {
        strv_free(r->lines);
}

static void test_exit_status_and_lines(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        Result r = {};
        SpawnOptions o = { .capture = true, .on_line = on_line, .on_exit = on_exit_cb, .userdata = &r };
        char *argv[] = { (char *) "sh", (char *) "-c", (char *) "echo one; echo two >&2; printf three; exit 3", NULL };
        _cleanup_(spawn_freep) Spawn *s = NULL;

        assert_return_code(sd_event_new(&e), 0);
        assert_return_code(spawn_start(e, argv, &o, &s), 0);
        assert_true(spawn_is_running(s));
        /* Its own process group. */
        assert_int_equal(getpgid(spawn_pid(s)), spawn_pid(s));
        run_until_done(e, &r, 5 * USEC_PER_SEC);
        assert_int_equal(r.res.exit_status, 3);
        assert_int_equal(r.res.signal, 0);
        assert_false(r.res.timed_out);
        assert_false(r.res.abandoned);
        assert_false(spawn_is_running(s));
        assert_int_equal(strv_length(r.lines), 3);
        assert_string_equal(r.lines[0], "one");
        assert_string_equal(r.lines[1], "two");
        assert_string_equal(r.lines[2], "three");
        result_done(&r);
}

static void test_not_found(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        char *argv[] = { (char *) "gna-no-such-program", NULL };
        char *argv2[] = { (char *) "/nonexistent/prog", NULL };
        Spawn *s = NULL;

        assert_return_code(sd_event_new(&e), 0);
        assert_int_equal(spawn_start(e, argv, NULL, &s), -ENOENT);
        assert_int_equal(spawn_start(e, argv2, NULL, &s), -ENOENT);
        assert_null(s);
}

/* A descriptor the daemon holds without O_CLOEXEC (a library's, say) is not inherited. */
static void test_closes_inherited_fds(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        Result r = {};
        SpawnOptions o = { .capture = true, .on_line = on_line, .on_exit = on_exit_cb, .userdata = &r };
        char *argv[] = { (char *) "sh", (char *) "-c",
                         (char *) "if [ -e /proc/$$/fd/77 ]; then echo inherited; else echo closed; fi", NULL };
        _cleanup_(spawn_freep) Spawn *s = NULL;
        int fd = open("/dev/null", O_RDONLY);

        assert_true(fd >= 0);
        assert_int_equal(dup2(fd, 77), 77); /* dup2 clears FD_CLOEXEC */
        assert_return_code(sd_event_new(&e), 0);
        assert_return_code(spawn_start(e, argv, &o, &s), 0);
        run_until_done(e, &r, 5 * USEC_PER_SEC);
        close(77);
        close(fd);
        assert_int_equal(r.res.exit_status, 0);
        assert_int_equal(strv_length(r.lines), 1);
        assert_string_equal(r.lines[0], "closed");
        result_done(&r);
}

/* A program that ignores SIGTERM: SIGKILL after the grace period, and the loop never stalls. */
static void test_timeout_ignores_sigterm(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_(sd_event_source_unrefp) sd_event_source *tick = NULL;
        Result r = {};
        SpawnOptions o = {
                .capture = true, .on_line = on_line, .on_exit = on_exit_cb, .userdata = &r,
                .timeout_usec = 300 * USEC_PER_MSEC, .kill_grace_usec = 400 * USEC_PER_MSEC,
        };
        char *argv[] = { (char *) "sh", (char *) "-c",
                         (char *) "trap '' TERM; echo waiting; while :; do sleep 0.05; done", NULL };
        _cleanup_(spawn_freep) Spawn *s = NULL;
        uint64_t t0;
        pid_t pid;

        assert_return_code(sd_event_new(&e), 0);
        tick = add_ticker(e, &r);
        t0 = now_usec();
        assert_return_code(spawn_start(e, argv, &o, &s), 0);
        pid = spawn_pid(s);
        run_until_done(e, &r, 5 * USEC_PER_SEC);
        assert_true(now_usec() - t0 >= 700 * USEC_PER_MSEC);
        assert_true(now_usec() - t0 < WITHIN(3 * USEC_PER_SEC));
        assert_true(r.res.timed_out);
        assert_false(r.res.abandoned);
        assert_int_equal(r.res.signal, SIGKILL);
        assert_int_equal(r.res.exit_status, -1);
        assert_true(strv_contains(r.lines, "waiting"));
        assert_true(gone(pid));
        assert_true(r.max_gap < MAX_GAP_USEC);
        result_done(&r);
}

/* A stopped program cannot act on SIGTERM; SIGKILL still ends it. */
static void test_timeout_stopped_child(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_(sd_event_source_unrefp) sd_event_source *tick = NULL;
        Result r = {};
        SpawnOptions o = {
                .on_exit = on_exit_cb, .userdata = &r,
                .timeout_usec = 200 * USEC_PER_MSEC, .kill_grace_usec = 200 * USEC_PER_MSEC,
        };
        char *argv[] = { (char *) "sh", (char *) "-c", (char *) "kill -STOP $$; exit 0", NULL };
        _cleanup_(spawn_freep) Spawn *s = NULL;

        assert_return_code(sd_event_new(&e), 0);
        tick = add_ticker(e, &r);
        assert_return_code(spawn_start(e, argv, &o, &s), 0);
        run_until_done(e, &r, 5 * USEC_PER_SEC);
        assert_true(r.res.timed_out);
        assert_int_equal(r.res.signal, SIGKILL);
        assert_true(r.max_gap < MAX_GAP_USEC);
        result_done(&r);
}

/* A grandchild in a session of its own keeps the output pipe open after the program exited: the exit
 * is reported at once anyway, with the output written before it. */
static void test_grandchild_holds_pipe(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_(sd_event_source_unrefp) sd_event_source *tick = NULL;
        Result r = {};
        SpawnOptions o = { .capture = true, .on_line = on_line, .on_exit = on_exit_cb, .userdata = &r,
                           .timeout_usec = 10 * USEC_PER_SEC };
        char *argv[] = { (char *) "sh", (char *) "-c",
                         (char *) "setsid sleep 30 & echo grandchild $!; exit 4", NULL };
        _cleanup_(spawn_freep) Spawn *s = NULL;
        uint64_t t0;
        int gc = 0;

        assert_return_code(sd_event_new(&e), 0);
        tick = add_ticker(e, &r);
        t0 = now_usec();
        assert_return_code(spawn_start(e, argv, &o, &s), 0);
        run_until_done(e, &r, 5 * USEC_PER_SEC);
        assert_true(now_usec() - t0 < WITHIN(USEC_PER_SEC));
        assert_int_equal(r.res.exit_status, 4);
        assert_false(r.res.timed_out);
        assert_int_equal(strv_length(r.lines), 1);
        assert_int_equal(sscanf(r.lines[0], "grandchild %d", &gc), 1);
        assert_true(gc > 0);
        /* It outlived its parent. (Where setsid(1) had to fork to leave the group, $! named the
         * setsid that exited at once, and the sleep holding the pipe is its child.) */
        if (kill(gc, 0) == 0)
                (void) kill(gc, SIGKILL);
        assert_true(r.max_gap < MAX_GAP_USEC);
        result_done(&r);
}

/* A program SIGKILL does not end (stuck in the kernel, D state; emulated by sending a harmless signal in
 * SIGKILL's place): the caller hears "abandoned" after the bound, the loop never waits for it, and the
 * reaper collects it when it finally goes. */
static void test_unkillable_child_abandoned(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_(sd_event_source_unrefp) sd_event_source *tick = NULL;
        Result r = {};
        SpawnOptions o = {
                .on_exit = on_exit_cb, .userdata = &r,
                .timeout_usec = 200 * USEC_PER_MSEC, .kill_grace_usec = 200 * USEC_PER_MSEC,
                .abandon_usec = 300 * USEC_PER_MSEC, .kill_signal = SIGCONT,
        };
        char *argv[] = { (char *) "sh", (char *) "-c", (char *) "trap '' TERM; while :; do sleep 0.05; done", NULL };
        _cleanup_(spawn_freep) Spawn *s = NULL;
        uint64_t t0;
        pid_t pid;

        assert_return_code(sd_event_new(&e), 0);
        tick = add_ticker(e, &r);
        t0 = now_usec();
        assert_return_code(spawn_start(e, argv, &o, &s), 0);
        pid = spawn_pid(s);
        run_until_done(e, &r, 5 * USEC_PER_SEC);
        assert_true(now_usec() - t0 >= 700 * USEC_PER_MSEC);
        assert_true(now_usec() - t0 < WITHIN(2 * USEC_PER_SEC));
        assert_true(r.res.timed_out);
        assert_true(r.res.abandoned);
        assert_false(spawn_is_running(s));
        assert_int_equal(kill(pid, 0), 0); /* still there */

        /* The loop goes on at its beat while the process lingers. */
        for (uint64_t t1 = now_usec(); now_usec() - t1 < 300 * USEC_PER_MSEC;)
                assert_return_code(sd_event_run(e, 20 * USEC_PER_MSEC), 0);
        assert_int_equal(kill(pid, 0), 0);

        /* The kernel lets it go: reaped from the loop, no zombie left. */
        assert_int_equal(kill(-pid, SIGKILL), 0);
        run_until_gone(e, pid, 15 * USEC_PER_SEC);
        assert_true(r.max_gap < MAX_GAP_USEC);
        result_done(&r);
}

/* Cancel: no callback, SIGTERM now and SIGKILL after the grace from the loop, then reaped; never
 * blocking the caller. */
static void test_cancel_and_free(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        Result r = {};
        SpawnOptions o = { .capture = true, .on_line = on_line, .on_exit = on_exit_cb, .userdata = &r,
                           .kill_grace_usec = 300 * USEC_PER_MSEC };
        char *argv[] = { (char *) "sh", (char *) "-c",
                         (char *) "trap '' TERM; echo ready; while :; do sleep 0.05; done", NULL };
        char *argv2[] = { (char *) "sleep", (char *) "30", NULL };
        Spawn *s = NULL;
        uint64_t t0;
        pid_t pid;

        assert_return_code(sd_event_new(&e), 0);
        assert_return_code(spawn_start(e, argv, &o, &s), 0);
        pid = spawn_pid(s);
        while (!strv_contains(r.lines, "ready")) /* its trap is set */
                assert_return_code(sd_event_run(e, 50 * USEC_PER_MSEC), 0);
        t0 = now_usec();
        assert_return_code(spawn_cancel(s), 0);
        assert_true(now_usec() - t0 < test_scaled_usec(50 * USEC_PER_MSEC, 150 * USEC_PER_MSEC)); /* SIGKILL comes after 300 ms */
        assert_int_equal(spawn_cancel(s), -ESRCH);
        assert_false(spawn_is_running(s));
        s = spawn_free(s);
        run_until_gone(e, pid, 3 * USEC_PER_SEC);
        assert_true(now_usec() - t0 >= 300 * USEC_PER_MSEC); /* it ignored SIGTERM: SIGKILL ended it */
        assert_false(r.done);

        /* Freed while running, and the loop freed right after (shutdown): killed, not left behind. */
        assert_return_code(spawn_start(e, argv2, &o, &s), 0);
        pid = spawn_pid(s);
        s = spawn_free(s);
        e = sd_event_unref(e);
        for (int i = 0; i < 100 && kill(pid, 0) == 0; i++) {
                siginfo_t si = {};
                (void) waitid(P_PID, pid, &si, WEXITED | WNOHANG);
                usleep(10 * 1000);
        }
        assert_int_equal(kill(pid, 0), -1);
        assert_false(r.done);
        result_done(&r);
}

/* A forked worker: gets the passed descriptor at its own number, not over fd 3 (where the parent had
 * another file, as the loader's LD_DEBUG_OUTPUT file may be), and nothing else of ours; its crash is
 * reported. */
static int child_body(int fd, void *userdata) {
        char c = 0;

        if (fd != *(const int *) userdata)
                return 4; /* moved */
        if (fcntl(77, F_GETFD) >= 0 || fcntl(3, F_GETFD) >= 0)
                return 2; /* inherited what it should not have */
        if (write(fd, "x", 1) != 1 || read(fd, &c, 1) != 1)
                return 3;
        if (c == 'c')
                (void) raise(SIGSEGV);
        return 0;
}

static void test_fork_worker(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        Result r = {};
        SpawnOptions o = { .on_exit = on_exit_cb, .userdata = &r };
        _cleanup_(spawn_freep) Spawn *s = NULL;
        int sv[2], fd = open("/dev/null", O_RDONLY);
        char c;

        assert_true(fd >= 0);
        assert_int_equal(dup2(fd, 77), 77);
        assert_true(fcntl(3, F_GETFD) >= 0); /* fd 3 is taken here: the socket gets another number */
        assert_return_code(sd_event_new(&e), 0);
        for (int round = 0; round < 2; round++) {
                assert_return_code(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
                r.done = false;
                assert_return_code(spawn_fork(e, sv[1], child_body, &sv[1], &o, &s), 0);
                close(sv[1]);
                assert_int_equal(getpgid(spawn_pid(s)), spawn_pid(s));
                assert_int_equal(read(sv[0], &c, 1), 1);
                assert_int_equal(write(sv[0], round == 0 ? "o" : "c", 1), 1);
                run_until_done(e, &r, 5 * USEC_PER_SEC);
                if (round == 0) {
                        assert_int_equal(r.res.exit_status, 0);
                } else {
                        assert_int_equal(r.res.exit_status, -1);
                        assert_int_equal(r.res.signal, SIGSEGV);
                }
                close(sv[0]);
                s = spawn_free(s);
        }
        close(77);
        close(fd);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_exit_status_and_lines),
                cmocka_unit_test(test_not_found),
                cmocka_unit_test(test_closes_inherited_fds),
                cmocka_unit_test(test_timeout_ignores_sigterm),
                cmocka_unit_test(test_timeout_stopped_child),
                cmocka_unit_test(test_grandchild_holds_pipe),
                cmocka_unit_test(test_unkillable_child_abandoned),
                cmocka_unit_test(test_cancel_and_free),
                cmocka_unit_test(test_fork_worker),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
