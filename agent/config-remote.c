/* SPDX-License-Identifier: MIT */
/* Owns the remote configuration source's mechanics (see config-remote.h): libcurl's multi interface
 * driven from sd-event, with CURLMOPT_SOCKETFUNCTION mapping curl's sockets to io sources and
 * CURLMOPT_TIMERFUNCTION to one timer source, so a slow or silent server never blocks the loop; the
 * URL template; and the last-known-good copy. */
#include <ctype.h>
#include <inttypes.h>
#include <curl/curl.h>
#include <dlfcn.h>
#include <strings.h>
#include <sys/epoll.h>
#include <time.h>

#include "build-config.h"
#include "config-remote.h"
#include "event-util.h"
#include "fileio.h"
#include "log.h"
#include "strv.h"

/* libcurl is dlopen'd on first use, not linked: it and its TLS, Kerberos, LDAP, SSH and HTTP/2 libraries
 * (two dozen shared objects, ~4 MiB resident, their relocations and constructors) would otherwise be
 * loaded by every start, --oneshot included, although only the remote configuration (config.remote.url)
 * and the Kubernetes node watch (mig.selected-from: node-label) use it. Loaded once, never unloaded
 * (curl_global_init's state lives in it). */
#define LIBCURL_SONAME "libcurl.so.4"
static typeof(curl_easy_cleanup) *sym_curl_easy_cleanup;
static typeof(curl_easy_getinfo) *sym_curl_easy_getinfo;
static typeof(curl_easy_init) *sym_curl_easy_init;
static typeof(curl_easy_setopt) *sym_curl_easy_setopt;
static typeof(curl_easy_strerror) *sym_curl_easy_strerror;
static typeof(curl_global_cleanup) *sym_curl_global_cleanup;
static typeof(curl_global_init) *sym_curl_global_init;
static typeof(curl_multi_add_handle) *sym_curl_multi_add_handle;
static typeof(curl_multi_assign) *sym_curl_multi_assign;
static typeof(curl_multi_cleanup) *sym_curl_multi_cleanup;
static typeof(curl_multi_info_read) *sym_curl_multi_info_read;
static typeof(curl_multi_init) *sym_curl_multi_init;
static typeof(curl_multi_remove_handle) *sym_curl_multi_remove_handle;
static typeof(curl_multi_setopt) *sym_curl_multi_setopt;
static typeof(curl_multi_socket_action) *sym_curl_multi_socket_action;
static typeof(curl_slist_append) *sym_curl_slist_append;
static typeof(curl_slist_free_all) *sym_curl_slist_free_all;

static int curl_dlopen(void) {
        static void *dl = NULL;

        if (dl)
                return 0;
        void *h = dlopen(LIBCURL_SONAME, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
                const char *e = dlerror();
                log_error("Cannot load %s, which the remote configuration (config.remote.url) and the Kubernetes "
                          "node watch (mig.selected-from: node-label) need: %s. Install libcurl (Debian: libcurl4, "
                          "RPM: libcurl).", LIBCURL_SONAME, e ? e : "dlopen failed");
                return -EOPNOTSUPP;
        }
#define CURL_SYM(n) { #n, (void **) &sym_##n }
        static const struct {
                const char *name;
                void **ptr;
        } syms[] = {
                CURL_SYM(curl_easy_cleanup),
                CURL_SYM(curl_easy_getinfo),
                CURL_SYM(curl_easy_init),
                CURL_SYM(curl_easy_setopt),
                CURL_SYM(curl_easy_strerror),
                CURL_SYM(curl_global_cleanup),
                CURL_SYM(curl_global_init),
                CURL_SYM(curl_multi_add_handle),
                CURL_SYM(curl_multi_assign),
                CURL_SYM(curl_multi_cleanup),
                CURL_SYM(curl_multi_info_read),
                CURL_SYM(curl_multi_init),
                CURL_SYM(curl_multi_remove_handle),
                CURL_SYM(curl_multi_setopt),
                CURL_SYM(curl_multi_socket_action),
                CURL_SYM(curl_slist_append),
                CURL_SYM(curl_slist_free_all),
        };
#undef CURL_SYM
        for (size_t i = 0; i < ELEMENTSOF(syms); i++) {
                *syms[i].ptr = dlsym(h, syms[i].name);
                if (!*syms[i].ptr) {
                        log_error("%s has no %s: not a usable libcurl (the remote configuration and the "
                                  "Kubernetes node watch need libcurl >= 7.85).", LIBCURL_SONAME, syms[i].name);
                        dlclose(h);
                        return -EOPNOTSUPP;
                }
        }
        dl = h;
        return 0;
}

