/* SPDX-License-Identifier: MIT */
/* Owns the non-MIG half of the fake libnvidia-ml.so.1: init/shutdown (loading the node description named
 * by FAKE_NVML_DESCRIPTION), fault injection (FAKE_NVML_FAIL_INIT, FAKE_NVML_FAIL, FAKE_NVML_BUSY,
 * FAKE_NVML_GARBAGE; delays, hangs and crashes are fake-faults.c's), the call trace (FAKE_NVML_TRACE), handle lookup, and the system and device
 * queries. README.md in this directory documents the environment and file formats. */
#include <fcntl.h>
#include <stdarg.h>

#include "fake-nvml.h"

#ifndef FAKE_NVML_DEFAULT_PROFILES
#  error "meson passes the model table's path as FAKE_NVML_DEFAULT_PROFILES"
#endif

FakeCtx fake_ctx = { .lock = PTHREAD_MUTEX_INITIALIZER, .trace_fd = -1 };

FAKE_DECLARE(nvmlInit, gna_nvmlInit_v2_fn);
FAKE_DECLARE(nvmlInit_v2, gna_nvmlInit_v2_fn);
FAKE_DECLARE(nvmlShutdown, gna_nvmlShutdown_fn);
FAKE_DECLARE(nvmlErrorString, gna_nvmlErrorString_fn);
FAKE_DECLARE(nvmlSystemGetDriverVersion, gna_nvmlSystemGetDriverVersion_fn);
FAKE_DECLARE(nvmlSystemGetNVMLVersion, gna_nvmlSystemGetNVMLVersion_fn);
FAKE_DECLARE(nvmlSystemGetCudaDriverVersion, gna_nvmlSystemGetCudaDriverVersion_fn);
FAKE_DECLARE(nvmlSystemGetCudaDriverVersion_v2, gna_nvmlSystemGetCudaDriverVersion_fn);
FAKE_DECLARE(nvmlDeviceGetCount, gna_nvmlDeviceGetCount_v2_fn);
FAKE_DECLARE(nvmlDeviceGetCount_v2, gna_nvmlDeviceGetCount_v2_fn);
FAKE_DECLARE(nvmlDeviceGetHandleByIndex, gna_nvmlDeviceGetHandleByIndex_v2_fn);
FAKE_DECLARE(nvmlDeviceGetHandleByIndex_v2, gna_nvmlDeviceGetHandleByIndex_v2_fn);
FAKE_DECLARE(nvmlDeviceGetHandleByPciBusId_v2, gna_nvmlDeviceGetHandleByPciBusId_v2_fn);
FAKE_DECLARE(nvmlDeviceGetName, gna_nvmlDeviceGetName_fn);
FAKE_DECLARE(nvmlDeviceGetUUID, gna_nvmlDeviceGetUUID_fn);
FAKE_DECLARE(nvmlDeviceGetPciInfo_v2, gna_nvmlDeviceGetPciInfo_v3_fn);
FAKE_DECLARE(nvmlDeviceGetPciInfo_v3, gna_nvmlDeviceGetPciInfo_v3_fn);
FAKE_DECLARE(nvmlDeviceGetMemoryInfo, gna_nvmlDeviceGetMemoryInfo_fn);
FAKE_DECLARE(nvmlDeviceGetCudaComputeCapability, gna_nvmlDeviceGetCudaComputeCapability_fn);
FAKE_DECLARE(nvmlDeviceGetMinorNumber, gna_nvmlDeviceGetMinorNumber_fn);
FAKE_DECLARE(nvmlDeviceGetGpuFabricInfo, gna_nvmlDeviceGetGpuFabricInfo_fn);
FAKE_DECLARE(nvmlDeviceGetComputeRunningProcesses_v2, gna_nvmlDeviceGetComputeRunningProcesses_v3_fn);
FAKE_DECLARE(nvmlDeviceGetComputeRunningProcesses_v3, gna_nvmlDeviceGetComputeRunningProcesses_v3_fn);

static void say(const char *fmt, ...) _printf_(1, 2);
static void say(const char *fmt, ...) {
        /* A library has no log of its own: stderr is where a person running the agent looks. */
        va_list ap;
        va_start(ap, fmt);
        fputs("fake-nvml: ", stderr);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
}

/* ---- return codes ---- */

