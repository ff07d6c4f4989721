/* SPDX-License-Identifier: MIT */
/* Owns <paths.state>/mig-profiles (mig-cache.h). The file:
 *
 *   # comment lines
 *   mig-profiles 1
 *   boot <kernel boot id>
 *   driver <NVIDIA driver version>
 *   model <PCI id, 8 hex digits> <total memory, bytes> <NVML name, to the end of the line>
 *   gpu <UUID>                                            (one or more per model)
 *   profile <index> <id> <slices> <memory slices> <instances> <starts a,b,… or -> <name>
 *   ci <index>:<id>:<slices>:<instances>,…               (the CI profiles NVML reported, when asked)
 *   asked <indices asked, 16 hex digits> <end>            (only for a partial table: bit i = index i asked;
 *                                                          end = the first index NVML called invalid)
 *   checksum <FNV-1a 64 of every byte before this line, 16 hex digits>
 */
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fileio.h"
#include "hash.h"
#include "mig-cache.h"
#include "mig-state.h"
#include "strv.h"

#define CACHE_MAX_SIZE (256 * 1024)
#define MAX_MODELS 16
#define MAX_PROFILES 64
#define MAX_STARTS 32
#define MAX_CI_PROFILES 16

typedef struct CacheModel {
        char *name;
        uint32_t pci_id;
        uint64_t total_bytes;
        char **uuids;
        MigGiProfile *profiles;
        size_t n_profiles;
        bool partial;
        uint64_t asked;
        unsigned end;
} CacheModel;

struct MigProfileCache {
        CacheModel *models;
        size_t n_models;
};

static void cache_model_done(CacheModel *m) {
        free(m->name);
        strv_free(m->uuids);
        for (size_t i = 0; i < m->n_profiles; i++)
                mig_gi_profile_done(&m->profiles[i]);
        free(m->profiles);
}

MigProfileCache *mig_profile_cache_free(MigProfileCache *c) {
        if (!c)
                return NULL;
        for (size_t i = 0; i < c->n_models; i++)
                cache_model_done(&c->models[i]);
        free(c->models);
        return mfree(c);
}

static int boot_id(const char *proc_dir, char **ret) {
        _cleanup_free_ char *path = path_join(proc_dir, "sys/kernel/random/boot_id");
        int r;

        if (!path)
                return -ENOMEM;
        r = read_one_line_file(path, ret);
        if (r >= 0 && (isempty(*ret) || strpbrk(*ret, " \t"))) {
                *ret = mfree(*ret);
                r = -EBADMSG;
        }
        return r;
}

/* A token of printable characters without blanks. */
static bool word_ok(const char *s) {
        if (isempty(s) || strlen(s) > 128)
                return false;
        for (; *s; s++)
                if (*s <= ' ' || *s > '~')
                        return false;
        return true;
}

static bool name_ok(const char *s) {
        if (isempty(s) || strlen(s) > 128)
                return false;
        for (; *s; s++)
                if (*s < ' ' || *s > '~')
                        return false;
        return true;
}

static int parse_starts(const char *v, MigGiProfile *p) {
        p->starts = calloc(MAX_STARTS, sizeof *p->starts);
        if (!p->starts)
                return -ENOMEM;
        if (streq(v, "-"))
                return 0;
        for (const char *c = v; *c;) {
                unsigned start;
                int used = 0;

                if (p->n_starts >= MAX_STARTS || sscanf(c, "%u%n", &start, &used) != 1 || used == 0 || start >= 64)
                        return -EBADMSG;
                p->starts[p->n_starts++] = start;
                c += used;
                if (*c == ',')
                        c++;
                else if (*c)
                        return -EBADMSG;
        }
        return 0;
}

