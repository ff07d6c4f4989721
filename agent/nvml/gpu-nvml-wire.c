/* SPDX-License-Identifier: MIT */
/* Owns the NVML worker's wire format (see gpu-nvml-worker.h): frame building, bounds-checked reading, and
 * the NvmlSnapshot encoding. A malformed frame is a protocol error, never a crash: the reader marks itself
 * bad and everything after reads as zero/NULL. */
#include <stdlib.h>
#include <string.h>

#include "gpu-nvml-worker.h"
#include "strv.h"

#define NULL_STRING UINT32_MAX

static void put(WireBuf *b, const void *p, size_t n) {
        if (b->oom)
                return;
        if (b->len + n > b->cap) {
                size_t cap = b->cap ? b->cap : 256;
                uint8_t *d;

                while (cap < b->len + n)
                        cap *= 2;
                d = realloc(b->data, cap);
                if (!d) {
                        b->oom = true;
                        return;
                }
                b->data = d;
                b->cap = cap;
        }
        memcpy(b->data + b->len, p, n);
        b->len += n;
}

void wire_begin(WireBuf *b, GpuNvmlWireType type) {
        b->len = 0;
        b->oom = false;
        wire_put_u32(b, 0);
        wire_put_u32(b, (uint32_t) type);
}

int wire_end(WireBuf *b) {
        uint32_t len;

        if (b->oom)
                return -ENOMEM;
        if (b->len - 8 > GPU_NVML_WIRE_MAX)
                return -EMSGSIZE;
        len = (uint32_t) (b->len - 8);
        memcpy(b->data, &len, sizeof len);
        return 0;
}

void wire_put_u32(WireBuf *b, uint32_t v) {
        put(b, &v, sizeof v);
}

void wire_put_u64(WireBuf *b, uint64_t v) {
        put(b, &v, sizeof v);
}

void wire_put_i32(WireBuf *b, int32_t v) {
        put(b, &v, sizeof v);
}

void wire_put_str(WireBuf *b, const char *s) {
        size_t n = s ? strlen(s) : 0;

        if (s && n >= NULL_STRING) {
                b->oom = true;
                return;
        }
        wire_put_u32(b, s ? (uint32_t) n : NULL_STRING);
        if (s)
                put(b, s, n);
}

void wire_buf_done(WireBuf *b) {
        b->data = mfree(b->data);
        b->len = b->cap = 0;
}

static bool get(WireReader *r, void *p, size_t n) {
        if (r->bad || r->left < n) {
                r->bad = true;
                memset(p, 0, n);
                return false;
        }
        memcpy(p, r->p, n);
        r->p += n;
        r->left -= n;
        return true;
}

uint32_t wire_get_u32(WireReader *r) {
        uint32_t v;
        (void) get(r, &v, sizeof v);
        return v;
}

uint64_t wire_get_u64(WireReader *r) {
        uint64_t v;
        (void) get(r, &v, sizeof v);
        return v;
}

int32_t wire_get_i32(WireReader *r) {
        int32_t v;
        (void) get(r, &v, sizeof v);
        return v;
}

char *wire_get_str(WireReader *r) {
        uint32_t n = wire_get_u32(r);
        char *s;

        if (r->bad || n == NULL_STRING)
                return NULL;
        if (n > r->left || n > GPU_NVML_WIRE_STR_MAX) {
                r->bad = true;
                return NULL;
        }
        s = strndup((const char *) r->p, n);
        if (!s || strlen(s) != n) { /* no NUL inside a string */
                free(s);
                r->bad = true;
                return NULL;
        }
        r->p += n;
        r->left -= n;
        return s;
}

static void put_mig_device(WireBuf *b, const MigDeviceInfo *m) {
        const unsigned v[] = { m->index, m->gi_id, m->ci_id, m->gi_profile_id, m->ci_profile_id,
                               m->placement_start, m->placement_size, m->multiprocessors, m->gi_slices,
                               m->ci_slices, m->copy_engines, m->decoders, m->encoders, m->jpegs, m->ofas };

        for (size_t i = 0; i < ELEMENTSOF(v); i++)
                wire_put_u32(b, v[i]);
        wire_put_u64(b, m->memory_mib);
        wire_put_str(b, m->uuid);
        wire_put_str(b, m->profile);
}

static void get_mig_device(WireReader *r, MigDeviceInfo *m) {
        unsigned *v[] = { &m->index, &m->gi_id, &m->ci_id, &m->gi_profile_id, &m->ci_profile_id,
                          &m->placement_start, &m->placement_size, &m->multiprocessors, &m->gi_slices,
                          &m->ci_slices, &m->copy_engines, &m->decoders, &m->encoders, &m->jpegs, &m->ofas };

        for (size_t i = 0; i < ELEMENTSOF(v); i++)
                *v[i] = wire_get_u32(r);
        m->memory_mib = wire_get_u64(r);
        m->uuid = wire_get_str(r);
        m->profile = wire_get_str(r);
}

