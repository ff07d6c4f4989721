/* SPDX-License-Identifier: MIT */
/* Owns reading CDI spec files: YAML or JSON (JSON is YAML) parsed by the project's one YAML reader
 * (yaml-reader.h: its depth, size and node limits) into a tree that keeps positions and scalar styles, then into the CdiSpec model the way the loader's strict decoding
 * does it: unknown fields, wrong types and duplicate keys fail the whole file, with FILE:LINE:COLUMN in
 * the message. The content rules live in cdi-validate.c. */
#include <ctype.h>
#include <inttypes.h>
#include <stdarg.h>

#include "cdi.h"
#include "fileio.h"
#include "strv.h"
#include "yaml-reader.h"

/* ---- the tree comes from the one YAML reader (yaml-reader.h), aliases refused ---- */

static int perr(char **error, const char *name, size_t line, size_t column, const char *fmt, ...) _printf_(5, 6);
static int perr(char **error, const char *name, size_t line, size_t column, const char *fmt, ...) {
        _cleanup_free_ char *msg = NULL;
        va_list ap;

        va_start(ap, fmt);
        if (vasprintf(&msg, fmt, ap) < 0)
                msg = NULL;
        va_end(ap);
        free(*error);
        *error = line > 0 ? strprintf("%s:%zu:%zu: %s", name, line, column, strna(msg))
                          : strprintf("%s: %s", name, strna(msg));
        return -EINVAL;
}

static int parse_tree(const char *name, const char *data, size_t size, GnaYamlNode **ret, char **error) {
        return gna_yaml_parse(name, data, size, 0, ret, error);
}

/* ---- tree → model, with the strict decoder's type rules ---- */

typedef struct Ctx {
        const char *name;
        char **error;
} Ctx;

#define FAIL(c, node, ...) perr((c)->error, (c)->name, (node)->line, (node)->column, __VA_ARGS__)

static bool scalar_is_null(const GnaYamlNode *n) {
        return n->type == GNA_YAML_SCALAR && n->plain &&
               (isempty(n->value) || streq(n->value, "~") || strcasecmp(n->value, "null") == 0);
}

static const char *yname(const GnaYamlNode *n) {
        return n->type == GNA_YAML_MAPPING ? "a mapping" : n->type == GNA_YAML_SEQUENCE ? "a list" : "a plain value";
}

/* Strings: any scalar (the loader's YAML → JSON step turns 0, 1.5 or true into a string for a string
 * field); null is the empty string. */
static int get_string(Ctx *c, const GnaYamlNode *n, const char *path, char **ret) {
        if (n->type != GNA_YAML_SCALAR)
                return FAIL(c, n, "%s must be a string, not %s", path, yname(n));
        if (scalar_is_null(n))
                return 0;
        free(*ret);
        *ret = strdup(n->value);
        return *ret ? 0 : -ENOMEM;
}

static int get_int(Ctx *c, const GnaYamlNode *n, const char *path, int64_t min, int64_t max, int64_t *ret) {
        char *end;

        if (n->type != GNA_YAML_SCALAR || !n->plain)
                return FAIL(c, n, "%s must be an integer, not %s", path, n->type == GNA_YAML_SCALAR ? "a quoted string" : yname(n));
        if (scalar_is_null(n))
                return 0;
        errno = 0;
        long long v = strtoll(n->value, &end, 0);
        if (errno != 0 || end == n->value || *end || v < min || v > max)
                return FAIL(c, n, "%s must be an integer from %" PRIi64 " to %" PRIi64 ", not \"%s\"", path, min, max, n->value);
        *ret = v;
        return 0;
}

static int get_bool(Ctx *c, const GnaYamlNode *n, const char *path, bool *ret) {
        static const char *const yes[] = { "true", "yes", "on", "y" }, *const no[] = { "false", "no", "off", "n" };

        if (n->type == GNA_YAML_SCALAR && n->plain) {
                if (scalar_is_null(n))
                        return 0;
                for (size_t i = 0; i < ELEMENTSOF(yes); i++) {
                        if (strcasecmp(n->value, yes[i]) == 0)
                                return *ret = true, 0;
                        if (strcasecmp(n->value, no[i]) == 0)
                                return *ret = false, 0;
                }
        }
        return FAIL(c, n, "%s must be true or false", path);
}

