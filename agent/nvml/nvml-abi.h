/* SPDX-License-Identifier: MIT */
/* Owns our own declarations of the subset of the NVML C ABI that the agent (and the fake NVML in tests/)
 * use. We dlopen libnvidia-ml.so.1 and never build against NVIDIA's nvml.h, so every value, struct size
 * and field offset here is a promise about somebody else's binary: tests/abi/ compiles this file next to
 * the real nvml.h (Debian libnvidia-ml-dev) and static-asserts each one that header also declares.
 *
 * Names are NVML's own so that code reads like NVML code and the conformance test can pair them up. Every
 * NVML name goes through GNA_NVML(): normally it expands to the name itself; a translation unit that
 * defines GNA_NVML_ABI_PREFIX before including this file gets every name as gna_<name> instead, so that
 * it can include the real nvml.h as well and compare the two (only tests/abi does that). For the same
 * reason all constants are enumerators, not macros: a macro name cannot be renamed, an enumerator can.
 * Function entry points are never declared as functions here, only as gna_<entry point>_fn pointer
 * types, because we only ever call them through dlsym. With GNA_NVML_ABI_FUNCTIONS_ONLY defined (after
 * including the real nvml.h) only those pointer types are declared, in terms of NVIDIA's own types, so
 * that the test can check each one against the real prototype.
 *
 * Values that the CUDA 11.8-era header Debian ships does not have (and which the conformance test
 * therefore cannot check) are marked "unverified" with where they come from. */
#pragma once

#include <stddef.h>

#if defined(GNA_NVML_ABI_PREFIX)
#  define GNA_NVML(name) gna_##name
#elif defined(GNA_NVML_ABI_FUNCTIONS_ONLY)
#  define GNA_NVML(name) name
#else
#  ifdef __nvml_nvml_h__
#    error "nvml-abi.h and NVIDIA's nvml.h declare the same names; define GNA_NVML_ABI_PREFIX to compare them"
#  endif
#  define GNA_NVML(name) name
#endif

#ifndef GNA_NVML_ABI_FUNCTIONS_ONLY

/* ---- Return codes ---------------------------------------------------------------------------------- */

typedef enum GNA_NVML(nvmlReturn_enum) {
        GNA_NVML(NVML_SUCCESS) = 0,
        GNA_NVML(NVML_ERROR_UNINITIALIZED) = 1,
        GNA_NVML(NVML_ERROR_INVALID_ARGUMENT) = 2,
        GNA_NVML(NVML_ERROR_NOT_SUPPORTED) = 3,
        GNA_NVML(NVML_ERROR_NO_PERMISSION) = 4,
        GNA_NVML(NVML_ERROR_ALREADY_INITIALIZED) = 5,
        GNA_NVML(NVML_ERROR_NOT_FOUND) = 6,
        GNA_NVML(NVML_ERROR_INSUFFICIENT_SIZE) = 7,
        GNA_NVML(NVML_ERROR_INSUFFICIENT_POWER) = 8,
        GNA_NVML(NVML_ERROR_DRIVER_NOT_LOADED) = 9,
        GNA_NVML(NVML_ERROR_TIMEOUT) = 10,
        GNA_NVML(NVML_ERROR_IRQ_ISSUE) = 11,
        GNA_NVML(NVML_ERROR_LIBRARY_NOT_FOUND) = 12,
        GNA_NVML(NVML_ERROR_FUNCTION_NOT_FOUND) = 13,
        GNA_NVML(NVML_ERROR_CORRUPTED_INFOROM) = 14,
        GNA_NVML(NVML_ERROR_GPU_IS_LOST) = 15,
        GNA_NVML(NVML_ERROR_RESET_REQUIRED) = 16,
        GNA_NVML(NVML_ERROR_OPERATING_SYSTEM) = 17,
        GNA_NVML(NVML_ERROR_LIB_RM_VERSION_MISMATCH) = 18,
        GNA_NVML(NVML_ERROR_IN_USE) = 19,
        GNA_NVML(NVML_ERROR_MEMORY) = 20,
        GNA_NVML(NVML_ERROR_NO_DATA) = 21,
        GNA_NVML(NVML_ERROR_VGPU_ECC_NOT_SUPPORTED) = 22,
        GNA_NVML(NVML_ERROR_INSUFFICIENT_RESOURCES) = 23,
        GNA_NVML(NVML_ERROR_FREQ_NOT_SUPPORTED) = 24,
        GNA_NVML(NVML_ERROR_ARGUMENT_VERSION_MISMATCH) = 25,
        GNA_NVML(NVML_ERROR_UNKNOWN) = 999,
} GNA_NVML(nvmlReturn_t);

