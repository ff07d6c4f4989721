/* SPDX-License-Identifier: MIT */
/* Owns the "last good load" record: {kernel release, driver version, options digest} written after
 * the driver stage loaded the modules successfully, read at start for the fast path (same record +
 * modules live = nothing to do). Stored atomically as <paths.state>/driver.state, KEY=value lines. */
#pragma once

#include <stdbool.h>

#include "macro.h"

#define DRIVER_STATE_FILE "driver.state"

typedef struct DriverState {
        char *kernel;            /* uname -r of the load, "6.1.0-57-amd64" */
        char *driver_version;    /* the nvidia module's version, "535.261.03" */
        char *options_digest;    /* driver_options_digest() of the effective options */
} DriverState;

/* A stable digest ("fnv1a64:<16 hex>") of the effective module options. Each entry is one module's
 * line, "MODULE opt=val opt2=val" (modprobe.d options merged with driver.parameters). Runs of
 * blanks collapse and the entries are sorted, so the order modules are listed in does not matter;
 * the order of options within a module does (modprobe: the last value of a parameter wins).
 * NULL or empty list: the digest of nothing. Returns 0 or -ENOMEM. */
int driver_options_digest(char *const *entries, char **ret);

/* New record with copies of the strings (each must be non-empty and single-line: -EINVAL). */
int driver_state_new(const char *kernel, const char *driver_version, const char *options_digest,
                     DriverState **ret);
DriverState *driver_state_free(DriverState *s);
DEFINE_CLEANUP_FUNC(DriverState *, driver_state_free);

/* Reads <state_dir>/driver.state. -ENOENT when there is none (first start, or removed to force a
 * full check); -EBADMSG when it is malformed or incomplete (treat as "no record"). */
int driver_state_load(const char *state_dir, DriverState **ret);

/* Writes <state_dir>/driver.state atomically (creating state_dir), mode 0644. */
int driver_state_save(const char *state_dir, const DriverState *s);

/* Removes the record (e.g. after an unload); 0 also when there was none. */
int driver_state_remove(const char *state_dir);

/* Whether the recorded load matches the current one. When not, and ret_reason is given, it says
 * why in words: "kernel changed from 6.1.0-56-amd64 to 6.1.0-57-amd64", "driver version changed
 * from … to …", "module options changed", "no record of a previous load". Returns 1 equal,
 * 0 different, -ENOMEM. recorded may be NULL. */
int driver_state_compare(const DriverState *recorded, const DriverState *now, char **ret_reason);
