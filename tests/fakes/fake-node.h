/* SPDX-License-Identifier: MIT */
/* Owns the fake NVML's node: the node description (driver versions, GPUs with their models, initial MIG
 * layout, fabric, processes), the state file that carries MIG mode and instances across processes, and
 * the MIG engine that changes that state under the rules the real driver enforces. Shared by the fake
 * libnvidia-ml.so.1 and fake-nvml-ctl; knows nothing of the NVML ABI (results are FakeResult). */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

#include "fake-model.h"

typedef enum FakeResult {
        FAKE_OK,
        FAKE_INVALID,      /* NVML_ERROR_INVALID_ARGUMENT */
        FAKE_NOT_SUPPORTED,
        FAKE_NOT_FOUND,
        FAKE_IN_USE,
        FAKE_INSUFFICIENT, /* NVML_ERROR_INSUFFICIENT_RESOURCES */
} FakeResult;

typedef enum FakeFit {
        FAKE_FIT_BEST,  /* what the driver does: fewest other placements lost, ties to the lowest start */
        FAKE_FIT_FIRST,
        FAKE_FIT_LAST,
        _FAKE_FIT_MAX,
        _FAKE_FIT_INVALID = -EINVAL,
} FakeFit;

FakeFit fake_fit_from_string(const char *s);

typedef struct FakeCi {
        bool used;
        unsigned profile;      /* CI profile id (== index) */
        unsigned start, size;  /* compute slices within the GI */
        char uuid[48];         /* "MIG-…": new on every creation */
} FakeCi;

typedef struct FakeGi {
        bool used;
        unsigned profile;      /* GI profile id */
        unsigned start, size;  /* memory slices */
        FakeCi ci[FAKE_MAX_CI];
} FakeGi;

typedef struct FakeProcess {
        unsigned pid;
        uint64_t memory_mib;
        unsigned gi, ci;       /* UINT32_MAX when not in a MIG device */
} FakeProcess;

/* An instance of the description's initial MIG layout. */
typedef struct FakeInitGi {
        const FakeGiProfile *profile;
        int start;             /* -1: the driver's choice */
        unsigned ci_profiles[FAKE_MAX_CI];
        size_t n_ci;           /* 0: one CI over the whole GI */
} FakeInitGi;

#define FAKE_MAX_NVLINK 18  /* NVML_NVLINK_MAX_LINKS */

/* The far end of one active NVLink: a GPU or an NVSwitch, by PCI address. */
typedef struct FakeNvLink {
        unsigned domain, bus, device, function;
} FakeNvLink;

typedef struct FakeGpu {
        /* from the description */
        char pci[16];          /* "0000:1b:00.0" */
        unsigned domain, bus, device, function;
        const FakeModel *model;
        char *name;            /* "name"/"name_hex": what nvmlDeviceGetName answers instead of the model's */
        char uuid[320];
        unsigned minor;
        unsigned subsystem;
        bool has_fabric;
        uint8_t cluster_uuid[16];
        unsigned clique;
        unsigned fabric_state; /* NVML_GPU_FABRIC_STATE_* value */
        bool has_nvlink;       /* "nvlink:" given: links 0..n_nvlink-1 active, the rest inactive */
        FakeNvLink nvlink[FAKE_MAX_NVLINK];
        size_t n_nvlink;
        FakeProcess *procs;
        size_t n_procs;
        bool init_mig, init_pending;
        FakeInitGi *init;
        size_t n_init;
        /* state */
        bool mig_current, mig_pending;
        FakeGi gi[FAKE_MAX_GI];
} FakeGpu;

typedef struct FakeNode {
        char *description_path, *state_path, *profiles_path;
        char *driver_version, *nvml_version;
        char *latency;         /* FAKE_NVML_DELAY rules of this node ("latency:"), NULL none */
        int cuda_version;      /* 12040 = 12.4 */
        FakeModels models;
        FakeGpu *gpus;         /* in PCI address order = NVML index order */
        size_t n_gpus;
        uint64_t serial;       /* MIG UUID counter, kept in the state file */
        struct stat seen;      /* the state file as last read or written */
} FakeNode;

/* Loads description and model table, then the state file (created from the description when absent).
 * state NULL: "<description>.state". */
int fake_node_load(FakeNode **ret, const char *description, const char *state, const char *profiles, FakeError *e);
FakeNode *fake_node_free(FakeNode *n);
DEFINE_CLEANUP_FUNC(FakeNode *, fake_node_free);

/* Re-reads the state file if another process replaced it since we last saw it. */
int fake_node_sync(FakeNode *n, FakeError *e);
/* Takes the cross-process lock (flock on "<state>.lock") and syncs; release with close(*ret_fd). */
int fake_node_lock(FakeNode *n, int *ret_fd, FakeError *e);
/* Writes the state file atomically (temp file + rename). */
int fake_node_save(FakeNode *n, FakeError *e);
/* Forget instances and apply the description's initial layout (used on load). */
int fake_node_reset_to_description(FakeNode *n, FakeError *e);

FakeGpu *fake_node_find_gpu(FakeNode *n, const char *index_or_pci);

/* ---- MIG engine (fake-mig.c) ---- */

/* The GI id of a placement: GI ids follow memory position (whole 0, halves 1-2, quarters 3-6, eighths
 * 7-14 on 8 slices; 0, 1-2, 3-6 on the 4-slice A30). */
unsigned fake_gi_id(const FakeModel *m, unsigned start, unsigned size);

FakeResult fake_mig_set_mode(FakeGpu *g, bool enable, bool busy, bool *ret_reset_required);
/* start < 0: choose a placement with fit. */
FakeResult fake_mig_create_gi(FakeGpu *g, const FakeGiProfile *p, int start, FakeFit fit, unsigned *ret_id);
FakeResult fake_mig_destroy_gi(FakeGpu *g, unsigned id, bool busy);
FakeResult fake_mig_create_ci(FakeNode *n, FakeGpu *g, unsigned gi, unsigned ci_profile, unsigned *ret_id);
FakeResult fake_mig_destroy_ci(FakeGpu *g, unsigned gi, unsigned ci, bool busy);
/* A GPU reset: the pending mode becomes current and every instance is gone. IN_USE when busy. */
FakeResult fake_mig_reset(FakeGpu *g, bool busy);
/* Whether a placement is still free and the profile's limits allow another instance there. */
bool fake_mig_can_place(const FakeGpu *g, const FakeGiProfile *p, unsigned start);

typedef struct FakeMigRef {
        unsigned gi, ci;
} FakeMigRef;
/* MIG devices in (GI id, CI id) order; returns the count (at most FAKE_MAX_GI * FAKE_MAX_CI). */
size_t fake_mig_devices(const FakeGpu *g, FakeMigRef *ret);
