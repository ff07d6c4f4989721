/* SPDX-License-Identifier: MIT */
/* Tests for agent/nvml/gpu-nvml-worker.c and gpu-nvml-wire.c: a snapshot survives the wire unchanged;
 * every truncation of a frame is rejected, never read past; and the worker, run against the fake NVML,
 * answers a snapshot, names the call that hangs past the deadline, reports a crash with its signal and
 * call, and serves the next request from a fresh process — while the loop keeps its beat. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "fileio.h"
#include "gpu-nvml-worker.h"
#include "strv.h"
#include "test-load.h"

/* The loop's beat: a 10 ms ticker sees no gap over 100 ms, stretched on a busy machine up to 600 ms —
 * half the 1.2 s nvmlInit delay a blocked loop would show. */
#define MAX_GAP_USEC test_scaled_usec(100 * USEC_PER_MSEC, 600 * USEC_PER_MSEC)

static const char fake_node[] =
        "gpus:\n"
        "  - pci: \"0000:3b:00.0\"\n"
        "    model: \"NVIDIA A100-SXM4-40GB\"\n"
        "    mig: enabled\n"
        "    instances:\n"
        "      - profile: 3g.20gb\n"
        "  - pci: \"0000:5e:00.0\"\n"
        "    model: \"NVIDIA H100 80GB HBM3\"\n";

static char *const addresses[] = { "0000:3b:00.0", "0000:5e:00.0", NULL };

static const char *const fake_env[] = { "FAKE_NVML_DESCRIPTION", "FAKE_NVML_STATE", "FAKE_NVML_HANG",
                                        "FAKE_NVML_HANG_FILE", "FAKE_NVML_CRASH", "FAKE_NVML_CRASH_FILE", NULL };

typedef struct Fix {
        char *lib, *dir, *description, *flag;
} Fix;

typedef struct Answer {
        bool done;
        int r;
        NvmlSnapshot *snap;
        char *error;
        char **progress;
        uint64_t last_beat, max_gap;
} Answer;

static uint64_t now_usec(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * USEC_PER_SEC + ts.tv_nsec / 1000;
}

static int setup(void **state) {
        const char *lib = getenv("GNA_FAKE_NVML"), *build = getenv("GNA_BUILD_ROOT");
        _cleanup_free_ char *path = lib ? strdup(lib) : build ? strprintf("%s/tests/fakes/libnvidia-ml.so.1", build) : NULL;
        Fix *f;

        if (!path || access(path, F_OK) < 0) {
                *state = NULL;
                return 0;
        }
        f = calloc(1, sizeof *f);
        assert_non_null(f);
        f->lib = TAKE_PTR(path);
        f->dir = strdup("/tmp/gna-test-nvml-worker-XXXXXX");
        assert_non_null(mkdtemp(f->dir));
        f->description = path_join(f->dir, "nvml.yaml");
        f->flag = path_join(f->dir, "flag");
        assert_int_equal(write_file_atomic(f->description, NULL, fake_node, strlen(fake_node), 0644), 0);
        for (const char *const *e = fake_env; *e; e++)
                unsetenv(*e);
        setenv("FAKE_NVML_DESCRIPTION", f->description, 1);
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fix *f = *state;
        _cleanup_free_ char *cmd = NULL;

        if (!f)
                return 0;
        cmd = strprintf("rm -rf '%s'", f->dir);
        (void) !system(cmd);
        free(f->lib);
        free(f->dir);
        free(f->description);
        free(f->flag);
        free(f);
        for (const char *const *e = fake_env; *e; e++)
                unsetenv(*e);
        return 0;
}

static Fix *fix_or_skip(void **state) {
        if (!*state) {
                print_message("fake libnvidia-ml.so.1 not built (tests/fakes); skipping\n");
                skip();
        }
        return *state;
}

static void on_done(GpuNvmlWorker *w, int r, NvmlSnapshot *snap, const char *error, void *userdata) {
        Answer *a = userdata;

        assert_false(a->done);
        a->done = true;
        a->r = r;
        a->snap = snap;
        a->error = error ? strdup(error) : NULL;
}

