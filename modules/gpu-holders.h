/* SPDX-License-Identifier: MIT */
/* Owns "who holds the GPU": processes with an NVIDIA device node open (a walk of <proc>/<pid>/fd)
 * and the kernel modules that hold nvidia (<sys>/module/<name>/holders), so that Unload() can refuse
 * with a list a sysadmin can act on instead of a bare EBUSY/EAGAIN from delete_module. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct GpuHolder {
        pid_t pid;
        char *comm;   /* <proc>/<pid>/comm; "?" when it could not be read */
        char *node;   /* the first NVIDIA node it holds, as the kernel shows it: "/dev/nvidia0" */
} GpuHolder;

typedef struct GpuHolders {
        GpuHolder *procs;      /* sorted by pid */
        size_t n_procs;
        size_t n_unreadable;   /* processes whose fds could not be read (EACCES without root) */
        char **modules;        /* modules holding the module asked about, sorted */
} GpuHolders;

/* Lists the processes of proc_dir (the root's /proc) that have a file open whose path, as
 * readlink(<proc>/<pid>/fd/N) shows it, is a node named nvidia* directly under dev_dir or under
 * dev_dir/nvidia-caps ("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-caps/…",
 * also with the kernel's " (deleted)" suffix). dev_dir is "/dev" on a real system; tests pass a
 * temporary directory. Process exclude_pid (0 = none; the agent passes its own pid while it still
 * holds NVML) is left out. Processes that exit during the walk are skipped silently. */
int gpu_holders_processes(const char *proc_dir, const char *dev_dir, pid_t exclude_pid, GpuHolders *holders);

/* Fills holders->modules with the entries of <sys_dir>/module/<module>/holders ('-' in module read
 * as '_', as the kernel names it). -ENOENT when the module is not loaded (no <sys>/module/<module>). */
int gpu_holders_modules(const char *sys_dir, const char *module, GpuHolders *holders);

/* Both of the above for the nvidia module and the /dev nodes. */
int gpu_holders_collect(const char *proc_dir, const char *sys_dir, const char *dev_dir, pid_t exclude_pid,
                        GpuHolders *holders);

void gpu_holders_done(GpuHolders *holders);

/* Whether anything holds the GPU. */
static inline bool gpu_holders_busy(const GpuHolders *h) {
        return h->n_procs > 0 || (h->modules && h->modules[0]);
}

/* A sentence for the Unload() refusal: "The GPU is in use: processes 1234 (python3, /dev/nvidia0),
 * 1301 (nvidia-persiste, /dev/nvidiactl); kernel modules nvidia_uvm, nvidia_modeset hold nvidia. Stop
 * them, then retry." NULL on OOM; "" when nothing holds it. */
char *gpu_holders_to_string(const GpuHolders *h);