static const char *strempty(const char *s) {
        return s ?: "";
}

static char *strjoin2(const char *a, const char *b) {
        char *s = NULL;
        return asprintf(&s, "%s%s", a, b) < 0 ? NULL : s;
}

struct ConfigRemoteFetcher {
        sd_event *event;
        CURLM *multi;
        CURL *easy;                  /* the transfer in flight, NULL when idle */
        sd_event_source *timer;      /* curl's timeout */
        sd_event_source **io;        /* one per socket curl watches */
        size_t n_io;
        struct curl_slist *headers;
        char *body;
        size_t size;
        bool too_large;
        char *etag, *last_modified;
        char errbuf[CURL_ERROR_SIZE];
        ConfigRemoteDone done;
        ConfigRemoteChunk on_chunk;
        void *userdata;
        int chunk_error;             /* what on_chunk returned when it aborted */
};

static void fetcher_io_forget(ConfigRemoteFetcher *f, sd_event_source *s) {
        for (size_t i = 0; i < f->n_io; i++)
                if (f->io[i] == s) {
                        f->io[i] = f->io[--f->n_io];
                        break;
                }
        sd_event_source_disable_unref(s);
}

static void fetcher_reset(ConfigRemoteFetcher *f) {
        if (f->easy) {
                /* Calls the socket function with CURL_POLL_REMOVE for the transfer's sockets. */
                sym_curl_multi_remove_handle(f->multi, f->easy);
                sym_curl_easy_cleanup(f->easy);
                f->easy = NULL;
        }
        sym_curl_slist_free_all(f->headers);
        f->headers = NULL;
        f->body = mfree(f->body);
        f->size = 0;
        f->too_large = false;
        f->chunk_error = 0;
        f->on_chunk = NULL;
        f->etag = mfree(f->etag);
        f->last_modified = mfree(f->last_modified);
        f->errbuf[0] = 0;
        if (f->timer)
                (void) sd_event_source_set_enabled(f->timer, SD_EVENT_OFF);
}

/* curl's own enum, with more values than we care about: no switch (-Wswitch-enum). */
static int errno_from_curl(CURLcode c) {
        if (c == CURLE_OPERATION_TIMEDOUT)
                return -ETIMEDOUT;
        if (c == CURLE_COULDNT_CONNECT)
                return -ECONNREFUSED;
        if (c == CURLE_COULDNT_RESOLVE_HOST)
                return -EHOSTUNREACH;
        if (c == CURLE_PEER_FAILED_VERIFICATION || c == CURLE_SSL_CONNECT_ERROR || c == CURLE_SSL_CACERT_BADFILE ||
            c == CURLE_SSL_CERTPROBLEM || c == CURLE_SSL_ISSUER_ERROR || c == CURLE_SSL_CRL_BADFILE ||
            c == CURLE_RECV_ERROR)
                return -EPROTO;
        if (c == CURLE_OUT_OF_MEMORY)
                return -ENOMEM;
        return -EIO;
}

