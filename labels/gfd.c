/* SPDX-License-Identifier: MIT */
/* Owns the NVML-backed half of the GFD label contract (README.md, "Labels"): driver and CUDA versions, the
 * full-GPU resource labels of the node's model, the MIG strategies none / single / mixed, sharing
 * (time-slicing and MPS replicas, the -SHARED suffix), mig.capable, mps.capable, vgpu.present,
 * gpu.clique and gpu.driver.kernel. It reads only a LabelNvml (label.h), never NVML itself, so that every
 * layout can be tested with hand-made snapshots. */
#include <stdarg.h>
#include <stdio.h>

#include "escape.h"
#include "label-internal.h"
#include "string-table.h"
#include "strv.h"

static const char *const mig_strategy_names[_LABEL_MIG_STRATEGY_MAX] = {
        [LABEL_MIG_STRATEGY_NONE] = "none",
        [LABEL_MIG_STRATEGY_SINGLE] = "single",
        [LABEL_MIG_STRATEGY_MIXED] = "mixed",
};

static const char *const sharing_names[_LABEL_SHARING_MAX] = {
        [LABEL_SHARING_NONE] = "none",
        [LABEL_SHARING_TIME_SLICING] = "time-slicing",
        [LABEL_SHARING_MPS] = "mps",
};

static DEFINE_STRING_TABLE_LOOKUP_TO_STRING(mig_strategy, LabelMigStrategy, mig_strategy_names, _LABEL_MIG_STRATEGY_MAX)
static DEFINE_STRING_TABLE_LOOKUP_TO_STRING(sharing, LabelSharing, sharing_names, _LABEL_SHARING_MAX)

typedef struct Gfd {
        const LabelInput *in;
        const LabelNvml *nvml;
        LabelSet *s;
        char ***warnings;
        char **products; /* per NVML GPU: its model, the sanitised NVML name (or the PCI one) */
} Gfd;

typedef struct GfdSharing {
        unsigned replicas;
        const char *strategy; /* "none" / "time-slicing" / "mps"; "" for -MIG-INVALID */
        bool suffix;          /* append -SHARED to the product */
} GfdSharing;

/* One MIG profile present on the node. */
typedef struct GfdProfile {
        const char *name;           /* canonical, e.g. "1g.10gb+me" */
        const LabelMigDevice *first; /* its attributes are the profile's labels */
        size_t gpu;                 /* index of first's parent GPU */
        size_t count;
} GfdProfile;

_printf_(2, 3) static int gfd_warn(Gfd *g, const char *fmt, ...) {
        char *m;
        va_list ap;
        int r;

        if (!g->warnings)
                return 0;
        va_start(ap, fmt);
        r = vasprintf(&m, fmt, ap);
        va_end(ap);
        if (r < 0)
                return -ENOMEM;
        return strv_consume(g->warnings, m);
}

/* resource is "gpu" or "mig-<profile>": the label is nvidia.com/<resource>.<field>, as GFD derives
 * it from the extended resource name. */
static int gfd_put(Gfd *g, const char *resource, const char *field, const char *value) {
        _cleanup_free_ char *key = strprintf(LABEL_PREFIX "%s.%s", resource, field);
        if (!key)
                return -ENOMEM;
        return label_put_checked(g->s, key, value, NULL, g->warnings);
}

static int gfd_put_u(Gfd *g, const char *resource, const char *field, uint64_t n) {
        _cleanup_free_ char *key = strprintf(LABEL_PREFIX "%s.%s", resource, field);
        if (!key)
                return -ENOMEM;
        return label_put_uint(g->s, key, n);
}

static bool is_digits(const char *s) {
        if (!*s)
                return false;
        for (; *s; s++)
                if (*s < '0' || *s > '9')
                        return false;
        return true;
}

/* "550.54.15" → 550 / 54 / 15; "570.86" → 570 / 86 / ""; the minor keeps leading zeros ("06"), as GFD
 * splits the string rather than parsing numbers. */
