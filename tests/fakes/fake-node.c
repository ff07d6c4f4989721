/* SPDX-License-Identifier: MIT */
/* Owns the fake NVML's node description and state file (see fake-node.h and README.md for both
 * formats). The description is read once per load and never written; the state file is the only thing
 * that changes, always replaced atomically, and re-read whenever another process replaced it. */
#include <ctype.h>
#include <fcntl.h>
#include <sys/file.h>

#include "fake-node.h"

#define UNSET UINT32_MAX

static int parse_pci(const char *s, FakeGpu *g) {
        unsigned d, b, dv, f;
        char tail;
        if (sscanf(s, "%x:%x:%x.%x%c", &d, &b, &dv, &f, &tail) != 4 || d > 0xffff || b > 0xff || dv > 0x1f || f > 7)
                return -EINVAL;
        g->domain = d, g->bus = b, g->device = dv, g->function = f;
        snprintf(g->pci, sizeof g->pci, "%04x:%02x:%02x.%x", d, b, dv, f);
        return 0;
}

static int parse_uuid_bytes(const char *s, uint8_t out[16]) {
        size_t n = 0;
        for (const char *p = s; *p; p++) {
                if (*p == '-')
                        continue;
                if (!isxdigit((unsigned char) p[0]) || !isxdigit((unsigned char) p[1]) || n >= 16)
                        return -EINVAL;
                char hex[3] = { p[0], p[1], 0 };
                out[n++] = (uint8_t) strtoul(hex, NULL, 16);
                p++;
        }
        return n == 16 ? 0 : -EINVAL;
}

static const char *mode_str(bool on) {
        return on ? "enabled" : "disabled";
}

static int parse_mode(FakeYaml *y, yaml_node_t *n, const char *what, bool *ret, FakeError *e) {
        const char *s;
        int r = fake_yaml_str(y, n, what, &s, e);
        if (r < 0)
                return r;
        if (streq(s, "enabled") || streq(s, "true"))
                *ret = true;
        else if (streq(s, "disabled") || streq(s, "false"))
                *ret = false;
        else
                return fake_error(e, "%s:%u: %s must be 'enabled' or 'disabled', not '%s'", y->path,
                                  fake_yaml_line(n), what, s);
        return 0;
}

/* A CI given as a profile id (2), as "<C>c" or as a profile name "<C>c.<G>g.<GB>gb" / the GI's own name. */
static int parse_ci(FakeYaml *y, yaml_node_t *n, const FakeGiProfile *gp, unsigned *ret, FakeError *e) {
        const char *s;
        int r = fake_yaml_str(y, n, "a compute instance", &s, e);
        if (r < 0)
                return r;
        char *end;
        unsigned long v = strtoul(s, &end, 10);
        int idx = -1;
        if (end != s && !*end)
                idx = v < FAKE_N_CI_PROFILES ? (int) v : -1;
        else if (streq(s, gp->name))
                idx = fake_ci_index_for_slices(gp->g);
        else if (end != s && *end == 'c')
                idx = fake_ci_index_for_slices((unsigned) v);
        if (idx < 0 || !fake_ci_profile(gp, (unsigned) idx, NULL))
                return fake_error(e, "%s:%u: GPU instance profile %s has no compute instance profile '%s'; use a "
                                  "CI profile id or '<C>c' with C in 1, 2, 3, 4, 7 and at most %u", y->path,
                                  fake_yaml_line(n), gp->name, s, gp->g);
        *ret = (unsigned) idx;
        return 0;
}

