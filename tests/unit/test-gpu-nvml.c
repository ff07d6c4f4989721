/* SPDX-License-Identifier: MIT */
/* Tests for agent/nvml/: the MIG profile naming formula on every model of the project's profile table,
 * the NVML return code → errno table, loading failures and their messages, the snapshot helpers, and —
 * against the fake libnvidia-ml.so.1 of tests/fakes/ — reading a node: GPUs in our order, MIG devices
 * with their names, fabric cliques, static facts not read twice (exact call counts, checked against the
 * fake's own call trace), and injected faults. The fake-backed tests skip only when the fake library has
 * not been built. */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/stat.h>
#include <cmocka.h>

#include "fileio.h"
#include "gpu-nvml-internal.h"
#include "strv.h"

/* ---- Profile names ---------------------------------------------------------------------------------- */

/* Every model and profile of mig-profiles.yaml (memory per k/8 of the GPU, total in MiB), with the name
 * the real driver and mig-parted use for it. */
static const struct {
        const char *model;
        uint64_t total_mib;
        unsigned gi, ci;
        uint64_t mem_mib;
        const char *suffix;
        const char *name;
} names[] = {
        { "A100-40GB", 40960, 7, 7, 40192, "", "7g.40gb" },
        { "A100-40GB", 40960, 4, 4, 19968, "", "4g.20gb" },
        { "A100-40GB", 40960, 3, 3, 19968, "", "3g.20gb" },
        { "A100-40GB", 40960, 2, 2, 9856, "", "2g.10gb" },
        { "A100-40GB", 40960, 1, 1, 9856, "", "1g.10gb" },
        { "A100-40GB", 40960, 1, 1, 4864, "", "1g.5gb" },
        { "A100-40GB", 40960, 1, 1, 4864, "+me", "1g.5gb+me" },
        { "A100-80GB", 81920, 7, 7, 80384, "", "7g.80gb" },
        { "A100-80GB", 81920, 4, 4, 40192, "", "4g.40gb" },
        { "A100-80GB", 81920, 3, 3, 40192, "", "3g.40gb" },
        { "A100-80GB", 81920, 2, 2, 19968, "", "2g.20gb" },
        { "A100-80GB", 81920, 1, 1, 19968, "", "1g.20gb" },
        { "A100-80GB", 81920, 1, 1, 9856, "", "1g.10gb" },
        { "A100-80GB", 81920, 1, 1, 9856, "+me", "1g.10gb+me" },
        { "H100", 81559, 7, 7, 81152, "", "7g.80gb" },
        { "H100", 81559, 4, 4, 40448, "", "4g.40gb" },
        { "H100", 81559, 3, 3, 40448, "", "3g.40gb" },
        { "H100", 81559, 2, 2, 20096, "", "2g.20gb" },
        { "H100", 81559, 1, 1, 20096, "", "1g.20gb" },
        { "H100", 81559, 1, 1, 9984, "", "1g.10gb" },
        { "H100", 81559, 1, 1, 9984, "+me", "1g.10gb+me" },
        { "H200", 143771, 7, 7, 143360, "", "7g.141gb" },
        { "H200", 143771, 4, 4, 71424, "", "4g.71gb" },
        { "H200", 143771, 3, 3, 71424, "", "3g.71gb" }, /* 70.5: round() → 71, rint() would say 70 */
        { "H200", 143771, 2, 2, 35584, "", "2g.35gb" },
        { "H200", 143771, 1, 1, 35584, "", "1g.35gb" },
        { "H200", 143771, 1, 1, 17664, "", "1g.18gb" },
        { "H200", 143771, 1, 1, 17664, "+me", "1g.18gb+me" },
        { "B200", 183359, 7, 7, 182784, "", "7g.180gb" },
        { "B200", 183359, 4, 4, 91392, "", "4g.90gb" },
        { "B200", 183359, 3, 3, 91392, "", "3g.90gb" },
        { "B200", 183359, 2, 2, 45568, "", "2g.45gb" },
        { "B200", 183359, 1, 1, 45568, "", "1g.45gb" },
        { "B200", 183359, 1, 1, 22784, "", "1g.23gb" },   /* 22.5 → 23 */
        { "B200", 183359, 1, 1, 22784, "+me", "1g.23gb+me" },
        { "A30", 24576, 4, 4, 23344, "", "4g.24gb" },
        { "A30", 24576, 2, 2, 11672, "", "2g.12gb" },
        { "A30", 24576, 2, 2, 11672, "+me", "2g.12gb+me" },
        { "A30", 24576, 1, 1, 5836, "", "1g.6gb" },
        { "A30", 24576, 1, 1, 5836, "+me", "1g.6gb+me" },
        /* Compute instances smaller than their GPU instance. */
        { "H100", 81559, 7, 1, 81152, "", "1c.7g.80gb" },
        { "A100-40GB", 40960, 3, 1, 19968, "", "1c.3g.20gb" },
        { "H200", 143771, 3, 2, 71424, "", "2c.3g.71gb" },
        { "A30", 24576, 2, 1, 11672, "+me", "1c.2g.12gb+me" },
        /* The other attribute suffixes pass through as given. */
        { "B200", 183359, 1, 1, 22784, "+me.all", "1g.23gb+me.all" },
        { "B200", 183359, 1, 1, 22784, "-me", "1g.23gb-me" },
        { "B200", 183359, 2, 2, 45568, "+gfx", "2g.45gb+gfx" },
};

static void test_profile_names(void **state) {
        for (size_t i = 0; i < ELEMENTSOF(names); i++) {
                _cleanup_free_ char *s = gpu_mig_profile_name(names[i].gi, names[i].ci, names[i].mem_mib,
                                                              names[i].total_mib << 20, names[i].suffix);
                if (!s || !streq(s, names[i].name))
                        fail_msg("%s %ug/%uc %" PRIu64 " MiB: got %s, want %s", names[i].model, names[i].gi,
                                 names[i].ci, names[i].mem_mib, strna(s), names[i].name);
        }
}

static void test_profile_name_garbage(void **state) {
        /* No name rather than a wrong one. */
        assert_null(gpu_mig_profile_name(0, 0, 4864, UINT64_C(40960) << 20, ""));
        assert_null(gpu_mig_profile_name(1, 1, 0, UINT64_C(40960) << 20, ""));
        assert_null(gpu_mig_profile_name(1, 1, 4864, 0, ""));
        assert_null(gpu_mig_profile_name(1, 2, 4864, UINT64_C(40960) << 20, ""));        /* CI > GI */
        assert_null(gpu_mig_profile_name(7, 7, 81920, UINT64_C(40960) << 20, ""));       /* MIG > GPU */
        assert_null(gpu_mig_profile_name(7, 7, UINT64_MAX >> 20, UINT64_MAX, ""));
        /* NULL suffix = none. */
        _cleanup_free_ char *s = gpu_mig_profile_name(1, 1, 4864, UINT64_C(40960) << 20, NULL);
        assert_string_equal(s, "1g.5gb");
}

