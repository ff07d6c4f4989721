/* SPDX-License-Identifier: MIT */
/* Owns the Kubernetes node watch (see kube-node.h): the kubeconfig reader, the list/watch state
 * machine over one ConfigRemoteFetcher, and the JSON of Node objects and watch events (json-c). */
#include <json-c/json.h>
#include <stdarg.h>

#include "config-remote.h"
#include "config-yaml.h"
#include "event-util.h"
#include "fileio.h"
#include "kube-node.h"
#include "strv.h"

DEFINE_CLEANUP_FUNC_NAMED(kube_json_object_putp, json_object *, json_object_put);

/* The watch asks the server to end it after this long (it is resumed at once): a connection that died
 * silently is noticed within that time. */
#define WATCH_SECONDS 300

struct KubeNode {
        sd_event *event;
        ConfigRemoteFetcher *fetcher;
        sd_event_source *retry;
        KubeNodeCallback cb;
        void *userdata;
        char *server, *node_name, *label, *token;
        char *ca, *cert, *key;            /* PEM */
        size_t ca_size, cert_size, key_size;
        char *ca_file, *cert_file, *key_file;
        uint64_t retry_min, retry_max, retry_next;
        char *resource_version;           /* last seen, NULL: list first */
        char *value;                      /* the label's value, NULL absent */
        bool have_value;
        bool watching;
        uint64_t watch_started;           /* CLOCK_MONOTONIC */
        bool gone;                        /* the watch said 410: list again */
        char *line;                       /* a watch event not complete yet */
        size_t line_size;
};

int kube_base64_decode(const char *s, char **ret, size_t *ret_size) {
        static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        _cleanup_free_ char *out = malloc(strlen(s) / 4 * 3 + 4);
        uint32_t acc = 0;
        size_t n = 0, bits = 0;

        if (!out)
                return -ENOMEM;
        for (const char *p = s; *p; p++) {
                if (strchr(" \t\r\n", *p))
                        continue;
                if (*p == '=')
                        break;
                const char *c = strchr(alphabet, *p);
                if (!c || !*c)
                        return -EINVAL;
                acc = (acc << 6) | (uint32_t) (c - alphabet);
                bits += 6;
                if (bits >= 8) {
                        bits -= 8;
                        out[n++] = (char) ((acc >> bits) & 0xff);
                }
        }
        out[n] = 0;
        *ret_size = n;
        *ret = TAKE_PTR(out);
        return 0;
}

static const Node *named(const Node *tree, const char *list, const char *name) {
        const Node *l = config_node_find(tree, list);
        for (size_t i = 0; l && l->type == NODE_SEQUENCE && i < l->n_items; i++) {
                const Node *n = config_node_find(l->items[i], "name");
                if (n && n->type == NODE_SCALAR && n->value && streq(n->value, name))
                        return l->items[i];
        }
        return NULL;
}

static const char *scalar(const Node *tree, const char *path) {
        const Node *n = tree ? config_node_find(tree, path) : NULL;
        return n && n->type == NODE_SCALAR && !n->null ? n->value : NULL;
}

/* A PEM either inline (KEY-data, base64) or a file name (KEY, relative to the kubeconfig's folder). */
static int take_pem(const Node *n, const char *key, const char *dir, char **pem, size_t *size, char **file) {
        _cleanup_free_ char *data_key = NULL;
        const char *v;

        if (asprintf(&data_key, "%s-data", key) < 0)
                return -ENOMEM;
        if ((v = scalar(n, data_key)))
                return kube_base64_decode(v, pem, size);
        if ((v = scalar(n, key))) {
                *file = v[0] == '/' ? strdup(v) : path_join(dir, v);
                return *file ? 0 : -ENOMEM;
        }
        return 0;
}