static int gfd_put_driver_version(Gfd *g) {
        const char *v = g->nvml->driver_version;
        char *parts[3] = {}, *p, *t;
        size_t n = 0;
        bool ok;
        int r;

        if (isempty(v))
                return 0; /* NVML could not say; the NVML layer has named the failing call */

        _cleanup_free_ char *copy = strdup(v);
        if (!copy)
                return -ENOMEM;
        ok = strlen(v) <= 63;
        for (p = copy; ok && (t = strsep(&p, "."));) {
                if (n == ELEMENTSOF(parts) || !is_digits(t))
                        ok = false;
                else
                        parts[n++] = t;
        }
        if (!ok || n < 2) {
                _cleanup_free_ char *quoted = escape_message(v);
                if (!quoted)
                        return -ENOMEM;
                return gfd_warn(g,
                                "NVML reported the driver version '%s', which is not of the form X.Y[.Z]; "
                                "the cuda.driver.* and cuda.driver-version.* labels are left out.",
                                quoted);
        }

        const char *rev = n == 3 ? parts[2] : "";
        static const char *const keys[][2] = {
                { LABEL_PREFIX "cuda.driver.major", LABEL_PREFIX "cuda.driver-version.major" },
                { LABEL_PREFIX "cuda.driver.minor", LABEL_PREFIX "cuda.driver-version.minor" },
                { LABEL_PREFIX "cuda.driver.rev", LABEL_PREFIX "cuda.driver-version.revision" },
        };
        const char *values[] = { parts[0], parts[1], rev };
        for (size_t i = 0; i < ELEMENTSOF(keys); i++)
                for (size_t k = 0; k < 2; k++) {
                        r = label_set_put(g->s, keys[i][k], values[i]);
                        if (r < 0)
                                return r;
                }
        return label_set_put(g->s, LABEL_PREFIX "cuda.driver-version.full", v);
}

/* nvmlSystemGetCudaDriverVersion: 12040 → 12.4. */
static int gfd_put_cuda_version(Gfd *g) {
        int v = g->nvml->cuda_version;
        char full[32];
        int r;

        if (v <= 0)
                return 0; /* unknown */
        unsigned major = (unsigned) v / 1000, minor = (unsigned) v % 1000 / 10;
        snprintf(full, sizeof full, "%u.%u", major, minor);

        r = label_put_uint(g->s, LABEL_PREFIX "cuda.runtime.major", major);
        if (r >= 0)
                r = label_put_uint(g->s, LABEL_PREFIX "cuda.runtime.minor", minor);
        if (r >= 0)
                r = label_put_uint(g->s, LABEL_PREFIX "cuda.runtime-version.major", major);
        if (r >= 0)
                r = label_put_uint(g->s, LABEL_PREFIX "cuda.runtime-version.minor", minor);
        if (r >= 0)
                r = label_set_put(g->s, LABEL_PREFIX "cuda.runtime-version.full", full);
        return r;
}

static const char *gfd_family(int major, int minor) {
        switch (major) {
        case 1:
                return "tesla";
        case 2:
                return "fermi";
        case 3:
                return "kepler";
        case 5:
                return "maxwell";
        case 6:
                return "pascal";
        case 7:
                return minor < 5 ? "volta" : "turing";
        case 8:
                return minor < 9 ? "ampere" : "ada-lovelace";
        case 9:
                return "hopper";
        case 10:
        case 12:
                return "blackwell";
        case 13:
                return "rubin";
        }
        return "undefined";
}

/* GFD considers a GPU MIG-capable when nvmlDeviceGetMigMode answers at all; a GPU whose answer we do
 * not know is not claimed to be. */
static bool gfd_mig_capable(const LabelNvml *n) {
        for (size_t i = 0; i < n->n_gpus; i++)
                if (n->gpus[i].mig_current == LABEL_MIG_DISABLED || n->gpus[i].mig_current == LABEL_MIG_ENABLED)
                        return true;
        return false;
}

static int gfd_put_clique(Gfd *g) {
        const LabelNvmlGpu *first = NULL;

        /* A GPU without a clique is not (or not yet) attached to an NVLink fabric and has no say. */
        for (size_t i = 0; i < g->nvml->n_gpus; i++) {
                const LabelNvmlGpu *gpu = &g->nvml->gpus[i];
                if (!gpu->clique)
                        continue;
                if (!first) {
                        first = gpu;
                        continue;
                }
                if (!streq(first->clique, gpu->clique))
                        return gfd_warn(g,
                                        "GPUs on this node report different NVLink cliques (%s: %s, %s: %s); "
                                        "gpu.clique is left out until the fabric manager agrees on one.",
                                        first->pci_address, first->clique, gpu->pci_address, gpu->clique);
        }
        if (!first)
                return 0;
        return label_put_checked(g->s, LABEL_PREFIX "gpu.clique", first->clique, NULL, g->warnings);
}