static void on_progress(GpuNvmlWorker *w, const char *text, void *userdata) {
        Answer *a = userdata;
        assert_return_code(strv_extend(&a->progress, text), 0);
}

static int on_beat(sd_event_source *s, uint64_t usec, void *userdata) {
        Answer *a = userdata;
        uint64_t n = now_usec();

        if (a->last_beat && n - a->last_beat > a->max_gap)
                a->max_gap = n - a->last_beat;
        a->last_beat = n;
        (void) sd_event_source_set_time(s, usec + 10 * USEC_PER_MSEC);
        return sd_event_source_set_enabled(s, SD_EVENT_ONESHOT);
}

static void answer_clear(Answer *a) {
        gpu_nvml_snapshot_free(a->snap);
        free(a->error);
        strv_free(a->progress);
        *a = (Answer) {};
}

/* Asks for a snapshot and runs the loop until the answer, with a 10 ms beat on the loop. */
static void ask(sd_event *e, GpuNvmlWorker *w, const char *lib, uint64_t timeout, Answer *a) {
        _cleanup_(sd_event_source_unrefp) sd_event_source *beat = NULL;
        uint64_t t0 = now_usec();

        answer_clear(a);
        assert_return_code(sd_event_add_time_relative(e, &beat, CLOCK_MONOTONIC, 10 * USEC_PER_MSEC, 0, on_beat, a), 0);
        gpu_nvml_worker_set_progress(w, on_progress, a);
        assert_return_code(gpu_nvml_worker_snapshot(w, lib, addresses, timeout, 2, on_done, a), 0);
        assert_true(gpu_nvml_worker_busy(w));
        assert_int_equal(gpu_nvml_worker_snapshot(w, lib, addresses, timeout, 2, on_done, a), -EBUSY);
        while (!a->done && now_usec() - t0 < 20 * USEC_PER_SEC)
                assert_return_code(sd_event_run(e, 50 * USEC_PER_MSEC), 0);
        assert_true(a->done);
        assert_false(gpu_nvml_worker_busy(w));
}