/* ---- Handles: opaque, only ever passed back to NVML --------------------------------------------------- */

typedef struct GNA_NVML(nvmlDevice_st) *GNA_NVML(nvmlDevice_t);
typedef struct GNA_NVML(nvmlGpuInstance_st) *GNA_NVML(nvmlGpuInstance_t);
typedef struct GNA_NVML(nvmlComputeInstance_st) *GNA_NVML(nvmlComputeInstance_t);
typedef struct GNA_NVML(nvmlEventSet_st) *GNA_NVML(nvmlEventSet_t);

/* ---- Buffer sizes and plain constants ----------------------------------------------------------------- */

enum {
        GNA_NVML(NVML_VALUE_NOT_AVAILABLE) = -1,

        GNA_NVML(NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE) = 32,
        GNA_NVML(NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE) = 16,
        GNA_NVML(NVML_DEVICE_UUID_BUFFER_SIZE) = 80,
        GNA_NVML(NVML_DEVICE_UUID_V2_BUFFER_SIZE) = 96,
        GNA_NVML(NVML_DEVICE_NAME_BUFFER_SIZE) = 64,
        GNA_NVML(NVML_DEVICE_NAME_V2_BUFFER_SIZE) = 96,
        GNA_NVML(NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE) = 80,
        GNA_NVML(NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE) = 80,

        GNA_NVML(NVML_DEVICE_MIG_DISABLE) = 0x0,
        GNA_NVML(NVML_DEVICE_MIG_ENABLE) = 0x1,
};

/* GPU instance profile *indices*: the argument of nvmlDeviceGetGpuInstanceProfileInfo(V), not the profile
 * id that Create/GetGpuInstances take. Newer drivers add indices; callers iterate at run time rather than
 * trusting _COUNT. */
enum {
        GNA_NVML(NVML_GPU_INSTANCE_PROFILE_1_SLICE) = 0x0,
        GNA_NVML(NVML_GPU_INSTANCE_PROFILE_2_SLICE) = 0x1,
        GNA_NVML(NVML_GPU_INSTANCE_PROFILE_3_SLICE) = 0x2,
        GNA_NVML(NVML_GPU_INSTANCE_PROFILE_4_SLICE) = 0x3,
        GNA_NVML(NVML_GPU_INSTANCE_PROFILE_7_SLICE) = 0x4,
        GNA_NVML(NVML_GPU_INSTANCE_PROFILE_8_SLICE) = 0x5,
        GNA_NVML(NVML_GPU_INSTANCE_PROFILE_6_SLICE) = 0x6,
        GNA_NVML(NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1) = 0x7,
        /* Unverified against a C header we can fetch (R525+/R570 headers; values agree in pynvml and the
         * nvml-wrapper-sys Rust bindings): */
        GNA_NVML(NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1) = 0x8,
        GNA_NVML(NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2) = 0x9,
        GNA_NVML(NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX) = 0xA,
        GNA_NVML(NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX) = 0xB,
        GNA_NVML(NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX) = 0xC,
        GNA_NVML(NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME) = 0xD,
        GNA_NVML(NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME) = 0xE,
        GNA_NVML(NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME) = 0xF,
        GNA_NVML(NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME) = 0x10,
        /* The count as of R570. The 11.8 header says 0x8 (it stops at 1_SLICE_REV1); the test knows. */
        GNA_NVML(NVML_GPU_INSTANCE_PROFILE_COUNT) = 0x11,