static int kubeconfig_read(KubeNode *k, const char *path, char **error) {
        _cleanup_(config_node_freep) Node *tree = NULL;
        _cleanup_free_ char *data = NULL, *dir = strdup(path);
        size_t size;
        int r;

        if (!dir)
                return -ENOMEM;
        *strrchr(dir, '/') = 0;
        r = read_full_file(path, 1024 * 1024, &data, &size);
        if (r < 0)
                return config_yaml_set_error(error, r, "%s: cannot read the kubeconfig: %s", path, strerror(-r));
        r = config_yaml_parse_file(path, data, size, error, &tree);
        if (r < 0)
                return r;
        const char *current = scalar(tree, "current-context");
        const Node *ctx = current ? named(tree, "contexts", current) : NULL;
        const char *cluster_name = scalar(ctx, "context.cluster"), *user_name = scalar(ctx, "context.user");
        const Node *cluster = cluster_name ? named(tree, "clusters", cluster_name) : NULL;
        const Node *user = user_name ? named(tree, "users", user_name) : NULL;
        const char *server = scalar(cluster, "cluster.server");
        if (!server)
                return config_yaml_set_error(error, -EINVAL,
                                             "%s: no API server: current-context must name a context whose "
                                             "cluster has a server", path);
        if (!startswith(server, "https://"))
                return config_yaml_set_error(error, -EINVAL, "%s: the API server %s is not an https:// URL", path,
                                             server);
        if (!(k->server = strdup(server)))
                return -ENOMEM;
        const Node *c = cluster ? config_node_find(cluster, "cluster") : NULL;
        const Node *u = user ? config_node_find(user, "user") : NULL;
        r = take_pem(c, "certificate-authority", dir, &k->ca, &k->ca_size, &k->ca_file);
        if (r >= 0)
                r = take_pem(u, "client-certificate", dir, &k->cert, &k->cert_size, &k->cert_file);
        if (r >= 0)
                r = take_pem(u, "client-key", dir, &k->key, &k->key_size, &k->key_file);
        if (r < 0)
                return config_yaml_set_error(error, r, "%s: a certificate or key is not valid base64", path);
        const char *token = scalar(u, "token"), *token_file = scalar(u, "tokenFile");
        if (token && !(k->token = strdup(token)))
                return -ENOMEM;
        if (!token && token_file) {
                /* Relative names are relative to the kubeconfig's folder, as kubectl takes them. */
                _cleanup_free_ char *tf = token_file[0] == '/' ? strdup(token_file) : path_join(dir, token_file);
                if (!tf)
                        return -ENOMEM;
                r = read_one_line_file(tf, &k->token);
                if (r < 0)
                        return config_yaml_set_error(error, r, "%s: cannot read the tokenFile %s: %s", path, tf,
                                                     strerror(-r));
        }
        return 0;
}

static void emit_error(KubeNode *k, int error, const char *fmt, ...) _printf_(3, 4);
static void emit_error(KubeNode *k, int error, const char *fmt, ...) {
        _cleanup_free_ char *msg = NULL;
        va_list ap;

        va_start(ap, fmt);
        if (vasprintf(&msg, fmt, ap) < 0)
                msg = NULL;
        va_end(ap);
        k->cb(k, &(KubeNodeEvent) { .error = error, .message = msg ?: "out of memory" }, k->userdata);
}

/* Takes the label of a Node object; reports a change. */
static void node_seen(KubeNode *k, json_object *node) {
        json_object *meta = NULL, *labels = NULL, *v = NULL, *rv = NULL;

        if (!json_object_object_get_ex(node, "metadata", &meta))
                return;
        if (json_object_object_get_ex(meta, "resourceVersion", &rv) && json_object_is_type(rv, json_type_string)) {
                free(k->resource_version);
                k->resource_version = strdup(json_object_get_string(rv));
        }
        const char *value = NULL;
        if (json_object_object_get_ex(meta, "labels", &labels) && json_object_object_get_ex(labels, k->label, &v) &&
            json_object_is_type(v, json_type_string))
                value = json_object_get_string(v);
        if (k->have_value && streq_ptr(k->value, value))
                return;
        free(k->value);
        k->value = value ? strdup(value) : NULL;
        k->have_value = true;
        k->cb(k, &(KubeNodeEvent) { .label = true, .value = k->value }, k->userdata);
}

