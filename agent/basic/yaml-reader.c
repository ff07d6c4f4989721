/* SPDX-License-Identifier: MIT */
/* Owns gna_yaml_parse(): libyaml events to a GnaYamlNode tree under the limits in yaml-reader.h, the
 * anchors table for aliases, and the located error messages of the reader. See yaml-reader.h. */
#include <stdarg.h>
#include <yaml.h>

#include "strv.h"
#include "yaml-reader.h"

GnaYamlNode *gna_yaml_node_unref(GnaYamlNode *n) {
        if (!n)
                return NULL;
        assert(n->n_ref > 0);
        if (--n->n_ref > 0)
                return NULL;
        for (size_t i = 0; i < n->n_items; i++) {
                if (n->keys)
                        gna_yaml_node_unref(n->keys[i]);
                gna_yaml_node_unref(n->items[i]);
        }
        free(n->keys);
        free(n->items);
        free(n->value);
        free(n);
        return NULL;
}

static GnaYamlNode *node_ref(GnaYamlNode *n) {
        n->n_ref++;
        return n;
}

const GnaYamlNode *gna_yaml_get(const GnaYamlNode *m, const char *key) {
        if (!m || m->type != GNA_YAML_MAPPING)
                return NULL;
        for (size_t i = 0; i < m->n_items; i++)
                if (streq(m->keys[i]->value, key))
                        return m->items[i];
        return NULL;
}

const char *gna_yaml_kind(const GnaYamlNode *n) {
        if (!n)
                return "nothing";
        switch (n->type) {
        case GNA_YAML_SCALAR:
                return "a plain value";
        case GNA_YAML_MAPPING:
                return "a mapping of keys";
        case GNA_YAML_SEQUENCE:
                return "a list";
        }
        return "something else";
}

const char *gna_yaml_scalar(const GnaYamlNode *n) {
        return n && n->type == GNA_YAML_SCALAR ? n->value : NULL;
}

typedef struct Anchor {
        char *name;
        GnaYamlNode *node;
} Anchor;

typedef struct Reader {
        yaml_parser_t yaml;
        const char *name;
        const char *data;
        size_t size;
        GnaYamlFlags flags;
        size_t weight; /* nodes so far, aliases expanded */
        Anchor *anchors;
        size_t n_anchors;
        char **error;
} Reader;

static void reader_done(Reader *r) {
        for (size_t i = 0; i < r->n_anchors; i++) {
                free(r->anchors[i].name);
                gna_yaml_node_unref(r->anchors[i].node);
        }
        free(r->anchors);
        yaml_parser_delete(&r->yaml);
}

_printf_(5, 6) static int located(Reader *r, int err, size_t line, size_t column, const char *fmt, ...) {
        _cleanup_free_ char *msg = NULL;
        va_list ap;

        va_start(ap, fmt);
        int k = vasprintf(&msg, fmt, ap);
        va_end(ap);
        if (k < 0)
                return -ENOMEM;
        if (r->error) {
                free(*r->error);
                *r->error = strprintf("%s:%zu:%zu: %s", r->name, line, column, msg);
        }
        return err;
}

/* libyaml counts lines and columns from 0, editors from 1. */
#define MARK(m) (size_t) (m).line + 1, (size_t) (m).column + 1

static int reader_next(Reader *r, yaml_event_t *e) {
        const yaml_parser_t *y = &r->yaml;

        if (yaml_parser_parse(&r->yaml, e))
                return 0;
        if (y->error == YAML_MEMORY_ERROR)
                return -ENOMEM;
        if (y->error == YAML_READER_ERROR) { /* bad encoding: only the byte offset is known */
                if (r->error) {
                        free(*r->error);
                        *r->error = strprintf("%s: invalid YAML: %s at byte %zu", r->name, strna(y->problem),
                                              y->problem_offset);
                }
                return -EBADMSG;
        }
        /* libyaml's words for a tab say nothing about tabs, the most common mistake of all. */
        bool tab = y->problem_mark.index < r->size && r->data[y->problem_mark.index] == '\t';
        return located(r, -EBADMSG, MARK(y->problem_mark), "invalid YAML: %s%s%s%s%s", strna(y->problem),
                       y->context ? " (" : "", y->context ?: "", y->context ? ")" : "",
                       tab ? "; indent with spaces, YAML does not allow tabs" : "");
}

