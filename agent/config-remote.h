/* SPDX-License-Identifier: MIT */
/* Owns the remote configuration source's mechanics: expanding the URL template, one HTTPS fetch at a
 * time through libcurl's multi interface on sd-event sources (never blocking the loop; also the
 * transport of the Kubernetes node watch, kube-node.c), and the last-known-good copy in the state
 * directory. Returns errors, logs at most at debug; the Manager
 * (manager-remote.c) decides what a result means for the node. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <systemd/sd-event.h>

#include "macro.h"

/* Documents larger than this are refused, as local files are. */
#define CONFIG_REMOTE_MAX (1024U * 1024U)

/* A streaming request's body, chunk by chunk as it arrives; a negative return aborts the transfer. */
typedef int (*ConfigRemoteChunk)(const char *data, size_t size, void *userdata);

typedef struct ConfigRemoteRequest {
        const char *url;           /* expanded, https:// */
        const char *ca_file;       /* NULL or "": the system's CAs */
        const char *cert, *key;    /* NULL or "": no client certificate */
        /* PEM in memory instead of files (kubeconfig *-data); size 0 = not set. */
        const char *ca_pem, *cert_pem, *key_pem;
        size_t ca_pem_size, cert_pem_size, key_pem_size;
        const char *bearer_token;  /* Authorization: Bearer, NULL none */
        uint64_t timeout_usec;     /* 0: none (a watch), but connecting still times out */
        ConfigRemoteChunk on_chunk;/* set: the body is streamed to it, not collected */
        const char *etag;          /* conditional request: If-None-Match, NULL none */
        const char *last_modified; /* If-Modified-Since, NULL none */
} ConfigRemoteRequest;

typedef struct ConfigRemoteResult {
        int error;                 /* 0, or a negative errno when no HTTP answer came */
        const char *error_text;    /* curl's words for that ("SSL certificate problem: …"), or NULL */
        long status;               /* HTTP status, 0 without an answer */
        const char *body;          /* NUL-terminated, status 200 only */
        size_t body_size;
        const char *etag, *last_modified; /* response headers, NULL when absent */
} ConfigRemoteResult;

typedef struct ConfigRemoteFetcher ConfigRemoteFetcher;
typedef void (*ConfigRemoteDone)(ConfigRemoteFetcher *f, const ConfigRemoteResult *res, void *userdata);

int config_remote_fetcher_new(sd_event *e, ConfigRemoteFetcher **ret);
ConfigRemoteFetcher *config_remote_fetcher_free(ConfigRemoteFetcher *f);
DEFINE_CLEANUP_FUNC(ConfigRemoteFetcher *, config_remote_fetcher_free);

/* Starts a fetch; done is called from the event loop when it ends (never from inside this call).
 * -EBUSY while one is in flight. */
int config_remote_fetch(ConfigRemoteFetcher *f, const ConfigRemoteRequest *req, ConfigRemoteDone done,
                        void *userdata);
bool config_remote_busy(const ConfigRemoteFetcher *f);
void config_remote_cancel(ConfigRemoteFetcher *f);

/* Replaces {hostname}, {machine-id} and {product} in template (percent-encoding the values); NULL values
 * are "unknown". Any other {…} is -EINVAL with *ret_bad set to the placeholder. */
int config_remote_expand_url(const char *template, const char *hostname, const char *machine_id,
                             const char *product, char **ret, char **ret_bad);

/* The last-known-good copy: <state_dir>/remote-config.yaml, its detached signature (when it was signed)
 * in <state_dir>/remote-config.sig and its metadata (URL, ETag, Last-Modified) in
 * <state_dir>/remote-config.meta, all written atomically. */
typedef struct ConfigRemoteCache {
        char *url;
        char *etag;
        char *last_modified;
        char *data;
        size_t size;
        char *sig;                 /* NULL: not signed */
        size_t sig_size;
} ConfigRemoteCache;

void config_remote_cache_done(ConfigRemoteCache *c);
/* -ENOENT when there is none. */
int config_remote_cache_load(const char *state_dir, ConfigRemoteCache *ret);
/* Also removes a remote-config.sig that c does not have. */
int config_remote_cache_save(const char *state_dir, const ConfigRemoteCache *c);

/* The highest serial of a signed document accepted from url: <state_dir>/remote-config.serial
 * ("url=…\nserial=N\n", written atomically). *ret is 0 when none was accepted from that URL. Kept apart
 * from the copy so that losing or refusing the copy does not lower it. */
int config_remote_serial_load(const char *state_dir, const char *url, uint64_t *ret);
int config_remote_serial_save(const char *state_dir, const char *url, uint64_t serial);
