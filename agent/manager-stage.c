/* SPDX-License-Identifier: MIT */
/* Owns the stage engine: passes over the stage table, the one transition function
 * (manager_set_stage), readiness (sd_notify, /run/gpu-node-agent files, D-Bus), and retry with
 * backoff. Each stage runs from its own event-loop iteration so D-Bus stays responsive between them. */
#include <inttypes.h>
#include <systemd/sd-daemon.h>
#include <time.h>

#include "event-util.h"
#include "fileio.h"
#include "log.h"
#include "health.h"
#include "metrics.h"
#include "manager.h"
#include "strv.h"

/* How far each progress report before READY=1 pushes the start timeout out (EXTEND_TIMEOUT_USEC=). */
#define STAGE_PROGRESS_EXTEND_USEC (120 * UINT64_C(1000000))

static uint64_t now_realtime(void) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        return (uint64_t) ts.tv_sec * USEC_PER_SEC + (uint64_t) ts.tv_nsec / 1000;
}

static bool stage_state_is_success(StageState s) {
        return s == STAGE_DONE || s == STAGE_SKIPPED;
}

static bool stage_state_is_final(StageState s) {
        return s == STAGE_DONE || s == STAGE_SKIPPED || s == STAGE_FAILED;
}

/* The NVIDIA driver is kept out of the kernel on purpose: Unload() (gpunodectl driver unload) is in
 * flight or holding, or an administrator removed it (modprobe -r) and the agent leaves it so. The
 * stages that need it are skipped, not failed, but the node cannot run GPU work: not ready. */
static bool manager_driver_held(const Manager *m) {
        return m->node.unload || m->node.driver_admin_unloaded;
}

bool manager_is_ready(const Manager *m) {
        if (!m->node.first_pass_done)
                return false;
        if (manager_driver_held(m))
                return false;
        for (int i = 0; i < _STAGE_MAX; i++)
                if (!stage_state_is_success(m->node.stages[i].state))
                        return false;
        return true;
}

const char *manager_stage_name(const Manager *m) {
        if (m->node.current_stage >= 0)
                return stage_to_string(m->node.current_stage);
        return m->node.first_pass_done ? "ready" : "starting";
}

static AgentState manager_compute_state(const Manager *m) {
        if (!m->node.first_pass_done)
                return AGENT_STARTING;
        if (m->node.stages[STAGE_PROBE].state == STAGE_FAILED)
                return AGENT_FAILED;
        /* An unhealthy GPU (or one missing from the bus) degrades the node without failing a stage. */
        if (health_node_state(m->node.health, NULL) != GPU_HEALTH_OK)
                return AGENT_DEGRADED;
        return manager_is_ready(m) ? AGENT_READY : AGENT_DEGRADED;
}

static char *manager_runtime_path(const Manager *m, const char *name) {
        _cleanup_free_ char *dir = path_join(m->node.config->paths.run, "gpu-node-agent");
        return dir ? path_join(dir, name) : NULL;
}

/* Readiness files for other units (ConditionPathExists=, shell scripts): "<stage>-ready" per stage
 * that succeeded and "ready" when all did. Best effort: a read-only /run must not fail a stage. */
static void manager_update_ready_file(const Manager *m, const char *name, bool ready) {
        _cleanup_free_ char *p = manager_runtime_path(m, name);
        int r;

        if (!p)
                return;
        if (!ready) {
                if (unlink(p) < 0 && errno != ENOENT)
                        log_warning_errno(errno, "Failed to remove %s: %m", p);
                return;
        }
        if (access(p, F_OK) == 0)
                return;
        _cleanup_free_ char *dir = path_join(m->node.config->paths.run, "gpu-node-agent");
        r = dir ? mkdir_p(dir, 0755) : -ENOMEM;
        if (r >= 0)
                r = write_file_atomic(p, NULL, "", 0, 0644);
        if (r < 0)
                log_warning_errno(r, "Failed to write readiness file %s: %s", p, strerror(-r));
}