static void test_wire_round_trip(void **state) {
        char *nvlinks[] = { (char *) "0000:5e:00.0", (char *) "0000:05:00.0", NULL };
        MigDeviceInfo mig[] = { { .index = 0, .gi_id = 1, .ci_id = 0, .gi_profile_id = 9, .placement_start = 4,
                                  .placement_size = 4, .uuid = (char *) "MIG-aaaa", .profile = (char *) "3g.20gb",
                                  .memory_mib = 19968, .multiprocessors = 42, .gi_slices = 3, .ci_slices = 3,
                                  .copy_engines = 3, .decoders = 2, .jpegs = 0, .ofas = 0 } };
        GpuInfo gpus[] = {
                { .pci_address = "0000:3b:00.0", .nvml_index = 0, .name = (char *) "NVIDIA A100-SXM4-40GB",
                  .uuid = (char *) "GPU-1", .memory_total_bytes = 42949672960ull, .cc_major = 8, .cc_minor = 0,
                  .minor = 0, .mig_current = GPU_MIG_ENABLED, .mig_pending = GPU_MIG_ENABLED, .mig_devices = mig,
                  .n_mig_devices = 1, .clique = (char *) "a1b2.7", .nvlink_known = true, .nvlink_remotes = nvlinks },
                { .pci_address = "0000:5e:00.0", .nvml_index = 1, .name = NULL, .uuid = NULL, .cc_major = -1,
                  .cc_minor = -1, .minor = -1, .mig_current = GPU_MIG_UNSUPPORTED, .mig_pending = GPU_MIG_UNSUPPORTED },
        };
        char *warnings[] = { (char *) "GPU 0000:5e:00.0: nvmlDeviceGetName failed", NULL };
        NvmlSnapshot s = { .driver_version = (char *) "550.54.15", .cuda_version = 12040, .nvml_version = NULL,
                           .gpus = gpus, .n_gpus = 2, .warnings = warnings };
        _cleanup_(wire_buf_done) WireBuf b = {};
        NvmlSnapshot *back = NULL;
        WireReader rd;

        wire_begin(&b, GPU_NVML_WIRE_SNAPSHOT);
        wire_put_snapshot(&b, &s);
        assert_return_code(wire_end(&b), 0);
        rd = (WireReader) { .p = b.data + 8, .left = b.len - 8 };
        assert_return_code(wire_get_snapshot(&rd, &back), 0);
        assert_true(gpu_nvml_snapshot_equal(&s, back));
        assert_null(back->nvml_version);
        assert_null(back->gpus[1].name);
        assert_null(back->gpus[1].uuid);
        assert_string_equal(back->gpus[0].mig_devices[0].profile, "3g.20gb");
        assert_string_equal(back->warnings[0], warnings[0]);
        assert_true(back->gpus[0].nvlink_known);
        assert_int_equal(strv_length(back->gpus[0].nvlink_remotes), 2);
        assert_string_equal(back->gpus[0].nvlink_remotes[1], "0000:05:00.0");
        assert_false(back->gpus[1].nvlink_known);
        assert_null(back->gpus[1].nvlink_remotes);
        gpu_nvml_snapshot_free(back);

        /* Every truncation is refused, and nothing is read past the end (ASan watches). */
        for (size_t len = 0; len < b.len - 8; len++) {
                uint8_t *copy = malloc(len ?: 1);
                assert_non_null(copy);
                memcpy(copy, b.data + 8, len);
                rd = (WireReader) { .p = copy, .left = len };
                back = NULL;
                assert_true(wire_get_snapshot(&rd, &back) < 0);
                assert_null(back);
                free(copy);
        }
}

/* A crashed or subverted worker's snapshot: every string NVML could not have answered, or that the reader
 * would have refused, fails the whole frame; a name keeps its bytes (the outputs escape them). */
static int hostile_round_trip(NvmlSnapshot *s) {
        _cleanup_(wire_buf_done) WireBuf b = {};
        NvmlSnapshot *back = NULL;
        WireReader rd;
        int r;

        wire_begin(&b, GPU_NVML_WIRE_SNAPSHOT);
        wire_put_snapshot(&b, s);
        assert_return_code(wire_end(&b), 0);
        rd = (WireReader) { .p = b.data + 8, .left = b.len - 8 };
        r = wire_get_snapshot(&rd, &back);
        gpu_nvml_snapshot_free(back);
        return r;
}

