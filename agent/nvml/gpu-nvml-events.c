/* SPDX-License-Identifier: MIT */
/* Owns the NVML calls of GPU health: the event worker's registration and blocking wait, and the health
 * check's reads (see gpu-nvml-events.h for the line protocol). The event entry points are looked up here
 * with dlsym on the handle gpu_nvml_open() loaded, so that a driver without them (or the calls the nvml
 * stage makes) is not affected: a missing one is "error ..." and an exit. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "gpu-nvml-events.h"
#include "gpu-nvml-internal.h"
#include "macro.h"
#include "strv.h"

/* The worker's two threads write to the same socket: one line per write, under the lock. */
typedef struct EventsCtx {
        int fd;
        pthread_mutex_t lock;
        GpuNvml *n;
        gna_nvmlEventSetWait_v2_fn wait;
        gna_nvmlDeviceGetRemappedRows_fn remapped;
        nvmlEventSet_t set;
        nvmlDevice_t *handles;
        char *const *addresses;
        size_t n_gpus;
} EventsCtx;

static void say(EventsCtx *c, const char *fmt, ...) _printf_(2, 3);
static void say(EventsCtx *c, const char *fmt, ...) {
        char buf[512];
        va_list ap;

        va_start(ap, fmt);
        int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
        va_end(ap);
        if (n < 0)
                return;
        if ((size_t) n > sizeof buf - 2)
                n = sizeof buf - 2;
        for (char *p = buf; p < buf + n; p++)
                if (*p == '\n')
                        *p = ' ';
        buf[n++] = '\n';
        pthread_mutex_lock(&c->lock);
        (void) !write(c->fd, buf, (size_t) n);
        pthread_mutex_unlock(&c->lock);
}

static void bus_id(const char *address, char buf[static 32]) {
        unsigned domain, bus, dev, fn;

        if (sscanf(address, "%x:%x:%x.%x", &domain, &bus, &dev, &fn) == 4)
                snprintf(buf, 32, "%08X:%02X:%02X.%X", domain, bus, dev, fn);
        else
                snprintf(buf, 32, "%s", address);
}

static const char *rc_text(GpuNvml *n, nvmlReturn_t rc) {
        return n->fn.nvmlErrorString ? n->fn.nvmlErrorString(rc) : gpu_nvml_return_to_string(rc);
}

static void *wait_thread(void *userdata) {
        EventsCtx *c = userdata;

        for (;;) {
                nvmlEventData_t data = {};
                nvmlReturn_t rc = c->wait(c->set, &data, GPU_NVML_EVENT_WAIT_MS);
                if (rc == NVML_ERROR_TIMEOUT)
                        continue;
                if (rc != NVML_SUCCESS) {
                        say(c, "error nvmlEventSetWait_v2: %s", rc_text(c->n, rc));
                        _exit(2);
                }
                size_t i;
                for (i = 0; i < c->n_gpus; i++)
                        if (c->handles[i] && c->handles[i] == data.device)
                                break;
                /* On a GPU in MIG mode the event names the parent and the GPU/compute instance it
                 * happened in (0xFFFFFFFF: the whole GPU). A handle we did not register: no GPU of ours. */
                if (i == c->n_gpus)
                        say(c, "event - %llu %llu %u %u", data.eventType, data.eventData, data.gpuInstanceId,
                            data.computeInstanceId);
                else
                        say(c, "event %zu %llu %llu %u %u", i, data.eventType, data.eventData, data.gpuInstanceId,
                            data.computeInstanceId);
        }
        return NULL;
}

/* One health check with the handles registration found (NVML is initialised once, for the worker's
 * life: no nvmlInit, no handle look-ups per check). */
static void health_check(EventsCtx *c) {
        unsigned count = 0;
        int r;

        r = gpu_nvml_device_get_count(c->n, &count);
        if (r < 0)
                say(c, "error %s", gpu_nvml_last_error(c->n));
        else
                say(c, "count %u", count);
        for (size_t i = 0; i < c->n_gpus; i++) {
                nvmlDevice_t d = c->handles[i];
                char id[32];

                if (!d) {
                        bus_id(c->addresses[i], id);
                        r = gpu_nvml_device_get_handle_by_pci_bus_id(c->n, id, &d);
                        if (r == -ENOENT || r == -EINVAL) {
                                say(c, "gpu %zu missing", i);
                                continue;
                        }
                        if (r < 0) {
                                say(c, "gpu %zu %s %s", i, r == -ENXIO ? "lost" : "error", gpu_nvml_last_error(c->n));
                                continue;
                        }
                }
                if (c->remapped) {
                        unsigned corr = 0, unc = 0, pending = 0, failure = 0;
                        gpu_nvml_enter(c->n, "nvmlDeviceGetRemappedRows");
                        nvmlReturn_t rc = c->remapped(d, &corr, &unc, &pending, &failure);
                        if (rc == NVML_ERROR_GPU_IS_LOST) {
                                say(c, "gpu %zu lost %s", i, rc_text(c->n, rc));
                                continue;
                        }
                        if (rc == NVML_SUCCESS)
                                say(c, "remap %zu %u %u %u %u", i, corr, unc, pending, failure);
                        /* NOT_SUPPORTED: no row remapping before Ampere; nothing to check. */
                }
                nvmlGpuFabricInfo_t f = {};
                r = gpu_nvml_device_get_gpu_fabric_info(c->n, d, &f);
                if (r >= 0 && f.state != NVML_GPU_FABRIC_STATE_NOT_SUPPORTED)
                        say(c, "fabric %zu %u %u", i, (unsigned) f.state, (unsigned) f.status);
                say(c, "gpu %zu ok", i);
        }
        say(c, "done");
}

