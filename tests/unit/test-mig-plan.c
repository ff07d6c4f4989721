/* SPDX-License-Identifier: MIT */
/* Tests the MIG planner on hand-built GPU states with the profile tables of tests/fixtures/
 * mig-profiles.yaml (A100-40GB, A100-80GB, H100, H200: 8 memory slices; A30: 4; L40S: no MIG) and
 * mig-parted's own config files. Plans are checked step by step for representative cases, and every
 * plan is applied by a small simulator that enforces the driver's rules (placements, overlaps, limits,
 * mode) so that "re-planning after applying is empty" is checked for every all-<profile> config. The
 * models and the simulator live in mig-test-gpus.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "mig-config.h"
#include "mig-plan.h"
#include "mig-test-gpus.h"
#include "strv.h"

#define STRV_MAKE(...) ((const char *const[]) { __VA_ARGS__, NULL })

/* ---- configs and plans ---- */

static MigConfigFile *load(const char *name) {
        const char *src = getenv("GNA_SOURCE_ROOT");
        if (!src)
                fail_msg("GNA_SOURCE_ROOT is not set; run through meson test");
        _cleanup_free_ char *path = strprintf("%s/tests/fixtures/mig-parted/%s", src, name), *error = NULL;
        MigConfigFile *f = NULL;
        if (mig_config_file_load(path, &f, &error) < 0)
                fail_msg("%s", strna(error));
        return f;
}

static MigConfigFile *parse(const char *text) {
        _cleanup_free_ char *error = NULL;
        MigConfigFile *f = NULL;
        if (mig_config_file_parse("mig.yaml", text, strlen(text), &f, &error) < 0)
                fail_msg("%s", strna(error));
        return f;
}

static const MigConfig *config(const MigConfigFile *f, const char *name) {
        const MigConfig *c = NULL;
        assert_int_equal(mig_config_file_find(f, name, &c, NULL), 0);
        return c;
}

static MigPlan *plan_ok(const MigConfig *c, const MigTestNode *node) {
        _cleanup_free_ char *error = NULL;
        MigPlan *p = NULL;
        int r = mig_plan_build(c, node->gpus, node->n, &p, &error);
        if (r < 0)
                fail_msg("%s: %s", c->name, strna(error));
        assert_string_equal(p->config_name, c->name);
        return p;
}

static void plan_fails(const MigConfig *c, const MigTestNode *node, const char *message) {
        _cleanup_free_ char *error = NULL;
        MigPlan *p = NULL;
        assert_int_equal(mig_plan_build(c, node->gpus, node->n, &p, &error), -EINVAL);
        assert_null(p);
        if (!streq_ptr(error, message))
                fail_msg("expected: %s\n     got: %s", message, strna(error));
}

static const MigGpuPlan *gpu_plan(const MigPlan *p, unsigned gpu) {
        for (size_t i = 0; i < p->n_gpus; i++)
                if (p->gpus[i].gpu == gpu)
                        return &p->gpus[i];
        return NULL;
}

static void assert_steps(const MigGpuPlan *p, const char *const *expected) {
        _cleanup_strv_free_ char **got = NULL;
        assert_non_null(p);
        for (size_t i = 0; i < p->n_steps; i++)
                assert_int_equal(strv_consume(&got, mig_step_to_string(&p->steps[i])), 0);
        if (!strv_equal(got, (char **) expected)) {
                _cleanup_free_ char *a = strv_join((char **) expected, "\n  "), *b = strv_join(got, "\n  ");
                fail_msg("GPU %u steps differ.\nexpected:\n  %s\ngot:\n  %s", p->gpu, a, b);
        }
}

/* Applies c, then checks that planning c again finds nothing to do. */
static void apply_and_recheck(const MigConfig *c, MigTestNode *node) {
        _cleanup_(mig_plan_freep) MigPlan *p = plan_ok(c, node), *again = NULL;
        mig_test_apply(node, p);
        again = plan_ok(c, node);
        if (again->n_gpus > 0) {
                _cleanup_free_ char *s = mig_step_to_string(&again->gpus[0].steps[0]);
                fail_msg("%s: re-planning after apply is not empty: GPU %u: %s …", c->name, again->gpus[0].gpu, s);
        }
}

/* ---- tests ---- */

static void test_a100_disabled_to_balanced(void **state) {
        (void) state;
        _cleanup_(mig_config_file_freep) MigConfigFile *f = load("config-default.yaml");
        _cleanup_(mig_test_node_done) MigTestNode node = mig_test_node_same(&mig_test_a100_40, 8);
        _cleanup_(mig_plan_freep) MigPlan *p = plan_ok(config(f, "all-balanced"), &node), *again = NULL;

        assert_int_equal(p->n_gpus, 8);
        assert_int_equal(p->n_unmanaged, 0);
        for (unsigned i = 0; i < 8; i++) {
                const MigGpuPlan *g = gpu_plan(p, i);
                assert_steps(g, STRV_MAKE("set-mode 1", "create-gi 3g.20gb id=9 start=4 size=4",
                                          "create-gi 2g.10gb id=14 start=0 size=2",
                                          "create-gi 1g.5gb id=19 start=2 size=1",
                                          "create-gi 1g.5gb id=19 start=3 size=1", "create-ci 3g.20gb id=2 gi=#1",
                                          "create-ci 2g.10gb id=1 gi=#2", "create-ci 1g.5gb id=0 gi=#3",
                                          "create-ci 1g.5gb id=0 gi=#4"));
                assert_false(g->needs_reset);
                assert_string_equal(g->pci_address, node.gpus[i].pci_address);
        }
        const MigStep *s = &p->gpus[3].steps[1];
        assert_int_equal(s->kind, MIG_STEP_CREATE_GI);
        assert_int_equal(s->profile_id, 9);
        assert_int_equal(s->start, 4);
        assert_int_equal(s->size, 4);
        s = &p->gpus[3].steps[8];
        assert_int_equal(s->kind, MIG_STEP_CREATE_CI);
        assert_int_equal(s->profile_id, 0);
        assert_int_equal(s->gi_step, 4);
        assert_string_equal(s->profile, "1g.5gb");

        mig_test_apply(&node, p);
        _cleanup_free_ char *layout = mig_test_layout_of(&node.gpus[7]);
        assert_string_equal(layout, "2g.10gb@0 1g.5gb@2 1g.5gb@3 3g.20gb@4");
        /* idempotent: the same config again is an empty plan (no writes, no hooks) */
        again = plan_ok(config(f, "all-balanced"), &node);
        assert_int_equal(again->n_gpus, 0);
        assert_int_equal(again->n_unmanaged, 0);
}

