/* SPDX-License-Identifier: MIT */
/* Owns the YAML node tree of the configuration loader: one file parsed with
 * the project's YAML reader into Nodes that remember file:line:column, trees merged the way drop-ins override, and the
 * "FILE:LINE:COLUMN: message" errors the loader reports (the MIG config reader shares the latter). */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "macro.h"

typedef enum NodeType {
        NODE_SCALAR,
        NODE_MAPPING,
        NODE_SEQUENCE,
} NodeType;

typedef struct Node Node;
struct Node {
        NodeType type;
        char *key;         /* set when this node is the value of a mapping entry */
        char *value;       /* NODE_SCALAR */
        bool null;         /* plain ~, null or nothing: the key goes back to its default */
        Node **items;      /* NODE_MAPPING, NODE_SEQUENCE */
        size_t n_items;
        const char *file;  /* borrowed from the loader's list of files */
        unsigned line, column, key_line, key_column;
};

Node *config_node_free(Node *n);
DEFINE_CLEANUP_FUNC(Node *, config_node_free);

/* Finds the node of a dotted key in a merged tree, to point an error at the file that set it. */
const Node *config_node_find(const Node *tree, const char *path);
/* Removes the entry key from a mapping and returns it (the caller frees it); NULL when absent. */
Node *config_node_take(Node *mapping, const char *key);
/* "a plain value", "a mapping of keys", "a list": for messages that say what was found instead. */
const char *config_node_kind(const Node *n);
/* Takes src. Mappings merge key by key; anything else (scalars, lists, null) replaces what was there. */
int config_node_merge(Node **dst, Node *src);

/* Parses one file (file is the name for messages and is borrowed by the nodes) into a tree whose top is
 * a mapping; *ret is NULL when there is nothing to merge (empty file, only comments, or a lone "---").
 * Invalid YAML fails with -EBADMSG, YAML this loader does not take (aliases, duplicate keys, a second
 * document, a top level that is not a mapping) with -EINVAL; both set *error. */
int config_yaml_parse_file(const char *file, const char *data, size_t size, char **error, Node **ret);

/* When error is set, replaces *error with the formatted message. Returns r. */
int config_yaml_set_error(char **error, int r, const char *fmt, ...) _printf_(3, 4);
/* Sets *error to "FILE:LINE:COLUMN: message", the form editors and compilers use, and returns -EINVAL. */
int config_yaml_located_error(char **error, const char *file, size_t line, size_t column, const char *fmt, ...)
        _printf_(5, 6);
