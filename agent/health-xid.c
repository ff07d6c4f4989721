/* SPDX-License-Identifier: MIT */
/* Owns the XID classification: which XIDs are the application's fault (ignored), which make a GPU
 * degraded until a health re-check passes, which need a GPU reset, and which a reboot. From NVIDIA's
 * "XID Errors" catalog (docs.nvidia.com/deploy/xid-errors, the "XID Error Listing" table and its
 * "Possible causes"/"Action" columns, R535-R570) and the GPU Debug Guidelines
 * (docs.nvidia.com/deploy/gpu-debug-guidelines). The configuration overrides a code either way
 * (health.xid.ignore, health.xid.fatal). Also the bound on the journal lines an XID storm makes. */
#include <stdio.h>
#include <stdlib.h>

#include "health.h"
#include "string-table.h"
#include "strv.h"

typedef struct XidEntry {
        unsigned xid;
        XidAction action;
        const char *text;
} XidEntry;

static const XidEntry xid_table[] = {
        /* Application errors: the catalog lists user application faults as the cause; the GPU is fine. */
        { 13, XID_APPLICATION, "graphics engine exception (application error)" },
        { 31, XID_APPLICATION, "GPU memory page fault (application error)" },
        { 43, XID_APPLICATION, "GPU stopped processing (application error)" },
        { 45, XID_APPLICATION, "preemptive cleanup after a previous error (application ended)" },
        { 68, XID_APPLICATION, "NVDEC0 exception (video decoder, application error)" },
        /* Recoverable: the catalog's action is to restart the application or that the driver recovered;
         * the GPU stays usable once a re-check (remapped rows, registration) is clean. */
        { 63, XID_RECOVERABLE, "ECC page retirement or row remapping recording event" },
        { 92, XID_RECOVERABLE, "high single-bit ECC error rate" },
        { 94, XID_RECOVERABLE, "contained ECC error (the affected application must restart)" },
        { 109, XID_RECOVERABLE, "context switch timeout (the application must restart)" },
        { 74, XID_RECOVERABLE, "NVLink error" },
        /* Need a GPU reset (catalog action: "reset the GPU" / drain and reset). */
        { 48, XID_RESET, "double-bit ECC error" },
        { 64, XID_RESET, "ECC page retirement or row remapper recording failure" },
        { 95, XID_RESET, "uncontained ECC error" },
        { 119, XID_RESET, "GSP RPC timeout" },
        { 120, XID_RESET, "GSP error" },
        { 140, XID_RESET, "unrecovered ECC error" },
        /* Need a reboot (or a node power cycle): the GPU is gone from the driver. */
        { 79, XID_REBOOT, "GPU has fallen off the bus" },
        { 154, XID_REBOOT, "GPU recovery action changed: node reboot required" },
};

static bool xid_listed(char *const *l, unsigned xid) {
        char buf[16];

        snprintf(buf, sizeof buf, "%u", xid);
        return strv_contains(l, buf);
}

XidAction health_xid_classify(unsigned xid, char *const *ignore, char *const *fatal, const char **ret_text) {
        const XidEntry *e = NULL;

        for (size_t i = 0; i < ELEMENTSOF(xid_table); i++)
                if (xid_table[i].xid == xid)
                        e = &xid_table[i];
        if (ret_text)
                *ret_text = e ? e->text : "not in the XID table";
        if (xid_listed(fatal, xid))
                return e && e->action == XID_REBOOT ? XID_REBOOT : XID_RESET;
        if (xid_listed(ignore, xid))
                return XID_APPLICATION;
        /* An XID we do not know: not the application's by default, but no reason to fail the GPU. */
        return e ? e->action : XID_RECOVERABLE;
}

bool xid_log_note(XidLog *l, unsigned xid, uint64_t now) {
        if (l->start_usec == 0) {
                l->start_usec = now;
                l->n_slots = 0;
        }
        for (size_t i = 0; i < l->n_slots; i++)
                if (l->slots[i].xid == xid) {
                        l->slots[i].more++;
                        return false;
                }
        if (l->n_slots < XID_LOG_SLOTS)
                l->slots[l->n_slots++] = (XidLogSlot) { .xid = xid };
        return true;
}

uint64_t xid_log_deadline(const XidLog *l) {
        return l->start_usec ? l->start_usec + XID_LOG_WINDOW_USEC : 0;
}

size_t xid_log_flush(XidLog *l, XidLogSlot ret[XID_LOG_SLOTS]) {
        size_t n = 0;

        for (size_t i = 0; i < l->n_slots; i++)
                if (l->slots[i].more > 0)
                        ret[n++] = l->slots[i];
        *l = (XidLog) {};
        return n;
}

static const char *const xid_action_names[_XID_ACTION_MAX] = {
        [XID_APPLICATION] = "application",
        [XID_RECOVERABLE] = "recoverable",
        [XID_RESET] = "reset",
        [XID_REBOOT] = "reboot",
};

DEFINE_STRING_TABLE_LOOKUP_TO_STRING(xid_action, XidAction, xid_action_names, _XID_ACTION_MAX)

static const char *const gpu_health_names[_GPU_HEALTH_MAX] = {
        [GPU_HEALTH_OK] = "ok",
        [GPU_HEALTH_DEGRADED] = "degraded",
        [GPU_HEALTH_FAILED] = "failed",
};

DEFINE_STRING_TABLE_LOOKUP_TO_STRING(gpu_health, GpuHealthState, gpu_health_names, _GPU_HEALTH_MAX)