/* Every config of config-default.yaml on four GPUs of one model, from MIG disabled: the ones meant for
 * the model apply (and re-planning after them is empty), the others are refused for naming a profile
 * the model does not have, or leave the GPUs unmanaged when their device-filter names other models. */
static void check_model(const MigConfigFile *f, const MigTestModel *m, const char *const *expected_applied) {
        _cleanup_strv_free_ char **applied = NULL;

        for (size_t i = 0; i < f->n_configs; i++) {
                const MigConfig *c = &f->configs[i];
                _cleanup_(mig_test_node_done) MigTestNode node = mig_test_node_same(m, 4);
                _cleanup_(mig_plan_freep) MigPlan *p = NULL;
                _cleanup_free_ char *error = NULL;

                int r = mig_plan_build(c, node.gpus, node.n, &p, &error);
                if (r < 0) {
                        assert_int_equal(r, -EINVAL);
                        if (!strstr(error, "): no MIG profile '"))
                                fail_msg("%s on %s: %s", c->name, m->name, error);
                        continue;
                }
                if (p->n_unmanaged == 4)
                        continue;
                assert_int_equal(p->n_unmanaged, 0);
                if (p->n_gpus == 0)
                        continue;
                assert_int_equal(p->n_gpus, 4);
                assert_int_equal(strv_extend(&applied, c->name), 0);
                apply_and_recheck(c, &node);

                /* the GPUs now hold exactly what the entry asked for */
                const MigConfigEntry *e = mig_config_match(c, &node.gpus[0]);
                unsigned wanted = 0;
                for (size_t k = 0; k < e->n_requests; k++) {
                        unsigned have = 0;
                        for (size_t gi = 0; gi < node.gpus[2].n_gis; gi++)
                                have += streq(mig_test_profile_by_id(&node.gpus[2],
                                                                     node.gpus[2].gis[gi].profile_id)->name,
                                              e->requests[k].profile);
                        assert_int_equal(have, e->requests[k].count);
                        wanted += e->requests[k].count;
                }
                assert_int_equal(node.gpus[2].n_gis, wanted);
                assert_true(node.gpus[2].mig_current);
        }
        if (!strv_equal(applied, (char **) expected_applied)) {
                _cleanup_free_ char *a = strv_join((char **) expected_applied, " "), *b = strv_join(applied, " ");
                fail_msg("%s:\nexpected %s\n     got %s", m->name, a, b);
        }
}

static void test_each_profile_config_per_model(void **state) {
        (void) state;
        _cleanup_(mig_config_file_freep) MigConfigFile *f = load("config-default.yaml");

        check_model(f, &mig_test_a100_40,
                    STRV_MAKE("all-enabled", "all-1g.5gb", "all-1g.5gb.me", "all-2g.10gb", "all-3g.20gb",
                              "all-4g.20gb", "all-7g.40gb", "all-1g.10gb", "all-balanced"));
        check_model(f, &mig_test_h100,
                    STRV_MAKE("all-enabled", "all-1g.10gb", "all-1g.10gb.me", "all-1g.20gb", "all-2g.20gb",
                              "all-3g.40gb", "all-4g.40gb", "all-7g.80gb", "all-balanced"));
        check_model(f, &mig_test_h200,
                    STRV_MAKE("all-enabled", "all-balanced", "all-1g.18gb", "all-1g.18gb.me", "all-1g.35gb",
                              "all-2g.35gb", "all-3g.71gb", "all-4g.71gb", "all-7g.141gb"));
        check_model(f, &mig_test_a30,
                    STRV_MAKE("all-enabled", "all-1g.6gb", "all-1g.6gb.me", "all-2g.12gb", "all-2g.12gb.me",
                              "all-4g.24gb", "all-balanced"));
}

static void test_h100_all_1g(void **state) {
        (void) state;
        _cleanup_(mig_config_file_freep) MigConfigFile *f = load("config-default.yaml");
        _cleanup_(mig_test_node_done) MigTestNode node = mig_test_node_same(&mig_test_h100, 8);
        _cleanup_(mig_plan_freep) MigPlan *p = plan_ok(config(f, "all-1g.10gb"), &node);

        assert_int_equal(p->n_gpus, 8);
        assert_steps(gpu_plan(p, 0), STRV_MAKE("set-mode 1",
                                               "create-gi 1g.10gb id=19 start=0 size=1",
                                               "create-gi 1g.10gb id=19 start=1 size=1",
                                               "create-gi 1g.10gb id=19 start=2 size=1",
                                               "create-gi 1g.10gb id=19 start=3 size=1",
                                               "create-gi 1g.10gb id=19 start=4 size=1",
                                               "create-gi 1g.10gb id=19 start=5 size=1",
                                               "create-gi 1g.10gb id=19 start=6 size=1",
                                               "create-ci 1g.10gb id=0 gi=#1", "create-ci 1g.10gb id=0 gi=#2",
                                               "create-ci 1g.10gb id=0 gi=#3", "create-ci 1g.10gb id=0 gi=#4",
                                               "create-ci 1g.10gb id=0 gi=#5", "create-ci 1g.10gb id=0 gi=#6",
                                               "create-ci 1g.10gb id=0 gi=#7"));
}

