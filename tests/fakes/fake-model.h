/* SPDX-License-Identifier: MIT */
/* Owns the fake NVML's GPU model table (tests/fixtures/mig-profiles.yaml): what each model reports
 * (memory, compute capability, MIG capability) and its MIG GPU instance profiles, plus the compute
 * instance profiles derived from a GI profile and the canonical MIG profile names. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fake-yaml.h"

#define FAKE_MAX_STARTS 8
#define FAKE_MAX_MEM_SLICES 8
#define FAKE_MAX_GI (2 * FAKE_MAX_MEM_SLICES - 1) /* GI ids 0..14: whole, halves, quarters, eighths */
#define FAKE_MAX_CI 8

typedef struct FakeGiProfile {
        unsigned index;      /* the NVML_GPU_INSTANCE_PROFILE_* index GetGpuInstanceProfileInfo takes */
        unsigned id;         /* the profile id Create/GetGpuInstances take: differs from index */
        unsigned g;          /* compute slices */
        unsigned inst;       /* most instances of this profile on one GPU */
        unsigned size;       /* memory slices of a placement */
        unsigned starts[FAKE_MAX_STARTS];
        size_t n_starts;
        uint64_t mem_mib;
        unsigned ce, dec, enc, jpeg, ofa;
        char attr[16];       /* "" or "+me" … */
        char name[48];       /* canonical "1g.10gb+me" */
} FakeGiProfile;

typedef struct FakeModel {
        char *name;
        unsigned pci_device_id;
        unsigned subsystem;  /* subsystem device << 16 | vendor, 0 if the table has none */
        uint64_t total_mib;
        int cc_major, cc_minor;
        unsigned sm_per_slice;
        unsigned memory_slices;  /* 8, or 4 on A30 */
        unsigned compute_slices; /* slices of the whole-GPU profile: 7, or 4 on A30 */
        bool mig_capable;
        bool needs_reset;        /* a MIG mode change stays pending until a GPU reset */
        FakeGiProfile *gi;
        size_t n_gi;
} FakeModel;

typedef struct FakeModels {
        FakeModel *models;
        size_t n;
} FakeModels;

int fake_models_load(FakeModels *m, const char *path, FakeError *e);
void fake_models_done(FakeModels *m);
const FakeModel *fake_models_find(const FakeModels *m, const char *name);

const FakeGiProfile *fake_model_gi_by_index(const FakeModel *m, unsigned index);
const FakeGiProfile *fake_model_gi_by_id(const FakeModel *m, unsigned id);
/* "1g.10gb", "1g.10gb+me", or a decimal profile id. */
const FakeGiProfile *fake_model_gi_lookup(const FakeModel *m, const char *name_or_id);

/* The GB of a profile name per the GFD label contract (README.md, "Labels"). */
unsigned fake_profile_gb(uint64_t mem_mib, uint64_t total_mib);

/* A compute instance profile of a GI profile: index == id, as on real hardware. */
typedef struct FakeCiProfile {
        unsigned id;
        unsigned c;    /* compute slices */
        unsigned inst; /* floor(g / c) */
} FakeCiProfile;

#define FAKE_N_CI_PROFILES 5
/* False when the GI profile has no CI profile of that index (too big, or 3c in a 4g GI). */
bool fake_ci_profile(const FakeGiProfile *gi, unsigned ci_index, FakeCiProfile *ret);
/* The CI profile index for c compute slices, -1 if none. */
int fake_ci_index_for_slices(unsigned c);
/* "1c.3g.40gb" (or "3g.40gb" when c == g, with the GI's attribute suffix). */
void fake_ci_name(const FakeGiProfile *gi, unsigned c, char *buf, size_t size);
