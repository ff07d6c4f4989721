/* SPDX-License-Identifier: MIT */
/* Owns the NVIDIA device nodes under /dev, as nvidia-modprobe and `nvidia-ctk system
 * create-device-nodes` make them (specs/driver.md "Device nodes"): which nodes, numbers and
 * permissions the loaded driver wants (devnode_plan(), read from a proc tree, needs no privileges)
 * and making /dev match that plan (devnode_apply(), needs CAP_MKNOD), plus the /dev/char/M:m
 * links that keep containers working after `systemctl daemon-reload`.
 *
 * Library code: errors come back as a negative errno plus a sentence for the caller to log. */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define DEVNODE_NVIDIA_MAJOR 195U
#define DEVNODE_CTL_MINOR 255U
#define DEVNODE_MODESET_MINOR 254U
#define DEVNODE_NVSWITCH_CTL_MINOR 255U

typedef enum DevnodeKind {
        DEVNODE_CTL,           /* nvidiactl */
        DEVNODE_GPU,           /* nvidia<minor> */
        DEVNODE_MODESET,       /* nvidia-modeset */
        DEVNODE_UVM,           /* nvidia-uvm */
        DEVNODE_UVM_TOOLS,     /* nvidia-uvm-tools */
        DEVNODE_CAP,           /* nvidia-caps/nvidia-cap<m> */
        DEVNODE_NVSWITCH,      /* nvidia-nvswitch<n> */
        DEVNODE_NVSWITCH_CTL,  /* nvidia-nvswitchctl */
        DEVNODE_IMEX_CHANNEL,  /* nvidia-caps-imex-channels/channel<n> */
        _DEVNODE_KIND_MAX,
        _DEVNODE_KIND_INVALID = -EINVAL,
} DevnodeKind;

const char *devnode_kind_to_string(DevnodeKind k);
DevnodeKind devnode_kind_from_string(const char *s);

/* One MIG device whose capability nodes a container needs: the GPU's device minor (the N of
 * /dev/nvidiaN, which is also the G of "gpu<G>/…" in mig-minors), GPU instance and compute instance
 * ids. Both its gi<I>/access and gi<I>/ci<C>/access nodes are planned. */
typedef struct DevnodeMigDevice {
        unsigned gpu_minor;
        unsigned gi;
        unsigned ci;
} DevnodeMigDevice;

typedef struct DevnodeOptions {
        /* Plan /dev/nvidia-modeset even when nvidia_modeset is not in <proc>/modules (configured to
         * be loaded). When the module is loaded it is planned anyway. */
        bool modeset;
        const DevnodeMigDevice *mig;
        size_t n_mig;
} DevnodeOptions;

typedef struct DevnodeSpec {
        DevnodeKind kind;
        char *name;        /* relative to the dev dir: "nvidia0", "nvidia-caps/nvidia-cap12" */
        unsigned major;
        unsigned minor;
        mode_t mode;       /* permission bits only */
        uid_t uid;
        gid_t gid;
} DevnodeSpec;

typedef struct DevnodePlan {
        DevnodeSpec *nodes;   /* sorted by name */
        size_t n_nodes;
        /* false when <proc>/driver/nvidia/params says ModifyDeviceFiles: 0: the admin (or a
         * container runtime) owns the nodes; devnode_apply() creates and changes none, and only
         * links those that already exist and are right. */
        bool modify;
        /* Nodes left out and why, one sentence each ("nvidia-uvm is not loaded (no \"nvidia-uvm\"
         * in /proc/devices): /dev/nvidia-uvm and /dev/nvidia-uvm-tools are not created"). */
        char **notes;
} DevnodePlan;

