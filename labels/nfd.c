/* SPDX-License-Identifier: MIT */
/* Owns the Node Feature Discovery "local" source feature file: its text (header, optional expiry
 * directive, sorted validated labels) and the atomic, no-churn write through a hidden subdirectory of
 * features.d (see README.md, "Labels"). */
#include <fcntl.h>
#include <libgen.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <time.h>

#include "fileio.h"
#include "nfd.h"
#include "strv.h"

/* NFD skips feature files over this size entirely; ours is a few hundred bytes. */
#define NFD_FILE_SIZE_MAX 65536

#define NFD_HEADER "# Written by gpu-node-agent; do not edit (regenerated on change).\n"

int nfd_format(const LabelSet *s, uint64_t expiry_realtime_usec, char **ret) {
        _cleanup_free_ char *buf = NULL;
        size_t size = 0;
        _cleanup_fclose_ FILE *f = open_memstream(&buf, &size);

        if (!f)
                return -ENOMEM;

        fputs(NFD_HEADER, f);
        if (expiry_realtime_usec > 0) {
                /* NFD parses the directive with RFC 3339 and applies it to the lines that follow. */
                time_t t = (time_t) (expiry_realtime_usec / USEC_PER_SEC);
                struct tm tm;
                char when[64];
                if (!gmtime_r(&t, &tm) || strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
                        return -EINVAL;
                fprintf(f, "# +expiry-time=%s\n", when);
        }

        /* The set is kept sorted; checking costs nothing and keeps the file's order a promise. */
        for (size_t i = 0; s && i < s->n; i++) {
                const Label *l = &s->labels[i];
                if (!label_key_is_valid(l->key) || !label_value_is_valid(l->value))
                        return -EINVAL;
                if (i > 0 && strcmp(s->labels[i - 1].key, l->key) >= 0)
                        return -EINVAL;
                fprintf(f, "%s=%s\n", l->key, l->value);
        }

        if (fflush(f) != 0 || ferror(f))
                return -ENOMEM;
        f = (fclose(f), NULL);
        if (size > NFD_FILE_SIZE_MAX)
                return -EFBIG;
        *ret = TAKE_PTR(buf);
        return 0;
}

_printf_(3, 4) static int fail(char **ret_error, int r, const char *fmt, ...) {
        if (ret_error) {
                va_list ap;
                va_start(ap, fmt);
                if (vasprintf(ret_error, fmt, ap) < 0)
                        *ret_error = NULL;
                va_end(ap);
        }
        return r;
}

static bool file_name_is_valid(const char *name) {
        /* NFD reads the regular files directly in features.d and skips dot-files. */
        return !isempty(name) && !strchr(name, '/') && name[0] != '.';
}

/* Makes sure dir is a directory, creating it when only the last component is missing: NFD may not be
 * deployed yet, but a missing parent means labels.directory points somewhere unexpected. */
static int ensure_directory(const char *dir, char **ret_error) {
        struct stat st;

        if (stat(dir, &st) >= 0) {
                if (!S_ISDIR(st.st_mode))
                        return fail(ret_error, -ENOTDIR,
                                    "The NFD feature directory %s is not a directory; remove it or set "
                                    "labels.directory to NFD's features.d directory.", dir);
                return 0;
        }
        if (errno != ENOENT)
                return fail(ret_error, negative_errno(), "Cannot access the NFD feature directory %s: %s.",
                            dir, strerror(errno));

        _cleanup_free_ char *copy = strdup(dir);
        if (!copy)
                return -ENOMEM;
        const char *parent = dirname(copy);
        if (stat(parent, &st) < 0 || !S_ISDIR(st.st_mode))
                return fail(ret_error, -ENOENT,
                            "The NFD feature directory %s does not exist, nor does its parent %s; "
                            "create %s (or deploy Node Feature Discovery), or set labels.directory to "
                            "the features.d directory NFD reads.", dir, parent, dir);

        if (mkdir(dir, 0755) < 0 && errno != EEXIST)
                return fail(ret_error, negative_errno(),
                            "Cannot create the NFD feature directory %s: %s; create it or set "
                            "labels.directory to a writable directory.", dir, strerror(errno));
        (void) fsync_parent_dir(dir);
        return 0;
}

static const char *kind_of(mode_t mode) {
        return S_ISDIR(mode) ? "a directory" : S_ISLNK(mode) ? "a symbolic link" : "a special file";
}

/* Removes the temp files a writer killed between create and rename left in the hidden directory
 * <dir>/.<name>, when that is a directory of ours; anything else there stays. */
static void cleanup_hidden(int dir_fd, const char *name) {
        _cleanup_free_ char *dot = strprintf(".%s", name), *prefix = strprintf("%s.", name);
        if (!dot || !prefix)
                return;
        _cleanup_close_ int fd = open_private_subdir(dir_fd, dot, false);
        if (fd >= 0)
                (void) cleanup_temp_files_at(fd, prefix);
}

int nfd_write(const char *dir, const char *name, const char *text, bool *ret_changed, char **ret_error) {
        size_t size = strlen(text);
        struct stat st;
        int r;

        *ret_changed = false;

        if (!file_name_is_valid(name))
                return fail(ret_error, -EINVAL,
                            "Invalid NFD feature file name '%s': it must be a plain file name without '/' "
                            "that does not start with '.' (NFD skips dot-files); fix labels.file.", name);

        _cleanup_free_ char *target = path_join(dir, name), *hidden = strprintf("%s/.%s", dir, name),
                            *dot = strprintf(".%s", name);
        if (!target || !hidden || !dot)
                return -ENOMEM;

        if (size > NFD_FILE_SIZE_MAX)
                return fail(ret_error, -EFBIG,
                            "The NFD feature file %s would be %zu bytes, over the %d bytes NFD reads (it "
                            "would skip the whole file); not writing it.", target, size, NFD_FILE_SIZE_MAX);

        r = ensure_directory(dir, ret_error);
        if (r < 0)
                return r;

        /* features.d itself is configuration (and may be a symlink); everything in it is looked at
         * relative to its fd and never through a symlink. */
        _cleanup_close_ int dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir_fd < 0)
                return fail(ret_error, negative_errno(), "Cannot open the NFD feature directory %s: %s.", dir,
                            strerror(errno));

        /* A plain file in the way makes the write below fail with ENOTDIR, and says so. */
        if (fstatat(dir_fd, dot, &st, AT_SYMLINK_NOFOLLOW) >= 0 &&
            (S_ISLNK(st.st_mode) || (S_ISDIR(st.st_mode) && (st.st_uid != geteuid() || (st.st_mode & 0022)))))
                return fail(ret_error, S_ISLNK(st.st_mode) ? -ELOOP : -EPERM,
                            "Refusing to use %s for the NFD feature file's temporary files: it is %s, not "
                            "a directory gpu-node-agent created (owned by uid %u, not writable by others); "
                            "remove it.", hidden, S_ISLNK(st.st_mode) ? "a symbolic link" : "a directory",
                            (unsigned) geteuid());
        cleanup_hidden(dir_fd, name);

        if (fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) >= 0) {
                if (!S_ISREG(st.st_mode))
                        return fail(ret_error, S_ISDIR(st.st_mode) ? -EISDIR : -EEXIST,
                                    "%s is %s, not a regular file, so NFD ignores it and the labels "
                                    "cannot be written there; remove it or set labels.file to another "
                                    "name.", target, kind_of(st.st_mode));

                /* No churn: NFD re-reads the file on every inotify event and the node object is
                 * updated on every change, so unchanged labels are not rewritten. */
                _cleanup_free_ char *old = NULL;
                size_t old_size = 0;
                if (read_full_file_at(dir_fd, name, READ_FILE_NOFOLLOW, NFD_FILE_SIZE_MAX, &old, &old_size) >= 0 &&
                    old_size == size && memcmp(old, text, size) == 0)
                        return 0;
        } else if (errno != ENOENT)
                return fail(ret_error, negative_errno(), "Cannot access the NFD feature file %s: %s.",
                            target, strerror(errno));

        /* The temp file lives in a hidden subdirectory: NFD ignores subdirectories, whereas a temp file
         * directly in features.d could be read half-written or trigger its rate-limited re-read
         * before the rename, leaving it with the old content. */
        r = write_file_atomic(target, dot, text, size, 0644);
        if (r < 0)
                return fail(ret_error, r,
                            "Cannot write the NFD feature file %s: %s (temporary file in %s/); make %s "
                            "writable or set labels.directory.", target, strerror(-r), hidden, dir);

        *ret_changed = true;
        return 0;
}

