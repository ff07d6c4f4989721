/* SPDX-License-Identifier: MIT */
/* Owns file and path helpers: atomic writes (temp + fsync + rename + fsync dir) done relative to
 * directory fds, whole-file reads that take only regular files, the symlink-proof opening of entries in
 * shared directories, leftover temp file cleanup, path joining, mkdir -p. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Writes data to path atomically. The temp file is created in tmp_subdir, a plain name (no '/') of a
 * directory beside the target (created if missing), as "<name>.XXXXXX", or, when NULL, next to the
 * target as ".<name>.XXXXXX". Everything below path's directory is opened relative to its fd and
 * without following symlinks: a temp directory that is a symlink, not a directory, not owned by us or
 * writable by others fails with -ENOTDIR/-ELOOP/-EPERM and nothing is created in it.
 * Returns 0 or a negative errno; on failure the target is unchanged and no temp file is left. */
int write_file_atomic(const char *path, const char *tmp_subdir, const void *data, size_t size, mode_t mode);

/* write_file_atomic(path, NULL, …) after creating path's parent directories (0755) when missing. */
int write_file_atomic_mkdir(const char *path, const void *data, size_t size, mode_t mode);

/* Opens dir (relative to dir_fd, or AT_FDCWD) as a directory without following a symlink at its last
 * component: -ELOOP for a symlink, -ENOTDIR for anything else that is not a directory. */
int open_dir_nofollow(int dir_fd, const char *name);

/* Opens the temp directory name inside dir_fd for our own use: it must be a real directory owned by
 * our effective uid and not writable by group or others (-ELOOP, -ENOTDIR, -EPERM otherwise).
 * With create, a missing one is made (0755). */
int open_private_subdir(int dir_fd, const char *name, bool create);

/* Removes the temp files a killed writer can leave in dir_fd: regular files owned by our effective uid
 * named prefix followed by exactly 6 characters of mkstemp's alphabet. Anything else is left alone.
 * Returns the number removed, or a negative errno. */
int cleanup_temp_files_at(int dir_fd, const char *prefix);

typedef enum ReadFileFlags {
        READ_FILE_NOFOLLOW = 1 << 0, /* refuse a symlink at the last component (-ELOOP) */
} ReadFileFlags;

/* Reads a whole file (at most max_size bytes; -EFBIG beyond) and NUL-terminates it. The file is
 * opened with O_NONBLOCK and must be a regular file: a FIFO, socket or device gives -EBADFD (a
 * directory -EISDIR) without a single read, so such a file can never block the caller. */
int read_full_file_at(int dir_fd, const char *path, ReadFileFlags flags, size_t max_size, char **ret,
                      size_t *ret_size);
int read_full_file(const char *path, size_t max_size, char **ret, size_t *ret_size);

/* Reads the first line, with trailing whitespace and newline removed. */
int read_one_line_file(const char *path, char **ret);

/* Returns a newly allocated "a/b" with exactly one slash between; NULL on OOM. */
char *path_join(const char *a, const char *b);

int mkdir_p(const char *path, mode_t mode);

/* Removes the trailing whitespace of s in place and returns s. */
char *strstrip_trailing(char *s);

/* fsync()s the directory containing path. */
int fsync_parent_dir(const char *path);