static int parse_cis(const char *v, MigGiProfile *p) {
        if (p->ci_profiles)
                return -EBADMSG;
        p->ci_profiles = calloc(MAX_CI_PROFILES, sizeof *p->ci_profiles);
        if (!p->ci_profiles)
                return -ENOMEM;
        for (const char *c = v; *c;) {
                MigCiProfile *ci = &p->ci_profiles[p->n_ci_profiles];
                int used = 0;

                if (p->n_ci_profiles >= MAX_CI_PROFILES ||
                    sscanf(c, "%u:%u:%u:%u%n", &ci->index, &ci->id, &ci->slices, &ci->instance_count, &used) != 4 ||
                    used == 0 || ci->slices == 0 || ci->slices > 8 || ci->instance_count == 0 || ci->instance_count > 8)
                        return -EBADMSG;
                p->n_ci_profiles++;
                c += used;
                if (*c == ',')
                        c++;
                else if (*c)
                        return -EBADMSG;
        }
        return p->n_ci_profiles > 0 ? 0 : -EBADMSG;
}

static int parse_line(MigProfileCache *c, char *line, unsigned *version, char **boot, char **driver) {
        char *sp = strchr(line, ' '), *v;
        CacheModel *m = c->n_models > 0 ? &c->models[c->n_models - 1] : NULL;
        int r;

        if (!sp)
                return -EBADMSG;
        *sp = '\0';
        v = sp + 1;

        if (streq(line, "mig-profiles"))
                return sscanf(v, "%u", version) == 1 ? 0 : -EBADMSG;
        if (streq(line, "boot") || streq(line, "driver")) {
                char **p = streq(line, "boot") ? boot : driver;
                if (*p || !word_ok(v))
                        return -EBADMSG;
                *p = strdup(v);
                return *p ? 0 : -ENOMEM;
        }
        if (streq(line, "model")) {
                CacheModel *l;
                int used = 0;

                if (c->n_models >= MAX_MODELS)
                        return -EBADMSG;
                l = realloc(c->models, (c->n_models + 1) * sizeof *l);
                if (!l)
                        return -ENOMEM;
                c->models = l;
                m = &l[c->n_models++];
                *m = (CacheModel) {};
                if (sscanf(v, "%" SCNx32 " %" SCNu64 " %n", &m->pci_id, &m->total_bytes, &used) != 2 || used == 0 ||
                    m->total_bytes == 0 || !name_ok(v + used))
                        return -EBADMSG;
                m->name = strdup(v + used);
                return m->name ? 0 : -ENOMEM;
        }
        if (!m)
                return -EBADMSG;
        if (streq(line, "gpu")) {
                if (!word_ok(v) || strv_length(m->uuids) >= 64)
                        return -EBADMSG;
                return strv_extend(&m->uuids, v);
        }
        if (streq(line, "profile")) {
                MigGiProfile *l, *p;
                char starts[256], name[64];

                if (m->n_profiles >= MAX_PROFILES)
                        return -EBADMSG;
                l = realloc(m->profiles, (m->n_profiles + 1) * sizeof *l);
                if (!l)
                        return -ENOMEM;
                m->profiles = l;
                p = &l[m->n_profiles++];
                *p = (MigGiProfile) {};
                if (sscanf(v, "%u %u %u %u %u %255s %63s", &p->index, &p->id, &p->slices, &p->memory_slices,
                           &p->instance_count, starts, name) != 7 ||
                    p->slices == 0 || p->slices > 8 || p->memory_slices == 0 || p->memory_slices > 64 ||
                    p->instance_count == 0 || p->instance_count > 8 || !word_ok(name))
                        return -EBADMSG;
                r = parse_starts(starts, p);
                if (r < 0)
                        return r;
                p->name = strdup(name);
                return p->name ? 0 : -ENOMEM;
        }
        if (streq(line, "asked")) {
                char extra;

                if (m->partial || sscanf(v, "%16" SCNx64 " %u%c", &m->asked, &m->end, &extra) != 2 || m->end == 0 ||
                    m->end > 64)
                        return -EBADMSG;
                m->partial = true;
                return 0;
        }
        if (streq(line, "ci")) {
                if (m->n_profiles == 0)
                        return -EBADMSG;
                return parse_cis(v, &m->profiles[m->n_profiles - 1]);
        }
        return -EBADMSG;
}

