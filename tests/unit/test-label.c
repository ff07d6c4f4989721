/* SPDX-License-Identifier: MIT */
/* Tests labels/label.c: Kubernetes name/value rules, GFD sanitising, product names from pci.ids and
 * the PCI-only label set (mode, heterogeneous nodes, over-long values, no GPU). Inventories are built by
 * hand: the values a user sees are asserted, not the internals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <ftw.h>
#include <sys/stat.h>

#include "fileio.h"
#include "label.h"
#include "strv.h"

static char *repeat(char c, size_t n) {
        char *s = malloc(n + 1);
        assert_non_null(s);
        memset(s, c, n);
        s[n] = 0;
        return s;
}

static void test_key_validation(void **state) {
        _cleanup_free_ char *name63 = repeat('a', 63), *name64 = repeat('a', 64);
        _cleanup_free_ char *k = NULL;

        assert_true(label_key_is_valid("nvidia.com/gpu.count"));
        assert_true(label_key_is_valid("nvidia.com/gpu-node-agent.state"));
        assert_true(label_key_is_valid("nvidia.com/mig-1g.10gb.me.count"));
        assert_true(label_key_is_valid("gpu.count"));
        assert_true(label_key_is_valid("a"));
        assert_true(label_key_is_valid("A_b.C-9"));
        assert_true(label_key_is_valid("a-1.b-2.example/x"));

        assert_int_equal(asprintf(&k, "nvidia.com/%s", name63), (int) strlen("nvidia.com/") + 63);
        assert_true(label_key_is_valid(k));
        k = mfree(k);
        assert_true(asprintf(&k, "nvidia.com/%s", name64) > 0);
        assert_false(label_key_is_valid(k));
        k = mfree(k);

        assert_false(label_key_is_valid(NULL));
        assert_false(label_key_is_valid(""));
        assert_false(label_key_is_valid("/gpu.count"));          /* empty prefix */
        assert_false(label_key_is_valid("nvidia.com/"));         /* empty name */
        assert_false(label_key_is_valid("nvidia.com/a/b"));      /* two slashes */
        assert_false(label_key_is_valid("Nvidia.com/gpu"));      /* prefix must be lowercase */
        assert_false(label_key_is_valid("nvidia_com/gpu"));      /* no '_' in a DNS name */
        assert_false(label_key_is_valid("-nvidia.com/gpu"));
        assert_false(label_key_is_valid("nvidia-.com/gpu"));
        assert_false(label_key_is_valid("nvidia..com/gpu"));
        assert_false(label_key_is_valid(".nvidia.com/gpu"));
        assert_false(label_key_is_valid("nvidia.com./gpu"));
        assert_false(label_key_is_valid("nvidia.com/-gpu"));
        assert_false(label_key_is_valid("nvidia.com/gpu."));
        assert_false(label_key_is_valid("nvidia.com/gpu count"));
        assert_false(label_key_is_valid("nvidia.com/gpu=count"));

        /* Prefix: each DNS label ≤ 63, the whole ≤ 253. */
        assert_true(asprintf(&k, "%s.com/x", name63) > 0);
        assert_true(label_key_is_valid(k));
        k = mfree(k);
        assert_true(asprintf(&k, "%s.com/x", name64) > 0);
        assert_false(label_key_is_valid(k));
        k = mfree(k);
        /* 4 × 63 + 3 dots = 255 > 253; 3 × 63 + 61 + 3 = 253. */
        assert_true(asprintf(&k, "%s.%s.%s.%s/x", name63, name63, name63, name63) > 0);
        assert_false(label_key_is_valid(k));
        k = mfree(k);
        assert_true(asprintf(&k, "%s.%s.%s.%.61s/x", name63, name63, name63, name63) > 0);
        assert_true(label_key_is_valid(k));
}

