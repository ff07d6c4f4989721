/* SPDX-License-Identifier: MIT */
/* Owns NULL-terminated string arrays (strv): the one list type used for config lists and warnings. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "macro.h"

char **strv_free(char **l);
DEFINE_CLEANUP_FUNC(char **, strv_free);
#define _cleanup_strv_free_ _cleanup_(strv_freep)

size_t strv_length(char *const *l);
/* Appends a copy of s; returns 0 or -ENOMEM. */
int strv_extend(char ***l, const char *s);
/* Appends s itself (takes ownership even on failure). */
int strv_consume(char ***l, char *s);
int strv_extendf(char ***l, const char *fmt, ...) _printf_(2, 3);
char **strv_copy(char *const *l);
bool strv_contains(char *const *l, const char *s);
bool strv_equal(char *const *a, char *const *b);
void strv_sort(char **l);
/* Joins with sep; returns NULL on OOM. An empty or NULL list gives "". */
char *strv_join(char *const *l, const char *sep);

#define STRV_FOREACH(s, l) for (char *const *s = (l); s && *s; s++)

/* asprintf() that returns the string, NULL on OOM. */
char *strprintf(const char *fmt, ...) _printf_(1, 2);
