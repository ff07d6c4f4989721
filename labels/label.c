/* SPDX-License-Identifier: MIT */
/* Owns label sets, the Kubernetes label rules, GFD-compatible sanitising and the computation of the
 * node's labels: the ones every GPU node gets, and the PCI-only set used while NVML is unavailable; the
 * NVML-backed GFD set lives in gfd.c (see README.md, "Labels"). */
#include <ctype.h>
#include <inttypes.h>
#include <stdint.h>

#include "fileio.h"
#include "hash.h"
#include "label-internal.h"
#include "strv.h"

#define LABEL_NAME_MAX 63
#define LABEL_VALUE_MAX 63
#define LABEL_PREFIX_MAX 253
/* "-" + 6 hex digits of FNV-1a appended to a shortened value. */
#define LABEL_HASH_SUFFIX_LEN 7

LabelSet *label_set_new(void) {
        return calloc(1, sizeof(LabelSet));
}

LabelSet *label_set_free(LabelSet *s) {
        if (!s)
                return NULL;
        for (size_t i = 0; i < s->n; i++) {
                free(s->labels[i].key);
                free(s->labels[i].value);
        }
        free(s->labels);
        free(s);
        return NULL;
}

/* Index of key, or -(insertion point + 1) when absent. */
static ssize_t label_set_find(const LabelSet *s, const char *key) {
        size_t lo = 0, hi = s->n;

        while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                int c = strcmp(s->labels[mid].key, key);
                if (c == 0)
                        return (ssize_t) mid;
                if (c < 0)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        return -(ssize_t) lo - 1;
}

int label_set_put(LabelSet *s, const char *key, const char *value) {
        if (!s || !key || !value)
                return -EINVAL;
        if (!label_key_is_valid(key) || !label_value_is_valid(value))
                return -EINVAL;

        _cleanup_free_ char *v = strdup(value);
        if (!v)
                return -ENOMEM;

        ssize_t i = label_set_find(s, key);
        if (i >= 0) {
                free(s->labels[i].value);
                s->labels[i].value = TAKE_PTR(v);
                return 0;
        }

        _cleanup_free_ char *k = strdup(key);
        if (!k)
                return -ENOMEM;
        Label *l = reallocarray(s->labels, s->n + 1, sizeof(Label));
        if (!l)
                return -ENOMEM;
        s->labels = l;

        size_t pos = (size_t) (-i - 1);
        memmove(s->labels + pos + 1, s->labels + pos, (s->n - pos) * sizeof(Label));
        s->labels[pos] = (Label) { .key = TAKE_PTR(k), .value = TAKE_PTR(v) };
        s->n++;
        return 0;
}

const char *label_set_get(const LabelSet *s, const char *key) {
        if (!s || !key)
                return NULL;
        ssize_t i = label_set_find(s, key);
        return i >= 0 ? s->labels[i].value : NULL;
}

bool label_set_equal(const LabelSet *a, const LabelSet *b) {
        size_t na = a ? a->n : 0, nb = b ? b->n : 0;

        if (na != nb)
                return false;
        for (size_t i = 0; i < na; i++)
                if (!streq(a->labels[i].key, b->labels[i].key) ||
                    !streq(a->labels[i].value, b->labels[i].value))
                        return false;
        return true;
}