static void test_wire_refuses_hostile_strings(void **state) {
        char long_name[301], max_name[GPU_NVML_STRING_MAX + 1];
        char *bad_link[] = { (char *) "../../../etc", NULL }, *bad_warning[] = { (char *) "GPU x\n<0>forged", NULL };
        MigDeviceInfo mig = { .uuid = (char *) "MIG-0123abcd", .profile = (char *) "1g.10gb" };
        GpuInfo g = { .pci_address = "0000:3b:00.0", .name = (char *) "NVIDIA \"H100\"\n#x=y\\", .uuid =
                              (char *) "GPU-0123abcd-ef01", .cc_major = -1, .cc_minor = -1, .minor = 0,
                      .mig_current = GPU_MIG_ENABLED, .mig_pending = GPU_MIG_ENABLED, .mig_devices = &mig,
                      .n_mig_devices = 1 };
        NvmlSnapshot s = { .driver_version = (char *) "550.54.15", .gpus = &g, .n_gpus = 1 };
        (void) state;

        memset(long_name, 'A', sizeof long_name - 1);
        long_name[sizeof long_name - 1] = '\0';
        memset(max_name, 'A', sizeof max_name - 1);
        max_name[sizeof max_name - 1] = '\0';

        assert_return_code(hostile_round_trip(&s), 0);
        g.name = max_name;
        assert_return_code(hostile_round_trip(&s), 0);
        g.name = long_name;
        assert_int_equal(hostile_round_trip(&s), -EBADMSG);
        g.name = (char *) "";
        assert_int_equal(hostile_round_trip(&s), -EBADMSG);
        g.name = (char *) "NVIDIA H100";

        const char *bad_uuids[] = { "GPU-", "GPU-0123\n#x", "GPU-01\"23", "gpu-0123", "MIG-0123", "GPU-01=2" };
        for (size_t i = 0; i < ELEMENTSOF(bad_uuids); i++) {
                g.uuid = (char *) bad_uuids[i];
                assert_int_equal(hostile_round_trip(&s), -EBADMSG);
        }
        g.uuid = long_name;
        assert_int_equal(hostile_round_trip(&s), -EBADMSG);
        g.uuid = NULL;

        mig.uuid = (char *) "MIG-GPU-0123abcd/1/0"; /* pre-R470: the '/' is no CDI name's */
        assert_int_equal(hostile_round_trip(&s), -EBADMSG);
        mig.uuid = NULL;
        mig.profile = (char *) "1g.10gb\n#";
        assert_int_equal(hostile_round_trip(&s), -EBADMSG);
        mig.profile = NULL;

        s.driver_version = (char *) "550.54.15\ncuda=13";
        assert_int_equal(hostile_round_trip(&s), -EBADMSG);
        s.driver_version = NULL;
        s.nvml_version = (char *) "12.550 #";
        assert_int_equal(hostile_round_trip(&s), -EBADMSG);
        s.nvml_version = NULL;
        s.warnings = bad_warning;
        assert_int_equal(hostile_round_trip(&s), -EBADMSG);
        s.warnings = NULL;
        g.nvlink_remotes = bad_link;
        assert_int_equal(hostile_round_trip(&s), -EBADMSG);
        g.nvlink_remotes = NULL;
        g.clique = (char *) "a1b2.7\n";
        assert_int_equal(hostile_round_trip(&s), -EBADMSG);
        g.clique = NULL;
        snprintf(g.pci_address, sizeof g.pci_address, "0000:3B:00.0/..");
        assert_int_equal(hostile_round_trip(&s), -EBADMSG);
        snprintf(g.pci_address, sizeof g.pci_address, "0000:3b:00.0");
        assert_return_code(hostile_round_trip(&s), 0);
}

static void test_worker_snapshot_and_progress(void **state) {
        Fix *f = fix_or_skip(state);
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_(gpu_nvml_worker_freep) GpuNvmlWorker *w = NULL;
        Answer a = {};
        pid_t pid;

        assert_return_code(sd_event_new(&e), 0);
        assert_return_code(gpu_nvml_worker_new(e, &w), 0);
        ask(e, w, f->lib, 0, &a);
        assert_int_equal(a.r, 0);
        assert_non_null(a.snap);
        assert_int_equal(a.snap->n_gpus, 2);
        assert_string_equal(a.snap->gpus[0].pci_address, "0000:3b:00.0");
        assert_int_equal(a.snap->gpus[0].mig_current, GPU_MIG_ENABLED);
        assert_int_equal(a.snap->gpus[0].n_mig_devices, 1);
        assert_string_equal(a.snap->gpus[1].name, "NVIDIA H100 80GB HBM3");
        assert_true(a.max_gap < MAX_GAP_USEC);
        pid = gpu_nvml_worker_pid(w);
        assert_true(pid > 0);

        /* The same worker serves the next request (its caches stay). */
        ask(e, w, f->lib, 0, &a);
        assert_int_equal(a.r, 0);
        assert_int_equal(gpu_nvml_worker_pid(w), pid);

        /* A slow init: the progress says which call and for how long, once a second. */
        w = gpu_nvml_worker_free(w);
        setenv("FAKE_NVML_DELAY", "nvmlInit_v2:*:1200", 1);
        assert_return_code(gpu_nvml_worker_new(e, &w), 0);
        ask(e, w, f->lib, 5 * USEC_PER_SEC, &a);
        unsetenv("FAKE_NVML_DELAY");
        assert_int_equal(a.r, 0);
        assert_int_equal(strv_length(a.progress), 1); /* once a second: 1.2 s */
        assert_true(startswith(a.progress[0], "nvmlInit_v2 for "));
        assert_true(a.max_gap < MAX_GAP_USEC);
        answer_clear(&a);
}