/* Computes the nodes from proc_dir (the root's /proc): nvidiactl; one nvidiaN per
 * <proc>/driver/nvidia/gpus/<BDF>/information "Device Minor:"; nvidia-modeset when wanted; uvm and
 * uvm-tools when "nvidia-uvm" is in <proc>/devices; nvidia-caps config and monitor (and the access
 * nodes of opts->mig) from <proc>/driver/nvidia-caps/mig-minors when "nvidia-caps" is in
 * <proc>/devices; nvidia-nvswitch0..N-1 and nvidia-nvswitchctl when "nvidia-nvswitch" is in
 * <proc>/devices, N the entries of <proc>/driver/nvidia-nvswitch/devices/.
 *
 * Permissions, as nvidia-modprobe: nvidia.ko's own nodes (nvidiaN, nvidiactl, modeset) 0666 root:root
 * unless <proc>/driver/nvidia/params sets DeviceFileUID/DeviceFileGID/DeviceFileMode; uvm nodes
 * always 0666 root:root; nvswitch nodes the DeviceFileMode of <proc>/driver/nvidia-nvswitch/permissions
 * (0666 when absent); a capability node the DeviceFileMode of its
 * <proc>/driver/nvidia/capabilities/… file, which the driver sets to 0400 for mig/config, 0444 for
 * mig/monitor and 0444 for gi/ci access (those values when the file is absent), owner root:root.
 *
 * Fails with -ENOENT when the nvidia module is not loaded (no <proc>/driver/nvidia/gpus), -EBADMSG
 * for an unparsable proc file, -ENXIO for a MIG device that mig-minors does not list; *ret_error
 * (optional) then says which file and what to do. */
int devnode_plan(const char *proc_dir, const DevnodeOptions *opts, DevnodePlan **ret, char **ret_error);
DevnodePlan *devnode_plan_free(DevnodePlan *p);

/* The IMEX channel nodes nvidia-caps-imex-channels/channel0..n_channels-1 (NVLink multi-node memory
 * export between the nodes of one NVLink domain), character devices of the "nvidia-caps-imex-channels"
 * major in <proc>/devices with minor = channel number, 0666 root:root (any process of a job in the domain
 * may import memory through a channel; access is governed by which channels a container gets), not
 * created or changed when <proc>/driver/nvidia/params says ModifyDeviceFiles: 0. devnode_apply() creates
 * only nvidia-caps/ itself: the caller makes <dev>/nvidia-caps-imex-channels first. Fails with
 * -ENOENT when the driver registered no such major (a driver before 550, or no IMEX support), *ret_error
 * saying so. */
int devnode_plan_imex(const char *proc_dir, unsigned n_channels, DevnodePlan **ret, char **ret_error);

/* Looks a planned node up by name ("nvidia0"); NULL when not planned. */
const DevnodeSpec *devnode_plan_find(const DevnodePlan *p, const char *name);

typedef struct DevnodeResult {
        unsigned created;      /* did not exist */
        unsigned replaced;     /* existed with the wrong type or device number (or was a regular file) */
        unsigned fixed;        /* right device, wrong mode or owner: chmod/chown in place */
        unsigned unchanged;    /* already right: left alone, same inode */
        unsigned skipped;      /* ModifyDeviceFiles=0: not touched */
        unsigned links;        /* /dev/char/M:m links created or corrected */
        unsigned links_ok;     /* /dev/char/M:m links that were already right */
} DevnodeResult;

/* Makes dev_dir (the root's /dev) match the plan. A missing node is created, a wrong one (other
 * type, other device number) replaced atomically (mknod under a temporary name beside it, then
 * rename over it, so no process ever sees the name missing); a right one with wrong permissions is
 * chmod/chown'ed; a right one is not touched. Then every planned node that exists as the right
 * character device gets /dev/char/<major>:<minor> -> ../<name>. Works through every node even
 * after a failure; returns the first error (and a sentence naming the path, the errno text and,
 * for EPERM, that creating device nodes needs CAP_MKNOD), *ret_result counting what was done either
 * way. */
int devnode_apply(const DevnodePlan *plan, const char *dev_dir, DevnodeResult *ret_result, char **ret_error);

/* "14 device nodes: 2 created, 1 replaced, 11 unchanged; 14 /dev/char links (2 new)" or, for
 * ModifyDeviceFiles=0, a sentence saying nothing was created and why. NULL on OOM. */
char *devnode_result_to_string(const DevnodePlan *plan, const DevnodeResult *r);