static void test_profile_index_suffix(void **state) {
        assert_string_equal(gpu_nvml_profile_index_suffix(NVML_GPU_INSTANCE_PROFILE_1_SLICE), "");
        assert_string_equal(gpu_nvml_profile_index_suffix(NVML_GPU_INSTANCE_PROFILE_7_SLICE), "");
        assert_string_equal(gpu_nvml_profile_index_suffix(NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1), "+me");
        assert_string_equal(gpu_nvml_profile_index_suffix(NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1), "+me");
        assert_string_equal(gpu_nvml_profile_index_suffix(NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2), "");
        assert_string_equal(gpu_nvml_profile_index_suffix(NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX), "+gfx");
        assert_string_equal(gpu_nvml_profile_index_suffix(NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME), "-me");
        assert_string_equal(gpu_nvml_profile_index_suffix(NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME), "+me.all");
        assert_null(gpu_nvml_profile_index_suffix(NVML_GPU_INSTANCE_PROFILE_COUNT));
        /* An index newer than us: from the name; a known index: its own, whatever the name says. */
        assert_string_equal(gpu_nvml_profile_suffix(NVML_GPU_INSTANCE_PROFILE_COUNT, "MIG 1g.24gb+foo"), "+foo");
        assert_string_equal(gpu_nvml_profile_suffix(NVML_GPU_INSTANCE_PROFILE_COUNT, "MIG 1g.24gb"), "");
        assert_string_equal(gpu_nvml_profile_suffix(NVML_GPU_INSTANCE_PROFILE_COUNT, NULL), "");
        /* A name's suffix goes into labels and gres.conf: only the characters a profile name has. */
        assert_string_equal(gpu_nvml_profile_suffix(NVML_GPU_INSTANCE_PROFILE_COUNT, "MIG 1g.24gb+me\n#x=y"), "");
        assert_string_equal(gpu_nvml_profile_suffix(NVML_GPU_INSTANCE_PROFILE_COUNT, "MIG 1g.24gb+\"me\""), "");
        assert_true(gpu_nvml_profile_is_valid("1c.2g.20gb+me.all"));
        assert_false(gpu_nvml_profile_is_valid("1g.10gb\n"));
        assert_true(gpu_nvml_uuid_is_valid("GPU-5e1d5c8a-1b2c-3d4e-5f60-718293a4b5c6", "GPU-"));
        assert_false(gpu_nvml_uuid_is_valid("GPU-5e1d5c8a-1b2c-3d4e-5f60-718293a4b5c6", "MIG-"));
        assert_false(gpu_nvml_uuid_is_valid("GPU--1", "GPU-"));
        assert_true(gpu_nvml_version_is_valid("550.54.15"));
        assert_false(gpu_nvml_version_is_valid("550..54"));
        assert_false(gpu_nvml_version_is_valid("550.54."));
        assert_false(gpu_nvml_version_is_valid(""));
        assert_string_equal(gpu_nvml_profile_suffix(NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, "MIG 1g.5gb"), "+me");
}

/* ---- Return codes ----------------------------------------------------------------------------------- */

static void test_errno_table(void **state) {
        static const struct {
                nvmlReturn_t rc;
                int error;
        } table[] = {
                { NVML_SUCCESS, 0 },
                { NVML_ERROR_UNINITIALIZED, -EBADFD },
                { NVML_ERROR_INVALID_ARGUMENT, -EINVAL },
                { NVML_ERROR_NOT_SUPPORTED, -EOPNOTSUPP },
                { NVML_ERROR_NO_PERMISSION, -EPERM },
                { NVML_ERROR_NOT_FOUND, -ENOENT },
                { NVML_ERROR_INSUFFICIENT_SIZE, -ENOBUFS },
                { NVML_ERROR_DRIVER_NOT_LOADED, -ENODEV },
                { NVML_ERROR_TIMEOUT, -ETIMEDOUT },
                { NVML_ERROR_FUNCTION_NOT_FOUND, -ENOSYS },
                { NVML_ERROR_GPU_IS_LOST, -ENXIO },
                { NVML_ERROR_RESET_REQUIRED, -ERESTART },
                { NVML_ERROR_LIB_RM_VERSION_MISMATCH, -EPROTO },
                { NVML_ERROR_IN_USE, -EBUSY },
                { NVML_ERROR_MEMORY, -ENOMEM },
                { NVML_ERROR_NO_DATA, -ENODATA },
                { NVML_ERROR_INSUFFICIENT_RESOURCES, -ENOSPC },
                { NVML_ERROR_UNKNOWN, -EIO },
                { (nvmlReturn_t) 4242, -EIO }, /* a code from a newer driver is still a failure */
        };
        for (size_t i = 0; i < ELEMENTSOF(table); i++)
                if (gpu_nvml_errno(table[i].rc) != table[i].error)
                        fail_msg("NVML return code %d: got %d, want %d", (int) table[i].rc,
                                 gpu_nvml_errno(table[i].rc), table[i].error);

        /* Every code we declare is a different errno from SUCCESS, and has its own name. */
        for (int rc = 1; rc <= NVML_ERROR_ARGUMENT_VERSION_MISMATCH; rc++) {
                assert_true(gpu_nvml_errno((nvmlReturn_t) rc) < 0);
                assert_true(startswith(gpu_nvml_return_to_string((nvmlReturn_t) rc), "NVML_ERROR_"));
        }
        assert_string_equal(gpu_nvml_return_to_string(NVML_ERROR_IN_USE), "NVML_ERROR_IN_USE");
        assert_string_equal(gpu_nvml_return_to_string((nvmlReturn_t) 4242), "an unknown NVML return code");
}

static void test_bus_id(void **state) {
        char s[32];

        assert_int_equal(gpu_nvml_normalize_bus_id("00000000:1B:00.0", s), 0);
        assert_string_equal(s, "0000:1b:00.0");
        assert_int_equal(gpu_nvml_normalize_bus_id("0001:C1:1F.7", s), 0);
        assert_string_equal(s, "0001:c1:1f.7");
        assert_int_equal(gpu_nvml_normalize_bus_id("", s), -EINVAL);
        assert_int_equal(gpu_nvml_normalize_bus_id("00000000:1B:00.0x", s), -EINVAL);
        assert_int_equal(gpu_nvml_normalize_bus_id("00000000:1B:20.0", s), -EINVAL);
        assert_int_equal(gpu_nvml_normalize_bus_id(NULL, s), -EINVAL);
}

