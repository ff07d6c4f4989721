/* SPDX-License-Identifier: MIT */
/* Tests modules/dkms*.c and modules/driver-state.c: the asynchronous runner against
 * tests/fakes-dkms/dkms on a real sd_event loop (streamed lines, every exit code's sentence, timeout
 * killing the whole process group, a loop that stays responsive), --prepare-kernel, `dkms status` run
 * for real, and the last-good-load record. Parsing `dkms status` output is tested in test-dkms-status.c. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "dkms.h"
#include "driver-state.h"
#include "fileio.h"
#include "macro.h"
#include "strv.h"

#define KVER "6.1.0-57-amd64"
#define MODNAME "nvidia-current"
#define MODVER "535.261.03"

static char *fake_dkms;

/* ---- fixture: a root with headers, a DKMS tree with one registered module, a .ko source ------ */

typedef struct Root {
        char dir[64];
        char *dkms_dir;
        char *modules_dir;
        char *call_log;
        char *pidfile;
        DkmsOptions opts;
} Root;

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
        return remove(p);
}

static void writef(const char *path, const char *s) {
        _cleanup_free_ char *dir = strdup(path);

        *strrchr(dir, '/') = 0;
        assert_return_code(mkdir_p(dir, 0755), 0);
        assert_return_code(write_file_atomic(path, NULL, s, strlen(s), 0644), 0);
}

static int root_setup(void **state) {
        Root *r = calloc(1, sizeof(Root));
        _cleanup_free_ char *p = NULL, *ko = NULL;

        assert_non_null(r);
        strcpy(r->dir, "/tmp/test-dkms-XXXXXX");
        assert_non_null(mkdtemp(r->dir));
        r->dkms_dir = strprintf("%s/var/lib/dkms", r->dir);
        r->modules_dir = strprintf("%s/lib/modules", r->dir);
        r->call_log = strprintf("%s/dkms-calls.log", r->dir);
        r->pidfile = strprintf("%s/dkms.pid", r->dir);

        p = strprintf("%s/%s/build", r->modules_dir, KVER);
        assert_return_code(mkdir_p(p, 0755), 0);
        free(p);
        p = strprintf("%s/%s/%s/source/dkms.conf", r->dkms_dir, MODNAME, MODVER);
        writef(p, "PACKAGE_NAME=\"" MODNAME "\"\nPACKAGE_VERSION=\"" MODVER "\"\n");
        ko = strprintf("%s/ko/nvidia-current.ko", r->dir);
        writef(ko, "not really an ELF object\n");

        r->opts = (DkmsOptions) {
                .program = fake_dkms,
                .root = r->dir,
                .timeout_usec = 20 * USEC_PER_SEC,
        };

        /* The fake reads its instructions from the environment the child inherits. */
        unsetenv("GNA_FAKE_DKMS_RESULT");
        unsetenv("GNA_FAKE_DKMS_DURATION");
        unsetenv("GNA_FAKE_DKMS_HANG");
        unsetenv("GNA_FAKE_DKMS_ENOSPC");
        unsetenv("GNA_FAKE_DKMS_FORMAT");
        unsetenv("GNA_FAKE_DKMS_WARNING");
        unsetenv("GNA_FAKE_DKMS_LEGACY");
        setenv("GNA_FAKE_DKMS_STATE", r->dkms_dir, 1);
        setenv("GNA_FAKE_DKMS_MODULES_DIR", r->modules_dir, 1);
        setenv("GNA_FAKE_DKMS_LOG", r->call_log, 1);
        setenv("GNA_FAKE_DKMS_PIDFILE", r->pidfile, 1);
        _cleanup_free_ char *kosrc = strprintf("%s/ko", r->dir);
        setenv("GNA_FAKE_DKMS_KO_SRC", kosrc, 1);

        *state = r;
        return 0;
}