static void test_value_validation(void **state) {
        _cleanup_free_ char *v63 = repeat('x', 63), *v64 = repeat('x', 64);

        assert_true(label_value_is_valid(""));
        assert_true(label_value_is_valid("true"));
        assert_true(label_value_is_valid("NVIDIA-H100-80GB-HBM3"));
        assert_true(label_value_is_valid("550.54.15"));
        assert_true(label_value_is_valid("A_b.C-9"));
        assert_true(label_value_is_valid(v63));
        assert_false(label_value_is_valid(v64));
        assert_false(label_value_is_valid(NULL));
        assert_false(label_value_is_valid("-a"));
        assert_false(label_value_is_valid("a_"));
        assert_false(label_value_is_valid(".a"));
        assert_false(label_value_is_valid("a b"));
        assert_false(label_value_is_valid("a/b"));
        assert_false(label_value_is_valid("NVIDIA-TITAN-X-(Pascal)"));
}

static void test_set(void **state) {
        _cleanup_(label_set_freep) LabelSet *a = label_set_new(), *b = label_set_new();
        _cleanup_free_ char *v64 = repeat('x', 64);

        assert_non_null(a);
        assert_non_null(b);
        assert_int_equal(label_set_put(a, "nvidia.com/gpu.product", "X"), 0);
        assert_int_equal(label_set_put(a, "nvidia.com/gpu.count", "8"), 0);
        assert_int_equal(label_set_put(a, "nvidia.com/gpu-node-agent.state", "ready"), 0);
        assert_int_equal(label_set_put(a, "nvidia.com/gpu.present", "true"), 0);
        assert_int_equal(label_set_put(a, "nvidia.com/gpu.mode", "compute"), 0);
        assert_int_equal(label_set_put(a, "nvidia.com/gpu.count", "4"), 0); /* replaces */

        assert_int_equal(a->n, 5);
        const char *order[] = { "nvidia.com/gpu-node-agent.state", "nvidia.com/gpu.count",
                                "nvidia.com/gpu.mode", "nvidia.com/gpu.present", "nvidia.com/gpu.product" };
        for (size_t i = 0; i < ELEMENTSOF(order); i++)
                assert_string_equal(a->labels[i].key, order[i]);
        assert_string_equal(label_set_get(a, "nvidia.com/gpu.count"), "4");
        assert_null(label_set_get(a, "nvidia.com/gpu.memory"));

        assert_int_equal(label_set_put(a, "nvidia.com/bad key", "x"), -EINVAL);
        assert_int_equal(label_set_put(a, "nvidia.com/gpu.product", v64), -EINVAL);
        assert_int_equal(label_set_put(a, "nvidia.com/gpu.product", "(x)"), -EINVAL);
        assert_int_equal(a->n, 5);
        assert_string_equal(label_set_get(a, "nvidia.com/gpu.product"), "X");

        /* Same content inserted in another order compares equal. */
        for (size_t i = ELEMENTSOF(order); i > 0; i--)
                assert_int_equal(label_set_put(b, a->labels[i - 1].key, a->labels[i - 1].value), 0);
        assert_true(label_set_equal(a, b));
        assert_int_equal(label_set_put(b, "nvidia.com/gpu.count", "5"), 0);
        assert_false(label_set_equal(a, b));
        assert_int_equal(label_set_put(b, "nvidia.com/gpu.count", "4"), 0);
        assert_int_equal(label_set_put(b, "nvidia.com/gpu.memory", "81559"), 0);
        assert_false(label_set_equal(a, b));
}

static void check_sanitize(const char *in, const char *want) {
        _cleanup_free_ char *s = label_sanitize(in);
        assert_non_null(s);
        assert_string_equal(s, want);
}

static void test_sanitize(void **state) {
        check_sanitize("NVIDIA-TITAN-X-(Pascal)", "NVIDIA-TITAN-X-Pascal");
        check_sanitize(" input  with multiple   spaces   ", "input-with-multiple-spaces");
        check_sanitize("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3");
        check_sanitize("Quadro RTX 6000/8000", "Quadro-RTX-60008000");
        check_sanitize("a ( ) b", "a-b");
        check_sanitize("keep-_.these", "keep-_.these");
        check_sanitize("a\tb", "ab"); /* tab is deleted before splitting, as GFD does */
        check_sanitize("Ünïcode £ x", "ncode-x");
        check_sanitize("", "");
        check_sanitize("   ", "");
        check_sanitize("(())", "");
}

