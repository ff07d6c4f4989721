/* SPDX-License-Identifier: MIT */
/* Owns the Manager's lifetime: creation, start-up (config, bus, signals, watchdog, device monitor),
 * the event loop, configuration reload, and teardown. The stage engine lives in manager-stage.c. */
#include <signal.h>
#include <sys/utsname.h>
#include <time.h>
#include <systemd/sd-daemon.h>

#include "build-config.h"
#include "cdi.h"
#include "devices.h"
#include "driver-unload.h"
#include "driver.h"
#include "event-util.h"
#include "fileio.h"
#include "gpu-nvml-worker.h"
#include "kube-node.h"
#include "log.h"
#include "health.h"
#include "metrics.h"
#include "manager.h"
#include "mig-cache.h"
#include "mig-manager.h"
#include "string-table.h"
#include "strv.h"

/* Device events arrive in bursts (a bind is remove+add+bind); one pass after they settle. */
#define SETTLE_USEC (300 * USEC_PER_MSEC)

/* NodeOps (node.h): what the stages, health, metrics, the MIG manager and the driver unload may ask of
 * the manager, which they do not see. */
static void node_op_stage_complete(Node *n, StageId id, int r, const char *message) {
        manager_stage_complete(manager_from_node(n), id, r, message);
}

static void node_op_stage_progress(Node *n, StageId id, const char *text) {
        manager_stage_progress(manager_from_node(n), id, text);
}

static void node_op_request_pass(Node *n, const char *reason) {
        manager_request_pass(manager_from_node(n), reason);
}

static void node_op_mark_dirty(Node *n, const char *path, const char *interface, const char *property) {
        manager_mark_dirty(manager_from_node(n), path, interface, property);
}

static void node_op_gpus_changed(Node *n, const Inventory *old) {
        manager_gpus_changed(manager_from_node(n), old);
}

static void node_op_nvml_changed(Node *n, const NvmlSnapshot *old) {
        manager_nvml_changed(manager_from_node(n), old);
}

static bool node_op_driver_removing(Node *n) {
        return driver_unload_held(n) || driver_reload_in_flight(n);
}

static const NodeOps manager_node_ops = {
        .stage_complete = node_op_stage_complete,
        .stage_progress = node_op_stage_progress,
        .request_pass = node_op_request_pass,
        .mark_dirty = node_op_mark_dirty,
        .gpus_changed = node_op_gpus_changed,
        .nvml_changed = node_op_nvml_changed,
        .nvml_stop = stage_nvml_stop,
        .nvml_read_async = stage_nvml_read_async,
        .nvml_read_input_async = stage_nvml_read_input_async,
        .metrics_update = metrics_update,
        .labels_write_now = stage_labels_write_now,
        .driver_removing = node_op_driver_removing,
};

Node *manager_node(Manager *m) {
        return &m->node;
}

const Node *manager_node_const(const Manager *m) {
        return &m->node;
}

Manager *manager_from_node(Node *n) {
        return (Manager *) ((char *) n - offsetof(Manager, node));
}

BusDirty **manager_bus_dirty(Manager *m) {
        return &m->bus_dirty;
}

const char *manager_config_error(const Manager *m) {
        return m->config_error;
}

int manager_new(const ManagerOptions *o, Manager **ret) {
        _cleanup_(manager_freep) Manager *m = calloc(1, sizeof(Manager));
        int r;

        if (!m)
                return -ENOMEM;
        m->options = *o;
        m->node.ops = &manager_node_ops;
        m->node.oneshot = o->oneshot;
        m->node.current_stage = _STAGE_INVALID;
        m->next_stage = _STAGE_INVALID;
        m->node.state = AGENT_STARTING;

        r = sd_event_new(&m->node.event);
        if (r < 0)
                return r;
        r = health_new(&m->node, &m->node.health);
        if (r < 0)
                return r;
        r = metrics_new(&m->node.metrics);
        if (r < 0)
                return r;

        *ret = TAKE_PTR(m);
        return 0;
}

Manager *manager_free(Manager *m) {
        if (!m)
                return NULL;

        /* An apply in flight holds fabric ops, event sources, a reset child and the NVML handle. */
        mig_manager_free(m->node.mig);
        health_free(m->node.health);
        metrics_free(m->node.metrics);
        manager_remote_done(m);
        kube_node_free(m->kube);
        free(m->node.kube_mig_config);
        free(m->node.kube_mig_config_refused);
        stage_driver_done(&m->node);
        stage_consumers_done(&m->node);
        stage_fabric_done(&m->node);
        if (m->options.bus)
                m->options.bus->disconnect(m);
        sd_device_monitor_unref(m->monitor);
        sd_event_source_unref(m->sig_term);
        sd_event_source_unref(m->sig_int);
        sd_event_source_unref(m->sig_hup);
        sd_event_source_unref(m->stage_source);
        sd_event_source_unref(m->retry_timer);
        sd_event_source_unref(m->node.refresh_timer);
        sd_event_source_unref(m->settle_timer);
        sd_event_source_unref(m->coalesce_timer);
        sd_event_unref(m->node.event);

        for (int i = 0; i < _STAGE_MAX; i++)
                free(m->node.stages[i].message);
        config_free(m->node.config);
        free(m->config_error);
        inventory_free(m->node.inventory);
        gpu_nvml_worker_free(m->node.nvml_worker);
        gpu_nvml_snapshot_free(m->node.nvml_snapshot);
        gpu_nvml_worker_free(m->node.nvml_reader);
        mig_profile_cache_free(m->node.mig_profiles);
        free(m->node.cdi_spec_text);
        cdi_mig_minors_cache_free(m->node.cdi_minors);
        free(m->node.devices_mig);
        label_set_free(m->node.labels);
        label_known_products_free(m->node.known_products, m->node.n_known_products);
        free(m->node.kernel_release);
        free(m);
        return NULL;
}