static void test_mig_mode_strings(void **state) {
        assert_string_equal(gpu_mig_mode_to_string(GPU_MIG_UNSUPPORTED), "unsupported");
        assert_string_equal(gpu_mig_mode_to_string(GPU_MIG_DISABLED), "disabled");
        assert_string_equal(gpu_mig_mode_to_string(GPU_MIG_ENABLED), "enabled");
        assert_null(gpu_mig_mode_to_string(_GPU_MIG_MODE_INVALID));
        assert_null(gpu_mig_mode_to_string(_GPU_MIG_MODE_MAX));
}

/* ---- Loading failures ----------------------------------------------------------------------------------- */

static void test_open_missing_library(void **state) {
        _cleanup_free_ char *error = NULL;
        GpuNvml *n = NULL;

        assert_int_equal(gpu_nvml_open("libnvidia-ml-gna-test-missing.so.1", &n, &error), -ENOENT);
        assert_null(n);
        assert_non_null(error);
        assert_non_null(strstr(error, "libnvidia-ml-gna-test-missing.so.1: cannot open shared object file"));
        assert_non_null(strstr(error, "libnvidia-ml1"));
        assert_non_null(strstr(error, "set nvml.library to its full path"));
        error = mfree(error);

        assert_int_equal(gpu_nvml_open("/nonexistent/gna/libnvidia-ml.so.1", &n, &error), -ENOENT);
        assert_null(n);
        assert_non_null(strstr(error, "/nonexistent/gna/libnvidia-ml.so.1"));
        assert_non_null(strstr(error, "nvml.library"));
}

static void test_open_not_a_library(void **state) {
        char path[] = "/tmp/gna-test-nvml-XXXXXX";
        _cleanup_free_ char *error = NULL;
        GpuNvml *n = NULL;
        int fd = mkstemp(path);

        assert_true(fd >= 0);
        assert_int_equal(write(fd, "not an ELF file\n", 16), 16);
        close(fd);

        assert_int_equal(gpu_nvml_open(path, &n, &error), -ELIBBAD);
        assert_null(n);
        assert_non_null(strstr(error, "Cannot load NVML"));
        assert_non_null(strstr(error, path));
        assert_non_null(strstr(error, "nvml.library"));
        unlink(path);
}

static void test_open_library_without_nvml(void **state) {
        _cleanup_free_ char *error = NULL;
        GpuNvml *n = NULL;

        /* A real shared library that is not NVML: the first required entry point is named. */
        assert_int_equal(gpu_nvml_open("libm.so.6", &n, &error), -ENOSYS);
        assert_null(n);
        assert_string_equal(error, "libm.so.6 exports neither nvmlInit_v2 nor nvmlInit: the NVIDIA driver is too "
                                   "old for this agent; install a current driver.");
}

/* ---- Snapshot helpers ----------------------------------------------------------------------------------- */

static NvmlSnapshot *make_snapshot(void) {
        NvmlSnapshot *s = calloc(1, sizeof *s);

        assert_non_null(s);
        s->driver_version = strdup("550.127.05");
        s->cuda_version = 12040;
        s->gpus = calloc(2, sizeof *s->gpus);
        s->n_gpus = 2;
        strcpy(s->gpus[0].pci_address, "0000:3b:00.0");
        s->gpus[0].name = strdup("NVIDIA A100-PCIE-40GB");
        s->gpus[0].mig_current = s->gpus[0].mig_pending = GPU_MIG_ENABLED;
        s->gpus[0].mig_devices = calloc(1, sizeof(MigDeviceInfo));
        s->gpus[0].n_mig_devices = 1;
        s->gpus[0].mig_devices[0] = (MigDeviceInfo) { .gi_id = 2, .uuid = strdup("MIG-1"), .profile = strdup("3g.20gb") };
        strcpy(s->gpus[1].pci_address, "0000:5e:00.0");
        s->gpus[1].minor = 1;
        assert_int_equal(strv_extend(&s->warnings, "a warning"), 0);
        return s;
}

static void test_snapshot_equal_find(void **state) {
        _cleanup_(gpu_nvml_snapshot_freep) NvmlSnapshot *a = make_snapshot(), *b = make_snapshot();

        assert_true(gpu_nvml_snapshot_equal(NULL, NULL));
        assert_false(gpu_nvml_snapshot_equal(a, NULL));
        assert_false(gpu_nvml_snapshot_equal(NULL, b));
        assert_true(gpu_nvml_snapshot_equal(a, b));

        /* Warnings do not count; everything a label or CDI spec is made from does. */
        b->warnings = strv_free(b->warnings);
        assert_true(gpu_nvml_snapshot_equal(a, b));
        free(b->gpus[0].mig_devices[0].uuid);
        b->gpus[0].mig_devices[0].uuid = strdup("MIG-2"); /* an instance re-created */
        assert_false(gpu_nvml_snapshot_equal(a, b));
        free(b->gpus[0].mig_devices[0].uuid);
        b->gpus[0].mig_devices[0].uuid = strdup("MIG-1");
        b->gpus[0].mig_pending = GPU_MIG_DISABLED;
        assert_false(gpu_nvml_snapshot_equal(a, b));
        b->gpus[0].mig_pending = GPU_MIG_ENABLED;
        b->gpus[1].clique = strdup("x.1");
        assert_false(gpu_nvml_snapshot_equal(a, b));
        free(b->gpus[1].clique);
        b->gpus[1].clique = NULL;
        b->gpus[1].nvlink_known = !a->gpus[1].nvlink_known; /* NVLink topology is compared */
        assert_false(gpu_nvml_snapshot_equal(a, b));
        b->gpus[1].nvlink_known = a->gpus[1].nvlink_known;
        assert_int_equal(strv_extend(&b->gpus[1].nvlink_remotes, "0000:05:00.0"), 0);
        assert_false(gpu_nvml_snapshot_equal(a, b));

        assert_ptr_equal(gpu_nvml_snapshot_find(a, "0000:5e:00.0"), &a->gpus[1]);
        assert_ptr_equal(gpu_nvml_snapshot_find(a, "0000:5E:00.0"), &a->gpus[1]);
        assert_null(gpu_nvml_snapshot_find(a, "0000:af:00.0"));
        assert_null(gpu_nvml_snapshot_find(NULL, "0000:5e:00.0"));
}