static LabelPciGpu gpu(const char *address, uint16_t device_id, uint32_t class_code, const char *name) {
        LabelPciGpu d = {
                .vendor_id = 0x10de,
                .device_id = device_id,
                .class_code = class_code,
                .name = (char *) name,
        };
        snprintf(d.address, sizeof d.address, "%s", address);
        return d;
}

static void check_product(const char *name, uint16_t device_id, const char *want) {
        LabelPciGpu d = gpu("0000:01:00.0", device_id, 0x030200, name);
        _cleanup_free_ char *p = label_product_from_pci(&d);
        assert_non_null(p);
        assert_string_equal(p, want);
}

static void test_product_from_pci(void **state) {
        check_product("GH100 [H100 SXM5 80GB]", 0x2330, "NVIDIA-H100-SXM5-80GB");
        check_product("GH100[H100 SXM5 80GB]", 0x2330, "NVIDIA-H100-SXM5-80GB");
        check_product("GA100 [A100 PCIe 40GB]", 0x20f1, "NVIDIA-A100-PCIe-40GB");
        check_product("AD102GL [L40S]", 0x26b9, "NVIDIA-L40S");
        check_product("TU102GL [Quadro RTX 6000/8000]", 0x1e30, "NVIDIA-Quadro-RTX-60008000");
        check_product("GB100 [NVIDIA B200]", 0x2901, "NVIDIA-B200"); /* no "NVIDIA-NVIDIA-" */
        check_product("GP102 [TITAN X (Pascal)]", 0x1b00, "NVIDIA-TITAN-X-Pascal");
        check_product("Some Future Chip", 0x3000, "NVIDIA-Some-Future-Chip");
        check_product("GH100 [H200 SXM 141GB", 0x2335, "NVIDIA-H200-SXM-141GB"); /* unterminated */
        /* Unknown to pci.ids, or nothing usable in the name: the device id, 4 hex digits. */
        check_product(NULL, 0x2330, "NVIDIA-2330");
        check_product(NULL, 0x0fff, "NVIDIA-0fff");
        check_product("GH100 [()]", 0x2324, "NVIDIA-2324");
}

static const char *warning_containing(char **warnings, const char *needle) {
        STRV_FOREACH(w, warnings)
                if (strstr(*w, needle))
                        return *w;
        return NULL;
}

static void compute(LabelPciGpu *gpus, size_t n, const char *machine, LabelSet **ret, char ***warnings) {
                LabelInput in = {
                .pci_gpus = gpus,
                .n_pci_gpus = n,
                .machine = machine,
                .agent_state = "ready",
                .version = "0.1.0",
        };
        assert_int_equal(labels_compute(&in, ret, warnings), 0);
        assert_non_null(*ret);
}

static void test_compute_hgx(void **state) {
        LabelPciGpu g[8];
        _cleanup_(label_set_freep) LabelSet *s = NULL;
        _cleanup_strv_free_ char **warnings = NULL;
        static const char *addr[] = { "0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
                                      "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0" };

        for (size_t i = 0; i < 8; i++)
                g[i] = gpu(addr[i], 0x2330, 0x030200, "GH100 [H100 SXM5 80GB]");
        /* g[7] may be one passed through to a VM (vfio-pci): the daemon lists every GPU PCI sees, and
         * each counts as one of the node's GPUs (LabelPciGpu has no driver to tell them apart). */

        compute(g, 8, "DGX H100", &s, &warnings);
        assert_null(warnings);

        static const char *want[][2] = {
                { "nvidia.com/gpu-node-agent.state", "ready" },
                { "nvidia.com/gpu-node-agent.version", "0.1.0" },
                { "nvidia.com/gpu.count", "8" },
                { "nvidia.com/gpu.machine", "DGX-H100" },
                { "nvidia.com/gpu.mode", "compute" },
                { "nvidia.com/gpu.present", "true" },
                { "nvidia.com/gpu.product", "NVIDIA-H100-SXM5-80GB" },
        };
        assert_int_equal(s->n, ELEMENTSOF(want));
        for (size_t i = 0; i < ELEMENTSOF(want); i++) {
                assert_string_equal(s->labels[i].key, want[i][0]);
                assert_string_equal(s->labels[i].value, want[i][1]);
        }
}