static int get_strv(Ctx *c, const GnaYamlNode *n, const char *path, char ***ret) {
        if (scalar_is_null(n))
                return 0;
        if (n->type != GNA_YAML_SEQUENCE)
                return FAIL(c, n, "%s must be a list of strings, not %s", path, yname(n));
        for (size_t i = 0; i < n->n_items; i++) {
                _cleanup_free_ char *s = NULL, *p = strprintf("%s[%zu]", path, i);
                int r = get_string(c, n->items[i], p, &s);
                if (r < 0)
                        return r;
                r = strv_extend(ret, s ?: "");
                if (r < 0)
                        return r;
        }
        return 0;
}

/* Checks a mapping's keys against the fields the loader's Go struct has (rule 12). */
static int check_fields(Ctx *c, const GnaYamlNode *n, const char *path, const char *const *fields) {
        if (n->type != GNA_YAML_MAPPING)
                return FAIL(c, n, "%s must be a mapping, not %s", path, yname(n));
        for (size_t i = 0; i < n->n_items; i++) {
                bool known = false;
                for (const char *const *f = fields; *f; f++)
                        known = known || streq(*f, n->keys[i]->value);
                if (!known) {
                        _cleanup_free_ char *list = strv_join((char **) fields, ", ");
                        return FAIL(c, n->items[i], "unknown field \"%s\" in %s; the loader rejects the whole file (known fields: %s)",
                                    n->keys[i]->value, path, strna(list));
                }
        }
        return 0;
}

static int get_object_list(Ctx *c, const GnaYamlNode *n, const char *path, size_t elem_size, void **array, size_t *count) {
        if (scalar_is_null(n))
                return 0;
        if (n->type != GNA_YAML_SEQUENCE)
                return FAIL(c, n, "%s must be a list, not %s", path, yname(n));
        if (n->n_items == 0)
                return 0;
        *array = calloc(n->n_items, elem_size);
        if (!*array)
                return -ENOMEM;
        *count = n->n_items;
        return 0;
}

static int parse_device_node(Ctx *c, const GnaYamlNode *n, const char *path, CdiDeviceNode *d) {
        static const char *const fields[] = { "path", "hostPath", "type", "major", "minor", "fileMode",
                                              "permissions", "uid", "gid", NULL };
        int r = check_fields(c, n, path, fields);

        for (size_t i = 0; r >= 0 && i < n->n_items; i++) {
                const char *k = n->keys[i]->value;
                const GnaYamlNode *v = n->items[i];
                _cleanup_free_ char *p = strprintf("%s.%s", path, k);
                int64_t x = 0;

                if (!p)
                        return -ENOMEM;
                if (streq(k, "path"))
                        r = get_string(c, v, p, &d->path);
                else if (streq(k, "hostPath"))
                        r = get_string(c, v, p, &d->host_path);
                else if (streq(k, "type"))
                        r = get_string(c, v, p, &d->type);
                else if (streq(k, "permissions"))
                        r = get_string(c, v, p, &d->permissions);
                else if (streq(k, "major"))
                        r = get_int(c, v, p, INT64_MIN, INT64_MAX, &d->major);
                else if (streq(k, "minor"))
                        r = get_int(c, v, p, INT64_MIN, INT64_MAX, &d->minor);
                else {
                        r = get_int(c, v, p, 0, UINT32_MAX, &x);
                        if (streq(k, "fileMode"))
                                d->has_file_mode = true, d->file_mode = (uint32_t) x;
                        else if (streq(k, "uid"))
                                d->has_uid = true, d->uid = (uint32_t) x;
                        else
                                d->has_gid = true, d->gid = (uint32_t) x;
                }
        }
        return r;
}

