/* SPDX-License-Identifier: MIT */
/* Owns GPU health on the loop side: the event worker (a spawn_fork() child blocked in
 * nvmlEventSetWait_v2; a crash or a hung start is reported and it is restarted with backoff), the health
 * check child, the per-GPU fault records and what is published from them (D-Bus, labels through a pass,
 * node state, the health.on-unhealthy hook), and <paths.state>/gpu-health, which keeps failed GPUs failed
 * across an agent restart in the same boot. Nothing here waits: both children talk through pipes that
 * the loop reads when they have a line, so an armed worker costs the loop no wakeup at all. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>
#include <unistd.h>

#include "event-util.h"
#include "fileio.h"
#include "gpu-nvml-events.h"
#include "health.h"
#include "log.h"
#include "node.h"
#include "nvml-abi.h"
#include "spawn-child.h"
#include "strv.h"

#define HEALTH_EVENTS_KEPT 8
#define HEALTH_RESTART_MIN_USEC (1 * USEC_PER_SEC)
#define HEALTH_RESTART_MAX_USEC (5 * 60 * USEC_PER_SEC)
#define HEALTH_STABLE_USEC (60 * USEC_PER_SEC)  /* armed this long: the next crash starts backoff over */
#define HEALTH_HOOK_TIMEOUT_USEC (60 * USEC_PER_SEC)
#define HEALTH_METRICS_INTERVAL_USEC (1 * USEC_PER_SEC) /* the textfile's bound in an event storm */
#define HEALTH_STATE_FILE "gpu-health"
#define HEALTH_STATE_MAX_SIZE (64 * 1024)
#define HEALTH_RESTORED_SUFFIX ", recorded before the agent restarted"

typedef struct HealthFault {
        GpuHealthState state;
        char *reason;
} HealthFault;

typedef struct HealthGpu {
        char pci_address[32];
        HealthFault event;         /* from the last bad event; sticky when failed */
        HealthFault check;         /* from the last health check, replaced by each */
        GpuHealthState published;  /* what D-Bus and the hook saw last */
        char *published_reason;
        char **events;             /* the last HEALTH_EVENTS_KEPT, newest last */
        uint64_t event_usec;       /* when the event fault was set (CLOCK_MONOTONIC) */
        uint64_t xid_count, dbe_count, sbe_count;
        unsigned last_xid;
        bool remap_known;
        unsigned remap[4];         /* corrected, uncorrected, pending, failure: the last check's */
        char *uuid;                /* NVML's, NULL unknown: a record in the state file names it */
        int64_t failed_since;      /* when the event fault became failed (CLOCK_REALTIME s), 0 none */
        unsigned event_xid;        /* the XID behind the event fault, 0 none (or another cause) */
        uint64_t state_usec;       /* when published (the state, not its reason) last changed */
        /* The hook sees lasting changes only (health_settle()): */
        GpuHealthState hook_state; /* the state that lasted, which the hook is to be told */
        char *hook_reason;
        unsigned hook_xid;
        GpuHealthState hook_told;  /* what the last run was told */
        uint64_t hook_usec;        /* when that run started (CLOCK_MONOTONIC), 0 never */
        XidLog xid_log;            /* the journal's XID lines in a storm */
} HealthGpu;

/* A failed GPU read from <paths.state>/gpu-health that health does not watch (yet). */
typedef struct HealthRecord {
        char pci_address[32];
        char *uuid;
        char *reason;
        int64_t since;
} HealthRecord;

/* A health.on-unhealthy run not finished yet, and the GPU it is about. */
typedef struct HealthHook {
        Spawn *spawn;
        char pci_address[32];
} HealthHook;

typedef struct HealthPipe {
        int fd;
        sd_event_source *io;
        char buf[4096];
        size_t len;
} HealthPipe;

struct Health {
        Node *n;
        HealthGpu *gpus;
        size_t n_gpus;
        char **addresses;          /* the GPUs the children watch, in our order */

        Spawn *worker;
        HealthPipe worker_pipe;
        bool armed;
        uint64_t armed_usec;
        unsigned restarts;         /* since the last stable run: drives the backoff */
        uint64_t restarts_total;
        sd_event_source *restart_timer;
        sd_event_source *arm_timer; /* the worker must say "armed" within nvml.timeout */

        struct CheckResult *results; /* a check in flight: its findings so far, else NULL */
        uint64_t check_usec;       /* when it was asked for */
        bool check_again;          /* one more asked for while one ran, or before the worker armed */
        sd_event_source *check_timer; /* the check must say "done" within nvml.timeout */
        sd_event_source *recheck_timer;
        char *check_node_reason;   /* node-wide finding of the last check, NULL none */
        bool active;

        HealthHook *hooks;         /* health.on-unhealthy runs not finished yet */
        size_t n_hooks;
        sd_event_source *hook_timer; /* a run held back by the per-GPU interval */
        sd_event_source *xid_log_timer; /* the end of the earliest XID log window */
        sd_event_source *metrics_timer; /* a textfile update held back in a storm */
        uint64_t metrics_usec;     /* when health last had the textfile updated */

        GpuHealthState node_published;
        char *node_published_reason;

        bool state_loaded;         /* the state file was read (once, when health first became active) */
        char *boot_id;             /* the kernel's boot id, "unknown" when unreadable */
        HealthRecord *records;     /* its failed GPUs not matched to a watched GPU yet */
        size_t n_records;
        char *state_text;          /* what the file holds, NULL: it has no record (or does not exist) */
};

static void fault_set(HealthFault *f, GpuHealthState s, const char *reason) {
        f->state = s;
        free(f->reason);
        f->reason = reason ? strdup(reason) : NULL;
}

static void pipe_close(HealthPipe *p) {
        p->io = sd_event_source_disable_unref(p->io);
        if (p->fd >= 0)
                close(p->fd);
        p->fd = -1;
        p->len = 0;
}

static HealthGpu *gpu_find(const Health *h, const char *pci_address) {
        for (size_t i = 0; h && i < h->n_gpus; i++)
                if (streq(h->gpus[i].pci_address, pci_address))
                        return &h->gpus[i];
        return NULL;
}

static void gpu_done(HealthGpu *g) {
        free(g->uuid);
        free(g->event.reason);
        free(g->check.reason);
        free(g->published_reason);
        free(g->hook_reason);
        strv_free(g->events);
}

/* The worse of the two faults; the reason names both when both are bad (an event whose re-check
 * failed: "XID 63: …; row remapping pending: …"). *ret_reason is allocated, NULL when ok. */
static GpuHealthState gpu_effective(const HealthGpu *g, char **ret_reason) {
        GpuHealthState s = g->event.state >= g->check.state ? g->event.state : g->check.state;

        if (s == GPU_HEALTH_OK)
                *ret_reason = NULL;
        else if (g->event.state != GPU_HEALTH_OK && g->check.state != GPU_HEALTH_OK)
                *ret_reason = strprintf("%s; %s", strna(g->event.reason), strna(g->check.reason));
        else
                *ret_reason = strdup(strna(g->event.state != GPU_HEALTH_OK ? g->event.reason : g->check.reason));
        return s;
}