int nfd_remove(const char *dir, const char *name, char **ret_error) {
        _cleanup_free_ char *dot = NULL;
        struct stat st;
        int r = 0;

        if (!file_name_is_valid(name))
                return -EINVAL;
        dot = strprintf(".%s", name);
        if (!dot)
                return -ENOMEM;

        _cleanup_close_ int dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir_fd < 0) {
                if (errno == ENOENT)
                        return 0;
                return fail(ret_error, negative_errno(), "Cannot open the NFD feature directory %s: %s.", dir,
                            strerror(errno));
        }

        /* Only what we write is removed: our regular file, our temp files, our hidden directory. A
         * symlink or anything else under those names was put there by someone else and stays. */
        if (fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) >= 0) {
                if (!S_ISREG(st.st_mode))
                        return fail(ret_error, S_ISDIR(st.st_mode) ? -EISDIR : -EEXIST,
                                    "%s/%s is %s, not the feature file gpu-node-agent writes; leaving it "
                                    "alone.", dir, name, kind_of(st.st_mode));
                if (unlinkat(dir_fd, name, 0) < 0 && errno != ENOENT)
                        return fail(ret_error, negative_errno(), "Cannot remove %s/%s: %s.", dir, name,
                                    strerror(errno));
        } else if (errno != ENOENT)
                return fail(ret_error, negative_errno(), "Cannot access %s/%s: %s.", dir, name, strerror(errno));

        _cleanup_close_ int fd = open_private_subdir(dir_fd, dot, false);
        if (fd >= 0) {
                _cleanup_free_ char *prefix = strprintf("%s.", name);
                if (!prefix)
                        return -ENOMEM;
                r = cleanup_temp_files_at(fd, prefix);
                if (r >= 0 && unlinkat(dir_fd, dot, AT_REMOVEDIR) < 0 && errno != ENOENT && errno != ENOTEMPTY)
                        r = negative_errno();
        } else if (fd != -ENOENT)
                r = fail(ret_error, fd, "%s/%s is not a directory gpu-node-agent created (%s); leaving it and "
                         "its contents alone.", dir, dot,
                         fd == -ELOOP ? "a symbolic link" : fd == -EPERM ? "owned by someone else or writable by others" :
                         "not a directory");

        (void) fsync(dir_fd);
        return r < 0 ? r : 0;
}
