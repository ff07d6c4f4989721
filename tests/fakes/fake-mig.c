/* SPDX-License-Identifier: MIT */
/* Owns the fake NVML's MIG engine: GPU instance placement (memory slices), per-profile instance limits
 * and compute-slice capacity, compute instances inside a GI, MIG mode with the pending-until-reset rule,
 * and the driver's placement choice when none is given. Mutates FakeGpu only; callers lock and save. */
#include <stdio.h>

#include "fake-node.h"

FakeFit fake_fit_from_string(const char *s) {
        if (!s || streq(s, "best"))
                return FAKE_FIT_BEST;
        if (streq(s, "first"))
                return FAKE_FIT_FIRST;
        if (streq(s, "last"))
                return FAKE_FIT_LAST;
        return _FAKE_FIT_INVALID;
}

unsigned fake_gi_id(const FakeModel *m, unsigned start, unsigned size) {
        return m->memory_slices / size - 1 + start / size;
}

static unsigned slice_mask(unsigned start, unsigned size) {
        return ((1u << size) - 1) << start;
}

static unsigned used_memory(const FakeGpu *g) {
        unsigned mask = 0;
        for (unsigned i = 0; i < FAKE_MAX_GI; i++)
                if (g->gi[i].used)
                        mask |= slice_mask(g->gi[i].start, g->gi[i].size);
        return mask;
}

static unsigned used_compute(const FakeGpu *g) {
        unsigned sum = 0;
        for (unsigned i = 0; i < FAKE_MAX_GI; i++)
                if (g->gi[i].used) {
                        const FakeGiProfile *p = fake_model_gi_by_id(g->model, g->gi[i].profile);
                        sum += p ? p->g : 0;
                }
        return sum;
}

static unsigned count_profile(const FakeGpu *g, unsigned id) {
        unsigned n = 0;
        for (unsigned i = 0; i < FAKE_MAX_GI; i++)
                if (g->gi[i].used && g->gi[i].profile == id)
                        n++;
        return n;
}

static bool is_start(const FakeGiProfile *p, unsigned start) {
        for (size_t i = 0; i < p->n_starts; i++)
                if (p->starts[i] == start)
                        return true;
        return false;
}

bool fake_mig_can_place(const FakeGpu *g, const FakeGiProfile *p, unsigned start) {
        return is_start(p, start) &&
               !(used_memory(g) & slice_mask(start, p->size)) &&
               count_profile(g, p->id) < p->inst &&
               used_compute(g) + p->g <= g->model->compute_slices;
}

/* How many placements of other profiles that are possible now would no longer be possible after p
 * took start: the driver's best-fit measure. */
static unsigned placements_lost(const FakeGpu *g, const FakeGiProfile *p, unsigned start) {
        unsigned mask = slice_mask(start, p->size), lost = 0;
        for (size_t i = 0; i < g->model->n_gi; i++) {
                const FakeGiProfile *q = &g->model->gi[i];
                if (q->id == p->id)
                        continue;
                for (size_t j = 0; j < q->n_starts; j++)
                        if (fake_mig_can_place(g, q, q->starts[j]) && (slice_mask(q->starts[j], q->size) & mask))
                                lost++;
        }
        return lost;
}

FakeResult fake_mig_create_gi(FakeGpu *g, const FakeGiProfile *p, int start, FakeFit fit, unsigned *ret_id) {
        if (!g->model->mig_capable || !g->mig_current)
                return FAKE_NOT_SUPPORTED;
        if (start >= 0) {
                if (!is_start(p, (unsigned) start))
                        return FAKE_INVALID;
                if (!fake_mig_can_place(g, p, (unsigned) start))
                        return FAKE_INSUFFICIENT;
        } else {
                unsigned best_lost = UINT32_MAX;
                for (size_t i = 0; i < p->n_starts; i++) {
                        unsigned s = p->starts[i];
                        if (!fake_mig_can_place(g, p, s))
                                continue;
                        switch (fit) {
                        case FAKE_FIT_FIRST:
                                if (start < 0 || s < (unsigned) start)
                                        start = (int) s;
                                break;
                        case FAKE_FIT_LAST:
                                if (start < 0 || s > (unsigned) start)
                                        start = (int) s;
                                break;
                        case FAKE_FIT_BEST:
                        case _FAKE_FIT_MAX:
                        case _FAKE_FIT_INVALID: {
                                unsigned lost = placements_lost(g, p, s);
                                if (lost < best_lost || (lost == best_lost && s < (unsigned) start)) {
                                        best_lost = lost;
                                        start = (int) s;
                                }
                                break;
                        }
                        }
                }
                if (start < 0)
                        return FAKE_INSUFFICIENT;
        }

        unsigned id = fake_gi_id(g->model, (unsigned) start, p->size);
        assert(id < FAKE_MAX_GI && !g->gi[id].used);
        g->gi[id] = (FakeGi) { .used = true, .profile = p->id, .start = (unsigned) start, .size = p->size };
        if (ret_id)
                *ret_id = id;
        return FAKE_OK;
}

static bool gi_has_cis(const FakeGi *gi) {
        for (unsigned c = 0; c < FAKE_MAX_CI; c++)
                if (gi->ci[c].used)
                        return true;
        return false;
}

