/* SPDX-License-Identifier: MIT */
/* Owns both sides of the NVML worker (the mechanism and the reasons are in gpu-nvml-worker.h): the
 * worker's request loop, and the daemon's asynchronous client — starting the worker, the request in
 * flight, its per-call deadline, the progress it reports, and turning a hang or a crash into a sentence. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "event-util.h"
#include "gpu-nvml-internal.h"
#include "gpu-nvml-worker.h"
#include "spawn-child.h"
#include "strv.h"

/* ---- the worker ---- */

static int write_all(int fd, const void *p, size_t n) {
        while (n > 0) {
                ssize_t k = write(fd, p, n);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return negative_errno();
                }
                p = (const uint8_t *) p + k;
                n -= (size_t) k;
        }
        return 0;
}

static int read_all(int fd, void *p, size_t n) {
        while (n > 0) {
                ssize_t k = read(fd, p, n);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return negative_errno();
                }
                if (k == 0)
                        return -EPIPE;
                p = (uint8_t *) p + k;
                n -= (size_t) k;
        }
        return 0;
}

static int send_frame(int fd, WireBuf *b) {
        int r = wire_end(b);
        return r < 0 ? r : write_all(fd, b->data, b->len);
}

typedef struct WorkerCtx {
        int fd;
        WireBuf progress;
} WorkerCtx;

static void worker_progress(const char *entry_point, int gpu, void *userdata) {
        WorkerCtx *c = userdata;

        wire_begin(&c->progress, GPU_NVML_WIRE_PROGRESS);
        wire_put_i32(&c->progress, gpu);
        wire_put_str(&c->progress, entry_point);
        (void) send_frame(c->fd, &c->progress);
}

static int send_error(int fd, int r, const char *message) {
        _cleanup_(wire_buf_done) WireBuf b = {};

        wire_begin(&b, GPU_NVML_WIRE_ERROR);
        wire_put_i32(&b, r);
        wire_put_str(&b, message ?: strerror(-r));
        return send_frame(fd, &b);
}