int gpu_nvml_events_run(int fd, const char *library, char *const *pci_addresses) {
        _cleanup_(gpu_nvml_closep) GpuNvml *n = NULL;
        _cleanup_free_ char *error = NULL;
        EventsCtx c = { .fd = fd, .lock = PTHREAD_MUTEX_INITIALIZER, .addresses = pci_addresses };
        nvmlReturn_t rc;
        size_t armed = 0;
        int r;

        r = gpu_nvml_open(library, &n, &error);
        if (r < 0) {
                say(&c, "error %s", error ?: strerror(-r));
                return 1;
        }
        c.n = n;
        gna_nvmlEventSetCreate_fn create = (gna_nvmlEventSetCreate_fn) dlsym(n->dl, "nvmlEventSetCreate");
        gna_nvmlDeviceRegisterEvents_fn reg = (gna_nvmlDeviceRegisterEvents_fn) dlsym(n->dl, "nvmlDeviceRegisterEvents");
        gna_nvmlDeviceGetSupportedEventTypes_fn supported =
                (gna_nvmlDeviceGetSupportedEventTypes_fn) dlsym(n->dl, "nvmlDeviceGetSupportedEventTypes");
        c.wait = (gna_nvmlEventSetWait_v2_fn) dlsym(n->dl, "nvmlEventSetWait_v2");
        if (!c.wait)
                c.wait = (gna_nvmlEventSetWait_v2_fn) dlsym(n->dl, "nvmlEventSetWait");
        c.remapped = (gna_nvmlDeviceGetRemappedRows_fn) dlsym(n->dl, "nvmlDeviceGetRemappedRows");
        if (!create || !reg || !c.wait) {
                say(&c, "error %s does not export the NVML event API (nvmlEventSetCreate, nvmlDeviceRegisterEvents, "
                        "nvmlEventSetWait_v2): the driver is too old for event-driven health", library);
                return 1;
        }
        rc = create(&c.set);
        if (rc != NVML_SUCCESS) {
                say(&c, "error nvmlEventSetCreate: %s", rc_text(n, rc));
                return 1;
        }

        c.n_gpus = strv_length(pci_addresses);
        _cleanup_free_ nvmlDevice_t *handles = calloc(c.n_gpus + 1, sizeof *handles);
        if (!handles)
                return 1;
        c.handles = handles;
        for (size_t i = 0; i < c.n_gpus; i++) {
                char id[32];
                unsigned long long types = nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError |
                                           nvmlEventTypeSingleBitEccError | nvmlEventTypeClock, have = 0;

                bus_id(pci_addresses[i], id);
                if (gpu_nvml_device_get_handle_by_pci_bus_id(n, id, &handles[i]) < 0) {
                        handles[i] = NULL;
                        say(&c, "unsupported %zu not visible to NVML", i);
                        continue;
                }
                /* Ask for what the GPU can report (clock events are not on every board); a driver
                 * without the query gets the critical ones. */
                if (supported && supported(handles[i], &have) == NVML_SUCCESS)
                        types &= have;
                else
                        types &= ~(unsigned long long) nvmlEventTypeClock;
                rc = types ? reg(handles[i], types, c.set) : NVML_ERROR_NOT_SUPPORTED;
                if (rc != NVML_SUCCESS) {
                        say(&c, "unsupported %zu %s", i, rc_text(n, rc));
                        continue;
                }
                armed++;
        }

        pthread_t t;
        r = pthread_create(&t, NULL, wait_thread, &c);
        if (r != 0) {
                say(&c, "error cannot start the event thread: %s", strerror(r));
                return 1;
        }
        say(&c, "armed %zu", armed);

        /* Requests from the loop, one a line; EOF: the agent is done with us. */
        char buf[256];
        size_t len = 0;
        for (;;) {
                ssize_t k = read(fd, buf + len, sizeof buf - 1 - len);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0)
                        _exit(0); /* the wait thread is blocked in NVML: no orderly shutdown */
                len += (size_t) k;
                buf[len] = 0;
                char *start = buf, *nl;
                while ((nl = strchr(start, '\n'))) {
                        *nl = 0;
                        if (streq(start, "check"))
                                health_check(&c);
                        start = nl + 1;
                }
                len -= (size_t) (start - buf);
                memmove(buf, start, len);
                if (len == sizeof buf - 1)
                        len = 0;
        }
}
