/* SPDX-License-Identifier: MIT */
/* Owns the hand-built GPUs the MIG unit tests plan for: the profile tables of the models in
 * tests/fixtures/mig-profiles.yaml (A100-40GB, A100-80GB, H100, H200: 8 memory slices; A30: 4; L40S and
 * a display GPU: no MIG), nodes of such GPUs, and a driver in miniature that applies a plan while
 * enforcing the driver's rules (placements, overlaps, limits, mode), so that a test can check that
 * re-planning after an apply finds nothing to do. A broken rule fails the running cmocka test. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "mig-test-gpus.h"
#include "strv.h"

/* ---- models ---- */

static const MigTestProfileTemplate gi8[] = {
        { 4, 0, 7, 1, 8, { 0 }, 1 },
        { 3, 5, 4, 1, 4, { 0 }, 1 },
        { 2, 9, 3, 2, 4, { 0, 4 }, 2 },
        { 1, 14, 2, 3, 2, { 0, 2, 4 }, 3 },
        { 9, 15, 1, 4, 2, { 0, 2, 4, 6 }, 4 },
        { 0, 19, 1, 7, 1, { 0, 1, 2, 3, 4, 5, 6 }, 7 },
        { 7, 20, 1, 1, 1, { 0, 1, 2, 3, 4, 5, 6 }, 7 },
};

static const MigTestProfileTemplate gi4[] = {
        { 3, 0, 4, 1, 4, { 0 }, 1 },
        { 1, 5, 2, 2, 2, { 0, 2 }, 2 },
        { 8, 6, 2, 1, 2, { 0, 2 }, 2 },
        { 0, 14, 1, 4, 1, { 0, 1, 2, 3 }, 4 },
        { 7, 21, 1, 1, 1, { 0, 1, 2, 3 }, 4 },
};

const MigTestModel mig_test_a100_40 = { "NVIDIA A100-SXM4-40GB", 0x20B010DE, 0x134F10DE, gi8, 7, 8,
        { "7g.40gb", "4g.20gb", "3g.20gb", "2g.10gb", "1g.10gb", "1g.5gb", "1g.5gb+me" } };
const MigTestModel mig_test_a100_80 = { "NVIDIA A100-SXM4-80GB", 0x20B210DE, 0x147F10DE, gi8, 7, 8,
        { "7g.80gb", "4g.40gb", "3g.40gb", "2g.20gb", "1g.20gb", "1g.10gb", "1g.10gb+me" } };
const MigTestModel mig_test_h100 = { "NVIDIA H100 80GB HBM3", 0x233010DE, 0x16C110DE, gi8, 7, 8,
        { "7g.80gb", "4g.40gb", "3g.40gb", "2g.20gb", "1g.20gb", "1g.10gb", "1g.10gb+me" } };
const MigTestModel mig_test_h200 = { "NVIDIA H200", 0x233510DE, 0x18BE10DE, gi8, 7, 8,
        { "7g.141gb", "4g.71gb", "3g.71gb", "2g.35gb", "1g.35gb", "1g.18gb", "1g.18gb+me" } };
const MigTestModel mig_test_a30 = { "NVIDIA A30", 0x20B710DE, 0x153210DE, gi4, 5, 4,
        { "4g.24gb", "2g.12gb", "2g.12gb+me", "1g.6gb", "1g.6gb+me" } };
const MigTestModel mig_test_l40s = { "NVIDIA L40S", 0x26B910DE, 0x185110DE, NULL, 0, 0, {} };
const MigTestModel mig_test_display = { "NVIDIA DGX Display", 0x1FB010DE, 0x12DB10DE, NULL, 0, 0, {} };

