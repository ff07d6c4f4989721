/* SPDX-License-Identifier: MIT */
/* Owns the fabric stage: the driver's daemons, started through systemd (modules/fabric.h does the
 * StartUnit/JobRemoved work on the bus's event loop). On an NVSwitch system nvidia-fabricmanager
 * first — the GPUs are unusable until it runs, so it is waited for and its failure fails the stage —
 * then nvidia-persistenced where it is installed. A unit that is already active is left alone, so a
 * re-run never restarts anything. The stage is asynchronous: the handler returns STAGE_RUNNING and
 * the unit callbacks finish it; the operation in flight is n->fabric_op, and the text gathered so far
 * is the stage's progress message (visible on D-Bus while it runs). */
#include <ctype.h>
#include <dirent.h>

#include "devices.h"
#include "driver-unload.h"
#include "fabric.h"
#include "fileio.h"
#include "log.h"
#include "strv.h"

static void fabric_persistenced_step(Node *n);

/* Appends part to the stage's progress text. */
static void fabric_progress(Node *n, const char *part) {
        const char *prev = n->stages[STAGE_FABRIC].message;
        _cleanup_free_ char *text = isempty(prev) ? strdup(part) : strprintf("%s; %s", prev, part);

        if (text)
                node_stage_progress(n, STAGE_FABRIC, text);
}

static void fabric_finish(Node *n, int r, const char *message) {
        _cleanup_free_ char *text = NULL;

        if (r >= 0 && !message) {
                /* The progress text is the summary; copy it, as completing replaces it. */
                text = strdup(n->stages[STAGE_FABRIC].message ?: "nothing to start");
                message = text;
        }
        node_stage_complete(n, STAGE_FABRIC, r, message);
}

/* Finishes the stage with what the op said, then frees the op (its info and message may point into it). */
static void fabric_op_done(Node *n, FabricOp *op, int r, const char *message) {
        fabric_finish(n, r, message);
        n->fabric_op = fabric_op_free(op);
}

static void fabric_record_started(Node *n, const char *unit) {
        if (!strv_contains(n->started_units, unit) && strv_extend(&n->started_units, unit) < 0)
                log_oom();
}

/* systemd is not on this bus (a private test bus, a container without it): sd-bus's errnos for
 * ServiceUnknown and NameHasNoOwner. Nothing can be managed then, which is not the units' fault. */
static bool systemd_absent(int r) {
        return r == -EHOSTUNREACH || r == -ENXIO;
}

#define SYSTEMD_ABSENT_MESSAGE                                                                         \
        "systemd is not on the system bus (org.freedesktop.systemd1 has no owner): " FABRIC_MANAGER_UNIT \
        " and " FABRIC_PERSISTENCED_UNIT " are not managed"

static bool unit_is_active(const FabricUnitInfo *info) {
        return streq_ptr(info->active_state, "active") || streq_ptr(info->active_state, "reloading");
}

/* An NVSwitch system by PCI (class 0x068000), or by the nvswitch driver's own list once it loaded. */
static size_t fabric_nvswitches(Node *n) {
        _cleanup_free_ char *p = path_join(n->config->paths.proc, "driver/nvidia-nvswitch/devices");
        _cleanup_closedir_ DIR *d = NULL;
        struct dirent *de;
        size_t count = 0;

        if (n->inventory && n->inventory->n_nvswitches > 0)
                return n->inventory->n_nvswitches;
        if (!p || !(d = opendir(p)))
                return 0;
        while ((de = readdir(d)))
                if (de->d_name[0] != '.')
                        count++;
        return count;
}

static bool looks_like_version(const char *s, size_t n) {
        bool dot = false;

        if (n == 0 || !isdigit((unsigned char) s[0]))
                return false;
        for (size_t i = 0; i < n; i++) {
                if (s[i] == '.')
                        dot = true;
                else if (!isdigit((unsigned char) s[i]))
                        return false;
        }
        return dot;
}

/* The loaded kernel module's version from <proc>/driver/nvidia/version: "NVRM version: NVIDIA UNIX
 * x86_64 Kernel Module  550.127.05  Tue Oct …" (or "… Open Kernel Module for x86_64  550.127.05 …"):
 * the first word shaped like a version. NULL when unknown. */
static char *fabric_driver_version(Node *n) {
        _cleanup_free_ char *p = path_join(n->config->paths.proc, "driver/nvidia/version"), *line = NULL;

        if (!p || read_one_line_file(p, &line) < 0 || !startswith(line, "NVRM version:"))
                return NULL;
        for (const char *s = line + strlen("NVRM version:"); *s;) {
                size_t len;
                s += strspn(s, " \t");
                len = strcspn(s, " \t");
                if (looks_like_version(s, len))
                        return strndup(s, len);
                s += len;
        }
        return NULL;
}