static const struct {
        nvmlReturn_t code;
        const char *name, *text;
} codes[] = {
        { NVML_SUCCESS, "SUCCESS", "Success" },
        { NVML_ERROR_UNINITIALIZED, "UNINITIALIZED", "Uninitialized" },
        { NVML_ERROR_INVALID_ARGUMENT, "INVALID_ARGUMENT", "Invalid Argument" },
        { NVML_ERROR_NOT_SUPPORTED, "NOT_SUPPORTED", "Not Supported" },
        { NVML_ERROR_NO_PERMISSION, "NO_PERMISSION", "Insufficient Permissions" },
        { NVML_ERROR_ALREADY_INITIALIZED, "ALREADY_INITIALIZED", "Already Initialized" },
        { NVML_ERROR_NOT_FOUND, "NOT_FOUND", "Not Found" },
        { NVML_ERROR_INSUFFICIENT_SIZE, "INSUFFICIENT_SIZE", "Insufficient Size" },
        { NVML_ERROR_INSUFFICIENT_POWER, "INSUFFICIENT_POWER", "Insufficient External Power" },
        { NVML_ERROR_DRIVER_NOT_LOADED, "DRIVER_NOT_LOADED", "Driver Not Loaded" },
        { NVML_ERROR_TIMEOUT, "TIMEOUT", "Timeout" },
        { NVML_ERROR_IRQ_ISSUE, "IRQ_ISSUE", "Interrupt request issue" },
        { NVML_ERROR_LIBRARY_NOT_FOUND, "LIBRARY_NOT_FOUND", "NVML Shared Library Not Found" },
        { NVML_ERROR_FUNCTION_NOT_FOUND, "FUNCTION_NOT_FOUND", "Function Not Found" },
        { NVML_ERROR_CORRUPTED_INFOROM, "CORRUPTED_INFOROM", "Corrupted infoROM" },
        { NVML_ERROR_GPU_IS_LOST, "GPU_IS_LOST", "GPU is lost" },
        { NVML_ERROR_RESET_REQUIRED, "RESET_REQUIRED", "GPU requires restart" },
        { NVML_ERROR_OPERATING_SYSTEM, "OPERATING_SYSTEM", "The operating system has blocked the request" },
        { NVML_ERROR_LIB_RM_VERSION_MISMATCH, "LIB_RM_VERSION_MISMATCH", "RM has detected an NVML/RM version mismatch" },
        { NVML_ERROR_IN_USE, "IN_USE", "In use by another client" },
        { NVML_ERROR_MEMORY, "MEMORY", "Insufficient Memory" },
        { NVML_ERROR_NO_DATA, "NO_DATA", "No data" },
        { NVML_ERROR_VGPU_ECC_NOT_SUPPORTED, "VGPU_ECC_NOT_SUPPORTED", "ECC is not supported for vGPU" },
        { NVML_ERROR_INSUFFICIENT_RESOURCES, "INSUFFICIENT_RESOURCES", "Ran out of critical resources, other than memory" },
        { NVML_ERROR_FREQ_NOT_SUPPORTED, "FREQ_NOT_SUPPORTED", "Frequency not supported" },
        { NVML_ERROR_ARGUMENT_VERSION_MISMATCH, "ARGUMENT_VERSION_MISMATCH", "Argument version mismatch" },
        { NVML_ERROR_UNKNOWN, "UNKNOWN", "Unknown Error" },
};

/* "23", "INSUFFICIENT_RESOURCES" or "NVML_ERROR_INSUFFICIENT_RESOURCES"; -1 if none of those. */
static int parse_code(const char *s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end != s && !*end)
                return v >= 0 && v <= 999 ? (int) v : -1;
        if (startswith(s, "NVML_ERROR_"))
                s += strlen("NVML_ERROR_");
        else if (startswith(s, "NVML_"))
                s += strlen("NVML_");
        for (size_t i = 0; i < ELEMENTSOF(codes); i++)
                if (streq(codes[i].name, s))
                        return (int) codes[i].code;
        return -1;
}

nvmlReturn_t fake_result(FakeResult r) {
        switch (r) {
        case FAKE_OK:
                return NVML_SUCCESS;
        case FAKE_INVALID:
                return NVML_ERROR_INVALID_ARGUMENT;
        case FAKE_NOT_SUPPORTED:
                return NVML_ERROR_NOT_SUPPORTED;
        case FAKE_NOT_FOUND:
                return NVML_ERROR_NOT_FOUND;
        case FAKE_IN_USE:
                return NVML_ERROR_IN_USE;
        case FAKE_INSUFFICIENT:
                return NVML_ERROR_INSUFFICIENT_RESOURCES;
        }
        return NVML_ERROR_UNKNOWN;
}

/* ---- environment: faults ---- */

static void parse_fail_rules(void) {
        const char *env = getenv("FAKE_NVML_FAIL");
        fake_ctx.rules = mfree(fake_ctx.rules);
        fake_ctx.n_rules = 0;
        if (isempty(env))
                return;
        _cleanup_free_ char *copy = strdup(env);
        if (!copy)
                return;
        size_t max = 1;
        for (const char *p = env; *p; p++)
                max += *p == ',';
        fake_ctx.rules = calloc(max, sizeof *fake_ctx.rules);
        if (!fake_ctx.rules)
                return;
        char *save = NULL;
        for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
                char *c1 = strchr(item, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
                FakeFailRule *rule = &fake_ctx.rules[fake_ctx.n_rules];
                *rule = (FakeFailRule) {};
                if (!c1 || !c2 || (size_t) (c1 - item) >= sizeof rule->name) {
                        say("FAKE_NVML_FAIL entry '%s' is not <entry point>:<nth call>:<code>; ignored", item);
                        continue;
                }
                *c1 = *c2 = 0;
                snprintf(rule->name, sizeof rule->name, "%s", item);
                const char *nth = c1 + 1;
                int code = parse_code(c2 + 1);
                char *end = NULL;
                if (!streq(nth, "*")) {
                        rule->nth = (unsigned) strtoul(nth, &end, 10);
                        rule->onwards = end && *end == '+';
                }
                if (code < 0 || (!streq(nth, "*") && (end == nth || rule->nth == 0 || (*end && !(rule->onwards && !end[1]))))) {
                        say("FAKE_NVML_FAIL entry for %s: want <nth call> as N, N+ or *, and a code as a number or "
                            "a name like IN_USE; ignored", item);
                        continue;
                }
                rule->code = (nvmlReturn_t) code;
                fake_ctx.n_rules++;
        }
}

