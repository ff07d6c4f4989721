/* SPDX-License-Identifier: MIT */
/* Tests for the fake NVML (tests/fakes/): the built libnvidia-ml.so.1 is dlopen'd as the agent does and
 * driven through the real ABI: device queries, the driver's MIG rules (placements, limits, CI fit, mode
 * changes pending until reset, index ≠ id), the MIG user guide's worked best-fit sequences, state that
 * survives re-init and other processes (fake-nvml-ctl), fault injection, the call trace and the node
 * descriptions mknode.py generates. */
#include <dlfcn.h>
#include <fcntl.h>
#include <libgen.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "fileio.h"
#include "nvml-abi.h"
#include "strv.h"

/* Not in nvml-abi.h (the agent always places instances itself); NVML's signature. */
typedef nvmlReturn_t (*create_gi_fn)(nvmlDevice_t device, unsigned int profileId, nvmlGpuInstance_t *gpuInstance);

#define SYMBOLS(X)                                                                                         \
        X(gna_nvmlInit_v2_fn, nvmlInit)                                                                    \
        X(gna_nvmlInit_v2_fn, nvmlInit_v2)                                                                 \
        X(gna_nvmlShutdown_fn, nvmlShutdown)                                                               \
        X(gna_nvmlErrorString_fn, nvmlErrorString)                                                         \
        X(gna_nvmlSystemGetDriverVersion_fn, nvmlSystemGetDriverVersion)                                   \
        X(gna_nvmlSystemGetNVMLVersion_fn, nvmlSystemGetNVMLVersion)                                       \
        X(gna_nvmlSystemGetCudaDriverVersion_fn, nvmlSystemGetCudaDriverVersion_v2)                        \
        X(gna_nvmlDeviceGetCount_v2_fn, nvmlDeviceGetCount)                                                \
        X(gna_nvmlDeviceGetCount_v2_fn, nvmlDeviceGetCount_v2)                                             \
        X(gna_nvmlDeviceGetHandleByIndex_v2_fn, nvmlDeviceGetHandleByIndex_v2)                             \
        X(gna_nvmlDeviceGetHandleByPciBusId_v2_fn, nvmlDeviceGetHandleByPciBusId_v2)                       \
        X(gna_nvmlDeviceGetName_fn, nvmlDeviceGetName)                                                     \
        X(gna_nvmlDeviceGetUUID_fn, nvmlDeviceGetUUID)                                                     \
        X(gna_nvmlDeviceGetPciInfo_v3_fn, nvmlDeviceGetPciInfo_v3)                                         \
        X(gna_nvmlDeviceGetMemoryInfo_fn, nvmlDeviceGetMemoryInfo)                                         \
        X(gna_nvmlDeviceGetCudaComputeCapability_fn, nvmlDeviceGetCudaComputeCapability)                   \
        X(gna_nvmlDeviceGetMinorNumber_fn, nvmlDeviceGetMinorNumber)                                       \
        X(gna_nvmlDeviceGetGpuFabricInfo_fn, nvmlDeviceGetGpuFabricInfo)                                   \
        X(gna_nvmlDeviceGetNvLinkState_fn, nvmlDeviceGetNvLinkState)                                       \
        X(gna_nvmlDeviceGetNvLinkRemotePciInfo_v2_fn, nvmlDeviceGetNvLinkRemotePciInfo_v2)                 \
        X(gna_nvmlDeviceGetComputeRunningProcesses_v3_fn, nvmlDeviceGetComputeRunningProcesses_v3)         \
        X(gna_nvmlDeviceGetMigMode_fn, nvmlDeviceGetMigMode)                                               \
        X(gna_nvmlDeviceSetMigMode_fn, nvmlDeviceSetMigMode)                                               \
        X(gna_nvmlDeviceGetGpuInstanceProfileInfo_fn, nvmlDeviceGetGpuInstanceProfileInfo)                 \
        X(gna_nvmlDeviceGetGpuInstanceProfileInfoV_fn, nvmlDeviceGetGpuInstanceProfileInfoV)               \
        X(gna_nvmlDeviceGetGpuInstancePossiblePlacements_v2_fn, nvmlDeviceGetGpuInstancePossiblePlacements_v2) \
        X(gna_nvmlDeviceGetGpuInstances_fn, nvmlDeviceGetGpuInstances)                                     \
        X(gna_nvmlDeviceGetGpuInstanceById_fn, nvmlDeviceGetGpuInstanceById)                               \
        X(gna_nvmlDeviceCreateGpuInstanceWithPlacement_fn, nvmlDeviceCreateGpuInstanceWithPlacement)       \
        X(create_gi_fn, nvmlDeviceCreateGpuInstance)                                                       \
        X(gna_nvmlGpuInstanceDestroy_fn, nvmlGpuInstanceDestroy)                                           \
        X(gna_nvmlGpuInstanceGetInfo_fn, nvmlGpuInstanceGetInfo)                                           \
        X(gna_nvmlGpuInstanceGetComputeInstanceProfileInfo_fn, nvmlGpuInstanceGetComputeInstanceProfileInfo) \
        X(gna_nvmlGpuInstanceGetComputeInstanceProfileInfoV_fn, nvmlGpuInstanceGetComputeInstanceProfileInfoV) \
        X(gna_nvmlGpuInstanceGetComputeInstances_fn, nvmlGpuInstanceGetComputeInstances)                   \
        X(gna_nvmlGpuInstanceCreateComputeInstance_fn, nvmlGpuInstanceCreateComputeInstance)               \
        X(gna_nvmlComputeInstanceDestroy_fn, nvmlComputeInstanceDestroy)                                   \
        X(gna_nvmlComputeInstanceGetInfo_v2_fn, nvmlComputeInstanceGetInfo_v2)                             \
        X(gna_nvmlDeviceGetMaxMigDeviceCount_fn, nvmlDeviceGetMaxMigDeviceCount)                           \
        X(gna_nvmlDeviceGetMigDeviceHandleByIndex_fn, nvmlDeviceGetMigDeviceHandleByIndex)                 \
        X(gna_nvmlDeviceGetAttributes_v2_fn, nvmlDeviceGetAttributes_v2)                                   \
        X(gna_nvmlDeviceGetGpuInstanceId_fn, nvmlDeviceGetGpuInstanceId)                                   \
        X(gna_nvmlDeviceGetComputeInstanceId_fn, nvmlDeviceGetComputeInstanceId)

/* The entry points, under NVML's own names, so the tests read like NVML code. */
#define DECLARE(type, name) static type name;
SYMBOLS(DECLARE)

static void *lib;
static char *tmp;  /* per test: holds nvml.yaml and its state */
static char *desc, *state;

static const char *const fake_env[] = {
        "FAKE_NVML_DESCRIPTION", "FAKE_NVML_STATE", "FAKE_NVML_PROFILES", "FAKE_NVML_FIT", "FAKE_NVML_FAIL_INIT",
        "FAKE_NVML_FAIL", "FAKE_NVML_BUSY", "FAKE_NVML_GARBAGE", "FAKE_NVML_TRACE", "FAKE_NVML_DELAY",
        "FAKE_NVML_HANG", "FAKE_NVML_HANG_FILE", "FAKE_NVML_CRASH", NULL,
};

static int group_setup(void **st) {
        const char *path = getenv("GNA_FAKE_NVML");
        if (!path)
                fail_msg("GNA_FAKE_NVML is not set; run through meson test");
        lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!lib)
                fail_msg("cannot load the fake NVML: %s", dlerror());
