/* SPDX-License-Identifier: MIT */
/* Owns the agent's system bus connection (open, attach, register, request the name, close), the
 * caller privilege check shared by the mutating methods, and the coalescing of PropertiesChanged:
 * properties are marked dirty wherever they change and one signal per object and interface goes out
 * once per event loop iteration, after the normal-priority work of that iteration. */
#include <linux/capability.h>
#include <systemd/sd-bus.h>
#include <systemd/sd-event.h>

#include "bus-mig.h"
#include "bus.h"
#include "driver-unload.h"
#include "log.h"
#include "strv.h"

/* Runs after the stage engine's defer source (normal priority), so a whole burst of transitions
 * is announced in one signal per interface. */
#define BUS_DIRTY_PRIORITY (SD_EVENT_PRIORITY_NORMAL + 10)

typedef struct BusDirtyEntry {
        char *path;
        char *interface;
        char **properties;  /* NULL together with all */
        bool all;           /* every EMITS_CHANGE property of the interface */
} BusDirtyEntry;

struct BusDirty {
        Manager *manager;
        sd_event_source *defer;
        BusDirtyEntry *entries;
        size_t n_entries;
        /* While InterfacesRemoved is being built, the inventory the vanishing GPUs still live in. */
        const Inventory *vanishing;
        /* The ApplyMigConfig() call waiting for its apply (bus-mig.c); dropped unanswered at exit. */
        sd_bus_message *mig_request;
        /* The unprivileged MIG reads (bus-mig.c): when the current window began, how many it had. */
        uint64_t mig_read_window_usec;
        unsigned mig_read_count;
};

static const sd_bus_error_map agent_error_map[] = {
        SD_BUS_ERROR_MAP(AGENT_ERROR_INVALID_CONFIG, EINVAL),
        SD_BUS_ERROR_MAP(AGENT_ERROR_ACCESS_DENIED, EACCES),
        SD_BUS_ERROR_MAP(AGENT_ERROR_BUSY, EBUSY),
        SD_BUS_ERROR_MAP(AGENT_ERROR_UNLOAD_FAILED, EIO),
        SD_BUS_ERROR_MAP(AGENT_ERROR_FAILED, EIO),
        SD_BUS_ERROR_MAP_END,
};

static void entry_done(BusDirtyEntry *e) {
        free(e->path);
        free(e->interface);
        strv_free(e->properties);
        *e = (BusDirtyEntry) {};
}

static void bus_dirty_clear(BusDirty *d) {
        for (size_t i = 0; i < d->n_entries; i++)
                entry_done(&d->entries[i]);
        free(d->entries);
        d->entries = NULL;
        d->n_entries = 0;
}

void bus_dirty_free(BusDirty *d) {
        if (!d)
                return;
        bus_dirty_clear(d);
        sd_event_source_disable_unref(d->defer);
        sd_bus_message_unref(d->mig_request);
        free(d);
}

const Inventory *bus_dirty_vanishing(const Manager *m) {
        BusDirty *const *d = manager_bus_dirty((Manager *) m);

        return *d ? (*d)->vanishing : NULL;
}

void bus_dirty_set_vanishing(Manager *m, const Inventory *old) {
        BusDirty *d = *manager_bus_dirty(m);

        if (d)
                d->vanishing = old;
}

static void bus_dirty_flush(BusDirty *d) {
        Manager *m = d->manager;
        Node *n = manager_node(m);

        for (size_t i = 0; i < d->n_entries; i++) {
                BusDirtyEntry *e = &d->entries[i];
                int r;

                if (n->bus) {
                        r = sd_bus_emit_properties_changed_strv(n->bus, e->path, e->interface,
                                                                e->all ? NULL : e->properties);
                        /* An object can vanish between marking and flushing (GPU removed): nothing to
                         * announce then, InterfacesRemoved already told the clients. */
                        if (r < 0)
                                log_debug("Could not emit PropertiesChanged for %s %s: %s", e->path,
                                          e->interface, strerror(-r));
                }
                entry_done(e);
        }
        d->n_entries = 0;
}

static int on_bus_dirty(sd_event_source *s, void *userdata) {
        bus_dirty_flush(userdata);
        return 0;
}

static int bus_dirty_get(Manager *m, BusDirty **ret) {
        BusDirty **slot = manager_bus_dirty(m);

        if (!*slot) {
                BusDirty *d = calloc(1, sizeof(*d));
                if (!d)
                        return -ENOMEM;
                d->manager = m;
                *slot = d;
        }
        *ret = *slot;
        return 0;
}