int gpu_nvml_worker_main(int fd, void *userdata) {
        WorkerCtx ctx = { .fd = fd };
        const GpuNvmlSeed *seed = userdata;
        GpuNvml *n = NULL;
        char *library = NULL;
        bool opened_once = false;

        for (;;) {
                _cleanup_(wire_buf_done) WireBuf out = {};
                _cleanup_(gpu_nvml_snapshot_freep) NvmlSnapshot *snap = NULL;
                _cleanup_strv_free_ char **addresses = NULL;
                _cleanup_free_ char *want = NULL, *error = NULL;
                _cleanup_free_ uint8_t *payload = NULL;
                uint32_t head[2], count;
                WireReader rd;
                GpuNvmlJobFunc fn;
                bool all;
                int r;

                if (read_all(fd, head, sizeof head) < 0)
                        break; /* the daemon went away or closed us */
                if (head[0] > GPU_NVML_WIRE_MAX ||
                    (head[1] != GPU_NVML_WIRE_SNAPSHOT_REQUEST && head[1] != GPU_NVML_WIRE_READ_REQUEST))
                        break;
                payload = malloc(head[0] ?: 1);
                if (!payload || read_all(fd, payload, head[0]) < 0)
                        break;
                rd = (WireReader) { .p = payload, .left = head[0] };
                want = wire_get_str(&rd);
                /* A read function of this very program image: the worker is a fork, never an exec. */
                fn = head[1] == GPU_NVML_WIRE_READ_REQUEST ? (GpuNvmlJobFunc) (uintptr_t) wire_get_u64(&rd) : NULL;
                /* A read with input bytes (gpu_nvml_worker_read_input()) instead of addresses. */
                GpuNvmlInput input = {};
                bool has_input = false;
                if (fn) {
                        uint32_t in_len = wire_get_u32(&rd);
                        if (in_len != UINT32_MAX && !rd.bad) {
                                if (in_len > rd.left)
                                        rd.bad = true;
                                else {
                                        input = (GpuNvmlInput) { .data = rd.p, .len = in_len };
                                        rd.p += in_len;
                                        rd.left -= in_len;
                                        has_input = true;
                                }
                        }
                }
                count = has_input ? 0 : wire_get_u32(&rd);
                all = count == UINT32_MAX;
                for (uint32_t i = 0; !all && i < count && !rd.bad; i++)
                        if (strv_consume(&addresses, wire_get_str(&rd)) < 0 && !rd.bad)
                                break;
                if (rd.bad || !want || (head[1] == GPU_NVML_WIRE_READ_REQUEST && !fn)) {
                        (void) send_error(fd, -EBADMSG, "malformed request to the NVML worker");
                        continue;
                }
                if (!all && !addresses && !(addresses = calloc(1, sizeof(char *))))
                        break;

                if (n && !streq(library, want)) {
                        n = gpu_nvml_close(n);
                        library = mfree(library);
                }
                if (!n) {
                        r = gpu_nvml_open_progress(want, worker_progress, &ctx, &n, &error);
                        if (r < 0) {
                                if (send_error(fd, r, error) < 0)
                                        break;
                                continue;
                        }
                        library = TAKE_PTR(want);
                        if (!opened_once && seed && seed->fn)
                                seed->fn(n, seed->userdata);
                        opened_once = true;
                }

                if (fn) {
                        /* A read of the caller's (the MIG states): its answer is raw bytes, as a job's. */
                        wire_begin(&out, GPU_NVML_WIRE_RESULT);
                        r = fn(n, has_input ? (void *) &input : all ? NULL : addresses, &out, &error);
                        n->progress_gpu = -1;
                        if (r >= 0) {
                                r = send_frame(fd, &out);
                                if (r == -ENOMEM || r == -EMSGSIZE)
                                        r = send_error(fd, r, "the NVML read's answer does not fit into a message");
                                if (r < 0)
                                        break;
                                continue;
                        }
                } else
                        r = gpu_nvml_read(n, all ? NULL : addresses, &snap, &error);
                if (r < 0) {
                        /* Start from scratch next time: the driver may have been unloaded or reset. */
                        n = gpu_nvml_close(n);
                        library = mfree(library);
                        if (send_error(fd, r, error) < 0)
                                break;
                        continue;
                }
                wire_begin(&out, GPU_NVML_WIRE_SNAPSHOT);
                wire_put_snapshot(&out, snap);
                r = send_frame(fd, &out);
                if (r == -ENOMEM || r == -EMSGSIZE)
                        r = send_error(fd, r, "the NVML snapshot does not fit into a message");
                if (r < 0)
                        break;
        }
        gpu_nvml_close(n);
        free(library);
        wire_buf_done(&ctx.progress);
        return 0;
}

/* ---- the daemon's client ---- */

static int job_main(int fd, void *userdata);

struct GpuNvmlWorker {
        sd_event *event;
        Spawn *child;
        int fd;
        sd_event_source *io, *deadline, *tick;
        GpuNvmlWorkerProgress progress;
        void *progress_userdata;
        uint8_t *in;
        size_t in_len, in_cap;

        bool busy;
        GpuNvmlWorkerDone done;
        void *userdata;
        uint64_t timeout_usec, init_usec;
        char *call;               /* "nvmlDeviceGetMemoryInfo on GPU 3", NULL before the first */
        bool in_init;
        uint64_t call_usec;       /* CLOCK_MONOTONIC when it started */

        /* A job in flight (gpu_nvml_worker_job()); the worker reads these from its copy of us. */
        GpuNvmlJobFunc job_fn;
        void *job_fn_userdata;
        char *job_library;
        int job_gpu;
        GpuNvmlJobDone job_done;
        bool job_stays;           /* a read on the long-lived worker (gpu_nvml_worker_read()): it goes on */

        GpuNvmlSeed seed;         /* for the long-lived worker, read there from its copy of us */
};

void gpu_nvml_worker_set_seed(GpuNvmlWorker *w, GpuNvmlSeedFunc fn, void *userdata) {
        w->seed = (GpuNvmlSeed) { .fn = fn, .userdata = userdata };
}

