/* SPDX-License-Identifier: MIT */
/* Owns the MIG planner: from one named config and the observed state of every GPU, the per-GPU steps
 * (destroy, mode change, reset, create with explicit placements) that make the node match the config,
 * validated against what each GPU reports before anything is returned. No NVML and no I/O. */
#pragma once

#include <stddef.h>

#include "mig-types.h"

/* The entry of config that applies to gpu: the last one whose device-filter and devices match it, or
 * NULL when none does (the GPU is unmanaged). */
const MigConfigEntry *mig_config_match(const MigConfig *config, const MigGpuState *gpu);

/* Plans the change from gpus[] (as NVML reports them now) to config. The plan holds only GPUs whose
 * layout or mode differs from the target; GPUs no entry covers are listed as unmanaged. When any GPU
 * cannot take its target (MIG unsupported, a profile it does not have, more than it holds, no placement
 * that fits), nothing is planned: -EINVAL and *ret_error says, one line per problem, which GPU, which
 * profile and why, with the choices the GPU has. Placements are computed here, largest profiles first,
 * each at the lowest start that leaves room for the rest; GI instances that already match the target
 * are kept where the rest can still be placed around them. */
int mig_plan_build(const MigConfig *config, const MigGpuState *gpus, size_t n_gpus, MigPlan **ret, char **ret_error);

/* One line for logs, the journal and tests: "create-gi 3g.20gb id=9 start=4 size=4",
 * "create-ci 3g.20gb id=2 gi=#0" (the GI made by step 0), "destroy-ci gi=3 ci=0 (1g.5gb)", "set-mode 1",
 * "reset-gpu". NULL on OOM. */
char *mig_step_to_string(const MigStep *s);