bool bus_mig_read_budget_take(Manager *m, uint64_t now, unsigned burst, uint64_t window_usec, uint64_t *ret_wait_usec) {
        BusDirty *d;

        if (bus_dirty_get(m, &d) < 0) {
                *ret_wait_usec = window_usec;
                return false;
        }
        if (now >= d->mig_read_window_usec + window_usec) {
                d->mig_read_window_usec = now;
                d->mig_read_count = 0;
        }
        if (d->mig_read_count < burst) {
                d->mig_read_count++;
                return true;
        }
        *ret_wait_usec = d->mig_read_window_usec + window_usec - now;
        return false;
}

sd_bus_message **bus_mig_pending_request(Manager *m) {
        BusDirty *d;

        return bus_dirty_get(m, &d) < 0 ? NULL : &d->mig_request;
}

static int bus_dirty_schedule(Manager *m, BusDirty *d) {
        Node *n = manager_node(m);
        int r;

        if (!n->event) {
                bus_dirty_flush(d);
                return 0;
        }
        if (!d->defer) {
                r = sd_event_add_defer(n->event, &d->defer, on_bus_dirty, d);
                if (r < 0)
                        return r;
                r = sd_event_source_set_priority(d->defer, BUS_DIRTY_PRIORITY);
                if (r < 0)
                        return r;
                (void) sd_event_source_set_description(d->defer, "bus-dirty");
        }
        return sd_event_source_set_enabled(d->defer, SD_EVENT_ONESHOT);
}

static int bus_dirty_add(Manager *m, const char *path, const char *interface, const char *property) {
        BusDirtyEntry *e = NULL;
        BusDirty *d;
        int r;

        r = bus_dirty_get(m, &d);
        if (r < 0)
                return r;

        for (size_t i = 0; i < d->n_entries; i++)
                if (streq(d->entries[i].path, path) && streq(d->entries[i].interface, interface)) {
                        e = &d->entries[i];
                        break;
                }

        if (!e) {
                BusDirtyEntry *n = realloc(d->entries, (d->n_entries + 1) * sizeof(*n));
                if (!n)
                        return -ENOMEM;
                d->entries = n;
                e = &d->entries[d->n_entries];
                *e = (BusDirtyEntry) { .path = strdup(path), .interface = strdup(interface) };
                if (!e->path || !e->interface) {
                        entry_done(e);
                        return -ENOMEM;
                }
                d->n_entries++;
        }

        if (!property) {
                e->all = true;
                e->properties = strv_free(e->properties);
        } else if (!e->all && !strv_contains(e->properties, property)) {
                r = strv_extend(&e->properties, property);
                if (r < 0)
                        return r;
        }

        return bus_dirty_schedule(m, d);
}

void manager_bus_mark_dirty(Manager *m, const char *path, const char *interface, const char *property) {
        Node *n = manager_node(m);
        int r;

        if (!n->bus)
                return;
        r = bus_dirty_add(m, path ?: AGENT_OBJECT_PATH, interface ?: AGENT_MANAGER_INTERFACE, property);
        if (r < 0)
                log_warning("Could not queue PropertiesChanged for %s: %s", property ?: "all properties",
                            strerror(-r));
}

int bus_check_privileged(sd_bus_message *m, sd_bus_error *error) {
        const char *member = sd_bus_message_get_member(m) ?: "This method";

        /* What the bus itself recorded for the sender's connection (its peer credentials at connect
         * time), never augmented from /proc/PID: that would be racy against PID reuse and would let a
         * process that dropped privileges later borrow another's. dbus-daemon and dbus-broker send no
         * capabilities, so on them this means effective UID 0 (or ours). */
        int r = sd_bus_query_sender_privilege(m, CAP_SYS_ADMIN);
        if (r < 0)
                return sd_bus_error_setf(error, AGENT_ERROR_ACCESS_DENIED,
                                         "%s requires root, and the caller's credentials could not be read from "
                                         "the bus: %s", member, strerror(-r));
        if (r == 0)
                return sd_bus_error_setf(error, AGENT_ERROR_ACCESS_DENIED, "%s requires root", member);
        return 0;
}

