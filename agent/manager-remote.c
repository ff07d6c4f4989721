/* SPDX-License-Identifier: MIT */
/* Owns the Manager's side of the remote configuration source (config.remote): which document takes
 * part in a configuration load (the last good one, kept in the state directory), when to fetch, and
 * what a fetch result means — a changed, valid document is saved and reloaded through the same path as
 * Reload()/SIGHUP; 304, a server error, a timeout, a TLS failure or an invalid document keep what the
 * node has. The HTTPS mechanics are in config-remote.c. */
#include <sys/socket.h>
#include <systemd/sd-daemon.h>

#include "config-remote.h"
#include "event-util.h"
#include "fileio.h"
#include "label.h"
#include "log.h"
#include "manager.h"

static int remote_expand_url(const Config *c, char **ret) {
        _cleanup_free_ char *machine_id = NULL, *product = NULL, *id_path = path_join(c->paths.etc, "machine-id"),
                            *bad = NULL;
        char hostname[256] = {};

        if (!id_path)
                return -ENOMEM;
        (void) read_one_line_file(id_path, &machine_id);
        (void) label_read_machine(c->paths.sys, &product);
        if (gethostname(hostname, sizeof(hostname) - 1) < 0)
                hostname[0] = 0;
        int r = config_remote_expand_url(c->remote.url, hostname[0] ? hostname : NULL,
                                         isempty(machine_id) ? NULL : machine_id, product, ret, &bad);
        if (r == -EINVAL)
                log_error("config.remote.url: unknown placeholder %s in %s; the placeholders are {hostname}, "
                          "{machine-id} and {product}. Not fetching the remote configuration.",
                          strna(bad), c->remote.url);
        return r;
}

/* The last good document for url, read from the state directory once. */
static ConfigRemoteCache *remote_cache(Manager *m, const Config *local, const char *url) {
        if (!m->remote_cache) {
                ConfigRemoteCache *c = calloc(1, sizeof(*c));
                if (!c)
                        return NULL;
                int r = config_remote_cache_load(local->paths.state, c);
                if (r < 0) {
                        if (r != -ENOENT)
                                log_warning_errno(r, "Cannot read the last known good remote configuration in %s: %m",
                                                  local->paths.state);
                        free(c);
                        return NULL;
                }
                m->remote_cache = c;
        }
        if (m->remote_cache->url && !streq(m->remote_cache->url, url)) {
                log_notice("The last known good remote configuration came from %s, not %s: not using it.",
                           m->remote_cache->url, url);
                return NULL;
        }
        return m->remote_cache;
}

static int load_with(Manager *m, const char *url, const char *data, size_t size, Config **ret, char **ret_error) {
        ConfigLoadOptions o = m->options.config;

        o.remote_name = url;
        o.remote_data = data;
        o.remote_size = size;
        return config_load(&o, ret, ret_error);
}

int manager_config_load(Manager *m, Config **ret, char **ret_error) {
        _cleanup_free_ char *url = NULL, *error = NULL;
        ConfigLoadOptions o = m->options.config;
        Config *local = NULL, *c = NULL;
        int r;

        /* A first look at the local files, for config.remote and the state directory; the checks
         * across keys wait for the merged result. */
        o.partial = true;
        r = config_load(&o, &local, ret_error);
        if (r < 0)
                return r;
        const ConfigRemoteCache *cache = NULL;
        if (!isempty(local->remote.url) && remote_expand_url(local, &url) >= 0)
                cache = remote_cache(m, local, url);
        config_free(local);
        if (cache) {
                r = load_with(m, url, cache->data, cache->size, &c, &error);
                if (r >= 0) {
                        *ret = c;
                        return 0;
                }
                /* The local files changed under it, or this agent no longer takes a key it has. */
                log_warning("The last known good remote configuration does not load with the local files, using "
                            "the local files alone: %s", error);
        }
        return config_load(&m->options.config, ret, ret_error);
}

static int on_remote_timer(sd_event_source *s, uint64_t usec, void *userdata);

static void remote_schedule(Manager *m, uint64_t delay_usec) {
        int r;

        r = event_reset_time_relative(m->node.event, &m->remote_timer, CLOCK_MONOTONIC, delay_usec, 0, on_remote_timer, m,
                                      "remote-config");
        if (r < 0)
                log_warning_errno(r, "Cannot arm the remote configuration timer, not fetching again: %m");
}

static void remote_failed(Manager *m, const char *why) {
        log_warning("Cannot fetch the remote configuration from %s: %s; keeping %s.", m->remote_url, why,
                    m->remote_cache ? "the last known good copy" : "the local configuration");
}

/* The server serves a good document again (the same as our copy, or 304): its old error is history. */
static void remote_error_clear(Manager *m) {
        if (!m->config_error || !m->config_error_remote)
                return;
        m->config_error = mfree(m->config_error);
        m->config_error_remote = false;
        manager_mark_dirty(m, NULL, AGENT_MANAGER_INTERFACE, "ConfigError");
}