#define LOAD(type, name)                                                                                   \
        name = (type) dlsym(lib, #name);                                                                   \
        if (!name)                                                                                         \
                fail_msg("the fake NVML does not export %s", #name);
        SYMBOLS(LOAD)
        /* Nothing but NVML's names is exported. */
        assert_null(dlsym(lib, "fake_node_load"));
        assert_null(dlsym(lib, "fake_ctx"));
        return 0;
}

static int group_teardown(void **st) {
        dlclose(lib);
        return 0;
}

static int setup(void **st) {
        for (const char *const *e = fake_env; *e; e++)
                unsetenv(*e);
        tmp = strdup("/tmp/gna-test-fake-nvml-XXXXXX");
        assert_non_null(tmp);
        assert_non_null(mkdtemp(tmp));
        desc = strprintf("%s/nvml.yaml", tmp);
        state = strprintf("%s/state.yaml", tmp);
        setenv("FAKE_NVML_DESCRIPTION", desc, 1);
        setenv("FAKE_NVML_STATE", state, 1);
        return 0;
}

static int teardown(void **st) {
        while (nvmlShutdown() == NVML_SUCCESS)
                ;
        _cleanup_free_ char *cmd = strprintf("rm -rf '%s'", tmp);
        assert_int_equal(system(cmd), 0);
        tmp = mfree(tmp);
        desc = mfree(desc);
        state = mfree(state);
        return 0;
}

static void write_desc(const char *yaml) {
        _cleanup_fclose_ FILE *f = fopen(desc, "we");
        assert_non_null(f);
        fputs(yaml, f);
}

/* Writes the description, forgets earlier state and initialises. */
static void start(const char *yaml) {
        while (nvmlShutdown() == NVML_SUCCESS)
                ;
        write_desc(yaml);
        unlink(state);
        assert_int_equal(nvmlInit_v2(), NVML_SUCCESS);
}

static void restart(void) {
        assert_int_equal(nvmlShutdown(), NVML_SUCCESS);
        assert_int_equal(nvmlInit_v2(), NVML_SUCCESS);
}

static nvmlDevice_t dev(unsigned i) {
        nvmlDevice_t d = NULL;
        assert_int_equal(nvmlDeviceGetHandleByIndex_v2(i, &d), NVML_SUCCESS);
        return d;
}

/* Runs fn with stderr going to a file and returns what it wrote. */
static char *capture_stderr(nvmlReturn_t (*fn)(void), nvmlReturn_t *ret) {
        _cleanup_free_ char *path = strprintf("%s/stderr", tmp);
        char *text = NULL;
        fflush(stderr);
        int saved = dup(STDERR_FILENO), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        assert_true(saved >= 0 && fd >= 0);
        dup2(fd, STDERR_FILENO);
        close(fd);
        *ret = fn();
        fflush(stderr);
        dup2(saved, STDERR_FILENO);
        close(saved);
        assert_int_equal(read_full_file(path, SIZE_MAX, &text, NULL), 0);
        return text;
}

/* Runs fake-nvml-ctl (built next to the library) with the test's environment. */
static int ctl(const char *args, char **ret_output) {
        _cleanup_free_ char *lib_path = strdup(getenv("GNA_FAKE_NVML")), *out = strprintf("%s/ctl.out", tmp);
        _cleanup_free_ char *cmd = strprintf("'%s/fake-nvml-ctl' %s >'%s' 2>&1", dirname(lib_path), args, out);
        int r = system(cmd);
        if (ret_output)
                assert_int_equal(read_full_file(out, SIZE_MAX, ret_output, NULL), 0);
        return WIFEXITED(r) ? WEXITSTATUS(r) : -1;
}

#define A100_MIG                                                                                           \
        "gpus:\n"                                                                                          \
        "  - {pci: \"0000:1b:00.0\", model: NVIDIA A100-SXM4-40GB, mig: enabled}\n"

/* Given out of PCI order on purpose: NVML numbers GPUs by bus id. */
#define MIXED                                                                                              \
        "driver_version: \"550.54.15\"\n"                                                                  \
        "cuda_version: \"12.4\"\n"                                                                         \
        "gpus:\n"                                                                                          \
        "  - {pci: \"0000:ca:00.0\", model: NVIDIA L40S}\n"                                               \
        "  - {pci: \"0000:1b:00.0\", model: NVIDIA H100 80GB HBM3, uuid: GPU-11111111-2222-3333-4444-555555555555,\n" \
        "     fabric: {cluster_uuid: 00112233-4455-6677-8899-aabbccddeeff, clique: 7},\n"                  \
        "     nvlink: [\"0000:05:00.0\", \"0000:17:00.0\"]}\n"                                              \
        "  - {pci: \"0000:17:00.0\", model: NVIDIA A100-PCIE-40GB, subsystem: 0x145f10de, nvlink: []}\n"   \
        "  - {pci: \"0000:3b:00.0\", model: NVIDIA A30, mig: enabled}\n"

static void test_init_and_errors(void **st) {
        char buf[96];
        unsigned n;

        assert_int_equal(nvmlDeviceGetCount_v2(&n), NVML_ERROR_UNINITIALIZED);
        assert_string_equal(nvmlErrorString(NVML_ERROR_DRIVER_NOT_LOADED), "Driver Not Loaded");
        assert_string_equal(nvmlErrorString(NVML_ERROR_INSUFFICIENT_RESOURCES),
                            "Ran out of critical resources, other than memory");
        assert_string_equal(nvmlErrorString((nvmlReturn_t) 12345), "Unknown Error");

        /* No description: like a host without the driver, and says what to set. */
        unsetenv("FAKE_NVML_DESCRIPTION");
        nvmlReturn_t r;
        _cleanup_free_ char *msg = capture_stderr(nvmlInit_v2, &r);
        assert_int_equal(r, NVML_ERROR_DRIVER_NOT_LOADED);
        assert_non_null(strstr(msg, "FAKE_NVML_DESCRIPTION is not set"));
        setenv("FAKE_NVML_DESCRIPTION", desc, 1);

        write_desc(MIXED);
        setenv("FAKE_NVML_FAIL_INIT", "9", 1);
        assert_int_equal(nvmlInit_v2(), NVML_ERROR_DRIVER_NOT_LOADED);
        setenv("FAKE_NVML_FAIL_INIT", "NO_PERMISSION", 1);
        assert_int_equal(nvmlInit(), NVML_ERROR_NO_PERMISSION);
        unsetenv("FAKE_NVML_FAIL_INIT");

        /* Init is counted like NVML's: two inits need two shutdowns. */
        assert_int_equal(nvmlInit_v2(), NVML_SUCCESS);
        assert_int_equal(nvmlInit(), NVML_SUCCESS);
        assert_int_equal(nvmlShutdown(), NVML_SUCCESS);
        assert_int_equal(nvmlDeviceGetCount_v2(&n), NVML_SUCCESS);
        assert_int_equal(nvmlShutdown(), NVML_SUCCESS);
        assert_int_equal(nvmlDeviceGetCount_v2(&n), NVML_ERROR_UNINITIALIZED);
        assert_int_equal(nvmlShutdown(), NVML_ERROR_UNINITIALIZED);

        assert_int_equal(nvmlInit_v2(), NVML_SUCCESS);
        assert_int_equal(nvmlSystemGetDriverVersion(buf, sizeof buf), NVML_SUCCESS);
        assert_string_equal(buf, "550.54.15");
        assert_int_equal(nvmlSystemGetDriverVersion(buf, 5), NVML_ERROR_INSUFFICIENT_SIZE);
        assert_int_equal(nvmlSystemGetNVMLVersion(buf, sizeof buf), NVML_SUCCESS);
        assert_string_equal(buf, "12.550.54.15");
        int cuda;
        assert_int_equal(nvmlSystemGetCudaDriverVersion_v2(&cuda), NVML_SUCCESS);
        assert_int_equal(cuda, 12040);
}

static void test_bad_descriptions(void **st) {
        static const struct {
                const char *yaml, *message;
        } cases[] = {
                { "gpus:\n  - {pci: \"0000:01:00.0\", model: NVIDIA H100}\n",
                  "model 'NVIDIA H100' is not in the model table" },
                { "gpus:\n  - {pci: \"1:2\", model: NVIDIA L40S}\n", "'1:2' is not a PCI address" },
                { "gpus:\n  - {pci: \"0000:01:00.0\", model: NVIDIA L40S, mig: enabled}\n",
                  "NVIDIA L40S is not MIG-capable; remove 'mig'" },
                { "gpus:\n  - {pci: \"0000:01:00.0\", model: NVIDIA A30, mig: enabled, instances: [{profile: 1g.5gb}]}\n",
                  "NVIDIA A30 has no GPU instance profile '1g.5gb'; its profiles are: 4g.24gb (id 0)" },
                { "gpus:\n  - {pci: \"0000:01:00.0\", model: NVIDIA A30, mig: enabled,\n"
                  "     instances: [{profile: 2g.12gb}, {profile: 2g.12gb}, {profile: 2g.12gb}]}\n",
                  "initial instance 3 (2g.12gb) cannot be created: no room left" },
                { "gpus:\n  - {pci: \"0000:01:00.0\", model: NVIDIA A30, mig: enabled,\n"
                  "     instances: [{profile: 2g.12gb, compute: [3c]}]}\n",
                  "has no compute instance profile '3c'" },
                { "gpu:\n  - {}\n", "unknown key 'gpu' in the node description" },
                { "gpus: [\n", "not valid YAML" },
        };
        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                nvmlReturn_t r;
                write_desc(cases[i].yaml);
                _cleanup_free_ char *msg = capture_stderr(nvmlInit_v2, &r);
                assert_int_equal(r, NVML_ERROR_UNKNOWN);
                if (!strstr(msg, cases[i].message) || !strstr(msg, desc))
                        fail_msg("case %zu: expected '%s' naming %s, got: %s", i, cases[i].message, desc, msg);
        }
}