/* Without NVML the product keeps the -SHARED suffix that the GFD set gives shared GPUs (no flapping
 * nodeSelector when NVML goes away), and only where GFD would add it. */
static void check_shared(LabelSharing sharing, unsigned replicas, bool rename_by_default, const char *want) {
        LabelPciGpu g[1] = { gpu("0000:18:00.0", 0x2330, 0x030200, "GH100 [H100 SXM5 80GB]") };
        LabelInput in = {
                .pci_gpus = g, .n_pci_gpus = 1, .sharing = sharing, .replicas = replicas,
                .rename_by_default = rename_by_default,
        };
        _cleanup_(label_set_freep) LabelSet *s = NULL;

        assert_int_equal(labels_compute(&in, &s, NULL), 0);
        assert_string_equal(label_set_get(s, "nvidia.com/gpu.product"), want);
}

static void test_shared_without_nvml(void **state) {
        check_shared(LABEL_SHARING_TIME_SLICING, 4, false, "NVIDIA-H100-SXM5-80GB-SHARED");
        check_shared(LABEL_SHARING_MPS, 2, false, "NVIDIA-H100-SXM5-80GB-SHARED");
        check_shared(LABEL_SHARING_TIME_SLICING, 4, true, "NVIDIA-H100-SXM5-80GB");
        check_shared(LABEL_SHARING_TIME_SLICING, 1, false, "NVIDIA-H100-SXM5-80GB");
        check_shared(LABEL_SHARING_NONE, 4, false, "NVIDIA-H100-SXM5-80GB");
}

static void check_mode(uint32_t c1, uint32_t c2, const char *want) {
        LabelPciGpu g[2] = {
                gpu("0000:01:00.0", 0x26b9, c1, "AD102GL [L40S]"),
                gpu("0000:02:00.0", 0x26b9, c2, "AD102GL [L40S]"),
        };
        _cleanup_(label_set_freep) LabelSet *s = NULL;

        compute(g, 2, NULL, &s, NULL);
        assert_string_equal(label_set_get(s, "nvidia.com/gpu.mode"), want);
}

static void test_mode(void **state) {
        check_mode(0x030200, 0x030200, "compute");
        check_mode(0x030000, 0x030000, "graphics");
        check_mode(0x030000, 0x030200, "unknown");
        check_mode(0x030200, 0x038000, "unknown");
        check_mode(0x030201, 0x030200, "compute"); /* prog-if byte does not matter */
}

static void test_machine(void **state) {
        LabelPciGpu g[1] = { gpu("0000:01:00.0", 0x26b9, 0x030200, "AD102GL [L40S]") };
        static const char *cases[][2] = {
                { NULL, "unknown" },
                { "", "unknown" },
                { "  (( ))  ", "unknown" },
                { "PowerEdge R760xa", "PowerEdge-R760xa" },
                { " ProLiant DL380 Gen11 (P52560-B21) ", "ProLiant-DL380-Gen11-P52560-B21" },
        };

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                _cleanup_(label_set_freep) LabelSet *s = NULL;
                _cleanup_strv_free_ char **warnings = NULL;
                compute(g, 1, cases[i][0], &s, &warnings);
                assert_string_equal(label_set_get(s, "nvidia.com/gpu.machine"), cases[i][1]);
                assert_null(warnings);
        }

        /* Sanitised but still not a valid value: never written, and the user is told. */
        _cleanup_(label_set_freep) LabelSet *s = NULL;
        _cleanup_strv_free_ char **warnings = NULL;
        compute(g, 1, "_Lab box_", &s, &warnings);
        assert_null(label_set_get(s, "nvidia.com/gpu.machine"));
        assert_string_equal(label_set_get(s, "nvidia.com/gpu.present"), "true");
        assert_int_equal(strv_length(warnings), 1);
        assert_non_null(strstr(warnings[0], "nvidia.com/gpu.machine left out"));
        assert_non_null(strstr(warnings[0], "'_Lab-box_'"));
}