static void gpu_init(MigGpuState *g, unsigned index, const MigTestModel *m) {
        static const unsigned ci_slices[] = { 1, 2, 3, 4, 7 };

        *g = (MigGpuState) { .index = index, .pci_id = m->pci_id, .subsystem_id = m->subsystem_id,
                             .mig_capable = m->t != NULL };
        snprintf(g->pci_address, sizeof(g->pci_address), "0000:%02x:00.0", 0x10 + index);
        g->model = strdup(m->name);
        g->gi_profiles = calloc(m->n_t + 1, sizeof(MigGiProfile));
        assert_true(g->model && g->gi_profiles);
        g->n_gi_profiles = m->n_t;
        for (size_t i = 0; i < m->n_t; i++) {
                const MigTestProfileTemplate *t = &m->t[i];
                MigGiProfile *p = &g->gi_profiles[i];
                *p = (MigGiProfile) { .index = t->index, .id = t->id, .name = strdup(m->names[i]), .slices = t->g,
                                      .memory_slices = t->size, .instance_count = t->inst,
                                      .starts = calloc(t->n_starts, sizeof(unsigned)), .n_starts = t->n_starts,
                                      .ci_profiles = calloc(5, sizeof(MigCiProfile)) };
                assert_true(p->name && p->starts && p->ci_profiles);
                memcpy(p->starts, t->starts, t->n_starts * sizeof(unsigned));
                for (unsigned c = 0; c < ELEMENTSOF(ci_slices); c++)
                        if (ci_slices[c] <= t->g && !(ci_slices[c] == 3 && t->g == 4))
                                p->ci_profiles[p->n_ci_profiles++] = (MigCiProfile) {
                                        .index = c, .id = c, .slices = ci_slices[c],
                                        .instance_count = t->g / ci_slices[c] };
        }
}

void mig_test_node_done(MigTestNode *n) {
        mig_gpu_states_free(n->gpus, n->n);
}

MigTestNode mig_test_node_new(const MigTestModel *const *models, size_t n) {
        MigTestNode node = { .gpus = calloc(n, sizeof(MigGpuState)), .n = n };
        assert_non_null(node.gpus);
        for (size_t i = 0; i < n; i++) {
                node.models[i] = models[i];
                gpu_init(&node.gpus[i], (unsigned) i, models[i]);
        }
        return node;
}

MigTestNode mig_test_node_same(const MigTestModel *m, size_t n) {
        const MigTestModel *v[16];
        for (size_t i = 0; i < n; i++)
                v[i] = m;
        return mig_test_node_new(v, n);
}

static const MigGiProfile *profile_named(const MigGpuState *g, const char *name) {
        for (size_t i = 0; i < g->n_gi_profiles; i++)
                if (streq(g->gi_profiles[i].name, name))
                        return &g->gi_profiles[i];
        fail_msg("GPU %u has no profile %s", g->index, name);
        return NULL;
}

const MigGiProfile *mig_test_profile_by_id(const MigGpuState *g, unsigned id) {
        for (size_t i = 0; i < g->n_gi_profiles; i++)
                if (g->gi_profiles[i].id == id)
                        return &g->gi_profiles[i];
        fail_msg("GPU %u has no profile id %u", g->index, id);
        return NULL;
}

static unsigned memory_slices_of(const MigGpuState *g) {
        return g->gi_profiles[0].memory_slices; /* the whole-GPU profile comes first in both templates */
}

/* ---- a driver in miniature: the rules the fake NVML enforces ---- */

static MigGiState *gi_find(MigGpuState *g, unsigned id) {
        for (size_t i = 0; i < g->n_gis; i++)
                if (g->gis[i].id == id)
                        return &g->gis[i];
        return NULL;
}

static unsigned sim_create_gi(MigGpuState *g, unsigned profile_id, unsigned start, unsigned size) {
        const MigGiProfile *p = mig_test_profile_by_id(g, profile_id);
        unsigned same = 0, compute = p->slices;
        unsigned id = memory_slices_of(g) / p->memory_slices - 1 + start / p->memory_slices; /* as the driver numbers */
        bool start_ok = false;

        assert_true(g->mig_current);
        assert_int_equal(size, p->memory_slices);
        for (size_t i = 0; i < p->n_starts; i++)
                start_ok = start_ok || p->starts[i] == start;
        assert_true(start_ok);
        for (size_t i = 0; i < g->n_gis; i++) {
                const MigGiState *o = &g->gis[i];
                if (start < o->start + o->size && o->start < start + size)
                        fail_msg("GPU %u: GI at %u+%u overlaps GI %u at %u+%u", g->index, start, size, o->id, o->start,
                                 o->size);
                same += o->profile_id == profile_id;
                compute += mig_test_profile_by_id(g, o->profile_id)->slices;
        }
        assert_true(same < p->instance_count);
        assert_true(compute <= g->gi_profiles[0].slices);
        MigGiState *t = realloc(g->gis, (g->n_gis + 1) * sizeof(MigGiState));
        assert_non_null(t);
        g->gis = t;
        g->gis[g->n_gis++] = (MigGiState) { .id = id, .profile_id = profile_id, .start = start, .size = size };
        return id;
}