static void gpu_add_event(HealthGpu *g, const char *text) {
        char stamp[32];
        time_t t = time(NULL);
        struct tm tm;

        strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
        if (strv_extendf(&g->events, "%s %s", stamp, text) < 0)
                return (void) log_oom();
        size_t n = strv_length(g->events);
        if (n > HEALTH_EVENTS_KEPT) {
                for (size_t i = 0; i < n - HEALTH_EVENTS_KEPT; i++)
                        free(g->events[i]);
                memmove(g->events, g->events + (n - HEALTH_EVENTS_KEPT),
                        (HEALTH_EVENTS_KEPT + 1) * sizeof(char *));
        }
}

int health_new(Node *n, Health **ret) {
        Health *h = calloc(1, sizeof *h);
        if (!h)
                return -ENOMEM;
        h->n = n;
        h->worker_pipe.fd = -1;
        *ret = h;
        return 0;
}

static void check_cancel(Health *h) {
        h->check_timer = sd_event_source_disable_unref(h->check_timer);
        h->results = mfree(h->results);
}

static void worker_stop(Health *h) {
        check_cancel(h);
        pipe_close(&h->worker_pipe);
        h->worker = spawn_free(h->worker);
        h->arm_timer = sd_event_source_disable_unref(h->arm_timer);
        h->armed = false;
}

Health *health_free(Health *h) {
        if (!h)
                return NULL;
        worker_stop(h);
        /* A hook still running is ended (its process group killed from the loop's background reaper). */
        for (size_t i = 0; i < h->n_hooks; i++)
                spawn_free(h->hooks[i].spawn);
        free(h->hooks);
        sd_event_source_disable_unref(h->hook_timer);
        sd_event_source_disable_unref(h->xid_log_timer);
        sd_event_source_disable_unref(h->metrics_timer);
        sd_event_source_disable_unref(h->restart_timer);
        sd_event_source_disable_unref(h->recheck_timer);
        for (size_t i = 0; i < h->n_gpus; i++)
                gpu_done(&h->gpus[i]);
        free(h->gpus);
        strv_free(h->addresses);
        free(h->check_node_reason);
        free(h->node_published_reason);
        for (size_t i = 0; i < h->n_records; i++) {
                free(h->records[i].uuid);
                free(h->records[i].reason);
        }
        free(h->records);
        free(h->boot_id);
        free(h->state_text);
        free(h);
        return NULL;
}

/* ---- The state file: failed GPUs outlive an agent restart ------------------------------------------- */

/* <paths.state>/gpu-health: "boot <kernel boot id>", then one "gpu <PCI address> <UUID> <since, Unix s>
 * <reason>" per GPU whose event fault is failed. Only failed faults are kept: a degraded one is
 * re-checked after a restart anyway. A reboot resets every GPU, so another boot id drops them all; another
 * UUID at the address is another GPU. */

static void record_free_at(Health *h, size_t i) {
        free(h->records[i].uuid);
        free(h->records[i].reason);
        h->records[i] = h->records[--h->n_records];
}

static HealthRecord *record_find(Health *h, const char *pci_address) {
        for (size_t i = 0; i < h->n_records; i++)
                if (streq(h->records[i].pci_address, pci_address))
                        return &h->records[i];
        return NULL;
}

static int record_add(Health *h, const char *pci_address, const char *uuid, const char *reason, int64_t since) {
        HealthRecord *l = reallocarray(h->records, h->n_records + 1, sizeof *l);
        if (!l)
                return -ENOMEM;
        h->records = l;
        HealthRecord *r = &l[h->n_records];
        *r = (HealthRecord) { .uuid = strdup(uuid), .reason = strdup(reason), .since = since };
        snprintf(r->pci_address, sizeof r->pci_address, "%s", pci_address);
        h->n_records++;
        if (!r->uuid || !r->reason) {
                record_free_at(h, h->n_records - 1);
                return -ENOMEM;
        }
        return 0;
}

static char *state_path(const Health *h) {
        return path_join(h->n->config->paths.state, HEALTH_STATE_FILE);
}

static void state_load(Health *h) {
        _cleanup_free_ char *path = state_path(h), *boot_path = path_join(h->n->config->paths.proc,
                                                                            "sys/kernel/random/boot_id");
        _cleanup_free_ char *text = NULL, *file_boot = NULL;
        unsigned lineno = 0, bad = 0;
        int r;

        h->state_loaded = true;
        if (!path || !boot_path)
                return (void) log_oom();
        r = read_one_line_file(boot_path, &h->boot_id);
        if (r < 0 || isempty(h->boot_id) || strpbrk(h->boot_id, " \t")) {
                log_warning("Cannot read the kernel's boot id from %s (%s): failed GPUs recorded in %s are kept "
                            "without telling whether the node rebooted since.", boot_path,
                            r < 0 ? strerror(-r) : "malformed", path);
                free(h->boot_id);
                h->boot_id = strdup("unknown");
                if (!h->boot_id)
                        return (void) log_oom();
        }
        /* The state directory is ours, but a link planted there must not make us read elsewhere. */
        r = read_full_file_at(AT_FDCWD, path, READ_FILE_NOFOLLOW, HEALTH_STATE_MAX_SIZE, &text, NULL);
        if (r == -ENOENT)
                return;
        if (r < 0) {
                log_warning("Ignoring %s: %s. GPU health starts clean (a fatal fault from before the restart "
                            "is not restored; remove the file if it is not a regular file).", path,
                            r == -ELOOP ? "it is a symlink, which is not followed" :
                            r == -EFBIG ? "too large" : strerror(-r));
                return;
        }
        char *save = NULL;
        for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
                char pci[32], uuid[128], boot[128], extra;
                long long since;
                int n = 0;

                lineno++;
                if (line[0] == '#' || isempty(line))
                        continue;
                if (!file_boot && sscanf(line, "boot %127s %c", boot, &extra) == 1) {
                        file_boot = strdup(boot);
                        if (!file_boot)
                                return (void) log_oom();
                        continue;
                }
                if (file_boot && sscanf(line, "gpu %31s %127s %lld %n", pci, uuid, &since, &n) == 3 && n > 0 &&
                    !isempty(line + n) && !record_find(h, pci)) {
                        if (record_add(h, pci, uuid, line + n, since) < 0)
                                return (void) log_oom();
                        continue;
                }
                log_warning("%s:%u: ignoring a malformed line (expected \"boot <id>\" first, then \"gpu <PCI "
                            "address> <UUID> <time> <reason>\").", path, lineno);
                bad++;
        }
        if (h->n_records > 0 && !streq(file_boot, h->boot_id)) {
                log_info("%s: %zu failed GPU(s) recorded in an earlier boot (%s, now %s): the reboot reset them, "
                         "dropping the records.", path, h->n_records, file_boot, h->boot_id);
                while (h->n_records > 0)
                        record_free_at(h, 0);
        }
        /* The file exists: rewritten (or removed) with what is left at the next save. */
        h->state_text = strdup("");
        if (!h->state_text)
                log_oom();
}

