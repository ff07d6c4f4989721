/* SPDX-License-Identifier: MIT */
/* Tests for the MIG applier and the MigManager (agent/mig/mig-apply*.c, mig-manager.c, mig-state.c,
 * mig-export.c) against the fake libnvidia-ml.so.1 (tests/fakes/), on a real sd-event loop: applies on
 * 8×A100-40GB (with the GPU reset the mode change needs, done by fake-nvml-ctl), every all-<profile>
 * config of mig-parted's config-default.yaml on 8×H100, 8×H200 and 8×A30, idempotent re-apply (no NVML
 * writes, counted from the fake's call trace), the GI profile table read once per model and NVML handle
 * (counted NVML calls), one GPU changed (the others keep their MIG UUIDs), plans
 * rejected with nothing changed, a creation failure rolled back, reset never → rebooting, busy GPUs,
 * journal recovery after a simulated crash, non-MIG GPUs, assert and export. Skips when the fake is not
 * built. */
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "fileio.h"
#include "gpu-nvml-worker.h"
#include "log.h"
#include "manager.h"
#include "mig-config.h"
#include "mig-journal.h"
#include "mig-manager.h"
#include "mig-plan.h"
#include "mig-state.h"
#include "mig-wire.h"
#include "strv.h"
#include "test-load.h"

typedef struct Fix {
        char *dir, *description, *trace, *agent_yaml, *journal;
        const char *config_file;
        Manager *m;
} Fix;

typedef struct Done {
        bool called;
        int error;
        char *config, *state, *message;
        bool changed, refused;
        bool had_mig_devices;       /* the outcome carried the MIG devices the apply's jobs read */
        int published;              /* stage_nvml_refresh_async() with them (publish_mig_devices) */
} Done;

/* on_done puts the apply's MIG devices into the daemon's snapshot, as the mig stage does. */
static bool publish_mig_devices;

static char *lib_path, *ctl_path, *source_root, *nodes_dir;
static struct Fix *current; /* torn down after each test, also a failed one */

static const char *const fake_env[] = { "FAKE_NVML_DESCRIPTION", "FAKE_NVML_STATE", "FAKE_NVML_FAIL",
                                        "FAKE_NVML_BUSY", "FAKE_NVML_TRACE", "FAKE_NVML_FIT",
                                        "GNA_MIG_RESET_PROGRAM", "GNA_MIG_RESET_TIMEOUT_MS", NULL };

static void write_file(const char *path, const char *text) {
        assert_int_equal(write_file_atomic(path, NULL, text, strlen(text), 0644), 0);
}

static bool available(void) {
        if (!lib_path || access(lib_path, R_OK) < 0 || access(ctl_path, X_OK) < 0) {
                print_message("fake libnvidia-ml.so.1 / fake-nvml-ctl not built (tests/fakes); skipping\n");
                return false;
        }
        return true;
}

/* A node description of n GPUs of one model. */
static char *description_of(const char *model, unsigned n, const char *extra) {
        _cleanup_strv_free_ char **l = NULL;

        assert_int_equal(strv_extend(&l, "gpus:"), 0);
        for (unsigned i = 0; i < n; i++) {
                assert_int_equal(strv_extendf(&l, "  - pci: \"0000:%02x:00.0\"", 0x10 + i * 0x10), 0);
                assert_int_equal(strv_extendf(&l, "    model: \"%s\"", model), 0);
                if (extra && i == 2)
                        assert_int_equal(strv_extend(&l, extra), 0);
        }
        assert_int_equal(strv_extend(&l, ""), 0);
        return strv_join(l, "\n");
}

/* agent_extra: more YAML under "mig:". description: a file path, or (when it starts with "gpus:") text. */
static Fix the_fix;

static Fix *fix_setup(const char *description, const char *mig_extra) {
        Fix *f = &the_fix;
        _cleanup_free_ char *text = NULL, *state_dir = NULL;
        char tmpl[] = "/tmp/test-mig-apply-XXXXXX";
        ManagerOptions mo = { .log_level = LOG_WARNING };
        static char *no_dirs[] = { NULL };
        _cleanup_free_ char *error = NULL;
        int r;

        *f = (Fix) {};
        assert_non_null(mkdtemp(tmpl));
        f->dir = strdup(tmpl);
        f->description = path_join(f->dir, "nvml.yaml");
        f->trace = path_join(f->dir, "trace");
        f->agent_yaml = path_join(f->dir, "agent.yaml");
        state_dir = path_join(f->dir, "state");
        f->journal = path_join(state_dir, MIG_JOURNAL_FILE);
        f->config_file = NULL;

        if (startswith(description, "gpus:"))
                write_file(f->description, description);
        else {
                _cleanup_free_ char *data = NULL;
                assert_int_equal(read_full_file(description, 1 << 20, &data, NULL), 0);
                write_file(f->description, data);
        }
        for (const char *const *e = fake_env; *e; e++)
                unsetenv(*e);
        _cleanup_free_ char *state = path_join(f->dir, "nvml.state");
        setenv("FAKE_NVML_DESCRIPTION", f->description, 1);
        setenv("FAKE_NVML_STATE", state, 1);
        setenv("FAKE_NVML_TRACE", f->trace, 1);
        setenv("GNA_MIG_RESET_PROGRAM", ctl_path, 1);

        text = strprintf("paths:\n  state: %s\nnvml:\n  library: %s\nmig:\n"
                         "  config-file: %s/tests/fixtures/mig-parted/config-default.yaml\n%s",
                         state_dir, lib_path, source_root, mig_extra ?: "");
        write_file(f->agent_yaml, text);

        assert_int_equal(manager_new(&mo, &f->m), 0);
        ConfigLoadOptions co = { .main_file = f->agent_yaml, .dropin_dirs = no_dirs };
        r = config_load(&co, &f->m->node.config, &error);
        if (r < 0)
                fail_msg("config_load: %s", error);
        /* As if the nvml stage had found NVML answering: the MIG manager then reads through its NVML
         * worker (the MIG reader); this process never opens NVML, as the daemon does not. */
        assert_non_null(f->m->node.nvml_snapshot = calloc(1, sizeof *f->m->node.nvml_snapshot));
        assert_int_equal(mig_manager_new(&f->m->node, &f->m->node.mig), 0);
        current = f;
        return f;
}

static void fix_teardown(Fix *f) {
        _cleanup_free_ char *cmd = strprintf("rm -rf '%s'", f->dir);

        current = NULL;
        f->m->node.mig = mig_manager_free(f->m->node.mig);
        manager_free(f->m);
        assert_int_equal(system(cmd), 0);
        free(f->dir);
        free(f->description);
        free(f->trace);
        free(f->agent_yaml);
        free(f->journal);
        for (const char *const *e = fake_env; *e; e++)
                unsetenv(*e);
}

static void done_clear(Done *d) {
        free(d->config);
        free(d->state);
        free(d->message);
        *d = (Done) {};
}

static void on_published(Node *n, int r, const char *error, void *userdata) {
        Done *d = userdata;

        assert_int_equal(r, 0);
        d->published = 1;
}

static void on_done(MigManager *mm, const MigApplyOutcome *o, void *userdata) {
        Done *d = userdata;

        d->called = true;
        d->error = o->error;
        d->config = strdup(o->config);
        d->state = strdup(o->state);
        d->message = strdup(o->message);
        d->changed = o->changed;
        d->refused = o->refused;
        d->had_mig_devices = o->mig_devices != NULL;
        if (publish_mig_devices && o->changed && o->mig_devices) {
                _cleanup_free_ char *error = NULL;
                int r = stage_nvml_refresh_async(&current->m->node, o->changed_gpus, o->mig_devices, on_published, d,
                                                   &error);
                if (r < 0)
                        d->published = r;
        }
}

static void run_until(Fix *f, Done *d) {
        for (unsigned i = 0; !d->called && i < 3000; i++)
                assert_true(sd_event_run(f->m->node.event, 10 * USEC_PER_MSEC) >= 0);
        assert_true(d->called);
}