static void test_one_gpu_changed(void **state) {
        (void) state;
        _cleanup_(mig_config_file_freep) MigConfigFile *f = load("config-default.yaml");
        _cleanup_(mig_test_node_done) MigTestNode node = mig_test_node_same(&mig_test_h100, 8);
        const MigConfig *c = config(f, "all-balanced");

        apply_and_recheck(c, &node);
        /* someone re-partitioned GPU 5 by hand */
        mig_test_set_layout(&node.gpus[5], "7g.80gb@0");
        _cleanup_(mig_plan_freep) MigPlan *p = plan_ok(c, &node);
        assert_int_equal(p->n_gpus, 1);
        assert_steps(gpu_plan(p, 5), STRV_MAKE("destroy-ci gi=0 ci=0 (7g.80gb)",
                                               "destroy-gi gi=0 (7g.80gb)", "create-gi 3g.40gb id=9 start=4 size=4",
                                               "create-gi 2g.20gb id=14 start=0 size=2",
                                               "create-gi 1g.10gb id=19 start=2 size=1",
                                               "create-gi 1g.10gb id=19 start=3 size=1",
                                               "create-ci 3g.40gb id=2 gi=#2", "create-ci 2g.20gb id=1 gi=#3",
                                               "create-ci 1g.10gb id=0 gi=#4", "create-ci 1g.10gb id=0 gi=#5"));

        /* a GI missing on GPU 2: only the missing one is created, the rest stays */
        apply_and_recheck(c, &node);
        mig_test_set_layout(&node.gpus[2], "2g.20gb@0 1g.10gb@2 3g.40gb@4");
        mig_plan_free(p);
        p = plan_ok(c, &node);
        assert_int_equal(p->n_gpus, 1);
        assert_steps(gpu_plan(p, 2), STRV_MAKE("create-gi 1g.10gb id=19 start=3 size=1",
                                               "create-ci 1g.10gb id=0 gi=#0"));
        assert_int_equal(p->gpus[0].steps[1].gi_step, 0);
}

static void test_keep_existing_where_the_rest_fits(void **state) {
        (void) state;
        _cleanup_(mig_config_file_freep) MigConfigFile *f = load("config-default.yaml");
        _cleanup_(mig_test_node_done) MigTestNode node = mig_test_node_same(&mig_test_a100_40, 1);

        /* 7 × 1g.5gb → balanced: two of the 1g stay, at the starts where 2g and 3g still fit */
        mig_test_set_layout(&node.gpus[0], "1g.5gb@0 1g.5gb@1 1g.5gb@2 1g.5gb@3 1g.5gb@4 1g.5gb@5 1g.5gb@6");
        _cleanup_(mig_plan_freep) MigPlan *p = plan_ok(config(f, "all-balanced"), &node);
        assert_steps(gpu_plan(p, 0), STRV_MAKE("destroy-ci gi=7 ci=0 (1g.5gb)",
                                               "destroy-ci gi=8 ci=0 (1g.5gb)", "destroy-ci gi=11 ci=0 (1g.5gb)",
                                               "destroy-ci gi=12 ci=0 (1g.5gb)", "destroy-ci gi=13 ci=0 (1g.5gb)",
                                               "destroy-gi gi=7 (1g.5gb)", "destroy-gi gi=8 (1g.5gb)",
                                               "destroy-gi gi=11 (1g.5gb)", "destroy-gi gi=12 (1g.5gb)",
                                               "destroy-gi gi=13 (1g.5gb)", "create-gi 3g.20gb id=9 start=4 size=4",
                                               "create-gi 2g.10gb id=14 start=0 size=2",
                                               "create-ci 3g.20gb id=2 gi=#10", "create-ci 2g.10gb id=1 gi=#11"));
        apply_and_recheck(config(f, "all-balanced"), &node);

        /* 1g at 5 and 6 cannot stay under 3g@4 … but 1g at 0, 1 can: the planner finds them */
        mig_test_set_layout(&node.gpus[0], "1g.5gb@0 1g.5gb@6");
        mig_plan_free(p);
        p = plan_ok(config(f, "all-balanced"), &node);
        assert_steps(gpu_plan(p, 0), STRV_MAKE("destroy-ci gi=13 ci=0 (1g.5gb)",
                                               "destroy-gi gi=13 (1g.5gb)", "create-gi 3g.20gb id=9 start=4 size=4",
                                               "create-gi 2g.10gb id=14 start=2 size=2",
                                               "create-gi 1g.5gb id=19 start=1 size=1", "create-ci 3g.20gb id=2 gi=#2",
                                               "create-ci 2g.10gb id=1 gi=#3", "create-ci 1g.5gb id=0 gi=#4"));
}