FakeResult fake_mig_destroy_gi(FakeGpu *g, unsigned id, bool busy) {
        if (id >= FAKE_MAX_GI || !g->gi[id].used)
                return FAKE_INVALID;
        if (busy || gi_has_cis(&g->gi[id]))
                return FAKE_IN_USE;
        g->gi[id] = (FakeGi) {};
        return FAKE_OK;
}

/* A MIG UUID from the GPU's UUID and the node's creation counter: deterministic, new per creation. */
static void mig_uuid(const FakeGpu *g, uint64_t serial, char *buf, size_t size) {
        uint64_t h[2] = { UINT64_C(0xcbf29ce484222325), UINT64_C(0x84222325cbf29ce4) };
        for (unsigned k = 0; k < 2; k++) {
                for (const char *s = g->uuid; *s; s++)
                        h[k] = (h[k] ^ (uint8_t) *s) * UINT64_C(0x100000001b3);
                for (unsigned i = 0; i < 8; i++)
                        h[k] = (h[k] ^ ((serial >> (8 * i)) & 0xff)) * UINT64_C(0x100000001b3);
        }
        snprintf(buf, size, "MIG-%08x-%04x-%04x-%04x-%012llx", (unsigned) (h[0] >> 32),
                 (unsigned) (h[0] >> 16) & 0xffff, 0x4000 | ((unsigned) h[0] & 0x0fff),
                 0x8000 | ((unsigned) (h[1] >> 48) & 0x3fff), (unsigned long long) (h[1] & UINT64_C(0xffffffffffff)));
}

FakeResult fake_mig_create_ci(FakeNode *n, FakeGpu *g, unsigned gi_id, unsigned ci_profile, unsigned *ret_id) {
        FakeCiProfile cp;
        if (gi_id >= FAKE_MAX_GI || !g->gi[gi_id].used)
                return FAKE_INVALID;
        FakeGi *gi = &g->gi[gi_id];
        const FakeGiProfile *gp = fake_model_gi_by_id(g->model, gi->profile);
        if (!gp)
                return FAKE_INVALID;
        if (!fake_ci_profile(gp, ci_profile, &cp))
                return FAKE_NOT_SUPPORTED;

        unsigned used = 0, same = 0;
        for (unsigned c = 0; c < FAKE_MAX_CI; c++)
                if (gi->ci[c].used) {
                        used |= slice_mask(gi->ci[c].start, gi->ci[c].size);
                        if (gi->ci[c].profile == ci_profile)
                                same++;
                }
        if (same >= cp.inst)
                return FAKE_INSUFFICIENT;
        int start = -1;
        for (unsigned s = 0; s + cp.c <= gp->g; s += cp.c)
                if (!(used & slice_mask(s, cp.c))) {
                        start = (int) s;
                        break;
                }
        if (start < 0)
                return FAKE_INSUFFICIENT;
        unsigned id = 0;
        while (id < FAKE_MAX_CI && gi->ci[id].used)
                id++;
        if (id >= FAKE_MAX_CI)
                return FAKE_INSUFFICIENT;

        FakeCi *ci = &gi->ci[id];
        *ci = (FakeCi) { .used = true, .profile = ci_profile, .start = (unsigned) start, .size = cp.c };
        mig_uuid(g, ++n->serial, ci->uuid, sizeof ci->uuid);
        if (ret_id)
                *ret_id = id;
        return FAKE_OK;
}

FakeResult fake_mig_destroy_ci(FakeGpu *g, unsigned gi, unsigned ci, bool busy) {
        if (gi >= FAKE_MAX_GI || ci >= FAKE_MAX_CI || !g->gi[gi].used || !g->gi[gi].ci[ci].used)
                return FAKE_INVALID;
        if (busy)
                return FAKE_IN_USE;
        g->gi[gi].ci[ci] = (FakeCi) {};
        return FAKE_OK;
}

static bool has_gis(const FakeGpu *g) {
        for (unsigned i = 0; i < FAKE_MAX_GI; i++)
                if (g->gi[i].used)
                        return true;
        return false;
}

FakeResult fake_mig_set_mode(FakeGpu *g, bool enable, bool busy, bool *ret_reset_required) {
        if (!g->model->mig_capable)
                return FAKE_NOT_SUPPORTED;
        if (ret_reset_required)
                *ret_reset_required = false;
        if (enable == g->mig_current && enable == g->mig_pending)
                return FAKE_OK;
        if (has_gis(g) || busy)
                return FAKE_IN_USE;
        g->mig_pending = enable;
        if (!g->model->needs_reset)
                g->mig_current = enable;
        if (ret_reset_required)
                *ret_reset_required = g->mig_pending != g->mig_current;
        return FAKE_OK;
}

FakeResult fake_mig_reset(FakeGpu *g, bool busy) {
        if (busy)
                return FAKE_IN_USE;
        g->mig_current = g->mig_pending;
        for (unsigned i = 0; i < FAKE_MAX_GI; i++)
                g->gi[i] = (FakeGi) {};
        return FAKE_OK;
}

size_t fake_mig_devices(const FakeGpu *g, FakeMigRef *ret) {
        size_t n = 0;
        if (!g->mig_current)
                return 0;
        for (unsigned i = 0; i < FAKE_MAX_GI; i++)
                for (unsigned c = 0; g->gi[i].used && c < FAKE_MAX_CI; c++)
                        if (g->gi[i].ci[c].used)
                                ret[n++] = (FakeMigRef) { .gi = i, .ci = c };
        return n;
}