/* Whether FAKE_NVML_FAIL fails this call; counts the call either way — while FAKE_NVML_FAIL_FILE exists,
 * when that is set (a test arms the rules for one request of a long-running daemon). */
static bool injected(const char *name, nvmlReturn_t *ret) {
        const char *file = getenv("FAKE_NVML_FAIL_FILE");
        bool hit = false;

        if (fake_ctx.n_rules > 0 && file && access(file, F_OK) < 0)
                return false;
        for (size_t i = 0; i < fake_ctx.n_rules; i++) {
                FakeFailRule *r = &fake_ctx.rules[i];
                if (!streq(r->name, name))
                        continue;
                r->calls++;
                if (!hit && (r->nth == 0 || r->calls == r->nth || (r->onwards && r->calls > r->nth))) {
                        *ret = r->code;
                        hit = true;
                }
        }
        return hit;
}

/* "0,2", "all" or "*": indices into the node's GPUs, in NVML order. */
static void parse_busy(size_t n) {
        const char *env = getenv("FAKE_NVML_BUSY");
        fake_ctx.busy = mfree(fake_ctx.busy);
        fake_ctx.busy = calloc(n ?: 1, sizeof *fake_ctx.busy);
        if (!fake_ctx.busy || isempty(env))
                return;
        _cleanup_free_ char *copy = strdup(env);
        char *save = NULL;
        for (char *item = copy ? strtok_r(copy, ",", &save) : NULL; item; item = strtok_r(NULL, ",", &save)) {
                char *end;
                unsigned long i = strtoul(item, &end, 10);
                if (streq(item, "all") || streq(item, "*"))
                        for (size_t k = 0; k < n; k++)
                                fake_ctx.busy[k] = true;
                else if (end != item && !*end && i < n)
                        fake_ctx.busy[i] = true;
                else
                        say("FAKE_NVML_BUSY entry '%s' is not a GPU index below %zu or 'all'; ignored", item, n);
        }
}

static void parse_garbage(size_t n) {
        static const struct {
                const char *name;
                unsigned bit;
        } fields[] = {
                { "name", FAKE_GARBAGE_NAME },     { "uuid", FAKE_GARBAGE_UUID },
                { "memory", FAKE_GARBAGE_MEMORY }, { "cc", FAKE_GARBAGE_CC },
                { "minor", FAKE_GARBAGE_MINOR },   { "mig", FAKE_GARBAGE_MIG },
                { "attributes", FAKE_GARBAGE_ATTRIBUTES }, { "pci", FAKE_GARBAGE_PCI },
        };
        const char *env = getenv("FAKE_NVML_GARBAGE");
        fake_ctx.garbage = mfree(fake_ctx.garbage);
        fake_ctx.garbage = calloc(n ?: 1, sizeof *fake_ctx.garbage);
        fake_ctx.garbage_driver = fake_ctx.garbage_cuda = fake_ctx.garbage_nvml = false;
        if (!fake_ctx.garbage || isempty(env))
                return;
        _cleanup_free_ char *copy = strdup(env);
        char *save = NULL;
        for (char *item = copy ? strtok_r(copy, ",", &save) : NULL; item; item = strtok_r(NULL, ",", &save)) {
                if (streq(item, "driver") || streq(item, "cuda") || streq(item, "nvml")) {
                        *(streq(item, "driver") ? &fake_ctx.garbage_driver :
                          streq(item, "cuda") ? &fake_ctx.garbage_cuda : &fake_ctx.garbage_nvml) = true;
                        continue;
                }
                char *colon = strchr(item, ':'), *end = NULL;
                unsigned bit = 0;
                unsigned long idx = 0;
                if (colon) {
                        *colon = 0;
                        idx = strtoul(item, &end, 10);
                        for (size_t f = 0; f < ELEMENTSOF(fields); f++)
                                if (streq(fields[f].name, colon + 1))
                                        bit = fields[f].bit;
                }
                bool all = colon && streq(item, "*");
                if (!colon || !bit || (!all && (end == item || *end || idx >= n))) {
                        say("FAKE_NVML_GARBAGE entry '%s' is not <gpu index|*>:<name|uuid|memory|cc|minor|mig|"
                            "attributes|pci> or driver/cuda/nvml; ignored", item);
                        continue;
                }
                for (size_t k = 0; k < n; k++)
                        if (all || k == idx)
                                fake_ctx.garbage[k] |= bit;
        }
}

bool fake_busy(unsigned gpu_index) {
        FakeNode *n = fake_ctx.node;
        return gpu_index < n->n_gpus && ((fake_ctx.busy && fake_ctx.busy[gpu_index]) || n->gpus[gpu_index].n_procs > 0);
}

