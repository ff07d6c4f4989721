/* SPDX-License-Identifier: MIT */
/* Owns MIG planning: which config entry covers each GPU, the resolution of profile names against what
 * that GPU reports, the feasibility checks (instance limits, compute and memory slices, placements),
 * the placement search, and the ordered steps per GPU. Everything is checked for every GPU before a plan
 * is returned, because a half-applied geometry is worse than a refused one (mig-parted wipes a GPU when
 * a profile turns out not to exist). */
#include <stdarg.h>

#include "mig-config.h"
#include "mig-plan.h"
#include "strv.h"

/* Memory slices are tracked as bits; 8 on every MIG GPU today. */
#define MEMORY_SLICES_MAX 64U

typedef struct Want {               /* one GPU instance to have, with its compute instances */
        const MigGiProfile *gi;
        const MigCiProfile **cis;   /* largest first; one spanning the GI for a plain name */
        size_t n_cis;
        char *name;                 /* "3g.20gb", or "3g.20gb (3 × 1c.3g.20gb)" for a shared GI */
        unsigned *starts;           /* the profile's placements, ascending */
        size_t n_starts;
} Want;

typedef struct Device {             /* one requested MIG device: a CI of a GI profile */
        const MigGiProfile *gi;
        const MigCiProfile *ci;
} Device;

typedef struct Problem {            /* one GPU that cannot take its target */
        unsigned gpu;
        const char *model;
        char *text;
} Problem;

typedef struct Problems {
        Problem *items;
        size_t n;
} Problems;

typedef struct Search {
        const MigGpuState *gpu;
        const Want *wants;
        size_t n;
        const MigGiState *const *keepable; /* existing GIs that may be kept (NULL entries otherwise) */
        unsigned *start, *best;
        uint64_t used;
        int score, best_score, max_score;
        size_t deepest;             /* the first item no start could be found for, on the deepest path */
} Search;

static void wants_free(Want *w, size_t n) {
        for (size_t i = 0; w && i < n; i++) {
                free(w[i].cis);
                free(w[i].name);
                free(w[i].starts);
        }
        free(w);
}

static void problems_done(Problems *p) {
        for (size_t i = 0; i < p->n; i++)
                free(p->items[i].text);
        free(p->items);
}

static int problem_add(Problems *p, const MigGpuState *g, const char *fmt, ...) _printf_(3, 4);
static int problem_add(Problems *p, const MigGpuState *g, const char *fmt, ...) {
        char *text;
        va_list ap;

        va_start(ap, fmt);
        int k = vasprintf(&text, fmt, ap);
        va_end(ap);
        if (k < 0)
                return -ENOMEM;
        Problem *t = realloc(p->items, (p->n + 1) * sizeof(Problem));
        if (!t) {
                free(text);
                return -ENOMEM;
        }
        p->items = t;
        p->items[p->n++] = (Problem) { g->index, strna(g->model), text };
        return 0;
}

static bool entry_matches(const MigConfigEntry *e, const MigGpuState *g) {
        bool ok = !e->device_filter;

        for (char **f = e->device_filter; f && *f && !ok; f++) {
                uint32_t pci, sub;
                bool has_sub;
                if (mig_device_filter_parse(*f, &pci, &sub, &has_sub) < 0)
                        continue;
                ok = pci == g->pci_id && (!has_sub || sub == g->subsystem_id);
        }
        if (!ok || e->all_devices)
                return ok;
        for (size_t i = 0; i < e->n_devices; i++)
                if (e->devices[i] == g->index)
                        return true;
        return false;
}

const MigConfigEntry *mig_config_match(const MigConfig *config, const MigGpuState *gpu) {
        const MigConfigEntry *match = NULL;

        for (size_t i = 0; i < config->n_entries; i++)
                if (entry_matches(&config->entries[i], gpu))
                        match = &config->entries[i];
        return match;
}

static const MigGiProfile *gi_profile_by_id(const MigGpuState *g, unsigned id) {
        for (size_t i = 0; i < g->n_gi_profiles; i++)
                if (g->gi_profiles[i].id == id)
                        return &g->gi_profiles[i];
        return NULL;
}

static const MigCiProfile *ci_profile_by_slices(const MigGiProfile *p, unsigned slices) {
        for (size_t i = 0; i < p->n_ci_profiles; i++)
                if (p->ci_profiles[i].slices == slices)
                        return &p->ci_profiles[i];
        return NULL;
}

static char *ci_name(const MigGiProfile *gi, unsigned ci_slices) {
        if (ci_slices == gi->slices)
                return strdup(gi->name);
        return strprintf("%uc.%s", ci_slices, gi->name);
}

