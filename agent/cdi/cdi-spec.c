/* SPDX-License-Identifier: MIT */
/* Owns the CdiSpec model: freeing it, the minimum cdiVersion its content needs (the loader's
 * requiresVxyz rules), and the deterministic YAML emitter. The emitter writes keys in alphabetical order
 * at every level, like the toolkit's own files, so a diff against `nvidia-ctk cdi generate` output is
 * readable, and it quotes a string only when a YAML 1.1 or 1.2 reader would take it for something else
 * (the loader's YAML → JSON step turns an unquoted 0 into a number). */
#include <ctype.h>
#include <inttypes.h>
#include <stdarg.h>

#include "cdi.h"
#include "strv.h"

void cdi_edits_done(CdiEdits *e) {
        strv_free(e->env);
        for (size_t i = 0; i < e->n_device_nodes; i++) {
                CdiDeviceNode *d = e->device_nodes + i;
                free(d->path);
                free(d->host_path);
                free(d->type);
                free(d->permissions);
        }
        free(e->device_nodes);
        for (size_t i = 0; i < e->n_mounts; i++) {
                free(e->mounts[i].host_path);
                free(e->mounts[i].container_path);
                strv_free(e->mounts[i].options);
                free(e->mounts[i].type);
        }
        free(e->mounts);
        for (size_t i = 0; i < e->n_hooks; i++) {
                free(e->hooks[i].hook_name);
                free(e->hooks[i].path);
                strv_free(e->hooks[i].args);
                strv_free(e->hooks[i].env);
        }
        free(e->hooks);
        for (size_t i = 0; i < e->n_net_devices; i++) {
                free(e->net_devices[i].host_interface_name);
                free(e->net_devices[i].name);
        }
        free(e->net_devices);
        if (e->intel_rdt)
                free(e->intel_rdt->clos_id);
        free(e->intel_rdt);
        free(e->additional_gids);
        *e = (CdiEdits) {};
}

CdiSpec *cdi_spec_free(CdiSpec *s) {
        if (!s)
                return NULL;
        free(s->version);
        free(s->kind);
        strv_free(s->annotations);
        for (size_t i = 0; i < s->n_devices; i++) {
                free(s->devices[i].name);
                strv_free(s->devices[i].annotations);
                cdi_edits_done(&s->devices[i].edits);
        }
        free(s->devices);
        cdi_edits_done(&s->edits);
        free(s);
        return NULL;
}

/* The versions the loader knows, oldest first. */
static const char *const known_versions[] = {
        "0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0",
};

static int parse_version(const char *v, unsigned out[3]) {
        char *end;

        if (*v == 'v')
                v++;
        for (int i = 0; i < 3; i++) {
                if (!isdigit((unsigned char) *v))
                        return -EINVAL;
                unsigned long x = strtoul(v, &end, 10);
                if (x > 100000)
                        return -EINVAL;
                out[i] = (unsigned) x;
                v = end;
                if (i < 2 && *v++ != '.')
                        return -EINVAL;
        }
        return *v ? -EINVAL : 0;
}

int cdi_version_compare(const char *a, const char *b) {
        unsigned va[3] = {}, vb[3] = {};

        (void) parse_version(a, va);
        (void) parse_version(b, vb);
        for (int i = 0; i < 3; i++)
                if (va[i] != vb[i])
                        return va[i] < vb[i] ? -1 : 1;
        return 0;
}

bool cdi_version_is_known(const char *v) {
        if (!v)
                return false;
        if (*v == 'v')
                v++;
        for (size_t i = 0; i < ELEMENTSOF(known_versions); i++)
                if (streq(v, known_versions[i]))
                        return true;
        return false;
}

static void need(const char **min, const char *v) {
        if (cdi_version_compare(v, *min) > 0)
                *min = v;
}

static void edits_min_version(const CdiEdits *e, const char **min) {
        for (size_t i = 0; i < e->n_mounts; i++)
                if (!isempty(e->mounts[i].type))
                        need(min, "0.4.0");
        for (size_t i = 0; i < e->n_device_nodes; i++)
                if (!isempty(e->device_nodes[i].host_path))
                        need(min, "0.5.0");
        if (e->intel_rdt || e->n_additional_gids > 0)
                need(min, "0.7.0");
        if (e->n_net_devices > 0 || (e->intel_rdt && (e->intel_rdt->has_schemata || e->intel_rdt->enable_monitoring)))
                need(min, "1.1.0");
}