static bool garbage(unsigned gpu_index, unsigned bit) {
        return fake_ctx.garbage && gpu_index < fake_ctx.node->n_gpus && (fake_ctx.garbage[gpu_index] & bit);
}

/* ---- trace ---- */

static void trace(const char *name, nvmlReturn_t r) {
        const char *path = getenv("FAKE_NVML_TRACE");
        if (isempty(path))
                return;
        if (!fake_ctx.trace_path || !streq(fake_ctx.trace_path, path)) {
                if (fake_ctx.trace_fd >= 0)
                        close(fake_ctx.trace_fd);
                free(fake_ctx.trace_path);
                fake_ctx.trace_path = strdup(path);
                fake_ctx.trace_fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
                if (fake_ctx.trace_fd < 0)
                        say("cannot open the trace file %s (FAKE_NVML_TRACE): %s", path, strerror(errno));
        }
        if (fake_ctx.trace_fd >= 0)
                dprintf(fake_ctx.trace_fd, "%s %d\n", name, (int) r);
}

/* ---- enter / leave / lock ---- */

bool fake_enter(const char *name, nvmlReturn_t *ret) {
        pthread_mutex_lock(&fake_ctx.lock);
        /* Under the lock, as the real driver serialises calls on its own lock. */
        fake_faults_apply(name, fake_ctx.node ? fake_ctx.node->n_gpus : 0);
        if (injected(name, ret))
                return true;
        if (fake_ctx.init_count == 0) {
                *ret = NVML_ERROR_UNINITIALIZED;
                return true;
        }
        FakeError e = {};
        if (fake_node_sync(fake_ctx.node, &e) < 0)
                say("%s; keeping the state read before", e.msg[0] ? e.msg : "cannot re-read the state file");
        return false;
}

nvmlReturn_t fake_leave(const char *name, nvmlReturn_t r) {
        trace(name, r);
        pthread_mutex_unlock(&fake_ctx.lock);
        return r;
}

nvmlReturn_t fake_lock(int *ret_fd) {
        FakeError e = {};
        if (fake_node_lock(fake_ctx.node, ret_fd, &e) < 0) {
                say("%s", e.msg[0] ? e.msg : "cannot lock the state file");
                *ret_fd = -1;
                return NVML_ERROR_UNKNOWN;
        }
        return NVML_SUCCESS;
}

nvmlReturn_t fake_unlock(int fd, nvmlReturn_t r, bool changed) {
        if (fd < 0)
                return r;
        if (r == NVML_SUCCESS && changed) {
                FakeError e = {};
                if (fake_node_save(fake_ctx.node, &e) < 0) {
                        say("%s", e.msg[0] ? e.msg : "cannot save the state file");
                        r = NVML_ERROR_UNKNOWN;
                }
        }
        close(fd);
        return r;
}

/* ---- handles ---- */

/* Finds which slot array of which GPU p points into; never dereferences p before that. */
static bool slot(uintptr_t p, uintptr_t base, size_t size, size_t count, size_t *ret) {
        if (p < base || p >= base + size * count || (p - base) % size)
                return false;
        *ret = (p - base) / size;
        return true;
}

FakeGpu *fake_device(nvmlDevice_t d, unsigned *ret_index) {
        for (size_t i = 0; d && i < fake_ctx.n_handles; i++)
                if (d == &fake_ctx.handles[i].dev) {
                        if (ret_index)
                                *ret_index = (unsigned) i;
                        return &fake_ctx.node->gpus[i];
                }
        return NULL;
}

FakeGpu *fake_mig_device(nvmlDevice_t d, unsigned *ret_index) {
        size_t k;
        for (size_t i = 0; d && i < fake_ctx.n_handles; i++)
                if (slot((uintptr_t) d, (uintptr_t) &fake_ctx.handles[i].mig[0][0], sizeof(struct nvmlDevice_st),
                         FAKE_MAX_GI * FAKE_MAX_CI, &k)) {
                        FakeGpu *g = &fake_ctx.node->gpus[i];
                        if (!g->mig_current || !g->gi[d->gi].used || !g->gi[d->gi].ci[d->ci].used)
                                return NULL;
                        if (ret_index)
                                *ret_index = (unsigned) i;
                        return g;
                }
        return NULL;
}

FakeGpu *fake_gpu_instance(nvmlGpuInstance_t gi, unsigned *ret_index) {
        size_t k;
        for (size_t i = 0; gi && i < fake_ctx.n_handles; i++)
                if (slot((uintptr_t) gi, (uintptr_t) &fake_ctx.handles[i].gi[0], sizeof(struct nvmlGpuInstance_st),
                         FAKE_MAX_GI, &k)) {
                        FakeGpu *g = &fake_ctx.node->gpus[i];
                        if (!g->mig_current || !g->gi[k].used)
                                return NULL;
                        if (ret_index)
                                *ret_index = (unsigned) i;
                        return g;
                }
        return NULL;
}