/* Applies and waits; returns mig_manager_apply's result (the outcome is in *d when 0). */
static int apply(Fix *f, const char *name, bool force, Done *d, char **ret_error) {
        _cleanup_free_ char *error = NULL;
        int r;

        done_clear(d);
        r = mig_manager_apply(f->m->node.mig, name, f->config_file, force, on_done, d, &error);
        if (r < 0) {
                if (ret_error)
                        *ret_error = TAKE_PTR(error);
                return r;
        }
        assert_null(error);
        run_until(f, d);
        /* Refused once the GPUs were read (the planner, busy GPUs): as a refusal at the call. */
        if (d->refused) {
                if (ret_error)
                        *ret_error = strdup(d->message);
                return d->error;
        }
        return 0;
}

static void apply_ok(Fix *f, const char *name, Done *d) {
        _cleanup_free_ char *error = NULL;
        int r = apply(f, name, false, d, &error);
        if (r < 0)
                fail_msg("applying %s: %s", name, error);
        if (!streq(d->state, "success"))
                fail_msg("applying %s: %s: %s", name, d->state, d->message);
        assert_string_equal(mig_manager_state(f->m->node.mig), "success");
        assert_string_equal(mig_manager_config(f->m->node.mig), name);
}

/* NVML writes in the fake's trace since the last call (which empties it). */
static unsigned trace_writes(Fix *f) {
        static const char *const writes[] = { "nvmlDeviceSetMigMode ", "nvmlDeviceCreateGpuInstance",
                                              "nvmlGpuInstanceCreateComputeInstance ", "nvmlGpuInstanceDestroy ",
                                              "nvmlComputeInstanceDestroy ", NULL };
        _cleanup_free_ char *data = NULL;
        unsigned n = 0;

        if (read_full_file(f->trace, 64 << 20, &data, NULL) < 0)
                return 0;
        for (char *line = strtok(data, "\n"); line; line = strtok(NULL, "\n"))
                for (const char *const *w = writes; *w; w++)
                        n += startswith(line, *w);
        (void) truncate(f->trace, 0); /* the fake keeps its O_APPEND descriptor */
        return n;
}

static unsigned trace_count(Fix *f, const char *symbol_rc) {
        _cleanup_free_ char *data = NULL;
        unsigned n = 0;

        if (read_full_file(f->trace, 64 << 20, &data, NULL) < 0)
                return 0;
        for (char *line = strtok(data, "\n"); line; line = strtok(NULL, "\n"))
                n += streq(line, symbol_rc);
        return n;
}

/* The test's own look at the fake, through a handle of its own that is closed again at once: the
 * workers are forks of this process and must not inherit an initialised library. */
static void read_states(Fix *f, MigGpuState **ret, size_t *ret_n) {
        _cleanup_free_ char *error = NULL;
        GpuNvml *n = NULL;
        int r = gpu_nvml_open(lib_path, &n, &error);
        if (r >= 0)
                r = mig_state_read(n, NULL, ret, ret_n, &error);
        gpu_nvml_close(n);
        if (r < 0)
                fail_msg("mig_state_read: %s", error);
}

static void read_snapshot(Fix *f, NvmlSnapshot **ret) {
        _cleanup_free_ char *error = NULL;
        GpuNvml *n = NULL;
        int r = gpu_nvml_open(lib_path, &n, &error);
        if (r >= 0)
                r = gpu_nvml_read(n, NULL, ret, &error);
        gpu_nvml_close(n);
        if (r < 0)
                fail_msg("gpu_nvml_read: %s", error);
}

typedef struct Report {
        bool called;
        int r;
        char *text;
} Report;

static void on_report(MigManager *mm, int r, const char *report, void *userdata) {
        Report *rp = userdata;

        rp->called = true;
        rp->r = r;
        rp->text = report ? strdup(report) : NULL;
}

/* mig_manager_assert_async()/mig_manager_export_async() and wait: the result, the report in *ret. */
static int assert_config(Fix *f, const char *name, char **ret) {
        _cleanup_free_ char *error = NULL;
        Report rp = {};

        assert_int_equal(mig_manager_assert_async(f->m->node.mig, name, NULL, on_report, &rp, &error), 0);
        for (unsigned i = 0; !rp.called && i < 3000; i++)
                assert_true(sd_event_run(f->m->node.event, 10 * USEC_PER_MSEC) >= 0);
        assert_true(rp.called);
        *ret = rp.text;
        return rp.r;
}

static int export_config(Fix *f, char **ret) {
        _cleanup_free_ char *error = NULL;
        Report rp = {};

        assert_int_equal(mig_manager_export_async(f->m->node.mig, on_report, &rp, &error), 0);
        for (unsigned i = 0; !rp.called && i < 3000; i++)
                assert_true(sd_event_run(f->m->node.event, 10 * USEC_PER_MSEC) >= 0);
        assert_true(rp.called);
        *ret = rp.text;
        return rp.r;
}

/* How many GIs named profile GPU g has (each with exactly one CI). */
static unsigned count_gis(const MigGpuState *g, const char *profile) {
        unsigned n = 0;
        for (size_t i = 0; i < g->n_gis; i++) {
                const MigGiProfile *p = mig_state_gi_profile(g, g->gis[i].profile_id);
                assert_non_null(p);
                assert_int_equal(g->gis[i].n_cis, 1);
                n += streq(p->name, profile);
        }
        return n;
}

static char *node_description(const char *node) {
        return strprintf("%s/%s/nvml.yaml", nodes_dir, node);
}

/* ---- 8×A100-40GB: disabled → all-balanced, with the GPU reset the mode change needs ---- */

static void test_a100_balanced(void **state) {
        _cleanup_free_ char *desc = node_description("a100-sxm"), *yaml = NULL, *report = NULL;
        Done d = {};
        Fix *f;
        MigGpuState *g = NULL;
        size_t n = 0;

        if (!available())
                skip();
        f = fix_setup(desc, NULL);

        apply_ok(f, "all-balanced", &d);
        assert_true(d.changed);
        read_states(f, &g, &n);
        assert_int_equal(n, 8);
        for (size_t i = 0; i < n; i++) {
                assert_true(g[i].mig_current);
                assert_int_equal(g[i].n_gis, 4);
                assert_int_equal(count_gis(&g[i], "1g.5gb"), 2);
                assert_int_equal(count_gis(&g[i], "2g.10gb"), 1);
                assert_int_equal(count_gis(&g[i], "3g.20gb"), 1);
        }
        /* The A100 mode change waited for a reset: one SetMigMode per GPU, answered "reset required". */
        assert_int_equal(trace_count(f, "nvmlDeviceSetMigMode 0"), 8);
        assert_int_equal(trace_writes(f), 8 + 8 * 4 * 2);
        assert_int_equal(access(f->journal, F_OK), -1); /* finished journals are removed */

        /* Idempotent: the same config again costs reads only. */
        apply_ok(f, "all-balanced", &d);
        assert_false(d.changed);
        assert_int_equal(trace_writes(f), 0);
        assert_int_equal(assert_config(f, "all-balanced", &report), 1);
        assert_non_null(strstr(report, "match MIG config all-balanced"));
        report = mfree(report);
        assert_int_equal(assert_config(f, "all-1g.5gb", &report), 0);
        assert_non_null(strstr(report, "GPU 0 (0000:07:00.0) does not match all-1g.5gb"));

        /* Export: one entry for eight identical GPUs, which assert takes back as a match. */
        assert_int_equal(export_config(f, &yaml), 0);
        assert_string_equal(yaml, "version: v1\nmig-configs:\n  current:\n    - devices: all\n      mig-enabled: true\n"
                                  "      mig-devices:\n        \"1g.5gb\": 2\n        \"2g.10gb\": 1\n"
                                  "        \"3g.20gb\": 1\n");

        /* Back to disabled: destroys, then the mode change and its reset. */
        apply_ok(f, "all-disabled", &d);
        mig_gpu_states_free(g, n);
        read_states(f, &g, &n);
        for (size_t i = 0; i < n; i++) {
                assert_false(g[i].mig_current);
                assert_int_equal(g[i].n_gis, 0);
        }
        mig_gpu_states_free(g, n);
        done_clear(&d);
        fix_teardown(f);
}

/* ---- the GI profile table is read once per GPU model and NVML handle, not per GPU and pass ---- */

/* A fresh MIG reader (an NVML worker with a new handle) for the next read. */
static void reopen_nvml(Fix *f) {
        stage_nvml_stop(&f->m->node, "the test starts a new NVML worker");
}