static void manager_apply_log_level(Manager *m) {
        log_set_max_level(m->options.log_level >= 0 ? m->options.log_level : m->node.config->log_level);
}

static int on_exit_signal(sd_event_source *s, const struct signalfd_siginfo *si, void *userdata) {
        Manager *m = userdata;

        log_info("Received SIG%s, exiting.", sigabbrev_np((int) si->ssi_signo));
        (void) sd_notify(false, "STOPPING=1\nSTATUS=Shutting down.");
        return sd_event_exit(m->node.event, 0);
}

static int on_sighup(sd_event_source *s, const struct signalfd_siginfo *si, void *userdata) {
        (void) manager_reload(userdata, NULL);
        return 0;
}

static int on_settled(sd_event_source *s, uint64_t usec, void *userdata) {
        manager_request_pass(userdata, "device change");
        return 0;
}

static int on_device_event(sd_device_monitor *mon, sd_device *d, void *userdata) {
        Manager *m = userdata;
        const char *syspath = NULL, *subsystem = NULL;
        sd_device_action_t action = _SD_DEVICE_ACTION_INVALID;

        (void) sd_device_get_syspath(d, &syspath);
        (void) sd_device_get_subsystem(d, &subsystem);
        (void) sd_device_get_action(d, &action);
        log_debug("Device event %d on %s (%s).", (int) action, strna(syspath), strna(subsystem));

        /* Only NVIDIA and Mellanox PCI functions matter, and of the modules only the driver's (NVML
         * becomes usable when nvidia loads) and the InfiniBand core (peermem). */
        if (subsystem && streq(subsystem, "pci")) {
                const char *vendor = NULL;
                if (sd_device_get_sysattr_value(d, "vendor", &vendor) >= 0 && vendor &&
                    !startswith(vendor, "0x10de") && !startswith(vendor, "0x15b3"))
                        return 0;
        } else if (subsystem && streq(subsystem, "module")) {
                const char *name = NULL;
                if (sd_device_get_sysname(d, &name) >= 0 && name && !startswith(name, "nvidia") &&
                    !streq(name, "ib_core"))
                        return 0;
        }

        int r = event_reset_time_relative(m->node.event, &m->settle_timer, CLOCK_MONOTONIC, SETTLE_USEC, 0, on_settled,
                                          m, "device-settle");
        if (r < 0)
                return log_warning_errno(r, "Failed to arm the device settle timer: %m");
        return 0;
}

/* Hotplug only makes sense on the host's own sysfs: sd-device always reads /sys, so with a
 * simulated or chroot sysfs the events would describe another machine. */
static int manager_setup_device_monitor(Manager *m) {
        int r;

        if (!streq(m->node.config->paths.sys, "/sys")) {
                log_debug("paths.sys is %s, not /sys: not watching device events.", m->node.config->paths.sys);
                return 0;
        }

        r = sd_device_monitor_new(&m->monitor);
        if (r >= 0)
                r = sd_device_monitor_filter_add_match_subsystem_devtype(m->monitor, "pci", NULL);
        if (r >= 0)
                r = sd_device_monitor_filter_add_match_subsystem_devtype(m->monitor, "module", NULL);
        if (r >= 0)
                r = sd_device_monitor_attach_event(m->monitor, m->node.event);
        if (r >= 0)
                r = sd_device_monitor_start(m->monitor, on_device_event, m);
        if (r < 0) {
                m->monitor = sd_device_monitor_unref(m->monitor);
                return log_warning_errno(r, "Cannot watch device events (%s); GPU hotplug is noticed only on "
                                         "Reconcile() or SIGHUP.", strerror(-r));
        }
        return 0;
}

static int manager_read_kernel_release(Manager *m) {
        _cleanup_free_ char *p = path_join(m->node.config->paths.proc, "sys/kernel/osrelease");
        char *s = NULL;
        struct utsname u;

        if (!p)
                return -ENOMEM;
        if (read_one_line_file(p, &s) >= 0 && !isempty(s)) {
                free(m->node.kernel_release);
                m->node.kernel_release = s;
                return 0;
        }
        free(s);
        if (uname(&u) < 0)
                return negative_errno();
        free(m->node.kernel_release);
        m->node.kernel_release = strdup(u.release);
        return m->node.kernel_release ? 0 : -ENOMEM;
}

