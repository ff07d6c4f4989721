/* SPDX-License-Identifier: MIT */
/* Owns loading the model table for the fake NVML (see fake-model.h). The table is strict: an unknown
 * key or a missing field is an error naming file and line, so a typo cannot silently change what a test
 * exercises. */
#include <stdio.h>

#include "fake-model.h"

/* c → CI profile index, as NVML numbers them (1, 2, 3, 4, 7 compute slices). */
static const unsigned ci_slices_by_index[FAKE_N_CI_PROFILES] = { 1, 2, 3, 4, 7 };

unsigned fake_profile_gb(uint64_t mem_mib, uint64_t total_mib) {
        if (total_mib == 0)
                return 0;
        /* GB = round(ceil(8 × mem / total) / 8 × ceil(total / 1024)), all in MiB. */
        uint64_t k = (8 * mem_mib + total_mib - 1) / total_mib;
        uint64_t t = (total_mib + 1023) / 1024;
        return (unsigned) ((k * t + 4) / 8);
}

bool fake_ci_profile(const FakeGiProfile *gi, unsigned ci_index, FakeCiProfile *ret) {
        if (ci_index >= FAKE_N_CI_PROFILES)
                return false;
        unsigned c = ci_slices_by_index[ci_index];
        if (c > gi->g || (c == 3 && gi->g == 4))
                return false;
        if (ret)
                *ret = (FakeCiProfile) { .id = ci_index, .c = c, .inst = gi->g / c };
        return true;
}

int fake_ci_index_for_slices(unsigned c) {
        for (unsigned i = 0; i < FAKE_N_CI_PROFILES; i++)
                if (ci_slices_by_index[i] == c)
                        return (int) i;
        return -1;
}

void fake_ci_name(const FakeGiProfile *gi, unsigned c, char *buf, size_t size) {
        if (c == gi->g)
                snprintf(buf, size, "%s", gi->name);
        else
                snprintf(buf, size, "%uc.%s", c, gi->name);
}

static int get_u(FakeYaml *y, yaml_node_t *map, const char *key, const char *what, bool required, uint64_t max,
                 uint64_t *ret, FakeError *e) {
        yaml_node_t *n = fake_yaml_get(y, map, key);
        if (!n) {
                if (required)
                        return fake_error(e, "%s:%u: %s has no '%s'; add it", y->path, fake_yaml_line(map), what,
                                          key);
                return 0;
        }
        char w[160];
        snprintf(w, sizeof w, "'%s' of %s", key, what);
        return fake_yaml_u64(y, n, w, max, ret, e);
}

static int parse_profile(FakeYaml *y, yaml_node_t *p, FakeModel *m, yaml_node_t *by_k, FakeGiProfile *ret,
                         FakeError *e) {
        static const char *const keys[] = { "index", "id", "g", "inst", "starts", "size", "mem_k", "mem_mib",
                                            "ce", "dec", "enc", "jpeg", "ofa", "attr", NULL };
        char what[192];
        uint64_t v;
        int r;

        snprintf(what, sizeof what, "a GPU instance profile of model '%s'", m->name);
        r = fake_yaml_expect(y, p, YAML_MAPPING_NODE, what, e);
        if (r < 0)
                return r;
        r = fake_yaml_check_keys(y, p, what, keys, e);
        if (r < 0)
                return r;

        *ret = (FakeGiProfile) {};
#define FIELD(key, field, req, max)                                                                        \
        v = 0;                                                                                             \
        r = get_u(y, p, key, what, req, max, &v, e);                                                       \
        if (r < 0)                                                                                         \
                return r;                                                                                  \
        ret->field = (unsigned) v;
        FIELD("index", index, true, 1000);
        FIELD("id", id, true, 1000);
        FIELD("g", g, true, 8);
        FIELD("inst", inst, true, 8);
        FIELD("size", size, true, m->memory_slices);
        FIELD("ce", ce, false, 64);
        FIELD("dec", dec, false, 64);
        FIELD("enc", enc, false, 64);
        FIELD("jpeg", jpeg, false, 64);
        FIELD("ofa", ofa, false, 64);
#undef FIELD
        if (ret->g == 0 || ret->inst == 0 || ret->size == 0)
                return fake_error(e, "%s:%u: g, inst and size of %s must not be 0", y->path, fake_yaml_line(p),
                                  what);

        yaml_node_t *starts = fake_yaml_get(y, p, "starts");
        r = fake_yaml_expect(y, starts, YAML_SEQUENCE_NODE, "'starts' of a GPU instance profile", e);
        if (r < 0)
                return r;
        if (fake_yaml_len(starts) == 0 || fake_yaml_len(starts) > FAKE_MAX_STARTS)
                return fake_error(e, "%s:%u: 'starts' must list 1 to %d placements", y->path,
                                  fake_yaml_line(starts), FAKE_MAX_STARTS);
        for (size_t i = 0; i < fake_yaml_len(starts); i++) {
                r = fake_yaml_u64(y, fake_yaml_item(y, starts, i), "a placement start", m->memory_slices - 1, &v, e);
                if (r < 0)
                        return r;
                if (v % ret->size != 0 || v + ret->size > m->memory_slices)
                        return fake_error(e, "%s:%u: placement start %llu of profile id %u does not fit %u memory "
                                          "slices of size %u", y->path, fake_yaml_line(starts),
                                          (unsigned long long) v, ret->id, m->memory_slices, ret->size);
                ret->starts[ret->n_starts++] = (unsigned) v;
        }

        yaml_node_t *mem_k = fake_yaml_get(y, p, "mem_k"), *mem_mib = fake_yaml_get(y, p, "mem_mib");
        if (mem_mib) {
                r = fake_yaml_u64(y, mem_mib, "'mem_mib' of a GPU instance profile", m->total_mib, &ret->mem_mib, e);
                if (r < 0)
                        return r;
        } else if (mem_k) {
                const char *k;
                r = fake_yaml_str(y, mem_k, "'mem_k' of a GPU instance profile", &k, e);
                if (r < 0)
                        return r;
                yaml_node_t *mn = fake_yaml_get(y, by_k, k);
                if (!mn)
                        return fake_error(e, "%s:%u: model '%s' has no mem_mib_by_k entry for mem_k %s; add it",
                                          y->path, fake_yaml_line(mem_k), m->name, k);
                r = fake_yaml_u64(y, mn, "a mem_mib_by_k value", m->total_mib, &ret->mem_mib, e);
                if (r < 0)
                        return r;
        } else
                return fake_error(e, "%s:%u: %s needs mem_k or mem_mib", y->path, fake_yaml_line(p), what);

        yaml_node_t *attr = fake_yaml_get(y, p, "attr");
        if (attr) {
                const char *a;
                r = fake_yaml_str(y, attr, "'attr' of a GPU instance profile", &a, e);
                if (r < 0)
                        return r;
                snprintf(ret->attr, sizeof ret->attr, "%s", a);
        }
        snprintf(ret->name, sizeof ret->name, "%ug.%ugb%s", ret->g, fake_profile_gb(ret->mem_mib, m->total_mib),
                 ret->attr);
        return 0;
}

