/* SPDX-License-Identifier: MIT */
/* The devices and fabric stages' entry points for the rest of the agent (stage-devices.c,
 * stage-fabric.c): re-making the device nodes outside a pass (the mig stage, after a MIG change
 * added or removed capability nodes) and the fabric stage's teardown. */
#pragma once

#include "stage-table.h"

/* The devices stage's work: plans the /dev/nvidia* nodes from <paths.proc> (with the capability
 * nodes of the MIG devices in n->nvml_snapshot, when there is one) and makes <paths.dev> match.
 * Returns STAGE_DONE (or STAGE_SKIPPED: devices.enabled is false, no GPU, the driver was unloaded
 * with Unload()) with a message saying what was done, or a negative errno with a sentence saying
 * what failed and what to do. *ret_message is always set (NULL only on OOM). */
int stage_devices_refresh(Node *n, char **ret_message);

/* Makes the capability nodes of the MIG devices in n->nvml_snapshot when the last devices refresh did not
 * make them for exactly this set of MIG devices (a new snapshot: the first one after start, instances made
 * by the agent or by anyone else): stage_devices_refresh() then, so that every MIG device NVML reports
 * has its nodes before the cdi stage names them. Nothing when the devices stage did not succeed in its
 * last run (it reports why) or is skipped. Failures are logged; the next pass retries. */
void stage_devices_sync_mig(Node *n);

/* Cancels a unit start of the fabric stage that is still in flight (no callback after this) and
 * forgets the units the agent started; also ends an Unload() in flight. Called by manager_free(). */
void stage_fabric_done(Node *n);