static void test_worker_hang_named_and_killed(void **state) {
        Fix *f = fix_or_skip(state);
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_(gpu_nvml_worker_freep) GpuNvmlWorker *w = NULL;
        Answer a = {};
        uint64_t t0;
        pid_t pid;

        assert_int_equal(write_file_atomic(f->flag, NULL, "", 0, 0644), 0);
        setenv("FAKE_NVML_HANG", "nvmlDeviceGetMemoryInfo:2", 1);
        setenv("FAKE_NVML_HANG_FILE", f->flag, 1);
        assert_return_code(sd_event_new(&e), 0);
        assert_return_code(gpu_nvml_worker_new(e, &w), 0);
        t0 = now_usec();
        ask(e, w, f->lib, 400 * USEC_PER_MSEC, &a);
        assert_true(now_usec() - t0 < 3 * USEC_PER_SEC);
        assert_int_equal(a.r, -ETIMEDOUT);
        assert_null(a.snap);
        assert_non_null(a.error);
        assert_true(startswith(a.error, "nvmlDeviceGetMemoryInfo on GPU 1 has not returned for 400 ms"));
        assert_true(a.max_gap < MAX_GAP_USEC);
        assert_int_equal(gpu_nvml_worker_pid(w), 0);

        /* Released: the next request starts a fresh worker and succeeds. */
        assert_int_equal(unlink(f->flag), 0);
        ask(e, w, f->lib, 400 * USEC_PER_MSEC, &a);
        assert_int_equal(a.r, 0);
        pid = gpu_nvml_worker_pid(w);
        assert_true(pid > 0);
        answer_clear(&a);
}

static void test_worker_crash_reported(void **state) {
        Fix *f = fix_or_skip(state);
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_(gpu_nvml_worker_freep) GpuNvmlWorker *w = NULL;
        Answer a = {};

        assert_int_equal(write_file_atomic(f->flag, NULL, "", 0, 0644), 0);
        setenv("FAKE_NVML_CRASH", "nvmlDeviceGetMigMode:1", 1);
        setenv("FAKE_NVML_CRASH_FILE", f->flag, 1);
        assert_return_code(sd_event_new(&e), 0);
        assert_return_code(gpu_nvml_worker_new(e, &w), 0);
        ask(e, w, f->lib, 0, &a);
        assert_int_equal(a.r, -EIO);
        assert_non_null(a.error);
        assert_string_equal(a.error, "The NVML worker crashed with signal SEGV in nvmlDeviceGetMigMode on GPU 0; it is "
                                     "started again on the next attempt.");

        assert_int_equal(unlink(f->flag), 0);
        ask(e, w, f->lib, 0, &a);
        assert_int_equal(a.r, 0);
        assert_int_equal(a.snap->n_gpus, 2);

        /* A library that is not there: an error sentence from the worker, not a crash. */
        ask(e, w, "/nonexistent/gna/libnvidia-ml.so.1", 0, &a);
        assert_int_equal(a.r, -ENOENT);
        assert_non_null(strstr(a.error, "Cannot load NVML"));
        answer_clear(&a);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_wire_round_trip),
                cmocka_unit_test(test_wire_refuses_hostile_strings),
                cmocka_unit_test_setup_teardown(test_worker_snapshot_and_progress, setup, teardown),
                cmocka_unit_test_setup_teardown(test_worker_hang_named_and_killed, setup, teardown),
                cmocka_unit_test_setup_teardown(test_worker_crash_reported, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