static bool scalar_is_null(const yaml_event_t *e) {
        const char *v = (const char *) e->data.scalar.value;

        if (e->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
                return false;
        return isempty(v) || streq(v, "~") || streq(v, "null") || streq(v, "Null") || streq(v, "NULL");
}

static const char *event_anchor(const yaml_event_t *e) {
        switch (e->type) {
        case YAML_SCALAR_EVENT:
                return (const char *) e->data.scalar.anchor;
        case YAML_SEQUENCE_START_EVENT:
                return (const char *) e->data.sequence_start.anchor;
        case YAML_MAPPING_START_EVENT:
                return (const char *) e->data.mapping_start.anchor;
        case YAML_NO_EVENT:
        case YAML_STREAM_START_EVENT:
        case YAML_STREAM_END_EVENT:
        case YAML_DOCUMENT_START_EVENT:
        case YAML_DOCUMENT_END_EVENT:
        case YAML_ALIAS_EVENT:
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT:
                break;
        }
        return NULL;
}

/* A later anchor of the same name replaces the earlier one, as YAML says. */
static int anchor_add(Reader *r, const yaml_event_t *e, const char *name, GnaYamlNode *n) {
        for (size_t i = 0; i < r->n_anchors; i++)
                if (streq(r->anchors[i].name, name)) {
                        gna_yaml_node_unref(r->anchors[i].node);
                        r->anchors[i].node = node_ref(n);
                        return 0;
                }
        if (r->n_anchors >= GNA_YAML_ANCHORS_MAX)
                return located(r, -EINVAL, MARK(e->start_mark), "more than %u anchors (&%s)", GNA_YAML_ANCHORS_MAX,
                               name);
        Anchor *a = reallocarray(r->anchors, r->n_anchors + 1, sizeof(Anchor));
        if (!a)
                return -ENOMEM;
        r->anchors = a;
        char *copy = strdup(name);
        if (!copy)
                return -ENOMEM;
        r->anchors[r->n_anchors++] = (Anchor) { .name = copy, .node = node_ref(n) };
        return 0;
}

static int count(Reader *r, const yaml_event_t *e, size_t weight) {
        if (weight > GNA_YAML_NODES_MAX - r->weight)
                return located(r, -EINVAL, MARK(e->start_mark),
                               "more than %u YAML nodes%s; this is not a file this agent reads", GNA_YAML_NODES_MAX,
                               e->type == YAML_ALIAS_EVENT ? " with aliases expanded" : "");
        r->weight += weight;
        return 0;
}

static int alias_node(Reader *r, const yaml_event_t *e, unsigned depth, GnaYamlNode **ret) {
        const char *name = (const char *) e->data.alias.anchor;

        if (!(r->flags & GNA_YAML_ALIASES))
                return located(r, -EINVAL, MARK(e->start_mark), "aliases (*%s) are not supported; write the value out",
                               name);
        for (size_t i = r->n_anchors; i-- > 0;)
                if (streq(r->anchors[i].name, name)) {
                        GnaYamlNode *a = r->anchors[i].node;
                        if (depth + a->height > GNA_YAML_DEPTH_MAX)
                                return located(r, -EINVAL, MARK(e->start_mark),
                                               "nested more than %u levels deep (with alias *%s expanded)",
                                               GNA_YAML_DEPTH_MAX, name);
                        int k = count(r, e, a->weight);
                        if (k < 0)
                                return k;
                        *ret = node_ref(a);
                        return 0;
                }
        /* Also what an alias inside its own anchor gives: no cycles. */
        return located(r, -EINVAL, MARK(e->start_mark), "alias *%s refers to no anchor (&%s) before it", name, name);
}

static int append(GnaYamlNode *n, GnaYamlNode *key, GnaYamlNode *child) {
        GnaYamlNode **items = reallocarray(n->items, n->n_items + 1, sizeof(GnaYamlNode *));
        if (!items)
                return -ENOMEM;
        n->items = items;
        if (n->type == GNA_YAML_MAPPING) {
                GnaYamlNode **keys = reallocarray(n->keys, n->n_items + 1, sizeof(GnaYamlNode *));
                if (!keys)
                        return -ENOMEM;
                n->keys = keys;
                n->keys[n->n_items] = key;
        }
        n->items[n->n_items++] = child;
        if (child->height + 1 > n->height)
                n->height = child->height + 1;
        n->weight += child->weight + (key ? 1 : 0);
        return 0;
}

/* Builds the node that starts with event e (which stays the caller's), at depth (0 = the top). */
static int parse_node(Reader *r, const yaml_event_t *e, unsigned depth, GnaYamlNode **ret) {
        _cleanup_(gna_yaml_node_unrefp) GnaYamlNode *n = NULL;
        int k;

        if (depth > GNA_YAML_DEPTH_MAX)
                return located(r, -EINVAL, MARK(e->start_mark), "nested more than %u levels deep", GNA_YAML_DEPTH_MAX);
        if (e->type == YAML_ALIAS_EVENT)
                return alias_node(r, e, depth, ret);
        if (e->type != YAML_SCALAR_EVENT && e->type != YAML_SEQUENCE_START_EVENT &&
            e->type != YAML_MAPPING_START_EVENT)
                return located(r, -EBADMSG, MARK(e->start_mark), "invalid YAML: unexpected event %d", (int) e->type);
        k = count(r, e, 1);
        if (k < 0)
                return k;

        n = calloc(1, sizeof(GnaYamlNode));
        if (!n)
                return -ENOMEM;
        n->n_ref = 1;
        n->weight = 1;
        n->line = (unsigned) e->start_mark.line + 1;
        n->column = (unsigned) e->start_mark.column + 1;
        if (e->type == YAML_SCALAR_EVENT) {
                n->type = GNA_YAML_SCALAR;
                n->value = strndup((const char *) e->data.scalar.value, e->data.scalar.length);
                if (!n->value)
                        return -ENOMEM;
                n->plain = e->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
                n->null = scalar_is_null(e);
        } else
                n->type = e->type == YAML_MAPPING_START_EVENT ? GNA_YAML_MAPPING : GNA_YAML_SEQUENCE;

        while (n->type != GNA_YAML_SCALAR) {
                _cleanup_(yaml_event_delete) yaml_event_t ke = {}, ve = {};
                _cleanup_(gna_yaml_node_unrefp) GnaYamlNode *key = NULL, *child = NULL;

                k = reader_next(r, &ke);
                if (k < 0)
                        return k;
                if (ke.type == YAML_SEQUENCE_END_EVENT || ke.type == YAML_MAPPING_END_EVENT)
                        break;
                if (n->type == GNA_YAML_MAPPING) {
                        if (ke.type != YAML_SCALAR_EVENT)
                                return located(r, -EINVAL, MARK(ke.start_mark),
                                               "a key must be a plain word, not a list or a mapping");
                        if (n->n_items >= GNA_YAML_KEYS_MAX)
                                return located(r, -EINVAL, MARK(ke.start_mark), "more than %u keys in one mapping",
                                               GNA_YAML_KEYS_MAX);
                        k = parse_node(r, &ke, depth + 1, &key);
                        if (k < 0)
                                return k;
                        for (size_t i = 0; i < n->n_items; i++)
                                if (streq(n->keys[i]->value, key->value))
                                        return located(r, -EINVAL, MARK(ke.start_mark),
                                                       "duplicate key '%s' (already set on line %u); remove one "
                                                       "of them", key->value, n->keys[i]->line);
                        k = reader_next(r, &ve);
                        if (k < 0)
                                return k;
                }
                k = parse_node(r, n->type == GNA_YAML_MAPPING ? &ve : &ke, depth + 1, &child);
                if (k < 0)
                        return k;
                k = append(n, key, child);
                if (k < 0)
                        return k;
                TAKE_PTR(key);
                TAKE_PTR(child);
        }

        /* Without aliases an anchor is only a name: nothing can refer to it. */
        const char *anchor = (r->flags & GNA_YAML_ALIASES) ? event_anchor(e) : NULL;
        if (anchor) {
                k = anchor_add(r, e, anchor, n);
                if (k < 0)
                        return k;
        }
        *ret = TAKE_PTR(n);
        return 0;
}

int gna_yaml_parse(const char *name, const char *data, size_t size, GnaYamlFlags flags, GnaYamlNode **ret,
                   char **ret_error) {
        _cleanup_(yaml_event_delete) yaml_event_t start = {}, doc = {}, top = {}, end = {}, next = {};
        _cleanup_(reader_done) Reader r = { .name = name, .data = data, .size = size, .flags = flags,
                                            .error = ret_error };
        _cleanup_(gna_yaml_node_unrefp) GnaYamlNode *tree = NULL;
        int k;

        assert(ret);
        if (size > GNA_YAML_SIZE_MAX) {
                if (ret_error) {
                        free(*ret_error);
                        *ret_error = strprintf("%s: %zu bytes, more than the %u KiB any YAML file this agent reads "
                                               "may have", name, size, GNA_YAML_SIZE_MAX / 1024);
                }
                return -EFBIG;
        }
        if (!yaml_parser_initialize(&r.yaml))
                return -ENOMEM;
        yaml_parser_set_input_string(&r.yaml, (const unsigned char *) data, size);

        k = reader_next(&r, &start);
        if (k >= 0)
                k = reader_next(&r, &doc);
        if (k >= 0 && doc.type != YAML_STREAM_END_EVENT) {
                k = reader_next(&r, &top);
                if (k >= 0)
                        k = parse_node(&r, &top, 0, &tree);
                if (k >= 0)
                        k = reader_next(&r, &end);
                if (k >= 0)
                        k = reader_next(&r, &next);
                /* A reader that stopped at the first document would silently ignore the rest. */
                if (k >= 0 && next.type != YAML_STREAM_END_EVENT)
                        return located(&r, -EINVAL, MARK(next.start_mark),
                                       "a second YAML document ('---') is not supported; use one document per file");
        }
        if (k < 0)
                return k;
        *ret = TAKE_PTR(tree);
        return 0;
}