/* ---- Against the fake NVML ------------------------------------------------------------------------------ */

typedef struct Fake {
        GpuNvml *nvml;  /* closed by the teardown, so that a failed test does not leave NVML initialised */
        char *lib;
        char *dir;
        char *description;
        char *trace;
} Fake;

static const char fake_node[] =
        "driver_version: \"550.127.05\"\n"
        "cuda_version: 12040\n"
        "nvml_version: \"12.550.127.05\"\n"
        "gpus:\n"
        "  - pci: \"0000:3b:00.0\"\n"
        "    model: \"NVIDIA A100-PCIE-40GB\"\n"
        "    uuid: \"GPU-3b000000-0000-0000-0000-000000000001\"\n"
        "    minor: 0\n"
        "    mig: enabled\n"
        "    instances:\n"
        "      - {profile: \"9\", start: 4}\n"                       /* 3g.20gb: GI id 2 */
        "      - {profile: \"14\", start: 0, compute: [\"1c\", \"1c\"]}\n" /* 2g.10gb as 2 × 1c: GI id 3 */
        "      - {profile: \"20\", start: 2}\n"                      /* 1g.5gb+me: GI id 9 */
        "  - pci: \"0000:5e:00.0\"\n"
        "    model: \"NVIDIA L40S\"\n"
        "    uuid: \"GPU-5e000000-0000-0000-0000-000000000002\"\n"
        "    minor: 1\n"
        "  - pci: \"0000:86:00.0\"\n"
        "    model: \"NVIDIA H100 80GB HBM3\"\n"
        "    uuid: \"GPU-86000000-0000-0000-0000-000000000003\"\n"
        "    minor: 2\n"
        "    fabric: {cluster_uuid: \"a1b2c3d4-e5f6-0718-293a-4b5c6d7e8f90\", clique: 7}\n"
        "    nvlink: [\"0000:87:00.0\", \"0000:05:00.0\", \"0000:87:00.0\"]\n"
        "  - pci: \"0000:87:00.0\"\n"
        "    model: \"NVIDIA H100 80GB HBM3\"\n"
        "    uuid: \"GPU-87000000-0000-0000-0000-000000000004\"\n"
        "    minor: 3\n"
        "    fabric: {cluster_uuid: \"a1b2c3d4-e5f6-0718-293a-4b5c6d7e8f90\", clique: 7, state: in-progress}\n";

/* Our inventory's order, with a GPU NVML does not know (bound to vfio-pci) in the middle. */
static char *const fake_addresses[] = { "0000:3b:00.0", "0000:5e:00.0", "0000:af:00.0", "0000:86:00.0",
                                        "0000:87:00.0", NULL };

static const char *const fake_env[] = { "FAKE_NVML_DESCRIPTION", "FAKE_NVML_STATE", "FAKE_NVML_FAIL_INIT",
                                        "FAKE_NVML_FAIL", "FAKE_NVML_BUSY", "FAKE_NVML_TRACE",
                                        "FAKE_NVML_GARBAGE", "FAKE_NVML_FIT", NULL };

static int fake_setup(void **state) {
        const char *lib = getenv("GNA_FAKE_NVML"), *build = getenv("GNA_BUILD_ROOT");
        _cleanup_free_ char *path = NULL;
        Fake *f;

        if (lib)
                path = strdup(lib);
        else if (build)
                path = strprintf("%s/tests/fakes/libnvidia-ml.so.1", build);
        if (!path || access(path, F_OK) < 0) {
                *state = NULL;
                return 0; /* each test skips */
        }

        f = calloc(1, sizeof *f);
        assert_non_null(f);
        f->lib = TAKE_PTR(path);
        f->dir = strdup("/tmp/gna-test-nvml-XXXXXX");
        assert_non_null(mkdtemp(f->dir));
        f->description = path_join(f->dir, "nvml.yaml");
        f->trace = path_join(f->dir, "trace");
        assert_int_equal(write_file_atomic(f->description, NULL, fake_node, strlen(fake_node), 0644), 0);

        for (const char *const *e = fake_env; *e; e++)
                unsetenv(*e);
        setenv("FAKE_NVML_DESCRIPTION", f->description, 1);
        setenv("FAKE_NVML_TRACE", f->trace, 1);
        *state = f;
        return 0;
}

static int fake_teardown(void **state) {
        Fake *f = *state;
        _cleanup_free_ char *cmd = NULL;

        if (!f)
                return 0;
        gpu_nvml_close(f->nvml);
        cmd = strprintf("rm -rf '%s'", f->dir);
        (void) !system(cmd);
        free(f->lib);
        free(f->dir);
        free(f->description);
        free(f->trace);
        free(f);
        for (const char *const *e = fake_env; *e; e++)
                unsetenv(*e);
        return 0;
}

static Fake *fake_or_skip(void **state) {
        if (!*state) {
                print_message("fake libnvidia-ml.so.1 not built (tests/fakes); skipping\n");
                skip();
        }
        return *state;
}

static size_t trace_lines(const Fake *f) {
        _cleanup_free_ char *s = NULL;
        size_t n = 0;

        if (read_full_file(f->trace, SIZE_MAX, &s, NULL) < 0)
                return 0;
        for (const char *p = s; *p; p++)
                n += *p == '\n';
        return n;
}

/* The entry points of the trace from line skip on, one per call. */
static char **trace_names(const Fake *f, size_t skip) {
        _cleanup_free_ char *s = NULL;
        char **l = NULL;
        size_t line = 0;

        assert_int_equal(read_full_file(f->trace, SIZE_MAX, &s, NULL), 0);
        for (char *p = s, *e; *p; p = e + 1, line++) {
                e = strchrnul(p, '\n');
                if (line >= skip)
                        assert_int_equal(strv_extendf(&l, "%.*s", (int) strcspn(p, " \n"), p), 0);
                if (!*e)
                        break;
        }
        return l;
}

static GpuNvml *fake_open(Fake *f) {
        _cleanup_free_ char *error = NULL;
        GpuNvml *n = NULL;
        int r = gpu_nvml_open(f->lib, &n, &error);

        if (r < 0)
                fail_msg("gpu_nvml_open(%s): %s", f->lib, strna(error));
        assert_null(f->nvml);
        return f->nvml = n;
}

