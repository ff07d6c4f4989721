/* SPDX-License-Identifier: MIT */
/* Owns the one YAML reader of the project: a file's bytes parsed with libyaml's event API into a small
 * tree of GnaYamlNodes that remember line, column and scalar style, under one set of limits that every
 * caller (configuration, mig-parted files, CDI specs) gets: size, nesting depth, node count with
 * aliases expanded (a "billion laughs" file fails after reading, not after exhausting memory or
 * stack), duplicate keys, a single document. What the tree means is the caller's business. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "macro.h"

/* Larger than any configuration, mig-parted file or CDI spec a node has (nvidia-ctk's spec for 8 GPUs
 * with MIG is ~100 KiB). */
#define GNA_YAML_SIZE_MAX (4U * 1024U * 1024U)
/* Deeper nesting than any of the three formats needs; keeps recursion off the end of the stack. */
#define GNA_YAML_DEPTH_MAX 64U
/* Nodes in a document, every alias counted with the whole subtree it stands for. */
#define GNA_YAML_NODES_MAX 200000U
/* Keys in one mapping (each new key is checked against the others for duplicates) and anchors in one
 * document (each alias is looked up among them): bounded, so that a 4 MiB file costs milliseconds. */
#define GNA_YAML_KEYS_MAX 1024U
#define GNA_YAML_ANCHORS_MAX 1024U

typedef enum GnaYamlType {
        GNA_YAML_SCALAR,
        GNA_YAML_MAPPING,
        GNA_YAML_SEQUENCE,
} GnaYamlType;

typedef struct GnaYamlNode GnaYamlNode;
struct GnaYamlNode {
        GnaYamlType type;
        char *value;          /* GNA_YAML_SCALAR */
        bool plain;           /* an unquoted scalar: may be a number, a bool or null */
        bool null;            /* plain "", "~", "null", "Null" or "NULL" */
        GnaYamlNode **keys;   /* GNA_YAML_MAPPING: keys[i] (scalars) names items[i] */
        GnaYamlNode **items;  /* GNA_YAML_MAPPING, GNA_YAML_SEQUENCE */
        size_t n_items;
        unsigned line, column; /* from 1; an alias has its anchor's */
        /* private */
        unsigned n_ref;       /* an alias shares the anchored node */
        unsigned height;      /* levels below this node */
        size_t weight;        /* nodes in this subtree, aliases expanded */
};

typedef enum GnaYamlFlags {
        /* Resolve *alias to the &anchor'ed node (shared, counted against the node limit with its whole
         * subtree). Without it an alias is refused: "aliases (*a) are not supported; write the value out". */
        GNA_YAML_ALIASES = 1 << 0,
} GnaYamlFlags;

GnaYamlNode *gna_yaml_node_unref(GnaYamlNode *n);
DEFINE_CLEANUP_FUNC(GnaYamlNode *, gna_yaml_node_unref);

/* Parses data (name is used in messages) into *ret, NULL for an empty stream. Errors set *ret_error to
 * "NAME:LINE:COLUMN: ..." and return -EBADMSG (not YAML), -EFBIG (over GNA_YAML_SIZE_MAX), -ENOMEM, or
 * -EINVAL (YAML over a limit or with what no caller takes: aliases without the flag, duplicate keys,
 * a key that is not a scalar, a second document). */
int gna_yaml_parse(const char *name, const char *data, size_t size, GnaYamlFlags flags, GnaYamlNode **ret,
                   char **ret_error);

/* The value of key in a mapping, or NULL. */
const GnaYamlNode *gna_yaml_get(const GnaYamlNode *mapping, const char *key);
/* "a plain value", "a mapping of keys", "a list": for messages that say what was found instead. */
const char *gna_yaml_kind(const GnaYamlNode *n);
/* The scalar's text, NULL when n is not a scalar. */
const char *gna_yaml_scalar(const GnaYamlNode *n);