/* Display order of a GPU's profiles: by size, as nvidia-smi lists them. */
static int gi_profile_cmp(const void *a, const void *b) {
        const MigGiProfile *x = *(const MigGiProfile *const *) a, *y = *(const MigGiProfile *const *) b;
        if (x->memory_slices != y->memory_slices)
                return x->memory_slices < y->memory_slices ? -1 : 1;
        if (x->slices != y->slices)
                return x->slices < y->slices ? -1 : 1;
        return strcmp(strna(x->name), strna(y->name));
}

static char *gi_profile_list(const MigGpuState *g) {
        _cleanup_free_ const MigGiProfile **v = calloc(g->n_gi_profiles + 1, sizeof(MigGiProfile *));
        _cleanup_strv_free_ char **l = NULL;

        if (!v)
                return NULL;
        for (size_t i = 0; i < g->n_gi_profiles; i++)
                v[i] = &g->gi_profiles[i];
        qsort(v, g->n_gi_profiles, sizeof(MigGiProfile *), gi_profile_cmp);
        for (size_t i = 0; i < g->n_gi_profiles; i++)
                if (strv_extend(&l, strna(v[i]->name)) < 0)
                        return NULL;
        return l ? strv_join(l, ", ") : strdup("none");
}

static int unsigned_cmp(const void *a, const void *b) {
        unsigned x = *(const unsigned *) a, y = *(const unsigned *) b;
        return x < y ? -1 : x > y;
}

static int ci_cmp(const MigCiProfile *x, const MigCiProfile *y) {
        if (x->slices != y->slices)
                return x->slices > y->slices ? -1 : 1;
        return x->id < y->id ? -1 : x->id > y->id;
}

/* Largest first: by memory slices, then compute slices; the rest only makes the order total. */
static int gi_order(const MigGiProfile *x, const MigGiProfile *y) {
        if (x->memory_slices != y->memory_slices)
                return x->memory_slices > y->memory_slices ? -1 : 1;
        if (x->slices != y->slices)
                return x->slices > y->slices ? -1 : 1;
        return x->id < y->id ? -1 : x->id > y->id;
}

static int device_cmp(const void *a, const void *b) {
        const Device *x = a, *y = b;
        return gi_order(x->gi, y->gi) ?: ci_cmp(x->ci, y->ci);
}

static int want_cmp(const void *a, const void *b) {
        const Want *x = a, *y = b;
        int c = gi_order(x->gi, y->gi);
        for (size_t i = 0; c == 0 && i < x->n_cis && i < y->n_cis; i++)
                c = ci_cmp(x->cis[i], y->cis[i]);
        if (c == 0 && x->n_cis != y->n_cis)
                c = x->n_cis > y->n_cis ? -1 : 1;
        return c;
}

static bool want_same(const Want *x, const Want *y) {
        return want_cmp(x, y) == 0;
}

static unsigned want_ci_slices(const Want *w) {
        unsigned sum = 0;
        for (size_t i = 0; i < w->n_cis; i++)
                sum += w->cis[i]->slices;
        return sum;
}

/* Whether w holds anything but one compute instance spanning its GPU instance. */
static bool want_shared(const Want *w) {
        return w->n_cis != 1 || w->cis[0]->slices != w->gi->slices;
}

/* Resolves one request against the GPU's own profiles; 0 with *ret_gi NULL after a problem was recorded. */
static int resolve(const MigGpuState *g, const MigConfigEntry *e, const MigDeviceRequest *req, Problems *pr,
                   const MigGiProfile **ret_gi, const MigCiProfile **ret_ci) {
        const MigGiProfile *gi = NULL;
        const MigCiProfile *ci;
        MigProfileName n;

        *ret_gi = NULL;
        if (mig_profile_name_parse(req->profile, &n) < 0)
                return problem_add(pr, g, "'%s' (entry on line %u) is not a MIG profile name (%s)", req->profile,
                                   e->line, MIG_PROFILE_NAME_SYNTAX);
        for (size_t i = 0; i < g->n_gi_profiles && !gi; i++)
                if (streq_ptr(g->gi_profiles[i].name, n.gi_name))
                        gi = &g->gi_profiles[i];
        if (!gi) {
                _cleanup_free_ char *list = gi_profile_list(g);
                if (!list)
                        return -ENOMEM;
                return problem_add(pr, g, "no MIG profile '%s' (entry on line %u); valid profiles: %s",
                                   n.gi_name, e->line, list);
        }
        ci = ci_profile_by_slices(gi, n.ci_slices ?: gi->slices);
        if (!ci) {
                _cleanup_strv_free_ char **l = NULL;
                for (size_t i = 0; i < gi->n_ci_profiles; i++) {
                        _cleanup_free_ char *c = ci_name(gi, gi->ci_profiles[i].slices);
                        if (!c || strv_extend(&l, c) < 0)
                                return -ENOMEM;
                }
                _cleanup_free_ char *list = l ? strv_join(l, ", ") : strdup("none");
                if (!list)
                        return -ENOMEM;
                return problem_add(pr, g,
                                   "'%s' (entry on line %u): a %s GPU instance has no compute instance of %u slices; "
                                   "valid: %s", req->profile, e->line, gi->name, n.ci_slices ?: gi->slices,
                                   list);
        }
        *ret_gi = gi;
        *ret_ci = ci;
        return 0;
}