static NvmlSnapshot *fake_read(GpuNvml *n, char *const *addresses) {
        _cleanup_free_ char *error = NULL;
        NvmlSnapshot *s = NULL;
        int r = gpu_nvml_read(n, addresses, &s, &error);

        if (r < 0)
                fail_msg("gpu_nvml_read: %s", strna(error));
        return s;
}

static void assert_no_warnings(const NvmlSnapshot *s) {
        if (s->warnings) {
                _cleanup_free_ char *w = strv_join(s->warnings, "\n");
                fail_msg("unexpected warnings:\n%s", w);
        }
}

static void test_fake_read(void **state) {
        Fake *f = fake_or_skip(state);
        GpuNvml *n = fake_open(f);
        _cleanup_(gpu_nvml_snapshot_freep) NvmlSnapshot *s = fake_read(n, fake_addresses);
        const GpuInfo *g;
        const MigDeviceInfo *m;

        assert_no_warnings(s);
        assert_string_equal(s->driver_version, "550.127.05");
        assert_string_equal(s->nvml_version, "12.550.127.05");
        assert_int_equal(s->cuda_version, 12040);

        /* Our order, the unknown GPU left out. */
        assert_int_equal(s->n_gpus, 4);
        assert_string_equal(s->gpus[0].pci_address, "0000:3b:00.0");
        assert_string_equal(s->gpus[1].pci_address, "0000:5e:00.0");
        assert_string_equal(s->gpus[2].pci_address, "0000:86:00.0");
        assert_string_equal(s->gpus[3].pci_address, "0000:87:00.0");
        assert_null(gpu_nvml_snapshot_find(s, "0000:af:00.0"));

        g = &s->gpus[0];
        assert_int_equal(g->nvml_index, 0);
        assert_string_equal(g->name, "NVIDIA A100-PCIE-40GB");
        assert_string_equal(g->uuid, "GPU-3b000000-0000-0000-0000-000000000001");
        assert_int_equal(g->memory_total_bytes, UINT64_C(40960) << 20);
        assert_int_equal(g->cc_major, 8);
        assert_int_equal(g->cc_minor, 0);
        assert_int_equal(g->minor, 0);
        assert_int_equal(g->mig_current, GPU_MIG_ENABLED);
        assert_int_equal(g->mig_pending, GPU_MIG_ENABLED);
        assert_null(g->clique);

        /* MIG devices in (GI id, CI id) order, named from attributes + the profile index's suffix. */
        assert_int_equal(g->n_mig_devices, 4);
        m = g->mig_devices;
        assert_int_equal(m[0].gi_id, 2);
        assert_int_equal(m[0].ci_id, 0);
        assert_string_equal(m[0].profile, "3g.20gb");
        assert_int_equal(m[0].gi_profile_id, 9);
        assert_int_equal(m[0].placement_start, 4);
        assert_int_equal(m[0].placement_size, 4);
        assert_int_equal(m[0].gi_slices, 3);
        assert_int_equal(m[0].ci_slices, 3);
        assert_int_equal(m[0].memory_mib, 19968);
        assert_int_equal(m[1].gi_id, 3);
        assert_int_equal(m[1].ci_id, 0);
        assert_string_equal(m[1].profile, "1c.2g.10gb");
        assert_int_equal(m[1].gi_profile_id, 14);
        assert_int_equal(m[1].ci_profile_id, 0);
        assert_int_equal(m[2].gi_id, 3);
        assert_int_equal(m[2].ci_id, 1);
        assert_string_equal(m[2].profile, "1c.2g.10gb");
        assert_int_equal(m[3].gi_id, 9);
        assert_string_equal(m[3].profile, "1g.5gb+me");
        assert_int_equal(m[3].gi_profile_id, 20);
        assert_int_equal(m[3].placement_start, 2);
        assert_int_equal(m[3].placement_size, 1);
        for (size_t i = 0; i < g->n_mig_devices; i++) {
                assert_non_null(m[i].uuid);
                assert_true(startswith(m[i].uuid, "MIG-"));
                for (size_t k = 0; k < i; k++)
                        assert_string_not_equal(m[i].uuid, m[k].uuid);
        }

        g = &s->gpus[1];
        assert_string_equal(g->name, "NVIDIA L40S");
        assert_int_equal(g->nvml_index, 1);
        assert_int_equal(g->cc_major, 8);
        assert_int_equal(g->cc_minor, 9);
        assert_int_equal(g->mig_current, GPU_MIG_UNSUPPORTED);
        assert_int_equal(g->mig_pending, GPU_MIG_UNSUPPORTED);
        assert_int_equal(g->n_mig_devices, 0);

        assert_false(g->nvlink_known); /* the L40S: NVLink NOT_SUPPORTED */
        assert_null(g->nvlink_remotes);

        g = &s->gpus[2];
        assert_int_equal(g->mig_current, GPU_MIG_DISABLED);
        assert_string_equal(g->clique, "a1b2c3d4-e5f6-0718-293a-4b5c6d7e8f90.7");
        /* Its 3 active links in link order, NVML's upper-case bus ids in our spelling; the rest inactive. */
        assert_true(g->nvlink_known);
        assert_int_equal(strv_length(g->nvlink_remotes), 3);
        assert_string_equal(g->nvlink_remotes[0], "0000:87:00.0");
        assert_string_equal(g->nvlink_remotes[1], "0000:05:00.0");
        assert_string_equal(g->nvlink_remotes[2], "0000:87:00.0");
        g = &s->gpus[3];
        assert_null(g->clique); /* fabric registration still in progress */
}