const char *cdi_spec_min_version(const CdiSpec *s) {
        const char *min = "0.3.0";

        edits_min_version(&s->edits, &min);
        if (strv_length(s->annotations) > 0)
                need(&min, "0.6.0");
        if (s->kind) {
                const char *slash = strchr(s->kind, '/');
                if (slash && slash != s->kind && slash[1] && strchr(slash + 1, '.'))
                        need(&min, "0.6.0");
        }
        for (size_t i = 0; i < s->n_devices; i++) {
                const CdiDevice *d = s->devices + i;
                if (d->name && isdigit((unsigned char) d->name[0]))
                        need(&min, "0.5.0");
                if (strv_length(d->annotations) > 0)
                        need(&min, "0.6.0");
                edits_min_version(&d->edits, &min);
        }
        return min;
}

/* ---- emitter ---- */

static bool plain_safe(const char *s) {
        static const char *const words[] = { "y", "n", "yes", "no", "on", "off", "true", "false", "null" };

        if (isempty(s) || !(isalpha((unsigned char) s[0]) || s[0] == '/' || s[0] == '_'))
                return false;
        for (const char *p = s; *p; p++)
                if (!isalnum((unsigned char) *p) && !strchr("/_.:=+@-", *p))
                        return false;
        if (s[strlen(s) - 1] == ':')
                return false;
        for (size_t i = 0; i < ELEMENTSOF(words); i++)
                if (strcasecmp(s, words[i]) == 0)
                        return false;
        return true;
}

static void emit_scalar(FILE *f, const char *s) {
        if (plain_safe(s)) {
                fputs(s, f);
                return;
        }
        fputc('"', f);
        for (const unsigned char *p = (const unsigned char *) (s ?: ""); *p; p++) {
                if (*p == '"' || *p == '\\')
                        fprintf(f, "\\%c", *p);
                else if (*p < 0x20 || *p == 0x7f)
                        fprintf(f, "\\x%02x", *p);
                else
                        fputc(*p, f);
        }
        fputc('"', f);
}

/* Keys of a mapping at `indent`; when *dash is set the first key of a list item takes "- " in place of
 * the last two spaces. */
static void emit_indent(FILE *f, unsigned indent, bool *dash) {
        if (*dash) {
                fprintf(f, "%*s- ", (int) indent - 2, "");
                *dash = false;
        } else
                fprintf(f, "%*s", (int) indent, "");
}

static void emit_key_scalar(FILE *f, unsigned indent, bool *dash, const char *key, const char *value) {
        emit_indent(f, indent, dash);
        fprintf(f, "%s: ", key);
        emit_scalar(f, value);
        fputc('\n', f);
}

static void emit_key_int(FILE *f, unsigned indent, bool *dash, const char *key, int64_t value) {
        emit_indent(f, indent, dash);
        fprintf(f, "%s: %" PRIi64 "\n", key, value);
}

static void emit_key_strv(FILE *f, unsigned indent, bool *dash, const char *key, char *const *l) {
        if (strv_length(l) == 0)
                return;
        emit_indent(f, indent, dash);
        fprintf(f, "%s:\n", key);
        STRV_FOREACH(s, l) {
                fprintf(f, "%*s- ", (int) indent, "");
                emit_scalar(f, *s);
                fputc('\n', f);
        }
}

static int emit_annotations(FILE *f, unsigned indent, bool *dash, char *const *pairs) {
        size_t n = strv_length(pairs) / 2;
        _cleanup_free_ size_t *order = NULL;

        if (n == 0)
                return 0;
        order = calloc(n, sizeof(size_t));
        if (!order)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++)
                order[i] = i;
        /* Insertion sort by key: a handful of entries at most. */
        for (size_t i = 1; i < n; i++)
                for (size_t j = i; j > 0 && strcmp(pairs[2 * order[j - 1]], pairs[2 * order[j]]) > 0; j--) {
                        size_t t = order[j];
                        order[j] = order[j - 1];
                        order[j - 1] = t;
                }
        emit_indent(f, indent, dash);
        fputs("annotations:\n", f);
        for (size_t i = 0; i < n; i++) {
                bool no = false;
                emit_key_scalar(f, indent + 2, &no, pairs[2 * order[i]], pairs[2 * order[i] + 1]);
        }
        return 0;
}

static bool edits_empty(const CdiEdits *e) {
        return (strv_length(e->env) == 0) && e->n_device_nodes == 0 && e->n_mounts == 0 && e->n_hooks == 0 &&
               e->n_net_devices == 0 && !e->intel_rdt && e->n_additional_gids == 0;
}