/* A GPU health starts to watch: a record for its address comes back as its failed fault when the UUID
 * is the same, and is dropped when another GPU sits there now. */
static void state_restore(Health *h, HealthGpu *g) {
        HealthRecord *rec = record_find(h, g->pci_address);
        char stamp[32], text[128];
        struct tm tm;

        if (!rec)
                return;
        if (!g->uuid || !streq(g->uuid, rec->uuid)) {
                log_info("GPU %s was recorded failed as %s but is %s now (replaced): dropping the record.",
                         g->pci_address, rec->uuid, strna(g->uuid));
                return record_free_at(h, (size_t) (rec - h->records));
        }
        _cleanup_free_ char *reason = strprintf("%s%s", rec->reason, HEALTH_RESTORED_SUFFIX);
        if (!reason)
                return (void) log_oom();
        time_t t = (time_t) rec->since;
        strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
        log_notice("GPU %s is still failed: %s (recorded at %s, before the agent restarted; reset the GPU and call "
                   "ResetGpuHealth).", g->pci_address, rec->reason, stamp);
        fault_set(&g->event, GPU_HEALTH_FAILED, reason);
        g->failed_since = rec->since;
        /* The hook was told before the restart: a restart is no change. */
        g->hook_state = g->hook_told = GPU_HEALTH_FAILED;
        g->hook_reason = TAKE_PTR(reason);
        snprintf(text, sizeof text, "failed fault recorded at %s restored after an agent restart", stamp);
        gpu_add_event(g, text);
        record_free_at(h, (size_t) (rec - h->records));
}

static int state_line(char **text, const char *pci, const char *uuid, int64_t since, const char *reason) {
        size_t l = strlen(reason), sl = strlen(HEALTH_RESTORED_SUFFIX);
        if (l >= sl && streq(reason + l - sl, HEALTH_RESTORED_SUFFIX))
                l -= sl;
        char *t = strprintf("%sgpu %s %s %lld %.*s\n", *text ?: "", pci, uuid, (long long) since, (int) l, reason);
        if (!t)
                return -ENOMEM;
        free(*text);
        *text = t;
        return 0;
}

/* Writes the failed GPUs when they differ from what the file holds; removes the file when none is. */
static void state_save(Health *h) {
        _cleanup_free_ char *path = NULL, *records = NULL, *text = NULL;
        int r;

        if (!h->active || !h->state_loaded)
                return;
        for (size_t i = 0; i < h->n_gpus; i++) {
                HealthGpu *g = &h->gpus[i];
                if (g->event.state != GPU_HEALTH_FAILED || !g->uuid)
                        continue;
                if (g->failed_since == 0)
                        g->failed_since = (int64_t) time(NULL);
                if (state_line(&records, g->pci_address, g->uuid, g->failed_since, strna(g->event.reason)) < 0)
                        return (void) log_oom();
        }
        for (size_t i = 0; i < h->n_records; i++)
                if (state_line(&records, h->records[i].pci_address, h->records[i].uuid, h->records[i].since,
                               h->records[i].reason) < 0)
                        return (void) log_oom();
        if (!records && !h->state_text)
                return;
        if (streq_ptr(records, h->state_text))
                return;
        path = state_path(h);
        if (!path)
                return (void) log_oom();
        if (!records) {
                if (unlink(path) < 0 && errno != ENOENT)
                        return (void) log_warning_errno(errno, "Failed to remove %s: %m", path);
                h->state_text = mfree(h->state_text);
                return;
        }
        text = strprintf("# gpu-node-agent: GPUs failed by a fatal fault, kept across agent restarts until the GPU\n"
                         "# is reset (ResetGpuHealth) or the node reboots. Do not edit.\n"
                         "boot %s\n%s", h->boot_id, records);
        if (!text)
                return (void) log_oom();
        r = mkdir_p(h->n->config->paths.state, 0755);
        if (r >= 0)
                r = write_file_atomic(path, NULL, text, strlen(text), 0644);
        if (r < 0)
                return (void) log_warning_errno(r, "Failed to record the failed GPUs in %s: %s. An agent restart "
                                                "would show them ok.", path, strerror(-r));
        free(h->state_text);
        h->state_text = TAKE_PTR(records);
}

/* ---- Publishing -------------------------------------------------------------------------------------- */

static int inventory_index(const Node *n, const char *pci_address) {
        for (size_t i = 0; n->inventory && i < n->inventory->n_gpus; i++)
                if (streq(n->inventory->gpus[i].address, pci_address))
                        return (int) i;
        return -1;
}

static void hooks_dispatch(Health *h);

static void hook_exited(Spawn *s, const SpawnResult *res, void *userdata) {
        Health *h = userdata;

        for (size_t i = 0; i < h->n_hooks; i++)
                if (h->hooks[i].spawn == s) {
                        h->hooks[i] = h->hooks[--h->n_hooks];
                        break;
                }
        if (res->timed_out)
                log_warning("health.on-unhealthy hook timed out and was killed.");
        else if (res->signal > 0)
                log_warning("health.on-unhealthy hook was killed by signal %d.", res->signal);
        else if (res->exit_status != 0)
                log_warning("health.on-unhealthy hook exited with status %d.", res->exit_status);
        spawn_free(s);
        /* A change that came while it ran is told now (or when the interval allows). */
        hooks_dispatch(h);
}

static bool hook_running(const Health *h, const char *pci_address) {
        for (size_t i = 0; i < h->n_hooks; i++)
                if (streq(h->hooks[i].pci_address, pci_address))
                        return true;
        return false;
}

/* At most one run per GPU per this long: a GPU that flaps tells the hook its latest state, not each. */
static uint64_t hook_interval(const Health *h) {
        uint64_t d = h->n->config->health.recheck_delay_usec;
        return d > USEC_PER_SEC ? d : USEC_PER_SEC;
}

