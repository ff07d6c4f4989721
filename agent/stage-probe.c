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

int stage_probe_run(Node *n, char **ret_message) {
        _cleanup_(inventory_freep) Inventory *inv = NULL;
        _cleanup_free_ char *error = NULL;
        int r;

        r = probe_pci(n->config->paths.sys, n->config->paths.pci_ids, &inv, &error);
        if (r < 0) {
                *ret_message = TAKE_PTR(error);
                return r;
        }

        if (!n->inventory || !inventory_equal(n->inventory, inv)) {
                STRV_FOREACH(w, inv->warnings)
                        log_warning("%s", *w);
                log_inventory(inv);

                Inventory *old = n->inventory;
                n->inventory = TAKE_PTR(inv);
                node_gpus_changed(n, old);
                inventory_free(old);
        }

        *ret_message = strprintf("%zu GPU%s, %zu NVSwitch%s, %zu NIC%s", n->inventory->n_gpus,
                     n->inventory->n_gpus == 1 ? "" : "s", n->inventory->n_nvswitches,
                     n->inventory->n_nvswitches == 1 ? "" : "es", n->inventory->n_nics,
                     n->inventory->n_nics == 1 ? "" : "s");
        return STAGE_DONE;
}
