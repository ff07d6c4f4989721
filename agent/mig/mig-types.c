/* SPDX-License-Identifier: MIT */
/* Owns the lifetime of the MIG data model (mig-types.h): the free functions of configs, GPU states and
 * plans, and the step kind string table used by logs, the journal and the tests. */
#include "mig-types.h"
#include "string-table.h"

static const char *const step_kind_table[_MIG_STEP_KIND_MAX] = {
        [MIG_STEP_SET_MODE] = "set-mode",
        [MIG_STEP_RESET_GPU] = "reset-gpu",
        [MIG_STEP_DESTROY_CI] = "destroy-ci",
        [MIG_STEP_DESTROY_GI] = "destroy-gi",
        [MIG_STEP_CREATE_GI] = "create-gi",
        [MIG_STEP_CREATE_CI] = "create-ci",
};

DEFINE_STRING_TABLE_LOOKUP(mig_step_kind, MigStepKind, step_kind_table, _MIG_STEP_KIND_MAX, _MIG_STEP_KIND_INVALID)

void mig_config_entry_done(MigConfigEntry *e) {
        if (!e)
                return;
        for (char **f = e->device_filter; f && *f; f++)
                free(*f);
        free(e->device_filter);
        free(e->devices);
        for (size_t i = 0; i < e->n_requests; i++)
                free(e->requests[i].profile);
        free(e->requests);
        *e = (MigConfigEntry) {};
}

void mig_config_done(MigConfig *c) {
        if (!c)
                return;
        for (size_t i = 0; i < c->n_entries; i++)
                mig_config_entry_done(&c->entries[i]);
        free(c->entries);
        free(c->name);
        *c = (MigConfig) {};
}

MigConfigFile *mig_config_file_free(MigConfigFile *f) {
        if (!f)
                return NULL;
        for (size_t i = 0; i < f->n_configs; i++)
                mig_config_done(&f->configs[i]);
        free(f->configs);
        free(f->path);
        free(f);
        return NULL;
}

void mig_gi_profile_done(MigGiProfile *p) {
        if (!p)
                return;
        free(p->name);
        free(p->starts);
        free(p->ci_profiles);
        *p = (MigGiProfile) {};
}

void mig_gi_state_done(MigGiState *gi) {
        if (!gi)
                return;
        free(gi->ci_ids);
        free(gi->ci_profile_ids);
        *gi = (MigGiState) {};
}

void mig_gpu_state_done(MigGpuState *g) {
        if (!g)
                return;
        free(g->model);
        for (size_t i = 0; i < g->n_gi_profiles; i++)
                mig_gi_profile_done(&g->gi_profiles[i]);
        free(g->gi_profiles);
        for (size_t i = 0; i < g->n_gis; i++)
                mig_gi_state_done(&g->gis[i]);
        free(g->gis);
        *g = (MigGpuState) {};
}

MigGpuState *mig_gpu_states_free(MigGpuState *gpus, size_t n) {
        for (size_t i = 0; gpus && i < n; i++)
                mig_gpu_state_done(&gpus[i]);
        free(gpus);
        return NULL;
}

void mig_gpu_plan_done(MigGpuPlan *p) {
        if (!p)
                return;
        for (size_t i = 0; i < p->n_steps; i++)
                free(p->steps[i].profile);
        free(p->steps);
        *p = (MigGpuPlan) {};
}

MigPlan *mig_plan_free(MigPlan *p) {
        if (!p)
                return NULL;
        for (size_t i = 0; i < p->n_gpus; i++)
                mig_gpu_plan_done(&p->gpus[i]);
        free(p->gpus);
        free(p->unmanaged);
        free(p->config_name);
        free(p);
        return NULL;
}