static GfdSharing gfd_sharing(const LabelInput *in) {
        const char *strategy = sharing_to_string(in->sharing);

        /* Sharing shows only when a GPU is actually split into replicas, as in GFD. */
        if (!strategy || in->sharing == LABEL_SHARING_NONE || in->replicas <= 1)
                return (GfdSharing) { .replicas = 1, .strategy = "none" };
        return (GfdSharing) {
                .replicas = in->replicas,
                .strategy = strategy,
                .suffix = label_sharing_renames(in),
        };
}

static const LabelPciGpu *gfd_pci(const Gfd *g, const LabelNvmlGpu *gpu) {
        for (size_t i = 0; i < g->in->n_pci_gpus; i++)
                if (streq(g->in->pci_gpus[i].address, gpu->pci_address))
                        return &g->in->pci_gpus[i];
        return NULL;
}

static bool gfd_same_pci_ids(const LabelPciGpu *a, const LabelPciGpu *b) {
        return a && b && a->vendor_id == b->vendor_id && a->device_id == b->device_id &&
               a->subsystem_vendor_id == b->subsystem_vendor_id && a->subsystem_device_id == b->subsystem_device_id;
}

/* The model of one GPU: its sanitised NVML name. When NVML gave none that is usable, the NVML name of
 * another GPU with the same PCI vendor, device and subsystem ids — the same product, so that one bad
 * answer does not split a node of identical GPUs into two models and lower gpu.count — else the name
 * from pci.ids, so that gpu.product is still written. */
static int gfd_gpu_model(Gfd *g, const LabelNvmlGpu *gpu, char **ret) {
        _cleanup_free_ char *m = label_sanitize(gpu->name ?: ""), *bad = NULL, *fallback = NULL, *from = NULL;
        const LabelPciGpu *pci = gfd_pci(g, gpu);
        int r;

        if (!m)
                return -ENOMEM;
        if (*m) {
                *ret = TAKE_PTR(m);
                return 0;
        }

        for (size_t i = 0; pci && !fallback && i < g->nvml->n_gpus; i++) {
                const LabelNvmlGpu *other = &g->nvml->gpus[i];
                if (other == gpu || !gfd_same_pci_ids(pci, gfd_pci(g, other)))
                        continue;
                _cleanup_free_ char *name = label_sanitize(other->name ?: "");
                if (!name)
                        return -ENOMEM;
                if (!*name)
                        continue;
                from = strprintf(", the name NVML reported for GPU %s with the same PCI IDs (%04x:%04x, subsystem "
                                 "%04x:%04x),", other->pci_address, pci->vendor_id, pci->device_id,
                                 pci->subsystem_vendor_id, pci->subsystem_device_id);
                if (!from)
                        return -ENOMEM;
                fallback = TAKE_PTR(name);
        }
        if (!fallback) {
                fallback = pci ? label_product_from_pci(pci) : strdup("NVIDIA-unknown");
                from = strdup(pci ? " from its PCI ID" : "");
                if (!fallback || !from)
                        return -ENOMEM;
        }

        if (gpu->name) {
                /* The name is the driver's: quoted escaped, so that it cannot break the log line or D-Bus. */
                _cleanup_free_ char *quoted = escape_message(gpu->name);
                if (!quoted)
                        return -ENOMEM;
                bad = strprintf("the name '%s' for GPU %s, which has no usable characters", quoted, gpu->pci_address);
        } else
                bad = strprintf("no name for GPU %s", gpu->pci_address);
        if (!bad)
                return -ENOMEM;
        r = gfd_warn(g, "NVML reported %s; using %s%s instead.", bad, fallback, from);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(fallback);
        return 0;
}

/* A GPU whose MIG mode NVML could not read (an error, or an answer that is neither mode) is labelled as
 * a full GPU; say what that leaves out. */