/* Delivers finished transfers. Nothing of f is used after done(): the callback may free f. */
static void fetcher_check_done(ConfigRemoteFetcher *f) {
        CURLMsg *msg;
        int left;

        while ((msg = sym_curl_multi_info_read(f->multi, &left))) {
                if (msg->msg != CURLMSG_DONE || msg->easy_handle != f->easy)
                        continue;
                CURLcode code = msg->data.result;
                ConfigRemoteResult res = {};
                char errbuf[CURL_ERROR_SIZE];
                long status = 0;

                (void) sym_curl_easy_getinfo(f->easy, CURLINFO_RESPONSE_CODE, &status);
                if (code != CURLE_OK) {
                        res.error = f->chunk_error < 0 ? f->chunk_error
                                    : f->too_large   ? -EFBIG
                                                     : errno_from_curl(code);
                        snprintf(errbuf, sizeof(errbuf), "%s", f->too_large ? "the document is larger than 1 MiB"
                                                               : f->errbuf[0] ? f->errbuf
                                                                              : sym_curl_easy_strerror(code));
                        res.error_text = errbuf;
                } else {
                        res.status = status;
                        if (status == 200) {
                                res.body = f->body ?: "";
                                res.body_size = f->size;
                        }
                        res.etag = f->etag;
                        res.last_modified = f->last_modified;
                }
                ConfigRemoteDone done = f->done;
                void *userdata = f->userdata;
                /* The result points into f until done() returns; reset after. */
                sym_curl_multi_remove_handle(f->multi, f->easy);
                f->done = NULL;
                done(f, &res, userdata);
                return;
        }
}

static int on_io(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        ConfigRemoteFetcher *f = userdata;
        int flags = (revents & EPOLLIN ? CURL_CSELECT_IN : 0) | (revents & EPOLLOUT ? CURL_CSELECT_OUT : 0) |
                    (revents & (EPOLLERR | EPOLLHUP) ? CURL_CSELECT_ERR : 0);
        int running;

        (void) sym_curl_multi_socket_action(f->multi, fd, flags, &running);
        fetcher_check_done(f);
        return 0;
}

static int on_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        ConfigRemoteFetcher *f = userdata;
        int running;

        (void) sym_curl_multi_socket_action(f->multi, CURL_SOCKET_TIMEOUT, 0, &running);
        fetcher_check_done(f);
        return 0;
}

static int on_curl_socket(CURL *easy, curl_socket_t fd, int what, void *userp, void *socketp) {
        ConfigRemoteFetcher *f = userp;
        sd_event_source *s = socketp;

        if (what == CURL_POLL_REMOVE) {
                if (s) {
                        sym_curl_multi_assign(f->multi, fd, NULL);
                        fetcher_io_forget(f, s);
                }
                return 0;
        }
        uint32_t events = (what & CURL_POLL_IN ? EPOLLIN : 0) | (what & CURL_POLL_OUT ? EPOLLOUT : 0);
        if (s)
                return sd_event_source_set_io_events(s, events) < 0 ? -1 : 0;

        sd_event_source **io = reallocarray(f->io, f->n_io + 1, sizeof(*io));
        if (!io)
                return -1;
        f->io = io;
        if (sd_event_add_io(f->event, &s, fd, events, on_io, f) < 0)
                return -1;
        (void) sd_event_source_set_description(s, "config-remote-io");
        f->io[f->n_io++] = s;
        sym_curl_multi_assign(f->multi, fd, s);
        return 0;
}

static int on_curl_timer(CURLM *multi, long timeout_ms, void *userp) {
        ConfigRemoteFetcher *f = userp;
        uint64_t now;

        if (timeout_ms < 0)
                return f->timer ? (sd_event_source_set_enabled(f->timer, SD_EVENT_OFF) < 0 ? -1 : 0) : 0;
        if (sd_event_now(f->event, CLOCK_MONOTONIC, &now) < 0)
                return -1;
        uint64_t when = now + (uint64_t) timeout_ms * USEC_PER_MSEC;
        return event_reset_time(f->event, &f->timer, CLOCK_MONOTONIC, when, 0, on_timer, f, "remote-config-curl") < 0 ? -1 : 0;
}