/* The worker of a job: open, run, answer, exit. */
static int job_main(int fd, void *userdata) {
        GpuNvmlWorker *w = userdata;
        WorkerCtx ctx = { .fd = fd };
        _cleanup_(wire_buf_done) WireBuf out = {};
        _cleanup_free_ char *error = NULL;
        GpuNvml *n = NULL;
        int r;

        r = gpu_nvml_open_progress(w->job_library, worker_progress, &ctx, &n, &error);
        if (r >= 0) {
                n->progress_gpu = w->job_gpu;
                wire_begin(&out, GPU_NVML_WIRE_RESULT);
                r = w->job_fn(n, w->job_fn_userdata, &out, &error);
                n->progress_gpu = -1;
        }
        if (r >= 0) {
                r = send_frame(fd, &out);
                if (r == -ENOMEM || r == -EMSGSIZE)
                        (void) send_error(fd, r, "the NVML job's answer does not fit into a message");
        } else
                (void) send_error(fd, r, error);
        gpu_nvml_close(n);
        wire_buf_done(&ctx.progress);
        return r < 0 ? 1 : 0;
}

static uint64_t now_usec(sd_event *e) {
        uint64_t t = 0;
        (void) sd_event_now(e, CLOCK_MONOTONIC, &t);
        return t;
}

/* Whole seconds from 1 s on ("30 s": the deadline and the ticks fire on the second), ms below. */
static void format_duration(char *buf, size_t size, uint64_t usec) {
        if (usec >= USEC_PER_SEC)
                snprintf(buf, size, "%" PRIu64 " s", (usec + USEC_PER_SEC / 2) / USEC_PER_SEC);
        else
                snprintf(buf, size, "%" PRIu64 " ms", usec / USEC_PER_MSEC);
}

static void stop_worker(GpuNvmlWorker *w) {
        w->io = sd_event_source_disable_unref(w->io);
        w->deadline = sd_event_source_disable_unref(w->deadline);
        w->tick = sd_event_source_disable_unref(w->tick);
        if (w->fd >= 0)
                w->fd = (close(w->fd), -1);
        /* SIGTERM now; SIGKILL and the reap follow from the loop (a wedged call may not let it go). */
        w->child = spawn_free(w->child);
        w->in_len = 0;
}

/* Ends the request in flight with r and a message (or a snapshot). */
static void finish(GpuNvmlWorker *w, int r, NvmlSnapshot *snap, const char *message) {
        GpuNvmlWorkerDone done = w->done;
        GpuNvmlJobDone job_done = w->job_done;

        w->busy = false;
        w->done = NULL;
        w->job_done = NULL;
        w->job_fn = NULL;
        w->job_stays = false;
        w->call = mfree(w->call);
        w->in_init = false;
        w->deadline = sd_event_source_disable_unref(w->deadline);
        w->tick = sd_event_source_disable_unref(w->tick);
        if (job_done) {
                gpu_nvml_snapshot_free(snap);
                job_done(w, r < 0 ? r : -EBADMSG, NULL, 0, r < 0 ? message : "NVML job answered with a snapshot",
                         w->userdata);
        } else if (done)
                done(w, r, snap, message, w->userdata);
        else
                gpu_nvml_snapshot_free(snap);
}

/* A job's answer: the worker is done (it exits after one job). */
static void finish_job(GpuNvmlWorker *w, const uint8_t *payload, uint32_t len) {
        GpuNvmlJobDone job_done = w->job_done;
        _cleanup_free_ uint8_t *copy = malloc(len ?: 1);

        if (!copy) {
                stop_worker(w);
                finish(w, -ENOMEM, NULL, "Out of memory.");
                return;
        }
        memcpy(copy, payload, len);
        if (!w->job_stays)
                stop_worker(w); /* a job's worker exits after it */
        w->job_done = NULL;
        finish(w, 0, NULL, NULL); /* resets the request; job_done is ours now */
        job_done(w, 0, copy, len, NULL, w->userdata);
}