static int root_teardown(void **state) {
        Root *r = *state;

        nftw(r->dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
        free(r->dkms_dir);
        free(r->modules_dir);
        free(r->call_log);
        free(r->pidfile);
        free(r);
        return 0;
}

/* ---- running the runner to completion ---------------------------------------------------------- */

typedef struct Result {
        bool done;
        int error;
        char *message;
        char **lines;
        char **progress;
        unsigned ticks;           /* of an unrelated timer, while building */
        unsigned ticks_at_done;
} Result;

static void result_free(Result *res) {
        free(res->message);
        strv_free(res->lines);
        strv_free(res->progress);
}

static void on_line(DkmsRun *run, const char *line, void *userdata) {
        Result *res = userdata;
        assert_return_code(strv_extend(&res->lines, line), 0);
}

static void on_progress(DkmsRun *run, const char *status, void *userdata) {
        Result *res = userdata;
        assert_return_code(strv_extend(&res->progress, status), 0);
}

static void on_done(DkmsRun *run, int error, const char *message, void *userdata) {
        Result *res = userdata;

        assert_false(res->done);
        res->done = true;
        res->error = error;
        res->message = strdup(message);
        res->ticks_at_done = res->ticks;
}

static int on_tick(sd_event_source *s, uint64_t usec, void *userdata) {
        Result *res = userdata;

        res->ticks++;
        return sd_event_source_set_time(s, usec + 100 * USEC_PER_MSEC);
}

static int on_guard(sd_event_source *s, uint64_t usec, void *userdata) {
        fail_msg("the dkms run did not finish within the guard time");
        return 0;
}

/* Starts a build and runs the loop until done; returns dkms_run_start()'s result. */
static int build(Root *root, const DkmsOptions *o, Result *res, DkmsRun **ret_run) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_(sd_event_source_unrefp) sd_event_source *tick = NULL, *guard = NULL;
        DkmsRunCallbacks cb = { .line = on_line, .progress = on_progress, .done = on_done };
        _cleanup_free_ char *error = NULL;
        DkmsRun *run = NULL;
        int r;

        assert_return_code(sd_event_new(&e), 0);
        assert_return_code(sd_event_add_time_relative(e, &tick, CLOCK_MONOTONIC, 100 * USEC_PER_MSEC, 1,
                                                      on_tick, res), 0);
        assert_return_code(sd_event_source_set_enabled(tick, SD_EVENT_ON), 0);
        assert_return_code(sd_event_add_time_relative(e, &guard, CLOCK_MONOTONIC, 30 * USEC_PER_SEC, 0,
                                                      on_guard, NULL), 0);

        r = dkms_run_start(e, KVER, o, &cb, res, &run, &error);
        if (r < 0) {
                res->message = TAKE_PTR(error);
                return r;
        }
        assert_true(dkms_run_is_running(run));
        assert_true(dkms_run_pid(run) > 0);
        assert_string_equal(dkms_run_kernel(run), KVER);

        while (!res->done)
                assert_return_code(sd_event_run(e, UINT64_MAX), 0);

        assert_false(dkms_run_is_running(run));
        if (ret_run)
                *ret_run = run;
        else
                dkms_run_free(run);
        return 0;
}

static uint64_t now_usec(void) {
        struct timespec ts;

        assert_return_code(clock_gettime(CLOCK_MONOTONIC, &ts), 0);
        return (uint64_t) ts.tv_sec * USEC_PER_SEC + (uint64_t) ts.tv_nsec / 1000;
}

static bool file_exists(const char *p) {
        return access(p, F_OK) == 0;
}

static ssize_t strv_index(char **l, const char *s) {
        for (size_t i = 0; l && l[i]; i++)
                if (streq(l[i], s))
                        return (ssize_t) i;
        return -1;
}

/* ---- the runner ------------------------------------------------------------------------------- */

static void test_build_ok_streams_lines(void **state) {
        Root *root = *state;
        Result res = {};
        _cleanup_free_ char *ko = strprintf("%s/%s/updates/dkms/nvidia-current.ko", root->modules_dir, KVER);
        _cleanup_free_ char *calls = NULL;
        DkmsRun *run = NULL;
        ssize_t a, b, c, d;

        assert_return_code(build(root, &root->opts, &res, &run), 0);
        assert_int_equal(res.error, 0);
        assert_true(startswith(res.message, "Built and installed " MODNAME " " MODVER " for " KVER " in "));
        assert_int_equal(dkms_run_outcome(run), DKMS_OUTCOME_OK);
        assert_int_equal(dkms_run_exit_status(run), 0);
        dkms_run_free(run);

        a = strv_index(res.lines, "Autoinstall of module " MODNAME "/" MODVER " for kernel " KVER " (x86_64)");
        b = strv_index(res.lines, "Building module:");
        c = strv_index(res.lines, "make -j16 KERNELRELEASE=" KVER " modules...");
        d = strv_index(res.lines, "Autoinstall on " KVER " succeeded for module(s) " MODNAME ".");
        assert_true(a >= 0 && a < b && b < c && c < d);

        /* STATUS= from the start names the module the tree holds, before dkms said anything. */
        assert_non_null(res.progress);
        assert_string_equal(res.progress[0], "building " MODNAME " " MODVER " for " KVER ": 0s");

        assert_true(file_exists(ko));
        assert_return_code(read_one_line_file(root->call_log, &calls), 0);
        assert_string_equal(calls, "autoinstall -k " KVER);
        result_free(&res);
}