static void kube_start(KubeNode *k);

static int on_retry(sd_event_source *s, uint64_t usec, void *userdata) {
        kube_start(userdata);
        return 0;
}

static void schedule_retry(KubeNode *k) {
        uint64_t d = k->retry_next ?: k->retry_min;

        k->retry_next = d * 2 > k->retry_max ? k->retry_max : d * 2;
        (void) event_reset_time_relative(k->event, &k->retry, CLOCK_MONOTONIC, d, 0, on_retry, k, "kube-node-retry");
}

/* One watch event per line. */
static int watch_line(KubeNode *k, const char *line) {
        _cleanup_(kube_json_object_putp) json_object *ev = json_tokener_parse(line);
        json_object *type = NULL, *obj = NULL, *code = NULL;

        if (!ev || !json_object_object_get_ex(ev, "type", &type) || !json_object_object_get_ex(ev, "object", &obj))
                return 0; /* not an event: ignore, as kubectl does with garbage between events */
        const char *t = json_object_get_string(type);
        if (streq(t, "ERROR")) {
                if (json_object_object_get_ex(obj, "code", &code) && json_object_get_int(code) == 410) {
                        k->gone = true;
                        return -ESTALE; /* ends the stream; list again */
                }
                return 0;
        }
        if (streq(t, "BOOKMARK") || streq(t, "ADDED") || streq(t, "MODIFIED"))
                node_seen(k, obj);
        else if (streq(t, "DELETED")) {
                /* The node object is gone (the node is being removed): the label is gone with it. */
                json_object *meta = NULL;
                if (json_object_object_get_ex(obj, "metadata", &meta))
                        json_object_object_del(meta, "labels");
                node_seen(k, obj);
        }
        return 0;
}

static int on_chunk(const char *data, size_t size, void *userdata) {
        KubeNode *k = userdata;

        for (size_t i = 0; i < size; i++) {
                if (data[i] != '\n') {
                        if (k->line_size > 1024 * 1024)
                                return -EFBIG;
                        char *l = realloc(k->line, k->line_size + 2);
                        if (!l)
                                return -ENOMEM;
                        k->line = l;
                        k->line[k->line_size++] = data[i];
                        continue;
                }
                if (!k->line)
                        continue;
                k->line[k->line_size] = 0;
                int r = watch_line(k, k->line);
                k->line_size = 0;
                if (r < 0)
                        return r;
        }
        return 0;
}

static void on_done(ConfigRemoteFetcher *f, const ConfigRemoteResult *res, void *userdata) {
        KubeNode *k = userdata;
        bool was_watch = k->watching;

        k->watching = false;
        k->line_size = 0;
        if (was_watch && k->gone) {
                /* 410 Gone: our resourceVersion is too old for the server's history; list again. */
                k->gone = false;
                k->resource_version = mfree(k->resource_version);
                kube_start(k);
                return;
        }
        if (res->error < 0) {
                emit_error(k, res->error, "%s: %s", k->server, res->error_text ?: strerror(-res->error));
                schedule_retry(k);
                return;
        }
        if (res->status == 401 || res->status == 403) {
                emit_error(k, -EACCES, "the API server %s refused the credentials (HTTP %ld) for node %s; check "
                           "the user in the kubeconfig", k->server, res->status, k->node_name);
                schedule_retry(k);
                return;
        }
        if (res->status == 410) {
                k->resource_version = mfree(k->resource_version);
                kube_start(k);
                return;
        }
        if (res->status == 404) {
                emit_error(k, -ENOENT, "the API server %s has no node %s; set kubernetes.node-name", k->server,
                           k->node_name);
                schedule_retry(k);
                return;
        }
        if (res->status != 200) {
                emit_error(k, -EIO, "the API server %s answered HTTP %ld", k->server, res->status);
                schedule_retry(k);
                return;
        }
        if (!was_watch)
                k->retry_next = 0;
        if (!was_watch) {
                _cleanup_(kube_json_object_putp) json_object *node = json_tokener_parse(res->body);
                if (!node) {
                        emit_error(k, -EBADMSG, "the API server %s sent a node object that is not JSON", k->server);
                        schedule_retry(k);
                        return;
                }
                node_seen(k, node);
        }
        /* The list, or a watch the server ended (timeoutSeconds): watch (again) from where we are. A
         * server that ends every watch at once would make that a busy loop: then back off. */
        uint64_t now = 0;
        (void) sd_event_now(k->event, CLOCK_MONOTONIC, &now);
        if (was_watch && now - k->watch_started < USEC_PER_SEC) {
                schedule_retry(k);
                return;
        }
        kube_start(k);
}