static void test_heterogeneous(void **state) {
        _cleanup_(label_set_freep) LabelSet *s = NULL;
        _cleanup_strv_free_ char **warnings = NULL;
        LabelPciGpu g[5] = {
                gpu("0000:01:00.0", 0x2330, 0x030200, "GH100 [H100 SXM5 80GB]"),
                gpu("0000:02:00.0", 0x20f1, 0x030200, "GA100 [A100 PCIe 40GB]"),
                gpu("0000:03:00.0", 0x20f1, 0x030200, "GA100 [A100 PCIe 40GB]"),
                gpu("0000:04:00.0", 0x20f1, 0x030200, "GA100 [A100 PCIe 40GB]"),
                gpu("0000:05:00.0", 0x26b9, 0x030000, "AD102GL [L40S]"),
        };

        /* The most numerous model wins, whatever the order. */
        compute(g, 5, "x", &s, &warnings);
        assert_string_equal(label_set_get(s, "nvidia.com/gpu.product"), "NVIDIA-A100-PCIe-40GB");
        assert_string_equal(label_set_get(s, "nvidia.com/gpu.count"), "3");
        assert_string_equal(label_set_get(s, "nvidia.com/gpu.mode"), "unknown");
        assert_int_equal(strv_length(warnings), 1);
        assert_string_equal(warnings[0],
                            "GPUs of more than one model on this node: labelling NVIDIA-A100-PCIe-40GB (3 GPUs, "
                            "the most numerous); gpu.count and gpu.product leave out NVIDIA-H100-SXM5-80GB "
                            "(1 GPU), NVIDIA-L40S (1 GPU).");
}

static void test_heterogeneous_tie(void **state) {
        /* 2 + 2: the model whose first GPU has the lowest PCI address wins, even when it is not listed
         * first. */
        LabelPciGpu g[4] = {
                gpu("0000:20:00.0", 0x20f1, 0x030200, "GA100 [A100 PCIe 40GB]"),
                gpu("0000:10:00.0", 0x2330, 0x030200, "GH100 [H100 SXM5 80GB]"),
                gpu("0000:30:00.0", 0x20f1, 0x030200, "GA100 [A100 PCIe 40GB]"),
                gpu("0000:40:00.0", 0x2330, 0x030200, "GH100 [H100 SXM5 80GB]"),
        };

        for (int round = 0; round < 2; round++) {
                _cleanup_(label_set_freep) LabelSet *s = NULL;
                _cleanup_strv_free_ char **warnings = NULL;
                if (round == 1) {
                        /* Swap listing order: the choice must not change. */
                        LabelPciGpu t = g[0];
                        g[0] = g[1];
                        g[1] = t;
                }
                compute(g, 4, "x", &s, &warnings);
                assert_string_equal(label_set_get(s, "nvidia.com/gpu.product"), "NVIDIA-H100-SXM5-80GB");
                assert_string_equal(label_set_get(s, "nvidia.com/gpu.count"), "2");
                assert_non_null(warning_containing(warnings, "leave out NVIDIA-A100-PCIe-40GB (2 GPUs)"));
        }
}

