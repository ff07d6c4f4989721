/* SPDX-License-Identifier: MIT */
/* Owns the fake NVML's reading of YAML files (the model table, node descriptions, state files): a
 * libyaml document with lookups by key and typed scalars that report errors as "file:line: sentence".
 * Aliases (the model table's `*gi8`) are resolved by libyaml's document loader. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <yaml.h>

#include "macro.h"

/* One error sentence, filled by the first failure and passed up unchanged. */
typedef struct FakeError {
        char msg[768];
} FakeError;

/* Formats into e (when e is non-NULL and still empty) and returns -EINVAL. */
int fake_error(FakeError *e, const char *fmt, ...) _printf_(2, 3);

typedef struct FakeYaml {
        char *path;
        yaml_document_t doc;
        bool loaded;
} FakeYaml;

/* Loads a whole file. A missing file is -ENOENT (with e filled). */
int fake_yaml_load(FakeYaml *y, const char *path, FakeError *e);
void fake_yaml_done(FakeYaml *y);

yaml_node_t *fake_yaml_root(FakeYaml *y);
/* Value of key in a mapping, NULL when absent (or when map is not a mapping). */
yaml_node_t *fake_yaml_get(FakeYaml *y, yaml_node_t *map, const char *key);
/* The n-th item of a sequence, NULL past the end. */
yaml_node_t *fake_yaml_item(FakeYaml *y, yaml_node_t *seq, size_t n);
size_t fake_yaml_len(yaml_node_t *seq);
unsigned fake_yaml_line(yaml_node_t *n);

/* Checks that every key of map is in the NULL-terminated list; names the first unknown one. */
int fake_yaml_check_keys(FakeYaml *y, yaml_node_t *map, const char *what, const char *const *known, FakeError *e);

/* Typed accessors: the node must be a scalar of that kind. "what" names the value in errors. */
int fake_yaml_str(FakeYaml *y, yaml_node_t *n, const char *what, const char **ret, FakeError *e);
int fake_yaml_u64(FakeYaml *y, yaml_node_t *n, const char *what, uint64_t max, uint64_t *ret, FakeError *e);
int fake_yaml_bool(FakeYaml *y, yaml_node_t *n, const char *what, bool *ret, FakeError *e);
/* Requires a mapping / sequence. */
int fake_yaml_expect(FakeYaml *y, yaml_node_t *n, yaml_node_type_t type, const char *what, FakeError *e);
