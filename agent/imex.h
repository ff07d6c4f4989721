/* SPDX-License-Identifier: MIT */
/* Owns the NVLink multi-node (IMEX) side of the node: whether NVML puts its GPUs in a fabric clique,
 * and the CDI spec of kind nvidia.com/imex-channel that names the IMEX channel device nodes the way the
 * NVIDIA Container Toolkit does (`nvidia-ctk cdi generate --mode=imex`), so that a runtime can hand
 * channel N to a container as "nvidia.com/imex-channel=N". Library-like: no logging above debug. */
#pragma once

#include "cdi.h"
#include "devnode.h"
#include "gpu-nvml.h"

#define IMEX_CDI_KIND "nvidia.com/imex-channel"
#define IMEX_UNIT "nvidia-imex.service"

/* The first fabric clique ("<cluster uuid>.<clique id>") of the snapshot's GPUs, NULL when no GPU is in
 * one (not fabric-attached, or its fabric registration has not completed). *ret_n: GPUs in a clique. */
const char *imex_clique(const NvmlSnapshot *s, size_t *ret_n);

/* The spec text: one device per planned channel, named by its number ("0"), with the device node
 * /dev/nvidia-caps-imex-channels/channel<N> (runtimes stat it for type and numbers, as for the GPU
 * spec). -ENODEV when the plan has no channel. */
int imex_cdi_spec_text(const DevnodePlan *plan, char **ret);