/* Parses text (NUL-terminated); *ret_boot / *ret_driver are the file's keys. */
static int parse(char *text, MigProfileCache **ret, char **ret_boot, char **ret_driver) {
        _cleanup_(mig_profile_cache_freep) MigProfileCache *c = calloc(1, sizeof *c);
        _cleanup_free_ char *boot = NULL, *driver = NULL;
        char *sum = strstr(text, "\nchecksum "), *save = NULL;
        uint64_t want, got;
        unsigned version = 0;
        char extra;
        int r;

        if (!c)
                return -ENOMEM;
        if (!sum || sscanf(sum + 10, "%16" SCNx64 "%c", &want, &extra) != 2 || extra != '\n' ||
            strlen(sum + 10) != 17)
                return -EBADMSG;
        got = fnv1a64(FNV1A64_INIT, text, (size_t) (sum - text) + 1);
        if (got != want)
                return -EBADMSG;
        sum[1] = '\0';

        for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
                if (line[0] == '#')
                        continue;
                r = parse_line(c, line, &version, &boot, &driver);
                if (r < 0)
                        return r;
        }
        if (version != 1 || !boot || !driver || c->n_models == 0)
                return -EBADMSG;
        for (size_t i = 0; i < c->n_models; i++)
                if (!c->models[i].uuids || c->models[i].n_profiles == 0)
                        return -EBADMSG;
        *ret = TAKE_PTR(c);
        *ret_boot = TAKE_PTR(boot);
        *ret_driver = TAKE_PTR(driver);
        return 0;
}

static const GpuInfo *snapshot_gpu_by_uuid(const NvmlSnapshot *s, const char *uuid) {
        for (size_t i = 0; s && i < s->n_gpus; i++)
                if (streq_ptr(s->gpus[i].uuid, uuid))
                        return &s->gpus[i];
        return NULL;
}

int mig_profile_cache_load(const char *state_dir, const char *proc_dir, const NvmlSnapshot *snapshot,
                           MigProfileCache **ret, char **ret_why) {
        _cleanup_free_ char *path = path_join(state_dir, MIG_PROFILE_CACHE_FILE), *text = NULL;
        _cleanup_free_ char *boot = NULL, *file_boot = NULL, *file_driver = NULL;
        _cleanup_(mig_profile_cache_freep) MigProfileCache *c = NULL;
        int r;

        *ret = NULL;
        *ret_why = NULL;
        if (!path)
                return -ENOMEM;
        /* The state directory is ours, but a link planted there must not make us read elsewhere. */
        r = read_full_file_at(AT_FDCWD, path, READ_FILE_NOFOLLOW, CACHE_MAX_SIZE, &text, NULL);
        if (r == -ENOENT)
                return 0;
        if (r < 0) {
                *ret_why = strprintf("%s cannot be read: %s", path, r == -ELOOP ? "it is a symlink" :
                                     r == -EFBIG ? "too large" : strerror(-r));
                return 0;
        }
        r = parse(text, &c, &file_boot, &file_driver);
        if (r == -ENOMEM)
                return r;
        if (r < 0) {
                *ret_why = strprintf("%s is not a valid MIG profile cache (garbled, truncated or edited)", path);
                return 0;
        }
        if (boot_id(proc_dir, &boot) < 0 || !streq(boot, file_boot)) {
                *ret_why = strprintf("%s is of another boot", path);
                return 0;
        }
        if (!snapshot || !streq_ptr(snapshot->driver_version, file_driver)) {
                *ret_why = strprintf("%s is of driver %s, not of the loaded %s", path, file_driver,
                                     snapshot ? strna(snapshot->driver_version) : "(unknown)");
                return 0;
        }
        for (size_t i = 0; i < c->n_models; i++)
                STRV_FOREACH(u, c->models[i].uuids) {
                        const GpuInfo *g = snapshot_gpu_by_uuid(snapshot, *u);
                        if (!g || !streq_ptr(g->name, c->models[i].name) ||
                            g->memory_total_bytes != c->models[i].total_bytes) {
                                *ret_why = strprintf("%s describes GPU %s as a %s, which NVML does not list now", path,
                                                     *u, c->models[i].name);
                                return 0;
                        }
                }
        *ret = TAKE_PTR(c);
        return 0;
}