static bool is_alnum_ascii(char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

/* [A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])? of at most max characters, n > 0. */
static bool qualified_name_is_valid(const char *s, size_t n, size_t max) {
        if (n == 0 || n > max)
                return false;
        if (!is_alnum_ascii(s[0]) || !is_alnum_ascii(s[n - 1]))
                return false;
        for (size_t i = 1; i + 1 < n; i++)
                if (!is_alnum_ascii(s[i]) && !strchr("-_.", s[i]))
                        return false;
        return true;
}

/* DNS-1123 subdomain: lowercase labels [a-z0-9]([-a-z0-9]*[a-z0-9])? of ≤63 joined by dots, ≤253 in
 * all. */
static bool dns_subdomain_is_valid(const char *s, size_t n) {
        if (n == 0 || n > LABEL_PREFIX_MAX)
                return false;

        size_t start = 0;
        for (size_t i = 0; i <= n; i++) {
                if (i < n && s[i] != '.') {
                        char c = s[i];
                        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'))
                                return false;
                        continue;
                }
                size_t len = i - start;
                if (len == 0 || len > 63 || s[start] == '-' || s[i - 1] == '-')
                        return false;
                start = i + 1;
        }
        return true;
}

bool label_key_is_valid(const char *key) {
        if (!key)
                return false;

        const char *slash = strchr(key, '/');
        if (!slash)
                return qualified_name_is_valid(key, strlen(key), LABEL_NAME_MAX);
        if (!dns_subdomain_is_valid(key, (size_t) (slash - key)))
                return false;
        /* A second '/' fails the name charset check. */
        return qualified_name_is_valid(slash + 1, strlen(slash + 1), LABEL_NAME_MAX);
}

bool label_value_is_valid(const char *value) {
        if (!value)
                return false;
        if (!*value)
                return true;
        return qualified_name_is_valid(value, strlen(value), LABEL_VALUE_MAX);
}

char *label_sanitize(const char *s) {
        size_t n = strlen(s);
        char *r = malloc(n + 1), *p = r;
        bool pending_sep = false;

        if (!r)
                return NULL;
        /* Characters outside the set are deleted first (so "a\tb" becomes "ab", as in GFD whose regexp
         * removes them before splitting on the remaining spaces); runs of spaces become one '-'. */
        for (size_t i = 0; i < n; i++) {
                char c = s[i];
                if (c == ' ') {
                        pending_sep = p > r;
                        continue;
                }
                if (!is_alnum_ascii(c) && !strchr("-_.", c))
                        continue;
                if (pending_sep)
                        *p++ = '-';
                pending_sep = false;
                *p++ = c;
        }
        *p = 0;
        return r;
}

char *label_product_from_pci(const LabelPciGpu *gpu) {
        char *r;

        if (gpu->name) {
                /* pci.ids puts the marketing name in brackets after the chip: "GH100 [H100 SXM5 80GB]". */
                const char *b = strchr(gpu->name, '[');
                _cleanup_free_ char *model = NULL;
                if (b) {
                        const char *e = strchr(b + 1, ']');
                        model = e ? strndup(b + 1, (size_t) (e - b - 1)) : strdup(b + 1);
                } else
                        model = strdup(gpu->name);
                if (!model)
                        return NULL;

                _cleanup_free_ char *clean = label_sanitize(model);
                if (!clean)
                        return NULL;
                if (*clean) {
                        if (streq(clean, "NVIDIA") || startswith(clean, "NVIDIA-"))
                                return TAKE_PTR(clean);
                        return asprintf(&r, "NVIDIA-%s", clean) < 0 ? NULL : r;
                }
        }
        return asprintf(&r, "NVIDIA-%04x", gpu->device_id) < 0 ? NULL : r;
}

int label_read_machine(const char *sys_dir, char **ret) {
        _cleanup_free_ char *p = path_join(sys_dir, "class/dmi/id/product_name");
        char *s = NULL;

        if (!p)
                return -ENOMEM;
        /* No DMI (ARM servers without SMBIOS, containers without /sys/class/dmi) is normal: the label
         * then says "unknown", as GFD's does. */
        if (read_one_line_file(p, &s) == -ENOMEM)
                return -ENOMEM;
        if (s && !*s)
                s = mfree(s);
        *ret = s;
        return 0;
}

/* Makes "<model><suffix>" fit the 63-character value limit. Kubernetes rejects longer values and NFD
 * drops such a label silently (GFD issue #1876); we keep a prefix of the model and append "-" plus 6
 * hex digits of an FNV-1a hash of the full value, so that two long names still differ. suffix (e.g.
 * "-MIG-1g.10gb") is kept whole. *ret_shortened says whether it had to shorten. */
static int label_value_fit(const char *model, const char *suffix, char **ret, bool *ret_shortened) {
        _cleanup_free_ char *full = NULL;
        char *r;

        suffix = suffix ?: "";
        if (asprintf(&full, "%s%s", model, suffix) < 0)
                return -ENOMEM;
        if (strlen(full) <= LABEL_VALUE_MAX) {
                *ret = TAKE_PTR(full);
                *ret_shortened = false;
                return 0;
        }

        size_t sl = strlen(suffix);
        if (sl + LABEL_HASH_SUFFIX_LEN + 1 > LABEL_VALUE_MAX)
                return -EINVAL;
        size_t keep = LABEL_VALUE_MAX - LABEL_HASH_SUFFIX_LEN - sl;
        if (keep > strlen(model))
                keep = strlen(model);
        /* No "--" or "._" seam where the cut falls on a separator. */
        while (keep > 0 && !is_alnum_ascii(model[keep - 1]))
                keep--;
        if (keep == 0)
                return -EINVAL;
        if (asprintf(&r, "%.*s-%06x%s", (int) keep, model, fnv1a32_string(full) & 0xffffffu, suffix) < 0)
                return -ENOMEM;
        *ret = r;
        *ret_shortened = true;
        return 0;
}

/* Puts a computed label. Values that would break the Kubernetes rules are never written: a long one is
 * shortened (with a warning), one that is still invalid is left out (with a warning). */
int label_put_checked(LabelSet *s, const char *key, const char *model, const char *suffix,
                      char ***warnings) {
        _cleanup_free_ char *value = NULL;
        bool shortened = false;
        int r;

        r = label_value_fit(model, suffix, &value, &shortened);
        if (r == -ENOMEM)
                return r;
        if (r >= 0 && label_value_is_valid(value)) {
                if (shortened && warnings &&
                    strv_extendf(warnings,
                                 "Label %s: value '%s%s' is longer than the 63 characters Kubernetes "
                                 "allows; writing the shortened '%s' instead.",
                                 key, model, suffix ?: "", value) < 0)
                        return -ENOMEM;
                return label_set_put(s, key, value);
        }
        if (warnings &&
            strv_extendf(warnings,
                         "Label %s left out: value '%s%s' is not a valid Kubernetes label value "
                         "(at most 63 characters of [A-Za-z0-9-_.], starting and ending alphanumeric).",
                         key, model, suffix ?: "") < 0)
                return -ENOMEM;
        return 0;
}

int label_put_uint(LabelSet *s, const char *key, uint64_t n) {
        char buf[32];

        snprintf(buf, sizeof buf, "%" PRIu64, n);
        return label_set_put(s, key, buf);
}

static const char *gpu_mode(const LabelInput *in) {
        bool compute = true, graphics = true;

        /* class_code is 24 bits (class, subclass, prog-if): 0x0302xx is a 3D controller (data-centre
         * parts in compute mode), 0x0300xx a VGA controller (display mode). */
        for (size_t i = 0; i < in->n_pci_gpus; i++) {
                uint32_t c = in->pci_gpus[i].class_code >> 8;
                compute = compute && c == 0x0302;
                graphics = graphics && c == 0x0300;
        }
        return compute ? "compute" : graphics ? "graphics" : "unknown";
}

void label_models_free(LabelModel *m, size_t n) {
        for (size_t i = 0; i < n; i++)
                free(m[i].product);
        free(m);
}

int label_models_count(char *const *products, const char *const *addresses, size_t n, LabelModel **ret,
                       size_t *ret_n) {
        LabelModel *m = calloc(n ?: 1, sizeof(LabelModel));
        size_t k = 0;

        if (!m)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                size_t j;
                for (j = 0; j < k; j++)
                        if (streq(m[j].product, products[i]))
                                break;
                if (j == k) {
                        m[k].product = strdup(products[i]);
                        if (!m[k].product) {
                                label_models_free(m, k);
                                return -ENOMEM;
                        }
                        m[k++].first_address = addresses[i];
                }
                m[j].count++;
                if (strcmp(addresses[i], m[j].first_address) < 0)
                        m[j].first_address = addresses[i];
        }
        *ret = m;
        *ret_n = k;
        return 0;
}