void wire_put_snapshot(WireBuf *b, const NvmlSnapshot *s) {
        wire_put_str(b, s->driver_version);
        wire_put_i32(b, s->cuda_version);
        wire_put_str(b, s->nvml_version);
        wire_put_u32(b, (uint32_t) strv_length(s->warnings));
        STRV_FOREACH(w, s->warnings)
                wire_put_str(b, *w);
        wire_put_u32(b, (uint32_t) s->n_gpus);
        for (size_t i = 0; i < s->n_gpus; i++) {
                const GpuInfo *g = &s->gpus[i];

                wire_put_str(b, g->pci_address);
                wire_put_u32(b, g->nvml_index);
                wire_put_str(b, g->name);
                wire_put_str(b, g->uuid);
                wire_put_u64(b, g->memory_total_bytes);
                wire_put_i32(b, g->cc_major);
                wire_put_i32(b, g->cc_minor);
                wire_put_i32(b, g->minor);
                wire_put_i32(b, g->mig_current);
                wire_put_i32(b, g->mig_pending);
                wire_put_str(b, g->clique);
                wire_put_u32(b, g->nvlink_known);
                wire_put_u32(b, (uint32_t) strv_length(g->nvlink_remotes));
                STRV_FOREACH(a, g->nvlink_remotes)
                        wire_put_str(b, *a);
                wire_put_u32(b, (uint32_t) g->n_mig_devices);
                for (size_t k = 0; k < g->n_mig_devices; k++)
                        put_mig_device(b, &g->mig_devices[k]);
        }
}

static bool mig_mode_ok(int32_t v) {
        return v >= 0 && v < _GPU_MIG_MODE_MAX;
}

int wire_get_snapshot(WireReader *r, NvmlSnapshot **ret) {
        _cleanup_(gpu_nvml_snapshot_freep) NvmlSnapshot *s = calloc(1, sizeof *s);
        uint32_t n;

        if (!s)
                return -ENOMEM;
        s->driver_version = wire_get_str(r);
        s->cuda_version = wire_get_i32(r);
        s->nvml_version = wire_get_str(r);
        n = wire_get_u32(r);
        if (n > r->left)
                return -EBADMSG;
        for (uint32_t i = 0; i < n && !r->bad; i++)
                if (strv_consume(&s->warnings, wire_get_str(r)) < 0 && !r->bad)
                        return -ENOMEM;
        n = wire_get_u32(r);
        if (n > r->left / 16)
                return -EBADMSG;
        s->gpus = calloc(n ?: 1, sizeof *s->gpus);
        if (!s->gpus)
                return -ENOMEM;
        for (uint32_t i = 0; i < n && !r->bad; i++) {
                GpuInfo *g = &s->gpus[s->n_gpus++];
                _cleanup_free_ char *address = wire_get_str(r);
                uint32_t m;

                if (!address || strlen(address) >= sizeof g->pci_address)
                        return -EBADMSG;
                strcpy(g->pci_address, address);
                g->nvml_index = wire_get_u32(r);
                g->name = wire_get_str(r);
                g->uuid = wire_get_str(r);
                g->memory_total_bytes = wire_get_u64(r);
                g->cc_major = wire_get_i32(r);
                g->cc_minor = wire_get_i32(r);
                g->minor = wire_get_i32(r);
                g->mig_current = wire_get_i32(r);
                g->mig_pending = wire_get_i32(r);
                g->clique = wire_get_str(r);
                g->nvlink_known = wire_get_u32(r) != 0;
                m = wire_get_u32(r);
                if (m > r->left / 4)
                        return -EBADMSG;
                for (uint32_t k = 0; k < m; k++) {
                        char *a = wire_get_str(r);
                        if (!a || strlen(a) >= sizeof g->pci_address) {
                                free(a);
                                return -EBADMSG;
                        }
                        if (strv_consume(&g->nvlink_remotes, a) < 0)
                                return -ENOMEM;
                }
                if (!mig_mode_ok(g->mig_current) || !mig_mode_ok(g->mig_pending))
                        return -EBADMSG;
                m = wire_get_u32(r);
                if (m > r->left / 16)
                        return -EBADMSG;
                if (m > 0) {
                        g->mig_devices = calloc(m, sizeof *g->mig_devices);
                        if (!g->mig_devices)
                                return -ENOMEM;
                }
                for (uint32_t k = 0; k < m && !r->bad; k++)
                        get_mig_device(r, &g->mig_devices[g->n_mig_devices++]);
        }
        if (r->bad || r->left != 0)
                return -EBADMSG;
        /* The worker checked NVML's strings; one that did not was crashed or subverted. */
        if (gpu_nvml_snapshot_check(s, NULL) < 0)
                return -EBADMSG;
        *ret = TAKE_PTR(s);
        return 0;
}
