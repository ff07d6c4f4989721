/* SPDX-License-Identifier: MIT */
/* Owns the data model shared by the MIG config reader (mig-config.c), the planner (mig-plan.c) and the
 * applier (mig-apply.c): a desired geometry per GPU, the observed layout per GPU, and the per-GPU plan
 * that turns one into the other. No NVML and no I/O here. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "macro.h"

/* --- what the config asks for (mig-parted v1) --- */

typedef struct MigDeviceRequest {
        char *profile;              /* as written: "1g.10gb", "1c.2g.20gb", "1g.10gb+me" */
        unsigned count;             /* 0 = none of this profile */
} MigDeviceRequest;

typedef struct MigConfigEntry {
        char **device_filter;       /* "0x233010DE" or "0x233010DE:0x16C110DE" (device<<16|vendor[:subsys]); NULL = any */
        bool all_devices;           /* devices: all */
        unsigned *devices;          /* else: GPU indices */
        size_t n_devices;
        bool mig_enabled;
        MigDeviceRequest *requests; /* when enabled; may be empty ({} = MIG on, no devices) */
        size_t n_requests;
        unsigned line;              /* for error messages */
} MigConfigEntry;

typedef struct MigConfig {          /* one named config of the file */
        char *name;
        MigConfigEntry *entries;    /* in file order; the last matching entry wins */
        size_t n_entries;
} MigConfig;

typedef struct MigConfigFile {
        char *path;
        MigConfig *configs;
        size_t n_configs;
} MigConfigFile;

/* --- what a GPU has now (read through NVML) and can do --- */

typedef struct MigCiProfile {       /* compute instance profile within a GI profile */
        unsigned index;
        unsigned id;
        unsigned slices;
        unsigned instance_count;
} MigCiProfile;

typedef struct MigGiProfile {       /* one GPU instance profile the GPU reports */
        unsigned index;             /* NVML profile index (GetGpuInstanceProfileInfo argument) */
        unsigned id;                /* profile id (Create/GetGpuInstances take this) */
        char *name;                 /* canonical name, e.g. "1g.10gb", "1g.10gb+me" */
        unsigned slices;            /* GPU (compute) slices */
        unsigned memory_slices;     /* placement size */
        unsigned instance_count;    /* the most instances of this profile */
        unsigned *starts;           /* possible placement starts */
        size_t n_starts;
        MigCiProfile *ci_profiles;  /* the CI profiles a GI of this profile takes (GetComputeInstanceProfileInfo):
                                     * the planner needs the full-size one for plain names and the C-slice one
                                     * for "<C>c.<G>g.<GB>gb" */
        size_t n_ci_profiles;
} MigGiProfile;

/* A compute instance whose id was not asked (the planning read counts a GI's CIs per CI profile and does
 * not ask each one's info): destroying it takes any CI of its profile in its GI. */
#define MIG_CI_ID_UNKNOWN UINT32_MAX

typedef struct MigGiState {         /* an existing GPU instance */
        unsigned id;
        unsigned profile_id;
        unsigned start, size;       /* placement */
        unsigned *ci_ids;           /* its compute instances (MIG_CI_ID_UNKNOWN: not asked) */
        unsigned *ci_profile_ids;
        size_t n_cis;
} MigGiState;

typedef struct MigGpuState {
        unsigned index;             /* our GPU index (PCI order) */
        char pci_address[32];
        char *model;                /* NVML name */
        uint32_t pci_id;            /* device<<16 | vendor, as device-filter writes it */
        uint32_t subsystem_id;      /* subsystem device<<16 | subsystem vendor */
        bool mig_capable;
        bool mig_current, mig_pending;
        bool busy;                  /* compute processes running */
        MigGiProfile *gi_profiles;  /* what this GPU supports */
        size_t n_gi_profiles;
        /* A table read only as far as a config needed (mig_state_read_for()): the profile indices asked
         * (bit i: index i answered, supported or not) and the first index NVML called invalid (the end of
         * its table). A profile whose index was not asked is unknown, never absent. false: the whole table. */
        bool gi_profiles_partial;
        uint64_t gi_profiles_asked;
        unsigned gi_profiles_end;
        MigGiState *gis;            /* what exists now */
        size_t n_gis;
} MigGpuState;

/* --- the plan for one GPU --- */

typedef enum MigStepKind {
        MIG_STEP_SET_MODE,          /* arg: enable (0/1) */
        MIG_STEP_RESET_GPU,         /* the mode change is pending until reset */
        MIG_STEP_DESTROY_CI,        /* gi_id, ci_id (or MIG_CI_ID_UNKNOWN), profile_id: its CI profile id */
        MIG_STEP_DESTROY_GI,        /* gi_id */
        MIG_STEP_CREATE_GI,         /* profile_id, start, size; the created id is recorded by the applier */
        MIG_STEP_CREATE_CI,         /* on the GI created by step `gi_step` (or an existing gi_id), ci profile id */
        _MIG_STEP_KIND_MAX,
        _MIG_STEP_KIND_INVALID = -EINVAL,
} MigStepKind;

typedef struct MigStep {
        MigStepKind kind;
        unsigned enable;
        unsigned gi_id, ci_id;
        unsigned profile_id;        /* GI profile id (CREATE_GI) or CI profile id (CREATE_CI) */
        unsigned start, size;
        int gi_step;                /* CREATE_CI: index of the CREATE_GI step in this plan, or -1 */
        char *profile;              /* the profile name, for logs and the journal */
} MigStep;

typedef struct MigGpuPlan {
        unsigned gpu;               /* our GPU index */
        char pci_address[32];
        MigStep *steps;             /* in execution order: destroy CIs, destroy GIs, mode, [reset], create GIs,
                                     * create CIs (destroys come first: SetMigMode is IN_USE while GIs exist) */
        size_t n_steps;
        bool needs_reset;           /* mode change pending until a reset */
} MigGpuPlan;

typedef struct MigPlan {
        char *config_name;
        MigGpuPlan *gpus;           /* only GPUs whose target differs; empty = nothing to do */
        size_t n_gpus;
        unsigned *unmanaged;        /* GPUs no entry covers: left alone, reported */
        size_t n_unmanaged;
} MigPlan;

const char *mig_step_kind_to_string(MigStepKind k);
MigStepKind mig_step_kind_from_string(const char *s);

/* Free functions (mig-types.c); each accepts NULL and half-built objects. */
MigConfigFile *mig_config_file_free(MigConfigFile *f);
DEFINE_CLEANUP_FUNC(MigConfigFile *, mig_config_file_free);
void mig_config_done(MigConfig *c);
void mig_config_entry_done(MigConfigEntry *e);
void mig_gi_profile_done(MigGiProfile *p);
void mig_gi_state_done(MigGiState *gi);
void mig_gpu_state_done(MigGpuState *g);
/* Frees an array of n GPU states and their contents; returns NULL. */
MigGpuState *mig_gpu_states_free(MigGpuState *gpus, size_t n);
void mig_gpu_plan_done(MigGpuPlan *p);
MigPlan *mig_plan_free(MigPlan *p);
DEFINE_CLEANUP_FUNC(MigPlan *, mig_plan_free);
