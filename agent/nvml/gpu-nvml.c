/* SPDX-License-Identifier: MIT */
/* Owns the NVML library handle: dlopen of libnvidia-ml.so.1, resolving every entry point (versioned name
 * first, older name as fallback), nvmlInit/nvmlShutdown, the return code → errno table, the one wrapper
 * each call goes through, and the per-address cache of static facts. Reading a snapshot is in
 * gpu-nvml-read.c. */
#include <dlfcn.h>
#include <stdio.h>

#include "escape.h"
#include "gpu-nvml-internal.h"
#include "string-table.h"
#include "strv.h"

/* What each NVML return code means to a caller that only sees an errno. Chosen so that the cases the
 * callers tell apart stay apart: "not MIG capable" (EOPNOTSUPP), "no such thing" (ENOENT), "driver not
 * there" (ENODEV), "busy, retry later" (EBUSY), "does not fit" (ENOSPC), "needs a reset" (ERESTART). */
static const struct {
        nvmlReturn_t rc;
        int error;
        const char *name;
} return_table[] = {
        { NVML_SUCCESS,                         0,                "NVML_SUCCESS" },
        { NVML_ERROR_UNINITIALIZED,             EBADFD,           "NVML_ERROR_UNINITIALIZED" },
        { NVML_ERROR_INVALID_ARGUMENT,          EINVAL,           "NVML_ERROR_INVALID_ARGUMENT" },
        { NVML_ERROR_NOT_SUPPORTED,             EOPNOTSUPP,       "NVML_ERROR_NOT_SUPPORTED" },
        { NVML_ERROR_NO_PERMISSION,             EPERM,            "NVML_ERROR_NO_PERMISSION" },
        { NVML_ERROR_ALREADY_INITIALIZED,       EALREADY,         "NVML_ERROR_ALREADY_INITIALIZED" },
        { NVML_ERROR_NOT_FOUND,                 ENOENT,           "NVML_ERROR_NOT_FOUND" },
        { NVML_ERROR_INSUFFICIENT_SIZE,         ENOBUFS,          "NVML_ERROR_INSUFFICIENT_SIZE" },
        { NVML_ERROR_INSUFFICIENT_POWER,        EIO,              "NVML_ERROR_INSUFFICIENT_POWER" },
        { NVML_ERROR_DRIVER_NOT_LOADED,         ENODEV,           "NVML_ERROR_DRIVER_NOT_LOADED" },
        { NVML_ERROR_TIMEOUT,                   ETIMEDOUT,        "NVML_ERROR_TIMEOUT" },
        { NVML_ERROR_IRQ_ISSUE,                 EIO,              "NVML_ERROR_IRQ_ISSUE" },
        { NVML_ERROR_LIBRARY_NOT_FOUND,         ELIBACC,          "NVML_ERROR_LIBRARY_NOT_FOUND" },
        { NVML_ERROR_FUNCTION_NOT_FOUND,        ENOSYS,           "NVML_ERROR_FUNCTION_NOT_FOUND" },
        { NVML_ERROR_CORRUPTED_INFOROM,         EUCLEAN,          "NVML_ERROR_CORRUPTED_INFOROM" },
        { NVML_ERROR_GPU_IS_LOST,               ENXIO,            "NVML_ERROR_GPU_IS_LOST" },
        { NVML_ERROR_RESET_REQUIRED,            ERESTART,         "NVML_ERROR_RESET_REQUIRED" },
        { NVML_ERROR_OPERATING_SYSTEM,          EACCES,           "NVML_ERROR_OPERATING_SYSTEM" },
        { NVML_ERROR_LIB_RM_VERSION_MISMATCH,   EPROTO,           "NVML_ERROR_LIB_RM_VERSION_MISMATCH" },
        { NVML_ERROR_IN_USE,                    EBUSY,            "NVML_ERROR_IN_USE" },
        { NVML_ERROR_MEMORY,                    ENOMEM,           "NVML_ERROR_MEMORY" },
        { NVML_ERROR_NO_DATA,                   ENODATA,          "NVML_ERROR_NO_DATA" },
        { NVML_ERROR_VGPU_ECC_NOT_SUPPORTED,    EOPNOTSUPP,       "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED" },
        { NVML_ERROR_INSUFFICIENT_RESOURCES,    ENOSPC,           "NVML_ERROR_INSUFFICIENT_RESOURCES" },
        { NVML_ERROR_FREQ_NOT_SUPPORTED,        EOPNOTSUPP,       "NVML_ERROR_FREQ_NOT_SUPPORTED" },
        { NVML_ERROR_ARGUMENT_VERSION_MISMATCH, EPROTONOSUPPORT,  "NVML_ERROR_ARGUMENT_VERSION_MISMATCH" },
        { NVML_ERROR_UNKNOWN,                   EIO,              "NVML_ERROR_UNKNOWN" },
};

