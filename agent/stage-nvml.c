/* SPDX-License-Identifier: MIT */
/* Owns the nvml stage: brings NVML up when it can (the driver may load later than we start), reads the
 * snapshot the cdi and labels stages use, and publishes changes. The NVML calls run in the worker
 * process (gpu-nvml-worker.h): the stage is RUNNING while it works, and a crash or a call that does not
 * return within nvml.timeout fails the stage with the call's name. NVML being unavailable is a normal,
 * reported state: the stage fails with the reason, the node is degraded, and the stage is retried with
 * backoff and on every pass (driver module events, Reconcile()). */
#include "devices.h"
#include "driver-unload.h"
#include "gpu-nvml-worker.h"
#include "log.h"
#include "mig-cache.h"
#include "mig-manager.h"
#include "stage-table.h"
#include "strv.h"

static void nvml_publish(Node *n, NvmlSnapshot *snap) {
        NvmlSnapshot *old = n->nvml_snapshot;

        if (gpu_nvml_snapshot_equal(old, snap)) {
                gpu_nvml_snapshot_free(snap);
                return;
        }
        n->nvml_snapshot = snap;
        node_nvml_changed(n, old);
        gpu_nvml_snapshot_free(old);
        /* The devices stage ran before this snapshot: MIG devices new in it get their nodes now. */
        stage_devices_sync_mig(n);
}

static char *nvml_summary(const NvmlSnapshot *s) {
        size_t mig_gpus = 0, mig_devices = 0;

        for (size_t i = 0; i < s->n_gpus; i++) {
                mig_gpus += s->gpus[i].mig_current == GPU_MIG_ENABLED;
                mig_devices += s->gpus[i].n_mig_devices;
        }
        return strprintf("driver %s, CUDA %d.%d, %zu GPU%s (%zu in MIG mode, %zu MIG device%s)",
                         strna(s->driver_version), s->cuda_version / 1000, (s->cuda_version % 1000) / 10,
                         s->n_gpus, s->n_gpus == 1 ? "" : "s", mig_gpus, mig_devices, mig_devices == 1 ? "" : "s");
}

void stage_nvml_stop(Node *n, const char *why) {
        /* The stage waiting for the worker hears why, so that its pass goes on; so does a MIG read. */
        gpu_nvml_worker_abort(n->nvml_worker, -ECANCELED, why);
        n->nvml_worker = gpu_nvml_worker_free(n->nvml_worker);
        gpu_nvml_worker_abort(n->nvml_reader, -ECANCELED, why);
        n->nvml_reader = gpu_nvml_worker_free(n->nvml_reader);
}

/* Both workers: their NVML handles keep /dev/nvidia* open. */
static void nvml_stop_all(Node *n) {
        stage_nvml_stop(n, "NVML is not in use any more");
}

static void on_snapshot(GpuNvmlWorker *worker, int r, NvmlSnapshot *snap, const char *error, void *userdata) {
        Node *n = userdata;
        _cleanup_free_ char *summary = NULL;
        bool first = !n->nvml_snapshot;

        if (r < 0) {
                /* Start from scratch next time: the driver may have been unloaded or reset. */
                nvml_publish(n, NULL);
                node_stage_complete(n, STAGE_NVML, r, error);
                return;
        }
        if (!gpu_nvml_snapshot_equal(n->nvml_snapshot, snap))
                STRV_FOREACH(w, snap->warnings)
                        log_warning("%s", *w);
        if (first)
                log_info("NVML initialised from %s.", n->config->nvml.library);
        nvml_publish(n, snap);
        summary = nvml_summary(n->nvml_snapshot);
        node_stage_complete(n, STAGE_NVML, STAGE_DONE, summary);
}

/* Once a second while the worker works: "nvmlInit_v2 for 3 s" in the Stages property and STATUS=. */
static void on_progress(GpuNvmlWorker *worker, const char *text, void *userdata) {
        node_stage_progress(userdata, STAGE_NVML, text);
}