static int parse_instance(FakeYaml *y, yaml_node_t *n, FakeGpu *g, FakeInitGi *ret, FakeError *e) {
        static const char *const keys[] = { "profile", "start", "compute", NULL };
        const char *s;
        uint64_t v;
        int r;

        r = fake_yaml_expect(y, n, YAML_MAPPING_NODE, "an entry of 'instances'", e);
        if (r < 0)
                return r;
        r = fake_yaml_check_keys(y, n, "an instance", keys, e);
        if (r < 0)
                return r;
        yaml_node_t *pn = fake_yaml_get(y, n, "profile");
        r = fake_yaml_str(y, pn, "'profile' of an instance", &s, e);
        if (r < 0)
                return r;
        *ret = (FakeInitGi) { .start = -1 };
        ret->profile = fake_model_gi_lookup(g->model, s);
        if (!ret->profile) {
                char list[512] = "";
                for (size_t i = 0; i < g->model->n_gi; i++) {
                        char one[64];
                        snprintf(one, sizeof one, "%s%s (id %u)", i ? ", " : "", g->model->gi[i].name,
                                 g->model->gi[i].id);
                        strncat(list, one, sizeof list - strlen(list) - 1);
                }
                return fake_error(e, "%s:%u: %s has no GPU instance profile '%s'; its profiles are: %s", y->path,
                                  fake_yaml_line(pn), g->model->name, s, list);
        }
        yaml_node_t *sn = fake_yaml_get(y, n, "start");
        if (sn) {
                r = fake_yaml_u64(y, sn, "'start' of an instance", g->model->memory_slices - 1, &v, e);
                if (r < 0)
                        return r;
                ret->start = (int) v;
        }
        yaml_node_t *cn = fake_yaml_get(y, n, "compute");
        if (cn) {
                r = fake_yaml_expect(y, cn, YAML_SEQUENCE_NODE, "'compute' of an instance", e);
                if (r < 0)
                        return r;
                if (fake_yaml_len(cn) == 0 || fake_yaml_len(cn) > FAKE_MAX_CI)
                        return fake_error(e, "%s:%u: 'compute' must list 1 to %d compute instances", y->path,
                                          fake_yaml_line(cn), FAKE_MAX_CI);
                for (size_t i = 0; i < fake_yaml_len(cn); i++) {
                        r = parse_ci(y, fake_yaml_item(y, cn, i), ret->profile, &ret->ci_profiles[ret->n_ci++], e);
                        if (r < 0)
                                return r;
                }
        }
        return 0;
}

