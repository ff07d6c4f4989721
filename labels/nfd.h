/* SPDX-License-Identifier: MIT */
/* Owns the Node Feature Discovery "local" source feature file: formatting (sorted, validated,
 * optional expiry directive) and the atomic, no-churn write through a hidden subdirectory. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "label.h"

/* Formats the file content. expiry_realtime_usec > 0 adds "# +expiry-time=<RFC3339 UTC>" before the
 * labels. Every label is validated again; -EINVAL if one is invalid. */
int nfd_format(const LabelSet *s, uint64_t expiry_realtime_usec, char **ret);

/* Writes <dir>/<name> atomically (temp file in <dir>/.<name>/, fsync, rename, fsync dir) when its
 * content differs from text; *ret_changed says whether it wrote. Creates dir when its parent exists.
 * On failure returns a negative errno and sets *ret_error to a sentence naming the path. */
int nfd_write(const char *dir, const char *name, const char *text, bool *ret_changed, char **ret_error);

/* Removes <dir>/<name> (and the hidden temp directory with our temp files); 0 when it did not exist.
 * Refuses (with *ret_error naming the path) a symlink or non-regular file under our name and a hidden
 * directory that is a symlink or not ours: those are never followed, emptied or removed. Leftover
 * temp files of a killed writer are removed by every nfd_write() too. */
int nfd_remove(const char *dir, const char *name, char **ret_error);