static void test_devices(void **st) {
        char buf[96];
        unsigned n, minor;
        nvmlDevice_t d;
        nvmlPciInfo_t pci;
        nvmlMemory_t mem;
        int major, minor_cc;

        start(MIXED);
        assert_int_equal(nvmlDeviceGetCount(&n), NVML_SUCCESS);
        assert_int_equal(n, 4);
        static const char *const names[] = { "NVIDIA A100-PCIE-40GB", "NVIDIA H100 80GB HBM3", "NVIDIA A30",
                                             "NVIDIA L40S" };
        for (unsigned i = 0; i < 4; i++) {
                assert_int_equal(nvmlDeviceGetName(dev(i), buf, sizeof buf), NVML_SUCCESS);
                assert_string_equal(buf, names[i]);
                assert_int_equal(nvmlDeviceGetMinorNumber(dev(i), &minor), NVML_SUCCESS);
                assert_int_equal(minor, i);
        }
        assert_int_equal(nvmlDeviceGetHandleByIndex_v2(4, &d), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceGetName(dev(0), buf, 4), NVML_ERROR_INSUFFICIENT_SIZE);

        /* The same handle every time, and by bus id in any spelling. */
        assert_ptr_equal(dev(1), dev(1));
        assert_int_equal(nvmlDeviceGetHandleByPciBusId_v2("00000000:1B:00.0", &d), NVML_SUCCESS);
        assert_ptr_equal(d, dev(1));
        assert_int_equal(nvmlDeviceGetHandleByPciBusId_v2("0000:1b:00.0", &d), NVML_SUCCESS);
        assert_ptr_equal(d, dev(1));
        assert_int_equal(nvmlDeviceGetHandleByPciBusId_v2("0000:1c:00.0", &d), NVML_ERROR_NOT_FOUND);
        assert_int_equal(nvmlDeviceGetHandleByPciBusId_v2("bogus", &d), NVML_ERROR_INVALID_ARGUMENT);

        assert_int_equal(nvmlDeviceGetPciInfo_v3(dev(0), &pci), NVML_SUCCESS);
        assert_string_equal(pci.busId, "00000000:17:00.0");
        assert_string_equal(pci.busIdLegacy, "0000:17:00.0");
        assert_int_equal(pci.bus, 0x17);
        assert_int_equal(pci.pciDeviceId, 0x20f110de);
        assert_int_equal(pci.pciSubSystemId, 0x145f10de);

        /* UUIDs: given, or derived from the PCI address as mknode.py writes them. */
        assert_int_equal(nvmlDeviceGetUUID(dev(1), buf, sizeof buf), NVML_SUCCESS);
        assert_string_equal(buf, "GPU-11111111-2222-3333-4444-555555555555");
        assert_int_equal(nvmlDeviceGetUUID(dev(0), buf, sizeof buf), NVML_SUCCESS);
        assert_string_equal(buf, "GPU-00001700-0000-4000-8000-20f100000000");

        assert_int_equal(nvmlDeviceGetMemoryInfo(dev(1), &mem), NVML_SUCCESS);
        assert_int_equal(mem.total, UINT64_C(81559) << 20);
        assert_int_equal(mem.free + mem.used, mem.total);
        assert_int_equal(nvmlDeviceGetCudaComputeCapability(dev(3), &major, &minor_cc), NVML_SUCCESS);
        assert_int_equal(major * 10 + minor_cc, 89);

        nvmlGpuFabricInfo_t fab;
        assert_int_equal(nvmlDeviceGetGpuFabricInfo(dev(1), &fab), NVML_SUCCESS);
        assert_int_equal(fab.state, NVML_GPU_FABRIC_STATE_COMPLETED);
        assert_int_equal(fab.cliqueId, 7);
        assert_int_equal(fab.clusterUuid[0], 0x00);
        assert_int_equal(fab.clusterUuid[15], 0xff);
        assert_int_equal(nvmlDeviceGetGpuFabricInfo(dev(0), &fab), NVML_ERROR_NOT_SUPPORTED);

        /* NVLink: the H100's two listed links are up, to an NVSwitch and to the A100; the rest are down up
         * to NVML_NVLINK_MAX_LINKS; "nvlink: []" is NVLink hardware with nothing up; the L40S has none. */
        nvmlEnableState_t on;
        assert_int_equal(nvmlDeviceGetNvLinkState(dev(1), 0, &on), NVML_SUCCESS);
        assert_int_equal(on, NVML_FEATURE_ENABLED);
        assert_int_equal(nvmlDeviceGetNvLinkState(dev(1), 2, &on), NVML_SUCCESS);
        assert_int_equal(on, NVML_FEATURE_DISABLED);
        assert_int_equal(nvmlDeviceGetNvLinkState(dev(1), NVML_NVLINK_MAX_LINKS, &on), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceGetNvLinkRemotePciInfo_v2(dev(1), 1, &pci), NVML_SUCCESS);
        assert_string_equal(pci.busId, "00000000:17:00.0");
        assert_int_equal(pci.bus, 0x17);
        assert_int_equal(nvmlDeviceGetNvLinkRemotePciInfo_v2(dev(1), 0, &pci), NVML_SUCCESS);
        assert_string_equal(pci.busId, "00000000:05:00.0");
        assert_int_equal(nvmlDeviceGetNvLinkRemotePciInfo_v2(dev(1), 2, &pci), NVML_ERROR_NOT_FOUND);
        assert_int_equal(nvmlDeviceGetNvLinkState(dev(0), 0, &on), NVML_SUCCESS);
        assert_int_equal(on, NVML_FEATURE_DISABLED);
        assert_int_equal(nvmlDeviceGetNvLinkState(dev(3), 0, &on), NVML_ERROR_NOT_SUPPORTED);
        assert_int_equal(nvmlDeviceGetNvLinkRemotePciInfo_v2(dev(3), 0, &pci), NVML_ERROR_NOT_SUPPORTED);

        /* Non-MIG models answer NOT_SUPPORTED to everything MIG. */
        unsigned cur, pend;
        nvmlGpuInstanceProfileInfo_t pi;
        assert_int_equal(nvmlDeviceGetMigMode(dev(3), &cur, &pend), NVML_ERROR_NOT_SUPPORTED);
        assert_int_equal(nvmlDeviceGetGpuInstanceProfileInfo(dev(3), 0, &pi), NVML_ERROR_NOT_SUPPORTED);
        assert_int_equal(nvmlDeviceGetMaxMigDeviceCount(dev(3), &n), NVML_ERROR_NOT_SUPPORTED);
}