/* Tells the hook g's lasting state (g->hook_state), and what it was told before. */
static void run_hook(Health *h, HealthGpu *g, uint64_t now) {
        extern char **environ;
        const char *cmd = h->n->config->health.on_unhealthy;
        _cleanup_strv_free_ char **env = NULL;
        char host[256] = "", xid[16] = "";
        int idx = inventory_index(h->n, g->pci_address);
        const GpuInfo *info = h->n->nvml_snapshot ? gpu_nvml_snapshot_find(h->n->nvml_snapshot, g->pci_address) : NULL;
        GpuHealthState old = g->hook_told;
        unsigned unhealthy = 0;
        Spawn *child = NULL;
        int r;

        g->hook_told = g->hook_state;
        if (isempty(cmd))
                return;
        g->hook_usec = now;
        for (size_t i = 0; i < h->n_gpus; i++)
                if (h->gpus[i].hook_state != GPU_HEALTH_OK)
                        unhealthy++;
        if (g->hook_xid > 0)
                snprintf(xid, sizeof xid, "%u", g->hook_xid);
        (void) gethostname(host, sizeof host - 1);
        env = strv_copy(environ);
        if (!env || strv_extendf(&env, "GPU_NODE_AGENT_GPU=%d", idx) < 0 ||
            strv_extendf(&env, "GPU_NODE_AGENT_GPU_PCI_ADDRESS=%s", g->pci_address) < 0 ||
            strv_extendf(&env, "GPU_NODE_AGENT_GPU_UUID=%s", info && info->uuid ? info->uuid : "") < 0 ||
            strv_extendf(&env, "GPU_NODE_AGENT_HEALTH=%s", gpu_health_to_string(g->hook_state)) < 0 ||
            strv_extendf(&env, "GPU_NODE_AGENT_OLD_HEALTH=%s", gpu_health_to_string(old)) < 0 ||
            strv_extendf(&env, "GPU_NODE_AGENT_REASON=%s", g->hook_reason ?: "") < 0 ||
            strv_extendf(&env, "GPU_NODE_AGENT_XID=%s", xid) < 0 ||
            strv_extendf(&env, "GPU_NODE_AGENT_UNHEALTHY_GPUS=%u", unhealthy) < 0 ||
            strv_extendf(&env, "GPU_NODE_AGENT_HOSTNAME=%s", host) < 0)
                return (void) log_oom();
        char *argv[] = { (char *) "/bin/sh", (char *) "-c", (char *) cmd, NULL };
        SpawnOptions o = { .env = env, .timeout_usec = HEALTH_HOOK_TIMEOUT_USEC, .on_exit = hook_exited,
                           .userdata = h };
        HealthHook *l = reallocarray(h->hooks, h->n_hooks + 1, sizeof *l);
        if (!l)
                return (void) log_oom();
        h->hooks = l;
        r = spawn_start(h->n->event, argv, &o, &child);
        if (r < 0)
                return (void) log_warning_errno(r, "Failed to run the health.on-unhealthy hook: %s", strerror(-r));
        log_debug("GPU %s: health.on-unhealthy hook run (%s -> %s).", g->pci_address, gpu_health_to_string(old),
                  gpu_health_to_string(g->hook_state));
        h->hooks[h->n_hooks] = (HealthHook) { .spawn = child };
        snprintf(h->hooks[h->n_hooks].pci_address, sizeof h->hooks[h->n_hooks].pci_address, "%s", g->pci_address);
        h->n_hooks++;
}

static int on_hook_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        hooks_dispatch(userdata);
        return 0;
}

/* Runs the hook for each GPU whose lasting state differs from what it was told, one run per GPU at a
 * time and per hook_interval(): the latest state wins, the ones in between are not told. */
static void hooks_dispatch(Health *h) {
        uint64_t now = 0, next = UINT64_MAX, interval = hook_interval(h);

        (void) sd_event_now(h->n->event, CLOCK_MONOTONIC, &now);
        for (size_t i = 0; i < h->n_gpus; i++) {
                HealthGpu *g = &h->gpus[i];
                if (g->hook_state == g->hook_told || hook_running(h, g->pci_address))
                        continue;   /* nothing to tell, or its exit comes back here */
                if (g->hook_usec > 0 && now < g->hook_usec + interval) {
                        if (g->hook_usec + interval < next)
                                next = g->hook_usec + interval;
                        continue;
                }
                run_hook(h, g, now);
        }
        if (next != UINT64_MAX &&
            event_reset_time(h->n->event, &h->hook_timer, CLOCK_MONOTONIC, next, 0, on_hook_timer, h,
                             "health-hook-interval") < 0)
                log_warning("Failed to arm the health.on-unhealthy interval timer: a held-back run is lost.");
}

static bool timer_armed(sd_event_source *s) {
        int enabled = SD_EVENT_OFF;
        return s && sd_event_source_get_enabled(s, &enabled) >= 0 && enabled != SD_EVENT_OFF;
}

/* Which published changes last, for the hook: failed at once (nothing clears it by itself); degraded once
 * a health check asked for at least health.recheck-delay after it began still finds it (a recoverable
 * XID that its re-check clears never reaches the hook); ok once a complete check agrees (the recovery
 * after a degraded or failed state that was told). checked: a complete health check just finished. */
static void health_settle(Health *h, bool checked) {
        uint64_t delay = h->n->config->health.recheck_delay_usec;
        bool waiting = false;

        for (size_t i = 0; i < h->n_gpus; i++) {
                HealthGpu *g = &h->gpus[i];
                GpuHealthState s = g->published;

                if (s == g->hook_state)
                        continue;
                if (s != GPU_HEALTH_FAILED &&
                    !(checked && (s == GPU_HEALTH_OK || h->check_usec >= g->state_usec + delay))) {
                        waiting = waiting || s == GPU_HEALTH_DEGRADED;
                        continue;
                }
                g->hook_state = s;
                free(g->hook_reason);
                g->hook_reason = g->published_reason ? strdup(g->published_reason) : NULL;
                g->hook_xid = s != GPU_HEALTH_OK && g->event.state != GPU_HEALTH_OK ? g->event_xid : 0;
        }
        /* A degraded state found by a check has no re-check coming of its own. */
        if (waiting && !timer_armed(h->recheck_timer))
                health_check_now(h);
        hooks_dispatch(h);
}

static char *node_reason_text(const Health *h, GpuHealthState *ret) {
        GpuHealthState worst = GPU_HEALTH_OK;
        unsigned n_bad = 0;
        const HealthGpu *first = NULL;

        for (size_t i = 0; i < h->n_gpus; i++) {
                _cleanup_free_ char *why = NULL;
                GpuHealthState s = gpu_effective(&h->gpus[i], &why);
                if (s == GPU_HEALTH_OK)
                        continue;
                n_bad++;
                if (s > worst) {
                        worst = s;
                        first = &h->gpus[i];
                }
        }
        if (h->check_node_reason && worst < GPU_HEALTH_DEGRADED)
                worst = GPU_HEALTH_DEGRADED;
        *ret = worst;
        if (worst == GPU_HEALTH_OK)
                return NULL;
        if (n_bad == 0)
                return strdup(h->check_node_reason);
        _cleanup_free_ char *why = NULL;
        (void) gpu_effective(first, &why);
        return strprintf("%u GPU%s unhealthy; GPU %d (%s) %s: %s%s%s", n_bad, n_bad == 1 ? "" : "s",
                         inventory_index(h->n, first->pci_address), first->pci_address, gpu_health_to_string(worst),
                         why ?: "unknown reason", h->check_node_reason ? "; " : "", h->check_node_reason ?: "");
}

/* Compares what is now with what was published; tells D-Bus, the hook and (through a pass: labels,
 * node state) everything else about each difference. */
static int on_metrics_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        Health *h = userdata;

        h->metrics_usec = usec;
        node_metrics_update(h->n);
        return 0;
}

/* The textfile follows a health change at once, and in a storm at most once per
 * HEALTH_METRICS_INTERVAL_USEC: each write is a file replaced, and the last one has the exact counts. */