/* The installed fabric manager's version from the dpkg database under the root: Debian's
 * "nvidia-fabricmanager" or NVIDIA's "nvidia-fabricmanager-<branch>", status "install ok installed",
 * its Version without epoch and Debian revision ("1:550.127.05-1" → "550.127.05"). NULL when not
 * known (no dpkg, another package manager): the check is then skipped, as the unit itself refuses a
 * mismatch at start. */
static char *fabric_manager_version(Node *n) {
        _cleanup_free_ char *p = path_join(n->config->paths.root, "var/lib/dpkg/status"), *text = NULL;
        char *save = NULL;
        bool ours = false, installed = false;
        _cleanup_free_ char *version = NULL;

        if (!p || read_full_file(p, 64U << 20, &text, NULL) < 0)
                return NULL;
        /* One more empty line ends the last stanza as the others. */
        for (char *line = strtok_r(text, "\n", &save);; line = strtok_r(NULL, "\n", &save)) {
                if (!line || startswith(line, "Package:")) {
                        if (ours && installed && version) {
                                char *v = strchr(version, ':') ? strchr(version, ':') + 1 : version;
                                char *dash = strrchr(v, '-');
                                if (dash)
                                        *dash = '\0';
                                return strdup(v);
                        }
                        if (!line)
                                return NULL;
                        const char *name = line + strlen("Package:");
                        name += strspn(name, " \t");
                        const char *rest = startswith(name, "nvidia-fabricmanager")
                                                   ? name + strlen("nvidia-fabricmanager") : NULL;
                        ours = rest && (*rest == '\0' || (rest[0] == '-' && rest[1] &&
                                                           strspn(rest + 1, "0123456789") == strlen(rest + 1)));
                        installed = false;
                        version = mfree(version);
                } else if (startswith(line, "Status:"))
                        installed = strstr(line, "install ok installed") != NULL;
                else if (startswith(line, "Version:")) {
                        free(version);
                        version = strdup(line + strlen("Version:") + strspn(line + strlen("Version:"), " \t"));
                }
        }
}

static void on_persistenced_started(FabricOp *op, int r, const char *message, void *userdata) {
        Node *n = userdata;

        if (r < 0)
                return fabric_op_done(n, op, r, message);
        n->fabric_op = fabric_op_free(op);
        fabric_record_started(n, FABRIC_PERSISTENCED_UNIT);
        fabric_progress(n, FABRIC_PERSISTENCED_UNIT " started");
        log_info("Started " FABRIC_PERSISTENCED_UNIT ".");
        fabric_finish(n, STAGE_DONE, NULL);
}

static void on_persistenced_query(FabricOp *op, int r, const FabricUnitInfo *info, const char *message,
                                  void *userdata) {
        Node *n = userdata;
        /* Installed, as the query just said: if it vanished since, that is worth a failure. */
        FabricStartOptions opts = { .timeout_usec = n->config->fabric.timeout_usec, .require_installed = true };
        bool installed = info && info->installed, active = info && unit_is_active(info);

        if (systemd_absent(r))
                return fabric_op_done(n, op, STAGE_SKIPPED, SYSTEMD_ABSENT_MESSAGE);
        if (r < 0)
                return fabric_op_done(n, op, r, message);
        /* info lives in op: everything needed from it was read above. */
        n->fabric_op = fabric_op_free(op);
        if (!installed) {
                fabric_progress(n, FABRIC_PERSISTENCED_UNIT " is not installed; not started");
                return fabric_finish(n, STAGE_DONE, NULL);
        }
        if (active) {
                fabric_progress(n, FABRIC_PERSISTENCED_UNIT " is running");
                return fabric_finish(n, STAGE_DONE, NULL);
        }
        r = fabric_unit_start(n->bus, FABRIC_PERSISTENCED_UNIT, &opts, on_persistenced_started, n, &n->fabric_op);
        if (r < 0) {
                _cleanup_free_ char *msg = strprintf("Cannot start " FABRIC_PERSISTENCED_UNIT ": %s", strerror(-r));
                fabric_finish(n, r, msg);
        }
}

static void fabric_persistenced_step(Node *n) {
        int r;

        if (!n->config->fabric.persistenced) {
                fabric_progress(n, "fabric.persistenced is off");
                return fabric_finish(n, STAGE_DONE, NULL);
        }
        r = fabric_unit_query(n->bus, FABRIC_PERSISTENCED_UNIT, on_persistenced_query, n, &n->fabric_op);
        if (r < 0) {
                _cleanup_free_ char *msg = strprintf("Cannot ask systemd about " FABRIC_PERSISTENCED_UNIT ": %s",
                                                     strerror(-r));
                fabric_finish(n, r, msg);
        }
}