static void test_long_product(void **state) {
        static const char *long1 =
                "GX999 [Hypothetical Accelerator With An Extraordinarily Long Marketing Name 288GB HBM3e Edition A]";
        static const char *long2 =
                "GX999 [Hypothetical Accelerator With An Extraordinarily Long Marketing Name 288GB HBM3e Edition B]";
        char *values[3] = {};

        for (size_t i = 0; i < 3; i++) {
                LabelPciGpu g[1] = { gpu("0000:01:00.0", 0x3001, 0x030200, i == 1 ? long2 : long1) };
                _cleanup_(label_set_freep) LabelSet *s = NULL;
                _cleanup_strv_free_ char **warnings = NULL;

                compute(g, 1, "x", &s, &warnings);
                const char *v = label_set_get(s, "nvidia.com/gpu.product");
                assert_non_null(v);
                assert_true(strlen(v) <= 63);
                assert_true(label_value_is_valid(v));
                /* A recognisable prefix of the model, then "-" and 6 hex digits. */
                assert_true(startswith(v, "NVIDIA-Hypothetical-Accelerator-With-An-Extraordinarily-"));
                size_t n = strlen(v);
                assert_int_equal(v[n - 7], '-');
                assert_int_equal(strspn(v + n - 6, "0123456789abcdef"), 6);

                const char *w = warning_containing(warnings, "nvidia.com/gpu.product");
                assert_non_null(w);
                assert_non_null(strstr(w, "longer than the 63 characters"));
                assert_non_null(strstr(w, v));
                values[i] = strdup(v);
                assert_non_null(values[i]);
        }
        /* Deterministic across runs, and two models sharing the first 56 characters stay apart. */
        assert_string_equal(values[0], values[2]);
        assert_string_not_equal(values[0], values[1]);
        for (size_t i = 0; i < 3; i++)
                free(values[i]);

        /* Exactly 63 characters is left alone. */
        _cleanup_free_ char *name = NULL, *pad = repeat('x', 63 - strlen("NVIDIA-"));
        assert_true(asprintf(&name, "GX [%s]", pad) > 0);
        LabelPciGpu g[1] = { gpu("0000:01:00.0", 0x3001, 0x030200, name) };
        _cleanup_(label_set_freep) LabelSet *s = NULL;
        _cleanup_strv_free_ char **warnings = NULL;
        compute(g, 1, "x", &s, &warnings);
        assert_int_equal(strlen(label_set_get(s, "nvidia.com/gpu.product")), 63);
        assert_null(warnings);
}

static void test_no_gpu(void **state) {
        _cleanup_(label_set_freep) LabelSet *s = NULL;
        _cleanup_strv_free_ char **warnings = NULL;

        compute(NULL, 0, "DGX H100", &s, &warnings);
        assert_int_equal(s->n, 0);
        assert_null(warnings);
        s = label_set_free(s);

        LabelInput in = { .agent_state = "ready", .version = "0.1.0" };
        assert_int_equal(labels_compute(&in, &s, NULL), 0);
        assert_int_equal(s->n, 0);
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *f) {
        return remove(p) < 0 ? -1 : 0;
}

static void test_read_machine(void **state) {
        char tmp[] = "/tmp/test-label-XXXXXX";
        _cleanup_free_ char *dmi = NULL, *file = NULL, *m = NULL;

        assert_non_null(mkdtemp(tmp));
        assert_int_equal(label_read_machine(tmp, &m), 0);
        assert_null(m);

        dmi = path_join(tmp, "class/dmi/id");
        file = path_join(dmi, "product_name");
        assert_int_equal(mkdir_p(dmi, 0755), 0);
        FILE *f = fopen(file, "w");
        assert_non_null(f);
        fputs("DGX H100  \n", f);
        fclose(f);
        assert_int_equal(label_read_machine(tmp, &m), 0);
        assert_string_equal(m, "DGX H100");
        m = mfree(m);

        f = fopen(file, "w");
        assert_non_null(f);
        fclose(f);
        assert_int_equal(label_read_machine(tmp, &m), 0);
        assert_null(m);

        assert_int_equal(nftw(tmp, rm_one, 16, FTW_DEPTH | FTW_PHYS), 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_key_validation),
                cmocka_unit_test(test_value_validation),
                cmocka_unit_test(test_set),
                cmocka_unit_test(test_shared_without_nvml),
                cmocka_unit_test(test_sanitize),
                cmocka_unit_test(test_product_from_pci),
                cmocka_unit_test(test_compute_hgx),
                cmocka_unit_test(test_mode),
                cmocka_unit_test(test_machine),
                cmocka_unit_test(test_heterogeneous),
                cmocka_unit_test(test_heterogeneous_tie),
                cmocka_unit_test(test_long_product),
                cmocka_unit_test(test_no_gpu),
                cmocka_unit_test(test_read_machine),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
