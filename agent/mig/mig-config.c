/* SPDX-License-Identifier: MIT */
/* Owns the mig-parted v1 reader: one YAML file read by the project's YAML reader (yaml-reader.h: its
 * limits, anchors and aliases resolved), merge keys ("<<") resolved here, YAML 1.1 scalars (yes/no/on/off booleans)
 * interpreted as mig-parted's Go YAML library does, and every value checked against the format, so that
 * a file mig-parted takes is read unchanged and a file with a mistake is rejected with the file, line,
 * column and key of the mistake. Also owns the syntax of MIG profile names and of device-filter ids. */
#include <ctype.h>
#include <stdarg.h>
#include <strings.h>

#include "config-yaml.h"
#include "fileio.h"
#include "mig-config.h"
#include "strv.h"
#include "yaml-reader.h"

/* More than any GPU holds (7 today), small enough that sums cannot overflow. */
#define MIG_COUNT_MAX 1000U
/* Merge keys may nest ("<<: *a" where a itself merges); a cycle through aliases must end somewhere, and
 * "<<: [*a, *a, …]" at every level must not multiply into hours of work. */
#define MERGE_DEPTH_MAX 16U
#define MERGE_COUNT_MAX 10000U

typedef struct Reader {
        const char *path;
        char **error;
        unsigned merges;            /* mappings merged so far, against MERGE_COUNT_MAX */
} Reader;

typedef struct Pair {
        const char *key;
        const GnaYamlNode *key_node;
        const GnaYamlNode *value;
} Pair;

typedef struct Pairs {
        Pair *items;
        size_t n;
} Pairs;

static void pairs_done(Pairs *p) {
        free(p->items);
}

/* "FILE:LINE:COLUMN: KEY: message" at node n (libyaml counts from 0, editors from 1). */
static int reader_error(Reader *r, const GnaYamlNode *n, const char *key, const char *fmt, ...) _printf_(4, 5);
static int reader_error(Reader *r, const GnaYamlNode *n, const char *key, const char *fmt, ...) {
        _cleanup_free_ char *msg = NULL;
        va_list ap;

        va_start(ap, fmt);
        int k = vasprintf(&msg, fmt, ap);
        va_end(ap);
        if (k < 0)
                return -ENOMEM;
        return config_yaml_set_error(r->error, -EINVAL, "%s:%zu:%zu: %s%s%s", r->path, n ? (size_t) n->line : 1,
                         n ? (size_t) n->column : 1, key ?: "", key ? ": " : "", msg);
}

static const char *scalar(const GnaYamlNode *n) {
        return gna_yaml_scalar(n);
}

static bool scalar_is_plain(const GnaYamlNode *n) {
        return n->type == GNA_YAML_SCALAR && n->plain;
}

static bool node_is_null(const GnaYamlNode *n) {
        const char *v = scalar(n);
        return v && scalar_is_plain(n) &&
               (isempty(v) || streq(v, "~") || streq(v, "null") || streq(v, "Null") || streq(v, "NULL"));
}

static const char *node_kind(const GnaYamlNode *n) {
        if (node_is_null(n))
                return "an empty value";
        switch (n->type) {
        case GNA_YAML_MAPPING:
                return "a mapping of keys";
        case GNA_YAML_SEQUENCE:
                return "a list";
        case GNA_YAML_SCALAR:
                return "a plain value";
        }
        return "something else";
}

/* YAML 1.1 booleans as go-yaml v2 (mig-parted's parser) reads them; the brief case-insensitive match
 * also takes "tRuE", which no YAML writer produces and no reader would misread. */
static int parse_bool(const GnaYamlNode *n, bool *ret) {
        static const char *const yes[] = { "y", "yes", "true", "on" }, *const no[] = { "n", "no", "false", "off" };
        const char *v = scalar(n);

        if (!v || !scalar_is_plain(n))
                return -EINVAL;
        for (size_t i = 0; i < ELEMENTSOF(yes); i++)
                if (strcasecmp(v, yes[i]) == 0 || strcasecmp(v, no[i]) == 0) {
                        *ret = strcasecmp(v, yes[i]) == 0;
                        return 0;
                }
        return -EINVAL;
}