static void test_unknown_profile(void **state) {
        (void) state;
        _cleanup_(mig_config_file_freep) MigConfigFile *f = load("config-default.yaml");
        _cleanup_(mig_test_node_done) MigTestNode h100 = mig_test_node_same(&mig_test_h100, 8);
        const MigTestModel *mixed[] = { &mig_test_a100_40, &mig_test_a100_40, &mig_test_h100, &mig_test_h100,
                                        &mig_test_a30 };
        _cleanup_(mig_test_node_done) MigTestNode node = mig_test_node_new(mixed, 5);

        plan_fails(config(f, "all-1g.5gb"), &h100,
                   "GPUs 0-7 (NVIDIA H100 80GB HBM3): no MIG profile '1g.5gb' (entry on line 14); valid profiles: "
                   "1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb");
        /* the A100s could take it, but nothing is planned while another GPU cannot */
        plan_fails(config(f, "all-1g.5gb"), &node,
                   "GPUs 2, 3 (NVIDIA H100 80GB HBM3): no MIG profile '1g.5gb' (entry on line 14); valid profiles: "
                   "1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb\n"
                   "GPU 4 (NVIDIA A30): no MIG profile '1g.5gb' (entry on line 14); valid profiles: 1g.6gb, "
                   "1g.6gb+me, 2g.12gb, 2g.12gb+me, 4g.24gb");

        /* well-formed but not a profile of this GPU: mig-parted would wipe the GPU, we refuse */
        _cleanup_(mig_config_file_freep) MigConfigFile *g = parse(
                "version: v1\nmig-configs:\n  bad:\n    - devices: all\n      mig-enabled: true\n"
                "      mig-devices: {\"1g.5gb\": 1, \"1g.7gb\": 1}\n");
        plan_fails(config(g, "bad"), &node,
                   "GPUs 0, 1 (NVIDIA A100-SXM4-40GB): no MIG profile '1g.7gb' (entry on line 4); valid profiles: "
                   "1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb\n"
                   "GPUs 2, 3 (NVIDIA H100 80GB HBM3): no MIG profile '1g.5gb' (entry on line 4); valid profiles: "
                   "1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb\n"
                   "GPU 4 (NVIDIA A30): no MIG profile '1g.5gb' (entry on line 4); valid profiles: 1g.6gb, "
                   "1g.6gb+me, 2g.12gb, 2g.12gb+me, 4g.24gb");
}

static void test_over_capacity(void **state) {
        (void) state;
        _cleanup_(mig_test_node_done) MigTestNode node = mig_test_node_same(&mig_test_a100_40, 2);
        _cleanup_(mig_test_node_done) MigTestNode a30 = mig_test_node_same(&mig_test_a30, 1);
        _cleanup_(mig_config_file_freep) MigConfigFile *f = parse(
                "version: v1\nmig-configs:\n"
                "  too-many:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {3g.20gb: 3}\n"
                "  compute:\n    - devices: all\n      mig-enabled: true\n"
                "      mig-devices: {1g.5gb: 1, 4g.20gb: 1, 3g.20gb: 1}\n"
                "  memory:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {3g.20gb: 2, 1g.5gb: 1}\n"
                "  me:\n    - devices: [1]\n      mig-enabled: true\n      mig-devices: {1g.5gb+me: 2}\n"
                "  a30:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {2g.12gb: 2, 1g.6gb: 1}\n");

        plan_fails(config(f, "too-many"), &node, "GPUs 0, 1 (NVIDIA A100-SXM4-40GB): 3 × 3g.20gb is more than the GPU "
                                                 "holds: at most 2 instances of 3g.20gb");
        plan_fails(config(f, "compute"), &node, "GPUs 0, 1 (NVIDIA A100-SXM4-40GB): 1 × 4g.20gb + 1 × 3g.20gb + "
                                                "1 × 1g.5gb need 8 compute slices; the GPU has 7");
        plan_fails(config(f, "memory"), &node, "GPUs 0, 1 (NVIDIA A100-SXM4-40GB): 2 × 3g.20gb + 1 × 1g.5gb need 9 "
                                               "memory slices; the GPU has 8");
        plan_fails(config(f, "me"), &node, "GPU 1 (NVIDIA A100-SXM4-40GB): 2 × 1g.5gb+me is more than the GPU holds: "
                                           "at most 1 instance of 1g.5gb+me");
        plan_fails(config(f, "a30"), &a30, "GPU 0 (NVIDIA A30): 2 × 2g.12gb + 1 × 1g.6gb need 5 compute slices; the "
                                           "GPU has 4");
}

static void test_no_placement(void **state) {
        (void) state;
        /* a made-up GPU whose 2g can only sit in the middle and whose 1g cannot use the last slice */
        static const MigTestProfileTemplate t[] = {
                { 0, 0, 4, 1, 4, { 0 }, 1 },
                { 1, 1, 2, 1, 2, { 1 }, 1 },
                { 2, 2, 1, 4, 1, { 0, 1, 2 }, 3 },
        };
        static const MigTestModel odd = { "Odd GPU", 0x000110DE, 0, t, 3, 4, { "4g.8gb", "2g.4gb", "1g.2gb" } };
        _cleanup_(mig_test_node_done) MigTestNode node = mig_test_node_same(&odd, 1);
        _cleanup_(mig_config_file_freep) MigConfigFile *f = parse(
                "version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: true\n"
                "      mig-devices: {1g.2gb: 2, 2g.4gb: 1}\n");

        plan_fails(config(f, "c"), &node,
                   "GPU 0 (Odd GPU): 1 × 2g.4gb + 2 × 1g.2gb fit by count and size but not by placement: no free "
                   "placement is left for 1g.2gb (it can start at memory slice 0, 1, 2) once the larger ones are "
                   "placed");
}

static void test_count_zero(void **state) {
        (void) state;
        _cleanup_(mig_test_node_done) MigTestNode node = mig_test_node_same(&mig_test_a100_40, 1);
        _cleanup_(mig_config_file_freep) MigConfigFile *f = parse(
                "version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: true\n"
                "      mig-devices: {1g.5gb: 0, 3g.20gb: 2, 7g.80gb: 0}\n");

        mig_test_set_layout(&node.gpus[0], "1g.5gb@0");
        _cleanup_(mig_plan_freep) MigPlan *p = plan_ok(config(f, "c"), &node);
        assert_steps(gpu_plan(p, 0), STRV_MAKE("destroy-ci gi=7 ci=0 (1g.5gb)",
                                               "destroy-gi gi=7 (1g.5gb)", "create-gi 3g.20gb id=9 start=0 size=4",
                                               "create-gi 3g.20gb id=9 start=4 size=4", "create-ci 3g.20gb id=2 gi=#2",
                                               "create-ci 3g.20gb id=2 gi=#3"));
        apply_and_recheck(config(f, "c"), &node);
}

