/* SPDX-License-Identifier: MIT */
/* Owns reading the MIG state of GPUs through NVML into MigGpuState (mig-types.h): MIG mode current and
 * pending, the GPU and compute instances that exist, the GPU instance profiles each GPU reports (ids,
 * canonical names, possible placements, instance limits, compute instance profiles) — not whether compute
 * processes run (mig_state_processes(), asked only for the GPUs a plan changes); the GI profile table is kept per GPU model for the life of the NVML handle. Also the
 * layout helpers the applier and the journal share: copying and comparing the part of a state that an
 * apply changes. Library code: negative errno plus a sentence, no logging. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "gpu-nvml-internal.h"
#include "mig-types.h"

/* The PCI addresses ("0000:1b:00.0") of every GPU NVML lists, sorted: the GPU numbering of mig-parted
 * when no PCI inventory is at hand. */
int mig_state_enumerate(GpuNvml *n, char ***ret, char **ret_error);

/* The NVML handle of the GPU at a PCI address; -ENODEV when NVML does not list it. */
int mig_state_device(GpuNvml *n, const char *pci_address, nvmlDevice_t *ret);

/* Reads one GPU. -ENODEV (no message) when NVML does not list the address (vfio-pci, unbound). */
int mig_state_read_gpu(GpuNvml *n, const char *pci_address, unsigned index, MigGpuState *ret, char **ret_error);
/* The same with the GI profile table read only as far as the profile names wanted (a config's, NULL =
 * the whole table) need: the table may then be partial (MigGpuState.gi_profiles_partial). It holds every
 * wanted profile the GPU has (a name it lacks makes the read take the whole table), the largest profile
 * (the GPU's compute slices) and NVML's end of the table. With MIG enabled, a partial table is enough only
 * when the GIs found use every compute slice (no GI of an unread profile can exist); otherwise the whole
 * table is read and the GIs with it. The per-model cache keeps what was read; a later read that needs more
 * asks only the indices not asked yet. */
int mig_state_read_gpu_for(GpuNvml *n, const char *pci_address, unsigned index, char *const *wanted,
                           MigGpuState *ret, char **ret_error);

/* Reads the GPUs at pci_addresses (index = position in that list; NULL = mig_state_enumerate()). GPUs
 * NVML does not list are left out, so indices may have gaps. */
int mig_state_read(GpuNvml *n, char *const *pci_addresses, MigGpuState **ret, size_t *ret_n, char **ret_error);
int mig_state_read_for(GpuNvml *n, char *const *pci_addresses, char *const *wanted, MigGpuState **ret, size_t *ret_n,
                       char **ret_error);

/* Re-reads only what a MIG write can change on a GPU whose state known was read before: the MIG mode,
 * the GPU instances of the profiles gi_profile_ids and, in them, the compute instances of the profiles
 * ci_profile_ids (a GI of another profile, or a CI of another profile, cannot have appeared through our
 * writes). Identity and the profile table are copied from known; busy is false. About 1 + G + 2·I + C
 * calls for G profiles, I GIs and C CIs, instead of the whole GPU with its profile table. */
int mig_state_read_layout(GpuNvml *n, const MigGpuState *known, const unsigned *gi_profile_ids, size_t n_gi_profile_ids,
                          const unsigned *ci_profile_ids, size_t n_ci_profile_ids, MigGpuState *ret, char **ret_error);

/* The GPU as known was before the first n_done steps of plan ran, all of them successfully: derived, no
 * NVML call. created[i] is the id NVML gave the GI (CREATE_GI) or CI (CREATE_CI) of step i;
 * mode_waits_for_reset: the run stopped after its SET_MODE because the change waits for a GPU reset.
 * What the steps wrote is what NVML answered for (a create answers the new instance's id with its info), so
 * the applier need not read the GPU again to report it. -ENOENT when a step names a GI neither known nor
 * created (the caller reads the GPU instead). */
int mig_state_after_steps(const MigGpuState *known, const MigGpuPlan *plan, size_t n_done, const unsigned *created,
                          bool mode_waits_for_reset, MigGpuState *ret);

/* Puts a model's GI profile table, as a cache of facts NVML reported before (mig-cache.c), into n's per-model
 * cache, so that reads on n do not ask NVML for it: profiles with the CI profiles NVML reported through a
 * GI of each (n_ci_profiles 0: none was asked; NVML's numbering stands in until one is). A model n has
 * read already keeps NVML's answer. partial, asked, end: a partial table (MigGpuState's gi_profiles_*). */
int mig_state_seed_model(GpuNvml *n, const char *model, uint32_t pci_id, uint64_t total_bytes,
                         const MigGiProfile *profiles, size_t n_profiles, bool partial, uint64_t asked, unsigned end);

/* Number of compute processes on the GPU. */
int mig_state_processes(GpuNvml *n, nvmlDevice_t d, unsigned *ret);

/* Deep copy of what an apply changes and what the journal records: index, address, model, ids, MIG
 * modes and the instances (no profiles). */
int mig_state_copy_layout(const MigGpuState *src, MigGpuState *ret);

/* Same MIG mode (current) and the same instances: GIs compared by profile and placement, each with the
 * same multiset of CI profiles. GI and CI ids are not compared (a re-created instance may get new ones). */
bool mig_state_layout_equal(const MigGpuState *a, const MigGpuState *b);

const MigGiProfile *mig_state_gi_profile(const MigGpuState *g, unsigned profile_id);
const MigGpuState *mig_state_find(const MigGpuState *gpus, size_t n, const char *pci_address);

/* "7g.40gb ×1, 1g.5gb ×2" style summary of the instances, "MIG disabled" or "no MIG instances". */
char *mig_state_layout_summary(const MigGpuState *g);
