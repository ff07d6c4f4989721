/* SPDX-License-Identifier: MIT */
/* Owns <paths.state>/gpu-products: the product model NVML last gave each GPU, kept across restarts so
 * that the labels written while NVML is down (boot before the driver loads) name the GPU as GFD does
 * once NVML is up, and nodeSelectors on gpu.product do not flap. */
#pragma once

#include <stddef.h>

#include "label.h"

#define GPU_PRODUCTS_FILE "gpu-products"

/* Reads the file: 0 with the entries (none when the file is missing), -ELOOP for a symlink, -EBADMSG
 * for a file that is not ours. Malformed lines are skipped. */
int gpu_products_load(const char *state_dir, LabelKnownProduct **ret, size_t *ret_n);
/* Replaces the file atomically (the state directory is created when missing). */
int gpu_products_save(const char *state_dir, const LabelKnownProduct *p, size_t n);
