/* SPDX-License-Identifier: MIT */
/* Unload(): taking the NVIDIA driver out of the kernel for a driver upgrade (driver-unload.c). */
#pragma once

#include <stdbool.h>
#include <systemd/sd-bus.h>

#include "node.h"

/* The refusal ("the GPU is in use: processes …") and every other failure of Unload(). */
#define AGENT_ERROR_BUSY "org.gpunodeagent.Agent1.Error.Busy"
#define AGENT_ERROR_UNLOAD_FAILED "org.gpunodeagent.Agent1.Error.UnloadFailed"

/* The modules Unload() removes, holders first. */
#define DRIVER_UNLOAD_MODULES "nvidia-peermem", "nvidia-modeset", "nvidia-uvm", "nvidia"

/* Starts an unload for the method call request and answers it when done (Unload(out as units,
 * out as modules): the units stopped and the modules removed), or with AGENT_ERROR_BUSY listing
 * what holds the GPU, or AGENT_ERROR_UNLOAD_FAILED. Steps: stop the units the fabric stage started
 * (asynchronously, one after the other), close NVML, collect the processes with /dev/nvidia* open and
 * the modules that hold nvidia, refuse with that list, or remove the modules in holder order.
 * Returns < 0 (with error set) when it cannot start, e.g. AGENT_ERROR_BUSY while another Unload()
 * runs. */
int driver_unload_request(Node *n, sd_bus_message *request, sd_bus_error *error);

/* After a successful Unload() the driver stays out of the kernel: the driver, devices and fabric
 * stages leave it alone (skipped) until Reconcile(), Reload() or a restart. Also true while an
 * Unload() runs. */
bool driver_unload_held(const Node *n);

/* Ends the hold (Reconcile(), Reload()); no-op while an Unload() runs. */
void driver_unload_release(Node *n);

/* Cancels an Unload() in flight (its caller gets no reply: the connection goes away with the
 * agent) and frees the state. */
void driver_unload_stop(Node *n);