static int parse_gpu(FakeYaml *y, yaml_node_t *n, FakeNode *node, FakeGpu *g, FakeError *e) {
        static const char *const keys[] = { "pci", "model", "name", "name_hex", "uuid", "minor", "subsystem", "mig",
                                            "mig_pending", "instances", "fabric", "nvlink", "processes", NULL };
        const char *s;
        uint64_t v;
        int r;

        r = fake_yaml_expect(y, n, YAML_MAPPING_NODE, "an entry of 'gpus'", e);
        if (r < 0)
                return r;
        r = fake_yaml_check_keys(y, n, "a GPU", keys, e);
        if (r < 0)
                return r;
        yaml_node_t *pci = fake_yaml_get(y, n, "pci");
        if (!pci)
                return fake_error(e, "%s:%u: a GPU has no 'pci' address; add one like pci: \"0000:1b:00.0\"",
                                  y->path, fake_yaml_line(n));
        r = fake_yaml_str(y, pci, "'pci' of a GPU", &s, e);
        if (r < 0)
                return r;
        if (parse_pci(s, g) < 0)
                return fake_error(e, "%s:%u: '%s' is not a PCI address; write it as domain:bus:device.function, "
                                  "e.g. 0000:1b:00.0", y->path, fake_yaml_line(pci), s);

        yaml_node_t *model = fake_yaml_get(y, n, "model");
        if (!model)
                return fake_error(e, "%s:%u: GPU %s has no 'model'; add the NVML name, e.g. \"NVIDIA H100 80GB "
                                  "HBM3\"", y->path, fake_yaml_line(n), g->pci);
        r = fake_yaml_str(y, model, "'model' of a GPU", &s, e);
        if (r < 0)
                return r;
        g->model = fake_models_find(&node->models, s);
        if (!g->model) {
                char list[1024] = "";
                for (size_t i = 0; i < node->models.n; i++) {
                        if (i)
                                strncat(list, ", ", sizeof list - strlen(list) - 1);
                        strncat(list, node->models.models[i].name, sizeof list - strlen(list) - 1);
                }
                return fake_error(e, "%s:%u: GPU %s: model '%s' is not in the model table %s; known models: %s",
                                  y->path, fake_yaml_line(model), g->pci, s, node->profiles_path, list);
        }
        g->subsystem = g->model->subsystem;

        /* A hostile driver's name: any string, or any bytes (name_hex), even what YAML cannot carry. */
        yaml_node_t *name = fake_yaml_get(y, n, "name"), *name_hex = fake_yaml_get(y, n, "name_hex");
        if (name && name_hex)
                return fake_error(e, "%s:%u: GPU %s has both 'name' and 'name_hex'; keep one", y->path,
                                  fake_yaml_line(n), g->pci);
        if (name) {
                r = fake_yaml_str(y, name, "'name' of a GPU", &s, e);
                if (r < 0)
                        return r;
                if (!(g->name = strdup(s)))
                        return -ENOMEM;
        }
        if (name_hex) {
                r = fake_yaml_str(y, name_hex, "'name_hex' of a GPU", &s, e);
                if (r < 0)
                        return r;
                size_t len = strlen(s);
                if (len == 0 || len % 2 || s[strspn(s, "0123456789abcdefABCDEF")] || strstr(s, "00"))
                        return fake_error(e, "%s:%u: GPU %s: name_hex '%s' is not pairs of hex digits without a "
                                          "00 byte, e.g. \"4e56ff\"", y->path, fake_yaml_line(name_hex), g->pci, s);
                if (!(g->name = calloc(len / 2 + 1, 1)))
                        return -ENOMEM;
                for (size_t i = 0; i < len / 2; i++) {
                        unsigned b;
                        sscanf(s + 2 * i, "%2x", &b);
                        g->name[i] = (char) b;
                }
                if (strlen(g->name) != len / 2)
                        return fake_error(e, "%s:%u: GPU %s: name_hex '%s' has a 00 byte", y->path,
                                          fake_yaml_line(name_hex), g->pci, s);
        }

        yaml_node_t *uuid = fake_yaml_get(y, n, "uuid");
        if (uuid) {
                r = fake_yaml_str(y, uuid, "'uuid' of a GPU", &s, e);
                if (r < 0)
                        return r;
                if (!startswith(s, "GPU-") || strlen(s) >= sizeof g->uuid)
                        return fake_error(e, "%s:%u: GPU %s: uuid '%s' must start with 'GPU-'", y->path,
                                          fake_yaml_line(uuid), g->pci, s);
                snprintf(g->uuid, sizeof g->uuid, "%s", s);
        }
        g->minor = UNSET;
        yaml_node_t *minor = fake_yaml_get(y, n, "minor");
        if (minor) {
                r = fake_yaml_u64(y, minor, "'minor' of a GPU", 254, &v, e);
                if (r < 0)
                        return r;
                g->minor = (unsigned) v;
        }
        yaml_node_t *sub = fake_yaml_get(y, n, "subsystem");
        if (sub) {
                r = fake_yaml_u64(y, sub, "'subsystem' of a GPU", UINT32_MAX, &v, e);
                if (r < 0)
                        return r;
                g->subsystem = (unsigned) v;
        }

        yaml_node_t *mig = fake_yaml_get(y, n, "mig"), *pending = fake_yaml_get(y, n, "mig_pending");
        if ((mig || pending) && !g->model->mig_capable)
                return fake_error(e, "%s:%u: GPU %s: %s is not MIG-capable; remove 'mig'", y->path,
                                  fake_yaml_line(mig ?: pending), g->pci, g->model->name);
        if (mig) {
                r = parse_mode(y, mig, "'mig' of a GPU", &g->init_mig, e);
                if (r < 0)
                        return r;
        }
        g->init_pending = g->init_mig;
        if (pending) {
                r = parse_mode(y, pending, "'mig_pending' of a GPU", &g->init_pending, e);
                if (r < 0)
                        return r;
        }
        yaml_node_t *inst = fake_yaml_get(y, n, "instances");
        if (inst) {
                r = fake_yaml_expect(y, inst, YAML_SEQUENCE_NODE, "'instances' of a GPU", e);
                if (r < 0)
                        return r;
                if (!g->init_mig)
                        return fake_error(e, "%s:%u: GPU %s has 'instances' but MIG is not enabled; add 'mig: "
                                          "enabled'", y->path, fake_yaml_line(inst), g->pci);
                g->init = calloc(fake_yaml_len(inst) ?: 1, sizeof *g->init);
                if (!g->init)
                        return -ENOMEM;
                for (size_t i = 0; i < fake_yaml_len(inst); i++) {
                        r = parse_instance(y, fake_yaml_item(y, inst, i), g, &g->init[g->n_init++], e);
                        if (r < 0)
                                return r;
                }
        }

        yaml_node_t *fabric = fake_yaml_get(y, n, "fabric");
        if (fabric) {
                static const char *const fkeys[] = { "cluster_uuid", "clique", "state", NULL };
                r = fake_yaml_expect(y, fabric, YAML_MAPPING_NODE, "'fabric' of a GPU", e);
                if (r >= 0)
                        r = fake_yaml_check_keys(y, fabric, "'fabric'", fkeys, e);
                if (r >= 0)
                        r = fake_yaml_str(y, fake_yaml_get(y, fabric, "cluster_uuid"), "'cluster_uuid' of 'fabric'",
                                          &s, e);
                if (r < 0)
                        return r;
                if (parse_uuid_bytes(s, g->cluster_uuid) < 0)
                        return fake_error(e, "%s:%u: GPU %s: cluster_uuid '%s' is not a UUID (32 hex digits)",
                                          y->path, fake_yaml_line(fabric), g->pci, s);
                r = fake_yaml_u64(y, fake_yaml_get(y, fabric, "clique"), "'clique' of 'fabric'", UINT32_MAX, &v, e);
                if (r < 0)
                        return r;
                g->clique = (unsigned) v;
                g->fabric_state = 3; /* completed */
                yaml_node_t *st = fake_yaml_get(y, fabric, "state");
                if (st) {
                        r = fake_yaml_str(y, st, "'state' of 'fabric'", &s, e);
                        if (r < 0)
                                return r;
                        if (streq(s, "not-started"))
                                g->fabric_state = 1;
                        else if (streq(s, "in-progress"))
                                g->fabric_state = 2;
                        else if (!streq(s, "completed"))
                                return fake_error(e, "%s:%u: fabric state must be not-started, in-progress or "
                                                  "completed, not '%s'", y->path, fake_yaml_line(st), s);
                }
                g->has_fabric = true;
        }

        yaml_node_t *nvlink = fake_yaml_get(y, n, "nvlink");
        if (nvlink) {
                r = fake_yaml_expect(y, nvlink, YAML_SEQUENCE_NODE, "'nvlink' of a GPU", e);
                if (r < 0)
                        return r;
                if (fake_yaml_len(nvlink) > FAKE_MAX_NVLINK)
                        return fake_error(e, "%s:%u: GPU %s has %zu NVLinks; NVML has at most %d per GPU",
                                          y->path, fake_yaml_line(nvlink), g->pci, fake_yaml_len(nvlink),
                                          FAKE_MAX_NVLINK);
                for (size_t i = 0; i < fake_yaml_len(nvlink); i++) {
                        FakeNvLink *l = &g->nvlink[g->n_nvlink++];
                        int end = -1;
                        r = fake_yaml_str(y, fake_yaml_item(y, nvlink, i), "an 'nvlink' entry", &s, e);
                        if (r < 0)
                                return r;
                        if (sscanf(s, "%x:%x:%x.%x%n", &l->domain, &l->bus, &l->device, &l->function, &end) != 4 ||
                            end != (int) strlen(s) || l->bus > 0xff || l->device > 0x1f || l->function > 7)
                                return fake_error(e, "%s:%u: GPU %s: NVLink %zu ends at '%s', which is not a PCI "
                                                  "address (the peer GPU's or NVSwitch's, e.g. 0000:05:00.0)",
                                                  y->path, fake_yaml_line(nvlink), g->pci, i, s);
                }
                g->has_nvlink = true;
        }

        yaml_node_t *procs = fake_yaml_get(y, n, "processes");
        if (procs) {
                static const char *const pkeys[] = { "pid", "memory_mib", "gi", "ci", NULL };
                r = fake_yaml_expect(y, procs, YAML_SEQUENCE_NODE, "'processes' of a GPU", e);
                if (r < 0)
                        return r;
                g->procs = calloc(fake_yaml_len(procs) ?: 1, sizeof *g->procs);
                if (!g->procs)
                        return -ENOMEM;
                for (size_t i = 0; i < fake_yaml_len(procs); i++) {
                        yaml_node_t *p = fake_yaml_item(y, procs, i);
                        FakeProcess *fp = &g->procs[g->n_procs++];
                        *fp = (FakeProcess) { .gi = UNSET, .ci = UNSET };
                        r = fake_yaml_expect(y, p, YAML_MAPPING_NODE, "a process", e);
                        if (r >= 0)
                                r = fake_yaml_check_keys(y, p, "a process", pkeys, e);
                        if (r >= 0)
                                r = fake_yaml_u64(y, fake_yaml_get(y, p, "pid"), "'pid' of a process", INT32_MAX, &v, e);
                        if (r < 0)
                                return r;
                        fp->pid = (unsigned) v;
                        if (fake_yaml_get(y, p, "memory_mib")) {
                                r = fake_yaml_u64(y, fake_yaml_get(y, p, "memory_mib"), "'memory_mib' of a process",
                                                  g->model->total_mib, &fp->memory_mib, e);
                                if (r < 0)
                                        return r;
                        }
                        if (fake_yaml_get(y, p, "gi")) {
                                r = fake_yaml_u64(y, fake_yaml_get(y, p, "gi"), "'gi' of a process", FAKE_MAX_GI - 1, &v, e);
                                if (r < 0)
                                        return r;
                                fp->gi = (unsigned) v;
                                fp->ci = 0;
                        }
                        if (fake_yaml_get(y, p, "ci")) {
                                r = fake_yaml_u64(y, fake_yaml_get(y, p, "ci"), "'ci' of a process", FAKE_MAX_CI - 1, &v, e);
                                if (r < 0)
                                        return r;
                                fp->ci = (unsigned) v;
                        }
                }
        }
        return 0;
}