/* "2 × 1g.5gb + 1 × 3g.20gb": the devices wants[] hold (only those of GI profile `only` unless NULL), in
 * the wants' order, for messages about the whole request. */
static char *wants_describe(const Want *w, size_t n, const MigGiProfile *only) {
        _cleanup_strv_free_ char **names = NULL;
        _cleanup_free_ size_t *counts = NULL;
        size_t n_names = 0;

        for (size_t i = 0; i < n; i++)
                for (size_t c = 0; (!only || w[i].gi == only) && c < w[i].n_cis; c++) {
                        _cleanup_free_ char *name = ci_name(w[i].gi, w[i].cis[c]->slices);
                        size_t k = 0;
                        if (!name)
                                return NULL;
                        while (k < n_names && !streq(names[k], name))
                                k++;
                        if (k == n_names) {
                                size_t *t = realloc(counts, (n_names + 1) * sizeof(size_t));
                                if (!t)
                                        return NULL;
                                counts = t;
                                counts[n_names++] = 0;
                                if (strv_consume(&names, TAKE_PTR(name)) < 0)
                                        return NULL;
                        }
                        counts[k]++;
                }
        _cleanup_strv_free_ char **l = NULL;
        for (size_t k = 0; k < n_names; k++)
                if (strv_extendf(&l, "%zu × %s", counts[k], names[k]) < 0)
                        return NULL;
        return l ? strv_join(l, " + ") : strdup("nothing");
}

/* Instance limits and capacity, checked before placing so that the message can say which limit. */
static int check_limits(const MigGpuState *g, const Want *w, size_t n, Problems *pr) {
        unsigned compute = 0, memory = 0, compute_max = 0, memory_max = 0;

        for (size_t i = 0; i < g->n_gi_profiles; i++) {
                const MigGiProfile *p = &g->gi_profiles[i];
                size_t count = 0;
                bool shared = false;
                compute_max = compute_max > p->slices ? compute_max : p->slices;
                for (size_t s = 0; s < p->n_starts; s++)
                        memory_max = memory_max > p->starts[s] + p->memory_slices ? memory_max
                                                                                  : p->starts[s] + p->memory_slices;
                for (size_t j = 0; j < n; j++)
                        if (w[j].gi == p) {
                                count++;
                                shared = shared || want_shared(&w[j]);
                        }
                if (count <= p->instance_count)
                        continue;
                if (!shared)
                        return problem_add(pr, g, "%zu × %s is more than the GPU holds: at most %u instance%s of %s",
                                           count, p->name, p->instance_count, p->instance_count == 1 ? "" : "s",
                                           p->name);
                _cleanup_free_ char *what = wants_describe(w, n, p);
                if (!what)
                        return -ENOMEM;
                return problem_add(pr, g,
                                   "%s is more than the GPU holds: compute instances share a %s GPU instance only up "
                                   "to its %u slices, so they need %zu of them, and the GPU holds at most %u",
                                   what, p->name, p->slices, count, p->instance_count);
        }
        for (size_t j = 0; j < n; j++) {
                compute += w[j].gi->slices;
                memory += w[j].gi->memory_slices;
        }
        /* A partial table (mig_state_read_gpu_for()) holds the largest profile, so compute_max is the GPU's;
         * memory_max is at least the extent of the wanted profiles' placements, which any layout that can be
         * placed stays within: a refusal here is never wrong (its "the GPU has" is the largest profile's). */
        if (compute <= compute_max && memory <= memory_max)
                return 0;

        _cleanup_free_ char *what = wants_describe(w, n, NULL);
        if (!what)
                return -ENOMEM;
        if (compute > compute_max)
                return problem_add(pr, g, "%s need %u compute slices; the GPU has %u", what, compute, compute_max);
        return problem_add(pr, g, "%s need %u memory slices; the GPU has %u", what, memory, memory_max);
}

static uint64_t slice_mask(unsigned start, unsigned size) {
        uint64_t m = size >= 64 ? UINT64_MAX : (UINT64_C(1) << size) - 1;
        return m << start;
}

static size_t count_ci(const MigGiState *gi, unsigned ci_profile_id) {
        size_t n = 0;
        for (size_t c = 0; gi->ci_profile_ids && c < gi->n_cis; c++)
                n += gi->ci_profile_ids[c] == ci_profile_id;
        return n;
}

