/* SPDX-License-Identifier: MIT */
/* Owns the labels stage: computes the node's labels and keeps the NFD feature file in step, with no
 * churn, and refreshes its expiry directive before it lapses. */
#include <time.h>

#include "build-config.h"
#include "config.h"
#include "event-util.h"
#include "fileio.h"
#include "gpu-nvml.h"
#include "gpu-products.h"
#include "health.h"
#include "log.h"
#include "stage-table.h"
#include "mig-manager.h"
#include "nfd.h"
#include "probe.h"
#include "strv.h"

/* The label library's plain input model (labels/label.h), filled from the probe's inventory and the
 * NVML snapshot. It points into both (names, profiles), which outlive it: it lives for one pass. */
typedef struct LabelFacts {
        LabelPciGpu *pci;
        size_t n_pci;
        LabelNvmlGpu *gpus;
        LabelMigDevice *migs;
        LabelNvml nvml;
        bool have_nvml;
} LabelFacts;

static void label_facts_done(LabelFacts *f) {
        free(f->pci);
        free(f->gpus);
        free(f->migs);
        *f = (LabelFacts) {};
}

static LabelMigMode label_mig_mode(GpuMigMode mode) {
        switch (mode) {
        case GPU_MIG_UNSUPPORTED:
                return LABEL_MIG_UNSUPPORTED;
        case GPU_MIG_DISABLED:
                return LABEL_MIG_DISABLED;
        case GPU_MIG_ENABLED:
                return LABEL_MIG_ENABLED;
        case _GPU_MIG_MODE_MAX:
        case _GPU_MIG_MODE_INVALID:
                break;
        }
        return LABEL_MIG_UNKNOWN;
}

/* The configuration was checked when it was read; a value outside the enum (none today) maps to the
 * label library's own invalid value, which it refuses (-EINVAL) or, for sharing, treats as none. */
static LabelMigStrategy label_mig_strategy(int s) {
        switch (s) {
        case MIG_STRATEGY_NONE:
                return LABEL_MIG_STRATEGY_NONE;
        case MIG_STRATEGY_SINGLE:
                return LABEL_MIG_STRATEGY_SINGLE;
        case MIG_STRATEGY_MIXED:
                return LABEL_MIG_STRATEGY_MIXED;
        default:
                return _LABEL_MIG_STRATEGY_MAX;
        }
}

static LabelSharing label_sharing(int s) {
        switch (s) {
        case SHARING_NONE:
                return LABEL_SHARING_NONE;
        case SHARING_TIME_SLICING:
                return LABEL_SHARING_TIME_SLICING;
        case SHARING_MPS:
                return LABEL_SHARING_MPS;
        default:
                return _LABEL_SHARING_MAX;
        }
}

static int label_facts_fill(LabelFacts *f, const Inventory *inv, const NvmlSnapshot *nvml) {
        size_t n_migs = 0, k = 0;

        *f = (LabelFacts) {};
        f->n_pci = inv ? inv->n_gpus : 0;
        f->pci = calloc(f->n_pci ?: 1, sizeof(LabelPciGpu));
        if (!f->pci)
                return -ENOMEM;
        for (size_t i = 0; i < f->n_pci; i++) {
                const PciDevice *d = &inv->gpus[i];
                f->pci[i] = (LabelPciGpu) {
                        .vendor_id = d->vendor_id,
                        .device_id = d->device_id,
                        .subsystem_vendor_id = d->subsystem_vendor_id,
                        .subsystem_device_id = d->subsystem_device_id,
                        .class_code = d->class_code,
                        .name = d->name,
                        .vgpu = d->vgpu,
                        .vgpu_host_driver_version = d->vgpu_host_driver_version,
                        .vgpu_host_driver_branch = d->vgpu_host_driver_branch,
                };
                _Static_assert(sizeof f->pci[i].address == sizeof d->address, "PCI address sizes differ");
                memcpy(f->pci[i].address, d->address, sizeof d->address);
        }
        if (!nvml)
                return 0;

        for (size_t i = 0; i < nvml->n_gpus; i++)
                n_migs += nvml->gpus[i].n_mig_devices;
        f->gpus = calloc(nvml->n_gpus ?: 1, sizeof(LabelNvmlGpu));
        f->migs = calloc(n_migs ?: 1, sizeof(LabelMigDevice));
        if (!f->gpus || !f->migs)
                return -ENOMEM;
        for (size_t i = 0; i < nvml->n_gpus; i++) {
                const GpuInfo *g = &nvml->gpus[i];
                f->gpus[i] = (LabelNvmlGpu) {
                        .name = g->name,
                        .memory_total_bytes = g->memory_total_bytes,
                        .cc_major = g->cc_major,
                        .cc_minor = g->cc_minor,
                        .mig_current = label_mig_mode(g->mig_current),
                        .mig_devices = f->migs + k,
                        .n_mig_devices = g->n_mig_devices,
                        .clique = g->clique,
                };
                _Static_assert(sizeof f->gpus[i].pci_address == sizeof g->pci_address, "PCI address sizes differ");
                memcpy(f->gpus[i].pci_address, g->pci_address, sizeof g->pci_address);
                for (size_t j = 0; j < g->n_mig_devices; j++) {
                        const MigDeviceInfo *d = &g->mig_devices[j];
                        f->migs[k++] = (LabelMigDevice) {
                                .index = d->index,
                                .gi_id = d->gi_id,
                                .ci_id = d->ci_id,
                                .profile = d->profile,
                                .memory_mib = d->memory_mib,
                                .multiprocessors = d->multiprocessors,
                                .gi_slices = d->gi_slices,
                                .ci_slices = d->ci_slices,
                                .copy_engines = d->copy_engines,
                                .decoders = d->decoders,
                                .encoders = d->encoders,
                                .jpegs = d->jpegs,
                                .ofas = d->ofas,
                        };
                }
        }
        f->nvml = (LabelNvml) {
                .driver_version = nvml->driver_version,
                .cuda_version = nvml->cuda_version,
                .gpus = f->gpus,
                .n_gpus = nvml->n_gpus,
        };
        f->have_nvml = true;
        return 0;
}