/* NULL out-parameters and handles that are not ours: INVALID_ARGUMENT, never a crash. */
static void test_null_and_foreign_handles(void **st) {
        nvmlDevice_t bogus = (nvmlDevice_t) (uintptr_t) 0x1234, d;
        nvmlGpuInstance_t bogus_gi = (nvmlGpuInstance_t) (uintptr_t) 0x5678;
        nvmlComputeInstance_t bogus_ci = (nvmlComputeInstance_t) (uintptr_t) 0x9abc;
        nvmlReturn_t act;
        unsigned u;
        char buf[64];

        start(A100_MIG);
        d = dev(0);
        assert_int_equal(nvmlSystemGetDriverVersion(NULL, 80), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlSystemGetCudaDriverVersion_v2(NULL), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceGetCount_v2(NULL), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceGetHandleByIndex_v2(0, NULL), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceGetHandleByPciBusId_v2(NULL, &d), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceGetName(d, NULL, 64), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceGetName(NULL, buf, 64), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceGetName(bogus, buf, 64), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceGetUUID(bogus, buf, 64), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceGetPciInfo_v3(d, NULL), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceGetMemoryInfo(d, NULL), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceGetCudaComputeCapability(d, NULL, NULL), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceGetMinorNumber(bogus, &u), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceGetGpuFabricInfo(d, NULL), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceGetComputeRunningProcesses_v3(d, NULL, NULL), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceGetMigMode(d, NULL, &u), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceSetMigMode(d, 1, NULL), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceSetMigMode(d, 2, &act), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceGetGpuInstanceProfileInfo(d, 0, NULL), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceGetGpuInstanceProfileInfoV(d, 0, NULL), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceGetGpuInstancePossiblePlacements_v2(d, 19, NULL, NULL), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceGetGpuInstances(d, 19, NULL, &u), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceGetGpuInstanceById(d, 0, NULL), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceCreateGpuInstanceWithPlacement(d, 19, NULL, &bogus_gi), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceCreateGpuInstance(d, 19, NULL), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceCreateGpuInstance(bogus, 19, &bogus_gi), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlGpuInstanceDestroy(NULL), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlGpuInstanceDestroy(bogus_gi), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlGpuInstanceGetInfo(bogus_gi, NULL), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlGpuInstanceGetComputeInstanceProfileInfo(bogus_gi, 0, 0, NULL), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlGpuInstanceGetComputeInstances(bogus_gi, 0, NULL, NULL), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlGpuInstanceCreateComputeInstance(bogus_gi, 0, NULL), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlComputeInstanceDestroy(bogus_ci), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlComputeInstanceGetInfo_v2(bogus_ci, NULL), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceGetMaxMigDeviceCount(d, NULL), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceGetMigDeviceHandleByIndex(d, 0, NULL), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceGetAttributes_v2(bogus, NULL), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceGetGpuInstanceId(d, NULL), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceGetComputeInstanceId(bogus, &u), NVML_ERROR_INVALID_ARGUMENT);
}

static void test_profiles_index_is_not_id(void **st) {
        /* A100/H100: index → id as real drivers report them. */
        static const unsigned index_to_id[][2] = { { 0, 19 }, { 7, 20 }, { 9, 15 }, { 1, 14 }, { 2, 9 }, { 3, 5 }, { 4, 0 } };
        nvmlGpuInstanceProfileInfo_t pi;
        nvmlGpuInstanceProfileInfo_v2_t v2 = { .version = nvmlGpuInstanceProfileInfo_v2 };
        nvmlGpuInstancePlacement_t pl[8];
        unsigned n;

        start(MIXED);
        nvmlDevice_t h100 = dev(1), a30 = dev(2);
        for (size_t i = 0; i < ELEMENTSOF(index_to_id); i++) {
                assert_int_equal(nvmlDeviceGetGpuInstanceProfileInfo(h100, index_to_id[i][0], &pi), NVML_SUCCESS);
                assert_int_equal(pi.id, index_to_id[i][1]);
        }
        assert_int_equal(nvmlDeviceGetGpuInstanceProfileInfo(h100, NVML_GPU_INSTANCE_PROFILE_8_SLICE, &pi),
                         NVML_ERROR_NOT_SUPPORTED);
        assert_int_equal(nvmlDeviceGetGpuInstanceProfileInfo(h100, NVML_GPU_INSTANCE_PROFILE_COUNT, &pi),
                         NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceGetGpuInstanceProfileInfo(h100, 2, &pi), NVML_SUCCESS);
        assert_int_equal(pi.sliceCount, 3);
        assert_int_equal(pi.instanceCount, 2);
        assert_int_equal(pi.memorySizeMB, 40448);
        assert_int_equal(pi.multiprocessorCount, 48);
        assert_int_equal(nvmlDeviceGetGpuInstanceProfileInfoV(h100, 7, &v2), NVML_SUCCESS);
        assert_string_equal(v2.name, "MIG 1g.10gb+me");
        assert_int_equal(v2.id, 20);
        v2.version = 1;
        assert_int_equal(nvmlDeviceGetGpuInstanceProfileInfoV(h100, 7, &v2), NVML_ERROR_ARGUMENT_VERSION_MISMATCH);

        /* A30: its own 4-slice table, index 8 = 2g.12gb+me. */
        v2.version = nvmlGpuInstanceProfileInfo_v2;
        assert_int_equal(nvmlDeviceGetGpuInstanceProfileInfoV(a30, 8, &v2), NVML_SUCCESS);
        assert_string_equal(v2.name, "MIG 2g.12gb+me");
        assert_int_equal(nvmlDeviceGetGpuInstanceProfileInfo(a30, 9, &pi), NVML_ERROR_NOT_SUPPORTED);

        /* Possible placements: static, counted first, too small a buffer refused. */
        assert_int_equal(nvmlDeviceGetGpuInstancePossiblePlacements_v2(h100, 19, NULL, &n), NVML_SUCCESS);
        assert_int_equal(n, 7);
        n = 2;
        assert_int_equal(nvmlDeviceGetGpuInstancePossiblePlacements_v2(h100, 19, pl, &n), NVML_ERROR_INSUFFICIENT_SIZE);
        n = 8;
        assert_int_equal(nvmlDeviceGetGpuInstancePossiblePlacements_v2(h100, 9, pl, &n), NVML_SUCCESS);
        assert_int_equal(n, 2);
        assert_int_equal(pl[1].start, 4);
        assert_int_equal(pl[1].size, 4);
        assert_int_equal(nvmlDeviceGetGpuInstancePossiblePlacements_v2(h100, 2, pl, &n), NVML_ERROR_INVALID_ARGUMENT);
}

static unsigned gi_id(nvmlGpuInstance_t gi) {
        nvmlGpuInstanceInfo_t info;
        assert_int_equal(nvmlGpuInstanceGetInfo(gi, &info), NVML_SUCCESS);
        return info.id;
}

/* Creates the profile ids in order without placements; writes the GI ids; returns the first failure. */
static nvmlReturn_t create_sequence(nvmlDevice_t d, const unsigned *ids, size_t n, unsigned *ret_gi) {
        for (size_t i = 0; i < n; i++) {
                nvmlGpuInstance_t gi;
                nvmlReturn_t r = nvmlDeviceCreateGpuInstance(d, ids[i], &gi);
                if (r != NVML_SUCCESS)
                        return r;
                ret_gi[i] = gi_id(gi);
        }
        return NVML_SUCCESS;
}

#define SEQ(...) ((const unsigned[]) { __VA_ARGS__ }), ELEMENTSOF(((const unsigned[]) { __VA_ARGS__ }))

static void check_sequence(const char *yaml, const unsigned *ids, size_t n, const unsigned *want, size_t n_want,
                           nvmlReturn_t last) {
        unsigned got[16] = {};
        start(yaml);
        assert_int_equal(create_sequence(dev(0), ids, n, got), last);
        for (size_t i = 0; i < n_want; i++)
                if (got[i] != want[i])
                        fail_msg("create #%zu (profile %u): GI id %u, expected %u", i + 1, ids[i], got[i], want[i]);
}