/* NVML calls in the fake's trace since the last look (which empties it): every process's. Not
 * nvmlShutdown: a job's worker calls it after it has answered, so it may land on either side of a look. */
static unsigned trace_calls(Fix *f) {
        _cleanup_free_ char *data = NULL;
        unsigned n = 0;

        if (read_full_file(f->trace, 64 << 20, &data, NULL) < 0)
                return 0;
        for (char *line = strtok(data, "\n"); line; line = strtok(NULL, "\n"))
                n += !startswith(line, "nvmlShutdown ");
        (void) truncate(f->trace, 0);
        return n;
}

static uint64_t apply_noop_calls(Fix *f, const char *name) {
        Done d = {};

        (void) trace_calls(f);
        apply_ok(f, name, &d);
        assert_false(d.changed);
        done_clear(&d);
        return trace_calls(f);
}

static void on_reader_states(GpuNvmlWorker *w, int r, const uint8_t *data, size_t len, const char *error,
                             void *userdata) {
        MigGpuState **ret = userdata;
        size_t n = 0;

        assert_int_equal(r, 0);
        assert_int_equal(mig_states_job_result(data, len, ret, &n), 0);
        assert_int_equal(n, 8);
}

static void on_reader_any(GpuNvmlWorker *w, int r, const uint8_t *data, size_t len, const char *error,
                          void *userdata) {
        *(bool *) userdata = true;
}

/* Starts the MIG reader (one read through it). */
static void reader_start(Fix *f) {
        _cleanup_free_ char *error = NULL;
        bool done = false;

        assert_int_equal(stage_nvml_read_async(&f->m->node, NULL, mig_states_job, on_reader_any, &done, &error), 0);
        for (unsigned i = 0; !done && i < 3000; i++)
                assert_true(sd_event_run(f->m->node.event, 10 * USEC_PER_MSEC) >= 0);
        assert_true(done);
}

/* The MIG states as the MIG reader reads them (with the tables it keeps). */
static void reader_states(Fix *f, MigGpuState **ret) {
        _cleanup_free_ char *error = NULL;

        *ret = NULL;
        assert_int_equal(stage_nvml_read_async(&f->m->node, NULL, mig_states_job, on_reader_states, ret, &error), 0);
        for (unsigned i = 0; !*ret && i < 3000; i++)
                assert_true(sd_event_run(f->m->node.event, 10 * USEC_PER_MSEC) >= 0);
        assert_non_null(*ret);
}

static void assert_profiles_equal(const MigGpuState *a, const MigGpuState *b) {
        assert_int_equal(a->n_gi_profiles, b->n_gi_profiles);
        for (size_t i = 0; i < a->n_gi_profiles; i++) {
                const MigGiProfile *x = &a->gi_profiles[i], *y = &b->gi_profiles[i];

                assert_string_equal(x->name, y->name);
                assert_int_equal(x->index, y->index);
                assert_int_equal(x->id, y->id);
                assert_int_equal(x->slices, y->slices);
                assert_int_equal(x->memory_slices, y->memory_slices);
                assert_int_equal(x->instance_count, y->instance_count);
                assert_int_equal(x->n_starts, y->n_starts);
                assert_memory_equal(x->starts, y->starts, x->n_starts * sizeof *x->starts);
                assert_int_equal(x->n_ci_profiles, y->n_ci_profiles);
                assert_memory_equal(x->ci_profiles, y->ci_profiles, x->n_ci_profiles * sizeof *x->ci_profiles);
        }
}

/* NVML calls for the A100's GI profile table, CI profiles included: read as far as all-balanced needs, and
 * whole (test_model_facts_cached). */
#define TABLE_PARTIAL 31
#define TABLE_WHOLE 46

static void test_model_facts_cached(void **state) {
        _cleanup_free_ char *desc = node_description("a100-sxm");
        MigGpuState *cold = NULL, *warm = NULL;
        size_t n_cold = 0, n_warm = 0;
        uint64_t first, second;
        unsigned change;
        Done d = {};
        Fix *f;

        if (!available())
                skip();
        f = fix_setup(desc, NULL);
        (void) trace_calls(f);
        apply_ok(f, "all-balanced", &d);
        assert_true(d.changed);
        done_clear(&d);
        change = trace_calls(f);
        printf("# 8xA100 disabled -> all-balanced: %u NVML calls\n", change);

        /* The NVML call budget (issue 14), counted in the fake's trace over every process (the MIG reader,
         * the jobs' workers). From MIG disabled, all-balanced costs at most 219 calls (nvmlShutdown not
         * counted; this fixture's snapshot is empty, so the jobs read no MIG devices — the budget with them
         * is test_mig_devices_from_jobs'): the planning read, the compute processes of the GPUs, and per
         * GPU two runs of steps on the MIG reader (the A100's mode change waits for a reset between them),
         * whose layout after them is derived from what NVML answered to each write.
         *
         * A re-apply that changes nothing reads, per A100 in all-balanced, 12 facts with a warm MIG reader
         * (compute processes are asked only for the GPUs a plan changes: none here): MIG mode (PCI ids, name
         * and memory size are kept per handle); GetGpuInstances for 3 profiles (1g.5gb, 2g.10gb, 3g.20gb:
         * the GIs found then hold every memory slice, so the other 4 profiles cannot have a GI and are not
         * asked); 4 GI infos; 4 GetComputeInstances (the largest CI profile of a GI first: a CI of the GI's
         * full size uses all of its slices; the CIs' ids are not asked: only a destroy needs one, and it
         * takes any CI of the profile). A fresh MIG reader (a new NVML handle) adds PCI info, name and memory
         * per GPU, its nvmlInit, the GPU listing (GetCount, a handle and the PCI info per GPU: 17) and the
         * model's profile table once, as far as all-balanced needs it (TABLE_PARTIAL, 31: 6 GI profile
         * probes — the indices of 1g.5gb, 2g.10gb and 3g.20gb, the first three, then 8_SLICE, which the A100
         * lacks, and 7_SLICE, the largest profile, and the end of the table —, 4 placement lists, 21 CI
         * profile probes through the first GI of each of the 3 profiles in use; the GIs found use all 7
         * compute slices, so no GI of an unread profile can exist). The whole table (a read for export or
         * `mig show`) is TABLE_WHOLE, 46: 18 GI profile probes (7 profiles, 10 indices the A100 lacks, the end),
         * 7 placement lists, the 21 CI profile probes. Before: 27 per GPU and the table per GPU (73, 584 a
         * pass), then 17 per GPU. */
        /* 219 until the agent closed its NVML processes around each GPU reset (the driver refuses to
         * reset a GPU that any process holds open): the MIG reader's next job opens NVML again, 1 for
         * the nvmlInit of the GPU after each of the 8 resets (the MIG reader's new session). */
        assert_true(change <= 227);
        reopen_nvml(f);
        first = apply_noop_calls(f, "all-balanced");
        second = apply_noop_calls(f, "all-balanced");
        printf("# re-apply: %u NVML calls with a new MIG reader, %u with a warm one\n", (unsigned) first,
               (unsigned) second);
        assert_int_equal(second, 8 * 12);
        assert_int_equal(first, 1 + 17 + TABLE_PARTIAL + 8 * 15);

        /* What a read reports is the same from the tables as from NVML, on every GPU. The MIG reader's
         * table was partial: a read of everything asks for the rest of it, and only for that (the indices
         * asked before are not asked again), besides the layout of each GPU. */
        (void) trace_calls(f);
        reader_states(f, &warm);
        assert_int_equal(trace_calls(f), TABLE_WHOLE - TABLE_PARTIAL + 8 * 12);
        n_warm = 8;
        read_states(f, &cold, &n_cold);
        assert_int_equal(n_warm, 8);
        assert_int_equal(n_cold, 8);
        for (size_t i = 0; i < 8; i++) {
                assert_profiles_equal(&cold[i], &warm[i]);
                assert_profiles_equal(&cold[0], &cold[i]);
                assert_true(mig_state_layout_equal(&cold[i], &warm[i]));
                assert_int_equal(count_gis(&cold[i], "1g.5gb"), 2);
        }
        mig_gpu_states_free(cold, n_cold);
        mig_gpu_states_free(warm, n_warm);
        fix_teardown(f);
}

/* ---- the MIG reader takes what the nvml stage's snapshot already says ---- */

