/* SPDX-License-Identifier: MIT */
/* Owns the MIG half of the fake libnvidia-ml.so.1: MIG mode, GPU instance and compute instance profiles,
 * placements, creation and destruction (through the engine in fake-mig.c, under the cross-process state
 * lock), and MIG device handles with their attributes. Return codes follow NVML's documentation for each
 * call; where the driver's behaviour is only known from examples, README.md says what we chose. */
#include "fake-nvml.h"

FAKE_DECLARE(nvmlDeviceGetMigMode, gna_nvmlDeviceGetMigMode_fn);
FAKE_DECLARE(nvmlDeviceSetMigMode, gna_nvmlDeviceSetMigMode_fn);
FAKE_DECLARE(nvmlDeviceGetGpuInstanceProfileInfo, gna_nvmlDeviceGetGpuInstanceProfileInfo_fn);
FAKE_DECLARE(nvmlDeviceGetGpuInstanceProfileInfoV, gna_nvmlDeviceGetGpuInstanceProfileInfoV_fn);
FAKE_DECLARE(nvmlDeviceGetGpuInstancePossiblePlacements_v2, gna_nvmlDeviceGetGpuInstancePossiblePlacements_v2_fn);
FAKE_DECLARE(nvmlDeviceGetGpuInstances, gna_nvmlDeviceGetGpuInstances_fn);
FAKE_DECLARE(nvmlDeviceGetGpuInstanceById, gna_nvmlDeviceGetGpuInstanceById_fn);
FAKE_DECLARE(nvmlDeviceCreateGpuInstanceWithPlacement, gna_nvmlDeviceCreateGpuInstanceWithPlacement_fn);
/* nvml-abi.h has no pointer type for the placement-less create (the agent never calls it); same ABI as
 * NVML's nvmlDeviceCreateGpuInstance(nvmlDevice_t, unsigned int, nvmlGpuInstance_t *). */
FAKE_EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t device, unsigned int profileId,
                                                     nvmlGpuInstance_t *gpuInstance);
FAKE_DECLARE(nvmlGpuInstanceDestroy, gna_nvmlGpuInstanceDestroy_fn);
FAKE_DECLARE(nvmlGpuInstanceGetInfo, gna_nvmlGpuInstanceGetInfo_fn);
FAKE_DECLARE(nvmlGpuInstanceGetComputeInstanceProfileInfo, gna_nvmlGpuInstanceGetComputeInstanceProfileInfo_fn);
FAKE_DECLARE(nvmlGpuInstanceGetComputeInstanceProfileInfoV, gna_nvmlGpuInstanceGetComputeInstanceProfileInfoV_fn);
FAKE_DECLARE(nvmlGpuInstanceGetComputeInstances, gna_nvmlGpuInstanceGetComputeInstances_fn);
FAKE_DECLARE(nvmlGpuInstanceCreateComputeInstance, gna_nvmlGpuInstanceCreateComputeInstance_fn);
FAKE_DECLARE(nvmlComputeInstanceDestroy, gna_nvmlComputeInstanceDestroy_fn);
FAKE_DECLARE(nvmlComputeInstanceGetInfo_v2, gna_nvmlComputeInstanceGetInfo_v2_fn);
FAKE_DECLARE(nvmlDeviceGetMaxMigDeviceCount, gna_nvmlDeviceGetMaxMigDeviceCount_fn);
FAKE_DECLARE(nvmlDeviceGetMigDeviceHandleByIndex, gna_nvmlDeviceGetMigDeviceHandleByIndex_fn);
FAKE_DECLARE(nvmlDeviceGetAttributes, gna_nvmlDeviceGetAttributes_v2_fn);
FAKE_DECLARE(nvmlDeviceGetAttributes_v2, gna_nvmlDeviceGetAttributes_v2_fn);
FAKE_DECLARE(nvmlDeviceGetGpuInstanceId, gna_nvmlDeviceGetGpuInstanceId_fn);
FAKE_DECLARE(nvmlDeviceGetComputeInstanceId, gna_nvmlDeviceGetComputeInstanceId_fn);

