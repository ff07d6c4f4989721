/* SPDX-License-Identifier: MIT */
/* Tests for modules/fabric.c against tests/fake-systemd on a private system-like dbus-daemon (the
 * integration tests' bus config with the fake's policy): unit lookup, start/stop with JobRemoved
 * results, the JobRemoved-before-reply race, timeouts, the fabric manager dying after start, long
 * watches, cancellation, and the version check. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <cmocka.h>
#include <systemd/sd-event.h>

#include "fabric.h"
#include "fileio.h"
#include "strv.h"

#define FM_FAILED "nvidia-fabricmanager failed: GPUs on an NVSwitch system are unusable until it runs; see " \
                  "journalctl -u nvidia-fabricmanager"

typedef struct Env {
        char *tmp;
        char *address;
        pid_t daemon;
        pid_t fake;
} Env;

typedef struct Result {
        unsigned calls;
        int r;
        char *message;
        bool installed;
        char *load_state, *active_state;
} Result;

static Env env;

/* Runs argv with stdout on a pipe and stderr in log; returns its pid and the first stdout line. */
static pid_t spawn_reading_line(char *const argv[], const char *address, const char *log, char *line, size_t size) {
        int out[2];
        assert_int_equal(pipe(out), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
                if (fd < 0 || dup2(out[1], 1) < 0 || dup2(fd, 2) < 0)
                        _exit(126);
                if (address)
                        setenv("DBUS_SYSTEM_BUS_ADDRESS", address, 1);
                execvp(argv[0], argv);
                _exit(127);
        }
        close(out[1]);
        FILE *f = fdopen(out[0], "r");
        assert_non_null(f);
        if (!fgets(line, (int) size, f))
                line[0] = 0;
        fclose(f);
        line[strcspn(line, "\n")] = 0;
        return pid;
}

/* The harness's substitution of the bus config template (every occurrence, as str.replace). */
static char *replace_all(const char *text, const char *from, const char *to) {
        size_t fl = strlen(from), n = 0;
        for (const char *p = strstr(text, from); p; p = strstr(p + fl, from))
                n++;
        char *out = malloc(strlen(text) + n * strlen(to) + 1), *o = out;
        assert_non_null(out);
        for (const char *p; (p = strstr(text, from)); text = p + fl) {
                memcpy(o, text, (size_t) (p - text));
                o = stpcpy(o + (p - text), to);
        }
        strcpy(o, text);
        return out;
}

static void stop_child(pid_t pid) {
        if (pid <= 0)
                return;
        kill(pid, SIGTERM);
        (void) waitpid(pid, NULL, 0);
}

static int group_setup(void **state) {
        const char *src = getenv("GNA_SOURCE_ROOT"), *build = getenv("GNA_BUILD_ROOT");
        _cleanup_free_ char *tmpl = NULL, *conf = NULL, *conf_path = NULL, *sock = NULL, *policy = NULL, *log = NULL,
                            *fake = NULL, *conf_arg = NULL;
        char line[512];

        if (!src || !build) {
                fprintf(stderr, "GNA_SOURCE_ROOT and GNA_BUILD_ROOT must be set (run through meson test)\n");
                return -1;
        }
        if (access("/usr/bin/dbus-daemon", X_OK) < 0) {
                print_message("SKIP: dbus-daemon is not installed (Debian package dbus); fabric tests need a bus\n");
                return -1;
        }
        env.tmp = strdup("/tmp/gna-test-fabric-XXXXXX");
        assert_non_null(mkdtemp(env.tmp));
        tmpl = path_join(src, "tests/integration/system-like.conf.in");
        assert_int_equal(read_full_file(tmpl, 65536, &conf, NULL), 0);
        sock = path_join(env.tmp, "system_bus_socket");
        policy = path_join(src, "tests/fake-systemd/org.freedesktop.systemd1.conf");
        _cleanup_free_ char *with_sock = replace_all(conf, "@SOCKET@", sock),
                            *filled = replace_all(with_sock, "@POLICY@", policy);
        conf_path = path_join(env.tmp, "bus.conf");
        assert_int_equal(write_file_atomic(conf_path, NULL, filled, strlen(filled), 0644), 0);
        log = path_join(env.tmp, "bus.log");

        conf_arg = strprintf("--config-file=%s", conf_path);
        env.daemon = spawn_reading_line((char *const[]) { "dbus-daemon", conf_arg, "--nofork", "--print-address=1", NULL },
                                        NULL, log, line, sizeof(line));
        if (!startswith(line, "unix:")) {
                fprintf(stderr, "dbus-daemon did not start; see %s\n", log);
                return -1;
        }
        env.address = strdup(line);

        fake = path_join(build, "tests/fake-systemd/fake-systemd");
        if (access(fake, X_OK) < 0) {
                fprintf(stderr, "%s is missing: build the tests first (ninja -C %s)\n", fake, build);
                return -1;
        }
        env.fake = spawn_reading_line((char *const[]) { fake, "--unit", "nvidia-persistenced.service=ok", "--unit",
                                                        "broken.service=fail", "--unit", "needs.service=dependency",
                                                        "--unit", "slow.service=hang", "--unit", "early.service=early",
                                                        "--unit", "nvidia-fabricmanager.service=ok", NULL },
                                      env.address, log, line, sizeof(line));
        if (!streq(line, "READY")) {
                fprintf(stderr, "fake-systemd did not start; see %s\n", log);
                return -1;
        }
        return 0;
}

