/* SPDX-License-Identifier: MIT */
/* Owns the devices stage: the /dev/nvidia* nodes nvidia-modprobe would make (modules/devnode.h does
 * the planning and the mknod), with the MIG capability nodes of the devices NVML last reported.
 * The nvml stage runs after this one in a pass and the capability nodes depend on what NVML says, so
 * every new snapshot calls stage_devices_sync_mig(), which re-makes the nodes when its MIG devices
 * are not the ones the last refresh made nodes for. */
#include <sys/stat.h>

#include "devices.h"
#include "devnode.h"
#include "driver-unload.h"
#include "log.h"
#include "strv.h"

DEFINE_CLEANUP_FUNC(DevnodePlan *, devnode_plan_free);

/* The MIG devices of the last NVML snapshot, as devnode wants them: by the parent's device minor.
 * A GPU whose minor NVML did not give is left out (its caps cannot be named), with a warning unless
 * quiet; the plan notes why the rest of its nodes exist anyway. */
static int collect_mig_devices(const NvmlSnapshot *s, bool quiet, DevnodeMigDevice **ret, size_t *ret_n) {
        _cleanup_free_ DevnodeMigDevice *list = NULL;
        size_t n = 0, total = 0;

        for (size_t i = 0; s && i < s->n_gpus; i++)
                if (s->gpus[i].minor >= 0)
                        total += s->gpus[i].n_mig_devices;
        if (total > 0) {
                list = calloc(total, sizeof(DevnodeMigDevice));
                if (!list)
                        return -ENOMEM;
        }
        for (size_t i = 0; s && i < s->n_gpus; i++) {
                const GpuInfo *g = &s->gpus[i];
                if (g->minor < 0) {
                        if (g->n_mig_devices > 0 && !quiet)
                                log_warning("NVML did not report the device minor of GPU %s: the capability "
                                            "nodes of its %zu MIG device(s) are not created.",
                                            g->pci_address, g->n_mig_devices);
                        continue;
                }
                for (size_t j = 0; j < g->n_mig_devices; j++)
                        list[n++] = (DevnodeMigDevice) { .gpu_minor = (unsigned) g->minor,
                                                         .gi = g->mig_devices[j].gi_id,
                                                         .ci = g->mig_devices[j].ci_id };
        }
        *ret = TAKE_PTR(list);
        *ret_n = n;
        return 0;
}

/* "minor:gi:ci" per MIG device, in snapshot order: what a refresh made nodes for. NULL on OOM (the next
 * sync then refreshes again, which is only work). */
static char *mig_key(const DevnodeMigDevice *mig, size_t n) {
        _cleanup_strv_free_ char **l = NULL;

        for (size_t i = 0; i < n; i++)
                if (strv_extendf(&l, "%u:%u:%u", mig[i].gpu_minor, mig[i].gi, mig[i].ci) < 0)
                        return NULL;
        return l ? strv_join(l, " ") : strdup("");
}

void stage_devices_sync_mig(Node *n) {
        _cleanup_free_ DevnodeMigDevice *mig = NULL;
        _cleanup_free_ char *key = NULL, *message = NULL;
        size_t n_mig = 0;

        if (!n->nvml_snapshot || n->stages[STAGE_DEVICES].state != STAGE_DONE)
                return;
        /* Quietly: collect_mig_devices() warns about GPUs without a minor, and the refresh will again. */
        if (collect_mig_devices(n->nvml_snapshot, true, &mig, &n_mig) < 0)
                return;
        key = mig_key(mig, n_mig);
        if (key && streq_ptr(key, n->devices_mig))
                return;
        if (stage_devices_refresh(n, &message) < 0)
                log_warning("The capability nodes of the MIG devices NVML reports could not be made: %s",
                            strna(message));
}

int stage_devices_refresh(Node *n, char **ret_message) {
        _cleanup_(devnode_plan_freep) DevnodePlan *plan = NULL;
        _cleanup_free_ DevnodeMigDevice *mig = NULL;
        _cleanup_free_ char *error = NULL;
        DevnodeResult result = {};
        struct stat st;
        size_t n_mig = 0;
        int r;

        assert(ret_message);

        if (!n->config->devices.enabled) {
                *ret_message = strdup("devices.enabled is false: the device nodes are left to the system");
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

        /* devtmpfs is always there on a real host; a missing one is a configuration mistake, and
         * devnode_apply() would only say that the first subdirectory cannot be made. */
        r = stat(n->config->paths.dev, &st) < 0 ? negative_errno() : S_ISDIR(st.st_mode) ? 0 : -ENOTDIR;
        if (r < 0) {
                *ret_message = strprintf("Cannot create the NVIDIA device nodes: %s is not a directory (%s); set "
                                         "paths.dev (or --root) to where devtmpfs is mounted.",
                                         n->config->paths.dev, strerror(-r));
                return r;
        }

        r = collect_mig_devices(n->nvml_snapshot, false, &mig, &n_mig);
        if (r < 0)
                return r;

        DevnodeOptions opts = {
                .modeset = n->config->driver.modeset,
                .mig = mig,
                .n_mig = n_mig,
        };
        r = devnode_plan(n->config->paths.proc, &opts, &plan, &error);
        if (r < 0) {
                *ret_message = error ? TAKE_PTR(error)
                                     : strprintf("Cannot work out the NVIDIA device nodes from %s: %s",
                                                 n->config->paths.proc, strerror(-r));
                return r;
        }
        STRV_FOREACH(note, plan->notes)
                log_debug("Device nodes: %s", *note);

        r = devnode_apply(plan, n->config->paths.dev, &result, &error);
        if (r < 0) {
                *ret_message = error ? TAKE_PTR(error)
                                     : strprintf("Cannot create the NVIDIA device nodes under %s: %s",
                                                 n->config->paths.dev, strerror(-r));
                return r;
        }

        *ret_message = devnode_result_to_string(plan, &result);
        if (!*ret_message)
                return -ENOMEM;
        free(n->devices_mig);
        n->devices_mig = mig_key(mig, n_mig);
        /* Routine passes find everything in place; only real work is worth a line. */
        if (result.created + result.replaced + result.fixed + result.links > 0)
                log_info("Device nodes under %s: %s.", n->config->paths.dev, *ret_message);
        return STAGE_DONE;
}

int stage_devices_run(Node *n, char **ret_message) {
        return stage_devices_refresh(n, ret_message);
}
