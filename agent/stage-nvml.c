/* SPDX-License-Identifier: MIT */
/* Owns the nvml stage: brings NVML up when it can (the driver may load later than we start), reads the
 * snapshot the cdi and labels stages use, and publishes changes. The NVML calls run in the worker
 * process (gpu-nvml-worker.h): the stage is RUNNING while it works, and a crash or a call that does not
 * return within nvml.timeout fails the stage with the call's name. NVML being unavailable is a normal,
 * reported state: the stage fails with the reason, the node is degraded, and the stage is retried with
 * backoff and on every pass (driver module events, Reconcile()). */
#include "bus.h"
#include "devices.h"
#include "driver-unload.h"
#include "gpu-nvml-worker.h"
#include "log.h"
#include "manager.h"
#include "mig-manager.h"
#include "strv.h"

static void nvml_publish(Manager *m, NvmlSnapshot *snap) {
        NvmlSnapshot *old = m->nvml_snapshot;

        if (nvml_snapshot_equal(old, snap)) {
                nvml_snapshot_free(snap);
                return;
        }
        m->nvml_snapshot = snap;
        manager_bus_nvml_changed(m, old);
        nvml_snapshot_free(old);
        /* The devices stage ran before this snapshot: MIG devices new in it get their nodes now. */
        manager_devices_sync_mig(m);
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

/* A MIG apply in flight holds the handle: it finishes (or rolls back) with it, and the next pass
 * reopens NVML. */
void manager_nvml_close(Manager *m) {
        if (m->mig && mig_manager_busy(m->mig))
                return;
        m->nvml = gpu_nvml_close(m->nvml);
}

void manager_nvml_stop(Manager *m, const char *why) {
        /* The stage waiting for the worker hears why, so that its pass goes on. */
        gpu_nvml_worker_abort(m->nvml_worker, -ECANCELED, why);
        m->nvml_worker = gpu_nvml_worker_free(m->nvml_worker);
        m->nvml = gpu_nvml_close(m->nvml);
}

/* Also the worker: its NVML handle keeps /dev/nvidia* open as well. */
static void nvml_stop_all(Manager *m) {
        m->nvml_worker = gpu_nvml_worker_free(m->nvml_worker);
        manager_nvml_close(m);
}

int manager_nvml_open_local(Manager *m, char **ret_error) {
        int r;

        *ret_error = NULL;
        if (m->nvml)
                return 0;
        if (!m->nvml_snapshot) {
                *ret_error = strdup("NVML is not available (see the nvml stage); the MIG layout cannot be read.");
                return -ENODEV;
        }
        /* The worker has just found the library answering; nvmlInit in this process is then as quick as
         * the driver allows. Only MIG reads use it (the writes run in NVML workers, which shut it down
         * before each fork; see docs/HACKING.md). */
        r = gpu_nvml_open(m->config->nvml.library, &m->nvml, ret_error);
        if (r < 0)
                return r;
        log_debug("NVML opened in the daemon for MIG management.");
        return 0;
}

static void on_snapshot(GpuNvmlWorker *worker, int r, NvmlSnapshot *snap, const char *error, void *userdata) {
        Manager *m = userdata;
        _cleanup_free_ char *summary = NULL;
        bool first = !m->nvml_snapshot;

        if (r < 0) {
                /* Start from scratch next time: the driver may have been unloaded or reset. */
                nvml_publish(m, NULL);
                manager_nvml_close(m);
                manager_stage_complete(m, STAGE_NVML, r, error);
                return;
        }
        if (!nvml_snapshot_equal(m->nvml_snapshot, snap))
                STRV_FOREACH(w, snap->warnings)
                        log_warning("%s", *w);
        if (first)
                log_info("NVML initialised from %s.", m->config->nvml.library);
        nvml_publish(m, snap);
        summary = nvml_summary(m->nvml_snapshot);
        manager_stage_complete(m, STAGE_NVML, STAGE_DONE, summary);
}

/* Once a second while the worker works: "nvmlInit_v2 for 3 s" in the Stages property and STATUS=. */
static void on_progress(GpuNvmlWorker *worker, const char *text, void *userdata) {
        manager_stage_progress(userdata, STAGE_NVML, text);
}

int stage_nvml_run(Manager *m, char **ret_message) {
        _cleanup_strv_free_ char **addresses = NULL;
        int r;

        if (!m->inventory || m->inventory->n_gpus == 0) {
                nvml_publish(m, NULL);
                nvml_stop_all(m);
                *ret_message = strdup("no NVIDIA GPU");
                return STAGE_SKIPPED;
        }

        /* Real NVML may call nvidia-modprobe and load the driver again behind the admin's back. */
        if (manager_driver_unload_held(m)) {
                nvml_publish(m, NULL);
                nvml_stop_all(m);
                *ret_message = strdup("the driver was unloaded with Unload(); Reconcile() or Reload() loads it again");
                return STAGE_SKIPPED;
        }

        for (size_t i = 0; i < m->inventory->n_gpus; i++)
                if (strv_extend(&addresses, m->inventory->gpus[i].address) < 0)
                        return -ENOMEM;

        if (!m->nvml_worker) {
                r = gpu_nvml_worker_new(m->event, &m->nvml_worker);
                if (r < 0)
                        return r;
                gpu_nvml_worker_set_progress(m->nvml_worker, on_progress, m);
        }
        /* A request still in flight belongs to an earlier pass: its answer would be as old as it. */
        gpu_nvml_worker_cancel(m->nvml_worker);
        /* A new worker is a fork: it must not inherit our own MIG handle initialised (its descriptors are
         * closed there). No apply uses that handle (theirs run in workers of their own). */
        if (gpu_nvml_worker_pid(m->nvml_worker) == 0)
                m->nvml = gpu_nvml_close(m->nvml);
        r = gpu_nvml_worker_snapshot(m->nvml_worker, m->config->nvml.library, addresses, m->config->nvml.timeout_usec,
                                     (unsigned) m->inventory->n_gpus, on_snapshot, m);
        if (r < 0) {
                *ret_message = strprintf("Cannot start the NVML worker: %s", strerror(-r));
                return r;
        }
        return STAGE_RUNNING;
}

/* After a MIG change, in this process (the writes ran in an NVML worker): the new layout for cdi and
 * labels. Still a synchronous read on the loop, see docs/HACKING.md. */
int manager_nvml_refresh(Manager *m, char **ret_error) {
        _cleanup_(nvml_snapshot_freep) NvmlSnapshot *snap = NULL;
        _cleanup_strv_free_ char **addresses = NULL;
        int r;

        *ret_error = NULL;
        /* An apply released the handle for its NVML worker (a fork must not inherit it initialised). */
        r = manager_nvml_open_local(m, ret_error);
        if (r < 0)
                return r;

        for (size_t i = 0; m->inventory && i < m->inventory->n_gpus; i++)
                if (strv_extend(&addresses, m->inventory->gpus[i].address) < 0)
                        return -ENOMEM;

        r = gpu_nvml_read(m->nvml, addresses, &snap, ret_error);
        if (r < 0) {
                /* Start from scratch next time: the driver may have been unloaded or reset. */
                manager_nvml_close(m);
                nvml_publish(m, NULL);
                return r;
        }

        if (!nvml_snapshot_equal(m->nvml_snapshot, snap))
                STRV_FOREACH(w, snap->warnings)
                        log_warning("%s", *w);
        nvml_publish(m, TAKE_PTR(snap));
        return 0;
}
