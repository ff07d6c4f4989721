/* SPDX-License-Identifier: MIT */
/* Owns the helpers declared in fileio.h: file operations relative to directory fds that never follow
 * a symlink below the directory they were given. */
#include <ctype.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdint.h>
#include <sys/random.h>
#include <sys/stat.h>

#include "fileio.h"
#include "macro.h"
#include "strv.h"

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

int open_dir_nofollow(int dir_fd, const char *name) {
        int fd = openat(dir_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd >= 0)
                return fd;
        int r = negative_errno();
        /* O_NOFOLLOW|O_DIRECTORY on a symlink gives ENOTDIR on some kernels, ELOOP on others. */
        struct stat st;
        if ((r == -ENOTDIR || r == -ELOOP) && fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) >= 0)
                return S_ISLNK(st.st_mode) ? -ELOOP : -ENOTDIR;
        return r;
}

int open_private_subdir(int dir_fd, const char *name, bool create) {
        struct stat st;

        if (create && mkdirat(dir_fd, name, 0755) < 0 && errno != EEXIST)
                return negative_errno();
        _cleanup_close_ int fd = open_dir_nofollow(dir_fd, name);
        if (fd < 0)
                return fd;
        if (fstat(fd, &st) < 0)
                return negative_errno();
        if (st.st_uid != geteuid() || (st.st_mode & 0022))
                return -EPERM;
        return TAKE_FD(fd);
}

static bool temp_suffix_is_valid(const char *s) {
        if (strlen(s) != 6)
                return false;
        for (; *s; s++)
                if (!isalnum((unsigned char) *s))
                        return false;
        return true;
}

int cleanup_temp_files_at(int dir_fd, const char *prefix) {
        _cleanup_close_ int fd = openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
                return negative_errno();
        _cleanup_closedir_ DIR *d = fdopendir(fd);
        if (!d)
                return negative_errno();
        fd = -1; /* owned by d now */
        int n = 0, r = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
                struct stat st;
                if (!startswith(de->d_name, prefix) || !temp_suffix_is_valid(de->d_name + strlen(prefix)))
                        continue;
                if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode) ||
                    st.st_uid != geteuid())
                        continue;
                if (unlinkat(dirfd(d), de->d_name, 0) < 0) {
                        if (errno != ENOENT && r == 0)
                                r = negative_errno();
                        continue;
                }
                n++;
        }
        return r < 0 ? r : n;
}

/* Creates "<prefix>XXXXXX" in dir_fd with O_EXCL|O_NOFOLLOW; the name is written to tmp (7 bytes more
 * than prefix). */
static int create_temp_at(int dir_fd, const char *prefix, char *tmp, size_t tmp_size) {
        static const char alphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

        for (unsigned attempt = 0; attempt < 100; attempt++) {
                uint8_t rnd[6];
                char suffix[7];
                if (getrandom(rnd, sizeof rnd, 0) != (ssize_t) sizeof rnd)
                        return errno > 0 ? negative_errno() : -EIO;
                for (size_t i = 0; i < 6; i++)
                        suffix[i] = alphabet[rnd[i] % (sizeof alphabet - 1)];
                suffix[6] = 0;
                if ((size_t) snprintf(tmp, tmp_size, "%s%s", prefix, suffix) >= tmp_size)
                        return -ENAMETOOLONG;
                int fd = openat(dir_fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY, 0600);
                if (fd >= 0)
                        return fd;
                if (errno != EEXIST)
                        return negative_errno();
        }
        return -EEXIST;
}

int write_file_atomic(const char *path, const char *tmp_subdir, const void *data, size_t size, mode_t mode) {
        _cleanup_free_ char *copy = strdup(path), *dcopy = strdup(path), *prefix = NULL, *tmp = NULL;
        _cleanup_close_ int dir_fd = -1, tmp_dir_fd = -1, fd = -1;
        int r;

        if (!copy || !dcopy)
                return -ENOMEM;
        if (tmp_subdir && (strchr(tmp_subdir, '/') || isempty(tmp_subdir)))
                return -EINVAL;
        const char *name = basename(copy);
        if (isempty(name))
                return -EINVAL;

        /* The target's directory is configuration and may be a symlink; what lies inside it is not. */
        dir_fd = open(dirname(dcopy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir_fd < 0)
                return negative_errno();
        if (tmp_subdir) {
                tmp_dir_fd = open_private_subdir(dir_fd, tmp_subdir, true);
                if (tmp_dir_fd < 0)
                        return tmp_dir_fd;
                prefix = strprintf("%s.", name);
        } else
                prefix = strprintf(".%s.", name);
        if (!prefix)
                return -ENOMEM;
        int tfd = tmp_subdir ? tmp_dir_fd : dir_fd;

        size_t tmp_size = strlen(prefix) + 7;
        tmp = malloc(tmp_size);
        if (!tmp)
                return -ENOMEM;
        fd = create_temp_at(tfd, prefix, tmp, tmp_size);
        if (fd < 0)
                return fd;

        r = write_all(fd, data, size);
        if (r >= 0 && fchmod(fd, mode) < 0)
                r = negative_errno();
        if (r >= 0 && fsync(fd) < 0)
                r = negative_errno();
        if (r >= 0 && renameat(tfd, tmp, dir_fd, name) < 0)
                r = negative_errno();
        if (r < 0) {
                (void) unlinkat(tfd, tmp, 0);
                return r;
        }
        if (fsync(dir_fd) < 0)
                return negative_errno();
        return 0;
}

int read_full_file_at(int dir_fd, const char *path, ReadFileFlags flags, size_t max_size, char **ret,
                      size_t *ret_size) {
        _cleanup_free_ char *buf = NULL;
        size_t n = 0, cap = 0;
        struct stat st;

        /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer. */
        _cleanup_close_ int fd = openat(dir_fd, path,
                                        O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK |
                                                ((flags & READ_FILE_NOFOLLOW) ? O_NOFOLLOW : 0));
        if (fd < 0)
                return negative_errno();
        if (fstat(fd, &st) < 0)
                return negative_errno();
        if (S_ISDIR(st.st_mode))
                return -EISDIR;
        if (!S_ISREG(st.st_mode))
                return -EBADFD;
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

int read_full_file(const char *path, size_t max_size, char **ret, size_t *ret_size) {
        return read_full_file_at(AT_FDCWD, path, 0, max_size, ret, ret_size);
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

int write_file_atomic_mkdir(const char *path, const void *data, size_t size, mode_t mode) {
        _cleanup_free_ char *dir = strdup(path);
        int r;

        if (!dir)
                return -ENOMEM;
        char *slash = strrchr(dir, '/');
        if (slash && slash != dir) {
                *slash = '\0';
                r = mkdir_p(dir, 0755);
                if (r < 0)
                        return r;
        }
        return write_file_atomic(path, NULL, data, size, mode);
}