int gpu_nvml_errno(nvmlReturn_t rc) {
        for (size_t i = 0; i < ELEMENTSOF(return_table); i++)
                if (return_table[i].rc == rc)
                        return -return_table[i].error;
        return -EIO; /* a code newer than this table: still a failure */
}

const char *gpu_nvml_return_to_string(nvmlReturn_t rc) {
        for (size_t i = 0; i < ELEMENTSOF(return_table); i++)
                if (return_table[i].rc == rc)
                        return return_table[i].name;
        return "an unknown NVML return code";
}

int gpu_nvml_result(GpuNvml *n, const char *entry_point, nvmlReturn_t rc) {
        if (rc == NVML_SUCCESS)
                return 0;
        n->last_entry = entry_point;
        n->last_rc = rc;
        n->last_missing = false;
        n->last_formatted = false;
        return gpu_nvml_errno(rc);
}

int gpu_nvml_missing(GpuNvml *n, const char *entry_point) {
        n->last_entry = entry_point;
        n->last_rc = NVML_ERROR_FUNCTION_NOT_FOUND;
        n->last_missing = true;
        n->last_formatted = false;
        return -ENOSYS;
}

const char *gpu_nvml_last_error(GpuNvml *n) {
        const char *text = NULL;

        if (!n->last_entry || n->last_formatted)
                return n->last_error;

        if (n->last_missing)
                snprintf(n->last_error, sizeof n->last_error, "%s: not exported by %s (driver too old)",
                         n->last_entry, strna(n->library));
        else {
                /* nvmlErrorString is an entry point like any other: it counts. */
                if (n->fn.nvmlErrorString) {
                        gpu_nvml_enter(n, "nvmlErrorString");
                        text = n->fn.nvmlErrorString(n->last_rc);
                }
                if (text && *text)
                        snprintf(n->last_error, sizeof n->last_error, "%s: %s (%s)", n->last_entry, text,
                                 gpu_nvml_return_to_string(n->last_rc));
                else
                        snprintf(n->last_error, sizeof n->last_error, "%s: %s (%d)", n->last_entry,
                                 gpu_nvml_return_to_string(n->last_rc), (int) n->last_rc);
        }
        /* nvmlErrorString's text is the library's: it goes into logs and D-Bus warnings. */
        string_clean(n->last_error);
        n->last_formatted = true;
        return n->last_error;
}

uint64_t gpu_nvml_calls(const GpuNvml *n) {
        return n ? n->calls : 0;
}

/* ---- Loading ------------------------------------------------------------------------------------------ */

#define SYM(field, fallback, required) { #field, fallback, offsetof(GpuNvmlFunctions, field), required }