static int parse_uint(const GnaYamlNode *n, unsigned max, unsigned *ret) {
        const char *v = scalar(n);
        unsigned long x = 0;

        if (!v || !scalar_is_plain(n) || isempty(v))
                return -EINVAL;
        for (const char *p = v; *p; p++) {
                if (!isdigit((unsigned char) *p))
                        return -EINVAL;
                if (x <= max) /* beyond max the value no longer matters, only that it is too large */
                        x = x * 10 + (unsigned long) (*p - '0');
        }
        if (x > max)
                return -ERANGE;
        *ret = (unsigned) x;
        return 0;
}

static int pairs_add(Pairs *p, const char *key, const GnaYamlNode *key_node, const GnaYamlNode *value) {
        Pair *t = realloc(p->items, (p->n + 1) * sizeof(Pair));
        if (!t)
                return -ENOMEM;
        p->items = t;
        p->items[p->n++] = (Pair) { key, key_node, value };
        return 0;
}

static const Pair *pairs_get(const Pairs *p, const char *key) {
        for (size_t i = 0; i < p->n; i++)
                if (streq(p->items[i].key, key))
                        return &p->items[i];
        return NULL;
}

static int mapping_collect(Reader *r, const GnaYamlNode *m, const char *keypath, unsigned depth, bool merged, Pairs *out);

/* "<<: *a" or "<<: [*a, *b]": keys of the merged mappings that the mapping does not set itself; of two
 * merged mappings the earlier one wins, as YAML 1.1's merge key type says. */
static int merge_into(Reader *r, const GnaYamlNode *v, const char *keypath, unsigned depth, Pairs *out) {
        if (v->type == GNA_YAML_MAPPING)
                return mapping_collect(r, v, keypath, depth + 1, true, out);
        if (v->type == GNA_YAML_SEQUENCE) {
                for (size_t i = 0; i < v->n_items; i++) {
                        const GnaYamlNode *item = v->items[i];
                        if (!item || item->type != GNA_YAML_MAPPING)
                                return reader_error(r, item ?: v, keypath,
                                                    "a merge key ('<<') takes mappings (*anchor) only, not %s",
                                                    item ? node_kind(item) : "nothing");
                        int k = mapping_collect(r, item, keypath, depth + 1, true, out);
                        if (k < 0)
                                return k;
                }
                return 0;
        }
        return reader_error(r, v, keypath, "a merge key ('<<') takes a mapping or a list of mappings, not %s",
                            node_kind(v));
}

/* The keys of mapping m with merge keys resolved. Explicit keys come first and must be unique; merged
 * keys only fill in what is not set yet. */
static int mapping_collect(Reader *r, const GnaYamlNode *m, const char *keypath, unsigned depth, bool merged, Pairs *out) {
        int k;

        if (depth > MERGE_DEPTH_MAX)
                return reader_error(r, m, keypath, "merge keys ('<<') nest deeper than %u levels (a cycle of aliases?)",
                                    MERGE_DEPTH_MAX);
        if (merged && ++r->merges > MERGE_COUNT_MAX)
                return reader_error(r, m, keypath, "more than %u merges ('<<'); write the values out", MERGE_COUNT_MAX);

        for (size_t i = 0; i < m->n_items; i++) {
                const GnaYamlNode *kn = m->keys[i], *vn = m->items[i];
                const char *key = scalar(kn);

                if (!key)
                        return reader_error(r, kn ?: m, keypath, "keys must be plain names, not %s",
                                            kn ? node_kind(kn) : "nothing");
                if (streq(key, "<<") && scalar_is_plain(kn))
                        continue;
                const Pair *dup = pairs_get(out, key);
                if (dup && !merged)
                        return reader_error(r, kn, keypath,
                                            "duplicate key '%s' (first on line %zu); remove one of them",
                                            key, (size_t) dup->key_node->line);
                if (dup)
                        continue;
                k = pairs_add(out, key, kn, vn);
                if (k < 0)
                        return k;
        }
        /* Merged keys after all explicit ones, so that the mapping's own keys win wherever they stand. */
        for (size_t i = 0; i < m->n_items; i++) {
                const GnaYamlNode *kn = m->keys[i];
                if (!streq_ptr(scalar(kn), "<<") || !scalar_is_plain(kn))
                        continue;
                k = merge_into(r, m->items[i], keypath, depth, out);
                if (k < 0)
                        return k;
        }
        return 0;
}

