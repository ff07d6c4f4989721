/* SPDX-License-Identifier: MIT */
/* Owns the NVML side of applying a plan to one GPU: each step as NVML calls (GPU and compute instances
 * looked up by id, GPU instances created at the planned placement), the journal record of every write,
 * the plan back to a recorded layout that rollback and journal recovery run, and the same steps as a job
 * of an NVML worker process (mig_gpu_steps_job()). Synchronous: the caller decides where it runs (the
 * daemon runs it in the worker: a MIG call can take hundreds of ms, or hang); the slow part, a GPU reset,
 * is the caller's (a child process). */
#include <stdlib.h>
#include <string.h>

#include "gpu-nvml-worker.h"
#include "mig-apply.h"
#include "mig-journal.h"
#include "mig-state.h"
#include "mig-wire.h"
#include "strv.h"

#define MAX_CIS 16

int mig_gpu_mode_is(GpuNvml *n, nvmlDevice_t d, bool want, bool *ret) {
        unsigned current = 0, pending = 0;
        int r;

        r = gpu_nvml_device_get_mig_mode(n, d, &current, &pending);
        if (r < 0)
                return r;
        *ret = (current == NVML_DEVICE_MIG_ENABLE) == want;
        return 0;
}

int mig_gpu_run_init(GpuNvml *n, const MigGpuPlan *plan, MigGpuRun *ret) {
        nvmlDevice_t device;
        int r;

        r = mig_state_device(n, plan->pci_address, &device);
        if (r < 0)
                return r;
        r = mig_gpu_run_prepare(plan, ret);
        if (r < 0)
                return r;
        ret->device = device;
        return 0;
}

void mig_gpu_run_done(MigGpuRun *run) {
        if (!run)
                return;
        free(run->created);
        free(run->gi_handles);
        *run = (MigGpuRun) {};
}

/* A compute instance by id; drivers without nvmlGpuInstanceGetComputeInstanceById are asked per CI
 * profile. */
static int find_ci(GpuNvml *n, nvmlGpuInstance_t gi, unsigned ci_id, nvmlComputeInstance_t *ret) {
        int r;

        r = gpu_nvml_gpu_instance_get_compute_instance_by_id(n, gi, ci_id, ret);
        if (r != -ENOSYS)
                return r;
        for (unsigned idx = 0; idx < NVML_COMPUTE_INSTANCE_PROFILE_COUNT; idx++) {
                nvmlComputeInstanceProfileInfo_v2_t info = {};
                nvmlComputeInstance_t cis[MAX_CIS];
                unsigned count = ELEMENTSOF(cis);

                r = gpu_nvml_gpu_instance_get_compute_instance_profile_info(
                        n, gi, idx, NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, &info);
                if (r == -EOPNOTSUPP || r == -EINVAL || r == -ENOENT)
                        continue;
                if (r < 0)
                        return r;
                r = gpu_nvml_gpu_instance_get_compute_instances(n, gi, info.id, cis, &count);
                if (r == -EOPNOTSUPP || r == -EINVAL)
                        continue;
                if (r < 0)
                        return r;
                for (unsigned k = 0; k < count; k++) {
                        nvmlComputeInstanceInfo_t ci = {};
                        r = gpu_nvml_compute_instance_get_info(n, cis[k], &ci);
                        if (r < 0)
                                return r;
                        if (ci.id == ci_id) {
                                *ret = cis[k];
                                return 0;
                        }
                }
        }
        return -ENOENT;
}

/* Any compute instance of a CI profile in gi (the planning read counts CIs per profile, without their ids:
 * which of equal CIs goes does not matter). */
static int find_ci_of_profile(GpuNvml *n, nvmlGpuInstance_t gi, unsigned ci_profile_id, nvmlComputeInstance_t *ret) {
        nvmlComputeInstance_t cis[MAX_CIS];
        unsigned count = ELEMENTSOF(cis);
        int r;

        r = gpu_nvml_gpu_instance_get_compute_instances(n, gi, ci_profile_id, cis, &count);
        if (r < 0)
                return r;
        if (count == 0)
                return -ENOENT;
        *ret = cis[0];
        return 0;
}

