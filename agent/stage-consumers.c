/* SPDX-License-Identifier: MIT */
/* Owns the consumers stage: after the labels, the same facts for the node's other consumers, each
 * switched on by its own setting —
 *   - Slurm (gres.slurm.*): the node's gres.conf lines (gres.c), rewritten only when they change;
 *   - the GPU Operator (validations.*): its driver-ready file while the driver is verified, removed when
 *     it breaks (validations.c);
 *   - NVLink multi-node (fabric.imex): where NVML puts GPUs in a fabric clique, the IMEX channel device
 *     nodes, their CDI spec (imex.c) and nvidia-imex.service.
 * It runs last in a pass because it reports on the others (driver, devices, nvml) as they ended. It is one
 * stage rather than three because all three are small writers of derived files with no order among them;
 * the message names each part. Starting nvidia-imex is asynchronous (modules/fabric.h): the handler then
 * returns STAGE_RUNNING and the unit callbacks finish the stage. */
#include <sys/stat.h>

#include "cdi.h"
#include "devices.h"
#include "devnode.h"
#include "fabric.h"
#include "fileio.h"
#include "gres.h"
#include "imex.h"
#include "log.h"
#include "stage-table.h"
#include "strv.h"
#include "validations.h"

DEFINE_CLEANUP_FUNC(DevnodePlan *, devnode_plan_free);

/* Under the packaged unit (ProtectSystem=strict) a read-only file system means "outside what the unit
 * lets us write". */
#define SANDBOX_HINT                                                                                     \
        "the service unit lets the agent write only below /etc/slurm and /run/nvidia, and only when they " \
        "exist when it starts: create the directory (slurmd's package makes /etc/slurm) and restart "     \
        "the agent, or allow the path with ReadWritePaths= in a drop-in."

static bool stage_ok(const Node *n, StageId id) {
        return n->stages[id].state == STAGE_DONE || n->stages[id].state == STAGE_SKIPPED;
}

/* A path of this process's view as the node sees it: paths.root stripped (as the CDI spec does). */
static const char *node_path(const Node *n, const char *p) {
        const char *root = n->config->paths.root;
        size_t len = strlen(root);

        while (len > 0 && root[len - 1] == '/')
                len--;
        if (len > 0 && strncmp(p, root, len) == 0 && p[len] == '/')
                return p + len;
        return p;
}

static int consumers_gres(Node *n, char ***parts) {
        const Config *c = n->config;
        _cleanup_free_ char *text = NULL;
        _cleanup_strv_free_ char **warnings = NULL;
        bool changed = false;
        int lines, r;

        if (!c->gres.slurm_enabled)
                return 0;
        /* NVML down is usually passing (a driver reload, a GPU reset): an empty file would take the GPUs
         * from Slurm at its next reconfigure. Only a node without GPUs gets one. */
        if (!n->nvml_snapshot && n->inventory && n->inventory->n_gpus > 0)
                return strv_extendf(parts, "Slurm: NVML is unavailable; %s left as it is", c->gres.slurm_file);

        /* slurmd refuses to start when a File= does not exist: the MIG devices' capability nodes were made
         * when the snapshot came in (stage_devices_sync_mig()); this only retries one that failed. */
        stage_devices_sync_mig(n);

        GresInput in = {
                .snapshot = n->nvml_snapshot,
                .sys = c->paths.sys,
                .proc = c->paths.proc,
                .dev = node_path(n, c->paths.dev),
        };
        lines = gres_format(&in, &text, &warnings);
        if (lines < 0)
                return strv_extendf(parts, "Slurm: formatting gres.conf lines failed: %s", strerror(-lines)) < 0 ? -ENOMEM : lines;
        r = gres_write(c->gres.slurm_file, text, &changed);
        if (r < 0) {
                log_error("Slurm: cannot write %s: %s; %s", c->gres.slurm_file, strerror(-r),
                          r == -EROFS ? SANDBOX_HINT : "check that its directory is writable, or set gres.slurm.file.");
                (void) strv_extendf(parts, "Slurm: cannot write %s: %s", c->gres.slurm_file, strerror(-r));
                return r;
        }
        STRV_FOREACH(w, warnings)
                log_full(changed ? LOG_WARNING : LOG_DEBUG, "Slurm: %s", *w);
        if (changed)
                log_info("Slurm: wrote %d GRES line%s to %s.", lines, lines == 1 ? "" : "s", c->gres.slurm_file);
        return strv_extendf(parts, "Slurm: %d GRES line%s %s %s", lines, lines == 1 ? "" : "s",
                            changed ? "written to" : "unchanged in", c->gres.slurm_file);
}