static void test_build_install_named_module(void **state) {
        Root *root = *state;
        Result res = {};
        _cleanup_free_ char *calls = NULL;
        DkmsOptions o = root->opts;

        o.module = MODNAME "/" MODVER;
        assert_return_code(build(root, &o, &res, NULL), 0);
        assert_int_equal(res.error, 0);
        assert_return_code(read_one_line_file(root->call_log, &calls), 0);
        assert_string_equal(calls, "install " MODNAME "/" MODVER " -k " KVER);
        result_free(&res);

        /* A module that is not in the tree: dkms exits 3, the sentence quotes its last lines. */
        o.module = "nvidia-tesla-535/535.1";
        res = (Result) {};
        assert_return_code(build(root, &o, &res, NULL), 0);
        assert_int_equal(res.error, -EPROTO);
        assert_string_equal(res.message, "dkms exited 3: last lines: Error! The module/version combo: "
                                         "nvidia-tesla-535-535.1 is not located in the DKMS tree.");
        result_free(&res);
}

static void test_build_failed_points_at_make_log(void **state) {
        Root *root = *state;
        Result res = {};
        _cleanup_free_ char *expected = NULL;
        DkmsRun *run = NULL;

        setenv("GNA_FAKE_DKMS_RESULT", "10", 1);
        assert_return_code(build(root, &root->opts, &res, &run), 0);
        assert_int_equal(res.error, -EIO);
        assert_int_equal(dkms_run_outcome(run), DKMS_OUTCOME_BUILD_FAILED);
        assert_int_equal(dkms_run_exit_status(run), 11); /* autoinstall: "one or more modules failed" */
        dkms_run_free(run);

        expected = strprintf("DKMS failed to build " MODNAME " " MODVER " for " KVER "; the compiler output "
                             "is in %s/" MODNAME "/" MODVER "/build/make.log (last error: %s/" MODNAME "/"
                             MODVER "/build/nvidia/nv.c:2841:5: error: implicit declaration of function "
                             "'acpi_bus_get_device' [-Werror=implicit-function-declaration])",
                             root->dkms_dir, root->dkms_dir);
        assert_string_equal(res.message, expected);
        result_free(&res);
}

static void test_build_disk_full(void **state) {
        Root *root = *state;
        Result res = {};
        _cleanup_free_ char *expected = NULL;

        /* The full disk shows only in make.log, as with a real compiler. */
        setenv("GNA_FAKE_DKMS_RESULT", "10", 1);
        setenv("GNA_FAKE_DKMS_ENOSPC", "1", 1);
        assert_return_code(build(root, &root->opts, &res, NULL), 0);
        assert_int_equal(res.error, -ENOSPC);
        expected = strprintf("DKMS failed to build " MODNAME " " MODVER " for " KVER ": no space left on "
                             "device; free space under /var/lib/dkms, /usr/src and /lib/modules and retry "
                             "(see %s/" MODNAME "/" MODVER "/build/make.log)",
                             root->dkms_dir);
        assert_string_equal(res.message, expected);
        result_free(&res);
}

