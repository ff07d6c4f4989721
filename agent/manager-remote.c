/* SPDX-License-Identifier: MIT */
/* Owns the Manager's side of the remote configuration source (config.remote): which document takes
 * part in a configuration load (the last good one, kept in the state directory), when to fetch, and
 * what a fetch result means — a changed, valid document is saved and reloaded through the same path as
 * Reload()/SIGHUP; 304, a server error, a timeout, a TLS failure or an invalid document keep what the
 * node has. With config.remote.signing-key a changed document is taken only with a detached signature
 * that verifies (fetched right after it) and a serial no lower than the highest one taken before; the
 * last good copy is checked again at every load. The HTTPS mechanics are in config-remote.c, the
 * signature check in config-signature.c. */
#include <sys/socket.h>
#include <systemd/sd-daemon.h>

#include <inttypes.h>

#include "config-remote.h"
#include "config-signature.h"
#include "event-util.h"
#include "fileio.h"
#include "label.h"
#include "log.h"
#include "manager.h"
#include "strv.h"

static int remote_expand(const Config *c, const char *key, const char *template, char **ret) {
        _cleanup_free_ char *machine_id = NULL, *product = NULL, *id_path = path_join(c->paths.etc, "machine-id"),
                            *bad = NULL;
        char hostname[256] = {};

        if (!id_path)
                return -ENOMEM;
        (void) read_one_line_file(id_path, &machine_id);
        (void) label_read_machine(c->paths.sys, &product);
        if (gethostname(hostname, sizeof(hostname) - 1) < 0)
                hostname[0] = 0;
        int r = config_remote_expand_url(template, hostname[0] ? hostname : NULL,
                                         isempty(machine_id) ? NULL : machine_id, product, ret, &bad);
        if (r == -EINVAL)
                log_error("%s: unknown placeholder %s in %s; the placeholders are {hostname}, "
                          "{machine-id} and {product}. Not fetching the remote configuration.",
                          key, strna(bad), template);
        return r;
}

static int remote_expand_url(const Config *c, char **ret) {
        return remote_expand(c, "config.remote.url", c->remote.url, ret);
}

/* Where the signature of the document at url is, NULL (0) when documents need none. */
static int remote_expand_sig_url(const Config *c, const char *url, char **ret) {
        *ret = NULL;
        if (isempty(c->remote.signing_key))
                return 0;
        if (!isempty(c->remote.signature_url))
                return remote_expand(c, "config.remote.signature-url", c->remote.signature_url, ret);
        return (*ret = strprintf("%s.sig", url)) ? 0 : -ENOMEM;
}

static void remote_cache_drop(Manager *m) {
        if (m->remote_cache) {
                config_remote_cache_done(m->remote_cache);
                m->remote_cache = mfree(m->remote_cache);
        }
}

/* With a signing key the copy must verify with it (the key may have changed since, or signing been
 * turned on after an unsigned copy was saved). */