static int consumers_validations(Node *n, char ***parts) {
        const Config *c = n->config;
        bool changed = false;
        int r;

        /* Verified = what the operator's driver validation checks (module loaded, nvidia-smi works):
         * the driver stage and device nodes succeeded and this pass's NVML read succeeded and lists GPUs
         * (judged by the nvml stage and its snapshot, not by an NVML handle of this process, which
         * may not be where NVML runs). */
        ValidationsState st = {
                .driver = c->validations.operator_compat && stage_ok(n, STAGE_DRIVER) && stage_ok(n, STAGE_DEVICES) &&
                          n->stages[STAGE_NVML].state == STAGE_DONE && n->nvml_snapshot &&
                          n->nvml_snapshot->n_gpus > 0,
        };
        /* Off: still remove a driver-ready we wrote before, or it would outlive the setting. */
        /* The node sees its driver at its own "/", however this process looks at it (--root). */
        _cleanup_free_ char *marker = validations_owner_marker(c->paths.run);
        if (!marker)
                return -ENOMEM;
        r = validations_update(c->validations.directory, marker, "/", &st, &changed);
        if (r < 0) {
                log_error("GPU Operator: cannot update %s/driver-ready: %s%s%s", c->validations.directory, strerror(-r),
                          r == -EROFS ? "; " : ".", r == -EROFS ? SANDBOX_HINT : "");
                (void) strv_extendf(parts, "GPU Operator: cannot update %s/driver-ready: %s", c->validations.directory,
                                    strerror(-r));
                return r;
        }
        if (changed)
                log_info("GPU Operator: %s %s/driver-ready.", st.driver ? "wrote" : "removed", c->validations.directory);
        if (!c->validations.operator_compat)
                return 0;
        return strv_extendf(parts, "GPU Operator: driver-ready %s%s (toolkit-ready and cuda-ready are not verified "
                            "by the agent and not written)", st.driver ? "present" : "absent",
                            st.driver ? "" : ", the driver is not verified");
}

/* Finishes the stage with the progress text plus part. */
static void consumers_finish(Node *n, int r, const char *part) {
        const char *prev = n->stages[STAGE_CONSUMERS].message;
        _cleanup_free_ char *text = isempty(prev) ? strdup(part) : strprintf("%s; %s", prev, part);

        n->imex_op = fabric_op_free(n->imex_op);
        node_stage_complete(n, STAGE_CONSUMERS, r, text ?: part);
}

static void on_imex_started(FabricOp *op, int r, const char *message, void *userdata) {
        Node *n = userdata;
        _cleanup_free_ char *msg = r < 0 ? strdup(message ?: strerror(-r)) : NULL;

        if (r < 0) {
                log_error("IMEX: %s", strna(msg));
                return consumers_finish(n, r, msg ?: "starting " IMEX_UNIT " failed");
        }
        if (!strv_contains(n->started_units, IMEX_UNIT) && strv_extend(&n->started_units, IMEX_UNIT) < 0)
                log_oom();
        log_info("IMEX: started " IMEX_UNIT ".");
        consumers_finish(n, STAGE_DONE, IMEX_UNIT " started");
}

static void on_imex_query(FabricOp *op, int r, const FabricUnitInfo *info, const char *message, void *userdata) {
        Node *n = userdata;
        FabricStartOptions opts = { .timeout_usec = n->config->fabric.timeout_usec, .require_installed = true };
        bool installed = info && info->installed,
             active = info && (streq_ptr(info->active_state, "active") || streq_ptr(info->active_state, "reloading"));

        if (r == -EHOSTUNREACH || r == -ENXIO)
                return consumers_finish(n, STAGE_DONE, "systemd is not on the system bus: " IMEX_UNIT " not managed");
        if (r < 0) {
                _cleanup_free_ char *msg = strdup(message ?: strerror(-r));
                return consumers_finish(n, r, msg ?: "cannot ask systemd about " IMEX_UNIT);
        }
        n->imex_op = fabric_op_free(op); /* info lives in op: read above */
        if (!installed)
                return consumers_finish(n, STAGE_DONE, IMEX_UNIT " is not installed; not started");
        if (active)
                return consumers_finish(n, STAGE_DONE, IMEX_UNIT " is running");
        r = fabric_unit_start(n->bus, IMEX_UNIT, &opts, on_imex_started, n, &n->imex_op);
        if (r < 0) {
                _cleanup_free_ char *msg = strprintf("cannot start " IMEX_UNIT ": %s", strerror(-r));
                consumers_finish(n, r, msg ?: "cannot start " IMEX_UNIT);
        }
}