static void fail(GpuNvmlWorker *w, int r, const char *fmt, ...) _printf_(3, 4);
static void fail(GpuNvmlWorker *w, int r, const char *fmt, ...) {
        _cleanup_free_ char *message = NULL;
        va_list ap;

        va_start(ap, fmt);
        if (vasprintf(&message, fmt, ap) < 0)
                message = NULL;
        va_end(ap);
        finish(w, r, NULL, message ?: "Out of memory.");
}

static uint64_t call_limit(GpuNvmlWorker *w) {
        return w->timeout_usec + (w->in_init ? w->init_usec : 0);
}

static int on_deadline(sd_event_source *s, uint64_t usec, void *userdata) {
        GpuNvmlWorker *w = userdata;
        _cleanup_free_ char *call = TAKE_PTR(w->call);
        char took[32];

        format_duration(took, sizeof took, usec - w->call_usec);
        stop_worker(w);
        if (call)
                fail(w, -ETIMEDOUT, "%s has not returned for %s; the NVML worker was killed and is started "
                     "again on the next attempt (a GPU that fell off the bus, or a wedged driver).", call, took);
        else
                fail(w, -ETIMEDOUT, "The NVML worker has not answered for %s; it was killed and is started again "
                     "on the next attempt.", took);
        return 0;
}

static void arm_deadline(GpuNvmlWorker *w) {
        uint64_t at = w->call_usec + call_limit(w);

        (void) event_reset_time(w->event, &w->deadline, CLOCK_MONOTONIC, at, 0, on_deadline, w, "nvml-deadline");
}

static void on_progress(GpuNvmlWorker *w, WireReader *rd) {
        int32_t gpu = wire_get_i32(rd);
        _cleanup_free_ char *entry = wire_get_str(rd);

        if (rd->bad || !entry)
                return;
        free(w->call);
        w->call = gpu >= 0 ? strprintf("%s on GPU %" PRIi32, entry, gpu) : strdup(entry);
        w->in_init = streq(entry, "nvmlInit_v2") || streq(entry, "dlopen");
        w->call_usec = now_usec(w->event);
        arm_deadline(w);
}

/* One complete frame. Returns < 0 for a protocol error. */
static int dispatch(GpuNvmlWorker *w, uint32_t type, const uint8_t *payload, uint32_t len) {
        WireReader rd = { .p = payload, .left = len };

        switch ((GpuNvmlWireType) type) {
        case GPU_NVML_WIRE_PROGRESS:
                on_progress(w, &rd);
                return rd.bad ? -EBADMSG : 0;
        case GPU_NVML_WIRE_ERROR: {
                int32_t r = wire_get_i32(&rd);
                _cleanup_free_ char *message = wire_get_str(&rd);

                if (rd.bad || r >= 0 || !w->busy)
                        return -EBADMSG;
                finish(w, r, NULL, message ?: "NVML failed.");
                return 0;
        }
        case GPU_NVML_WIRE_RESULT:
                if (!w->busy || !w->job_done)
                        return -EBADMSG;
                finish_job(w, payload, len);
                return 0;
        case GPU_NVML_WIRE_SNAPSHOT: {
                NvmlSnapshot *snap = NULL;
                int r;

                if (!w->busy || w->job_done)
                        return -EBADMSG;
                r = wire_get_snapshot(&rd, &snap);
                if (r < 0)
                        return r;
                finish(w, 0, snap, NULL);
                return 0;
        }
        case GPU_NVML_WIRE_SNAPSHOT_REQUEST:
        case GPU_NVML_WIRE_READ_REQUEST:
                break;
        }
        return -EBADMSG;
}

static void worker_gone(GpuNvmlWorker *w, const char *why) {
        _cleanup_free_ char *call = TAKE_PTR(w->call);

        stop_worker(w);
        if (w->busy)
                fail(w, -EIO, "The NVML worker %s%s%s; it is started again on the next attempt.", why,
                     call ? " in " : "", call ?: "");
}

