/* SPDX-License-Identifier: MIT */
/* Owns rendering and writing the node_exporter textfile (see metrics.h). Metric names and labels follow
 * dcgm-exporter (etc/default-counters.csv and its text template: gpu, UUID, pci_bus_id, device,
 * modelName, Hostname; GPU_I_PROFILE and GPU_I_ID on MIG series), so dashboards built for it read ours.
 * The values are what the agent knows without polling: DCGM_FI_DEV_XID_ERRORS (the last XID, 0 none)
 * and the ECC counters come from the NVML events the health worker saw since the agent started (DCGM's
 * VOL counters count since the driver loaded), the remapped-row series from the last health check. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "build-config.h"
#include "escape.h"
#include "fileio.h"
#include "health.h"
#include "log.h"
#include "node.h"
#include "metrics.h"
#include "strv.h"

struct Metrics {
        char *written;              /* the text last written, NULL none */
        char *written_path;
        int last_error;             /* the errno of the last failed write, logged once */
        uint64_t mig_applies[3];    /* success, rebooting, failed */
        uint64_t mig_apply_changes;
        uint64_t dkms_build_usec, dkms_started_usec;
        bool dkms_known, dkms_ok;
};

int metrics_new(Metrics **ret) {
        Metrics *x = calloc(1, sizeof *x);
        if (!x)
                return -ENOMEM;
        *ret = x;
        return 0;
}

Metrics *metrics_free(Metrics *x) {
        if (!x)
                return NULL;
        free(x->written);
        free(x->written_path);
        free(x);
        return NULL;
}

void metrics_count_mig_apply(Node *n, const char *state, bool changed) {
        static const char *const states[] = { "success", "rebooting", "failed" };
        for (size_t i = 0; i < ELEMENTSOF(states); i++)
                if (streq_ptr(state, states[i]))
                        n->metrics->mig_applies[i]++;
        if (changed)
                n->metrics->mig_apply_changes++;
        metrics_update(n);
}

void metrics_dkms_started(Node *n) {
        (void) sd_event_now(n->event, CLOCK_MONOTONIC, &n->metrics->dkms_started_usec);
}

void metrics_dkms_finished(Node *n, bool ok) {
        uint64_t now = 0;

        (void) sd_event_now(n->event, CLOCK_MONOTONIC, &now);
        if (n->metrics->dkms_started_usec == 0 || now < n->metrics->dkms_started_usec)
                return;
        n->metrics->dkms_build_usec = now - n->metrics->dkms_started_usec;
        n->metrics->dkms_started_usec = 0;
        n->metrics->dkms_known = true;
        n->metrics->dkms_ok = ok;
        metrics_update(n);
}

void metrics_put_label_value(FILE *f, const char *v) {
        /* The format is UTF-8: a byte of NVML's that is not becomes U+FFFD (the parsers reject the file). */
        _cleanup_free_ char *valid = v && !utf8_is_valid(v) ? utf8_make_valid(v) : NULL;

        for (const char *p = valid ?: v ?: ""; *p; p++)
                if (*p == '\\' || *p == '"')
                        fprintf(f, "\\%c", *p);
                else if (*p == '\n')
                        fputs("\\n", f);
                else
                        fputc(*p, f);
}
#define put_value metrics_put_label_value

static void header(FILE *f, const char *name, const char *type, const char *help) {
        fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* dcgm-exporter's labels for a GPU: gpu (NVML index), UUID, pci_bus_id (NVML's spelling), device
 * (nvidia<minor>), modelName, Hostname. */
static void gpu_labels(FILE *f, const GpuInfo *g, const char *host) {
        unsigned domain = 0, bus = 0, dev = 0, fn = 0;
        char bus_id[32] = "";

        if (sscanf(g->pci_address, "%x:%x:%x.%x", &domain, &bus, &dev, &fn) == 4)
                snprintf(bus_id, sizeof bus_id, "%08X:%02X:%02X.%X", domain, bus, dev, fn);
        fprintf(f, "gpu=\"%u\",UUID=\"", g->nvml_index);
        put_value(f, g->uuid);
        fprintf(f, "\",pci_bus_id=\"%s\",device=\"", bus_id);
        if (g->minor >= 0)
                fprintf(f, "nvidia%d", g->minor);
        fputs("\",modelName=\"", f);
        put_value(f, g->name);
        fputs("\",Hostname=\"", f);
        put_value(f, host);
        fputc('"', f);
}

/* dcgm-exporter's (3.3.6 on) labels of DCGM_FI_DEV_XID_ERRORS: err_code, the value as a string, and
 * err_msg, what the XID means (none for 0); the text is health-xid.c's, not dcgm-exporter's. */
static void xid_labels(FILE *f, unsigned xid) {
        const char *text = NULL;

        fprintf(f, ",err_code=\"%u\"", xid);
        (void) health_xid_classify(xid, NULL, NULL, &text);
        if (xid != 0 && text) {
                fputs(",err_msg=\"", f);
                put_value(f, text);
                fputc('"', f);
        }
}