#define ENTER()                                                                                            \
        nvmlReturn_t r;                                                                                    \
        if (fake_enter(__func__, &r))                                                                      \
        return fake_leave(__func__, r)

/* A physical GPU handle whose model has MIG; *ret is the NVML error otherwise. */
static FakeGpu *mig_gpu(nvmlDevice_t device, unsigned *idx, nvmlReturn_t *ret) {
        FakeGpu *g = fake_device(device, idx);
        if (!g) {
                *ret = fake_mig_device(device, NULL) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
                return NULL;
        }
        if (!g->model->mig_capable) {
                *ret = NVML_ERROR_NOT_SUPPORTED;
                return NULL;
        }
        return g;
}

static bool mig_garbage(unsigned idx, unsigned bit) {
        return fake_ctx.garbage && (fake_ctx.garbage[idx] & bit);
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode) {
        ENTER();
        unsigned idx;
        FakeGpu *g = mig_gpu(device, &idx, &r);
        if (g && (!currentMode || !pendingMode))
                r = NVML_ERROR_INVALID_ARGUMENT;
        else if (g) {
                bool bad = mig_garbage(idx, FAKE_GARBAGE_MIG);
                *currentMode = bad ? 7 : g->mig_current ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
                *pendingMode = bad ? 7 : g->mig_pending ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
                r = NVML_SUCCESS;
        }
        return fake_leave(__func__, r);
}

nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t device, unsigned int mode, nvmlReturn_t *activationStatus) {
        ENTER();
        unsigned idx;
        int fd = -1;
        bool reset = false;
        if (!activationStatus || (mode != NVML_DEVICE_MIG_ENABLE && mode != NVML_DEVICE_MIG_DISABLE))
                return fake_leave(__func__, NVML_ERROR_INVALID_ARGUMENT);
        r = fake_lock(&fd);
        FakeGpu *g = r == NVML_SUCCESS ? mig_gpu(device, &idx, &r) : NULL;
        if (g) {
                r = fake_result(fake_mig_set_mode(g, mode == NVML_DEVICE_MIG_ENABLE, fake_busy(idx), &reset));
                *activationStatus = r != NVML_SUCCESS ? r : reset ? NVML_ERROR_RESET_REQUIRED : NVML_SUCCESS;
        }
        return fake_leave(__func__, fake_unlock(fd, r, true));
}

static nvmlReturn_t gi_profile(nvmlDevice_t device, unsigned index, const FakeGpu **ret_gpu,
                               const FakeGiProfile **ret) {
        nvmlReturn_t r = NVML_SUCCESS;
        unsigned idx;
        FakeGpu *g = mig_gpu(device, &idx, &r);
        if (!g)
                return r;
        if (index >= NVML_GPU_INSTANCE_PROFILE_COUNT)
                return NVML_ERROR_INVALID_ARGUMENT;
        *ret = fake_model_gi_by_index(g->model, index);
        *ret_gpu = g;
        return *ret ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                 nvmlGpuInstanceProfileInfo_t *info) {
        ENTER();
        const FakeGpu *g = NULL;
        const FakeGiProfile *p = NULL;
        r = info ? gi_profile(device, profile, &g, &p) : NVML_ERROR_INVALID_ARGUMENT;
        if (r == NVML_SUCCESS)
                *info = (nvmlGpuInstanceProfileInfo_t) {
                        .id = p->id, .sliceCount = p->g, .instanceCount = p->inst,
                        .multiprocessorCount = p->g * g->model->sm_per_slice, .copyEngineCount = p->ce,
                        .decoderCount = p->dec, .encoderCount = p->enc, .jpegCount = p->jpeg, .ofaCount = p->ofa,
                        .memorySizeMB = p->mem_mib,
                };
        return fake_leave(__func__, r);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                  nvmlGpuInstanceProfileInfo_v2_t *info) {
        ENTER();
        const FakeGpu *g = NULL;
        const FakeGiProfile *p = NULL;
        if (!info)
                r = NVML_ERROR_INVALID_ARGUMENT;
        else if (info->version != nvmlGpuInstanceProfileInfo_v2)
                r = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        else
                r = gi_profile(device, profile, &g, &p);
        if (r == NVML_SUCCESS) {
                *info = (nvmlGpuInstanceProfileInfo_v2_t) {
                        .version = nvmlGpuInstanceProfileInfo_v2, .id = p->id, .sliceCount = p->g,
                        .instanceCount = p->inst, .multiprocessorCount = p->g * g->model->sm_per_slice,
                        .copyEngineCount = p->ce, .decoderCount = p->dec, .encoderCount = p->enc,
                        .jpegCount = p->jpeg, .ofaCount = p->ofa, .memorySizeMB = p->mem_mib,
                };
                snprintf(info->name, sizeof info->name, "MIG %s", p->name);
        }
        return fake_leave(__func__, r);
}

