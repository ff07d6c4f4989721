/* SPDX-License-Identifier: MIT */
/* Owns the helpers that label.c (label sets, the PCI-only set) and gfd.c (the NVML-backed GFD set)
 * share; not part of the labels API. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "label.h"

/* Puts key = model + suffix (suffix may be NULL). A value over 63 characters has its model part
 * shortened (suffix kept whole) with a warning; a value still invalid is left out with a warning. */
int label_put_checked(LabelSet *s, const char *key, const char *model, const char *suffix,
                      char ***warnings);

/* Puts key = decimal n (always valid). */
int label_put_uint(LabelSet *s, const char *key, uint64_t n);

/* GPUs grouped by product: each product once, in order of first appearance. */
typedef struct LabelModel {
        char *product;
        size_t count;
        const char *first_address; /* lowest PCI address among its GPUs (points into the caller's data) */
} LabelModel;

/* Groups n GPUs given as parallel arrays of product names and PCI addresses. */
int label_models_count(char *const *products, const char *const *addresses, size_t n, LabelModel **ret,
                       size_t *ret_n);
void label_models_free(LabelModel *m, size_t n);
/* The model with most GPUs, ties going to the lowest PCI address. */
size_t label_models_choose(const LabelModel *m, size_t n);
/* Appends the "more than one model" warning when n > 1. */
int label_models_warn(const LabelModel *m, size_t n, size_t chosen, char ***warnings);

/* Whether shared GPUs are renamed "<product>-SHARED": sharing on with more than one replica and
 * renameByDefault off, as in GFD. Both label sets follow it, so that gpu.product does not change
 * with NVML's state. */
bool label_sharing_renames(const LabelInput *in);

/* gpu.count and gpu.product (with the -SHARED suffix where label_sharing_renames()) from the PCI
 * inventory alone. */
int label_put_pci_models(LabelSet *s, const LabelInput *in, char ***warnings);

/* The NVML-backed GFD labels (gfd.c): versions, the chosen model's resource labels, MIG strategy
 * labels, sharing, mig.capable, mps.capable, vgpu.present, gpu.clique, gpu.driver.kernel. */
int label_put_gfd(LabelSet *s, const LabelInput *in, char ***warnings);