void mig_profile_cache_seed(const MigProfileCache *c, GpuNvml *n) {
        for (size_t i = 0; c && i < c->n_models; i++) {
                const CacheModel *m = &c->models[i];
                (void) mig_state_seed_model(n, m->name, m->pci_id, m->total_bytes, m->profiles, m->n_profiles,
                                            m->partial, m->asked, m->end);
        }
}

/* ---- writing ---- */

static const GpuInfo *snapshot_gpu_by_address(const NvmlSnapshot *s, const char *address) {
        for (size_t i = 0; s && i < s->n_gpus; i++)
                if (streq(s->gpus[i].pci_address, address))
                        return &s->gpus[i];
        return NULL;
}

static bool same_model(const MigGpuState *a, const GpuInfo *ga, const MigGpuState *b, const GpuInfo *gb) {
        return streq_ptr(a->model, b->model) && a->pci_id == b->pci_id && ga->memory_total_bytes == gb->memory_total_bytes;
}

static bool has_gi_of(const MigGpuState *g, unsigned profile_id) {
        for (size_t i = 0; i < g->n_gis; i++)
                if (g->gis[i].profile_id == profile_id)
                        return true;
        return false;
}

static bool usable(const MigGpuState *g, const GpuInfo *info) {
        return g->n_gi_profiles > 0 && info && info->uuid && word_ok(info->uuid) && name_ok(g->model) &&
               info->memory_total_bytes > 0;
}