/* Whether an existing GI holds exactly the compute instances w asks for (as a multiset of profiles). */
static bool cis_equal(const MigGiState *gi, const Want *w) {
        if (gi->n_cis != w->n_cis)
                return false;
        for (size_t c = 0; c < w->n_cis; c++) {
                size_t want = 0;
                for (size_t k = 0; k < w->n_cis; k++)
                        want += w->cis[k] == w->cis[c];
                if (count_ci(gi, w->cis[c]->id) != want)
                        return false;
        }
        return true;
}

/* How many of an existing GI's compute instances stay when it is kept for w but its CIs differ. Only
 * when w asks for CIs of one profile: they then take any free aligned slot, so the missing ones fit
 * beside those that stay. With mixed sizes every CI is redone, largest first, because a small CI left
 * where a larger one must go would block it. */
static size_t cis_kept(const MigGiState *gi, const Want *w) {
        for (size_t c = 1; c < w->n_cis; c++)
                if (w->cis[c] != w->cis[0])
                        return 0;
        size_t have = w->n_cis > 0 ? count_ci(gi, w->cis[0]->id) : 0;
        return have < w->n_cis ? have : w->n_cis;
}

static const MigGiState *existing_at(const Search *s, size_t item, unsigned start) {
        for (size_t i = 0; i < s->gpu->n_gis; i++) {
                const MigGiState *gi = s->keepable[i];
                if (gi && gi->profile_id == s->wants[item].gi->id && gi->start == start)
                        return gi;
        }
        return NULL;
}

static int keep_score(const Search *s, size_t item, unsigned start) {
        const MigGiState *gi = existing_at(s, item, start);
        if (!gi)
                return 0;
        return cis_equal(gi, &s->wants[item]) ? 2 : 1;
}

/* Depth-first over starts in ascending order, largest profiles first: the first layout found is the one
 * "lowest start that fits" describes, and a better one replaces it only when it keeps more of what
 * exists (2 per GI kept as it is, 1 per GI whose compute instances are redone). */
static void search(Search *s, size_t i) {
        if (s->best_score == s->max_score)
                return;
        if (i == s->n) {
                if (s->score > s->best_score) {
                        s->best_score = s->score;
                        memcpy(s->best, s->start, s->n * sizeof(unsigned));
                }
                return;
        }
        if (s->score + 2 * (int) (s->n - i) <= s->best_score)
                return;

        const Want *w = &s->wants[i];
        bool placed = false;
        for (size_t k = 0; k < w->n_starts; k++) {
                unsigned st = w->starts[k];
                uint64_t m = slice_mask(st, w->gi->memory_slices);

                if (i > 0 && want_same(&s->wants[i - 1], w) && st <= s->start[i - 1])
                        continue; /* identical items in ascending order: each layout once */
                if (s->used & m)
                        continue;
                int sc = keep_score(s, i, st);
                placed = true;
                s->start[i] = st;
                s->used |= m;
                s->score += sc;
                search(s, i + 1);
                s->score -= sc;
                s->used &= ~m;
        }
        if (!placed && i > s->deepest)
                s->deepest = i;
}

static int step_add(MigGpuPlan *p, MigStep step, char *profile) {
        MigStep *t;

        if (!profile && (step.kind == MIG_STEP_CREATE_GI || step.kind == MIG_STEP_CREATE_CI))
                return -ENOMEM;
        t = realloc(p->steps, (p->n_steps + 1) * sizeof(MigStep));
        if (!t) {
                free(profile);
                return -ENOMEM;
        }
        p->steps = t;
        step.profile = profile;
        p->steps[p->n_steps++] = step;
        return 0;
}

static char *existing_ci_name(const MigGpuState *g, const MigGiState *gi, unsigned ci_profile_id) {
        const MigGiProfile *p = gi_profile_by_id(g, gi->profile_id);
        if (!p)
                return strprintf("GI profile %u", gi->profile_id);
        for (size_t i = 0; i < p->n_ci_profiles; i++)
                if (p->ci_profiles[i].id == ci_profile_id)
                        return ci_name(p, p->ci_profiles[i].slices);
        return strprintf("CI profile %u in %s", ci_profile_id, p->name);
}

/* Destroys gi's compute instances except the first `keep` of CI profile keep_profile. */
static int add_destroy_cis(MigGpuPlan *p, const MigGpuState *g, const MigGiState *gi, unsigned keep_profile,
                           size_t keep) {
        for (size_t c = 0; c < gi->n_cis; c++) {
                if (keep > 0 && gi->ci_profile_ids && gi->ci_profile_ids[c] == keep_profile) {
                        keep--;
                        continue;
                }
                int k = step_add(p, (MigStep) { .kind = MIG_STEP_DESTROY_CI, .gi_id = gi->id, .ci_id = gi->ci_ids[c],
                                                .profile_id = gi->ci_profile_ids ? gi->ci_profile_ids[c] : 0,
                                                .gi_step = -1 },
                                 existing_ci_name(g, gi, gi->ci_profile_ids ? gi->ci_profile_ids[c] : UINT32_MAX));
                if (k < 0)
                        return k;
        }
        return 0;
}

