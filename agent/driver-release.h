/* SPDX-License-Identifier: MIT */
/* Owns letting go of the GPU before the driver is removed (a when-idle reload, Unload()): our NVML
 * processes — the NVML worker, the MIG reader, the health event worker — hold /dev/nvidia* through their
 * library handles, and the kernel refuses to remove nvidia while a node is open (EAGAIN). They are told
 * to stop, then watched from a timer on the event loop (never a wait in it) until none of our children
 * has a node open: SIGKILL for one still holding after 1 s (a call wedged in the driver), given up after
 * 5 s, after which the removal names whoever still holds the GPU. */
#pragma once

#include "node.h"

typedef struct DriverRelease DriverRelease;

/* Called from the loop once our processes let go (or 5 s passed). The DriverRelease is finished: the
 * callback frees it (driver_release_free()). */
typedef void (*DriverReleaseDone)(Node *n, void *userdata);

/* why: the message NVML's state gets ("NVML was closed: …"). */
int driver_release_start(Node *n, const char *why, DriverReleaseDone done, void *userdata, DriverRelease **ret);
DriverRelease *driver_release_free(DriverRelease *r);

/* Whether pid is a child of ours (the PPID in <proc_dir>/<pid>/stat). */
bool driver_own_child(const char *proc_dir, pid_t pid);
DEFINE_CLEANUP_FUNC(DriverRelease *, driver_release_free);
