/* SPDX-License-Identifier: MIT */
/* Owns label sets and the label rules: Kubernetes name/value validation, GFD sanitising, and the
 * computation of the node's labels from a plain input model (LabelInput: the GPUs as PCI sees them,
 * what NVML said of them, the labelling options), which the daemon fills from its probe, its NVML
 * snapshot and its configuration (agent/stage-labels.c). Nothing here knows the daemon's types. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "macro.h"

#define LABEL_PREFIX "nvidia.com/"

typedef struct Label {
        char *key;   /* full name, e.g. "nvidia.com/gpu.count" */
        char *value;
} Label;

typedef struct LabelSet {
        Label *labels; /* kept sorted by key */
        size_t n;
} LabelSet;

LabelSet *label_set_new(void);
LabelSet *label_set_free(LabelSet *s);
DEFINE_CLEANUP_FUNC(LabelSet *, label_set_free);

/* Adds or replaces key=value. -EINVAL when the key or value breaks the Kubernetes rules. */
int label_set_put(LabelSet *s, const char *key, const char *value);
const char *label_set_get(const LabelSet *s, const char *key);
bool label_set_equal(const LabelSet *a, const LabelSet *b);

/* Kubernetes rules: optional DNS-subdomain prefix (≤253) + "/" + name (≤63,
 * [A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?); value empty or ≤63 of the same charset. */
bool label_key_is_valid(const char *key);
bool label_value_is_valid(const char *value);

/* GFD sanitising: drop characters outside [A-Za-z0-9-_. ], split on whitespace, join with '-'.
 * Returns NULL on OOM. */
char *label_sanitize(const char *s);

/* One NVIDIA GPU as PCI sees it. */
typedef struct LabelPciGpu {
        char address[32];          /* PCI address, "0000:3b:00.0" */
        uint16_t vendor_id;
        uint16_t device_id;
        uint16_t subsystem_vendor_id;
        uint16_t subsystem_device_id;
        uint32_t class_code;       /* 24 bits: 0x030200 */
        const char *name;          /* pci.ids device name, e.g. "GH100 [H100 SXM5 80GB]"; NULL if unknown */
        bool vgpu;                 /* a vGPU guest's GPU */
        const char *vgpu_host_driver_version; /* the host driver's, NULL when not known */
        const char *vgpu_host_driver_branch;
} LabelPciGpu;

typedef enum LabelMigMode {
        LABEL_MIG_UNSUPPORTED,     /* not a MIG-capable GPU */
        LABEL_MIG_DISABLED,
        LABEL_MIG_ENABLED,
        LABEL_MIG_UNKNOWN,         /* NVML could not say */
} LabelMigMode;

/* One MIG device as NVML describes it. */
typedef struct LabelMigDevice {
        unsigned index;            /* within its parent GPU */
        unsigned gi_id;            /* GPU instance id */
        unsigned ci_id;            /* compute instance id within the GI */
        const char *profile;       /* canonical name: "1g.10gb", "1g.10gb+me"; NULL if unknown */
        uint64_t memory_mib;
        unsigned multiprocessors;
        unsigned gi_slices;
        unsigned ci_slices;
        unsigned copy_engines, decoders, encoders, jpegs, ofas;
} LabelMigDevice;

/* One GPU as NVML describes it; fields NVML could not answer are NULL / 0 / -1. */
typedef struct LabelNvmlGpu {
        char pci_address[32];      /* matches LabelPciGpu.address */
        const char *name;          /* "NVIDIA H100 80GB HBM3" */
        uint64_t memory_total_bytes;
        int cc_major, cc_minor;
        LabelMigMode mig_current;
        const LabelMigDevice *mig_devices;
        size_t n_mig_devices;
        const char *clique;        /* NVLink "<clusterUUID>.<cliqueId>", NULL when none */
} LabelNvmlGpu;

/* What NVML said of the node: GPUs in PCI address order, one per GPU NVML knows. */
typedef struct LabelNvml {
        const char *driver_version; /* "550.54.15", NULL when unknown */
        int cuda_version;          /* 12040 = 12.4; 0 unknown */
        const LabelNvmlGpu *gpus;
        size_t n_gpus;
} LabelNvml;