static char *step_failed(GpuNvml *n, const MigGpuRun *run, const MigStep *s, const char *what) {
        /* A rollback's steps come from a recorded layout, which knows profile ids, not names. */
        const char *p = s->profile ? s->profile : "", *sp = *p ? " " : "";

        switch (s->kind) {
        case MIG_STEP_SET_MODE:
                return strprintf("GPU %u (%s): %s MIG mode failed: %s", run->plan->gpu, run->plan->pci_address,
                                 s->enable ? "enabling" : "disabling", what);
        case MIG_STEP_RESET_GPU:
                return strprintf("GPU %u (%s): the MIG mode change is still not active: %s", run->plan->gpu,
                                 run->plan->pci_address, what);
        case MIG_STEP_DESTROY_CI:
                if (s->ci_id == MIG_CI_ID_UNKNOWN)
                        return strprintf("GPU %u (%s): destroying a compute instance%s%s (CI profile id %u) of GPU "
                                         "instance %u failed: %s", run->plan->gpu, run->plan->pci_address, sp, p,
                                         s->profile_id, s->gi_id, what);
                return strprintf("GPU %u (%s): destroying compute instance %u of GPU instance %u failed: %s",
                                 run->plan->gpu, run->plan->pci_address, s->ci_id, s->gi_id, what);
        case MIG_STEP_DESTROY_GI:
                return strprintf("GPU %u (%s): destroying GPU instance %u%s%s failed: %s", run->plan->gpu,
                                 run->plan->pci_address, s->gi_id, *p ? " " : "", p, what);
        case MIG_STEP_CREATE_GI:
                return strprintf("GPU %u (%s): creating GPU instance%s%s (profile id %u) at placement %u+%u "
                                 "failed: %s", run->plan->gpu, run->plan->pci_address, sp, p, s->profile_id, s->start,
                                 s->size, what);
        case MIG_STEP_CREATE_CI:
                return strprintf("GPU %u (%s): creating compute instance%s%s (CI profile id %u) failed: %s",
                                 run->plan->gpu, run->plan->pci_address, sp, p, s->profile_id, what);
        case _MIG_STEP_KIND_MAX:
        case _MIG_STEP_KIND_INVALID:
                break;
        }
        (void) n;
        return strprintf("GPU %s: unknown step: %s", run->plan->pci_address, what);
}

static unsigned step_gi(const MigGpuRun *run, const MigStep *s) {
        if (s->gi_step >= 0 && (size_t) s->gi_step < run->plan->n_steps)
                return run->created[s->gi_step];
        return s->gi_id;
}

/* One step; r < 0 with *ret_error on failure. 1 = the MIG mode waits for a reset. */
static int run_step(GpuNvml *n, MigGpuRun *run, size_t i, MigJournal *j, char **ret_error) {
        const MigStep *s = &run->plan->steps[i];
        nvmlGpuInstance_t gi = NULL;
        nvmlComputeInstance_t ci = NULL;
        nvmlGpuInstanceInfo_t gi_info = {};
        nvmlComputeInstanceInfo_t ci_info = {};
        bool active = false;
        int r = 0, rj;

        switch (s->kind) {
        case MIG_STEP_SET_MODE:
                r = gpu_nvml_device_set_mig_mode(n, run->device, s->enable ? NVML_DEVICE_MIG_ENABLE
                                                                           : NVML_DEVICE_MIG_DISABLE);
                if (r >= 0 || r == -ERESTART) {
                        run->wrote = run->mode_changed = true;
                        rj = j ? mig_journal_step(j, run->plan->pci_address, s, 0, 0, r) : 0;
                        if (rj < 0)
                                return rj;
                }
                if (r == -ERESTART)
                        return MIG_GPU_RUN_NEEDS_RESET;
                /* Some drivers answer SUCCESS and still keep the change pending: ask. */
                if (r >= 0) {
                        r = mig_gpu_mode_is(n, run->device, s->enable, &active);
                        if (r >= 0 && !active)
                                return MIG_GPU_RUN_NEEDS_RESET;
                }
                break;

        case MIG_STEP_RESET_GPU: {
                unsigned current = 0, pending = 0;

                /* Done already (the SET_MODE before took effect, or a reset just ran): nothing to wait for. */
                r = gpu_nvml_device_get_mig_mode(n, run->device, &current, &pending);
                if (r >= 0 && current != pending)
                        return MIG_GPU_RUN_NEEDS_RESET;
                break;
        }

        case MIG_STEP_DESTROY_CI:
                r = gpu_nvml_device_get_gpu_instance_by_id(n, run->device, s->gi_id, &gi);
                if (r >= 0)
                        r = s->ci_id == MIG_CI_ID_UNKNOWN ? find_ci_of_profile(n, gi, s->profile_id, &ci)
                                                          : find_ci(n, gi, s->ci_id, &ci);
                if (r >= 0)
                        r = gpu_nvml_compute_instance_destroy(n, ci);
                if (r >= 0) {
                        run->wrote = true;
                        rj = j ? mig_journal_step(j, run->plan->pci_address, s, s->gi_id, s->ci_id, 0) : 0;
                        if (rj < 0)
                                return rj;
                }
                break;

        case MIG_STEP_DESTROY_GI:
                r = gpu_nvml_device_get_gpu_instance_by_id(n, run->device, s->gi_id, &gi);
                if (r >= 0)
                        r = gpu_nvml_gpu_instance_destroy(n, gi);
                if (r >= 0) {
                        run->wrote = true;
                        rj = j ? mig_journal_step(j, run->plan->pci_address, s, s->gi_id, 0, 0) : 0;
                        if (rj < 0)
                                return rj;
                }
                break;

        case MIG_STEP_CREATE_GI: {
                nvmlGpuInstancePlacement_t pl = { .start = s->start, .size = s->size };

                r = gpu_nvml_device_create_gpu_instance_with_placement(n, run->device, s->profile_id, &pl, &gi);
                if (r >= 0) {
                        run->wrote = true;
                        r = gpu_nvml_gpu_instance_get_info(n, gi, &gi_info);
                }
                if (r >= 0) {
                        run->created[i] = gi_info.id;
                        run->gi_handles[i] = gi;
                        rj = j ? mig_journal_step(j, run->plan->pci_address, s, gi_info.id, 0, 0) : 0;
                        if (rj < 0)
                                return rj;
                }
                break;
        }

        case MIG_STEP_CREATE_CI: {
                unsigned gi_id = step_gi(run, s);

                /* The GI this process just created: its handle is at hand. */
                if (s->gi_step >= 0 && (size_t) s->gi_step < run->plan->n_steps && run->gi_handles[s->gi_step])
                        gi = run->gi_handles[s->gi_step];
                else
                        r = gpu_nvml_device_get_gpu_instance_by_id(n, run->device, gi_id, &gi);
                if (r >= 0)
                        r = gpu_nvml_gpu_instance_create_compute_instance(n, gi, s->profile_id, &ci);
                if (r >= 0) {
                        run->wrote = true;
                        r = gpu_nvml_compute_instance_get_info(n, ci, &ci_info);
                }
                if (r >= 0) {
                        run->created[i] = ci_info.id;
                        rj = j ? mig_journal_step(j, run->plan->pci_address, s, gi_id, ci_info.id, 0) : 0;
                        if (rj < 0)
                                return rj;
                }
                break;
        }

        case _MIG_STEP_KIND_MAX:
        case _MIG_STEP_KIND_INVALID:
                r = -EINVAL;
                break;
        }

        if (r < 0) {
                if (j)
                        (void) mig_journal_step(j, run->plan->pci_address, s, step_gi(run, s), s->ci_id, r);
                *ret_error = step_failed(n, run, s, gpu_nvml_last_error(n));
        }
        return r;
}