static void test_device_filter_and_indices(void **state) {
        (void) state;
        const MigTestModel *models[] = { &mig_test_a100_40, &mig_test_a100_40, &mig_test_h100, &mig_test_a100_40 };
        _cleanup_(mig_test_node_done) MigTestNode node = mig_test_node_new(models, 4);
        _cleanup_(mig_config_file_freep) MigConfigFile *f = parse(
                "version: v1\nmig-configs:\n  c:\n"
                "    - device-filter: \"0x20b010de:0x134f10de\"\n      devices: all\n      mig-enabled: true\n"
                "      mig-devices: {7g.40gb: 1}\n"
                "    - device-filter: [\"0x20B010DE:0x145F10DE\"]\n      devices: all\n      mig-enabled: true\n"
                "      mig-devices: {3g.20gb: 2}\n"
                "    - device-filter: 0x20B010DE\n      devices: [0, 7]\n      mig-enabled: true\n"
                "      mig-devices: {4g.20gb: 1}\n");

        node.gpus[1].subsystem_id = 0x145F10DE;
        _cleanup_(mig_plan_freep) MigPlan *p = plan_ok(config(f, "c"), &node);
        assert_int_equal(p->n_gpus, 3);
        /* GPU 0: the third entry (filter without subsystem, index 0) comes last and wins */
        assert_steps(gpu_plan(p, 0), STRV_MAKE("set-mode 1", "create-gi 4g.20gb id=5 start=0 size=4",
                                               "create-ci 4g.20gb id=3 gi=#1"));
        assert_steps(gpu_plan(p, 1), STRV_MAKE("set-mode 1", "create-gi 3g.20gb id=9 start=0 size=4",
                                               "create-gi 3g.20gb id=9 start=4 size=4", "create-ci 3g.20gb id=2 gi=#1",
                                               "create-ci 3g.20gb id=2 gi=#2"));
        assert_steps(gpu_plan(p, 3), STRV_MAKE("set-mode 1", "create-gi 7g.40gb id=0 start=0 size=8",
                                               "create-ci 7g.40gb id=4 gi=#1"));
        assert_int_equal(p->n_unmanaged, 1);
        assert_int_equal(p->unmanaged[0], 2);
        assert_ptr_equal(mig_config_match(config(f, "c"), &node.gpus[0]), &config(f, "c")->entries[2]);
        assert_ptr_equal(mig_config_match(config(f, "c"), &node.gpus[2]), NULL);
}

static void test_last_entry_wins(void **state) {
        (void) state;
        _cleanup_(mig_test_node_done) MigTestNode node = mig_test_node_same(&mig_test_a100_40, 4);
        _cleanup_(mig_config_file_freep) MigConfigFile *f = parse(
                "version: v1\nmig-configs:\n  c:\n"
                "    - devices: all\n      mig-enabled: true\n      mig-devices: {7g.40gb: 1}\n"
                "    - devices: [2]\n      mig-enabled: false\n"
                "    - device-filter: 0x20B010DE\n      devices: [2, 3]\n      mig-enabled: true\n"
                "      mig-devices: {3g.20gb: 2}\n"
                "    - device-filter: 0x233010DE\n      devices: all\n      mig-enabled: false\n");

        mig_test_set_layout(&node.gpus[1], "7g.40gb@0");
        _cleanup_(mig_plan_freep) MigPlan *p = plan_ok(config(f, "c"), &node);
        assert_int_equal(p->n_gpus, 3);
        assert_non_null(gpu_plan(p, 0));
        assert_null(gpu_plan(p, 1)); /* already as wanted */
        assert_steps(gpu_plan(p, 2), STRV_MAKE("set-mode 1", "create-gi 3g.20gb id=9 start=0 size=4",
                                               "create-gi 3g.20gb id=9 start=4 size=4", "create-ci 3g.20gb id=2 gi=#1",
                                               "create-ci 3g.20gb id=2 gi=#2"));
        assert_non_null(gpu_plan(p, 3));
        apply_and_recheck(config(f, "c"), &node);
}