static int cmp_gpu(const void *a, const void *b) {
        const FakeGpu *x = a, *y = b;
        return strcmp(x->pci, y->pci);
}

static int parse_description(FakeNode *node, FakeError *e) {
        static const char *const keys[] = { "driver_version", "cuda_version", "nvml_version", "latency", "gpus",
                                            NULL };
        _cleanup_(fake_yaml_done) FakeYaml y = {};
        const char *s;
        int r;

        r = fake_yaml_load(&y, node->description_path, e);
        if (r < 0)
                return r;
        yaml_node_t *root = fake_yaml_root(&y);
        r = fake_yaml_expect(&y, root, YAML_MAPPING_NODE, "the node description", e);
        if (r >= 0)
                r = fake_yaml_check_keys(&y, root, "the node description", keys, e);
        if (r < 0)
                return r;

        s = "550.127.05";
        if (fake_yaml_get(&y, root, "driver_version")) {
                r = fake_yaml_str(&y, fake_yaml_get(&y, root, "driver_version"), "'driver_version'", &s, e);
                if (r < 0)
                        return r;
        }
        node->driver_version = strdup(s);
        if (fake_yaml_get(&y, root, "latency")) {
                r = fake_yaml_str(&y, fake_yaml_get(&y, root, "latency"), "'latency'", &s, e);
                if (r < 0)
                        return r;
                if (!(node->latency = strdup(s)))
                        return -ENOMEM;
        }
        if (fake_yaml_get(&y, root, "nvml_version")) {
                r = fake_yaml_str(&y, fake_yaml_get(&y, root, "nvml_version"), "'nvml_version'", &s, e);
                if (r < 0)
                        return r;
                node->nvml_version = strdup(s);
        } else if (asprintf(&node->nvml_version, "12.%s", node->driver_version ?: "") < 0)
                node->nvml_version = NULL;
        if (!node->driver_version || !node->nvml_version)
                return -ENOMEM;

        node->cuda_version = 12040;
        yaml_node_t *cuda = fake_yaml_get(&y, root, "cuda_version");
        if (cuda) {
                unsigned maj, min;
                char tail;
                r = fake_yaml_str(&y, cuda, "'cuda_version'", &s, e);
                if (r < 0)
                        return r;
                if (sscanf(s, "%u.%u%c", &maj, &min, &tail) == 2 && maj < 100 && min < 100)
                        node->cuda_version = (int) (maj * 1000 + min * 10);
                else if (sscanf(s, "%u%c", &maj, &tail) == 1 && maj < 1000000)
                        node->cuda_version = (int) maj;
                else
                        return fake_error(e, "%s:%u: cuda_version must be like \"12.4\" or 12040, not '%s'",
                                          y.path, fake_yaml_line(cuda), s);
        }

        yaml_node_t *gpus = fake_yaml_get(&y, root, "gpus");
        if (gpus) {
                r = fake_yaml_expect(&y, gpus, YAML_SEQUENCE_NODE, "'gpus'", e);
                if (r < 0)
                        return r;
        }
        node->gpus = calloc(fake_yaml_len(gpus) ?: 1, sizeof *node->gpus);
        if (!node->gpus)
                return -ENOMEM;
        for (size_t i = 0; i < fake_yaml_len(gpus); i++) {
                r = parse_gpu(&y, fake_yaml_item(&y, gpus, i), node, &node->gpus[node->n_gpus++], e);
                if (r < 0)
                        return r;
                for (size_t j = 0; j + 1 < node->n_gpus; j++)
                        if (streq(node->gpus[j].pci, node->gpus[node->n_gpus - 1].pci))
                                return fake_error(e, "%s: GPU %s is listed twice", y.path, node->gpus[j].pci);
        }
        /* NVML numbers GPUs in PCI bus order; minors default to the same order, as the driver assigns them. */
        qsort(node->gpus, node->n_gpus, sizeof *node->gpus, cmp_gpu);
        for (size_t i = 0; i < node->n_gpus; i++) {
                FakeGpu *g = &node->gpus[i];
                if (g->minor == UNSET)
                        g->minor = (unsigned) i;
                if (!g->uuid[0])
                        snprintf(g->uuid, sizeof g->uuid, "GPU-%04x%04x-0000-4000-8000-%04x%08x", g->domain,
                                 (g->bus << 8) | (g->device << 3) | g->function, g->model->pci_device_id, g->minor);
        }
        return 0;
}

