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

typedef struct Want {               /* one GPU instance to have, with its one compute instance */
        const MigGiProfile *gi;
        const MigCiProfile *ci;
        char *name;                 /* canonical: "3g.20gb" (whole-GI CI) or "1c.3g.20gb" */
        unsigned *starts;           /* the profile's placements, ascending */
        size_t n_starts;
} Want;

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

/* Largest first: by memory slices, then compute slices; the rest only makes the order total. */
static int want_cmp(const void *a, const void *b) {
        const Want *x = a, *y = b;
        if (x->gi->memory_slices != y->gi->memory_slices)
                return x->gi->memory_slices > y->gi->memory_slices ? -1 : 1;
        if (x->gi->slices != y->gi->slices)
                return x->gi->slices > y->gi->slices ? -1 : 1;
        if (x->gi->id != y->gi->id)
                return x->gi->id < y->gi->id ? -1 : 1;
        if (x->ci->slices != y->ci->slices)
                return x->ci->slices > y->ci->slices ? -1 : 1;
        return x->ci->id < y->ci->id ? -1 : x->ci->id > y->ci->id;
}

static bool want_same(const Want *x, const Want *y) {
        return x->gi == y->gi && x->ci == y->ci;
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

/* "2 × 1g.5gb + 1 × 3g.20gb", for messages about the whole request. */
static char *wants_describe(const Want *w, size_t n) {
        _cleanup_strv_free_ char **l = NULL;

        for (size_t i = 0; i < n;) {
                size_t j = i;
                while (j < n && want_same(&w[i], &w[j]))
                        j++;
                if (strv_extendf(&l, "%zu × %s", j - i, w[i].name) < 0)
                        return NULL;
                i = j;
        }
        return l ? strv_join(l, " + ") : strdup("nothing");
}

/* Instance limits and capacity, checked before placing so that the message can say which limit. */
static int check_limits(const MigGpuState *g, const Want *w, size_t n, Problems *pr) {
        unsigned compute = 0, memory = 0, compute_max = 0, memory_max = 0;

        for (size_t i = 0; i < g->n_gi_profiles; i++) {
                const MigGiProfile *p = &g->gi_profiles[i];
                size_t count = 0;
                compute_max = compute_max > p->slices ? compute_max : p->slices;
                for (size_t s = 0; s < p->n_starts; s++)
                        memory_max = memory_max > p->starts[s] + p->memory_slices ? memory_max
                                                                                  : p->starts[s] + p->memory_slices;
                for (size_t j = 0; j < n; j++)
                        count += w[j].gi == p;
                if (count > p->instance_count)
                        return problem_add(pr, g, "%zu × %s is more than the GPU holds: at most %u instance%s of %s",
                                           count, p->name, p->instance_count, p->instance_count == 1 ? "" : "s",
                                           p->name);
        }
        for (size_t j = 0; j < n; j++) {
                compute += w[j].gi->slices;
                memory += w[j].gi->memory_slices;
        }
        if (compute <= compute_max && memory <= memory_max)
                return 0;

        _cleanup_free_ char *what = wants_describe(w, n);
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
        return gi->n_cis == 1 && gi->ci_profile_ids[0] == s->wants[item].ci->id ? 2 : 1;
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

static int add_destroy_cis(MigGpuPlan *p, const MigGpuState *g, const MigGiState *gi) {
        for (size_t c = 0; c < gi->n_cis; c++) {
                int k = step_add(p, (MigStep) { .kind = MIG_STEP_DESTROY_CI, .gi_id = gi->id, .ci_id = gi->ci_ids[c],
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
                _cleanup_free_ char *what = wants_describe(w, n), *starts = NULL;
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
                        for (size_t i = 0; i < n; i++)
                                if (kept[i] == gi) {
                                        stays = true;
                                        redo = keep_score(&s, i, best[i]) < 2;
                                }
                        if (stays && !redo)
                                continue;
                        if (pass == 0)
                                k = add_destroy_cis(p, g, gi);
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
                k = step_add(p, (MigStep) { .kind = MIG_STEP_CREATE_CI, .profile_id = w[i].ci->id,
                                            .gi_id = kept[i] ? kept[i]->id : 0, .gi_step = gi_step[i] },
                             strdup(w[i].name));
                if (k < 0)
                        return k;
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
                        k = add_destroy_cis(p, g, order[j]);
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

static int plan_gpu(const MigGpuState *g, const MigConfigEntry *e, MigGpuPlan *p, Problems *pr) {
        Want *w = NULL;
        size_t n = 0, problems = pr->n;
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
                Want *t = realloc(w, (n + count) * sizeof(Want));
                if (!t) {
                        k = -ENOMEM;
                        goto finish;
                }
                w = t;
                for (unsigned c = 0; c < count; c++) {
                        w[n] = (Want) { .gi = gi, .ci = ci, .name = ci_name(gi, ci->slices),
                                        .starts = calloc(gi->n_starts + 1, sizeof(unsigned)),
                                        .n_starts = gi->n_starts };
                        n++;
                        if (!w[n - 1].name || !w[n - 1].starts) {
                                k = -ENOMEM;
                                goto finish;
                        }
                        if (gi->n_starts > 0)
                                memcpy(w[n - 1].starts, gi->starts, gi->n_starts * sizeof(unsigned));
                        qsort(w[n - 1].starts, gi->n_starts, sizeof(unsigned), unsigned_cmp);
                        for (size_t i = 0; i < gi->n_starts; i++)
                                if (gi->starts[i] + gi->memory_slices > MEMORY_SLICES_MAX) {
                                        k = problem_add(pr, g, "the GPU reports a placement of %s beyond memory "
                                                        "slice %u, which this planner cannot use", gi->name,
                                                        MEMORY_SLICES_MAX);
                                        goto finish;
                                }
                }
        }
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
