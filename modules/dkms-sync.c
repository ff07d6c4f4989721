/* SPDX-License-Identifier: MIT */
/* Owns the blocking front ends to dkms.c for callers without an event loop of their own
 * (`gpu-node-agent --prepare-kernel`, the CLI): each runs the asynchronous runner on a private
 * sd_event loop until it finishes. Never used from the daemon's loop. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dkms.h"
#include "macro.h"
#include "strv.h"

DEFINE_CLEANUP_FUNC(DkmsRun *, dkms_run_free);

typedef struct SyncState {
        bool done;
        int error;
        char *message;
        DkmsModule *modules;
        size_t n_modules;
} SyncState;

static void sync_line(DkmsRun *run, const char *line, void *userdata) {
        fprintf(stderr, "%s\n", line);
}

static void sync_done(DkmsRun *run, int error, const char *message, void *userdata) {
        SyncState *st = userdata;

        st->done = true;
        st->error = error;
        st->message = message ? strdup(message) : NULL;
}

static void sync_status_done(DkmsRun *run, int error, const DkmsModule *l, size_t n, const char *message,
                             void *userdata) {
        SyncState *st = userdata;

        st->done = true;
        st->error = error;
        st->message = message ? strdup(message) : NULL;
        if (error < 0 || n == 0)
                return;
        st->modules = calloc(n, sizeof(DkmsModule));
        if (!st->modules) {
                st->error = -ENOMEM;
                return;
        }
        for (size_t i = 0; i < n; i++) {
                DkmsModule *m = &st->modules[i];
                m->state = l[i].state;
                m->name = strdup(l[i].name);
                m->version = strdup(l[i].version);
                m->kernel = l[i].kernel ? strdup(l[i].kernel) : NULL;
                m->arch = l[i].arch ? strdup(l[i].arch) : NULL;
                m->note = l[i].note ? strdup(l[i].note) : NULL;
                st->n_modules = i + 1;
                if (!m->name || !m->version || (l[i].kernel && !m->kernel) || (l[i].arch && !m->arch) ||
                    (l[i].note && !m->note))
                        st->error = -ENOMEM;
        }
}

static int sync_loop(sd_event *e, SyncState *st) {
        while (!st->done) {
                int r = sd_event_run(e, UINT64_MAX);
                if (r < 0)
                        return r;
        }
        return 0;
}

int dkms_prepare_kernel(const char *kver, const DkmsOptions *o, char **ret_error) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_(dkms_run_freep) DkmsRun *run = NULL;
        SyncState st = {};
        DkmsRunCallbacks cb = { .line = sync_line, .done = sync_done };
        int r;

        r = sd_event_new(&e);
        if (r < 0)
                return r;
        r = dkms_run_start(e, kver, o, &cb, &st, &run, ret_error);
        if (r < 0)
                return r;
        r = sync_loop(e, &st);
        if (r < 0) {
                if (ret_error)
                        *ret_error = strprintf("Event loop failed while dkms ran: %s", strerror(-r));
                return r;
        }
        if (st.error < 0 && ret_error)
                *ret_error = TAKE_PTR(st.message);
        free(st.message);
        return st.error;
}

int dkms_status(const char *kver, const DkmsOptions *o, DkmsModule **ret, size_t *ret_n, char **ret_error) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_(dkms_run_freep) DkmsRun *run = NULL;
        SyncState st = {};
        int r;

        assert(ret);
        assert(ret_n);

        r = sd_event_new(&e);
        if (r < 0)
                return r;
        r = dkms_status_start(e, kver, o, sync_status_done, &st, &run, ret_error);
        if (r < 0)
                return r;
        r = sync_loop(e, &st);
        if (r >= 0)
                r = st.error;
        if (r < 0) {
                dkms_module_list_free(st.modules, st.n_modules);
                if (ret_error)
                        *ret_error = st.message ? TAKE_PTR(st.message)
                                                : strprintf("dkms status failed: %s", strerror(-r));
                free(st.message);
                return r;
        }
        free(st.message);
        *ret = st.modules;
        *ret_n = st.n_modules;
        return 0;
}