typedef enum GpuSeries {
        SERIES_XID,
        SERIES_SBE,
        SERIES_DBE,
        SERIES_REMAP_CORR,
        SERIES_REMAP_UNC,
        SERIES_REMAP_FAILURE,
        SERIES_XID_COUNT,
} GpuSeries;

static void gpu_family(FILE *f, const Node *n, const char *host, const char *name, const char *type,
                       const char *help, GpuSeries which) {
        const NvmlSnapshot *s = n->nvml_snapshot;
        bool any = false;

        for (size_t i = 0; s && i < s->n_gpus; i++) {
                HealthCounters c;
                uint64_t v = 0;

                if (health_gpu_counters(n->health, s->gpus[i].pci_address, &c) < 0)
                        continue;
                switch (which) {
                case SERIES_XID: v = c.last_xid; break;
                case SERIES_SBE: v = c.sbe; break;
                case SERIES_DBE: v = c.dbe; break;
                case SERIES_REMAP_CORR: v = c.remap_correctable; break;
                case SERIES_REMAP_UNC: v = c.remap_uncorrectable; break;
                case SERIES_REMAP_FAILURE: v = c.remap_failure; break;
                case SERIES_XID_COUNT: v = c.xids; break;
                }
                if (which >= SERIES_REMAP_CORR && which <= SERIES_REMAP_FAILURE && !c.remap_known)
                        continue;
                if (!any)
                        header(f, name, type, help);
                any = true;
                fprintf(f, "%s{", name);
                gpu_labels(f, &s->gpus[i], host);
                if (which == SERIES_XID)
                        xid_labels(f, c.last_xid);
                fprintf(f, "} %" PRIu64 "\n", v);
        }
}

