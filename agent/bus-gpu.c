/* SPDX-License-Identifier: MIT */
/* Owns the org.gpunodeagent.Agent1.Gpu objects, one per GPU of the current inventory at
 * /org/gpunodeagent/Agent1/gpu/<index>: a fallback vtable that looks the GPU up by index, the node
 * enumerator the object manager lists them with, InterfacesAdded/Removed when the GPU list changes,
 * and the NVML-backed properties with their change announcements (manager_bus_nvml_changed()).
 * Documented in docs/dbus/org.gpunodeagent.Agent1.Gpu.md. */
#include <inttypes.h>
#include <stdio.h>
#include <systemd/sd-bus.h>

#include "bus.h"
#include "escape.h"
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
        Node *n = manager_node(m);
        const Inventory *vanishing;
        unsigned index;

        if (gpu_index_from_path(path, &index) < 0)
                return 0;

        if (n->inventory && index < n->inventory->n_gpus) {
                *found = &n->inventory->gpus[index];
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
        Node *n = manager_node(m);
        int r;

        for (size_t i = 0; n->inventory && i < n->inventory->n_gpus; i++) {
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

/* sd-bus refuses a string that is not UTF-8 (-EINVAL), and one refused property fails the whole GetAll
 * and GetManagedObjects: a name NVML or pci.ids gave us with other bytes is sent with U+FFFD for them. */
static int append_string(sd_bus_message *reply, const char *v) {
        _cleanup_free_ char *valid = NULL;

        if (!v)
                v = "";
        if (!utf8_is_valid(v)) {
                valid = utf8_make_valid(v);
                if (!valid)
                        return -ENOMEM;
                v = valid;
        }
        return sd_bus_message_append(reply, "s", v);
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
        return append_string(reply, v);
}

static const GpuInfo *snapshot_find(const NvmlSnapshot *s, const char *address) {
        return s ? gpu_nvml_snapshot_find(s, address) : NULL;
}

/* The object's userdata is its PciDevice (so the PCI properties can be plain offsets); the NVML
 * properties also need the Manager's snapshot. sd-bus sets the current slot to the fallback vtable's
 * slot around every getter (Get, GetAll, GetManagedObjects, PropertiesChanged), and that slot's
 * userdata is the Manager we registered it with. */
static const GpuInfo *gpu_nvml_info(sd_bus *bus, const PciDevice *d) {
        sd_bus_slot *slot = sd_bus_get_current_slot(bus);
        const Manager *m = slot ? sd_bus_slot_get_userdata(slot) : NULL;
        const Node *n = m ? manager_node_const(m) : NULL;

        return n ? snapshot_find(n->nvml_snapshot, d->address) : NULL;
}

/* Every NVML property has one rendering, used both by the getters and by the change detection, so
 * that "changed" means exactly "a client would read something else". */
static const char *gpu_uuid(const GpuInfo *g) {
        return g && g->uuid ? g->uuid : "";
}

static const char *gpu_nvml_name(const GpuInfo *g) {
        return g && g->name ? g->name : "";
}

static uint64_t gpu_memory_mib(const GpuInfo *g) {
        return g ? g->memory_total_bytes >> 20 : 0;
}

static void gpu_compute_capability(const GpuInfo *g, char buf[static 24]) {
        if (g && g->cc_major >= 0 && g->cc_minor >= 0)
                snprintf(buf, 24, "%d.%d", g->cc_major, g->cc_minor);
        else
                buf[0] = 0;
}

static const char *gpu_mig_mode(const GpuInfo *g, bool pending) {
        GpuMigMode mode;

        if (!g)
                return "";
        mode = pending ? g->mig_pending : g->mig_current;
        if (mode < 0 || mode >= _GPU_MIG_MODE_MAX)
                return "";
        return gpu_mig_mode_to_string(mode) ?: "";
}

static bool gpu_mig_devices_equal(const GpuInfo *a, const GpuInfo *b) {
        size_t na = a ? a->n_mig_devices : 0, nb = b ? b->n_mig_devices : 0;

        if (na != nb)
                return false;
        for (size_t i = 0; i < na; i++) {
                const MigDeviceInfo *x = &a->mig_devices[i], *y = &b->mig_devices[i];
                if (!streq(x->uuid ?: "", y->uuid ?: "") || !streq(x->profile ?: "", y->profile ?: "") ||
                    x->gi_id != y->gi_id || x->ci_id != y->ci_id)
                        return false;
        }
        return true;
}

static int property_get_nvml_string(sd_bus *bus, const char *path, const char *interface, const char *property,
                                    sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        const GpuInfo *g = gpu_nvml_info(bus, userdata);
        char cc[24];
        const char *v;

        if (streq(property, "Uuid"))
                v = gpu_uuid(g);
        else if (streq(property, "NvmlName"))
                v = gpu_nvml_name(g);
        else if (streq(property, "ComputeCapability")) {
                gpu_compute_capability(g, cc);
                v = cc;
        } else if (streq(property, "MigMode"))
                v = gpu_mig_mode(g, false);
        else if (streq(property, "MigModePending"))
                v = gpu_mig_mode(g, true);
        else
                return -EINVAL;
        return append_string(reply, v);
}

static int property_get_memory_mib(sd_bus *bus, const char *path, const char *interface, const char *property,
                                   sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        return sd_bus_message_append(reply, "t", gpu_memory_mib(gpu_nvml_info(bus, userdata)));
}

static int property_get_mig_devices(sd_bus *bus, const char *path, const char *interface, const char *property,
                                    sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        const GpuInfo *g = gpu_nvml_info(bus, userdata);
        int r;

        r = sd_bus_message_open_container(reply, 'a', "(ssuu)");
        if (r < 0)
                return r;
        for (size_t i = 0; g && i < g->n_mig_devices; i++) {
                const MigDeviceInfo *d = &g->mig_devices[i];
                r = sd_bus_message_append(reply, "(ssuu)", d->uuid ?: "", d->profile ?: "", (uint32_t) d->gi_id,
                                          (uint32_t) d->ci_id);
                if (r < 0)
                        return r;
        }
        return sd_bus_message_close_container(reply);
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
        /* From NVML: "" / 0 / [] while NVML is unavailable or did not answer for this GPU. */
        SD_BUS_PROPERTY("NvmlName", "s", property_get_nvml_string, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("Uuid", "s", property_get_nvml_string, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("MemoryMiB", "t", property_get_memory_mib, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("ComputeCapability", "s", property_get_nvml_string, 0,
                        SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("MigMode", "s", property_get_nvml_string, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("MigModePending", "s", property_get_nvml_string, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("MigDevices", "a(ssuu)", property_get_mig_devices, 0,
                        SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("Health", "s", bus_health_property_get_gpu, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("HealthEvents", "as", bus_health_property_get_gpu_events, 0,
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
        Node *n = manager_node(m);
        size_t n_old = old ? old->n_gpus : 0, n_new = n->inventory ? n->inventory->n_gpus : 0;
        int r;

        if (!n->bus)
                return;

        for (size_t i = 0; i < n_old && i < n_new; i++)
                if (!gpu_equal(&old->gpus[i], &n->inventory->gpus[i])) {
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
                r = sd_bus_emit_object_removed(n->bus, p);
                bus_dirty_set_vanishing(m, NULL);
                if (r < 0)
                        log_warning("Could not emit InterfacesRemoved for %s: %s", p, strerror(-r));
        }

        for (size_t i = n_old; i < n_new; i++) {
                _cleanup_free_ char *p = NULL;
                if (gpu_path((unsigned) i, &p) < 0)
                        return (void) log_oom();
                r = sd_bus_emit_object_added(n->bus, p);
                if (r < 0)
                        log_warning("Could not emit InterfacesAdded for %s: %s", p, strerror(-r));
        }

        if (n_old != n_new)
                manager_bus_mark_dirty(m, NULL, NULL, "GpuCount");
}

static void gpu_nvml_mark_changed(Manager *m, const char *path, const GpuInfo *a, const GpuInfo *b) {
        char cc_a[24], cc_b[24];

        if (!streq(gpu_nvml_name(a), gpu_nvml_name(b)))
                manager_bus_mark_dirty(m, path, AGENT_GPU_INTERFACE, "NvmlName");
        if (!streq(gpu_uuid(a), gpu_uuid(b)))
                manager_bus_mark_dirty(m, path, AGENT_GPU_INTERFACE, "Uuid");
        if (gpu_memory_mib(a) != gpu_memory_mib(b))
                manager_bus_mark_dirty(m, path, AGENT_GPU_INTERFACE, "MemoryMiB");
        gpu_compute_capability(a, cc_a);
        gpu_compute_capability(b, cc_b);
        if (!streq(cc_a, cc_b))
                manager_bus_mark_dirty(m, path, AGENT_GPU_INTERFACE, "ComputeCapability");
        if (!streq(gpu_mig_mode(a, false), gpu_mig_mode(b, false)))
                manager_bus_mark_dirty(m, path, AGENT_GPU_INTERFACE, "MigMode");
        if (!streq(gpu_mig_mode(a, true), gpu_mig_mode(b, true)))
                manager_bus_mark_dirty(m, path, AGENT_GPU_INTERFACE, "MigModePending");
        if (!gpu_mig_devices_equal(a, b))
                manager_bus_mark_dirty(m, path, AGENT_GPU_INTERFACE, "MigDevices");
}

/* Lives here rather than in bus-manager.c because nearly all of it is per GPU; the two Manager
 * properties are compared the way their getters render them. */
void manager_bus_nvml_changed(Manager *m, const NvmlSnapshot *old) {
        Node *n = manager_node(m);
        const NvmlSnapshot *new = n->nvml_snapshot;
        int cuda_old = old && old->cuda_version > 0 ? old->cuda_version : 0;
        int cuda_new = new && new->cuda_version > 0 ? new->cuda_version : 0;

        if (!n->bus)
                return;

        if (!streq(old && old->driver_version ? old->driver_version : "",
                   new && new->driver_version ? new->driver_version : ""))
                manager_bus_mark_dirty(m, NULL, NULL, "DriverVersion");
        if (cuda_old != cuda_new)
                manager_bus_mark_dirty(m, NULL, NULL, "CudaVersion");

        /* By PCI address: the snapshot lists only the GPUs NVML knows, so positions need not match. */
        for (size_t i = 0; n->inventory && i < n->inventory->n_gpus; i++) {
                const char *address = n->inventory->gpus[i].address;
                _cleanup_free_ char *p = NULL;

                if (gpu_path((unsigned) i, &p) < 0)
                        return (void) log_oom();
                gpu_nvml_mark_changed(m, p, snapshot_find(old, address), snapshot_find(new, address));
        }
}
