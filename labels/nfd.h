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

/* Removes <dir>/<name> (and the hidden temp directory); 0 when it did not exist. */
int nfd_remove(const char *dir, const char *name);
