/* SPDX-License-Identifier: MIT */
/* Owns file and path helpers: atomic writes (temp + fsync + rename + fsync dir), whole-file reads,
 * path joining, mkdir -p. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Writes data to path atomically. The temp file is created in tmp_dir (which must be on the same
 * file system; created if missing) or, when NULL, next to the target as ".<name>.XXXXXX".
 * Returns 0 or a negative errno; on failure the target is unchanged and no temp file is left. */
int write_file_atomic(const char *path, const char *tmp_dir, const void *data, size_t size, mode_t mode);

/* Reads a whole file (at most max_size bytes; -EFBIG beyond) and NUL-terminates it. */
int read_full_file(const char *path, size_t max_size, char **ret, size_t *ret_size);

/* Reads the first line, with trailing whitespace and newline removed. */
int read_one_line_file(const char *path, char **ret);

/* Writes a short string (plus newline) non-atomically, as for a sysfs or procfs attribute. */
int write_string_file(const char *path, const char *s);

/* Returns a newly allocated "a/b" with exactly one slash between; NULL on OOM. */
char *path_join(const char *a, const char *b);

int mkdir_p(const char *path, mode_t mode);

/* Removes the trailing whitespace of s in place and returns s. */
char *strstrip_trailing(char *s);

/* fsync()s the directory containing path. */
int fsync_parent_dir(const char *path);
