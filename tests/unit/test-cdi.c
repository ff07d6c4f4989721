/* SPDX-License-Identifier: MIT */
/* Tests for agent/cdi/ and the cdi stage: our checker of the CDI loader's rules against the vendored
 * good/bad specs and our own loader-rejects fixtures (each with the message a user would read), the
 * builder against golden specs written by hand (tests/fixtures/cdi/golden) on simulated nodes made in
 * temp dirs, version selection, driver discovery through the ld.so cache and a separate driver root,
 * and the writer's refusals (another producer, the toolkit's refresh unit), no-churn and atomicity.
 * The simulated nodes use the x86_64 multiarch library folder. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <inttypes.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>
#include <cmocka.h>

#include "cdi.h"
#include "fileio.h"
#include "manager.h"
#include "strv.h"

#define VERSION "550.54.15"

static char *fixture(const char *rel) {
        const char *src = getenv("GNA_SOURCE_ROOT");
        if (!src)
                fail_msg("GNA_SOURCE_ROOT is not set; run through meson test");
        char *p = strprintf("%s/tests/fixtures/cdi/%s", src, rel);
        assert_non_null(p);
        return p;
}

static char *read_text(const char *path) {
        char *data = NULL;
        size_t size;
        int r = read_full_file(path, 1 << 20, &data, &size);
        if (r < 0)
                fail_msg("cannot read %s: %s", path, strerror(-r));
        return data;
}

static void rm_rf(const char *d) {
        _cleanup_free_ char *cmd = strprintf("rm -rf '%s'", d);
        assert_int_equal(system(cmd), 0);
}

/* Creates root/rel (a file, or a directory when rel ends in '/') with its parents. */
static void touch(const char *root, const char *rel) {
        _cleanup_free_ char *p = path_join(root, rel);
        size_t n = strlen(p);
        if (p[n - 1] == '/') {
                assert_int_equal(mkdir_p(p, 0755), 0);
                return;
        }
        _cleanup_free_ char *dir = strdup(p);
        *strrchr(dir, '/') = 0;
        assert_int_equal(mkdir_p(dir, 0755), 0);
        assert_int_equal(write_file_atomic(p, NULL, "x", 1, 0644), 0);
}

static void link_at(const char *root, const char *rel, const char *target) {
        _cleanup_free_ char *p = path_join(root, rel);
        assert_int_equal(symlink(target, p), 0);
}

/* ---- simulated nodes ---- */

typedef struct TestNode {
        char *root;
        char *dev, *proc, *sys, *run, *etc;
        char *spec;  /* <run>/cdi/nvidia.yaml */
} TestNode;

static void node_free(TestNode *n) {
        rm_rf(n->root);
        free(n->root);
        free(n->dev);
        free(n->proc);
        free(n->sys);
        free(n->run);
        free(n->etc);
        free(n->spec);
}