/* /run/gpu-node-agent/state: one KEY=value per line, for scripts that cannot speak D-Bus. */
static void manager_write_state_file(const Manager *m) {
        _cleanup_free_ char *p = manager_runtime_path(m, "state"), *text = NULL;
        _cleanup_strv_free_ char **l = NULL;
        int r = 0;

        if (!p)
                return;
        r = strv_extendf(&l, "STATE=%s", agent_state_to_string(m->node.state));
        if (r >= 0)
                r = strv_extendf(&l, "READY=%s", manager_is_ready(m) ? "yes" : "no");
        if (r >= 0)
                r = strv_extendf(&l, "GPU_COUNT=%zu", m->node.inventory ? m->node.inventory->n_gpus : 0);
        for (int i = 0; r >= 0 && i < _STAGE_MAX; i++)
                r = strv_extendf(&l, "STAGE_%s=%s", stage_to_string(i), stage_state_to_string(m->node.stages[i].state));
        if (r >= 0)
                r = strv_extend(&l, "");
        if (r < 0 || !(text = strv_join(l, "\n")))
                return (void) log_oom();

        _cleanup_free_ char *old = NULL;
        if (read_full_file(p, 1 << 16, &old, NULL) >= 0 && streq(old, text))
                return;
        _cleanup_free_ char *dir = path_join(m->node.config->paths.run, "gpu-node-agent");
        r = dir ? mkdir_p(dir, 0755) : -ENOMEM;
        if (r >= 0)
                r = write_file_atomic(p, NULL, text, strlen(text), 0644);
        if (r < 0)
                log_warning_errno(r, "Failed to write %s: %s", p, strerror(-r));
}

static void manager_update_status(const Manager *m) {
        const StageResult *failed = NULL;
        StageId failed_id = _STAGE_INVALID;

        if (m->node.current_stage >= 0) {
                (void) sd_notifyf(false, "STATUS=Running stage %s (%d/%d).", stage_to_string(m->node.current_stage),
                                  (int) m->node.current_stage + 1, (int) _STAGE_MAX);
                return;
        }
        /* Between two stages of a pass the outcome is not known yet: keep "Running stage …" rather
         * than flapping to the previous pass's result. */
        if (m->pass_active)
                return;
        for (int i = 0; i < _STAGE_MAX && !failed; i++)
                if (m->node.stages[i].state == STAGE_FAILED) {
                        failed = &m->node.stages[i];
                        failed_id = (StageId) i;
                }
        size_t n = m->node.inventory ? m->node.inventory->n_gpus : 0;
        if (failed)
                (void) sd_notifyf(false, "STATUS=%s: stage %s failed: %s", m->node.state == AGENT_FAILED ? "Failed" : "Degraded",
                                  stage_to_string(failed_id), strna(failed->message));
        else if (manager_is_ready(m) && m->node.state == AGENT_READY)
                (void) sd_notifyf(false, "STATUS=Ready: %zu GPU%s.", n, n == 1 ? "" : "s");
        else if (m->node.first_pass_done) {
                /* Degraded without a failed stage: the driver held out of the kernel, or a GPU unhealthy. */
                const char *why = NULL;
                if (manager_driver_held(m))
                        why = m->node.stages[STAGE_DRIVER].message;
                else
                        (void) health_node_state(m->node.health, &why);
                (void) sd_notifyf(false, "STATUS=Degraded: %s", strna(why));
        } else
                (void) sd_notify(false, "STATUS=Starting.");
}

void manager_set_stage(Manager *m, StageId id, StageState state, int error, const char *message) {
        StageResult *r = &m->node.stages[id];
        StageState old = r->state;
        bool changed = old != state || !streq_ptr(r->message, message);
        uint64_t now = now_realtime();

        assert(id >= 0 && id < _STAGE_MAX);

        if (state == STAGE_RUNNING) {
                r->started_usec = now;
                r->finished_usec = 0;
                m->node.current_stage = id;
        } else {
                if (stage_state_is_final(state))
                        r->finished_usec = now;
                if (m->node.current_stage == id)
                        m->node.current_stage = _STAGE_INVALID;
        }
        if (state == STAGE_FAILED)
                r->failures++;
        else if (stage_state_is_success(state))
                r->failures = 0;
        r->state = state;
        r->error = error < 0 ? -error : error;
        if (!streq_ptr(r->message, message)) {
                free(r->message);
                r->message = message ? strdup(message) : NULL;
        }

        /* Routine re-runs (running, then the same result again) stay at debug level; only a
         * change of outcome is worth a line at info or above. */
        int level = state == STAGE_FAILED ? LOG_ERR : LOG_INFO;
        if (state == STAGE_RUNNING || !changed)
                level = LOG_DEBUG;
        if (log_get_max_level() >= level) {
                _cleanup_free_ char *f1 = strprintf("GPU_NODE_AGENT_STAGE=%s", stage_to_string(id)),
                                    *f2 = strprintf("GPU_NODE_AGENT_STAGE_STATE=%s", stage_state_to_string(state)),
                                    *f3 = strprintf("ERRNO=%d", r->error);
                if (f1 && f2 && f3) {
                        const char *fields[] = { f1, f2, f3, NULL };
                        log_struct(level, fields, "Stage %s: %s → %s%s%s", stage_to_string(id),
                                   stage_state_to_string(old), stage_state_to_string(state),
                                   message ? ": " : "", message ?: "");
                }
        }

        manager_update_status(m);
        if (stage_state_is_final(state) || state == STAGE_PENDING) {
                _cleanup_free_ char *name = stage_ready_file_name(id);
                if (name)
                        manager_update_ready_file(m, name, stage_state_is_success(state));
        }
        manager_mark_dirty(m, NULL, AGENT_MANAGER_INTERFACE, "Stage");
        if (changed || stage_state_is_final(state))
                manager_mark_dirty(m, NULL, AGENT_MANAGER_INTERFACE, "Stages");
        if (old != state)
                manager_stage_changed(m, id);

        /* The next piece of work is scheduled from an event source, never called from here. */
        if (m->pass_active && state != STAGE_RUNNING && m->stage_source)
                (void) sd_event_source_set_enabled(m->stage_source, SD_EVENT_ONESHOT);
}

