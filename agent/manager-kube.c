/* SPDX-License-Identifier: MIT */
/* Owns the Manager's side of mig.selected-from: node-label — the Kubernetes node watch (kube-node.c)
 * is started and stopped with the configuration, and a new nvidia.com/mig.config value requests a pass,
 * whose mig stage applies it through the MIG manager as mig.selected would be (a value that is no
 * valid label value is refused there: mig.config.state=failed, nothing applied). The node name and the
 * credentials come from the local configuration only. */
#include <ctype.h>
#include <sys/socket.h>

#include "kube-node.h"
#include "log.h"
#include "manager.h"

#define MIG_CONFIG_LABEL "nvidia.com/mig.config"

static void on_kube_event(KubeNode *k, const KubeNodeEvent *ev, void *userdata) {
        Manager *m = userdata;

        if (!ev->label) {
                log_warning("Kubernetes node watch: %s; MIG stays at %s.", ev->message,
                            m->node.kube_mig_config ? m->node.kube_mig_config : "its current layout");
                return;
        }
        free(m->node.kube_mig_config);
        free(m->node.kube_mig_config_refused);
        m->node.kube_mig_config = ev->value ? strdup(ev->value) : NULL;
        m->node.kube_mig_config_refused = ev->refused ? strdup(ev->refused) : NULL;
        m->node.kube_mig_config_read = true;
        if (ev->refused)
                log_error("Node label " MIG_CONFIG_LABEL " is '%s', which is not a valid label value; refused.",
                          ev->refused);
        else
                log_info("Node label " MIG_CONFIG_LABEL " is %s%s%s.", ev->value ? "'" : "",
                         ev->value ?: "not set", ev->value ? "'" : "");
        manager_request_pass(m, "node label " MIG_CONFIG_LABEL " changed");
}

void manager_kube_update(Manager *m) {
        _cleanup_free_ char *error = NULL;
        char hostname[256] = {};
        int r;

        m->kube = kube_node_free(m->kube);
        if (m->options.oneshot || m->node.config->mig.selected_from != MIG_SELECTED_FROM_NODE_LABEL) {
                m->node.kube_mig_config = mfree(m->node.kube_mig_config);
                m->node.kube_mig_config_refused = mfree(m->node.kube_mig_config_refused);
                m->node.kube_mig_config_read = false;
                return;
        }
        /* Local configuration only (the remote document may not set kubernetes.*): whose Node this is
         * decides which GPUs a label reconfigures. */
        const char *name = m->node.config->kubernetes.node_name;
        if (isempty(name)) {
                if (gethostname(hostname, sizeof(hostname) - 1) < 0) {
                        log_error_errno(errno, "mig.selected-from is node-label but the host name is unknown (%m); "
                                        "set kubernetes.node-name.");
                        return;
                }
                /* As the kubelet names its Node by default: the host name in lower case. */
                for (char *p = hostname; *p; p++)
                        *p = (char) tolower((unsigned char) *p);
                name = hostname;
        }
        /* As for config.remote: a sandbox without IP sockets makes every request fail vaguely. */
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0 && errno == EAFNOSUPPORT) {
                log_error("mig.selected-from is node-label, but this process may not open IP sockets (the unit's "
                          "RestrictAddressFamilies=); copy /usr/share/gpu-node-agent/remote-config.conf to "
                          "/etc/systemd/system/gpu-node-agent.service.d/, set the API server's address in its "
                          "IPAddressAllow= and restart the service.");
                return;
        }
        if (fd >= 0)
                close(fd);
        bool in_cluster = m->node.config->kubernetes.credentials == KUBE_CREDENTIALS_IN_CLUSTER;
        KubeNodeOptions o = {
                .kubeconfig = m->node.config->kubernetes.kubeconfig,
                .service_account_dir = in_cluster ? m->node.config->kubernetes.service_account_dir : NULL,
                .node_name = name,
                .label = MIG_CONFIG_LABEL,
                .retry_min_usec = m->node.config->engine.retry_min_usec,
                .retry_max_usec = m->node.config->engine.retry_max_usec,
        };
        r = kube_node_new(m->node.event, &o, on_kube_event, m, &m->kube, &error);
        if (r < 0)
                log_error("mig.selected-from is node-label, but the node cannot be watched: %s",
                          error ?: strerror(-r));
}