static int gi_state_cmp(const void *a, const void *b) {
        const MigGiState *x = *(const MigGiState *const *) a, *y = *(const MigGiState *const *) b;
        return x->id < y->id ? -1 : x->id > y->id;
}

/* The steps for an enabled target. keep: whether existing GIs may stay (MIG is on now and stays on). */
static int plan_enabled(const MigGpuState *g, const Want *w, size_t n, bool keep, MigGpuPlan *p, Problems *pr) {
        _cleanup_free_ const MigGiState **keepable = calloc(g->n_gis + 1, sizeof(MigGiState *));
        _cleanup_free_ const MigGiState **order = calloc(g->n_gis + 1, sizeof(MigGiState *));
        _cleanup_free_ unsigned *start = calloc(n + 1, sizeof(unsigned)), *best = calloc(n + 1, sizeof(unsigned));
        _cleanup_free_ int *gi_step = calloc(n + 1, sizeof(int));
        _cleanup_free_ const MigGiState **kept = calloc(n + 1, sizeof(MigGiState *));
        int k;

        if (!keepable || !order || !start || !best || !gi_step || !kept)
                return -ENOMEM;
        for (size_t i = 0; i < g->n_gis; i++) {
                keepable[i] = keep ? &g->gis[i] : NULL;
                order[i] = &g->gis[i];
        }

        Search s = { .gpu = g, .wants = w, .n = n, .keepable = keepable, .start = start, .best = best,
                     .best_score = -1, .max_score = 2 * (int) n };
        search(&s, 0);
        if (s.best_score < 0) {
                _cleanup_free_ char *what = wants_describe(w, n, NULL), *starts = NULL;
                _cleanup_strv_free_ char **l = NULL;
                const Want *stuck = &w[s.deepest];
                for (size_t i = 0; i < stuck->n_starts; i++)
                        if (strv_extendf(&l, "%u", stuck->starts[i]) < 0)
                                return -ENOMEM;
                starts = l ? strv_join(l, ", ") : strdup("none");
                if (!what || !starts)
                        return -ENOMEM;
                return problem_add(pr, g,
                                   "%s fit by count and size but not by placement: no free placement is left for %s "
                                   "(it can start at memory slice %s) once the larger ones are placed", what,
                                   stuck->name, starts);
        }

        /* Which existing GIs stay: those the chosen layout puts an item on, at the same start. */
        bool any_change = false;
        for (size_t i = 0; i < n; i++) {
                kept[i] = existing_at(&s, i, best[i]);
                any_change = any_change || !kept[i] || keep_score(&s, i, best[i]) < 2;
        }

        qsort(order, g->n_gis, sizeof(MigGiState *), gi_state_cmp);
        bool destroyed = false;
        /* With MIG off NVML has no instances to report; anything listed then is not ours to destroy. */
        for (size_t pass = 0; g->mig_current && pass < 2; pass++)
                for (size_t j = 0; j < g->n_gis; j++) {
                        const MigGiState *gi = order[j];
                        bool stays = false, redo = false;
                        const Want *as = NULL;
                        for (size_t i = 0; i < n; i++)
                                if (kept[i] == gi) {
                                        stays = true;
                                        redo = keep_score(&s, i, best[i]) < 2;
                                        as = &w[i];
                                }
                        if (stays && !redo)
                                continue;
                        if (pass == 0)
                                k = as ? add_destroy_cis(p, g, gi, as->cis[0]->id, cis_kept(gi, as))
                                       : add_destroy_cis(p, g, gi, 0, 0);
                        else if (stays)
                                continue;
                        else {
                                const MigGiProfile *gp = gi_profile_by_id(g, gi->profile_id);
                                destroyed = true;
                                k = step_add(p,
                                             (MigStep) { .kind = MIG_STEP_DESTROY_GI, .gi_id = gi->id, .gi_step = -1 },
                                             gp ? strdup(gp->name) : strprintf("GI profile %u", gi->profile_id));
                        }
                        if (k < 0)
                                return k;
                }
        if (!any_change && !destroyed && p->n_steps == 0 && keep)
                return 0;

        if (!g->mig_current || !g->mig_pending) {
                /* MIG is off, or on with a change to off pending: set it (back) on. Off with "on" pending
                 * only needs the reset. */
                if (g->mig_current || !g->mig_pending)
                        k = step_add(p, (MigStep) { .kind = MIG_STEP_SET_MODE, .enable = 1, .gi_step = -1 }, NULL);
                else {
                        p->needs_reset = true;
                        k = step_add(p, (MigStep) { .kind = MIG_STEP_RESET_GPU, .gi_step = -1 }, NULL);
                }
                if (k < 0)
                        return k;
        }

        for (size_t i = 0; i < n; i++) {
                gi_step[i] = -1;
                if (kept[i])
                        continue;
                gi_step[i] = (int) p->n_steps;
                k = step_add(p, (MigStep) { .kind = MIG_STEP_CREATE_GI, .profile_id = w[i].gi->id, .start = best[i],
                                            .size = w[i].gi->memory_slices, .gi_step = -1 },
                             strdup(w[i].gi->name));
                if (k < 0)
                        return k;
        }
        for (size_t i = 0; i < n; i++) {
                if (kept[i] && keep_score(&s, i, best[i]) == 2)
                        continue;
                /* Largest first within the GI (w[i].cis is ordered so), after those that stay. */
                for (size_t c = kept[i] ? cis_kept(kept[i], &w[i]) : 0; c < w[i].n_cis; c++) {
                        k = step_add(p, (MigStep) { .kind = MIG_STEP_CREATE_CI, .profile_id = w[i].cis[c]->id,
                                                    .gi_id = kept[i] ? kept[i]->id : 0, .gi_step = gi_step[i] },
                                     ci_name(w[i].gi, w[i].cis[c]->slices));
                        if (k < 0)
                                return k;
                }
        }
        return 0;
}