static void test_build_exit_codes(void **state) {
        Root *root = *state;
        static const struct {
                const char *code;
                int error;
                DkmsOutcome outcome;
                const char *needle_install;   /* `dkms install` exits with the code itself */
                const char *needle_auto;      /* `dkms autoinstall` exits 11 and names the code */
        } cases[] = {
                { "11", -ENOPKG, DKMS_OUTCOME_HEADERS_MISSING,
                  "DKMS cannot build " MODNAME " " MODVER " for " KVER ": the kernel headers are missing; "
                  "install them with: apt-get install linux-headers-" KVER, NULL },
                { "7", -ENOENT, DKMS_OUTCOME_MODULE_MISSING,
                  "DKMS built " MODNAME " " MODVER " for " KVER " but the module file it names is missing "
                  "(the build produced no .ko); see ", NULL },
                { "77", -EOPNOTSUPP, DKMS_OUTCOME_EXCLUDED,
                  "Kernel " KVER " is excluded by the dkms.conf of " MODNAME " " MODVER " (BUILD_EXCLUSIVE, "
                  "e.g. a realtime kernel): the driver cannot be built for it; boot a supported kernel", NULL },
                { "42", -EPROTO, DKMS_OUTCOME_FAILED,
                  "dkms exited 42: last lines: Building module: | Cleaning build area... | make -j16 "
                  "KERNELRELEASE=" KVER " modules... | Error! Could not locate dkms.conf file. | File: ",
                  "dkms exited 11 (" MODNAME " failed with 42): last lines: Error! Could not locate dkms.conf "
                  "file. | File: " },
        };

        for (int install = 0; install <= 1; install++)
                for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                        DkmsOptions o = root->opts;
                        const char *needle = install ? cases[i].needle_install
                                                     : cases[i].needle_auto ?: cases[i].needle_install;
                        Result res = {};
                        DkmsRun *run = NULL;

                        if (install)
                                o.module = MODNAME "/" MODVER;
                        setenv("GNA_FAKE_DKMS_RESULT", cases[i].code, 1);
                        assert_return_code(build(root, &o, &res, &run), 0);
                        assert_int_equal(res.error, cases[i].error);
                        assert_int_equal(dkms_run_outcome(run), cases[i].outcome);
                        assert_int_equal(dkms_run_exit_status(run), install ? atoi(cases[i].code) : 11);
                        if (!startswith(res.message, needle))
                                fail_msg("%s, exit %s: \"%s\" does not start with \"%s\"",
                                         install ? "install" : "autoinstall", cases[i].code, res.message, needle);
                        dkms_run_free(run);
                        result_free(&res);
                }
}

static void test_autoinstall_names_failed_module(void **state) {
        Root *root = *state;
        _cleanup_free_ char *conf = strprintf("%s/nvidia-peermem/" MODVER "/source/dkms.conf", root->dkms_dir);
        _cleanup_free_ char *expected = NULL;

        /* Two modules; both fail; dkms 3.0's summary names nvidia-current first, although
         * nvidia-peermem was built last: the sentence must point at nvidia-current's make.log. */
        writef(conf, "PACKAGE_NAME=\"nvidia-peermem\"\n");
        setenv("GNA_FAKE_DKMS_RESULT", "10", 1);
        setenv("GNA_FAKE_DKMS_LEGACY", "1", 1);
        expected = strprintf("DKMS failed to build " MODNAME " " MODVER " for " KVER "; the compiler output is "
                             "in %s/" MODNAME "/" MODVER "/build/make.log (last error: ", root->dkms_dir);

        for (int legacy = 0; legacy <= 1; legacy++) {
                Result res = {};

                if (legacy)
                        setenv("GNA_FAKE_DKMS_LEGACY", "1", 1);
                else
                        unsetenv("GNA_FAKE_DKMS_LEGACY");
                assert_return_code(build(root, &root->opts, &res, NULL), 0);
                assert_int_equal(res.error, -EIO);
                if (!startswith(res.message, expected))
                        fail_msg("\"%s\" does not start with \"%s\"", res.message, expected);
                assert_string_equal(res.progress[0], "building " MODNAME " " MODVER ", nvidia-peermem " MODVER
                                                     " for " KVER ": 0s");
                result_free(&res);
        }
        unsetenv("GNA_FAKE_DKMS_LEGACY");
}

static void test_timeout_kills_process_group(void **state) {
        Root *root = *state;
        Result res = {};
        DkmsOptions o = root->opts;
        _cleanup_free_ char *pids = NULL;
        pid_t dkms_pid = 0, make_pid = 0;
        uint64_t t0, t1;
        int status = 0;

        /* The fake's "make" outlives dkms: we adopt it when dkms dies, to see how it ended. */
        assert_return_code(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);

        setenv("GNA_FAKE_DKMS_HANG", "1", 1);
        o.timeout_usec = 500 * USEC_PER_MSEC;
        o.kill_grace_usec = 300 * USEC_PER_MSEC;

        t0 = now_usec();
        assert_return_code(build(root, &o, &res, NULL), 0);
        t1 = now_usec();

        assert_int_equal(res.error, -ETIME);
        assert_string_equal(res.message, "dkms build for " KVER " timed out after 500ms; its process group "
                                         "was killed");
        /* SIGTERM was ignored: only SIGKILL after the grace period ended it. */
        assert_true(t1 - t0 >= 800 * USEC_PER_MSEC);
        assert_true(t1 - t0 < 10 * USEC_PER_SEC);

        assert_return_code(read_one_line_file(root->pidfile, &pids), 0);
        assert_int_equal(sscanf(pids, "%d %d", &dkms_pid, &make_pid), 2);
        assert_int_equal(kill(dkms_pid, 0), -1);
        assert_int_equal(errno, ESRCH);

        /* The grandchild died too, not of old age (it sleeps an hour). When its parent dkms went first
         * it was handed to us and we see SIGKILL; when it went first, dkms's zombie reaping may have
         * raced the kill and it is simply gone. Either way it must be gone within the grace period. */
        bool reaped = false;
        for (int i = 0; i < 500; i++) {
                pid_t p = waitpid(make_pid, &status, WNOHANG);
                if (p == make_pid) {
                        reaped = true;
                        break;
                }
                if (p < 0 && errno == ECHILD && kill(make_pid, 0) < 0)
                        break;
                usleep(10 * 1000);
        }
        if (reaped) {
                assert_true(WIFSIGNALED(status));
                assert_int_equal(WTERMSIG(status), SIGKILL);
        }
        assert_int_equal(kill(make_pid, 0), -1);
        assert_int_equal(errno, ESRCH);

        assert_return_code(prctl(PR_SET_CHILD_SUBREAPER, 0), 0);
        result_free(&res);
}

