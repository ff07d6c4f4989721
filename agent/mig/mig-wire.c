/* SPDX-License-Identifier: MIT */
/* Owns MigGpuState on the NVML worker's wire (gpu-nvml-worker.h's frames): the "read the MIG state of
 * these GPUs" job that runs in a worker, and its answer decoded in the daemon. Bounds checked: a
 * malformed answer is -EBADMSG, never a crash. Library code: no logging. */
#include <stdlib.h>
#include <string.h>

#include "gpu-nvml-worker.h"
#include "mig-state.h"
#include "mig-wire.h"
#include "strv.h"

#define WIRE_MAX_ITEMS 4096u

static void put_u32s(WireBuf *b, const unsigned *v, size_t n) {
        wire_put_u64(b, n);
        for (size_t i = 0; i < n; i++)
                wire_put_u32(b, v[i]);
}

static int get_u32s(WireReader *rd, unsigned **ret, size_t *ret_n) {
        uint64_t n = wire_get_u64(rd);
        unsigned *v;

        if (rd->bad || n > WIRE_MAX_ITEMS)
                return -EBADMSG;
        v = calloc(n ?: 1, sizeof *v);
        if (!v)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++)
                v[i] = wire_get_u32(rd);
        *ret = v;
        *ret_n = (size_t) n;
        return rd->bad ? -EBADMSG : 0;
}

void mig_wire_put_state(WireBuf *b, const MigGpuState *g) {
        wire_put_u32(b, g->index);
        wire_put_str(b, g->pci_address);
        wire_put_str(b, g->model);
        wire_put_u32(b, g->pci_id);
        wire_put_u32(b, g->subsystem_id);
        wire_put_u32(b, (g->mig_capable ? 1u : 0) | (g->mig_current ? 2u : 0) | (g->mig_pending ? 4u : 0) |
                        (g->busy ? 8u : 0));
        wire_put_u64(b, g->n_gi_profiles);
        for (size_t i = 0; i < g->n_gi_profiles; i++) {
                const MigGiProfile *p = &g->gi_profiles[i];
                wire_put_u32(b, p->index);
                wire_put_u32(b, p->id);
                wire_put_str(b, p->name);
                wire_put_u32(b, p->slices);
                wire_put_u32(b, p->memory_slices);
                wire_put_u32(b, p->instance_count);
                put_u32s(b, p->starts, p->n_starts);
                wire_put_u64(b, p->n_ci_profiles);
                for (size_t k = 0; k < p->n_ci_profiles; k++) {
                        wire_put_u32(b, p->ci_profiles[k].index);
                        wire_put_u32(b, p->ci_profiles[k].id);
                        wire_put_u32(b, p->ci_profiles[k].slices);
                        wire_put_u32(b, p->ci_profiles[k].instance_count);
                }
        }
        wire_put_u32(b, g->gi_profiles_partial);
        wire_put_u64(b, g->gi_profiles_asked);
        wire_put_u32(b, g->gi_profiles_end);
        wire_put_u64(b, g->n_gis);
        for (size_t i = 0; i < g->n_gis; i++) {
                const MigGiState *gi = &g->gis[i];
                wire_put_u32(b, gi->id);
                wire_put_u32(b, gi->profile_id);
                wire_put_u32(b, gi->start);
                wire_put_u32(b, gi->size);
                put_u32s(b, gi->ci_ids, gi->n_cis);
                put_u32s(b, gi->ci_profile_ids, gi->n_cis);
        }
}

