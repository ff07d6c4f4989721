/* SPDX-License-Identifier: MIT */
/* Owns the MIG devices' nvidia-caps minors for the CDI builder: parsing
 * <proc>/driver/nvidia-caps/mig-minors into a sorted table, keeping that table for as long as the file
 * stays the same file, and looking a GI's or CI's access minor up in it. See cdi-internal.h. */
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cdi-internal.h"
#include "fileio.h"
#include "macro.h"

static int mig_minor_cmp(const void *a, const void *b) {
        const MigMinor *x = a, *y = b;

        if (x->gpu != y->gpu)
                return x->gpu < y->gpu ? -1 : 1;
        if (x->gi != y->gi)
                return x->gi < y->gi ? -1 : 1;
        return x->ci < y->ci ? -1 : x->ci > y->ci;
}

/* Decimal digits at *p, below UINT_MAX (which stands for "no CI"); advances *p. */
static bool parse_uint(const char **p, unsigned *ret) {
        const char *s = *p;
        unsigned long v = 0;

        if (!isdigit((unsigned char) *s))
                return false;
        for (; isdigit((unsigned char) *s); s++) {
                v = v * 10 + (unsigned long) (*s - '0');
                if (v >= UINT_MAX)
                        return false;
        }
        *p = s;
        *ret = (unsigned) v;
        return true;
}

static bool skip(const char **p, const char *word) {
        size_t n = strlen(word);

        if (strncmp(*p, word, n) != 0)
                return false;
        *p += n;
        return true;
}

/* One line (up to '\n' or the end); false for lines that are not a GI's or CI's access minor. */
static bool parse_mig_minor_line(const char *l, MigMinor *ret) {
        MigMinor m = { .ci = MIG_MINOR_GI };

        if (!skip(&l, "gpu") || !parse_uint(&l, &m.gpu) || !skip(&l, "/gi") || !parse_uint(&l, &m.gi))
                return false;
        if (skip(&l, "/ci") && !parse_uint(&l, &m.ci))
                return false;
        if (!skip(&l, "/access") || (*l != ' ' && *l != '\t'))
                return false;
        l += strspn(l, " \t");
        if (!parse_uint(&l, &m.minor))
                return false;
        l += strspn(l, " \t\r");
        if (*l != '\n' && *l != 0)
                return false;
        *ret = m;
        return true;
}

/* Other lines ("config 1", "monitor 2", whatever a later driver adds) are not ours and are skipped. */
static int mig_minors_parse(const char *text, MigMinors *ret) {
        size_t n = 0, lines = 1;
        bool sorted = true;

        for (const char *l = strchr(text, '\n'); l; l = strchr(l + 1, '\n'))
                lines++;
        _cleanup_free_ MigMinor *v = calloc(lines, sizeof(MigMinor));
        if (!v)
                return -ENOMEM;
        for (const char *l = text; *l; l += strcspn(l, "\n"), l += *l == '\n')
                if (parse_mig_minor_line(l, &v[n])) {
                        sorted = sorted && (n == 0 || mig_minor_cmp(&v[n - 1], &v[n]) < 0);
                        n++;
                }
        /* The driver writes them in this order already; sorting is for a file that is not. */
        if (!sorted)
                qsort(v, n, sizeof(MigMinor), mig_minor_cmp);
        *ret = (MigMinors) { .v = TAKE_PTR(v), .n = n };
        return 0;
}

/* The table of the last build and the file it came from. The agent builds the spec after every NVML read,
 * and the driver only ever recreates this file along with the module; a file replaced or rewritten has
 * another inode, size or change time. */
struct CdiMigMinorsCache {
        char *path;
        struct stat st;
        MigMinors minors;
};

CdiMigMinorsCache *cdi_mig_minors_cache_free(CdiMigMinorsCache *c) {
        if (!c)
                return NULL;
        free(c->path);
        free(c->minors.v);
        free(c);
        return NULL;
}

static bool same_file(const struct stat *a, const struct stat *b) {
        return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
               a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec &&
               a->st_ctim.tv_sec == b->st_ctim.tv_sec && a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

int cdi_mig_minors_read(CdiMigMinorsCache **cache, const char *proc, const MigMinors **ret) {
        static const MigMinors none = {};
        CdiMigMinorsCache *c;
        _cleanup_free_ char *p = path_join(proc, "driver/nvidia-caps/mig-minors"), *text = NULL;
        MigMinors parsed = {};
        struct stat st;
        int r;

        if (!p)
                return -ENOMEM;
        *ret = &none;
        if (stat(p, &st) < 0)
                return errno == ENOENT ? 0 : negative_errno();
        if (!*cache && !(*cache = calloc(1, sizeof(CdiMigMinorsCache))))
                return -ENOMEM;
        c = *cache;
        if (streq_ptr(c->path, p) && same_file(&c->st, &st)) {
                *ret = &c->minors;
                return 0;
        }

        r = read_full_file(p, 16 * 1024 * 1024, &text, NULL);
        if (r < 0)
                return r == -ENOENT ? 0 : r;
        r = mig_minors_parse(text, &parsed);
        if (r < 0)
                return r;
        free(c->path);
        free(c->minors.v);
        c->path = TAKE_PTR(p);
        c->st = st;
        c->minors = parsed;
        *ret = &c->minors;
        return 0;
}

const MigMinor *cdi_mig_minor_find(const MigMinors *t, unsigned gpu, unsigned gi, unsigned ci) {
        const MigMinor key = { .gpu = gpu, .gi = gi, .ci = ci };

        return t->n > 0 ? bsearch(&key, t->v, t->n, sizeof(MigMinor), mig_minor_cmp) : NULL;
}