static void test_loop_responsive_and_progress(void **state) {
        Root *root = *state;
        Result res = {};
        DkmsOptions o = root->opts;

        setenv("GNA_FAKE_DKMS_DURATION", "1.6", 1);
        o.progress_interval_usec = 500 * USEC_PER_MSEC;
        assert_return_code(build(root, &o, &res, NULL), 0);
        assert_int_equal(res.error, 0);

        /* A 100 ms timer kept firing while dkms built. */
        assert_true(res.ticks_at_done >= 10);

        /* Progress at start, then each interval while building: 0s, 500ms, 1s, 1s (1.5 s). */
        assert_true(strv_length(res.progress) >= 3);
        assert_true(strv_length(res.progress) <= 5);
        assert_string_equal(res.progress[0], "building " MODNAME " " MODVER " for " KVER ": 0s");
        assert_string_equal(res.progress[1], "building " MODNAME " " MODVER " for " KVER ": 500ms");
        assert_string_equal(res.progress[2], "building " MODNAME " " MODVER " for " KVER ": 1s");
        result_free(&res);
}

static void test_cancel(void **state) {
        Root *root = *state;
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        DkmsRunCallbacks cb = { .line = on_line, .done = on_done };
        Result res = {};
        _cleanup_free_ char *pids = NULL;
        DkmsRun *run = NULL;
        pid_t pid, dkms_pid = 0, make_pid = 0;
        uint64_t t0, t1;

        setenv("GNA_FAKE_DKMS_DURATION", "30", 1);
        assert_return_code(sd_event_new(&e), 0);
        assert_return_code(dkms_run_start(e, KVER, &root->opts, &cb, &res, &run, NULL), 0);
        pid = dkms_run_pid(run);

        /* Let it get to its "make". */
        while (!strv_contains(res.lines, "make -j16 KERNELRELEASE=" KVER " modules..."))
                assert_return_code(sd_event_run(e, UINT64_MAX), 0);
        /* The fake writes "<dkms pid> <make pid>" once make runs; read until both are there. */
        int n = 0;
        for (int i = 0; i < 300 && n != 2; i++) {
                pids = mfree(pids);
                if (read_one_line_file(root->pidfile, &pids) >= 0)
                        n = sscanf(pids, "%d %d", &dkms_pid, &make_pid);
                if (n != 2)
                        usleep(10 * 1000);
        }
        assert_int_equal(n, 2);
        assert_int_equal(dkms_pid, pid);

        t0 = now_usec();
        assert_return_code(dkms_run_cancel(run), 0);
        t1 = now_usec();
        assert_true(t1 - t0 < 50 * USEC_PER_MSEC); /* never blocks */
        assert_false(dkms_run_is_running(run));
        assert_int_equal(dkms_run_outcome(run), DKMS_OUTCOME_CANCELLED);
        /* The loop sees it and its make go and reaps it. */
        for (t1 = now_usec(); (kill(pid, 0) == 0 || kill(make_pid, 0) == 0) && now_usec() - t1 < 3 * USEC_PER_SEC;)
                assert_return_code(sd_event_run(e, 20 * USEC_PER_MSEC), 0);
        assert_int_equal(kill(pid, 0), -1);
        assert_int_equal(kill(make_pid, 0), -1);
        assert_int_equal(dkms_run_cancel(run), -ESRCH);

        /* No callback after a cancel, even with the loop running on. */
        assert_return_code(sd_event_run(e, 100 * USEC_PER_MSEC), 0);
        assert_false(res.done);
        dkms_run_free(run);
        result_free(&res);
}

