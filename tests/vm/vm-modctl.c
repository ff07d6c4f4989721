/* SPDX-License-Identifier: MIT */
/* Owns the real-kernel test's in-VM helper: a thin command line over the module layer
 * (modules/module.h) and over the raw module syscalls, so tests/vm/guest.sh can drive a real kernel
 * through the same code the agent uses, including module_unload(), which the agent exposes only over
 * D-Bus. Every command prints one "rc=<int> errno=<NAME>" line, then "message=<text>" when there is
 * one, then "info ..." lines; the exit status is 0 unless the command line itself was wrong.
 *
 *   vm-modctl [--modules=DIR] [--sys=DIR] [--config=PATH]... [--firmware=DIR] COMMAND ...
 *     load NAME [OPTIONS]        module_load()
 *     unload NAME...             module_unload()
 *     peermem 0|1                module_peermem_check() (1: a 0x15b3 device exists)
 *     stage [--modeset] [--peermem] [--mlx] [--param=NAME=OPTIONS]...
 *                                the driver stage's order (ipmi best effort, nvidia, nvidia-uvm,
 *                                nvidia-modeset, the peermem rule) through the library, for kernels
 *                                where the agent's own stage cannot run yet
 *     info NAME                  module_lookup()
 *     insmod FILE [PARAMS]       finit_module(2) as is: what the kernel itself says
 *     rmmod NAME                 delete_module(2) with O_NONBLOCK */
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "macro.h"
#include "module.h"
#include "strv.h"

static const char *arg_modules = NULL;
static const char *arg_sys = "/sys";
static const char *arg_firmware = "/lib/firmware";
static char **arg_config = NULL;

static void print_result(int r, const char *message) {
        const char *name = r < 0 ? strerrorname_np(-r) : "0";
        printf("rc=%d errno=%s\n", r, name ?: "?");
        if (message)
                printf("message=%s\n", message);
}

static void print_log(void *userdata, int priority, const char *message) {
        (void) userdata;
        fprintf(stderr, "kmod<%d>: %s\n", priority, message);
}

static int cmd_load(ModuleContext *c, int argc, char **argv) {
        _cleanup_free_ char *msg = NULL;
        if (argc < 1 || argc > 2)
                return -EINVAL;
        int r = module_load(c, argv[0], argc > 1 ? argv[1] : NULL, &msg);
        print_result(r, msg);
        return 0;
}

static int cmd_unload(ModuleContext *c, int argc, char **argv) {
        _cleanup_strv_free_ char **names = NULL;
        _cleanup_free_ char *msg = NULL;
        if (argc < 1)
                return -EINVAL;
        for (int i = 0; i < argc; i++)
                if (strv_extend(&names, argv[i]) < 0)
                        return -ENOMEM;
        int r = module_unload(c, names, &msg);
        print_result(r, msg);
        return 0;
}

static int cmd_peermem(ModuleContext *c, int argc, char **argv) {
        _cleanup_free_ char *reason = NULL;
        if (argc != 1)
                return -EINVAL;
        int r = module_peermem_check(c, streq(argv[0], "1"), &reason);
        print_result(r, reason);
        return 0;
}

static int cmd_info(ModuleContext *c, int argc, char **argv) {
        _cleanup_module_info_free_ ModuleInfo *info = NULL;
        _cleanup_free_ char *msg = NULL, *deps = NULL;
        if (argc != 1)
                return -EINVAL;
        int r = module_lookup(c, argv[0], &info, &msg);
        print_result(r, msg);
        if (r < 0)
                return 0;
        deps = strv_join(info->depends, ",");
        printf("info name=%s index=%s file=%s version=%s signer=%s depends=%s\n", info->kernel_name,
               info->index_name, info->filename, strna(info->version), strna(info->signer), strna(deps));
        printf("info vermagic=%s\n", strna(info->vermagic));
        STRV_FOREACH(f, info->firmware)
                printf("info firmware=%s\n", *f);
        STRV_FOREACH(sd, info->softdeps)
                printf("info softdep=%s\n", *sd);
        printf("info license=%s open=%s\n", strna(info->license), module_info_is_open(info) ? "yes" : "no");
        return 0;
}

/* What the agent's driver stage does (specs/driver.md, "Load"), step by step through the library;
 * one "step NAME rc=… errno=…" line and a message line per module. Stops at the first required
 * module that fails, as the stage does. */