static int plan_disabled(const MigGpuState *g, MigGpuPlan *p) {
        int k;

        if (g->mig_current && !g->mig_pending) {
                /* Off is already pending: only the reset is missing, and it removes every instance. */
                p->needs_reset = true;
                return step_add(p, (MigStep) { .kind = MIG_STEP_RESET_GPU, .gi_step = -1 }, NULL);
        }
        if (!g->mig_current && !g->mig_pending)
                return 0;
        if (g->mig_current) {
                _cleanup_free_ const MigGiState **order = calloc(g->n_gis + 1, sizeof(MigGiState *));
                if (!order)
                        return -ENOMEM;
                for (size_t j = 0; j < g->n_gis; j++)
                        order[j] = &g->gis[j];
                qsort(order, g->n_gis, sizeof(MigGiState *), gi_state_cmp);
                for (size_t j = 0; j < g->n_gis; j++) {
                        k = add_destroy_cis(p, g, order[j], 0, 0);
                        if (k < 0)
                                return k;
                }
                for (size_t j = 0; j < g->n_gis; j++) {
                        const MigGiProfile *gp = gi_profile_by_id(g, order[j]->profile_id);
                        k = step_add(p, (MigStep) { .kind = MIG_STEP_DESTROY_GI, .gi_id = order[j]->id, .gi_step = -1 },
                                     gp ? strdup(gp->name) : strprintf("GI profile %u", order[j]->profile_id));
                        if (k < 0)
                                return k;
                }
        }
        return step_add(p, (MigStep) { .kind = MIG_STEP_SET_MODE, .enable = 0, .gi_step = -1 }, NULL);
}

/* Whether the GPU already holds exactly the requested devices (as a multiset of GI and CI profiles),
 * however their CIs are grouped into GIs, with no GI left empty: what mig-parted's assert compares, so a
 * layout made by hand or by mig-parted that has the devices is not redone. */
static bool devices_present(const MigGpuState *g, const Device *d, size_t n_devices) {
        size_t n_cis = 0;

        for (size_t j = 0; j < g->n_gis; j++) {
                if (g->gis[j].n_cis == 0 || !g->gis[j].ci_profile_ids)
                        return false;
                n_cis += g->gis[j].n_cis;
        }
        if (n_cis != n_devices)
                return false;
        for (size_t i = 0; i < n_devices; i++) {
                size_t want = 0, have = 0;
                for (size_t k = 0; k < n_devices; k++)
                        want += d[k].gi == d[i].gi && d[k].ci == d[i].ci;
                for (size_t j = 0; j < g->n_gis; j++)
                        if (g->gis[j].profile_id == d[i].gi->id)
                                have += count_ci(&g->gis[j], d[i].ci->id);
                if (have != want)
                        return false;
        }
        return true;
}

/* mig-parted's meaning of a config: MIG devices of one GPU instance profile share GPU instances. Each
 * device is one compute instance; those of a GI profile go, largest first, into the first GI of that
 * profile that still has the compute slices and the per-profile CI count for them (first-fit decreasing),
 * so "1c.3g.20gb": 3 is one 3g GI with three 1c CIs, and a plain "3g.20gb" fills a GI of its own.
 * mig-parted reuses the last GI it made while the next CI fits; this finds the same or fewer GIs. */