static void test_start_errors(void **state) {
        Root *root = *state;
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        DkmsOptions o = root->opts;
        DkmsRun *run = NULL;
        char *error = NULL;

        assert_return_code(sd_event_new(&e), 0);

        o.program = "/nonexistent/dkms";
        assert_int_equal(dkms_run_start(e, KVER, &o, NULL, NULL, &run, &error), -ENOENT);
        assert_string_equal(error, "Cannot run /nonexistent/dkms: not found; install the dkms package (or "
                                   "set the path of dkms)");
        error = mfree(error);
        assert_null(run);

        o = root->opts;
        assert_int_equal(dkms_run_start(e, "-rf", &o, NULL, NULL, &run, &error), -EINVAL);
        assert_string_equal(error, "Invalid kernel release \"-rf\": expected a name like 6.1.0-57-amd64");
        error = mfree(error);

        o.module = "nvidia-current";
        assert_int_equal(dkms_run_start(e, KVER, &o, NULL, NULL, &run, &error), -EINVAL);
        assert_string_equal(error, "Invalid DKMS module \"nvidia-current\": expected NAME/VERSION such as "
                                   "nvidia-current/535.261.03");
        error = mfree(error);

        /* Headers missing for this kernel: the async runner refuses too, without running dkms. */
        o = root->opts;
        assert_int_equal(dkms_run_start(e, "6.1.0-99-amd64", &o, NULL, NULL, &run, &error), -ENOPKG);
        assert_non_null(strstr(error, "apt-get install linux-headers-6.1.0-99-amd64"));
        error = mfree(error);
        assert_false(file_exists(root->call_log));
}

/* ---- synchronous helpers ---------------------------------------------------------------------- */

static int capture_stderr(const char *path) {
        int saved = dup(STDERR_FILENO);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

        assert_true(saved >= 0 && fd >= 0);
        fflush(stderr);
        assert_return_code(dup2(fd, STDERR_FILENO), 0);
        close(fd);
        return saved;
}

static void restore_stderr(int saved) {
        fflush(stderr);
        dup2(saved, STDERR_FILENO);
        close(saved);
}

static void test_prepare_kernel_missing_headers(void **state) {
        Root *root = *state;
        _cleanup_free_ char *build = strprintf("%s/6.1.0-58-amd64/build", root->modules_dir);
        char *error = NULL;

        /* No headers at all, then a dangling build link (linux-image without linux-headers). */
        assert_int_equal(dkms_prepare_kernel("6.1.0-58-amd64", &root->opts, &error), -ENOPKG);
        assert_non_null(error);
        _cleanup_free_ char *expected = strprintf(
                "Kernel headers for 6.1.0-58-amd64 are not installed (%s is missing), so the NVIDIA module "
                "cannot be built for it; install them with: apt-get install linux-headers-6.1.0-58-amd64",
                build);
        assert_string_equal(error, expected);
        error = mfree(error);

        assert_return_code(mkdir_p(build, 0755), 0);
        assert_return_code(rmdir(build), 0);
        assert_return_code(symlink("/usr/src/linux-headers-6.1.0-58-amd64-nonexistent", build), 0);
        assert_int_equal(dkms_prepare_kernel("6.1.0-58-amd64", &root->opts, &error), -ENOPKG);
        assert_string_equal(error, expected);
        free(error);

        assert_false(file_exists(root->call_log)); /* dkms never ran */
}

static void test_prepare_kernel_builds(void **state) {
        Root *root = *state;
        _cleanup_free_ char *out = strprintf("%s/stderr", root->dir), *text = NULL;
        char *error = NULL;
        int saved, r;

        saved = capture_stderr(out);
        r = dkms_prepare_kernel(KVER, &root->opts, &error);
        restore_stderr(saved);
        assert_int_equal(r, 0);
        assert_null(error);
        assert_return_code(read_full_file(out, 1 << 20, &text, NULL), 0);
        assert_non_null(strstr(text, "Autoinstall of module " MODNAME "/" MODVER " for kernel " KVER));
        assert_non_null(strstr(text, "Autoinstall on " KVER " succeeded"));
        text = mfree(text);

        /* And a failing build returns the sentence. */
        setenv("GNA_FAKE_DKMS_RESULT", "10", 1);
        saved = capture_stderr(out);
        r = dkms_prepare_kernel("6.1.0-57-amd64", &(DkmsOptions) { .program = fake_dkms, .root = root->dir,
                                                                   .module = MODNAME "/" MODVER },
                                &error);
        restore_stderr(saved);
        assert_int_equal(r, -EIO);
        assert_non_null(strstr(error, "/var/lib/dkms/" MODNAME "/" MODVER "/build/make.log"));
        free(error);
        assert_return_code(read_full_file(out, 1 << 20, &text, NULL), 0);
        assert_non_null(strstr(text, "Error! Bad return status for module build on kernel: " KVER));
}