static int cmd_stage(ModuleContext *c, int argc, char **argv) {
        static const char *const required[] = { "nvidia", "nvidia-uvm", "nvidia-modeset" };
        bool modeset = false, peermem = false, mlx = false;
        _cleanup_strv_free_ char **params = NULL;

        for (int i = 0; i < argc; i++) {
                if (streq(argv[i], "--modeset"))
                        modeset = true;
                else if (streq(argv[i], "--peermem"))
                        peermem = true;
                else if (streq(argv[i], "--mlx"))
                        mlx = true;
                else if (startswith(argv[i], "--param=")) {
                        if (strv_extend(&params, argv[i] + strlen("--param=")) < 0)
                                return -ENOMEM;
                } else
                        return -EINVAL;
        }

        /* Best effort, as for the agent: a missing ipmi stack is no reason to stop. */
        static const char *const best_effort[] = { "ipmi_msghandler", "ipmi_devintf" };
        for (size_t i = 0; i < ELEMENTSOF(best_effort); i++) {
                _cleanup_free_ char *msg = NULL;
                int r = module_load(c, best_effort[i], NULL, &msg);
                printf("step %s ", best_effort[i]);
                print_result(r, msg);
        }

        for (size_t i = 0; i < ELEMENTSOF(required); i++) {
                _cleanup_free_ char *msg = NULL;
                const char *opts = NULL;
                size_t n = strlen(required[i]);

                if (streq(required[i], "nvidia-modeset") && !modeset)
                        continue;
                STRV_FOREACH(p, params)
                        if (strncmp(*p, required[i], n) == 0 && (*p)[n] == '=')
                                opts = *p + n + 1;
                int r = module_load(c, required[i], opts, &msg);
                printf("step %s ", required[i]);
                print_result(r, msg);
                if (r < 0)
                        return 0;
        }

        if (peermem) {
                _cleanup_free_ char *reason = NULL, *msg = NULL;
                int r = module_peermem_check(c, mlx, &reason);
                if (r <= 0) {
                        printf("step nvidia-peermem-skip ");
                        print_result(r, reason);
                        return 0;
                }
                r = module_load(c, "nvidia-peermem", NULL, &msg);
                printf("step nvidia-peermem ");
                print_result(r, msg);
        }
        return 0;
}

static int cmd_insmod(int argc, char **argv) {
        _cleanup_close_ int fd = -EBADF;
        if (argc < 1 || argc > 2)
                return -EINVAL;
        fd = open(argv[0], O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
                print_result(-errno, "cannot open the module file");
                return 0;
        }
        int r = (int) syscall(SYS_finit_module, fd, argc > 1 ? argv[1] : "", 0);
        print_result(r < 0 ? -errno : 0, NULL);
        return 0;
}

static int cmd_rmmod(int argc, char **argv) {
        if (argc != 1)
                return -EINVAL;
        int r = (int) syscall(SYS_delete_module, argv[0], O_NONBLOCK);
        print_result(r < 0 ? -errno : 0, NULL);
        return 0;
}

static int run(int argc, char **argv) {
        enum { ARG_MODULES = 0x100, ARG_SYS, ARG_CONFIG, ARG_FIRMWARE, ARG_DEBUG };
        static const struct option options[] = {
                { "modules", required_argument, NULL, ARG_MODULES },
                { "sys", required_argument, NULL, ARG_SYS },
                { "config", required_argument, NULL, ARG_CONFIG },
                { "firmware", required_argument, NULL, ARG_FIRMWARE },
                { "debug", no_argument, NULL, ARG_DEBUG },
                {}
        };
        _cleanup_module_context_free_ ModuleContext *c = NULL;
        bool debug = false;
        int o, r;

        while ((o = getopt_long(argc, argv, "+", options, NULL)) >= 0)
                switch (o) {
                case ARG_MODULES:
                        arg_modules = optarg;
                        break;
                case ARG_SYS:
                        arg_sys = optarg;
                        break;
                case ARG_CONFIG:
                        if (strv_extend(&arg_config, optarg) < 0)
                                return -ENOMEM;
                        break;
                case ARG_FIRMWARE:
                        arg_firmware = optarg;
                        break;
                case ARG_DEBUG:
                        debug = true;
                        break;
                default:
                        return -EINVAL;
                }
        if (optind >= argc)
                return -EINVAL;

        const char *cmd = argv[optind];
        argc -= optind + 1;
        argv += optind + 1;
        if (streq(cmd, "insmod"))
                return cmd_insmod(argc, argv);
        if (streq(cmd, "rmmod"))
                return cmd_rmmod(argc, argv);

        static char *const library_commands[] = { "load", "unload", "peermem", "info", "stage", NULL };
        if (!strv_contains(library_commands, cmd)) {
                fprintf(stderr, "vm-modctl: unknown command '%s'.\n", cmd);
                return -EINVAL;
        }
        if (!arg_modules) {
                fprintf(stderr, "vm-modctl: --modules=DIR (lib/modules/<release>) is required for %s.\n", cmd);
                return -EINVAL;
        }
        ModuleContextConfig config = {
                .modules_dir = arg_modules,
                .config_paths = (const char *const *) arg_config,
                .sys_dir = arg_sys,
                .firmware_dir = arg_firmware,
        };
        r = module_context_new(&config, &c);
        if (r < 0) {
                fprintf(stderr, "vm-modctl: cannot set up libkmod on %s: %s\n", arg_modules, strerror(-r));
                return r;
        }
        if (debug)
                module_context_set_log(c, print_log, NULL, 7);

        if (streq(cmd, "load"))
                return cmd_load(c, argc, argv);
        if (streq(cmd, "unload"))
                return cmd_unload(c, argc, argv);
        if (streq(cmd, "peermem"))
                return cmd_peermem(c, argc, argv);
        if (streq(cmd, "info"))
                return cmd_info(c, argc, argv);
        if (streq(cmd, "stage"))
                return cmd_stage(c, argc, argv);
        return -EINVAL;
}

int main(int argc, char **argv) {
        int r = run(argc, argv);
        strv_free(arg_config);
        if (r == -EINVAL)
                fprintf(stderr, "vm-modctl: bad command line; see the comment at the top of tests/vm/vm-modctl.c.\n");
        return r < 0 ? 1 : 0;
}