/* The NVIDIA MIG user guide's examples on an empty A100-40GB. */
static void test_best_fit_worked_sequences(void **st) {
        check_sequence(A100_MIG, SEQ(9, 9), SEQ(2, 1), NVML_SUCCESS);
        check_sequence(A100_MIG, SEQ(9, 19, 14, 19), SEQ(2, 7, 4, 8), NVML_SUCCESS);
        check_sequence(A100_MIG, SEQ(14, 19, 19, 19, 19, 19), SEQ(5, 13, 7, 8, 9, 10), NVML_SUCCESS);
        check_sequence(A100_MIG, SEQ(19, 19, 14, 9), SEQ(13, 11, 3), NVML_ERROR_INSUFFICIENT_RESOURCES);
        /* The 4-slice A30: whole 0, halves 1-2, quarters 3-6. */
        const char *a30 = "gpus:\n  - {pci: \"0000:3b:00.0\", model: NVIDIA A30, mig: enabled}\n";
        check_sequence(a30, SEQ(14, 14, 5, 14), SEQ(3, 4, 2), NVML_ERROR_INSUFFICIENT_RESOURCES);
        check_sequence(a30, SEQ(0), SEQ(0), NVML_SUCCESS);
        /* First and last fit, to shake out order dependence. */
        setenv("FAKE_NVML_FIT", "first", 1);
        check_sequence(A100_MIG, SEQ(9, 9), SEQ(1, 2), NVML_SUCCESS);
        setenv("FAKE_NVML_FIT", "last", 1);
        check_sequence(A100_MIG, SEQ(19, 14), SEQ(13, 5), NVML_SUCCESS);
}

static void test_placement_rules(void **st) {
        nvmlGpuInstance_t gi, list[8];
        nvmlGpuInstancePlacement_t pl = { .start = 1, .size = 4 };
        unsigned n;

        start(A100_MIG);
        nvmlDevice_t d = dev(0);
        /* 3g.20gb only at 0 and 4, with its own size. */
        assert_int_equal(nvmlDeviceCreateGpuInstanceWithPlacement(d, 9, &pl, &gi), NVML_ERROR_INVALID_ARGUMENT);
        pl = (nvmlGpuInstancePlacement_t) { .start = 4, .size = 2 };
        assert_int_equal(nvmlDeviceCreateGpuInstanceWithPlacement(d, 9, &pl, &gi), NVML_ERROR_INVALID_ARGUMENT);
        pl.size = 4;
        assert_int_equal(nvmlDeviceCreateGpuInstanceWithPlacement(d, 9, &pl, &gi), NVML_SUCCESS);
        assert_int_equal(gi_id(gi), 2);
        /* Overlap. */
        pl = (nvmlGpuInstancePlacement_t) { .start = 6, .size = 1 };
        assert_int_equal(nvmlDeviceCreateGpuInstanceWithPlacement(d, 19, &pl, &gi), NVML_ERROR_INSUFFICIENT_RESOURCES);
        /* Per-profile limit: one 1g.5gb+me. */
        pl.start = 0;
        assert_int_equal(nvmlDeviceCreateGpuInstanceWithPlacement(d, 20, &pl, &gi), NVML_SUCCESS);
        pl.start = 1;
        assert_int_equal(nvmlDeviceCreateGpuInstanceWithPlacement(d, 20, &pl, &gi), NVML_ERROR_INSUFFICIENT_RESOURCES);
        assert_int_equal(nvmlDeviceCreateGpuInstanceWithPlacement(d, 19, &pl, &gi), NVML_SUCCESS);
        assert_int_equal(gi_id(gi), 8);
        /* Unknown profile id. */
        assert_int_equal(nvmlDeviceCreateGpuInstance(d, 2, &gi), NVML_ERROR_INVALID_ARGUMENT);

        assert_int_equal(nvmlDeviceGetGpuInstances(d, 19, list, &n), NVML_SUCCESS);
        assert_int_equal(n, 1);
        assert_int_equal(gi_id(list[0]), 8);
        assert_int_equal(nvmlDeviceGetGpuInstances(d, 5, list, &n), NVML_SUCCESS);
        assert_int_equal(n, 0);
        assert_int_equal(nvmlDeviceGetGpuInstanceById(d, 2, &gi), NVML_SUCCESS);
        assert_int_equal(gi_id(gi), 2);
        assert_int_equal(nvmlDeviceGetGpuInstanceById(d, 1, &gi), NVML_ERROR_NOT_FOUND);

        /* Destroy frees the slices; the handle is dead afterwards. */
        assert_int_equal(nvmlDeviceGetGpuInstanceById(d, 2, &gi), NVML_SUCCESS);
        assert_int_equal(nvmlGpuInstanceDestroy(gi), NVML_SUCCESS);
        assert_int_equal(nvmlGpuInstanceDestroy(gi), NVML_ERROR_INVALID_ARGUMENT);
        pl = (nvmlGpuInstancePlacement_t) { .start = 4, .size = 4 };
        assert_int_equal(nvmlDeviceCreateGpuInstanceWithPlacement(d, 9, &pl, &gi), NVML_SUCCESS);
}