static const char *result_words(FakeResult r) {
        switch (r) {
        case FAKE_OK:
                return "success";
        case FAKE_INVALID:
                return "the placement start is not one of the profile's";
        case FAKE_NOT_SUPPORTED:
                return "not supported";
        case FAKE_NOT_FOUND:
                return "not found";
        case FAKE_IN_USE:
                return "in use";
        case FAKE_INSUFFICIENT:
                return "no room left (placement taken, profile limit or compute slices exhausted)";
        }
        return "unknown";
}

int fake_node_reset_to_description(FakeNode *n, FakeError *e) {
        n->serial = 0;
        for (size_t i = 0; i < n->n_gpus; i++) {
                FakeGpu *g = &n->gpus[i];
                g->mig_current = g->init_mig;
                g->mig_pending = g->init_pending;
                memset(g->gi, 0, sizeof g->gi);
                for (size_t k = 0; k < g->n_init; k++) {
                        FakeInitGi *ig = &g->init[k];
                        unsigned gi, ci;
                        FakeResult fr = fake_mig_create_gi(g, ig->profile, ig->start, FAKE_FIT_BEST, &gi);
                        if (fr != FAKE_OK) {
                                char at[32] = "";
                                if (ig->start >= 0)
                                        snprintf(at, sizeof at, " at start %d", ig->start);
                                return fake_error(e, "%s: GPU %s: initial instance %zu (%s%s) cannot be created: "
                                                  "%s; change the layout", n->description_path, g->pci, k + 1,
                                                  ig->profile->name, at, result_words(fr));
                        }
                        const FakeGiProfile *gp = ig->profile;
                        unsigned whole = (unsigned) fake_ci_index_for_slices(gp->g);
                        for (size_t c = 0; c < (ig->n_ci ?: 1); c++) {
                                fr = fake_mig_create_ci(n, g, gi, ig->n_ci ? ig->ci_profiles[c] : whole, &ci);
                                if (fr != FAKE_OK)
                                        return fake_error(e, "%s: GPU %s: compute instance %zu of initial instance "
                                                          "%zu (%s) does not fit: %s; change the layout",
                                                          n->description_path, g->pci, c + 1, k + 1, gp->name,
                                                          result_words(fr));
                        }
                }
        }
        return 0;
}