int metrics_format(const Node *n, char **ret) {
        _cleanup_free_ char *buf = NULL;
        size_t size = 0;
        char host[256] = "";
        FILE *f = open_memstream(&buf, &size);

        if (!f)
                return -ENOMEM;
        (void) gethostname(host, sizeof host - 1);
        const NvmlSnapshot *s = n->nvml_snapshot;

        /* DCGM exporter–compatible fields. */
        gpu_family(f, n, host, "DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.",
                   SERIES_XID);
        gpu_family(f, n, host, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter",
                   "Total number of single-bit volatile ECC errors (events seen since the agent started).",
                   SERIES_SBE);
        gpu_family(f, n, host, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter",
                   "Total number of double-bit volatile ECC errors (events seen since the agent started).",
                   SERIES_DBE);
        gpu_family(f, n, host, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
                   "Number of remapped rows for correctable errors", SERIES_REMAP_CORR);
        gpu_family(f, n, host, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
                   "Number of remapped rows for uncorrectable errors", SERIES_REMAP_UNC);
        gpu_family(f, n, host, "DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed",
                   SERIES_REMAP_FAILURE);

        /* Ours. */
        header(f, "gpu_node_agent_info", "gauge", "The agent's version and the driver NVML reports (always 1).");
        fputs("gpu_node_agent_info{version=\"", f);
        put_value(f, GPU_NODE_AGENT_VERSION);
        fputs("\",driver_version=\"", f);
        put_value(f, s ? s->driver_version : "");
        fputs("\",Hostname=\"", f);
        put_value(f, host);
        fputs("\"} 1\n", f);

        header(f, "gpu_node_agent_node_state", "gauge", "1 for the node's state (the State property), 0 for the others.");
        for (int i = 0; i < _AGENT_STATE_MAX; i++)
                fprintf(f, "gpu_node_agent_node_state{state=\"%s\"} %d\n", agent_state_to_string(i), n->state == i);

        header(f, "gpu_node_agent_passes_total", "counter", "Passes of the stages finished since the agent started.");
        fprintf(f, "gpu_node_agent_passes_total %" PRIu64 "\n", n->n_passes);

        header(f, "gpu_node_agent_stage_state", "gauge", "1 for each stage's state in the last pass, 0 for the others.");
        for (int i = 0; i < _STAGE_MAX; i++)
                for (int st = 0; st < _STAGE_STATE_MAX; st++)
                        fprintf(f, "gpu_node_agent_stage_state{stage=\"%s\",state=\"%s\"} %d\n", stage_to_string(i),
                                stage_state_to_string(st), (int) n->stages[i].state == st);

        header(f, "gpu_node_agent_stage_duration_seconds", "gauge", "How long each stage took the last time it ran.");
        for (int i = 0; i < _STAGE_MAX; i++) {
                const StageResult *r = &n->stages[i];
                if (r->started_usec == 0 || r->finished_usec < r->started_usec)
                        continue;
                fprintf(f, "gpu_node_agent_stage_duration_seconds{stage=\"%s\"} %.6f\n", stage_to_string(i),
                        (double) (r->finished_usec - r->started_usec) / USEC_PER_SEC);
        }

        header(f, "gpu_node_agent_gpus", "gauge", "NVIDIA GPUs found on the PCI bus.");
        fprintf(f, "gpu_node_agent_gpus %zu\n", n->inventory ? n->inventory->n_gpus : 0);
        header(f, "gpu_node_agent_unhealthy_gpus", "gauge", "GPUs whose health is degraded or failed.");
        fprintf(f, "gpu_node_agent_unhealthy_gpus %u\n", health_unhealthy_gpus(n->health));

        bool any = false;
        for (size_t i = 0; s && i < s->n_gpus; i++) {
                const char *why;
                GpuHealthState st = health_gpu_state(n->health, s->gpus[i].pci_address, &why);
                if (!any)
                        header(f, "gpu_node_agent_gpu_health", "gauge",
                               "1 for each GPU's health (ok, degraded, failed), 0 for the others.");
                any = true;
                for (int h = 0; h < _GPU_HEALTH_MAX; h++) {
                        fputs("gpu_node_agent_gpu_health{", f);
                        gpu_labels(f, &s->gpus[i], host);
                        fprintf(f, ",health=\"%s\"} %d\n", gpu_health_to_string(h), (int) st == h);
                }
        }
        gpu_family(f, n, host, "gpu_node_agent_xid_events_total", "counter",
                   "XID events seen since the agent started, all classes.", SERIES_XID_COUNT);

        any = false;
        for (size_t i = 0; s && i < s->n_gpus; i++)
                for (size_t j = 0; j < s->gpus[i].n_mig_devices; j++) {
                        const GpuInfo *g = &s->gpus[i];
                        const MigDeviceInfo *d = &g->mig_devices[j];
                        GpuInfo as_mig = *g;
                        if (!any)
                                header(f, "gpu_node_agent_mig_device_info", "gauge",
                                       "One series per MIG device (always 1), with dcgm-exporter's MIG labels.");
                        any = true;
                        as_mig.uuid = d->uuid;
                        fputs("gpu_node_agent_mig_device_info{", f);
                        gpu_labels(f, &as_mig, host);
                        fputs(",GPU_I_PROFILE=\"", f);
                        put_value(f, d->profile);
                        fprintf(f, "\",GPU_I_ID=\"%u\"} 1\n", d->gi_id);
                }

        header(f, "gpu_node_agent_health_event_worker_armed", "gauge",
               "1 while the event worker is registered for NVML events and waiting.");
        fprintf(f, "gpu_node_agent_health_event_worker_armed %d\n", health_armed(n->health));
        header(f, "gpu_node_agent_health_event_worker_restarts_total", "counter",
               "Times the event worker crashed, hung or exited and was restarted.");
        fprintf(f, "gpu_node_agent_health_event_worker_restarts_total %" PRIu64 "\n", health_worker_restarts(n->health));

        static const char *const results[] = { "success", "rebooting", "failed" };
        header(f, "gpu_node_agent_mig_applies_total", "counter", "MIG applies finished, by result.");
        for (size_t i = 0; i < ELEMENTSOF(results); i++)
                fprintf(f, "gpu_node_agent_mig_applies_total{result=\"%s\"} %" PRIu64 "\n", results[i],
                        n->metrics->mig_applies[i]);
        header(f, "gpu_node_agent_mig_apply_changes_total", "counter", "MIG applies that changed the MIG devices.");
        fprintf(f, "gpu_node_agent_mig_apply_changes_total %" PRIu64 "\n", n->metrics->mig_apply_changes);
        if (n->metrics->dkms_known) {
                header(f, "gpu_node_agent_dkms_build_seconds", "gauge",
                       "How long the last DKMS build took, and whether it succeeded.");
                fprintf(f, "gpu_node_agent_dkms_build_seconds{result=\"%s\"} %.3f\n",
                        n->metrics->dkms_ok ? "success" : "failed",
                        (double) n->metrics->dkms_build_usec / USEC_PER_SEC);
        }

        if (fclose(f) != 0)
                return -ENOMEM;
        *ret = TAKE_PTR(buf);
        return 0;
}

void metrics_update(Node *n) {
        const char *path = n->config ? n->config->metrics.textfile : NULL;
        _cleanup_free_ char *text = NULL;
        Metrics *x = n->metrics;
        int r;

        if (isempty(path) || n->oneshot || !n->first_pass_done)
                return;
        r = metrics_format(n, &text);
        if (r < 0)
                return (void) log_oom();
        if (x->written && streq(x->written, text) && streq_ptr(x->written_path, path))
                return;
        r = write_file_atomic_mkdir(path, text, strlen(text), 0644);
        if (r < 0) {
                if (r != x->last_error)
                        log_warning_errno(r, "Failed to write the metrics textfile %s (metrics.textfile): %s%s", path,
                                          strerror(-r),
                                          r == -EROFS || r == -EACCES
                                                  ? " — under the shipped unit only /var/lib/prometheus/node-exporter "
                                                    "is writable for it: use that directory, or give the unit "
                                                    "ReadWritePaths= for this one in a drop-in"
                                                  : "");
                x->last_error = r;
                return;
        }
        x->last_error = 0;
        free(x->written);
        x->written = TAKE_PTR(text);
        free(x->written_path);
        x->written_path = strdup(path);
}