int stage_nvml_run(Node *n, char **ret_message) {
        _cleanup_strv_free_ char **addresses = NULL;
        int r;

        if (!n->inventory || n->inventory->n_gpus == 0) {
                nvml_publish(n, NULL);
                nvml_stop_all(n);
                *ret_message = strdup("no NVIDIA GPU");
                return STAGE_SKIPPED;
        }

        /* Real NVML may call nvidia-modprobe and load the driver again behind the admin's back. */
        if (driver_unload_held(n)) {
                nvml_publish(n, NULL);
                nvml_stop_all(n);
                *ret_message = strdup("the driver was unloaded with Unload(); Reconcile() or Reload() loads it again");
                return STAGE_SKIPPED;
        }

        for (size_t i = 0; i < n->inventory->n_gpus; i++)
                if (strv_extend(&addresses, n->inventory->gpus[i].address) < 0)
                        return -ENOMEM;

        if (!n->nvml_worker) {
                r = gpu_nvml_worker_new(n->event, &n->nvml_worker);
                if (r < 0)
                        return r;
                gpu_nvml_worker_set_progress(n->nvml_worker, on_progress, n);
        }
        /* A request still in flight belongs to an earlier pass: its answer would be as old as it. */
        gpu_nvml_worker_cancel(n->nvml_worker);
        r = gpu_nvml_worker_snapshot(n->nvml_worker, n->config->nvml.library, addresses, n->config->nvml.timeout_usec,
                                     (unsigned) n->inventory->n_gpus, on_snapshot, n);
        if (r < 0) {
                *ret_message = strprintf("Cannot start the NVML worker: %s", strerror(-r));
                return r;
        }
        return STAGE_RUNNING;
}

/* ---- the MIG reader: NVML reads the MIG code needs, in a long-lived worker of its own ---- */

/* Runs in the MIG reader (a fork of the daemon) after it opened NVML: what this pass's snapshot and the PCI
 * inventory already say about each GPU is not asked again there — its identity (name, memory, PCI ids),
 * which the MIG reads need, and the static facts a re-read after a MIG change needs. Only when the
 * reader's NVML is the driver the snapshot was read from (same version; a reload stops the reader). */
static void reader_seed(GpuNvml *nvml, void *userdata) {
        Node *n = userdata;
        const NvmlSnapshot *s = n->nvml_snapshot;

        if (!s || !gpu_nvml_seed_system(nvml, s))
                return;
        for (size_t i = 0; i < s->n_gpus; i++) {
                const GpuInfo *g = &s->gpus[i];
                uint32_t pci_id = 0, subsystem_id = 0;

                for (size_t k = 0; n->inventory && k < n->inventory->n_gpus; k++) {
                        const PciDevice *p = &n->inventory->gpus[k];
                        if (!streq(p->address, g->pci_address))
                                continue;
                        pci_id = (uint32_t) p->device_id << 16 | p->vendor_id;
                        subsystem_id = (uint32_t) p->subsystem_device_id << 16 | p->subsystem_vendor_id;
                }
                if (gpu_nvml_seed_gpu(nvml, g, pci_id, subsystem_id) < 0)
                        return;
        }
        /* The GI profile tables of earlier reads in this boot, with this driver and these GPUs. */
        mig_profile_cache_seed(n->mig_profiles, nvml);
}

/* Before the MIG reader is forked (again): the profile tables it may take from the state directory. */
static void reader_load_profiles(Node *n) {
        _cleanup_free_ char *why = NULL;

        n->mig_profiles = mig_profile_cache_free(n->mig_profiles);
        if (mig_profile_cache_load(n->config->paths.state, n->config->paths.proc, n->nvml_snapshot, &n->mig_profiles,
                                   &why) < 0)
                log_oom();
        else if (why)
                log_info("Not using the MIG profile cache: %s; NVML is asked (and the cache written again).", why);
}