static void health_metrics_changed(Health *h) {
        uint64_t now = 0;

        /* Without a textfile nothing is written: no timer to wake an idle daemon for. */
        if (isempty(h->n->config->metrics.textfile) || timer_armed(h->metrics_timer))
                return;
        (void) sd_event_now(h->n->event, CLOCK_MONOTONIC, &now);
        if (h->metrics_usec == 0 || now >= h->metrics_usec + HEALTH_METRICS_INTERVAL_USEC ||
            event_reset_time(h->n->event, &h->metrics_timer, CLOCK_MONOTONIC,
                             h->metrics_usec + HEALTH_METRICS_INTERVAL_USEC, 0, on_metrics_timer, h,
                             "health-metrics") < 0) {
                h->metrics_usec = now;
                node_metrics_update(h->n);
        }
}

static void health_publish_checked(Health *h, bool checked) {
        Node *n = h->n;
        bool changed = false;
        uint64_t now = 0;

        (void) sd_event_now(n->event, CLOCK_MONOTONIC, &now);
        for (size_t i = 0; i < h->n_gpus; i++) {
                HealthGpu *g = &h->gpus[i];
                _cleanup_free_ char *why = NULL;
                GpuHealthState s = gpu_effective(g, &why);

                if (s == g->published && streq_ptr(why, g->published_reason))
                        continue;
                if (s == GPU_HEALTH_OK)
                        log_info("GPU %s is healthy again%s%s.", g->pci_address,
                                 g->published_reason ? " (was: " : "", g->published_reason ? g->published_reason : "");
                else
                        log_warning("GPU %s is %s: %s.", g->pci_address, gpu_health_to_string(s), strna(why));
                if (s != g->published)
                        g->state_usec = now;
                g->published = s;
                free(g->published_reason);
                g->published_reason = why ? strdup(why) : NULL;
                changed = true;

                int idx = inventory_index(n, g->pci_address);
                if (idx >= 0) {
                        _cleanup_free_ char *path = strprintf("%s/%d", AGENT_GPU_PATH_PREFIX, idx);
                        if (path) {
                                node_mark_dirty(n, path, AGENT_GPU_INTERFACE, "Health");
                                node_mark_dirty(n, path, AGENT_GPU_INTERFACE, "HealthEvents");
                        }
                }
        }

        GpuHealthState node;
        _cleanup_free_ char *reason = node_reason_text(h, &node);
        if (node != h->node_published || !streq_ptr(reason, h->node_published_reason)) {
                h->node_published = node;
                free(h->node_published_reason);
                h->node_published_reason = TAKE_PTR(reason);
                node_mark_dirty(n, NULL, AGENT_MANAGER_INTERFACE, "Health");
                node_mark_dirty(n, NULL, AGENT_MANAGER_INTERFACE, "UnhealthyGpus");
                changed = true;
        }
        /* Labels, the feature file and the node state follow from a pass; the metrics (counters change
         * with every event, even one that changes no state) now. */
        if (changed)
                node_request_pass(n, "GPU health changed");
        health_metrics_changed(h);
        state_save(h);
        health_settle(h, checked);
}

static void health_publish(Health *h) {
        health_publish_checked(h, false);
}

/* ---- Health check ------------------------------------------------------------------------------------ */

typedef struct CheckResult {
        bool seen;
        bool remap_known;
        unsigned remap[4];
        GpuHealthState state;
        char reason[192];
} CheckResult;

static void check_finding(CheckResult *c, GpuHealthState s, const char *fmt, ...) _printf_(3, 4);
static void check_finding(CheckResult *c, GpuHealthState s, const char *fmt, ...) {
        va_list ap;

        if (s < c->state)
                return;
        c->state = s;
        va_start(ap, fmt);
        vsnprintf(c->reason, sizeof c->reason, fmt, ap);
        va_end(ap);
}

static void check_line(Health *h, CheckResult *res, char *line) {
        unsigned a, b, c, d;
        size_t i;
        char what[16];
        int off = 0;

        if (sscanf(line, "gpu %zu %15s %n", &i, what, &off) >= 2 && i < h->n_gpus) {
                res[i].seen = true;
                if (streq(what, "missing"))
                        check_finding(&res[i], GPU_HEALTH_FAILED, "not visible to NVML (fell off the bus?)");
                else if (streq(what, "lost"))
                        check_finding(&res[i], GPU_HEALTH_FAILED, "lost (NVML: GPU is lost): reset the GPU or reboot");
                else if (streq(what, "error"))
                        check_finding(&res[i], GPU_HEALTH_DEGRADED, "NVML does not answer for it: %s", line + off);
        } else if (sscanf(line, "remap %zu %u %u %u %u", &i, &a, &b, &c, &d) == 5 && i < h->n_gpus) {
                res[i].remap_known = true;
                res[i].remap[0] = a, res[i].remap[1] = b, res[i].remap[2] = c, res[i].remap[3] = d;
                if (d)
                        check_finding(&res[i], GPU_HEALTH_FAILED,
                                      "row remapping failed (%u uncorrectable rows): the GPU needs servicing", b);
                else if (c)
                        check_finding(&res[i], GPU_HEALTH_DEGRADED,
                                      "row remapping pending: reset the GPU to apply it");
        } else if (sscanf(line, "fabric %zu %u %u", &i, &a, &b) == 3 && i < h->n_gpus) {
                static const char *const states[] = { "not supported", "not started", "in progress", "completed" };
                if (a != NVML_GPU_FABRIC_STATE_COMPLETED)
                        check_finding(&res[i], GPU_HEALTH_DEGRADED,
                                      "fabric registration not complete (%s): not ready for NVLink work",
                                      a < ELEMENTSOF(states) ? states[a] : "unknown state");
                else if (b != NVML_SUCCESS)
                        check_finding(&res[i], GPU_HEALTH_DEGRADED,
                                      "fabric registration failed (NVML status %u): check nvidia-fabricmanager", b);
        } else if (startswith(line, "error "))
                log_warning("GPU health check: %s", line + 6);
}

static void check_apply(Health *h, const CheckResult *res, bool complete, const char *failure) {
        const Node *n = h->n;
        unsigned expect = n->config->probe.expect_gpus;
        size_t found = n->inventory ? n->inventory->n_gpus : 0;

        free(h->check_node_reason);
        h->check_node_reason = NULL;
        if (expect > 0 && found < expect)
                h->check_node_reason = strprintf("expected %u GPUs (probe.expect-gpus), found %zu on the PCI bus: a "
                                                 "GPU fell off the bus or is not seated", expect, found);
        for (size_t i = 0; i < h->n_gpus; i++) {
                HealthGpu *g = &h->gpus[i];
                if (!complete) {
                        /* A check that hung or crashed says nothing good: keep what was known. */
                        if (failure && g->check.state == GPU_HEALTH_OK)
                                fault_set(&g->check, GPU_HEALTH_DEGRADED, failure);
                        continue;
                }
                fault_set(&g->check, res[i].state, res[i].state == GPU_HEALTH_OK ? NULL : res[i].reason);
                g->remap_known = res[i].remap_known;
                memcpy(g->remap, res[i].remap, sizeof g->remap);
                /* Recovery: a recoverable fault ends with a clean re-check. */
                if (res[i].seen && res[i].state == GPU_HEALTH_OK && g->event.state == GPU_HEALTH_DEGRADED &&
                    h->check_usec >= g->event_usec + h->n->config->health.recheck_delay_usec) {
                        log_info("GPU %s passed its health re-check.", g->pci_address);
                        gpu_add_event(g, "health re-check passed");
                        fault_set(&g->event, GPU_HEALTH_OK, NULL);
                        g->event_xid = 0;
                }
        }
        health_publish_checked(h, complete);
}


