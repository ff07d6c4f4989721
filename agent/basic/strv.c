/* SPDX-License-Identifier: MIT */
/* Owns the strv helpers declared in strv.h. */
#include <stdarg.h>

#include "strv.h"

char **strv_free(char **l) {
        if (!l)
                return NULL;
        for (char **s = l; *s; s++)
                free(*s);
        free(l);
        return NULL;
}

size_t strv_length(char *const *l) {
        size_t n = 0;
        while (l && l[n])
                n++;
        return n;
}

int strv_consume(char ***l, char *s) {
        if (!s)
                return -ENOMEM;
        size_t n = strv_length(*l);
        char **t = realloc(*l, sizeof(char *) * (n + 2));
        if (!t) {
                free(s);
                return -ENOMEM;
        }
        t[n] = s;
        t[n + 1] = NULL;
        *l = t;
        return 0;
}

int strv_extend(char ***l, const char *s) {
        return strv_consume(l, strdup(s));
}

int strv_extendf(char ***l, const char *fmt, ...) {
        va_list ap;
        char *s = NULL;
        int r;

        va_start(ap, fmt);
        r = vasprintf(&s, fmt, ap);
        va_end(ap);
        if (r < 0)
                return -ENOMEM;
        return strv_consume(l, s);
}

char **strv_copy(char *const *l) {
        size_t n = strv_length(l);
        char **c = calloc(n + 1, sizeof(char *));
        if (!c)
                return NULL;
        for (size_t i = 0; i < n; i++) {
                c[i] = strdup(l[i]);
                if (!c[i])
                        return strv_free(c);
        }
        return c;
}

bool strv_contains(char *const *l, const char *s) {
        STRV_FOREACH(i, l)
                if (streq(*i, s))
                        return true;
        return false;
}

bool strv_equal(char *const *a, char *const *b) {
        size_t n = strv_length(a);
        if (n != strv_length(b))
                return false;
        for (size_t i = 0; i < n; i++)
                if (!streq(a[i], b[i]))
                        return false;
        return true;
}

static int cmp_str(const void *a, const void *b) {
        return strcmp(*(char *const *) a, *(char *const *) b);
}

void strv_sort(char **l) {
        size_t n = strv_length(l);
        if (n > 1)
                qsort(l, n, sizeof(char *), cmp_str);
}

char *strv_join(char *const *l, const char *sep) {
        size_t k = strlen(sep), len = 0;
        STRV_FOREACH(s, l)
                len += strlen(*s) + k;
        char *r = malloc(len + 1), *p = r;
        if (!r)
                return NULL;
        *p = 0;
        STRV_FOREACH(s, l) {
                if (s != l) {
                        memcpy(p, sep, k);
                        p += k;
                }
                size_t m = strlen(*s);
                memcpy(p, *s, m);
                p += m;
        }
        *p = 0;
        return r;
}

char *strprintf(const char *fmt, ...) {
        va_list ap;
        char *s = NULL;

        va_start(ap, fmt);
        if (vasprintf(&s, fmt, ap) < 0)
                s = NULL;
        va_end(ap);
        return s;
}