        /* nvmlGpuInstanceProfileInfo_v3_t.capabilities bits (unverified, R550+). */
        GNA_NVML(NVML_GPU_INSTANCE_PROFILE_CAPS_P2P) = 0x1,
        GNA_NVML(NVML_GPU_INSTANCE_PROFILE_CAPS_GFX) = 0x2,
};

/* Compute instance profile indices (argument of nvmlGpuInstanceGetComputeInstanceProfileInfo(V)). */
enum {
        GNA_NVML(NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE) = 0x0,
        GNA_NVML(NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE) = 0x1,
        GNA_NVML(NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE) = 0x2,
        GNA_NVML(NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE) = 0x3,
        GNA_NVML(NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE) = 0x4,
        GNA_NVML(NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE) = 0x5,
        GNA_NVML(NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE) = 0x6,
        GNA_NVML(NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1) = 0x7, /* unverified (R525+) */
        GNA_NVML(NVML_COMPUTE_INSTANCE_PROFILE_COUNT) = 0x8,        /* unverified; 0x7 in the 11.8 header */

        GNA_NVML(NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED) = 0x0,
        GNA_NVML(NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT) = 0x1,
};

/* Fabric (NVLink multi-node, GB200 NVL) state, nvmlGpuFabricInfo_t.state. Unverified: R525+ only. */
enum {
        GNA_NVML(NVML_GPU_FABRIC_UUID_LEN) = 16,
        GNA_NVML(NVML_GPU_FABRIC_STATE_NOT_SUPPORTED) = 0,
        GNA_NVML(NVML_GPU_FABRIC_STATE_NOT_STARTED) = 1,
        GNA_NVML(NVML_GPU_FABRIC_STATE_IN_PROGRESS) = 2,
        GNA_NVML(NVML_GPU_FABRIC_STATE_COMPLETED) = 3,
};
typedef unsigned char GNA_NVML(nvmlGpuFabricState_t);

/* NVLink: links per GPU (18 in the 11.8 header: Hopper's count) and nvmlDeviceGetNvLinkState's answer. */
enum {
        GNA_NVML(NVML_NVLINK_MAX_LINKS) = 18,
};
typedef enum GNA_NVML(nvmlEnableState_enum) {
        GNA_NVML(NVML_FEATURE_DISABLED) = 0,
        GNA_NVML(NVML_FEATURE_ENABLED) = 1,
} GNA_NVML(nvmlEnableState_t);

/* Event types (nvmlDeviceRegisterEvents' mask, nvmlEventData_t.eventType): a 64-bit mask in nvml.h
 * (unsigned long long); these fit an int. eventData of an XID event is the XID. */
enum {
        GNA_NVML(nvmlEventTypeSingleBitEccError) = 0x1,
        GNA_NVML(nvmlEventTypeDoubleBitEccError) = 0x2,
        GNA_NVML(nvmlEventTypePState) = 0x4,
        GNA_NVML(nvmlEventTypeXidCriticalError) = 0x8,
        GNA_NVML(nvmlEventTypeClock) = 0x10,
};

/* ---- Structs ------------------------------------------------------------------------------------------ */

/* The layout nvmlDeviceGetPciInfo_v3 (and _v2) fill in. busId is "00000000:1B:00.0": 8 hex digits of
 * domain, upper case. */
typedef struct GNA_NVML(nvmlPciInfo_st) {
        char busIdLegacy[GNA_NVML(NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE)];
        unsigned int domain;
        unsigned int bus;
        unsigned int device;
        unsigned int pciDeviceId;    /* device << 16 | vendor */
        unsigned int pciSubSystemId; /* subsystem device << 16 | subsystem vendor */
        char busId[GNA_NVML(NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE)];
} GNA_NVML(nvmlPciInfo_t);

/* nvmlDeviceGetMemoryInfo (v1, unversioned): bytes. */
typedef struct GNA_NVML(nvmlMemory_st) {
        unsigned long long total;
        unsigned long long free;
        unsigned long long used;
} GNA_NVML(nvmlMemory_t);

