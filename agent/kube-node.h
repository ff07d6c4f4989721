/* SPDX-License-Identifier: MIT */
/* Owns the Kubernetes node watch: reads one label of this node's Node object from the API server,
 * with the credentials of a kubeconfig (the kubelet's) or of a pod's service account (in-cluster), and
 * keeps watching it — a GET of the node, then a streaming watch from its resourceVersion, resumed from
 * the last version seen (a BOOKMARK's too) when the stream ends, a fresh GET on 410 Gone (an ERROR
 * event or the HTTP status), and retries with backoff on other errors. A token read from a file is
 * read again on HTTP 401 (the kubelet rotates service-account tokens) and the request retried once at
 * once. The node name is the caller's (local configuration) alone: an object the server sends for
 * another name is refused. Transport: config-remote.c (libcurl multi on sd-event). JSON through
 * json-c. Reports through callbacks; logs at most at debug. The RBAC these requests need:
 * docs/kubernetes.md, packaging/kubernetes/rbac.yaml. */
#pragma once

#include <systemd/sd-event.h>

#include "macro.h"

typedef struct KubeNode KubeNode;

typedef struct KubeNodeEvent {
        bool label;                /* true: the label's value changed (value NULL = label absent or "") */
        const char *value;
        const char *refused;       /* label: the value is not a valid Kubernetes label value (only a
                                    * broken or hostile server sends one): value is NULL and this is the
                                    * value as printable text (escaped, shortened), for messages only */
        int error;                 /* !label: a failure, and what it was in words */
        const char *message;
} KubeNodeEvent;

typedef void (*KubeNodeCallback)(KubeNode *k, const KubeNodeEvent *ev, void *userdata);

typedef struct KubeNodeOptions {
        const char *kubeconfig;    /* path */
        const char *service_account_dir; /* set: in-cluster credentials instead of the kubeconfig: the
                                    * API server from KUBERNETES_SERVICE_HOST/PORT, DIR/ca.crt, DIR/token */
        const char *node_name;     /* an RFC 1123 subdomain (what the kubelet registers), else -EINVAL */
        const char *label;         /* "nvidia.com/mig.config" */
        uint64_t retry_min_usec, retry_max_usec;
} KubeNodeOptions;

/* Reads the kubeconfig (current-context → cluster server and CA, user client certificate/key or
 * token), or the in-cluster credentials; on failure -errno and *ret_error names the file (or the
 * variable) and what is missing. Starts at once. */
int kube_node_new(sd_event *e, const KubeNodeOptions *o, KubeNodeCallback cb, void *userdata, KubeNode **ret,
                  char **ret_error);
KubeNode *kube_node_free(KubeNode *k);
DEFINE_CLEANUP_FUNC(KubeNode *, kube_node_free);

/* For the unit tests: bytes of a watch stream, taken as if the watch request had received them (-errno
 * where the stream would end), and the resourceVersion the next watch would resume from (NULL: the next
 * request lists). */
int kube_node_watch_feed(KubeNode *k, const char *data, size_t size);
const char *kube_node_resource_version(const KubeNode *k);

/* Whether s is a valid Node name: an RFC 1123 DNS subdomain (lower case, at most 253 characters). */
bool kube_node_name_is_valid(const char *s);

/* s as printable ASCII for a message: the backslash and every byte outside 0x20..0x7e as \xNN, cut
 * after max input bytes with "..." appended. NULL on ENOMEM. */
char *kube_printable(const char *s, size_t max);

/* Base64 (RFC 4648, with padding; whitespace skipped), as kubeconfig *-data fields are. */
int kube_base64_decode(const char *s, char **ret, size_t *ret_size);
