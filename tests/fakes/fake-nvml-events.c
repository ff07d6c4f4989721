/* SPDX-License-Identifier: MIT */
/* Owns the fake NVML's health entry points: the event set (nvmlEventSetCreate, nvmlDeviceRegisterEvents,
 * nvmlDeviceGetSupportedEventTypes, nvmlEventSetWait(_v2), nvmlEventSetFree) and row remapping
 * (nvmlDeviceGetRemappedRows), driven by injected events so that tests can make a GPU fail while the
 * agent runs:
 *
 *   FAKE_NVML_EVENT_FILE  a file tests append lines to, one fault each (GPU = NVML index):
 *                           xid GPU CODE [GI]     an XID (critical error) event, eventData = CODE; with GI,
 *                                                 in that MIG GPU instance (gpuInstanceId, computeInstanceId 0)
 *                           dbe GPU / sbe GPU     a double-/single-bit ECC event
 *                           lost GPU              the GPU falls off the bus: an XID 79 event, and from then
 *                                                 on its remapped-rows query answers GPU_IS_LOST
 *                           back GPU              the GPU answers again (after a reset)
 *                           remap GPU CORR UNC PENDING FAILURE   what nvmlDeviceGetRemappedRows answers
 *                         A waiter blocks (inotify on the file's directory, no polling) until a line for
 *                         a GPU and type it registered is appended; lines written before the set was
 *                         created are state (remap, lost), not events.
 *   FAKE_NVML_EVENTS      GPU:xid:CODE@MS, GPU:dbe@MS, GPU:sbe@MS, GPU:lost@MS[,…]: the same events MS
 *                         milliseconds after the event set was created ("an XID on GPU 3 at time T").
 *
 * nvmlEventSetWait_v2 waits outside the library lock, as the real one lets other threads call in. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <time.h>
#include <unistd.h>

#include "fake-nvml.h"

FAKE_DECLARE(nvmlEventSetCreate, gna_nvmlEventSetCreate_fn);
FAKE_DECLARE(nvmlEventSetFree, gna_nvmlEventSetFree_fn);
FAKE_DECLARE(nvmlDeviceRegisterEvents, gna_nvmlDeviceRegisterEvents_fn);
FAKE_DECLARE(nvmlDeviceGetSupportedEventTypes, gna_nvmlDeviceGetSupportedEventTypes_fn);
FAKE_DECLARE(nvmlEventSetWait_v2, gna_nvmlEventSetWait_v2_fn);
FAKE_DECLARE(nvmlEventSetWait, gna_nvmlEventSetWait_v2_fn);
FAKE_DECLARE(nvmlDeviceGetRemappedRows, gna_nvmlDeviceGetRemappedRows_fn);

#define FAKE_EVENT_TYPES                                                                                    \
        (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypeXidCriticalError |  \
         nvmlEventTypePState | nvmlEventTypeClock)
#define FAKE_MAX_TIMED 64

typedef struct FakeTimed {
        unsigned gpu, gi;
        unsigned long long type, data;
        uint64_t due_ms;
        bool fired;
} FakeTimed;

struct nvmlEventSet_st {
        unsigned long long *mask;  /* per GPU */
        size_t n_gpus;
        char *file;
        off_t offset;              /* of the event file: what is before is not an event for this set */
        int inotify_fd;
        uint64_t created_ms;
        FakeTimed timed[FAKE_MAX_TIMED];
        size_t n_timed;
};

static uint64_t now_ms(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000;
}

/* One line of the event file: 1 and the event for xid/dbe/sbe/lost, 0 for a state line or junk. */
static int parse_event(const char *line, unsigned *gpu, unsigned long long *type, unsigned long long *data,
                       unsigned *gi) {
        char kind[16];
        unsigned g, code, instance;
        int n = sscanf(line, "%15s %u %u %u", kind, &g, &code, &instance);

        if (n < 2)
                return 0;
        *gpu = g;
        *data = 0;
        *gi = n == 4 ? instance : 0xFFFFFFFFu;
        if (streq(kind, "xid") && n >= 3) {
                *type = nvmlEventTypeXidCriticalError;
                *data = code;
        } else if (streq(kind, "lost")) {
                *type = nvmlEventTypeXidCriticalError;
                *data = 79;
        } else if (streq(kind, "dbe"))
                *type = nvmlEventTypeDoubleBitEccError;
        else if (streq(kind, "sbe"))
                *type = nvmlEventTypeSingleBitEccError;
        else
                return 0;
        return 1;
}

