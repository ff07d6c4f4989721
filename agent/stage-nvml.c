/* SPDX-License-Identifier: MIT */
/* Owns the nvml stage: brings NVML up when it can (the driver may load later than we start), reads the
 * snapshot the cdi and labels stages use, and publishes changes. NVML being unavailable is a normal,
 * reported state: the stage fails with the reason, the node is degraded, and the stage is retried with
 * backoff and on every pass (driver module events, Reconcile()). */
#include "bus.h"
#include "log.h"
#include "manager.h"
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

int stage_nvml_run(Manager *m, char **ret_message) {
        _cleanup_(nvml_snapshot_freep) NvmlSnapshot *snap = NULL;
        _cleanup_strv_free_ char **addresses = NULL;
        _cleanup_free_ char *error = NULL;
        int r;

        if (!m->inventory || m->inventory->n_gpus == 0) {
                nvml_publish(m, NULL);
                m->nvml = gpu_nvml_close(m->nvml);
                *ret_message = strdup("no NVIDIA GPU");
                return STAGE_SKIPPED;
        }

        if (!m->nvml) {
                r = gpu_nvml_open(m->config->nvml.library, &m->nvml, &error);
                if (r < 0) {
                        nvml_publish(m, NULL);
                        *ret_message = TAKE_PTR(error);
                        return r;
                }
                log_info("NVML initialised from %s.", m->config->nvml.library);
        }

        for (size_t i = 0; i < m->inventory->n_gpus; i++)
                if (strv_extend(&addresses, m->inventory->gpus[i].address) < 0)
                        return -ENOMEM;

        r = gpu_nvml_read(m->nvml, addresses, &snap, &error);
        if (r < 0) {
                /* Start from scratch next time: the driver may have been unloaded or reset. */
                m->nvml = gpu_nvml_close(m->nvml);
                nvml_publish(m, NULL);
                *ret_message = TAKE_PTR(error);
                return r;
        }

        if (!nvml_snapshot_equal(m->nvml_snapshot, snap))
                STRV_FOREACH(w, snap->warnings)
                        log_warning("%s", *w);
        *ret_message = nvml_summary(snap);
        nvml_publish(m, TAKE_PTR(snap));
        return STAGE_DONE;
}