/* nvmlDeviceGetAttributes_v2, meaningful on a MIG device handle. */
typedef struct GNA_NVML(nvmlDeviceAttributes_st) {
        unsigned int multiprocessorCount;
        unsigned int sharedCopyEngineCount;
        unsigned int sharedDecoderCount;
        unsigned int sharedEncoderCount;
        unsigned int sharedJpegCount;
        unsigned int sharedOfaCount;
        unsigned int gpuInstanceSliceCount;
        unsigned int computeInstanceSliceCount;
        unsigned long long memorySizeMB; /* MiB despite the name */
} GNA_NVML(nvmlDeviceAttributes_t);

/* nvmlDeviceGetComputeRunningProcesses_v3 (and _v2) element; the ids are 0xFFFFFFFF without MIG. */
typedef struct GNA_NVML(nvmlProcessInfo_st) {
        unsigned int pid;
        unsigned long long usedGpuMemory;
        unsigned int gpuInstanceId;
        unsigned int computeInstanceId;
} GNA_NVML(nvmlProcessInfo_t);

/* A GPU instance placement, in memory slices. */
typedef struct GNA_NVML(nvmlGpuInstancePlacement_st) {
        unsigned int start;
        unsigned int size;
} GNA_NVML(nvmlGpuInstancePlacement_t);

typedef struct GNA_NVML(nvmlGpuInstanceProfileInfo_st) {
        unsigned int id; /* the profile id, distinct from the index it was asked by */
        unsigned int isP2pSupported;
        unsigned int sliceCount;
        unsigned int instanceCount; /* the most instances of this profile the GPU can hold */
        unsigned int multiprocessorCount;
        unsigned int copyEngineCount;
        unsigned int decoderCount;
        unsigned int encoderCount;
        unsigned int jpegCount;
        unsigned int ofaCount;
        unsigned long long memorySizeMB;
} GNA_NVML(nvmlGpuInstanceProfileInfo_t);

/* nvmlDeviceGetGpuInstanceProfileInfoV: like the above with a leading version (set by the caller to
 * nvmlGpuInstanceProfileInfo_v2) and the driver's own profile name at the end. */
typedef struct GNA_NVML(nvmlGpuInstanceProfileInfo_v2_st) {
        unsigned int version;
        unsigned int id;
        unsigned int isP2pSupported;
        unsigned int sliceCount;
        unsigned int instanceCount;
        unsigned int multiprocessorCount;
        unsigned int copyEngineCount;
        unsigned int decoderCount;
        unsigned int encoderCount;
        unsigned int jpegCount;
        unsigned int ofaCount;
        unsigned long long memorySizeMB;
        char name[GNA_NVML(NVML_DEVICE_NAME_V2_BUFFER_SIZE)];
} GNA_NVML(nvmlGpuInstanceProfileInfo_v2_t);

typedef struct GNA_NVML(nvmlGpuInstanceInfo_st) {
        GNA_NVML(nvmlDevice_t) device;
        unsigned int id;
        unsigned int profileId;
        GNA_NVML(nvmlGpuInstancePlacement_t) placement;
} GNA_NVML(nvmlGpuInstanceInfo_t);

/* A compute instance placement, in compute slices within its GPU instance. */
typedef struct GNA_NVML(nvmlComputeInstancePlacement_st) {
        unsigned int start;
        unsigned int size;
} GNA_NVML(nvmlComputeInstancePlacement_t);

typedef struct GNA_NVML(nvmlComputeInstanceProfileInfo_st) {
        unsigned int id;
        unsigned int sliceCount;
        unsigned int instanceCount;
        unsigned int multiprocessorCount;
        unsigned int sharedCopyEngineCount;
        unsigned int sharedDecoderCount;
        unsigned int sharedEncoderCount;
        unsigned int sharedJpegCount;
        unsigned int sharedOfaCount;
} GNA_NVML(nvmlComputeInstanceProfileInfo_t);