static int group_teardown(void **state) {
        stop_child(env.fake);
        stop_child(env.daemon);
        if (env.tmp) {
                _cleanup_free_ char *cmd = strprintf("rm -rf '%s'", env.tmp);
                (void) !system(cmd);
        }
        free(env.tmp);
        free(env.address);
        return 0;
}

static sd_bus *connect_bus(sd_event *e) {
        sd_bus *bus = NULL;
        assert_int_equal(sd_bus_new(&bus), 0);
        assert_true(sd_bus_set_address(bus, env.address) >= 0);
        assert_true(sd_bus_set_bus_client(bus, 1) >= 0);
        assert_true(sd_bus_start(bus) >= 0);
        if (e)
                assert_true(sd_bus_attach_event(bus, e, 0) >= 0);
        return bus;
}

typedef struct Ctx {
        sd_event *event;
        sd_bus *bus;
} Ctx;

static int setup(void **state) {
        Ctx *c = calloc(1, sizeof(*c));
        assert_non_null(c);
        assert_int_equal(sd_event_new(&c->event), 0);
        c->bus = connect_bus(c->event);
        *state = c;
        return 0;
}

static int teardown(void **state) {
        Ctx *c = *state;
        sd_bus_flush_close_unref(c->bus);
        sd_event_unref(c->event);
        free(c);
        return 0;
}

static void set_behaviour(Ctx *c, const char *unit, const char *behaviour) {
        sd_bus_error e = SD_BUS_ERROR_NULL;
        int r = sd_bus_call_method(c->bus, "org.freedesktop.systemd1", "/org/gpunodeagent/FakeSystemd1",
                                   "org.gpunodeagent.FakeSystemd1", "SetBehaviour", &e, NULL, "ss", unit, behaviour);
        if (r < 0)
                fail_msg("SetBehaviour: %s", e.message);
        sd_bus_error_free(&e);
}

static char **fake_calls(Ctx *c) {
        sd_bus_message *reply = NULL;
        char **l = NULL;
        assert_true(sd_bus_call_method(c->bus, "org.freedesktop.systemd1", "/org/gpunodeagent/FakeSystemd1",
                                       "org.gpunodeagent.FakeSystemd1", "Calls", NULL, &reply, "") >= 0);
        assert_true(sd_bus_message_read_strv(reply, &l) >= 0);
        sd_bus_message_unref(reply);
        return l;
}

static void result_clear(Result *res) {
        free(res->message);
        free(res->load_state);
        free(res->active_state);
        *res = (Result) {};
}

static void on_done(FabricOp *op, int r, const char *message, void *userdata) {
        Result *res = userdata;
        res->calls++;
        res->r = r;
        free(res->message);
        res->message = message ? strdup(message) : NULL;
}

static void on_query(FabricOp *op, int r, const FabricUnitInfo *info, const char *message, void *userdata) {
        Result *res = userdata;
        on_done(op, r, message, userdata);
        if (info) {
                res->installed = info->installed;
                res->load_state = strdup(info->load_state);
                res->active_state = strdup(info->active_state);
        }
}

static uint64_t now_ms(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000;
}