static int parse_mount(Ctx *c, const GnaYamlNode *n, const char *path, CdiMount *m) {
        static const char *const fields[] = { "hostPath", "containerPath", "options", "type", NULL };
        int r = check_fields(c, n, path, fields);

        for (size_t i = 0; r >= 0 && i < n->n_items; i++) {
                const char *k = n->keys[i]->value;
                _cleanup_free_ char *p = strprintf("%s.%s", path, k);
                if (!p)
                        return -ENOMEM;
                if (streq(k, "hostPath"))
                        r = get_string(c, n->items[i], p, &m->host_path);
                else if (streq(k, "containerPath"))
                        r = get_string(c, n->items[i], p, &m->container_path);
                else if (streq(k, "options"))
                        r = get_strv(c, n->items[i], p, &m->options);
                else
                        r = get_string(c, n->items[i], p, &m->type);
        }
        return r;
}

static int parse_hook(Ctx *c, const GnaYamlNode *n, const char *path, CdiHook *h) {
        static const char *const fields[] = { "hookName", "path", "args", "env", "timeout", NULL };
        int r = check_fields(c, n, path, fields);

        for (size_t i = 0; r >= 0 && i < n->n_items; i++) {
                const char *k = n->keys[i]->value;
                _cleanup_free_ char *p = strprintf("%s.%s", path, k);
                if (!p)
                        return -ENOMEM;
                if (streq(k, "hookName"))
                        r = get_string(c, n->items[i], p, &h->hook_name);
                else if (streq(k, "path"))
                        r = get_string(c, n->items[i], p, &h->path);
                else if (streq(k, "args"))
                        r = get_strv(c, n->items[i], p, &h->args);
                else if (streq(k, "env"))
                        r = get_strv(c, n->items[i], p, &h->env);
                else {
                        h->has_timeout = !scalar_is_null(n->items[i]);
                        r = get_int(c, n->items[i], p, INT64_MIN, INT64_MAX, &h->timeout);
                }
        }
        return r;
}

static int parse_net_device(Ctx *c, const GnaYamlNode *n, const char *path, CdiNetDevice *d) {
        static const char *const fields[] = { "hostInterfaceName", "name", NULL };
        int r = check_fields(c, n, path, fields);

        for (size_t i = 0; r >= 0 && i < n->n_items; i++) {
                _cleanup_free_ char *p = strprintf("%s.%s", path, n->keys[i]->value);
                if (!p)
                        return -ENOMEM;
                r = get_string(c, n->items[i], p,
                               streq(n->keys[i]->value, "name") ? &d->name : &d->host_interface_name);
        }
        return r;
}

static int parse_intel_rdt(Ctx *c, const GnaYamlNode *n, const char *path, CdiIntelRdt *rdt) {
        static const char *const fields[] = { "closID", "l3CacheSchema", "memBwSchema", "schemata",
                                              "enableMonitoring", "enableCMT", "enableMBM", NULL };
        int r = check_fields(c, n, path, fields);

        for (size_t i = 0; r >= 0 && i < n->n_items; i++) {
                const char *k = n->keys[i]->value;
                const GnaYamlNode *v = n->items[i];
                _cleanup_free_ char *p = strprintf("%s.%s", path, k), *ignored = NULL;
                _cleanup_strv_free_ char **schemata = NULL;
                if (!p)
                        return -ENOMEM;
                if (streq(k, "closID"))
                        r = get_string(c, v, p, &rdt->clos_id);
                else if (streq(k, "schemata")) {
                        r = get_strv(c, v, p, &schemata);
                        rdt->has_schemata = !scalar_is_null(v);
                } else if (streq(k, "enableMonitoring"))
                        r = get_bool(c, v, p, &rdt->enable_monitoring);
                else if (streq(k, "enableCMT")) {
                        r = get_bool(c, v, p, &rdt->enable_cmt);
                        rdt->seen_enable_cmt = true;
                } else if (streq(k, "enableMBM")) {
                        r = get_bool(c, v, p, &rdt->enable_mbm);
                        rdt->seen_enable_mbm = true;
                } else
                        r = get_string(c, v, p, &ignored);
        }
        return r;
}