int mig_gpu_run_steps(GpuNvml *n, MigGpuRun *run, MigJournal *j, char **ret_error) {
        int r;

        while (run->next < run->plan->n_steps) {
                size_t i = run->next++;

                r = run_step(n, run, i, j, ret_error);
                if (r != 0)
                        return r;
        }
        return 0;
}

/* ---- the steps in an NVML worker ---- */

static void put_plan(struct WireBuf *out, const MigGpuPlan *p) {
        wire_put_u32(out, p->gpu);
        wire_put_str(out, p->pci_address);
        wire_put_u32(out, p->needs_reset);
        wire_put_u64(out, p->n_steps);
        for (size_t i = 0; i < p->n_steps; i++) {
                const MigStep *st = &p->steps[i];
                wire_put_i32(out, st->kind);
                wire_put_u32(out, st->enable);
                wire_put_u32(out, st->gi_id);
                wire_put_u32(out, st->ci_id);
                wire_put_u32(out, st->profile_id);
                wire_put_u32(out, st->start);
                wire_put_u32(out, st->size);
                wire_put_i32(out, st->gi_step);
                wire_put_str(out, st->profile);
        }
}

static int get_plan(WireReader *rd, MigGpuPlan *ret) {
        _cleanup_(mig_gpu_plan_done) MigGpuPlan p = {};
        _cleanup_free_ char *pci = NULL;
        uint64_t n;

        p.gpu = wire_get_u32(rd);
        pci = wire_get_str(rd);
        p.needs_reset = wire_get_u32(rd) != 0;
        n = wire_get_u64(rd);
        if (rd->bad || !pci || strlen(pci) >= sizeof p.pci_address || n > 4096)
                return -EBADMSG;
        strcpy(p.pci_address, pci);
        p.steps = calloc(n ?: 1, sizeof *p.steps);
        if (!p.steps)
                return -ENOMEM;
        for (; p.n_steps < n; p.n_steps++) {
                MigStep *st = &p.steps[p.n_steps];
                st->kind = (MigStepKind) wire_get_i32(rd);
                st->enable = wire_get_u32(rd);
                st->gi_id = wire_get_u32(rd);
                st->ci_id = wire_get_u32(rd);
                st->profile_id = wire_get_u32(rd);
                st->start = wire_get_u32(rd);
                st->size = wire_get_u32(rd);
                st->gi_step = wire_get_i32(rd);
                st->profile = wire_get_str(rd);
                if (rd->bad || st->kind < 0 || st->kind >= _MIG_STEP_KIND_MAX ||
                    st->gi_step < -1 || st->gi_step >= (int) n)
                        return -EBADMSG;
        }
        *ret = p;
        p = (MigGpuPlan) {};
        return 0;
}

static int ids_add(unsigned *ids, size_t *n, size_t max, unsigned id) {
        for (size_t i = 0; i < *n; i++)
                if (ids[i] == id)
                        return 0;
        if (*n >= max)
                return -E2BIG;
        ids[(*n)++] = id;
        return 0;
}