static void kube_start(KubeNode *k) {
        _cleanup_free_ char *url = NULL;
        int r;

        if (k->resource_version)
                r = asprintf(&url,
                             "%s/api/v1/nodes?fieldSelector=metadata.name%%3D%s&watch=true&resourceVersion=%s"
                             "&allowWatchBookmarks=true&timeoutSeconds=%d",
                             k->server, k->node_name, k->resource_version, WATCH_SECONDS);
        else
                r = asprintf(&url, "%s/api/v1/nodes/%s", k->server, k->node_name);
        if (r < 0) {
                schedule_retry(k);
                return;
        }
        ConfigRemoteRequest req = {
                .url = url,
                .ca_file = k->ca_file, .cert = k->cert_file, .key = k->key_file,
                .ca_pem = k->ca, .ca_pem_size = k->ca_size,
                .cert_pem = k->cert, .cert_pem_size = k->cert_size,
                .key_pem = k->key, .key_pem_size = k->key_size,
                .bearer_token = k->token,
                .timeout_usec = k->resource_version ? (WATCH_SECONDS + 30) * USEC_PER_SEC : 30 * USEC_PER_SEC,
                .on_chunk = k->resource_version ? on_chunk : NULL,
        };
        k->watching = k->resource_version;
        (void) sd_event_now(k->event, CLOCK_MONOTONIC, &k->watch_started);
        r = config_remote_fetch(k->fetcher, &req, on_done, k);
        if (r < 0) {
                k->watching = false;
                emit_error(k, r, "cannot start a request to %s: %s", k->server, strerror(-r));
                schedule_retry(k);
        }
}

int kube_node_new(sd_event *e, const KubeNodeOptions *o, KubeNodeCallback cb, void *userdata, KubeNode **ret,
                  char **ret_error) {
        _cleanup_(kube_node_freep) KubeNode *k = calloc(1, sizeof(*k));
        int r;

        if (!k)
                return -ENOMEM;
        k->event = sd_event_ref(e);
        k->cb = cb;
        k->userdata = userdata;
        k->retry_min = o->retry_min_usec ?: USEC_PER_SEC;
        k->retry_max = o->retry_max_usec ?: 300 * USEC_PER_SEC;
        if (!(k->node_name = strdup(o->node_name)) || !(k->label = strdup(o->label)))
                return -ENOMEM;
        r = kubeconfig_read(k, o->kubeconfig, ret_error);
        if (r < 0)
                return r;
        r = config_remote_fetcher_new(e, &k->fetcher);
        if (r < 0)
                return r;
        kube_start(k);
        *ret = TAKE_PTR(k);
        return 0;
}

KubeNode *kube_node_free(KubeNode *k) {
        if (!k)
                return NULL;
        config_remote_fetcher_free(k->fetcher);
        sd_event_source_disable_unref(k->retry);
        sd_event_unref(k->event);
        free(k->server);
        free(k->node_name);
        free(k->label);
        free(k->token);
        free(k->ca);
        free(k->cert);
        free(k->key);
        free(k->ca_file);
        free(k->cert_file);
        free(k->key_file);
        free(k->resource_version);
        free(k->value);
        free(k->line);
        free(k);
        return NULL;
}
