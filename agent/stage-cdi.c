/* SPDX-License-Identifier: MIT */
/* Owns the cdi stage: after every NVML read, describes the node's GPUs and MIG devices in the CDI spec
 * (cdi.spec, /var/run/cdi/nvidia.yaml by default) so that container runtimes never inject a device that
 * no longer exists; nothing else refreshes that file after a MIG change. Build → validate → write, and
 * the file is only touched when its bytes change. */
#include "cdi.h"
#include "log.h"
#include "stage-table.h"
#include "strv.h"

int stage_cdi_run(Node *n, char **ret_message) {
        const Config *c = n->config;
        _cleanup_(cdi_spec_freep) CdiSpec *spec = NULL;
        _cleanup_strv_free_ char **warnings = NULL;
        _cleanup_free_ char *text = NULL, *error = NULL;
        bool changed = false;
        int r;

        if (!c->cdi.enabled) {
                *ret_message = strdup("disabled by cdi.enabled: false");
                return STAGE_SKIPPED;
        }
        /* The engine runs us only after the nvml stage succeeded or was skipped; no snapshot means no GPU
         * NVML can see, and then there is nothing to describe. */
        if (!n->nvml_snapshot) {
                *ret_message = strprintf("no GPU known to NVML; %s left as it is", c->cdi.spec);
                return STAGE_SKIPPED;
        }

        r = cdi_check_conflicts(c->cdi.spec, c->paths.etc, &error);
        if (r < 0) {
                if (!error)
                        error = strprintf("cannot check %s for other CDI specs: %s", c->cdi.spec, strerror(-r));
                log_error("CDI: %s", strna(error));
                *ret_message = TAKE_PTR(error);
                return r;
        }

        CdiBuildInput in = {
                .snapshot = n->nvml_snapshot,
                .root = c->paths.root,
                .dev = c->paths.dev,
                .proc = c->paths.proc,
                .sys = c->paths.sys,
                .run = c->paths.run,
                .driver_root = c->cdi.driver_root,
                .minors_cache = &n->cdi_minors,
                .device_names = c->cdi.device_names,
        };
        r = cdi_spec_build(&in, &spec, &warnings);
        if (r == -ENODEV) {
                /* A spec must name at least one device. Leaving the old file would keep serving devices
                 * that are gone (all MIG devices destroyed, say), so our file goes. */
                STRV_FOREACH(w, warnings)
                        log_warning("CDI: %s", *w);
                n->cdi_spec_text = mfree(n->cdi_spec_text);
                _cleanup_free_ char *rm_error = NULL;
                r = cdi_spec_remove(c->cdi.spec, &rm_error);
                if (r < 0) {
                        if (r != -ENOENT) {
                                *ret_message = rm_error ? strprintf("no GPU or MIG device to describe, but %s", rm_error)
                                                        : strprintf("no GPU or MIG device to describe, and cannot "
                                                                    "remove %s: %s", c->cdi.spec, strerror(-r));
                                return r;
                        }
                        *ret_message = strdup("no GPU or MIG device to describe");
                        return STAGE_SKIPPED;
                }
                log_info("CDI: removed %s: no GPU or MIG device to describe.", c->cdi.spec);
                *ret_message = strprintf("no GPU or MIG device to describe; removed %s", c->cdi.spec);
                return STAGE_SKIPPED;
        }
        if (r < 0)
                return r;

        r = cdi_spec_to_yaml(spec, &text);
        if (r < 0)
                return r;

        r = cdi_spec_write(c->cdi.spec, text, &changed, &error);
        if (r < 0) {
                /* A validation failure here is our bug; say so rather than write a file runtimes drop. */
                log_error("CDI: not writing %s: %s", c->cdi.spec, strna(error));
                *ret_message = strprintf("not writing %s: %s", c->cdi.spec, strna(error));
                return r;
        }

        /* Say what was left out when the result changes, not on every pass. */
        bool news = changed || !streq_ptr(n->cdi_spec_text, text);
        STRV_FOREACH(w, warnings)
                log_full(news ? LOG_WARNING : LOG_DEBUG, "CDI: %s", *w);
        free(n->cdi_spec_text);
        n->cdi_spec_text = TAKE_PTR(text);

        if (!changed) {
                *ret_message = strdup("unchanged");
                return STAGE_DONE;
        }
        log_info("CDI: wrote %s (%zu devices).", c->cdi.spec, spec->n_devices);
        *ret_message = strprintf("%zu devices written to %s", spec->n_devices, c->cdi.spec);
        return STAGE_DONE;
}