static void test_status_sync(void **state) {
        Root *root = *state;
        DkmsModule *l = NULL;
        size_t n = 0;
        char *error = NULL;

        /* Installed for KVER after a build; "added" for a kernel it was never built for. */
        assert_return_code(dkms_prepare_kernel(KVER, &root->opts, NULL), 0);

        assert_return_code(dkms_status(KVER, &root->opts, &l, &n, &error), 0);
        assert_int_equal(n, 1);
        assert_string_equal(l[0].name, MODNAME);
        assert_string_equal(l[0].kernel, KVER);
        assert_int_equal(l[0].state, DKMS_MODULE_INSTALLED);
        dkms_module_list_free(l, n);

        setenv("GNA_FAKE_DKMS_FORMAT", "2", 1);
        assert_return_code(dkms_status("6.1.0-58-amd64", &root->opts, &l, &n, &error), 0);
        assert_int_equal(n, 1);
        assert_int_equal(l[0].state, DKMS_MODULE_ADDED);
        assert_null(l[0].kernel);
        dkms_module_list_free(l, n);

        DkmsOptions o = root->opts;
        o.program = "/nonexistent/dkms";
        assert_int_equal(dkms_status(NULL, &o, &l, &n, &error), -ENOENT);
        assert_non_null(strstr(error, "install the dkms package"));
        free(error);
}

/* ---- driver.state ----------------------------------------------------------------------------- */

static void test_driver_state(void **state) {
        Root *root = *state;
        _cleanup_free_ char *d1 = NULL, *d2 = NULL, *d3 = NULL, *d4 = NULL, *dir = NULL, *text = NULL;
        _cleanup_free_ char *path = NULL, *reason = NULL;
        DriverState *s = NULL, *loaded = NULL, *now = NULL;
        char *a[] = { (char *) "nvidia NVreg_OpenRmEnableUnsupportedGpus=1  NVreg_EnableGpuFirmware=0",
                      (char *) "nvidia-uvm uvm_perf_prefetch_enable=0", NULL };
        char *b[] = { (char *) "  nvidia-uvm   uvm_perf_prefetch_enable=0 ",
                      (char *) "nvidia NVreg_OpenRmEnableUnsupportedGpus=1 NVreg_EnableGpuFirmware=0", NULL };
        char *c[] = { (char *) "nvidia NVreg_EnableGpuFirmware=0 NVreg_OpenRmEnableUnsupportedGpus=1",
                      (char *) "nvidia-uvm uvm_perf_prefetch_enable=0", NULL };

        /* Module order and blanks do not matter; option order does; the value is pinned. */
        assert_return_code(driver_options_digest(a, &d1), 0);
        assert_return_code(driver_options_digest(b, &d2), 0);
        assert_return_code(driver_options_digest(c, &d3), 0);
        assert_return_code(driver_options_digest(NULL, &d4), 0);
        assert_string_equal(d1, d2);
        assert_string_not_equal(d1, d3);
        assert_string_equal(d4, "fnv1a64:cbf29ce484222325");
        assert_int_equal(strlen(d1), strlen("fnv1a64:") + 16);

        dir = strprintf("%s/var/lib/gpu-node-agent", root->dir);
        assert_int_equal(driver_state_load(dir, &loaded), -ENOENT);
        assert_int_equal(driver_state_new("6.1.0-57-amd64", "", d1, &s), -EINVAL);
        assert_int_equal(driver_state_new("6.1.0-57-amd64\nX=1", "535.261.03", d1, &s), -EINVAL);

        assert_return_code(driver_state_new(KVER, MODVER, d1, &s), 0);
        assert_return_code(driver_state_save(dir, s), 0);
        path = strprintf("%s/driver.state", dir);
        assert_return_code(read_full_file(path, 4096, &text, NULL), 0);
        _cleanup_free_ char *expected = strprintf(
                "# gpu-node-agent: the last good driver load. Remove this file to force a full\n"
                "# check (and a DKMS rebuild if needed) at the next start.\n"
                "KERNEL=" KVER "\nDRIVER_VERSION=" MODVER "\nOPTIONS_DIGEST=%s\n", d1);
        assert_string_equal(text, expected);

        assert_return_code(driver_state_load(dir, &loaded), 0);
        assert_string_equal(loaded->kernel, KVER);
        assert_string_equal(loaded->driver_version, MODVER);
        assert_string_equal(loaded->options_digest, d1);
        assert_int_equal(driver_state_compare(loaded, s, &reason), 1);
        assert_null(reason);

        assert_return_code(driver_state_new("6.1.0-58-amd64", MODVER, d1, &now), 0);
        assert_int_equal(driver_state_compare(loaded, now, &reason), 0);
        assert_string_equal(reason, "kernel changed from " KVER " to 6.1.0-58-amd64");
        reason = mfree(reason);
        now = driver_state_free(now);

        assert_return_code(driver_state_new(KVER, "550.127.08", d1, &now), 0);
        assert_int_equal(driver_state_compare(loaded, now, &reason), 0);
        assert_string_equal(reason, "driver version changed from " MODVER " to 550.127.08");
        reason = mfree(reason);
        now = driver_state_free(now);

        assert_return_code(driver_state_new(KVER, MODVER, d3, &now), 0);
        assert_int_equal(driver_state_compare(loaded, now, &reason), 0);
        assert_string_equal(reason, "module options changed");
        reason = mfree(reason);
        assert_int_equal(driver_state_compare(NULL, now, &reason), 0);
        assert_string_equal(reason, "no record of a previous load");
        reason = mfree(reason);
        now = driver_state_free(now);
        loaded = driver_state_free(loaded);

        /* Malformed or incomplete records are "no record", not a crash or a false match. */
        writef(path, "KERNEL=" KVER "\nDRIVER_VERSION=" MODVER "\n");
        assert_int_equal(driver_state_load(dir, &loaded), -EBADMSG);
        writef(path, "garbage\n");
        assert_int_equal(driver_state_load(dir, &loaded), -EBADMSG);
        /* Unknown keys from a newer agent are fine. */
        text = mfree(text);
        text = strprintf("KERNEL=%s\nFUTURE=1\nDRIVER_VERSION=%s\nOPTIONS_DIGEST=%s\n", KVER, MODVER, d1);
        writef(path, text);
        assert_return_code(driver_state_load(dir, &loaded), 0);
        assert_int_equal(driver_state_compare(loaded, s, NULL), 1);
        loaded = driver_state_free(loaded);

        assert_return_code(driver_state_remove(dir), 0);
        assert_false(file_exists(path));
        assert_return_code(driver_state_remove(dir), 0);
        driver_state_free(s);
}