FakeGpu *fake_compute_instance(nvmlComputeInstance_t ci, unsigned *ret_index) {
        size_t k;
        for (size_t i = 0; ci && i < fake_ctx.n_handles; i++)
                if (slot((uintptr_t) ci, (uintptr_t) &fake_ctx.handles[i].ci[0][0],
                         sizeof(struct nvmlComputeInstance_st), FAKE_MAX_GI * FAKE_MAX_CI, &k)) {
                        FakeGpu *g = &fake_ctx.node->gpus[i];
                        if (!g->mig_current || !g->gi[ci->gi].used || !g->gi[ci->gi].ci[ci->ci].used)
                                return NULL;
                        if (ret_index)
                                *ret_index = (unsigned) i;
                        return g;
                }
        return NULL;
}

static int make_handles(size_t n) {
        if (fake_ctx.handles && fake_ctx.n_handles == n)
                return 0; /* same shape: keep the handles a caller may still hold */
        FakeHandles *h = calloc(n ?: 1, sizeof *h);
        if (!h)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                h[i].dev = (struct nvmlDevice_st) { .gpu = (unsigned) i };
                for (unsigned g = 0; g < FAKE_MAX_GI; g++) {
                        h[i].gi[g] = (struct nvmlGpuInstance_st) { .gpu = (unsigned) i, .gi = g };
                        for (unsigned c = 0; c < FAKE_MAX_CI; c++) {
                                h[i].mig[g][c] = (struct nvmlDevice_st) { .gpu = (unsigned) i, .mig = true, .gi = g, .ci = c };
                                h[i].ci[g][c] = (struct nvmlComputeInstance_st) { .gpu = (unsigned) i, .gi = g, .ci = c };
                        }
                }
        }
        free(fake_ctx.handles);
        fake_ctx.handles = h;
        fake_ctx.n_handles = n;
        return 0;
}

/* ---- init / shutdown ---- */

/* FAKE_NVML_DEV=<dir>: like the real library, hold <dir>/nvidiactl and <dir>/nvidia<minor> of every GPU
 * open from the first nvmlInit to the last nvmlShutdown (or the process's exit), so that a process with
 * NVML open shows up in a walk of /proc/<pid>/fd as one holding the GPU. A missing node is reported and
 * skipped, as the library would fail on it. */
static void dev_close(void) {
        for (size_t i = 0; i < fake_ctx.n_dev_fds; i++)
                if (fake_ctx.dev_fds[i] >= 0)
                        close(fake_ctx.dev_fds[i]);
        fake_ctx.dev_fds = mfree(fake_ctx.dev_fds);
        fake_ctx.n_dev_fds = 0;
}

static void dev_open(const FakeNode *node) {
        const char *dir = getenv("FAKE_NVML_DEV");

        if (isempty(dir))
                return;
        dev_close();
        fake_ctx.dev_fds = calloc(node->n_gpus + 1, sizeof(int));
        if (!fake_ctx.dev_fds)
                return;
        for (size_t i = 0; i <= node->n_gpus; i++) {
                char p[PATH_MAX];
                if (i == 0)
                        snprintf(p, sizeof(p), "%s/nvidiactl", dir);
                else
                        snprintf(p, sizeof(p), "%s/nvidia%u", dir, node->gpus[i - 1].minor);
                int fd = open(p, O_RDONLY | O_CLOEXEC);
                if (fd < 0)
                        say("FAKE_NVML_DEV: cannot open %s: %s", p, strerror(errno));
                fake_ctx.dev_fds[fake_ctx.n_dev_fds++] = fd;
        }
}

static nvmlReturn_t do_init(void) {
        if (fake_ctx.init_count > 0) {
                fake_ctx.init_count++;
                return NVML_SUCCESS;
        }
        const char *fail = getenv("FAKE_NVML_FAIL_INIT");
        if (!isempty(fail)) {
                int code = parse_code(fail);
                if (code < 0) {
                        say("FAKE_NVML_FAIL_INIT='%s' is not a return code (a number or a name like "
                            "DRIVER_NOT_LOADED); failing with UNKNOWN", fail);
                        return NVML_ERROR_UNKNOWN;
                }
                if (code != NVML_SUCCESS)
                        return (nvmlReturn_t) code;
        }
        const char *desc = getenv("FAKE_NVML_DESCRIPTION");
        if (isempty(desc)) {
                say("FAKE_NVML_DESCRIPTION is not set: point it at a node description (nvml.yaml, see "
                    "tests/fakes/README.md); answering as if no driver were loaded");
                return NVML_ERROR_DRIVER_NOT_LOADED;
        }
        const char *profiles = getenv("FAKE_NVML_PROFILES");
        if (isempty(profiles))
                profiles = FAKE_NVML_DEFAULT_PROFILES;
        const char *fit = getenv("FAKE_NVML_FIT");
        if (fake_fit_from_string(isempty(fit) ? NULL : fit) < 0) {
                say("FAKE_NVML_FIT='%s' must be best, first or last; using best", fit);
                fit = NULL;
        }

        FakeError e = {};
        FakeNode *node = NULL;
        int r = fake_node_load(&node, desc, getenv("FAKE_NVML_STATE"), profiles, &e);
        if (r < 0) {
                say("%s", e.msg[0] ? e.msg : strerror(-r));
                return r == -ENOMEM ? NVML_ERROR_MEMORY : NVML_ERROR_UNKNOWN;
        }
        if (make_handles(node->n_gpus) < 0) {
                fake_node_free(node);
                return NVML_ERROR_MEMORY;
        }
        fake_node_free(fake_ctx.node);
        fake_ctx.node = node;
        fake_ctx.fit = fake_fit_from_string(isempty(fit) ? NULL : fit);
        if (fake_ctx.fit < 0)
                fake_ctx.fit = FAKE_FIT_BEST;
        parse_busy(node->n_gpus);
        parse_garbage(node->n_gpus);
        dev_open(node);
        fake_ctx.init_count = 1;
        return NVML_SUCCESS;
}