/* ---- state file ---- */

typedef struct GpuState {
        bool mig_current, mig_pending;
        FakeGi gi[FAKE_MAX_GI];
} GpuState;

static int state_error(FakeYaml *y, yaml_node_t *n, const char *what, FakeError *e) {
        return fake_error(e, "state file %s:%u: %s; delete the file to start over from the node description",
                          y->path, fake_yaml_line(n), what);
}

static int read_state_gpu(FakeNode *n, FakeYaml *y, yaml_node_t *gn, GpuState *states, FakeError *e) {
        const char *s;
        uint64_t v[6];
        int r;

        r = fake_yaml_str(y, fake_yaml_get(y, gn, "pci"), "'pci' of a state GPU", &s, e);
        if (r < 0)
                return r;
        size_t idx = n->n_gpus;
        for (size_t i = 0; i < n->n_gpus; i++)
                if (streq(n->gpus[i].pci, s))
                        idx = i;
        if (idx == n->n_gpus)
                return 0; /* a GPU the description no longer has */
        FakeGpu *g = &n->gpus[idx];
        GpuState *st = &states[idx];
        *st = (GpuState) {};
        r = parse_mode(y, fake_yaml_get(y, gn, "mig_current"), "'mig_current'", &st->mig_current, e);
        if (r >= 0)
                r = parse_mode(y, fake_yaml_get(y, gn, "mig_pending"), "'mig_pending'", &st->mig_pending, e);
        if (r < 0)
                return r;

        static const char *const gi_keys[] = { "id", "profile", "start", "size", NULL };
        yaml_node_t *gis = fake_yaml_get(y, gn, "gpu_instances");
        for (size_t i = 0; i < fake_yaml_len(gis); i++) {
                yaml_node_t *it = fake_yaml_item(y, gis, i);
                for (size_t k = 0; gi_keys[k]; k++) {
                        r = fake_yaml_u64(y, fake_yaml_get(y, it, gi_keys[k]), gi_keys[k], 1000, &v[k], e);
                        if (r < 0)
                                return r;
                }
                const FakeGiProfile *p = fake_model_gi_by_id(g->model, (unsigned) v[1]);
                if (!p || v[3] != p->size || v[2] >= g->model->memory_slices ||
                    v[0] != fake_gi_id(g->model, (unsigned) v[2], (unsigned) v[3]) || st->gi[v[0]].used)
                        return state_error(y, it, "a GPU instance does not match the GPU's profiles", e);
                st->gi[v[0]] = (FakeGi) { .used = true, .profile = p->id, .start = (unsigned) v[2],
                                          .size = (unsigned) v[3] };
        }

        static const char *const ci_keys[] = { "gi", "id", "profile", "start", "size", NULL };
        yaml_node_t *cis = fake_yaml_get(y, gn, "compute_instances");
        for (size_t i = 0; i < fake_yaml_len(cis); i++) {
                yaml_node_t *it = fake_yaml_item(y, cis, i);
                for (size_t k = 0; ci_keys[k]; k++) {
                        r = fake_yaml_u64(y, fake_yaml_get(y, it, ci_keys[k]), ci_keys[k], 1000, &v[k], e);
                        if (r < 0)
                                return r;
                }
                r = fake_yaml_str(y, fake_yaml_get(y, it, "uuid"), "'uuid' of a compute instance", &s, e);
                if (r < 0)
                        return r;
                if (v[0] >= FAKE_MAX_GI || !st->gi[v[0]].used || v[1] >= FAKE_MAX_CI || st->gi[v[0]].ci[v[1]].used ||
                    strlen(s) >= sizeof st->gi[0].ci[0].uuid)
                        return state_error(y, it, "a compute instance names a GPU instance that does not exist", e);
                FakeCi *ci = &st->gi[v[0]].ci[v[1]];
                *ci = (FakeCi) { .used = true, .profile = (unsigned) v[2], .start = (unsigned) v[3],
                                 .size = (unsigned) v[4] };
                snprintf(ci->uuid, sizeof ci->uuid, "%s", s);
        }
        return 0;
}