static int mapping_pairs(Reader *r, const GnaYamlNode *m, const char *keypath, Pairs *ret) {
        return mapping_collect(r, m, keypath, 0, false, ret);
}

/* Rejects keys not in the NULL-terminated list `known`; `what` names the place for the message. */
static int check_keys(Reader *r, const Pairs *p, const char *keypath, const char *const *known, const char *what) {
        for (size_t i = 0; i < p->n; i++) {
                bool ok = false;
                for (const char *const *k = known; *k; k++)
                        ok = ok || streq(*k, p->items[i].key);
                if (ok)
                        continue;
                /* "'a', 'b' and 'c'": the list is at least two keys long */
                _cleanup_strv_free_ char **l = strv_copy((char **) known);
                if (!l)
                        return -ENOMEM;
                size_t n = strv_length(l);
                _cleanup_free_ char *last = TAKE_PTR(l[n - 1]), *head = strv_join(l, "', '");
                if (!head)
                        return -ENOMEM;
                return reader_error(r, p->items[i].key_node, keypath, "unknown key '%s'; %s takes only '%s' and '%s'",
                                    p->items[i].key, what, head, strna(last));
        }
        return 0;
}

static bool is_lower_word(const char **p) {
        const char *s = *p;
        if (!islower((unsigned char) *s))
                return false;
        while (islower((unsigned char) *s) || isdigit((unsigned char) *s))
                s++;
        *p = s;
        return true;
}

static bool parse_number(const char **p, unsigned *ret) {
        unsigned long x = 0;
        const char *s = *p;

        if (!isdigit((unsigned char) *s) || *s == '0')
                return false;
        for (; isdigit((unsigned char) *s); s++) {
                x = x * 10 + (unsigned long) (*s - '0');
                if (x > 100000)
                        return false;
        }
        *p = s;
        *ret = (unsigned) x;
        return true;
}

int mig_profile_name_parse(const char *s, MigProfileName *ret) {
        MigProfileName n = {};
        const char *p = s;
        unsigned a;

        if (!s || !parse_number(&p, &a))
                return -EINVAL;
        if (*p == 'c') {
                n.ci_slices = a;
                if (*++p != '.')
                        return -EINVAL;
                p++;
                n.gi_name = p;
                if (!parse_number(&p, &a))
                        return -EINVAL;
        } else
                n.gi_name = s;
        n.gi_slices = a;
        if (*p++ != 'g' || *p++ != '.' || !parse_number(&p, &n.memory_gb) || *p++ != 'g' || *p++ != 'b')
                return -EINVAL;
        /* Attributes: "+me", "+me.all", "+gfx", "-me", several as "+a,b" — the forms NVML's names and
         * mig-parted's parser use; words are checked for shape only, the GPU's list decides the rest. */
        while (*p) {
                bool plus = *p == '+';
                if (*p != '+' && *p != '-')
                        return -EINVAL;
                p++;
                for (;;) {
                        if (!is_lower_word(&p))
                                return -EINVAL;
                        if (*p == '.' && plus) {
                                p++;
                                continue;
                        }
                        if (*p == ',' && plus) {
                                p++;
                                continue;
                        }
                        break;
                }
        }
        *ret = n;
        return 0;
}

static int parse_hex32(const char *s, size_t len, uint32_t *ret) {
        uint32_t x = 0;

        if (len != 10 || s[0] != '0' || (s[1] != 'x' && s[1] != 'X'))
                return -EINVAL;
        for (size_t i = 2; i < len; i++) {
                if (!isxdigit((unsigned char) s[i]))
                        return -EINVAL;
                x = x << 4 | (uint32_t) (isdigit((unsigned char) s[i]) ? s[i] - '0' : (tolower(s[i]) - 'a' + 10));
        }
        *ret = x;
        return 0;
}

