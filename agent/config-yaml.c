/* SPDX-License-Identifier: MIT */
/* Owns the YAML side of the configuration: one file read by the project's YAML reader (yaml-reader.h,
 * with its limits) into a small Node tree that remembers file:line:column, merging such trees, and the located error messages both this file and
 * config.c write. Knows nothing of the key table; config.c checks the trees against it. */
#include <stdarg.h>

#include "config-yaml.h"
#include "yaml-reader.h"

Node *config_node_free(Node *n) {
        if (!n)
                return NULL;
        for (size_t i = 0; i < n->n_items; i++)
                config_node_free(n->items[i]);
        free(n->items);
        free(n->key);
        free(n->value);
        free(n);
        return NULL;
}

static int config_node_append(Node *parent, Node *child) {
        Node **t = realloc(parent->items, (parent->n_items + 1) * sizeof(Node *));
        if (!t)
                return -ENOMEM;
        parent->items = t;
        parent->items[parent->n_items++] = child;
        return 0;
}

static Node *config_node_get(const Node *n, const char *key) {
        if (!n || n->type != NODE_MAPPING)
                return NULL;
        for (size_t i = 0; i < n->n_items; i++)
                if (streq(n->items[i]->key, key))
                        return n->items[i];
        return NULL;
}

const Node *config_node_find(const Node *tree, const char *path) {
        const Node *n = tree;
        for (const char *p = path; n && *p;) {
                size_t len = strcspn(p, ".");
                _cleanup_free_ char *key = strndup(p, len);
                if (!key)
                        return NULL;
                n = config_node_get(n, key);
                p += len + (p[len] == '.');
        }
        return n;
}

Node *config_node_take(Node *mapping, const char *key) {
        if (!mapping || mapping->type != NODE_MAPPING)
                return NULL;
        for (size_t i = 0; i < mapping->n_items; i++)
                if (streq(mapping->items[i]->key, key)) {
                        Node *n = mapping->items[i];
                        memmove(mapping->items + i, mapping->items + i + 1,
                                (mapping->n_items - i - 1) * sizeof(Node *));
                        mapping->n_items--;
                        return n;
                }
        return NULL;
}

const char *config_node_kind(const Node *n) {
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

int config_node_merge(Node **dst, Node *src) {
        _cleanup_(config_node_freep) Node *s = src;
        int r;

        if (!*dst || (*dst)->type != NODE_MAPPING || s->type != NODE_MAPPING) {
                config_node_free(*dst);
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
                        r = config_node_merge(&(*dst)->items[j], item);
                else {
                        r = config_node_append(*dst, item);
                        if (r < 0)
                                config_node_free(item);
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

/* The reader's tree, copied into Nodes that know their file and key position and can be merged. */
static int convert(const GnaYamlNode *y, const char *file, Node **ret) {
        _cleanup_(config_node_freep) Node *n = calloc(1, sizeof(Node));
        int r;

        if (!n)
                return -ENOMEM;
        n->type = y->type == GNA_YAML_SCALAR ? NODE_SCALAR : y->type == GNA_YAML_MAPPING ? NODE_MAPPING : NODE_SEQUENCE;
        n->file = file;
        n->line = y->line;
        n->column = y->column;
        if (y->type == GNA_YAML_SCALAR) {
                n->value = strdup(y->value);
                if (!n->value)
                        return -ENOMEM;
                n->null = y->null;
        }
        for (size_t i = 0; i < y->n_items; i++) {
                _cleanup_(config_node_freep) Node *child = NULL;
                r = convert(y->items[i], file, &child);
                if (r < 0)
                        return r;
                if (y->type == GNA_YAML_MAPPING) {
                        child->key = strdup(y->keys[i]->value);
                        if (!child->key)
                                return -ENOMEM;
                        child->key_line = y->keys[i]->line;
                        child->key_column = y->keys[i]->column;
                }
                r = config_node_append(n, child);
                if (r < 0)
                        return r;
                TAKE_PTR(child);
        }
        *ret = TAKE_PTR(n);
        return 0;
}

int config_yaml_parse_file(const char *file, const char *data, size_t size, char **error, Node **ret) {
        _cleanup_(gna_yaml_node_unrefp) GnaYamlNode *y = NULL;
        _cleanup_(config_node_freep) Node *tree = NULL;
        int r;

        /* No aliases: a drop-in overrides keys of another file, and an alias would hide which. */
        r = gna_yaml_parse(file, data, size, 0, &y, error);
        if (r < 0)
                return r;
        if (y) {
                r = convert(y, file, &tree);
                if (r < 0)
                        return r;
        }
        if (tree && tree->null)
                tree = config_node_free(tree);
        if (tree && tree->type != NODE_MAPPING)
                return config_yaml_located_error(error, file, tree->line, tree->column,
                                                 "the top level must be a mapping of keys such as 'labels:', not %s",
                                                 config_node_kind(tree));
        *ret = TAKE_PTR(tree);
        return 0;
}
