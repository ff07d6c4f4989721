/* SPDX-License-Identifier: MIT */
/* Owns the inside of GpuNvml, shared by the files of agent/nvml/ and by the MIG manager: the table of
 * entry points resolved with dlsym, the one place every call goes through (counting, return code →
 * negative errno, NVML's error string kept for the message), and one small gpu_nvml_<call>() wrapper per
 * entry point. Code outside agent/ (labels, CDI) uses gpu-nvml.h only. */
#pragma once

#include <stdint.h>

#include "gpu-nvml.h"
#include "nvml-abi.h"

/* Every entry point we may call. The field is named after the preferred (versioned) symbol; the loader
 * falls back to the older name where one exists (see the table in gpu-nvml.c). NULL = not exported. */
typedef struct GpuNvmlFunctions {
        gna_nvmlInit_v2_fn nvmlInit_v2;
        gna_nvmlShutdown_fn nvmlShutdown;
        gna_nvmlErrorString_fn nvmlErrorString;
        gna_nvmlSystemGetDriverVersion_fn nvmlSystemGetDriverVersion;
        gna_nvmlSystemGetNVMLVersion_fn nvmlSystemGetNVMLVersion;
        gna_nvmlSystemGetCudaDriverVersion_fn nvmlSystemGetCudaDriverVersion_v2;

        gna_nvmlDeviceGetCount_v2_fn nvmlDeviceGetCount_v2;
        gna_nvmlDeviceGetHandleByIndex_v2_fn nvmlDeviceGetHandleByIndex_v2;
        gna_nvmlDeviceGetHandleByPciBusId_v2_fn nvmlDeviceGetHandleByPciBusId_v2;
        gna_nvmlDeviceGetIndex_fn nvmlDeviceGetIndex;
        gna_nvmlDeviceGetName_fn nvmlDeviceGetName;
        gna_nvmlDeviceGetUUID_fn nvmlDeviceGetUUID;
        gna_nvmlDeviceGetPciInfo_v3_fn nvmlDeviceGetPciInfo_v3;
        gna_nvmlDeviceGetMemoryInfo_fn nvmlDeviceGetMemoryInfo;
        gna_nvmlDeviceGetCudaComputeCapability_fn nvmlDeviceGetCudaComputeCapability;
        gna_nvmlDeviceGetMinorNumber_fn nvmlDeviceGetMinorNumber;
        gna_nvmlDeviceGetGpuFabricInfo_fn nvmlDeviceGetGpuFabricInfo;
        gna_nvmlDeviceGetNvLinkState_fn nvmlDeviceGetNvLinkState;
        gna_nvmlDeviceGetNvLinkRemotePciInfo_v2_fn nvmlDeviceGetNvLinkRemotePciInfo_v2;
        gna_nvmlDeviceGetComputeRunningProcesses_v3_fn nvmlDeviceGetComputeRunningProcesses_v3;

        gna_nvmlDeviceGetMigMode_fn nvmlDeviceGetMigMode;
        gna_nvmlDeviceSetMigMode_fn nvmlDeviceSetMigMode;
        gna_nvmlDeviceGetGpuInstanceProfileInfo_fn nvmlDeviceGetGpuInstanceProfileInfo;
        gna_nvmlDeviceGetGpuInstanceProfileInfoV_fn nvmlDeviceGetGpuInstanceProfileInfoV;
        gna_nvmlDeviceGetGpuInstancePossiblePlacements_v2_fn nvmlDeviceGetGpuInstancePossiblePlacements_v2;
        gna_nvmlDeviceGetGpuInstances_fn nvmlDeviceGetGpuInstances;
        gna_nvmlDeviceGetGpuInstanceById_fn nvmlDeviceGetGpuInstanceById;
        gna_nvmlDeviceCreateGpuInstanceWithPlacement_fn nvmlDeviceCreateGpuInstanceWithPlacement;
        gna_nvmlGpuInstanceDestroy_fn nvmlGpuInstanceDestroy;
        gna_nvmlGpuInstanceGetInfo_fn nvmlGpuInstanceGetInfo;
        gna_nvmlGpuInstanceGetComputeInstanceProfileInfo_fn nvmlGpuInstanceGetComputeInstanceProfileInfo;
        gna_nvmlGpuInstanceGetComputeInstanceProfileInfoV_fn nvmlGpuInstanceGetComputeInstanceProfileInfoV;
        gna_nvmlGpuInstanceGetComputeInstances_fn nvmlGpuInstanceGetComputeInstances;
        gna_nvmlGpuInstanceGetComputeInstanceById_fn nvmlGpuInstanceGetComputeInstanceById;
        gna_nvmlGpuInstanceCreateComputeInstance_fn nvmlGpuInstanceCreateComputeInstance;
        gna_nvmlComputeInstanceDestroy_fn nvmlComputeInstanceDestroy;
        gna_nvmlComputeInstanceGetInfo_v2_fn nvmlComputeInstanceGetInfo_v2;
        gna_nvmlDeviceGetMaxMigDeviceCount_fn nvmlDeviceGetMaxMigDeviceCount;
        gna_nvmlDeviceGetMigDeviceHandleByIndex_fn nvmlDeviceGetMigDeviceHandleByIndex;
        gna_nvmlDeviceGetAttributes_v2_fn nvmlDeviceGetAttributes_v2;
        gna_nvmlDeviceGetGpuInstanceId_fn nvmlDeviceGetGpuInstanceId;
        gna_nvmlDeviceGetComputeInstanceId_fn nvmlDeviceGetComputeInstanceId;
} GpuNvmlFunctions;