static void test_mixed_per_gpu_configs(void **state) {
        (void) state;
        _cleanup_(mig_config_file_freep) MigConfigFile *ex = load("examples-config.yaml");
        _cleanup_(mig_config_file_freep) MigConfigFile *dgx = load("examples-dgx-station-80gb-config.yaml");
        _cleanup_(mig_test_node_done) MigTestNode node = mig_test_node_same(&mig_test_a100_40, 8);

        /* custom-config: 0-3 off (already), 4: 7 × 1g.5gb, 5: 3 × 2g.10gb, 6: 2 × 3g.20gb, 7: balanced */
        _cleanup_(mig_plan_freep) MigPlan *p = plan_ok(config(ex, "custom-config"), &node);
        assert_int_equal(p->n_gpus, 4);
        for (unsigned i = 0; i < 4; i++)
                assert_null(gpu_plan(p, i));
        apply_and_recheck(config(ex, "custom-config"), &node);
        _cleanup_free_ char *l4 = mig_test_layout_of(&node.gpus[4]), *l5 = mig_test_layout_of(&node.gpus[5]),
                            *l6 = mig_test_layout_of(&node.gpus[6]);
        assert_string_equal(l4, "1g.5gb@0 1g.5gb@1 1g.5gb@2 1g.5gb@3 1g.5gb@4 1g.5gb@5 1g.5gb@6");
        assert_string_equal(l5, "2g.10gb@0 2g.10gb@2 2g.10gb@4");
        assert_string_equal(l6, "3g.20gb@0 3g.20gb@4");

        /* DGX Station A100-80GB: four MIG GPUs around a display GPU at index 3 */
        const MigTestModel *models[] = { &mig_test_a100_80, &mig_test_a100_80, &mig_test_a100_80, &mig_test_display,
                                         &mig_test_a100_80 };
        _cleanup_(mig_test_node_done) MigTestNode station = mig_test_node_new(models, 5);
        mig_plan_free(p);
        p = plan_ok(config(dgx, "balanced-k8s-dgx-station-80"), &station);
        assert_int_equal(p->n_unmanaged, 0);
        assert_int_equal(p->n_gpus, 3);
        assert_null(gpu_plan(p, 0));
        assert_null(gpu_plan(p, 3));
        apply_and_recheck(config(dgx, "balanced-k8s-dgx-station-80"), &station);
        _cleanup_free_ char *s1 = mig_test_layout_of(&station.gpus[1]), *s2 = mig_test_layout_of(&station.gpus[2]),
                            *s4 = mig_test_layout_of(&station.gpus[4]);
        assert_string_equal(s1, "3g.40gb@0 3g.40gb@4");
        assert_string_equal(s2, "2g.20gb@0 2g.20gb@2 2g.20gb@4 1g.10gb@6");
        assert_string_equal(s4, "1g.10gb@0 1g.10gb@1 1g.10gb@2 1g.10gb@3 1g.10gb@4 1g.10gb@5 1g.10gb@6");
        assert_false(station.gpus[0].mig_current);
}

static void test_non_mig_and_unmanaged(void **state) {
        (void) state;
        _cleanup_(mig_config_file_freep) MigConfigFile *f = load("config-default.yaml");
        const MigTestModel *models[] = { &mig_test_h100, &mig_test_l40s, &mig_test_h100, &mig_test_l40s };
        _cleanup_(mig_test_node_done) MigTestNode node = mig_test_node_new(models, 4);

        /* all-balanced filters by model: the L40S are no entry's business */
        _cleanup_(mig_plan_freep) MigPlan *p = plan_ok(config(f, "all-balanced"), &node);
        assert_int_equal(p->n_gpus, 2);
        assert_int_equal(p->n_unmanaged, 2);
        assert_int_equal(p->unmanaged[0], 1);
        assert_int_equal(p->unmanaged[1], 3);
        /* devices: all with MIG off covers the L40S too, and there is nothing to do on it */
        mig_plan_free(p);
        p = plan_ok(config(f, "all-disabled"), &node);
        assert_int_equal(p->n_gpus, 0);
        assert_int_equal(p->n_unmanaged, 0);
        /* devices: all with MIG on cannot be done on an L40S */
        plan_fails(config(f, "all-enabled"), &node,
                   "GPUs 1, 3 (NVIDIA L40S): MIG is not supported on this model, but the entry on line 8 enables it; "
                   "exclude such GPUs with device-filter or devices, or set mig-enabled: false for them");
        /* one L40S, named by index */
        _cleanup_(mig_config_file_freep) MigConfigFile *g = parse(
                "version: v1\nmig-configs:\n  c:\n    - devices: [0, 1]\n      mig-enabled: true\n"
                "      mig-devices: {}\n");
        plan_fails(config(g, "c"), &node,
                   "GPU 1 (NVIDIA L40S): MIG is not supported on this model, but the entry on line 4 enables it; "
                   "exclude such GPUs with device-filter or devices, or set mig-enabled: false for them");
}

static void test_disable(void **state) {
        (void) state;
        _cleanup_(mig_config_file_freep) MigConfigFile *f = load("config-default.yaml");
        _cleanup_(mig_test_node_done) MigTestNode node = mig_test_node_same(&mig_test_a100_40, 2);

        mig_test_set_layout(&node.gpus[1], "3g.20gb@4 2g.10gb@0 1g.5gb@2 1g.5gb@3/1c");
        _cleanup_(mig_plan_freep) MigPlan *p = plan_ok(config(f, "all-disabled"), &node);
        assert_int_equal(p->n_gpus, 1);
        assert_steps(gpu_plan(p, 1), STRV_MAKE("destroy-ci gi=2 ci=0 (3g.20gb)",
                                               "destroy-ci gi=3 ci=0 (2g.10gb)", "destroy-ci gi=9 ci=0 (1g.5gb)",
                                               "destroy-ci gi=10 ci=0 (1g.5gb)", "destroy-gi gi=2 (3g.20gb)",
                                               "destroy-gi gi=3 (2g.10gb)", "destroy-gi gi=9 (1g.5gb)",
                                               "destroy-gi gi=10 (1g.5gb)", "set-mode 0"));
        apply_and_recheck(config(f, "all-disabled"), &node);

        /* MIG on without devices: instances go, the mode stays */
        mig_test_set_layout(&node.gpus[0], "7g.40gb@0");
        mig_plan_free(p);
        p = plan_ok(config(f, "all-enabled"), &node);
        assert_steps(gpu_plan(p, 0), STRV_MAKE("destroy-ci gi=0 ci=0 (7g.40gb)", "destroy-gi gi=0 (7g.40gb)"));
        assert_steps(gpu_plan(p, 1), STRV_MAKE("set-mode 1"));
}

