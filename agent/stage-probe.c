/* SPDX-License-Identifier: MIT */
/* Owns the probe stage: reads the PCI inventory and publishes changes (log, D-Bus objects). */
#include "log.h"
#include "stage-table.h"
#include "strv.h"

static void log_inventory(const Inventory *inv) {
        for (size_t i = 0; i < inv->n_gpus; i++) {
                const PciDevice *g = &inv->gpus[i];
                log_info("GPU %u: %s %04x:%04x %s, NUMA %d, driver %s%s%s.", g->index, g->address, g->vendor_id,
                         g->device_id, g->name ?: "(unknown name)", g->numa_node, g->driver ?: "none",
                         g->link_speed ? ", link " : "", g->link_speed ?: "");
        }
        if (inv->n_nvswitches > 0)
                log_info("%zu NVSwitch%s found.", inv->n_nvswitches, inv->n_nvswitches == 1 ? "" : "es");
        if (inv->n_nics > 0)
                log_info("%zu Mellanox/NVIDIA networking device%s found.", inv->n_nics, inv->n_nics == 1 ? "" : "s");
}

int stage_probe_run(Node *m, char **ret_message) {
        _cleanup_(inventory_freep) Inventory *inv = NULL;
        _cleanup_free_ char *error = NULL;
        int r;

        r = probe_pci(m->config->paths.sys, m->config->paths.pci_ids, &inv, &error);
        if (r < 0) {
                *ret_message = TAKE_PTR(error);
                return r;
        }

        if (!m->inventory || !inventory_equal(m->inventory, inv)) {
                STRV_FOREACH(w, inv->warnings)
                        log_warning("%s", *w);
                log_inventory(inv);

                Inventory *old = m->inventory;
                m->inventory = TAKE_PTR(inv);
                node_gpus_changed(m, old);
                inventory_free(old);
        }

        *ret_message = strprintf("%zu GPU%s, %zu NVSwitch%s, %zu NIC%s", m->inventory->n_gpus,
                     m->inventory->n_gpus == 1 ? "" : "s", m->inventory->n_nvswitches,
                     m->inventory->n_nvswitches == 1 ? "" : "es", m->inventory->n_nics,
                     m->inventory->n_nics == 1 ? "" : "s");
        return STAGE_DONE;
}