typedef struct GNA_NVML(nvmlComputeInstanceProfileInfo_v2_st) {
        unsigned int version;
        unsigned int id;
        unsigned int sliceCount;
        unsigned int instanceCount;
        unsigned int multiprocessorCount;
        unsigned int sharedCopyEngineCount;
        unsigned int sharedDecoderCount;
        unsigned int sharedEncoderCount;
        unsigned int sharedJpegCount;
        unsigned int sharedOfaCount;
        char name[GNA_NVML(NVML_DEVICE_NAME_V2_BUFFER_SIZE)];
} GNA_NVML(nvmlComputeInstanceProfileInfo_v2_t);

typedef struct GNA_NVML(nvmlComputeInstanceInfo_st) {
        GNA_NVML(nvmlDevice_t) device;
        GNA_NVML(nvmlGpuInstance_t) gpuInstance;
        unsigned int id;
        unsigned int profileId;
        GNA_NVML(nvmlComputeInstancePlacement_t) placement;
} GNA_NVML(nvmlComputeInstanceInfo_t);

/* nvmlDeviceGetGpuFabricInfo (R525+, unverified): the NVLink fabric a GPU belongs to. status is the
 * result of fabric registration, meaningful once state is COMPLETED. */
typedef struct GNA_NVML(nvmlGpuFabricInfo_st) {
        unsigned char clusterUuid[GNA_NVML(NVML_GPU_FABRIC_UUID_LEN)];
        GNA_NVML(nvmlReturn_t) status;
        unsigned int cliqueId;
        GNA_NVML(nvmlGpuFabricState_t) state;
} GNA_NVML(nvmlGpuFabricInfo_t);

/* What nvmlEventSetWait_v2 fills in: the device (a MIG device handle for an event inside one), the type
 * bit, the data (the XID for nvmlEventTypeXidCriticalError) and, on MIG, the GI/CI ids (0xFFFFFFFF on a
 * whole GPU). */
typedef struct GNA_NVML(nvmlEventData_st) {
        GNA_NVML(nvmlDevice_t) device;
        unsigned long long eventType;
        unsigned long long eventData;
        unsigned int gpuInstanceId;
        unsigned int computeInstanceId;
} GNA_NVML(nvmlEventData_t);

/* Struct version words, as NVML builds them: the struct's size in the low bits, the version in the top
 * byte. NVML_STRUCT_VERSION itself is only defined under its own name in unprefixed builds. */
#define GNA_NVML_STRUCT_VERSION(type, ver) ((unsigned int) (sizeof(type) | ((unsigned int) (ver) << 24U)))
#ifndef GNA_NVML_ABI_PREFIX
#  define NVML_STRUCT_VERSION(data, ver) GNA_NVML_STRUCT_VERSION(nvml##data##_v##ver##_t, ver)
#endif

enum {
        GNA_NVML(nvmlGpuInstanceProfileInfo_v2) =
                GNA_NVML_STRUCT_VERSION(GNA_NVML(nvmlGpuInstanceProfileInfo_v2_t), 2),
        GNA_NVML(nvmlComputeInstanceProfileInfo_v2) =
                GNA_NVML_STRUCT_VERSION(GNA_NVML(nvmlComputeInstanceProfileInfo_v2_t), 2),
};

#endif /* GNA_NVML_ABI_FUNCTIONS_ONLY */

/* ---- Entry points, as pointer types for dlsym ------------------------------------------------------------
 * One per symbol we look up; a versioned symbol and its unversioned fallback share a type when their
 * arguments have the same layout (the v2/v3 variants differ only in semantics we handle). */

typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlInit_v2_fn)(void); /* also nvmlInit */
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlShutdown_fn)(void);
typedef const char *(*gna_nvmlErrorString_fn)(GNA_NVML(nvmlReturn_t) result);

typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlSystemGetDriverVersion_fn)(char *version, unsigned int length);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlSystemGetNVMLVersion_fn)(char *version, unsigned int length);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlSystemGetCudaDriverVersion_fn)(int *cudaDriverVersion); /* and _v2 */

typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlDeviceGetCount_v2_fn)(unsigned int *deviceCount);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlDeviceGetHandleByIndex_v2_fn)(unsigned int index,
                                                                      GNA_NVML(nvmlDevice_t) *device);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlDeviceGetHandleByPciBusId_v2_fn)(const char *pciBusId,
                                                                         GNA_NVML(nvmlDevice_t) *device);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlDeviceGetIndex_fn)(GNA_NVML(nvmlDevice_t) device, unsigned int *index);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlDeviceGetName_fn)(GNA_NVML(nvmlDevice_t) device, char *name,
                                                          unsigned int length);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlDeviceGetUUID_fn)(GNA_NVML(nvmlDevice_t) device, char *uuid,
                                                          unsigned int length);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlDeviceGetPciInfo_v3_fn)(GNA_NVML(nvmlDevice_t) device,
                                                                GNA_NVML(nvmlPciInfo_t) *pci);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlDeviceGetMemoryInfo_fn)(GNA_NVML(nvmlDevice_t) device,
                                                                GNA_NVML(nvmlMemory_t) *memory);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlDeviceGetCudaComputeCapability_fn)(GNA_NVML(nvmlDevice_t) device,
                                                                           int *major, int *minor);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlDeviceGetMinorNumber_fn)(GNA_NVML(nvmlDevice_t) device,
                                                                 unsigned int *minorNumber);
/* (A real header older than R525 has no fabric types; the function check skips this one then.) */
#if !defined(GNA_NVML_ABI_FUNCTIONS_ONLY) || defined(NVML_GPU_FABRIC_UUID_LEN)
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlDeviceGetGpuFabricInfo_fn)(GNA_NVML(nvmlDevice_t) device,
                                                                   GNA_NVML(nvmlGpuFabricInfo_t) *gpuFabricInfo);
#endif
/* NVLink topology (Slurm's Links=): a link's state, and the PCI address of what is at its far end. */
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlDeviceGetNvLinkState_fn)(GNA_NVML(nvmlDevice_t) device, unsigned int link,
                                                                 GNA_NVML(nvmlEnableState_t) *isActive);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlDeviceGetNvLinkRemotePciInfo_v2_fn)(GNA_NVML(nvmlDevice_t) device,
                                                                            unsigned int link,
                                                                            GNA_NVML(nvmlPciInfo_t) *pci);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlDeviceGetComputeRunningProcesses_v3_fn)(
        GNA_NVML(nvmlDevice_t) device, unsigned int *infoCount, GNA_NVML(nvmlProcessInfo_t) *infos);

