/* SPDX-License-Identifier: MIT */
/* Owns the IMEX helpers of imex.h.
 *
 * The toolkit's IMEX spec (nvidia-container-toolkit pkg/nvcdi, its TestImexMode): cdiVersion 0.5.0 (the
 * names start with a digit), kind nvidia.com/imex-channel, devices "0", "1", … each with one deviceNode
 * /dev/nvidia-caps-imex-channels/channel<N>; no common edits. We write the same devices, checked by our
 * CDI validator before they are written. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "imex.h"
#include "strv.h"

const char *imex_clique(const NvmlSnapshot *s, size_t *ret_n) {
        const char *first = NULL;
        size_t n = 0;

        for (size_t i = 0; s && i < s->n_gpus; i++)
                if (!isempty(s->gpus[i].clique)) {
                        first = first ?: s->gpus[i].clique;
                        n++;
                }
        if (ret_n)
                *ret_n = n;
        return first;
}

static int channel_cmp(const void *a, const void *b) {
        unsigned x = (*(const DevnodeSpec *const *) a)->minor, y = (*(const DevnodeSpec *const *) b)->minor;
        return x < y ? -1 : x > y;
}

int imex_cdi_spec_text(const DevnodePlan *plan, char **ret) {
        _cleanup_(cdi_spec_freep) CdiSpec *spec = calloc(1, sizeof(CdiSpec));
        size_t n = 0;

        if (!spec)
                return -ENOMEM;
        for (size_t i = 0; i < plan->n_nodes; i++)
                n += plan->nodes[i].kind == DEVNODE_IMEX_CHANNEL;
        if (n == 0)
                return -ENODEV;
        spec->kind = strdup(IMEX_CDI_KIND);
        spec->devices = calloc(n, sizeof(CdiDevice));
        if (!spec->kind || !spec->devices)
                return -ENOMEM;

        /* In channel order (the plan is sorted by name, which puts channel10 before channel2). */
        _cleanup_free_ const DevnodeSpec **order = calloc(n, sizeof(DevnodeSpec *));
        if (!order)
                return -ENOMEM;
        n = 0;
        for (size_t i = 0; i < plan->n_nodes; i++)
                if (plan->nodes[i].kind == DEVNODE_IMEX_CHANNEL)
                        order[n++] = &plan->nodes[i];
        qsort(order, n, sizeof(*order), channel_cmp);

        for (size_t i = 0; i < n; i++) {
                CdiDevice *d = &spec->devices[spec->n_devices++];
                d->name = strprintf("%u", order[i]->minor);
                d->edits.device_nodes = calloc(1, sizeof(CdiDeviceNode));
                if (!d->name || !d->edits.device_nodes)
                        return -ENOMEM;
                d->edits.n_device_nodes = 1;
                d->edits.device_nodes[0].path = strprintf("/dev/%s", order[i]->name);
                if (!d->edits.device_nodes[0].path)
                        return -ENOMEM;
        }
        spec->version = strdup(cdi_spec_min_version(spec));
        if (!spec->version)
                return -ENOMEM;
        _cleanup_free_ char *yaml = NULL;
        int r = cdi_spec_to_yaml(spec, &yaml);
        if (r < 0)
                return r;
        /* The emitter's header speaks of the GPU spec; this file says what it is itself. */
        const char *body = yaml;
        while (*body == '#')
                body = strchrnul(body, '\n') + (strchr(body, '\n') ? 1 : 0);
        char *t = strprintf("# Written by gpu-node-agent: the NVLink IMEX channels of this node (fabric.imex), for\n"
                            "# runtimes to hand out as " IMEX_CDI_KIND "=<channel>. Do not edit: set fabric.imex: off\n"
                            "# in the agent's configuration to manage this file yourself.\n%s",
                            body);
        if (!t)
                return -ENOMEM;
        *ret = t;
        return 0;
}