static int read_state(FakeNode *n, FakeError *e) {
        _cleanup_(fake_yaml_done) FakeYaml y = {};
        _cleanup_free_ GpuState *states = NULL;
        struct stat st;
        uint64_t serial = 0;
        int r;

        r = fake_yaml_load(&y, n->state_path, e);
        if (r < 0)
                return r;
        /* Stat the file we read, not the path, so a replacement racing with us is seen next time. */
        if (stat(n->state_path, &st) < 0)
                return -errno;
        yaml_node_t *root = fake_yaml_root(&y);
        if (fake_yaml_get(&y, root, "serial")) {
                r = fake_yaml_u64(&y, fake_yaml_get(&y, root, "serial"), "'serial'", UINT64_MAX, &serial, e);
                if (r < 0)
                        return r;
        }
        states = calloc(n->n_gpus ?: 1, sizeof *states);
        if (!states)
                return -ENOMEM;
        /* GPUs the state file does not mention keep what they have (the description's initial state). */
        for (size_t i = 0; i < n->n_gpus; i++) {
                states[i].mig_current = n->gpus[i].mig_current;
                states[i].mig_pending = n->gpus[i].mig_pending;
                memcpy(states[i].gi, n->gpus[i].gi, sizeof states[i].gi);
        }
        yaml_node_t *gpus = fake_yaml_get(&y, root, "gpus");
        for (size_t i = 0; i < fake_yaml_len(gpus); i++) {
                r = read_state_gpu(n, &y, fake_yaml_item(&y, gpus, i), states, e);
                if (r < 0)
                        return r;
        }
        for (size_t i = 0; i < n->n_gpus; i++) {
                n->gpus[i].mig_current = states[i].mig_current;
                n->gpus[i].mig_pending = states[i].mig_pending;
                memcpy(n->gpus[i].gi, states[i].gi, sizeof states[i].gi);
        }
        n->serial = serial;
        n->seen = st;
        return 0;
}

int fake_node_save(FakeNode *n, FakeError *e) {
        _cleanup_free_ char *tmp = NULL;
        _cleanup_fclose_ FILE *f = NULL;
        int fd;

        if (asprintf(&tmp, "%s.XXXXXX", n->state_path) < 0)
                return -ENOMEM;
        fd = mkostemp(tmp, O_CLOEXEC);
        if (fd < 0)
                return fake_error(e, "cannot write the fake NVML state next to %s: %s", n->state_path,
                                  strerror(errno)), -errno;
        f = fdopen(fd, "w");
        if (!f) {
                close(fd);
                unlink(tmp);
                return -ENOMEM;
        }
        fprintf(f, "# Fake NVML state for %s: MIG mode and instances per GPU.\n"
                   "# Rewritten after every change; delete it to start over from the description.\n"
                   "serial: %llu\ngpus:\n", n->description_path, (unsigned long long) n->serial);
        for (size_t i = 0; i < n->n_gpus; i++) {
                const FakeGpu *g = &n->gpus[i];
                fprintf(f, "  - pci: \"%s\"\n    mig_current: %s\n    mig_pending: %s\n    gpu_instances:\n",
                        g->pci, mode_str(g->mig_current), mode_str(g->mig_pending));
                for (unsigned k = 0; k < FAKE_MAX_GI; k++)
                        if (g->gi[k].used)
                                fprintf(f, "      - {id: %u, profile: %u, start: %u, size: %u}\n", k, g->gi[k].profile,
                                        g->gi[k].start, g->gi[k].size);
                fprintf(f, "    compute_instances:\n");
                for (unsigned k = 0; k < FAKE_MAX_GI; k++)
                        for (unsigned c = 0; g->gi[k].used && c < FAKE_MAX_CI; c++) {
                                const FakeCi *ci = &g->gi[k].ci[c];
                                if (ci->used)
                                        fprintf(f, "      - {gi: %u, id: %u, profile: %u, start: %u, size: %u, "
                                                   "uuid: \"%s\"}\n", k, c, ci->profile, ci->start, ci->size, ci->uuid);
                        }
        }
        if (fflush(f) != 0 || ferror(f)) {
                int r = -errno;
                unlink(tmp);
                return fake_error(e, "cannot write %s: %s", tmp, strerror(-r)), r;
        }
        /* No fsync: this is test state, and the tests restart processes, not machines. */
        if (rename(tmp, n->state_path) < 0) {
                int r = -errno;
                unlink(tmp);
                return fake_error(e, "cannot replace %s: %s", n->state_path, strerror(-r)), r;
        }
        if (stat(n->state_path, &n->seen) < 0)
                return -errno;
        return 0;
}

