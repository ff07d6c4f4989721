/* SPDX-License-Identifier: MIT */
/* Owns the Kubernetes node watch: reads one label of this node's Node object from the API server,
 * with the credentials of a kubeconfig (the kubelet's), and keeps watching it — a GET of the node, then
 * a streaming watch from its resourceVersion, resumed from the last version seen when the stream
 * ends, a fresh GET on 410 Gone, and retries with backoff on errors. Transport: config-remote.c
 * (libcurl multi on sd-event). JSON through json-c. Reports through callbacks; logs at most at
 * debug. */
#pragma once

#include <systemd/sd-event.h>

#include "macro.h"

typedef struct KubeNode KubeNode;

typedef struct KubeNodeEvent {
        bool label;                /* true: the label's value changed (value NULL = label absent) */
        const char *value;
        int error;                 /* !label: a failure, and what it was in words */
        const char *message;
} KubeNodeEvent;

typedef void (*KubeNodeCallback)(KubeNode *k, const KubeNodeEvent *ev, void *userdata);

typedef struct KubeNodeOptions {
        const char *kubeconfig;    /* path */
        const char *node_name;
        const char *label;         /* "nvidia.com/mig.config" */
        uint64_t retry_min_usec, retry_max_usec;
} KubeNodeOptions;

/* Reads the kubeconfig (current-context → cluster server and CA, user client certificate/key or
 * token); on failure -errno and *ret_error names the file and what is missing. Starts at once. */
int kube_node_new(sd_event *e, const KubeNodeOptions *o, KubeNodeCallback cb, void *userdata, KubeNode **ret,
                  char **ret_error);
KubeNode *kube_node_free(KubeNode *k);
DEFINE_CLEANUP_FUNC(KubeNode *, kube_node_free);

/* Base64 (RFC 4648, with padding; whitespace skipped), as kubeconfig *-data fields are. */
int kube_base64_decode(const char *s, char **ret, size_t *ret_size);
