/* SPDX-License-Identifier: MIT */
/* Owns NVML behind a worker process: the daemon never calls libnvidia-ml for the nvml stage itself.
 *
 * Why a process, not a thread: a call into the vendor library can crash (SIGSEGV inside
 * libnvidia-ml) or never return (a GPU that fell off the bus, a wedged driver lock), and the library may
 * hang already in its load-time constructor. A thread that does either takes the daemon with it or can
 * never be stopped; a process can be killed, and the daemon keeps answering D-Bus, sending watchdog
 * pings and handling SIGTERM while it waits, and starts a new one when the library answers again.
 *
 * How: the worker is a fork of the daemon (spawn_fork(): own process group, every descriptor but its
 * socket closed, default signals, PDEATHSIG so it never outlives us) that runs gpu_nvml_worker_main() on
 * one end of a socketpair. It dlopens libnvidia-ml itself and keeps the handle (and its caches of static
 * facts) between requests; the daemon side is an asynchronous client on sd-event. Requests are coarse:
 * one SNAPSHOT request is "open the library if not open yet (or another one), then read every GPU and
 * its MIG state". Before each entry-point call the worker sends a PROGRESS message (the call and the GPU
 * index), so that when a call does not come back within the deadline, the daemon can say which one:
 * "nvmlDeviceGetMemoryInfo on GPU 3 has not returned for 30 s". The deadline runs per call (re-armed by
 * every PROGRESS), with extra time for nvmlInit (which attaches every GPU, seconds each without
 * persistence mode): min(timeout, 5 s) per GPU. A worker that overruns is killed (SIGTERM, SIGKILL, reaped without blocking); one
 * that dies is reported with its signal and the call it was in; both fail the request, and the next
 * request starts a fresh worker.
 *
 * Wire format, both directions: frames of [u32 length][u32 type][length bytes of payload], host byte
 * order (both ends are the same binary). Strings are [u32 length or 0xffffffff for NULL][bytes]. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <systemd/sd-event.h>

#include "gpu-nvml.h"

typedef struct GpuNvmlWorker GpuNvmlWorker;
struct WireBuf;

/* r < 0: error is a sentence (the snapshot is NULL). r == 0: the snapshot is the callee's to keep. */
typedef void (*GpuNvmlWorkerDone)(GpuNvmlWorker *w, int r, NvmlSnapshot *snapshot, const char *error,
                                  void *userdata);

#define GPU_NVML_WORKER_TIMEOUT_DEFAULT_USEC (30 * USEC_PER_SEC)
/* Extra time for nvmlInit per GPU (at most the per-call timeout): the driver attaches the GPUs one after
 * another, 1–4 s each. */
#define GPU_NVML_WORKER_INIT_PER_GPU_USEC (5 * USEC_PER_SEC)

int gpu_nvml_worker_new(sd_event *e, GpuNvmlWorker **ret);

/* Kills the worker (if any) without a callback. NULL-safe. */
GpuNvmlWorker *gpu_nvml_worker_free(GpuNvmlWorker *w);
DEFINE_CLEANUP_FUNC(GpuNvmlWorker *, gpu_nvml_worker_free);

/* Asks for a snapshot (see gpu_nvml_read(): pci_addresses NULL = every GPU NVML lists), starting a
 * worker when none runs. timeout_usec bounds each NVML call (0 = the default); n_gpus sizes the extra
 * time nvmlInit gets. -EBUSY while a request is in flight. done is called from the loop, never from here. */
int gpu_nvml_worker_snapshot(GpuNvmlWorker *w, const char *library, char *const *pci_addresses,
                             uint64_t timeout_usec, unsigned n_gpus, GpuNvmlWorkerDone done, void *userdata);

bool gpu_nvml_worker_busy(const GpuNvmlWorker *w);

/* While a request is in flight, called once a second with what the worker is doing ("nvmlInit_v2 for
 * 3 s", "nvmlDeviceGetMemoryInfo on GPU 5 for 1 s"): for the stage's progress. Not called while idle. */
typedef void (*GpuNvmlWorkerProgress)(GpuNvmlWorker *w, const char *text, void *userdata);
void gpu_nvml_worker_set_progress(GpuNvmlWorker *w, GpuNvmlWorkerProgress cb, void *userdata);

/* Drops the request in flight (no callback) and kills the worker, which may be wedged in it. */
void gpu_nvml_worker_cancel(GpuNvmlWorker *w);

/* Kills the worker; a request in flight is answered with r (< 0) and message, from here. */
void gpu_nvml_worker_abort(GpuNvmlWorker *w, int r, const char *message);

pid_t gpu_nvml_worker_pid(const GpuNvmlWorker *w);

/* A job: a function that runs in a worker forked for it alone (so its input is whatever the daemon's
 * memory holds at the fork: plans, journal, ids — nothing to serialise on the way in), on its own NVML
 * handle (opened there with progress reporting, so every call gets the per-call deadline), and writes
 * its answer into result (raw bytes the caller decodes; the wire_put_* helpers). A return < 0 is sent as
 * an error with *ret_error. The worker exits afterwards: MIG writes are rare, and a fresh process cannot
 * carry a wedged state from an earlier call. gpu is the GPU index named in progress messages (-1 none). */
