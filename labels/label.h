/* SPDX-License-Identifier: MIT */
/* Owns label sets and the label rules: Kubernetes name/value validation, GFD sanitising, and the
 * computation of the node's labels from the inventory (PCI-only set for now; NVML-backed GFD labels
 * join later through LabelInput). */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "config.h"
#include "gpu-nvml.h"
#include "macro.h"
#include "probe.h"

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

/* Product name from the pci.ids device name: the bracketed part when there is one
 * ("GH100[H100 SXM5 80GB]" → "H100 SXM5 80GB"), prefixed "NVIDIA " unless it already starts with
 * it, sanitised: "NVIDIA-H100-SXM5-80GB". Without a name: "NVIDIA-<device id, 4 hex digits>". */
char *label_product_from_pci(const PciDevice *gpu);

/* The product model NVML last gave a GPU (the sanitised NVML name, "NVIDIA-H100-80GB-HBM3"), kept
 * by the daemon across restarts so that the NVML-less label set names the GPU the same way. */
typedef struct LabelKnownProduct {
        char address[32];          /* PCI address, as PciDevice.address */
        uint16_t device_id;        /* used only while the GPU at address still has this id */
        char *product;
} LabelKnownProduct;

void label_known_products_free(LabelKnownProduct *p, size_t n);

/* Merges what the snapshot says into *list: one entry per NVML GPU with a usable name (replacing one
 * for the same address), entries of GPUs NVML does not list are kept while the inventory still has
 * that address and device id. Sets *ret_changed when the list changed. */
int label_known_products_update(LabelKnownProduct **list, size_t *n, const Inventory *inv,
                                const NvmlSnapshot *nvml, bool *ret_changed);

typedef struct LabelInput {
        const Inventory *inventory;
        const NvmlSnapshot *nvml;  /* NULL: NVML unavailable → the PCI-only set */
        const char *machine;       /* raw DMI product name, NULL if unreadable → "unknown" */
        const char *agent_state;   /* "ready" / "degraded" / "failed" */
        const char *version;       /* agent version */
        const char *kernel_release;/* gpu.driver.kernel, written only with NVML (the driver answered) */
        MigStrategy mig_strategy;
        SharingStrategy sharing;
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