int mig_device_filter_parse(const char *s, uint32_t *ret_pci_id, uint32_t *ret_subsystem_id, bool *ret_has_subsystem) {
        uint32_t pci = 0, sub = 0;
        const char *colon;

        if (!s)
                return -EINVAL;
        colon = strchr(s, ':');
        if (parse_hex32(s, colon ? (size_t) (colon - s) : strlen(s), &pci) < 0)
                return -EINVAL;
        if (colon && parse_hex32(colon + 1, strlen(colon + 1), &sub) < 0)
                return -EINVAL;
        if (ret_pci_id)
                *ret_pci_id = pci;
        if (ret_subsystem_id)
                *ret_subsystem_id = sub;
        if (ret_has_subsystem)
                *ret_has_subsystem = colon;
        return 0;
}

static int read_device_filter(Reader *r, const GnaYamlNode *n, const char *keypath, MigConfigEntry *e) {
        _cleanup_strv_free_ char **l = NULL;
        const GnaYamlNode *single[1] = { n };
        const GnaYamlNode **items = single;
        size_t n_items = 1;
        _cleanup_free_ const GnaYamlNode **seq = NULL;
        int k;

        if (n->type == GNA_YAML_SEQUENCE) {
                n_items = n->n_items;
                if (n_items == 0)
                        return reader_error(r, n, keypath,
                                            "an empty list matches no GPU; remove the key to match every GPU, or list "
                                            "PCI ids such as \"0x233010DE\"");
                seq = calloc(n_items, sizeof(const GnaYamlNode *));
                if (!seq)
                        return -ENOMEM;
                for (size_t i = 0; i < n_items; i++)
                        seq[i] = n->items[i];
                items = seq;
        }
        for (size_t i = 0; i < n_items; i++) {
                const char *v = scalar(items[i]);
                _cleanup_free_ char *where = n->type == GNA_YAML_SEQUENCE ? strprintf("%s[%zu]", keypath, i)
                                                                            : strdup(keypath);
                if (!where)
                        return -ENOMEM;
                if (!v || node_is_null(items[i]))
                        return reader_error(r, items[i] ?: n, where,
                                            "must be a PCI id string such as \"0x233010DE\" or a list of them, not %s",
                                            items[i] ? node_kind(items[i]) : "nothing");
                if (mig_device_filter_parse(v, NULL, NULL, NULL) < 0)
                        return reader_error(r, items[i], where,
                                            "'%s' is not a PCI id; write 0xDDDDVVVV (device id, then vendor id, e.g. "
                                            "0x233010DE), optionally followed by :0xSSSSVVVV (subsystem device and "
                                            "vendor id)", v);
                k = strv_extend(&l, v);
                if (k < 0)
                        return k;
        }
        e->device_filter = TAKE_PTR(l);
        return 0;
}

static int read_devices(Reader *r, const GnaYamlNode *n, const char *keypath, MigConfigEntry *e) {
        if (n->type == GNA_YAML_SCALAR && !node_is_null(n)) {
                if (streq(scalar(n), "all")) {
                        e->all_devices = true;
                        return 0;
                }
                return reader_error(r, n, keypath, "'%s' is neither 'all' nor a list of GPU indices such as [0, 1]",
                                    scalar(n));
        }
        if (n->type != GNA_YAML_SEQUENCE)
                return reader_error(r, n, keypath, "must be 'all' or a list of GPU indices such as [0, 1], not %s",
                                    node_kind(n));

        size_t count = n->n_items;
        e->devices = calloc(count ?: 1, sizeof(unsigned));
        if (!e->devices)
                return -ENOMEM;
        for (size_t i = 0; i < count; i++) {
                const GnaYamlNode *item = n->items[i];
                if (!item || parse_uint(item, UINT16_MAX, &e->devices[i]) < 0) {
                        _cleanup_free_ char *where = strprintf("%s[%zu]", keypath, i);
                        if (!where)
                                return -ENOMEM;
                        if (item && scalar(item))
                                return reader_error(r, item, where,
                                                    "'%s' is not a GPU index; write a whole number (0 is the first "
                                                    "GPU in PCI address order)", scalar(item));
                        return reader_error(r, item ?: n, where, "must be a GPU index (a whole number), not %s",
                                            item ? node_kind(item) : "nothing");
                }
                e->n_devices = i + 1;
        }
        return 0;
}