static int on_io(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        GpuNvmlWorker *w = userdata;

        /* A bounded number of reads per dispatch: a chatty worker must not starve D-Bus. */
        for (unsigned rounds = 0; rounds < 16; rounds++) {
                if (w->in_cap - w->in_len < 4096) {
                        size_t cap = w->in_cap ? w->in_cap * 2 : 16384;
                        uint8_t *n = realloc(w->in, cap);
                        if (!n) {
                                worker_gone(w, "could not be read from (out of memory)");
                                return 0;
                        }
                        w->in = n;
                        w->in_cap = cap;
                }
                ssize_t k = read(w->fd, w->in + w->in_len, w->in_cap - w->in_len);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0 && errno == EAGAIN)
                        break;
                if (k <= 0) {
                        /* EOF: it died (the exit handler says how), or closed its end. Wait for the exit
                         * notification when it is coming; the socket says nothing more. */
                        w->io = sd_event_source_disable_unref(w->io);
                        if (!spawn_is_running(w->child))
                                worker_gone(w, "closed its connection");
                        return 0;
                }
                w->in_len += (size_t) k;

                size_t off = 0;
                while (w->in_len - off >= 8) {
                        uint32_t head[2];

                        memcpy(head, w->in + off, sizeof head);
                        if (head[0] > GPU_NVML_WIRE_MAX) {
                                worker_gone(w, "sent a malformed message");
                                return 0;
                        }
                        if (w->in_len - off - 8 < head[0])
                                break;
                        if (dispatch(w, head[1], w->in + off + 8, head[0]) < 0) {
                                worker_gone(w, "sent a malformed message");
                                return 0;
                        }
                        if (!w->child) /* the callback freed or cancelled us */
                                return 0;
                        off += 8 + head[0];
                }
                memmove(w->in, w->in + off, w->in_len - off);
                w->in_len -= off;
        }
        return 0;
}

static void on_exit_worker(Spawn *child, const SpawnResult *res, void *userdata) {
        GpuNvmlWorker *w = userdata;
        char why[96];

        if (res->signal > 0)
                snprintf(why, sizeof why, "crashed with signal %s", sigabbrev_np(res->signal) ?: "?");
        else
                snprintf(why, sizeof why, "exited with status %d", res->exit_status);
        /* Frames it sent before dying (a result, maybe) count: read them first. */
        if (w->io && w->fd >= 0)
                (void) on_io(w->io, w->fd, EPOLLIN, w);
        if (w->child == child)
                worker_gone(w, why);
}

static int start_worker(GpuNvmlWorker *w, SpawnChildFunc fn, void *fn_userdata) {
        SpawnOptions o = { .on_exit = on_exit_worker, .userdata = w, .kill_grace_usec = 1 * USEC_PER_SEC };
        int sv[2], r;

        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) < 0)
                return negative_errno();
        /* The worker's end blocks: it has nothing else to do. */
        r = fcntl(sv[1], F_SETFL, 0) < 0 ? negative_errno() : 0;
        if (r >= 0)
                r = spawn_fork(w->event, sv[1], fn, fn_userdata, &o, &w->child);
        close(sv[1]);
        if (r < 0) {
                close(sv[0]);
                return r;
        }
        w->fd = sv[0];
        r = sd_event_add_io(w->event, &w->io, w->fd, EPOLLIN, on_io, w);
        if (r < 0) {
                stop_worker(w);
                return r;
        }
        (void) sd_event_source_set_description(w->io, "nvml-worker");
        return 0;
}

static int on_tick(sd_event_source *s, uint64_t usec, void *userdata) {
        GpuNvmlWorker *w = userdata;
        _cleanup_free_ char *text = NULL;
        char took[32];

        format_duration(took, sizeof took, usec > w->call_usec ? usec - w->call_usec : 0);
        text = strprintf("%s for %s", w->call ?: "starting NVML", took);
        if (w->progress && text)
                w->progress(w, text, w->progress_userdata);
        if (!w->tick) /* the callback ended the request */
                return 0;
        (void) sd_event_source_set_time(s, usec + USEC_PER_SEC);
        return sd_event_source_set_enabled(s, SD_EVENT_ONESHOT);
}