static void test_pending_mode(void **state) {
        (void) state;
        _cleanup_(mig_config_file_freep) MigConfigFile *f = load("config-default.yaml");
        _cleanup_(mig_test_node_done) MigTestNode node = mig_test_node_same(&mig_test_a100_40, 3);
        _cleanup_(mig_plan_freep) MigPlan *p = NULL;

        /* 0: on is pending until a reset; 1: off is pending; 2: on, with off pending and instances left */
        node.gpus[0].mig_pending = true;
        mig_test_set_layout(&node.gpus[1], "");
        node.gpus[1].mig_pending = false;
        mig_test_set_layout(&node.gpus[2], "7g.40gb@0");
        node.gpus[2].mig_pending = false;

        p = plan_ok(config(f, "all-4g.20gb"), &node);
        assert_steps(gpu_plan(p, 0), STRV_MAKE("reset-gpu", "create-gi 4g.20gb id=5 start=0 size=4",
                                               "create-ci 4g.20gb id=3 gi=#1"));
        assert_true(gpu_plan(p, 0)->needs_reset);
        assert_steps(gpu_plan(p, 1), STRV_MAKE("set-mode 1", "create-gi 4g.20gb id=5 start=0 size=4",
                                               "create-ci 4g.20gb id=3 gi=#1"));
        assert_false(gpu_plan(p, 1)->needs_reset);
        assert_steps(gpu_plan(p, 2), STRV_MAKE("destroy-ci gi=0 ci=0 (7g.40gb)", "destroy-gi gi=0 (7g.40gb)",
                                               "set-mode 1", "create-gi 4g.20gb id=5 start=0 size=4",
                                               "create-ci 4g.20gb id=3 gi=#3"));

        mig_plan_free(p);
        p = plan_ok(config(f, "all-disabled"), &node);
        assert_steps(gpu_plan(p, 0), STRV_MAKE("set-mode 0"));
        assert_steps(gpu_plan(p, 1), STRV_MAKE("reset-gpu"));
        assert_true(gpu_plan(p, 1)->needs_reset);
        assert_steps(gpu_plan(p, 2), STRV_MAKE("reset-gpu"));
        apply_and_recheck(config(f, "all-disabled"), &node);
}

static void test_compute_instance_profiles(void **state) {
        (void) state;
        _cleanup_(mig_test_node_done) MigTestNode node = mig_test_node_same(&mig_test_a100_40, 1);
        _cleanup_(mig_config_file_freep) MigConfigFile *f = parse(
                "version: v1\nmig-configs:\n"
                "  small-ci:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {1c.3g.20gb: 2}\n"
                "  whole:\n    - devices: all\n      mig-enabled: true\n"
                "      mig-devices: {3g.20gb: 1, 3c.3g.20gb: 1}\n"
                "  bad-ci:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {3c.4g.20gb: 1}\n");

        /* mig-parted's meaning: devices of one GI profile share one GI while its slices last */
        _cleanup_(mig_plan_freep) MigPlan *p = plan_ok(config(f, "small-ci"), &node);
        assert_steps(gpu_plan(p, 0), STRV_MAKE("set-mode 1", "create-gi 3g.20gb id=9 start=0 size=4",
                                               "create-ci 1c.3g.20gb id=0 gi=#1", "create-ci 1c.3g.20gb id=0 gi=#1"));
        apply_and_recheck(config(f, "small-ci"), &node);

        /* "3c.3g.20gb" is "3g.20gb": each takes a whole GI; the one there stays, its CIs are redone */
        mig_plan_free(p);
        p = plan_ok(config(f, "whole"), &node);
        assert_steps(gpu_plan(p, 0), STRV_MAKE("destroy-ci gi=1 ci=0 (1c.3g.20gb)", "destroy-ci gi=1 ci=1 (1c.3g.20gb)",
                                               "create-gi 3g.20gb id=9 start=4 size=4",
                                               "create-ci 3g.20gb id=2 gi=1", "create-ci 3g.20gb id=2 gi=#2"));
        assert_int_equal(gpu_plan(p, 0)->steps[3].gi_step, -1);
        assert_int_equal(gpu_plan(p, 0)->steps[3].gi_id, 1);
        apply_and_recheck(config(f, "whole"), &node);

        plan_fails(config(f, "bad-ci"), &node,
                   "GPU 0 (NVIDIA A100-SXM4-40GB): '3c.4g.20gb' (entry on line 12): a 4g.20gb GPU instance has no "
                   "compute instance of 3 slices; valid: 1c.4g.20gb, 2c.4g.20gb, 4g.20gb");
}