static void test_compute_instances(void **st) {
        nvmlGpuInstance_t gi, gi4;
        nvmlComputeInstance_t ci[4], list[8];
        nvmlComputeInstanceProfileInfo_t cp;
        nvmlComputeInstanceProfileInfo_v2_t cp2 = { .version = nvmlComputeInstanceProfileInfo_v2 };
        nvmlComputeInstanceInfo_t info;
        nvmlDeviceAttributes_t attr;
        nvmlDevice_t mig;
        unsigned n, id;
        char name[96], uuid[96], uuid2[96];

        start(A100_MIG);
        nvmlDevice_t d = dev(0);
        nvmlGpuInstancePlacement_t pl = { .start = 4, .size = 4 };
        assert_int_equal(nvmlDeviceCreateGpuInstanceWithPlacement(d, 9, &pl, &gi), NVML_SUCCESS);
        pl.start = 0;
        assert_int_equal(nvmlDeviceCreateGpuInstanceWithPlacement(d, 5, &pl, &gi4), NVML_SUCCESS);

        /* CI profiles of a 3g GI: 1c x3, 2c x1, 3c x1; no 4c; a 4g GI has no 3c. */
        assert_int_equal(nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 0, 0, &cp), NVML_SUCCESS);
        assert_int_equal(cp.instanceCount, 3);
        assert_int_equal(cp.multiprocessorCount, 14);
        assert_int_equal(cp.sharedCopyEngineCount, 3);
        assert_int_equal(nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 3, 0, &cp), NVML_ERROR_NOT_SUPPORTED);
        assert_int_equal(nvmlGpuInstanceGetComputeInstanceProfileInfo(gi4, 2, 0, &cp), NVML_ERROR_NOT_SUPPORTED);
        assert_int_equal(nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, NVML_COMPUTE_INSTANCE_PROFILE_COUNT, 0, &cp),
                         NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlGpuInstanceGetComputeInstanceProfileInfoV(gi, 1, 0, &cp2), NVML_SUCCESS);
        assert_string_equal(cp2.name, "MIG 2c.3g.20gb");
        assert_int_equal(cp2.instanceCount, 1);

        for (unsigned i = 0; i < 3; i++) {
                assert_int_equal(nvmlGpuInstanceCreateComputeInstance(gi, 0, &ci[i]), NVML_SUCCESS);
                assert_int_equal(nvmlComputeInstanceGetInfo_v2(ci[i], &info), NVML_SUCCESS);
                assert_int_equal(info.id, i);
                assert_int_equal(info.placement.start, i);
                assert_ptr_equal(info.gpuInstance, gi);
                assert_ptr_equal(info.device, d);
        }
        /* The GI is full: neither another 1c nor a 2c fits. */
        assert_int_equal(nvmlGpuInstanceCreateComputeInstance(gi, 0, &ci[3]), NVML_ERROR_INSUFFICIENT_RESOURCES);
        assert_int_equal(nvmlGpuInstanceCreateComputeInstance(gi, 1, &ci[3]), NVML_ERROR_INSUFFICIENT_RESOURCES);
        assert_int_equal(nvmlGpuInstanceCreateComputeInstance(gi, 3, &ci[3]), NVML_ERROR_NOT_SUPPORTED);
        assert_int_equal(nvmlGpuInstanceGetComputeInstances(gi, 0, list, &n), NVML_SUCCESS);
        assert_int_equal(n, 3);
        /* A GI with CIs cannot go. */
        assert_int_equal(nvmlGpuInstanceDestroy(gi), NVML_ERROR_IN_USE);
        assert_int_equal(nvmlGpuInstanceCreateComputeInstance(gi4, 4, &ci[3]), NVML_ERROR_NOT_SUPPORTED);
        assert_int_equal(nvmlGpuInstanceCreateComputeInstance(gi4, 3, &ci[3]), NVML_SUCCESS);

        /* MIG devices in (GI id, CI id) order: GI 1 (4g, CI 0), then GI 2's three 1c CIs. */
        assert_int_equal(nvmlDeviceGetMaxMigDeviceCount(d, &n), NVML_SUCCESS);
        assert_int_equal(n, 7);
        assert_int_equal(nvmlDeviceGetMigDeviceHandleByIndex(d, 0, &mig), NVML_SUCCESS);
        assert_int_equal(nvmlDeviceGetGpuInstanceId(mig, &id), NVML_SUCCESS);
        assert_int_equal(id, 1);
        assert_int_equal(nvmlDeviceGetName(mig, name, sizeof name), NVML_SUCCESS);
        assert_string_equal(name, "NVIDIA A100-SXM4-40GB MIG 4g.20gb");
        assert_int_equal(nvmlDeviceGetMigDeviceHandleByIndex(d, 2, &mig), NVML_SUCCESS);
        assert_int_equal(nvmlDeviceGetGpuInstanceId(mig, &id), NVML_SUCCESS);
        assert_int_equal(id, 2);
        assert_int_equal(nvmlDeviceGetComputeInstanceId(mig, &id), NVML_SUCCESS);
        assert_int_equal(id, 1);
        assert_int_equal(nvmlDeviceGetName(mig, name, sizeof name), NVML_SUCCESS);
        assert_string_equal(name, "NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb");
        assert_int_equal(nvmlDeviceGetAttributes_v2(mig, &attr), NVML_SUCCESS);
        assert_int_equal(attr.memorySizeMB, 19968);
        assert_int_equal(attr.multiprocessorCount, 14);
        assert_int_equal(attr.gpuInstanceSliceCount, 3);
        assert_int_equal(attr.computeInstanceSliceCount, 1);
        assert_int_equal(attr.sharedCopyEngineCount, 3);
        assert_int_equal(attr.sharedDecoderCount, 2);
        assert_int_equal(nvmlDeviceGetMigDeviceHandleByIndex(d, 4, &mig), NVML_ERROR_NOT_FOUND);
        assert_int_equal(nvmlDeviceGetMigDeviceHandleByIndex(d, 7, &mig), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlDeviceGetAttributes_v2(d, &attr), NVML_ERROR_NOT_SUPPORTED);
        assert_int_equal(nvmlDeviceGetGpuInstanceId(d, &id), NVML_ERROR_NOT_SUPPORTED);

        /* The lowest free CI id is reused, and a re-created instance gets a new MIG UUID. */
        assert_int_equal(nvmlDeviceGetMigDeviceHandleByIndex(d, 2, &mig), NVML_SUCCESS);
        assert_int_equal(nvmlDeviceGetUUID(mig, uuid, sizeof uuid), NVML_SUCCESS);
        assert_true(startswith(uuid, "MIG-"));
        assert_int_equal(nvmlComputeInstanceDestroy(ci[1]), NVML_SUCCESS);
        assert_int_equal(nvmlDeviceGetUUID(mig, uuid2, sizeof uuid2), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlGpuInstanceCreateComputeInstance(gi, 0, &ci[1]), NVML_SUCCESS);
        assert_int_equal(nvmlComputeInstanceGetInfo_v2(ci[1], &info), NVML_SUCCESS);
        assert_int_equal(info.id, 1);
        assert_int_equal(nvmlDeviceGetUUID(mig, uuid2, sizeof uuid2), NVML_SUCCESS);
        assert_string_not_equal(uuid, uuid2);
}

static void test_mig_mode(void **st) {
        nvmlReturn_t act;
        unsigned cur, pend;
        nvmlGpuInstance_t gi;
        _cleanup_free_ char *out = NULL;

        start(MIXED);
        nvmlDevice_t a100 = dev(0), h100 = dev(1);
        /* A100 needs a reset: the change stays pending. */
        assert_int_equal(nvmlDeviceSetMigMode(a100, NVML_DEVICE_MIG_ENABLE, &act), NVML_SUCCESS);
        assert_int_equal(act, NVML_ERROR_RESET_REQUIRED);
        assert_int_equal(nvmlDeviceGetMigMode(a100, &cur, &pend), NVML_SUCCESS);
        assert_int_equal(cur, NVML_DEVICE_MIG_DISABLE);
        assert_int_equal(pend, NVML_DEVICE_MIG_ENABLE);
        assert_int_equal(nvmlDeviceCreateGpuInstance(a100, 19, &gi), NVML_ERROR_NOT_SUPPORTED);

        /* Another process resets the GPU; this process sees it on its next call. */
        assert_int_equal(ctl("-r -i 00000000:17:00.0", &out), 0);
        assert_string_equal(out, "GPU 00000000:17:00.0 was successfully reset.\n");
        assert_int_equal(nvmlDeviceGetMigMode(a100, &cur, &pend), NVML_SUCCESS);
        assert_int_equal(cur, NVML_DEVICE_MIG_ENABLE);
        assert_int_equal(pend, NVML_DEVICE_MIG_ENABLE);
        assert_int_equal(nvmlDeviceCreateGpuInstance(a100, 19, &gi), NVML_SUCCESS);
        /* Not while GPU instances exist. */
        assert_int_equal(nvmlDeviceSetMigMode(a100, NVML_DEVICE_MIG_DISABLE, &act), NVML_ERROR_IN_USE);
        assert_int_equal(nvmlGpuInstanceDestroy(gi), NVML_SUCCESS);
        assert_int_equal(nvmlDeviceSetMigMode(a100, NVML_DEVICE_MIG_DISABLE, &act), NVML_SUCCESS);
        assert_int_equal(act, NVML_ERROR_RESET_REQUIRED);
        /* Changing one's mind before the reset: nothing pending any more. */
        assert_int_equal(nvmlDeviceSetMigMode(a100, NVML_DEVICE_MIG_ENABLE, &act), NVML_SUCCESS);
        assert_int_equal(act, NVML_SUCCESS);

        /* H100 switches at once. */
        assert_int_equal(nvmlDeviceSetMigMode(h100, NVML_DEVICE_MIG_ENABLE, &act), NVML_SUCCESS);
        assert_int_equal(act, NVML_SUCCESS);
        assert_int_equal(nvmlDeviceGetMigMode(h100, &cur, &pend), NVML_SUCCESS);
        assert_int_equal(cur, NVML_DEVICE_MIG_ENABLE);
        assert_int_equal(nvmlDeviceSetMigMode(dev(3), NVML_DEVICE_MIG_ENABLE, &act), NVML_ERROR_NOT_SUPPORTED);

        out = mfree(out);
        assert_int_equal(ctl("show", &out), 0);
        assert_non_null(strstr(out, "GPU 1 0000:1b:00.0 NVIDIA H100 80GB HBM3 (GPU-11111111-2222-3333-4444-555555555555): "
                                    "MIG current enabled, pending enabled\n"));
        out = mfree(out);
        assert_int_equal(ctl("reset 7", &out), 1);
        assert_non_null(strstr(out, "no GPU '7'"));
}