int mig_wire_get_state(WireReader *rd, MigGpuState *g) {
        _cleanup_free_ char *pci = NULL;
        uint32_t flags;
        uint64_t n;
        size_t n_ids;
        int r;

        g->index = wire_get_u32(rd);
        pci = wire_get_str(rd);
        if (rd->bad || !pci || strlen(pci) >= sizeof g->pci_address)
                return -EBADMSG;
        strcpy(g->pci_address, pci);
        g->model = wire_get_str(rd);
        g->pci_id = wire_get_u32(rd);
        g->subsystem_id = wire_get_u32(rd);
        flags = wire_get_u32(rd);
        g->mig_capable = flags & 1;
        g->mig_current = flags & 2;
        g->mig_pending = flags & 4;
        g->busy = flags & 8;

        n = wire_get_u64(rd);
        if (rd->bad || n > WIRE_MAX_ITEMS || !(g->gi_profiles = calloc(n ?: 1, sizeof *g->gi_profiles)))
                return rd->bad || n > WIRE_MAX_ITEMS ? -EBADMSG : -ENOMEM;
        for (; g->n_gi_profiles < n; g->n_gi_profiles++) {
                MigGiProfile *p = &g->gi_profiles[g->n_gi_profiles];
                uint64_t m;

                p->index = wire_get_u32(rd);
                p->id = wire_get_u32(rd);
                p->name = wire_get_str(rd);
                p->slices = wire_get_u32(rd);
                p->memory_slices = wire_get_u32(rd);
                p->instance_count = wire_get_u32(rd);
                r = get_u32s(rd, &p->starts, &p->n_starts);
                if (r < 0)
                        return r;
                m = wire_get_u64(rd);
                if (rd->bad || m > WIRE_MAX_ITEMS || !(p->ci_profiles = calloc(m ?: 1, sizeof *p->ci_profiles)))
                        return rd->bad || m > WIRE_MAX_ITEMS ? -EBADMSG : -ENOMEM;
                for (; p->n_ci_profiles < m; p->n_ci_profiles++) {
                        MigCiProfile *c = &p->ci_profiles[p->n_ci_profiles];
                        c->index = wire_get_u32(rd);
                        c->id = wire_get_u32(rd);
                        c->slices = wire_get_u32(rd);
                        c->instance_count = wire_get_u32(rd);
                }
        }

        g->gi_profiles_partial = wire_get_u32(rd) != 0;
        g->gi_profiles_asked = wire_get_u64(rd);
        g->gi_profiles_end = wire_get_u32(rd);

        n = wire_get_u64(rd);
        if (rd->bad || n > WIRE_MAX_ITEMS || !(g->gis = calloc(n ?: 1, sizeof *g->gis)))
                return rd->bad || n > WIRE_MAX_ITEMS ? -EBADMSG : -ENOMEM;
        for (; g->n_gis < n; g->n_gis++) {
                MigGiState *gi = &g->gis[g->n_gis];

                gi->id = wire_get_u32(rd);
                gi->profile_id = wire_get_u32(rd);
                gi->start = wire_get_u32(rd);
                gi->size = wire_get_u32(rd);
                r = get_u32s(rd, &gi->ci_ids, &gi->n_cis);
                if (r < 0)
                        return r;
                r = get_u32s(rd, &gi->ci_profile_ids, &n_ids);
                if (r < 0)
                        return r;
                if (n_ids != gi->n_cis)
                        return -EBADMSG;
        }
        return rd->bad ? -EBADMSG : 0;
}

/* Writes the states (count, then each) and frees them. */
static void put_states(WireBuf *out, MigGpuState *states, size_t n_states) {
        wire_put_u64(out, n_states);
        for (size_t i = 0; i < n_states; i++)
                mig_wire_put_state(out, &states[i]);
        mig_gpu_states_free(states, n_states);
}

int mig_states_job(GpuNvml *n, void *userdata, struct WireBuf *out, char **ret_error) {
        char *const *addresses = userdata;
        MigGpuState *states = NULL;
        size_t n_states = 0;
        int r;

        r = mig_state_read(n, addresses, &states, &n_states, ret_error);
        if (r < 0)
                return r;
        put_states(out, states, n_states);
        return 0;
}

void mig_states_for_input(struct WireBuf *b, char *const *pci_addresses, char *const *wanted) {
        wire_put_u32(b, !!pci_addresses);
        wire_put_u64(b, strv_length(pci_addresses));
        STRV_FOREACH(a, pci_addresses)
                wire_put_str(b, *a);
        wire_put_u64(b, strv_length(wanted));
        STRV_FOREACH(w, wanted)
                wire_put_str(b, *w);
}