static int gfd_warn_mig_unknown(Gfd *g) {
        for (size_t i = 0; i < g->nvml->n_gpus; i++) {
                const LabelNvmlGpu *gpu = &g->nvml->gpus[i];
                int r;

                if (gpu->mig_current == LABEL_MIG_UNSUPPORTED || gpu->mig_current == LABEL_MIG_DISABLED ||
                    gpu->mig_current == LABEL_MIG_ENABLED)
                        continue;
                r = gfd_warn(g, "NVML could not read the MIG mode of GPU %s; it is labelled as a full GPU%s, and "
                             "mig.capable does not count it.", gpu->pci_address,
                             g->in->mig_strategy == LABEL_MIG_STRATEGY_MIXED ? ", any MIG devices it has are left out of "
                                                                        "the mig-* labels" :
                             g->in->mig_strategy == LABEL_MIG_STRATEGY_SINGLE ? ", which MIG strategy single counts as a GPU "
                                                                         "not in MIG mode" : "");
                if (r < 0)
                        return r;
        }
        return 0;
}

/* product, count, replicas and sharing-strategy of one resource. profile is the MIG profile part of
 * the product (NULL for a full GPU). */
static int gfd_put_resource(Gfd *g, const char *resource, const char *model, const char *profile,
                            uint64_t count, const GfdSharing *sh) {
        _cleanup_free_ char *key = strprintf(LABEL_PREFIX "%s.product", resource);
        _cleanup_free_ char *suffix = strprintf("%s%s%s", profile ? "-MIG-" : "", profile ?: "",
                                                sh->suffix ? "-SHARED" : "");
        int r;

        if (!key || !suffix)
                return -ENOMEM;
        r = label_put_checked(g->s, key, model, suffix, g->warnings);
        if (r >= 0)
                r = gfd_put_u(g, resource, "count", count);
        if (r >= 0)
                r = gfd_put_u(g, resource, "replicas", sh->replicas);
        if (r >= 0)
                r = gfd_put(g, resource, "sharing-strategy", sh->strategy);
        return r;
}

/* The GPU of the model whose answer gives a fact: the first that has it, one out of MIG mode before one
 * in MIG mode (as GFD lets full GPUs override), so that one GPU's garbage does not cost the whole model
 * its label; when none has it, the one whose absence is named. */
typedef bool (*GfdHasFact)(const LabelNvmlGpu *gpu);

static bool gfd_has_memory(const LabelNvmlGpu *gpu) {
        return (gpu->memory_total_bytes >> 20) > 0;
}

static bool gfd_has_cc(const LabelNvmlGpu *gpu) {
        return gpu->cc_major > 0 && gpu->cc_minor >= 0;
}

static const LabelNvmlGpu *gfd_model_rep(Gfd *g, const char *model, GfdHasFact has) {
        const LabelNvmlGpu *best = NULL;
        int best_rank = -1;

        for (size_t i = 0; i < g->nvml->n_gpus; i++) {
                const LabelNvmlGpu *gpu = &g->nvml->gpus[i];
                if (!streq(g->products[i], model))
                        continue;
                int rank = (has(gpu) ? 2 : 0) + (gpu->mig_current != LABEL_MIG_ENABLED ? 1 : 0);
                if (rank > best_rank) {
                        best = gpu;
                        best_rank = rank;
                }
        }
        return best;
}

/* The full-GPU labels of the chosen model. GPUs in MIG mode are counted under their full name but
 * cannot be shared (replicas 0); when the model also has GPUs out of MIG mode, those decide replicas
 * and the product, as GFD lets full GPUs override. */
static int gfd_put_gpus(Gfd *g, const char *model) {
        const LabelNvmlGpu *rep;
        bool any_full = false;
        size_t count = 0;
        int r;

        for (size_t i = 0; i < g->nvml->n_gpus; i++) {
                if (!streq(g->products[i], model))
                        continue;
                count++;
                any_full = any_full || g->nvml->gpus[i].mig_current != LABEL_MIG_ENABLED;
        }

        GfdSharing sh = any_full ? gfd_sharing(g->in) : (GfdSharing) { .replicas = 0, .strategy = "none" };
        r = gfd_put_resource(g, "gpu", model, NULL, count, &sh);
        if (r < 0)
                return r;

        rep = gfd_model_rep(g, model, gfd_has_memory);
        if (gfd_has_memory(rep))
                r = gfd_put_u(g, "gpu", "memory", rep->memory_total_bytes >> 20);
        else
                r = gfd_warn(g, "NVML reported no memory size for GPU %s; gpu.memory is left out.",
                             rep->pci_address);
        if (r < 0)
                return r;

        rep = gfd_model_rep(g, model, gfd_has_cc);
        if (!gfd_has_cc(rep))
                return gfd_warn(g, "NVML reported no compute capability for GPU %s; gpu.family and "
                                "gpu.compute.* are left out.",
                                rep->pci_address);
        r = gfd_put(g, "gpu", "family", gfd_family(rep->cc_major, rep->cc_minor));
        if (r >= 0)
                r = gfd_put_u(g, "gpu", "compute.major", (unsigned) rep->cc_major);
        if (r >= 0)
                r = gfd_put_u(g, "gpu", "compute.minor", (unsigned) rep->cc_minor);
        return r;
}

