/* SPDX-License-Identifier: MIT */
/* Owns letting go of the GPU before the driver is removed (driver-release.h). */
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver-release.h"
#include "event-util.h"
#include "fileio.h"
#include "gpu-holders.h"
#include "health.h"
#include "log.h"
#include "strv.h"

#define RELEASE_POLL_USEC (20 * USEC_PER_MSEC)
#define RELEASE_KILL_USEC (1 * USEC_PER_SEC)
#define RELEASE_MAX_USEC (5 * USEC_PER_SEC)

struct DriverRelease {
        Node *node;
        sd_event_source *timer;
        uint64_t start_usec;
        bool killed;
        DriverReleaseDone done;
        void *userdata;
};

DriverRelease *driver_release_free(DriverRelease *r) {
        if (!r)
                return NULL;
        sd_event_source_disable_unref(r->timer);
        return mfree(r);
}

bool driver_own_child(const char *proc_dir, pid_t pid) {
        _cleanup_free_ char *sp = strprintf("%s/%d/stat", proc_dir, (int) pid), *stat = NULL;
        const char *rp;

        return sp && read_one_line_file(sp, &stat) >= 0 && (rp = strrchr(stat, ')')) &&
               atoi(rp + 4) == (int) getpid(); /* ") S PPID" */
}

static void release_finish(DriverRelease *r) {
        r->timer = sd_event_source_disable_unref(r->timer);
        r->done(r->node, r->userdata);
}

static int on_tick(sd_event_source *s, uint64_t usec, void *userdata) {
        DriverRelease *r = userdata;
        Node *n = r->node;
        _cleanup_(gpu_holders_done) GpuHolders h = {};
        uint64_t t;
        size_t own = 0;
        int k;

        (void) sd_event_now(sd_event_source_get_event(s), CLOCK_MONOTONIC, &usec);
        t = usec - r->start_usec;
        if (gpu_holders_processes("/proc", n->config->paths.dev, getpid(), &h) < 0) {
                release_finish(r);
                return 0;
        }
        for (size_t i = 0; i < h.n_procs; i++) {
                /* Our own /proc, not paths.proc: our children are in our pid namespace whatever
                 * paths.proc shows of the host. */
                if (!driver_own_child("/proc", h.procs[i].pid))
                        continue;
                own++;
                if (t >= RELEASE_KILL_USEC && !r->killed) {
                        log_warning("Our NVML process %d (%s) still holds %s 1 s after SIGTERM: killing it.",
                                    (int) h.procs[i].pid, h.procs[i].comm, h.procs[i].node);
                        (void) kill(h.procs[i].pid, SIGKILL);
                }
        }
        if (own == 0) {
                /* A slow let-go (a process wedged in a driver call, killed) is worth a line. */
                if (t >= 100 * USEC_PER_MSEC)
                        log_info("Our NVML processes let go of the GPU after %" PRIu64 " ms.", t / USEC_PER_MSEC);
                else
                        log_debug("Our NVML processes let go of the GPU after %" PRIu64 " ms.", t / USEC_PER_MSEC);
                release_finish(r);
                return 0;
        }
        if (t >= RELEASE_KILL_USEC)
                r->killed = true;
        if (t >= RELEASE_MAX_USEC) {
                log_warning("%zu of our NVML processes still hold the GPU after %" PRIu64 " s.", own, t / USEC_PER_SEC);
                release_finish(r);
                return 0;
        }
        k = event_reset_time_relative(sd_event_source_get_event(s), &r->timer, CLOCK_MONOTONIC, RELEASE_POLL_USEC, 0,
                                      on_tick, r, "driver-release");
        if (k < 0) {
                log_warning("Cannot wait for our NVML processes to let go of the GPU: %s", strerror(-k));
                release_finish(r);
        }
        return 0;
}

int driver_release_start(Node *n, const char *why, DriverReleaseDone done, void *userdata, DriverRelease **ret) {
        _cleanup_(driver_release_freep) DriverRelease *r = NULL;
        int k;

        assert(n);
        assert(done);
        assert(ret);
        r = calloc(1, sizeof(DriverRelease));
        if (!r)
                return -ENOMEM;
        *r = (DriverRelease) { .node = n, .done = done, .userdata = userdata };
        log_info("The driver is about to be removed: stopping our NVML processes, which hold %s/nvidia*.",
                 n->config->paths.dev);
        node_nvml_stop(n, why);
        health_release_driver(n->health);
        (void) sd_event_now(n->event, CLOCK_MONOTONIC, &r->start_usec);
        /* The first look at once (from the loop: the stopped workers are reaped there). */
        k = event_reset_time_relative(n->event, &r->timer, CLOCK_MONOTONIC, 0, 0, on_tick, r, "driver-release");
        if (k < 0)
                return k;
        *ret = TAKE_PTR(r);
        return 0;
}