typedef int (*GpuNvmlJobFunc)(GpuNvml *n, void *userdata, struct WireBuf *result, char **ret_error);
/* r < 0: error is a sentence (result NULL). r == 0: result/len valid during the call only. */
typedef void (*GpuNvmlJobDone)(GpuNvmlWorker *w, int r, const uint8_t *result, size_t len, const char *error,
                               void *userdata);

/* Starts a job (see above); -EBUSY while a request is in flight. done is called from the loop. Hang and
 * crash are reported as for snapshots ("nvmlDeviceCreateGpuInstanceWithPlacement on GPU 2 has not
 * returned for 30 s; ..."). */
int gpu_nvml_worker_job(GpuNvmlWorker *w, const char *library, int gpu, uint64_t timeout_usec,
                        GpuNvmlJobFunc fn, void *fn_userdata, GpuNvmlJobDone done, void *userdata);

/* A read on the long-lived worker (the one gpu_nvml_worker_snapshot() uses), for reads the daemon needs
 * often and that must not cost a fork and an nvmlInit each (the MIG states before planning an apply):
 * fn runs there on the worker's own handle, with its caches, userdata = the strv of pci_addresses (NULL
 * = every GPU NVML lists), and answers as a job does. fn is a function of this program: the worker is a
 * fork of the daemon, never an exec, so its address is the same there. The worker stays for the next
 * request; a hang, a crash and the deadline are as for snapshots. -EBUSY while a request is in flight. */
int gpu_nvml_worker_read(GpuNvmlWorker *w, const char *library, char *const *pci_addresses, uint64_t timeout_usec,
                         unsigned n_gpus, GpuNvmlJobFunc fn, GpuNvmlJobDone done, void *userdata);

/* Facts the daemon already holds, for the long-lived worker: fn runs in the worker (a fork of the daemon,
 * so it sees the daemon's memory as it was at the fork) right after the worker opened NVML for the first
 * time — never after a reopen, whose driver may be another — and puts them into n's caches
 * (gpu_nvml_seed_*()), so that NVML is not asked for them again. */
typedef void (*GpuNvmlSeedFunc)(GpuNvml *n, void *userdata);
typedef struct GpuNvmlSeed {
        GpuNvmlSeedFunc fn;
        void *userdata;
} GpuNvmlSeed;
void gpu_nvml_worker_set_seed(GpuNvmlWorker *w, GpuNvmlSeedFunc fn, void *userdata);

/* A read on the long-lived worker with input bytes instead of addresses: fn gets a const GpuNvmlInput *
 * (valid during the call) as its userdata. For work that must run on the worker's open handle but whose
 * input the worker, forked earlier, cannot have in its memory (the MIG steps of an apply). */
typedef struct GpuNvmlInput {
        const uint8_t *data;
        size_t len;
} GpuNvmlInput;
int gpu_nvml_worker_read_input(GpuNvmlWorker *w, const char *library, const void *data, size_t len,
                               uint64_t timeout_usec, unsigned n_gpus, GpuNvmlJobFunc fn, GpuNvmlJobDone done,
                               void *userdata);

/* The worker's side: serves requests on fd until EOF. userdata: a GpuNvmlSeed or NULL. Returns the exit
 * status. */
int gpu_nvml_worker_main(int fd, void *userdata);

/* ---- the wire, shared by both sides (gpu-nvml-wire.c) ---- */

typedef enum GpuNvmlWireType {
        GPU_NVML_WIRE_SNAPSHOT_REQUEST = 1, /* str library, u32 n (0xffffffff: NULL list), n × str, */
        GPU_NVML_WIRE_PROGRESS,             /* i32 gpu, str entry point */
        GPU_NVML_WIRE_ERROR,                /* i32 r, str message */
        GPU_NVML_WIRE_SNAPSHOT,             /* the NvmlSnapshot */
        GPU_NVML_WIRE_RESULT,               /* a job's or a read's answer: bytes only its caller reads */
        GPU_NVML_WIRE_READ_REQUEST,         /* str library, u64 read function, u32 input length (0xffffffff:
                                             * none, and the rest is as SNAPSHOT_REQUEST) or the input bytes */
} GpuNvmlWireType;

#define GPU_NVML_WIRE_MAX (64u << 20)
/* The longest string a frame may carry (paths, warnings): a worker that sends more is broken. */
#define GPU_NVML_WIRE_STR_MAX (64u << 10)

typedef struct WireBuf {
        uint8_t *data;
        size_t len, cap;
        bool oom;
} WireBuf;

typedef struct WireReader {
        const uint8_t *p;
        size_t left;
        bool bad;
} WireReader;

/* A frame header is reserved by wire_begin() and filled in by wire_end(). */
void wire_begin(WireBuf *b, GpuNvmlWireType type);
int wire_end(WireBuf *b);
void wire_put_u32(WireBuf *b, uint32_t v);
void wire_put_u64(WireBuf *b, uint64_t v);
void wire_put_i32(WireBuf *b, int32_t v);
void wire_put_str(WireBuf *b, const char *s);
void wire_buf_done(WireBuf *b);

uint32_t wire_get_u32(WireReader *r);
uint64_t wire_get_u64(WireReader *r);
int32_t wire_get_i32(WireReader *r);
/* A copy (NULL for a NULL string or when the frame is bad: check r->bad). */
char *wire_get_str(WireReader *r);

void wire_put_snapshot(WireBuf *b, const NvmlSnapshot *s);
int wire_get_snapshot(WireReader *r, NvmlSnapshot **ret);