static void on_snapshot_read(GpuNvmlWorker *w, int r, NvmlSnapshot *snap, const char *error, void *userdata) {
        assert_int_equal(r, 0);
        *(NvmlSnapshot **) userdata = snap;
}

/* The snapshot as the nvml stage reads it (in a worker of its own), published as the daemon's. */
static void publish_snapshot(Fix *f) {
        _cleanup_(gpu_nvml_worker_freep) GpuNvmlWorker *w = NULL;
        NvmlSnapshot *snap = NULL;

        assert_int_equal(gpu_nvml_worker_new(f->m->node.event, &w), 0);
        assert_int_equal(gpu_nvml_worker_snapshot(w, lib_path, NULL, 0, 8, on_snapshot_read, &snap), 0);
        for (unsigned i = 0; !snap && i < 3000; i++)
                assert_true(sd_event_run(f->m->node.event, 10 * USEC_PER_MSEC) >= 0);
        assert_non_null(snap);
        assert_non_null(snap->driver_version);
        gpu_nvml_snapshot_free(f->m->node.nvml_snapshot);
        f->m->node.nvml_snapshot = snap;
}

static void test_reader_seeded(void **state) {
        _cleanup_free_ char *desc = node_description("a100-sxm");
        uint64_t unseeded, seeded, cached, other_driver;
        Done d = {};
        Fix *f;

        if (!available())
                skip();
        f = fix_setup(desc, NULL);
        apply_ok(f, "all-balanced", &d);
        assert_true(d.changed);
        done_clear(&d);

        /* The empty snapshot of the fixture: nothing to take. Per GPU 12 layout calls (see
         * test_model_facts_cached) and its PCI info, name and memory. */
        reopen_nvml(f);
        unseeded = apply_noop_calls(f, "all-balanced");
        assert_int_equal(unseeded, 1 + 17 + TABLE_PARTIAL + 8 * 15);

        /* With the nvml stage's snapshot, a new MIG reader asks the driver version once (is it the
         * snapshot's driver?) and then neither the name nor the memory size of any GPU. */
        publish_snapshot(f);
        reopen_nvml(f);
        seeded = apply_noop_calls(f, "all-balanced");
        printf("# re-apply with a new MIG reader: %u NVML calls unseeded, %u seeded\n", (unsigned) unseeded,
               (unsigned) seeded);
        assert_int_equal(seeded, 1 + 1 + 17 + TABLE_PARTIAL + 8 * 13);

        /* That read wrote the model's profile table to the state directory: the next MIG reader takes it
         * and asks NVML for no table (TABLE_PARTIAL calls fewer). */
        _cleanup_free_ char *cache = path_join(f->dir, "state/mig-profiles");
        assert_int_equal(access(cache, F_OK), 0);
        reopen_nvml(f);
        cached = apply_noop_calls(f, "all-balanced");
        printf("# ... and %u with the profile cache\n", (unsigned) cached);
        assert_int_equal(cached, 1 + 1 + 17 + 8 * 13);

        /* A snapshot of another driver than the reader's: nothing of it is taken. */
        free(f->m->node.nvml_snapshot->driver_version);
        assert_non_null(f->m->node.nvml_snapshot->driver_version = strdup("1.2.3"));
        reopen_nvml(f);
        other_driver = apply_noop_calls(f, "all-balanced");
        assert_int_equal(other_driver, 1 + 1 + 17 + TABLE_PARTIAL + 8 * 15);
        fix_teardown(f);
}

/* ---- after a change, the jobs' own reading of the new MIG devices is the snapshot's ---- */

static unsigned apply_published(Fix *f, const char *name) {
        Done d = {};
        unsigned calls;

        (void) trace_calls(f);
        publish_mig_devices = true;
        apply_ok(f, name, &d);
        publish_mig_devices = false;
        calls = trace_calls(f);
        printf("# %s: %u NVML calls, the new MIG devices included\n", name, calls);
        assert_true(d.changed);
        assert_true(d.had_mig_devices);
        assert_int_equal(d.published, 1);
        done_clear(&d);
        return calls;
}

static void test_mig_devices_from_jobs(void **state) {
        _cleanup_free_ char *desc = node_description("a100-sxm");
        Fix *f;

        if (!available())
                skip();
        f = fix_setup(desc, NULL);
        publish_snapshot(f);

        /* From MIG disabled: every MIG device is new. What the jobs read after their steps, merged into
         * the snapshot, is what a full read of NVML says (UUIDs, GI/CI ids and profiles, placements,
         * attributes, profile names, MIG modes), without that read. */
        unsigned calls = apply_published(f, "all-balanced");
        /* The NVML call budget of issue 14 for MIG off -> all-balanced on 8xA100, as the mig stage makes it
         * (bench-mig.py case a), counted in the fake's trace of every process (nvmlShutdown not counted):
         * the planning read with the model's profile table, the compute processes of the 8 GPUs, 8
         * SetMigMode, 32 GI and 32 CI creates each with its info — all on the MIG reader, one NVML session
         * (its nvmlInit and handles are the planning read's) — and the new MIG devices (per device its
         * handle, UUID and GI id; attributes once per (GI, CI) profile and GPU model: the first GPU's job
         * asks, the later jobs take its answer). The profile table is read only as far as all-balanced needs
         * it (TABLE_PARTIAL). Was 773 with the MIG reader's re-read of the MIG devices, 583 before the jobs
         * read them, 356 with the attributes asked per GPU, 335 with a worker per job (16 nvmlInit and
         * handles), 303 with the whole profile table. The goal: at most 288. */
        /* 279 until the agent closed its NVML processes around each GPU reset, as it must on a real
         * driver (which refuses to reset a GPU held open by any process); the fake let the reset through
         * then. The reopened MIG reader after each of the 8 resets costs 5 calls (its nvmlInit, the
         * driver version, the GPU's handle, MIG mode and compute processes read again): 319. */
        assert_true(calls <= 319);
        _cleanup_(gpu_nvml_snapshot_freep) NvmlSnapshot *fresh = NULL;
        read_snapshot(f, &fresh);
        assert_true(gpu_nvml_snapshot_equal(f->m->node.nvml_snapshot, fresh));
        for (size_t i = 0; i < fresh->n_gpus; i++)
                assert_int_equal(f->m->node.nvml_snapshot->gpus[i].n_mig_devices, 4);

        /* Kept GPU instances (the two 1g.5gb) whose CIs the planning read counted without their ids, and
         * new ones next to them. */
        apply_published(f, "all-1g.5gb");
        fresh = gpu_nvml_snapshot_free(fresh);
        read_snapshot(f, &fresh);
        assert_true(gpu_nvml_snapshot_equal(f->m->node.nvml_snapshot, fresh));
        for (size_t i = 0; i < fresh->n_gpus; i++)
                assert_int_equal(f->m->node.nvml_snapshot->gpus[i].n_mig_devices, 7);

        /* Back to MIG disabled (a reset on the A100): no MIG devices, MIG mode disabled. */
        apply_published(f, "all-disabled");
        fresh = gpu_nvml_snapshot_free(fresh);
        read_snapshot(f, &fresh);
        assert_true(gpu_nvml_snapshot_equal(f->m->node.nvml_snapshot, fresh));
        fix_teardown(f);
}

/* ---- the GI profile table read only as far as a config needs ---- */

