/* SPDX-License-Identifier: MIT */
/* Owns the NVIDIA GPU Operator's validation files (/run/nvidia/validations/<layer>-ready) for clusters
 * where the operator runs the device plugin and DCGM but the driver is the host's (ClusterPolicy
 * driver.enabled=false): the operator's pods wait for these files. Only layers the agent has verified
 * get a file, and only files whose bytes are ours are ever removed. Library-like: no logging above
 * debug. */
#pragma once

#include <stdbool.h>

/* What the agent can vouch for. toolkit-ready (a container that the runtime injected the driver into ran
 * nvidia-smi) and cuda-ready (a CUDA kernel ran in a pod) are checks of things the agent does not run,
 * so they have no field and are never written. */
typedef struct ValidationsState {
        bool driver;             /* kernel module loaded, device nodes made, NVML initialised and listing GPUs */
} ValidationsState;

/* The content of driver-ready as the operator's validator writes it for a driver installed on the host
 * (env lines its consumers source). host_root is the root the agent manages, "/" on a real host. NULL
 * on OOM. */
char *validations_driver_ready_text(const char *host_root);

/* The owner marker's path under the run directory (paths.run): the one name both the consumers stage
 * and --cleanup use, so that cleanup finds the marker the stage wrote. NULL on OOM. */
char *validations_owner_marker(const char *run_dir);

/* Makes dir match state: writes <dir>/driver-ready (atomically, only when its bytes differ) when
 * state->driver, and then keeps owner_marker (a file of the agent's own runtime directory) to remember
 * that the file is ours; otherwise removes driver-ready only when the marker exists and the file still
 * holds exactly what we wrote — the operator's validator writes the same bytes for a host driver, and a
 * file it wrote is never ours to remove. *ret_changed: driver-ready was written or removed. */
int validations_update(const char *dir, const char *owner_marker, const char *host_root, const ValidationsState *state,
                       bool *ret_changed);
