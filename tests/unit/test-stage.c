/* SPDX-License-Identifier: MIT */
/* Tests for the stage engine (agent/stage.c, agent/manager-stage.c): string tables, and whole passes in
 * --oneshot mode against simulated nodes — stage results, dependencies, node state, readiness files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/stat.h>
#include <cmocka.h>

#include <syslog.h>

#include "fileio.h"
#include "manager.h"
#include "strv.h"

typedef struct Env {
        char *tmp;
        char *config;
        char *dropins;
        char *features;
        char *run;
} Env;

static const char *nodes_dir(void) {
        const char *e = getenv("GNA_FIXTURE_NODES");
        return e ?: "build/tests/fixtures/nodes";
}

static void env_free(Env *e) {
        _cleanup_free_ char *cmd = strprintf("rm -rf '%s'", e->tmp);
        assert_int_equal(system(cmd), 0);
        free(e->tmp);
        free(e->config);
        free(e->dropins);
        free(e->features);
        free(e->run);
}

/* A config that points every path at the simulated node and the outputs into a temp dir. */
static void env_init_full(Env *e, const char *node, const char *sys_override, const char *features_override,
                          const char *nvml_library) {
        _cleanup_free_ char *text = NULL, *node_dir = NULL;

        e->tmp = strdup("/tmp/gna-test-stage-XXXXXX");
        assert_non_null(mkdtemp(e->tmp));
        e->config = path_join(e->tmp, "agent.yaml");
        e->dropins = path_join(e->tmp, "conf.d");
        e->features = features_override ? strdup(features_override) : path_join(e->tmp, "features.d");
        e->run = path_join(e->tmp, "run");
        assert_int_equal(mkdir(e->dropins, 0755), 0);
        assert_int_equal(mkdir(e->run, 0755), 0);
        node_dir = path_join(nodes_dir(), node);

        const char *pci_ids = getenv("GNA_FIXTURE_PCI_IDS") ?: "tests/fixtures/pci.ids";
        const char *fake = getenv("GNA_FAKE_NVML");
        assert_non_null(fake);
        _cleanup_free_ char *desc = path_join(node_dir, "nvml.yaml"), *st = path_join(e->tmp, "nvml.state");
        assert_int_equal(setenv("FAKE_NVML_DESCRIPTION", desc, 1), 0);
        assert_int_equal(setenv("FAKE_NVML_STATE", st, 1), 0);
        text = strprintf("paths:\n"
                         "  sys: %s%s\n"
                         "  proc: %s/proc\n"
                         "  dev: %s/dev\n"
                         "  run: %s\n"
                         "  state: %s/state\n"
                         "  pci-ids: %s\n"
                         "nvml:\n"
                         "  library: %s\n"
                         "labels:\n"
                         "  directory: %s\n"
                         "devices:\n"
                         "  enabled: false\n" /* the node's dev tree is the build's fixture: read only */
                         "cdi:\n"
                         "  driver-root: %s\n"
                         "engine:\n"
                         "  retry-min: 1s\n",
                         sys_override ? "" : node_dir, sys_override ?: "/sys", node_dir, node_dir, e->run, e->tmp,
                         pci_ids, nvml_library ?: fake, e->features, node_dir);
        assert_int_equal(write_file_atomic(e->config, NULL, text, strlen(text), 0644), 0);
}

static void env_init(Env *e, const char *node, const char *sys_override, const char *features_override) {
        env_init_full(e, node, sys_override, features_override, NULL);
}

static int run_oneshot(Env *e, Manager **ret) {
        char *dirs[] = { e->dropins, NULL };
        ManagerOptions o = {
                .config = { .main_file = e->config, .dropin_dirs = dirs },
                .oneshot = true,
                .log_level = LOG_ERR,
        };
        Manager *m = NULL;

        assert_int_equal(manager_new(&o, &m), 0);
        assert_int_equal(manager_startup(m), 0);
        int r = manager_run(m);
        *ret = m;
        return r;
}

static bool exists(const char *dir, const char *name) {
        _cleanup_free_ char *p = path_join(dir, name);
        return access(p, F_OK) == 0;
}