/* GFD lets whichever model it sees last win, which is effectively random on a mixed node. We pick the
 * model with the most GPUs, ties going to the one with the lowest PCI address, and say which. */
size_t label_models_choose(const LabelModel *m, size_t n) {
        size_t best = 0;
        for (size_t i = 1; i < n; i++)
                if (m[i].count > m[best].count ||
                    (m[i].count == m[best].count && strcmp(m[i].first_address, m[best].first_address) < 0))
                        best = i;
        return best;
}

int label_models_warn(const LabelModel *m, size_t n, size_t chosen, char ***warnings) {
        _cleanup_strv_free_ char **others = NULL;

        if (n < 2 || !warnings)
                return 0;
        for (size_t i = 0; i < n; i++)
                if (i != chosen && strv_extendf(&others, "%s (%zu GPU%s)", m[i].product, m[i].count,
                                                m[i].count == 1 ? "" : "s") < 0)
                        return -ENOMEM;
        _cleanup_free_ char *list = strv_join(others, ", ");
        if (!list)
                return -ENOMEM;
        return strv_extendf(warnings,
                            "GPUs of more than one model on this node: labelling %s (%zu GPU%s, the most "
                            "numerous); gpu.count and gpu.product leave out %s.",
                            m[chosen].product, m[chosen].count, m[chosen].count == 1 ? "" : "s", list);
}