static int on_retry(sd_event_source *s, uint64_t usec, void *userdata) {
        manager_request_pass(userdata, "retry of failed stages");
        return 0;
}

static void manager_schedule_retry(Manager *m) {
        uint64_t delay = m->node.config->engine.retry_min_usec;
        bool failed = false;
        int r;

        for (int i = 0; i < _STAGE_MAX; i++)
                failed = failed || m->node.stages[i].state == STAGE_FAILED;
        if (!failed) {
                m->retry_attempt = 0;
                if (m->retry_timer)
                        (void) sd_event_source_set_enabled(m->retry_timer, SD_EVENT_OFF);
                return;
        }

        for (unsigned i = 0; i < m->retry_attempt && delay < m->node.config->engine.retry_max_usec; i++)
                delay *= 2;
        if (delay > m->node.config->engine.retry_max_usec)
                delay = m->node.config->engine.retry_max_usec;
        m->retry_attempt++;

        r = event_reset_time_relative(m->node.event, &m->retry_timer, CLOCK_MONOTONIC, delay, 0, on_retry, m,
                                      "stage-retry");
        if (r < 0)
                log_warning_errno(r, "Failed to arm the retry timer: %m");
        else
                log_info("Retrying failed stages in %.1fs (attempt %u).", (double) delay / USEC_PER_SEC,
                         m->retry_attempt);
}

static void manager_finish_pass(Manager *m) {
        AgentState old = m->node.state;
        bool first = !m->node.first_pass_done;

        m->pass_active = false;
        m->node.first_pass_done = true;
        m->node.n_passes++;
        (void) sd_event_now(m->node.event, CLOCK_MONOTONIC, &m->last_pass_end_usec);
        m->node.state = manager_compute_state(m);

        manager_update_ready_file(m, "ready", manager_is_ready(m));
        manager_write_state_file(m);
        manager_update_status(m);
        if (old != m->node.state) {
                log_info("Node state: %s → %s.", agent_state_to_string(old), agent_state_to_string(m->node.state));
                manager_mark_dirty(m, NULL, AGENT_MANAGER_INTERFACE, "State");
        }
        manager_mark_dirty(m, NULL, AGENT_MANAGER_INTERFACE, "Ready");
        manager_mark_dirty(m, NULL, AGENT_MANAGER_INTERFACE, "Stage");

        /* READY=1 after the first full pass whatever its outcome: a broken GPU must never hang
         * boot. Units that need working GPUs gate on `gpunodectl wait-ready`. */
        if (first)
                (void) sd_notify(false, "READY=1");

        if (m->options.oneshot) {
                m->exit_code = manager_is_ready(m) ? 0 : 1;
                (void) sd_event_exit(m->node.event, m->exit_code);
                return;
        }

        manager_schedule_retry(m);
        health_pass_done(m->node.health);
        metrics_update(&m->node);
        if (m->pass_again) {
                m->pass_again = m->pass_again_coalesced = false;
                manager_request_pass(m, "queued request");
        } else if (m->pass_again_coalesced) {
                m->pass_again_coalesced = false;
                manager_request_pass_coalesced(m, "queued Reconcile()");
        }
}

static bool manager_stage_blocked(Manager *m, const StageDescriptor *d, char **ret_message) {
        for (int i = 0; i < _STAGE_MAX; i++) {
                if (!(d->depends & (1u << i)) || stage_state_is_success(m->node.stages[i].state))
                        continue;
                *ret_message = strprintf("waiting for stage %s (%s)", stage_to_string(i),
                                         stage_state_to_string(m->node.stages[i].state));
                return true;
        }
        return false;
}

static int on_stage(sd_event_source *s, void *userdata) {
        Manager *m = userdata;
        StageId id = m->next_stage;
        _cleanup_free_ char *message = NULL;
        const StageDescriptor *d;
        int r;

        if (id < 0 || id >= _STAGE_MAX) {
                manager_finish_pass(m);
                return 0;
        }
        d = stage_descriptor(id);
        m->next_stage = id + 1;

        if (manager_stage_blocked(m, d, &message)) {
                manager_set_stage(m, id, STAGE_PENDING, 0, message);
                return 0;
        }

        manager_set_stage(m, id, STAGE_RUNNING, 0, NULL);
        r = d->run(&m->node, &message);
        if (r == STAGE_RUNNING)
                return 0; /* it finishes from its own event source with node_stage_complete() */
        manager_stage_complete(m, id, r, message);
        return 0;
}