static const struct {
        const char *name;
        const char *fallback;
        size_t offset;
        bool required;
} symbol_table[] = {
        /* Required: without these we cannot even say which GPUs there are. */
        SYM(nvmlInit_v2,                          "nvmlInit",                             true),
        SYM(nvmlShutdown,                         NULL,                                   true),
        SYM(nvmlErrorString,                      NULL,                                   true),
        SYM(nvmlSystemGetDriverVersion,           NULL,                                   true),
        SYM(nvmlDeviceGetCount_v2,                "nvmlDeviceGetCount",                   true),
        SYM(nvmlDeviceGetHandleByIndex_v2,        "nvmlDeviceGetHandleByIndex",           true),
        SYM(nvmlDeviceGetHandleByPciBusId_v2,     "nvmlDeviceGetHandleByPciBusId",        true),
        SYM(nvmlDeviceGetName,                    NULL,                                   true),
        SYM(nvmlDeviceGetUUID,                    NULL,                                   true),
        SYM(nvmlDeviceGetPciInfo_v3,              "nvmlDeviceGetPciInfo_v2",              true),
        SYM(nvmlDeviceGetMemoryInfo,              NULL,                                   true),
        /* Optional: a missing one makes its field unknown (or, for MIG, the GPU not MIG-capable). */
        SYM(nvmlSystemGetNVMLVersion,             NULL,                                   false),
        SYM(nvmlSystemGetCudaDriverVersion_v2,    "nvmlSystemGetCudaDriverVersion",       false),
        SYM(nvmlDeviceGetIndex,                   NULL,                                   false),
        SYM(nvmlDeviceGetCudaComputeCapability,   NULL,                                   false),
        SYM(nvmlDeviceGetMinorNumber,             NULL,                                   false),
        SYM(nvmlDeviceGetGpuFabricInfo,           NULL,                                   false),
        SYM(nvmlDeviceGetNvLinkState,             NULL,                                   false),
        SYM(nvmlDeviceGetNvLinkRemotePciInfo_v2,  "nvmlDeviceGetNvLinkRemotePciInfo",     false),
        SYM(nvmlDeviceGetComputeRunningProcesses_v3, "nvmlDeviceGetComputeRunningProcesses_v2", false),
        SYM(nvmlDeviceGetMigMode,                 NULL,                                   false),
        SYM(nvmlDeviceSetMigMode,                 NULL,                                   false),
        SYM(nvmlDeviceGetGpuInstanceProfileInfo,  NULL,                                   false),
        SYM(nvmlDeviceGetGpuInstanceProfileInfoV, NULL,                                   false),
        SYM(nvmlDeviceGetGpuInstancePossiblePlacements_v2, "nvmlDeviceGetGpuInstancePossiblePlacements", false),
        SYM(nvmlDeviceGetGpuInstances,            NULL,                                   false),
        SYM(nvmlDeviceGetGpuInstanceById,         NULL,                                   false),
        SYM(nvmlDeviceCreateGpuInstanceWithPlacement, NULL,                               false),
        SYM(nvmlGpuInstanceDestroy,               NULL,                                   false),
        SYM(nvmlGpuInstanceGetInfo,               NULL,                                   false),
        SYM(nvmlGpuInstanceGetComputeInstanceProfileInfo, NULL,                           false),
        SYM(nvmlGpuInstanceGetComputeInstanceProfileInfoV, NULL,                          false),
        SYM(nvmlGpuInstanceGetComputeInstances,   NULL,                                   false),
        SYM(nvmlGpuInstanceGetComputeInstanceById, NULL,                                  false),
        SYM(nvmlGpuInstanceCreateComputeInstance, NULL,                                   false),
        SYM(nvmlComputeInstanceDestroy,           NULL,                                   false),
        SYM(nvmlComputeInstanceGetInfo_v2,        "nvmlComputeInstanceGetInfo",           false),
        SYM(nvmlDeviceGetMaxMigDeviceCount,       NULL,                                   false),
        SYM(nvmlDeviceGetMigDeviceHandleByIndex,  NULL,                                   false),
        SYM(nvmlDeviceGetAttributes_v2,           "nvmlDeviceGetAttributes",              false),
        SYM(nvmlDeviceGetGpuInstanceId,           NULL,                                   false),
        SYM(nvmlDeviceGetComputeInstanceId,       NULL,                                   false),
};

static GpuNvml *gpu_nvml_free(GpuNvml *n) {
        if (!n)
                return NULL;
        gpu_nvml_cache_clear(n);
        if (n->mig_models_free)
                n->mig_models_free(n->mig_models);
        if (n->dl)
                dlclose(n->dl);
        free(n->library);
        free(n);
        return NULL;
}
DEFINE_CLEANUP_FUNC(GpuNvml *, gpu_nvml_free);

static int gpu_nvml_load_symbols(GpuNvml *n, char **ret_error) {
        for (size_t i = 0; i < ELEMENTSOF(symbol_table); i++) {
                void *p = dlsym(n->dl, symbol_table[i].name);

                if (!p && symbol_table[i].fallback)
                        p = dlsym(n->dl, symbol_table[i].fallback);
                if (!p && symbol_table[i].required) {
                        if (symbol_table[i].fallback)
                                *ret_error = strprintf("%s exports neither %s nor %s: the NVIDIA driver is too old "
                                                       "for this agent; install a current driver.",
                                                       n->library, symbol_table[i].name, symbol_table[i].fallback);
                        else
                                *ret_error = strprintf("%s does not export %s: the NVIDIA driver is too old for "
                                                       "this agent; install a current driver.",
                                                       n->library, symbol_table[i].name);
                        return -ENOSYS;
                }
                /* POSIX guarantees a function pointer survives the trip through void *. */
                memcpy((uint8_t *) &n->fn + symbol_table[i].offset, &p, sizeof p);
        }
        return 0;
}