static int pack(Device *d, size_t n_devices, Want **ret, size_t *ret_n) {
        Want *w = NULL;
        size_t n = 0;

        if (n_devices > 0)
                qsort(d, n_devices, sizeof(Device), device_cmp);
        for (size_t i = 0; i < n_devices; i++) {
                Want *into = NULL;
                for (size_t j = 0; j < n && !into; j++) {
                        size_t same = 0;
                        if (w[j].gi != d[i].gi || want_ci_slices(&w[j]) + d[i].ci->slices > d[i].gi->slices)
                                continue;
                        for (size_t c = 0; c < w[j].n_cis; c++)
                                same += w[j].cis[c] == d[i].ci;
                        if (same < d[i].ci->instance_count)
                                into = &w[j];
                }
                if (!into) {
                        Want *t = realloc(w, (n + 1) * sizeof(Want));
                        if (!t)
                                goto oom;
                        w = t;
                        into = &w[n++];
                        *into = (Want) { .gi = d[i].gi, .n_starts = d[i].gi->n_starts,
                                         .starts = calloc(d[i].gi->n_starts + 1, sizeof(unsigned)) };
                        if (!into->starts)
                                goto oom;
                        if (d[i].gi->n_starts > 0)
                                memcpy(into->starts, d[i].gi->starts, d[i].gi->n_starts * sizeof(unsigned));
                        qsort(into->starts, into->n_starts, sizeof(unsigned), unsigned_cmp);
                }
                const MigCiProfile **t = realloc(into->cis, (into->n_cis + 1) * sizeof(MigCiProfile *));
                if (!t)
                        goto oom;
                into->cis = t;
                into->cis[into->n_cis++] = d[i].ci;
        }
        for (size_t j = 0; j < n; j++) {
                _cleanup_free_ char *what = want_shared(&w[j]) ? wants_describe(&w[j], 1, NULL) : NULL;
                if (want_shared(&w[j]) && !what)
                        goto oom;
                w[j].name = what ? strprintf("%s (%s)", w[j].gi->name, what) : strdup(w[j].gi->name);
                if (!w[j].name)
                        goto oom;
        }
        *ret = w;
        *ret_n = n;
        return 0;
oom:
        wants_free(w, n);
        return -ENOMEM;
}

static int plan_gpu(const MigGpuState *g, const MigConfigEntry *e, MigGpuPlan *p, Problems *pr) {
        _cleanup_free_ Device *d = NULL;
        Want *w = NULL;
        size_t n = 0, n_devices = 0, problems = pr->n;
        int k = 0;

        p->gpu = g->index;
        memcpy(p->pci_address, g->pci_address, sizeof(p->pci_address));
        p->pci_address[sizeof(p->pci_address) - 1] = 0;

        if (!g->mig_capable) {
                if (e->mig_enabled)
                        return problem_add(pr, g,
                                           "MIG is not supported on this model, but the entry on line %u enables it; "
                                           "exclude such GPUs with device-filter or devices, or set mig-enabled: false "
                                           "for them", e->line);
                return 0;
        }
        if (!e->mig_enabled)
                return plan_disabled(g, p);

        for (size_t r = 0; r < e->n_requests; r++) {
                const MigGiProfile *gi;
                const MigCiProfile *ci;
                unsigned count = e->requests[r].count;

                if (count == 0)
                        continue; /* none of this profile: nothing to resolve, nothing to create */
                k = resolve(g, e, &e->requests[r], pr, &gi, &ci);
                if (k < 0 || !gi)
                        goto finish;
                for (size_t i = 0; i < gi->n_starts; i++)
                        if (gi->starts[i] + gi->memory_slices > MEMORY_SLICES_MAX) {
                                k = problem_add(pr, g, "the GPU reports a placement of %s beyond memory slice %u, "
                                                "which this planner cannot use", gi->name, MEMORY_SLICES_MAX);
                                goto finish;
                        }
                Device *t = realloc(d, (n_devices + count) * sizeof(Device));
                if (!t) {
                        k = -ENOMEM;
                        goto finish;
                }
                d = t;
                for (unsigned c = 0; c < count; c++)
                        d[n_devices++] = (Device) { .gi = gi, .ci = ci };
        }
        if (g->mig_current && g->mig_pending && pr->n == problems && devices_present(g, d, n_devices))
                goto finish;
        k = pack(d, n_devices, &w, &n);
        if (k < 0)
                goto finish;
        if (n > 0)
                qsort(w, n, sizeof(Want), want_cmp);
        k = check_limits(g, w, n, pr);
        if (k >= 0 && pr->n == problems)
                k = plan_enabled(g, w, n, g->mig_current && g->mig_pending, p, pr);
finish:
        wants_free(w, n);
        return k;
}

