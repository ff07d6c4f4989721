/* SPDX-License-Identifier: MIT */
/* Owns the NvmlSnapshot model's helpers (free, find, equal: what the stages compare to decide whether
 * anything changed) and the canonical MIG profile naming formula of labels.md. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "escape.h"
#include "gpu-nvml-internal.h"
#include "strv.h"

void gpu_nvml_mig_device_done(MigDeviceInfo *m) {
        free(m->uuid);
        free(m->profile);
        m->uuid = m->profile = NULL;
}

void gpu_info_done(GpuInfo *g) {
        if (!g)
                return;
        free(g->name);
        free(g->uuid);
        free(g->clique);
        g->nvlink_remotes = strv_free(g->nvlink_remotes);
        for (size_t i = 0; i < g->n_mig_devices; i++)
                gpu_nvml_mig_device_done(&g->mig_devices[i]);
        free(g->mig_devices);
        g->name = g->uuid = g->clique = NULL;
        g->mig_devices = NULL;
        g->n_mig_devices = 0;
}

NvmlSnapshot *gpu_nvml_snapshot_free(NvmlSnapshot *s) {
        if (!s)
                return NULL;
        for (size_t i = 0; i < s->n_gpus; i++)
                gpu_info_done(&s->gpus[i]);
        free(s->gpus);
        free(s->driver_version);
        free(s->nvml_version);
        strv_free(s->warnings);
        free(s);
        return NULL;
}

const GpuInfo *gpu_nvml_snapshot_find(const NvmlSnapshot *s, const char *pci_address) {
        if (!s || !pci_address)
                return NULL;
        for (size_t i = 0; i < s->n_gpus; i++)
                if (strcasecmp(s->gpus[i].pci_address, pci_address) == 0)
                        return &s->gpus[i];
        return NULL;
}

static bool mig_device_equal(const MigDeviceInfo *a, const MigDeviceInfo *b) {
        return a->index == b->index && a->gi_id == b->gi_id && a->ci_id == b->ci_id &&
               a->gi_profile_id == b->gi_profile_id && a->ci_profile_id == b->ci_profile_id &&
               a->placement_start == b->placement_start && a->placement_size == b->placement_size &&
               streq_ptr(a->uuid, b->uuid) && streq_ptr(a->profile, b->profile) &&
               a->memory_mib == b->memory_mib && a->multiprocessors == b->multiprocessors &&
               a->gi_slices == b->gi_slices && a->ci_slices == b->ci_slices &&
               a->copy_engines == b->copy_engines && a->decoders == b->decoders && a->encoders == b->encoders &&
               a->jpegs == b->jpegs && a->ofas == b->ofas;
}

static bool gpu_info_equal(const GpuInfo *a, const GpuInfo *b) {
        if (!streq(a->pci_address, b->pci_address) || a->nvml_index != b->nvml_index ||
            !streq_ptr(a->name, b->name) || !streq_ptr(a->uuid, b->uuid) ||
            a->memory_total_bytes != b->memory_total_bytes || a->cc_major != b->cc_major ||
            a->cc_minor != b->cc_minor || a->minor != b->minor || a->mig_current != b->mig_current ||
            a->mig_pending != b->mig_pending || !streq_ptr(a->clique, b->clique) ||
            a->nvlink_known != b->nvlink_known || !strv_equal(a->nvlink_remotes, b->nvlink_remotes) ||
            a->n_mig_devices != b->n_mig_devices)
                return false;
        for (size_t i = 0; i < a->n_mig_devices; i++)
                if (!mig_device_equal(&a->mig_devices[i], &b->mig_devices[i]))
                        return false;
        return true;
}

bool gpu_nvml_snapshot_equal(const NvmlSnapshot *a, const NvmlSnapshot *b) {
        if (!a || !b)
                return a == b;
        if (!streq_ptr(a->driver_version, b->driver_version) || a->cuda_version != b->cuda_version ||
            !streq_ptr(a->nvml_version, b->nvml_version) || a->n_gpus != b->n_gpus)
                return false;
        for (size_t i = 0; i < a->n_gpus; i++)
                if (!gpu_info_equal(&a->gpus[i], &b->gpus[i]))
                        return false;
        return true;
}

char *gpu_mig_profile_name(unsigned gi_slices, unsigned ci_slices, uint64_t memory_mib, uint64_t total_bytes,
                           const char *suffix) {
        uint64_t eighths, total_gib, gb;

        /* Garbage in (a MIG device larger than its GPU, zero sizes) gives no name rather than a wrong one. */
        if (gi_slices == 0 || ci_slices == 0 || ci_slices > gi_slices || memory_mib == 0 || total_bytes == 0 ||
            total_bytes > (UINT64_C(1) << 55) || memory_mib > (total_bytes >> 20) + 1)
                return NULL;

        /* labels.md: GB = round(ceil(8 × memMiB × 2^20 / totalBytes) / 8 × ceil(totalBytes / 2^30)).
         * Integer arithmetic: eighths × GiB / 8 rounded half away from zero is (eighths × GiB + 4) / 8 for
         * these non-negative numbers — exactly round(), never rint()'s half-to-even (H200 3g: 70.5 → 71). */
        eighths = ((memory_mib << 23) + total_bytes - 1) / total_bytes;
        total_gib = (total_bytes + (UINT64_C(1) << 30) - 1) >> 30;
        gb = (eighths * total_gib + 4) / 8;

        if (ci_slices != gi_slices)
                return strprintf("%uc.%ug.%" PRIu64 "gb%s", ci_slices, gi_slices, gb, suffix ?: "");
        return strprintf("%ug.%" PRIu64 "gb%s", gi_slices, gb, suffix ?: "");
}