static bool dlerror_means_missing(const char *library, const char *message) {
        if (strchr(library, '/'))
                return access(library, F_OK) < 0 && errno == ENOENT;
        return message && strstr(message, "No such file");
}

void gpu_nvml_enter(GpuNvml *n, const char *entry_point) {
        n->calls++;
        if (n->progress)
                n->progress(entry_point, n->progress_gpu, n->progress_userdata);
}

int gpu_nvml_open(const char *library, GpuNvml **ret, char **ret_error) {
        return gpu_nvml_open_progress(library, NULL, NULL, ret, ret_error);
}

int gpu_nvml_open_progress(const char *library, GpuNvmlProgress progress, void *userdata, GpuNvml **ret,
                           char **ret_error) {
        _cleanup_(gpu_nvml_freep) GpuNvml *n = NULL;
        nvmlReturn_t rc;
        int r;

        assert(library);
        assert(ret);
        assert(ret_error);

        *ret_error = NULL;

        n = calloc(1, sizeof *n);
        if (!n)
                return -ENOMEM;
        n->library = strdup(library);
        if (!n->library)
                return -ENOMEM;
        n->progress = progress;
        n->progress_userdata = userdata;
        n->progress_gpu = -1;

        /* A library's constructor can hang as well as any call. */
        if (progress)
                progress("dlopen", -1, userdata);
        n->dl = dlopen(library, RTLD_NOW | RTLD_LOCAL);
        if (!n->dl) {
                const char *e = dlerror();

                if (dlerror_means_missing(library, e)) {
                        *ret_error = strprintf("Cannot load NVML: %s. Is the NVIDIA driver's user-space library "
                                               "installed (Debian: libnvidia-ml1, elsewhere: nvidia-utils)? If it is "
                                               "installed in another place, set nvml.library to its full path.",
                                               e ? e : library);
                        return -ENOENT;
                }
                *ret_error = strprintf("Cannot load NVML: %s. Check that nvml.library (%s) names the NVIDIA "
                                       "driver's libnvidia-ml.so.1 for this machine's architecture.",
                                       e ? e : "dlopen failed", library);
                return -ELIBBAD;
        }

        r = gpu_nvml_load_symbols(n, ret_error);
        if (r < 0)
                return r;

        gpu_nvml_enter(n, "nvmlInit_v2");
        rc = n->fn.nvmlInit_v2();
        r = gpu_nvml_result(n, "nvmlInit_v2", rc);
        if (r < 0) {
                (void) gpu_nvml_last_error(n);
                /* An if chain, not a switch: NVML's return codes are not ours to enumerate. */
                if (rc == NVML_ERROR_DRIVER_NOT_LOADED)
                        *ret_error = strprintf("NVML from %s cannot start: the nvidia kernel module is not loaded "
                                               "(%s); NVML is retried when the driver appears.",
                                               library, n->last_error);
                else if (rc == NVML_ERROR_LIB_RM_VERSION_MISMATCH)
                        *ret_error = strprintf("NVML from %s cannot start: the library and the loaded nvidia kernel "
                                               "module are different driver versions (%s); reload the module or "
                                               "reboot after a driver upgrade.", library, n->last_error);
                else if (rc == NVML_ERROR_NO_PERMISSION)
                        *ret_error = strprintf("NVML from %s cannot start: no permission to open the GPU device "
                                               "nodes (%s); the agent must run as root.", library, n->last_error);
                else
                        *ret_error = strprintf("NVML from %s cannot start: %s.", library, n->last_error);
                return r;
        }
        n->initialized = true;

        *ret = TAKE_PTR(n);
        return 0;
}

GpuNvml *gpu_nvml_close(GpuNvml *n) {
        if (!n)
                return NULL;
        if (n->initialized) {
                gpu_nvml_enter(n, "nvmlShutdown");
                (void) n->fn.nvmlShutdown();
        }
        return gpu_nvml_free(n);
}

/* ---- Cache -------------------------------------------------------------------------------------------- */

