/* SPDX-License-Identifier: MIT */
/* Owns what the two halves of the fake libnvidia-ml.so.1 (fake-nvml.c: init, faults, trace, devices;
 * fake-nvml-mig.c: MIG) share: the process-wide context, the handle objects behind nvmlDevice_t,
 * nvmlGpuInstance_t and nvmlComputeInstance_t, and the enter/leave bracket every entry point uses.
 * Everything here is hidden (-fvisibility=hidden); only NVML's own names are exported. */
#pragma once

#include <pthread.h>

#include "fake-node.h"
#include "nvml-abi.h"

#define FAKE_EXPORT __attribute__((visibility("default")))
/* Declares an exported entry point with the exact function type nvml-abi.h gives its pointer type, so a
 * definition that differs from the ABI does not compile. */
#define FAKE_DECLARE(name, fn_type) FAKE_EXPORT extern __typeof__(*(fn_type) 0) name

/* Handles are fixed slots: a GPU's device handle, one MIG device / GI / CI slot per (GI id, CI id). They
 * live as long as the loaded node, so a handle stays valid across calls (and across re-inits of the same
 * node); whether the instance behind a slot exists is checked on every use. */
struct nvmlDevice_st {
        unsigned gpu;
        bool mig;
        unsigned gi, ci;
};
struct nvmlGpuInstance_st {
        unsigned gpu, gi;
};
struct nvmlComputeInstance_st {
        unsigned gpu, gi, ci;
};

typedef struct FakeHandles {
        struct nvmlDevice_st dev;
        struct nvmlDevice_st mig[FAKE_MAX_GI][FAKE_MAX_CI];
        struct nvmlGpuInstance_st gi[FAKE_MAX_GI];
        struct nvmlComputeInstance_st ci[FAKE_MAX_GI][FAKE_MAX_CI];
} FakeHandles;

/* FAKE_NVML_GARBAGE fields. */
typedef enum FakeGarbage {
        FAKE_GARBAGE_NAME = 1 << 0,       /* empty name */
        FAKE_GARBAGE_UUID = 1 << 1,       /* empty UUID */
        FAKE_GARBAGE_MEMORY = 1 << 2,     /* total memory 0 */
        FAKE_GARBAGE_CC = 1 << 3,         /* compute capability 0.0 */
        FAKE_GARBAGE_MINOR = 1 << 4,      /* minor number 4294967295 */
        FAKE_GARBAGE_MIG = 1 << 5,        /* MIG mode 7/7 */
        FAKE_GARBAGE_ATTRIBUTES = 1 << 6, /* MIG device attributes all 0 */
        FAKE_GARBAGE_PCI = 1 << 7,        /* empty bus id, ids 0 */
} FakeGarbage;

typedef struct FakeFailRule {
        char name[64];   /* entry point */
        unsigned nth;    /* 1-based call number; 0 = every call */
        bool onwards;    /* "N+": that call and every later one */
        unsigned calls;  /* calls seen so far */
        nvmlReturn_t code;
} FakeFailRule;

typedef struct FakeCtx {
        pthread_mutex_t lock;
        unsigned init_count;
        FakeNode *node;
        FakeHandles *handles; /* one per GPU of node */
        size_t n_handles;
        FakeFit fit;
        bool *busy;           /* per GPU (FAKE_NVML_BUSY) */
        unsigned *garbage;    /* per GPU, FakeGarbage bits */
        bool garbage_driver, garbage_cuda, garbage_nvml;
        FakeFailRule *rules;
        size_t n_rules;
        int trace_fd;
        char *trace_path;
        int *dev_fds;         /* FAKE_NVML_DEV: the nodes held open from the first init to the last shutdown */
        size_t n_dev_fds;
} FakeCtx;

extern FakeCtx fake_ctx;

/* Every entry point: if (fake_enter(__func__, &r)) return fake_leave(__func__, r); … return
 * fake_leave(__func__, r). enter takes the process lock, applies FAKE_NVML_FAIL, refuses before init
 * and picks up state another process wrote; leave traces and unlocks. */
bool fake_enter(const char *name, nvmlReturn_t *ret);

/* The latency and fault model (fake-faults.c): load the rules (at each first init, once the node is
 * loaded: node_latency is its "latency:"), and apply them to one call (a delay, a hang until released, a
 * crash); n_gpus scales "/gpu" delays. */
void fake_faults_load(const char *node_latency);
void fake_faults_apply(const char *name, size_t n_gpus);
nvmlReturn_t fake_leave(const char *name, nvmlReturn_t r);

/* Takes the cross-process state lock for a mutation; fake_unlock saves when r is SUCCESS. */
nvmlReturn_t fake_lock(int *ret_fd);
nvmlReturn_t fake_unlock(int fd, nvmlReturn_t r, bool changed);

/* Handle lookups: NULL for anything that is not a live handle of ours. */
FakeGpu *fake_device(nvmlDevice_t d, unsigned *ret_index);       /* physical GPU handles only */
FakeGpu *fake_mig_device(nvmlDevice_t d, unsigned *ret_index);   /* MIG device handles only */
FakeGpu *fake_gpu_instance(nvmlGpuInstance_t gi, unsigned *ret_index);
FakeGpu *fake_compute_instance(nvmlComputeInstance_t ci, unsigned *ret_index);

bool fake_busy(unsigned gpu_index);
nvmlReturn_t fake_result(FakeResult r);