/* The cases mig-parted takes and a GI-per-device planner refused or got wrong (issue 14). */
static void test_shared_gpu_instances(void **state) {
        (void) state;
        _cleanup_(mig_test_node_done) MigTestNode node = mig_test_node_same(&mig_test_a100_40, 1);
        _cleanup_(mig_config_file_freep) MigConfigFile *f = parse(
                "version: v1\nmig-configs:\n"
                "  three-and-four:\n    - devices: all\n      mig-enabled: true\n"
                "      mig-devices: {1c.3g.20gb: 3, 4g.20gb: 1}\n"
                "  two-in-seven:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {1c.7g.40gb: 2}\n"
                "  four-small:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {1c.3g.20gb: 4}\n"
                "  mixed-sizes:\n    - devices: all\n      mig-enabled: true\n"
                "      mig-devices: {1c.3g.20gb: 1, 2c.3g.20gb: 1, 3g.20gb: 1}\n"
                "  eight-in-seven:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {1c.7g.40gb: 8}\n"
                "  too-many-2c:\n    - devices: all\n      mig-enabled: true\n"
                "      mig-devices: {2c.3g.20gb: 3, 4g.20gb: 1}\n");

        _cleanup_(mig_plan_freep) MigPlan *p = plan_ok(config(f, "three-and-four"), &node);
        assert_steps(gpu_plan(p, 0), STRV_MAKE("set-mode 1", "create-gi 4g.20gb id=5 start=0 size=4",
                                               "create-gi 3g.20gb id=9 start=4 size=4",
                                               "create-ci 4g.20gb id=3 gi=#1", "create-ci 1c.3g.20gb id=0 gi=#2",
                                               "create-ci 1c.3g.20gb id=0 gi=#2", "create-ci 1c.3g.20gb id=0 gi=#2"));
        apply_and_recheck(config(f, "three-and-four"), &node);
        _cleanup_free_ char *layout = mig_test_layout_of(&node.gpus[0]);
        assert_string_equal(layout, "4g.20gb@0 3g.20gb@4/1c,1c,1c");

        /* Two 1c CIs in the one 7g GI; the 4g and 3g GIs go. */
        mig_plan_free(p);
        p = plan_ok(config(f, "two-in-seven"), &node);
        apply_and_recheck(config(f, "two-in-seven"), &node);
        free(layout);
        layout = mig_test_layout_of(&node.gpus[0]);
        assert_string_equal(layout, "7g.40gb@0/1c,1c");

        /* A fourth 1c does not fit a 3g GI of 3 slices: a second GI takes it. */
        mig_plan_free(p);
        p = plan_ok(config(f, "four-small"), &node);
        apply_and_recheck(config(f, "four-small"), &node);
        free(layout);
        layout = mig_test_layout_of(&node.gpus[0]);
        assert_string_equal(layout, "3g.20gb@0/1c,1c,1c 3g.20gb@4/1c");

        /* Mixed sizes share a GI, created largest first (2c, then 1c); a plain 3g.20gb has a GI of its own.
         * Which of the two existing GIs becomes which is the planner's choice. */
        mig_plan_free(p);
        p = plan_ok(config(f, "mixed-sizes"), &node);
        apply_and_recheck(config(f, "mixed-sizes"), &node);
        free(layout);
        layout = mig_test_layout_of(&node.gpus[0]);
        assert_true(streq(layout, "3g.20gb@0/2c,1c 3g.20gb@4") || streq(layout, "3g.20gb@0 3g.20gb@4/2c,1c"));

        /* A layout that already has the devices is left alone however its CIs are grouped (mig-parted's
         * assert counts devices too): two 3g GIs with one 1c each satisfy "1c.3g.20gb": 2. */
        mig_test_set_layout(&node.gpus[0], "3g.20gb@0/1c 3g.20gb@4/1c");
        _cleanup_(mig_config_file_freep) MigConfigFile *two = parse(
                "version: v1\nmig-configs:\n"
                "  two-small:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {1c.3g.20gb: 2}\n");
        mig_plan_free(p);
        p = plan_ok(config(two, "two-small"), &node);
        assert_int_equal(p->n_gpus, 0);

        /* Adding a CI of the same profile to a kept GI only creates the missing one. */
        mig_test_set_layout(&node.gpus[0], "3g.20gb@4/1c,1c 4g.20gb@0");
        mig_plan_free(p);
        p = plan_ok(config(f, "three-and-four"), &node);
        assert_steps(gpu_plan(p, 0), STRV_MAKE("create-ci 1c.3g.20gb id=0 gi=2"));
        apply_and_recheck(config(f, "three-and-four"), &node);

        /* What cannot fit is still refused, before anything is touched. */
        plan_fails(config(f, "eight-in-seven"), &node,
                   "GPU 0 (NVIDIA A100-SXM4-40GB): 8 × 1c.7g.40gb is more than the GPU holds: compute instances share "
                   "a 7g.40gb GPU instance only up to its 7 slices, so they need 2 of them, and the GPU holds at most 1");
        plan_fails(config(f, "too-many-2c"), &node,
                   "GPU 0 (NVIDIA A100-SXM4-40GB): 3 × 2c.3g.20gb is more than the GPU holds: compute instances "
                   "share a 3g.20gb GPU instance only up to its 3 slices, so they need 3 of them, and the GPU holds "
                   "at most 2");
}

static void test_step_kind_strings(void **state) {
        (void) state;
        for (int k = 0; k < _MIG_STEP_KIND_MAX; k++) {
                const char *s = mig_step_kind_to_string((MigStepKind) k);
                assert_non_null(s);
                assert_int_equal(mig_step_kind_from_string(s), k);
        }
        assert_string_equal(mig_step_kind_to_string(MIG_STEP_CREATE_GI), "create-gi");
        assert_int_equal(mig_step_kind_from_string("create-gpu"), _MIG_STEP_KIND_INVALID);
        assert_null(mig_step_kind_to_string(_MIG_STEP_KIND_MAX));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_a100_disabled_to_balanced),
                cmocka_unit_test(test_each_profile_config_per_model),
                cmocka_unit_test(test_h100_all_1g),
                cmocka_unit_test(test_one_gpu_changed),
                cmocka_unit_test(test_keep_existing_where_the_rest_fits),
                cmocka_unit_test(test_unknown_profile),
                cmocka_unit_test(test_over_capacity),
                cmocka_unit_test(test_no_placement),
                cmocka_unit_test(test_count_zero),
                cmocka_unit_test(test_device_filter_and_indices),
                cmocka_unit_test(test_last_entry_wins),
                cmocka_unit_test(test_mixed_per_gpu_configs),
                cmocka_unit_test(test_non_mig_and_unmanaged),
                cmocka_unit_test(test_disable),
                cmocka_unit_test(test_pending_mode),
                cmocka_unit_test(test_compute_instance_profiles),
                cmocka_unit_test(test_shared_gpu_instances),
                cmocka_unit_test(test_step_kind_strings),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