int main(void) {
        const char *src = getenv("GNA_SOURCE_ROOT");
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_build_ok_streams_lines, root_setup, root_teardown),
                cmocka_unit_test_setup_teardown(test_build_install_named_module, root_setup, root_teardown),
                cmocka_unit_test_setup_teardown(test_build_failed_points_at_make_log, root_setup, root_teardown),
                cmocka_unit_test_setup_teardown(test_build_disk_full, root_setup, root_teardown),
                cmocka_unit_test_setup_teardown(test_build_exit_codes, root_setup, root_teardown),
                cmocka_unit_test_setup_teardown(test_autoinstall_names_failed_module, root_setup, root_teardown),
                cmocka_unit_test_setup_teardown(test_timeout_kills_process_group, root_setup, root_teardown),
                cmocka_unit_test_setup_teardown(test_loop_responsive_and_progress, root_setup, root_teardown),
                cmocka_unit_test_setup_teardown(test_cancel, root_setup, root_teardown),
                cmocka_unit_test_setup_teardown(test_start_errors, root_setup, root_teardown),
                cmocka_unit_test_setup_teardown(test_prepare_kernel_missing_headers, root_setup, root_teardown),
                cmocka_unit_test_setup_teardown(test_prepare_kernel_builds, root_setup, root_teardown),
                cmocka_unit_test_setup_teardown(test_status_sync, root_setup, root_teardown),
                cmocka_unit_test_setup_teardown(test_driver_state, root_setup, root_teardown),
        };
        int r;

        fake_dkms = strprintf("%s/tests/fakes-dkms/dkms", src ?: ".");
        if (access(fake_dkms, X_OK) < 0) {
                fprintf(stderr, "test-dkms: %s is not executable; set GNA_SOURCE_ROOT\n", fake_dkms);
                return 1;
        }
        r = cmocka_run_group_tests(tests, NULL, NULL);
        free(fake_dkms);
        return r;
}
