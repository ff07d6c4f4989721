/* SPDX-License-Identifier: MIT */
/* Owns the output helpers declared in ctl-output.h. */
#include <inttypes.h>
#include <unistd.h>

#include "ctl-output.h"
#include "macro.h"

bool ctl_colors_enabled(void) {
        const char *no_color = getenv("NO_COLOR"), *term = getenv("TERM");

        return isatty(STDOUT_FILENO) && isempty(no_color) && !streq_ptr(term, "dumb");
}

const char *ctl_ansi(const char *seq) {
        return ctl_colors_enabled() ? seq : "";
}

int ctl_table_new(CtlTable **ret, size_t n_columns, const char *const *header) {
        CtlTable *t = calloc(1, sizeof(*t));
        int r;

        if (!t)
                return -ENOMEM;
        t->n_columns = n_columns;
        r = ctl_table_add_row(t, header);
        if (r < 0) {
                ctl_table_free(t);
                return r;
        }
        *ret = t;
        return 0;
}

CtlTable *ctl_table_free(CtlTable *t) {
        if (!t)
                return NULL;
        for (size_t i = 0; i < t->n_rows * t->n_columns; i++)
                free(t->cells[i]);
        free(t->cells);
        free(t->colors);
        for (size_t i = 0; t->notes && i < t->n_rows; i++)
                free(t->notes[i]);
        free(t->notes);
        free(t);
        return NULL;
}

int ctl_table_add_row(CtlTable *t, const char *const *cells) {
        size_t n = (t->n_rows + 1) * t->n_columns, base = t->n_rows * t->n_columns;
        char **c = realloc(t->cells, n * sizeof(char *));
        if (!c)
                return -ENOMEM;
        t->cells = c;
        const char **col = realloc(t->colors, n * sizeof(char *));
        if (!col)
                return -ENOMEM;
        t->colors = col;
        char **notes = realloc(t->notes, (t->n_rows + 1) * sizeof(char *));
        if (!notes)
                return -ENOMEM;
        t->notes = notes;
        t->notes[t->n_rows] = NULL;

        for (size_t i = 0; i < t->n_columns; i++) {
                t->colors[base + i] = NULL;
                t->cells[base + i] = strdup(isempty(cells[i]) ? "-" : cells[i]);
                if (!t->cells[base + i]) {
                        for (size_t j = 0; j < i; j++)
                                free(t->cells[base + j]);
                        return -ENOMEM;
                }
        }
        t->n_rows++;
        return 0;
}

void ctl_table_set_color(CtlTable *t, size_t column, const char *seq) {
        if (t->n_rows > 0 && column < t->n_columns)
                t->colors[(t->n_rows - 1) * t->n_columns + column] = seq;
}

int ctl_table_add_note(CtlTable *t, const char *line) {
        char **note, *n;

        if (t->n_rows == 0)
                return -EINVAL;
        note = &t->notes[t->n_rows - 1];
        if (asprintf(&n, "%s%s%s", *note ?: "", *note ? "\n" : "", line) < 0)
                return -ENOMEM;
        free(*note);
        *note = n;
        return 0;
}

size_t ctl_utf8_width(const char *s) {
        size_t n = 0;
        for (; *s; s++)
                if (((unsigned char) *s & 0xc0) != 0x80)
                        n++;
        return n;
}

void ctl_table_print(const CtlTable *t, FILE *f, bool header) {
        size_t width[t->n_columns];

        for (size_t c = 0; c < t->n_columns; c++) {
                width[c] = 0;
                for (size_t r = header ? 0 : 1; r < t->n_rows; r++) {
                        size_t w = ctl_utf8_width(t->cells[r * t->n_columns + c]);
                        if (w > width[c])
                                width[c] = w;
                }
        }

        for (size_t r = header ? 0 : 1; r < t->n_rows; r++) {
                for (size_t c = 0; c < t->n_columns; c++) {
                        const char *cell = t->cells[r * t->n_columns + c];
                        const char *color = r == 0 ? ANSI_BOLD : t->colors[r * t->n_columns + c];
                        bool last = c + 1 == t->n_columns;

                        fprintf(f, "%s%s%s", color ? ctl_ansi(color) : "", cell, color ? ctl_ansi(ANSI_NORMAL) : "");
                        /* No trailing blanks: the last column is not padded. */
                        if (!last)
                                fprintf(f, "%*s", (int) (width[c] - ctl_utf8_width(cell) + 1), "");
                }
                fputc('\n', f);
                if (t->notes[r])
                        fprintf(f, "%s\n", t->notes[r]);
        }
}

void ctl_format_mib(uint64_t mib, char *buf, size_t n) {
        if (mib == 0)
                snprintf(buf, n, "%s", "");
        else if (mib < 1024)
                snprintf(buf, n, "%" PRIu64 " MiB", mib);
        else if (mib < 10 * 1024) {
                uint64_t tenths = (mib * 10 + 512) / 1024;  /* rounded: 7680 MiB is "7.5 GiB" */
                snprintf(buf, n, "%" PRIu64 ".%" PRIu64 " GiB", tenths / 10, tenths % 10);
        } else
                /* Boards advertise a round size the driver never reports in full (81559 MiB on an
                 * "80GB" H100): the nearest GiB is what a person recognises. */
                snprintf(buf, n, "%" PRIu64 " GiB", (mib + 512) / 1024);
}

void ctl_shorten_id(const char *id, char *buf, size_t n) {
        if (!id || ctl_utf8_width(id) <= 13)
                snprintf(buf, n, "%s", id ?: "");
        else
                snprintf(buf, n, "%.12s…", id);
}

void ctl_json_string(FILE *f, const char *s) {
        if (!s) {
                fputs("null", f);
                return;
        }
        fputc('"', f);
        for (const unsigned char *p = (const unsigned char *) s; *p; p++)
                switch (*p) {
                case '"':
                        fputs("\\\"", f);
                        break;
                case '\\':
                        fputs("\\\\", f);
                        break;
                case '\n':
                        fputs("\\n", f);
                        break;
                case '\t':
                        fputs("\\t", f);
                        break;
                case '\r':
                        fputs("\\r", f);
                        break;
                default:
                        if (*p < 0x20 || *p == 0x7f)
                                fprintf(f, "\\u%04x", *p);
                        else
                                fputc(*p, f);
                }
        fputc('"', f);
}

void ctl_json_key(FILE *f, bool *first, const char *key) {
        if (!*first)
                fputc(',', f);
        *first = false;
        ctl_json_string(f, key);
        fputc(':', f);
}

void ctl_json_kv_string(FILE *f, bool *first, const char *key, const char *value) {
        ctl_json_key(f, first, key);
        ctl_json_string(f, value);
}

void ctl_json_kv_string_or_null(FILE *f, bool *first, const char *key, const char *value) {
        ctl_json_kv_string(f, first, key, isempty(value) ? NULL : value);
}

void ctl_json_kv_uint(FILE *f, bool *first, const char *key, uint64_t value) {
        ctl_json_key(f, first, key);
        fprintf(f, "%" PRIu64, value);
}

void ctl_json_kv_int(FILE *f, bool *first, const char *key, int64_t value) {
        ctl_json_key(f, first, key);
        fprintf(f, "%" PRIi64, value);
}

void ctl_json_kv_bool(FILE *f, bool *first, const char *key, bool value) {
        ctl_json_key(f, first, key);
        fputs(value ? "true" : "false", f);
}

void ctl_json_kv_null(FILE *f, bool *first, const char *key) {
        ctl_json_key(f, first, key);
        fputs("null", f);
}
