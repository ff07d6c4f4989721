/* SPDX-License-Identifier: MIT */
/* Owns the agent's view of NVML: loading libnvidia-ml.so.1 with dlopen (never linked), initialising it,
 * mapping every NVML return code to a negative errno plus NVML's own error string, and reading what the
 * stages need into plain structs (GpuInfo, MigDeviceInfo) so that nothing above this layer touches the
 * NVML ABI. Our declarations of that ABI subset live in nvml-abi.h. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "macro.h"

typedef struct GpuNvml GpuNvml;

typedef enum GpuMigMode {
        GPU_MIG_UNSUPPORTED,  /* nvmlDeviceGetMigMode answered NOT_SUPPORTED: not a MIG-capable GPU */
        GPU_MIG_DISABLED,
        GPU_MIG_ENABLED,
        _GPU_MIG_MODE_MAX,
        _GPU_MIG_MODE_INVALID = -EINVAL,
} GpuMigMode;

/* One MIG device (a compute instance inside a GPU instance), as the labels, CDI and MIG code see it. */
typedef struct MigDeviceInfo {
        unsigned index;              /* MIG device index within its parent (GetMigDeviceHandleByIndex) */
        unsigned gi_id;              /* GPU instance id */
        unsigned ci_id;              /* compute instance id within the GI */
        unsigned gi_profile_id;      /* GPU instance profile *id* (not index) */
        unsigned ci_profile_id;
        unsigned placement_start;    /* GI placement, memory slices */
        unsigned placement_size;
        char *uuid;                  /* "MIG-xxxxxxxx-..." */
        char *profile;               /* canonical name: "1g.10gb", "1c.2g.20gb", "1g.10gb+me"; NULL if unknown */
        uint64_t memory_mib;         /* attributes.memorySizeMB */
        unsigned multiprocessors;
        unsigned gi_slices;          /* attributes.gpuInstanceSliceCount */
        unsigned ci_slices;          /* attributes.computeInstanceSliceCount */
        unsigned copy_engines, decoders, encoders, jpegs, ofas;
} MigDeviceInfo;

/* qsort() order of MIG devices: GPU instance id, then compute instance id, then NVML index. */
int gpu_nvml_mig_device_compare(const void *a, const void *b);

/* One physical GPU. Fields NVML could not answer are NULL / 0 / -1 and named in warnings. */
typedef struct GpuInfo {
        char pci_address[32];        /* "0000:3b:00.0", lower case, matches PciDevice.address */
        unsigned nvml_index;         /* NVML's own index (may differ from ours) */
        char *name;                  /* "NVIDIA H100 80GB HBM3" */
        char *uuid;                  /* "GPU-xxxxxxxx-..." */
        uint64_t memory_total_bytes; /* 0 when unknown */
        int cc_major, cc_minor;      /* -1 when unknown */
        int minor;                   /* /dev/nvidia<minor>, -1 when unknown */
        GpuMigMode mig_current;
        GpuMigMode mig_pending;
        MigDeviceInfo *mig_devices;  /* MIG devices, ordered by (gi_id, ci_id) */
        size_t n_mig_devices;
        char *clique;                /* "<clusterUUID>.<cliqueId>" when fabric-attached and completed, else NULL */
        bool nvlink_known;           /* NVML reports NVLink state for this GPU (false: no NVLink, or not said) */
        char **nvlink_remotes;       /* per active NVLink, the far end's PCI address ("0000:1b:00.0"): a peer
                                      * GPU or an NVSwitch; NULL when none is active */
} GpuInfo;

/* What NVML said about the node in one read. GPUs are in PCI address order (our index), one entry per
 * GPU NVML knows; a GPU of the inventory that NVML does not list (vfio-pci, unbound) has no entry. */
typedef struct NvmlSnapshot {
        char *driver_version;        /* "550.54.15" */
        int cuda_version;            /* nvmlSystemGetCudaDriverVersion: 12040 = 12.4; 0 unknown */
        char *nvml_version;
        GpuInfo *gpus;
        size_t n_gpus;
        char **warnings;             /* one line each: which call failed for which GPU, and why */
} NvmlSnapshot;

/* Loads the library (a bare name goes through the loader's search, a path is used as is) and calls
 * nvmlInit_v2 (falling back to nvmlInit). Returns:
 *   -ENOENT   the library is missing ("libnvidia-ml.so.1: cannot open shared object file … — is the
 *             NVIDIA driver's user-space (libnvidia-ml1 / nvidia-utils) installed? (nvml.library)")
 *   -ENODEV   NVML_ERROR_DRIVER_NOT_LOADED ("the nvidia kernel module is not loaded")
 *   -ENOSYS   a required entry point is missing (too old a driver); the message names it
 *   other     the mapped init error
 * with *ret_error set to one sentence for the log and D-Bus. Never exits, never aborts. */
int gpu_nvml_open(const char *library, GpuNvml **ret, char **ret_error);

/* Called before each NVML entry point (and before dlopen, as "dlopen"): entry point, and our index of the
 * GPU being read or -1. */
typedef void (*GpuNvmlProgress)(const char *entry_point, int gpu, void *userdata);

/* gpu_nvml_open() that reports progress from the start (dlopen, nvmlInit_v2) and keeps reporting for
 * every later call on the handle. */
