/* SPDX-License-Identifier: MIT */
/* Owns <paths.state>/mig-profiles: the GPU instance profile tables NVML reported (profiles, placements and
 * the CI profiles reported through a GI of each), per GPU model, kept across agent restarts so that a new
 * MIG reader does not ask NVML for them again (46 calls per model on an A100 for the whole table). A table
 * read only as far as a config needed (mig_state_read_gpu_for()) is kept as such, with the indices it asked
 * (an "asked" line): a profile of an index not asked is unknown, and a read that needs it asks NVML.
 *
 * A table is a fact of the GPU model and the driver. The file names the kernel boot id, the driver
 * version and the UUID of every GPU it describes; it is used only when all of them are what this boot's
 * nvml stage read (the snapshot): another boot, another driver, a GPU that is not there or is another
 * model, and the whole file is ignored. So is a file that does not parse, whose checksum does not match
 * (truncated, edited, garbled) or whose values are out of range: the MIG reader then asks NVML, and the
 * file is written again from that read. The daemon reads and writes it (never NVML); the MIG reader gets
 * the loaded tables at its fork (mig_profile_cache_seed()). */
#pragma once

#include <stddef.h>

#include "gpu-nvml.h"
#include "mig-types.h"

#define MIG_PROFILE_CACHE_FILE "mig-profiles"

typedef struct MigProfileCache MigProfileCache;

/* The tables of state_dir's file when they are valid for snapshot (boot id under proc_dir). 0 with *ret
 * NULL and *ret_why naming the reason when there is none to use (no file: *ret_why NULL). */
int mig_profile_cache_load(const char *state_dir, const char *proc_dir, const NvmlSnapshot *snapshot,
                           MigProfileCache **ret, char **ret_why);
MigProfileCache *mig_profile_cache_free(MigProfileCache *c);
DEFINE_CLEANUP_FUNC(MigProfileCache *, mig_profile_cache_free);

/* Puts the tables into n's per-model cache (in the MIG reader, after its first nvmlInit). */
void mig_profile_cache_seed(const MigProfileCache *c, GpuNvml *n);

/* Writes the tables of states (a read of the MIG reader; memory sizes and UUIDs from snapshot) unless the
 * file says that already. 0 when written or unchanged; nothing is written when no GPU has a table. */
int mig_profile_cache_save(const char *state_dir, const char *proc_dir, const NvmlSnapshot *snapshot,
                           const MigGpuState *states, size_t n_states);