static int parse_edits(Ctx *c, const GnaYamlNode *n, const char *path, CdiEdits *e) {
        static const char *const fields[] = { "env", "deviceNodes", "hooks", "mounts", "netDevices",
                                              "intelRdt", "additionalGids", NULL };
        int r;

        if (scalar_is_null(n))
                return 0;
        r = check_fields(c, n, path, fields);
        for (size_t i = 0; r >= 0 && i < n->n_items; i++) {
                const char *k = n->keys[i]->value;
                const GnaYamlNode *v = n->items[i];
                _cleanup_free_ char *p = strprintf("%s.%s", path, k);
                if (!p)
                        return -ENOMEM;

                if (streq(k, "env"))
                        r = get_strv(c, v, p, &e->env);
                else if (streq(k, "deviceNodes")) {
                        r = get_object_list(c, v, p, sizeof(CdiDeviceNode), (void **) &e->device_nodes, &e->n_device_nodes);
                        for (size_t j = 0; r >= 0 && j < e->n_device_nodes; j++) {
                                _cleanup_free_ char *q = strprintf("%s[%zu]", p, j);
                                r = q ? parse_device_node(c, v->items[j], q, e->device_nodes + j) : -ENOMEM;
                        }
                } else if (streq(k, "mounts")) {
                        r = get_object_list(c, v, p, sizeof(CdiMount), (void **) &e->mounts, &e->n_mounts);
                        for (size_t j = 0; r >= 0 && j < e->n_mounts; j++) {
                                _cleanup_free_ char *q = strprintf("%s[%zu]", p, j);
                                r = q ? parse_mount(c, v->items[j], q, e->mounts + j) : -ENOMEM;
                        }
                } else if (streq(k, "hooks")) {
                        r = get_object_list(c, v, p, sizeof(CdiHook), (void **) &e->hooks, &e->n_hooks);
                        for (size_t j = 0; r >= 0 && j < e->n_hooks; j++) {
                                _cleanup_free_ char *q = strprintf("%s[%zu]", p, j);
                                r = q ? parse_hook(c, v->items[j], q, e->hooks + j) : -ENOMEM;
                        }
                } else if (streq(k, "netDevices")) {
                        r = get_object_list(c, v, p, sizeof(CdiNetDevice), (void **) &e->net_devices, &e->n_net_devices);
                        for (size_t j = 0; r >= 0 && j < e->n_net_devices; j++) {
                                _cleanup_free_ char *q = strprintf("%s[%zu]", p, j);
                                r = q ? parse_net_device(c, v->items[j], q, e->net_devices + j) : -ENOMEM;
                        }
                } else if (streq(k, "intelRdt")) {
                        if (scalar_is_null(v))
                                continue;
                        e->intel_rdt = calloc(1, sizeof(CdiIntelRdt));
                        r = e->intel_rdt ? parse_intel_rdt(c, v, p, e->intel_rdt) : -ENOMEM;
                } else {
                        r = get_object_list(c, v, p, sizeof(uint32_t), (void **) &e->additional_gids, &e->n_additional_gids);
                        for (size_t j = 0; r >= 0 && j < e->n_additional_gids; j++) {
                                _cleanup_free_ char *q = strprintf("%s[%zu]", p, j);
                                int64_t x = 0;
                                r = q ? get_int(c, v->items[j], q, 0, UINT32_MAX, &x) : -ENOMEM;
                                e->additional_gids[j] = (uint32_t) x;
                        }
                }
        }
        return r;
}

