/* SPDX-License-Identifier: MIT */
/* Owns writing GPU layouts as a mig-parted v1 config (`gpunodectl mig export`): each GPU's devices by
 * name and count, and GPUs with the same layout merged into one entry — `devices: all` when every GPU is
 * alike, a device-filter when a layout covers exactly the GPUs of one PCI id, else an index list. In
 * mig-parted's format every device is one compute instance, and devices of one GPU instance profile
 * share GPU instances: a GPU instance holding several compute instances is written as one device per
 * compute instance ("1c.3g.20gb": 3), which the planner reads back as the same layout. */
#include <stdlib.h>
#include <string.h>

#include "mig-manager.h"
#include "mig-state.h"
#include "strv.h"

typedef struct Layout {
        bool enabled;
        char **devices;               /* "name\tcount", sorted by name */
        unsigned *gpus;               /* GPU indices */
        size_t n_gpus;
        uint32_t pci_id;
        bool one_pci_id;
} Layout;

static char *device_name(const MigGpuState *g, const MigGiState *gi, size_t k) {
        const MigGiProfile *p = mig_state_gi_profile(g, gi->profile_id);
        unsigned slices = 0;

        if (!p)
                return strprintf("profile-%u", gi->profile_id);
        if (k >= gi->n_cis)
                return strdup(p->name);
        for (size_t i = 0; i < p->n_ci_profiles; i++)
                if (p->ci_profiles[i].id == gi->ci_profile_ids[k])
                        slices = p->ci_profiles[i].slices;
        if (slices == 0 || slices == p->slices)
                return strdup(p->name);
        return strprintf("%uc.%s", slices, p->name);
}

static int gpu_devices(const MigGpuState *g, char ***ret) {
        _cleanup_strv_free_ char **names = NULL, **out = NULL;

        for (size_t i = 0; g->mig_current && i < g->n_gis; i++)
                for (size_t k = 0; k < (g->gis[i].n_cis ?: 1); k++)
                        if (strv_consume(&names, device_name(g, &g->gis[i], k)) < 0)
                                return -ENOMEM;
        strv_sort(names);
        for (size_t i = 0; names && names[i];) {
                size_t k = i;
                while (names[k] && streq(names[k], names[i]))
                        k++;
                if (strv_extendf(&out, "%s\t%zu", names[i], k - i) < 0)
                        return -ENOMEM;
                i = k;
        }
        *ret = TAKE_PTR(out);
        return 0;
}

static void layouts_free(Layout *l, size_t n) {
        for (size_t i = 0; i < n; i++) {
                strv_free(l[i].devices);
                free(l[i].gpus);
        }
        free(l);
}

int mig_export_yaml(const MigGpuState *gpus, size_t n_gpus, const char *config_name, char **ret_yaml) {
        Layout *layouts = calloc(n_gpus ?: 1, sizeof *layouts);
        size_t n_layouts = 0;
        _cleanup_strv_free_ char **out = NULL;
        int r = -ENOMEM;

        if (!layouts)
                return -ENOMEM;

        for (size_t i = 0; i < n_gpus; i++) {
                const MigGpuState *g = &gpus[i];
                _cleanup_strv_free_ char **devices = NULL;
                bool enabled = g->mig_capable && g->mig_current;
                Layout *l = NULL;

                r = gpu_devices(g, &devices);
                if (r < 0)
                        goto finish;
                for (size_t k = 0; k < n_layouts && !l; k++)
                        if (layouts[k].enabled == enabled && strv_equal(layouts[k].devices, devices))
                                l = &layouts[k];
                if (!l) {
                        l = &layouts[n_layouts++];
                        *l = (Layout) { .enabled = enabled, .devices = TAKE_PTR(devices), .pci_id = g->pci_id,
                                        .one_pci_id = true };
                        l->gpus = calloc(n_gpus, sizeof *l->gpus);
                        if (!l->gpus) {
                                r = -ENOMEM;
                                goto finish;
                        }
                }
                l->gpus[l->n_gpus++] = g->index;
                l->one_pci_id = l->one_pci_id && l->pci_id == g->pci_id;
        }

        r = -ENOMEM;
        if (strv_extend(&out, "version: v1") < 0 || strv_extend(&out, "mig-configs:") < 0 ||
            strv_extendf(&out, "  %s:", config_name) < 0)
                goto finish;
        for (size_t k = 0; k < n_layouts; k++) {
                const Layout *l = &layouts[k];
                bool filter = l->one_pci_id;

                /* A filter only when no other layout has GPUs of this PCI id. */
                for (size_t o = 0; filter && o < n_layouts; o++)
                        if (o != k)
                                for (size_t i = 0; i < n_gpus; i++)
                                        for (size_t x = 0; x < layouts[o].n_gpus; x++)
                                                if (layouts[o].gpus[x] == gpus[i].index && gpus[i].pci_id == l->pci_id)
                                                        filter = false;

                if (n_layouts == 1) {
                        if (strv_extend(&out, "    - devices: all") < 0)
                                goto finish;
                } else if (filter) {
                        if (strv_extendf(&out, "    - device-filter: \"0x%08X\"", l->pci_id) < 0 ||
                            strv_extend(&out, "      devices: all") < 0)
                                goto finish;
                } else {
                        _cleanup_strv_free_ char **idx = NULL;
                        _cleanup_free_ char *joined = NULL;
                        for (size_t i = 0; i < l->n_gpus; i++)
                                if (strv_extendf(&idx, "%u", l->gpus[i]) < 0)
                                        goto finish;
                        joined = strv_join(idx, ", ");
                        if (!joined || strv_extendf(&out, "    - devices: [%s]", joined) < 0)
                                goto finish;
                }
                if (strv_extendf(&out, "      mig-enabled: %s", l->enabled ? "true" : "false") < 0)
                        goto finish;
                if (!l->enabled)
                        continue;
                if (!l->devices) {
                        if (strv_extend(&out, "      mig-devices: {}") < 0)
                                goto finish;
                        continue;
                }
                if (strv_extend(&out, "      mig-devices:") < 0)
                        goto finish;
                STRV_FOREACH(d, l->devices) {
                        const char *tab = strchr(*d, '\t');
                        if (strv_extendf(&out, "        \"%.*s\": %s", (int) (tab - *d), *d, tab + 1) < 0)
                                goto finish;
                }
        }
        if (strv_extend(&out, "") < 0)
                goto finish;
        *ret_yaml = strv_join(out, "\n");
        r = *ret_yaml ? 0 : -ENOMEM;

finish:
        layouts_free(layouts, n_layouts);
        return r;
}