/* Returns 1 when the unit step should follow (clique, auto, channels in place, a bus). */
static int consumers_imex(Node *n, char ***parts) {
        const Config *c = n->config;
        _cleanup_(devnode_plan_freep) DevnodePlan *plan = NULL;
        _cleanup_free_ char *error = NULL, *text = NULL;
        DevnodeResult res = {};
        size_t n_gpus = 0;
        bool changed = false;
        int r;

        const char *clique = imex_clique(n->nvml_snapshot, &n_gpus);
        if (!c->fabric.imex || !clique)
                return 0;

        if (c->fabric.imex_channels == 0 || c->fabric.imex_channels > 2048) {
                /* 2048 is the driver's default NVreg_ImexChannelCount. */
                (void) strv_extendf(parts, "IMEX: fabric.imex-channels is %u; set it to 1..2048 (channels are numbered "
                                    "from 0; the driver makes 2048 by default)", c->fabric.imex_channels);
                return -EINVAL;
        }
        r = devnode_plan_imex(c->paths.proc, c->fabric.imex_channels, &plan, &error);
        if (r >= 0 && plan->modify) {
                /* As nvidia-modprobe makes it; root-owned, not world-writable. */
                _cleanup_free_ char *dir = path_join(c->paths.dev, "nvidia-caps-imex-channels");
                if (!dir)
                        return -ENOMEM;
                if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
                        r = negative_errno();
                        error = strprintf("Cannot create %s: %s", dir, strerror(-r));
                }
        }
        if (r >= 0)
                r = devnode_apply(plan, c->paths.dev, &res, &error);
        if (r < 0) {
                log_error("IMEX: %s", error ?: strerror(-r));
                (void) strv_extendf(parts, "IMEX: %s", error ?: strerror(-r));
                return r;
        }
        if (res.created + res.replaced + res.fixed > 0)
                log_info("IMEX: %u channel node%s under %s/nvidia-caps-imex-channels (clique %s).",
                         c->fabric.imex_channels, c->fabric.imex_channels == 1 ? "" : "s", c->paths.dev, clique);

        if (c->cdi.enabled) {
                r = imex_cdi_spec_text(plan, &text);
                if (r >= 0)
                        r = cdi_spec_write(c->cdi.imex_spec, text, &changed, &error);
                if (r < 0) {
                        log_error("IMEX: not writing %s: %s", c->cdi.imex_spec, error ?: strerror(-r));
                        (void) strv_extendf(parts, "IMEX: not writing %s: %s", c->cdi.imex_spec, error ?: strerror(-r));
                        return r;
                }
                if (changed)
                        log_info("IMEX: wrote %s (kind " IMEX_CDI_KIND ", %u channel%s).", c->cdi.imex_spec,
                                 c->fabric.imex_channels, c->fabric.imex_channels == 1 ? "" : "s");
        }
        r = strv_extendf(parts, "IMEX: %zu GPU%s in clique %s, %u channel%s%s%s", n_gpus, n_gpus == 1 ? "" : "s",
                         clique, c->fabric.imex_channels, c->fabric.imex_channels == 1 ? "" : "s",
                         c->cdi.enabled ? " in " : "", c->cdi.enabled ? c->cdi.imex_spec : "");
        if (r < 0)
                return r;
        return n->bus ? 1 : 0;
}

int stage_consumers_run(Node *n, char **ret_message) {
        _cleanup_strv_free_ char **parts = NULL;
        int r, first = 0, imex;

        r = consumers_gres(n, &parts);
        if (r < 0)
                first = r;
        r = consumers_validations(n, &parts);
        if (r < 0 && first == 0)
                first = r;
        imex = consumers_imex(n, &parts);
        if (imex < 0 && first == 0)
                first = imex;

        _cleanup_free_ char *text = parts ? strv_join(parts, "; ") : NULL;
        if (parts && !text)
                return -ENOMEM;
        if (first < 0) {
                *ret_message = TAKE_PTR(text);
                return first;
        }
        if (imex > 0) {
                n->imex_op = fabric_op_free(n->imex_op);
                node_stage_progress(n, STAGE_CONSUMERS, text);
                r = fabric_unit_query(n->bus, IMEX_UNIT, on_imex_query, n, &n->imex_op);
                if (r < 0) {
                        *ret_message = strprintf("%s; cannot ask systemd about " IMEX_UNIT ": %s", strna(text), strerror(-r));
                        return r;
                }
                return STAGE_RUNNING;
        }
        if (!text) {
                *ret_message = strdup("gres.slurm.enabled and validations.operator-compat are false and no GPU is in an "
                                      "NVLink fabric clique");
                return STAGE_SKIPPED;
        }
        *ret_message = TAKE_PTR(text);
        return STAGE_DONE;
}

void stage_consumers_done(Node *n) {
        n->imex_op = fabric_op_free(n->imex_op);
}