static void test_partial_table(void **state) {
        _cleanup_free_ char *desc = node_description("a100-sxm"), *mig = NULL, *error = NULL, *cmd = NULL;
        _cleanup_free_ char *cache = NULL, *text = NULL;
        MigGpuState *g = NULL;
        size_t n = 0;
        Done d = {};
        Fix *f;

        if (!available())
                skip();

        /* A name the GPU lacks, asked of a cold MIG reader: the whole table is read, and the refusal lists
         * every profile (one read only as far as the names would stop before 4g.20gb, the +me profile and
         * 1g.10gb). */
        f = fix_setup(desc, NULL);
        mig = path_join(f->dir, "mig.yaml");
        write_file(mig, "version: v1\nmig-configs:\n"
                        "  unknown-profile:\n    - devices: all\n      mig-enabled: true\n"
                        "      mig-devices: {\"1g.5gb\": 1, \"1g.7gb\": 1}\n");
        f->config_file = mig;
        assert_int_equal(apply(f, "unknown-profile", false, &d, &error), -EINVAL);
        static const char *const all[] = { "1g.5gb, ", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb",
                                           "7g.40gb" };
        for (size_t i = 0; i < ELEMENTSOF(all); i++)
                assert_non_null(strstr(error, all[i]));
        f->config_file = NULL;
        done_clear(&d);
        fix_teardown(f);

        /* all-balanced from MIG disabled reads only its part of the table, and the state directory keeps it
         * as partial (the file is keyed by the nvml stage's driver version: a snapshot). */
        f = fix_setup(desc, NULL);
        publish_snapshot(f);
        apply_ok(f, "all-balanced", &d);
        assert_true(d.changed);
        done_clear(&d);
        cache = path_join(f->dir, "state/mig-profiles");
        assert_int_equal(read_full_file(cache, 1 << 20, &text, NULL), 0);
        assert_non_null(strstr(text, "\nasked "));
        assert_null(strstr(text, " 4g.20gb\n"));

        /* Someone else gives GPU 0 a 4g.20gb (a profile that table never read) next to a 3g.20gb. A new
         * MIG reader, with that table: the 3g.20gb found does not use all 7 compute slices, so a GI of an
         * unread profile may exist: the whole table is read and the 4g.20gb found, and all-balanced goes
         * back onto GPU 0 (a read that missed it would place the 2g.10gb over it, and fail). */
        cmd = strprintf("'%s' reset 0 >/dev/null && '%s' create 0 4g.20gb,3g.20gb >/dev/null", ctl_path, ctl_path);
        assert_int_equal(system(cmd), 0);
        reopen_nvml(f);
        apply_ok(f, "all-balanced", &d);
        assert_true(d.changed);
        assert_non_null(strstr(d.message, "GPU 0 (0000:07:00.0): 2g.10gb@0, 1g.5gb@2, 1g.5gb@3, 3g.20gb@4"));
        done_clear(&d);
        read_states(f, &g, &n);
        assert_int_equal(count_gis(&g[0], "4g.20gb"), 0);
        assert_int_equal(count_gis(&g[0], "1g.5gb"), 2);
        assert_int_equal(count_gis(&g[0], "2g.10gb"), 1);
        mig_gpu_states_free(g, n);
        /* The complete table is what the state directory keeps now. */
        text = mfree(text);
        assert_int_equal(read_full_file(cache, 1 << 20, &text, NULL), 0);
        assert_null(strstr(text, "\nasked "));
        assert_non_null(strstr(text, " 4g.20gb\n"));
        fix_teardown(f);
}

/* ---- <paths.state>/mig-profiles: used only when valid for this boot, driver and GPUs ---- */

static uint64_t fnv1a(const char *p, size_t n) {
        uint64_t h = UINT64_C(14695981039346656037);
        for (size_t i = 0; i < n; i++) {
                h ^= (uint8_t) p[i];
                h *= UINT64_C(1099511628211);
        }
        return h;
}

/* text (a valid cache) with its first occurrence of from replaced by to and the checksum made right: a
 * well-formed file as a person or another machine could have left it. */
static char *replanted(const char *text, const char *from, const char *to) {
        const char *at = strstr(text, from), *sum;
        _cleanup_free_ char *body = NULL;

        assert_non_null(at);
        body = strprintf("%.*s%s%s", (int) (at - text), text, to, at + strlen(from));
        assert_non_null(body);
        sum = strstr(body, "\nchecksum ");
        assert_non_null(sum);
        body[sum - body + 1] = '\0';
        return strprintf("%schecksum %016" PRIx64 "\n", body, fnv1a(body, strlen(body)));
}

static void test_profile_cache_ignored(void **state) {
        _cleanup_free_ char *desc = node_description("a100-sxm"), *cache = NULL, *good = NULL, *now = NULL;
        _cleanup_free_ char *boot = NULL, *gpu = NULL;
        const unsigned with_cache = 1 + 1 + 17 + 8 * 13, without = with_cache + TABLE_PARTIAL;
        Done d = {};
        Fix *f;

        if (!available())
                skip();
        f = fix_setup(desc, NULL);
        apply_ok(f, "all-balanced", &d);
        done_clear(&d);
        publish_snapshot(f);
        cache = path_join(f->dir, "state/mig-profiles");
        reopen_nvml(f);
        (void) apply_noop_calls(f, "all-balanced"); /* writes the cache, with the CI profiles of the GIs */
        reopen_nvml(f);
        assert_int_equal(apply_noop_calls(f, "all-balanced"), with_cache);
        assert_int_equal(read_full_file(cache, 1 << 20, &good, NULL), 0);
        assert_non_null(strstr(good, "\nboot "));

        /* Garbled (a byte changed, the checksum not): ignored, NVML asked, the file written again. */
        _cleanup_free_ char *garbled = strdup(good);
        char *digit = strstr(garbled, "\nprofile ") + 9;
        *digit = *digit == '9' ? '8' : '9';
        write_file(cache, garbled);
        reopen_nvml(f);
        assert_int_equal(apply_noop_calls(f, "all-balanced"), without);
        assert_int_equal(read_full_file(cache, 1 << 20, &now, NULL), 0);
        assert_string_equal(now, good);
        now = mfree(now);

        /* Truncated: ignored. */
        write_file(cache, strndupa(good, strlen(good) / 2));
        reopen_nvml(f);
        assert_int_equal(apply_noop_calls(f, "all-balanced"), without);

        /* Well-formed, but of another boot, or naming a GPU NVML does not list: ignored. */
        _cleanup_free_ char *other_boot = NULL, *other_gpu = NULL;
        const char *b = strstr(good, "\nboot ") + 6, *g = strstr(good, "\ngpu GPU-") + 5;
        boot = strndup(b, strcspn(b, "\n"));
        gpu = strndup(g, strcspn(g, "\n"));
        other_boot = replanted(good, boot, "00000000-0000-4000-8000-000000000000");
        other_gpu = replanted(good, gpu, "GPU-00000000-0000-4000-8000-000000000000");
        write_file(cache, other_boot);
        reopen_nvml(f);
        assert_int_equal(apply_noop_calls(f, "all-balanced"), without);
        write_file(cache, other_gpu);
        reopen_nvml(f);
        assert_int_equal(apply_noop_calls(f, "all-balanced"), without);

        /* A symlink planted in its place (to a valid copy) is not followed. */
        _cleanup_free_ char *elsewhere = path_join(f->dir, "elsewhere");
        write_file(elsewhere, good);
        assert_int_equal(unlink(cache), 0);
        assert_int_equal(symlink(elsewhere, cache), 0);
        reopen_nvml(f);
        assert_int_equal(apply_noop_calls(f, "all-balanced"), without);

        /* Each time the file was written again from NVML's answer: valid, and used. */
        assert_int_equal(read_full_file(cache, 1 << 20, &now, NULL), 0);
        assert_string_equal(now, good);
        reopen_nvml(f);
        assert_int_equal(apply_noop_calls(f, "all-balanced"), with_cache);
        fix_teardown(f);
}

/* ---- every all-<profile> of config-default.yaml a GPU reports, on 8 GPUs of a model ---- */

static void apply_all_profiles(const char *description, unsigned expected_configs) {
        _cleanup_free_ char *path = NULL, *error = NULL;
        _cleanup_(mig_config_file_freep) MigConfigFile *cf = NULL;
        MigGpuState *g = NULL;
        size_t n = 0;
        unsigned applied = 0;
        Done d = {};
        Fix *f;

        f = fix_setup(description, NULL);
        path = strprintf("%s/tests/fixtures/mig-parted/config-default.yaml", source_root);
        assert_int_equal(mig_config_file_load(path, &cf, &error), 0);
        read_states(f, &g, &n);
        assert_int_equal(n, 8);

        for (size_t p = 0; p < g[0].n_gi_profiles; p++) {
                _cleanup_free_ char *name = strprintf("all-%s", g[0].gi_profiles[p].name);
                const MigConfig *c = NULL;
                MigGpuState *after = NULL;
                size_t n_after = 0;

                for (char *s = name; *s; s++)
                        if (*s == '+')
                                *s = '.';
                if (mig_config_file_find(cf, name, &c, NULL) < 0)
                        continue;
                apply_ok(f, name, &d);
                read_states(f, &after, &n_after);
                /* The entry of the config for this model says how many. */
                const MigConfigEntry *e = mig_config_match(c, &g[0]);
                assert_non_null(e);
                assert_int_equal(e->n_requests, 1);
                for (size_t i = 0; i < n_after; i++)
                        if (count_gis(&after[i], e->requests[0].profile) != e->requests[0].count)
                                fail_msg("%s: GPU %zu has %u of %s", name, i, count_gis(&after[i], e->requests[0].profile),
                                         e->requests[0].profile);
                mig_gpu_states_free(after, n_after);
                applied++;
        }
        assert_int_equal(applied, expected_configs);
        mig_gpu_states_free(g, n);
        done_clear(&d);
        fix_teardown(f);
}

