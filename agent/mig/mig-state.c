/* SPDX-License-Identifier: MIT */
/* Owns reading MIG state through NVML (see mig-state.h). Profile names come from what the GPU reports
 * (slices, memory, the profile index's attribute suffix) through the same formula the labels use
 * (gpu_mig_profile_name), never from a table of ours. The GI profile table (profiles, placements, CI
 * profiles) is a fact of the GPU model and the driver, so it is read once per model and kept for the
 * life of the NVML handle: a pass then reads per GPU only its identity, MIG mode, instances and
 * processes. A planning read asks only as much of the table as its config's names need
 * (mig_state_read_gpu_for()); what a later read needs more of is asked then, index by index. */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mig-config.h"
#include "mig-state.h"
#include "strv.h"

#define MAX_GI_PROFILE_INDEX 64   /* newer drivers add indices; stop at NVML's "no such index" */
#define MAX_PLACEMENTS 32
#define MAX_INSTANCES 16          /* GIs per profile, CIs per GI: 8 on every GPU so far */

/* NVML's CI profile index constants by compute slice count (nvml.h). */
static const struct {
        unsigned index, slices;
} ci_profile_indices[] = {
        { NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, 1 }, { NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE, 2 },
        { NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, 3 }, { NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE, 4 },
        { NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE, 6 }, { NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE, 7 },
        { NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE, 8 },
};

static int failed(GpuNvml *n, const char *pci_address, int r, char **ret_error) {
        if (ret_error && !*ret_error)
                *ret_error = strprintf("Cannot read the MIG state of GPU %s: %s.", pci_address, gpu_nvml_last_error(n));
        return r;
}

/* --- per-model facts --- */

typedef struct MigCiAsked {         /* the CI profiles NVML reported through a GI of one GI profile */
        unsigned gi_profile_id;
        MigCiProfile *l;
        size_t n;
} MigCiAsked;

typedef struct MigModelFacts {
        char *name;                 /* key: NVML name, PCI device id, total memory (the names depend on it) */
        uint32_t pci_id;
        uint64_t total_bytes;
        MigGiProfile *gi_profiles;  /* as read_gi_profiles() leaves them: CI profiles from NVML's numbering */
        size_t n_gi_profiles;
        bool partial;               /* as MigGpuState's gi_profiles_partial, _asked, _end */
        uint64_t indices_asked;
        unsigned end;
        MigCiAsked *asked;
        size_t n_asked;
} MigModelFacts;

/* Kept inside the GpuNvml handle (n->mig_models), so it lives and dies with one driver load: the
 * applier and the MigManager read through the same handle, and a reopened handle starts empty. */
typedef struct MigModelCache {
        MigModelFacts *models;
        size_t n_models;
} MigModelCache;

static void ci_asked_done(MigCiAsked *a) {
        free(a->l);
}

static void model_facts_done(MigModelFacts *m) {
        free(m->name);
        for (size_t i = 0; i < m->n_gi_profiles; i++)
                mig_gi_profile_done(&m->gi_profiles[i]);
        free(m->gi_profiles);
        for (size_t i = 0; i < m->n_asked; i++)
                ci_asked_done(&m->asked[i]);
        free(m->asked);
}

static void model_cache_free(MigModelCache *c) {
        if (!c)
                return;
        for (size_t i = 0; i < c->n_models; i++)
                model_facts_done(&c->models[i]);
        free(c->models);
        free(c);
}

/* n's cache, created on first use; NULL on OOM (the cache only saves reads). */
static MigModelCache *model_cache_get(GpuNvml *n) {
        if (!n->mig_models) {
                n->mig_models = calloc(1, sizeof(MigModelCache));
                if (!n->mig_models)
                        return NULL;
                n->mig_models_free = model_cache_free;
        }
        return n->mig_models;
}

static int ci_profiles_copy(const MigCiProfile *src, size_t n, MigCiProfile **ret) {
        MigCiProfile *l = calloc(n ?: 1, sizeof *l);

        if (!l)
                return -ENOMEM;
        if (n > 0)
                memcpy(l, src, n * sizeof *l);
        *ret = l;
        return 0;
}

static int gi_profiles_copy(const MigGiProfile *src, size_t n, MigGiProfile **ret, size_t *ret_n) {
        MigGiProfile *l = calloc(n ?: 1, sizeof *l);
        size_t k = 0;

        if (!l)
                return -ENOMEM;
        for (; k < n; k++) {
                const MigGiProfile *s = &src[k];
                MigGiProfile *d = &l[k];

                *d = *s;
                d->name = strdup(s->name);
                d->starts = calloc(s->n_starts ?: 1, sizeof *d->starts);
                d->ci_profiles = NULL;
                if (!d->name || !d->starts || ci_profiles_copy(s->ci_profiles, s->n_ci_profiles, &d->ci_profiles) < 0) {
                        k++;
                        goto oom;
                }
                if (s->n_starts > 0)
                        memcpy(d->starts, s->starts, s->n_starts * sizeof *d->starts);
        }
        *ret = l;
        *ret_n = n;
        return 0;
oom:
        while (k > 0)
                mig_gi_profile_done(&l[--k]);
        free(l);
        return -ENOMEM;
}

/* The cached facts of g's model on this handle. */
static MigModelFacts *model_facts_find(GpuNvml *n, const MigGpuState *g, uint64_t total_bytes) {
        MigModelCache *c = model_cache_get(n);

        for (size_t i = 0; c && i < c->n_models; i++) {
                MigModelFacts *m = &c->models[i];
                if (streq(m->name, g->model) && m->pci_id == g->pci_id && m->total_bytes == total_bytes)
                        return m;
        }
        return NULL;
}

/* Keeps what read_gi_profiles() read for g's model. Only a table with profiles: an empty one may be a
 * driver that answers only in MIG mode, and is asked again. NULL (nothing kept) also on OOM: the cache
 * only saves reads. */
static MigModelFacts *model_facts_add(GpuNvml *n, const MigGpuState *g, uint64_t total_bytes) {
        MigModelFacts *l, m = { .pci_id = g->pci_id, .total_bytes = total_bytes, .partial = g->gi_profiles_partial,
                                .indices_asked = g->gi_profiles_asked, .end = g->gi_profiles_end };
        MigModelCache *c = model_cache_get(n);

        if (!c || g->n_gi_profiles == 0)
                return NULL;
        m.name = strdup(g->model);
        if (!m.name || gi_profiles_copy(g->gi_profiles, g->n_gi_profiles, &m.gi_profiles, &m.n_gi_profiles) < 0)
                goto fail;
        l = realloc(c->models, (c->n_models + 1) * sizeof *l);
        if (!l)
                goto fail;
        c->models = l;
        l[c->n_models] = m;
        return &l[c->n_models++];
fail:
        model_facts_done(&m);
        return NULL;
}