static void test_busy(void **st) {
        nvmlReturn_t act;
        nvmlProcessInfo_t procs[4];
        nvmlGpuInstance_t gi;
        unsigned n = 0;
        _cleanup_free_ char *out = NULL;

        setenv("FAKE_NVML_BUSY", "1", 1);
        start(MIXED);
        assert_int_equal(nvmlDeviceGetComputeRunningProcesses_v3(dev(1), &n, NULL), NVML_ERROR_INSUFFICIENT_SIZE);
        assert_int_equal(n, 1);
        assert_int_equal(nvmlDeviceGetComputeRunningProcesses_v3(dev(1), &n, procs), NVML_SUCCESS);
        assert_int_equal(procs[0].usedGpuMemory, UINT64_C(1) << 30);
        assert_int_equal(procs[0].gpuInstanceId, UINT32_MAX);
        n = 0;
        assert_int_equal(nvmlDeviceGetComputeRunningProcesses_v3(dev(0), &n, NULL), NVML_SUCCESS);
        assert_int_equal(n, 0);
        assert_int_equal(nvmlDeviceSetMigMode(dev(1), NVML_DEVICE_MIG_ENABLE, &act), NVML_ERROR_IN_USE);
        assert_int_equal(act, NVML_ERROR_IN_USE);
        assert_int_equal(ctl("reset 1", &out), 1);
        assert_non_null(strstr(out, "Unable to reset GPU 0000:1b:00.0: it is in use"));

        /* A busy GPU keeps its instances (the A30 is busy through the description's processes). */
        unsetenv("FAKE_NVML_BUSY");
        start("gpus:\n  - {pci: \"0000:3b:00.0\", model: NVIDIA A30, mig: enabled, instances: [{profile: 4g.24gb}],\n"
              "     processes: [{pid: 77, memory_mib: 100, gi: 0, ci: 0}]}\n");
        assert_int_equal(nvmlDeviceGetGpuInstanceById(dev(0), 0, &gi), NVML_SUCCESS);
        nvmlComputeInstance_t ci;
        assert_int_equal(nvmlGpuInstanceGetComputeInstances(gi, 3, &ci, &n), NVML_SUCCESS);
        assert_int_equal(n, 1);
        assert_int_equal(nvmlComputeInstanceDestroy(ci), NVML_ERROR_IN_USE);
        nvmlDevice_t mig;
        assert_int_equal(nvmlDeviceGetMigDeviceHandleByIndex(dev(0), 0, &mig), NVML_SUCCESS);
        n = 4;
        assert_int_equal(nvmlDeviceGetComputeRunningProcesses_v3(mig, &n, procs), NVML_SUCCESS);
        assert_int_equal(n, 1);
        assert_int_equal(procs[0].pid, 77);
}

static void test_state_survives_restart(void **st) {
        nvmlGpuInstance_t gi, gi_again;
        nvmlComputeInstance_t ci;
        nvmlDevice_t mig;
        char uuid[96], uuid_again[96];
        unsigned n;

        start(A100_MIG);
        nvmlDevice_t d = dev(0);
        assert_int_equal(nvmlDeviceCreateGpuInstance(d, 14, &gi), NVML_SUCCESS);
        assert_int_equal(nvmlGpuInstanceCreateComputeInstance(gi, 1, &ci), NVML_SUCCESS);
        assert_int_equal(nvmlDeviceGetMigDeviceHandleByIndex(d, 0, &mig), NVML_SUCCESS);
        assert_int_equal(nvmlDeviceGetUUID(mig, uuid, sizeof uuid), NVML_SUCCESS);

        restart();
        /* Same instances, same UUID, and the handles taken before still work. */
        assert_ptr_equal(dev(0), d);
        assert_int_equal(nvmlDeviceGetGpuInstanceById(d, gi_id(gi), &gi_again), NVML_SUCCESS);
        assert_ptr_equal(gi_again, gi);
        assert_int_equal(nvmlDeviceGetUUID(mig, uuid_again, sizeof uuid_again), NVML_SUCCESS);
        assert_string_equal(uuid, uuid_again);

        /* The state file is plain YAML a person can read; deleting it starts over from the description. */
        _cleanup_free_ char *text = NULL;
        assert_int_equal(read_full_file(state, SIZE_MAX, &text, NULL), 0);
        assert_non_null(strstr(text, uuid));
        assert_int_equal(unlink(state), 0);
        assert_int_equal(nvmlDeviceGetGpuInstances(d, 14, &gi_again, &n), NVML_SUCCESS);
        assert_int_equal(n, 0);
        assert_int_equal(access(state, F_OK), 0);
}

static uint64_t mono_ms(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The latency model: per-call delays, per GPU for init; a hang released by removing a file; a crash. */
static void test_latency_hang_crash(void **st) {
        _cleanup_free_ char *release = strprintf("%s/release", tmp);
        nvmlMemory_t mem;
        uint64_t t0;
        pid_t pid;
        int status;

        /* nvmlInit 100 ms per GPU (MIXED has 4), every GetMemoryInfo 50 ms. */
        setenv("FAKE_NVML_DELAY", "nvmlInit_v2:*:100/gpu,nvmlDeviceGetMemoryInfo:*:50", 1);
        t0 = mono_ms();
        start(MIXED);
        assert_true(mono_ms() - t0 >= 400);
        t0 = mono_ms();
        assert_int_equal(nvmlDeviceGetMemoryInfo(dev(1), &mem), NVML_SUCCESS);
        assert_true(mono_ms() - t0 >= 50);
        unsetenv("FAKE_NVML_DELAY");

        /* The same from the node description ("latency:"); the variable wins over it. */
        t0 = mono_ms();
        start("latency: \"nvmlInit_v2:*:150/gpu\"\n" MIXED);
        assert_true(mono_ms() - t0 >= 150 * 4);
        setenv("FAKE_NVML_DELAY", "nvmlInit_v2:*:1", 1);
        t0 = mono_ms();
        restart();
        assert_true(mono_ms() - t0 < 150 * 4);
        unsetenv("FAKE_NVML_DELAY");

        /* The second GetMemoryInfo hangs until the file is gone: removed from another process. */
        write_file_atomic(release, NULL, "", 0, 0644);
        setenv("FAKE_NVML_HANG", "nvmlDeviceGetMemoryInfo:2", 1);
        setenv("FAKE_NVML_HANG_FILE", release, 1);
        restart();
        assert_int_equal(nvmlDeviceGetMemoryInfo(dev(0), &mem), NVML_SUCCESS);
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                usleep(300 * 1000);
                unlink(release);
                _exit(0);
        }
        t0 = mono_ms();
        assert_int_equal(nvmlDeviceGetMemoryInfo(dev(1), &mem), NVML_SUCCESS);
        assert_true(mono_ms() - t0 >= 250);
        assert_int_equal(waitpid(pid, &status, 0), pid);
        unsetenv("FAKE_NVML_HANG");
        unsetenv("FAKE_NVML_HANG_FILE");

        /* A crash inside the library: SIGSEGV in that call, in a child so the test survives. */
        setenv("FAKE_NVML_CRASH", "nvmlDeviceGetMemoryInfo:1", 1);
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                signal(SIGSEGV, SIG_DFL); /* not cmocka's handler: die as the daemon's worker would */
                restart();
                (void) nvmlDeviceGetMemoryInfo(dev(0), &mem);
                _exit(0);
        }
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFSIGNALED(status));
        assert_int_equal(WTERMSIG(status), SIGSEGV);
        unsetenv("FAKE_NVML_CRASH");
}