static void test_all_profiles_h100(void **state) {
        _cleanup_free_ char *desc = node_description("dgx-h100");
        if (!available())
                skip();
        apply_all_profiles(desc, 7); /* 1g.10gb(+me), 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb */
}

static void test_all_profiles_h200(void **state) {
        _cleanup_free_ char *desc = description_of("NVIDIA H200", 8, NULL);
        if (!available())
                skip();
        apply_all_profiles(desc, 7);
}

static void test_all_profiles_a30(void **state) {
        _cleanup_free_ char *desc = description_of("NVIDIA A30", 8, NULL);
        if (!available())
                skip();
        apply_all_profiles(desc, 5); /* 1g.6gb(+me), 2g.12gb(+me), 4g.24gb */
}

/* ---- one GPU changed: the other GPUs keep their instances (and MIG UUIDs) ---- */

static void test_one_gpu_changed(void **state) {
        _cleanup_free_ char *desc = node_description("dgx-h100"), *mig = NULL, *yaml = NULL;
        _cleanup_(gpu_nvml_snapshot_freep) NvmlSnapshot *before = NULL, *after = NULL;
        Done d = {};
        Fix *f;

        if (!available())
                skip();
        f = fix_setup(desc, NULL);
        apply_ok(f, "all-1g.10gb", &d);
        read_snapshot(f, &before);
        (void) trace_writes(f);

        mig = path_join(f->dir, "mig.yaml");
        write_file(mig, "version: v1\nmig-configs:\n  one-changed:\n"
                        "    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.10gb\": 7}\n"
                        "    - devices: [3]\n      mig-enabled: true\n      mig-devices: {\"3g.40gb\": 2}\n");
        f->config_file = mig;
        apply_ok(f, "one-changed", &d);
        /* GPU 3: 7 CIs and 7 GIs destroyed, 2 GIs and 2 CIs created; nothing else written. */
        assert_int_equal(trace_writes(f), 7 + 7 + 2 + 2);
        read_snapshot(f, &after);
        for (size_t i = 0; i < 8; i++) {
                if (i == 3) {
                        assert_int_equal(after->gpus[i].n_mig_devices, 2);
                        continue;
                }
                assert_int_equal(after->gpus[i].n_mig_devices, before->gpus[i].n_mig_devices);
                for (size_t k = 0; k < after->gpus[i].n_mig_devices; k++)
                        assert_string_equal(after->gpus[i].mig_devices[k].uuid, before->gpus[i].mig_devices[k].uuid);
        }

        /* Export merges the seven alike GPUs by index list. */
        assert_int_equal(export_config(f, &yaml), 0);
        assert_non_null(strstr(yaml, "    - devices: [0, 1, 2, 4, 5, 6, 7]\n      mig-enabled: true\n      mig-devices:\n"
                                     "        \"1g.10gb\": 7\n"));
        assert_non_null(strstr(yaml, "    - devices: [3]\n      mig-enabled: true\n      mig-devices:\n"
                                     "        \"3g.40gb\": 2\n"));
        done_clear(&d);
        fix_teardown(f);
}

/* ---- plans the GPUs cannot take: rejected, nothing written ---- */

static void test_rejected(void **state) {
        _cleanup_free_ char *desc = node_description("dgx-h100"), *mig = NULL, *error = NULL;
        Done d = {};
        Fix *f;

        if (!available())
                skip();
        f = fix_setup(desc, NULL);
        apply_ok(f, "all-3g.40gb", &d);
        (void) trace_writes(f);

        mig = path_join(f->dir, "mig.yaml");
        write_file(mig, "version: v1\nmig-configs:\n"
                        "  unknown-profile:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.7gb\": 1}\n"
                        "  too-many:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.10gb\": 8}\n");
        f->config_file = mig;

        assert_int_equal(apply(f, "unknown-profile", false, &d, &error), -EINVAL);
        assert_non_null(strstr(error, "1g.7gb"));
        assert_non_null(strstr(error, "1g.10gb")); /* the valid choices are listed */
        /* A rejected request leaves the node and what is reported about it as they were. */
        assert_string_equal(mig_manager_state(f->m->node.mig), "success");
        assert_string_equal(mig_manager_config(f->m->node.mig), "all-3g.40gb");
        error = mfree(error);

        assert_int_equal(apply(f, "too-many", false, &d, &error), -EINVAL);
        assert_non_null(strstr(error, "1g.10gb"));
        error = mfree(error);

        assert_int_equal(apply(f, "no-such-config", false, &d, &error), -ENOENT);
        assert_non_null(strstr(error, "no-such-config"));

        assert_int_equal(trace_writes(f), 0);
        f->config_file = NULL;
        done_clear(&d);
        fix_teardown(f);
}

/* ---- the 3rd GPU instance creation fails: that GPU goes back, the others go ahead ---- */

static void test_creation_failure_rolled_back(void **state) {
        _cleanup_free_ char *desc = node_description("dgx-h100"), *error = NULL;
        MigGpuState *g = NULL;
        size_t n = 0;
        Done d = {};
        Fix *f;

        if (!available())
                skip();
        setenv("FAKE_NVML_FAIL", "nvmlDeviceCreateGpuInstanceWithPlacement:3+:23", 1);
        f = fix_setup(desc, NULL);
        setenv("FAKE_NVML_FAIL", "nvmlDeviceCreateGpuInstanceWithPlacement:3+:23", 1);

        assert_int_equal(apply(f, "all-balanced", false, &d, &error), 0);
        assert_string_equal(d.state, "failed");
        assert_int_equal(d.error, -ENOSPC);
        assert_non_null(strstr(d.message, "GPU 0 (0000:1b:00.0): creating GPU instance 1g.10gb"));
        assert_non_null(strstr(d.message, "NVML_ERROR_INSUFFICIENT_RESOURCES"));
        assert_non_null(strstr(d.message, "GPU 0 (0000:1b:00.0): rolled back to the previous layout"));
        assert_string_equal(mig_manager_state(f->m->node.mig), "failed");

        /* The fake counts calls per process, and the steps of every GPU run in one NVML session (the MIG
         * reader): GPU 0 fails at the third create, every later GPU at its first; each is rolled back. */
        assert_non_null(strstr(d.message, "GPU 7 (0000:df:00.0): rolled back to the previous layout"));
        read_states(f, &g, &n);
        for (size_t i = 0; i < n; i++) {
                assert_false(g[i].mig_current);    /* as before: MIG off, nothing left behind */
                assert_int_equal(g[i].n_gis, 0);
        }
        mig_gpu_states_free(g, n);
        done_clear(&d);
        fix_teardown(f);
}

/* ---- a rollback that fails too: the apply stops there, no other GPU is touched ---- */