static const char *known_product(const LabelInput *in, const LabelPciGpu *gpu) {
        for (size_t i = 0; i < in->n_known_products; i++)
                if (streq(in->known_products[i].address, gpu->address) &&
                    in->known_products[i].device_id == gpu->device_id)
                        return in->known_products[i].product;
        return NULL;
}

void label_known_products_free(LabelKnownProduct *p, size_t n) {
        for (size_t i = 0; i < n; i++)
                free(p[i].product);
        free(p);
}

static const LabelPciGpu *pci_gpu(const LabelPciGpu *pci_gpus, size_t n_pci_gpus, const char *address) {
        for (size_t i = 0; i < n_pci_gpus; i++)
                if (streq(pci_gpus[i].address, address))
                        return &pci_gpus[i];
        return NULL;
}

int label_known_products_update(LabelKnownProduct **list, size_t *n, const LabelPciGpu *pci_gpus,
                                size_t n_pci_gpus, const LabelNvml *nvml, bool *ret_changed) {
        LabelKnownProduct *l = NULL;
        size_t k = 0;
        bool changed = false;
        int r = -ENOMEM;

        l = calloc((nvml ? nvml->n_gpus : 0) + *n + 1, sizeof(LabelKnownProduct));
        if (!l)
                return -ENOMEM;
        for (size_t i = 0; nvml && i < nvml->n_gpus; i++) {
                const LabelNvmlGpu *g = &nvml->gpus[i];
                const LabelPciGpu *pci = pci_gpu(pci_gpus, n_pci_gpus, g->pci_address);
                _cleanup_free_ char *product = label_sanitize(g->name ?: "");
                if (!product)
                        goto fail;
                if (!pci || isempty(product) || !label_value_is_valid(product))
                        continue;
                snprintf(l[k].address, sizeof(l[k].address), "%s", pci->address);
                l[k].device_id = pci->device_id;
                l[k].product = TAKE_PTR(product);
                k++;
        }
        for (size_t i = 0; i < *n; i++) {
                const LabelKnownProduct *old = &(*list)[i];
                const LabelPciGpu *pci = pci_gpu(pci_gpus, n_pci_gpus, old->address);
                bool found = false;

                for (size_t j = 0; j < k && !found; j++)
                        if (streq(l[j].address, old->address)) {
                                found = true;
                                changed = changed || l[j].device_id != old->device_id ||
                                          !streq(l[j].product, old->product);
                        }
                if (found)
                        continue;
                if (!pci || pci->device_id != old->device_id) {
                        changed = true; /* gone, or another GPU in its slot */
                        continue;
                }
                l[k] = *old;
                l[k].product = strdup(old->product);
                if (!l[k].product)
                        goto fail;
                k++;
        }
        changed = changed || k != *n;
        label_known_products_free(*list, *n);
        *list = l;
        *n = k;
        *ret_changed = changed;
        return 0;
fail:
        label_known_products_free(l, k);
        return r;
}

bool label_sharing_renames(const LabelInput *in) {
        return in->sharing > LABEL_SHARING_NONE && in->sharing < _LABEL_SHARING_MAX && in->replicas > 1 &&
               !in->rename_by_default;
}