/* How MIG devices are published (labels.mig-strategy). */
typedef enum LabelMigStrategy {
        LABEL_MIG_STRATEGY_NONE,
        LABEL_MIG_STRATEGY_SINGLE,
        LABEL_MIG_STRATEGY_MIXED,
        _LABEL_MIG_STRATEGY_MAX,
} LabelMigStrategy;

/* How GPUs are shared (sharing.strategy). */
typedef enum LabelSharing {
        LABEL_SHARING_NONE,
        LABEL_SHARING_TIME_SLICING,
        LABEL_SHARING_MPS,
        _LABEL_SHARING_MAX,
} LabelSharing;

/* Product name from the pci.ids device name: the bracketed part when there is one
 * ("GH100[H100 SXM5 80GB]" → "H100 SXM5 80GB"), prefixed "NVIDIA " unless it already starts with
 * it, sanitised: "NVIDIA-H100-SXM5-80GB". Without a name: "NVIDIA-<device id, 4 hex digits>". */
char *label_product_from_pci(const LabelPciGpu *gpu);

/* The product model NVML last gave a GPU (the sanitised NVML name, "NVIDIA-H100-80GB-HBM3"), kept
 * by the daemon across restarts so that the NVML-less label set names the GPU the same way. */
typedef struct LabelKnownProduct {
        char address[32];          /* PCI address, as LabelPciGpu.address */
        uint16_t device_id;        /* used only while the GPU at address still has this id */
        char *product;
} LabelKnownProduct;

void label_known_products_free(LabelKnownProduct *p, size_t n);

/* Merges what NVML says into *list: one entry per NVML GPU with a usable name that PCI lists too
 * (replacing one for the same address), entries of GPUs NVML does not list are kept while PCI still
 * lists that address with that device id. Sets *ret_changed when the list changed. */
int label_known_products_update(LabelKnownProduct **list, size_t *n, const LabelPciGpu *pci_gpus,
                                size_t n_pci_gpus, const LabelNvml *nvml, bool *ret_changed);

typedef struct LabelInput {
        const LabelPciGpu *pci_gpus; /* the node's NVIDIA GPUs, in PCI address order */
        size_t n_pci_gpus;
        const LabelNvml *nvml;     /* NULL: NVML unavailable → the PCI-only set */
        const char *machine;       /* raw DMI product name, NULL if unreadable → "unknown" */
        const char *agent_state;   /* "ready" / "degraded" / "failed" */
        const char *version;       /* agent version */
        const char *kernel_release;/* gpu.driver.kernel, written only with NVML (the driver answered) */
        LabelMigStrategy mig_strategy;
        LabelSharing sharing;
        unsigned replicas;         /* ≥ 1 */
        bool rename_by_default;
        const char *mig_config;    /* mig.config: the selected MIG geometry's name, NULL = none */
        const char *mig_config_state; /* mig.config.state, NULL = none */
        uint64_t timestamp_sec;    /* gfd.timestamp, 0 = not written */
        /* Without NVML, gpu.product of a GPU listed here is this (NVML's name when it last answered)
         * instead of the pci.ids name, so that nodeSelectors do not change with NVML's state. */
        const LabelKnownProduct *known_products;
        size_t n_known_products;
        const char *gpu_health;    /* gpu.health: "ok" / "degraded" / "failed", NULL = not watched (no
                                    * gpu.health nor gpu-node-agent.unhealthy-gpus label) */
        unsigned unhealthy_gpus;   /* gpu-node-agent.unhealthy-gpus, with gpu_health */
} LabelInput;

/* Computes the label set. With no GPU returns 0 and an empty set. Warnings (e.g. heterogeneous node:
 * which model was chosen) are appended to *warnings when non-NULL. */
int labels_compute(const LabelInput *in, LabelSet **ret, char ***warnings);

/* Reads <sys_dir>/class/dmi/id/product_name; NULL (and 0) when absent or unreadable. */
int label_read_machine(const char *sys_dir, char **ret);