/* The placements a profile can ever have, as NVML documents for _v2: regardless of MIG mode and of what
 * is already placed. Callers find the free ones themselves. */
nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t device, unsigned int profileId,
                                                           nvmlGpuInstancePlacement_t *placements,
                                                           unsigned int *count) {
        ENTER();
        unsigned idx;
        FakeGpu *g = mig_gpu(device, &idx, &r);
        const FakeGiProfile *p = g ? fake_model_gi_by_id(g->model, profileId) : NULL;
        if (g && (!p || !count))
                r = NVML_ERROR_INVALID_ARGUMENT;
        else if (g) {
                unsigned room = *count;
                *count = (unsigned) p->n_starts;
                r = NVML_SUCCESS;
                if (placements && room < p->n_starts)
                        r = NVML_ERROR_INSUFFICIENT_SIZE;
                for (size_t i = 0; placements && r == NVML_SUCCESS && i < p->n_starts; i++)
                        placements[i] = (nvmlGpuInstancePlacement_t) { .start = p->starts[i], .size = p->size };
        }
        return fake_leave(__func__, r);
}

/* A MIG-capable GPU handle with MIG mode currently enabled (what GI/CI calls need). */
static FakeGpu *mig_enabled_gpu(nvmlDevice_t device, unsigned *idx, nvmlReturn_t *ret) {
        FakeGpu *g = mig_gpu(device, idx, ret);
        if (g && !g->mig_current) {
                *ret = NVML_ERROR_NOT_SUPPORTED;
                return NULL;
        }
        return g;
}

nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId, nvmlGpuInstance_t *gpuInstances,
                                       unsigned int *count) {
        ENTER();
        unsigned idx;
        FakeGpu *g = mig_enabled_gpu(device, &idx, &r);
        if (g && (!fake_model_gi_by_id(g->model, profileId) || !gpuInstances || !count))
                r = NVML_ERROR_INVALID_ARGUMENT;
        else if (g) {
                unsigned n = 0;
                for (unsigned i = 0; i < FAKE_MAX_GI; i++)
                        if (g->gi[i].used && g->gi[i].profile == profileId)
                                gpuInstances[n++] = &fake_ctx.handles[idx].gi[i];
                *count = n;
                r = NVML_SUCCESS;
        }
        return fake_leave(__func__, r);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id, nvmlGpuInstance_t *gpuInstance) {
        ENTER();
        unsigned idx;
        FakeGpu *g = mig_enabled_gpu(device, &idx, &r);
        if (g && !gpuInstance)
                r = NVML_ERROR_INVALID_ARGUMENT;
        else if (g && (id >= FAKE_MAX_GI || !g->gi[id].used))
                r = NVML_ERROR_NOT_FOUND;
        else if (g) {
                *gpuInstance = &fake_ctx.handles[idx].gi[id];
                r = NVML_SUCCESS;
        }
        return fake_leave(__func__, r);
}