int fake_node_sync(FakeNode *n, FakeError *e) {
        struct stat st;
        if (stat(n->state_path, &st) < 0) {
                if (errno != ENOENT)
                        return fake_error(e, "cannot read %s: %s", n->state_path, strerror(errno)), -errno;
                /* Deleted: start over from the description, as the README promises. */
                int r = fake_node_reset_to_description(n, e);
                return r < 0 ? r : fake_node_save(n, e);
        }
        if (st.st_ino == n->seen.st_ino && st.st_dev == n->seen.st_dev && st.st_size == n->seen.st_size &&
            st.st_mtim.tv_sec == n->seen.st_mtim.tv_sec && st.st_mtim.tv_nsec == n->seen.st_mtim.tv_nsec)
                return 0;
        return read_state(n, e);
}

int fake_node_lock(FakeNode *n, int *ret_fd, FakeError *e) {
        _cleanup_free_ char *p = NULL;
        if (asprintf(&p, "%s.lock", n->state_path) < 0)
                return -ENOMEM;
        int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0)
                return fake_error(e, "cannot open the lock file %s: %s", p, strerror(errno)), -errno;
        if (flock(fd, LOCK_EX) < 0) {
                int r = -errno;
                close(fd);
                return r;
        }
        int r = fake_node_sync(n, e);
        if (r < 0) {
                close(fd);
                return r;
        }
        *ret_fd = fd;
        return 0;
}

int fake_node_load(FakeNode **ret, const char *description, const char *state, const char *profiles, FakeError *e) {
        _cleanup_(fake_node_freep) FakeNode *n = NULL;
        int r, fd;

        n = calloc(1, sizeof *n);
        if (!n)
                return -ENOMEM;
        n->description_path = strdup(description);
        n->profiles_path = strdup(profiles);
        if (state)
                n->state_path = strdup(state);
        else if (asprintf(&n->state_path, "%s.state", description) < 0)
                n->state_path = NULL;
        if (!n->description_path || !n->profiles_path || !n->state_path)
                return -ENOMEM;

        r = fake_models_load(&n->models, profiles, e);
        if (r < 0)
                return r;
        r = parse_description(n, e);
        if (r < 0)
                return r;
        /* Always build the initial layout: it validates the description even when a state file exists. */
        r = fake_node_reset_to_description(n, e);
        if (r < 0)
                return r;
        r = fake_node_lock(n, &fd, e);
        if (r < 0)
                return r;
        if (n->seen.st_ino == 0) /* sync found no state file: the description's layout stands, save it */
                r = fake_node_save(n, e);
        close(fd);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(n);
        return 0;
}

FakeNode *fake_node_free(FakeNode *n) {
        if (!n)
                return NULL;
        for (size_t i = 0; i < n->n_gpus; i++) {
                free(n->gpus[i].procs);
                free(n->gpus[i].init);
                free(n->gpus[i].name);
        }
        free(n->gpus);
        fake_models_done(&n->models);
        free(n->description_path);
        free(n->state_path);
        free(n->profiles_path);
        free(n->driver_version);
        free(n->latency);
        free(n->nvml_version);
        free(n);
        return NULL;
}

FakeGpu *fake_node_find_gpu(FakeNode *n, const char *index_or_pci) {
        char *end;
        unsigned long i = strtoul(index_or_pci, &end, 10);
        if (end != index_or_pci && !*end)
                return i < n->n_gpus ? &n->gpus[i] : NULL;
        FakeGpu probe = {};
        const char *s = index_or_pci;
        /* nvidia-smi style "00000000:1B:00.0": drop extra domain digits. */
        if (strlen(s) == 16 && startswith(s, "0000"))
                s += 4;
        if (parse_pci(s, &probe) < 0)
                return NULL;
        for (size_t k = 0; k < n->n_gpus; k++)
                if (streq(n->gpus[k].pci, probe.pci))
                        return &n->gpus[k];
        return NULL;
}
