/* SPDX-License-Identifier: MIT */
/* Owns the type and constant half of the NVML ABI conformance test: our declarations (agent/nvml/nvml-abi.h,
 * every name prefixed gna_) compiled beside NVIDIA's nvml.h, with a static assertion for every constant
 * value, struct size, field offset and field size that both declare. It compiles only if they all agree;
 * when run it prints what the real header had no counterpart for (newer than that header), so a reader
 * of the test log sees what was not checked. */
#define GNA_NVML_ABI_PREFIX 1
#include "nvml-abi.h"

#include <nvml.h>
#include <stdio.h>

#define CHECK_CONST(name) _Static_assert((long long) gna_##name == (long long) (name), #name " differs from nvml.h")
#define CHECK_SIZE(type) _Static_assert(sizeof(gna_##type) == sizeof(type), "sizeof(" #type ") differs from nvml.h")
#define CHECK_FIELD(type, field)                                                                             \
        _Static_assert(offsetof(gna_##type, field) == offsetof(type, field),                                  \
                       "offsetof(" #type ", " #field ") differs from nvml.h");                                \
        _Static_assert(sizeof(((gna_##type *) 0)->field) == sizeof(((type *) 0)->field),                      \
                       "sizeof(" #type "." #field ") differs from nvml.h")

/* ---- Return codes: all of ours are in every header since CUDA 11.x ---- */
CHECK_SIZE(nvmlReturn_t);
CHECK_CONST(NVML_SUCCESS);
CHECK_CONST(NVML_ERROR_UNINITIALIZED);
CHECK_CONST(NVML_ERROR_INVALID_ARGUMENT);
CHECK_CONST(NVML_ERROR_NOT_SUPPORTED);
CHECK_CONST(NVML_ERROR_NO_PERMISSION);
CHECK_CONST(NVML_ERROR_ALREADY_INITIALIZED);
CHECK_CONST(NVML_ERROR_NOT_FOUND);
CHECK_CONST(NVML_ERROR_INSUFFICIENT_SIZE);
CHECK_CONST(NVML_ERROR_INSUFFICIENT_POWER);
CHECK_CONST(NVML_ERROR_DRIVER_NOT_LOADED);
CHECK_CONST(NVML_ERROR_TIMEOUT);
CHECK_CONST(NVML_ERROR_IRQ_ISSUE);
CHECK_CONST(NVML_ERROR_LIBRARY_NOT_FOUND);
CHECK_CONST(NVML_ERROR_FUNCTION_NOT_FOUND);
CHECK_CONST(NVML_ERROR_CORRUPTED_INFOROM);
CHECK_CONST(NVML_ERROR_GPU_IS_LOST);
CHECK_CONST(NVML_ERROR_RESET_REQUIRED);
CHECK_CONST(NVML_ERROR_OPERATING_SYSTEM);
CHECK_CONST(NVML_ERROR_LIB_RM_VERSION_MISMATCH);
CHECK_CONST(NVML_ERROR_IN_USE);
CHECK_CONST(NVML_ERROR_MEMORY);
CHECK_CONST(NVML_ERROR_NO_DATA);
CHECK_CONST(NVML_ERROR_VGPU_ECC_NOT_SUPPORTED);
CHECK_CONST(NVML_ERROR_INSUFFICIENT_RESOURCES);
CHECK_CONST(NVML_ERROR_FREQ_NOT_SUPPORTED);
CHECK_CONST(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
CHECK_CONST(NVML_ERROR_UNKNOWN);

/* ---- Handles ---- */
CHECK_SIZE(nvmlDevice_t);
CHECK_SIZE(nvmlGpuInstance_t);
CHECK_SIZE(nvmlComputeInstance_t);
CHECK_SIZE(nvmlEventSet_t);

/* ---- Constants ---- */
CHECK_CONST(NVML_VALUE_NOT_AVAILABLE);
CHECK_CONST(NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE);
CHECK_CONST(NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE);
CHECK_CONST(NVML_DEVICE_UUID_BUFFER_SIZE);
CHECK_CONST(NVML_DEVICE_UUID_V2_BUFFER_SIZE);
CHECK_CONST(NVML_DEVICE_NAME_BUFFER_SIZE);
CHECK_CONST(NVML_DEVICE_NAME_V2_BUFFER_SIZE);
CHECK_CONST(NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE);
CHECK_CONST(NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE);
CHECK_CONST(NVML_DEVICE_MIG_DISABLE);
CHECK_CONST(NVML_DEVICE_MIG_ENABLE);

CHECK_CONST(NVML_GPU_INSTANCE_PROFILE_1_SLICE);
CHECK_CONST(NVML_GPU_INSTANCE_PROFILE_2_SLICE);
CHECK_CONST(NVML_GPU_INSTANCE_PROFILE_3_SLICE);
CHECK_CONST(NVML_GPU_INSTANCE_PROFILE_4_SLICE);
CHECK_CONST(NVML_GPU_INSTANCE_PROFILE_7_SLICE);
CHECK_CONST(NVML_GPU_INSTANCE_PROFILE_8_SLICE);
CHECK_CONST(NVML_GPU_INSTANCE_PROFILE_6_SLICE);
CHECK_CONST(NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1);
#ifdef NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1
CHECK_CONST(NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1);
#endif
#ifdef NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2
CHECK_CONST(NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2);
#endif
#ifdef NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX
CHECK_CONST(NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX);
CHECK_CONST(NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX);
CHECK_CONST(NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX);
#endif
#ifdef NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME
CHECK_CONST(NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME);
CHECK_CONST(NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME);
#endif
#ifdef NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME
CHECK_CONST(NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME);
CHECK_CONST(NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME);
#endif
/* Our count is the R570 one; only a header that knows the same newest index can confirm it. */
#if defined(NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME)
CHECK_CONST(NVML_GPU_INSTANCE_PROFILE_COUNT);
#else
_Static_assert(gna_NVML_GPU_INSTANCE_PROFILE_COUNT > NVML_GPU_INSTANCE_PROFILE_COUNT,
               "an older header must list fewer GPU instance profiles than we know");
#endif
#ifdef NVML_GPU_INSTANCE_PROFILE_CAPS_P2P
CHECK_CONST(NVML_GPU_INSTANCE_PROFILE_CAPS_P2P);
CHECK_CONST(NVML_GPU_INSTANCE_PROFILE_CAPS_GFX);
#endif

CHECK_CONST(NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE);
CHECK_CONST(NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE);
CHECK_CONST(NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE);
CHECK_CONST(NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE);
CHECK_CONST(NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE);
CHECK_CONST(NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE);
CHECK_CONST(NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE);
#ifdef NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1
CHECK_CONST(NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1);
CHECK_CONST(NVML_COMPUTE_INSTANCE_PROFILE_COUNT);
#else
_Static_assert(gna_NVML_COMPUTE_INSTANCE_PROFILE_COUNT > NVML_COMPUTE_INSTANCE_PROFILE_COUNT,
               "an older header must list fewer compute instance profiles than we know");
#endif
CHECK_CONST(NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED);
CHECK_CONST(NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT);

/* ---- Structs ---- */
CHECK_SIZE(nvmlPciInfo_t);
CHECK_CONST(NVML_NVLINK_MAX_LINKS);
CHECK_SIZE(nvmlEnableState_t);
CHECK_CONST(NVML_FEATURE_DISABLED);
CHECK_CONST(NVML_FEATURE_ENABLED);
CHECK_FIELD(nvmlPciInfo_t, busIdLegacy);
CHECK_FIELD(nvmlPciInfo_t, domain);
CHECK_FIELD(nvmlPciInfo_t, bus);
CHECK_FIELD(nvmlPciInfo_t, device);
CHECK_FIELD(nvmlPciInfo_t, pciDeviceId);
CHECK_FIELD(nvmlPciInfo_t, pciSubSystemId);
CHECK_FIELD(nvmlPciInfo_t, busId);

CHECK_CONST(nvmlEventTypeSingleBitEccError);
CHECK_CONST(nvmlEventTypeDoubleBitEccError);
CHECK_CONST(nvmlEventTypePState);
CHECK_CONST(nvmlEventTypeXidCriticalError);
CHECK_CONST(nvmlEventTypeClock);
CHECK_SIZE(nvmlEventData_t);
CHECK_FIELD(nvmlEventData_t, device);
CHECK_FIELD(nvmlEventData_t, eventType);
CHECK_FIELD(nvmlEventData_t, eventData);
CHECK_FIELD(nvmlEventData_t, gpuInstanceId);
CHECK_FIELD(nvmlEventData_t, computeInstanceId);

CHECK_SIZE(nvmlMemory_t);
CHECK_FIELD(nvmlMemory_t, total);
CHECK_FIELD(nvmlMemory_t, free);
CHECK_FIELD(nvmlMemory_t, used);

CHECK_SIZE(nvmlDeviceAttributes_t);
CHECK_FIELD(nvmlDeviceAttributes_t, multiprocessorCount);
CHECK_FIELD(nvmlDeviceAttributes_t, sharedCopyEngineCount);
CHECK_FIELD(nvmlDeviceAttributes_t, sharedDecoderCount);
CHECK_FIELD(nvmlDeviceAttributes_t, sharedEncoderCount);
CHECK_FIELD(nvmlDeviceAttributes_t, sharedJpegCount);
CHECK_FIELD(nvmlDeviceAttributes_t, sharedOfaCount);
CHECK_FIELD(nvmlDeviceAttributes_t, gpuInstanceSliceCount);
CHECK_FIELD(nvmlDeviceAttributes_t, computeInstanceSliceCount);
CHECK_FIELD(nvmlDeviceAttributes_t, memorySizeMB);

CHECK_SIZE(nvmlProcessInfo_t);
CHECK_FIELD(nvmlProcessInfo_t, pid);
CHECK_FIELD(nvmlProcessInfo_t, usedGpuMemory);
CHECK_FIELD(nvmlProcessInfo_t, gpuInstanceId);
CHECK_FIELD(nvmlProcessInfo_t, computeInstanceId);
/* The _v2 fallback entry point takes nvmlProcessInfo_v2_t: it must be the same layout. */
_Static_assert(sizeof(gna_nvmlProcessInfo_t) == sizeof(nvmlProcessInfo_v2_t), "nvmlProcessInfo_v2_t differs");
_Static_assert(offsetof(gna_nvmlProcessInfo_t, computeInstanceId) == offsetof(nvmlProcessInfo_v2_t, computeInstanceId),
               "nvmlProcessInfo_v2_t differs");

CHECK_SIZE(nvmlGpuInstancePlacement_t);
CHECK_FIELD(nvmlGpuInstancePlacement_t, start);
CHECK_FIELD(nvmlGpuInstancePlacement_t, size);

CHECK_SIZE(nvmlGpuInstanceProfileInfo_t);
CHECK_FIELD(nvmlGpuInstanceProfileInfo_t, id);
CHECK_FIELD(nvmlGpuInstanceProfileInfo_t, isP2pSupported);
CHECK_FIELD(nvmlGpuInstanceProfileInfo_t, sliceCount);
CHECK_FIELD(nvmlGpuInstanceProfileInfo_t, instanceCount);
CHECK_FIELD(nvmlGpuInstanceProfileInfo_t, multiprocessorCount);
CHECK_FIELD(nvmlGpuInstanceProfileInfo_t, copyEngineCount);
CHECK_FIELD(nvmlGpuInstanceProfileInfo_t, decoderCount);
CHECK_FIELD(nvmlGpuInstanceProfileInfo_t, encoderCount);
CHECK_FIELD(nvmlGpuInstanceProfileInfo_t, jpegCount);
CHECK_FIELD(nvmlGpuInstanceProfileInfo_t, ofaCount);
CHECK_FIELD(nvmlGpuInstanceProfileInfo_t, memorySizeMB);

CHECK_SIZE(nvmlGpuInstanceProfileInfo_v2_t);
CHECK_FIELD(nvmlGpuInstanceProfileInfo_v2_t, version);
CHECK_FIELD(nvmlGpuInstanceProfileInfo_v2_t, id);
CHECK_FIELD(nvmlGpuInstanceProfileInfo_v2_t, isP2pSupported);
CHECK_FIELD(nvmlGpuInstanceProfileInfo_v2_t, sliceCount);
CHECK_FIELD(nvmlGpuInstanceProfileInfo_v2_t, instanceCount);
CHECK_FIELD(nvmlGpuInstanceProfileInfo_v2_t, multiprocessorCount);
CHECK_FIELD(nvmlGpuInstanceProfileInfo_v2_t, copyEngineCount);
CHECK_FIELD(nvmlGpuInstanceProfileInfo_v2_t, decoderCount);
CHECK_FIELD(nvmlGpuInstanceProfileInfo_v2_t, encoderCount);
CHECK_FIELD(nvmlGpuInstanceProfileInfo_v2_t, jpegCount);
CHECK_FIELD(nvmlGpuInstanceProfileInfo_v2_t, ofaCount);
CHECK_FIELD(nvmlGpuInstanceProfileInfo_v2_t, memorySizeMB);
CHECK_FIELD(nvmlGpuInstanceProfileInfo_v2_t, name);
CHECK_CONST(nvmlGpuInstanceProfileInfo_v2);

CHECK_SIZE(nvmlGpuInstanceInfo_t);
CHECK_FIELD(nvmlGpuInstanceInfo_t, device);
CHECK_FIELD(nvmlGpuInstanceInfo_t, id);
CHECK_FIELD(nvmlGpuInstanceInfo_t, profileId);
CHECK_FIELD(nvmlGpuInstanceInfo_t, placement);

CHECK_SIZE(nvmlComputeInstancePlacement_t);
CHECK_FIELD(nvmlComputeInstancePlacement_t, start);
CHECK_FIELD(nvmlComputeInstancePlacement_t, size);

CHECK_SIZE(nvmlComputeInstanceProfileInfo_t);
CHECK_FIELD(nvmlComputeInstanceProfileInfo_t, id);
CHECK_FIELD(nvmlComputeInstanceProfileInfo_t, sliceCount);
CHECK_FIELD(nvmlComputeInstanceProfileInfo_t, instanceCount);
CHECK_FIELD(nvmlComputeInstanceProfileInfo_t, multiprocessorCount);
CHECK_FIELD(nvmlComputeInstanceProfileInfo_t, sharedCopyEngineCount);
CHECK_FIELD(nvmlComputeInstanceProfileInfo_t, sharedDecoderCount);
CHECK_FIELD(nvmlComputeInstanceProfileInfo_t, sharedEncoderCount);
CHECK_FIELD(nvmlComputeInstanceProfileInfo_t, sharedJpegCount);
CHECK_FIELD(nvmlComputeInstanceProfileInfo_t, sharedOfaCount);

CHECK_SIZE(nvmlComputeInstanceProfileInfo_v2_t);
CHECK_FIELD(nvmlComputeInstanceProfileInfo_v2_t, version);
CHECK_FIELD(nvmlComputeInstanceProfileInfo_v2_t, id);
CHECK_FIELD(nvmlComputeInstanceProfileInfo_v2_t, sliceCount);
CHECK_FIELD(nvmlComputeInstanceProfileInfo_v2_t, instanceCount);
CHECK_FIELD(nvmlComputeInstanceProfileInfo_v2_t, multiprocessorCount);
CHECK_FIELD(nvmlComputeInstanceProfileInfo_v2_t, sharedCopyEngineCount);
CHECK_FIELD(nvmlComputeInstanceProfileInfo_v2_t, sharedDecoderCount);
CHECK_FIELD(nvmlComputeInstanceProfileInfo_v2_t, sharedEncoderCount);
CHECK_FIELD(nvmlComputeInstanceProfileInfo_v2_t, sharedJpegCount);
CHECK_FIELD(nvmlComputeInstanceProfileInfo_v2_t, sharedOfaCount);
CHECK_FIELD(nvmlComputeInstanceProfileInfo_v2_t, name);
CHECK_CONST(nvmlComputeInstanceProfileInfo_v2);

CHECK_SIZE(nvmlComputeInstanceInfo_t);
CHECK_FIELD(nvmlComputeInstanceInfo_t, device);
CHECK_FIELD(nvmlComputeInstanceInfo_t, gpuInstance);
CHECK_FIELD(nvmlComputeInstanceInfo_t, id);
CHECK_FIELD(nvmlComputeInstanceInfo_t, profileId);
CHECK_FIELD(nvmlComputeInstanceInfo_t, placement);

#ifdef NVML_GPU_FABRIC_UUID_LEN
CHECK_CONST(NVML_GPU_FABRIC_UUID_LEN);
CHECK_CONST(NVML_GPU_FABRIC_STATE_NOT_SUPPORTED);
CHECK_CONST(NVML_GPU_FABRIC_STATE_NOT_STARTED);
CHECK_CONST(NVML_GPU_FABRIC_STATE_IN_PROGRESS);
CHECK_CONST(NVML_GPU_FABRIC_STATE_COMPLETED);
CHECK_SIZE(nvmlGpuFabricState_t);
CHECK_SIZE(nvmlGpuFabricInfo_t);
CHECK_FIELD(nvmlGpuFabricInfo_t, clusterUuid);
CHECK_FIELD(nvmlGpuFabricInfo_t, status);
CHECK_FIELD(nvmlGpuFabricInfo_t, cliqueId);
CHECK_FIELD(nvmlGpuFabricInfo_t, state);
#endif

/* What the header at hand could not confirm: printed by main so that the test log says so. */
static const char *const unchecked[] = {
#ifndef NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1
        "NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1",
#endif
#ifndef NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2
        "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2",
#endif
#ifndef NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX
        "NVML_GPU_INSTANCE_PROFILE_{1,2,4}_SLICE_GFX",
#endif
#ifndef NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME
        "NVML_GPU_INSTANCE_PROFILE_{1,2}_SLICE_NO_ME",
#endif
#ifndef NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME
        "NVML_GPU_INSTANCE_PROFILE_{1,2}_SLICE_ALL_ME",
#endif
#ifndef NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME
        "NVML_GPU_INSTANCE_PROFILE_COUNT (only checked to exceed the header's)",
#endif
#ifndef NVML_GPU_INSTANCE_PROFILE_CAPS_P2P
        "NVML_GPU_INSTANCE_PROFILE_CAPS_P2P, NVML_GPU_INSTANCE_PROFILE_CAPS_GFX",
#endif
#ifndef NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1
        "NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1",
        "NVML_COMPUTE_INSTANCE_PROFILE_COUNT (only checked to exceed the header's)",
#endif
#ifndef NVML_GPU_FABRIC_UUID_LEN
        "NVML_GPU_FABRIC_UUID_LEN, NVML_GPU_FABRIC_STATE_*",
        "nvmlGpuFabricState_t, nvmlGpuFabricInfo_t (size and every field)",
#endif
        NULL,
};

void nvml_abi_functions_report(void);

int main(void) {
        size_t n = 0;

        for (const char *const *p = unchecked; *p; p++)
                n++;
        printf("nvml-abi: every constant, struct size and field offset that nvml.h (NVML API %d) declares matches "
               "agent/nvml/nvml-abi.h.\n", NVML_API_VERSION);
        nvml_abi_functions_report();
        if (n == 0)
                printf("nvml-abi: nothing left unchecked.\n");
        else {
                printf("nvml-abi: %zu declaration group%s could not be checked (this nvml.h predates them):\n", n,
                       n == 1 ? "" : "s");
                for (const char *const *p = unchecked; *p; p++)
                        printf("  %s\n", *p);
        }
        return 0;
}