/* Static facts of one GPU, by PCI address, read once and kept until gpu_nvml_invalidate(). A fact is
 * kept only once read successfully, so a failed call is retried (and warned about) on the next read. */
typedef enum GpuNvmlFact {
        GPU_FACT_INDEX = 1u << 0,
        GPU_FACT_NAME = 1u << 1,
        GPU_FACT_UUID = 1u << 2,
        GPU_FACT_MEMORY = 1u << 3,
        GPU_FACT_CC = 1u << 4,
        GPU_FACT_MINOR = 1u << 5,
        GPU_FACT_NO_MIG = 1u << 6,     /* GetMigMode said NOT_SUPPORTED: never MIG-capable */
        GPU_FACT_MAX_MIG = 1u << 7,
        GPU_FACT_NO_FABRIC = 1u << 8,  /* GetGpuFabricInfo said NOT_SUPPORTED: never fabric-attached */
        GPU_FACT_NVLINK = 1u << 9,     /* NVLink topology read (nvlink_known / nvlink_remotes) */
        GPU_FACT_PCI_IDS = 1u << 10,   /* pci_device_id / pci_subsystem_id (the MIG reads) */
} GpuNvmlFact;

enum {
        GPU_SYSTEM_DRIVER = 1u << 0,
        GPU_SYSTEM_NVML = 1u << 1,
        GPU_SYSTEM_CUDA = 1u << 2,
};

typedef struct GpuNvmlCached {
        char pci_address[32];
        bool absent;                   /* NVML does not know this address (vfio-pci, unbound) */
        nvmlDevice_t handle;
        unsigned facts;                /* GpuNvmlFact bits */
        unsigned nvml_index;
        char *name;
        char *uuid;
        uint64_t memory_total_bytes;
        uint32_t pci_device_id, pci_subsystem_id; /* nvmlPciInfo_t's, as device-filter writes them */
        int cc_major, cc_minor;
        int minor;
        unsigned max_mig_devices;
        bool nvlink_known;             /* NVML answered NvLinkState (not NOT_SUPPORTED) */
        char **nvlink_remotes;         /* one per active link: the far end's PCI address, ours spelled */
        /* The MIG devices the last read found and read without a warning, by UUID: a MIG device's facts
         * (attributes, GI/CI ids, profiles, placement, profile name) cannot change while it exists, and
         * re-creating it gives it a new UUID. Emptied when the GPU leaves MIG mode. */
        MigDeviceInfo *mig_known;
        size_t n_mig_known;
} GpuNvmlCached;

