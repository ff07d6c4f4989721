/* SPDX-License-Identifier: MIT */
/* Owns the small set of helpers every file uses: cleanup attributes, ownership transfer, string
 * comparisons. Kept tiny on purpose (STYLE.md rule 8). */
#pragma once

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define _cleanup_(f) __attribute__((cleanup(f)))
#define _unused_ __attribute__((unused))
#define _printf_(a, b) __attribute__((format(printf, a, b)))
#define _noreturn_ __attribute__((noreturn))

#define ELEMENTSOF(x) (sizeof(x) / sizeof((x)[0]))

/* Hand a pointer over to a new owner and clear the old one, so a _cleanup_ does not free it. */
#define TAKE_PTR(p)                                                                                \
        ({                                                                                         \
                __typeof__(p) _p_ = (p);                                                           \
                (p) = NULL;                                                                        \
                _p_;                                                                               \
        })

#define TAKE_FD(fd)                                                                                \
        ({                                                                                         \
                int _fd_ = (fd);                                                                   \
                (fd) = -1;                                                                         \
                _fd_;                                                                              \
        })

/* Defines funcp(type *p) that calls func(*p) when *p is set; func may return anything. */
#define DEFINE_CLEANUP_FUNC(type, func)                                                            \
        static inline void func##p(type *p) {                                                      \
                if (*p)                                                                            \
                        func(*p);                                                                  \
        }

/* The same under a name of our own, for another library's func: DEFINE_CLEANUP_FUNC would name the
 * helper func##p, in that library's namespace (libkmod's kmod_module_unref##p), not in ours. */
#define DEFINE_CLEANUP_FUNC_NAMED(name, type, func)                                                \
        static inline void name(type *p) {                                                         \
                if (*p)                                                                            \
                        func(*p);                                                                  \
        }

static inline void freep(void *p) {
        free(*(void **) p);
}

static inline void closep(int *fd) {
        if (*fd >= 0)
                close(*fd);
}

static inline void fclosep(FILE **f) {
        if (*f)
                fclose(*f);
}

static inline void closedirp(DIR **d) {
        if (*d)
                closedir(*d);
}

#define _cleanup_free_ _cleanup_(freep)
#define _cleanup_close_ _cleanup_(closep)
#define _cleanup_fclose_ _cleanup_(fclosep)
#define _cleanup_closedir_ _cleanup_(closedirp)

static inline bool streq(const char *a, const char *b) {
        return strcmp(a, b) == 0;
}

static inline bool streq_ptr(const char *a, const char *b) {
        if (!a || !b)
                return a == b;
        return strcmp(a, b) == 0;
}

static inline bool startswith(const char *s, const char *prefix) {
        return strncmp(s, prefix, strlen(prefix)) == 0;
}

static inline bool isempty(const char *s) {
        return !s || !*s;
}

static inline const char *strna(const char *s) {
        return s ?: "n/a";
}

/* libc calls that return -1 and set errno become a negative errno right where they are made. */
static inline int negative_errno(void) {
        return errno > 0 ? -errno : -EIO;
}

#define USEC_PER_SEC UINT64_C(1000000)
#define USEC_PER_MSEC UINT64_C(1000)

static inline void *mfree(void *p) {
        free(p);
        return NULL;
}