void manager_stage_complete(Manager *m, StageId id, int r, const char *message) {
        if (r < 0)
                manager_set_stage(m, id, STAGE_FAILED, r, message ?: strerror(-r));
        else
                manager_set_stage(m, id, r == STAGE_SKIPPED ? STAGE_SKIPPED : STAGE_DONE, 0, message);
}

void manager_stage_progress(Manager *m, StageId id, const char *text) {
        StageResult *r = &m->node.stages[id];

        if (r->state != STAGE_RUNNING || streq_ptr(r->message, text))
                return;
        free(r->message);
        r->message = text ? strdup(text) : NULL;
        (void) sd_notifyf(false, "STATUS=Running stage %s: %s", stage_to_string(id), strna(text));
        /* Before READY=1, a stage that still reports progress (a DKMS build ticks every 10 s) pushes
         * the unit's start timeout (90 s by default) out: without this, systemd kills the daemon in
         * the middle of any build longer than that, restarts it, and the build starts over, forever.
         * A stage that hangs silently still hits the timeout; the build itself is bounded by
         * driver.dkms.timeout. */
        if (!m->node.first_pass_done)
                (void) sd_notifyf(false, "EXTEND_TIMEOUT_USEC=%" PRIu64, STAGE_PROGRESS_EXTEND_USEC);
        manager_mark_dirty(m, NULL, AGENT_MANAGER_INTERFACE, "Stages");
}

static void manager_start_pass(Manager *m, const char *reason);

static int on_coalesced(sd_event_source *s, uint64_t usec, void *userdata) {
        manager_start_pass(userdata, "coalesced requests");
        return 0;
}

void manager_request_pass(Manager *m, const char *reason) {
        if (m->pass_active) {
                log_debug("Pass requested (%s) while one runs: queued.", reason);
                m->pass_again = true;
                return;
        }
        manager_start_pass(m, reason);
}

void manager_request_pass_coalesced(Manager *m, const char *reason) {
        uint64_t now = 0, at;
        int enabled = 0, r;

        if (m->pass_active) {
                /* Queued too, but it does not start at once after this pass: a client that keeps
                 * calling would otherwise keep the stages running back to back. */
                log_debug("Pass requested (%s) while one runs: queued.", reason);
                m->pass_again_coalesced = true;
                return;
        }
        if (m->coalesce_timer && sd_event_source_get_enabled(m->coalesce_timer, &enabled) >= 0 &&
            enabled != SD_EVENT_OFF) {
                log_debug("Pass requested (%s): joins the one about to start.", reason);
                return;
        }
        /* Right after a pass: what it would find is what that one found. Wait out the interval, and let
         * everything asked for meanwhile share the one pass. */
        (void) sd_event_now(m->node.event, CLOCK_MONOTONIC, &now);
        at = m->last_pass_end_usec + MANAGER_PASS_MIN_INTERVAL_USEC;
        if (m->node.first_pass_done && now < at) {
                log_debug("Pass requested (%s) %" PRIu64 " ms after the last one: starts in %" PRIu64 " ms.",
                          reason, (now - m->last_pass_end_usec) / USEC_PER_MSEC, (at - now) / USEC_PER_MSEC);
                r = event_reset_time(m->node.event, &m->coalesce_timer, CLOCK_MONOTONIC, at, 0, on_coalesced, m,
                                     "pass-coalesce");
                if (r >= 0)
                        return;
                log_warning_errno(r, "Failed to arm the pass coalescing timer, starting the pass now: %m");
        }
        manager_start_pass(m, reason);
}

static void manager_start_pass(Manager *m, const char *reason) {
        int r;

        if (m->coalesce_timer)
                (void) sd_event_source_set_enabled(m->coalesce_timer, SD_EVENT_OFF);
        if (m->pass_active) {
                m->pass_again = true;
                return;
        }
        log_debug("Starting a pass over all stages (%s).", reason);

        if (!m->stage_source) {
                r = sd_event_add_defer(m->node.event, &m->stage_source, on_stage, m);
                if (r < 0) {
                        log_error_errno(r, "Failed to schedule the stages: %m");
                        return;
                }
                (void) sd_event_source_set_description(m->stage_source, "manager-stage");
        }
        if (m->retry_timer)
                (void) sd_event_source_set_enabled(m->retry_timer, SD_EVENT_OFF);
        m->pass_active = true;
        m->next_stage = 0;
        (void) sd_event_source_set_enabled(m->stage_source, SD_EVENT_ONESHOT);
}
