/* SPDX-License-Identifier: MIT */
/* Owns <paths.state>/gpu-products (gpu-products.h). One line per GPU: "<PCI address> <device id, 4 hex
 * digits> <product>", after a comment header; the product is a label value (no blank). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>

#include "fileio.h"
#include "gpu-products.h"
#include "strv.h"

#define GPU_PRODUCTS_MAX_SIZE (256 * 1024)

static bool address_ok(const char *s) {
        unsigned dom, bus, dev, fn;
        char extra;
        return strlen(s) < 32 && sscanf(s, "%x:%x:%x.%u%c", &dom, &bus, &dev, &fn, &extra) == 4;
}

int gpu_products_load(const char *state_dir, LabelKnownProduct **ret, size_t *ret_n) {
        _cleanup_free_ char *path = path_join(state_dir, GPU_PRODUCTS_FILE), *text = NULL;
        LabelKnownProduct *l = NULL;
        size_t n = 0;
        int r;

        *ret = NULL;
        *ret_n = 0;
        if (!path)
                return -ENOMEM;
        /* The state directory is ours, but a link planted there must not make us read elsewhere. */
        r = read_full_file_at(AT_FDCWD, path, READ_FILE_NOFOLLOW, GPU_PRODUCTS_MAX_SIZE, &text, NULL);
        if (r == -ENOENT)
                return 0;
        if (r == -EFBIG)
                return -EBADMSG;
        if (r < 0)
                return r;

        char *save = NULL;
        for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
                char address[64], product[128];
                unsigned device;
                char extra;

                if (line[0] == '#' || isempty(line))
                        continue;
                if (sscanf(line, "%63s %4x %127s %c", address, &device, product, &extra) != 3 ||
                    !address_ok(address) || !label_value_is_valid(product) || isempty(product))
                        continue;
                LabelKnownProduct *t = reallocarray(l, n + 1, sizeof(LabelKnownProduct));
                if (!t)
                        goto oom;
                l = t;
                l[n] = (LabelKnownProduct) { .device_id = (uint16_t) device, .product = strdup(product) };
                if (!l[n].product)
                        goto oom;
                snprintf(l[n].address, sizeof(l[n].address), "%s", address);
                n++;
        }
        *ret = l;
        *ret_n = n;
        return 0;
oom:
        label_known_products_free(l, n);
        return -ENOMEM;
}

int gpu_products_save(const char *state_dir, const LabelKnownProduct *p, size_t n) {
        _cleanup_free_ char *path = path_join(state_dir, GPU_PRODUCTS_FILE);
        _cleanup_free_ char *text = strdup("# gpu-node-agent: the product name NVML last gave each GPU, used for\n"
                                           "# nvidia.com/gpu.product while NVML is down. Safe to remove.\n");
        int r;

        if (!path || !text)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                char *t = strprintf("%s%s %04x %s\n", text, p[i].address, p[i].device_id, p[i].product);
                if (!t)
                        return -ENOMEM;
                free(text);
                text = t;
        }
        r = mkdir_p(state_dir, 0755);
        if (r < 0)
                return r;
        return write_file_atomic(path, NULL, text, strlen(text), 0644);
}