/* Runs the loop until the callback ran want times; fails the test after limit_ms. */
static void run(Ctx *c, Result *res, unsigned want, unsigned limit_ms) {
        uint64_t deadline = now_ms() + limit_ms;
        while (res->calls < want) {
                if (now_ms() >= deadline)
                        fail_msg("no callback within %u ms (%u of %u calls)", limit_ms, res->calls, want);
                assert_true(sd_event_run(c->event, 50 * USEC_PER_MSEC) >= 0);
        }
}

/* Spins the loop for ms, to show that nothing (more) happens. */
static void spin(Ctx *c, unsigned ms) {
        uint64_t deadline = now_ms() + ms;
        while (now_ms() < deadline)
                assert_true(sd_event_run(c->event, 20 * USEC_PER_MSEC) >= 0);
}

static void query(Ctx *c, const char *unit, Result *res) {
        FabricOp *op = NULL;
        result_clear(res);
        assert_int_equal(fabric_unit_query(c->bus, unit, on_query, res, &op), 0);
        run(c, res, 1, 5000);
        fabric_op_free(op);
}

static void test_query(void **state) {
        Ctx *c = *state;
        Result res = {};

        set_behaviour(c, "nvidia-persistenced.service", "ok");
        query(c, "nvidia-persistenced.service", &res);
        assert_int_equal(res.r, 0);
        assert_true(res.installed);
        assert_string_equal(res.load_state, "loaded");
        assert_string_equal(res.active_state, "inactive");

        query(c, "not-there.service", &res);
        assert_int_equal(res.r, 0);
        assert_false(res.installed);
        assert_string_equal(res.load_state, "not-found");
        result_clear(&res);
}

static void test_start_and_stop(void **state) {
        Ctx *c = *state;
        Result res = {};
        FabricOp *op = NULL;

        set_behaviour(c, "nvidia-persistenced.service", "ok");
        assert_int_equal(fabric_unit_start(c->bus, "nvidia-persistenced.service", NULL, on_done, &res, &op), 0);
        assert_string_equal(fabric_op_unit(op), "nvidia-persistenced.service");
        run(c, &res, 1, 5000);
        assert_int_equal(res.r, 0);
        assert_null(res.message);
        op = fabric_op_free(op);

        _cleanup_strv_free_ char **calls = fake_calls(c);
        assert_true(strv_contains(calls, "Subscribe"));
        assert_true(strv_contains(calls, "StartUnit nvidia-persistenced.service replace"));

        query(c, "nvidia-persistenced.service", &res);
        assert_string_equal(res.active_state, "active");

        result_clear(&res);
        assert_int_equal(fabric_unit_stop(c->bus, "nvidia-persistenced.service", 0, on_done, &res, &op), 0);
        run(c, &res, 1, 5000);
        assert_int_equal(res.r, 0);
        op = fabric_op_free(op);
        query(c, "nvidia-persistenced.service", &res);
        assert_string_equal(res.active_state, "inactive");

        /* Stopping what is not installed is done: nothing to stop. */
        result_clear(&res);
        assert_int_equal(fabric_unit_stop(c->bus, "not-there.service", 0, on_done, &res, &op), 0);
        run(c, &res, 1, 5000);
        assert_int_equal(res.r, 0);
        assert_string_equal(res.message, "not-there.service is not installed; nothing to stop");
        fabric_op_free(op);
        result_clear(&res);
}

static void test_start_not_installed(void **state) {
        Ctx *c = *state;
        Result res = {};
        FabricOp *op = NULL;

        assert_int_equal(fabric_unit_start(c->bus, "not-there.service", NULL, on_done, &res, &op), 0);
        run(c, &res, 1, 5000);
        assert_int_equal(res.r, 0);
        assert_string_equal(res.message, "not-there.service is not installed; not started");
        op = fabric_op_free(op);

        result_clear(&res);
        FabricStartOptions o = { .require_installed = true };
        assert_int_equal(fabric_unit_start(c->bus, "not-there.service", &o, on_done, &res, &op), 0);
        run(c, &res, 1, 5000);
        assert_int_equal(res.r, -ENOENT);
        assert_string_equal(res.message, "not-there.service is not installed (LoadState=not-found)");
        fabric_op_free(op);
        result_clear(&res);

        /* It was looked up, never started. */
        _cleanup_strv_free_ char **calls = fake_calls(c);
        assert_true(strv_contains(calls, "LoadUnit not-there.service"));
        assert_false(strv_contains(calls, "StartUnit not-there.service replace"));
}