static size_t on_body(char *p, size_t size, size_t n, void *userdata) {
        ConfigRemoteFetcher *f = userdata;
        size_t len = size * n;
        long status = 0;

        (void) sym_curl_easy_getinfo(f->easy, CURLINFO_RESPONSE_CODE, &status);
        if (f->on_chunk && status == 200) {
                int r = f->on_chunk(p, len, f->userdata);
                if (r < 0) {
                        f->chunk_error = r;
                        return 0;
                }
                return len;
        }

        if (f->size + len > CONFIG_REMOTE_MAX) {
                f->too_large = true;
                return 0; /* aborts the transfer */
        }
        char *b = realloc(f->body, f->size + len + 1);
        if (!b)
                return 0;
        memcpy(b + f->size, p, len);
        f->size += len;
        b[f->size] = 0;
        f->body = b;
        return len;
}

/* "ETag: \"abc\"\r\n" → "\"abc\"" when name matches; NULL otherwise. */
static char *header_value(const char *p, size_t len, const char *name) {
        size_t n = strlen(name);

        if (len <= n + 1 || strncasecmp(p, name, n) != 0 || p[n] != ':')
                return NULL;
        p += n + 1;
        len -= n + 1;
        while (len > 0 && (*p == ' ' || *p == '\t'))
                p++, len--;
        while (len > 0 && (p[len - 1] == '\r' || p[len - 1] == '\n' || p[len - 1] == ' '))
                len--;
        return strndup(p, len);
}

static size_t on_header(char *p, size_t size, size_t n, void *userdata) {
        ConfigRemoteFetcher *f = userdata;
        size_t len = size * n;
        char *v;

        /* A new status line (after "100 Continue") starts a new set of headers. */
        if (len >= 5 && strncmp(p, "HTTP/", 5) == 0) {
                f->etag = mfree(f->etag);
                f->last_modified = mfree(f->last_modified);
        } else if ((v = header_value(p, len, "ETag"))) {
                free(f->etag);
                f->etag = v;
        } else if ((v = header_value(p, len, "Last-Modified"))) {
                free(f->last_modified);
                f->last_modified = v;
        }
        return len;
}