static int read_mig_devices(Reader *r, const GnaYamlNode *n, const char *keypath, MigConfigEntry *e) {
        _cleanup_(pairs_done) Pairs p = {};
        int k;

        if (n->type != GNA_YAML_MAPPING)
                return reader_error(r, n, keypath,
                                    "must be a mapping of MIG profile names to counts such as {\"1g.10gb\": 7}, not %s",
                                    node_kind(n));
        k = mapping_pairs(r, n, keypath, &p);
        if (k < 0)
                return k;
        e->requests = calloc(p.n ?: 1, sizeof(MigDeviceRequest));
        if (!e->requests)
                return -ENOMEM;
        for (size_t i = 0; i < p.n; i++) {
                const Pair *q = &p.items[i];
                MigProfileName name;

                if (mig_profile_name_parse(q->key, &name) < 0)
                        return reader_error(r, q->key_node, keypath, "'%s' is not a MIG profile name (%s)", q->key,
                                            MIG_PROFILE_NAME_SYNTAX);
                if (name.ci_slices > name.gi_slices)
                        return reader_error(r, q->key_node, keypath,
                                            "'%s' asks for a compute instance of %u slices inside a GPU instance of "
                                            "%u; <C> in <C>c.<G>g.<GB>gb cannot exceed <G>", q->key, name.ci_slices,
                                            name.gi_slices);

                _cleanup_free_ char *where = strprintf("%s.%s", keypath, q->key);
                if (!where)
                        return -ENOMEM;
                unsigned count;
                k = parse_uint(q->value, MIG_COUNT_MAX, &count);
                if (k == -ERANGE)
                        return reader_error(r, q->value, where, "%s is more than any GPU can hold; counts go up to %u",
                                            scalar(q->value), MIG_COUNT_MAX);
                if (k < 0)
                        return reader_error(r, q->value, where,
                                            "%s%s%s is not a count; write a whole number of devices (0 = none of "
                                            "this profile)", scalar(q->value) ? "'" : "",
                                            scalar(q->value) ?: node_kind(q->value), scalar(q->value) ? "'" : "");
                e->requests[i].profile = strdup(q->key);
                if (!e->requests[i].profile)
                        return -ENOMEM;
                e->requests[i].count = count;
                e->n_requests = i + 1;
        }
        return 0;
}