static int parse_model(FakeYaml *y, yaml_node_t *n, FakeModel *m, FakeError *e) {
        static const char *const keys[] = { "name", "pci_device_id", "subsystem", "total_mib", "compute",
                                            "sm_per_slice", "memory_slices", "mem_mib_by_k", "gi_profiles",
                                            "mig_mode_change_needs_reset", "mig_capable", NULL };
        const char *s;
        uint64_t v;
        int r;

        r = fake_yaml_expect(y, n, YAML_MAPPING_NODE, "a model", e);
        if (r < 0)
                return r;
        r = fake_yaml_check_keys(y, n, "a model", keys, e);
        if (r < 0)
                return r;
        yaml_node_t *name = fake_yaml_get(y, n, "name");
        if (!name)
                return fake_error(e, "%s:%u: a model has no 'name'; add it", y->path, fake_yaml_line(n));
        r = fake_yaml_str(y, name, "'name' of a model", &s, e);
        if (r < 0)
                return r;
        m->name = strdup(s);
        if (!m->name)
                return -ENOMEM;

        char what[160];
        snprintf(what, sizeof what, "model '%s'", m->name);
        r = get_u(y, n, "pci_device_id", what, true, 0xffff, &v, e);
        if (r < 0)
                return r;
        m->pci_device_id = (unsigned) v;
        v = 0;
        r = get_u(y, n, "subsystem", what, false, UINT32_MAX, &v, e);
        if (r < 0)
                return r;
        m->subsystem = (unsigned) v;
        r = get_u(y, n, "total_mib", what, true, UINT64_C(1) << 40, &m->total_mib, e);
        if (r < 0)
                return r;

        yaml_node_t *cc = fake_yaml_get(y, n, "compute");
        r = fake_yaml_expect(y, cc, YAML_SEQUENCE_NODE, "'compute' of a model", e);
        if (r < 0)
                return r;
        if (fake_yaml_len(cc) != 2)
                return fake_error(e, "%s:%u: 'compute' of %s must be [major, minor]", y->path, fake_yaml_line(cc),
                                  what);
        r = fake_yaml_u64(y, fake_yaml_item(y, cc, 0), "a compute capability major", 99, &v, e);
        if (r < 0)
                return r;
        m->cc_major = (int) v;
        r = fake_yaml_u64(y, fake_yaml_item(y, cc, 1), "a compute capability minor", 99, &v, e);
        if (r < 0)
                return r;
        m->cc_minor = (int) v;

        m->memory_slices = 8;
        r = get_u(y, n, "memory_slices", what, false, FAKE_MAX_MEM_SLICES, &v, e);
        if (r < 0)
                return r;
        if (fake_yaml_get(y, n, "memory_slices")) {
                if (v != 4 && v != 8)
                        return fake_error(e, "%s: memory_slices of %s must be 4 or 8", y->path, what);
                m->memory_slices = (unsigned) v;
        }
        v = 0;
        r = get_u(y, n, "sm_per_slice", what, false, 1000, &v, e);
        if (r < 0)
                return r;
        m->sm_per_slice = (unsigned) v;

        yaml_node_t *gis = fake_yaml_get(y, n, "gi_profiles");
        m->mig_capable = gis != NULL;
        yaml_node_t *cap = fake_yaml_get(y, n, "mig_capable");
        if (cap) {
                r = fake_yaml_bool(y, cap, "'mig_capable' of a model", &m->mig_capable, e);
                if (r < 0)
                        return r;
        }
        yaml_node_t *reset = fake_yaml_get(y, n, "mig_mode_change_needs_reset");
        if (reset) {
                r = fake_yaml_bool(y, reset, "'mig_mode_change_needs_reset' of a model", &m->needs_reset, e);
                if (r < 0)
                        return r;
        }
        if (!m->mig_capable)
                return 0;
        if (m->sm_per_slice == 0)
                return fake_error(e, "%s:%u: MIG-capable %s needs sm_per_slice", y->path, fake_yaml_line(n), what);
        r = fake_yaml_expect(y, gis, YAML_SEQUENCE_NODE, "'gi_profiles' of a MIG-capable model", e);
        if (r < 0)
                return r;
        m->gi = calloc(fake_yaml_len(gis), sizeof *m->gi);
        if (!m->gi)
                return -ENOMEM;
        yaml_node_t *by_k = fake_yaml_get(y, n, "mem_mib_by_k");
        for (size_t i = 0; i < fake_yaml_len(gis); i++) {
                FakeGiProfile *p = &m->gi[m->n_gi];
                r = parse_profile(y, fake_yaml_item(y, gis, i), m, by_k, p, e);
                if (r < 0)
                        return r;
                for (size_t j = 0; j < m->n_gi; j++)
                        if (m->gi[j].index == p->index || m->gi[j].id == p->id)
                                return fake_error(e, "%s: %s lists profile index %u / id %u twice", y->path, what,
                                                  p->index, p->id);
                m->n_gi++;
                if (p->size == m->memory_slices && p->g > m->compute_slices)
                        m->compute_slices = p->g;
        }
        if (m->compute_slices == 0)
                return fake_error(e, "%s: MIG-capable %s has no whole-GPU profile (size %u)", y->path, what,
                                  m->memory_slices);
        return 0;
}