static int get_strv(WireReader *rd, char ***ret) {
        _cleanup_strv_free_ char **l = NULL;
        uint64_t n = wire_get_u64(rd);

        if (rd->bad || n > WIRE_MAX_ITEMS)
                return -EBADMSG;
        for (uint64_t i = 0; i < n; i++) {
                char *v = wire_get_str(rd);

                if (rd->bad || !v) {
                        free(v);
                        return -EBADMSG;
                }
                if (strv_consume(&l, v) < 0)
                        return -ENOMEM;
        }
        *ret = TAKE_PTR(l);
        return 0;
}

int mig_states_for_job(GpuNvml *n, void *userdata, struct WireBuf *out, char **ret_error) {
        const GpuNvmlInput *in = userdata;
        WireReader rd = { .p = in->data, .left = in->len };
        _cleanup_strv_free_ char **addresses = NULL, **wanted = NULL;
        MigGpuState *states = NULL;
        size_t n_states = 0;
        bool all = wire_get_u32(&rd) == 0;
        int r;

        r = get_strv(&rd, &addresses);
        if (r >= 0)
                r = get_strv(&rd, &wanted);
        if (r >= 0 && !all && !addresses && !(addresses = calloc(1, sizeof(char *))))
                return -ENOMEM;
        if (r < 0) {
                *ret_error = strdup("malformed input for the MIG read");
                return r;
        }
        /* No names: the whole table (a config that asks for no MIG device still needs the largest). */
        if (!wanted && !(wanted = calloc(1, sizeof(char *))))
                return -ENOMEM;
        r = mig_state_read_for(n, all ? NULL : addresses, wanted, &states, &n_states, ret_error);
        if (r < 0)
                return r;
        put_states(out, states, n_states);
        return 0;
}

int mig_states_job_result(const uint8_t *data, size_t len, MigGpuState **ret, size_t *ret_n) {
        WireReader rd = { .p = data, .left = len };
        MigGpuState *states;
        uint64_t n;
        size_t k = 0;
        int r = 0;

        n = wire_get_u64(&rd);
        if (rd.bad || n > WIRE_MAX_ITEMS)
                return -EBADMSG;
        states = calloc(n ?: 1, sizeof *states);
        if (!states)
                return -ENOMEM;
        for (; r >= 0 && k < n; k++)
                r = mig_wire_get_state(&rd, &states[k]);
        if (r < 0) {
                mig_gpu_states_free(states, k);
                return r;
        }
        *ret = states;
        *ret_n = (size_t) n;
        return 0;
}

int mig_busy_job(GpuNvml *n, void *userdata, struct WireBuf *out, char **ret_error) {
        char *const *addresses = userdata;
        size_t count = strv_length(addresses);
        int progress_gpu = n->progress_gpu;

        wire_put_u64(out, count);
        for (size_t i = 0; i < count; i++) {
                nvmlDevice_t d;
                unsigned procs = 0;
                int r;

                n->progress_gpu = (int) i;
                r = mig_state_device(n, addresses[i], &d);
                if (r >= 0)
                        r = mig_state_processes(n, d, &procs);
                n->progress_gpu = progress_gpu;
                if (r == -ENODEV)
                        procs = 0;
                else if (r < 0) {
                        *ret_error = strprintf("Cannot count the compute processes on GPU %s: %s", addresses[i],
                                               gpu_nvml_last_error(n));
                        return r;
                }
                wire_put_u32(out, procs);
        }
        return 0;
}

int mig_busy_job_result(const uint8_t *data, size_t len, size_t n_expected, unsigned **ret) {
        WireReader rd = { .p = data, .left = len };
        _cleanup_free_ unsigned *procs = NULL;
        uint64_t n = wire_get_u64(&rd);

        if (rd.bad || n != n_expected)
                return -EBADMSG;
        procs = calloc(n ?: 1, sizeof *procs);
        if (!procs)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++)
                procs[i] = wire_get_u32(&rd);
        if (rd.bad || rd.left != 0)
                return -EBADMSG;
        *ret = TAKE_PTR(procs);
        return 0;
}
