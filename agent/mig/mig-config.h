/* SPDX-License-Identifier: MIT */
/* Owns reading MIG geometry files in mig-parted's v1 format, unchanged (YAML 1.1 booleans, anchors,
 * aliases and merge keys, flow style), into MigConfigFile, with errors that name file, line, column and
 * key; and the syntax of MIG profile names, which the planner shares. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mig-types.h"

/* Reads and validates a whole file. On failure *ret_error (when given) is set to one sentence of the form
 * "FILE:LINE:COLUMN: KEY: what is wrong and how to fix it" and a negative errno is returned: -EINVAL for
 * content we do not take, -EBADMSG for invalid YAML, the read error (-ENOENT …) for a file we cannot read. */
int mig_config_file_load(const char *path, MigConfigFile **ret, char **ret_error);
/* The same for data already in memory; path is used for messages and stored in the result. */
int mig_config_file_parse(const char *path, const char *data, size_t size, MigConfigFile **ret, char **ret_error);

/* Looks a named config up. -ENOENT with an error that lists the names the file has. */
int mig_config_file_find(const MigConfigFile *f, const char *name, const MigConfig **ret, char **ret_error);

/* A parsed MIG profile name: "[<C>c.]<G>g.<GB>gb[+attr[.attr]…|-attr]". */
typedef struct MigProfileName {
        unsigned ci_slices;         /* C, or 0 when the name has no "<C>c." (a CI spanning the whole GI) */
        unsigned gi_slices;         /* G */
        unsigned memory_gb;         /* GB */
        const char *gi_name;        /* points into the parsed string: the GI part, "<G>g.<GB>gb[attrs]" */
} MigProfileName;

/* Checks the syntax only (names are resolved against what each GPU reports, in the planner).
 * -EINVAL when the string is not a MIG profile name. */
int mig_profile_name_parse(const char *s, MigProfileName *ret);

/* The sentence used when a name is malformed, for the config reader and the planner alike. */
#define MIG_PROFILE_NAME_SYNTAX                                                                         \
        "expected <G>g.<GB>gb or <C>c.<G>g.<GB>gb, optionally followed by +me, +me.all, +gfx or -me"

/* Parses a device-filter element "0xDDDDVVVV" or "0xDDDDVVVV:0xSSSSVVVV" (case-insensitive hex).
 * *ret_has_subsystem says whether the subsystem part was given. -EINVAL when malformed. */
int mig_device_filter_parse(const char *s, uint32_t *ret_pci_id, uint32_t *ret_subsystem_id, bool *ret_has_subsystem);