static uint64_t now_realtime(void) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        return (uint64_t) ts.tv_sec * USEC_PER_SEC + (uint64_t) ts.tv_nsec / 1000;
}

const char *stage_labels_mig_config(const Node *n) {
        if (n->config->mig.selected_from == MIG_SELECTED_FROM_NODE_LABEL)
                return NULL;
        return mig_manager_config(n->mig);
}

/* The state label reflects the other stages; this one is running while it is computed. */
static const char *labels_agent_state(const Node *n) {
        for (int i = 0; i < _STAGE_MAX; i++)
                if (i != STAGE_LABELS && n->stages[i].state == STAGE_FAILED)
                        return i == STAGE_PROBE ? "failed" : "degraded";
        if (health_node_state(n->health, NULL) != GPU_HEALTH_OK)
                return "degraded";
        return "ready";
}

static int on_refresh(sd_event_source *s, uint64_t usec, void *userdata) {
        node_request_pass(userdata, "feature file expiry refresh");
        return 0;
}

/* With labels.expiry set, the file carries an absolute expiry time; keep the one already written
 * while it has more than half its lifetime left, so an unchanged label set is not rewritten. */
static uint64_t labels_pick_expiry(Node *n, bool same_labels) {
        uint64_t lifetime = n->config->labels.expiry_usec, now = now_realtime();

        if (lifetime == 0)
                return 0;
        if (same_labels && n->labels_expiry_usec > now + lifetime / 2)
                return n->labels_expiry_usec;
        return now + lifetime;
}

static void labels_arm_refresh(Node *n) {
        uint64_t lifetime = n->config->labels.expiry_usec;
        int r;

        if (lifetime == 0 || n->labels_expiry_usec == 0) {
                if (n->refresh_timer)
                        (void) sd_event_source_set_enabled(n->refresh_timer, SD_EVENT_OFF);
                return;
        }
        uint64_t at = n->labels_expiry_usec - lifetime / 2, now = now_realtime();
        uint64_t delay = at > now ? at - now : 0;
        r = event_reset_time_relative(n->event, &n->refresh_timer, CLOCK_MONOTONIC, delay, USEC_PER_SEC, on_refresh,
                                      n, "labels-refresh");
        if (r < 0)
                log_warning_errno(r, "Failed to arm the feature file refresh timer: %m");
}

static void labels_publish(Node *n, LabelSet *labels, uint64_t expiry) {
        bool changed = !(n->labels && labels && label_set_equal(n->labels, labels)) && (n->labels || labels);

        n->labels_expiry_usec = expiry;
        if (!changed) {
                label_set_free(labels);
                return;
        }
        label_set_free(n->labels);
        n->labels = labels;
        node_mark_dirty(n, NULL, AGENT_MANAGER_INTERFACE, "Labels");
}

/* Keeps NVML's product name per GPU in the state directory: written when NVML answers and the names
 * changed, read once when the labels must be made without NVML. A failure costs only the stable name
 * while NVML is down, so it is logged, never fatal. */
static void labels_known_products(Node *n, const LabelFacts *f) {
        const char *dir = n->config->paths.state;
        bool changed = false;
        int r;

        if (!n->known_products_loaded) {
                n->known_products_loaded = true;
                r = gpu_products_load(dir, &n->known_products, &n->n_known_products);
                if (r < 0)
                        log_warning_errno(r, "Cannot read %s/%s (%m): while NVML is down gpu.product comes from "
                                          "the PCI ID database.", dir, GPU_PRODUCTS_FILE);
        }
        if (!f->have_nvml)
                return;
        r = label_known_products_update(&n->known_products, &n->n_known_products, f->pci, f->n_pci, &f->nvml,
                                        &changed);
        if (r < 0 || !changed)
                return;
        r = gpu_products_save(dir, n->known_products, n->n_known_products);
        if (r < 0)
                log_warning_errno(r, "Cannot write %s/%s (%m): after a restart without NVML, gpu.product will "
                                  "come from the PCI ID database.", dir, GPU_PRODUCTS_FILE);
}