/* The GPU after the steps of plan: the GI profiles and CI profiles that known had or plan creates. */
static int read_layout_after(GpuNvml *n, const MigGpuState *known, const MigGpuPlan *plan, MigGpuState *ret,
                             char **ret_error) {
        unsigned gi_ids[64], ci_ids[64];
        size_t n_gi = 0, n_ci = 0;
        int r = 0;

        for (size_t i = 0; r >= 0 && i < known->n_gis; i++) {
                r = ids_add(gi_ids, &n_gi, ELEMENTSOF(gi_ids), known->gis[i].profile_id);
                for (size_t k = 0; r >= 0 && k < known->gis[i].n_cis; k++)
                        r = ids_add(ci_ids, &n_ci, ELEMENTSOF(ci_ids), known->gis[i].ci_profile_ids[k]);
        }
        for (size_t i = 0; r >= 0 && i < plan->n_steps; i++) {
                if (plan->steps[i].kind == MIG_STEP_CREATE_GI)
                        r = ids_add(gi_ids, &n_gi, ELEMENTSOF(gi_ids), plan->steps[i].profile_id);
                else if (plan->steps[i].kind == MIG_STEP_CREATE_CI)
                        r = ids_add(ci_ids, &n_ci, ELEMENTSOF(ci_ids), plan->steps[i].profile_id);
        }
        if (r < 0) /* more profiles than any GPU has: read it all */
                return mig_state_read_gpu(n, plan->pci_address, plan->gpu, ret, ret_error);
        r = mig_state_read_layout(n, known, gi_ids, n_gi, ci_ids, n_ci, ret, ret_error);
        if (r >= 0)
                ret->index = plan->gpu;
        return r;
}

/* The attribute suffix of a GI profile's MIG devices ("+me"), as the snapshot read names them. */
static const char *profile_suffix(const MigGpuState *now, unsigned gi_profile_id) {
        const MigGiProfile *p = mig_state_gi_profile(now, gi_profile_id);

        return p ? gpu_nvml_profile_suffix(p->index, p->name) : NULL;
}

/* The MIG devices of the GPU after steps that all succeeded, now being the layout they left (derived, not
 * read): per device only what the steps cannot know — its handle, its UUID, its GI id (and its CI id in a
 * GI of several CIs, or of CIs whose ids were not asked) —, its attributes once per (GI profile, CI
 * profile). The same MigDeviceInfo the snapshot read makes. -ENOENT when a device is not one of now's (the
 * caller reads the GPU instead). */
/* Attributes of a (GI profile, CI profile) that an earlier job of the apply read on a GPU of the same model
 * (name and memory size). */
static const MigDeviceInfo *seen_attributes(const MigGpuStepsJob *job, const MigGpuState *now, unsigned gi_profile_id,
                                            unsigned ci_profile_id) {
        for (size_t i = 0; job->seen && i < job->seen->n_gpus; i++) {
                const GpuInfo *g = &job->seen->gpus[i];
                const MigGpuState *b = mig_state_find(job->before, job->n_before, g->pci_address);

                if (!b || !streq_ptr(b->model, now->model) || !b->model)
                        continue;
                for (size_t k = 0; k < g->n_mig_devices; k++)
                        if (g->mig_devices[k].gi_profile_id == gi_profile_id &&
                            g->mig_devices[k].ci_profile_id == ci_profile_id && g->mig_devices[k].memory_mib > 0)
                                return &g->mig_devices[k];
        }
        return NULL;
}

