/* SPDX-License-Identifier: MIT */
/* Owns gpunodectl's output primitives: colour decisions, aligned tables, and a small JSON writer
 * (strings escaped per RFC 8259, keys in the order the caller writes them). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define ANSI_GREEN "\x1b[0;1;32m"
#define ANSI_YELLOW "\x1b[0;1;33m"
#define ANSI_RED "\x1b[0;1;31m"
#define ANSI_BOLD "\x1b[1m"
#define ANSI_NORMAL "\x1b[0m"

/* Colour only for a terminal, and never when $NO_COLOR is set (non-empty) or $TERM is "dumb". */
bool ctl_colors_enabled(void);
/* The escape sequence when colours are on, "" otherwise. */
const char *ctl_ansi(const char *seq);

typedef struct CtlTable {
        size_t n_columns;
        char **cells;      /* row-major, header first, n_rows * n_columns strings */
        size_t n_rows;
        const char **colors; /* per cell, may be NULL: an ANSI sequence applied to that cell */
        char **notes;      /* per row, NULL or free-form lines (joined by '\n') printed under it */
} CtlTable;

/* The header is the first row; it is printed only when header is true. */
int ctl_table_new(CtlTable **ret, size_t n_columns, const char *const *header);
CtlTable *ctl_table_free(CtlTable *t);
/* Adds one row of n_columns cells (NULL or "" shown as "-"). */
int ctl_table_add_row(CtlTable *t, const char *const *cells);
/* Sets the colour of the last added row's cell column. */
void ctl_table_set_color(CtlTable *t, size_t column, const char *seq);
/* Adds a free-form line under the last added row (a sub-list such as a GPU's MIG devices): printed
 * as is, outside the columns, whether or not the header is. */
int ctl_table_add_note(CtlTable *t, const char *line);
void ctl_table_print(const CtlTable *t, FILE *f, bool header);

static inline void ctl_table_freep(CtlTable **t) {
        ctl_table_free(*t);
}

/* Display width of a UTF-8 string, counting code points (good enough for names and messages). */
size_t ctl_utf8_width(const char *s);

/* "80 GiB" (nearest GiB from 10 GiB up), "7.5 GiB", "512 MiB"; "" for 0 (unknown). */
void ctl_format_mib(uint64_t mib, char *buf, size_t n);
/* The first 12 characters of an id and "…" ("GPU-5a4b3c2d…", "MIG-0f1e2d3c…"), or the whole id
 * when it is that short: enough to tell the devices of one node apart in a table. */
void ctl_shorten_id(const char *id, char *buf, size_t n);

/* JSON pieces. ctl_json_string() writes a quoted escaped string, or null for NULL. */
void ctl_json_string(FILE *f, const char *s);
/* "key": and the separator before it when not first. */
void ctl_json_key(FILE *f, bool *first, const char *key);
void ctl_json_kv_string(FILE *f, bool *first, const char *key, const char *value);
/* Empty strings become null: "not known" has one spelling in our JSON. */
void ctl_json_kv_string_or_null(FILE *f, bool *first, const char *key, const char *value);
void ctl_json_kv_uint(FILE *f, bool *first, const char *key, uint64_t value);
void ctl_json_kv_int(FILE *f, bool *first, const char *key, int64_t value);
void ctl_json_kv_bool(FILE *f, bool *first, const char *key, bool value);
void ctl_json_kv_null(FILE *f, bool *first, const char *key);
