/* SPDX-License-Identifier: MIT */
/* Owns `gpu-node-agent --cleanup`: taking back what the agent published for other software. */
#pragma once

#include "config.h"

/* Removes, for the paths of configuration c: the NFD feature file (labels.directory/labels.file, and
 * the hidden directory of its temporary files), the CDI spec (cdi.spec) when the agent wrote it, and
 * the readiness and state files under <paths.run>/gpu-node-agent/. Leaves what keeps the node usable
 * (device nodes, loaded modules, the MIG layout) and the persistent state directory. Logs each file
 * removed; returns 0, or the first negative errno (and goes on with the rest). */
int agent_cleanup_outputs(const Config *c);