static int read_entry(Reader *r, const GnaYamlNode *n, const char *keypath, MigConfigEntry *e) {
        static const char *const keys[] = { "device-filter", "devices", "mig-enabled", "mig-devices", NULL };
        _cleanup_(pairs_done) Pairs p = {};
        const Pair *q;
        int k;

        e->line = n->line;
        if (n->type != GNA_YAML_MAPPING)
                return reader_error(r, n, keypath,
                                    "an entry must be a mapping with 'devices' and 'mig-enabled', not %s",
                                    node_kind(n));
        k = mapping_pairs(r, n, keypath, &p);
        if (k < 0)
                return k;
        k = check_keys(r, &p, keypath, keys, "an entry");
        if (k < 0)
                return k;

        _cleanup_free_ char *kp_filter = strprintf("%s.device-filter", keypath),
                            *kp_devices = strprintf("%s.devices", keypath),
                            *kp_enabled = strprintf("%s.mig-enabled", keypath),
                            *kp_mig_devices = strprintf("%s.mig-devices", keypath);
        if (!kp_filter || !kp_devices || !kp_enabled || !kp_mig_devices)
                return -ENOMEM;

        q = pairs_get(&p, "device-filter");
        if (q && !node_is_null(q->value)) {
                k = read_device_filter(r, q->value, kp_filter, e);
                if (k < 0)
                        return k;
        }

        q = pairs_get(&p, "devices");
        if (!q || node_is_null(q->value))
                return reader_error(r, q ? q->value : n, kp_devices,
                                    "missing; write 'devices: all' or a list of GPU indices such as [0, 1]");
        k = read_devices(r, q->value, kp_devices, e);
        if (k < 0)
                return k;

        q = pairs_get(&p, "mig-enabled");
        if (!q || node_is_null(q->value))
                return reader_error(r, q ? q->value : n, kp_enabled, "missing; write 'mig-enabled: true' or 'false'");
        if (parse_bool(q->value, &e->mig_enabled) < 0) {
                if (scalar(q->value) && !scalar_is_plain(q->value))
                        return reader_error(r, q->value, kp_enabled,
                                            "\"%s\" is a quoted string, not a boolean; write true or false "
                                            "without quotes",
                                            scalar(q->value));
                return reader_error(r, q->value, kp_enabled, "%s%s%s is not a boolean; write true or false",
                                    scalar(q->value) ? "'" : "", scalar(q->value) ?: node_kind(q->value),
                                    scalar(q->value) ? "'" : "");
        }

        q = pairs_get(&p, "mig-devices");
        if (!q && e->mig_enabled)
                return reader_error(r, n, kp_mig_devices,
                                    "missing; with mig-enabled: true list the devices as profile: count, or write "
                                    "'mig-devices: {}' for MIG mode without devices");
        if (q && !node_is_null(q->value)) {
                k = read_mig_devices(r, q->value, kp_mig_devices, e);
                if (k < 0)
                        return k;
                bool any = false;
                for (size_t i = 0; i < e->n_requests; i++)
                        any = any || e->requests[i].count > 0;
                if (!e->mig_enabled && any) /* counts of 0 ask for nothing, which MIG off gives */
                        return reader_error(r, q->value, kp_mig_devices,
                                            "must be empty when mig-enabled is false; remove it, or set mig-enabled: "
                                            "true");
        }
        return 0;
}

static int read_config(Reader *r, const Pair *q, MigConfig *c) {
        _cleanup_free_ char *keypath = strprintf("mig-configs.%s", q->key);
        const GnaYamlNode *n = q->value;
        int k;

        if (!keypath)
                return -ENOMEM;
        c->name = strdup(q->key);
        if (!c->name)
                return -ENOMEM;
        if (n->type != GNA_YAML_SEQUENCE)
                return reader_error(r, n, keypath, "must be a list of entries (- devices: …), not %s", node_kind(n));

        size_t count = n->n_items;
        if (count == 0)
                return reader_error(r, n, keypath,
                                    "has no entries; add at least one, such as '- devices: all' with "
                                    "'mig-enabled: false'");
        c->entries = calloc(count, sizeof(MigConfigEntry));
        if (!c->entries)
                return -ENOMEM;
        for (size_t i = 0; i < count; i++) {
                _cleanup_free_ char *where = strprintf("%s[%zu]", keypath, i);
                const GnaYamlNode *item = n->items[i];
                if (!where)
                        return -ENOMEM;
                c->n_entries = i + 1;
                k = read_entry(r, item, where, &c->entries[i]);
                if (k < 0)
                        return k;
        }
        return 0;
}

