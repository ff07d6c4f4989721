/* SPDX-License-Identifier: MIT */
/* Owns what module.c (context, lookup, modinfo, state, status) and module-load.c (load, unload,
 * peermem) share: the context's fields and a few helpers. Not for use outside modules/module*.c. */
#pragma once

#include <libkmod.h>

#include "module.h"

struct ModuleContext {
        struct kmod_ctx *kmod;
        char *modules_dir;
        char *sys_dir;
        char *firmware_dir;
        char *kernel_release;
        char *running_flags;     /* the running kernel's vermagic without the release, once looked up */
        bool running_flags_known;
        ModuleFlavour flavour;

        ModuleLogFunc log_func;
        void *log_userdata;
        int log_max_priority;

        /* The last load failure per kernel name, for module_status(): parallel lists. */
        char **failed_names;
        char **failed_messages;
};

DEFINE_CLEANUP_FUNC_NAMED(module_kmod_unrefp, struct kmod_module *, kmod_module_unref);
DEFINE_CLEANUP_FUNC_NAMED(module_kmod_unref_listp, struct kmod_list *, kmod_module_unref_list);
DEFINE_CLEANUP_FUNC_NAMED(module_kmod_info_free_listp, struct kmod_list *, kmod_module_info_free_list);

void module_debug(ModuleContext *c, const char *fmt, ...) _printf_(2, 3);

/* "nvidia-uvm" → "nvidia_uvm", newly allocated (NULL on OOM). */
char *module_name_normalize(const char *name);
/* "nvidia_uvm" → "nvidia-uvm" (nvidia* names only) for messages, newly allocated (NULL on OOM). */
char *module_name_display(const char *name);

/* <sys_dir>/module/<normalized name>[/<sub>], newly allocated. */
char *module_sys_path(ModuleContext *c, const char *name, const char *sub);

int module_info_from_kmod(ModuleContext *c, struct kmod_module *mod, ModuleInfo **ret);

void module_failure_set(ModuleContext *c, const char *name, const char *message);
const char *module_failure_get(ModuleContext *c, const char *name);
