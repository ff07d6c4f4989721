/* SPDX-License-Identifier: MIT */
/* Owns the YAML side of the configuration: reading one file with libyaml into a small Node tree that
 * remembers file:line:column, merging such trees, and the located error messages both this file and
 * config.c write. Knows nothing of the key table; config.c checks the trees against it. */
#include <stdarg.h>
#include <yaml.h>

#include "config-yaml.h"

/* Deeper nesting than any key needs; the limit keeps a hostile file from exhausting the stack. */
#define CONFIG_DEPTH_MAX 64U

#define IN_SET3(x, a, b, c) ((x) == (a) || (x) == (b) || (x) == (c))

Node *yaml_node_free(Node *n) {
        if (!n)
                return NULL;
        for (size_t i = 0; i < n->n_items; i++)
                yaml_node_free(n->items[i]);
        free(n->items);
        free(n->key);
        free(n->value);
        free(n);
        return NULL;
}

static int yaml_node_append(Node *parent, Node *child) {
        Node **t = realloc(parent->items, (parent->n_items + 1) * sizeof(Node *));
        if (!t)
                return -ENOMEM;
        parent->items = t;
        parent->items[parent->n_items++] = child;
        return 0;
}

static Node *yaml_node_get(const Node *n, const char *key) {
        if (!n || n->type != NODE_MAPPING)
                return NULL;
        for (size_t i = 0; i < n->n_items; i++)
                if (streq(n->items[i]->key, key))
                        return n->items[i];
        return NULL;
}

const Node *yaml_node_find(const Node *tree, const char *path) {
        const Node *n = tree;
        for (const char *p = path; n && *p;) {
                size_t len = strcspn(p, ".");
                _cleanup_free_ char *key = strndup(p, len);
                if (!key)
                        return NULL;
                n = yaml_node_get(n, key);
                p += len + (p[len] == '.');
        }
        return n;
}

const char *yaml_node_kind(const Node *n) {
        switch (n->type) {
        case NODE_SCALAR:
                return "a plain value";
        case NODE_MAPPING:
                return "a mapping of keys";
        case NODE_SEQUENCE:
                return "a list";
        }
        return "something else";
}

int yaml_node_merge(Node **dst, Node *src) {
        _cleanup_(yaml_node_freep) Node *s = src;
        int r;

        if (!*dst || (*dst)->type != NODE_MAPPING || s->type != NODE_MAPPING) {
                yaml_node_free(*dst);
                *dst = TAKE_PTR(s);
                return 0;
        }
        for (size_t i = 0; i < s->n_items; i++) {
                Node *item = TAKE_PTR(s->items[i]);
                size_t j;

                for (j = 0; j < (*dst)->n_items; j++)
                        if (streq((*dst)->items[j]->key, item->key))
                                break;
                if (j < (*dst)->n_items)
                        r = yaml_node_merge(&(*dst)->items[j], item);
                else {
                        r = yaml_node_append(*dst, item);
                        if (r < 0)
                                yaml_node_free(item);
                }
                if (r < 0)
                        return r;
        }
        return 0;
}

int config_yaml_set_error(char **error, int r, const char *fmt, ...) {
        va_list ap;

        if (error) {
                free(*error);
                va_start(ap, fmt);
                if (vasprintf(error, fmt, ap) < 0)
                        *error = NULL;
                va_end(ap);
        }
        return r;
}

int config_yaml_located_error(char **error, const char *file, size_t line, size_t column, const char *fmt, ...) {
        _cleanup_free_ char *msg = NULL;
        va_list ap;

        va_start(ap, fmt);
        int k = vasprintf(&msg, fmt, ap);
        va_end(ap);
        if (k < 0)
                return -ENOMEM;
        return config_yaml_set_error(error, -EINVAL, "%s:%zu:%zu: %s", file, line, column, msg);
}

typedef struct Parser {
        yaml_parser_t yaml;
        const char *file;
        const char *data;
        size_t size;
        char **error;
} Parser;

/* libyaml counts lines and columns from 0, editors from 1. */
#define MARK(m) (size_t) (m).line + 1, (size_t) (m).column + 1

static void parser_done(Parser *p) {
        yaml_parser_delete(&p->yaml);
}

static int parser_next(Parser *p, yaml_event_t *e) {
        const yaml_parser_t *y = &p->yaml;

        if (yaml_parser_parse(&p->yaml, e))
                return 0;
        if (y->error == YAML_MEMORY_ERROR)
                return -ENOMEM;
        if (y->error == YAML_READER_ERROR) /* bad encoding: only the byte offset is known */
                return config_yaml_set_error(p->error, -EBADMSG, "%s: invalid YAML: %s at byte %zu", p->file,
                                             strna(y->problem), y->problem_offset);
        /* libyaml's words for a tab say nothing about tabs, the most common mistake of all. */
        bool tab = y->problem_mark.index < p->size && p->data[y->problem_mark.index] == '\t';
        return config_yaml_set_error(p->error, -EBADMSG, "%s:%zu:%zu: invalid YAML: %s%s%s%s%s", p->file,
                                     MARK(y->problem_mark), strna(y->problem), y->context ? " (" : "",
                                     y->context ?: "", y->context ? ")" : "",
                                     tab ? "; indent with spaces, YAML does not allow tabs" : "");
}

