/* SPDX-License-Identifier: MIT */
/* Owns what the fuzzers in this folder share: a scratch directory per process (made once, emptied per
 * input), writing and removing files in it, and splitting an input into parts. */
#pragma once

#include <ctype.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <sys/stat.h>

#include "fileio.h"
#include "log.h"
#include "macro.h"
#include "strv.h"

/* Parts of one input are separated by this line; a fuzzer reads up to n parts from it. */
#define FUZZ_SEPARATOR "\n--8<--\n"

static inline const char *fuzz_scratch(void) {
        static char dir[64];
        if (!dir[0]) {
                snprintf(dir, sizeof dir, "/tmp/gna-fuzz-XXXXXX");
                if (!mkdtemp(dir))
                        abort();
                log_set_max_level(LOG_EMERG); /* keep libFuzzer's output readable */
        }
        return dir;
}

static inline int fuzz_rm_one(const char *p, const struct stat *st, int flag, struct FTW *w) {
        (void) st;
        (void) flag;
        (void) w;
        (void) remove(p);
        return 0;
}

/* Empties dir (keeps dir itself). */
static inline void fuzz_clean(const char *dir) {
        _cleanup_closedir_ DIR *d = opendir(dir);
        struct dirent *de;
        while (d && (de = readdir(d))) {
                if (streq(de->d_name, ".") || streq(de->d_name, ".."))
                        continue;
                _cleanup_free_ char *p = path_join(dir, de->d_name);
                if (p)
                        (void) nftw(p, fuzz_rm_one, 16, FTW_DEPTH | FTW_PHYS);
        }
}

static inline void fuzz_write(const char *path, const void *data, size_t size) {
        _cleanup_close_ int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd < 0)
                return;
        if (size > 0 && write(fd, data, size) < 0)
                return;
}

/* The i-th part of data (0-based), NUL-terminated in a new buffer; NULL when there are fewer parts. */
static inline char *fuzz_part(const uint8_t *data, size_t size, unsigned i, size_t *ret_size) {
        const char *p = (const char *) data, *end = p + size;
        size_t sl = strlen(FUZZ_SEPARATOR);
        for (unsigned k = 0; k < i; k++) {
                const char *s = memmem(p, (size_t) (end - p), FUZZ_SEPARATOR, sl);
                if (!s)
                        return NULL;
                p = s + sl;
        }
        const char *s = memmem(p, (size_t) (end - p), FUZZ_SEPARATOR, sl);
        size_t n = s ? (size_t) (s - p) : (size_t) (end - p);
        char *r = malloc(n + 1);
        if (!r)
                return NULL;
        memcpy(r, p, n);
        r[n] = 0;
        if (ret_size)
                *ret_size = n;
        return r;
}
