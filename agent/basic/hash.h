/* SPDX-License-Identifier: MIT */
/* FNV-1a (Fowler–Noll–Vo), 32 and 64 bit: the one non-cryptographic hash of the code base, stable across
 * builds and architectures. Its users only need "did this change" or "is this the same text": the driver
 * options digest (modules/driver-state.c), the MIG profile cache's checksum (agent/mig/mig-cache.c) and
 * the short suffix of a shortened label value (labels/label.c). Nothing relies on it against a forger. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define FNV1A64_INIT UINT64_C(0xcbf29ce484222325)
#define FNV1A32_INIT UINT32_C(0x811c9dc5)

/* Continues the hash h over n bytes of p (start with FNV1A64_INIT). */
static inline uint64_t fnv1a64(uint64_t h, const void *p, size_t n) {
        const unsigned char *b = p;

        for (size_t i = 0; i < n; i++) {
                h ^= b[i];
                h *= UINT64_C(0x100000001b3);
        }
        return h;
}

/* The 32-bit hash of a NUL-terminated string. */
static inline uint32_t fnv1a32_string(const char *s) {
        uint32_t h = FNV1A32_INIT;

        for (; *s; s++) {
                h ^= (unsigned char) *s;
                h *= UINT32_C(0x01000193);
        }
        return h;
}