static int reader_get(Node *n, char **ret_error) {
        int r;

        if (!n->nvml_snapshot) {
                *ret_error = strdup("NVML is not available (see the nvml stage); the MIG layout cannot be read.");
                return -ENODEV;
        }
        /* A new reader would open /dev/nvidia* while the driver is taken out, and keep it. */
        if (node_driver_removing(n)) {
                *ret_error = strdup(NODE_DRIVER_REMOVING_MESSAGE);
                return -EBUSY;
        }
        if (!n->nvml_reader) {
                r = gpu_nvml_worker_new(n->event, &n->nvml_reader);
                if (r < 0)
                        return r;
                gpu_nvml_worker_set_seed(n->nvml_reader, reader_seed, n);
        }
        if (gpu_nvml_worker_busy(n->nvml_reader)) {
                *ret_error = strdup("A MIG read is already running; try again when it has finished.");
                return -EBUSY;
        }
        if (gpu_nvml_worker_pid(n->nvml_reader) == 0)
                reader_load_profiles(n); /* the request forks a new reader */
        return 0;
}

static int gpu_addresses(Node *n, char ***ret) {
        _cleanup_strv_free_ char **l = NULL;

        for (size_t i = 0; n->inventory && i < n->inventory->n_gpus; i++)
                if (strv_extend(&l, n->inventory->gpus[i].address) < 0)
                        return -ENOMEM;
        if (!l && !(l = calloc(1, sizeof(char *))))
                return -ENOMEM;
        *ret = TAKE_PTR(l);
        return 0;
}

int stage_nvml_read_async(Node *n, char *const *addresses, GpuNvmlJobFunc fn, GpuNvmlJobDone done,
                            void *userdata, char **ret_error) {
        int r;

        *ret_error = NULL;
        r = reader_get(n, ret_error);
        if (r < 0)
                return r;
        r = gpu_nvml_worker_read(n->nvml_reader, n->config->nvml.library, addresses, n->config->nvml.timeout_usec,
                                 n->inventory ? (unsigned) n->inventory->n_gpus : 1, fn, done, userdata);
        if (r < 0)
                *ret_error = strprintf("Cannot start the NVML worker for the MIG read: %s", strerror(-r));
        return r;
}

int stage_nvml_read_input_async(Node *n, const void *input, size_t len, GpuNvmlJobFunc fn, GpuNvmlJobDone done,
                                  void *userdata, char **ret_error) {
        int r;

        *ret_error = NULL;
        r = reader_get(n, ret_error);
        if (r < 0)
                return r;
        r = gpu_nvml_worker_read_input(n->nvml_reader, n->config->nvml.library, input, len,
                                       n->config->nvml.timeout_usec, n->inventory ? (unsigned) n->inventory->n_gpus : 1,
                                       fn, done, userdata);
        if (r < 0)
                *ret_error = strprintf("Cannot start the NVML worker for the MIG change: %s", strerror(-r));
        return r;
}

/* A deep copy of a snapshot, through its wire encoding (one definition of what a snapshot holds). NULL on
 * OOM. */
static NvmlSnapshot *snapshot_copy(const NvmlSnapshot *s) {
        _cleanup_(wire_buf_done) WireBuf b = {};
        NvmlSnapshot *copy = NULL;
        WireReader rd;

        wire_put_snapshot(&b, s);
        if (b.oom)
                return NULL;
        rd = (WireReader) { .p = b.data, .left = b.len };
        if (wire_get_snapshot(&rd, &copy) < 0)
                return NULL;
        return copy;
}

/* The published snapshot with the GPUs of fresh (a read of some of them) replaced; fresh is taken. The
 * GPUs keep the NVML index the full read gave them (a read of a few numbers them from 0 where the driver
 * has no nvmlDeviceGetIndex). NULL on OOM. */
static NvmlSnapshot *snapshot_merge(const NvmlSnapshot *old, NvmlSnapshot *fresh) {
        _cleanup_(gpu_nvml_snapshot_freep) NvmlSnapshot *in = fresh, *copy = snapshot_copy(old);

        if (!copy)
                return NULL;
        for (size_t i = 0; i < in->n_gpus; i++)
                for (size_t k = 0; k < copy->n_gpus; k++) {
                        if (!streq(copy->gpus[k].pci_address, in->gpus[i].pci_address))
                                continue;
                        in->gpus[i].nvml_index = copy->gpus[k].nvml_index;
                        gpu_info_done(&copy->gpus[k]);
                        copy->gpus[k] = in->gpus[i];
                        in->gpus[i] = (GpuInfo) {};
                        break;
                }
        STRV_FOREACH(w, in->warnings)
                if (strv_extend(&copy->warnings, *w) < 0)
                        return NULL;
        return TAKE_PTR(copy);
}