/* MIG */
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlDeviceGetMigMode_fn)(GNA_NVML(nvmlDevice_t) device,
                                                             unsigned int *currentMode, unsigned int *pendingMode);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlDeviceSetMigMode_fn)(GNA_NVML(nvmlDevice_t) device, unsigned int mode,
                                                             GNA_NVML(nvmlReturn_t) *activationStatus);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlDeviceGetGpuInstanceProfileInfo_fn)(
        GNA_NVML(nvmlDevice_t) device, unsigned int profile, GNA_NVML(nvmlGpuInstanceProfileInfo_t) *info);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlDeviceGetGpuInstanceProfileInfoV_fn)(
        GNA_NVML(nvmlDevice_t) device, unsigned int profile, GNA_NVML(nvmlGpuInstanceProfileInfo_v2_t) *info);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlDeviceGetGpuInstancePossiblePlacements_v2_fn)(
        GNA_NVML(nvmlDevice_t) device, unsigned int profileId, GNA_NVML(nvmlGpuInstancePlacement_t) *placements,
        unsigned int *count);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlDeviceGetGpuInstances_fn)(GNA_NVML(nvmlDevice_t) device,
                                                                  unsigned int profileId,
                                                                  GNA_NVML(nvmlGpuInstance_t) *gpuInstances,
                                                                  unsigned int *count);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlDeviceGetGpuInstanceById_fn)(GNA_NVML(nvmlDevice_t) device, unsigned int id,
                                                                     GNA_NVML(nvmlGpuInstance_t) *gpuInstance);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlDeviceCreateGpuInstanceWithPlacement_fn)(
        GNA_NVML(nvmlDevice_t) device, unsigned int profileId, const GNA_NVML(nvmlGpuInstancePlacement_t) *placement,
        GNA_NVML(nvmlGpuInstance_t) *gpuInstance);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlGpuInstanceDestroy_fn)(GNA_NVML(nvmlGpuInstance_t) gpuInstance);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlGpuInstanceGetInfo_fn)(GNA_NVML(nvmlGpuInstance_t) gpuInstance,
                                                               GNA_NVML(nvmlGpuInstanceInfo_t) *info);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlGpuInstanceGetComputeInstanceProfileInfo_fn)(
        GNA_NVML(nvmlGpuInstance_t) gpuInstance, unsigned int profile, unsigned int engProfile,
        GNA_NVML(nvmlComputeInstanceProfileInfo_t) *info);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlGpuInstanceGetComputeInstanceProfileInfoV_fn)(
        GNA_NVML(nvmlGpuInstance_t) gpuInstance, unsigned int profile, unsigned int engProfile,
        GNA_NVML(nvmlComputeInstanceProfileInfo_v2_t) *info);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlGpuInstanceGetComputeInstances_fn)(
        GNA_NVML(nvmlGpuInstance_t) gpuInstance, unsigned int profileId,
        GNA_NVML(nvmlComputeInstance_t) *computeInstances, unsigned int *count);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlGpuInstanceGetComputeInstanceById_fn)(
        GNA_NVML(nvmlGpuInstance_t) gpuInstance, unsigned int id, GNA_NVML(nvmlComputeInstance_t) *computeInstance);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlGpuInstanceCreateComputeInstance_fn)(
        GNA_NVML(nvmlGpuInstance_t) gpuInstance, unsigned int profileId,
        GNA_NVML(nvmlComputeInstance_t) *computeInstance);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlComputeInstanceDestroy_fn)(GNA_NVML(nvmlComputeInstance_t) computeInstance);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlComputeInstanceGetInfo_v2_fn)(GNA_NVML(nvmlComputeInstance_t) computeInstance,
                                                                      GNA_NVML(nvmlComputeInstanceInfo_t) *info);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlDeviceGetMaxMigDeviceCount_fn)(GNA_NVML(nvmlDevice_t) device,
                                                                       unsigned int *count);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlDeviceGetMigDeviceHandleByIndex_fn)(GNA_NVML(nvmlDevice_t) device,
                                                                            unsigned int index,
                                                                            GNA_NVML(nvmlDevice_t) *migDevice);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlDeviceGetAttributes_v2_fn)(GNA_NVML(nvmlDevice_t) device,
                                                                   GNA_NVML(nvmlDeviceAttributes_t) *attributes);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlDeviceGetGpuInstanceId_fn)(GNA_NVML(nvmlDevice_t) device, unsigned int *id);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlDeviceGetComputeInstanceId_fn)(GNA_NVML(nvmlDevice_t) device,
                                                                       unsigned int *id);

/* Health (agent/nvml/gpu-nvml-events.c): the event set a worker process blocks on, and row remapping. */
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlEventSetCreate_fn)(GNA_NVML(nvmlEventSet_t) *set);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlEventSetFree_fn)(GNA_NVML(nvmlEventSet_t) set);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlDeviceRegisterEvents_fn)(GNA_NVML(nvmlDevice_t) device,
                                                                 unsigned long long eventTypes,
                                                                 GNA_NVML(nvmlEventSet_t) set);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlDeviceGetSupportedEventTypes_fn)(GNA_NVML(nvmlDevice_t) device,
                                                                         unsigned long long *eventTypes);
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlEventSetWait_v2_fn)(GNA_NVML(nvmlEventSet_t) set,
                                                            GNA_NVML(nvmlEventData_t) *data,
                                                            unsigned int timeoutms); /* also nvmlEventSetWait */
typedef GNA_NVML(nvmlReturn_t) (*gna_nvmlDeviceGetRemappedRows_fn)(GNA_NVML(nvmlDevice_t) device,
                                                                  unsigned int *corrRows, unsigned int *uncRows,
                                                                  unsigned int *isPending,
                                                                  unsigned int *failureOccurred);