static nvmlReturn_t create_gi(nvmlDevice_t device, unsigned profileId, const nvmlGpuInstancePlacement_t *placement,
                              bool with_placement, nvmlGpuInstance_t *gpuInstance) {
        unsigned idx, id;
        int fd = -1;
        if (!gpuInstance || (with_placement && !placement))
                return NVML_ERROR_INVALID_ARGUMENT;
        nvmlReturn_t r = fake_lock(&fd);
        FakeGpu *g = r == NVML_SUCCESS ? mig_enabled_gpu(device, &idx, &r) : NULL;
        if (g) {
                const FakeGiProfile *p = fake_model_gi_by_id(g->model, profileId);
                if (!p || (placement && placement->size != p->size))
                        r = NVML_ERROR_INVALID_ARGUMENT;
                else
                        r = fake_result(fake_mig_create_gi(g, p, placement ? (int) placement->start : -1,
                                                           fake_ctx.fit, &id));
                if (r == NVML_SUCCESS)
                        *gpuInstance = &fake_ctx.handles[idx].gi[id];
        }
        return fake_unlock(fd, r, true);
}

nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t device, unsigned int profileId,
                                                      const nvmlGpuInstancePlacement_t *placement,
                                                      nvmlGpuInstance_t *gpuInstance) {
        ENTER();
        if (placement && placement->start >= FAKE_MAX_MEM_SLICES)
                return fake_leave(__func__, NVML_ERROR_INVALID_ARGUMENT);
        return fake_leave(__func__, create_gi(device, profileId, placement, true, gpuInstance));
}

nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t device, unsigned int profileId, nvmlGpuInstance_t *gpuInstance) {
        ENTER();
        return fake_leave(__func__, create_gi(device, profileId, NULL, false, gpuInstance));
}

nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gpuInstance) {
        ENTER();
        unsigned idx;
        int fd = -1;
        r = fake_lock(&fd);
        FakeGpu *g = r == NVML_SUCCESS ? fake_gpu_instance(gpuInstance, &idx) : NULL;
        if (r == NVML_SUCCESS)
                r = g ? fake_result(fake_mig_destroy_gi(g, gpuInstance->gi, fake_busy(idx))) : NVML_ERROR_INVALID_ARGUMENT;
        return fake_leave(__func__, fake_unlock(fd, r, true));
}

nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info) {
        ENTER();
        unsigned idx;
        FakeGpu *g = fake_gpu_instance(gpuInstance, &idx);
        if (!g || !info)
                return fake_leave(__func__, NVML_ERROR_INVALID_ARGUMENT);
        const FakeGi *gi = &g->gi[gpuInstance->gi];
        *info = (nvmlGpuInstanceInfo_t) {
                .device = &fake_ctx.handles[idx].dev, .id = gpuInstance->gi, .profileId = gi->profile,
                .placement = { .start = gi->start, .size = gi->size },
        };
        return fake_leave(__func__, NVML_SUCCESS);
}