static void on_refreshed(GpuNvmlWorker *w, int r, NvmlSnapshot *snap, const char *error, void *userdata) {
        Node *n = userdata;
        StageNvmlRefreshDone cb = TAKE_PTR(n->refresh_cb);
        void *ud = TAKE_PTR(n->refresh_userdata);

        if (r >= 0 && n->nvml_snapshot) {
                snap = snapshot_merge(n->nvml_snapshot, snap);
                if (!snap) {
                        r = -ENOMEM;
                        error = "Out of memory.";
                }
        }
        if (r < 0)
                /* Start from scratch: the driver may have been unloaded or reset. The next nvml stage reads. */
                nvml_publish(n, NULL);
        else {
                if (!gpu_nvml_snapshot_equal(n->nvml_snapshot, snap))
                        STRV_FOREACH(warning, snap->warnings)
                                log_warning("%s", *warning);
                nvml_publish(n, snap);
        }
        if (cb)
                cb(n, r, error, ud);
}

/* The published snapshot with the MIG mode and devices of the GPUs in fresh replaced (taken from fresh).
 * NULL on OOM, or when a GPU of fresh is not in it. */
static NvmlSnapshot *snapshot_with_mig(const NvmlSnapshot *old, NvmlSnapshot *fresh) {
        _cleanup_(gpu_nvml_snapshot_freep) NvmlSnapshot *copy = snapshot_copy(old);

        if (!copy)
                return NULL;
        for (size_t i = 0; i < fresh->n_gpus; i++) {
                GpuInfo *in = &fresh->gpus[i], *g = NULL;

                for (size_t k = 0; !g && k < copy->n_gpus; k++)
                        if (streq(copy->gpus[k].pci_address, in->pci_address))
                                g = &copy->gpus[k];
                if (!g)
                        return NULL;
                g->mig_current = in->mig_current;
                g->mig_pending = in->mig_pending;
                for (size_t k = 0; k < g->n_mig_devices; k++)
                        gpu_nvml_mig_device_done(&g->mig_devices[k]);
                free(g->mig_devices);
                g->mig_devices = TAKE_PTR(in->mig_devices);
                g->n_mig_devices = in->n_mig_devices;
                in->n_mig_devices = 0;
        }
        return TAKE_PTR(copy);
}

int stage_nvml_refresh_async(Node *n, char *const *pci_addresses, const NvmlSnapshot *mig_devices,
                               StageNvmlRefreshDone cb, void *userdata, char **ret_error) {
        _cleanup_strv_free_ char **addresses = NULL;
        int r;

        *ret_error = NULL;
        if (mig_devices && n->nvml_snapshot && !n->refresh_cb) {
                /* Read by the apply's own jobs, after their steps: nothing to ask NVML again. A copy of
                 * theirs, so that the caller's stays whole. */
                _cleanup_(gpu_nvml_snapshot_freep) NvmlSnapshot *fresh = snapshot_copy(mig_devices);
                NvmlSnapshot *snap = NULL;

                if (fresh)
                        snap = snapshot_with_mig(n->nvml_snapshot, fresh);
                if (snap) {
                        nvml_publish(n, snap);
                        cb(n, 0, NULL, userdata);
                        return 0;
                }
                /* Out of memory, or a GPU the snapshot lacks: read as before. */
        }
        r = reader_get(n, ret_error);
        if (r < 0)
                return r;
        if (pci_addresses && *pci_addresses)
                addresses = strv_copy(pci_addresses);
        else
                r = gpu_addresses(n, &addresses);
        if (r < 0 || !addresses)
                return -ENOMEM;
        r = gpu_nvml_worker_snapshot(n->nvml_reader, n->config->nvml.library, addresses, n->config->nvml.timeout_usec,
                                     (unsigned) strv_length(addresses), on_refreshed, n);
        if (r < 0) {
                *ret_error = strprintf("Cannot start the NVML worker to re-read NVML: %s", strerror(-r));
                return r;
        }
        n->refresh_cb = cb;
        n->refresh_userdata = userdata;
        return 0;
}