GpuNvmlCached *gpu_nvml_cached(GpuNvml *n, const char *pci_address) {
        GpuNvmlCached *c;

        for (size_t i = 0; i < n->n_cached; i++)
                if (streq(n->cached[i].pci_address, pci_address))
                        return &n->cached[i];

        if (strlen(pci_address) >= sizeof c->pci_address)
                return NULL;
        c = realloc(n->cached, (n->n_cached + 1) * sizeof *c);
        if (!c)
                return NULL;
        n->cached = c;
        c = &n->cached[n->n_cached++];
        *c = (GpuNvmlCached) { .cc_major = -1, .cc_minor = -1, .minor = -1 };
        strcpy(c->pci_address, pci_address);
        return c;
}

void gpu_nvml_mig_known_clear(GpuNvmlCached *c) {
        for (size_t i = 0; i < c->n_mig_known; i++)
                gpu_nvml_mig_device_done(&c->mig_known[i]);
        c->mig_known = mfree(c->mig_known);
        c->n_mig_known = 0;
}

void gpu_nvml_cache_clear(GpuNvml *n) {
        for (size_t i = 0; i < n->n_cached; i++) {
                free(n->cached[i].name);
                free(n->cached[i].uuid);
                strv_free(n->cached[i].nvlink_remotes);
                gpu_nvml_mig_known_clear(&n->cached[i]);
        }
        n->cached = mfree(n->cached);
        n->n_cached = 0;

        for (size_t i = 0; i < n->n_models; i++) {
                free(n->models[i].name);
                free(n->models[i].profiles);
                free(n->models[i].ci_profiles);
        }
        n->models = mfree(n->models);
        n->n_models = 0;

        n->system_facts = 0;
        n->enumerated = strv_free(n->enumerated);
        n->driver_version = mfree(n->driver_version);
        n->nvml_version = mfree(n->nvml_version);
        n->cuda_version = 0;
}

void gpu_nvml_invalidate(GpuNvml *n) {
        if (n)
                gpu_nvml_cache_clear(n);
}

/* ---- Small helpers shared with the reader -------------------------------------------------------------- */

int gpu_nvml_normalize_bus_id(const char *nvml_bus_id, char ret[static 32]) {
        unsigned domain, bus, dev, fn;
        int consumed = 0;

        /* Only hex digits and separators: sscanf's %x would also take "0x" prefixes and signs. */
        if (!nvml_bus_id || nvml_bus_id[strspn(nvml_bus_id, "0123456789abcdefABCDEF:.")] != '\0' ||
            sscanf(nvml_bus_id, "%x:%x:%x.%x%n", &domain, &bus, &dev, &fn, &consumed) != 4 ||
            nvml_bus_id[consumed] != '\0' || domain > 0xffff || bus > 0xff || dev > 0x1f || fn > 7)
                return -EINVAL;
        snprintf(ret, 32, "%04x:%02x:%02x.%x", domain, bus, dev, fn);
        return 0;
}

const char *gpu_nvml_profile_suffix(unsigned index, const char *name) {
        const char *suffix = gpu_nvml_profile_index_suffix(index), *gb;

        if (suffix)
                return suffix;
        gb = name ? strstr(name, "gb") : NULL;
        /* The suffix becomes part of the profile name, hence of labels and gres.conf lines. */
        if (!gb || (gb[2] != '+' && gb[2] != '-') || strlen(gb + 2) > 16 ||
            gb[2 + strspn(gb + 2, "abcdefghijklmnopqrstuvwxyz.+-")] != '\0')
                return "";
        return gb + 2;
}

const char *gpu_nvml_profile_index_suffix(unsigned index) {
        switch (index) {
        case NVML_GPU_INSTANCE_PROFILE_1_SLICE:
        case NVML_GPU_INSTANCE_PROFILE_2_SLICE:
        case NVML_GPU_INSTANCE_PROFILE_3_SLICE:
        case NVML_GPU_INSTANCE_PROFILE_4_SLICE:
        case NVML_GPU_INSTANCE_PROFILE_7_SLICE:
        case NVML_GPU_INSTANCE_PROFILE_8_SLICE:
        case NVML_GPU_INSTANCE_PROFILE_6_SLICE:
        case NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2: /* 1g with twice the memory: "1g.20gb", no attribute */
                return "";
        case NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1:
        case NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1:
                return "+me";
        case NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME:
        case NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME:
                return "+me.all";
        case NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX:
        case NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX:
        case NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX:
                return "+gfx";
        case NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME:
        case NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME:
                return "-me";
        default:
                return NULL;
        }
}

static const char *const mig_mode_table[_GPU_MIG_MODE_MAX] = {
        [GPU_MIG_UNSUPPORTED] = "unsupported",
        [GPU_MIG_DISABLED] = "disabled",
        [GPU_MIG_ENABLED] = "enabled",
};