static bool scalar_is_null(const yaml_event_t *e) {
        const char *v = (const char *) e->data.scalar.value;

        if (e->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
                return false;
        return isempty(v) || streq(v, "~") || streq(v, "null") || streq(v, "Null") || streq(v, "NULL");
}

/* Builds the node that starts with event e (which stays the caller's). */
static int parse_node(Parser *p, const yaml_event_t *e, unsigned depth, Node **ret) {
        bool mapping = e->type == YAML_MAPPING_START_EVENT;
        _cleanup_(yaml_node_freep) Node *n = NULL;
        int r;

        if (depth > CONFIG_DEPTH_MAX)
                return config_yaml_located_error(p->error, p->file, MARK(e->start_mark),
                                                 "nested more than %u levels deep", CONFIG_DEPTH_MAX);
        if (e->type == YAML_ALIAS_EVENT)
                return config_yaml_located_error(p->error, p->file, MARK(e->start_mark),
                                                 "aliases (*%s) are not supported; write the value out",
                                                 e->data.alias.anchor);
        if (!IN_SET3(e->type, YAML_SCALAR_EVENT, YAML_SEQUENCE_START_EVENT, YAML_MAPPING_START_EVENT))
                return config_yaml_set_error(p->error, -EBADMSG, "%s:%zu:%zu: invalid YAML: unexpected event %d",
                                             p->file, MARK(e->start_mark), (int) e->type);

        n = calloc(1, sizeof(Node));
        if (!n)
                return -ENOMEM;
        n->type = e->type == YAML_SCALAR_EVENT ? NODE_SCALAR : mapping ? NODE_MAPPING : NODE_SEQUENCE;
        n->file = p->file;
        n->line = (unsigned) e->start_mark.line + 1;
        n->column = (unsigned) e->start_mark.column + 1;
        if (e->type == YAML_SCALAR_EVENT) {
                n->value = strndup((const char *) e->data.scalar.value, e->data.scalar.length);
                if (!n->value)
                        return -ENOMEM;
                n->null = scalar_is_null(e);
        }

        while (n->type != NODE_SCALAR) {
                _cleanup_(yaml_event_delete) yaml_event_t k = {}, v = {};
                _cleanup_(yaml_node_freep) Node *child = NULL;
                const char *key = NULL;

                r = parser_next(p, &k);
                if (r < 0)
                        return r;
                if (k.type == YAML_SEQUENCE_END_EVENT || k.type == YAML_MAPPING_END_EVENT)
                        break;
                if (mapping) {
                        if (k.type != YAML_SCALAR_EVENT)
                                return config_yaml_located_error(p->error, p->file, MARK(k.start_mark),
                                                                 "a key must be a plain word such as 'labels'");
                        key = (const char *) k.data.scalar.value;
                        const Node *dup = yaml_node_get(n, key);
                        if (dup)
                                return config_yaml_located_error(p->error, p->file, MARK(k.start_mark),
                                                                 "duplicate key '%s' (already set on line %u); "
                                                                 "remove one of them", key, dup->key_line);
                        r = parser_next(p, &v);
                        if (r < 0)
                                return r;
                }
                r = parse_node(p, mapping ? &v : &k, depth + 1, &child);
                if (r < 0)
                        return r;
                if (key) {
                        child->key = strdup(key);
                        if (!child->key)
                                return -ENOMEM;
                        child->key_line = (unsigned) k.start_mark.line + 1;
                        child->key_column = (unsigned) k.start_mark.column + 1;
                }
                r = yaml_node_append(n, child);
                if (r < 0)
                        return r;
                TAKE_PTR(child);
        }
        *ret = TAKE_PTR(n);
        return 0;
}

int config_yaml_parse_file(const char *file, const char *data, size_t size, char **error, Node **ret) {
        _cleanup_(yaml_event_delete) yaml_event_t start = {}, doc = {}, top = {}, end = {}, next = {};
        _cleanup_(parser_done) Parser p = { .file = file, .data = data, .size = size, .error = error };
        _cleanup_(yaml_node_freep) Node *tree = NULL;
        int r;

        if (!yaml_parser_initialize(&p.yaml))
                return -ENOMEM;
        yaml_parser_set_input_string(&p.yaml, (const unsigned char *) data, size);

        r = parser_next(&p, &start);
        if (r >= 0)
                r = parser_next(&p, &doc);
        if (r >= 0 && doc.type != YAML_STREAM_END_EVENT) {
                r = parser_next(&p, &top);
                if (r >= 0)
                        r = parse_node(&p, &top, 0, &tree);
                if (r >= 0)
                        r = parser_next(&p, &end);
                if (r >= 0)
                        r = parser_next(&p, &next);
                if (r >= 0 && next.type != YAML_STREAM_END_EVENT)
                        return config_yaml_located_error(error, file, MARK(next.start_mark),
                                                         "a second YAML document ('---') is not supported; use one "
                                                         "document per file");
        }
        if (r < 0)
                return r;
        if (tree && tree->null)
                tree = yaml_node_free(tree);
        if (tree && tree->type != NODE_MAPPING)
                return config_yaml_located_error(error, file, tree->line, tree->column,
                                                 "the top level must be a mapping of keys such as 'labels:', not %s",
                                                 yaml_node_kind(tree));
        *ret = TAKE_PTR(tree);
        return 0;
}
