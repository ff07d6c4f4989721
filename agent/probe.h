/* SPDX-License-Identifier: MIT */
/* Owns the PCI inventory: NVIDIA GPUs (class 0x0300/0x0302, no SR-IOV VFs), NVSwitches (0x0680) and
 * Mellanox/NVIDIA networking NICs (vendor 0x15b3), read through libpci's sysfs method from a
 * configurable sysfs tree. GPU order = PCI address order = the GPU index used everywhere. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "macro.h"

typedef enum PciKind {
        PCI_KIND_GPU,
        PCI_KIND_NVSWITCH,
        PCI_KIND_NIC,
        _PCI_KIND_MAX,
        _PCI_KIND_INVALID = -EINVAL,
} PciKind;

typedef struct PciDevice {
        PciKind kind;
        unsigned index;            /* position within its kind, in PCI address order */
        char address[32];          /* "0000:3b:00.0" */
        uint16_t vendor_id;
        uint16_t device_id;
        uint16_t subsystem_vendor_id;
        uint16_t subsystem_device_id;
        uint32_t class_code;       /* 24 bits: 0x030200 */
        char *name;                /* pci.ids device name, e.g. "GH100 [H100 SXM5 80GB]"; NULL if unknown */
        int numa_node;             /* -1 when unknown */
        int iommu_group;           /* -1 when none */
        char *driver;              /* bound driver ("nvidia", "vfio-pci"), NULL when unbound */
        char *link_speed;          /* current link speed as sysfs says it, e.g. "32.0 GT/s PCIe"; NULL */
        unsigned link_width;       /* current link width, 0 when unknown */
        bool vgpu;                 /* a vGPU guest's GPU: NVIDIA's "VF" vendor-specific PCI capability */
        char *vgpu_host_driver_version; /* from that capability's host driver record, NULL none */
        char *vgpu_host_driver_branch;
} PciDevice;

typedef struct Inventory {
        PciDevice *gpus;
        size_t n_gpus;
        PciDevice *nvswitches;
        size_t n_nvswitches;
        PciDevice *nics;
        size_t n_nics;
        char **warnings;           /* things a sysadmin should hear about, one line each (unreadable
                                    * attribute, missing pci.ids, …); the caller logs them */
} Inventory;

/* sys_dir is the sysfs mount (e.g. "/sys" or "<fixture>/sys"); libpci reads <sys_dir>/bus/pci.
 * pci_ids is the pci.ids file (a missing one is a warning: names stay NULL).
 * Returns 0 with an inventory (possibly without any device), or a negative errno with *ret_error set
 * ("cannot read /x/sys/bus/pci/devices: No such file or directory") when the tree is unusable. */
int probe_pci(const char *sys_dir, const char *pci_ids, Inventory **ret, char **ret_error);

Inventory *inventory_free(Inventory *inv);
DEFINE_CLEANUP_FUNC(Inventory *, inventory_free);

/* True when both list the same devices with the same attributes (warnings ignored). */
bool inventory_equal(const Inventory *a, const Inventory *b);

const char *probe_pci_kind_to_string(PciKind k);

/* Parses a vendor-specific PCI capability (cap[0] = 0x09, len bytes as the capability's own length
 * byte says). Not NVIDIA's vGPU signature: 0 with *ret_vgpu false. A vGPU capability: *ret_vgpu true,
 * and the host driver's version and branch ("550.127.05", "r550_00") with 0, or -EBADMSG when it has
 * no complete host driver record. */
int probe_parse_vgpu_capability(const uint8_t *cap, size_t len, bool *ret_vgpu, char **ret_version,
                                char **ret_branch);