static nvmlReturn_t init_entry(const char *name) {
        nvmlReturn_t r;
        pthread_mutex_lock(&fake_ctx.lock);
        /* Fault rules (and their call counters) start over with each first init of the process. */
        bool first = fake_ctx.init_count == 0;
        if (first)
                parse_fail_rules();
        if (!injected(name, &r))
                r = do_init();
        /* After loading the node: its latency, and "2000/gpu" knows how many GPUs it attaches. */
        if (r == NVML_SUCCESS && first) {
                fake_faults_load(fake_ctx.node ? fake_ctx.node->latency : NULL);
                fake_faults_apply(name, fake_ctx.node ? fake_ctx.node->n_gpus : 0);
        }
        return fake_leave(name, r);
}

nvmlReturn_t nvmlInit(void) {
        return init_entry(__func__);
}

nvmlReturn_t nvmlInit_v2(void) {
        return init_entry(__func__);
}

nvmlReturn_t nvmlShutdown(void) {
        nvmlReturn_t r;
        if (fake_enter(__func__, &r))
                return fake_leave(__func__, r);
        if (fake_ctx.init_count > 0 && --fake_ctx.init_count == 0)
                dev_close();
        return fake_leave(__func__, NVML_SUCCESS);
}

const char *nvmlErrorString(nvmlReturn_t result) {
        const char *s = "Unknown Error";
        pthread_mutex_lock(&fake_ctx.lock);
        for (size_t i = 0; i < ELEMENTSOF(codes); i++)
                if (codes[i].code == result)
                        s = codes[i].text;
        fake_leave(__func__, NVML_SUCCESS);
        return s;
}

__attribute__((destructor)) static void fake_unload(void) {
        dev_close();
        fake_ctx.node = fake_node_free(fake_ctx.node);
        fake_ctx.handles = mfree(fake_ctx.handles);
        fake_ctx.busy = mfree(fake_ctx.busy);
        fake_ctx.garbage = mfree(fake_ctx.garbage);
        fake_ctx.rules = mfree(fake_ctx.rules);
        fake_ctx.trace_path = mfree(fake_ctx.trace_path);
        if (fake_ctx.trace_fd >= 0)
                close(fake_ctx.trace_fd);
        fake_ctx.trace_fd = -1;
}

/* ---- system ---- */

static nvmlReturn_t copy_string(const char *s, char *buf, unsigned length) {
        if (!buf)
                return NVML_ERROR_INVALID_ARGUMENT;
        if (strlen(s) + 1 > length)
                return NVML_ERROR_INSUFFICIENT_SIZE;
        memcpy(buf, s, strlen(s) + 1);
        return NVML_SUCCESS;
}

/* A string the node description chose (a hostile driver's): one longer than the buffer fills it whole,
 * with no NUL, as a broken driver might, instead of NVML's INSUFFICIENT_SIZE. */
static nvmlReturn_t copy_hostile(const char *s, char *buf, unsigned length) {
        if (!buf)
                return NVML_ERROR_INVALID_ARGUMENT;
        if (strlen(s) + 1 > length) {
                memcpy(buf, s, length);
                return NVML_SUCCESS;
        }
        return copy_string(s, buf, length);
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
        nvmlReturn_t r;
        if (fake_enter(__func__, &r))
                return fake_leave(__func__, r);
        return fake_leave(__func__, copy_string(fake_ctx.garbage_driver ? "" : fake_ctx.node->driver_version,
                                                version, length));
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
        nvmlReturn_t r;
        if (fake_enter(__func__, &r))
                return fake_leave(__func__, r);
        return fake_leave(__func__, copy_string(fake_ctx.garbage_nvml ? "" : fake_ctx.node->nvml_version,
                                                version, length));
}

static nvmlReturn_t cuda_version(int *v) {
        if (!v)
                return NVML_ERROR_INVALID_ARGUMENT;
        *v = fake_ctx.garbage_cuda ? 0 : fake_ctx.node->cuda_version;
        return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion) {
        nvmlReturn_t r;
        if (fake_enter(__func__, &r))
                return fake_leave(__func__, r);
        return fake_leave(__func__, cuda_version(cudaDriverVersion));
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion) {
        nvmlReturn_t r;
        if (fake_enter(__func__, &r))
                return fake_leave(__func__, r);
        return fake_leave(__func__, cuda_version(cudaDriverVersion));
}

/* ---- devices ---- */

static nvmlReturn_t get_count(unsigned *count) {
        if (!count)
                return NVML_ERROR_INVALID_ARGUMENT;
        *count = (unsigned) fake_ctx.node->n_gpus;
        return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) {
        nvmlReturn_t r;
        if (fake_enter(__func__, &r))
                return fake_leave(__func__, r);
        return fake_leave(__func__, get_count(deviceCount));
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
        nvmlReturn_t r;
        if (fake_enter(__func__, &r))
                return fake_leave(__func__, r);
        return fake_leave(__func__, get_count(deviceCount));
}

