/* SPDX-License-Identifier: MIT */
/* Owns turning NVML's answers into an NvmlSnapshot: which GPUs NVML knows, their static facts (cached in
 * GpuNvml), MIG mode, MIG devices with their canonical profile names, fabric clique. The
 * snapshot's helpers and the profile naming formula are in gpu-nvml-snapshot.c.
 *
 * NVML calls per read, for G GPUs NVML knows (the benchmarks and tests count them):
 *   first read:   3 system versions + per GPU 8 (handle by bus id, index (when exported), name, UUID,
 *                 memory, compute capability, minor, MIG mode) + 1 fabric (when exported); a GPU NVML
 *                 does not know costs its handle lookup once; + NVLink (gpu-nvml-nvlink.c): 1 state
 *                 call when not supported, else per link 1 state + 1 remote PCI info when active
 *   every read:   per GPU 1 MIG mode (0 once NOT_SUPPORTED) + 1 fabric (0 once NOT_SUPPORTED)
 *   MIG enabled:  + 1 max MIG device count (first time), + per GPU model once: one profile info call per
 *                 profile index until INVALID_ARGUMENT, + per slot 1 handle (NOT_FOUND = empty), + per MIG
 *                 device 1 UUID, and for a device not known by that UUID from the last read (new, or
 *                 read with a warning) 5 more (attributes, GI id, CI id, CI by id, CI info; without
 *                 nvmlGpuInstanceGetComputeInstanceById the last two become one CI profile info call per
 *                 (GI profile, CI slices) and model, once), + per GPU instance of such devices 2 (GI by
 *                 id, GI info: its profile id and placement; cheaper than GetGpuInstances per profile,
 *                 which costs one call per profile even for a GPU with one instance)
 *   every failed call adds 1 nvmlErrorString. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

#include "escape.h"
#include "gpu-nvml-internal.h"
#include "strv.h"

/* Errors after which nothing NVML says can be trusted: NVML was shut down under us, the module went away,
 * or the module was replaced by another version. The whole read fails so that the stage reopens NVML. */
static bool nvml_error_is_fatal(int r) {
        return r == -EBADFD || r == -ENODEV || r == -EPROTO;
}

static int warn(NvmlSnapshot *s, const char *fmt, ...) _printf_(2, 3);
static int warn(NvmlSnapshot *s, const char *fmt, ...) {
        va_list ap;
        char *line = NULL;
        int r;

        va_start(ap, fmt);
        r = vasprintf(&line, fmt, ap);
        va_end(ap);
        if (r < 0)
                return -ENOMEM;
        return strv_consume(&s->warnings, line);
}

/* A failed call for one GPU: a warning naming GPU and call, unless NVML as a whole is gone. */
static int gpu_call_failed(GpuNvml *n, NvmlSnapshot *s, const char *address, int r) {
        if (r == -ENOMEM)
                return r;
        if (nvml_error_is_fatal(r))
                return r;
        return warn(s, "GPU %s: %s; the value is left unknown.", address, gpu_nvml_last_error(n));
}