/* ---- Event worker ------------------------------------------------------------------------------------ */

typedef struct HealthChildArgs {
        const char *library;
        char *const *addresses;
} HealthChildArgs;

static int worker_body(int fd, void *userdata) {
        const HealthChildArgs *a = userdata;
        return gpu_nvml_events_run(fd, a->library, a->addresses);
}

static void worker_schedule_restart(Health *h, const char *why);
static void check_send(Health *h);

static void check_finish(Health *h, bool complete, const char *failure) {
        _cleanup_free_ CheckResult *results = TAKE_PTR(h->results);

        h->check_timer = sd_event_source_disable_unref(h->check_timer);
        if (failure)
                log_warning("GPU health: %s.", failure);
        if (results)
                check_apply(h, results, complete, failure);
}

/* One line per XID code per GPU and window; what the window held back, in one line per code at its end. */
static void xid_log_summary(Health *h, HealthGpu *g) {
        XidLogSlot more[XID_LOG_SLOTS];
        size_t n = xid_log_flush(&g->xid_log, more);

        for (size_t i = 0; i < n; i++)
                log_info("XID %u on GPU %d (%s): %" PRIu64 " more in the last %" PRIu64 " s.", more[i].xid,
                         inventory_index(h->n, g->pci_address), g->pci_address, more[i].more,
                         XID_LOG_WINDOW_USEC / USEC_PER_SEC);
}

static int on_xid_log_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        Health *h = userdata;
        uint64_t next = UINT64_MAX;

        for (size_t i = 0; i < h->n_gpus; i++) {
                uint64_t d = xid_log_deadline(&h->gpus[i].xid_log);
                if (d > 0 && d <= usec)
                        xid_log_summary(h, &h->gpus[i]);
                else if (d > 0 && d < next)
                        next = d;
        }
        if (next != UINT64_MAX)
                (void) event_reset_time(h->n->event, &h->xid_log_timer, CLOCK_MONOTONIC, next, 0, on_xid_log_timer,
                                        h, "health-xid-log");
        return 0;
}

static void xid_log(Health *h, HealthGpu *g, unsigned xid, const char *desc, XidAction a) {
        uint64_t now = 0, d = xid_log_deadline(&g->xid_log);

        (void) sd_event_now(h->n->event, CLOCK_MONOTONIC, &now);
        if (d > 0 && now >= d)
                xid_log_summary(h, g); /* its timer is due in this same iteration */
        if (xid_log_note(&g->xid_log, xid, now))
                log_info("GPU %s: XID %u (%s; class %s).", g->pci_address, xid, desc, xid_action_to_string(a));
        /* Windows open in time order: an armed timer is due no later than this one's end. */
        if (!timer_armed(h->xid_log_timer) &&
            event_reset_time(h->n->event, &h->xid_log_timer, CLOCK_MONOTONIC, xid_log_deadline(&g->xid_log), 0,
                             on_xid_log_timer, h, "health-xid-log") < 0)
                log_warning("GPU %s: failed to arm the XID log timer; the count of XIDs held back comes with "
                            "the next XID.", g->pci_address);
}

static void handle_event(Health *h, HealthGpu *g, unsigned long long type, unsigned long long data, unsigned gi) {
        const ConfigHealth *c = &h->n->config->health;
        char text[256], where[48] = "";

        if (gi != 0xFFFFFFFFu)
                snprintf(where, sizeof where, " in MIG GPU instance %u", gi);

        if (type == nvmlEventTypeXidCriticalError) {
                const char *desc;
                XidAction a = health_xid_classify((unsigned) data, c->xid_ignore, c->xid_fatal, &desc);
                g->xid_count++;
                g->last_xid = (unsigned) data;
                snprintf(text, sizeof text, "XID %llu%s: %s", data, where, desc);
                gpu_add_event(g, text);
                xid_log(h, g, (unsigned) data, desc, a);
                switch (a) {
                case XID_APPLICATION:
                        break;
                case XID_RECOVERABLE:
                        if (g->event.state < GPU_HEALTH_FAILED) {
                                fault_set(&g->event, GPU_HEALTH_DEGRADED, text);
                                g->event_xid = (unsigned) data;
                                (void) sd_event_now(h->n->event, CLOCK_MONOTONIC, &g->event_usec);
                        }
                        /* Clears once a re-check passes. */
                        health_check_now(h);
                        break;
                case XID_RESET:
                        snprintf(text + strlen(text), sizeof text - strlen(text), "; reset the GPU (nvidia-smi -r)");
                        fault_set(&g->event, GPU_HEALTH_FAILED, text);
                        g->event_xid = (unsigned) data;
                        break;
                case XID_REBOOT:
                        snprintf(text + strlen(text), sizeof text - strlen(text), "; reboot the node");
                        fault_set(&g->event, GPU_HEALTH_FAILED, text);
                        g->event_xid = (unsigned) data;
                        break;
                case _XID_ACTION_MAX:
                case _XID_ACTION_INVALID:
                        break;
                }
        } else if (type == nvmlEventTypeDoubleBitEccError) {
                g->dbe_count++;
                snprintf(text, sizeof text, "double-bit ECC error%s", where);
                gpu_add_event(g, text);
                fault_set(&g->event, GPU_HEALTH_FAILED, "double-bit ECC error; reset the GPU (nvidia-smi -r)");
                g->event_xid = 0;
        } else if (type == nvmlEventTypeSingleBitEccError) {
                g->sbe_count++;
                gpu_add_event(g, "single-bit ECC error (corrected)");
        } else if (type == nvmlEventTypeClock) {
                gpu_add_event(g, "clock change (throttling)");
        } else
                return;
        health_publish(h);
}


static void worker_line(Health *h, char *line) {
        unsigned long long type, data;
        unsigned gi = 0xFFFFFFFFu, ci = 0xFFFFFFFFu;
        size_t i;

        if (h->results && (startswith(line, "count ") || startswith(line, "gpu ") || startswith(line, "remap ") ||
                           startswith(line, "fabric ")))
                check_line(h, h->results, line);
        else if (h->results && streq(line, "done")) {
                check_finish(h, true, NULL);
                if (h->check_again)
                        check_send(h);
        } else if (startswith(line, "armed ")) {
                h->armed = true;
                (void) sd_event_now(h->n->event, CLOCK_MONOTONIC, &h->armed_usec);
                h->arm_timer = sd_event_source_disable_unref(h->arm_timer);
                log_debug("GPU event worker armed on %s GPU(s).", line + 6);
                if (h->check_again)
                        check_send(h);
        } else if (sscanf(line, "event %zu %llu %llu %u %u", &i, &type, &data, &gi, &ci) >= 3) {
                if (i < h->n_gpus)
                        handle_event(h, &h->gpus[i], type, data, gi);
        } else if (startswith(line, "unsupported "))
                log_info("GPU event worker: no events for GPU #%s.", line + 12);
        else if (startswith(line, "error "))
                log_warning("GPU event worker: %s", line + 6);
}

