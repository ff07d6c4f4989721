/* SPDX-License-Identifier: MIT */
/* Owns the entry-point half of the NVML ABI conformance test: every gna_<entry point>_fn pointer type of
 * agent/nvml/nvml-abi.h, declared here in terms of NVIDIA's own types (GNA_NVML_ABI_FUNCTIONS_ONLY), must
 * be the type of a pointer to the real prototype, for the preferred symbol and for its fallback. Types
 * are compared after our structs are proven identical by nvml-abi-types.c. */

/* Declares the older, unversioned prototypes too, instead of #defining their names to the new ones. */
#define NVML_NO_UNVERSIONED_FUNC_DEFS 1
#include <nvml.h>
#include <stdio.h>

#define GNA_NVML_ABI_FUNCTIONS_ONLY 1
#include "nvml-abi.h"

#define CHECK_FN(type, symbol)                                                                               \
        _Static_assert(__builtin_types_compatible_p(type, __typeof__(&symbol)),                               \
                       #symbol " does not have the type " #type)

CHECK_FN(gna_nvmlInit_v2_fn, nvmlInit_v2);
CHECK_FN(gna_nvmlInit_v2_fn, nvmlInit);
CHECK_FN(gna_nvmlShutdown_fn, nvmlShutdown);
CHECK_FN(gna_nvmlErrorString_fn, nvmlErrorString);
CHECK_FN(gna_nvmlSystemGetDriverVersion_fn, nvmlSystemGetDriverVersion);
CHECK_FN(gna_nvmlSystemGetNVMLVersion_fn, nvmlSystemGetNVMLVersion);
CHECK_FN(gna_nvmlSystemGetCudaDriverVersion_fn, nvmlSystemGetCudaDriverVersion_v2);
CHECK_FN(gna_nvmlSystemGetCudaDriverVersion_fn, nvmlSystemGetCudaDriverVersion);

CHECK_FN(gna_nvmlDeviceGetCount_v2_fn, nvmlDeviceGetCount_v2);
CHECK_FN(gna_nvmlDeviceGetCount_v2_fn, nvmlDeviceGetCount);
CHECK_FN(gna_nvmlDeviceGetHandleByIndex_v2_fn, nvmlDeviceGetHandleByIndex_v2);
CHECK_FN(gna_nvmlDeviceGetHandleByIndex_v2_fn, nvmlDeviceGetHandleByIndex);
CHECK_FN(gna_nvmlDeviceGetHandleByPciBusId_v2_fn, nvmlDeviceGetHandleByPciBusId_v2);
CHECK_FN(gna_nvmlDeviceGetHandleByPciBusId_v2_fn, nvmlDeviceGetHandleByPciBusId);
CHECK_FN(gna_nvmlDeviceGetIndex_fn, nvmlDeviceGetIndex);
CHECK_FN(gna_nvmlDeviceGetName_fn, nvmlDeviceGetName);
CHECK_FN(gna_nvmlDeviceGetUUID_fn, nvmlDeviceGetUUID);
CHECK_FN(gna_nvmlDeviceGetPciInfo_v3_fn, nvmlDeviceGetPciInfo_v3);
CHECK_FN(gna_nvmlDeviceGetPciInfo_v3_fn, nvmlDeviceGetPciInfo_v2);
CHECK_FN(gna_nvmlDeviceGetMemoryInfo_fn, nvmlDeviceGetMemoryInfo);
CHECK_FN(gna_nvmlDeviceGetCudaComputeCapability_fn, nvmlDeviceGetCudaComputeCapability);
CHECK_FN(gna_nvmlDeviceGetMinorNumber_fn, nvmlDeviceGetMinorNumber);
#ifdef NVML_GPU_FABRIC_UUID_LEN
CHECK_FN(gna_nvmlDeviceGetGpuFabricInfo_fn, nvmlDeviceGetGpuFabricInfo);
#endif
CHECK_FN(gna_nvmlDeviceGetNvLinkState_fn, nvmlDeviceGetNvLinkState);
CHECK_FN(gna_nvmlDeviceGetNvLinkRemotePciInfo_v2_fn, nvmlDeviceGetNvLinkRemotePciInfo_v2);
CHECK_FN(gna_nvmlDeviceGetComputeRunningProcesses_v3_fn, nvmlDeviceGetComputeRunningProcesses_v3);
/* The _v2 fallback takes nvmlProcessInfo_v2_t*, a distinct type of the same layout (nvml-abi-types.c). */

CHECK_FN(gna_nvmlDeviceGetMigMode_fn, nvmlDeviceGetMigMode);
CHECK_FN(gna_nvmlDeviceSetMigMode_fn, nvmlDeviceSetMigMode);
CHECK_FN(gna_nvmlDeviceGetGpuInstanceProfileInfo_fn, nvmlDeviceGetGpuInstanceProfileInfo);
CHECK_FN(gna_nvmlDeviceGetGpuInstanceProfileInfoV_fn, nvmlDeviceGetGpuInstanceProfileInfoV);
CHECK_FN(gna_nvmlDeviceGetGpuInstancePossiblePlacements_v2_fn, nvmlDeviceGetGpuInstancePossiblePlacements_v2);
CHECK_FN(gna_nvmlDeviceGetGpuInstancePossiblePlacements_v2_fn, nvmlDeviceGetGpuInstancePossiblePlacements);
CHECK_FN(gna_nvmlDeviceGetGpuInstances_fn, nvmlDeviceGetGpuInstances);
CHECK_FN(gna_nvmlDeviceGetGpuInstanceById_fn, nvmlDeviceGetGpuInstanceById);
CHECK_FN(gna_nvmlDeviceCreateGpuInstanceWithPlacement_fn, nvmlDeviceCreateGpuInstanceWithPlacement);
CHECK_FN(gna_nvmlGpuInstanceDestroy_fn, nvmlGpuInstanceDestroy);
CHECK_FN(gna_nvmlGpuInstanceGetInfo_fn, nvmlGpuInstanceGetInfo);
CHECK_FN(gna_nvmlGpuInstanceGetComputeInstanceProfileInfo_fn, nvmlGpuInstanceGetComputeInstanceProfileInfo);
CHECK_FN(gna_nvmlGpuInstanceGetComputeInstanceProfileInfoV_fn, nvmlGpuInstanceGetComputeInstanceProfileInfoV);
CHECK_FN(gna_nvmlGpuInstanceGetComputeInstances_fn, nvmlGpuInstanceGetComputeInstances);
CHECK_FN(gna_nvmlGpuInstanceGetComputeInstanceById_fn, nvmlGpuInstanceGetComputeInstanceById);
CHECK_FN(gna_nvmlGpuInstanceCreateComputeInstance_fn, nvmlGpuInstanceCreateComputeInstance);
CHECK_FN(gna_nvmlComputeInstanceDestroy_fn, nvmlComputeInstanceDestroy);
CHECK_FN(gna_nvmlComputeInstanceGetInfo_v2_fn, nvmlComputeInstanceGetInfo_v2);
CHECK_FN(gna_nvmlComputeInstanceGetInfo_v2_fn, nvmlComputeInstanceGetInfo);
CHECK_FN(gna_nvmlDeviceGetMaxMigDeviceCount_fn, nvmlDeviceGetMaxMigDeviceCount);
CHECK_FN(gna_nvmlDeviceGetMigDeviceHandleByIndex_fn, nvmlDeviceGetMigDeviceHandleByIndex);
CHECK_FN(gna_nvmlDeviceGetAttributes_v2_fn, nvmlDeviceGetAttributes_v2);
CHECK_FN(gna_nvmlDeviceGetAttributes_v2_fn, nvmlDeviceGetAttributes);
CHECK_FN(gna_nvmlDeviceGetGpuInstanceId_fn, nvmlDeviceGetGpuInstanceId);
CHECK_FN(gna_nvmlDeviceGetComputeInstanceId_fn, nvmlDeviceGetComputeInstanceId);
CHECK_FN(gna_nvmlEventSetCreate_fn, nvmlEventSetCreate);
CHECK_FN(gna_nvmlEventSetFree_fn, nvmlEventSetFree);
CHECK_FN(gna_nvmlDeviceRegisterEvents_fn, nvmlDeviceRegisterEvents);
CHECK_FN(gna_nvmlDeviceGetSupportedEventTypes_fn, nvmlDeviceGetSupportedEventTypes);
CHECK_FN(gna_nvmlEventSetWait_v2_fn, nvmlEventSetWait_v2);
CHECK_FN(gna_nvmlEventSetWait_v2_fn, nvmlEventSetWait);
CHECK_FN(gna_nvmlDeviceGetRemappedRows_fn, nvmlDeviceGetRemappedRows);

/* Linked into the same program as nvml-abi-types.c, which has main. */
void nvml_abi_functions_report(void);
void nvml_abi_functions_report(void) {
#ifdef NVML_GPU_FABRIC_UUID_LEN
        printf("nvml-abi: every entry point type matches its nvml.h prototype.\n");
#else
        printf("nvml-abi: every entry point type matches its nvml.h prototype, except nvmlDeviceGetGpuFabricInfo, "
               "which this nvml.h predates.\n");
#endif
}