static int emit_edits(FILE *f, unsigned indent, bool *dash, const CdiEdits *e) {
        bool item;

        if (e->intel_rdt)
                return -EOPNOTSUPP; /* we never produce it */

        emit_indent(f, indent, dash);
        if (edits_empty(e)) {
                fputs("containerEdits: {}\n", f);
                return 0;
        }
        fputs("containerEdits:\n", f);
        indent += 2;

        if (e->n_additional_gids > 0) {
                fprintf(f, "%*sadditionalGids:\n", (int) indent, "");
                for (size_t i = 0; i < e->n_additional_gids; i++)
                        fprintf(f, "%*s- %" PRIu32 "\n", (int) indent, "", e->additional_gids[i]);
        }
        if (e->n_device_nodes > 0) {
                fprintf(f, "%*sdeviceNodes:\n", (int) indent, "");
                for (size_t i = 0; i < e->n_device_nodes; i++) {
                        const CdiDeviceNode *d = e->device_nodes + i;
                        item = true;
                        if (d->has_file_mode)
                                emit_key_int(f, indent + 2, &item, "fileMode", d->file_mode);
                        if (d->has_gid)
                                emit_key_int(f, indent + 2, &item, "gid", d->gid);
                        if (!isempty(d->host_path))
                                emit_key_scalar(f, indent + 2, &item, "hostPath", d->host_path);
                        if (d->major != 0)
                                emit_key_int(f, indent + 2, &item, "major", d->major);
                        if (d->minor != 0)
                                emit_key_int(f, indent + 2, &item, "minor", d->minor);
                        emit_key_scalar(f, indent + 2, &item, "path", d->path);
                        if (!isempty(d->permissions))
                                emit_key_scalar(f, indent + 2, &item, "permissions", d->permissions);
                        if (!isempty(d->type))
                                emit_key_scalar(f, indent + 2, &item, "type", d->type);
                        if (d->has_uid)
                                emit_key_int(f, indent + 2, &item, "uid", d->uid);
                }
        }
        item = false;
        emit_key_strv(f, indent, &item, "env", e->env);
        if (e->n_hooks > 0) {
                fprintf(f, "%*shooks:\n", (int) indent, "");
                for (size_t i = 0; i < e->n_hooks; i++) {
                        const CdiHook *h = e->hooks + i;
                        item = true;
                        emit_key_strv(f, indent + 2, &item, "args", h->args);
                        emit_key_strv(f, indent + 2, &item, "env", h->env);
                        emit_key_scalar(f, indent + 2, &item, "hookName", h->hook_name);
                        emit_key_scalar(f, indent + 2, &item, "path", h->path);
                        if (h->has_timeout)
                                emit_key_int(f, indent + 2, &item, "timeout", h->timeout);
                }
        }
        if (e->n_mounts > 0) {
                fprintf(f, "%*smounts:\n", (int) indent, "");
                for (size_t i = 0; i < e->n_mounts; i++) {
                        const CdiMount *m = e->mounts + i;
                        item = true;
                        emit_key_scalar(f, indent + 2, &item, "containerPath", m->container_path);
                        emit_key_scalar(f, indent + 2, &item, "hostPath", m->host_path);
                        emit_key_strv(f, indent + 2, &item, "options", m->options);
                        if (!isempty(m->type))
                                emit_key_scalar(f, indent + 2, &item, "type", m->type);
                }
        }
        if (e->n_net_devices > 0) {
                fprintf(f, "%*snetDevices:\n", (int) indent, "");
                for (size_t i = 0; i < e->n_net_devices; i++) {
                        item = true;
                        emit_key_scalar(f, indent + 2, &item, "hostInterfaceName", e->net_devices[i].host_interface_name);
                        emit_key_scalar(f, indent + 2, &item, "name", e->net_devices[i].name);
                }
        }
        return 0;
}

int cdi_spec_to_yaml(const CdiSpec *s, char **ret) {
        _cleanup_free_ char *buf = NULL;
        size_t size = 0;
        bool no = false;
        int r = 0;

        FILE *f = open_memstream(&buf, &size);
        if (!f)
                return -ENOMEM;

        fputs("# Written by gpu-node-agent: the CDI spec of the node's NVIDIA GPUs and MIG devices, rewritten\n"
              "# whenever they change. Do not edit: set cdi.enabled: false in the agent's configuration to\n"
              "# manage this file yourself.\n",
              f);
        r = emit_annotations(f, 0, &no, s->annotations);
        if (r >= 0)
                emit_key_scalar(f, 0, &no, "cdiVersion", s->version);
        if (r >= 0 && !edits_empty(&s->edits))
                r = emit_edits(f, 0, &no, &s->edits);
        if (r >= 0) {
                fputs("devices:\n", f);
                for (size_t i = 0; r >= 0 && i < s->n_devices; i++) {
                        const CdiDevice *d = s->devices + i;
                        bool item = true;
                        r = emit_annotations(f, 2, &item, d->annotations);
                        if (r >= 0)
                                r = emit_edits(f, 2, &item, &d->edits);
                        if (r >= 0)
                                emit_key_scalar(f, 2, &item, "name", d->name);
                }
        }
        if (r >= 0)
                emit_key_scalar(f, 0, &no, "kind", s->kind);

        if (fclose(f) != 0 && r >= 0)
                r = -ENOMEM;
        if (r < 0)
                return r;
        *ret = TAKE_PTR(buf);
        return 0;
}