static int read_top(Reader *r, const GnaYamlNode *top, MigConfigFile *f) {
        static const char *const keys[] = { "version", "mig-configs", NULL };
        _cleanup_(pairs_done) Pairs p = {}, configs = {};
        const Pair *q;
        int k;

        if (!top || node_is_null(top))
                return config_yaml_set_error(r->error, -EINVAL,
                                 "%s: the file is empty; a MIG config file starts with 'version: v1' and "
                                 "'mig-configs:'", r->path);
        if (top->type != GNA_YAML_MAPPING)
                return reader_error(r, top, NULL,
                                    "the top level must be a mapping with 'version: v1' and 'mig-configs:', not %s",
                                    node_kind(top));
        k = mapping_pairs(r, top, NULL, &p);
        if (k < 0)
                return k;
        k = check_keys(r, &p, NULL, keys, "a mig-parted config file");
        if (k < 0)
                return k;

        q = pairs_get(&p, "version");
        if (!q)
                return reader_error(r, top, "version", "missing; add 'version: v1' (mig-parted's config format)");
        if (!streq_ptr(scalar(q->value), "v1"))
                return reader_error(r, q->value, "version", "%s%s%s is not supported; this reader takes mig-parted's "
                                    "v1 format (version: v1)", scalar(q->value) ? "'" : "",
                                    scalar(q->value) ?: node_kind(q->value), scalar(q->value) ? "'" : "");

        q = pairs_get(&p, "mig-configs");
        if (!q)
                return reader_error(r, top, "mig-configs", "missing; add the named configs under 'mig-configs:'");
        if (q->value->type != GNA_YAML_MAPPING)
                return reader_error(r, q->value, "mig-configs",
                                    "must be a mapping of config names to lists of entries, not %s",
                                    node_kind(q->value));
        k = mapping_pairs(r, q->value, "mig-configs", &configs);
        if (k < 0)
                return k;
        if (configs.n == 0)
                return reader_error(r, q->value, "mig-configs", "is empty; add at least one named config");

        f->configs = calloc(configs.n, sizeof(MigConfig));
        if (!f->configs)
                return -ENOMEM;
        for (size_t i = 0; i < configs.n; i++) {
                f->n_configs = i + 1;
                k = read_config(r, &configs.items[i], &f->configs[i]);
                if (k < 0)
                        return k;
        }
        return 0;
}

int mig_config_file_parse(const char *path, const char *data, size_t size, MigConfigFile **ret, char **ret_error) {
        _cleanup_(mig_config_file_freep) MigConfigFile *f = NULL;
        _cleanup_(gna_yaml_node_unrefp) GnaYamlNode *top = NULL;
        Reader r = { .path = path, .error = ret_error };
        int k;

        assert(path);
        assert(ret);

        f = calloc(1, sizeof(MigConfigFile));
        if (!f)
                return -ENOMEM;
        f->path = strdup(path);
        if (!f->path)
                return -ENOMEM;

        /* mig-parted files share entries through anchors and merge keys: aliases are resolved, within
         * the reader's limits. */
        k = gna_yaml_parse(path, data, size, GNA_YAML_ALIASES, &top, ret_error);
        if (k < 0)
                return k;
        k = read_top(&r, top, f);
        if (k < 0)
                return k;

        *ret = TAKE_PTR(f);
        return 0;
}

int mig_config_file_load(const char *path, MigConfigFile **ret, char **ret_error) {
        _cleanup_free_ char *data = NULL;
        size_t size;
        int k;

        assert(path);
        k = read_full_file(path, GNA_YAML_SIZE_MAX, &data, &size);
        if (k == -EFBIG)
                return config_yaml_set_error(ret_error, k, "%s: larger than %u MiB; this is not a MIG config file",
                                             path, GNA_YAML_SIZE_MAX / 1024 / 1024);
        if (k == -EBADFD)
                return config_yaml_set_error(ret_error, k, "%s: not a regular file (a FIFO, socket or device); "
                                             "only regular files are read as MIG config files", path);
        if (k < 0)
                return config_yaml_set_error(ret_error, k, "%s: cannot read the MIG config file: %s", path,
                                             strerror(-k));
        return mig_config_file_parse(path, data, size, ret, ret_error);
}

int mig_config_file_find(const MigConfigFile *f, const char *name, const MigConfig **ret, char **ret_error) {
        _cleanup_strv_free_ char **names = NULL;
        int k;

        assert(f);
        for (size_t i = 0; i < f->n_configs; i++)
                if (streq_ptr(f->configs[i].name, name)) {
                        if (ret)
                                *ret = &f->configs[i];
                        return 0;
                }
        for (size_t i = 0; i < f->n_configs; i++) {
                k = strv_extend(&names, f->configs[i].name);
                if (k < 0)
                        return k;
        }
        _cleanup_free_ char *list = strv_join(names, ", ");
        if (!list)
                return -ENOMEM;
        return config_yaml_set_error(ret_error, -ENOENT, "%s has no MIG config named '%s'; it has: %s", f->path,
                                     strna(name), list);
}