int manager_startup(Manager *m) {
        _cleanup_free_ char *error = NULL;
        sigset_t ss;
        int r;

        r = manager_config_load(m, &m->node.config, &error);
        if (r < 0)
                return log_error_errno(r, "Invalid configuration, not starting: %s", error);
        manager_apply_log_level(m);
        STRV_FOREACH(s, m->node.config->sources)
                log_debug("Configuration file: %s", *s);

        sigemptyset(&ss);
        sigaddset(&ss, SIGTERM);
        sigaddset(&ss, SIGINT);
        sigaddset(&ss, SIGHUP);
        if (sigprocmask(SIG_BLOCK, &ss, NULL) < 0)
                return log_error_errno(errno, "Failed to block signals: %m");
        r = sd_event_add_signal(m->node.event, &m->sig_term, SIGTERM, on_exit_signal, m);
        if (r >= 0)
                r = sd_event_add_signal(m->node.event, &m->sig_int, SIGINT, on_exit_signal, m);
        if (r >= 0 && !m->options.oneshot)
                r = sd_event_add_signal(m->node.event, &m->sig_hup, SIGHUP, on_sighup, m);
        if (r < 0)
                return log_error_errno(r, "Failed to install signal handlers: %m");
        (void) sd_event_source_set_description(m->sig_term, "manager-sigterm");
        (void) sd_event_source_set_description(m->sig_int, "manager-sigint");
        if (m->sig_hup)
                (void) sd_event_source_set_description(m->sig_hup, "manager-sighup");

        /* Sends WATCHDOG=1 at half of $WATCHDOG_USEC; a no-op without it. */
        r = sd_event_set_watchdog(m->node.event, true);
        if (r < 0)
                log_warning_errno(r, "Failed to enable the watchdog: %m");

        r = manager_read_kernel_release(m);
        if (r < 0)
                return log_error_errno(r, "Failed to determine the kernel release: %m");

        if (!m->options.oneshot && m->options.bus) {
                r = m->options.bus->connect(m);
                if (r < 0)
                        return r;
                (void) manager_setup_device_monitor(m);
        }

        m->node.labels_timestamp_sec = (uint64_t) time(NULL);
        log_info("gpu-node-agent " GPU_NODE_AGENT_VERSION " starting (root %s, kernel %s).",
                 m->node.config->paths.root, m->node.kernel_release);
        manager_remote_update(m);
        manager_kube_update(m);
        manager_request_pass(m, "start-up");
        return 0;
}

int manager_run(Manager *m) {
        int r = sd_event_loop(m->node.event);
        if (r < 0)
                return log_error_errno(r, "Event loop failed: %m");
        return m->exit_code ? m->exit_code : r;
}

int manager_reload(Manager *m, char **ret_error) {
        _cleanup_free_ char *error = NULL;
        Config *c = NULL;
        int r;

        (void) sd_notify(false, "RELOADING=1\nSTATUS=Reloading configuration.");
        /* Reload (the method or SIGHUP) is one of the ways an admin says "load the driver again"
         * after Unload(), as Reconcile() is. */
        driver_unload_release(&m->node);
        log_info("Reloading configuration.");

        r = manager_config_load(m, &c, &error);
        if (r < 0) {
                log_error("Reload failed, keeping the previous configuration: %s", error);
                free(m->config_error);
                m->config_error = TAKE_PTR(error);
                m->config_error_remote = false;
                manager_mark_dirty(m, NULL, AGENT_MANAGER_INTERFACE, "ConfigError");
                (void) sd_notifyf(false, "READY=1\nSTATUS=Reload failed, previous configuration kept: %s",
                                  m->config_error);
                if (ret_error)
                        *ret_error = strdup(m->config_error);
                return r;
        }

        config_free(m->node.config);
        m->node.config = c;
        manager_apply_log_level(m);
        m->node.labels_timestamp_sec = (uint64_t) time(NULL);
        if (m->config_error) {
                m->config_error = mfree(m->config_error);
                manager_mark_dirty(m, NULL, AGENT_MANAGER_INTERFACE, "ConfigError");
        }
        manager_mark_dirty(m, NULL, AGENT_MANAGER_INTERFACE, "ConfigSources");
        (void) manager_read_kernel_release(m);
        manager_remote_update(m);
        manager_kube_update(m);
        log_info("Configuration reloaded (%zu file(s)).", strv_length(m->node.config->sources));
        (void) sd_notify(false, "READY=1");
        manager_request_pass(m, "reload");
        return 0;
}

void manager_mark_dirty(Manager *m, const char *path, const char *interface, const char *property) {
        if (m->options.bus)
                m->options.bus->mark_dirty(m, path, interface, property);
}

void manager_gpus_changed(Manager *m, const Inventory *old) {
        if (m->options.bus)
                m->options.bus->gpus_changed(m, old);
}

void manager_nvml_changed(Manager *m, const NvmlSnapshot *old) {
        if (m->options.bus)
                m->options.bus->nvml_changed(m, old);
}

void manager_stage_changed(Manager *m, StageId id) {
        if (m->options.bus)
                m->options.bus->stage_changed(m, id);
}