static void test_fake_call_counts(void **state) {
        Fake *f = fake_or_skip(state);
        GpuNvml *n = fake_open(f);
        _cleanup_(gpu_nvml_snapshot_freep) NvmlSnapshot *a = NULL, *b = NULL, *c = NULL;
        char *const no_mig[] = { "0000:5e:00.0", "0000:af:00.0", NULL };
        uint64_t before, first, second;

        assert_int_equal(gpu_nvml_calls(n), 1); /* nvmlInit_v2 */
        assert_int_equal(trace_lines(f), 1);

        before = gpu_nvml_calls(n);
        a = fake_read(n, fake_addresses);
        first = gpu_nvml_calls(n) - before;
        /* We count every call the library sees. */
        assert_int_equal(gpu_nvml_calls(n), trace_lines(f));

        b = fake_read(n, fake_addresses);
        second = gpu_nvml_calls(n) - before - first;
        assert_int_equal(gpu_nvml_calls(n), trace_lines(f));
        assert_true(gpu_nvml_snapshot_equal(a, b));
        assert_true(second < first);
        /* What is read again (gpu-nvml-read.c's table): the A100 in MIG mode: mode 1 + 7 slots + the UUID
         * of each of its 4 MIG devices, whose other facts are known by that UUID; each H100: mode 1 +
         * fabric 1; the L40S (no MIG, no fabric) and the GPU NVML does not know: nothing. */
        assert_int_equal(second, 1 + 7 + 4 + 2 + 2);
        _cleanup_strv_free_ char **called = trace_names(f, (size_t) (before + first));
        STRV_FOREACH(name, called)
                if (!strv_contains((char **) (const char *const[]) { "nvmlDeviceGetMigMode", "nvmlDeviceGetGpuFabricInfo",
                                                                   "nvmlDeviceGetMigDeviceHandleByIndex",
                                                                   "nvmlDeviceGetUUID", NULL }, *name))
                        fail_msg("the second read called %s", *name);

        /* GPUs with nothing that can change cost no call at all. */
        c = fake_read(n, no_mig);
        assert_int_equal(gpu_nvml_calls(n) - before - first - second, 0);
        assert_int_equal(c->n_gpus, 1);
        assert_string_equal(c->gpus[0].name, "NVIDIA L40S");

        /* After invalidate everything is read again. */
        gpu_nvml_invalidate(n);
        c = gpu_nvml_snapshot_free(c);
        before = gpu_nvml_calls(n);
        c = fake_read(n, fake_addresses);
        assert_int_equal(gpu_nvml_calls(n) - before, first);
        assert_true(gpu_nvml_snapshot_equal(a, c));
}

static const MigDeviceInfo *mig_by_gi(const GpuInfo *g, unsigned gi_id) {
        for (size_t i = 0; i < g->n_mig_devices; i++)
                if (g->mig_devices[i].gi_id == gi_id)
                        return &g->mig_devices[i];
        fail_msg("GPU %s has no MIG device in GPU instance %u", g->pci_address, gi_id);
        return NULL;
}

static void test_fake_mig_recreated(void **state) {
        Fake *f = fake_or_skip(state);
        GpuNvml *n = fake_open(f);
        _cleanup_(gpu_nvml_snapshot_freep) NvmlSnapshot *a = NULL, *b = NULL, *c = NULL;
        nvmlGpuInstancePlacement_t placement = { .start = 2, .size = 1 };
        nvmlGpuInstance_t gi = NULL;
        nvmlComputeInstance_t ci = NULL;
        nvmlDevice_t gpu = NULL;
        uint64_t before;

        a = fake_read(n, fake_addresses);
        b = fake_read(n, fake_addresses);
        assert_true(gpu_nvml_snapshot_equal(a, b));
        _cleanup_free_ char *old_uuid = strdup(mig_by_gi(&a->gpus[0], 9)->uuid);
        assert_string_equal(mig_by_gi(&a->gpus[0], 9)->profile, "1g.5gb+me");

        /* Re-create GPU instance 9 (1g.5gb+me at slice 2) as a 1g.5gb in the same place: same GI and CI
         * ids, a new UUID and other facts, as the MIG manager would. */
        assert_int_equal(gpu_nvml_device_get_handle_by_pci_bus_id(n, "00000000:3B:00.0", &gpu), 0);
        assert_int_equal(gpu_nvml_device_get_gpu_instance_by_id(n, gpu, 9, &gi), 0);
        unsigned count = 1;
        assert_int_equal(gpu_nvml_gpu_instance_get_compute_instances(n, gi, 0, &ci, &count), 0);
        assert_int_equal(count, 1);
        assert_int_equal(gpu_nvml_compute_instance_destroy(n, ci), 0);
        assert_int_equal(gpu_nvml_gpu_instance_destroy(n, gi), 0);
        assert_int_equal(gpu_nvml_device_create_gpu_instance_with_placement(n, gpu, 19, &placement, &gi), 0);
        assert_int_equal(gpu_nvml_gpu_instance_create_compute_instance(n, gi, 0, &ci), 0);

        before = gpu_nvml_calls(n);
        c = fake_read(n, fake_addresses);
        assert_no_warnings(c);
        const MigDeviceInfo *m = mig_by_gi(&c->gpus[0], 9);
        assert_string_not_equal(m->uuid, old_uuid);
        assert_string_equal(m->profile, "1g.5gb");
        assert_int_equal(m->gi_profile_id, 19);
        assert_int_equal(m->ci_id, 0);
        assert_int_equal(m->placement_start, 2);
        assert_int_equal(m->placement_size, 1);
        assert_int_equal(m->memory_mib, 4864);
        assert_int_equal(m->decoders, 0); /* +me had the media engines */
        /* Only the new device is read in full: 5 calls beyond its UUID, and its GPU instance's 2 (without
         * CI look-up by id: GI id, CI id, attributes and one CI profile info for the new GI profile). */
        unsigned full = n->fn.nvmlGpuInstanceGetComputeInstanceById ? 5 + 2 : 3 + 2 + 1;
        assert_int_equal(gpu_nvml_calls(n) - before, 1 + 7 + 4 + full + 2 + 2);
        /* The other devices are as they were. */
        assert_int_equal(c->gpus[0].n_mig_devices, 4);
        for (size_t i = 0; i < 3; i++) {
                const MigDeviceInfo *x = &c->gpus[0].mig_devices[i], *y = &b->gpus[0].mig_devices[i];
                assert_int_equal(x->gi_id, y->gi_id);
                assert_int_equal(x->ci_id, y->ci_id);
                assert_int_equal(x->gi_profile_id, y->gi_profile_id);
                assert_int_equal(x->multiprocessors, y->multiprocessors);
                assert_string_equal(x->uuid, y->uuid);
                assert_string_equal(x->profile, y->profile);
        }
        assert_false(gpu_nvml_snapshot_equal(b, c));

        /* And from then on it is known too. */
        c = gpu_nvml_snapshot_free(c);
        before = gpu_nvml_calls(n);
        c = fake_read(n, fake_addresses);
        assert_int_equal(gpu_nvml_calls(n) - before, 1 + 7 + 4 + 2 + 2);
        assert_string_equal(mig_by_gi(&c->gpus[0], 9)->profile, "1g.5gb");
}

static void test_fake_enumerate(void **state) {
        Fake *f = fake_or_skip(state);
        GpuNvml *n = fake_open(f);
        _cleanup_(gpu_nvml_snapshot_freep) NvmlSnapshot *s = fake_read(n, NULL);

        /* Without a list: every GPU NVML has, in PCI order, with NVML's bus id spelled our way. */
        assert_no_warnings(s);
        assert_int_equal(s->n_gpus, 4);
        assert_string_equal(s->gpus[0].pci_address, "0000:3b:00.0");
        assert_string_equal(s->gpus[3].pci_address, "0000:87:00.0");
        assert_int_equal(s->gpus[3].nvml_index, 3);
        assert_int_equal(s->gpus[0].n_mig_devices, 4);
}