DEFINE_STRING_TABLE_LOOKUP_TO_STRING(gpu_mig_mode, GpuMigMode, mig_mode_table, _GPU_MIG_MODE_MAX)

/* ---- One wrapper per entry point -------------------------------------------------------------------------- */

/* A driver that fills the whole buffer leaves no NUL: the string ends at the buffer's end, whatever it
 * answered. */
static int terminated(int r, char *buf, unsigned size) {
        if (buf && size > 0)
                buf[size - 1] = '\0';
        return r;
}

int gpu_nvml_system_get_driver_version(GpuNvml *n, char *buf, unsigned size) {
        return terminated(GPU_NVML_CALL(n, nvmlSystemGetDriverVersion, buf, size), buf, size);
}

int gpu_nvml_system_get_nvml_version(GpuNvml *n, char *buf, unsigned size) {
        return terminated(GPU_NVML_CALL(n, nvmlSystemGetNVMLVersion, buf, size), buf, size);
}

int gpu_nvml_system_get_cuda_driver_version(GpuNvml *n, int *ret) {
        return GPU_NVML_CALL(n, nvmlSystemGetCudaDriverVersion_v2, ret);
}

int gpu_nvml_device_get_count(GpuNvml *n, unsigned *ret) {
        return GPU_NVML_CALL(n, nvmlDeviceGetCount_v2, ret);
}

int gpu_nvml_device_get_handle_by_index(GpuNvml *n, unsigned index, nvmlDevice_t *ret) {
        return GPU_NVML_CALL(n, nvmlDeviceGetHandleByIndex_v2, index, ret);
}

int gpu_nvml_device_get_handle_by_pci_bus_id(GpuNvml *n, const char *bus_id, nvmlDevice_t *ret) {
        return GPU_NVML_CALL(n, nvmlDeviceGetHandleByPciBusId_v2, bus_id, ret);
}

int gpu_nvml_device_get_index(GpuNvml *n, nvmlDevice_t d, unsigned *ret) {
        return GPU_NVML_CALL(n, nvmlDeviceGetIndex, d, ret);
}

int gpu_nvml_device_get_name(GpuNvml *n, nvmlDevice_t d, char *buf, unsigned size) {
        return terminated(GPU_NVML_CALL(n, nvmlDeviceGetName, d, buf, size), buf, size);
}

int gpu_nvml_device_get_uuid(GpuNvml *n, nvmlDevice_t d, char *buf, unsigned size) {
        return terminated(GPU_NVML_CALL(n, nvmlDeviceGetUUID, d, buf, size), buf, size);
}

int gpu_nvml_device_get_pci_info(GpuNvml *n, nvmlDevice_t d, nvmlPciInfo_t *ret) {
        return GPU_NVML_CALL(n, nvmlDeviceGetPciInfo_v3, d, ret);
}

int gpu_nvml_device_get_memory_info(GpuNvml *n, nvmlDevice_t d, nvmlMemory_t *ret) {
        return GPU_NVML_CALL(n, nvmlDeviceGetMemoryInfo, d, ret);
}

int gpu_nvml_device_get_cuda_compute_capability(GpuNvml *n, nvmlDevice_t d, int *major, int *minor) {
        return GPU_NVML_CALL(n, nvmlDeviceGetCudaComputeCapability, d, major, minor);
}

int gpu_nvml_device_get_minor_number(GpuNvml *n, nvmlDevice_t d, unsigned *ret) {
        return GPU_NVML_CALL(n, nvmlDeviceGetMinorNumber, d, ret);
}

int gpu_nvml_device_get_gpu_fabric_info(GpuNvml *n, nvmlDevice_t d, nvmlGpuFabricInfo_t *ret) {
        return GPU_NVML_CALL(n, nvmlDeviceGetGpuFabricInfo, d, ret);
}

int gpu_nvml_device_get_nvlink_state(GpuNvml *n, nvmlDevice_t d, unsigned link, nvmlEnableState_t *ret) {
        return GPU_NVML_CALL(n, nvmlDeviceGetNvLinkState, d, link, ret);
}

int gpu_nvml_device_get_nvlink_remote_pci_info(GpuNvml *n, nvmlDevice_t d, unsigned link, nvmlPciInfo_t *ret) {
        return GPU_NVML_CALL(n, nvmlDeviceGetNvLinkRemotePciInfo_v2, d, link, ret);
}