static void test_string_tables(void **state) {
        for (int i = 0; i < _STAGE_MAX; i++)
                assert_int_equal(stage_from_string(stage_to_string(i)), i);
        for (int i = 0; i < _STAGE_STATE_MAX; i++)
                assert_int_equal(stage_state_from_string(stage_state_to_string(i)), i);
        for (int i = 0; i < _AGENT_STATE_MAX; i++)
                assert_int_equal(agent_state_from_string(agent_state_to_string(i)), i);
        assert_int_equal(stage_from_string("nope"), _STAGE_INVALID);
        assert_null(stage_to_string(_STAGE_MAX));
        assert_string_equal(stage_to_string(STAGE_PROBE), "probe");
        assert_string_equal(stage_to_string(STAGE_NVML), "nvml");
        assert_string_equal(stage_to_string(STAGE_CDI), "cdi");
        assert_string_equal(stage_to_string(STAGE_LABELS), "labels");
        /* The order of a pass, and what waits for what: labels need only the probe (they fall back to
         * PCI when the driver or NVML is down); NVML needs the driver; CDI and MIG need NVML. */
        static const char *const order[] = { "probe", "driver", "devices", "fabric", "nvml", "mig", "cdi", "labels", "consumers" };
        assert_int_equal(ELEMENTSOF(order), _STAGE_MAX);
        for (int i = 0; i < _STAGE_MAX; i++)
                assert_string_equal(stage_to_string(i), order[i]);
        assert_int_equal(stage_descriptor(STAGE_PROBE)->depends, 0);
        assert_int_equal(stage_descriptor(STAGE_DRIVER)->depends, 1u << STAGE_PROBE);
        assert_int_equal(stage_descriptor(STAGE_DEVICES)->depends, 1u << STAGE_DRIVER);
        assert_int_equal(stage_descriptor(STAGE_FABRIC)->depends, 1u << STAGE_DEVICES);
        assert_int_equal(stage_descriptor(STAGE_NVML)->depends, 1u << STAGE_DRIVER);
        assert_int_equal(stage_descriptor(STAGE_MIG)->depends, 1u << STAGE_NVML);
        assert_int_equal(stage_descriptor(STAGE_CDI)->depends, 1u << STAGE_NVML);
        assert_int_equal(stage_descriptor(STAGE_LABELS)->depends, 1u << STAGE_PROBE);
        /* The consumers must run after a failed driver too, to withdraw the operator's driver-ready. */
        assert_int_equal(stage_descriptor(STAGE_CONSUMERS)->depends, 0);
}

static void test_full_pass_ready(void **state) {
        Env e = {};
        Manager *m = NULL;
        _cleanup_free_ char *agent_run = NULL, *state_path = NULL, *state_text = NULL;

        env_init(&e, "dgx-h100", NULL, NULL);
        assert_int_equal(run_oneshot(&e, &m), 0);

        assert_int_equal(m->node.stages[STAGE_PROBE].state, STAGE_DONE);
        assert_int_equal(m->node.stages[STAGE_NVML].state, STAGE_DONE);
        assert_int_equal(m->node.stages[STAGE_CDI].state, STAGE_DONE);
        assert_int_equal(m->node.stages[STAGE_LABELS].state, STAGE_DONE);
        assert_int_equal(m->node.state, AGENT_READY);
        assert_true(manager_is_ready(m));
        assert_non_null(m->node.nvml_snapshot);
        assert_int_equal(m->node.nvml_snapshot->n_gpus, 8);
        assert_string_equal(manager_stage_name(m), "ready");
        assert_int_equal(m->node.inventory->n_gpus, 8);
        assert_string_equal(m->node.stages[STAGE_PROBE].message, "8 GPUs, 4 NVSwitches, 8 NICs");
        assert_true(m->node.stages[STAGE_PROBE].finished_usec >= m->node.stages[STAGE_PROBE].started_usec);
        assert_string_equal(label_set_get(m->node.labels, "nvidia.com/gpu.count"), "8");

        agent_run = path_join(e.run, "gpu-node-agent");
        assert_true(exists(agent_run, "ready"));
        assert_true(exists(agent_run, "probe-ready"));
        assert_true(exists(agent_run, "labels-ready"));
        assert_true(exists(e.features, "gpu-node-agent"));
        state_path = path_join(agent_run, "state");
        assert_int_equal(read_full_file(state_path, 4096, &state_text, NULL), 0);
        assert_string_equal(state_text, "STATE=ready\nREADY=yes\nGPU_COUNT=8\nSTAGE_probe=done\nSTAGE_driver=done\nSTAGE_devices=skipped\n"
                                        "STAGE_fabric=skipped\nSTAGE_nvml=done\nSTAGE_mig=skipped\n"
                                        "STAGE_cdi=done\nSTAGE_labels=done\nSTAGE_consumers=skipped\n");
        assert_string_equal(m->node.stages[STAGE_CONSUMERS].message,
                            "gres.slurm.enabled and validations.operator-compat are false and no GPU is in an NVLink "
                            "fabric clique");
        _cleanup_free_ char *spec = path_join(e.run, "cdi/nvidia.yaml");
        assert_int_equal(access(spec, F_OK), 0);

        manager_free(m);
        env_free(&e);
}