/* Every MIG profile on the node, in order of first appearance (GPU order, then MIG device order). A
 * MIG device whose profile NVML could not name is left out, with a warning. */
static int gfd_collect_profiles(Gfd *g, GfdProfile **ret, size_t *ret_n) {
        _cleanup_free_ GfdProfile *p = NULL;
        size_t n = 0;
        int r;

        for (size_t i = 0; i < g->nvml->n_gpus; i++) {
                const LabelNvmlGpu *gpu = &g->nvml->gpus[i];
                if (gpu->mig_current != LABEL_MIG_ENABLED)
                        continue;
                for (size_t j = 0; j < gpu->n_mig_devices; j++) {
                        const LabelMigDevice *d = &gpu->mig_devices[j];
                        if (isempty(d->profile)) {
                                r = gfd_warn(g,
                                             "MIG device %u of GPU %s (GPU instance %u, compute instance %u) "
                                             "has no known profile; it is left out of the MIG labels.",
                                             d->index, gpu->pci_address, d->gi_id, d->ci_id);
                                if (r < 0)
                                        return r;
                                continue;
                        }
                        size_t k;
                        for (k = 0; k < n; k++)
                                if (streq(p[k].name, d->profile))
                                        break;
                        if (k == n) {
                                GfdProfile *q = reallocarray(p, n + 1, sizeof(GfdProfile));
                                if (!q)
                                        return -ENOMEM;
                                p = q;
                                p[n++] = (GfdProfile) { .name = d->profile, .first = d, .gpu = i };
                        }
                        p[k].count++;
                }
        }
        *ret = TAKE_PTR(p);
        *ret_n = n;
        return 0;
}