static int parse_annotations(Ctx *c, const GnaYamlNode *n, const char *path, char ***ret) {
        if (scalar_is_null(n))
                return 0;
        if (n->type != GNA_YAML_MAPPING)
                return FAIL(c, n, "%s must be a mapping of strings, not %s", path, yname(n));
        for (size_t i = 0; i < n->n_items; i++) {
                _cleanup_free_ char *p = strprintf("%s.%s", path, n->keys[i]->value), *v = NULL;
                int r = p ? get_string(c, n->items[i], p, &v) : -ENOMEM;
                if (r >= 0)
                        r = strv_extend(ret, n->keys[i]->value);
                if (r >= 0)
                        r = strv_extend(ret, v ?: "");
                if (r < 0)
                        return r;
        }
        return 0;
}

static int parse_device(Ctx *c, const GnaYamlNode *n, const char *path, CdiDevice *d) {
        static const char *const fields[] = { "name", "annotations", "containerEdits", NULL };
        int r = check_fields(c, n, path, fields);

        for (size_t i = 0; r >= 0 && i < n->n_items; i++) {
                const char *k = n->keys[i]->value;
                _cleanup_free_ char *p = strprintf("%s.%s", path, k);
                if (!p)
                        return -ENOMEM;
                if (streq(k, "name"))
                        r = get_string(c, n->items[i], p, &d->name);
                else if (streq(k, "annotations"))
                        r = parse_annotations(c, n->items[i], p, &d->annotations);
                else
                        r = parse_edits(c, n->items[i], p, &d->edits);
        }
        return r;
}

int cdi_spec_parse(const char *name, const char *data, size_t size, CdiSpec **ret, char **ret_error) {
        static const char *const fields[] = { "cdiVersion", "kind", "annotations", "devices", "containerEdits", NULL };
        _cleanup_(gna_yaml_node_unrefp) GnaYamlNode *root = NULL;
        _cleanup_(cdi_spec_freep) CdiSpec *s = NULL;
        Ctx c = { .name = name, .error = ret_error };
        int r;

        r = parse_tree(name, data, size, &root, ret_error);
        if (r < 0)
                return r;
        if (!root || scalar_is_null(root))
                return perr(ret_error, name, 0, 0, "the file holds no CDI spec (it is empty)");

        s = calloc(1, sizeof(CdiSpec));
        if (!s)
                return -ENOMEM;
        r = check_fields(&c, root, "the spec", fields);
        for (size_t i = 0; r >= 0 && i < root->n_items; i++) {
                const char *k = root->keys[i]->value;
                const GnaYamlNode *v = root->items[i];
                if (streq(k, "cdiVersion"))
                        r = get_string(&c, v, k, &s->version);
                else if (streq(k, "kind"))
                        r = get_string(&c, v, k, &s->kind);
                else if (streq(k, "annotations"))
                        r = parse_annotations(&c, v, k, &s->annotations);
                else if (streq(k, "containerEdits"))
                        r = parse_edits(&c, v, k, &s->edits);
                else {
                        r = get_object_list(&c, v, k, sizeof(CdiDevice), (void **) &s->devices, &s->n_devices);
                        for (size_t j = 0; r >= 0 && j < s->n_devices; j++) {
                                _cleanup_free_ char *q = strprintf("devices[%zu]", j);
                                r = q ? parse_device(&c, v->items[j], q, s->devices + j) : -ENOMEM;
                        }
                }
        }
        if (r < 0)
                return r;
        *ret = TAKE_PTR(s);
        return 0;
}

int cdi_file_kind(const char *path, char **ret_kind) {
        _cleanup_free_ char *data = NULL, *error = NULL;
        _cleanup_(gna_yaml_node_unrefp) GnaYamlNode *root = NULL;
        size_t size;
        int r;

        *ret_kind = NULL;
        r = read_full_file(path, GNA_YAML_SIZE_MAX, &data, &size);
        if (r < 0)
                return r;
        if (parse_tree(path, data, size, &root, &error) < 0 || !root || root->type != GNA_YAML_MAPPING)
                return 0;
        for (size_t i = 0; i < root->n_items; i++)
                if (streq(root->keys[i]->value, "kind") && root->items[i]->type == GNA_YAML_SCALAR) {
                        *ret_kind = strdup(root->items[i]->value);
                        return *ret_kind ? 0 : -ENOMEM;
                }
        return 0;
}
