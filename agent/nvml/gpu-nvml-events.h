/* SPDX-License-Identifier: MIT */
/* Owns the NVML side of GPU health, run in a forked worker process (never on the event loop): it
 * initialises NVML once, registers for XID, ECC and clock events on every GPU, and then one thread
 * blocks in nvmlEventSetWait_v2 for as long as the process lives while the other answers health-check
 * requests with the handles it already has (GPU count, remapped rows, fabric registration). It talks
 * over a stream socket, one line per fact (health.c parses them):
 *   to the worker:    "check"
 *   from the worker:  "armed <n>", "unsupported <gpu> <why>", "event <gpu> <type bit> <data>",
 *                     "error <text>" (then it exits), and per check "count <n>",
 *                     "gpu <gpu> ok|missing|lost|error <text>",
 *                     "remap <gpu> <corrected> <uncorrected> <pending> <failure>",
 *                     "fabric <gpu> <state> <status>", "done"
 * <gpu> is the position in the PCI address list the worker was given. */
#pragma once

/* Waits between two nvmlEventSetWait_v2 calls' timeouts: only the worker wakes up, never the loop. */
#define GPU_NVML_EVENT_WAIT_MS 60000u

/* The body of the spawn_fork() child: fd is its end of the socket; pci_addresses our GPUs, in order.
 * Returns (or exits with) the exit status. */
int gpu_nvml_events_run(int fd, const char *library, char *const *pci_addresses);