static int read_system(GpuNvml *n, NvmlSnapshot *s) {
        char buf[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
        int r;

        if (!(n->system_facts & GPU_SYSTEM_DRIVER)) {
                buf[0] = '\0';
                r = gpu_nvml_system_get_driver_version(n, buf, sizeof buf);
                if (r >= 0 && *buf && !gpu_nvml_version_is_valid(buf)) {
                        if (warn(s, "NVML: nvmlSystemGetDriverVersion answered a string that is not a version "
                                 "(digits and dots); the driver version is unknown.") < 0)
                                return -ENOMEM;
                } else if (r >= 0 && *buf) {
                        n->driver_version = strdup(buf);
                        if (!n->driver_version)
                                return -ENOMEM;
                        n->system_facts |= GPU_SYSTEM_DRIVER;
                } else if (nvml_error_is_fatal(r))
                        return r;
                else if (warn(s, "NVML: %s; the driver version is unknown.",
                              r < 0 ? gpu_nvml_last_error(n) : "nvmlSystemGetDriverVersion: empty answer") < 0)
                        return -ENOMEM;
        }

        if (!(n->system_facts & GPU_SYSTEM_NVML)) {
                buf[0] = '\0';
                r = gpu_nvml_system_get_nvml_version(n, buf, sizeof buf);
                if (r >= 0 && *buf && !gpu_nvml_version_is_valid(buf)) {
                        if (warn(s, "NVML: nvmlSystemGetNVMLVersion answered a string that is not a version "
                                 "(digits and dots); the NVML version is unknown.") < 0)
                                return -ENOMEM;
                } else if (r >= 0 && *buf) {
                        n->nvml_version = strdup(buf);
                        if (!n->nvml_version)
                                return -ENOMEM;
                        n->system_facts |= GPU_SYSTEM_NVML;
                } else if (r == -ENOSYS)
                        n->system_facts |= GPU_SYSTEM_NVML;
                else if (nvml_error_is_fatal(r))
                        return r;
                else if (warn(s, "NVML: %s; the NVML version is unknown.",
                              r < 0 ? gpu_nvml_last_error(n) : "nvmlSystemGetNVMLVersion: empty answer") < 0)
                        return -ENOMEM;
        }

        if (!(n->system_facts & GPU_SYSTEM_CUDA)) {
                int v = 0;

                r = gpu_nvml_system_get_cuda_driver_version(n, &v);
                if (r >= 0 && v > 0) {
                        n->cuda_version = v;
                        n->system_facts |= GPU_SYSTEM_CUDA;
                } else if (r == -ENOSYS)
                        n->system_facts |= GPU_SYSTEM_CUDA;
                else if (nvml_error_is_fatal(r))
                        return r;
                else if (warn(s, "NVML: %s; the CUDA driver version is unknown.",
                              r < 0 ? gpu_nvml_last_error(n) : "nvmlSystemGetCudaDriverVersion: not a version") < 0)
                        return -ENOMEM;
        }

        if (n->driver_version && !(s->driver_version = strdup(n->driver_version)))
                return -ENOMEM;
        if (n->nvml_version && !(s->nvml_version = strdup(n->nvml_version)))
                return -ENOMEM;
        s->cuda_version = n->cuda_version;
        return 0;
}

/* Every GPU NVML lists, in PCI order, with its handle and index remembered in the cache. The list is
 * n's (kept for its lifetime): callers must not free it. */
int gpu_nvml_enumerate(GpuNvml *n, char ***ret, char **ret_error) {
        _cleanup_strv_free_ char **l = NULL;
        unsigned count = 0;
        int r;

        if (n->enumerated) {
                *ret = n->enumerated;
                return 0;
        }

        r = gpu_nvml_device_get_count(n, &count);
        if (r < 0) {
                *ret_error = strprintf("Cannot list GPUs through NVML: %s.", gpu_nvml_last_error(n));
                return r;
        }

        for (unsigned i = 0; i < count; i++) {
                nvmlPciInfo_t pci = {};
                nvmlDevice_t d = NULL;
                char address[32];
                GpuNvmlCached *c;

                r = gpu_nvml_device_get_handle_by_index(n, i, &d);
                if (r >= 0)
                        r = gpu_nvml_device_get_pci_info(n, d, &pci);
                if (r < 0) {
                        *ret_error = strprintf("Cannot list GPUs through NVML: GPU %u: %s.", i, gpu_nvml_last_error(n));
                        return r;
                }
                pci.busId[sizeof pci.busId - 1] = '\0';
                if (gpu_nvml_normalize_bus_id(pci.busId, address) < 0) {
                        string_clean(pci.busId);
                        *ret_error = strprintf("Cannot list GPUs through NVML: GPU %u has the PCI bus id \"%s\", "
                                               "which is not a PCI address.", i, pci.busId);
                        return -EBADMSG;
                }
                c = gpu_nvml_cached(n, address);
                if (!c)
                        return -ENOMEM;
                c->handle = d;
                c->absent = false;
                c->nvml_index = i;
                c->facts |= GPU_FACT_INDEX;
                if (strv_extend(&l, address) < 0)
                        return -ENOMEM;
        }
        strv_sort(l);
        if (!l && !(l = calloc(1, sizeof(char *))))
                return -ENOMEM;

        *ret = n->enumerated = TAKE_PTR(l);
        return 0;
}

/* NVML's handle for our address; *ret_present false when NVML does not know the GPU. */
static int gpu_handle(GpuNvml *n, NvmlSnapshot *s, GpuNvmlCached *c, bool *ret_present) {
        unsigned domain, bus, dev, fn;
        char bus_id[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
        int r;

        *ret_present = false;
        if (c->absent)
                return 0;
        if (c->handle) {
                *ret_present = true;
                return 0;
        }

        if (sscanf(c->pci_address, "%x:%x:%x.%x", &domain, &bus, &dev, &fn) != 4)
                return warn(s, "GPU %s: not a PCI address; skipped.", c->pci_address);
        /* NVML's own spelling, the one nvmlDeviceGetPciInfo reports. */
        snprintf(bus_id, sizeof bus_id, "%08X:%02X:%02X.%X", domain, bus, dev, fn);

        r = gpu_nvml_device_get_handle_by_pci_bus_id(n, bus_id, &c->handle);
        if (r == -ENOENT || r == -EINVAL) {
                /* vfio-pci, unbound, or hidden from NVML: not ours to describe, and NVML only looks for
                 * GPUs at init, so no need to ask again until it is reopened. */
                c->absent = true;
                c->handle = NULL;
                return 0;
        }
        if (r < 0) {
                c->handle = NULL;
                if (nvml_error_is_fatal(r))
                        return r;
                return warn(s, "GPU %s: %s; the GPU is left out.", c->pci_address, gpu_nvml_last_error(n));
        }
        *ret_present = true;
        return 0;
}

static int read_static_facts(GpuNvml *n, NvmlSnapshot *s, GpuNvmlCached *c, unsigned position) {
        char buf[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
        int r;

        if (!(c->facts & GPU_FACT_INDEX)) {
                r = gpu_nvml_device_get_index(n, c->handle, &c->nvml_index);
                if (r == -ENOSYS) {
                        /* NVML numbers GPUs in PCI order, as our list is. */
                        c->nvml_index = position;
                        c->facts |= GPU_FACT_INDEX;
                } else if (r >= 0)
                        c->facts |= GPU_FACT_INDEX;
                else if ((r = gpu_call_failed(n, s, c->pci_address, r)) < 0)
                        return r;
        }

        if (!(c->facts & GPU_FACT_NAME)) {
                buf[0] = '\0';
                r = gpu_nvml_device_get_name(n, c->handle, buf, sizeof buf);
                if (r >= 0 && !*buf)
                        r = warn(s, "GPU %s: nvmlDeviceGetName answered an empty name; the product is left unknown.",
                                 c->pci_address);
                else if (r >= 0) {
                        if (!(c->name = strdup(buf)))
                                return -ENOMEM;
                        c->facts |= GPU_FACT_NAME;
                } else
                        r = gpu_call_failed(n, s, c->pci_address, r);
                if (r < 0)
                        return r;
        }

        if (!(c->facts & GPU_FACT_UUID)) {
                buf[0] = '\0';
                r = gpu_nvml_device_get_uuid(n, c->handle, buf, sizeof buf);
                if (r >= 0 && !*buf)
                        r = warn(s, "GPU %s: nvmlDeviceGetUUID answered an empty UUID; the UUID is left unknown.",
                                 c->pci_address);
                else if (r >= 0 && !gpu_nvml_uuid_is_valid(buf, "GPU-"))
                        r = warn(s, "GPU %s: nvmlDeviceGetUUID answered a UUID that is not \"GPU-\" followed by "
                                 "hex digits and dashes; the UUID is left unknown (no UUID-named CDI device, no UUID "
                                 "label or metric).", c->pci_address);
                else if (r >= 0) {
                        if (!(c->uuid = strdup(buf)))
                                return -ENOMEM;
                        c->facts |= GPU_FACT_UUID;
                } else
                        r = gpu_call_failed(n, s, c->pci_address, r);
                if (r < 0)
                        return r;
        }

        if (!(c->facts & GPU_FACT_MEMORY)) {
                nvmlMemory_t mem = {};

                r = gpu_nvml_device_get_memory_info(n, c->handle, &mem);
                if (r >= 0 && mem.total == 0)
                        r = warn(s, "GPU %s: nvmlDeviceGetMemoryInfo reports 0 bytes of memory; the memory size "
                                 "is left unknown.", c->pci_address);
                else if (r >= 0) {
                        c->memory_total_bytes = mem.total;
                        c->facts |= GPU_FACT_MEMORY;
                } else
                        r = gpu_call_failed(n, s, c->pci_address, r);
                if (r < 0)
                        return r;
        }

        if (!(c->facts & GPU_FACT_CC)) {
                int major = -1, minor = -1;

                r = gpu_nvml_device_get_cuda_compute_capability(n, c->handle, &major, &minor);
                if (r >= 0 && (major <= 0 || minor < 0))
                        r = warn(s, "GPU %s: nvmlDeviceGetCudaComputeCapability answered %d.%d, which is not a "
                                 "compute capability; it is left unknown.", c->pci_address, major, minor);
                else if (r >= 0) {
                        c->cc_major = major;
                        c->cc_minor = minor;
                        c->facts |= GPU_FACT_CC;
                } else
                        r = gpu_call_failed(n, s, c->pci_address, r);
                if (r < 0)
                        return r;
        }

        if (!(c->facts & GPU_FACT_MINOR)) {
                unsigned minor = 0;

                r = gpu_nvml_device_get_minor_number(n, c->handle, &minor);
                if (r >= 0 && minor > 255)
                        r = warn(s, "GPU %s: nvmlDeviceGetMinorNumber answered %u, not a /dev/nvidia minor; it is "
                                 "left unknown.", c->pci_address, minor);
                else if (r >= 0) {
                        c->minor = (int) minor;
                        c->facts |= GPU_FACT_MINOR;
                } else
                        r = gpu_call_failed(n, s, c->pci_address, r);
                if (r < 0)
                        return r;
        }
        return 0;
}

static GpuMigMode mig_mode_from_nvml(unsigned m) {
        return m == NVML_DEVICE_MIG_ENABLE ? GPU_MIG_ENABLED :
               m == NVML_DEVICE_MIG_DISABLE ? GPU_MIG_DISABLED : _GPU_MIG_MODE_INVALID;
}

static int read_mig_mode(GpuNvml *n, NvmlSnapshot *s, GpuNvmlCached *c, GpuInfo *g) {
        unsigned current = 0, pending = 0;
        int r;

        g->mig_current = g->mig_pending = GPU_MIG_UNSUPPORTED;
        if (c->facts & GPU_FACT_NO_MIG)
                return 0;

        r = gpu_nvml_device_get_mig_mode(n, c->handle, &current, &pending);
        if (r == -EOPNOTSUPP || r == -ENOSYS) {
                c->facts |= GPU_FACT_NO_MIG;
                return 0;
        }
        g->mig_current = g->mig_pending = _GPU_MIG_MODE_INVALID;
        if (r < 0)
                return gpu_call_failed(n, s, c->pci_address, r);

        g->mig_current = mig_mode_from_nvml(current);
        g->mig_pending = mig_mode_from_nvml(pending);
        if (g->mig_current < 0 || g->mig_pending < 0)
                return warn(s, "GPU %s: nvmlDeviceGetMigMode answered modes %u/%u, which are neither disabled "
                            "nor enabled; the MIG mode is left unknown.", c->pci_address, current, pending);
        return 0;
}

static int read_fabric(GpuNvml *n, NvmlSnapshot *s, GpuNvmlCached *c, GpuInfo *g) {
        nvmlGpuFabricInfo_t f = {};
        const uint8_t *u = f.clusterUuid;
        int r;

        if (c->facts & GPU_FACT_NO_FABRIC)
                return 0;

        r = gpu_nvml_device_get_gpu_fabric_info(n, c->handle, &f);
        if (r == -EOPNOTSUPP || r == -ENOSYS || (r >= 0 && f.state == NVML_GPU_FABRIC_STATE_NOT_SUPPORTED)) {
                c->facts |= GPU_FACT_NO_FABRIC;
                return 0;
        }
        if (r < 0)
                return gpu_call_failed(n, s, c->pci_address, r);
        /* Still registering, or registration failed: no clique to advertise yet. */
        if (f.state != NVML_GPU_FABRIC_STATE_COMPLETED || f.status != NVML_SUCCESS)
                return 0;

        g->clique = strprintf("%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x.%u",
                              u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12],
                              u[13], u[14], u[15], f.cliqueId);
        return g->clique ? 0 : -ENOMEM;
}

/* The GPU instance profiles of c's model, asked once per model: which profile id is which index, and so
 * which attribute suffix its MIG devices' names carry. NULL (with a warning) when NVML cannot say. */
static int gpu_model(GpuNvml *n, NvmlSnapshot *s, GpuNvmlCached *c, GpuNvmlModel **ret) {
        _cleanup_free_ GpuNvmlGiProfile *profiles = NULL;
        size_t n_profiles = 0;
        GpuNvmlModel *m;
        int r;

        *ret = NULL;
        if (!c->name)
                return warn(s, "GPU %s: the model is unknown, so the MIG profile names are too.", c->pci_address);

        for (size_t i = 0; i < n->n_models; i++)
                if (streq(n->models[i].name, c->name)) {
                        *ret = &n->models[i];
                        return 0;
                }

        /* Newer drivers add indices (0..16 today): ask until NVML says the index does not exist. The bound
         * only protects against a library that never says so. */
        for (unsigned index = 0; index < 64; index++) {
                nvmlGpuInstanceProfileInfo_v2_t info = {};
                const char *suffix;
                GpuNvmlGiProfile *p;

                r = gpu_nvml_device_get_gpu_instance_profile_info(n, c->handle, index, &info);
                if (r == -EINVAL || r == -ENOSYS)
                        break;
                if (r == -EOPNOTSUPP)
                        continue;
                if (r < 0)
                        return gpu_call_failed(n, s, c->pci_address, r);

                info.name[sizeof info.name - 1] = '\0';
                suffix = gpu_nvml_profile_suffix(index, info.name);

                p = realloc(profiles, (n_profiles + 1) * sizeof *p);
                if (!p)
                        return -ENOMEM;
                profiles = p;
                profiles[n_profiles] = (GpuNvmlGiProfile) { .id = info.id };
                snprintf(profiles[n_profiles].suffix, sizeof profiles[n_profiles].suffix, "%s", suffix);
                n_profiles++;
        }

        m = realloc(n->models, (n->n_models + 1) * sizeof *m);
        if (!m)
                return -ENOMEM;
        n->models = m;
        m = &n->models[n->n_models];
        *m = (GpuNvmlModel) { .name = strdup(c->name), .profiles = TAKE_PTR(profiles), .n_profiles = n_profiles };
        if (!m->name) {
                free(m->profiles);
                return -ENOMEM;
        }
        n->n_models++;
        *ret = m;
        return 0;
}

static const char *model_suffix(const GpuNvmlModel *m, unsigned gi_profile_id) {
        if (!m)
                return NULL;
        for (size_t i = 0; i < m->n_profiles; i++)
                if (m->profiles[i].id == gi_profile_id)
                        return m->profiles[i].suffix;
        return NULL;
}

typedef struct GiSeen {
        unsigned id;
        bool ok;
        nvmlGpuInstance_t handle;
        nvmlGpuInstanceInfo_t info;
} GiSeen;

/* The CI profile of a compute instance from its slice count, for drivers that cannot look a CI up by id:
 * the CI profile indices are per slice count (NVML_COMPUTE_INSTANCE_PROFILE_<C>_SLICE), and the index's
 * profile info names the id. One call per (GI profile, slice count) and model. */
static int ci_profile_from_slices(GpuNvml *n, NvmlSnapshot *s, GpuNvmlCached *c, GpuNvmlModel *model,
                                  const GiSeen *gi, unsigned ci_slices, unsigned *ret) {
        static const unsigned index_by_slices[] = {
                [1] = NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, [2] = NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
                [3] = NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, [4] = NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
                [6] = NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE, [7] = NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
                [8] = NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE,
        };
        nvmlComputeInstanceProfileInfo_v2_t info = {};
        GpuNvmlCiProfile *p;
        int r;

        if (model)
                for (size_t i = 0; i < model->n_ci_profiles; i++)
                        if (model->ci_profiles[i].gi_profile_id == gi->info.profileId &&
                            model->ci_profiles[i].ci_slices == ci_slices) {
                                *ret = model->ci_profiles[i].id;
                                return 0;
                        }

        if (ci_slices >= ELEMENTSOF(index_by_slices) || (ci_slices != 1 && index_by_slices[ci_slices] == 0))
                return warn(s, "GPU %s: a compute instance of %u slices has no CI profile; its profile id is left "
                            "unknown.", c->pci_address, ci_slices);

        r = gpu_nvml_gpu_instance_get_compute_instance_profile_info(n, gi->handle, index_by_slices[ci_slices],
                                                                    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                                                                    &info);
        if (r < 0)
                return gpu_call_failed(n, s, c->pci_address, r);
        if (info.sliceCount != ci_slices)
                return warn(s, "GPU %s: compute instance profile index %u has %u slices, not %u; the CI profile id "
                            "is left unknown.", c->pci_address, index_by_slices[ci_slices], info.sliceCount,
                            ci_slices);
        *ret = info.id;

        if (!model)
                return 0;
        p = realloc(model->ci_profiles, (model->n_ci_profiles + 1) * sizeof *p);
        if (!p)
                return -ENOMEM;
        model->ci_profiles = p;
        p[model->n_ci_profiles++] = (GpuNvmlCiProfile) { gi->info.profileId, ci_slices, info.id };
        return 0;
}

int gpu_nvml_mig_device_compare(const void *a, const void *b) {
        const MigDeviceInfo *x = a, *y = b;

        if (x->gi_id != y->gi_id)
                return x->gi_id < y->gi_id ? -1 : 1;
        if (x->ci_id != y->ci_id)
                return x->ci_id < y->ci_id ? -1 : 1;
        return x->index < y->index ? -1 : x->index > y->index;
}

/* A device the last read knew, by UUID (an instance keeps its UUID for its whole life). */
static MigDeviceInfo *mig_known_find(GpuNvmlCached *c, const char *uuid) {
        for (size_t k = 0; k < c->n_mig_known; k++)
                if (streq_ptr(c->mig_known[k].uuid, uuid))
                        return &c->mig_known[k];
        return NULL;
}

/* *m = *from with its own strings, at slot index. */
static int mig_device_copy(const MigDeviceInfo *from, unsigned index, MigDeviceInfo *m) {
        *m = *from;
        m->index = index;
        m->uuid = m->profile = NULL;
        if ((from->uuid && !(m->uuid = strdup(from->uuid))) || (from->profile && !(m->profile = strdup(from->profile)))) {
                gpu_nvml_mig_device_done(m);
                return -ENOMEM;
        }
        return 0;
}

/* One MIG device in slot i; *ret_found false for an empty slot. A device known by UUID from the last read
 * costs only its handle and UUID. */
static int read_mig_device(GpuNvml *n, NvmlSnapshot *s, GpuNvmlCached *c, GpuNvmlModel *model,
                           GiSeen *gis, size_t *n_gis, unsigned i, MigDeviceInfo *m, bool *ret_found) {
        char buf[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = "";
        nvmlDeviceAttributes_t a = {};
        nvmlDevice_t md = NULL;
        nvmlComputeInstance_t ci = NULL;
        nvmlComputeInstanceInfo_t ci_info = {};
        bool have_attr = false, have_ids = false;
        GiSeen *gi = NULL;
        int r;

        *ret_found = false;
        *m = (MigDeviceInfo) { .index = i };

        r = gpu_nvml_device_get_mig_device_handle_by_index(n, c->handle, i, &md);
        if (r == -ENOENT)
                return 0;
        if (r < 0)
                return gpu_call_failed(n, s, c->pci_address, r);
        *ret_found = true;

        r = gpu_nvml_device_get_uuid(n, md, buf, sizeof buf);
        if (r >= 0 && *buf && !gpu_nvml_uuid_is_valid(buf, "MIG-"))
                /* Also NVML's pre-R470 "MIG-GPU-<uuid>/<gi>/<ci>", whose '/' no CDI name may hold. */
                r = warn(s, "GPU %s: MIG device %u: nvmlDeviceGetUUID answered a UUID that is not \"MIG-\" "
                         "followed by hex digits and dashes; the UUID is left unknown.", c->pci_address, i);
        else if (r >= 0 && *buf) {
                MigDeviceInfo *k = mig_known_find(c, buf);
                if (k)
                        return mig_device_copy(k, i, m);
                if (!(m->uuid = strdup(buf)))
                        return -ENOMEM;
        } else if (r >= 0)
                r = warn(s, "GPU %s: MIG device %u has an empty UUID.", c->pci_address, i);
        else
                r = gpu_call_failed(n, s, c->pci_address, r);
        if (r < 0)
                return r;

        r = gpu_nvml_device_get_attributes(n, md, &a);
        if (r >= 0) {
                have_attr = true;
                m->memory_mib = a.memorySizeMB;
                m->multiprocessors = a.multiprocessorCount;
                m->gi_slices = a.gpuInstanceSliceCount;
                m->ci_slices = a.computeInstanceSliceCount;
                m->copy_engines = a.sharedCopyEngineCount;
                m->decoders = a.sharedDecoderCount;
                m->encoders = a.sharedEncoderCount;
                m->jpegs = a.sharedJpegCount;
                m->ofas = a.sharedOfaCount;
        } else if ((r = gpu_call_failed(n, s, c->pci_address, r)) < 0)
                return r;

        r = gpu_nvml_device_get_gpu_instance_id(n, md, &m->gi_id);
        if (r >= 0)
                r = gpu_nvml_device_get_compute_instance_id(n, md, &m->ci_id);
        if (r >= 0)
                have_ids = true;
        else if ((r = gpu_call_failed(n, s, c->pci_address, r)) < 0)
                return r;

        if (have_ids) {
                for (size_t k = 0; k < *n_gis; k++)
                        if (gis[k].id == m->gi_id)
                                gi = &gis[k];
                if (!gi) {
                        /* MIG devices ≤ slots, so gis (sized by slots) cannot overflow. */
                        gi = &gis[(*n_gis)++];
                        *gi = (GiSeen) { .id = m->gi_id };
                        r = gpu_nvml_device_get_gpu_instance_by_id(n, c->handle, m->gi_id, &gi->handle);
                        if (r >= 0)
                                r = gpu_nvml_gpu_instance_get_info(n, gi->handle, &gi->info);
                        if (r >= 0)
                                gi->ok = true;
                        else if ((r = gpu_call_failed(n, s, c->pci_address, r)) < 0)
                                return r;
                }
        }

        if (gi && gi->ok) {
                m->gi_profile_id = gi->info.profileId;
                m->placement_start = gi->info.placement.start;
                m->placement_size = gi->info.placement.size;

                r = gpu_nvml_gpu_instance_get_compute_instance_by_id(n, gi->handle, m->ci_id, &ci);
                if (r >= 0)
                        r = gpu_nvml_compute_instance_get_info(n, ci, &ci_info);
                if (r >= 0)
                        m->ci_profile_id = ci_info.profileId;
                else if (r == -ENOSYS && have_attr)
                        r = ci_profile_from_slices(n, s, c, model, gi, m->ci_slices, &m->ci_profile_id);
                else
                        r = gpu_call_failed(n, s, c->pci_address, r);
                if (r < 0)
                        return r;

                if (have_attr && model) {
                        const char *suffix = model_suffix(model, m->gi_profile_id);

                        if (!suffix)
                                return warn(s, "GPU %s: MIG device %u uses GPU instance profile id %u, which "
                                            "nvmlDeviceGetGpuInstanceProfileInfo does not list; its profile "
                                            "name is left unknown.", c->pci_address, i, m->gi_profile_id);
                        m->profile = gpu_mig_profile_name(m->gi_slices, m->ci_slices, m->memory_mib,
                                                          c->memory_total_bytes, suffix);
                        if (!m->profile)
                                return warn(s, "GPU %s: MIG device %u: no profile name from %u GPU slices, %u "
                                            "compute slices, %" PRIu64 " MiB of %" PRIu64 " bytes.",
                                            c->pci_address, i, m->gi_slices, m->ci_slices, m->memory_mib,
                                            c->memory_total_bytes);
                }
        }
        return 0;
}

static int read_mig_devices(GpuNvml *n, NvmlSnapshot *s, GpuNvmlCached *c, GpuInfo *g) {
        _cleanup_free_ MigDeviceInfo *devices = NULL, *known = NULL;
        _cleanup_free_ GiSeen *gis = NULL;
        GpuNvmlModel *model = NULL;
        size_t n_devices = 0, n_gis = 0, n_known = 0;
        int r;

        if (!(c->facts & GPU_FACT_MAX_MIG)) {
                r = gpu_nvml_device_get_max_mig_device_count(n, c->handle, &c->max_mig_devices);
                if (r < 0)
                        return gpu_call_failed(n, s, c->pci_address, r);
                if (c->max_mig_devices > 64)
                        return warn(s, "GPU %s: nvmlDeviceGetMaxMigDeviceCount answered %u; MIG devices are left "
                                    "out.", c->pci_address, c->max_mig_devices);
                c->facts |= GPU_FACT_MAX_MIG;
        }
        if (c->max_mig_devices == 0) {
                gpu_nvml_mig_known_clear(c);
                return 0;
        }

        r = gpu_model(n, s, c, &model);
        if (r < 0)
                return r;

        devices = calloc(c->max_mig_devices, sizeof *devices);
        known = calloc(c->max_mig_devices, sizeof *known);
        gis = calloc(c->max_mig_devices, sizeof *gis);
        if (!devices || !known || !gis)
                return -ENOMEM;

        for (unsigned i = 0; i < c->max_mig_devices; i++) {
                size_t n_warnings = strv_length(s->warnings);
                bool found;

                r = read_mig_device(n, s, c, model, gis, &n_gis, i, &devices[n_devices], &found);
                /* Kept for the next read only when read completely: a failed call is asked again. */
                if (r >= 0 && found && devices[n_devices].uuid && strv_length(s->warnings) == n_warnings)
                        r = mig_device_copy(&devices[n_devices], devices[n_devices].index, &known[n_known++]);
                if (found)
                        n_devices++;
                if (r < 0) {
                        for (size_t k = 0; k < n_devices; k++)
                                gpu_nvml_mig_device_done(&devices[k]);
                        for (size_t k = 0; k < n_known; k++)
                                gpu_nvml_mig_device_done(&known[k]);
                        return r;
                }
        }

        /* What this read found replaces what the last one knew: destroyed instances are forgotten. */
        gpu_nvml_mig_known_clear(c);
        c->mig_known = n_known > 0 ? TAKE_PTR(known) : NULL;
        c->n_mig_known = n_known;

        qsort(devices, n_devices, sizeof *devices, gpu_nvml_mig_device_compare);
        g->mig_devices = n_devices > 0 ? TAKE_PTR(devices) : NULL;
        g->n_mig_devices = n_devices;
        return 0;
}

static int read_gpu(GpuNvml *n, NvmlSnapshot *s, const char *address, unsigned position, GpuInfo *g,
                    bool *ret_present) {
        GpuNvmlCached *c;
        int r;

        c = gpu_nvml_cached(n, address);
        if (!c)
                return strlen(address) >= sizeof c->pci_address ? warn(s, "GPU %s: not a PCI address; skipped.", address)
                                                                : -ENOMEM;

        r = gpu_handle(n, s, c, ret_present);
        if (r < 0 || !*ret_present)
                return r;

        r = read_static_facts(n, s, c, position);
        if (r < 0)
                return r;

        strcpy(g->pci_address, c->pci_address);
        g->nvml_index = c->nvml_index;
        g->memory_total_bytes = c->memory_total_bytes;
        g->cc_major = c->cc_major;
        g->cc_minor = c->cc_minor;
        g->minor = c->minor;
        if ((c->name && !(g->name = strdup(c->name))) || (c->uuid && !(g->uuid = strdup(c->uuid))))
                return -ENOMEM;

        r = read_mig_mode(n, s, c, g);
        if (r < 0)
                return r;
        if (g->mig_current == GPU_MIG_ENABLED) {
                r = read_mig_devices(n, s, c, g);
                if (r < 0)
                        return r;
        } else
                gpu_nvml_mig_known_clear(c);
        r = gpu_nvml_read_nvlinks(n, s, c, g);
        if (r < 0)
                return r;
        return read_fabric(n, s, c, g);
}

int gpu_nvml_read(GpuNvml *n, char *const *pci_addresses, NvmlSnapshot **ret, char **ret_error) {
        _cleanup_(gpu_nvml_snapshot_freep) NvmlSnapshot *s = NULL;
        char **all = NULL;
        size_t n_addresses;
        int r;

        assert(n);
        assert(ret);
        assert(ret_error);

        *ret_error = NULL;

        s = calloc(1, sizeof *s);
        if (!s)
                return -ENOMEM;

        r = read_system(n, s);
        if (r < 0)
                goto fail;

        if (!pci_addresses) {
                r = gpu_nvml_enumerate(n, &all, ret_error);
                if (r < 0)
                        return r;
                pci_addresses = all;
        }

        n_addresses = strv_length(pci_addresses);
        s->gpus = calloc(n_addresses ?: 1, sizeof *s->gpus);
        if (!s->gpus)
                return -ENOMEM;

        for (size_t i = 0; i < n_addresses; i++) {
                GpuInfo *g = &s->gpus[s->n_gpus];
                bool present = false;

                *g = (GpuInfo) { .cc_major = -1, .cc_minor = -1, .minor = -1 };
                n->progress_gpu = (int) i;
                r = read_gpu(n, s, pci_addresses[i], (unsigned) s->n_gpus, g, &present);
                n->progress_gpu = -1;
                if (present)
                        s->n_gpus++;
                else
                        gpu_info_done(g);
                if (r < 0)
                        goto fail;
        }

        *ret = TAKE_PTR(s);
        return 0;

fail:
        if (r == -ENOMEM)
                *ret_error = strdup("Out of memory while reading NVML.");
        else
                *ret_error = strprintf("NVML stopped answering (%s); it is reopened on the next attempt.",
                                       gpu_nvml_last_error(n));
        return r;
}

bool gpu_nvml_seed_system(GpuNvml *n, const NvmlSnapshot *s) {
        char buf[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE] = "";

        if (!s || !s->driver_version)
                return false;
        if (!(n->system_facts & GPU_SYSTEM_DRIVER)) {
                if (gpu_nvml_system_get_driver_version(n, buf, sizeof buf) < 0 || !*buf ||
                    !(n->driver_version = strdup(buf)))
                        return false;
                n->system_facts |= GPU_SYSTEM_DRIVER;
        }
        if (!streq(n->driver_version, s->driver_version))
                return false;
        if (!(n->system_facts & GPU_SYSTEM_NVML)) {
                if (s->nvml_version && !(n->nvml_version = strdup(s->nvml_version)))
                        return false;
                /* Unknown there: asked again (as a read would). */
                if (n->nvml_version)
                        n->system_facts |= GPU_SYSTEM_NVML;
        }
        if (!(n->system_facts & GPU_SYSTEM_CUDA) && s->cuda_version > 0) {
                n->cuda_version = s->cuda_version;
                n->system_facts |= GPU_SYSTEM_CUDA;
        }
        return true;
}

int gpu_nvml_seed_gpu(GpuNvml *n, const GpuInfo *g, uint32_t pci_device_id, uint32_t pci_subsystem_id) {
        GpuNvmlCached *c = gpu_nvml_cached(n, g->pci_address);

        if (!c)
                return -ENOMEM;
        if (!(c->facts & GPU_FACT_INDEX)) {
                c->nvml_index = g->nvml_index;
                c->facts |= GPU_FACT_INDEX;
        }
        if (!(c->facts & GPU_FACT_NAME) && g->name && *g->name) {
                if (!(c->name = strdup(g->name)))
                        return -ENOMEM;
                c->facts |= GPU_FACT_NAME;
        }
        if (!(c->facts & GPU_FACT_UUID) && g->uuid && *g->uuid) {
                if (!(c->uuid = strdup(g->uuid)))
                        return -ENOMEM;
                c->facts |= GPU_FACT_UUID;
        }
        if (!(c->facts & GPU_FACT_MEMORY) && g->memory_total_bytes > 0) {
                c->memory_total_bytes = g->memory_total_bytes;
                c->facts |= GPU_FACT_MEMORY;
        }
        if (!(c->facts & GPU_FACT_CC) && g->cc_major > 0 && g->cc_minor >= 0) {
                c->cc_major = g->cc_major;
                c->cc_minor = g->cc_minor;
                c->facts |= GPU_FACT_CC;
        }
        if (!(c->facts & GPU_FACT_MINOR) && g->minor >= 0) {
                c->minor = g->minor;
                c->facts |= GPU_FACT_MINOR;
        }
        if (g->mig_current == GPU_MIG_UNSUPPORTED)
                c->facts |= GPU_FACT_NO_MIG;
        /* NVLink topology is fixed while the driver is loaded: what the snapshot says (also "not known"). */
        if (!(c->facts & GPU_FACT_NVLINK)) {
                if (g->nvlink_remotes && !(c->nvlink_remotes = strv_copy(g->nvlink_remotes)))
                        return -ENOMEM;
                c->nvlink_known = g->nvlink_known;
                c->facts |= GPU_FACT_NVLINK;
        }
        if (!(c->facts & GPU_FACT_PCI_IDS) && pci_device_id != 0) {
                c->pci_device_id = pci_device_id;
                c->pci_subsystem_id = pci_subsystem_id;
                c->facts |= GPU_FACT_PCI_IDS;
        }
        return 0;
}