static void test_failed_rollback_stops_apply(void **state) {
        _cleanup_free_ char *desc = node_description("dgx-h100"), *error = NULL, *message = NULL, *journal = NULL;
        MigGpuState *balanced = NULL, *g = NULL;
        size_t n_balanced = 0, n = 0;
        Done d = {};
        Fix *f;

        if (!available())
                skip();
        f = fix_setup(desc, NULL);
        apply_ok(f, "all-balanced", &d);
        read_states(f, &balanced, &n_balanced);

        /* GI creates fail (the fake counts per process: in every NVML worker): GPU 0 fails going to
         * all-1g.10gb, and so does its rollback, which has to create its balanced GIs again. */
        setenv("FAKE_NVML_FAIL", "nvmlDeviceCreateGpuInstanceWithPlacement:1+:23", 1);
        reopen_nvml(f); /* the fake reads it at a process's first nvmlInit: a new MIG reader, which runs the steps */
        (void) trace_writes(f);

        assert_int_equal(apply(f, "all-1g.10gb", false, &d, &error), 0);
        assert_string_equal(d.state, "failed");
        assert_non_null(strstr(d.message, "the rollback to the previous layout failed too; GPU 0 (0000:1b:00.0) is left "
                                          "with "));
        assert_non_null(strstr(d.message, ": the apply stopped there and touched no other GPU"));
        assert_non_null(strstr(d.message, "GPUs 1, 2, 3, 4, 5, 6, 7 not touched"));
        /* The rollback's steps name no profile: no empty name in the sentence. */
        assert_null(strstr(d.message, "instance  ("));
        assert_non_null(strstr(d.message, "creating GPU instance (profile id "));
        assert_string_equal(mig_manager_state(f->m->node.mig), "failed");

        read_states(f, &g, &n);
        assert_int_equal(n, 8);
        assert_false(mig_state_layout_equal(&g[0], &balanced[0]));
        for (size_t i = 1; i < n; i++)
                assert_true(mig_state_layout_equal(&g[i], &balanced[i])); /* untouched */

        /* The journal stays, with the halt; the next start reports it and changes nothing. */
        assert_int_equal(read_full_file(f->journal, 1 << 20, &journal, NULL), 0);
        assert_non_null(strstr(journal, "\nhalt pci=0000:1b:00.0 left="));
        assert_null(strstr(journal, "\nend "));
        unsetenv("FAKE_NVML_FAIL");
        reopen_nvml(f); /* the library answers again: a MIG reader without the fault */
        (void) trace_writes(f);
        f->m->node.mig = mig_manager_free(f->m->node.mig);
        assert_int_equal(mig_manager_new(&f->m->node, &f->m->node.mig), 0);
        done_clear(&d);
        assert_int_equal(mig_manager_recover(f->m->node.mig, on_done, &d, &message), -ENOTRECOVERABLE);
        assert_true(startswith(message, "A MIG apply of config all-1g.10gb stopped because the rollback of GPU "
                                        "0000:1b:00.0 failed (left with "));
        assert_non_null(strstr(message, "MIG is not changed until someone checks the GPUs"));
        assert_false(d.called);
        assert_int_equal(trace_writes(f), 0);
        assert_string_equal(mig_manager_state(f->m->node.mig), "failed");
        /* Every pass says so again, not once. */
        message = mfree(message);
        assert_int_equal(mig_manager_recover(f->m->node.mig, on_done, &d, &message), -ENOTRECOVERABLE);

        /* An explicit apply is the decision that clears it. */
        apply_ok(f, "all-balanced", &d);
        assert_int_equal(access(f->journal, F_OK), -1);

        mig_gpu_states_free(g, n);
        mig_gpu_states_free(balanced, n_balanced);
        done_clear(&d);
        fix_teardown(f);
}

/* ---- mig.reset: never → rebooting; after the reset the apply finishes ---- */

static void test_reset_never(void **state) {
        _cleanup_free_ char *desc = node_description("a100-sxm"), *cmd = NULL;
        MigGpuState *g = NULL;
        size_t n = 0;
        Done d = {};
        Fix *f;

        if (!available())
                skip();
        f = fix_setup(desc, "  reset: never\n");
        assert_int_equal(apply(f, "all-1g.5gb", false, &d, NULL), 0);
        assert_string_equal(d.state, "rebooting");
        assert_int_equal(d.error, 0);
        assert_non_null(strstr(d.message, "GPU 0 (0000:07:00.0): the MIG mode change waits for a GPU reset or a reboot"));
        assert_string_equal(mig_manager_state(f->m->node.mig), "rebooting");
        read_states(f, &g, &n);
        assert_false(g[0].mig_current);
        assert_true(g[0].mig_pending);
        mig_gpu_states_free(g, n);

        cmd = strprintf("'%s' reset >/dev/null", ctl_path);
        assert_int_equal(system(cmd), 0);
        apply_ok(f, "all-1g.5gb", &d);
        assert_int_equal(trace_count(f, "nvmlDeviceSetMigMode 0"), 8); /* only the first apply's */
        read_states(f, &g, &n);
        assert_int_equal(count_gis(&g[7], "1g.5gb"), 7);
        mig_gpu_states_free(g, n);
        done_clear(&d);
        fix_teardown(f);
}

/* ---- a GPU reset that fails: the mode change is taken back ---- */

static void test_reset_fails(void **state) {
        _cleanup_free_ char *desc = node_description("a100-sxm");
        MigGpuState *g = NULL;
        size_t n = 0;
        Done d = {};
        Fix *f;

        if (!available())
                skip();
        f = fix_setup(desc, NULL);
        setenv("GNA_MIG_RESET_PROGRAM", "/bin/false", 1);
        f->m->node.mig = mig_manager_free(f->m->node.mig);
        assert_int_equal(mig_manager_new(&f->m->node, &f->m->node.mig), 0);

        assert_int_equal(apply(f, "all-1g.5gb", false, &d, NULL), 0);
        assert_string_equal(d.state, "failed");
        assert_non_null(strstr(d.message, "GPU 0 (0000:07:00.0): the GPU reset (/bin/false -r -i) failed with exit "
                                          "status 1; GPU 0 (0000:07:00.0): rolled back to the previous layout"));
        read_states(f, &g, &n);
        for (size_t i = 0; i < n; i++) {
                assert_false(g[i].mig_current);
                assert_false(g[i].mig_pending); /* the pending change was taken back */
        }
        mig_gpu_states_free(g, n);
        done_clear(&d);
        fix_teardown(f);
}

/* ---- a GPU reset that hangs, ignores SIGTERM and leaves a grandchild holding its output: the loop goes on ---- */

typedef struct Beat {
        uint64_t last, max_gap;
} Beat;

static uint64_t mono_usec(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * USEC_PER_SEC + ts.tv_nsec / 1000;
}

static int on_beat(sd_event_source *s, uint64_t usec, void *userdata) {
        Beat *b = userdata;
        uint64_t n = mono_usec();

        if (b->last && n - b->last > b->max_gap)
                b->max_gap = n - b->last;
        b->last = n;
        (void) sd_event_source_set_time(s, usec + 10 * USEC_PER_MSEC);
        return sd_event_source_set_enabled(s, SD_EVENT_ONESHOT);
}

static void test_reset_hangs(void **state) {
        _cleanup_free_ char *desc = description_of("NVIDIA A100-SXM4-40GB", 1, NULL), *script = NULL, *text = NULL,
                           *gc_file = NULL, *gc = NULL;
        _cleanup_(sd_event_source_unrefp) sd_event_source *beat_source = NULL;
        Beat beat = {};
        Done d = {};
        uint64_t t0;
        Fix *f;

        if (!available())
                skip();
        f = fix_setup(desc, NULL);
        script = path_join(f->dir, "reset-hangs");
        gc_file = path_join(f->dir, "grandchild");
        text = strprintf("#!/bin/sh\ntrap '' TERM\necho \"resetting $4\"\nsetsid sleep 60 &\necho $! > '%s'\n"
                         "while :; do sleep 0.05; done\n", gc_file);
        write_file(script, text);
        assert_int_equal(chmod(script, 0755), 0);
        setenv("GNA_MIG_RESET_PROGRAM", script, 1);
        setenv("GNA_MIG_RESET_TIMEOUT_MS", "300", 1);
        f->m->node.mig = mig_manager_free(f->m->node.mig);
        assert_int_equal(mig_manager_new(&f->m->node, &f->m->node.mig), 0);
        reader_start(f); /* its fork (slow in an ASan build) is the daemon's first MIG read, not this apply's */
        assert_return_code(sd_event_add_time_relative(f->m->node.event, &beat_source, CLOCK_MONOTONIC,
                                                      10 * USEC_PER_MSEC, 0, on_beat, &beat), 0);

        t0 = mono_usec();
        assert_int_equal(apply(f, "all-1g.5gb", false, &d, NULL), 0);
        /* The timeout, then the SIGKILL grace: not more. */
        assert_true(mono_usec() - t0 < 300 * USEC_PER_MSEC + 2 * USEC_PER_SEC + 1500 * USEC_PER_MSEC);
        assert_string_equal(d.state, "failed");
        assert_non_null(strstr(d.message, "the GPU reset ("));
        assert_non_null(strstr(d.message, " -r -i) did not finish within"));
        printf("# longest gap between 10 ms ticks during the apply with a hung reset: %.1f ms\n",
               beat.max_gap / 1000.0);
        /* 100 ms, stretched on a busy machine up to 200 ms: below the 300 ms reset timeout a blocked loop
         * would sit through. */
        assert_true(beat.max_gap < test_scaled_usec(100 * USEC_PER_MSEC, 200 * USEC_PER_MSEC));

        if (read_one_line_file(gc_file, &gc) >= 0 && atoi(gc) > 0)
                (void) kill(atoi(gc), SIGKILL);
        done_clear(&d);
        fix_teardown(f);
}