int gpu_nvml_device_get_compute_running_processes(GpuNvml *n, nvmlDevice_t d, unsigned *count,
                                                  nvmlProcessInfo_t *infos) {
        return GPU_NVML_CALL(n, nvmlDeviceGetComputeRunningProcesses_v3, d, count, infos);
}

int gpu_nvml_device_get_mig_mode(GpuNvml *n, nvmlDevice_t d, unsigned *current, unsigned *pending) {
        return GPU_NVML_CALL(n, nvmlDeviceGetMigMode, d, current, pending);
}

int gpu_nvml_device_set_mig_mode(GpuNvml *n, nvmlDevice_t d, unsigned mode) {
        nvmlReturn_t status = NVML_SUCCESS;
        int r;

        r = GPU_NVML_CALL(n, nvmlDeviceSetMigMode, d, mode, &status);
        if (r < 0)
                return r;
        /* The call itself worked; whether the new mode is active is in the activation status. */
        return gpu_nvml_result(n, "nvmlDeviceSetMigMode (activation)", status);
}

int gpu_nvml_device_get_gpu_instance_profile_info(GpuNvml *n, nvmlDevice_t d, unsigned profile_index,
                                                  nvmlGpuInstanceProfileInfo_v2_t *ret) {
        nvmlGpuInstanceProfileInfo_t v1 = {};
        int r;

        if (n->fn.nvmlDeviceGetGpuInstanceProfileInfoV) {
                *ret = (nvmlGpuInstanceProfileInfo_v2_t) { .version = nvmlGpuInstanceProfileInfo_v2 };
                return GPU_NVML_CALL(n, nvmlDeviceGetGpuInstanceProfileInfoV, d, profile_index, ret);
        }

        r = GPU_NVML_CALL(n, nvmlDeviceGetGpuInstanceProfileInfo, d, profile_index, &v1);
        if (r < 0)
                return r;
        *ret = (nvmlGpuInstanceProfileInfo_v2_t) {
                .version = nvmlGpuInstanceProfileInfo_v2,
                .id = v1.id,
                .isP2pSupported = v1.isP2pSupported,
                .sliceCount = v1.sliceCount,
                .instanceCount = v1.instanceCount,
                .multiprocessorCount = v1.multiprocessorCount,
                .copyEngineCount = v1.copyEngineCount,
                .decoderCount = v1.decoderCount,
                .encoderCount = v1.encoderCount,
                .jpegCount = v1.jpegCount,
                .ofaCount = v1.ofaCount,
                .memorySizeMB = v1.memorySizeMB,
        };
        return 0;
}

int gpu_nvml_device_get_gpu_instance_possible_placements(GpuNvml *n, nvmlDevice_t d, unsigned profile_id,
                                                         nvmlGpuInstancePlacement_t *placements, unsigned *count) {
        return GPU_NVML_CALL(n, nvmlDeviceGetGpuInstancePossiblePlacements_v2, d, profile_id, placements, count);
}

int gpu_nvml_device_get_gpu_instances(GpuNvml *n, nvmlDevice_t d, unsigned profile_id, nvmlGpuInstance_t *gis,
                                      unsigned *count) {
        return GPU_NVML_CALL(n, nvmlDeviceGetGpuInstances, d, profile_id, gis, count);
}

int gpu_nvml_device_get_gpu_instance_by_id(GpuNvml *n, nvmlDevice_t d, unsigned id, nvmlGpuInstance_t *ret) {
        return GPU_NVML_CALL(n, nvmlDeviceGetGpuInstanceById, d, id, ret);
}

int gpu_nvml_device_create_gpu_instance_with_placement(GpuNvml *n, nvmlDevice_t d, unsigned profile_id,
                                                       const nvmlGpuInstancePlacement_t *placement,
                                                       nvmlGpuInstance_t *ret) {
        return GPU_NVML_CALL(n, nvmlDeviceCreateGpuInstanceWithPlacement, d, profile_id, placement, ret);
}

int gpu_nvml_gpu_instance_destroy(GpuNvml *n, nvmlGpuInstance_t gi) {
        return GPU_NVML_CALL(n, nvmlGpuInstanceDestroy, gi);
}

int gpu_nvml_gpu_instance_get_info(GpuNvml *n, nvmlGpuInstance_t gi, nvmlGpuInstanceInfo_t *ret) {
        return GPU_NVML_CALL(n, nvmlGpuInstanceGetInfo, gi, ret);
}