/* GPU instance profile id → attribute suffix ("+me" …), one table per GPU model (by name). */
typedef struct GpuNvmlGiProfile {
        unsigned id;
        char suffix[16];
} GpuNvmlGiProfile;

/* (GI profile id, compute slices) → CI profile id, for drivers without nvmlGpuInstanceGetComputeInstanceById. */
typedef struct GpuNvmlCiProfile {
        unsigned gi_profile_id, ci_slices, id;
} GpuNvmlCiProfile;

typedef struct GpuNvmlModel {
        char *name;
        GpuNvmlGiProfile *profiles;
        size_t n_profiles;
        GpuNvmlCiProfile *ci_profiles;
        size_t n_ci_profiles;
} GpuNvmlModel;

struct GpuNvml {
        void *dl;
        char *library;
        bool initialized;
        uint64_t calls;
        GpuNvmlFunctions fn;
        /* The last failed call. Its message is made only when asked for (gpu_nvml_last_error), so that
         * the expected failures (NOT_FOUND for an empty MIG slot, NOT_SUPPORTED) cost no nvmlErrorString. */
        const char *last_entry;        /* a string literal */
        nvmlReturn_t last_rc;
        bool last_missing;             /* the entry point is not exported */
        bool last_formatted;
        char last_error[256];

        /* System versions cannot change while the library is loaded (a new driver means a new module,
         * which makes NVML fail and the stage reopen it), so they are read once, like the static facts. */
        unsigned system_facts;         /* GPU_SYSTEM_* bits: read, or known to be unanswerable */
        char *driver_version, *nvml_version;
        int cuda_version;

        char **enumerated;             /* PCI addresses of every GPU NVML lists, for a read without a list */
        /* Per-model MIG facts kept by agent/mig (mig-state.c) for the life of this handle: a new handle
         * (the driver may have been reloaded) starts without them. */
        struct MigModelCache *mig_models;
        void (*mig_models_free)(struct MigModelCache *c);

        GpuNvmlCached *cached;
        size_t n_cached;
        GpuNvmlModel *models;
        size_t n_models;

        /* Told before every entry-point call (the worker forwards it, so that a call that never returns
         * can be named); progress_gpu is our index of the GPU being read, -1 outside a GPU. */
        GpuNvmlProgress progress;
        void *progress_userdata;
        int progress_gpu;
};

/* Negative errno for an NVML return code (0 for NVML_SUCCESS). The table is in gpu-nvml.c. */
int gpu_nvml_errno(nvmlReturn_t rc);
/* NVML's own constant name, "NVML_ERROR_IN_USE"; "an unknown NVML return code" for codes newer than us. */
const char *gpu_nvml_return_to_string(nvmlReturn_t rc);

/* The bookkeeping every call goes through: remembers a failure for gpu_nvml_last_error() and returns
 * gpu_nvml_errno(rc). entry_point must be a string literal. Call through GPU_NVML_CALL, which also counts
 * the call, so that a missing optional entry point costs no call and answers -ENOSYS. */
int gpu_nvml_result(GpuNvml *n, const char *entry_point, nvmlReturn_t rc);
int gpu_nvml_missing(GpuNvml *n, const char *entry_point);