static nvmlReturn_t by_index(unsigned index, nvmlDevice_t *device) {
        if (!device || index >= fake_ctx.n_handles)
                return NVML_ERROR_INVALID_ARGUMENT;
        *device = &fake_ctx.handles[index].dev;
        return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
        nvmlReturn_t r;
        if (fake_enter(__func__, &r))
                return fake_leave(__func__, r);
        return fake_leave(__func__, by_index(index, device));
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
        nvmlReturn_t r;
        if (fake_enter(__func__, &r))
                return fake_leave(__func__, r);
        return fake_leave(__func__, by_index(index, device));
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device) {
        nvmlReturn_t r;
        if (fake_enter(__func__, &r))
                return fake_leave(__func__, r);
        unsigned d = 0, b, dv, f;
        char tail;
        if (!pciBusId || !device)
                r = NVML_ERROR_INVALID_ARGUMENT;
        else if (sscanf(pciBusId, "%x:%x:%x.%x%c", &d, &b, &dv, &f, &tail) != 4 &&
                 (d = 0, sscanf(pciBusId, "%x:%x.%x%c", &b, &dv, &f, &tail) != 3))
                r = NVML_ERROR_INVALID_ARGUMENT;
        else {
                r = NVML_ERROR_NOT_FOUND;
                for (size_t i = 0; i < fake_ctx.node->n_gpus; i++) {
                        FakeGpu *g = &fake_ctx.node->gpus[i];
                        if (g->domain == d && g->bus == b && g->device == dv && g->function == f) {
                                *device = &fake_ctx.handles[i].dev;
                                r = NVML_SUCCESS;
                        }
                }
        }
        return fake_leave(__func__, r);
}

/* A physical or a MIG device; for MIG, *gi and *ci are set. */
static FakeGpu *any_device(nvmlDevice_t d, unsigned *idx, const FakeGi **gi, const FakeCi **ci) {
        FakeGpu *g = fake_device(d, idx);
        *gi = NULL, *ci = NULL;
        if (g)
                return g;
        g = fake_mig_device(d, idx);
        if (g) {
                *gi = &g->gi[d->gi];
                *ci = &g->gi[d->gi].ci[d->ci];
        }
        return g;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
        nvmlReturn_t r;
        if (fake_enter(__func__, &r))
                return fake_leave(__func__, r);
        unsigned idx;
        const FakeGi *gi;
        const FakeCi *ci;
        FakeGpu *g = any_device(device, &idx, &gi, &ci);
        char buf[160];
        if (!g)
                return fake_leave(__func__, NVML_ERROR_INVALID_ARGUMENT);
        if (garbage(idx, FAKE_GARBAGE_NAME))
                buf[0] = 0;
        else if (gi) {
                char pn[64];
                fake_ci_name(fake_model_gi_by_id(g->model, gi->profile), ci->size, pn, sizeof pn);
                snprintf(buf, sizeof buf, "%s MIG %s", g->model->name, pn);
        } else if (g->name)
                return fake_leave(__func__, copy_hostile(g->name, name, length));
        else
                snprintf(buf, sizeof buf, "%s", g->model->name);
        return fake_leave(__func__, copy_string(buf, name, length));
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
        nvmlReturn_t r;
        if (fake_enter(__func__, &r))
                return fake_leave(__func__, r);
        unsigned idx;
        const FakeGi *gi;
        const FakeCi *ci;
        FakeGpu *g = any_device(device, &idx, &gi, &ci);
        if (!g)
                return fake_leave(__func__, NVML_ERROR_INVALID_ARGUMENT);
        const char *s = garbage(idx, FAKE_GARBAGE_UUID) ? "" : ci ? ci->uuid : g->uuid;
        return fake_leave(__func__, copy_hostile(s, uuid, length));
}

static nvmlReturn_t pci_info(nvmlDevice_t device, nvmlPciInfo_t *pci) {
        unsigned idx;
        const FakeGi *gi;
        const FakeCi *ci;
        FakeGpu *g = any_device(device, &idx, &gi, &ci);
        if (!g || !pci)
                return NVML_ERROR_INVALID_ARGUMENT;
        *pci = (nvmlPciInfo_t) {};
        if (garbage(idx, FAKE_GARBAGE_PCI))
                return NVML_SUCCESS;
        pci->domain = g->domain;
        pci->bus = g->bus;
        pci->device = g->device;
        pci->pciDeviceId = g->model->pci_device_id << 16 | 0x10de;
        pci->pciSubSystemId = g->subsystem;
        snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", g->domain, g->bus, g->device,
                 g->function);
        snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.%X", g->domain, g->bus, g->device, g->function);
        return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) {
        nvmlReturn_t r;
        if (fake_enter(__func__, &r))
                return fake_leave(__func__, r);
        return fake_leave(__func__, pci_info(device, pci));
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
        nvmlReturn_t r;
        if (fake_enter(__func__, &r))
                return fake_leave(__func__, r);
        return fake_leave(__func__, pci_info(device, pci));
}