/* One line per problem; GPUs of one model with the same problem share a line ("GPUs 0, 1, 2 (…)"). */
static char *problems_format(const Problems *pr) {
        _cleanup_strv_free_ char **lines = NULL;
        _cleanup_free_ bool *done = calloc(pr->n + 1, sizeof(bool));

        if (!done)
                return NULL;
        for (size_t i = 0; i < pr->n; i++) {
                _cleanup_strv_free_ char **ids = NULL;
                if (done[i])
                        continue;
                unsigned first = 0, last = 0, n_gpus = 0;
                bool open = false;
                for (size_t j = i; j <= pr->n; j++) {
                        bool same = j < pr->n && !done[j] && streq(pr->items[j].model, pr->items[i].model) &&
                                    streq(pr->items[j].text, pr->items[i].text);
                        if (same && open && pr->items[j].gpu == last + 1) {
                                last = pr->items[j].gpu;
                                done[j] = true;
                                continue;
                        }
                        if (open && (same || j == pr->n)) {
                                int k = first == last      ? strv_extendf(&ids, "%u", first)
                                        : last == first + 1 ? strv_extendf(&ids, "%u, %u", first, last)
                                                            : strv_extendf(&ids, "%u-%u", first, last);
                                if (k < 0)
                                        return NULL;
                                n_gpus += last - first + 1;
                        }
                        if (same) {
                                first = last = pr->items[j].gpu;
                                open = done[j] = true;
                        }
                }
                _cleanup_free_ char *list = strv_join(ids, ", ");
                if (!list || strv_extendf(&lines, "GPU%s %s (%s): %s", n_gpus > 1 ? "s" : "", list,
                                          pr->items[i].model, pr->items[i].text) < 0)
                        return NULL;
        }
        return strv_join(lines, "\n");
}

int mig_plan_build(const MigConfig *config, const MigGpuState *gpus, size_t n_gpus, MigPlan **ret, char **ret_error) {
        _cleanup_(mig_plan_freep) MigPlan *plan = NULL;
        _cleanup_(problems_done) Problems pr = {};
        int k;

        assert(config);
        assert(gpus || n_gpus == 0);
        assert(ret);

        plan = calloc(1, sizeof(MigPlan));
        if (!plan)
                return -ENOMEM;
        plan->config_name = strdup(strna(config->name));
        plan->gpus = calloc(n_gpus + 1, sizeof(MigGpuPlan));
        plan->unmanaged = calloc(n_gpus + 1, sizeof(unsigned));
        if (!plan->config_name || !plan->gpus || !plan->unmanaged)
                return -ENOMEM;

        for (size_t i = 0; i < n_gpus; i++) {
                const MigConfigEntry *e = mig_config_match(config, &gpus[i]);
                if (!e) {
                        plan->unmanaged[plan->n_unmanaged++] = gpus[i].index;
                        continue;
                }
                MigGpuPlan *p = &plan->gpus[plan->n_gpus];
                k = plan_gpu(&gpus[i], e, p, &pr);
                if (k < 0)
                        return k;
                if (p->n_steps > 0)
                        plan->n_gpus++;
                else
                        mig_gpu_plan_done(p);
        }

        if (pr.n > 0) {
                if (ret_error) {
                        free(*ret_error);
                        *ret_error = problems_format(&pr);
                        if (!*ret_error)
                                return -ENOMEM;
                }
                return -EINVAL;
        }
        *ret = TAKE_PTR(plan);
        return 0;
}

char *mig_step_to_string(const MigStep *s) {
        switch (s->kind) {
        case MIG_STEP_SET_MODE:
                return strprintf("set-mode %u", s->enable);
        case MIG_STEP_RESET_GPU:
                return strdup("reset-gpu");
        case MIG_STEP_DESTROY_CI:
                if (s->ci_id == MIG_CI_ID_UNKNOWN)
                        return strprintf("destroy-ci gi=%u ci-profile=%u (%s)", s->gi_id, s->profile_id, strna(s->profile));
                return strprintf("destroy-ci gi=%u ci=%u (%s)", s->gi_id, s->ci_id, strna(s->profile));
        case MIG_STEP_DESTROY_GI:
                return strprintf("destroy-gi gi=%u (%s)", s->gi_id, strna(s->profile));
        case MIG_STEP_CREATE_GI:
                return strprintf("create-gi %s id=%u start=%u size=%u", strna(s->profile), s->profile_id, s->start,
                                 s->size);
        case MIG_STEP_CREATE_CI:
                if (s->gi_step >= 0)
                        return strprintf("create-ci %s id=%u gi=#%d", strna(s->profile), s->profile_id, s->gi_step);
                return strprintf("create-ci %s id=%u gi=%u", strna(s->profile), s->profile_id, s->gi_id);
        case _MIG_STEP_KIND_MAX:
        case _MIG_STEP_KIND_INVALID:
                break;
        }
        return strprintf("step %d", (int) s->kind);
}