/* Replaces facts' table with g's, which read more of it. */
static int model_facts_update(MigModelFacts *m, const MigGpuState *g) {
        MigGiProfile *l;
        size_t n_l;

        if (gi_profiles_copy(g->gi_profiles, g->n_gi_profiles, &l, &n_l) < 0)
                return -ENOMEM;
        for (size_t i = 0; i < m->n_gi_profiles; i++)
                mig_gi_profile_done(&m->gi_profiles[i]);
        free(m->gi_profiles);
        m->gi_profiles = l;
        m->n_gi_profiles = n_l;
        m->partial = g->gi_profiles_partial;
        m->indices_asked = g->gi_profiles_asked;
        m->end = g->gi_profiles_end;
        return 0;
}

/* g's table from facts. */
static int table_from_facts(const MigModelFacts *m, MigGpuState *g) {
        int r;

        r = gi_profiles_copy(m->gi_profiles, m->n_gi_profiles, &g->gi_profiles, &g->n_gi_profiles);
        if (r < 0)
                return r;
        g->gi_profiles_partial = m->partial;
        g->gi_profiles_asked = m->indices_asked;
        g->gi_profiles_end = m->end;
        return 0;
}

static const MigCiAsked *ci_asked_find(const MigModelFacts *m, unsigned gi_profile_id) {
        for (size_t i = 0; m && i < m->n_asked; i++)
                if (m->asked[i].gi_profile_id == gi_profile_id)
                        return &m->asked[i];
        return NULL;
}

static void ci_asked_add(MigModelFacts *m, const MigGiProfile *p) {
        MigCiAsked a = { .gi_profile_id = p->id, .n = p->n_ci_profiles }, *l;

        /* Kept only when NVML reported some: an empty answer is asked again. */
        if (!m || p->n_ci_profiles == 0 || ci_profiles_copy(p->ci_profiles, p->n_ci_profiles, &a.l) < 0)
                return;
        l = realloc(m->asked, (m->n_asked + 1) * sizeof *l);
        if (!l) {
                ci_asked_done(&a);
                return;
        }
        m->asked = l;
        m->asked[m->n_asked++] = a;
}