static void on_fetched(ConfigRemoteFetcher *f, const ConfigRemoteResult *res, void *userdata) {
        Manager *m = userdata;
        _cleanup_free_ char *error = NULL;
        char why[64];
        int r;

        if (m->node.config->remote.interval_usec > 0)
                remote_schedule(m, m->node.config->remote.interval_usec);

        if (res->error < 0) {
                remote_failed(m, res->error_text);
                return;
        }
        if (res->status == 304) {
                log_debug("Remote configuration %s not modified.", m->remote_url);
                remote_error_clear(m);
                return;
        }
        if (res->status != 200) {
                snprintf(why, sizeof(why), "the server answered HTTP %ld", res->status);
                remote_failed(m, why);
                return;
        }

        ConfigRemoteCache *old = m->remote_cache;
        bool same = old && streq_ptr(old->url, m->remote_url) && old->size == res->body_size &&
                    memcmp(old->data, res->body, res->body_size) == 0;
        if (!same) {
                Config *c = NULL;
                r = load_with(m, m->remote_url, res->body, res->body_size, &c, &error);
                if (r < 0) {
                        log_error("The remote configuration is invalid, keeping %s: %s",
                                  old ? "the last known good copy" : "the local configuration", error);
                        free(m->config_error);
                        m->config_error = TAKE_PTR(error);
                        m->config_error_remote = true;
                        manager_mark_dirty(m, NULL, AGENT_MANAGER_INTERFACE, "ConfigError");
                        return;
                }
                config_free(c);
        }

        ConfigRemoteCache *n = calloc(1, sizeof(*n));
        if (!n || !(n->url = strdup(m->remote_url)) || (res->etag && !(n->etag = strdup(res->etag))) ||
            (res->last_modified && !(n->last_modified = strdup(res->last_modified))) ||
            !(n->data = malloc(res->body_size + 1))) {
                if (n)
                        config_remote_cache_done(n);
                free(n);
                log_oom();
                return;
        }
        memcpy(n->data, res->body, res->body_size);
        n->data[res->body_size] = 0;
        n->size = res->body_size;
        r = config_remote_cache_save(m->node.config->paths.state, n);
        if (r < 0)
                log_warning_errno(r, "Cannot save the remote configuration in %s as the last known good copy: %m",
                                  m->node.config->paths.state);
        if (old)
                config_remote_cache_done(old);
        free(old);
        m->remote_cache = n;
        if (same) {
                remote_error_clear(m);
                return;
        }

        log_info("Remote configuration %s changed, reloading.", m->remote_url);
        m->remote_reloading = true;
        (void) manager_reload(m, NULL);
        m->remote_reloading = false;
}

static void remote_fetch_now(Manager *m) {
        const ConfigRemote *rc = &m->node.config->remote;
        const ConfigRemoteCache *cache = m->remote_cache && streq_ptr(m->remote_cache->url, m->remote_url)
                                                 ? m->remote_cache
                                                 : NULL;
        int r;

        if (config_remote_busy(m->remote_fetcher))
                config_remote_cancel(m->remote_fetcher);
        if (!m->remote_fetcher) {
                r = config_remote_fetcher_new(m->node.event, &m->remote_fetcher);
                if (r < 0) {
                        log_error_errno(r, "Cannot set up libcurl for the remote configuration: %m");
                        return;
                }
        }
        /* A unit without AF_INET/AF_INET6 in RestrictAddressFamilies= makes every fetch fail with a
         * vague "Couldn't connect"; say what to change instead. */
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0 && errno == EAFNOSUPPORT) {
                log_error("config.remote is set, but this process may not open IP sockets (the unit's "
                          "RestrictAddressFamilies=); copy /usr/share/gpu-node-agent/remote-config.conf to "
                          "/etc/systemd/system/gpu-node-agent.service.d/, set the server's address in its "
                          "IPAddressAllow= and restart the service.");
                remote_schedule(m, rc->interval_usec > 0 ? rc->interval_usec : 5 * 60 * USEC_PER_SEC);
                return;
        }
        if (fd >= 0)
                close(fd);

        ConfigRemoteRequest req = {
                .url = m->remote_url,
                .ca_file = rc->ca_file,
                .cert = rc->cert,
                .key = rc->key,
                .timeout_usec = rc->timeout_usec,
                .etag = cache && !isempty(cache->etag) ? cache->etag : NULL,
                .last_modified = cache && !isempty(cache->last_modified) ? cache->last_modified : NULL,
        };
        log_debug("Fetching the remote configuration from %s.", m->remote_url);
        r = config_remote_fetch(m->remote_fetcher, &req, on_fetched, m);
        if (r < 0) {
                log_error_errno(r, "Cannot start fetching the remote configuration from %s: %m", m->remote_url);
                remote_schedule(m, rc->interval_usec > 0 ? rc->interval_usec : 5 * 60 * USEC_PER_SEC);
        }
}

static int on_remote_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        remote_fetch_now(userdata);
        return 0;
}

void manager_remote_update(Manager *m) {
        _cleanup_free_ char *url = NULL;

        if (m->options.oneshot || isempty(m->node.config->remote.url) || remote_expand_url(m->node.config, &url) < 0) {
                manager_remote_done(m);
                return;
        }
        free(m->remote_url);
        m->remote_url = TAKE_PTR(url);
        /* A reload the document itself caused keeps the schedule; any other (the admin's, at start-up)
         * fetches now, so a changed URL or certificate takes effect at once. */
        if (m->remote_reloading)
                return;
        if (m->remote_timer)
                (void) sd_event_source_set_enabled(m->remote_timer, SD_EVENT_OFF);
        remote_fetch_now(m);
}

void manager_remote_done(Manager *m) {
        m->remote_fetcher = config_remote_fetcher_free(m->remote_fetcher);
        m->remote_timer = sd_event_source_disable_unref(m->remote_timer);
        m->remote_url = mfree(m->remote_url);
        if (m->remote_cache) {
                config_remote_cache_done(m->remote_cache);
                m->remote_cache = mfree(m->remote_cache);
        }
}