int config_remote_fetcher_new(sd_event *e, ConfigRemoteFetcher **ret) {
        _cleanup_(config_remote_fetcher_freep) ConfigRemoteFetcher *f = NULL;
        int r;

        r = curl_dlopen();
        if (r < 0)
                return r;
        if (sym_curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
                return -EIO;
        f = calloc(1, sizeof(*f));
        if (!f) {
                sym_curl_global_cleanup();
                return -ENOMEM;
        }
        f->event = sd_event_ref(e);
        f->multi = sym_curl_multi_init();
        if (!f->multi)
                return -ENOMEM;
        if (sym_curl_multi_setopt(f->multi, CURLMOPT_SOCKETFUNCTION, on_curl_socket) != CURLM_OK ||
            sym_curl_multi_setopt(f->multi, CURLMOPT_SOCKETDATA, f) != CURLM_OK ||
            sym_curl_multi_setopt(f->multi, CURLMOPT_TIMERFUNCTION, on_curl_timer) != CURLM_OK ||
            sym_curl_multi_setopt(f->multi, CURLMOPT_TIMERDATA, f) != CURLM_OK)
                return -EIO;
        *ret = TAKE_PTR(f);
        return 0;
}

ConfigRemoteFetcher *config_remote_fetcher_free(ConfigRemoteFetcher *f) {
        if (!f)
                return NULL;
        fetcher_reset(f);
        if (f->multi)
                sym_curl_multi_cleanup(f->multi);
        for (size_t i = 0; i < f->n_io; i++)
                sd_event_source_disable_unref(f->io[i]);
        free(f->io);
        sd_event_source_disable_unref(f->timer);
        sd_event_unref(f->event);
        free(f);
        sym_curl_global_cleanup();
        return NULL;
}

bool config_remote_busy(const ConfigRemoteFetcher *f) {
        return f && f->done;
}

void config_remote_cancel(ConfigRemoteFetcher *f) {
        if (!f)
                return;
        fetcher_reset(f);
        f->done = NULL;
}

static int add_header(struct curl_slist **l, const char *name, const char *value) {
        _cleanup_free_ char *h = NULL;

        if (isempty(value))
                return 0;
        if (asprintf(&h, "%s: %s", name, value) < 0)
                return -ENOMEM;
        struct curl_slist *n = sym_curl_slist_append(*l, h);
        if (!n)
                return -ENOMEM;
        *l = n;
        return 0;
}

int config_remote_fetch(ConfigRemoteFetcher *f, const ConfigRemoteRequest *req, ConfigRemoteDone done,
                        void *userdata) {
        int r;

        assert(f && req && req->url && done);
        if (config_remote_busy(f))
                return -EBUSY;
        fetcher_reset(f);

        f->easy = sym_curl_easy_init();
        if (!f->easy)
                return -ENOMEM;
        r = add_header(&f->headers, "If-None-Match", req->etag);
        if (r >= 0)
                r = add_header(&f->headers, "If-Modified-Since", req->last_modified);
        _cleanup_free_ char *bearer = NULL;
        if (r >= 0 && req->bearer_token) {
                bearer = strjoin2("Bearer ", req->bearer_token);
                r = bearer ? add_header(&f->headers, "Authorization", bearer) : -ENOMEM;
        }
        if (r < 0) {
                fetcher_reset(f);
                return r;
        }
        long timeout_ms = req->timeout_usec == 0                       ? 0
                          : req->timeout_usec / USEC_PER_MSEC > 0 ? (long) (req->timeout_usec / USEC_PER_MSEC)
                                                                  : 1;
        struct curl_blob ca = { (void *) req->ca_pem, req->ca_pem_size, CURL_BLOB_COPY },
                         cert = { (void *) req->cert_pem, req->cert_pem_size, CURL_BLOB_COPY },
                         key = { (void *) req->key_pem, req->key_pem_size, CURL_BLOB_COPY };
        bool ok = sym_curl_easy_setopt(f->easy, CURLOPT_URL, req->url) == CURLE_OK &&
                  sym_curl_easy_setopt(f->easy, CURLOPT_PROTOCOLS_STR, "https") == CURLE_OK &&
                  sym_curl_easy_setopt(f->easy, CURLOPT_NOSIGNAL, 1L) == CURLE_OK &&
                  /* Connections are minutes apart: nothing to gain from keeping one open. */
                  sym_curl_easy_setopt(f->easy, CURLOPT_FORBID_REUSE, 1L) == CURLE_OK &&
                  sym_curl_easy_setopt(f->easy, CURLOPT_TIMEOUT_MS, timeout_ms) == CURLE_OK &&
                  sym_curl_easy_setopt(f->easy, CURLOPT_CONNECTTIMEOUT_MS, 30000L) == CURLE_OK &&
                  (ca.len == 0 || sym_curl_easy_setopt(f->easy, CURLOPT_CAINFO_BLOB, &ca) == CURLE_OK) &&
                  (cert.len == 0 || sym_curl_easy_setopt(f->easy, CURLOPT_SSLCERT_BLOB, &cert) == CURLE_OK) &&
                  (key.len == 0 || sym_curl_easy_setopt(f->easy, CURLOPT_SSLKEY_BLOB, &key) == CURLE_OK) &&
                  sym_curl_easy_setopt(f->easy, CURLOPT_ERRORBUFFER, f->errbuf) == CURLE_OK &&
                  sym_curl_easy_setopt(f->easy, CURLOPT_USERAGENT, "gpu-node-agent/" GPU_NODE_AGENT_VERSION) == CURLE_OK &&
                  sym_curl_easy_setopt(f->easy, CURLOPT_WRITEFUNCTION, on_body) == CURLE_OK &&
                  sym_curl_easy_setopt(f->easy, CURLOPT_WRITEDATA, f) == CURLE_OK &&
                  sym_curl_easy_setopt(f->easy, CURLOPT_HEADERFUNCTION, on_header) == CURLE_OK &&
                  sym_curl_easy_setopt(f->easy, CURLOPT_HEADERDATA, f) == CURLE_OK &&
                  sym_curl_easy_setopt(f->easy, CURLOPT_HTTPHEADER, f->headers) == CURLE_OK &&
                  (isempty(req->ca_file) || sym_curl_easy_setopt(f->easy, CURLOPT_CAINFO, req->ca_file) == CURLE_OK) &&
                  (isempty(req->cert) || sym_curl_easy_setopt(f->easy, CURLOPT_SSLCERT, req->cert) == CURLE_OK) &&
                  (isempty(req->key) || sym_curl_easy_setopt(f->easy, CURLOPT_SSLKEY, req->key) == CURLE_OK);
        if (!ok || sym_curl_multi_add_handle(f->multi, f->easy) != CURLM_OK) {
                fetcher_reset(f);
                return -EIO;
        }
        f->done = done;
        f->on_chunk = req->on_chunk;
        f->userdata = userdata;
        return 0;
}

static int append_encoded(char **buf, size_t *len, size_t *cap, const char *s) {
        for (const unsigned char *p = (const unsigned char *) s; *p; p++) {
                if (*len + 4 > *cap) {
                        size_t n = *cap * 2 + 64;
                        char *b = realloc(*buf, n);
                        if (!b)
                                return -ENOMEM;
                        *buf = b;
                        *cap = n;
                }
                if (isalnum(*p) || strchr("-._~", *p))
                        (*buf)[(*len)++] = (char) *p;
                else
                        *len += (size_t) snprintf(*buf + *len, 4, "%%%02X", *p);
        }
        return 0;
}

int config_remote_expand_url(const char *template, const char *hostname, const char *machine_id,
                             const char *product, char **ret, char **ret_bad) {
        static const char *const names[] = { "{hostname}", "{machine-id}", "{product}" };
        const char *values[] = { hostname ?: "unknown", machine_id ?: "unknown", product ?: "unknown" };
        _cleanup_free_ char *buf = NULL;
        size_t len = 0, cap = 0;
        int r;

        for (const char *p = template; *p;) {
                size_t i;
                if (*p == '{') {
                        for (i = 0; i < ELEMENTSOF(names); i++)
                                if (startswith(p, names[i]))
                                        break;
                        if (i >= ELEMENTSOF(names)) {
                                if (ret_bad)
                                        *ret_bad = strndup(p, strcspn(p, "}") + (strchr(p, '}') ? 1 : 0));
                                return -EINVAL;
                        }
                        r = append_encoded(&buf, &len, &cap, values[i]);
                        if (r < 0)
                                return r;
                        p += strlen(names[i]);
                        continue;
                }
                /* Everything else is copied as written. */
                if (len + 2 > cap) {
                        char *b = realloc(buf, cap * 2 + 64);
                        if (!b)
                                return -ENOMEM;
                        buf = b;
                        cap = cap * 2 + 64;
                }
                buf[len++] = *p++;
        }
        char *b = realloc(buf, len + 1);
        if (!b)
                return -ENOMEM;
        buf = b;
        buf[len] = 0;
        *ret = TAKE_PTR(buf);
        return 0;
}

void config_remote_cache_done(ConfigRemoteCache *c) {
        free(c->url);
        free(c->etag);
        free(c->last_modified);
        free(c->data);
        free(c->sig);
        *c = (ConfigRemoteCache) {};
}

int config_remote_cache_load(const char *state_dir, ConfigRemoteCache *ret) {
        _cleanup_free_ char *doc = path_join(state_dir, "remote-config.yaml"),
                            *meta = path_join(state_dir, "remote-config.meta"), *text = NULL;
        ConfigRemoteCache c = {};
        size_t size;
        int r;

        if (!doc || !meta)
                return -ENOMEM;
        r = read_full_file(doc, CONFIG_REMOTE_MAX, &c.data, &c.size);
        if (r < 0)
                return r;
        _cleanup_free_ char *sig = path_join(state_dir, "remote-config.sig");
        if (!sig) {
                config_remote_cache_done(&c);
                return -ENOMEM;
        }
        r = read_full_file(sig, CONFIG_REMOTE_MAX, &c.sig, &c.sig_size);
        if (r < 0 && r != -ENOENT) {
                config_remote_cache_done(&c);
                return r;
        }
        /* Without metadata the copy is still good, only not usable for a conditional request. */
        if (read_full_file(meta, 64 * 1024, &text, &size) >= 0)
                for (char *line = text, *next; line && *line; line = next) {
                        next = strchr(line, '\n');
                        if (next)
                                *next++ = 0;
                        char **dst = startswith(line, "url=")             ? &c.url
                                     : startswith(line, "etag=")          ? &c.etag
                                     : startswith(line, "last-modified=") ? &c.last_modified
                                                                          : NULL;
                        if (!dst || *dst)
                                continue;
                        if (!(*dst = strdup(strchr(line, '=') + 1))) {
                                config_remote_cache_done(&c);
                                return -ENOMEM;
                        }
                }
        *ret = c;
        return 0;
}

int config_remote_cache_save(const char *state_dir, const ConfigRemoteCache *c) {
        _cleanup_free_ char *doc = path_join(state_dir, "remote-config.yaml"),
                            *meta = path_join(state_dir, "remote-config.meta"), *text = NULL;
        int r;

        if (!doc || !meta)
                return -ENOMEM;
        r = mkdir_p(state_dir, 0755);
        if (r < 0)
                return r;
        /* The document first: a crash in between leaves a good document with older validators, which
         * costs one unconditional fetch and nothing else. */
        r = write_file_atomic(doc, NULL, c->data, c->size, 0600);
        if (r < 0)
                return r;
        /* A crash before the signature is replaced leaves a copy that does not verify: it is then not
         * used, and the next fetch brings both again. */
        _cleanup_free_ char *sig = path_join(state_dir, "remote-config.sig");
        if (!sig)
                return -ENOMEM;
        if (c->sig)
                r = write_file_atomic(sig, NULL, c->sig, c->sig_size, 0600);
        else
                r = unlink(sig) < 0 && errno != ENOENT ? -errno : 0;
        if (r < 0)
                return r;
        if (asprintf(&text, "url=%s\netag=%s\nlast-modified=%s\n", strempty(c->url), strempty(c->etag),
                     strempty(c->last_modified)) < 0)
                return -ENOMEM;
        return write_file_atomic(meta, NULL, text, strlen(text), 0600);
}

int config_remote_serial_load(const char *state_dir, const char *url, uint64_t *ret) {
        _cleanup_free_ char *path = path_join(state_dir, "remote-config.serial"), *text = NULL;
        const char *u = NULL, *v = NULL;
        int r;

        if (!path)
                return -ENOMEM;
        *ret = 0;
        r = read_full_file(path, 64 * 1024, &text, NULL);
        if (r == -ENOENT)
                return 0;
        if (r < 0)
                return r;
        for (char *line = text, *next; line && *line; line = next) {
                next = strchr(line, '\n');
                if (next)
                        *next++ = 0;
                if (startswith(line, "url="))
                        u = line + 4;
                else if (startswith(line, "serial="))
                        v = line + 7;
        }
        if (!u || !v || !streq(u, url))
                return 0;
        char *end;
        errno = 0;
        unsigned long long n = strtoull(v, &end, 10);
        if (!isdigit((unsigned char) v[0]) || *end || errno != 0)
                return -EBADMSG;
        *ret = n;
        return 0;
}

int config_remote_serial_save(const char *state_dir, const char *url, uint64_t serial) {
        _cleanup_free_ char *path = path_join(state_dir, "remote-config.serial"), *text = NULL;
        int r;

        if (!path)
                return -ENOMEM;
        r = mkdir_p(state_dir, 0755);
        if (r < 0)
                return r;
        if (asprintf(&text, "url=%s\nserial=%" PRIu64 "\n", url, serial) < 0)
                return -ENOMEM;
        return write_file_atomic(path, NULL, text, strlen(text), 0600);
}