/* ---- Checks on strings from NVML and from workers ------------------------------------------------------- */

static bool hex_or_dash(char c) {
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') || c == '-';
}

bool gpu_nvml_uuid_is_valid(const char *s, const char *prefix) {
        size_t n;

        if (!s || !startswith(s, prefix))
                return false;
        n = strlen(s);
        s += strlen(prefix);
        if (n > GPU_NVML_UUID_MAX || !*s || *s == '-')
                return false;
        for (; *s; s++)
                if (!hex_or_dash(*s))
                        return false;
        return true;
}

bool gpu_nvml_version_is_valid(const char *s) {
        bool digit = false;

        if (!s || strlen(s) > 79)
                return false;
        for (; *s; s++) {
                if (*s >= '0' && *s <= '9')
                        digit = true;
                else if (*s == '.' && digit)
                        digit = false;
                else
                        return false;
        }
        return digit;
}

bool gpu_nvml_profile_is_valid(const char *s) {
        if (!s || !*s || strlen(s) > 32)
                return false;
        return s[strspn(s, "0123456789abcdefghijklmnopqrstuvwxyz.+-")] == '\0';
}

bool gpu_nvml_pci_address_is_valid(const char *s) {
        char again[32];

        return s && gpu_nvml_normalize_bus_id(s, again) >= 0 && streq(again, s);
}

static bool name_ok(const char *s) {
        return !s || (*s && strlen(s) <= GPU_NVML_STRING_MAX);
}

int gpu_nvml_snapshot_check(const NvmlSnapshot *s, const char **ret_what) {
        const char *what = NULL;

        if (s->driver_version && !gpu_nvml_version_is_valid(s->driver_version))
                what = "the driver version";
        else if (s->nvml_version && !gpu_nvml_version_is_valid(s->nvml_version))
                what = "the NVML version";
        STRV_FOREACH(w, s->warnings)
                if (!what && (strlen(*w) > 4096 || string_has_control(*w) || !utf8_is_valid(*w)))
                        what = "a warning";
        for (size_t i = 0; !what && i < s->n_gpus; i++) {
                const GpuInfo *g = &s->gpus[i];

                if (!gpu_nvml_pci_address_is_valid(g->pci_address))
                        what = "a GPU's PCI address";
                else if (!name_ok(g->name))
                        what = "a GPU's name";
                else if (g->uuid && !gpu_nvml_uuid_is_valid(g->uuid, "GPU-"))
                        what = "a GPU's UUID";
                else if (g->clique && (strlen(g->clique) > 64 ||
                                       g->clique[strspn(g->clique, "0123456789abcdef-.")] != '\0'))
                        what = "a GPU's fabric clique";
                STRV_FOREACH(a, g->nvlink_remotes)
                        if (!what && !gpu_nvml_pci_address_is_valid(*a))
                                what = "an NVLink's far end";
                for (size_t k = 0; !what && k < g->n_mig_devices; k++) {
                        const MigDeviceInfo *m = &g->mig_devices[k];
                        if (m->uuid && !gpu_nvml_uuid_is_valid(m->uuid, "MIG-"))
                                what = "a MIG device's UUID";
                        else if (m->profile && !gpu_nvml_profile_is_valid(m->profile))
                                what = "a MIG device's profile name";
                }
        }
        if (ret_what)
                *ret_what = what;
        return what ? -EBADMSG : 0;
}
