/* SPDX-License-Identifier: MIT */
/* Owns the org.gpunodeagent.Agent1.Gpu objects, one per GPU of the current inventory at
 * /org/gpunodeagent/Agent1/gpu/<index>: a fallback vtable that looks the GPU up by index, the node
 * enumerator the object manager lists them with, and InterfacesAdded/Removed when the GPU list
 * changes. Documented in docs/dbus/org.gpunodeagent.Agent1.Gpu.md. */
#include <inttypes.h>
#include <stdio.h>
#include <systemd/sd-bus.h>

#include "bus.h"
#include "log.h"
#include "strv.h"

/* The index is written in plain decimal, not with sd_bus_path_encode(): that would escape a leading
 * digit ("_30"), and "gpu/0" is what a person types into busctl. */
static int gpu_path(unsigned index, char **ret) {
        return asprintf(ret, "%s/%u", AGENT_GPU_PATH_PREFIX, index) < 0 ? -ENOMEM : 0;
}

static int gpu_index_from_path(const char *path, unsigned *ret) {
        const char *p;
        unsigned long v;
        char *end;

        if (!startswith(path, AGENT_GPU_PATH_PREFIX "/"))
                return -EINVAL;
        p = path + strlen(AGENT_GPU_PATH_PREFIX "/");
        /* Exactly one canonical spelling per object: no sign, no leading zeros, no trailing junk. */
        if (*p < '0' || *p > '9' || (p[0] == '0' && p[1]))
                return -EINVAL;
        errno = 0;
        v = strtoul(p, &end, 10);
        if (errno != 0 || *end || v > UINT32_MAX)
                return -EINVAL;
        *ret = (unsigned) v;
        return 0;
}

static int gpu_object_find(sd_bus *bus, const char *path, const char *interface, void *userdata,
                           void **found, sd_bus_error *error) {
        Manager *m = userdata;
        const Inventory *vanishing;
        unsigned index;

        if (gpu_index_from_path(path, &index) < 0)
                return 0;

        if (m->inventory && index < m->inventory->n_gpus) {
                *found = &m->inventory->gpus[index];
                return 1;
        }
        vanishing = bus_dirty_vanishing(m);
        if (vanishing && index < vanishing->n_gpus) {
                *found = &vanishing->gpus[index];
                return 1;
        }
        return 0;
}

static int gpu_node_enumerator(sd_bus *bus, const char *path, void *userdata, char ***nodes,
                               sd_bus_error *error) {
        _cleanup_strv_free_ char **l = NULL;
        Manager *m = userdata;
        int r;

        for (size_t i = 0; m->inventory && i < m->inventory->n_gpus; i++) {
                char *p;
                r = gpu_path((unsigned) i, &p);
                if (r < 0)
                        return r;
                r = strv_consume(&l, p);
                if (r < 0)
                        return r;
        }
        *nodes = TAKE_PTR(l);
        return 1;
}

static int property_get_pci_address(sd_bus *bus, const char *path, const char *interface, const char *property,
                                    sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        const PciDevice *d = userdata;
        return sd_bus_message_append(reply, "s", d->address);
}

/* Strings that may be unknown are "" rather than absent: D-Bus has no null, and "" reads as
 * "not known" in every client language. */
static int property_get_string_or_empty(sd_bus *bus, const char *path, const char *interface,
                                        const char *property, sd_bus_message *reply, void *userdata,
                                        sd_bus_error *error) {
        const PciDevice *d = userdata;
        const char *v;

        if (streq(property, "Name"))
                v = d->name;
        else if (streq(property, "Driver"))
                v = d->driver;
        else if (streq(property, "LinkSpeed"))
                v = d->link_speed;
        else
                return -EINVAL;
        return sd_bus_message_append(reply, "s", v ?: "");
}