int gpu_nvml_gpu_instance_get_compute_instance_profile_info(GpuNvml *n, nvmlGpuInstance_t gi, unsigned profile_index,
                                                            unsigned eng_profile,
                                                            nvmlComputeInstanceProfileInfo_v2_t *ret) {
        nvmlComputeInstanceProfileInfo_t v1 = {};
        int r;

        if (n->fn.nvmlGpuInstanceGetComputeInstanceProfileInfoV) {
                *ret = (nvmlComputeInstanceProfileInfo_v2_t) { .version = nvmlComputeInstanceProfileInfo_v2 };
                return GPU_NVML_CALL(n, nvmlGpuInstanceGetComputeInstanceProfileInfoV, gi, profile_index,
                                     eng_profile, ret);
        }

        r = GPU_NVML_CALL(n, nvmlGpuInstanceGetComputeInstanceProfileInfo, gi, profile_index, eng_profile, &v1);
        if (r < 0)
                return r;
        *ret = (nvmlComputeInstanceProfileInfo_v2_t) {
                .version = nvmlComputeInstanceProfileInfo_v2,
                .id = v1.id,
                .sliceCount = v1.sliceCount,
                .instanceCount = v1.instanceCount,
                .multiprocessorCount = v1.multiprocessorCount,
                .sharedCopyEngineCount = v1.sharedCopyEngineCount,
                .sharedDecoderCount = v1.sharedDecoderCount,
                .sharedEncoderCount = v1.sharedEncoderCount,
                .sharedJpegCount = v1.sharedJpegCount,
                .sharedOfaCount = v1.sharedOfaCount,
        };
        return 0;
}

int gpu_nvml_gpu_instance_get_compute_instances(GpuNvml *n, nvmlGpuInstance_t gi, unsigned profile_id,
                                                nvmlComputeInstance_t *cis, unsigned *count) {
        return GPU_NVML_CALL(n, nvmlGpuInstanceGetComputeInstances, gi, profile_id, cis, count);
}

int gpu_nvml_gpu_instance_get_compute_instance_by_id(GpuNvml *n, nvmlGpuInstance_t gi, unsigned id,
                                                     nvmlComputeInstance_t *ret) {
        return GPU_NVML_CALL(n, nvmlGpuInstanceGetComputeInstanceById, gi, id, ret);
}

int gpu_nvml_gpu_instance_create_compute_instance(GpuNvml *n, nvmlGpuInstance_t gi, unsigned profile_id,
                                                  nvmlComputeInstance_t *ret) {
        return GPU_NVML_CALL(n, nvmlGpuInstanceCreateComputeInstance, gi, profile_id, ret);
}

int gpu_nvml_compute_instance_destroy(GpuNvml *n, nvmlComputeInstance_t ci) {
        return GPU_NVML_CALL(n, nvmlComputeInstanceDestroy, ci);
}

int gpu_nvml_compute_instance_get_info(GpuNvml *n, nvmlComputeInstance_t ci, nvmlComputeInstanceInfo_t *ret) {
        return GPU_NVML_CALL(n, nvmlComputeInstanceGetInfo_v2, ci, ret);
}

int gpu_nvml_device_get_max_mig_device_count(GpuNvml *n, nvmlDevice_t d, unsigned *ret) {
        return GPU_NVML_CALL(n, nvmlDeviceGetMaxMigDeviceCount, d, ret);
}

int gpu_nvml_device_get_mig_device_handle_by_index(GpuNvml *n, nvmlDevice_t d, unsigned index, nvmlDevice_t *ret) {
        return GPU_NVML_CALL(n, nvmlDeviceGetMigDeviceHandleByIndex, d, index, ret);
}

int gpu_nvml_device_get_attributes(GpuNvml *n, nvmlDevice_t d, nvmlDeviceAttributes_t *ret) {
        return GPU_NVML_CALL(n, nvmlDeviceGetAttributes_v2, d, ret);
}

int gpu_nvml_device_get_gpu_instance_id(GpuNvml *n, nvmlDevice_t d, unsigned *ret) {
        return GPU_NVML_CALL(n, nvmlDeviceGetGpuInstanceId, d, ret);
}

int gpu_nvml_device_get_compute_instance_id(GpuNvml *n, nvmlDevice_t d, unsigned *ret) {
        return GPU_NVML_CALL(n, nvmlDeviceGetComputeInstanceId, d, ret);
}