static int gfd_put_mig_attributes(Gfd *g, const char *resource, const GfdProfile *p) {
        const LabelMigDevice *d = p->first;
        const struct {
                const char *field;
                uint64_t value;
        } a[] = {
                { "multiprocessors", d->multiprocessors },
                { "slices.gi", d->gi_slices },
                { "slices.ci", d->ci_slices },
                { "engines.copy", d->copy_engines },
                { "engines.decoder", d->decoders },
                { "engines.encoder", d->encoders },
                { "engines.jpeg", d->jpegs },
                { "engines.ofa", d->ofas },
        };
        int r;

        if (d->memory_mib > 0)
                r = gfd_put_u(g, resource, "memory", d->memory_mib);
        else
                r = gfd_warn(g, "NVML reported no memory size for MIG device %u of GPU %s (profile %s); %s.memory "
                             "is left out.", d->index, g->nvml->gpus[p->gpu].pci_address, p->name, resource);
        if (r < 0)
                return r;
        for (size_t i = 0; i < ELEMENTSOF(a); i++) {
                r = gfd_put_u(g, resource, a[i].field, a[i].value);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* One MIG profile's labels under resource ("gpu" for single, "mig-<profile>" for mixed). In the
 * product the attribute separators become '.' as in the resource name (1g.6gb+me → 1g.6gb.me):
 * sanitising alone would drop '+' and make "1g.6gbme", which names no profile. */
static int gfd_put_profile(Gfd *g, const char *resource, const GfdProfile *p) {
        _cleanup_free_ char *name = strdup(p->name), *profile = NULL;
        GfdSharing sh = gfd_sharing(g->in);
        int r;

        if (!name)
                return -ENOMEM;
        for (char *c = name; *c; c++)
                if (*c == '+' || *c == ',')
                        *c = '.';
        profile = label_sanitize(name);
        if (!profile)
                return -ENOMEM;
        r = gfd_put_resource(g, resource, g->products[p->gpu], profile, p->count, &sh);
        if (r < 0)
                return r;
        return gfd_put_mig_attributes(g, resource, p);
}

static int gfd_put_single_invalid(Gfd *g, size_t gpu, const char *reason) {
        int r;

        r = gfd_warn(g,
                     "MIG strategy single needs every GPU in MIG mode with MIG devices of one profile, but %s; "
                     "labelling %s-MIG-INVALID with gpu.count=0. Change the MIG layout (mig.config) or set "
                     "labels.mig-strategy to mixed.",
                     reason, g->products[gpu]);
        if (r < 0)
                return r;

        GfdSharing sh = { .replicas = 0, .strategy = "" };
        r = gfd_put_resource(g, "gpu", g->products[gpu], "INVALID", 0, &sh);
        if (r >= 0)
                r = gfd_put_u(g, "gpu", "memory", 0);
        return r;
}

/* single: the MIG devices are published as nvidia.com/gpu, which only works when they are all alike. */
static int gfd_put_single(Gfd *g) {
        _cleanup_free_ GfdProfile *p = NULL;
        _cleanup_free_ char *reason = NULL;
        size_t n = 0, first = SIZE_MAX;
        int r;

        for (size_t i = 0; i < g->nvml->n_gpus && first == SIZE_MAX; i++)
                if (g->nvml->gpus[i].mig_current == LABEL_MIG_ENABLED)
                        first = i;
        /* No GPU in MIG mode: the same labels as strategy none (GFD). */
        if (first == SIZE_MAX)
                return 0;

        /* The checks in GFD's order, so that the reason named is the one GFD would log. */
        for (size_t i = 0; i < g->nvml->n_gpus; i++) {
                const LabelNvmlGpu *gpu = &g->nvml->gpus[i];
                if (gpu->mig_current == LABEL_MIG_ENABLED && gpu->n_mig_devices == 0) {
                        reason = strprintf("GPU %s is in MIG mode without any MIG device", gpu->pci_address);
                        return reason ? gfd_put_single_invalid(g, first, reason) : -ENOMEM;
                }
        }
        for (size_t i = 0; i < g->nvml->n_gpus; i++) {
                const LabelNvmlGpu *gpu = &g->nvml->gpus[i];
                if (gpu->mig_current != LABEL_MIG_ENABLED) {
                        reason = strprintf("GPU %s (%s) is not in MIG mode", gpu->pci_address, g->products[i]);
                        return reason ? gfd_put_single_invalid(g, first, reason) : -ENOMEM;
                }
        }

        r = gfd_collect_profiles(g, &p, &n);
        if (r < 0)
                return r;
        if (n == 0)
                return gfd_put_single_invalid(g, first, "no MIG device has a known profile");
        if (n > 1) {
                _cleanup_strv_free_ char **names = NULL;
                for (size_t i = 0; i < n; i++)
                        if (strv_extend(&names, p[i].name) < 0)
                                return -ENOMEM;
                _cleanup_free_ char *list = strv_join(names, ", ");
                if (!list)
                        return -ENOMEM;
                reason = strprintf("the node has MIG devices of %zu profiles (%s)", n, list);
                if (!reason)
                        return -ENOMEM;
                return gfd_put_single_invalid(g, first, reason);
        }
        return gfd_put_profile(g, "gpu", &p[0]);
}

/* mixed: every profile is its own resource nvidia.com/mig-<profile>; '+' and ',' (attribute
 * separators) are not allowed in label names and become '.': mig-1g.10gb+me → mig-1g.10gb.me. */
static int gfd_put_mixed(Gfd *g) {
        _cleanup_free_ GfdProfile *p = NULL;
        size_t n = 0;
        int r;

        r = gfd_collect_profiles(g, &p, &n);
        if (r < 0)
                return r;
        for (size_t i = 0; i < n; i++) {
                _cleanup_free_ char *resource = strprintf("mig-%s", p[i].name);
                _cleanup_free_ char *longest = NULL;
                if (!resource)
                        return -ENOMEM;
                for (char *c = resource; *c; c++)
                        if (*c == '+' || *c == ',')
                                *c = '.';
                longest = strprintf(LABEL_PREFIX "%s.sharing-strategy", resource);
                if (!longest)
                        return -ENOMEM;
                if (!label_key_is_valid(longest)) {
                        r = gfd_warn(g, "MIG profile '%s' does not make a valid label name; its mig-* labels "
                                     "are left out.",
                                     p[i].name);
                        if (r < 0)
                                return r;
                        continue;
                }
                r = gfd_put_profile(g, resource, &p[i]);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* vgpu.present from the GPUs' vendor-specific PCI capability (probe.c), and the host driver's version
 * and branch from its record, as GFD labels a vGPU guest; false elsewhere, as GFD writes it. */
static int gfd_put_vgpu(Gfd *g) {
        const LabelPciGpu *gpus = g->in->pci_gpus, *vgpu = NULL;
        int r;

        for (size_t i = 0; i < g->in->n_pci_gpus; i++)
                if (gpus[i].vgpu && (!vgpu || (!vgpu->vgpu_host_driver_version && gpus[i].vgpu_host_driver_version)))
                        vgpu = &gpus[i];
        r = label_set_put(g->s, LABEL_PREFIX "vgpu.present", vgpu ? "true" : "false");
        if (r < 0 || !vgpu || !vgpu->vgpu_host_driver_version)
                return r;
        r = label_put_checked(g->s, LABEL_PREFIX "vgpu.host-driver-version", vgpu->vgpu_host_driver_version, NULL,
                              g->warnings);
        if (r >= 0)
                r = label_put_checked(g->s, LABEL_PREFIX "vgpu.host-driver-branch", vgpu->vgpu_host_driver_branch,
                                      NULL, g->warnings);
        return r;
}

int label_put_gfd(LabelSet *s, const LabelInput *in, char ***warnings) {
        const LabelNvml *nvml = in->nvml;
        _cleanup_strv_free_ char **products = NULL;
        _cleanup_free_ const char **addresses = calloc(nvml->n_gpus ?: 1, sizeof(char *));
        Gfd g = { .in = in, .nvml = nvml, .s = s, .warnings = warnings };
        GfdSharing sh = gfd_sharing(in);
        int r;

        if (!addresses)
                return -ENOMEM;

        r = gfd_put_driver_version(&g);
        if (r >= 0)
                r = gfd_put_cuda_version(&g);
        if (r >= 0 && in->kernel_release)
                r = label_put_checked(s, LABEL_PREFIX "gpu.driver.kernel", in->kernel_release, NULL, warnings);
        if (r >= 0)
                r = label_set_put(s, LABEL_PREFIX "mig.capable", gfd_mig_capable(nvml) ? "true" : "false");
        if (r >= 0)
                r = label_set_put(s, LABEL_PREFIX "mps.capable",
                                  in->sharing == LABEL_SHARING_MPS && sh.replicas > 1 ? "true" : "false");
        if (r >= 0)
                r = gfd_put_vgpu(&g);
        if (r >= 0)
                r = gfd_put_clique(&g);
        if (r >= 0 && in->mig_strategy != LABEL_MIG_STRATEGY_NONE)
                r = label_put_checked(s, LABEL_PREFIX "mig.strategy",
                                      mig_strategy_to_string(in->mig_strategy) ?: "", NULL, warnings);
        if (r < 0)
                return r;

        /* Every GPU bound to something else than nvidia (vfio-pci): NVML sees none, PCI still does. */
        if (nvml->n_gpus == 0)
                return label_put_pci_models(s, in, warnings);

        for (size_t i = 0; i < nvml->n_gpus; i++) {
                char *m;
                r = gfd_gpu_model(&g, &nvml->gpus[i], &m);
                if (r < 0)
                        return r;
                r = strv_consume(&products, m);
                if (r < 0)
                        return r;
                addresses[i] = nvml->gpus[i].pci_address;
        }
        g.products = products;
        r = gfd_warn_mig_unknown(&g);
        if (r < 0)
                return r;

        LabelModel *models = NULL;
        size_t n_models = 0;
        r = label_models_count(products, addresses, nvml->n_gpus, &models, &n_models);
        if (r < 0)
                return r;
        size_t chosen = label_models_choose(models, n_models);
        r = label_models_warn(models, n_models, chosen, warnings);
        if (r >= 0)
                r = gfd_put_gpus(&g, models[chosen].product);
        label_models_free(models, n_models);
        if (r < 0)
                return r;

        switch (in->mig_strategy) {
        case LABEL_MIG_STRATEGY_NONE:
                return 0;
        case LABEL_MIG_STRATEGY_SINGLE:
                return gfd_put_single(&g);
        case LABEL_MIG_STRATEGY_MIXED:
                return gfd_put_mixed(&g);
        case _LABEL_MIG_STRATEGY_MAX:
                break;
        }
        return -EINVAL;
}