static void test_probe_failure_blocks_labels(void **state) {
        Env e = {};
        Manager *m = NULL;
        _cleanup_free_ char *agent_run = NULL;

        env_init(&e, "dgx-h100", "/nonexistent/gna-sys", NULL);
        assert_int_equal(run_oneshot(&e, &m), 1);

        assert_int_equal(m->node.stages[STAGE_PROBE].state, STAGE_FAILED);
        assert_true(m->node.stages[STAGE_PROBE].error > 0);
        assert_non_null(strstr(m->node.stages[STAGE_PROBE].message, "/nonexistent/gna-sys"));
        assert_int_equal(m->node.stages[STAGE_DRIVER].state, STAGE_PENDING);
        assert_string_equal(m->node.stages[STAGE_DRIVER].message, "waiting for stage probe (failed)");
        assert_int_equal(m->node.stages[STAGE_NVML].state, STAGE_PENDING);
        assert_string_equal(m->node.stages[STAGE_NVML].message, "waiting for stage driver (pending)");
        assert_int_equal(m->node.stages[STAGE_CDI].state, STAGE_PENDING);
        assert_string_equal(m->node.stages[STAGE_CDI].message, "waiting for stage nvml (pending)");
        assert_int_equal(m->node.stages[STAGE_LABELS].state, STAGE_PENDING);
        assert_string_equal(m->node.stages[STAGE_LABELS].message, "waiting for stage probe (failed)");
        assert_int_equal(m->node.state, AGENT_FAILED);
        assert_false(manager_is_ready(m));

        agent_run = path_join(e.run, "gpu-node-agent");
        assert_false(exists(agent_run, "ready"));
        assert_false(exists(agent_run, "probe-ready"));
        assert_false(exists(e.features, "gpu-node-agent"));
        manager_free(m);
        env_free(&e);
}

static void test_no_gpu_skips_labels(void **state) {
        Env e = {};
        Manager *m = NULL;
        _cleanup_free_ char *agent_run = NULL;

        env_init(&e, "no-gpu", NULL, NULL);
        /* A stale file from an earlier GPU must go away. */
        assert_int_equal(mkdir_p(e.features, 0755), 0);
        _cleanup_free_ char *stale = path_join(e.features, "gpu-node-agent");
        assert_int_equal(write_file_atomic(stale, NULL, "nvidia.com/gpu.present=true\n", 28, 0644), 0);

        assert_int_equal(run_oneshot(&e, &m), 0);
        assert_int_equal(m->node.stages[STAGE_PROBE].state, STAGE_DONE);
        assert_int_equal(m->node.stages[STAGE_LABELS].state, STAGE_SKIPPED);
        assert_non_null(strstr(m->node.stages[STAGE_LABELS].message, "no NVIDIA GPU"));
        assert_int_equal(m->node.state, AGENT_READY);
        assert_false(exists(e.features, "gpu-node-agent"));
        agent_run = path_join(e.run, "gpu-node-agent");
        assert_true(exists(agent_run, "labels-ready"));
        manager_free(m);
        env_free(&e);
}

static void test_nvml_missing_degrades(void **state) {
        Env e = {};
        Manager *m = NULL;
        _cleanup_free_ char *features = NULL, *text = NULL;

        /* The driver's library is not there: NVML fails with the reason, CDI waits, and the labels
         * still go out — the PCI-only set, marked degraded. */
        env_init_full(&e, "h200", NULL, NULL, "/nonexistent/libnvidia-ml.so.1");
        assert_int_equal(run_oneshot(&e, &m), 1);
        assert_int_equal(m->node.stages[STAGE_NVML].state, STAGE_FAILED);
        assert_non_null(strstr(m->node.stages[STAGE_NVML].message, "/nonexistent/libnvidia-ml.so.1"));
        assert_int_equal(m->node.stages[STAGE_CDI].state, STAGE_PENDING);
        assert_int_equal(m->node.stages[STAGE_LABELS].state, STAGE_DONE);
        assert_int_equal(m->node.state, AGENT_DEGRADED);
        assert_null(m->node.nvml_snapshot);
        features = path_join(e.features, "gpu-node-agent");
        assert_int_equal(read_full_file(features, 65536, &text, NULL), 0);
        assert_non_null(strstr(text, "nvidia.com/gpu-node-agent.state=degraded\n"));
        assert_non_null(strstr(text, "nvidia.com/gpu.count=1\n"));
        assert_null(strstr(text, "cuda.driver"));
        manager_free(m);
        env_free(&e);
}

static void test_labels_failure_degrades(void **state) {
        Env e = {};
        Manager *m = NULL;
        _cleanup_free_ char *agent_run = NULL;

        /* Neither the directory nor its parent exists: the stage fails and names the path. */
        env_init(&e, "h200", NULL, "/nonexistent/gna-parent/features.d");
        assert_int_equal(run_oneshot(&e, &m), 1);
        assert_int_equal(m->node.stages[STAGE_PROBE].state, STAGE_DONE);
        assert_int_equal(m->node.stages[STAGE_LABELS].state, STAGE_FAILED);
        assert_non_null(strstr(m->node.stages[STAGE_LABELS].message, "/nonexistent/gna-parent"));
        assert_int_equal(m->node.state, AGENT_DEGRADED);
        agent_run = path_join(e.run, "gpu-node-agent");
        assert_true(exists(agent_run, "probe-ready"));
        assert_false(exists(agent_run, "labels-ready"));
        assert_false(exists(agent_run, "ready"));
        manager_free(m);
        env_free(&e);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_string_tables),
                cmocka_unit_test(test_full_pass_ready),
                cmocka_unit_test(test_probe_failure_blocks_labels),
                cmocka_unit_test(test_no_gpu_skips_labels),
                cmocka_unit_test(test_nvml_missing_degrades),
                cmocka_unit_test(test_labels_failure_degrades),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