static void on_manager_started(FabricOp *op, int r, const char *message, void *userdata) {
        Node *n = userdata;

        if (r < 0)
                return fabric_op_done(n, op, r, message);
        n->fabric_op = fabric_op_free(op);
        fabric_record_started(n, FABRIC_MANAGER_UNIT);
        fabric_progress(n, FABRIC_MANAGER_UNIT " started");
        log_info("Started " FABRIC_MANAGER_UNIT "; it kept running through the watch period.");
        fabric_persistenced_step(n);
}

static void on_manager_query(FabricOp *op, int r, const FabricUnitInfo *info, const char *message, void *userdata) {
        Node *n = userdata;
        bool active = info && unit_is_active(info);

        if (systemd_absent(r))
                return fabric_op_done(n, op, STAGE_SKIPPED, SYSTEMD_ABSENT_MESSAGE);
        if (r < 0)
                return fabric_op_done(n, op, r, message);
        n->fabric_op = fabric_op_free(op);
        if (active) {
                fabric_progress(n, FABRIC_MANAGER_UNIT " is running");
                return fabric_persistenced_step(n);
        }
        /* Not installed, masked, failed, inactive: the start reports each in its own words. */
        r = fabric_manager_start(n->bus, n->config->fabric.timeout_usec, 0, on_manager_started, n, &n->fabric_op);
        if (r < 0) {
                _cleanup_free_ char *msg = strprintf("Cannot start " FABRIC_MANAGER_UNIT ": %s", strerror(-r));
                fabric_finish(n, r, msg);
        }
}

/* Returns STAGE_RUNNING when a query went out, or a final result with *ret_message. */
static int fabric_manager_step(Node *n, size_t n_nvswitches, char **ret_message) {
        _cleanup_free_ char *fm = NULL, *drv = NULL, *error = NULL;
        int r;

        fm = fabric_manager_version(n);
        drv = fabric_driver_version(n);
        if (fm && drv) {
                r = fabric_version_check(fm, drv, &error);
                if (r < 0) {
                        *ret_message = TAKE_PTR(error);
                        return r;
                }
        } else
                log_debug("Fabric manager version check skipped: %s version unknown.",
                          fm ? "driver" : "nvidia-fabricmanager");

        _cleanup_free_ char *count = strprintf("%zu NVSwitch%s", n_nvswitches, n_nvswitches == 1 ? "" : "es");
        if (count)
                node_stage_progress(n, STAGE_FABRIC, count);
        r = fabric_unit_query(n->bus, FABRIC_MANAGER_UNIT, on_manager_query, n, &n->fabric_op);
        if (r < 0) {
                *ret_message = strprintf("Cannot ask systemd about " FABRIC_MANAGER_UNIT ": %s", strerror(-r));
                return r;
        }
        return STAGE_RUNNING;
}

int stage_fabric_run(Node *n, char **ret_message) {
        const ConfigFabric *c = &n->config->fabric;
        size_t n_nvswitches;
        int r;

        if (!n->bus) {
                *ret_message = strdup("no system bus (--oneshot)");
                return STAGE_SKIPPED;
        }
        if (!n->inventory || n->inventory->n_gpus == 0) {
                *ret_message = strdup("no NVIDIA GPU");
                return STAGE_SKIPPED;
        }
        if (driver_unload_held(n)) {
                *ret_message = strdup("the driver was unloaded with Unload(); Reconcile() loads it again");
                return STAGE_SKIPPED;
        }

        n_nvswitches = fabric_nvswitches(n);
        if (!c->persistenced && (!c->fabricmanager || n_nvswitches == 0)) {
                *ret_message = strdup(n_nvswitches == 0
                                              ? "fabric.persistenced is off and this is not an NVSwitch system"
                                              : "fabric.persistenced and fabric.fabricmanager are off");
                return STAGE_SKIPPED;
        }

        /* A run never overlaps another (the engine runs one stage at a time); this is only hygiene. */
        n->fabric_op = fabric_op_free(n->fabric_op);

        if (c->fabricmanager && n_nvswitches > 0) {
                r = fabric_manager_step(n, n_nvswitches, ret_message);
                if (r != STAGE_RUNNING)
                        return r;
        } else {
                node_stage_progress(n, STAGE_FABRIC, n_nvswitches == 0 ? "not an NVSwitch system"
                                                                          : "fabric.fabricmanager is off");
                fabric_persistenced_step(n);
        }
        return STAGE_RUNNING;
}

void stage_fabric_done(Node *n) {
        n->fabric_op = fabric_op_free(n->fabric_op);
        n->started_units = strv_free(n->started_units);
        driver_unload_stop(n);
}