#define GPU_NVML_CALL(n, sym, ...)                                                                         \
        ((n)->fn.sym ? gpu_nvml_result((n), #sym, (gpu_nvml_enter((n), #sym), (n)->fn.sym(__VA_ARGS__)))   \
                     : gpu_nvml_missing((n), #sym))

/* Counts a call and tells the progress callback which one starts. */
void gpu_nvml_enter(GpuNvml *n, const char *entry_point);

/* "<entry point>: <NVML's error string> (<NVML_ERROR_…>)" of the last failed call, "" when none failed
 * yet. The first request after a failure calls nvmlErrorString (and counts it). */
const char *gpu_nvml_last_error(GpuNvml *n);

/* One wrapper per entry point: negative errno (see gpu_nvml_errno), -ENOSYS when not exported. Buffer
 * sizes are the caller's; strings are NUL-terminated by NVML. */
int gpu_nvml_system_get_driver_version(GpuNvml *n, char *buf, unsigned size);
int gpu_nvml_system_get_nvml_version(GpuNvml *n, char *buf, unsigned size);
int gpu_nvml_system_get_cuda_driver_version(GpuNvml *n, int *ret);
int gpu_nvml_device_get_count(GpuNvml *n, unsigned *ret);
int gpu_nvml_device_get_handle_by_index(GpuNvml *n, unsigned index, nvmlDevice_t *ret);
int gpu_nvml_device_get_handle_by_pci_bus_id(GpuNvml *n, const char *bus_id, nvmlDevice_t *ret);
int gpu_nvml_device_get_index(GpuNvml *n, nvmlDevice_t d, unsigned *ret);
int gpu_nvml_device_get_name(GpuNvml *n, nvmlDevice_t d, char *buf, unsigned size);
int gpu_nvml_device_get_uuid(GpuNvml *n, nvmlDevice_t d, char *buf, unsigned size);
int gpu_nvml_device_get_pci_info(GpuNvml *n, nvmlDevice_t d, nvmlPciInfo_t *ret);
int gpu_nvml_device_get_memory_info(GpuNvml *n, nvmlDevice_t d, nvmlMemory_t *ret);
int gpu_nvml_device_get_cuda_compute_capability(GpuNvml *n, nvmlDevice_t d, int *major, int *minor);
int gpu_nvml_device_get_minor_number(GpuNvml *n, nvmlDevice_t d, unsigned *ret);
int gpu_nvml_device_get_gpu_fabric_info(GpuNvml *n, nvmlDevice_t d, nvmlGpuFabricInfo_t *ret);
int gpu_nvml_device_get_nvlink_state(GpuNvml *n, nvmlDevice_t d, unsigned link, nvmlEnableState_t *ret);
int gpu_nvml_device_get_nvlink_remote_pci_info(GpuNvml *n, nvmlDevice_t d, unsigned link, nvmlPciInfo_t *ret);
/* *count in: capacity of infos; out: number of processes (INSUFFICIENT_SIZE → -ENOBUFS with the need). */
int gpu_nvml_device_get_compute_running_processes(GpuNvml *n, nvmlDevice_t d, unsigned *count,
                                                  nvmlProcessInfo_t *infos);

int gpu_nvml_device_get_mig_mode(GpuNvml *n, nvmlDevice_t d, unsigned *current, unsigned *pending);
/* Returns the call's error, else the activation status's error (RESET_REQUIRED → -ERESTART, IN_USE →
 * -EBUSY …), so that one negative errno says whether the mode is now active. */
int gpu_nvml_device_set_mig_mode(GpuNvml *n, nvmlDevice_t d, unsigned mode);
/* Uses the V variant when exported (it also fills ret->name), else the plain one. */
int gpu_nvml_device_get_gpu_instance_profile_info(GpuNvml *n, nvmlDevice_t d, unsigned profile_index,
                                                  nvmlGpuInstanceProfileInfo_v2_t *ret);
int gpu_nvml_device_get_gpu_instance_possible_placements(GpuNvml *n, nvmlDevice_t d, unsigned profile_id,
                                                         nvmlGpuInstancePlacement_t *placements, unsigned *count);
int gpu_nvml_device_get_gpu_instances(GpuNvml *n, nvmlDevice_t d, unsigned profile_id, nvmlGpuInstance_t *gis,
                                      unsigned *count);
int gpu_nvml_device_get_gpu_instance_by_id(GpuNvml *n, nvmlDevice_t d, unsigned id, nvmlGpuInstance_t *ret);
int gpu_nvml_device_create_gpu_instance_with_placement(GpuNvml *n, nvmlDevice_t d, unsigned profile_id,
                                                       const nvmlGpuInstancePlacement_t *placement,
                                                       nvmlGpuInstance_t *ret);
int gpu_nvml_gpu_instance_destroy(GpuNvml *n, nvmlGpuInstance_t gi);
int gpu_nvml_gpu_instance_get_info(GpuNvml *n, nvmlGpuInstance_t gi, nvmlGpuInstanceInfo_t *ret);
/* V variant when exported, like the GI one. */
int gpu_nvml_gpu_instance_get_compute_instance_profile_info(GpuNvml *n, nvmlGpuInstance_t gi, unsigned profile_index,
                                                            unsigned eng_profile,
                                                            nvmlComputeInstanceProfileInfo_v2_t *ret);
int gpu_nvml_gpu_instance_get_compute_instances(GpuNvml *n, nvmlGpuInstance_t gi, unsigned profile_id,
                                                nvmlComputeInstance_t *cis, unsigned *count);
int gpu_nvml_gpu_instance_get_compute_instance_by_id(GpuNvml *n, nvmlGpuInstance_t gi, unsigned id,
                                                     nvmlComputeInstance_t *ret);
int gpu_nvml_gpu_instance_create_compute_instance(GpuNvml *n, nvmlGpuInstance_t gi, unsigned profile_id,
                                                  nvmlComputeInstance_t *ret);
int gpu_nvml_compute_instance_destroy(GpuNvml *n, nvmlComputeInstance_t ci);
int gpu_nvml_compute_instance_get_info(GpuNvml *n, nvmlComputeInstance_t ci, nvmlComputeInstanceInfo_t *ret);
int gpu_nvml_device_get_max_mig_device_count(GpuNvml *n, nvmlDevice_t d, unsigned *ret);
int gpu_nvml_device_get_mig_device_handle_by_index(GpuNvml *n, nvmlDevice_t d, unsigned index, nvmlDevice_t *ret);
int gpu_nvml_device_get_attributes(GpuNvml *n, nvmlDevice_t d, nvmlDeviceAttributes_t *ret);
int gpu_nvml_device_get_gpu_instance_id(GpuNvml *n, nvmlDevice_t d, unsigned *ret);
int gpu_nvml_device_get_compute_instance_id(GpuNvml *n, nvmlDevice_t d, unsigned *ret);

/* "00000000:1B:00.0" (NVML) → "0000:1b:00.0" (ours, sysfs). -EINVAL if it is not a PCI address. */
int gpu_nvml_normalize_bus_id(const char *nvml_bus_id, char ret[static 32]);

/* The PCI addresses of every GPU NVML lists, in PCI order (owned by n, cached for its lifetime). */
int gpu_nvml_enumerate(GpuNvml *n, char ***ret, char **ret_error);
/* The attribute suffix of a GPU instance profile index: "" "+me" "+me.all" "+gfx" "-me"; NULL for an
 * index newer than this code knows. */
const char *gpu_nvml_profile_index_suffix(unsigned index);
/* The same, and for an index newer than this code the attribute from the profile's name (the driver's
 * "MIG 1g.24gb+foo", or ours "1g.24gb+foo" → "+foo"; "" without one). Never NULL. */
const char *gpu_nvml_profile_suffix(unsigned index, const char *name);

/* The NVLink topology of c's GPU into g (gpu-nvml-nvlink.c): read once, cached in c. A missing entry point
 * or NOT_SUPPORTED leaves g->nvlink_known false; a failing link is a warning. */
int gpu_nvml_read_nvlinks(GpuNvml *n, NvmlSnapshot *s, GpuNvmlCached *c, GpuInfo *g);

/* Frees what a MigDeviceInfo owns. */
void gpu_nvml_mig_device_done(MigDeviceInfo *m);
/* Forgets c's known MIG devices. */
void gpu_nvml_mig_known_clear(GpuNvmlCached *c);

/* The cache entry of a PCI address (created empty on first use); NULL on OOM. */
GpuNvmlCached *gpu_nvml_cached(GpuNvml *n, const char *pci_address);
void gpu_nvml_cache_clear(GpuNvml *n);