static void test_start_job_results(void **state) {
        Ctx *c = *state;
        Result res = {};
        FabricOp *op = NULL;

        assert_int_equal(fabric_unit_start(c->bus, "broken.service", NULL, on_done, &res, &op), 0);
        run(c, &res, 1, 5000);
        assert_int_equal(res.r, -EIO);
        assert_string_equal(res.message, "Failed to start broken.service: the start job ended with result 'failed'; "
                                         "see journalctl -u broken.service");
        op = fabric_op_free(op);

        result_clear(&res);
        assert_int_equal(fabric_unit_start(c->bus, "needs.service", NULL, on_done, &res, &op), 0);
        run(c, &res, 1, 5000);
        assert_int_equal(res.r, -ENOLINK);
        assert_non_null(strstr(res.message, "result 'dependency' (a unit it needs failed)"));
        op = fabric_op_free(op);

        /* JobRemoved arrives before StartUnit's reply: still seen. */
        result_clear(&res);
        assert_int_equal(fabric_unit_start(c->bus, "early.service", NULL, on_done, &res, &op), 0);
        run(c, &res, 1, 5000);
        assert_int_equal(res.r, 0);
        fabric_op_free(op);
        result_clear(&res);
}

static void test_start_timeout_and_cancel(void **state) {
        Ctx *c = *state;
        Result res = {};
        FabricOp *op = NULL;
        FabricStartOptions o = { .timeout_usec = 200 * USEC_PER_MSEC };

        assert_int_equal(fabric_unit_start(c->bus, "slow.service", &o, on_done, &res, &op), 0);
        run(c, &res, 1, 5000);
        assert_int_equal(res.r, -ETIMEDOUT);
        assert_string_equal(res.message, "Timed out after 0.2 s waiting for systemd to start slow.service; see "
                                         "systemctl status slow.service");
        op = fabric_op_free(op);

        /* Freed before anything came back: the callback never runs. */
        result_clear(&res);
        assert_int_equal(fabric_unit_start(c->bus, "nvidia-persistenced.service", NULL, on_done, &res, &op), 0);
        op = fabric_op_free(op);
        spin(c, 200);
        assert_int_equal(res.calls, 0);
        result_clear(&res);
}

static void test_fabric_manager(void **state) {
        Ctx *c = *state;
        Result res = {};
        FabricOp *op = NULL;
        uint64_t t0;

        /* Stays up through the watch window. */
        set_behaviour(c, FABRIC_MANAGER_UNIT, "ok");
        t0 = now_ms();
        assert_int_equal(fabric_manager_start(c->bus, 0, 300 * USEC_PER_MSEC, on_done, &res, &op), 0);
        run(c, &res, 1, 5000);
        assert_int_equal(res.r, 0);
        assert_true(now_ms() - t0 >= 300);
        op = fabric_op_free(op);

        /* Dies 100 ms after starting: reported as soon as it happens, not at the end of the window. */
        result_clear(&res);
        set_behaviour(c, FABRIC_MANAGER_UNIT, "die:100");
        t0 = now_ms();
        assert_int_equal(fabric_manager_start(c->bus, 0, 3 * USEC_PER_SEC, on_done, &res, &op), 0);
        run(c, &res, 1, 5000);
        assert_int_equal(res.r, -EIO);
        assert_true(startswith(res.message, FM_FAILED " (nvidia-fabricmanager.service stopped "));
        assert_non_null(strstr(res.message, "(ActiveState=failed, SubState=failed)"));
        assert_true(now_ms() - t0 < 2500);
        op = fabric_op_free(op);

        /* Crashes into systemd's auto-restart: also dead for us. */
        result_clear(&res);
        set_behaviour(c, FABRIC_MANAGER_UNIT, "restart:50");
        assert_int_equal(fabric_manager_start(c->bus, 0, 3 * USEC_PER_SEC, on_done, &res, &op), 0);
        run(c, &res, 1, 5000);
        assert_int_equal(res.r, -EIO);
        assert_non_null(strstr(res.message, "SubState=auto-restart"));
        op = fabric_op_free(op);

        /* Start job fails. */
        result_clear(&res);
        set_behaviour(c, FABRIC_MANAGER_UNIT, "fail");
        assert_int_equal(fabric_manager_start(c->bus, 0, 0, on_done, &res, &op), 0);
        run(c, &res, 1, 5000);
        assert_int_equal(res.r, -EIO);
        assert_string_equal(res.message, FM_FAILED " (Failed to start nvidia-fabricmanager.service: the start job "
                                         "ended with result 'failed'; see journalctl -u nvidia-fabricmanager.service)");
        op = fabric_op_free(op);

        /* Not installed on an NVSwitch system: a failure, with the package to install. */
        result_clear(&res);
        set_behaviour(c, FABRIC_MANAGER_UNIT, "missing");
        assert_int_equal(fabric_manager_start(c->bus, 0, 0, on_done, &res, &op), 0);
        run(c, &res, 1, 5000);
        assert_int_equal(res.r, -ENOENT);
        assert_true(startswith(res.message, FM_FAILED " (nvidia-fabricmanager.service is not installed"));
        assert_non_null(strstr(res.message, "install the nvidia-fabricmanager package"));
        fabric_op_free(op);
        result_clear(&res);
}