void gpu_nvml_worker_set_progress(GpuNvmlWorker *w, GpuNvmlWorkerProgress cb, void *userdata) {
        w->progress = cb;
        w->progress_userdata = userdata;
}

int gpu_nvml_worker_new(sd_event *e, GpuNvmlWorker **ret) {
        GpuNvmlWorker *w = calloc(1, sizeof *w);

        if (!w)
                return -ENOMEM;
        w->event = sd_event_ref(e);
        w->fd = -1;
        *ret = w;
        return 0;
}

GpuNvmlWorker *gpu_nvml_worker_free(GpuNvmlWorker *w) {
        if (!w)
                return NULL;
        w->done = NULL;
        w->job_done = NULL;
        stop_worker(w);
        free(w->in);
        free(w->call);
        free(w->job_library);
        sd_event_unref(w->event);
        return mfree(w);
}

void gpu_nvml_worker_cancel(GpuNvmlWorker *w) {
        if (!w || !w->busy)
                return;
        w->done = NULL;
        w->job_done = NULL;
        stop_worker(w);
        finish(w, -ECANCELED, NULL, NULL);
}

void gpu_nvml_worker_abort(GpuNvmlWorker *w, int r, const char *message) {
        if (!w)
                return;
        stop_worker(w);
        if (w->busy)
                finish(w, r, NULL, message);
}

bool gpu_nvml_worker_busy(const GpuNvmlWorker *w) {
        return w && w->busy;
}

pid_t gpu_nvml_worker_pid(const GpuNvmlWorker *w) {
        return w ? spawn_pid(w->child) : 0;
}

/* Sends a request to the long-lived worker (started when none runs). */
static int send_request(GpuNvmlWorker *w, const char *library, GpuNvmlJobFunc fn, char *const *pci_addresses,
                        const GpuNvmlInput *input) {
        _cleanup_(wire_buf_done) WireBuf b = {};
        int r;

        if (!spawn_is_running(w->child) || w->fd < 0) {
                stop_worker(w);
                r = start_worker(w, gpu_nvml_worker_main, w->seed.fn ? &w->seed : NULL);
                if (r < 0)
                        return r;
        }

        wire_begin(&b, fn ? GPU_NVML_WIRE_READ_REQUEST : GPU_NVML_WIRE_SNAPSHOT_REQUEST);
        wire_put_str(&b, library);
        if (fn) {
                wire_put_u64(&b, (uint64_t) (uintptr_t) fn);
                wire_put_u32(&b, input ? (uint32_t) input->len : UINT32_MAX);
                if (input && input->len > 0) {
                        if (b.len + input->len > b.cap) {
                                uint8_t *p = realloc(b.data, b.len + input->len);
                                if (!p)
                                        return -ENOMEM;
                                b.data = p;
                                b.cap = b.len + input->len;
                        }
                        memcpy(b.data + b.len, input->data, input->len);
                        b.len += input->len;
                }
        }
        if (!input) {
                wire_put_u32(&b, pci_addresses ? (uint32_t) strv_length(pci_addresses) : UINT32_MAX);
                STRV_FOREACH(a, pci_addresses)
                        wire_put_str(&b, *a);
        }
        r = wire_end(&b);
        if (r < 0)
                return r;
        /* Into an idle socket (a job's input: a few KiB): all of it, or the worker is broken. */
        for (size_t done = 0; done < b.len;) {
                ssize_t k = write(w->fd, b.data + done, b.len - done);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0) {
                        r = k < 0 ? negative_errno() : -EIO;
                        stop_worker(w);
                        return r;
                }
                done += (size_t) k;
        }
        return 0;
}

static void arm_request(GpuNvmlWorker *w, uint64_t timeout_usec, unsigned n_gpus);