static uint64_t used_mib(const FakeGpu *g, unsigned idx, const FakeGi *gi) {
        uint64_t used = 0;
        for (size_t i = 0; i < g->n_procs; i++)
                if (!gi || g->procs[i].gi == (unsigned) (gi - g->gi))
                        used += g->procs[i].memory_mib;
        if (!gi && fake_ctx.busy && fake_ctx.busy[idx])
                used += 1024;
        return used;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
        nvmlReturn_t r;
        if (fake_enter(__func__, &r))
                return fake_leave(__func__, r);
        unsigned idx;
        const FakeGi *gi;
        const FakeCi *ci;
        FakeGpu *g = any_device(device, &idx, &gi, &ci);
        if (!g || !memory)
                return fake_leave(__func__, NVML_ERROR_INVALID_ARGUMENT);
        uint64_t total = g->model->total_mib;
        if (gi)
                total = fake_model_gi_by_id(g->model, gi->profile)->mem_mib;
        if (garbage(idx, FAKE_GARBAGE_MEMORY))
                total = 0;
        uint64_t used = used_mib(g, idx, gi);
        if (used > total)
                used = total;
        *memory = (nvmlMemory_t) { .total = total << 20, .used = used << 20, .free = (total - used) << 20 };
        return fake_leave(__func__, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
        nvmlReturn_t r;
        if (fake_enter(__func__, &r))
                return fake_leave(__func__, r);
        unsigned idx;
        const FakeGi *gi;
        const FakeCi *ci;
        FakeGpu *g = any_device(device, &idx, &gi, &ci);
        if (!g || !major || !minor)
                return fake_leave(__func__, NVML_ERROR_INVALID_ARGUMENT);
        bool bad = garbage(idx, FAKE_GARBAGE_CC);
        *major = bad ? 0 : g->model->cc_major;
        *minor = bad ? 0 : g->model->cc_minor;
        return fake_leave(__func__, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber) {
        nvmlReturn_t r;
        if (fake_enter(__func__, &r))
                return fake_leave(__func__, r);
        unsigned idx;
        FakeGpu *g = fake_device(device, &idx);
        if (!g || !minorNumber)
                return fake_leave(__func__, fake_mig_device(device, NULL) && minorNumber ? NVML_ERROR_NOT_SUPPORTED
                                                                                       : NVML_ERROR_INVALID_ARGUMENT);
        *minorNumber = garbage(idx, FAKE_GARBAGE_MINOR) ? UINT32_MAX : g->minor;
        return fake_leave(__func__, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *info) {
        nvmlReturn_t r;
        if (fake_enter(__func__, &r))
                return fake_leave(__func__, r);
        FakeGpu *g = fake_device(device, NULL);
        if (!g || !info)
                r = fake_mig_device(device, NULL) && info ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
        else if (!g->has_fabric)
                r = NVML_ERROR_NOT_SUPPORTED;
        else {
                *info = (nvmlGpuFabricInfo_t) { .status = NVML_SUCCESS, .cliqueId = g->clique,
                                                .state = (nvmlGpuFabricState_t) g->fabric_state };
                memcpy(info->clusterUuid, g->cluster_uuid, sizeof info->clusterUuid);
                r = NVML_SUCCESS;
        }
        return fake_leave(__func__, r);
}

static nvmlReturn_t processes(nvmlDevice_t device, unsigned *count, nvmlProcessInfo_t *infos) {
        unsigned idx;
        const FakeGi *gi;
        const FakeCi *ci;
        FakeGpu *g = any_device(device, &idx, &gi, &ci);
        if (!g || !count)
                return NVML_ERROR_INVALID_ARGUMENT;
        nvmlProcessInfo_t list[64];
        unsigned n = 0;
        if (!gi && fake_ctx.busy && fake_ctx.busy[idx])
                list[n++] = (nvmlProcessInfo_t) { .pid = 4242 + idx, .usedGpuMemory = UINT64_C(1024) << 20,
                                                  .gpuInstanceId = UINT32_MAX, .computeInstanceId = UINT32_MAX };
        for (size_t i = 0; i < g->n_procs && n < ELEMENTSOF(list); i++) {
                const FakeProcess *p = &g->procs[i];
                if (gi && (p->gi != (unsigned) (gi - g->gi) || p->ci != (unsigned) (ci - gi->ci)))
                        continue;
                list[n++] = (nvmlProcessInfo_t) { .pid = p->pid, .usedGpuMemory = p->memory_mib << 20,
                                                  .gpuInstanceId = p->gi, .computeInstanceId = p->ci };
        }
        unsigned room = *count;
        *count = n;
        if (n > room || (n > 0 && !infos))
                return NVML_ERROR_INSUFFICIENT_SIZE;
        if (n > 0)
                memcpy(infos, list, n * sizeof *list);
        return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos) {
        nvmlReturn_t r;
        if (fake_enter(__func__, &r))
                return fake_leave(__func__, r);
        return fake_leave(__func__, processes(device, infoCount, infos));
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos) {
        nvmlReturn_t r;
        if (fake_enter(__func__, &r))
                return fake_leave(__func__, r);
        return fake_leave(__func__, processes(device, infoCount, infos));
}