static void sim_create_ci(MigGpuState *g, unsigned gi_id, unsigned ci_profile_id) {
        MigGiState *gi = gi_find(g, gi_id);
        assert_non_null(gi);
        const MigGiProfile *p = mig_test_profile_by_id(g, gi->profile_id);
        unsigned used = 0, id = 0, slices = 0;
        for (size_t i = 0; i < p->n_ci_profiles; i++)
                if (p->ci_profiles[i].id == ci_profile_id)
                        slices = p->ci_profiles[i].slices;
        assert_true(slices > 0);
        for (size_t i = 0; i < gi->n_cis; i++)
                for (size_t k = 0; k < p->n_ci_profiles; k++)
                        if (p->ci_profiles[k].id == gi->ci_profile_ids[i])
                                used += p->ci_profiles[k].slices;
        assert_true(used + slices <= p->slices);
        size_t same = 0;
        for (size_t i = 0; i < gi->n_cis; i++)
                same += gi->ci_profile_ids[i] == ci_profile_id;
        for (size_t k = 0; k < p->n_ci_profiles; k++)
                if (p->ci_profiles[k].id == ci_profile_id)
                        assert_true(same < p->ci_profiles[k].instance_count);
        for (bool taken = true; taken; id += taken) {
                taken = false;
                for (size_t i = 0; i < gi->n_cis; i++)
                        taken = taken || gi->ci_ids[i] == id;
        }
        gi->ci_ids = realloc(gi->ci_ids, (gi->n_cis + 1) * sizeof(unsigned));
        gi->ci_profile_ids = realloc(gi->ci_profile_ids, (gi->n_cis + 1) * sizeof(unsigned));
        assert_true(gi->ci_ids && gi->ci_profile_ids);
        gi->ci_ids[gi->n_cis] = id;
        gi->ci_profile_ids[gi->n_cis++] = ci_profile_id;
}

void mig_test_apply(MigTestNode *node, const MigPlan *plan) {
        for (size_t p = 0; p < plan->n_gpus; p++) {
                const MigGpuPlan *gp = &plan->gpus[p];
                assert_true(gp->gpu < node->n);
                MigGpuState *g = &node->gpus[gp->gpu];
                unsigned created[64] = {};

                assert_true(gp->n_steps < ELEMENTSOF(created));
                for (size_t s = 0; s < gp->n_steps; s++) {
                        const MigStep *st = &gp->steps[s];
                        MigGiState *gi;
                        switch (st->kind) {
                        case MIG_STEP_SET_MODE:
                                assert_int_equal(g->n_gis, 0); /* SetMigMode is IN_USE while GIs exist */
                                g->mig_current = g->mig_pending = st->enable;
                                break;
                        case MIG_STEP_RESET_GPU:
                                g->mig_current = g->mig_pending;
                                for (size_t i = 0; i < g->n_gis; i++)
                                        mig_gi_state_done(&g->gis[i]);
                                g->n_gis = 0;
                                break;
                        case MIG_STEP_DESTROY_CI: {
                                gi = gi_find(g, st->gi_id);
                                assert_non_null(gi);
                                size_t i = 0;
                                while (i < gi->n_cis && gi->ci_ids[i] != st->ci_id)
                                        i++;
                                assert_true(i < gi->n_cis);
                                memmove(gi->ci_ids + i, gi->ci_ids + i + 1, (gi->n_cis - i - 1) * sizeof(unsigned));
                                memmove(gi->ci_profile_ids + i, gi->ci_profile_ids + i + 1,
                                        (gi->n_cis - i - 1) * sizeof(unsigned));
                                gi->n_cis--;
                                break;
                        }
                        case MIG_STEP_DESTROY_GI:
                                gi = gi_find(g, st->gi_id);
                                assert_non_null(gi);
                                assert_int_equal(gi->n_cis, 0); /* the driver says IN_USE */
                                mig_gi_state_done(gi);
                                *gi = g->gis[--g->n_gis];
                                break;
                        case MIG_STEP_CREATE_GI:
                                created[s] = sim_create_gi(g, st->profile_id, st->start, st->size);
                                break;
                        case MIG_STEP_CREATE_CI:
                                if (st->gi_step >= 0) {
                                        assert_true((size_t) st->gi_step < s);
                                        assert_int_equal(gp->steps[st->gi_step].kind, MIG_STEP_CREATE_GI);
                                }
                                sim_create_ci(g, st->gi_step >= 0 ? created[st->gi_step] : st->gi_id, st->profile_id);
                                break;
                        case _MIG_STEP_KIND_MAX:
                        case _MIG_STEP_KIND_INVALID:
                                fail();
                        }
                }
        }
}

