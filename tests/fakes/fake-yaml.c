/* SPDX-License-Identifier: MIT */
/* Owns YAML loading and typed lookups for the fake NVML (see fake-yaml.h). */
#include <stdarg.h>

#include "fake-yaml.h"

int fake_error(FakeError *e, const char *fmt, ...) {
        if (e && !e->msg[0]) {
                va_list ap;
                va_start(ap, fmt);
                vsnprintf(e->msg, sizeof e->msg, fmt, ap);
                va_end(ap);
        }
        return -EINVAL;
}

int fake_yaml_load(FakeYaml *y, const char *path, FakeError *e) {
        _cleanup_fclose_ FILE *f = NULL;
        yaml_parser_t parser;
        int r = 0;

        *y = (FakeYaml) {};
        f = fopen(path, "re");
        if (!f) {
                r = -errno;
                fake_error(e, "%s: cannot open: %s", path, strerror(errno));
                return r;
        }
        if (!yaml_parser_initialize(&parser))
                return fake_error(e, "%s: out of memory initialising the YAML parser", path), -ENOMEM;
        yaml_parser_set_input_file(&parser, f);
        if (!yaml_parser_load(&parser, &y->doc)) {
                r = fake_error(e, "%s:%zu: not valid YAML: %s %s; fix the syntax", path,
                               parser.problem_mark.line + 1, strna(parser.problem), strna(parser.context));
                yaml_parser_delete(&parser);
                return r;
        }
        yaml_parser_delete(&parser);
        y->loaded = true;
        y->path = strdup(path);
        if (!y->path) {
                fake_yaml_done(y);
                return -ENOMEM;
        }
        if (!yaml_document_get_root_node(&y->doc)) {
                fake_error(e, "%s: the file is empty; it needs a YAML mapping", path);
                fake_yaml_done(y);
                return -EINVAL;
        }
        return 0;
}

void fake_yaml_done(FakeYaml *y) {
        if (y->loaded)
                yaml_document_delete(&y->doc);
        y->path = mfree(y->path);
        y->loaded = false;
}

yaml_node_t *fake_yaml_root(FakeYaml *y) {
        return y->loaded ? yaml_document_get_root_node(&y->doc) : NULL;
}

unsigned fake_yaml_line(yaml_node_t *n) {
        return n ? (unsigned) n->start_mark.line + 1 : 0;
}

static const char *scalar(yaml_node_t *n) {
        return n && n->type == YAML_SCALAR_NODE ? (const char *) n->data.scalar.value : NULL;
}

yaml_node_t *fake_yaml_get(FakeYaml *y, yaml_node_t *map, const char *key) {
        if (!map || map->type != YAML_MAPPING_NODE)
                return NULL;
        for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
                const char *k = scalar(yaml_document_get_node(&y->doc, p->key));
                if (k && streq(k, key))
                        return yaml_document_get_node(&y->doc, p->value);
        }
        return NULL;
}

size_t fake_yaml_len(yaml_node_t *seq) {
        if (!seq || seq->type != YAML_SEQUENCE_NODE)
                return 0;
        return (size_t) (seq->data.sequence.items.top - seq->data.sequence.items.start);
}

yaml_node_t *fake_yaml_item(FakeYaml *y, yaml_node_t *seq, size_t n) {
        if (n >= fake_yaml_len(seq))
                return NULL;
        return yaml_document_get_node(&y->doc, seq->data.sequence.items.start[n]);
}

int fake_yaml_check_keys(FakeYaml *y, yaml_node_t *map, const char *what, const char *const *known, FakeError *e) {
        if (!map || map->type != YAML_MAPPING_NODE)
                return 0;
        for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
                yaml_node_t *kn = yaml_document_get_node(&y->doc, p->key);
                const char *k = scalar(kn);
                bool ok = false;
                for (const char *const *i = known; k && *i; i++)
                        if (streq(*i, k))
                                ok = true;
                if (!ok) {
                        char list[256] = "";
                        for (const char *const *i = known; *i; i++) {
                                if (list[0])
                                        strncat(list, ", ", sizeof list - strlen(list) - 1);
                                strncat(list, *i, sizeof list - strlen(list) - 1);
                        }
                        return fake_error(e, "%s:%u: unknown key '%s' in %s; known keys are: %s", y->path,
                                          fake_yaml_line(kn), strna(k), what, list);
                }
        }
        return 0;
}

static const char *type_name(yaml_node_type_t t) {
        switch (t) {
        case YAML_SCALAR_NODE:
                return "a scalar";
        case YAML_SEQUENCE_NODE:
                return "a list";
        case YAML_MAPPING_NODE:
                return "a mapping";
        case YAML_NO_NODE:
                break;
        }
        return "nothing";
}

int fake_yaml_expect(FakeYaml *y, yaml_node_t *n, yaml_node_type_t type, const char *what, FakeError *e) {
        if (!n)
                return fake_error(e, "%s: %s is missing; it must be %s", y->path, what, type_name(type));
        if (n->type != type)
                return fake_error(e, "%s:%u: %s must be %s, not %s", y->path, fake_yaml_line(n), what,
                                  type_name(type), type_name(n->type));
        return 0;
}

int fake_yaml_str(FakeYaml *y, yaml_node_t *n, const char *what, const char **ret, FakeError *e) {
        int r = fake_yaml_expect(y, n, YAML_SCALAR_NODE, what, e);
        if (r < 0)
                return r;
        *ret = scalar(n);
        return 0;
}

int fake_yaml_u64(FakeYaml *y, yaml_node_t *n, const char *what, uint64_t max, uint64_t *ret, FakeError *e) {
        const char *s;
        char *end;
        int r = fake_yaml_str(y, n, what, &s, e);
        if (r < 0)
                return r;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 0);
        if (errno || end == s || *end || s[0] == '-' || v > max)
                return fake_error(e, "%s:%u: %s must be a whole number between 0 and %llu, not '%s'", y->path,
                                  fake_yaml_line(n), what, (unsigned long long) max, s);
        *ret = v;
        return 0;
}

int fake_yaml_bool(FakeYaml *y, yaml_node_t *n, const char *what, bool *ret, FakeError *e) {
        const char *s;
        int r = fake_yaml_str(y, n, what, &s, e);
        if (r < 0)
                return r;
        if (streq(s, "true") || streq(s, "yes") || streq(s, "on"))
                *ret = true;
        else if (streq(s, "false") || streq(s, "no") || streq(s, "off"))
                *ret = false;
        else
                return fake_error(e, "%s:%u: %s must be true or false, not '%s'", y->path, fake_yaml_line(n),
                                  what, s);
        return 0;
}