int fake_models_load(FakeModels *m, const char *path, FakeError *e) {
        _cleanup_(fake_yaml_done) FakeYaml y = {};
        int r;

        *m = (FakeModels) {};
        r = fake_yaml_load(&y, path, e);
        if (r < 0)
                return r;
        yaml_node_t *models = fake_yaml_get(&y, fake_yaml_root(&y), "models");
        r = fake_yaml_expect(&y, models, YAML_SEQUENCE_NODE, "'models' of the model table", e);
        if (r < 0)
                return r;
        m->models = calloc(fake_yaml_len(models) ?: 1, sizeof *m->models);
        if (!m->models)
                return -ENOMEM;
        for (size_t i = 0; i < fake_yaml_len(models); i++) {
                r = parse_model(&y, fake_yaml_item(&y, models, i), &m->models[m->n++], e);
                if (r < 0) {
                        fake_models_done(m);
                        return r;
                }
        }
        return 0;
}

void fake_models_done(FakeModels *m) {
        for (size_t i = 0; i < m->n; i++) {
                free(m->models[i].name);
                free(m->models[i].gi);
        }
        m->models = mfree(m->models);
        m->n = 0;
}

const FakeModel *fake_models_find(const FakeModels *m, const char *name) {
        for (size_t i = 0; i < m->n; i++)
                if (m->models[i].name && streq(m->models[i].name, name))
                        return &m->models[i];
        return NULL;
}

const FakeGiProfile *fake_model_gi_by_index(const FakeModel *m, unsigned index) {
        for (size_t i = 0; i < m->n_gi; i++)
                if (m->gi[i].index == index)
                        return &m->gi[i];
        return NULL;
}

const FakeGiProfile *fake_model_gi_by_id(const FakeModel *m, unsigned id) {
        for (size_t i = 0; i < m->n_gi; i++)
                if (m->gi[i].id == id)
                        return &m->gi[i];
        return NULL;
}

const FakeGiProfile *fake_model_gi_lookup(const FakeModel *m, const char *name_or_id) {
        char *end;
        unsigned long id = strtoul(name_or_id, &end, 10);
        if (end != name_or_id && !*end)
                return fake_model_gi_by_id(m, (unsigned) id);
        for (size_t i = 0; i < m->n_gi; i++)
                if (streq(m->gi[i].name, name_or_id))
                        return &m->gi[i];
        return NULL;
}
