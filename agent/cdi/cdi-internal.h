/* SPDX-License-Identifier: MIT */
/* Owns what the files of agent/cdi/ share and nothing outside it uses: the MIG minors table the builder
 * (cdi-build.c) reads from cdi-mig-minors.c. */
#pragma once

#include "cdi.h"

#include <limits.h>
#include <stddef.h>

/* The nvidia-caps device minors of MIG devices, from <proc>/driver/nvidia-caps/mig-minors: one line per
 * "gpu<G>/gi<I>/access <minor>" (ci = MIG_MINOR_GI) and "gpu<G>/gi<I>/ci<C>/access <minor>". The driver
 * lists every GPU, GI and CI it could ever have (~4300 lines for its 32 GPUs) whatever the node has, so
 * the file is parsed in one pass into a sorted array that is searched with bsearch, and kept for as long
 * as the file stays the same file (mig_minors_cache in cdi-mig-minors.c). */
#define MIG_MINOR_GI UINT_MAX

typedef struct MigMinor {
        unsigned gpu, gi, ci, minor;
} MigMinor;

typedef struct MigMinors {
        MigMinor *v;
        size_t n;
} MigMinors;

/* *ret points into *cache (created when NULL; valid until the next call with it or its free); an empty
 * table when the file is absent (no nvidia-caps support: every MIG device is then left out with a
 * warning that says so). */
int cdi_mig_minors_read(CdiMigMinorsCache **cache, const char *proc, const MigMinors **ret);

/* The access minor of GPU gpu's GI gi (ci = MIG_MINOR_GI) or of its CI ci; NULL when the table has none. */
const MigMinor *cdi_mig_minor_find(const MigMinors *t, unsigned gpu, unsigned gi, unsigned ci);