/* The GI profile behind a GI handle and a CI profile of it. */
static nvmlReturn_t ci_profile(nvmlGpuInstance_t gpuInstance, unsigned profile, unsigned engProfile,
                               const FakeGpu **ret_gpu, const FakeGiProfile **ret_gp, FakeCiProfile *ret) {
        FakeGpu *g = fake_gpu_instance(gpuInstance, NULL);
        if (!g || profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT ||
            engProfile >= NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT)
                return NVML_ERROR_INVALID_ARGUMENT;
        const FakeGiProfile *gp = fake_model_gi_by_id(g->model, g->gi[gpuInstance->gi].profile);
        if (!gp || !fake_ci_profile(gp, profile, ret))
                return NVML_ERROR_NOT_SUPPORTED;
        *ret_gpu = g;
        *ret_gp = gp;
        return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                                                          unsigned int engProfile,
                                                          nvmlComputeInstanceProfileInfo_t *info) {
        ENTER();
        const FakeGpu *g = NULL;
        const FakeGiProfile *gp = NULL;
        FakeCiProfile cp;
        r = info ? ci_profile(gpuInstance, profile, engProfile, &g, &gp, &cp) : NVML_ERROR_INVALID_ARGUMENT;
        if (r == NVML_SUCCESS)
                /* CIs share their GI's engines: the counts are the GI's. */
                *info = (nvmlComputeInstanceProfileInfo_t) {
                        .id = cp.id, .sliceCount = cp.c, .instanceCount = cp.inst,
                        .multiprocessorCount = cp.c * g->model->sm_per_slice, .sharedCopyEngineCount = gp->ce,
                        .sharedDecoderCount = gp->dec, .sharedEncoderCount = gp->enc, .sharedJpegCount = gp->jpeg,
                        .sharedOfaCount = gp->ofa,
                };
        return fake_leave(__func__, r);
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                                                           unsigned int engProfile,
                                                           nvmlComputeInstanceProfileInfo_v2_t *info) {
        ENTER();
        const FakeGpu *g = NULL;
        const FakeGiProfile *gp = NULL;
        FakeCiProfile cp;
        if (!info)
                r = NVML_ERROR_INVALID_ARGUMENT;
        else if (info->version != nvmlComputeInstanceProfileInfo_v2)
                r = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        else
                r = ci_profile(gpuInstance, profile, engProfile, &g, &gp, &cp);
        if (r == NVML_SUCCESS) {
                char name[64];
                *info = (nvmlComputeInstanceProfileInfo_v2_t) {
                        .version = nvmlComputeInstanceProfileInfo_v2, .id = cp.id, .sliceCount = cp.c,
                        .instanceCount = cp.inst, .multiprocessorCount = cp.c * g->model->sm_per_slice,
                        .sharedCopyEngineCount = gp->ce, .sharedDecoderCount = gp->dec,
                        .sharedEncoderCount = gp->enc, .sharedJpegCount = gp->jpeg, .sharedOfaCount = gp->ofa,
                };
                fake_ci_name(gp, cp.c, name, sizeof name);
                snprintf(info->name, sizeof info->name, "MIG %s", name);
        }
        return fake_leave(__func__, r);
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                                                nvmlComputeInstance_t *computeInstances, unsigned int *count) {
        ENTER();
        unsigned idx;
        FakeGpu *g = fake_gpu_instance(gpuInstance, &idx);
        if (!g || !computeInstances || !count || profileId >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
                return fake_leave(__func__, NVML_ERROR_INVALID_ARGUMENT);
        const FakeGi *gi = &g->gi[gpuInstance->gi];
        unsigned n = 0;
        for (unsigned c = 0; c < FAKE_MAX_CI; c++)
                if (gi->ci[c].used && gi->ci[c].profile == profileId)
                        computeInstances[n++] = &fake_ctx.handles[idx].ci[gpuInstance->gi][c];
        *count = n;
        return fake_leave(__func__, NVML_SUCCESS);
}

nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                                                  nvmlComputeInstance_t *computeInstance) {
        ENTER();
        unsigned idx, id;
        int fd = -1;
        if (!computeInstance || profileId >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
                return fake_leave(__func__, NVML_ERROR_INVALID_ARGUMENT);
        r = fake_lock(&fd);
        FakeGpu *g = r == NVML_SUCCESS ? fake_gpu_instance(gpuInstance, &idx) : NULL;
        if (r == NVML_SUCCESS && !g)
                r = NVML_ERROR_INVALID_ARGUMENT;
        if (g) {
                r = fake_result(fake_mig_create_ci(fake_ctx.node, g, gpuInstance->gi, profileId, &id));
                if (r == NVML_SUCCESS)
                        *computeInstance = &fake_ctx.handles[idx].ci[gpuInstance->gi][id];
        }
        return fake_leave(__func__, fake_unlock(fd, r, true));
}

nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t computeInstance) {
        ENTER();
        unsigned idx;
        int fd = -1;
        r = fake_lock(&fd);
        FakeGpu *g = r == NVML_SUCCESS ? fake_compute_instance(computeInstance, &idx) : NULL;
        if (r == NVML_SUCCESS)
                r = g ? fake_result(fake_mig_destroy_ci(g, computeInstance->gi, computeInstance->ci, fake_busy(idx)))
                      : NVML_ERROR_INVALID_ARGUMENT;
        return fake_leave(__func__, fake_unlock(fd, r, true));
}

nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance, nvmlComputeInstanceInfo_t *info) {
        ENTER();
        unsigned idx;
        FakeGpu *g = fake_compute_instance(computeInstance, &idx);
        if (!g || !info)
                return fake_leave(__func__, NVML_ERROR_INVALID_ARGUMENT);
        const FakeCi *ci = &g->gi[computeInstance->gi].ci[computeInstance->ci];
        *info = (nvmlComputeInstanceInfo_t) {
                .device = &fake_ctx.handles[idx].dev, .gpuInstance = &fake_ctx.handles[idx].gi[computeInstance->gi],
                .id = computeInstance->ci, .profileId = ci->profile,
                .placement = { .start = ci->start, .size = ci->size },
        };
        return fake_leave(__func__, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
        ENTER();
        unsigned idx;
        FakeGpu *g = mig_gpu(device, &idx, &r);
        if (g && !count)
                r = NVML_ERROR_INVALID_ARGUMENT;
        else if (g) {
                *count = g->model->compute_slices;
                r = NVML_SUCCESS;
        }
        return fake_leave(__func__, r);
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice) {
        ENTER();
        unsigned idx;
        FakeGpu *g = mig_gpu(device, &idx, &r);
        FakeMigRef refs[FAKE_MAX_GI * FAKE_MAX_CI];
        if (g && (!migDevice || index >= g->model->compute_slices))
                r = NVML_ERROR_INVALID_ARGUMENT;
        else if (g) {
                size_t n = fake_mig_devices(g, refs);
                r = index < n ? NVML_SUCCESS : NVML_ERROR_NOT_FOUND;
                if (r == NVML_SUCCESS)
                        *migDevice = &fake_ctx.handles[idx].mig[refs[index].gi][refs[index].ci];
        }
        return fake_leave(__func__, r);
}

static nvmlReturn_t attributes(nvmlDevice_t device, nvmlDeviceAttributes_t *attr) {
        unsigned idx;
        FakeGpu *g = fake_mig_device(device, &idx);
        if (!g || !attr)
                return fake_device(device, NULL) && attr ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
        const FakeGi *gi = &g->gi[device->gi];
        const FakeCi *ci = &gi->ci[device->ci];
        const FakeGiProfile *gp = fake_model_gi_by_id(g->model, gi->profile);
        *attr = (nvmlDeviceAttributes_t) {};
        if (mig_garbage(idx, FAKE_GARBAGE_ATTRIBUTES))
                return NVML_SUCCESS;
        *attr = (nvmlDeviceAttributes_t) {
                .multiprocessorCount = ci->size * g->model->sm_per_slice, .sharedCopyEngineCount = gp->ce,
                .sharedDecoderCount = gp->dec, .sharedEncoderCount = gp->enc, .sharedJpegCount = gp->jpeg,
                .sharedOfaCount = gp->ofa, .gpuInstanceSliceCount = gp->g, .computeInstanceSliceCount = ci->size,
                .memorySizeMB = gp->mem_mib,
        };
        return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetAttributes(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes_) {
        ENTER();
        return fake_leave(__func__, attributes(device, attributes_));
}

nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes_) {
        ENTER();
        return fake_leave(__func__, attributes(device, attributes_));
}

static nvmlReturn_t instance_id(nvmlDevice_t device, unsigned *id, bool gi) {
        if (!id)
                return NVML_ERROR_INVALID_ARGUMENT;
        if (!fake_mig_device(device, NULL))
                return fake_device(device, NULL) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
        *id = gi ? device->gi : device->ci;
        return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
        ENTER();
        return fake_leave(__func__, instance_id(device, id, true));
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
        ENTER();
        return fake_leave(__func__, instance_id(device, id, false));
}