/* ---- a GPU with compute processes: refused unless forced ---- */

static void test_busy(void **state) {
        _cleanup_free_ char *desc = description_of("NVIDIA H100 80GB HBM3", 4,
                                                   "    processes: [{pid: 77, memory_mib: 100}]");
        _cleanup_free_ char *error = NULL;
        Done d = {};
        Fix *f;

        if (!available())
                skip();
        f = fix_setup(desc, NULL);
        assert_int_equal(apply(f, "all-1g.10gb", false, &d, &error), -EBUSY);
        assert_string_equal(error, "GPU 2 (0000:30:00.0) has compute processes running; nothing was changed. Stop the "
                                   "workloads on it, or apply with force.");
        assert_int_equal(trace_writes(f), 0);

        /* Forced: the driver has the last word (it refuses the mode change on a busy GPU), and that GPU is
         * rolled back while the others are done. */
        assert_int_equal(apply(f, "all-1g.10gb", true, &d, NULL), 0);
        assert_string_equal(d.state, "failed");
        assert_non_null(strstr(d.message, "GPU 2 (0000:30:00.0): enabling MIG mode failed"));
        assert_non_null(strstr(d.message, "NVML_ERROR_IN_USE"));
        assert_non_null(strstr(d.message, "GPU 3 (0000:40:00.0): 1g.10gb@0"));
        done_clear(&d);
        fix_teardown(f);
}

/* ---- an apply interrupted by a crash: the next MigManager rolls back what was not finished ---- */

static void test_journal_recovery(void **state) {
        _cleanup_free_ char *desc = node_description("dgx-h100"), *note = NULL, *message = NULL;
        _cleanup_(mig_journal_freep) MigJournal *j = NULL;
        MigGpuState *balanced = NULL, *g = NULL, prev[2] = {};
        size_t n_balanced = 0, n = 0;
        Done d = {};
        Fix *f;

        if (!available())
                skip();
        f = fix_setup(desc, NULL);
        apply_ok(f, "all-balanced", &d);
        read_states(f, &balanced, &n_balanced);
        apply_ok(f, "all-1g.10gb", &d);

        /* What a crash in the middle of "all-1g.10gb" (from all-balanced) leaves: GPU 1 finished, GPU 0
         * not, and a torn last line. */
        assert_int_equal(mig_state_copy_layout(&balanced[0], &prev[0]), 0);
        assert_int_equal(mig_state_copy_layout(&balanced[1], &prev[1]), 0);
        assert_int_equal(mig_journal_begin(f->journal, "all-1g.10gb", prev, 2, &j), 0);
        assert_int_equal(mig_journal_append(j, "step", "pci=0000:1b:00.0 kind=destroy-ci rc=0"), 0);
        assert_int_equal(mig_journal_gpu_end(j, "0000:43:00.0", "done"), 0);
        assert_int_equal(mig_journal_append(j, "step", "pci=0000:1b:00.0 kind=destroy-gi rc=0"), 0);
        j = mig_journal_free(j);
        FILE *torn = fopen(f->journal, "ae");
        assert_non_null(torn);
        fputs("step pci=0000:1b:00.0 kind=crea", torn);
        fclose(torn);

        /* A new start. */
        f->m->node.mig = mig_manager_free(f->m->node.mig);
        assert_int_equal(mig_manager_new(&f->m->node, &f->m->node.mig), 0);
        done_clear(&d);
        assert_int_equal(mig_manager_recover(f->m->node.mig, on_done, &d, &message), 1);
        /* The GPUs are read in the MIG reader (an NVML worker); the plan back follows from its answer. */
        assert_string_equal(message, "An interrupted apply of MIG config all-1g.10gb was found; reading the GPUs it "
                                     "had not finished.");
        run_until(f, &d);
        assert_string_equal(d.state, "success");
        assert_true(d.changed);
        note = mig_manager_take_recovery_note(f->m->node.mig);
        assert_true(startswith(note, "An interrupted apply of MIG config all-1g.10gb was found (2 steps journaled); "
                                     "rolling the GPUs it had not finished back to their previous layout.: "));
        assert_non_null(strstr(note, "GPU 0 (0000:1b:00.0): "));
        assert_int_equal(access(f->journal, F_OK), -1);

        read_states(f, &g, &n);
        assert_true(mig_state_layout_equal(&g[0], &balanced[0]));  /* rolled back */
        assert_int_equal(count_gis(&g[1], "1g.10gb"), 7);          /* finished: left alone */
        assert_int_equal(count_gis(&g[2], "1g.10gb"), 7);          /* not in the journal: left alone */

        /* Once per start. */
        message = mfree(message);
        assert_int_equal(mig_manager_recover(f->m->node.mig, on_done, &d, &message), 0);
        assert_null(message);

        mig_gpu_states_free(g, n);
        mig_gpu_states_free(balanced, n_balanced);
        mig_gpu_state_done(&prev[0]);
        mig_gpu_state_done(&prev[1]);
        done_clear(&d);
        fix_teardown(f);
}

/* ---- an L40S (no MIG) with devices: all, mig-enabled: false ---- */

static void test_l40s(void **state) {
        _cleanup_free_ char *desc = node_description("l40s"), *yaml = NULL;
        Done d = {};
        Fix *f;

        if (!available())
                skip();
        f = fix_setup(desc, NULL);
        apply_ok(f, "all-disabled", &d);
        assert_false(d.changed);
        assert_string_equal(d.message, "no change needed");
        assert_int_equal(trace_writes(f), 0);
        assert_int_equal(export_config(f, &yaml), 0);
        assert_string_equal(yaml, "version: v1\nmig-configs:\n  current:\n    - devices: all\n      mig-enabled: false\n");
        done_clear(&d);
        fix_teardown(f);
}

static int teardown(void **state) {
        /* A failed test skips its own teardown; the fake NVML must be shut down before the next. */
        if (current)
                fix_teardown(current);
        return 0;
}

#define TEST(t) cmocka_unit_test_teardown(t, teardown)

int main(void) {
        const char *lib = getenv("GNA_FAKE_NVML"), *build = getenv("GNA_BUILD_ROOT");
        const struct CMUnitTest tests[] = {
                TEST(test_a100_balanced),
                TEST(test_model_facts_cached),
                TEST(test_reader_seeded),
                TEST(test_profile_cache_ignored),
                TEST(test_mig_devices_from_jobs),
                TEST(test_partial_table),
                TEST(test_all_profiles_h100),
                TEST(test_all_profiles_h200),
                TEST(test_all_profiles_a30),
                TEST(test_one_gpu_changed),
                TEST(test_rejected),
                TEST(test_creation_failure_rolled_back),
                TEST(test_failed_rollback_stops_apply),
                TEST(test_reset_never),
                TEST(test_reset_fails),
                TEST(test_reset_hangs),
                TEST(test_busy),
                TEST(test_journal_recovery),
                TEST(test_l40s),
        };
        int r;

        log_set_max_level(LOG_WARNING);
        lib_path = lib ? strdup(lib) : build ? strprintf("%s/tests/fakes/libnvidia-ml.so.1", build) : NULL;
        ctl_path = build ? strprintf("%s/tests/fakes/fake-nvml-ctl", build) : NULL;
        source_root = strdup(getenv("GNA_SOURCE_ROOT") ?: ".");
        nodes_dir = getenv("GNA_FIXTURE_NODES") ? strdup(getenv("GNA_FIXTURE_NODES"))
                                                : strprintf("%s/tests/fixtures/nodes", build ?: "build");
        r = cmocka_run_group_tests(tests, NULL, NULL);
        free(lib_path);
        free(ctl_path);
        free(source_root);
        free(nodes_dir);
        return r;
}