static void driver_files(const char *driver_root) {
        touch(driver_root, "usr/lib/x86_64-linux-gnu/libcuda.so." VERSION);
        touch(driver_root, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so." VERSION);
        link_at(driver_root, "usr/lib/x86_64-linux-gnu/libcuda.so.1", "libcuda.so." VERSION);
        link_at(driver_root, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "libnvidia-ml.so." VERSION);
        touch(driver_root, "usr/lib/x86_64-linux-gnu/libc.so.6");
        touch(driver_root, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.161.08"); /* another driver's leftover */
        touch(driver_root, "usr/bin/nvidia-smi");
        touch(driver_root, "lib/firmware/nvidia/" VERSION "/gsp_ga10x.bin");
        touch(driver_root, "lib/firmware/nvidia/" VERSION "/README");
}

static TestNode node_new(bool with_driver) {
        TestNode n = {};
        n.root = strdup("/tmp/gna-test-cdi-XXXXXX");
        assert_non_null(mkdtemp(n.root));
        n.dev = path_join(n.root, "dev");
        n.proc = path_join(n.root, "proc");
        n.sys = path_join(n.root, "sys");
        n.run = path_join(n.root, "run");
        n.etc = path_join(n.root, "etc");
        n.spec = path_join(n.root, "run/cdi/nvidia.yaml");

        const char *files[] = {
                "dev/nvidia0", "dev/nvidia1", "dev/nvidiactl", "dev/nvidia-uvm", "dev/nvidia-uvm-tools",
                "dev/dri/card1", "dev/dri/renderD128",
                "sys/bus/pci/devices/0000:3b:00.0/drm/card1/", "sys/bus/pci/devices/0000:3b:00.0/drm/renderD128/",
                "sys/bus/pci/devices/0000:86:00.0/",
                "run/nvidia-persistenced/socket", "run/cdi/", "etc/",
        };
        for (size_t i = 0; i < ELEMENTSOF(files); i++)
                touch(n.root, files[i]);

        _cleanup_free_ char *minors = fixture("mig-minors"), *text = read_text(minors),
                           *dst = path_join(n.proc, "driver/nvidia-caps/mig-minors");
        touch(n.root, "proc/driver/nvidia-caps/");
        assert_int_equal(write_file_atomic(dst, NULL, text, strlen(text), 0444), 0);
        if (with_driver)
                driver_files(n.root);
        return n;
}

static CdiBuildInput node_input(const TestNode *n, const NvmlSnapshot *snap, const char *driver_root) {
        return (CdiBuildInput) { .snapshot = snap, .root = n->root, .dev = n->dev, .proc = n->proc,
                                 .sys = n->sys, .run = n->run, .driver_root = driver_root ?: n->root };
}

/* ---- NVML snapshots written by hand ---- */

static MigDeviceInfo mig_a[] = {
        { .index = 0, .gi_id = 1, .ci_id = 0, .uuid = "MIG-aaaaaaaa-0000-4000-8000-000000000001" },
        { .index = 1, .gi_id = 2, .ci_id = 0, .uuid = "MIG-aaaaaaaa-0000-4000-8000-000000000002" },
        { .index = 2, .gi_id = 7, .ci_id = 0, .uuid = "MIG-aaaaaaaa-0000-4000-8000-000000000003" },
};

static MigDeviceInfo mig_b[] = {
        { .index = 0, .gi_id = 1, .ci_id = 0, .uuid = "MIG-bbbbbbbb-0000-4000-8000-000000000001" },
        { .index = 1, .gi_id = 2, .ci_id = 0, .uuid = "MIG-bbbbbbbb-0000-4000-8000-000000000002" },
};

static GpuInfo gpu_a(bool mig) {
        return (GpuInfo) { .pci_address = "0000:3b:00.0", .nvml_index = 0,
                           .uuid = "GPU-11111111-2222-3333-4444-555555555555", .minor = 0,
                           .mig_current = mig ? GPU_MIG_ENABLED : GPU_MIG_DISABLED,
                           .mig_devices = mig ? mig_a : NULL, .n_mig_devices = mig ? ELEMENTSOF(mig_a) : 0 };
}

static GpuInfo gpu_b(bool mig) {
        return (GpuInfo) { .pci_address = "0000:86:00.0", .nvml_index = 1,
                           .uuid = "GPU-66666666-7777-8888-9999-000000000000", .minor = 1,
                           .mig_current = mig ? GPU_MIG_ENABLED : GPU_MIG_DISABLED,
                           .mig_devices = mig ? mig_b : NULL, .n_mig_devices = mig ? ELEMENTSOF(mig_b) : 0 };
}

static NvmlSnapshot snapshot(GpuInfo *gpus, size_t n) {
        return (NvmlSnapshot) { .driver_version = VERSION, .cuda_version = 12040, .gpus = gpus, .n_gpus = n };
}

static char *build_yaml(const CdiBuildInput *in, char ***ret_warnings) {
        _cleanup_(cdi_spec_freep) CdiSpec *s = NULL;
        _cleanup_free_ char *error = NULL;
        char *text = NULL;

        assert_int_equal(cdi_spec_build(in, &s, ret_warnings), 0);
        assert_int_equal(cdi_spec_to_yaml(s, &text), 0);
        /* Everything we build must pass our own checker. */
        if (cdi_validate_text("built", text, strlen(text), &error) < 0)
                fail_msg("the built spec fails validation: %s\n%s", error, text);
        return text;
}

static void assert_golden(const char *name, const char *actual) {
        _cleanup_free_ char *rel = strprintf("golden/%s.yaml", name), *p = fixture(rel), *expected = read_text(p);
        if (streq(expected, actual))
                return;
        _cleanup_free_ char *out = strprintf("/tmp/gna-cdi-actual-%s.yaml", name);
        (void) write_file_atomic(out, NULL, actual, strlen(actual), 0644);
        fail_msg("%s differs from the golden file; actual output in %s (diff -u %s %s)", name, out, p, out);
}

/* ---- the validator ---- */

static void test_validator_good(void **state) {
        const char *good[] = { "testdata/good/minimal.json", "testdata/good/spec-example.json" };
        for (size_t i = 0; i < ELEMENTSOF(good); i++) {
                _cleanup_free_ char *p = fixture(good[i]), *text = read_text(p), *error = NULL;
                if (cdi_validate_text(good[i], text, strlen(text), &error) < 0)
                        fail_msg("%s rejected: %s", good[i], error);
        }
}

static void test_validator_bad(void **state) {
        static const struct {
                const char *file;
                const char *message;
        } bad[] = {
                { "testdata/bad/empty.json", "testdata/bad/empty.json: the file holds no CDI spec (it is empty)" },
                { "testdata/bad/explicit-empty.json",
                  "testdata/bad/explicit-empty.json: cdiVersion \"\" is not a CDI version the loader knows (0.3.0 to 1.1.0)" },
                /* The six the JSON schema lets through. */
                { "loader-rejects/schema-passes-unknown-field.json",
                  "loader-rejects/schema-passes-unknown-field.json:8:23: unknown field \"deviceNode\" in "
                  "devices[0].containerEdits; the loader rejects the whole file (known fields: env, deviceNodes, hooks, "
                  "mounts, netDevices, intelRdt, additionalGids)" },
                { "loader-rejects/schema-passes-bad-device-name.json",
                  "devices[0] (\"gpu/0\"): the device name may contain only letters, digits, '_', '.', ':' and '-'" },
                { "loader-rejects/schema-passes-bad-version.json",
                  "cdiVersion \"0.9.0\" is not a CDI version the loader knows (0.3.0 to 1.1.0)" },
                { "loader-rejects/schema-passes-bad-hook-name.json",
                  "containerEdits.hooks[0]: hookName \"preStart\" is not an OCI hook (prestart, createRuntime, "
                  "createContainer, startContainer, poststart, poststop)" },
                { "loader-rejects/schema-passes-env-not-string.json",
                  ":13:13: containerEdits.env[0] must be a string, not a mapping" },
                { "loader-rejects/schema-passes-bad-kind.json",
                  "kind \"nvidia.com\" is not VENDOR/CLASS (e.g. nvidia.com/gpu)" },
                /* Our own. */
                { "loader-rejects/env-without-value.yaml",
                  "containerEdits.env[0] \"NVIDIA_VISIBLE_DEVICES\" is not an environment variable: write NAME=value" },
                { "loader-rejects/device-node-type.yaml",
                  "devices[0] (\"0\").deviceNodes[0] (/dev/nvidia0): type \"x\" is not one of b, c, u, p (or leave it out)" },
                { "loader-rejects/device-node-permissions.yaml",
                  "devices[0] (\"0\").deviceNodes[0] (/dev/nvidia0): permissions \"rwx\" must be made of r, w and m" },
                { "loader-rejects/device-node-no-path.yaml",
                  "devices[0] (\"0\").deviceNodes[0] has no path: every device node needs one" },
                { "loader-rejects/device-node-negative-major.yaml",
                  "devices[0] (\"0\").deviceNodes[0] (/dev/nvidia0): negative device number -1:0" },
                { "loader-rejects/duplicate-device.yaml",
                  "devices[1] (\"0\"): the device name is used twice (also devices[0]); names must be unique" },
                { "loader-rejects/empty-device-edits.yaml",
                  "devices[0] (\"0\") has no containerEdits: a device must change something in the container" },
                { "loader-rejects/version-too-low.yaml",
                  "cdiVersion 0.3.0 is lower than the content needs: set cdiVersion to 0.5.0 or later" },
                { "loader-rejects/annotations-need-0.6.yaml",
                  "cdiVersion 0.5.0 is lower than the content needs: set cdiVersion to 0.6.0 or later" },
                { "loader-rejects/class-dot-needs-0.6.yaml",
                  "cdiVersion 0.5.0 is lower than the content needs: set cdiVersion to 0.6.0 or later" },
                { "loader-rejects/annotation-key.yaml",
                  "devices[0] (\"0\"): annotation key \"not a key!\" is not a valid Kubernetes annotation key" },
                { "loader-rejects/hook-without-path.yaml", "containerEdits.hooks[0] (createContainer) has no path" },
                { "loader-rejects/mount-without-host-path.yaml", "containerEdits.mounts[0] has no hostPath" },
                { "loader-rejects/no-devices.yaml", "the spec has no devices: a CDI spec needs at least one" },
                { "loader-rejects/duplicate-key.yaml",
                  ":3:1: duplicate key 'kind' (already set on line 2); remove one of them" },
                { "loader-rejects/major-quoted.yaml",
                  ":8:14: devices[0].containerEdits.deviceNodes[0].major must be an integer, not a quoted string" },
                { "loader-rejects/not-yaml.yaml", "invalid YAML: " },
        };

        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                _cleanup_free_ char *p = fixture(bad[i].file), *text = read_text(p), *error = NULL;
                int r = cdi_validate_text(bad[i].file, text, strlen(text), &error);
                if (r >= 0)
                        fail_msg("%s was accepted", bad[i].file);
                assert_non_null(error);
                if (!strstr(error, bad[i].message))
                        fail_msg("%s: expected \"%s\" in \"%s\"", bad[i].file, bad[i].message, error);
                /* Every message names the file it is about. */
                assert_true(startswith(error, bad[i].file));
        }
}

/* ---- the builder ---- */

static void test_golden_two_gpus(void **state) {
        TestNode n = node_new(true);
        GpuInfo gpus[] = { gpu_a(false), gpu_b(false) };
        NvmlSnapshot snap = snapshot(gpus, 2);
        CdiBuildInput in = node_input(&n, &snap, NULL);
        _cleanup_strv_free_ char **warnings = NULL;
        _cleanup_free_ char *text = build_yaml(&in, &warnings);

        assert_golden("two-gpus", text);
        assert_null(warnings);
        node_free(&n);
}

static void test_golden_mig(void **state) {
        TestNode n = node_new(true);
        GpuInfo gpus[] = { gpu_a(true) };
        NvmlSnapshot snap = snapshot(gpus, 1);
        CdiBuildInput in = node_input(&n, &snap, NULL);
        _cleanup_strv_free_ char **warnings = NULL;
        _cleanup_free_ char *text = build_yaml(&in, &warnings);

        /* A GPU in MIG mode has no full-GPU entry, and no DRM nodes come along. */
        assert_golden("mig", text);
        assert_null(warnings);
        node_free(&n);
}

static void test_golden_mixed(void **state) {
        TestNode n = node_new(true);
        GpuInfo gpus[] = { gpu_a(false), gpu_b(true) };
        NvmlSnapshot snap = snapshot(gpus, 2);
        CdiBuildInput in = node_input(&n, &snap, NULL);
        _cleanup_free_ char *text = build_yaml(&in, NULL);

        assert_golden("mixed", text);
        node_free(&n);
}

/* cdi.device-name-strategy: the names nvidia-ctk's --device-name-strategy gives, on a node where GPU 0 is
 * whole and GPU 1 is in MIG mode. Each result is a golden file (so tests/cdi checks it against the CDI
 * schema too). Under every strategy the MIG-enabled GPU has no whole-GPU entry: nvidia-ctk v1.18 and later
 * skip such a GPU (v1.17 and older listed it), and giving it out would hand a container the parent GPU's
 * node without its MIG caps, which CUDA cannot use. */
static void test_device_name_strategies(void **state) {
        static const struct {
                unsigned names;
                const char *golden;
                const char *const expected[12];
        } cases[] = {
                { 0, "mixed", { "0", "GPU-11111111-2222-3333-4444-555555555555", "1:0",
                                "MIG-bbbbbbbb-0000-4000-8000-000000000001", "1:1",
                                "MIG-bbbbbbbb-0000-4000-8000-000000000002", "all" } },
                { CDI_NAMES_INDEX | CDI_NAMES_UUID, "mixed", {} },
                { CDI_NAMES_INDEX, "mixed-index", { "0", "1:0", "1:1", "all" } },
                { CDI_NAMES_UUID, "mixed-uuid", { "GPU-11111111-2222-3333-4444-555555555555",
                                                  "MIG-bbbbbbbb-0000-4000-8000-000000000001",
                                                  "MIG-bbbbbbbb-0000-4000-8000-000000000002", "all" } },
                { CDI_NAMES_TYPE_INDEX, "mixed-type-index", { "gpu0", "mig1:0", "mig1:1", "all" } },
                { CDI_NAMES_INDEX | CDI_NAMES_UUID | CDI_NAMES_TYPE_INDEX, "mixed-all-names",
                  { "0", "GPU-11111111-2222-3333-4444-555555555555", "gpu0", "1:0",
                    "MIG-bbbbbbbb-0000-4000-8000-000000000001", "mig1:0", "1:1",
                    "MIG-bbbbbbbb-0000-4000-8000-000000000002", "mig1:1", "all" } },
        };
        TestNode n = node_new(true);
        GpuInfo gpus[] = { gpu_a(false), gpu_b(true) };
        NvmlSnapshot snap = snapshot(gpus, 2);

        for (size_t c = 0; c < ELEMENTSOF(cases); c++) {
                CdiBuildInput in = node_input(&n, &snap, NULL);
                in.device_names = cases[c].names;
                _cleanup_(cdi_spec_freep) CdiSpec *s = NULL;
                _cleanup_strv_free_ char **warnings = NULL;
                _cleanup_free_ char *text = build_yaml(&in, NULL);

                assert_golden(cases[c].golden, text);
                assert_int_equal(cdi_spec_build(&in, &s, &warnings), 0);
                assert_null(warnings);
                size_t k = 0;
                for (; cases[c].expected[0] && cases[c].expected[k]; k++) {
                        assert_true(k < s->n_devices);
                        assert_string_equal(s->devices[k].name, cases[c].expected[k]);
                }
                if (cases[c].expected[0])
                        assert_int_equal(s->n_devices, k);
                /* GPU 1 is in MIG mode: no entry hands out the whole GPU, whatever it would be called. */
                for (size_t i = 0; i < s->n_devices; i++) {
                        const char *name = s->devices[i].name;
                        assert_false(streq(name, "1") || streq(name, "gpu1") ||
                                     streq(name, "GPU-66666666-7777-8888-9999-000000000000"));
                        if (!streq(name, "all") && s->devices[i].edits.n_device_nodes == 1)
                                assert_string_equal(s->devices[i].edits.device_nodes[0].path, "/dev/nvidia0");
                }
        }
        node_free(&n);
}

static void test_golden_no_libraries(void **state) {
        TestNode n = node_new(false);
        GpuInfo gpus[] = { gpu_a(false) };
        NvmlSnapshot snap = snapshot(gpus, 1);
        _cleanup_free_ char *empty = path_join(n.root, "driver-root");
        touch(n.root, "driver-root/");
        CdiBuildInput in = node_input(&n, &snap, empty);
        _cleanup_strv_free_ char **warnings = NULL;
        _cleanup_free_ char *text = build_yaml(&in, &warnings);
        _cleanup_free_ char *expected = strprintf("no NVIDIA driver libraries (lib*.so." VERSION ") under %s: the spec "
                                                  "has no library mounts (is cdi.driver-root right?)", empty);

        assert_golden("no-libraries", text);
        assert_int_equal(strv_length(warnings), 1);
        assert_string_equal(warnings[0], expected);
        node_free(&n);
}

static void test_golden_hook(void **state) {
        TestNode n = node_new(true);
        GpuInfo gpus[] = { gpu_a(false) };
        NvmlSnapshot snap = snapshot(gpus, 1);
        touch(n.root, "usr/bin/nvidia-cdi-hook");
        CdiBuildInput in = node_input(&n, &snap, NULL);
        _cleanup_free_ char *text = build_yaml(&in, NULL);

        assert_golden("hook", text);
        node_free(&n);
}

static void test_version_selection(void **state) {
        TestNode n = node_new(true);
        GpuInfo gpus[] = { gpu_a(false) };
        NvmlSnapshot snap = snapshot(gpus, 1);
        CdiBuildInput in = node_input(&n, &snap, NULL);
        _cleanup_(cdi_spec_freep) CdiSpec *s = NULL;
        _cleanup_free_ char *text = NULL, *error = NULL;

        assert_int_equal(cdi_spec_build(&in, &s, NULL), 0);
        /* "0" starts with a digit: 0.5.0, and nothing in our content needs more. */
        assert_string_equal(s->version, "0.5.0");
        assert_string_equal(cdi_spec_min_version(s), "0.5.0");

        /* The same spec claiming 0.4.0 is refused before it reaches the disk. */
        free(s->version);
        s->version = strdup("0.4.0");
        assert_int_equal(cdi_spec_to_yaml(s, &text), 0);
        assert_int_equal(cdi_validate_text("x.yaml", text, strlen(text), &error), -EINVAL);
        assert_string_equal(error, "x.yaml: cdiVersion 0.4.0 is lower than the content needs: set cdiVersion to 0.5.0 or later");

        /* Without names that start with digits the floor is 0.3.0; each newer feature raises it. */
        for (size_t i = 0; i < s->n_devices; i++) {
                free(s->devices[i].name);
                s->devices[i].name = strprintf("gpu%zu", i);
        }
        assert_string_equal(cdi_spec_min_version(s), "0.3.0");
        s->edits.mounts[0].type = strdup("bind");
        assert_string_equal(cdi_spec_min_version(s), "0.4.0");
        assert_int_equal(strv_extend(&s->devices[0].annotations, "example.com/a"), 0);
        assert_int_equal(strv_extend(&s->devices[0].annotations, "b"), 0);
        assert_string_equal(cdi_spec_min_version(s), "0.6.0");
        s->edits.additional_gids = calloc(1, sizeof(uint32_t));
        s->edits.n_additional_gids = 1;
        assert_string_equal(cdi_spec_min_version(s), "0.7.0");

        assert_true(cdi_version_compare("0.10.0", "0.9.0") > 0);
        assert_true(cdi_version_compare("v0.5.0", "0.5.0") == 0);
        node_free(&n);
}

/* Writes a glibc "ld.so.cache1.1" file listing the given (soname, path) pairs as x86-64 libc6 libraries. */
static void write_ldcache(const char *path, const char *const *pairs, size_t n) {
        size_t strings = 48 + 24 * n, size = strings;
        for (size_t i = 0; i < 2 * n; i++)
                size += strlen(pairs[i]) + 1;
        _cleanup_free_ char *buf = calloc(1, size);
        uint32_t nlibs = (uint32_t) n, len = (uint32_t) (size - strings);

        memcpy(buf, "glibc-ld.so.cache1.1", 20);
        memcpy(buf + 20, &nlibs, 4);
        memcpy(buf + 24, &len, 4);
        size_t off = strings;
        for (size_t i = 0; i < n; i++) {
                int32_t flags = 0x0303;
                uint32_t key = (uint32_t) off, value;
                memcpy(buf + off, pairs[2 * i], strlen(pairs[2 * i]) + 1);
                off += strlen(pairs[2 * i]) + 1;
                value = (uint32_t) off;
                memcpy(buf + off, pairs[2 * i + 1], strlen(pairs[2 * i + 1]) + 1);
                off += strlen(pairs[2 * i + 1]) + 1;
                memcpy(buf + 48 + 24 * i, &flags, 4);
                memcpy(buf + 48 + 24 * i + 4, &key, 4);
                memcpy(buf + 48 + 24 * i + 8, &value, 4);
        }
        assert_int_equal(write_file_atomic(path, NULL, buf, size, 0644), 0);
}

static bool has_mount(const CdiSpec *s, const char *host, const char *container) {
        for (size_t i = 0; i < s->edits.n_mounts; i++)
                if (streq(s->edits.mounts[i].host_path, host) && streq(s->edits.mounts[i].container_path, container))
                        return true;
        return false;
}

static void test_ldcache(void **state) {
        TestNode n = node_new(false);
        GpuInfo gpus[] = { gpu_a(false) };
        NvmlSnapshot snap = snapshot(gpus, 1);
        CdiBuildInput in = node_input(&n, &snap, NULL);
        _cleanup_(cdi_spec_freep) CdiSpec *s = NULL;
        _cleanup_free_ char *cache = path_join(n.root, "etc/ld.so.cache");
        const char *pairs[] = {
                "libcuda.so.1", "/opt/nvidia/lib/libcuda.so.1",
                "libnvidia-ml.so.1", "/opt/nvidia/lib/libnvidia-ml.so.1",
                "libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6",
        };

        /* Only the cache knows this folder; libnvidia-ml.so.1 is an absolute link, resolved in the root. */
        touch(n.root, "opt/nvidia/lib/libcuda.so." VERSION);
        touch(n.root, "opt/nvidia/lib/libnvidia-ml.so." VERSION);
        link_at(n.root, "opt/nvidia/lib/libcuda.so.1", "libcuda.so." VERSION);
        link_at(n.root, "opt/nvidia/lib/libnvidia-ml.so.1", "/opt/nvidia/lib/libnvidia-ml.so." VERSION);
        write_ldcache(cache, pairs, 3);

        assert_int_equal(cdi_spec_build(&in, &s, NULL), 0);
        assert_true(has_mount(s, "/opt/nvidia/lib/libcuda.so." VERSION, "/opt/nvidia/lib/libcuda.so." VERSION));
        assert_true(has_mount(s, "/opt/nvidia/lib/libnvidia-ml.so." VERSION, "/opt/nvidia/lib/libnvidia-ml.so." VERSION));
        s = cdi_spec_free(s);

        /* A cache that is not one: the usual folders are searched instead. */
        assert_int_equal(write_file_atomic(cache, NULL, "garbage", 7, 0644), 0);
        driver_files(n.root);
        assert_int_equal(cdi_spec_build(&in, &s, NULL), 0);
        assert_false(has_mount(s, "/opt/nvidia/lib/libcuda.so." VERSION, "/opt/nvidia/lib/libcuda.so." VERSION));
        assert_true(has_mount(s, "/usr/lib/x86_64-linux-gnu/libcuda.so." VERSION, "/usr/lib/x86_64-linux-gnu/libcuda.so." VERSION));
        node_free(&n);
}

static void test_driver_root(void **state) {
        TestNode n = node_new(false);
        GpuInfo gpus[] = { gpu_a(false) };
        NvmlSnapshot snap = snapshot(gpus, 1);
        _cleanup_free_ char *driver_root = path_join(n.root, "run/nvidia/driver");
        CdiBuildInput in = node_input(&n, &snap, driver_root);
        _cleanup_(cdi_spec_freep) CdiSpec *s = NULL;

        /* A driver container's root: the host sees it under /run/nvidia/driver, the container at /. */
        driver_files(driver_root);
        touch(driver_root, "usr/bin/nvidia-cdi-hook");
        assert_int_equal(cdi_spec_build(&in, &s, NULL), 0);
        assert_true(has_mount(s, "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so." VERSION,
                              "/usr/lib/x86_64-linux-gnu/libcuda.so." VERSION));
        assert_true(has_mount(s, "/run/nvidia/driver/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi"));
        assert_true(has_mount(s, "/run/nvidia/driver/lib/firmware/nvidia/" VERSION "/gsp_ga10x.bin",
                              "/lib/firmware/nvidia/" VERSION "/gsp_ga10x.bin"));
        assert_string_equal(s->edits.hooks[0].path, "/run/nvidia/driver/usr/bin/nvidia-cdi-hook");
        /* Device nodes are always the node's /dev. */
        assert_string_equal(s->devices[0].edits.device_nodes[0].path, "/dev/nvidia0");
        assert_null(s->devices[0].edits.device_nodes[0].host_path);
        node_free(&n);
}

static void test_bad_nvml_data(void **state) {
        TestNode n = node_new(true);
        GpuInfo gpus[] = { gpu_a(false), gpu_b(true) };
        MigDeviceInfo orphan[] = { { .index = 0, .gi_id = 14, .ci_id = 9, .uuid = "MIG-cccccccc-0000-4000-8000-000000000001" } };
        NvmlSnapshot snap = snapshot(gpus, 2);
        CdiBuildInput in = node_input(&n, &snap, NULL);
        _cleanup_(cdi_spec_freep) CdiSpec *s = NULL;
        _cleanup_strv_free_ char **warnings = NULL;

        /* No minor for GPU 0; GPU 1's only MIG device has no caps line (ci9 does not exist). */
        gpus[0].minor = -1;
        gpus[1].mig_devices = orphan;
        gpus[1].n_mig_devices = 1;
        assert_int_equal(cdi_spec_build(&in, &s, &warnings), -ENODEV);
        assert_null(s);
        assert_int_equal(strv_length(warnings), 2);
        assert_string_equal(warnings[0], "GPU 0000:3b:00.0 (GPU-11111111-2222-3333-4444-555555555555): NVML did not give "
                                         "its device minor (/dev/nvidiaN); left out of the CDI spec");
        assert_string_equal(warnings[1], "MIG device 1:0 (MIG-cccccccc-0000-4000-8000-000000000001): "
                                         "driver/nvidia-caps/mig-minors has no \"gpu1/gi14/ci9/access\" line; left out of "
                                         "the CDI spec (is the nvidia-caps support of the driver loaded?)");
        warnings = strv_free(warnings);

        /* A garbage UUID costs only its own name. */
        gpus[0].minor = 0;
        gpus[0].uuid = "GPU/../x";
        gpus[1].mig_current = GPU_MIG_DISABLED;
        gpus[1].uuid = "GPU-66666666-7777-8888-9999-000000000000";
        assert_int_equal(cdi_spec_build(&in, &s, &warnings), 0);
        assert_int_equal(s->n_devices, 4); /* 0, 1, GPU-6666…, all */
        assert_string_equal(warnings[0], "GPU 0000:3b:00.0: \"GPU/../x\" cannot be a CDI device name (invalid or used twice); left out");
        warnings = strv_free(warnings);
        s = cdi_spec_free(s);

        /* No UUID from NVML: the device keeps its index name, and the user hears why the other is missing. */
        MigDeviceInfo no_uuid[] = { { .index = 0, .gi_id = 1, .ci_id = 0 } };
        gpus[0].uuid = NULL;
        gpus[1].mig_current = GPU_MIG_ENABLED;
        gpus[1].mig_devices = no_uuid;
        assert_int_equal(cdi_spec_build(&in, &s, &warnings), 0);
        assert_int_equal(s->n_devices, 3); /* 0, 1:0, all */
        assert_int_equal(strv_length(warnings), 2);
        assert_string_equal(warnings[0], "GPU 0000:3b:00.0: NVML gave no UUID; its CDI device is named \"0\" only");
        assert_string_equal(warnings[1], "MIG device 1:0: NVML gave no UUID; its CDI device is named \"1:0\" only");
        node_free(&n);
}

/* Strings a hostile driver (or a caller that skipped the NVML layer's checks) could hand the builder:
 * quotes, newlines, '#', ':', backslashes, bytes that are not UTF-8. The spec stays valid and parseable,
 * such a UUID costs only its own name, and the warnings quote it escaped. */
static void test_hostile_strings(void **state) {
        TestNode n = node_new(true);
        GpuInfo gpus[] = { gpu_a(false), gpu_b(false) };
        NvmlSnapshot snap = snapshot(gpus, 2);
        CdiBuildInput in = node_input(&n, &snap, NULL);
        _cleanup_strv_free_ char **warnings = NULL;
        _cleanup_(cdi_spec_freep) CdiSpec *back = NULL;
        _cleanup_free_ char *error = NULL;
        (void) state;

        gpus[0].uuid = "GPU-1\n  - name: evil\n#\"x\\";
        gpus[1].uuid = "GPU-\xff: \"";
        gpus[0].name = "NVIDIA \"H100\"\n#x: y";
        _cleanup_free_ char *text = build_yaml(&in, &warnings);
        assert_int_equal(cdi_spec_parse("built", text, strlen(text), &back, &error), 0);
        assert_int_equal(back->n_devices, 3); /* 0, 1, all */
        assert_null(strstr(text, "evil"));
        assert_int_equal(strv_length(warnings), 2);
        assert_string_equal(warnings[0], "GPU 0000:3b:00.0: \"GPU-1\\n  - name: evil\\n#\"x\\\" cannot be a CDI device "
                                         "name (invalid or used twice); left out");
        assert_string_equal(warnings[1], "GPU 0000:86:00.0: \"GPU-\xef\xbf\xbd: \"\" cannot be a CDI device name "
                                         "(invalid or used twice); left out");
        node_free(&n);
}

/* mig-minors as the driver lays it out (tests/fixtures/mknode.py): config and monitor, then per GPU 15 GPU
 * instances, each an access minor followed by its 8 compute instances'. With 32 GPUs (the driver's own
 * count) that is 4322 lines; with offset 0 the first lines are those of the fixture. */
static char *driver_mig_minors(unsigned n_gpus, unsigned offset) {
        _cleanup_strv_free_ char **lines = NULL;
        unsigned minor = 3 + offset;

        assert_int_equal(strv_extend(&lines, "config 1"), 0);
        assert_int_equal(strv_extend(&lines, "monitor 2"), 0);
        for (unsigned gpu = 0; gpu < n_gpus; gpu++)
                for (unsigned gi = 0; gi < 15; gi++) {
                        assert_int_equal(strv_extendf(&lines, "gpu%u/gi%u/access %u", gpu, gi, minor++), 0);
                        for (unsigned ci = 0; ci < 8; ci++)
                                assert_int_equal(strv_extendf(&lines, "gpu%u/gi%u/ci%u/access %u", gpu, gi, ci, minor++), 0);
                }
        assert_int_equal(strv_length(lines), 2 + n_gpus * 15 * 9);
        char *text = strv_join(lines, "\n");
        assert_non_null(text);
        return text;
}

static void write_mig_minors(const TestNode *n, const char *text) {
        _cleanup_free_ char *p = path_join(n->proc, "driver/nvidia-caps/mig-minors"), *t = strprintf("%s\n", text);
        assert_int_equal(write_file_atomic(p, NULL, t, strlen(t), 0444), 0);
}

static const CdiDevice *find_device(const CdiSpec *s, const char *name) {
        for (size_t i = 0; i < s->n_devices; i++)
                if (streq(s->devices[i].name, name))
                        return &s->devices[i];
        fail_msg("no CDI device \"%s\"", name);
        return NULL;
}

static uint64_t now_usec(void) {
        struct timespec ts;
        assert_int_equal(clock_gettime(CLOCK_MONOTONIC, &ts), 0);
        return (uint64_t) ts.tv_sec * USEC_PER_SEC + (uint64_t) ts.tv_nsec / 1000;
}

/* Builds with a freshly written mig-minors (so it is parsed, not served from the kept table) and fails
 * when that takes 20 ms or more. */
static CdiSpec *timed_build(const CdiBuildInput *in, const char *what, char ***ret_warnings) {
        CdiSpec *s = NULL;
        uint64_t t0 = now_usec();

        assert_int_equal(cdi_spec_build(in, &s, ret_warnings), 0);
        uint64_t took = now_usec() - t0;
        if (took >= 20 * USEC_PER_MSEC)
                fail_msg("building the spec with %s took %" PRIu64 " µs", what, took);
        return s;
}

static void test_mig_minors_driver_size(void **state) {
        TestNode n = node_new(true);
        GpuInfo gpus[] = { gpu_a(false), gpu_b(true) };
        NvmlSnapshot snap = snapshot(gpus, 2);
        CdiBuildInput in = node_input(&n, &snap, NULL);
        _cleanup_(cdi_spec_freep) CdiSpec *s = NULL;
        _cleanup_strv_free_ char **warnings = NULL;
        _cleanup_free_ char *text = NULL, *gpus32 = driver_mig_minors(32, 0), *gpus64 = driver_mig_minors(64, 0),
                           *shifted = driver_mig_minors(32, 10000);
        const CdiDevice *d;
        CdiMigMinorsCache *cache = NULL; /* kept between builds, as the Manager keeps it */

        in.minors_cache = &cache;

        /* The driver's whole file costs one linear pass, not one that grows with the square of its lines
         * (that took 35 ms per build on 32 GPUs, 130 ms on 64). Well under 5 ms here; the bound is
         * generous for sanitizer builds and busy machines. */
        write_mig_minors(&n, gpus32);
        s = timed_build(&in, "the driver's 4322-line mig-minors", &warnings);
        assert_null(warnings);
        /* The same spec as from the short fixture. */
        assert_int_equal(cdi_spec_to_yaml(s, &text), 0);
        assert_golden("mixed", text);
        s = cdi_spec_free(s);

        /* 64 GPUs, and the last one's lines at the end of the file: gpu63/gi1/access is 3 + 63 × 135 + 9. */
        gpus[1].minor = 63;
        write_mig_minors(&n, gpus64);
        s = timed_build(&in, "a 64-GPU (8642-line) mig-minors", NULL);
        d = find_device(s, "1:0");
        assert_int_equal(d->edits.n_device_nodes, 3);
        assert_string_equal(d->edits.device_nodes[0].path, "/dev/nvidia63");
        assert_string_equal(d->edits.device_nodes[1].path, "/dev/nvidia-caps/nvidia-cap8517");
        assert_string_equal(d->edits.device_nodes[2].path, "/dev/nvidia-caps/nvidia-cap8518");
        s = cdi_spec_free(s);

        /* A new file (the driver reloaded) is read again, not served from the kept table. */
        gpus[1].minor = 31;
        write_mig_minors(&n, shifted);
        assert_int_equal(cdi_spec_build(&in, &s, NULL), 0);
        d = find_device(s, "1:0");
        assert_string_equal(d->edits.device_nodes[1].path, "/dev/nvidia-caps/nvidia-cap14197");
        assert_string_equal(d->edits.device_nodes[2].path, "/dev/nvidia-caps/nvidia-cap14198");
        s = cdi_spec_free(s);

        /* Lines out of order and lines of other kinds are fine; a malformed access line gives no minor. */
        write_mig_minors(&n, "gpu31/gi1/ci0/access 77\nmonitor 2\ngpu31/gi1/access 76\ngpu31/gi1/ci1/access x\n"
                             "gpu31/gi2/access\ngpu31/gi2/ci0/access 5 6\nconfig 1");
        assert_int_equal(cdi_spec_build(&in, &s, &warnings), 0);
        d = find_device(s, "1:0");
        assert_string_equal(d->edits.device_nodes[1].path, "/dev/nvidia-caps/nvidia-cap76");
        assert_string_equal(d->edits.device_nodes[2].path, "/dev/nvidia-caps/nvidia-cap77");
        assert_int_equal(strv_length(warnings), 1);
        assert_string_equal(warnings[0], "MIG device 1:1 (MIG-bbbbbbbb-0000-4000-8000-000000000002): "
                                         "driver/nvidia-caps/mig-minors has no \"gpu31/gi2/access\" line; left out "
                                         "of the CDI spec (is the nvidia-caps support of the driver loaded?)");
        assert_non_null(cache);
        cdi_mig_minors_cache_free(cache);
        node_free(&n);
}

static void test_mig_minors_only_for_mig(void **state) {
        TestNode n = node_new(true);
        GpuInfo gpus[] = { gpu_a(false), gpu_b(false) };
        NvmlSnapshot snap = snapshot(gpus, 2);
        CdiBuildInput in = node_input(&n, &snap, NULL);
        _cleanup_(cdi_spec_freep) CdiSpec *s = NULL;
        _cleanup_strv_free_ char **warnings = NULL;
        _cleanup_free_ char *p = path_join(n.proc, "driver/nvidia-caps/mig-minors");
        _cleanup_free_ char *expected = strprintf("cannot read %s/driver/nvidia-caps/mig-minors: Too many levels of "
                                                  "symbolic links", n.proc);

        /* An unreadable file: a node without MIG devices has no reason to read it, so no warning. */
        assert_int_equal(unlink(p), 0);
        assert_int_equal(symlink("mig-minors", p), 0);
        assert_int_equal(cdi_spec_build(&in, &s, &warnings), 0);
        assert_null(warnings);
        s = cdi_spec_free(s);

        /* With MIG devices it is read, and the failure is named. */
        gpus[1] = gpu_b(true);
        assert_int_equal(cdi_spec_build(&in, &s, &warnings), 0);
        assert_int_equal(strv_length(warnings), 3);
        assert_string_equal(warnings[0], expected);
        assert_true(startswith(warnings[1], "MIG device 1:0 (MIG-bbbbbbbb-0000-4000-8000-000000000001): "
                                            "driver/nvidia-caps/mig-minors has no \"gpu1/gi1/access\" line"));
        node_free(&n);
}

/* ---- the writer ---- */

static char *two_gpu_text(const TestNode *n) {
        GpuInfo gpus[] = { gpu_a(false), gpu_b(false) };
        NvmlSnapshot snap = snapshot(gpus, 2);
        CdiBuildInput in = node_input(n, &snap, NULL);
        return build_yaml(&in, NULL);
}

static size_t count_entries(const char *dir) {
        _cleanup_closedir_ DIR *d = opendir(dir);
        struct dirent *de;
        size_t k = 0;
        assert_non_null(d);
        while ((de = readdir(d)))
                k += !streq(de->d_name, ".") && !streq(de->d_name, "..");
        return k;
}

static void test_conflict(void **state) {
        TestNode n = node_new(true);
        _cleanup_free_ char *other = path_join(n.root, "run/cdi/k8s.device-plugin.nvidia.com-gpu.json"),
                           *mgmt = path_join(n.root, "run/cdi/management.nvidia.com-gpu.yaml"), *error = NULL;

        /* The MIG manager's management spec is another kind: no conflict. */
        assert_int_equal(write_file_atomic(mgmt, NULL, "cdiVersion: 0.5.0\nkind: management.nvidia.com/gpu\n", 49, 0644), 0);
        assert_int_equal(cdi_check_conflicts(n.spec, n.etc, &error), 0);

        const char *json = "{\"cdiVersion\": \"0.5.0\", \"kind\": \"nvidia.com/gpu\", \"devices\": []}";
        assert_int_equal(write_file_atomic(other, NULL, json, strlen(json), 0644), 0);
        assert_int_equal(cdi_check_conflicts(n.spec, n.etc, &error), -EEXIST);
        _cleanup_free_ char *expected = strprintf(
                "%s declares CDI kind nvidia.com/gpu in the same directory as the agent's %s; runtimes drop every device "
                "that two such files both name. Remove it and stop whatever writes it (an `nvidia-ctk cdi generate` job, "
                "the toolkit's nvidia-cdi-refresh), or set cdi.enabled: false",
                other, n.spec);
        assert_string_equal(error, expected);
        node_free(&n);
}

static void test_refresh_unit(void **state) {
        TestNode n = node_new(true);
        _cleanup_free_ char *error = NULL,
                           *wants = path_join(n.etc, "systemd/system/multi-user.target.wants/nvidia-cdi-refresh.path"),
                           *mask = path_join(n.etc, "systemd/system/nvidia-cdi-refresh.path");

        touch(n.etc, "systemd/system/multi-user.target.wants/");
        assert_int_equal(symlink("/usr/lib/systemd/system/nvidia-cdi-refresh.path", wants), 0);
        assert_int_equal(cdi_check_conflicts(n.spec, n.etc, &error), -EBUSY);
        _cleanup_free_ char *expected = strprintf(
                "the NVIDIA Container Toolkit's nvidia-cdi-refresh.path is enabled (%s) and would rewrite the CDI spec the "
                "agent writes; run `systemctl mask nvidia-cdi-refresh.path` to let the agent own it, or set "
                "cdi.enabled: false to leave it to the toolkit",
                wants);
        assert_string_equal(error, expected);

        /* Masked, it cannot start whatever still wants it. */
        assert_int_equal(symlink("/dev/null", mask), 0);
        assert_int_equal(cdi_check_conflicts(n.spec, n.etc, &error), 0);
        node_free(&n);
}

static void test_no_churn_and_atomic(void **state) {
        TestNode n = node_new(true);
        _cleanup_free_ char *text = two_gpu_text(&n), *error = NULL, *dir = path_join(n.root, "run/cdi"), *back = NULL;
        struct stat a, b;
        bool changed = false;

        assert_int_equal(cdi_spec_write(n.spec, text, &changed, &error), 0);
        assert_true(changed);
        assert_int_equal(stat(n.spec, &a), 0);
        assert_int_equal(a.st_mode & 07777, 0644);
        assert_int_equal(count_entries(dir), 1); /* no temp file left */
        back = read_text(n.spec);
        assert_string_equal(back, text);

        /* The same bytes again: not touched, so runtimes' watches stay quiet. A temp file a killed
         * writer left beside the spec goes, even then. */
        _cleanup_free_ char *stale = path_join(dir, ".nvidia.yaml.Qw3rT9");
        FILE *w = fopen(stale, "w");
        assert_non_null(w);
        fclose(w);
        assert_int_equal(count_entries(dir), 2);
        assert_int_equal(cdi_spec_write(n.spec, text, &changed, &error), 0);
        assert_false(changed);
        assert_int_equal(count_entries(dir), 1);
        assert_int_equal(stat(n.spec, &b), 0);
        assert_true(a.st_ino == b.st_ino);
        assert_true(a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec);

        /* A change replaces the file by rename: a new inode, still no temp file. */
        GpuInfo one[] = { gpu_b(false) };
        NvmlSnapshot snap = snapshot(one, 1);
        CdiBuildInput in = node_input(&n, &snap, NULL);
        _cleanup_free_ char *text2 = build_yaml(&in, NULL);
        assert_int_equal(cdi_spec_write(n.spec, text2, &changed, &error), 0);
        assert_true(changed);
        assert_int_equal(stat(n.spec, &b), 0);
        assert_true(a.st_ino != b.st_ino);
        assert_int_equal(count_entries(dir), 1);

        /* Content that fails the checker never reaches the file. */
        char *kind = strstr(text, "kind: nvidia.com/gpu");
        assert_non_null(kind);
        strcpy(kind, "kind: nvidia.com\n");
        _cleanup_free_ char *expected = strprintf("%s: kind \"nvidia.com\" is not VENDOR/CLASS (e.g. nvidia.com/gpu)", n.spec);
        assert_int_equal(cdi_spec_write(n.spec, text, &changed, &error), -EINVAL);
        assert_string_equal(error, expected);
        _cleanup_free_ char *after = read_text(n.spec);
        assert_string_equal(after, text2);
        assert_int_equal(count_entries(dir), 1);
        node_free(&n);
}

static void test_write_directory(void **state) {
        TestNode n = node_new(true);
        _cleanup_free_ char *text = two_gpu_text(&n), *error = NULL, *spec = path_join(n.root, "var/run/cdi/nvidia.yaml"),
                           *deep = path_join(n.root, "no/such/parent/nvidia.yaml"), *parent = path_join(n.root, "no/such");
        bool changed;

        /* The directory is created when its parent exists… */
        touch(n.root, "var/run/");
        assert_int_equal(cdi_spec_write(spec, text, &changed, &error), 0);
        assert_true(changed);

        /* …and not otherwise: that is a configuration mistake. */
        assert_int_equal(cdi_spec_write(deep, text, &changed, &error), -ENOENT);
        _cleanup_free_ char *expected = strprintf("cannot create %s/parent for the CDI spec: %s does not exist (check cdi.spec)",
                                                  parent, parent);
        assert_string_equal(error, expected);
        node_free(&n);
}

/* ---- the stage ---- */

static void test_stage(void **state) {
        TestNode n = node_new(true);
        GpuInfo gpus[] = { gpu_a(false), gpu_b(false) };
        NvmlSnapshot snap = snapshot(gpus, 2);
        Config c = { .paths = { .root = n.root, .dev = n.dev, .proc = n.proc, .sys = n.sys, .run = n.run, .etc = n.etc },
                     .cdi = { .enabled = false, .spec = n.spec, .driver_root = n.root } };
        Node m = { .config = &c };
        _cleanup_free_ char *msg = NULL, *golden = fixture("golden/two-gpus.yaml"), *expected = read_text(golden);

        assert_int_equal(stage_cdi_run(&m, &msg), STAGE_SKIPPED);
        assert_string_equal(msg, "disabled by cdi.enabled: false");
        msg = mfree(msg);

        c.cdi.enabled = true;
        assert_int_equal(stage_cdi_run(&m, &msg), STAGE_SKIPPED);
        _cleanup_free_ char *no_gpu = strprintf("no GPU known to NVML; %s left as it is", n.spec);
        assert_string_equal(msg, no_gpu);
        msg = mfree(msg);
        assert_false(access(n.spec, F_OK) == 0);

        m.nvml_snapshot = &snap;
        assert_int_equal(stage_cdi_run(&m, &msg), STAGE_DONE);
        _cleanup_free_ char *written = strprintf("5 devices written to %s", n.spec), *on_disk = read_text(n.spec);
        assert_string_equal(msg, written);
        assert_string_equal(m.cdi_spec_text, expected);
        assert_string_equal(on_disk, expected);
        msg = mfree(msg);

        assert_int_equal(stage_cdi_run(&m, &msg), STAGE_DONE);
        assert_string_equal(msg, "unchanged");
        msg = mfree(msg);

        /* Every MIG device destroyed: nothing left to describe, so our file goes rather than keep serving
         * dead devices. */
        GpuInfo empty_mig[] = { gpu_a(true) };
        empty_mig[0].n_mig_devices = 0;
        NvmlSnapshot empty = snapshot(empty_mig, 1);
        m.nvml_snapshot = &empty;
        assert_int_equal(stage_cdi_run(&m, &msg), STAGE_SKIPPED);
        _cleanup_free_ char *removed = strprintf("no GPU or MIG device to describe; removed %s", n.spec);
        assert_string_equal(msg, removed);
        assert_false(access(n.spec, F_OK) == 0);
        assert_null(m.cdi_spec_text);
        msg = mfree(msg);

        /* A symlink planted under our spec's name is not ours to delete (nor what it points to). */
        _cleanup_free_ char *target = path_join(n.root, "elsewhere.yaml");
        assert_int_equal(write_file_atomic(target, NULL, "x\n", 2, 0644), 0);
        assert_int_equal(symlink(target, n.spec), 0);
        assert_int_equal(stage_cdi_run(&m, &msg), -EEXIST);
        _cleanup_free_ char *refused = strprintf("no GPU or MIG device to describe, but %s is a symbolic link, not "
                                                 "the CDI spec gpu-node-agent writes; leaving it alone", n.spec);
        assert_string_equal(msg, refused);
        struct stat lst;
        assert_int_equal(lstat(n.spec, &lst), 0);
        assert_true(S_ISLNK(lst.st_mode));
        assert_int_equal(access(target, F_OK), 0);
        assert_int_equal(unlink(n.spec), 0);
        msg = mfree(msg);
        m.nvml_snapshot = &snap;
        assert_int_equal(stage_cdi_run(&m, &msg), STAGE_DONE);
        assert_string_equal(msg, written);
        msg = mfree(msg);

        /* Another producer appears: the stage fails, naming both files, and leaves ours alone. */
        _cleanup_free_ char *other = path_join(n.root, "run/cdi/nvidia-ctk.json");
        const char *json = "{\"cdiVersion\": \"0.5.0\", \"kind\": \"nvidia.com/gpu\"}";
        assert_int_equal(write_file_atomic(other, NULL, json, strlen(json), 0644), 0);
        assert_int_equal(stage_cdi_run(&m, &msg), -EEXIST);
        assert_non_null(strstr(msg, other));
        assert_non_null(strstr(msg, n.spec));
        msg = mfree(msg);
        _cleanup_free_ char *still = read_text(n.spec);
        assert_string_equal(still, expected);

        free(m.cdi_spec_text);
        node_free(&n);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_validator_good),
                cmocka_unit_test(test_validator_bad),
                cmocka_unit_test(test_golden_two_gpus),
                cmocka_unit_test(test_golden_mig),
                cmocka_unit_test(test_golden_mixed),
                cmocka_unit_test(test_device_name_strategies),
                cmocka_unit_test(test_golden_no_libraries),
                cmocka_unit_test(test_golden_hook),
                cmocka_unit_test(test_version_selection),
                cmocka_unit_test(test_ldcache),
                cmocka_unit_test(test_driver_root),
                cmocka_unit_test(test_bad_nvml_data),
                cmocka_unit_test(test_hostile_strings),
                cmocka_unit_test(test_mig_minors_driver_size),
                cmocka_unit_test(test_mig_minors_only_for_mig),
                cmocka_unit_test(test_conflict),
                cmocka_unit_test(test_refresh_unit),
                cmocka_unit_test(test_no_churn_and_atomic),
                cmocka_unit_test(test_write_directory),
                cmocka_unit_test(test_stage),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