int mig_profile_cache_save(const char *state_dir, const char *proc_dir, const NvmlSnapshot *snapshot,
                           const MigGpuState *states, size_t n_states) {
        _cleanup_free_ char *path = path_join(state_dir, MIG_PROFILE_CACHE_FILE), *boot = NULL, *old = NULL;
        _cleanup_free_ char *body = NULL, *text = NULL;
        _cleanup_free_ bool *done = calloc(n_states + 1, sizeof(bool));
        _cleanup_strv_free_ char **lines = NULL;
        size_t n_models = 0;
        int r;

        if (!path || !done)
                return -ENOMEM;
        if (!snapshot || !word_ok(snapshot->driver_version) || boot_id(proc_dir, &boot) < 0)
                return 0; /* nothing to key it by: no cache */
        if (strv_extend(&lines, "# gpu-node-agent: the MIG GPU instance profile tables NVML reported, per GPU model. "
                        "Used only in this boot, with this driver and these GPUs; safe to delete.") < 0 ||
            strv_extend(&lines, "mig-profiles 1") < 0 || strv_extendf(&lines, "boot %s", boot) < 0 ||
            strv_extendf(&lines, "driver %s", snapshot->driver_version) < 0)
                return -ENOMEM;

        for (size_t i = 0; i < n_states; i++) {
                const MigGpuState *g = &states[i], *t = g;
                const GpuInfo *gi = snapshot_gpu_by_address(snapshot, g->pci_address);

                if (done[i] || !usable(g, gi))
                        continue;
                if (++n_models > MAX_MODELS)
                        break;
                if (strv_extendf(&lines, "model %08" PRIx32 " %" PRIu64 " %s", g->pci_id, gi->memory_total_bytes,
                                 g->model) < 0)
                        return -ENOMEM;
                for (size_t k = i; k < n_states; k++) {
                        const GpuInfo *gk = snapshot_gpu_by_address(snapshot, states[k].pci_address);
                        if (done[k] || !usable(&states[k], gk) || !same_model(g, gi, &states[k], gk))
                                continue;
                        done[k] = true;
                        if (strv_extendf(&lines, "gpu %s", gk->uuid) < 0)
                                return -ENOMEM;
                        /* The table of the GPU whose read asked most of it (a later GPU of the model may
                         * have read more of a partial one). */
                        if (t->gi_profiles_partial &&
                            (!states[k].gi_profiles_partial || __builtin_popcountll(states[k].gi_profiles_asked) >
                                                                       __builtin_popcountll(t->gi_profiles_asked)))
                                t = &states[k];
                }
                if (t->gi_profiles_partial &&
                    strv_extendf(&lines, "asked %016" PRIx64 " %u", t->gi_profiles_asked, t->gi_profiles_end) < 0)
                        return -ENOMEM;
                for (size_t p = 0; p < t->n_gi_profiles && p < MAX_PROFILES; p++) {
                        const MigGiProfile *pr = &t->gi_profiles[p];
                        const MigGiProfile *asked = NULL;
                        _cleanup_strv_free_ char **starts = NULL, **cis = NULL;
                        _cleanup_free_ char *s = NULL, *c = NULL;

                        for (size_t q = 0; q < pr->n_starts && q < MAX_STARTS; q++)
                                if (strv_extendf(&starts, "%u", pr->starts[q]) < 0)
                                        return -ENOMEM;
                        s = starts ? strv_join(starts, ",") : strdup("-");
                        if (!s)
                                return -ENOMEM;
                        if (!word_ok(pr->name))
                                return 0; /* a name we cannot write back: no cache */
                        if (strv_extendf(&lines, "profile %u %u %u %u %u %s %s", pr->index, pr->id, pr->slices,
                                         pr->memory_slices, pr->instance_count, s, pr->name) < 0)
                                return -ENOMEM;
                        /* The CI profiles NVML reported: those of a GPU of the model that has a GI of it. */
                        for (size_t k = i; !asked && k < n_states; k++) {
                                const GpuInfo *gk = snapshot_gpu_by_address(snapshot, states[k].pci_address);
                                if (usable(&states[k], gk) && same_model(g, gi, &states[k], gk) &&
                                    has_gi_of(&states[k], pr->id))
                                        asked = mig_state_gi_profile(&states[k], pr->id);
                        }
                        if (!asked || asked->n_ci_profiles == 0)
                                continue;
                        for (size_t q = 0; q < asked->n_ci_profiles && q < MAX_CI_PROFILES; q++) {
                                const MigCiProfile *ci = &asked->ci_profiles[q];
                                if (strv_extendf(&cis, "%u:%u:%u:%u", ci->index, ci->id, ci->slices,
                                                 ci->instance_count) < 0)
                                        return -ENOMEM;
                        }
                        c = strv_join(cis, ",");
                        if (!c || strv_extendf(&lines, "ci %s", c) < 0)
                                return -ENOMEM;
                }
        }
        if (n_models == 0 || n_models > MAX_MODELS)
                return 0;

        body = strv_join(lines, "\n");
        if (!body || !(text = strprintf("%s\n", body)))
                return -ENOMEM;
        /* The checksum covers every byte before its line. */
        free(body);
        body = TAKE_PTR(text);
        text = strprintf("%schecksum %016" PRIx64 "\n", body, fnv1a64(FNV1A64_INIT, body, strlen(body)));
        if (!text)
                return -ENOMEM;

        r = read_full_file_at(AT_FDCWD, path, READ_FILE_NOFOLLOW, CACHE_MAX_SIZE, &old, NULL);
        if (r >= 0 && streq(old, text))
                return 0;
        return write_file_atomic_mkdir(path, text, strlen(text), 0644);
}