int mig_state_device(GpuNvml *n, const char *pci_address, nvmlDevice_t *ret) {
        unsigned domain, bus, dev, fn;
        char bus_id[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
        GpuNvmlCached *c;
        int r;

        c = gpu_nvml_cached(n, pci_address);
        if (c && c->absent)
                return -ENODEV;
        if (c && c->handle) {
                *ret = c->handle;
                return 0;
        }
        if (sscanf(pci_address, "%x:%x:%x.%x", &domain, &bus, &dev, &fn) != 4)
                return -EINVAL;
        snprintf(bus_id, sizeof bus_id, "%08X:%02X:%02X.%X", domain, bus, dev, fn);
        r = gpu_nvml_device_get_handle_by_pci_bus_id(n, bus_id, ret);
        if (r == -ENOENT || r == -EINVAL)
                return -ENODEV;
        if (r >= 0 && c)
                c->handle = *ret;
        return r;
}

int mig_state_enumerate(GpuNvml *n, char ***ret, char **ret_error) {
        char **l = NULL;
        int r;

        r = gpu_nvml_enumerate(n, &l, ret_error);
        if (r < 0)
                return r;
        *ret = strv_copy(l);
        return *ret ? 0 : -ENOMEM;
}

int mig_state_processes(GpuNvml *n, nvmlDevice_t d, unsigned *ret) {
        unsigned count = 0;
        int r;

        /* Asking with no room answers the count: SUCCESS for none, INSUFFICIENT_SIZE otherwise. */
        r = gpu_nvml_device_get_compute_running_processes(n, d, &count, NULL);
        if (r == -ENOBUFS || r >= 0) {
                *ret = r >= 0 ? 0 : count ?: 1;
                return 0;
        }
        return r;
}

/* The CI profiles of a GI profile. Asked from NVML through an existing GI of that profile when there is
 * one; otherwise (the question needs a GI handle, and we create nothing just to ask) NVML's numbering:
 * CI profile id = index, C ≤ G compute slices, ⌊G/C⌋ instances, no 3-slice CI in a 4-slice GI. The
 * applier's create is the final check: a CI the GPU refuses fails the apply, which is rolled back. */
static int read_ci_profiles(GpuNvml *n, nvmlGpuInstance_t gi, MigGiProfile *p) {
        MigCiProfile *l;
        size_t k = 0;
        int r;

        l = calloc(ELEMENTSOF(ci_profile_indices), sizeof *l);
        if (!l)
                return -ENOMEM;
        for (size_t i = 0; i < ELEMENTSOF(ci_profile_indices); i++) {
                unsigned idx = ci_profile_indices[i].index, c = ci_profile_indices[i].slices;

                if (gi) {
                        nvmlComputeInstanceProfileInfo_v2_t info = {};

                        r = gpu_nvml_gpu_instance_get_compute_instance_profile_info(
                                n, gi, idx, NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, &info);
                        if (r == -EOPNOTSUPP || r == -EINVAL || r == -ENOENT)
                                continue;
                        if (r < 0) {
                                free(l);
                                return r;
                        }
                        l[k++] = (MigCiProfile) { .index = idx, .id = info.id, .slices = info.sliceCount,
                                                  .instance_count = info.instanceCount };
                        continue;
                }
                if (c > p->slices || (c == 3 && p->slices == 4) || ((c == 6 || c == 8) && c != p->slices))
                        continue;
                l[k++] = (MigCiProfile) { .index = idx, .id = idx, .slices = c, .instance_count = p->slices / c };
        }
        free(p->ci_profiles);
        p->ci_profiles = l;
        p->n_ci_profiles = k;
        return 0;
}

#define GI_INDEX_END 2 /* ask_gi_index(): NVML's table ends at this index */

/* Asks NVML for the GI profile at index: 1 (added to g's table), 0 (the GPU has none there), GI_INDEX_END
 * (no such index: g->gi_profiles_end is set), or a negative errno. */
static int ask_gi_index(GpuNvml *n, nvmlDevice_t d, uint64_t total_bytes, MigGpuState *g, unsigned index) {
        nvmlGpuInstanceProfileInfo_v2_t info = {};
        nvmlGpuInstancePlacement_t pl[MAX_PLACEMENTS];
        unsigned n_pl = ELEMENTSOF(pl);
        const char *suffix;
        MigGiProfile *p;
        int r;

        r = gpu_nvml_device_get_gpu_instance_profile_info(n, d, index, &info);
        if (r == -EINVAL || r == -ENOSYS) {
                g->gi_profiles_end = index;
                return GI_INDEX_END;
        }
        if (r == -EOPNOTSUPP) {
                g->gi_profiles_asked |= UINT64_C(1) << index;
                return 0;
        }
        if (r < 0)
                return r;

        info.name[sizeof info.name - 1] = '\0';
        suffix = gpu_nvml_profile_suffix(index, info.name);

        r = gpu_nvml_device_get_gpu_instance_possible_placements(n, d, info.id, pl, &n_pl);
        if (r < 0)
                return r;

        p = realloc(g->gi_profiles, (g->n_gi_profiles + 1) * sizeof *p);
        if (!p)
                return -ENOMEM;
        g->gi_profiles = p;
        p = &g->gi_profiles[g->n_gi_profiles++];
        *p = (MigGiProfile) {
                .index = index,
                .id = info.id,
                .slices = info.sliceCount,
                .instance_count = info.instanceCount,
                .memory_slices = n_pl > 0 ? pl[0].size : 0,
        };
        p->name = gpu_mig_profile_name(info.sliceCount, info.sliceCount, info.memorySizeMB, total_bytes, suffix);
        if (!p->name)
                p->name = strprintf("profile-%u", info.id); /* no usable name: never matches a config */
        p->starts = calloc(n_pl ?: 1, sizeof *p->starts);
        if (!p->name || !p->starts)
                return -ENOMEM;
        for (unsigned i = 0; i < n_pl; i++)
                p->starts[i] = pl[i].start;
        p->n_starts = n_pl;
        r = read_ci_profiles(n, NULL, p);
        if (r < 0)
                return r;
        g->gi_profiles_asked |= UINT64_C(1) << index;
        return 1;
}

static bool index_asked(const MigGpuState *g, unsigned index) {
        return index < 64 && (g->gi_profiles_asked & (UINT64_C(1) << index));
}

static bool index_past_end(const MigGpuState *g, unsigned index) {
        return g->gi_profiles_end > 0 && index >= g->gi_profiles_end;
}

/* The compute slices of the GI profiles nvml.h defines, as their names say (0: an index newer than us). */
static unsigned index_nominal_slices(unsigned index) {
        switch (index) {
        case NVML_GPU_INSTANCE_PROFILE_1_SLICE:
        case NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1:
        case NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2:
        case NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX:
        case NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME:
        case NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME:
                return 1;
        case NVML_GPU_INSTANCE_PROFILE_2_SLICE:
        case NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1:
        case NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX:
        case NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME:
        case NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME:
                return 2;
        case NVML_GPU_INSTANCE_PROFILE_3_SLICE:
                return 3;
        case NVML_GPU_INSTANCE_PROFILE_4_SLICE:
        case NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX:
                return 4;
        case NVML_GPU_INSTANCE_PROFILE_6_SLICE:
                return 6;
        case NVML_GPU_INSTANCE_PROFILE_7_SLICE:
                return 7;
        case NVML_GPU_INSTANCE_PROFILE_8_SLICE:
                return 8;
        default:
                return 0;
        }
}

static unsigned table_max_slices(const MigGpuState *g) {
        unsigned max = 0;

        for (size_t i = 0; i < g->n_gi_profiles; i++)
                max = max > g->gi_profiles[i].slices ? max : g->gi_profiles[i].slices;
        return max;
}

/* Whether a wanted entry's device filters ("@0xDDDDVVVV[:0xSSSSVVVV],…") take g; none: every GPU. */
static bool wanted_for(const char *filters, const MigGpuState *g) {
        _cleanup_free_ char *copy = filters ? strdup(filters) : NULL;
        char *save = NULL;

        if (!filters || !copy)
                return true; /* out of memory: counted in (reads more, never less) */
        for (char *f = strtok_r(copy, ",", &save); f; f = strtok_r(NULL, ",", &save)) {
                uint32_t pci, sub;
                bool has_sub;

                if (mig_device_filter_parse(f, &pci, &sub, &has_sub) >= 0 && pci == g->pci_id &&
                    (!has_sub || sub == g->subsystem_id))
                        return true;
        }
        return false;
}

/* Whether every GI profile that wanted names for g is in g's table. An entry is a config's profile name,
 * "[<C>c.]<G>g.<GB>gb[attrs]", optionally followed by "@" and the device filters of its config entry (then
 * it is wanted only on GPUs they take). A name that does not parse needs no table (the planner refuses it
 * as such). */
static bool table_has(const MigGpuState *g, char *const *wanted) {
        STRV_FOREACH(w, wanted) {
                _cleanup_free_ char *name = NULL;
                const char *at = strchr(*w, '@');
                MigProfileName pn;
                size_t len;
                bool found = false;

                if (at && !wanted_for(at + 1, g))
                        continue;
                name = at ? strndup(*w, (size_t) (at - *w)) : strdup(*w);
                if (!name)
                        return false; /* reads the whole table */
                if (mig_profile_name_parse(name, &pn) < 0)
                        continue;
                len = strlen(pn.gi_name);
                for (size_t i = 0; i < g->n_gi_profiles && !found; i++)
                        found = g->gi_profiles[i].name && strlen(g->gi_profiles[i].name) == len &&
                                strncmp(g->gi_profiles[i].name, pn.gi_name, len) == 0;
                if (!found)
                        return false;
        }
        return true;
}

static int profile_index_cmp(const void *a, const void *b) {
        const MigGiProfile *x = a, *y = b;
        return x->index < y->index ? -1 : x->index > y->index;
}

/* The rest of the table: every index not asked yet, up to NVML's end. */
static int read_gi_profiles_all(GpuNvml *n, nvmlDevice_t d, uint64_t total_bytes, MigGpuState *g) {
        for (unsigned index = 0; index < MAX_GI_PROFILE_INDEX && !index_past_end(g, index); index++) {
                int r;

                if (index_asked(g, index))
                        continue;
                r = ask_gi_index(n, d, total_bytes, g, index);
                if (r < 0)
                        return r;
                if (r == GI_INDEX_END)
                        break;
        }
        g->gi_profiles_partial = false;
        if (g->n_gi_profiles > 1)
                qsort(g->gi_profiles, g->n_gi_profiles, sizeof *g->gi_profiles, profile_index_cmp);
        return 0;
}

/* Reads what g's table lacks: everything (wanted NULL), or (wanted: the config's profile names) only as
 * far as they need. A partial table holds, in index order, every index up to the last wanted profile found
 * (so a name resolves to the profile the whole table would resolve it to: the first of that name), the
 * largest profile (every index defined with more slices than the largest found is asked: it is the GPU's
 * compute capacity, for the planner's limits and for read_gis_all()), and the end of NVML's table (an
 * index newer than nvml.h could have any size: then the whole table is read). Unknown profiles stay
 * unknown, never absent: a name not found means the whole table is read, so that the planner's refusal
 * lists every profile. */
static int read_gi_profiles(GpuNvml *n, nvmlDevice_t d, uint64_t total_bytes, MigGpuState *g, char *const *wanted) {
        int r;

        if (!wanted)
                return read_gi_profiles_all(n, d, total_bytes, g);

        for (unsigned index = 0; index < MAX_GI_PROFILE_INDEX && !index_past_end(g, index) && !table_has(g, wanted);
             index++) {
                if (index_asked(g, index))
                        continue;
                r = ask_gi_index(n, d, total_bytes, g, index);
                if (r < 0)
                        return r;
                if (r == GI_INDEX_END)
                        break;
        }
        if (!table_has(g, wanted))
                return read_gi_profiles_all(n, d, total_bytes, g);

        for (;;) {
                unsigned have = table_max_slices(g), best = UINT_MAX, best_slices = 0;

                for (unsigned i = 0; i < NVML_GPU_INSTANCE_PROFILE_COUNT; i++)
                        if (!index_asked(g, i) && !index_past_end(g, i) && index_nominal_slices(i) > have &&
                            index_nominal_slices(i) > best_slices) {
                                best = i;
                                best_slices = index_nominal_slices(i);
                        }
                if (best == UINT_MAX)
                        break;
                r = ask_gi_index(n, d, total_bytes, g, best);
                if (r < 0)
                        return r;
        }

        if (g->gi_profiles_end == 0) {
                r = ask_gi_index(n, d, total_bytes, g, NVML_GPU_INSTANCE_PROFILE_COUNT);
                if (r < 0)
                        return r;
                if (r != GI_INDEX_END) /* a driver with indices newer than ours */
                        return read_gi_profiles_all(n, d, total_bytes, g);
        }

        g->gi_profiles_partial = false;
        for (unsigned i = 0; i < g->gi_profiles_end && i < MAX_GI_PROFILE_INDEX; i++)
                if (!index_asked(g, i))
                        g->gi_profiles_partial = true;
        if (g->n_gi_profiles > 1)
                qsort(g->gi_profiles, g->n_gi_profiles, sizeof *g->gi_profiles, profile_index_cmp);
        return 0;
}

static int gi_compare(const void *a, const void *b) {
        const MigGiState *x = a, *y = b;
        return x->id < y->id ? -1 : x->id > y->id;
}

static int read_cis(GpuNvml *n, nvmlGpuInstance_t handle, MigModelFacts *facts, MigGiProfile *p, bool ask_profiles,
                    MigGiState *gi) {
        int r;

        /* The real CI profiles, now that a GI of this profile is at hand (once per GI profile; once per
         * model when a previous GPU of the model already had one). */
        if (ask_profiles) {
                const MigCiAsked *a = ci_asked_find(facts, p->id);

                if (a) {
                        MigCiProfile *l;

                        r = ci_profiles_copy(a->l, a->n, &l);
                        if (r < 0)
                                return r;
                        free(p->ci_profiles);
                        p->ci_profiles = l;
                        p->n_ci_profiles = a->n;
                } else {
                        r = read_ci_profiles(n, handle, p);
                        if (r < 0)
                                return r;
                        ci_asked_add(facts, p);
                }
        }
        gi->ci_ids = calloc(MAX_INSTANCES, sizeof *gi->ci_ids);
        gi->ci_profile_ids = calloc(MAX_INSTANCES, sizeof *gi->ci_profile_ids);
        if (!gi->ci_ids || !gi->ci_profile_ids)
                return -ENOMEM;

        /* Largest CI profile first (a GI usually holds one CI of its full size): once the CIs found use
         * all of the GI's compute slices, no other CI can exist, and the smaller profiles are not asked. */
        unsigned used = 0;
        for (size_t j = p->n_ci_profiles; j > 0; j--) {
                nvmlComputeInstance_t cis[MAX_INSTANCES];
                unsigned count = ELEMENTSOF(cis);
                size_t i = j - 1;

                if (p->slices > 0 && used >= p->slices)
                        break;
                r = gpu_nvml_gpu_instance_get_compute_instances(n, handle, p->ci_profiles[i].id, cis, &count);
                if (r == -EOPNOTSUPP || r == -EINVAL)
                        continue;
                if (r < 0)
                        return r;
                /* The planner needs each CI's profile (the one asked for), not its id: only a destroy does,
                 * and it takes any CI of the profile (mig-apply-gpu.c). One call per CI saved. */
                for (unsigned k = 0; k < count && gi->n_cis < MAX_INSTANCES; k++) {
                        gi->ci_ids[gi->n_cis] = MIG_CI_ID_UNKNOWN;
                        gi->ci_profile_ids[gi->n_cis++] = p->ci_profiles[i].id;
                        used += p->ci_profiles[i].slices;
                }
        }
        /* By CI id, as nvidia-smi lists them (when known). */
        for (size_t i = 1; i < gi->n_cis; i++)
                for (size_t k = i; k > 0 && gi->ci_ids[k - 1] > gi->ci_ids[k]; k--) {
                        unsigned t = gi->ci_ids[k];
                        gi->ci_ids[k] = gi->ci_ids[k - 1];
                        gi->ci_ids[k - 1] = t;
                        t = gi->ci_profile_ids[k];
                        gi->ci_profile_ids[k] = gi->ci_profile_ids[k - 1];
                        gi->ci_profile_ids[k - 1] = t;
                }
        return 0;
}

/* Whether every placement of p overlaps a memory slice in occupied: then no GI of p can exist (GIs never
 * overlap), and NVML need not be asked. */
static bool profile_cannot_fit(const MigGiProfile *p, uint64_t occupied) {
        if (p->n_starts == 0 || p->memory_slices == 0)
                return false;
        for (size_t i = 0; i < p->n_starts; i++) {
                uint64_t mask;

                if (p->starts[i] + p->memory_slices > 64)
                        return false;
                mask = (p->memory_slices >= 64 ? ~UINT64_C(0) : (UINT64_C(1) << p->memory_slices) - 1) << p->starts[i];
                if (!(occupied & mask))
                        return false;
        }
        return true;
}

static int read_gis(GpuNvml *n, nvmlDevice_t d, MigModelFacts *facts, MigGpuState *g) {
        uint64_t occupied = 0; /* memory slices of the GIs found so far */
        int r;

        for (size_t i = 0; i < g->n_gi_profiles; i++) {
                MigGiProfile *p = &g->gi_profiles[i];
                nvmlGpuInstance_t gis[MAX_INSTANCES];
                unsigned count = ELEMENTSOF(gis);

                if (profile_cannot_fit(p, occupied))
                        continue;
                r = gpu_nvml_device_get_gpu_instances(n, d, p->id, gis, &count);
                if (r < 0)
                        return r;
                for (unsigned k = 0; k < count; k++) {
                        nvmlGpuInstanceInfo_t info = {};
                        MigGiState *gi;

                        r = gpu_nvml_gpu_instance_get_info(n, gis[k], &info);
                        if (r < 0)
                                return r;
                        gi = realloc(g->gis, (g->n_gis + 1) * sizeof *gi);
                        if (!gi)
                                return -ENOMEM;
                        g->gis = gi;
                        gi = &g->gis[g->n_gis++];
                        *gi = (MigGiState) { .id = info.id, .profile_id = info.profileId,
                                             .start = info.placement.start, .size = info.placement.size };
                        for (unsigned m = info.placement.start; m < info.placement.start + info.placement.size && m < 64; m++)
                                occupied |= UINT64_C(1) << m;
                        r = read_cis(n, gis[k], facts, p, k == 0, gi);
                        if (r < 0)
                                return r;
                }
        }
        if (g->n_gis > 1)
                qsort(g->gis, g->n_gis, sizeof *g->gis, gi_compare);
        return 0;
}

/* Whether the GIs of g use every compute slice its GPU has (the largest profile's). */
static bool gis_fill_gpu(const MigGpuState *g) {
        unsigned used = 0, max = table_max_slices(g);

        for (size_t i = 0; i < g->n_gis; i++) {
                const MigGiProfile *p = mig_state_gi_profile(g, g->gis[i].profile_id);
                if (!p)
                        return false;
                used += p->slices;
        }
        return max > 0 && used >= max;
}

int mig_state_read_gpu(GpuNvml *n, const char *pci_address, unsigned index, MigGpuState *ret, char **ret_error) {
        return mig_state_read_gpu_for(n, pci_address, index, NULL, ret, ret_error);
}

int mig_state_read_gpu_for(GpuNvml *n, const char *pci_address, unsigned index, char *const *wanted,
                           MigGpuState *ret, char **ret_error) {
        _cleanup_(mig_gpu_state_done) MigGpuState g = { .index = index };
        char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = "";
        nvmlPciInfo_t pci = {};
        nvmlMemory_t mem = {};
        nvmlDevice_t d = NULL;
        GpuNvmlCached *c;
        MigModelFacts *facts;
        unsigned current = 0, pending = 0;
        int r;

        assert(n);
        assert(ret);

        if (strlen(pci_address) >= sizeof g.pci_address)
                return -EINVAL;
        strcpy(g.pci_address, pci_address);

        r = mig_state_device(n, pci_address, &d);
        if (r == -ENODEV)
                return r;
        if (r < 0)
                return failed(n, pci_address, r, ret_error);

        /* PCI ids, name and memory size do not change while the handle lives: asked once per handle
         * (shared with the snapshot read's cache of static facts). */
        c = gpu_nvml_cached(n, pci_address);
        if (c && (c->facts & GPU_FACT_PCI_IDS)) {
                g.pci_id = c->pci_device_id;
                g.subsystem_id = c->pci_subsystem_id;
        } else {
                r = gpu_nvml_device_get_pci_info(n, d, &pci);
                if (r < 0)
                        return failed(n, pci_address, r, ret_error);
                g.pci_id = pci.pciDeviceId;
                g.subsystem_id = pci.pciSubSystemId;
                if (c) {
                        c->pci_device_id = g.pci_id;
                        c->pci_subsystem_id = g.subsystem_id;
                        c->facts |= GPU_FACT_PCI_IDS;
                }
        }

        if (c && (c->facts & GPU_FACT_NAME) && c->name)
                g.model = strdup(c->name);
        else {
                r = gpu_nvml_device_get_name(n, d, name, sizeof name);
                if (r < 0)
                        return failed(n, pci_address, r, ret_error);
                g.model = strdup(name);
                if (g.model && c && *name && !c->name && (c->name = strdup(name)))
                        c->facts |= GPU_FACT_NAME;
        }
        if (!g.model)
                return -ENOMEM;

        /* Compute processes are not asked here: only the GPUs a plan changes are asked, just before the
         * apply (mig_busy_job()); a read that plans nothing (or only shows) does not need them. */

        r = gpu_nvml_device_get_mig_mode(n, d, &current, &pending);
        if (r == -EOPNOTSUPP) {
                *ret = g;
                g = (MigGpuState) {};
                return 0;
        }
        if (r < 0)
                return failed(n, pci_address, r, ret_error);
        g.mig_capable = true;
        g.mig_current = current == NVML_DEVICE_MIG_ENABLE;
        g.mig_pending = pending == NVML_DEVICE_MIG_ENABLE;

        if (c && (c->facts & GPU_FACT_MEMORY))
                mem.total = c->memory_total_bytes;
        else {
                r = gpu_nvml_device_get_memory_info(n, d, &mem);
                if (r < 0)
                        return failed(n, pci_address, r, ret_error);
                if (c && mem.total > 0) {
                        c->memory_total_bytes = mem.total;
                        c->facts |= GPU_FACT_MEMORY;
                }
        }

        facts = model_facts_find(n, &g, mem.total);
        if (facts) {
                r = table_from_facts(facts, &g);
                if (r < 0)
                        return r;
        }
        if (!facts || facts->partial) {
                uint64_t asked = g.gi_profiles_asked;

                r = read_gi_profiles(n, d, mem.total, &g, wanted);
                if (r < 0)
                        return r == -ENOMEM ? r : failed(n, pci_address, r, ret_error);
                if (!facts)
                        facts = model_facts_add(n, &g, mem.total);
                else if ((g.gi_profiles_asked != asked || !g.gi_profiles_partial) && model_facts_update(facts, &g) < 0)
                        return -ENOMEM;
        }

        if (g.mig_current) {
                r = read_gis(n, d, facts, &g);
                if (r < 0)
                        return r == -ENOMEM ? r : failed(n, pci_address, r, ret_error);
                /* A GI of a profile not read could exist unless those found use every compute slice of the
                 * GPU (GIs never share one; the largest profile, which a partial table holds, is the GPU):
                 * otherwise the whole table, and the GIs again. */
                if (g.gi_profiles_partial && !gis_fill_gpu(&g)) {
                        for (size_t i = 0; i < g.n_gis; i++)
                                mig_gi_state_done(&g.gis[i]);
                        g.gis = mfree(g.gis);
                        g.n_gis = 0;
                        for (size_t i = 0; i < g.n_gi_profiles; i++)
                                mig_gi_profile_done(&g.gi_profiles[i]);
                        g.gi_profiles = mfree(g.gi_profiles);
                        g.n_gi_profiles = 0;
                        r = facts ? table_from_facts(facts, &g) : 0;
                        if (r < 0)
                                return r;
                        r = read_gi_profiles(n, d, mem.total, &g, NULL);
                        if (r < 0)
                                return r == -ENOMEM ? r : failed(n, pci_address, r, ret_error);
                        if (facts && model_facts_update(facts, &g) < 0)
                                return -ENOMEM;
                        r = read_gis(n, d, facts, &g);
                        if (r < 0)
                                return r == -ENOMEM ? r : failed(n, pci_address, r, ret_error);
                }
        }

        *ret = g;
        g = (MigGpuState) {};
        return 0;
}

int mig_state_read(GpuNvml *n, char *const *pci_addresses, MigGpuState **ret, size_t *ret_n, char **ret_error) {
        return mig_state_read_for(n, pci_addresses, NULL, ret, ret_n, ret_error);
}

int mig_state_read_for(GpuNvml *n, char *const *pci_addresses, char *const *wanted, MigGpuState **ret, size_t *ret_n,
                       char **ret_error) {
        _cleanup_strv_free_ char **all = NULL;
        MigGpuState *l = NULL;
        size_t k = 0, count;
        int r;

        if (!pci_addresses) {
                r = mig_state_enumerate(n, &all, ret_error);
                if (r < 0)
                        return r;
                pci_addresses = all;
        }
        count = strv_length(pci_addresses);
        l = calloc(count ?: 1, sizeof *l);
        if (!l)
                return -ENOMEM;
        for (size_t i = 0; i < count; i++) {
                int progress_gpu = n->progress_gpu;

                /* A worker's progress names the GPU being read ("… on GPU 3 has not returned"). */
                n->progress_gpu = (int) i;
                r = mig_state_read_gpu_for(n, pci_addresses[i], (unsigned) i, wanted, &l[k], ret_error);
                n->progress_gpu = progress_gpu;
                if (r == -ENODEV)
                        continue;
                if (r < 0) {
                        mig_gpu_states_free(l, k);
                        return r;
                }
                k++;
        }
        *ret = l;
        *ret_n = k;
        return 0;
}

int mig_state_copy_layout(const MigGpuState *src, MigGpuState *ret) {
        _cleanup_(mig_gpu_state_done) MigGpuState g = {
                .index = src->index,
                .pci_id = src->pci_id,
                .subsystem_id = src->subsystem_id,
                .mig_capable = src->mig_capable,
                .mig_current = src->mig_current,
                .mig_pending = src->mig_pending,
                .busy = src->busy,
        };

        memcpy(g.pci_address, src->pci_address, sizeof g.pci_address);
        if (src->model && !(g.model = strdup(src->model)))
                return -ENOMEM;
        if (src->n_gis > 0) {
                g.gis = calloc(src->n_gis, sizeof *g.gis);
                if (!g.gis)
                        return -ENOMEM;
        }
        for (size_t i = 0; i < src->n_gis; i++) {
                const MigGiState *s = &src->gis[i];
                MigGiState *d = &g.gis[g.n_gis++];

                *d = (MigGiState) { .id = s->id, .profile_id = s->profile_id, .start = s->start, .size = s->size };
                d->ci_ids = calloc(s->n_cis ?: 1, sizeof *d->ci_ids);
                d->ci_profile_ids = calloc(s->n_cis ?: 1, sizeof *d->ci_profile_ids);
                if (!d->ci_ids || !d->ci_profile_ids)
                        return -ENOMEM;
                if (s->n_cis > 0) {
                        memcpy(d->ci_ids, s->ci_ids, s->n_cis * sizeof *d->ci_ids);
                        memcpy(d->ci_profile_ids, s->ci_profile_ids, s->n_cis * sizeof *d->ci_profile_ids);
                }
                d->n_cis = s->n_cis;
        }
        *ret = g;
        g = (MigGpuState) {};
        return 0;
}

static bool gi_same(const MigGiState *a, const MigGiState *b) {
        bool used[MAX_INSTANCES] = {};

        if (a->profile_id != b->profile_id || a->start != b->start || a->n_cis != b->n_cis || a->n_cis > MAX_INSTANCES)
                return false;
        for (size_t i = 0; i < a->n_cis; i++) {
                size_t k;
                for (k = 0; k < b->n_cis; k++)
                        if (!used[k] && b->ci_profile_ids[k] == a->ci_profile_ids[i])
                                break;
                if (k == b->n_cis)
                        return false;
                used[k] = true;
        }
        return true;
}

bool mig_state_layout_equal(const MigGpuState *a, const MigGpuState *b) {
        if (a->mig_current != b->mig_current || a->n_gis != b->n_gis)
                return false;
        for (size_t i = 0; i < a->n_gis; i++) {
                size_t k;
                for (k = 0; k < b->n_gis; k++)
                        if (gi_same(&a->gis[i], &b->gis[k]))
                                break;
                if (k == b->n_gis)
                        return false;
        }
        return true;
}

const MigGiProfile *mig_state_gi_profile(const MigGpuState *g, unsigned profile_id) {
        for (size_t i = 0; i < g->n_gi_profiles; i++)
                if (g->gi_profiles[i].id == profile_id)
                        return &g->gi_profiles[i];
        return NULL;
}

const MigGpuState *mig_state_find(const MigGpuState *gpus, size_t n, const char *pci_address) {
        for (size_t i = 0; i < n; i++)
                if (streq(gpus[i].pci_address, pci_address))
                        return &gpus[i];
        return NULL;
}

char *mig_state_layout_summary(const MigGpuState *g) {
        _cleanup_strv_free_ char **parts = NULL;

        if (!g->mig_capable)
                return strdup("not MIG capable");
        if (!g->mig_current)
                return strdup(g->mig_pending ? "MIG disabled (enabled once the GPU is reset)" : "MIG disabled");
        if (g->n_gis == 0)
                return strdup("MIG enabled, no instances");
        /* In memory order, as a person draws the GPU. */
        for (unsigned start = 0, done = 0; done < g->n_gis && start < 64; start++)
                for (size_t i = 0; i < g->n_gis; i++) {
                        const MigGiProfile *p;
                        if (g->gis[i].start != start)
                                continue;
                        p = mig_state_gi_profile(g, g->gis[i].profile_id);
                        if (strv_extendf(&parts, "%s@%u", p ? p->name : "?", start) < 0)
                                return NULL;
                        done++;
                }
        return strv_join(parts, ", ");
}

int mig_state_read_layout(GpuNvml *n, const MigGpuState *known, const unsigned *gi_profile_ids, size_t n_gi_profile_ids,
                          const unsigned *ci_profile_ids, size_t n_ci_profile_ids, MigGpuState *ret, char **ret_error) {
        _cleanup_(mig_gpu_state_done) MigGpuState g = {};
        unsigned current = 0, pending = 0;
        nvmlDevice_t d = NULL;
        int r;

        assert(n && known && ret);

        /* What a MIG write cannot change comes from known: identity and the profile table. */
        r = mig_state_copy_layout(known, &g);
        if (r < 0)
                return r;
        g.n_gis = 0;
        for (size_t i = 0; i < known->n_gis; i++)
                mig_gi_state_done(&g.gis[i]);
        g.gis = mfree(g.gis);
        g.busy = false;
        if (known->n_gi_profiles > 0) {
                r = gi_profiles_copy(known->gi_profiles, known->n_gi_profiles, &g.gi_profiles, &g.n_gi_profiles);
                if (r < 0)
                        return r;
                g.gi_profiles_partial = known->gi_profiles_partial;
                g.gi_profiles_asked = known->gi_profiles_asked;
                g.gi_profiles_end = known->gi_profiles_end;
        }
        if (!known->mig_capable) {
                *ret = g;
                g = (MigGpuState) {};
                return 0;
        }

        r = mig_state_device(n, known->pci_address, &d);
        if (r == -ENODEV)
                return r;
        if (r < 0)
                return failed(n, known->pci_address, r, ret_error);
        r = gpu_nvml_device_get_mig_mode(n, d, &current, &pending);
        if (r < 0)
                return failed(n, known->pci_address, r, ret_error);
        g.mig_current = current == NVML_DEVICE_MIG_ENABLE;
        g.mig_pending = pending == NVML_DEVICE_MIG_ENABLE;
        if (!g.mig_current) {
                *ret = g;
                g = (MigGpuState) {};
                return 0;
        }

        for (size_t i = 0; i < n_gi_profile_ids; i++) {
                nvmlGpuInstance_t gis[MAX_INSTANCES];
                unsigned count = ELEMENTSOF(gis);

                r = gpu_nvml_device_get_gpu_instances(n, d, gi_profile_ids[i], gis, &count);
                if (r == -EOPNOTSUPP || r == -EINVAL)
                        continue;
                if (r < 0)
                        return failed(n, known->pci_address, r, ret_error);
                for (unsigned k = 0; k < count; k++) {
                        nvmlGpuInstanceInfo_t info = {};
                        const MigGiProfile *p;
                        MigGiState *gi;

                        r = gpu_nvml_gpu_instance_get_info(n, gis[k], &info);
                        if (r < 0)
                                return failed(n, known->pci_address, r, ret_error);
                        gi = realloc(g.gis, (g.n_gis + 1) * sizeof *gi);
                        if (!gi)
                                return -ENOMEM;
                        g.gis = gi;
                        gi = &g.gis[g.n_gis++];
                        *gi = (MigGiState) { .id = info.id, .profile_id = info.profileId,
                                             .start = info.placement.start, .size = info.placement.size };
                        gi->ci_ids = calloc(MAX_INSTANCES, sizeof *gi->ci_ids);
                        gi->ci_profile_ids = calloc(MAX_INSTANCES, sizeof *gi->ci_profile_ids);
                        if (!gi->ci_ids || !gi->ci_profile_ids)
                                return -ENOMEM;
                        p = mig_state_gi_profile(&g, info.profileId);
                        for (size_t c = 0; c < n_ci_profile_ids; c++) {
                                nvmlComputeInstance_t cis[MAX_INSTANCES];
                                unsigned n_cis = ELEMENTSOF(cis);
                                bool listed = !p;

                                /* Only CI profiles this GI profile takes (when the table says). */
                                for (size_t q = 0; p && q < p->n_ci_profiles; q++)
                                        listed = listed || p->ci_profiles[q].id == ci_profile_ids[c];
                                if (!listed)
                                        continue;
                                r = gpu_nvml_gpu_instance_get_compute_instances(n, gis[k], ci_profile_ids[c], cis, &n_cis);
                                if (r == -EOPNOTSUPP || r == -EINVAL)
                                        continue;
                                if (r < 0)
                                        return failed(n, known->pci_address, r, ret_error);
                                for (unsigned m = 0; m < n_cis && gi->n_cis < MAX_INSTANCES; m++) {
                                        nvmlComputeInstanceInfo_t ci = {};

                                        r = gpu_nvml_compute_instance_get_info(n, cis[m], &ci);
                                        if (r < 0)
                                                return failed(n, known->pci_address, r, ret_error);
                                        gi->ci_ids[gi->n_cis] = ci.id;
                                        gi->ci_profile_ids[gi->n_cis++] = ci.profileId;
                                }
                        }
                }
        }
        if (g.n_gis > 1)
                qsort(g.gis, g.n_gis, sizeof *g.gis, gi_compare);
        *ret = g;
        g = (MigGpuState) {};
        return 0;
}

/* One more CI on gi (its arrays are sized n_cis: grown by one). */
static int gi_add_ci(MigGiState *gi, unsigned ci_id, unsigned profile_id) {
        unsigned *ids = realloc(gi->ci_ids, (gi->n_cis + 1) * sizeof *ids), *profiles;

        if (!ids)
                return -ENOMEM;
        gi->ci_ids = ids;
        profiles = realloc(gi->ci_profile_ids, (gi->n_cis + 1) * sizeof *profiles);
        if (!profiles)
                return -ENOMEM;
        gi->ci_profile_ids = profiles;
        ids[gi->n_cis] = ci_id;
        profiles[gi->n_cis++] = profile_id;
        return 0;
}

static MigGiState *gi_find_id(MigGpuState *g, unsigned id) {
        for (size_t i = 0; i < g->n_gis; i++)
                if (g->gis[i].id == id)
                        return &g->gis[i];
        return NULL;
}

int mig_state_after_steps(const MigGpuState *known, const MigGpuPlan *plan, size_t n_done, const unsigned *created,
                          bool mode_waits_for_reset, MigGpuState *ret) {
        _cleanup_(mig_gpu_state_done) MigGpuState g = {};
        int r;

        assert(known && plan && ret);
        assert(n_done <= plan->n_steps);

        r = mig_state_copy_layout(known, &g);
        if (r < 0)
                return r;
        g.busy = false;
        if (known->n_gi_profiles > 0) {
                r = gi_profiles_copy(known->gi_profiles, known->n_gi_profiles, &g.gi_profiles, &g.n_gi_profiles);
                if (r < 0)
                        return r;
                g.gi_profiles_partial = known->gi_profiles_partial;
                g.gi_profiles_asked = known->gi_profiles_asked;
                g.gi_profiles_end = known->gi_profiles_end;
        }

        for (size_t i = 0; i < n_done; i++) {
                const MigStep *s = &plan->steps[i];
                unsigned gi_id = s->gi_step >= 0 && (size_t) s->gi_step < plan->n_steps ? created[s->gi_step] : s->gi_id;
                MigGiState *gi;

                switch (s->kind) {
                case MIG_STEP_SET_MODE:
                        g.mig_pending = s->enable;
                        /* Active at once unless the run stopped right here to wait for the reset. */
                        if (!(mode_waits_for_reset && i + 1 == n_done))
                                g.mig_current = s->enable;
                        break;
                case MIG_STEP_RESET_GPU:
                        g.mig_current = g.mig_pending;
                        break;
                case MIG_STEP_DESTROY_CI:
                        gi = gi_find_id(&g, s->gi_id);
                        for (size_t k = 0; gi && k < gi->n_cis; k++)
                                if (gi->ci_ids[k] == s->ci_id) {
                                        memmove(&gi->ci_ids[k], &gi->ci_ids[k + 1], (gi->n_cis - k - 1) * sizeof *gi->ci_ids);
                                        memmove(&gi->ci_profile_ids[k], &gi->ci_profile_ids[k + 1],
                                                (gi->n_cis - k - 1) * sizeof *gi->ci_profile_ids);
                                        gi->n_cis--;
                                        break;
                                }
                        break;
                case MIG_STEP_DESTROY_GI:
                        gi = gi_find_id(&g, s->gi_id);
                        if (gi) {
                                size_t k = (size_t) (gi - g.gis);
                                mig_gi_state_done(gi);
                                memmove(&g.gis[k], &g.gis[k + 1], (g.n_gis - k - 1) * sizeof *g.gis);
                                g.n_gis--;
                        }
                        break;
                case MIG_STEP_CREATE_GI:
                        gi = realloc(g.gis, (g.n_gis + 1) * sizeof *gi);
                        if (!gi)
                                return -ENOMEM;
                        g.gis = gi;
                        g.gis[g.n_gis++] = (MigGiState) { .id = created[i], .profile_id = s->profile_id,
                                                          .start = s->start, .size = s->size };
                        break;
                case MIG_STEP_CREATE_CI:
                        gi = gi_find_id(&g, gi_id);
                        if (!gi)
                                return -ENOENT; /* a CI in a GI the steps neither found nor made: read instead */
                        r = gi_add_ci(gi, created[i], s->profile_id);
                        if (r < 0)
                                return r;
                        break;
                case _MIG_STEP_KIND_MAX:
                case _MIG_STEP_KIND_INVALID:
                        return -EINVAL;
                }
        }
        if (!g.mig_current)
                for (size_t i = 0; i < g.n_gis; i++)
                        mig_gi_state_done(&g.gis[i]);
        if (!g.mig_current) {
                g.gis = mfree(g.gis);
                g.n_gis = 0;
        }
        if (g.n_gis > 1)
                qsort(g.gis, g.n_gis, sizeof *g.gis, gi_compare);
        *ret = g;
        g = (MigGpuState) {};
        return 0;
}

int mig_state_seed_model(GpuNvml *n, const char *model, uint32_t pci_id, uint64_t total_bytes,
                         const MigGiProfile *profiles, size_t n_profiles, bool partial, uint64_t asked, unsigned end) {
        _cleanup_(mig_gpu_state_done) MigGpuState g = { .pci_id = pci_id, .gi_profiles_partial = partial,
                                                        .gi_profiles_asked = partial ? asked : 0,
                                                        .gi_profiles_end = partial ? end : 0 };
        MigModelFacts *facts;
        int r;

        if (!model || n_profiles == 0)
                return -EINVAL;
        g.model = strdup(model);
        if (!g.model)
                return -ENOMEM;
        if (model_facts_find(n, &g, total_bytes))
                return 0; /* read already: NVML's answer stays */
        r = gi_profiles_copy(profiles, n_profiles, &g.gi_profiles, &g.n_gi_profiles);
        if (r < 0)
                return r;
        /* The table keeps the CI profiles by NVML's numbering, as read_gi_profiles() leaves them; those
         * NVML reported through a GI of a profile are its asked lists. */
        for (size_t i = 0; i < g.n_gi_profiles; i++) {
                r = read_ci_profiles(n, NULL, &g.gi_profiles[i]);
                if (r < 0)
                        return r;
        }
        facts = model_facts_add(n, &g, total_bytes);
        if (!facts)
                return -ENOMEM;
        for (size_t i = 0; i < n_profiles; i++)
                if (profiles[i].n_ci_profiles > 0 && !ci_asked_find(facts, profiles[i].id))
                        ci_asked_add(facts, &profiles[i]);
        return 0;
}