static void test_fake_init_failure(void **state) {
        Fake *f = fake_or_skip(state);
        _cleanup_free_ char *error = NULL;
        GpuNvml *n = NULL;

        setenv("FAKE_NVML_FAIL_INIT", "DRIVER_NOT_LOADED", 1);
        assert_int_equal(gpu_nvml_open(f->lib, &n, &error), -ENODEV);
        assert_null(n);
        assert_non_null(strstr(error, "the nvidia kernel module is not loaded"));
        assert_non_null(strstr(error, "nvmlInit_v2: Driver Not Loaded (NVML_ERROR_DRIVER_NOT_LOADED)"));
        assert_non_null(strstr(error, f->lib));
        error = mfree(error);

        setenv("FAKE_NVML_FAIL_INIT", "LIB_RM_VERSION_MISMATCH", 1);
        assert_int_equal(gpu_nvml_open(f->lib, &n, &error), -EPROTO);
        assert_non_null(strstr(error, "different driver versions"));
        error = mfree(error);

        setenv("FAKE_NVML_FAIL_INIT", "NO_PERMISSION", 1);
        assert_int_equal(gpu_nvml_open(f->lib, &n, &error), -EPERM);
        assert_non_null(strstr(error, "must run as root"));
        unsetenv("FAKE_NVML_FAIL_INIT");
}

static bool has_warning(const NvmlSnapshot *s, const char *needle) {
        STRV_FOREACH(w, s->warnings)
                if (strstr(*w, needle))
                        return true;
        return false;
}

static void test_fake_single_call_fails(void **state) {
        Fake *f = fake_or_skip(state);
        GpuNvml *n = NULL;
        _cleanup_(gpu_nvml_snapshot_freep) NvmlSnapshot *a = NULL, *b = NULL;

        /* The first UUID read fails (GPU 0): that field is unknown, with a warning naming GPU, call and
         * NVML's error; everything else is there. The fact is not cached, so the next read gets it. */
        setenv("FAKE_NVML_FAIL", "nvmlDeviceGetUUID:1:GPU_IS_LOST", 1);
        n = fake_open(f);
        a = fake_read(n, fake_addresses);
        assert_int_equal(a->n_gpus, 4);
        assert_null(a->gpus[0].uuid);
        assert_string_equal(a->gpus[0].name, "NVIDIA A100-PCIE-40GB");
        assert_int_equal(a->gpus[0].n_mig_devices, 4);
        assert_non_null(a->gpus[1].uuid);
        assert_int_equal(strv_length(a->warnings), 1);
        assert_string_equal(a->warnings[0], "GPU 0000:3b:00.0: nvmlDeviceGetUUID: GPU is lost "
                                            "(NVML_ERROR_GPU_IS_LOST); the value is left unknown.");

        b = fake_read(n, fake_addresses);
        assert_no_warnings(b);
        assert_string_equal(b->gpus[0].uuid, "GPU-3b000000-0000-0000-0000-000000000001");
        assert_false(gpu_nvml_snapshot_equal(a, b));
        unsetenv("FAKE_NVML_FAIL");
}

static void test_fake_nvlink_call_fails(void **state) {
        Fake *f = fake_or_skip(state);
        GpuNvml *n = NULL;
        _cleanup_(gpu_nvml_snapshot_freep) NvmlSnapshot *a = NULL, *b = NULL;

        /* A failing remote look-up (not NOT_SUPPORTED) leaves that GPU's topology unknown, with a warning,
         * never the read failed; the next read asks again and gets it. */
        setenv("FAKE_NVML_FAIL", "nvmlDeviceGetNvLinkRemotePciInfo_v2:2:UNKNOWN", 1);
        n = fake_open(f);
        a = fake_read(n, fake_addresses);
        assert_int_equal(a->n_gpus, 4);
        assert_false(a->gpus[2].nvlink_known);
        assert_null(a->gpus[2].nvlink_remotes);
        assert_int_equal(strv_length(a->warnings), 1);
        assert_string_equal(a->warnings[0], "GPU 0000:86:00.0: nvmlDeviceGetNvLinkRemotePciInfo_v2: Unknown Error "
                                            "(NVML_ERROR_UNKNOWN); its NVLink topology is left unknown.");
        b = fake_read(n, fake_addresses);
        assert_no_warnings(b);
        assert_true(b->gpus[2].nvlink_known);
        assert_int_equal(strv_length(b->gpus[2].nvlink_remotes), 3);
        unsetenv("FAKE_NVML_FAIL");
}

static void test_fake_mig_call_fails(void **state) {
        Fake *f = fake_or_skip(state);
        GpuNvml *n = NULL;
        _cleanup_(gpu_nvml_snapshot_freep) NvmlSnapshot *a = NULL;

        _cleanup_(gpu_nvml_snapshot_freep) NvmlSnapshot *b = NULL;

        /* A MIG device whose attributes cannot be read: listed, unnamed, warned about. */
        setenv("FAKE_NVML_FAIL", "nvmlDeviceGetAttributes_v2:2:UNKNOWN", 1);
        n = fake_open(f);
        a = fake_read(n, fake_addresses);
        assert_int_equal(a->gpus[0].n_mig_devices, 4);
        assert_null(a->gpus[0].mig_devices[1].profile);
        assert_string_equal(a->gpus[0].mig_devices[0].profile, "3g.20gb");
        assert_true(has_warning(a, "GPU 0000:3b:00.0: nvmlDeviceGetAttributes_v2: Unknown Error (NVML_ERROR_UNKNOWN)"));

        /* A device read with a warning is not kept: the next read asks again and gets its name. */
        b = fake_read(n, fake_addresses);
        assert_no_warnings(b);
        assert_string_equal(b->gpus[0].mig_devices[1].profile, "1c.2g.10gb");
        unsetenv("FAKE_NVML_FAIL");
}