int gpu_nvml_worker_snapshot(GpuNvmlWorker *w, const char *library, char *const *pci_addresses,
                             uint64_t timeout_usec, unsigned n_gpus, GpuNvmlWorkerDone done, void *userdata) {
        int r;

        assert(w);
        assert(library);
        if (w->busy)
                return -EBUSY;
        r = send_request(w, library, NULL, pci_addresses, NULL);
        if (r < 0)
                return r;
        w->done = done;
        w->userdata = userdata;
        /* until it says otherwise, it may be loading and initialising */
        arm_request(w, timeout_usec, n_gpus);
        return 0;
}

/* Sends a job request (fn over the GPUs of pci_addresses, or over input): its answer goes to done, and the
 * worker stays for the next one. */
static int start_job(GpuNvmlWorker *w, const char *library, GpuNvmlJobFunc fn, char *const *pci_addresses,
                     const GpuNvmlInput *input, uint64_t timeout_usec, unsigned n_gpus, GpuNvmlJobDone done,
                     void *userdata) {
        int r;

        assert(w);
        assert(library);
        assert(fn);
        assert(done);
        if (w->busy)
                return -EBUSY;
        r = send_request(w, library, fn, pci_addresses, input);
        if (r < 0)
                return r;
        w->done = NULL;
        w->job_done = done;
        w->job_stays = true;
        w->userdata = userdata;
        arm_request(w, timeout_usec, n_gpus);
        return 0;
}

int gpu_nvml_worker_read(GpuNvmlWorker *w, const char *library, char *const *pci_addresses, uint64_t timeout_usec,
                         unsigned n_gpus, GpuNvmlJobFunc fn, GpuNvmlJobDone done, void *userdata) {
        return start_job(w, library, fn, pci_addresses, NULL, timeout_usec, n_gpus, done, userdata);
}

int gpu_nvml_worker_read_input(GpuNvmlWorker *w, const char *library, const void *data, size_t len,
                               uint64_t timeout_usec, unsigned n_gpus, GpuNvmlJobFunc fn, GpuNvmlJobDone done,
                               void *userdata) {
        GpuNvmlInput input = { .data = data, .len = len };

        if (len >= GPU_NVML_WIRE_MAX / 2)
                return -EMSGSIZE;
        return start_job(w, library, fn, NULL, &input, timeout_usec, n_gpus, done, userdata);
}

static void arm_request(GpuNvmlWorker *w, uint64_t timeout_usec, unsigned n_gpus) {
        w->busy = true;
        w->timeout_usec = timeout_usec ?: GPU_NVML_WORKER_TIMEOUT_DEFAULT_USEC;
        w->init_usec = (uint64_t) n_gpus * (w->timeout_usec < GPU_NVML_WORKER_INIT_PER_GPU_USEC
                                                    ? w->timeout_usec : GPU_NVML_WORKER_INIT_PER_GPU_USEC);
        w->call = mfree(w->call);
        w->in_init = true;
        w->call_usec = now_usec(w->event);
        arm_deadline(w);
        if (w->progress)
                (void) event_reset_time(w->event, &w->tick, CLOCK_MONOTONIC, w->call_usec + USEC_PER_SEC, 0, on_tick, w,
                                        "nvml-progress");
}

int gpu_nvml_worker_job(GpuNvmlWorker *w, const char *library, int gpu, uint64_t timeout_usec,
                        GpuNvmlJobFunc fn, void *fn_userdata, GpuNvmlJobDone done, void *userdata) {
        char *copy;
        int r;

        assert(w);
        assert(library);
        assert(fn);
        assert(done);
        if (w->busy)
                return -EBUSY;
        copy = strdup(library);
        if (!copy)
                return -ENOMEM;
        free(w->job_library);
        w->job_library = copy;
        w->job_fn = fn;
        w->job_fn_userdata = fn_userdata;
        w->job_gpu = gpu;

        /* A fresh worker per job: it is forked now, with the job's input in its memory. */
        stop_worker(w);
        r = start_worker(w, job_main, w);
        if (r < 0) {
                w->job_fn = NULL;
                return r;
        }
        w->done = NULL;
        w->job_done = done;
        w->userdata = userdata;
        /* nvmlInit attaches every GPU; a job touches one, but the driver still attaches all: allow one. */
        arm_request(w, timeout_usec, 1);
        return 0;
}