/* Reads what is there and hands over every complete line. 0 at EOF. */
static int pipe_drain(Health *h, HealthPipe *p) {
        for (;;) {
                ssize_t n = read(p->fd, p->buf + p->len, sizeof p->buf - p->len - 1);
                if (n < 0)
                        return errno == EAGAIN || errno == EINTR ? 1 : -errno;
                if (n == 0)
                        return 0;
                p->len += (size_t) n;
                p->buf[p->len] = 0;
                char *start = p->buf, *nl;
                while ((nl = strchr(start, '\n'))) {
                        *nl = 0;
                        worker_line(h, start);
                        if (p->fd < 0)
                                return 0; /* the line stopped the worker */
                        start = nl + 1;
                }
                p->len -= (size_t) (start - p->buf);
                memmove(p->buf, start, p->len);
                if (p->len == sizeof p->buf - 1)
                        p->len = 0; /* a line longer than the buffer is not ours: drop it */
        }
}

static int on_worker_io(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        Health *h = userdata;
        int r = pipe_drain(h, &h->worker_pipe);
        if (r <= 0 && h->worker_pipe.fd == fd)
                h->worker_pipe.io = sd_event_source_disable_unref(h->worker_pipe.io);
        return 0;
}

static void on_worker_exit(Spawn *s, const SpawnResult *res, void *userdata) {
        Health *h = userdata;
        char why[128];

        if (h->worker != s)
                return;
        if (h->worker_pipe.fd >= 0)
                (void) pipe_drain(h, &h->worker_pipe);
        if (res->signal > 0)
                snprintf(why, sizeof why, "crashed with signal %s", sigabbrev_np(res->signal) ?: "?");
        else
                snprintf(why, sizeof why, "exited with status %d", res->exit_status);
        if (h->results)
                check_finish(h, false, "the event worker ended during a health check");
        worker_schedule_restart(h, why);
}

static int on_arm_timeout(sd_event_source *s, uint64_t usec, void *userdata) {
        worker_schedule_restart(userdata, "did not register for events within nvml.timeout (hung in NVML)");
        return 0;
}

static int on_restart(sd_event_source *s, uint64_t usec, void *userdata);

static void worker_start(Health *h) {
        SpawnOptions o = { .on_exit = on_worker_exit, .userdata = h, .kill_grace_usec = 1 * USEC_PER_SEC };
        HealthChildArgs args = { .library = h->n->config->nvml.library, .addresses = h->addresses };
        int sv[2], r;

        worker_stop(h);
        h->restart_timer = sd_event_source_disable_unref(h->restart_timer);
        if (!h->active || strv_length(h->addresses) == 0)
                return;
        /* The daemon itself never loads libnvidia-ml (docs/HACKING.md), so the fork starts clean. */
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
                log_warning_errno(errno, "Failed to start the GPU event worker: %m");
                return worker_schedule_restart(h, "could not be started");
        }
        /* The child is a fork: args on our stack is its copy. Its end blocks: it has nothing else to do. */
        r = spawn_fork(h->n->event, sv[1], worker_body, &args, &o, &h->worker);
        close(sv[1]);
        if (r < 0) {
                close(sv[0]);
                log_warning_errno(r, "Failed to start the GPU event worker: %s", strerror(-r));
                return worker_schedule_restart(h, "could not be started");
        }
        (void) fcntl(sv[0], F_SETFL, O_NONBLOCK);
        h->worker_pipe.fd = sv[0];
        h->worker_pipe.len = 0;
        r = sd_event_add_io(h->n->event, &h->worker_pipe.io, sv[0], EPOLLIN, on_worker_io, h);
        if (r >= 0) {
                (void) sd_event_source_set_description(h->worker_pipe.io, "health-events");
                r = event_reset_time_relative(h->n->event, &h->arm_timer, CLOCK_MONOTONIC,
                                              h->n->config->nvml.timeout_usec, 0, on_arm_timeout, h,
                                              "health-arm-timeout");
        }
        if (r < 0) {
                log_warning_errno(r, "Failed to watch the GPU event worker: %s", strerror(-r));
                worker_schedule_restart(h, "could not be watched");
        }
}

static int on_restart(sd_event_source *s, uint64_t usec, void *userdata) {
        worker_start(userdata);
        return 0;
}

static void worker_schedule_restart(Health *h, const char *why) {
        uint64_t now = 0, delay = HEALTH_RESTART_MIN_USEC;
        int r;

        (void) sd_event_now(h->n->event, CLOCK_MONOTONIC, &now);
        if (h->armed && now - h->armed_usec > HEALTH_STABLE_USEC)
                h->restarts = 0;
        worker_stop(h);
        if (!h->active)
                return;
        for (unsigned i = 0; i < h->restarts && delay < HEALTH_RESTART_MAX_USEC; i++)
                delay *= 2;
        if (delay > HEALTH_RESTART_MAX_USEC)
                delay = HEALTH_RESTART_MAX_USEC;
        h->restarts++;
        h->restarts_total++;
        log_warning("GPU event worker %s; restarting it in %.1fs (attempt %u). GPU events are not seen meanwhile.",
                    why, (double) delay / USEC_PER_SEC, h->restarts);
        h->restart_timer = sd_event_source_disable_unref(h->restart_timer);
        r = event_reset_time_relative(h->n->event, &h->restart_timer, CLOCK_MONOTONIC, delay, 0, on_restart, h,
                                      "health-worker-restart");
        if (r < 0)
                log_warning_errno(r, "Failed to arm the event worker restart timer: %m");
}

/* ---- Running checks ------------------------------------------------------------------------------------ */

static int on_check_timeout(sd_event_source *s, uint64_t usec, void *userdata) {
        Health *h = userdata;
        check_finish(h, false, "the health check hung in NVML");
        worker_schedule_restart(h, "hung in a health check and was killed");
        return 0;
}

/* Asks the armed worker for a check; one is pending until it is armed. */
static void check_send(Health *h) {
        int r;

        h->check_again = true;
        if (!h->active || !h->armed || h->results || h->worker_pipe.fd < 0)
                return;
        h->results = calloc(h->n_gpus + 1, sizeof(CheckResult));
        if (!h->results)
                return (void) log_oom();
        if (write(h->worker_pipe.fd, "check\n", 6) != 6) {
                h->results = mfree(h->results);
                return worker_schedule_restart(h, "does not take requests");
        }
        h->check_again = false;
        (void) sd_event_now(h->n->event, CLOCK_MONOTONIC, &h->check_usec);
        r = event_reset_time_relative(h->n->event, &h->check_timer, CLOCK_MONOTONIC, h->n->config->nvml.timeout_usec,
                                      0, on_check_timeout, h, "health-check-timeout");
        if (r < 0)
                log_warning_errno(r, "Failed to arm the health check timeout: %m");
}