void mig_test_set_layout(MigGpuState *g, const char *spec) {
        _cleanup_free_ char *copy = strdup(spec);
        char *save = NULL;

        for (size_t i = 0; i < g->n_gis; i++)
                mig_gi_state_done(&g->gis[i]);
        g->n_gis = 0;
        g->mig_current = g->mig_pending = true;
        for (char *item = strtok_r(copy, " ", &save); item; item = strtok_r(NULL, " ", &save)) {
                char *at = strchr(item, '@'), *slash = strchr(item, '/');
                assert_non_null(at);
                *at = 0;
                if (slash)
                        *slash = 0;
                const MigGiProfile *p = profile_named(g, item);
                unsigned id = sim_create_gi(g, p->id, (unsigned) atoi(at + 1), p->memory_slices);
                if (!slash) {
                        sim_create_ci(g, id, p->ci_profiles[p->n_ci_profiles - 1].id);
                        continue;
                }
                for (char *c = slash + 1; c && *c; c = strchr(c, ',') ? strchr(c, ',') + 1 : NULL)
                        for (size_t k = 0; k < p->n_ci_profiles; k++)
                                if (p->ci_profiles[k].slices == (unsigned) atoi(c))
                                        sim_create_ci(g, id, p->ci_profiles[k].id);
        }
}

/* "" for one CI spanning the GI, else "/1c,1c" (CI slices in CI id order). */
static char *ci_list(const MigGiProfile *p, const MigGiState *gi) {
        _cleanup_strv_free_ char **l = NULL;
        bool whole = gi->n_cis == 1;
        for (unsigned id = 0; id < 64; id++)
                for (size_t c = 0; c < gi->n_cis; c++)
                        for (size_t k = 0; gi->ci_ids[c] == id && k < p->n_ci_profiles; k++)
                                if (p->ci_profiles[k].id == gi->ci_profile_ids[c]) {
                                        whole = whole && p->ci_profiles[k].slices == p->slices;
                                        if (strv_extendf(&l, "%uc", p->ci_profiles[k].slices) < 0)
                                                return NULL;
                                }
        if (whole || !l)
                return strdup("");
        _cleanup_free_ char *j = strv_join(l, ",");
        return j ? strprintf("/%s", j) : NULL;
}

char *mig_test_layout_of(const MigGpuState *g) {
        _cleanup_strv_free_ char **l = NULL;
        for (unsigned s = 0; s < 64; s++)
                for (size_t i = 0; i < g->n_gis; i++)
                        if (g->gis[i].start == s) {
                                const MigGiProfile *p = mig_test_profile_by_id(g, g->gis[i].profile_id);
                                _cleanup_free_ char *cis = ci_list(p, &g->gis[i]);
                                assert_non_null(cis);
                                assert_int_equal(strv_extendf(&l, "%s@%u%s", p->name, s, cis), 0);
                        }
        return l ? strv_join(l, " ") : strdup("");
}