int label_put_pci_models(LabelSet *s, const LabelInput *in, char ***warnings) {
        _cleanup_strv_free_ char **products = NULL;
        _cleanup_free_ const char **addresses = calloc(in->n_pci_gpus ?: 1, sizeof(char *));
        LabelModel *models = NULL;
        size_t n_models = 0;
        int r;

        if (!addresses)
                return -ENOMEM;
        for (size_t i = 0; i < in->n_pci_gpus; i++) {
                const char *known = known_product(in, &in->pci_gpus[i]);
                r = strv_consume(&products, known ? strdup(known) : label_product_from_pci(&in->pci_gpus[i]));
                if (r < 0)
                        return r;
                addresses[i] = in->pci_gpus[i].address;
        }

        /* GPUs bound to vfio-pci (passed through to a VM) are counted here: they are physical GPUs of
         * this node. With NVML, gpu.count is what NVML sees, as in GFD. */
        r = label_models_count(products, addresses, in->n_pci_gpus, &models, &n_models);
        if (r < 0)
                return r;
        size_t chosen = label_models_choose(models, n_models);
        r = label_models_warn(models, n_models, chosen, warnings);
        if (r >= 0)
                r = label_put_uint(s, LABEL_PREFIX "gpu.count", models[chosen].count);
        if (r >= 0)
                r = label_put_checked(s, LABEL_PREFIX "gpu.product", models[chosen].product,
                                      label_sharing_renames(in) ? "-SHARED" : NULL, warnings);
        label_models_free(models, n_models);
        return r;
}

/* Our own keys that do not depend on NVML; written only when the caller has a value. */
static int put_optional(LabelSet *s, const char *key, const char *value, char ***warnings) {
        return value ? label_put_checked(s, key, value, NULL, warnings) : 0;
}

int labels_compute(const LabelInput *in, LabelSet **ret, char ***warnings) {
        _cleanup_(label_set_freep) LabelSet *s = label_set_new();
        int r;

        if (!s)
                return -ENOMEM;
        if (in->n_pci_gpus == 0) {
                *ret = TAKE_PTR(s);
                return 0;
        }

        r = label_set_put(s, LABEL_PREFIX "gpu.present", "true");
        if (r < 0)
                return r;
        r = label_set_put(s, LABEL_PREFIX "gpu.mode", gpu_mode(in));
        if (r < 0)
                return r;

        _cleanup_free_ char *machine = label_sanitize(in->machine ?: "");
        if (!machine)
                return -ENOMEM;
        r = label_put_checked(s, LABEL_PREFIX "gpu.machine", isempty(machine) ? "unknown" : machine, NULL,
                              warnings);
        if (r < 0)
                return r;

        r = put_optional(s, LABEL_PREFIX "gpu-node-agent.state", in->agent_state, warnings);
        if (r >= 0)
                r = put_optional(s, LABEL_PREFIX "gpu-node-agent.version", in->version, warnings);
        if (r >= 0)
                r = put_optional(s, LABEL_PREFIX "mig.config", in->mig_config, warnings);
        if (r >= 0)
                r = put_optional(s, LABEL_PREFIX "mig.config.state", in->mig_config_state, warnings);
        if (r >= 0 && in->timestamp_sec > 0)
                r = label_put_uint(s, LABEL_PREFIX "gfd.timestamp", in->timestamp_sec);
        if (r >= 0 && in->gpu_health) {
                r = put_optional(s, LABEL_PREFIX "gpu.health", in->gpu_health, warnings);
                if (r >= 0)
                        r = label_put_uint(s, LABEL_PREFIX "gpu-node-agent.unhealthy-gpus", in->unhealthy_gpus);
        }
        if (r < 0)
                return r;

        /* Without NVML (driver not loaded yet, library missing) only what PCI tells us; the caller
         * reports the agent as degraded and retries NVML. */
        r = in->nvml ? label_put_gfd(s, in, warnings) : label_put_pci_models(s, in, warnings);
        if (r < 0)
                return r;

        *ret = TAKE_PTR(s);
        return 0;
}