static void test_watch(void **state) {
        Ctx *c = *state;
        Result res = {}, started = {};
        FabricOp *watch = NULL, *op = NULL;

        set_behaviour(c, "watched.service", "die:500");
        assert_int_equal(fabric_unit_start(c->bus, "watched.service", NULL, on_done, &started, &op), 0);
        run(c, &started, 1, 5000);
        assert_int_equal(started.r, 0);
        op = fabric_op_free(op);

        assert_int_equal(fabric_unit_watch(c->bus, "watched.service", on_done, &res, &watch), 0);
        run(c, &res, 1, 5000);
        assert_int_equal(res.r, -EIO);
        assert_string_equal(res.message, "watched.service stopped (ActiveState=failed, SubState=failed); see "
                                         "journalctl -u watched.service");

        /* Started again (by an admin, or systemd): reported as back. */
        set_behaviour(c, "watched.service", "ok");
        result_clear(&started);
        assert_int_equal(fabric_unit_start(c->bus, "watched.service", NULL, on_done, &started, &op), 0);
        run(c, &res, 2, 5000);
        assert_int_equal(res.r, 0);
        assert_null(res.message);
        run(c, &started, 1, 5000);
        fabric_op_free(op);
        fabric_op_free(watch);
        result_clear(&res);
        result_clear(&started);
}

static void test_needs_event_loop(void **state) {
        sd_bus *bus = connect_bus(NULL);
        Result res = {};
        FabricOp *op = NULL;

        assert_int_equal(fabric_unit_start(bus, "x.service", NULL, on_done, &res, &op), -ENXIO);
        assert_null(op);
        assert_int_equal(fabric_unit_start(bus, "", NULL, on_done, &res, &op), -EINVAL);
        sd_bus_flush_close_unref(bus);
}

static void test_version_check(void **state) {
        _cleanup_free_ char *msg = NULL;

        assert_int_equal(fabric_version_check("550.127.05\n", " 550.127.05", &msg), 0);
        assert_null(msg);
        assert_int_equal(fabric_version_check("550.90.07", "550.127.05", &msg), -EPROTO);
        assert_string_equal(msg, "nvidia-fabricmanager 550.90.07 does not match the NVIDIA driver 550.127.05: fabric "
                                 "manager must be exactly the driver's version; install nvidia-fabricmanager "
                                 "550.127.05.");
        free(msg);
        msg = NULL;
        assert_int_equal(fabric_version_check("", "550.127.05", &msg), -EINVAL);
        assert_string_equal(msg, "Cannot compare nvidia-fabricmanager and driver versions: the fabric manager version "
                                 "is unknown.");
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_version_check),
                cmocka_unit_test(test_needs_event_loop),
                cmocka_unit_test_setup_teardown(test_query, setup, teardown),
                cmocka_unit_test_setup_teardown(test_start_and_stop, setup, teardown),
                cmocka_unit_test_setup_teardown(test_start_not_installed, setup, teardown),
                cmocka_unit_test_setup_teardown(test_start_job_results, setup, teardown),
                cmocka_unit_test_setup_teardown(test_start_timeout_and_cancel, setup, teardown),
                cmocka_unit_test_setup_teardown(test_fabric_manager, setup, teardown),
                cmocka_unit_test_setup_teardown(test_watch, setup, teardown),
        };
        return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
