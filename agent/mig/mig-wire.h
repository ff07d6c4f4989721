/* SPDX-License-Identifier: MIT */
/* Owns the MIG reads as a job of an NVML worker (gpu_nvml_worker_job()): mig_states_job() runs in the
 * worker on its own handle — userdata is the strv of PCI addresses (NULL = every GPU NVML lists), in its
 * memory at the fork — and mig_states_job_result() decodes the answer in the daemon. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "gpu-nvml.h"
#include "mig-types.h"

struct WireBuf;

int mig_states_job(GpuNvml *n, void *userdata, struct WireBuf *out, char **ret_error);

/* The same on the MIG reader with input bytes (gpu_nvml_worker_read_input(): a GpuNvmlInput as userdata),
 * mig_states_for_input() writes them: the PCI addresses, and the MIG profile names of the config to be
 * planned, so that the GI profile table is read only as far as they need (mig_state_read_for()). Its
 * answer is mig_states_job's. */
int mig_states_for_job(GpuNvml *n, void *userdata, struct WireBuf *out, char **ret_error);
void mig_states_for_input(struct WireBuf *b, char *const *pci_addresses, char *const *wanted);

/* One MigGpuState on the wire (the MIG steps sent to the MIG reader use it too). */
struct WireReader;
void mig_wire_put_state(struct WireBuf *b, const MigGpuState *g);
int mig_wire_get_state(struct WireReader *rd, MigGpuState *g);
/* -EBADMSG for a malformed answer. */
int mig_states_job_result(const uint8_t *data, size_t len, MigGpuState **ret, size_t *ret_n);

/* The compute processes on the GPUs at the PCI addresses userdata names (a strv, in order): asked only for
 * the GPUs a plan changes, just before the apply, on the MIG reader. mig_busy_job_result() checks that
 * there is one count per address. A GPU NVML does not list counts 0 (the apply names it). */
int mig_busy_job(GpuNvml *n, void *userdata, struct WireBuf *out, char **ret_error);
int mig_busy_job_result(const uint8_t *data, size_t len, size_t n_expected, unsigned **ret);
