/* SPDX-License-Identifier: MIT */
/* Owns the interface of mig-test-gpus.c: GPU models with their MIG profile tables, nodes built from
 * them, and the driver simulator that applies a MigPlan to such a node. For cmocka tests only: the
 * functions fail the running test when a plan breaks a rule. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "mig-plan.h"

typedef struct MigTestProfileTemplate {
        unsigned index, id, g, inst, size;
        unsigned starts[8];
        unsigned n_starts;
} MigTestProfileTemplate;

typedef struct MigTestModel {
        const char *name;
        uint32_t pci_id, subsystem_id;
        const MigTestProfileTemplate *t; /* NULL: not MIG capable */
        size_t n_t;
        unsigned memory_slices;
        const char *names[7];            /* in the template's order */
} MigTestModel;

extern const MigTestModel mig_test_a100_40, mig_test_a100_80, mig_test_h100, mig_test_h200, mig_test_a30;
extern const MigTestModel mig_test_l40s, mig_test_display; /* not MIG capable */

typedef struct MigTestNode {
        MigGpuState *gpus;
        size_t n;
        const MigTestModel *models[16];
} MigTestNode;

/* n GPUs of the given models (at most 16), indices 0…n-1, MIG off and no GIs. */
MigTestNode mig_test_node_new(const MigTestModel *const *models, size_t n);
MigTestNode mig_test_node_same(const MigTestModel *m, size_t n);
void mig_test_node_done(MigTestNode *n);

const MigGiProfile *mig_test_profile_by_id(const MigGpuState *g, unsigned id);

/* Applies every step of plan to node as the driver would, failing the test on a step it would refuse. */
void mig_test_apply(MigTestNode *node, const MigPlan *plan);

/* Sets a layout on a GPU with MIG on: "3g.20gb@4 1g.5gb@2/1c,1c" (CIs by slices; default one whole CI). */
void mig_test_set_layout(MigGpuState *g, const char *spec);

/* "2g.10gb@0 3g.20gb@4/1c,1c …" sorted by start (CIs by slices unless one spans the GI), for comparing layouts. */
char *mig_test_layout_of(const MigGpuState *g);