static void test_fault_injection(void **st) {
        nvmlGpuInstance_t gi;
        nvmlGpuInstancePlacement_t pl = { .start = 0, .size = 1 };
        unsigned n;
        char buf[96];
        nvmlMemory_t mem;
        int major, minor;

        setenv("FAKE_NVML_FAIL", "nvmlDeviceCreateGpuInstanceWithPlacement:2:INSUFFICIENT_RESOURCES,"
                                 "nvmlDeviceGetCount_v2:*:999,nvmlDeviceGetName:2+:3", 1);
        start(A100_MIG);
        nvmlDevice_t d = dev(0);
        assert_int_equal(nvmlDeviceCreateGpuInstanceWithPlacement(d, 19, &pl, &gi), NVML_SUCCESS);
        pl.start = 1;
        assert_int_equal(nvmlDeviceCreateGpuInstanceWithPlacement(d, 19, &pl, &gi), NVML_ERROR_INSUFFICIENT_RESOURCES);
        assert_int_equal(nvmlDeviceGetGpuInstanceById(d, 8, &gi), NVML_ERROR_NOT_FOUND); /* nothing was created */
        assert_int_equal(nvmlDeviceCreateGpuInstanceWithPlacement(d, 19, &pl, &gi), NVML_SUCCESS);
        assert_int_equal(nvmlDeviceGetCount_v2(&n), NVML_ERROR_UNKNOWN);
        assert_int_equal(nvmlDeviceGetCount_v2(&n), NVML_ERROR_UNKNOWN);
        assert_int_equal(nvmlDeviceGetCount(&n), NVML_SUCCESS);
        assert_int_equal(nvmlDeviceGetName(d, buf, sizeof buf), NVML_SUCCESS);
        assert_int_equal(nvmlDeviceGetName(d, buf, sizeof buf), NVML_ERROR_NOT_SUPPORTED);
        assert_int_equal(nvmlDeviceGetName(d, buf, sizeof buf), NVML_ERROR_NOT_SUPPORTED);
        /* Counting starts over with the next first init. */
        restart();
        assert_int_equal(nvmlDeviceGetName(d, buf, sizeof buf), NVML_SUCCESS);

        unsetenv("FAKE_NVML_FAIL");
        setenv("FAKE_NVML_GARBAGE", "0:name,1:memory,*:cc,driver", 1);
        start(MIXED);
        assert_int_equal(nvmlDeviceGetName(dev(0), buf, sizeof buf), NVML_SUCCESS);
        assert_string_equal(buf, "");
        assert_int_equal(nvmlDeviceGetName(dev(1), buf, sizeof buf), NVML_SUCCESS);
        assert_string_equal(buf, "NVIDIA H100 80GB HBM3");
        assert_int_equal(nvmlDeviceGetMemoryInfo(dev(1), &mem), NVML_SUCCESS);
        assert_int_equal(mem.total, 0);
        assert_int_equal(nvmlDeviceGetCudaComputeCapability(dev(2), &major, &minor), NVML_SUCCESS);
        assert_int_equal(major, 0);
        assert_int_equal(nvmlSystemGetDriverVersion(buf, sizeof buf), NVML_SUCCESS);
        assert_string_equal(buf, "");

        /* A typo in a rule is said, not silently ignored. */
        unsetenv("FAKE_NVML_GARBAGE");
        setenv("FAKE_NVML_FAIL", "nvmlDeviceGetName:x:3", 1);
        while (nvmlShutdown() == NVML_SUCCESS)
                ;
        nvmlReturn_t r;
        _cleanup_free_ char *msg = capture_stderr(nvmlInit_v2, &r);
        assert_int_equal(r, NVML_SUCCESS);
        assert_non_null(strstr(msg, "FAKE_NVML_FAIL entry for nvmlDeviceGetName"));
}

static void test_trace(void **st) {
        _cleanup_free_ char *trace = strprintf("%s/trace", tmp), *text = NULL;
        nvmlDevice_t d;
        unsigned n;

        setenv("FAKE_NVML_TRACE", trace, 1);
        write_desc(A100_MIG);
        assert_int_equal(nvmlInit_v2(), NVML_SUCCESS);
        assert_int_equal(nvmlDeviceGetCount_v2(&n), NVML_SUCCESS);
        assert_int_equal(nvmlDeviceGetHandleByIndex_v2(5, &d), NVML_ERROR_INVALID_ARGUMENT);
        assert_int_equal(nvmlShutdown(), NVML_SUCCESS);
        assert_int_equal(nvmlDeviceGetCount_v2(&n), NVML_ERROR_UNINITIALIZED);
        unsetenv("FAKE_NVML_TRACE");
        assert_int_equal(read_full_file(trace, SIZE_MAX, &text, NULL), 0);
        assert_string_equal(text, "nvmlInit_v2 0\n"
                                  "nvmlDeviceGetCount_v2 0\n"
                                  "nvmlDeviceGetHandleByIndex_v2 2\n"
                                  "nvmlShutdown 0\n"
                                  "nvmlDeviceGetCount_v2 1\n");
}

/* The node descriptions mknode.py writes next to each simulated node. */
static void test_fixture_nodes(void **st) {
        static const struct {
                const char *node;
                unsigned count;
                const char *first_name;
        } nodes[] = {
                { "dgx-h100", 8, "NVIDIA H100 80GB HBM3" }, { "vfio", 1, "NVIDIA H100 80GB HBM3" },
                { "unbound", 0, NULL },                     { "mixed", 3, "NVIDIA H100 80GB HBM3" },
                { "a30", 1, "NVIDIA A30" },                 { "t4", 1, "Tesla T4" },
                { "a100-sxm", 8, "NVIDIA A100-SXM4-40GB" }, { "gen-8", 8, "NVIDIA H100 80GB HBM3" },
                { "h200", 1, "NVIDIA H200" },
        };
        const char *dir = getenv("GNA_FIXTURE_NODES");
        if (!dir)
                fail_msg("GNA_FIXTURE_NODES is not set; run through meson test");
        for (size_t i = 0; i < ELEMENTSOF(nodes); i++) {
                _cleanup_free_ char *path = strprintf("%s/%s/nvml.yaml", dir, nodes[i].node);
                unsigned n;
                char buf[96];
                setenv("FAKE_NVML_DESCRIPTION", path, 1);
                unlink(state); /* the nodes share one state file; never write into the build tree */
                assert_int_equal(nvmlInit_v2(), NVML_SUCCESS);
                assert_int_equal(nvmlDeviceGetCount_v2(&n), NVML_SUCCESS);
                if (n != nodes[i].count)
                        fail_msg("%s: %u GPUs, expected %u", nodes[i].node, n, nodes[i].count);
                if (n > 0) {
                        assert_int_equal(nvmlDeviceGetName(dev(0), buf, sizeof buf), NVML_SUCCESS);
                        assert_string_equal(buf, nodes[i].first_name);
                        /* The UUID agrees with what the node's /proc says. */
                        nvmlPciInfo_t pci;
                        _cleanup_free_ char *info = NULL, *proc = NULL;
                        assert_int_equal(nvmlDeviceGetPciInfo_v3(dev(0), &pci), NVML_SUCCESS);
                        proc = strprintf("%s/%s/proc/driver/nvidia/gpus/%04x:%02x:%02x.0/information", dir,
                                         nodes[i].node, pci.domain, pci.bus, pci.device);
                        assert_int_equal(read_full_file(proc, SIZE_MAX, &info, NULL), 0);
                        assert_int_equal(nvmlDeviceGetUUID(dev(0), buf, sizeof buf), NVML_SUCCESS);
                        assert_non_null(strstr(info, buf));
                }
                assert_int_equal(nvmlShutdown(), NVML_SUCCESS);
        }
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_init_and_errors, setup, teardown),
                cmocka_unit_test_setup_teardown(test_bad_descriptions, setup, teardown),
                cmocka_unit_test_setup_teardown(test_devices, setup, teardown),
                cmocka_unit_test_setup_teardown(test_null_and_foreign_handles, setup, teardown),
                cmocka_unit_test_setup_teardown(test_profiles_index_is_not_id, setup, teardown),
                cmocka_unit_test_setup_teardown(test_best_fit_worked_sequences, setup, teardown),
                cmocka_unit_test_setup_teardown(test_placement_rules, setup, teardown),
                cmocka_unit_test_setup_teardown(test_compute_instances, setup, teardown),
                cmocka_unit_test_setup_teardown(test_mig_mode, setup, teardown),
                cmocka_unit_test_setup_teardown(test_busy, setup, teardown),
                cmocka_unit_test_setup_teardown(test_state_survives_restart, setup, teardown),
                cmocka_unit_test_setup_teardown(test_fault_injection, setup, teardown),
                cmocka_unit_test_setup_teardown(test_latency_hang_crash, setup, teardown),
                cmocka_unit_test_setup_teardown(test_trace, setup, teardown),
                cmocka_unit_test_setup_teardown(test_fixture_nodes, setup, teardown),
        };
        return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
