/* SPDX-License-Identifier: MIT */
/* Owns the Node's libkmod context (driver-modules.h): made here, below the driver stage and the
 * driver unload that both use it. */
#include "driver-modules.h"
#include "fileio.h"
#include "log.h"
#include "strv.h"

static void kmod_log(void *userdata, int priority, const char *message) {
        log_debug("libkmod: %s", message);
}

int driver_module_context(Node *n, ModuleContext **ret) {
        const ConfigPaths *p = &n->config->paths;
        int r;

        if (!n->module_ctx) {
                _cleanup_free_ char *modules_dir = path_join(p->modules, n->kernel_release),
                                    *etc = path_join(p->etc, "modprobe.d"),
                                    *run = path_join(p->root, "run/modprobe.d"),
                                    *lib = path_join(p->root, "lib/modprobe.d"),
                                    *usrlib = path_join(p->root, "usr/lib/modprobe.d"),
                                    *firmware = path_join(p->root, "lib/firmware");
                if (!modules_dir || !etc || !run || !lib || !usrlib || !firmware)
                        return -ENOMEM;
                const char *const config_paths[] = { etc, run, lib, usrlib, NULL };
                const ModuleContextConfig cc = {
                        .modules_dir = modules_dir,
                        .config_paths = config_paths,
                        .sys_dir = p->sys,
                        .firmware_dir = firmware,
                        .kernel_release = n->kernel_release,
                };
                r = module_context_new(&cc, &n->module_ctx);
                if (r < 0)
                        return r;
                /* Formatting libkmod's chatter costs; only ask for it when it is shown. */
                if (log_get_max_level() >= LOG_DEBUG)
                        module_context_set_log(n->module_ctx, kmod_log, n, LOG_DEBUG);
        }
        *ret = n->module_ctx;
        return 0;
}