static void parse_timed(nvmlEventSet_t set) {
        const char *e = getenv("FAKE_NVML_EVENTS");
        char buf[1024];

        if (!e || !*e)
                return;
        snprintf(buf, sizeof buf, "%s", e);
        for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                char kind[16] = "";
                unsigned g, code = 0;
                unsigned long ms;
                char line[64];
                FakeTimed *x = &set->timed[set->n_timed];

                if (set->n_timed >= FAKE_MAX_TIMED)
                        break;
                if (sscanf(t, "%u:%15[a-z]:%u@%lu", &g, kind, &code, &ms) != 4 &&
                    sscanf(t, "%u:%15[a-z]@%lu", &g, kind, &ms) != 3) {
                        fprintf(stderr, "fake-nvml: FAKE_NVML_EVENTS: '%s' is not GPU:KIND[:CODE]@MS; ignored\n", t);
                        continue;
                }
                snprintf(line, sizeof line, "%s %u %u", kind, g, code);
                if (parse_event(line, &x->gpu, &x->type, &x->data, &x->gi) <= 0) {
                        fprintf(stderr, "fake-nvml: FAKE_NVML_EVENTS: unknown kind '%s' (xid, dbe, sbe, lost); ignored\n",
                                kind);
                        continue;
                }
                x->due_ms = set->created_ms + ms;
                set->n_timed++;
        }
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *ret) {
        nvmlReturn_t r;

        if (fake_enter(__func__, &r))
                return fake_leave(__func__, r);
        if (!ret)
                return fake_leave(__func__, NVML_ERROR_INVALID_ARGUMENT);
        nvmlEventSet_t set = calloc(1, sizeof *set);
        if (!set)
                return fake_leave(__func__, NVML_ERROR_MEMORY);
        set->n_gpus = fake_ctx.node->n_gpus;
        set->mask = calloc(set->n_gpus + 1, sizeof *set->mask);
        set->inotify_fd = -1;
        set->created_ms = now_ms();
        const char *f = getenv("FAKE_NVML_EVENT_FILE");
        if (f && *f) {
                set->file = strdup(f);
                int fd = open(f, O_RDONLY | O_CLOEXEC);
                if (fd >= 0) {
                        set->offset = lseek(fd, 0, SEEK_END);
                        close(fd);
                }
                set->inotify_fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
                char *dir = strdup(f), *slash = dir ? strrchr(dir, '/') : NULL;
                if (slash)
                        *slash = 0;
                if (set->inotify_fd >= 0 && dir &&
                    inotify_add_watch(set->inotify_fd, slash ? (*dir ? dir : "/") : ".",
                                      IN_MODIFY | IN_CREATE | IN_CLOSE_WRITE | IN_MOVED_TO) < 0)
                        fprintf(stderr, "fake-nvml: cannot watch the directory of %s: %s\n", f, strerror(errno));
                free(dir);
        }
        parse_timed(set);
        if (!set->mask) {
                free(set->file);
                free(set);
                return fake_leave(__func__, NVML_ERROR_MEMORY);
        }
        *ret = set;
        return fake_leave(__func__, NVML_SUCCESS);
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
        nvmlReturn_t r;

        if (fake_enter(__func__, &r))
                return fake_leave(__func__, r);
        if (!set)
                return fake_leave(__func__, NVML_ERROR_INVALID_ARGUMENT);
        if (set->inotify_fd >= 0)
                close(set->inotify_fd);
        free(set->mask);
        free(set->file);
        free(set);
        return fake_leave(__func__, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *types) {
        nvmlReturn_t r;

        if (fake_enter(__func__, &r))
                return fake_leave(__func__, r);
        if (!fake_device(device, NULL) || !types)
                return fake_leave(__func__, NVML_ERROR_INVALID_ARGUMENT);
        *types = FAKE_EVENT_TYPES;
        return fake_leave(__func__, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types, nvmlEventSet_t set) {
        unsigned idx;
        nvmlReturn_t r;

        if (fake_enter(__func__, &r))
                return fake_leave(__func__, r);
        if (!fake_device(device, &idx) || !set || idx >= set->n_gpus)
                return fake_leave(__func__, NVML_ERROR_INVALID_ARGUMENT);
        if (types & ~(unsigned long long) FAKE_EVENT_TYPES)
                return fake_leave(__func__, NVML_ERROR_NOT_SUPPORTED);
        set->mask[idx] |= types;
        return fake_leave(__func__, NVML_SUCCESS);
}

static bool deliver(nvmlEventSet_t set, unsigned gpu, unsigned long long type, unsigned long long data,
                    unsigned gi, nvmlEventData_t *out) {
        if (gpu >= set->n_gpus || !(set->mask[gpu] & type))
                return false;
        *out = (nvmlEventData_t) {
                .device = &fake_ctx.handles[gpu].dev,
                .eventType = type,
                .eventData = data,
                .gpuInstanceId = gi,
                .computeInstanceId = gi == 0xFFFFFFFFu ? 0xFFFFFFFFu : 0,
        };
        return true;
}

/* The next complete line of the event file after set->offset that is an event for this set. */
static bool next_from_file(nvmlEventSet_t set, nvmlEventData_t *out) {
        char line[256];
        bool found = false;

        if (!set->file)
                return false;
        FILE *f = fopen(set->file, "re");
        if (!f)
                return false;
        if (fseeko(f, set->offset, SEEK_SET) < 0) {
                fclose(f);
                return false;
        }
        while (!found && fgets(line, sizeof line, f)) {
                size_t n = strlen(line);
                unsigned gpu, gi;
                unsigned long long type, data;

                if (n == 0 || line[n - 1] != '\n')
                        break; /* a line still being written */
                set->offset += (off_t) n;
                if (parse_event(line, &gpu, &type, &data, &gi) > 0)
                        found = deliver(set, gpu, type, data, gi, out);
        }
        fclose(f);
        return found;
}

static bool next_timed(nvmlEventSet_t set, nvmlEventData_t *out, uint64_t *next_due) {
        uint64_t now = now_ms();

        *next_due = UINT64_MAX;
        for (size_t i = 0; i < set->n_timed; i++) {
                FakeTimed *t = &set->timed[i];
                if (t->fired)
                        continue;
                if (t->due_ms <= now) {
                        t->fired = true;
                        if (deliver(set, t->gpu, t->type, t->data, t->gi, out))
                                return true;
                        continue;
                }
                if (t->due_ms < *next_due)
                        *next_due = t->due_ms;
        }
        return false;
}

static nvmlReturn_t event_wait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned timeoutms) {
        uint64_t deadline = now_ms() + timeoutms;

        for (;;) {
                uint64_t due, now;
                char buf[4096];

                if (next_timed(set, data, &due) || next_from_file(set, data))
                        return NVML_SUCCESS;
                now = now_ms();
                if (now >= deadline)
                        return NVML_ERROR_TIMEOUT;
                uint64_t until = due < deadline ? due : deadline;
                uint64_t wait = until - now;
                struct pollfd p = { .fd = set->inotify_fd, .events = POLLIN };
                int n = poll(set->inotify_fd >= 0 ? &p : NULL, set->inotify_fd >= 0 ? 1 : 0,
                             wait > INT_MAX ? INT_MAX : (int) wait);
                if (n < 0 && errno != EINTR)
                        return NVML_ERROR_UNKNOWN;
                if (n > 0)
                        while (read(set->inotify_fd, buf, sizeof buf) > 0)
                                ;
        }
}

static nvmlReturn_t set_wait(const char *name, nvmlEventSet_t set, nvmlEventData_t *data, unsigned timeoutms) {
        nvmlReturn_t r;

        if (fake_enter(name, &r))
                return fake_leave(name, r);
        if (!set || !data)
                return fake_leave(name, NVML_ERROR_INVALID_ARGUMENT);
        /* Block outside the library lock, as NVML lets other threads call in meanwhile. */
        pthread_mutex_unlock(&fake_ctx.lock);
        r = event_wait(set, data, timeoutms);
        pthread_mutex_lock(&fake_ctx.lock);
        return fake_leave(name, r);
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
        return set_wait(__func__, set, data, timeoutms);
}

nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
        return set_wait(__func__, set, data, timeoutms);
}