int gpu_nvml_open_progress(const char *library, GpuNvmlProgress progress, void *userdata, GpuNvml **ret,
                           char **ret_error);

/* nvmlShutdown + dlclose. Accepts NULL. */
GpuNvml *gpu_nvml_close(GpuNvml *n);
DEFINE_CLEANUP_FUNC(GpuNvml *, gpu_nvml_close);

/* Reads the whole snapshot: system versions, then every GPU. pci_addresses (our inventory's GPUs, in
 * order) selects and orders the GPUs; NULL = every GPU NVML lists, in PCI order. Static facts (name,
 * UUID, memory, compute capability, minor) are cached by PCI address inside GpuNvml and not read again;
 * MIG mode and fabric state are read every time. MIG devices are cached by their MIG UUID (an instance
 * keeps it for its whole life; a re-created one gets a new one), so on an unchanged node a read costs
 * the MIG mode per GPU, a handle per MIG device slot and the UUID per MIG device; a device the last read
 * did not know, or read only with a warning, is read in full. A failing call for one GPU omits that
 * field with a warning; only a failure that leaves nothing usable (e.g. GetCount) fails the read. */
int gpu_nvml_read(GpuNvml *n, char *const *pci_addresses, NvmlSnapshot **ret, char **ret_error);

/* Seeding a worker's caches with facts the daemon already read (gpu_nvml_worker_set_seed()): true when
 * NVML's driver version (one call, kept) is s's — the facts are then of this driver load's GPUs (a GPU is
 * at its PCI address until the driver is reloaded) — and takes s's NVML and CUDA versions. */
bool gpu_nvml_seed_system(GpuNvml *n, const NvmlSnapshot *s);
/* g's static facts (NVML index, name, UUID, memory size, compute capability, minor, NVLink topology, not
 * MIG capable) into the cache of its address, and the PCI ids (nvmlPciInfo_t's pciDeviceId and
 * pciSubSystemId) when pci_device_id is not 0. Only what s says is known is taken. */
int gpu_nvml_seed_gpu(GpuNvml *n, const GpuInfo *g, uint32_t pci_device_id, uint32_t pci_subsystem_id);

/* Forgets cached static facts (after a driver reload or a GPU reset). */
void gpu_nvml_invalidate(GpuNvml *n);

/* Number of NVML entry-point calls made so far (for the benchmarks and the no-re-read tests). */
uint64_t gpu_nvml_calls(const GpuNvml *n);

NvmlSnapshot *gpu_nvml_snapshot_free(NvmlSnapshot *s);
DEFINE_CLEANUP_FUNC(NvmlSnapshot *, gpu_nvml_snapshot_free);
void gpu_info_done(GpuInfo *g);

const GpuInfo *gpu_nvml_snapshot_find(const NvmlSnapshot *s, const char *pci_address);

/* Same versions, GPUs and MIG devices with the same attributes (warnings ignored). NULLs compare equal
 * only to NULL. */
bool gpu_nvml_snapshot_equal(const NvmlSnapshot *a, const NvmlSnapshot *b);

/* The canonical MIG profile name from a device's attributes, the parent's total memory, and the GI
 * profile's attribute suffix ("" "+me" "+me.all" "+gfx" "-me"): "<G>g.<GB>gb" or "<C>c.<G>g.<GB>gb"
 * with GB = round(ceil(8 × memMiB × 2^20 / totalBytes) / 8 × ceil(totalBytes / 2^30)) (labels.md). */
char *gpu_mig_profile_name(unsigned gi_slices, unsigned ci_slices, uint64_t memory_mib,
                           uint64_t total_bytes, const char *suffix);

const char *gpu_mig_mode_to_string(GpuMigMode m);

/* The strings NVML hands us are data from a driver we did not write, and those a worker sends may come
 * from a crashed or subverted process: each is checked where it enters (the reader, the wire decoder).
 * The longest string NVML answers, without its NUL: the V2 name and UUID buffers are 96 bytes. */
#define GPU_NVML_STRING_MAX 95
/* prefix ("GPU-" or "MIG-") followed by hex digits and dashes (a hex digit first), at most
 * GPU_NVML_UUID_MAX bytes (a real one has 40; one that filled NVML's whole buffer was cut short): the only
 * characters a CDI device name, a label or a gres.conf line can take from it. NVML's pre-R470
 * "MIG-GPU-<uuid>/<gi>/<ci>" form is refused. */
#define GPU_NVML_UUID_MAX 80
bool gpu_nvml_uuid_is_valid(const char *s, const char *prefix);
/* "550.54.15", "12.550.54.15": digits separated by single dots, at most 79 bytes (NVML's 80-byte buffer). */
bool gpu_nvml_version_is_valid(const char *s);
/* A canonical MIG profile name: "1g.10gb", "1c.2g.20gb+me.all", lower-case letters, digits, '.', '+', '-'. */
bool gpu_nvml_profile_is_valid(const char *s);
/* A PCI address as we spell it: "0000:3b:00.0" (lower case). */
bool gpu_nvml_pci_address_is_valid(const char *s);
/* Every string of s within the rules above (names: non-empty, at most GPU_NVML_STRING_MAX bytes, any
 * bytes but NUL). -EBADMSG with *ret_what naming the first offending field otherwise. */
int gpu_nvml_snapshot_check(const NvmlSnapshot *s, const char **ret_what);