static void test_fake_driver_gone(void **state) {
        Fake *f = fake_or_skip(state);
        GpuNvml *n = NULL;
        _cleanup_(gpu_nvml_snapshot_freep) NvmlSnapshot *s = NULL;
        _cleanup_free_ char *error = NULL;

        /* NVML answering "driver not loaded" mid-read: the read fails as a whole, so the stage reopens. */
        setenv("FAKE_NVML_FAIL", "nvmlDeviceGetMigMode:1+:DRIVER_NOT_LOADED", 1);
        n = fake_open(f);
        assert_int_equal(gpu_nvml_read(n, fake_addresses, &s, &error), -ENODEV);
        assert_null(s);
        assert_string_equal(error, "NVML stopped answering (nvmlDeviceGetMigMode: Driver Not Loaded "
                                   "(NVML_ERROR_DRIVER_NOT_LOADED)); it is reopened on the next attempt.");
        unsetenv("FAKE_NVML_FAIL");
}

static void test_fake_garbage(void **state) {
        Fake *f = fake_or_skip(state);
        GpuNvml *n = NULL;
        _cleanup_(gpu_nvml_snapshot_freep) NvmlSnapshot *s = NULL;

        /* Nonsense answers become unknown fields with warnings, never values. */
        setenv("FAKE_NVML_GARBAGE", "1:name,1:memory,1:cc,1:minor,2:mig", 1);
        n = fake_open(f);
        s = fake_read(n, fake_addresses);
        assert_int_equal(s->n_gpus, 4);
        assert_null(s->gpus[1].name);
        assert_int_equal(s->gpus[1].memory_total_bytes, 0);
        assert_int_equal(s->gpus[1].cc_major, -1);
        assert_int_equal(s->gpus[1].minor, -1);
        assert_int_equal(s->gpus[2].mig_current, _GPU_MIG_MODE_INVALID);
        assert_true(has_warning(s, "GPU 0000:5e:00.0: nvmlDeviceGetName answered an empty name"));
        assert_true(has_warning(s, "GPU 0000:5e:00.0: nvmlDeviceGetMemoryInfo reports 0 bytes"));
        assert_true(has_warning(s, "GPU 0000:5e:00.0: nvmlDeviceGetCudaComputeCapability answered 0.0"));
        assert_true(has_warning(s, "GPU 0000:5e:00.0: nvmlDeviceGetMinorNumber answered 4294967295"));
        assert_true(has_warning(s, "GPU 0000:86:00.0: nvmlDeviceGetMigMode answered modes 7/7"));
        unsetenv("FAKE_NVML_GARBAGE");
}

/* A hostile driver: names keep their bytes (bounded by NVML's buffer, even one it filled without a NUL),
 * UUIDs and versions that are not one are refused, with a warning naming the GPU by PCI address. */
static void test_fake_hostile_strings(void **state) {
        Fake *f = fake_or_skip(state);
        _cleanup_free_ char *desc = NULL, *long_name = malloc(301), *long_uuid = malloc(301);
        GpuNvml *n;
        _cleanup_(gpu_nvml_snapshot_freep) NvmlSnapshot *s = NULL;

        assert_non_null(long_name);
        assert_non_null(long_uuid);
        memset(long_name, 'N', 300);
        long_name[300] = '\0';
        memcpy(long_uuid, "GPU-", 4);
        memset(long_uuid + 4, 'a', 296);
        long_uuid[300] = '\0';
        desc = strprintf("driver_version: \"550.54.15\\n#evil=1\"\n"
                         "gpus:\n"
                         "  - pci: \"0000:3b:00.0\"\n"
                         "    model: \"NVIDIA H100 80GB HBM3\"\n"
                         "    name: \"NVIDIA \\\"H100\\\"\\n#a=b\\\\c\"\n"
                         "    uuid: \"GPU-0123\\n#evil=1\"\n"
                         "  - pci: \"0000:5e:00.0\"\n"
                         "    model: \"NVIDIA H100 80GB HBM3\"\n"
                         "    name: \"%s\"\n"
                         "    uuid: \"%s\"\n",
                         long_name, long_uuid);
        assert_non_null(desc);
        assert_int_equal(write_file_atomic(f->description, NULL, desc, strlen(desc), 0644), 0);

        n = fake_open(f);
        s = fake_read(n, NULL);
        assert_int_equal(s->n_gpus, 2);
        assert_null(s->driver_version);
        assert_true(has_warning(s, "NVML: nvmlSystemGetDriverVersion answered a string that is not a version"));
        assert_string_equal(s->gpus[0].name, "NVIDIA \"H100\"\n#a=b\\c");
        assert_null(s->gpus[0].uuid);
        assert_true(has_warning(s, "GPU 0000:3b:00.0: nvmlDeviceGetUUID answered a UUID that is not"));
        assert_int_equal(strlen(s->gpus[1].name), GPU_NVML_STRING_MAX);
        assert_null(s->gpus[1].uuid);
        assert_true(has_warning(s, "GPU 0000:5e:00.0: nvmlDeviceGetUUID answered a UUID that is not"));
        /* What the reader kept passes the daemon's wire check. */
        assert_return_code(gpu_nvml_snapshot_check(s, NULL), 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_profile_names),
                cmocka_unit_test(test_profile_name_garbage),
                cmocka_unit_test(test_profile_index_suffix),
                cmocka_unit_test(test_errno_table),
                cmocka_unit_test(test_bus_id),
                cmocka_unit_test(test_mig_mode_strings),
                cmocka_unit_test(test_open_missing_library),
                cmocka_unit_test(test_open_not_a_library),
                cmocka_unit_test(test_open_library_without_nvml),
                cmocka_unit_test(test_snapshot_equal_find),
                cmocka_unit_test_setup_teardown(test_fake_read, fake_setup, fake_teardown),
                cmocka_unit_test_setup_teardown(test_fake_hostile_strings, fake_setup, fake_teardown),
                cmocka_unit_test_setup_teardown(test_fake_call_counts, fake_setup, fake_teardown),
                cmocka_unit_test_setup_teardown(test_fake_mig_recreated, fake_setup, fake_teardown),
                cmocka_unit_test_setup_teardown(test_fake_enumerate, fake_setup, fake_teardown),
                cmocka_unit_test_setup_teardown(test_fake_init_failure, fake_setup, fake_teardown),
                cmocka_unit_test_setup_teardown(test_fake_nvlink_call_fails, fake_setup, fake_teardown),
                cmocka_unit_test_setup_teardown(test_fake_single_call_fails, fake_setup, fake_teardown),
                cmocka_unit_test_setup_teardown(test_fake_mig_call_fails, fake_setup, fake_teardown),
                cmocka_unit_test_setup_teardown(test_fake_driver_gone, fake_setup, fake_teardown),
                cmocka_unit_test_setup_teardown(test_fake_garbage, fake_setup, fake_teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