/* The remapped-rows answer of GPU gpu from the whole event file: the last "remap" line wins; "lost" until
 * a later "back" makes it GPU_IS_LOST. */
static nvmlReturn_t remapped_state(unsigned gpu, unsigned v[4]) {
        const char *file = getenv("FAKE_NVML_EVENT_FILE");
        char line[256];
        bool lost = false;

        memset(v, 0, 4 * sizeof *v);
        FILE *f = file && *file ? fopen(file, "re") : NULL;
        while (f && fgets(line, sizeof line, f)) {
                char kind[16];
                unsigned g, a[4];
                int n = sscanf(line, "%15s %u %u %u %u %u", kind, &g, &a[0], &a[1], &a[2], &a[3]);
                if (n < 2 || g != gpu)
                        continue;
                if (streq(kind, "lost"))
                        lost = true;
                else if (streq(kind, "back"))
                        lost = false;
                else if (streq(kind, "remap") && n == 6)
                        memcpy(v, a, sizeof a);
        }
        if (f)
                fclose(f);
        return lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                       unsigned int *isPending, unsigned int *failureOccurred) {
        unsigned idx, v[4];
        nvmlReturn_t r;

        if (fake_enter(__func__, &r))
                return fake_leave(__func__, r);
        if (!fake_device(device, &idx))
                return fake_leave(__func__, fake_mig_device(device, NULL) ? NVML_ERROR_NOT_SUPPORTED
                                                                          : NVML_ERROR_INVALID_ARGUMENT);
        if (!corrRows || !uncRows || !isPending || !failureOccurred)
                return fake_leave(__func__, NVML_ERROR_INVALID_ARGUMENT);
        r = remapped_state(idx, v);
        if (r == NVML_SUCCESS) {
                *corrRows = v[0];
                *uncRows = v[1];
                *isPending = v[2];
                *failureOccurred = v[3];
        }
        return fake_leave(__func__, r);
}