static const sd_bus_vtable gpu_vtable[] = {
        SD_BUS_VTABLE_START(0),

        /* The index is part of the object path, so it never changes for an object; everything else
         * can, when GPUs come and go (indices follow PCI address order) or drivers are rebound. */
        SD_BUS_PROPERTY("Index", "u", NULL, offsetof(PciDevice, index), SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("PciAddress", "s", property_get_pci_address, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("Name", "s", property_get_string_or_empty, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("VendorId", "q", NULL, offsetof(PciDevice, vendor_id),
                        SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("DeviceId", "q", NULL, offsetof(PciDevice, device_id),
                        SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("SubsystemVendorId", "q", NULL, offsetof(PciDevice, subsystem_vendor_id),
                        SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("SubsystemDeviceId", "q", NULL, offsetof(PciDevice, subsystem_device_id),
                        SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("Class", "u", NULL, offsetof(PciDevice, class_code), SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("NumaNode", "i", NULL, offsetof(PciDevice, numa_node), SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("IommuGroup", "i", NULL, offsetof(PciDevice, iommu_group),
                        SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("Driver", "s", property_get_string_or_empty, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("LinkSpeed", "s", property_get_string_or_empty, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("LinkWidth", "u", NULL, offsetof(PciDevice, link_width),
                        SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),

        SD_BUS_VTABLE_END,
};

int bus_gpu_register(Manager *m, sd_bus *bus) {
        int r;

        r = sd_bus_add_fallback_vtable(bus, NULL, AGENT_GPU_PATH_PREFIX, AGENT_GPU_INTERFACE, gpu_vtable,
                                       gpu_object_find, m);
        if (r < 0)
                return r;
        return sd_bus_add_node_enumerator(bus, NULL, AGENT_GPU_PATH_PREFIX, gpu_node_enumerator, m);
}

static bool gpu_equal(const PciDevice *a, const PciDevice *b) {
        return a->index == b->index && streq(a->address, b->address) && a->vendor_id == b->vendor_id &&
               a->device_id == b->device_id && a->subsystem_vendor_id == b->subsystem_vendor_id &&
               a->subsystem_device_id == b->subsystem_device_id && a->class_code == b->class_code &&
               streq_ptr(a->name, b->name) && a->numa_node == b->numa_node &&
               a->iommu_group == b->iommu_group && streq_ptr(a->driver, b->driver) &&
               streq_ptr(a->link_speed, b->link_speed) && a->link_width == b->link_width;
}

void manager_bus_gpus_changed(Manager *m, const Inventory *old) {
        size_t n_old = old ? old->n_gpus : 0, n_new = m->inventory ? m->inventory->n_gpus : 0;
        int r;

        if (!m->bus)
                return;

        for (size_t i = 0; i < n_old && i < n_new; i++)
                if (!gpu_equal(&old->gpus[i], &m->inventory->gpus[i])) {
                        _cleanup_free_ char *p = NULL;
                        if (gpu_path((unsigned) i, &p) < 0)
                                return (void) log_oom();
                        manager_bus_mark_dirty(m, p, AGENT_GPU_INTERFACE, NULL);
                }

        for (size_t i = n_new; i < n_old; i++) {
                _cleanup_free_ char *p = NULL;
                if (gpu_path((unsigned) i, &p) < 0)
                        return (void) log_oom();
                /* sd-bus lists the interfaces of a removed object by looking it up once more. */
                bus_dirty_set_vanishing(m, old);
                r = sd_bus_emit_object_removed(m->bus, p);
                bus_dirty_set_vanishing(m, NULL);
                if (r < 0)
                        log_warning("Could not emit InterfacesRemoved for %s: %s", p, strerror(-r));
        }

        for (size_t i = n_old; i < n_new; i++) {
                _cleanup_free_ char *p = NULL;
                if (gpu_path((unsigned) i, &p) < 0)
                        return (void) log_oom();
                r = sd_bus_emit_object_added(m->bus, p);
                if (r < 0)
                        log_warning("Could not emit InterfacesAdded for %s: %s", p, strerror(-r));
        }

        if (n_old != n_new)
                manager_bus_mark_dirty(m, NULL, NULL, "GpuCount");
}
