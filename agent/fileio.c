/* SPDX-License-Identifier: MIT */
/* Owns the helpers declared in fileio.h. */
#include <ctype.h>
#include <fcntl.h>
#include <libgen.h>
#include <sys/stat.h>

#include "fileio.h"
#include "macro.h"

char *path_join(const char *a, const char *b) {
        char *r;
        size_t la = strlen(a);

        while (la > 1 && a[la - 1] == '/')
                la--;
        while (*b == '/')
                b++;
        if (asprintf(&r, "%.*s%s%s", (int) la, a, (la == 1 && a[0] == '/') || !*b ? "" : "/", b) < 0)
                return NULL;
        return r;
}

char *strstrip_trailing(char *s) {
        size_t n = strlen(s);
        while (n > 0 && isspace((unsigned char) s[n - 1]))
                s[--n] = 0;
        return s;
}

int mkdir_p(const char *path, mode_t mode) {
        _cleanup_free_ char *p = strdup(path);
        if (!p)
                return -ENOMEM;
        for (char *s = p + 1; *s; s++) {
                if (*s != '/')
                        continue;
                *s = 0;
                if (mkdir(p, mode) < 0 && errno != EEXIST)
                        return negative_errno();
                *s = '/';
        }
        if (mkdir(p, mode) < 0 && errno != EEXIST)
                return negative_errno();
        return 0;
}

int fsync_parent_dir(const char *path) {
        _cleanup_free_ char *p = strdup(path);
        if (!p)
                return -ENOMEM;
        _cleanup_close_ int fd = open(dirname(p), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
                return negative_errno();
        if (fsync(fd) < 0)
                return negative_errno();
        return 0;
}

static int write_all(int fd, const void *data, size_t size) {
        const char *p = data;
        while (size > 0) {
                ssize_t k = write(fd, p, size);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return negative_errno();
                }
                p += k;
                size -= (size_t) k;
        }
        return 0;
}

int write_file_atomic(const char *path, const char *tmp_dir, const void *data, size_t size, mode_t mode) {
        _cleanup_free_ char *copy = strdup(path), *tmp = NULL;
        int r;

        if (!copy)
                return -ENOMEM;
        if (tmp_dir) {
                r = mkdir_p(tmp_dir, 0755);
                if (r < 0)
                        return r;
                r = asprintf(&tmp, "%s/%s.XXXXXX", tmp_dir, basename(copy));
        } else {
                _cleanup_free_ char *d = strdup(path);
                if (!d)
                        return -ENOMEM;
                r = asprintf(&tmp, "%s/.%s.XXXXXX", dirname(d), basename(copy));
        }
        if (r < 0)
                return -ENOMEM;

        _cleanup_close_ int fd = mkostemp(tmp, O_CLOEXEC);
        if (fd < 0)
                return negative_errno();

        r = write_all(fd, data, size);
        if (r >= 0 && fchmod(fd, mode) < 0)
                r = negative_errno();
        if (r >= 0 && fsync(fd) < 0)
                r = negative_errno();
        if (r >= 0 && rename(tmp, path) < 0)
                r = negative_errno();
        if (r < 0) {
                (void) unlink(tmp);
                return r;
        }
        return fsync_parent_dir(path);
}

int read_full_file(const char *path, size_t max_size, char **ret, size_t *ret_size) {
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
        _cleanup_free_ char *buf = NULL;
        size_t n = 0, cap = 0;

        if (fd < 0)
                return negative_errno();
        for (;;) {
                if (cap - n < 4096) {
                        cap = cap ? cap * 2 : 8192;
                        char *t = realloc(buf, cap + 1);
                        if (!t)
                                return -ENOMEM;
                        buf = t;
                }
                ssize_t k = read(fd, buf + n, cap - n);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return negative_errno();
                }
                if (k == 0)
                        break;
                n += (size_t) k;
                if (n > max_size)
                        return -EFBIG;
        }
        if (!buf && !(buf = malloc(1)))
                return -ENOMEM;
        buf[n] = 0;
        *ret = TAKE_PTR(buf);
        if (ret_size)
                *ret_size = n;
        return 0;
}

int read_one_line_file(const char *path, char **ret) {
        char *s;
        int r = read_full_file(path, 1 << 20, &s, NULL);
        if (r < 0)
                return r;
        s[strcspn(s, "\n")] = 0;
        *ret = strstrip_trailing(s);
        return 0;
}

int write_string_file(const char *path, const char *s) {
        _cleanup_close_ int fd = open(path, O_WRONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0)
                return negative_errno();
        int r = write_all(fd, s, strlen(s));
        if (r < 0)
                return r;
        return write_all(fd, "\n", 1);
}