static int read_mig_devices_after(GpuNvml *n, nvmlDevice_t d, const MigGpuStepsJob *job, const MigGpuState *now,
                                  NvmlSnapshot **ret) {
        uint64_t total_bytes = job->memory_total_bytes;
        _cleanup_(gpu_nvml_snapshot_freep) NvmlSnapshot *s = calloc(1, sizeof *s);
        struct {
                unsigned gi_profile_id, ci_profile_id;
                nvmlDeviceAttributes_t a;
        } seen[16];
        size_t n_seen = 0, n_cis = 0, found = 0;
        GpuInfo *g;
        int r;

        if (!s || !(s->gpus = calloc(1, sizeof *s->gpus)))
                return -ENOMEM;
        s->n_gpus = 1;
        g = &s->gpus[0];
        *g = (GpuInfo) { .cc_major = -1, .cc_minor = -1, .minor = -1,
                         .mig_current = now->mig_current ? GPU_MIG_ENABLED : GPU_MIG_DISABLED,
                         .mig_pending = now->mig_pending ? GPU_MIG_ENABLED : GPU_MIG_DISABLED };
        memcpy(g->pci_address, now->pci_address, sizeof g->pci_address);
        if (!now->mig_capable)
                return -EINVAL;
        for (size_t i = 0; i < now->n_gis; i++)
                n_cis += now->gis[i].n_cis;
        if (!now->mig_current || n_cis == 0) {
                *ret = TAKE_PTR(s);
                return 0;
        }
        g->mig_devices = calloc(n_cis, sizeof *g->mig_devices);
        if (!g->mig_devices)
                return -ENOMEM;

        for (unsigned idx = 0; found < n_cis && idx < 64; idx++) {
                char buf[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = "";
                MigDeviceInfo *m = &g->mig_devices[found];
                const MigGiState *gi = NULL;
                const nvmlDeviceAttributes_t *a = NULL;
                nvmlDevice_t md = NULL;
                size_t k = 0;

                r = gpu_nvml_device_get_mig_device_handle_by_index(n, d, idx, &md);
                if (r == -ENOENT)
                        continue;
                if (r < 0)
                        return r;
                *m = (MigDeviceInfo) { .index = idx };
                g->n_mig_devices = ++found;
                r = gpu_nvml_device_get_uuid(n, md, buf, sizeof buf);
                if (r < 0)
                        return r;
                if (!*buf)
                        return -ENOENT;
                m->uuid = strdup(buf);
                if (!m->uuid)
                        return -ENOMEM;
                r = gpu_nvml_device_get_gpu_instance_id(n, md, &m->gi_id);
                if (r < 0)
                        return r;
                for (size_t i = 0; !gi && i < now->n_gis; i++)
                        if (now->gis[i].id == m->gi_id)
                                gi = &now->gis[i];
                if (!gi || gi->n_cis == 0)
                        return -ENOENT;
                if (gi->n_cis == 1 && gi->ci_ids[0] != MIG_CI_ID_UNKNOWN)
                        m->ci_id = gi->ci_ids[0];
                else {
                        r = gpu_nvml_device_get_compute_instance_id(n, md, &m->ci_id);
                        if (r < 0)
                                return r;
                        for (k = 0; k < gi->n_cis && gi->ci_ids[k] != m->ci_id; k++)
                                ;
                        if (k == gi->n_cis) {
                                /* CIs kept from before, whose ids were not asked: one of them when all are of
                                 * one profile, else the caller reads the GPU. */
                                for (k = 0; k < gi->n_cis && gi->ci_ids[k] != MIG_CI_ID_UNKNOWN; k++)
                                        ;
                                if (k == gi->n_cis)
                                        return -ENOENT;
                                for (size_t q = 0; q < gi->n_cis; q++)
                                        if (gi->ci_ids[q] == MIG_CI_ID_UNKNOWN &&
                                            gi->ci_profile_ids[q] != gi->ci_profile_ids[k])
                                                return -ENOENT;
                        }
                }
                m->gi_profile_id = gi->profile_id;
                m->ci_profile_id = gi->ci_profile_ids[k];
                m->placement_start = gi->start;
                m->placement_size = gi->size;

                for (size_t q = 0; !a && q < n_seen; q++)
                        if (seen[q].gi_profile_id == m->gi_profile_id && seen[q].ci_profile_id == m->ci_profile_id)
                                a = &seen[q].a;
                const MigDeviceInfo *other = a ? NULL : seen_attributes(job, now, m->gi_profile_id, m->ci_profile_id);
                if (other && n_seen < ELEMENTSOF(seen)) {
                        /* Shown by another GPU of this model in this apply. */
                        seen[n_seen] = (typeof(seen[0])) { m->gi_profile_id, m->ci_profile_id, {
                                .multiprocessorCount = other->multiprocessors,
                                .sharedCopyEngineCount = other->copy_engines,
                                .sharedDecoderCount = other->decoders,
                                .sharedEncoderCount = other->encoders,
                                .sharedJpegCount = other->jpegs,
                                .sharedOfaCount = other->ofas,
                                .gpuInstanceSliceCount = other->gi_slices,
                                .computeInstanceSliceCount = other->ci_slices,
                                .memorySizeMB = other->memory_mib } };
                        a = &seen[n_seen++].a;
                }
                if (!a) {
                        if (n_seen >= ELEMENTSOF(seen))
                                return -ENOENT;
                        seen[n_seen] = (typeof(seen[0])) { m->gi_profile_id, m->ci_profile_id, {} };
                        r = gpu_nvml_device_get_attributes(n, md, &seen[n_seen].a);
                        if (r < 0)
                                return r;
                        a = &seen[n_seen++].a;
                }
                m->memory_mib = a->memorySizeMB;
                m->multiprocessors = a->multiprocessorCount;
                m->gi_slices = a->gpuInstanceSliceCount;
                m->ci_slices = a->computeInstanceSliceCount;
                m->copy_engines = a->sharedCopyEngineCount;
                m->decoders = a->sharedDecoderCount;
                m->encoders = a->sharedEncoderCount;
                m->jpegs = a->sharedJpegCount;
                m->ofas = a->sharedOfaCount;
                m->profile = gpu_mig_profile_name(m->gi_slices, m->ci_slices, m->memory_mib, total_bytes,
                                                  profile_suffix(now, m->gi_profile_id));
                if (!m->profile)
                        return -ENOENT; /* the snapshot read would warn: let it */
        }
        if (found != n_cis)
                return -ENOENT;
        qsort(g->mig_devices, g->n_mig_devices, sizeof *g->mig_devices, gpu_nvml_mig_device_compare);
        *ret = TAKE_PTR(s);
        return 0;
}

int mig_gpu_steps_job(GpuNvml *n, void *userdata, struct WireBuf *out, char **ret_error) {
        const MigGpuStepsJob *job = userdata;
        MigGpuRun run = *job->run; /* our copy of the daemon's run, at the fork */
        _cleanup_(mig_gpu_state_done) MigGpuState now = {};
        _cleanup_(mig_gpu_plan_done) MigGpuPlan rollback = {};
        _cleanup_free_ char *err = NULL, *summary = NULL, *rollback_error = NULL;
        _cleanup_(gpu_nvml_snapshot_freep) NvmlSnapshot *devices = NULL;
        bool derived = false;
        int r = 0, rr;

        if (job->journal && !job->read_only && !job->journal_open) {
                r = mig_journal_reopen(job->journal);
                if (r < 0) {
                        *ret_error = strprintf("GPU %u (%s): cannot open the MIG journal to record the change: %s",
                                               run.plan->gpu, run.plan->pci_address, strerror(-r));
                        return r;
                }
        }
        if (!job->read_only) {
                r = mig_state_device(n, run.plan->pci_address, &run.device);
                if (r < 0)
                        err = strprintf("GPU %u (%s): NVML does not answer for it: %s", run.plan->gpu,
                                        run.plan->pci_address, strerror(-r));
                else
                        r = mig_gpu_run_steps(n, &run, job->journal, &err);
        }

        /* What the GPU has now: for the result line, a halt record, and the plan back to the layout
         * before when the daemon asked for one (a failure it will roll back). With the GPU's state from
         * before the apply, only what these steps can have changed is read again. */
        if (job->derive && !job->read_only && r >= 0 && job->known && job->known->n_gi_profiles > 0 &&
            mig_state_after_steps(job->known, run.plan, run.next, run.created, r == MIG_GPU_RUN_NEEDS_RESET, &now) >= 0)
                /* Every step succeeded: NVML answered each write (a create with the new instance's id), so
                 * the layout is known without reading the GPU again. */
                rr = 0, derived = true;
        else if (job->known && job->known->n_gi_profiles > 0) /* a full read (a journal's record has no table) */
                rr = read_layout_after(n, job->known, run.plan, &now, &rollback_error);
        else
                rr = mig_state_read_gpu(n, run.plan->pci_address, run.plan->gpu, &now, &rollback_error);
        if (rr >= 0) {
                summary = mig_state_layout_summary(&now);
                if (job->restore_to && (r < 0 || job->read_only)) {
                        rr = mig_restore_plan(&now, job->restore_to, &rollback);
                        if (rr >= 0)
                                rr = 1;
                }
        } else if (!rollback_error)
                rollback_error = strdup(strerror(-rr));

        wire_put_i32(out, r);
        wire_put_str(out, err);
        wire_put_u64(out, run.next);
        wire_put_u32(out, run.wrote);
        wire_put_u32(out, run.mode_changed);
        wire_put_u64(out, run.plan->n_steps);
        for (size_t i = 0; i < run.plan->n_steps; i++)
                wire_put_u32(out, run.created[i]);
        wire_put_str(out, summary);
        wire_put_i32(out, rr);
        if (rr == 1)
                put_plan(out, &rollback);
        else
                wire_put_str(out, rr < 0 ? rollback_error : NULL);

        /* The steps are done: the new MIG devices for CDI and labels, while the handle is open. A failure
         * here costs nothing but the daemon's re-read of the GPU. */
        if (derived && r == 0 && job->memory_total_bytes > 0 &&
            read_mig_devices_after(n, run.device, job, &now, &devices) < 0)
                devices = gpu_nvml_snapshot_free(devices);
        wire_put_u32(out, !!devices);
        if (devices)
                wire_put_snapshot(out, devices);
        return 0;
}

int mig_gpu_steps_input(const MigGpuStepsJob *job, struct WireBuf *out) {
        const MigGpuRun *run = job->run;

        put_plan(out, run->plan);
        wire_put_u64(out, run->next);
        wire_put_u32(out, run->wrote);
        wire_put_u32(out, run->mode_changed);
        for (size_t i = 0; i < run->plan->n_steps; i++)
                wire_put_u32(out, run->created[i]);
        wire_put_str(out, mig_journal_path(job->journal));
        wire_put_u32(out, job->read_only);
        wire_put_u32(out, job->derive);
        wire_put_u64(out, job->memory_total_bytes);
        wire_put_u32(out, !!job->known);
        if (job->known)
                mig_wire_put_state(out, job->known);
        wire_put_u32(out, !!job->restore_to);
        if (job->restore_to)
                mig_wire_put_state(out, job->restore_to);
        /* The GPUs' models, for the attributes another GPU of the model showed; then those devices (a
         * snapshot on the wire is the last thing in its frame). */
        wire_put_u64(out, job->seen ? job->n_before : 0);
        for (size_t i = 0; job->seen && i < job->n_before; i++) {
                wire_put_str(out, job->before[i].pci_address);
                wire_put_str(out, job->before[i].model);
        }
        wire_put_u32(out, !!job->seen);
        if (job->seen)
                wire_put_snapshot(out, job->seen);
        return out->oom ? -ENOMEM : 0;
}

int mig_gpu_steps_read(GpuNvml *n, void *userdata, struct WireBuf *out, char **ret_error) {
        const GpuNvmlInput *in = userdata;
        WireReader rd = { .p = in->data, .left = in->len };
        _cleanup_(mig_gpu_plan_done) MigGpuPlan plan = {};
        _cleanup_(mig_gpu_state_done) MigGpuState known = {}, restore_to = {};
        _cleanup_(gpu_nvml_snapshot_freep) NvmlSnapshot *seen = NULL;
        _cleanup_(mig_journal_freep) MigJournal *journal = NULL;
        _cleanup_free_ char *journal_path = NULL;
        MigGpuState *before = NULL;
        size_t n_before = 0;
        MigGpuRun run = {};
        MigGpuStepsJob job = {};
        uint64_t count;
        int r;

        r = get_plan(&rd, &plan);
        if (r < 0)
                goto bad;
        r = mig_gpu_run_prepare(&plan, &run);
        if (r < 0)
                return r;
        run.next = (size_t) wire_get_u64(&rd);
        run.wrote = wire_get_u32(&rd) != 0;
        run.mode_changed = wire_get_u32(&rd) != 0;
        for (size_t i = 0; i < plan.n_steps; i++)
                run.created[i] = wire_get_u32(&rd);
        journal_path = wire_get_str(&rd);
        job.read_only = wire_get_u32(&rd) != 0;
        job.derive = wire_get_u32(&rd) != 0;
        job.memory_total_bytes = wire_get_u64(&rd);
        if (rd.bad || run.next > plan.n_steps)
                goto bad;
        if (wire_get_u32(&rd)) {
                if (mig_wire_get_state(&rd, &known) < 0)
                        goto bad;
                job.known = &known;
        }
        if (wire_get_u32(&rd)) {
                if (mig_wire_get_state(&rd, &restore_to) < 0)
                        goto bad;
                job.restore_to = &restore_to;
        }
        count = wire_get_u64(&rd);
        if (rd.bad || count > 4096)
                goto bad;
        before = calloc(count ?: 1, sizeof *before);
        if (!before) {
                r = -ENOMEM;
                goto done;
        }
        for (; n_before < count; n_before++) {
                _cleanup_free_ char *address = wire_get_str(&rd);
                if (rd.bad || !address || strlen(address) >= sizeof before[n_before].pci_address)
                        goto bad;
                strcpy(before[n_before].pci_address, address);
                before[n_before].model = wire_get_str(&rd);
        }
        if (wire_get_u32(&rd)) {
                if (wire_get_snapshot(&rd, &seen) < 0) /* checks that it ends the input */
                        goto bad;
                job.seen = seen;
        } else if (rd.bad || rd.left != 0)
                goto bad;
        job.before = before;
        job.n_before = n_before;

        if (journal_path && !job.read_only) {
                r = mig_journal_open_append(journal_path, &journal);
                if (r < 0) {
                        *ret_error = strprintf("GPU %u (%s): cannot open the MIG journal to record the change: %s",
                                               plan.gpu, plan.pci_address, strerror(-r));
                        goto done;
                }
                job.journal = journal;
                job.journal_open = true;
        }
        job.run = &run;
        n->progress_gpu = (int) plan.gpu;
        r = mig_gpu_steps_job(n, &job, out, ret_error);
        goto done;
bad:
        r = -EBADMSG;
        *ret_error = strdup("the MIG steps sent to the NVML worker are malformed");
done:
        mig_gpu_run_done(&run);
        mig_gpu_states_free(before, n_before);
        return r;
}

int mig_gpu_steps_job_result(MigGpuRun *run, const uint8_t *data, size_t len, MigGpuStepsAnswer *ret,
                             char **ret_error) {
        WireReader rd = { .p = data, .left = len };
        _cleanup_free_ char *err = NULL;
        uint64_t next, n_steps;
        bool wrote, mode_changed;
        int32_t r;

        *ret = (MigGpuStepsAnswer) {};
        r = wire_get_i32(&rd);
        err = wire_get_str(&rd);
        next = wire_get_u64(&rd);
        wrote = wire_get_u32(&rd) != 0;
        mode_changed = wire_get_u32(&rd) != 0;
        n_steps = wire_get_u64(&rd);
        if (rd.bad || n_steps != run->plan->n_steps || next > n_steps || next < run->next)
                goto bad;
        for (size_t i = 0; i < n_steps; i++)
                run->created[i] = wire_get_u32(&rd);
        ret->summary = wire_get_str(&rd);
        ret->rollback_r = wire_get_i32(&rd);
        if (ret->rollback_r == 1) {
                if (get_plan(&rd, &ret->rollback) < 0)
                        goto bad;
        } else
                ret->rollback_error = wire_get_str(&rd);
        if (wire_get_u32(&rd) && (wire_get_snapshot(&rd, &ret->devices) < 0 || ret->devices->n_gpus != 1))
                goto bad;
        if (rd.bad)
                goto bad;
        run->next = (size_t) next;
        run->wrote = run->wrote || wrote;
        run->mode_changed = run->mode_changed || mode_changed;
        if (r < 0)
                *ret_error = TAKE_PTR(err);
        return r;
bad:
        mig_gpu_steps_answer_done(ret);
        *ret_error = strprintf("GPU %u (%s): the NVML worker sent a malformed answer", run->plan->gpu,
                               run->plan->pci_address);
        return -EBADMSG;
}

void mig_gpu_steps_answer_done(MigGpuStepsAnswer *a) {
        if (!a)
                return;
        free(a->summary);
        free(a->rollback_error);
        gpu_nvml_snapshot_free(a->devices);
        mig_gpu_plan_done(&a->rollback);
        *a = (MigGpuStepsAnswer) {};
}

int mig_gpu_run_prepare(const MigGpuPlan *plan, MigGpuRun *ret) {
        MigGpuRun run = { .plan = plan };

        run.created = calloc(plan->n_steps ?: 1, sizeof *run.created);
        run.gi_handles = calloc(plan->n_steps ?: 1, sizeof *run.gi_handles);
        if (!run.created || !run.gi_handles) {
                free(run.created);
                free(run.gi_handles);
                return -ENOMEM;
        }
        *ret = run;
        return 0;
}

/* ---- back to a recorded layout ---- */

static int add_step(MigGpuPlan *p, MigStep s) {
        MigStep *l = realloc(p->steps, (p->n_steps + 1) * sizeof *l);
        if (!l)
                return -ENOMEM;
        p->steps = l;
        l[p->n_steps] = s;
        return (int) p->n_steps++;
}

static const MigGiState *find_gi(const MigGpuState *g, const MigGiState *like, const bool *used) {
        for (size_t i = 0; i < g->n_gis; i++)
                if (!used[i] && g->gis[i].profile_id == like->profile_id && g->gis[i].start == like->start)
                        return &g->gis[i];
        return NULL;
}

int mig_restore_plan(const MigGpuState *now, const MigGpuState *target, MigGpuPlan *ret) {
        _cleanup_(mig_gpu_plan_done) MigGpuPlan p = { .gpu = target->index };
        _cleanup_free_ bool *kept_now = calloc(now->n_gis + 1, sizeof(bool));
        _cleanup_free_ const MigGiState **match = calloc(target->n_gis + 1, sizeof(MigGiState *));
        int r;

        if (!kept_now || !match)
                return -ENOMEM;
        memcpy(p.pci_address, target->pci_address, sizeof p.pci_address);

        if (mig_state_layout_equal(now, target) && now->mig_pending == target->mig_current) {
                *ret = p;
                p = (MigGpuPlan) {};
                return 0;
        }

        /* GIs that are where they were, with the same CIs, stay. */
        if (now->mig_current && target->mig_current)
                for (size_t i = 0; i < target->n_gis; i++) {
                        const MigGiState *g = find_gi(now, &target->gis[i], kept_now);
                        if (!g)
                                continue;
                        MigGpuState one_now = { .mig_current = true, .gis = (MigGiState *) g, .n_gis = 1 };
                        MigGpuState one_target = { .mig_current = true, .gis = (MigGiState *) &target->gis[i], .n_gis = 1 };
                        if (!mig_state_layout_equal(&one_now, &one_target))
                                continue;
                        kept_now[g - now->gis] = true;
                        match[i] = g;
                }

        for (int pass = 0; now->mig_current && pass < 2; pass++)
                for (size_t i = 0; i < now->n_gis; i++) {
                        const MigGiState *g = &now->gis[i];
                        if (kept_now[i])
                                continue;
                        for (size_t k = 0; pass == 0 && k < g->n_cis; k++) {
                                r = add_step(&p, (MigStep) { .kind = MIG_STEP_DESTROY_CI, .gi_id = g->id,
                                                             .ci_id = g->ci_ids[k],
                                                             .profile_id = g->ci_profile_ids[k], .gi_step = -1 });
                                if (r < 0)
                                        return r;
                        }
                        if (pass == 1) {
                                r = add_step(&p, (MigStep) { .kind = MIG_STEP_DESTROY_GI, .gi_id = g->id, .gi_step = -1 });
                                if (r < 0)
                                        return r;
                        }
                }

        if (now->mig_current != target->mig_current || now->mig_pending != target->mig_current) {
                r = add_step(&p, (MigStep) { .kind = MIG_STEP_SET_MODE, .enable = target->mig_current, .gi_step = -1 });
                if (r >= 0)
                        r = add_step(&p, (MigStep) { .kind = MIG_STEP_RESET_GPU, .gi_step = -1 });
                if (r < 0)
                        return r;
                p.needs_reset = true;
        }

        if (!target->mig_current)
                goto done;

        for (size_t i = 0; i < target->n_gis; i++) {
                const MigGiState *t = &target->gis[i];
                int gi_step;

                if (match[i])
                        continue;
                gi_step = add_step(&p, (MigStep) { .kind = MIG_STEP_CREATE_GI, .profile_id = t->profile_id,
                                                   .start = t->start, .size = t->size, .gi_step = -1 });
                if (gi_step < 0)
                        return gi_step;
                for (size_t k = 0; k < t->n_cis; k++) {
                        r = add_step(&p, (MigStep) { .kind = MIG_STEP_CREATE_CI, .profile_id = t->ci_profile_ids[k],
                                                     .gi_step = gi_step });
                        if (r < 0)
                                return r;
                }
        }

done:
        *ret = p;
        p = (MigGpuPlan) {};
        return 0;
}