static void log_name_owner(sd_bus *bus) {
        _cleanup_(sd_bus_creds_unrefp) sd_bus_creds *creds = NULL;
        const char *unique = NULL, *comm = NULL;
        pid_t pid = 0;

        if (sd_bus_get_name_creds(bus, AGENT_BUS_NAME,
                                  SD_BUS_CREDS_UNIQUE_NAME | SD_BUS_CREDS_PID | SD_BUS_CREDS_COMM |
                                          SD_BUS_CREDS_AUGMENT,
                                  &creds) >= 0) {
                (void) sd_bus_creds_get_unique_name(creds, &unique);
                (void) sd_bus_creds_get_pid(creds, &pid);
                (void) sd_bus_creds_get_comm(creds, &comm);
        }

        if (pid > 0)
                log_error("Bus name %s is already owned by %s (pid %d, %s): is another gpu-node-agent running?",
                          AGENT_BUS_NAME, unique ?: "another connection", (int) pid, comm ?: "unknown");
        else
                log_error("Bus name %s is already owned by %s: is another gpu-node-agent running?",
                          AGENT_BUS_NAME, unique ?: "another connection");
}

int manager_bus_connect(Manager *m) {
        Node *n = manager_node(m);
        _cleanup_(sd_bus_flush_close_unrefp) sd_bus *bus = NULL;
        const char *address = getenv("DBUS_SYSTEM_BUS_ADDRESS");
        BusDirty *d;
        int r;

        r = sd_bus_open_system_with_description(&bus, "gpu-node-agent");
        if (r < 0)
                return log_error_errno(r, "Failed to connect to the system bus%s%s: %s", address ? " at " : "",
                                       address ?: "", strerror(-r));

        r = sd_bus_attach_event(bus, n->event, SD_EVENT_PRIORITY_NORMAL);
        if (r < 0)
                return log_error_errno(r, "Failed to attach the bus to the event loop: %s", strerror(-r));

        r = sd_bus_error_add_map(agent_error_map);
        if (r < 0)
                return log_error_errno(r, "Failed to register the D-Bus error map: %s", strerror(-r));

        r = sd_bus_add_object_manager(bus, NULL, AGENT_OBJECT_PATH);
        if (r < 0)
                return log_error_errno(r, "Failed to add the object manager at %s: %s", AGENT_OBJECT_PATH,
                                       strerror(-r));

        r = bus_manager_register(m, bus);
        if (r < 0)
                return log_error_errno(r, "Failed to register the %s interface: %s", AGENT_MANAGER_INTERFACE,
                                       strerror(-r));

        r = bus_gpu_register(m, bus);
        if (r < 0)
                return log_error_errno(r, "Failed to register the %s objects: %s", AGENT_GPU_INTERFACE,
                                       strerror(-r));

        /* Before the first pass, so that MigConfig/MigConfigState changes of the mig stage are announced. */
        r = bus_mig_attach(m);
        if (r < 0)
                return log_oom();

        r = bus_dirty_get(m, &d);
        if (r < 0)
                return log_oom();

        /* Synchronously and without queueing: two agents on one node would fight over the same files,
         * so the second one must fail now, loudly, rather than wait in line. */
        r = sd_bus_request_name(bus, AGENT_BUS_NAME, 0);
        if (r == -EEXIST) {
                log_name_owner(bus);
                return -EEXIST;
        }
        if (r == -EACCES || r == -EPERM)
                return log_error_errno(r, "The bus refused to let this process own %s: run the agent as root and "
                                       "install the D-Bus policy org.gpunodeagent.Agent1.conf into "
                                       "/usr/share/dbus-1/system.d/.", AGENT_BUS_NAME);
        if (r < 0 && r != -EALREADY)
                return log_error_errno(r, "Failed to request bus name %s: %s", AGENT_BUS_NAME, strerror(-r));

        n->bus = TAKE_PTR(bus);
        log_debug("Connected to the system bus as %s.", AGENT_BUS_NAME);
        return 0;
}

void manager_bus_disconnect(Manager *m) {
        Node *n = manager_node(m);
        /* Pending PropertiesChanged are dropped: the name goes away with the connection anyway. */
        BusDirty **d = manager_bus_dirty(m);

        bus_dirty_free(*d);
        *d = NULL;
        n->bus = sd_bus_flush_close_unref(n->bus);
}

const ManagerBusOps manager_bus_ops = {
        .connect = manager_bus_connect,
        .disconnect = manager_bus_disconnect,
        .mark_dirty = manager_bus_mark_dirty,
        .gpus_changed = manager_bus_gpus_changed,
        .nvml_changed = manager_bus_nvml_changed,
        .stage_changed = manager_bus_emit_stage_changed,
};