int stage_labels_run(Node *n, char **ret_message) {
        const ConfigLabels *c = &n->config->labels;
        _cleanup_(label_set_freep) LabelSet *labels = NULL;
        _cleanup_strv_free_ char **warnings = NULL;
        _cleanup_free_ char *machine = NULL, *text = NULL, *error = NULL, *path = NULL;
        _cleanup_(label_facts_done) LabelFacts facts = {};
        bool written = false;
        int r;

        if (!c->enabled) {
                labels_publish(n, NULL, 0);
                labels_arm_refresh(n);
                *ret_message = strdup("disabled in the configuration (labels.enabled: false)");
                return STAGE_SKIPPED;
        }

        path = path_join(c->directory, c->file);
        if (!path)
                return -ENOMEM;

        if (!n->inventory || n->inventory->n_gpus == 0) {
                _cleanup_free_ char *rm_error = NULL;
                r = nfd_remove(c->directory, c->file, &rm_error);
                if (r < 0) {
                        *ret_message = rm_error ? strprintf("no NVIDIA GPU, but %s", rm_error)
                                                : strprintf("no NVIDIA GPU, but removing %s failed: %s", path,
                                                            strerror(-r));
                        return r;
                }
                labels_publish(n, NULL, 0);
                labels_arm_refresh(n);
                *ret_message = strprintf("no NVIDIA GPU: no labels, %s removed", path);
                return STAGE_SKIPPED;
        }

        r = label_facts_fill(&facts, n->inventory, n->nvml_snapshot);
        if (r < 0) {
                *ret_message = strprintf("computing labels failed: %s", strerror(-r));
                return r;
        }
        labels_known_products(n, &facts);
        (void) label_read_machine(n->config->paths.sys, &machine);
        LabelInput in = {
                .pci_gpus = facts.pci,
                .n_pci_gpus = facts.n_pci,
                .nvml = facts.have_nvml ? &facts.nvml : NULL,
                .machine = machine,
                .agent_state = labels_agent_state(n),
                .version = GPU_NODE_AGENT_VERSION,
                .kernel_release = n->kernel_release,
                .mig_strategy = label_mig_strategy(n->config->labels.mig_strategy),
                .sharing = label_sharing(n->config->sharing.strategy),
                .replicas = n->config->sharing.replicas,
                .rename_by_default = n->config->sharing.rename_by_default,
                .timestamp_sec = n->config->labels.timestamp ? n->labels_timestamp_sec : 0,
                .mig_config = stage_labels_mig_config(n),
                .mig_config_state = mig_manager_state(n->mig),
                .known_products = n->known_products,
                .n_known_products = n->n_known_products,
                .gpu_health = health_active(n->health) ? gpu_health_to_string(health_node_state(n->health, NULL))
                                                       : NULL,
                .unhealthy_gpus = health_unhealthy_gpus(n->health),
        };
        r = labels_compute(&in, &labels, &warnings);
        if (r < 0) {
                *ret_message = strprintf("computing labels failed: %s", strerror(-r));
                return r;
        }

        bool same = n->labels && label_set_equal(n->labels, labels);
        if (!same)
                STRV_FOREACH(w, warnings)
                        log_warning("%s", *w);

        uint64_t expiry = labels_pick_expiry(n, same);
        r = nfd_format(labels, expiry, &text);
        if (r < 0) {
                *ret_message = strprintf("formatting the feature file failed: %s", strerror(-r));
                return r;
        }
        r = nfd_write(c->directory, c->file, text, &written, &error);
        if (r < 0) {
                *ret_message = TAKE_PTR(error);
                return r;
        }
        if (written)
                log_info("Wrote %zu labels to %s.", labels->n, path);

        size_t n_labels = labels->n;
        labels_publish(n, TAKE_PTR(labels), expiry);
        labels_arm_refresh(n);
        *ret_message = strprintf("%zu labels %s %s", n_labels, written ? "written to" : "unchanged in", path);
        return STAGE_DONE;
}

/* Outside a pass: a MIG change takes seconds to minutes, and the stages after mig wait for it, so the
 * feature file is written once more as it starts, to say nvidia.com/mig.config.state=pending — as the
 * GPU Operator's MIG manager labels the node before it applies a new nvidia.com/mig.config. */
void stage_labels_write_now(Node *n) {
        _cleanup_free_ char *message = NULL;
        int r;

        r = stage_labels_run(n, &message);
        if (r < 0)
                log_warning("Could not write the feature file before the MIG change: %s",
                            message ?: strerror(-r));
}