static int remote_cache_verify(const Config *local, const ConfigRemoteCache *c) {
        _cleanup_free_ char *msg = NULL;

        if (isempty(local->remote.signing_key))
                return 0;
        if (!c->sig) {
                log_warning("The last known good remote configuration is not signed, and config.remote.signing-key "
                            "is set: not using it until the server serves a signed document.");
                return -EBADMSG;
        }
        int r = config_signature_verify(local->remote.signing_key, c->data, c->size, c->sig, c->sig_size, &msg);
        if (r < 0)
                log_warning("Not using the last known good remote configuration: %s.", msg ?: strerror(-r));
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
        if (cache && remote_cache_verify(local, cache) < 0) {
                remote_cache_drop(m);
                cache = NULL;
        }
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

/* The document is not taken: the node keeps what it has, and ConfigError says why. */
static void remote_refuse(Manager *m, const char *what, char *error) {
        if (!error) {
                log_oom();
                return;
        }
        log_error("The remote configuration is %s, keeping %s: %s", what,
                  m->remote_cache ? "the last known good copy" : "the local configuration", error);
        free(m->config_error);
        m->config_error = error;
        m->config_error_remote = true;
        manager_mark_dirty(m, NULL, AGENT_MANAGER_INTERFACE, "ConfigError");
}

static ConfigRemoteCache *cache_from_result(const char *url, const ConfigRemoteResult *res) {
        ConfigRemoteCache *n = calloc(1, sizeof(*n));

        if (!n || !(n->url = strdup(url)) || (res->etag && !(n->etag = strdup(res->etag))) ||
            (res->last_modified && !(n->last_modified = strdup(res->last_modified))) ||
            !(n->data = malloc(res->body_size + 1))) {
                if (n)
                        config_remote_cache_done(n);
                free(n);
                return NULL;
        }
        memcpy(n->data, res->body, res->body_size);
        n->data[res->body_size] = 0;
        n->size = res->body_size;
        return n;
}

/* A signed document: its signature verifies with config.remote.signing-key and its serial is not below
 * the highest one taken from this URL, so a document the server (or whoever stands in for it) served
 * before cannot be served again to turn the node back. */
static int remote_verify(Manager *m, const ConfigRemoteCache *n, uint64_t *ret_serial, char **ret_error) {
        const Config *c = m->node.config;
        _cleanup_free_ char *msg = NULL;
        uint64_t serial, highest;
        int r;

        r = config_signature_verify(c->remote.signing_key, n->data, n->size, n->sig, n->sig_size, &msg);
        if (r < 0) {
                *ret_error = strprintf("%s: refused, its signature %s: %s", n->url, m->remote_sig_url,
                                       msg ?: strerror(-r));
                return r;
        }
        r = config_remote_document_serial(n->url, n->data, n->size, &serial, &msg);
        if (r == -ENOENT) {
                *ret_error = strprintf("%s: refused, a signed document must carry its version as a top-level "
                                       "'serial: N', raised with every change (such as serial: 2026120101), "
                                       "or an older signed document could be served again", n->url);
                return -ENODATA;
        }
        if (r < 0) {
                *ret_error = msg ? TAKE_PTR(msg) : strprintf("%s: %s", n->url, strerror(-r));
                return r;
        }
        r = config_remote_serial_load(c->paths.state, n->url, &highest);
        if (r < 0) {
                *ret_error = strprintf("%s: refused, cannot read the highest serial taken so far from "
                                       "%s/remote-config.serial: %s", n->url, c->paths.state, strerror(-r));
                return r;
        }
        if (serial < highest) {
                *ret_error = strprintf("%s: refused, its serial %" PRIu64 " is older than %" PRIu64 ", the "
                                       "newest this node has taken: a document served again to turn the node "
                                       "back (a rollback) is refused. Publish the document with a serial of at "
                                       "least %" PRIu64 "; after a key rotation that started the serials over, "
                                       "remove %s/remote-config.serial on the node", n->url, serial, highest,
                                       highest, c->paths.state);
                return -ESTALE;
        }
        *ret_serial = serial;
        return 0;
}

/* Takes n (the document the server answered, valid signature if one is needed): a changed one must
 * load with the local files, then it becomes the last good copy and the configuration is reloaded. */
static void remote_accept(Manager *m, ConfigRemoteCache *n, bool same, bool is_signed, uint64_t serial) {
        _cleanup_free_ char *error = NULL;
        int r;

        m->remote_sig_retry = false;
        if (!same) {
                Config *c = NULL;
                r = load_with(m, n->url, n->data, n->size, &c, &error);
                if (r < 0) {
                        config_remote_cache_done(n);
                        free(n);
                        remote_refuse(m, "invalid", TAKE_PTR(error));
                        return;
                }
                config_free(c);
        }
        /* The serial first: a crash before the copy is saved leaves the bar where this document put it. */
        if (is_signed) {
                r = config_remote_serial_save(m->node.config->paths.state, n->url, serial);
                if (r < 0)
                        log_warning_errno(r, "Cannot save the serial of the remote configuration in %s: %m",
                                          m->node.config->paths.state);
        }
        r = config_remote_cache_save(m->node.config->paths.state, n);
        if (r < 0)
                log_warning_errno(r, "Cannot save the remote configuration in %s as the last known good copy: %m",
                                  m->node.config->paths.state);
        remote_cache_drop(m);
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

static void on_sig_fetched(ConfigRemoteFetcher *f, const ConfigRemoteResult *res, void *userdata) {
        Manager *m = userdata;
        ConfigRemoteCache *n = TAKE_PTR(m->remote_pending);
        _cleanup_free_ char *error = NULL;
        bool retried = m->remote_sig_retry;
        uint64_t serial = 0;
        int r;

        m->remote_sig_retry = false;
        if (!n)
                return;
        if (res->error < 0 || res->status != 200) {
                char why[64];
                if (res->error >= 0)
                        snprintf(why, sizeof(why), "the server answered HTTP %ld", res->status);
                remote_refuse(m, "refused",
                              strprintf("%s: refused, its signature %s cannot be fetched (%s), and "
                                        "config.remote.signing-key takes only signed documents",
                                        n->url, m->remote_sig_url, res->error < 0 ? strna(res->error_text) : why));
                config_remote_cache_done(n);
                free(n);
                return;
        }
        if (!(n->sig = malloc(res->body_size + 1))) {
                config_remote_cache_done(n);
                free(n);
                log_oom();
                return;
        }
        memcpy(n->sig, res->body, res->body_size);
        n->sig[res->body_size] = 0;
        n->sig_size = res->body_size;

        r = remote_verify(m, n, &serial, &error);
        if (r == -EBADMSG && !retried) {
                /* The server may be between writing the document and its signature: both again, soon. */
                log_notice("%s; fetching the document and its signature again in 2s.", error);
                m->remote_sig_retry = true;
                remote_schedule(m, 2 * USEC_PER_SEC);
                config_remote_cache_done(n);
                free(n);
                return;
        }
        if (r < 0) {
                config_remote_cache_done(n);
                free(n);
                remote_refuse(m, "refused", TAKE_PTR(error));
                return;
        }
        remote_accept(m, n, false, true, serial);
}

static void on_fetched(ConfigRemoteFetcher *f, const ConfigRemoteResult *res, void *userdata) {
        Manager *m = userdata;
        char why[64];
        int r;

        if (m->node.config->remote.interval_usec > 0)
                remote_schedule(m, m->node.config->remote.interval_usec);

        if (res->error < 0) {
                m->remote_sig_retry = false;
                remote_failed(m, res->error_text);
                return;
        }
        if (res->status == 304) {
                /* The copy we have; with a signing key, one that verified with it at the last load. */
                m->remote_sig_retry = false;
                log_debug("Remote configuration %s not modified.", m->remote_url);
                remote_error_clear(m);
                return;
        }
        if (res->status != 200) {
                m->remote_sig_retry = false;
                snprintf(why, sizeof(why), "the server answered HTTP %ld", res->status);
                remote_failed(m, why);
                return;
        }

        ConfigRemoteCache *old = m->remote_cache;
        bool same = old && streq_ptr(old->url, m->remote_url) && old->size == res->body_size &&
                    memcmp(old->data, res->body, res->body_size) == 0;
        ConfigRemoteCache *n = cache_from_result(m->remote_url, res);
        if (!n) {
                log_oom();
                return;
        }
        if (same && old->sig) {
                /* The same document keeps the signature it was taken with. */
                if (!(n->sig = malloc(old->sig_size + 1))) {
                        config_remote_cache_done(n);
                        free(n);
                        log_oom();
                        return;
                }
                memcpy(n->sig, old->sig, old->sig_size + 1);
                n->sig_size = old->sig_size;
        }
        if (same || !m->remote_sig_url) {
                remote_accept(m, n, same, false, 0);
                return;
        }

        /* A changed document and a signing key: its signature next. res points into f, whose next
         * fetch frees it; n is a copy. */
        if (m->remote_pending) {
                config_remote_cache_done(m->remote_pending);
                free(m->remote_pending);
        }
        m->remote_pending = n;
        const ConfigRemote *rc = &m->node.config->remote;
        ConfigRemoteRequest req = {
                .url = m->remote_sig_url,
                .ca_file = rc->ca_file,
                .cert = rc->cert,
                .key = rc->key,
                .timeout_usec = rc->timeout_usec,
        };
        log_debug("Fetching the signature of the remote configuration from %s.", m->remote_sig_url);
        r = config_remote_fetch(f, &req, on_sig_fetched, m);
        if (r < 0) {
                m->remote_pending = NULL;
                config_remote_cache_done(n);
                free(n);
                remote_refuse(m, "refused", strprintf("%s: refused, cannot start fetching its signature %s: %s",
                                                      m->remote_url, m->remote_sig_url, strerror(-r)));
        }
}

static void remote_fetch_now(Manager *m) {
        const ConfigRemote *rc = &m->node.config->remote;
        const ConfigRemoteCache *cache = m->remote_cache && streq_ptr(m->remote_cache->url, m->remote_url)
                                                 ? m->remote_cache
                                                 : NULL;
        int r;

        if (config_remote_busy(m->remote_fetcher))
                config_remote_cancel(m->remote_fetcher);
        if (m->remote_pending) {
                config_remote_cache_done(m->remote_pending);
                m->remote_pending = mfree(m->remote_pending);
        }
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
        Manager *m = userdata;

        /* A round still running (a slow server, or a document's signature after it) is not cut short:
         * the next one starts an interval after it. It ends within config.remote.timeout per fetch. */
        if (config_remote_busy(m->remote_fetcher)) {
                log_debug("The last fetch of the remote configuration is still running, not starting another.");
                remote_schedule(m, m->node.config->remote.interval_usec > 0 ? m->node.config->remote.interval_usec
                                                                            : 5 * 60 * USEC_PER_SEC);
                return 0;
        }
        remote_fetch_now(m);
        return 0;
}

void manager_remote_update(Manager *m) {
        _cleanup_free_ char *url = NULL;

        if (m->options.oneshot || isempty(m->node.config->remote.url) || remote_expand_url(m->node.config, &url) < 0) {
                manager_remote_done(m);
                return;
        }
        _cleanup_free_ char *sig_url = NULL;
        if (remote_expand_sig_url(m->node.config, url, &sig_url) < 0) {
                manager_remote_done(m);
                return;
        }
        free(m->remote_url);
        m->remote_url = TAKE_PTR(url);
        free(m->remote_sig_url);
        m->remote_sig_url = TAKE_PTR(sig_url);
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
        m->remote_sig_url = mfree(m->remote_sig_url);
        m->remote_sig_retry = false;
        remote_cache_drop(m);
        if (m->remote_pending) {
                config_remote_cache_done(m->remote_pending);
                m->remote_pending = mfree(m->remote_pending);
        }
}