static int on_recheck(sd_event_source *s, uint64_t usec, void *userdata) {
        check_send(userdata);
        return 0;
}

void health_release_driver(Health *h) {
        if (!h)
                return;
        /* A worker that crashed is not running but has its restart armed: that restart, due in the
         * middle of the removal, would open the GPU again and make the kernel refuse it. */
        h->restart_timer = sd_event_source_disable_unref(h->restart_timer);
        if (!h->worker)
                return;
        log_debug("Health event worker stopped: the driver is being removed.");
        worker_stop(h);
}

void health_check_now(Health *h) {
        uint64_t delay = h->n->config->health.recheck_delay_usec;
        int r;

        if (!h->active)
                return;
        if (delay == 0)
                return check_send(h);
        r = event_reset_time_relative(h->n->event, &h->recheck_timer, CLOCK_MONOTONIC, delay, 0, on_recheck, h,
                                      "health-recheck");
        if (r < 0)
                check_send(h);
}

/* ---- Following the node -------------------------------------------------------------------------------- */

static void health_set_gpus(Health *h, char **addresses) {
        _cleanup_free_ HealthGpu *gpus = calloc(strv_length(addresses) + 1, sizeof *gpus);
        size_t n = 0;

        if (!gpus)
                return (void) log_oom();
        STRV_FOREACH(a, addresses) {
                HealthGpu *old = gpu_find(h, *a);
                if (old) {
                        gpus[n] = *old;
                        *old = (HealthGpu) {};
                } else {
                        const GpuInfo *info = h->n->nvml_snapshot ? gpu_nvml_snapshot_find(h->n->nvml_snapshot, *a) : NULL;
                        snprintf(gpus[n].pci_address, sizeof gpus[n].pci_address, "%s", *a);
                        gpus[n].uuid = info && info->uuid ? strdup(info->uuid) : NULL;
                        state_restore(h, &gpus[n]);
                }
                n++;
        }
        for (size_t i = 0; i < h->n_gpus; i++) {
                HealthGpu *g = &h->gpus[i];
                /* A failed GPU no longer watched (lost to NVML) stays recorded. */
                if (g->event.state == GPU_HEALTH_FAILED && g->uuid && h->active &&
                    record_add(h, g->pci_address, g->uuid, strna(g->event.reason), g->failed_since ?: (int64_t) time(NULL)) < 0)
                        log_oom();
                xid_log_summary(h, g);
                gpu_done(g);
        }
        free(h->gpus);
        h->gpus = TAKE_PTR(gpus);
        h->n_gpus = n;
        strv_free(h->addresses);
        h->addresses = strv_copy(addresses);
}

void health_pass_done(Health *h) {
        const Node *n = h->n;
        _cleanup_strv_free_ char **addresses = NULL;
        bool active = n->config->health.enabled && n->nvml_snapshot && !n->oneshot;

        if (!active) {
                if (h->active) {
                        h->active = false;
                        worker_stop(h);
                        check_cancel(h);
                        h->restart_timer = sd_event_source_disable_unref(h->restart_timer);
                        h->recheck_timer = sd_event_source_disable_unref(h->recheck_timer);
                        health_set_gpus(h, NULL);
                        free(h->check_node_reason);
                        h->check_node_reason = NULL;
                        health_publish(h);
                }
                return;
        }
        for (size_t i = 0; i < n->nvml_snapshot->n_gpus; i++)
                if (strv_extend(&addresses, n->nvml_snapshot->gpus[i].pci_address) < 0)
                        return (void) log_oom();
        h->active = true;
        if (!h->state_loaded)
                state_load(h);
        if (!strv_equal(addresses, h->addresses) || !h->addresses) {
                health_set_gpus(h, addresses);
                health_publish(h); /* a failed GPU restored from the state file shows at once */
                h->restarts = 0;
                h->restart_timer = sd_event_source_disable_unref(h->restart_timer);
                worker_start(h);
        } else if (!h->worker && !h->restart_timer)
                worker_start(h);
        check_send(h);
}

static int gpu_was_reset(Health *h, const char *pci_address, const char *event) {
        HealthGpu *g = gpu_find(h, pci_address);
        HealthRecord *rec = record_find(h, pci_address);

        if (rec)
                record_free_at(h, (size_t) (rec - h->records));
        if (!g) {
                if (rec)
                        state_save(h);
                return -ENOENT;
        }
        gpu_add_event(g, event);
        fault_set(&g->event, GPU_HEALTH_OK, NULL);
        g->event_xid = 0;
        g->failed_since = 0;
        health_publish(h);
        check_send(h);
        return 0;
}

int health_reset_gpu(Health *h, const char *pci_address) {
        return gpu_was_reset(h, pci_address, "reset reported by an operator");
}

void health_gpu_reset_by_agent(Health *h, const char *pci_address) {
        if (!h)
                return;
        if (gpu_was_reset(h, pci_address, "reset by the agent (MIG mode change)") >= 0)
                log_info("GPU %s: reset by the agent, its fatal fault (if any) is cleared and it is re-checked.",
                         pci_address);
}

/* ---- Queries ------------------------------------------------------------------------------------------- */

GpuHealthState health_gpu_state(const Health *h, const char *pci_address, const char **ret_reason) {
        const HealthGpu *g = gpu_find(h, pci_address);

        if (!g) {
                if (ret_reason)
                        *ret_reason = NULL;
                return GPU_HEALTH_OK;
        }
        if (ret_reason)
                *ret_reason = g->published_reason;
        return g->published;
}

char *const *health_gpu_events(const Health *h, const char *pci_address) {
        const HealthGpu *g = gpu_find(h, pci_address);
        return g ? g->events : NULL;
}

GpuHealthState health_node_state(const Health *h, const char **ret_reason) {
        if (ret_reason)
                *ret_reason = h ? h->node_published_reason : NULL;
        return h ? h->node_published : GPU_HEALTH_OK;
}

unsigned health_unhealthy_gpus(const Health *h) {
        unsigned n = 0;
        for (size_t i = 0; h && i < h->n_gpus; i++)
                if (h->gpus[i].published != GPU_HEALTH_OK)
                        n++;
        return n;
}

bool health_active(const Health *h) {
        /* From the facts rather than h->active, which follows at the end of the pass whose labels
         * already ask. */
        return h && h->n->config && h->n->config->health.enabled && h->n->nvml_snapshot && !h->n->oneshot;
}

bool health_armed(const Health *h) {
        return h && h->armed;
}

uint64_t health_worker_restarts(const Health *h) {
        return h ? h->restarts_total : 0;
}

int health_gpu_counters(const Health *h, const char *pci_address, HealthCounters *ret) {
        const HealthGpu *g = gpu_find(h, pci_address);

        if (!g)
                return -ENOENT;
        *ret = (HealthCounters) {
                .xids = g->xid_count,
                .sbe = g->sbe_count,
                .dbe = g->dbe_count,
                .last_xid = g->last_xid,
                .remap_known = g->remap_known,
                .remap_correctable = g->remap[0],
                .remap_uncorrectable = g->remap[1],
                .remap_failure = g->remap[3],
        };
        return 0;
}
