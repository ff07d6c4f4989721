/* SPDX-License-Identifier: MIT */
/* Owns the kernel-module layer of the driver stage: a libkmod context on an explicit modules
 * directory and modprobe.d list, module lookup by kernel name (with Debian's nvidia-current naming),
 * modinfo, state from <sys>/module, loads with pre-checks and errors in words, the nvidia-peermem
 * rule, unloads in holder order, and the per-module status the D-Bus Modules property shows.
 *
 * Names: every function takes the kernel's module name ("nvidia", "nvidia-uvm" or "nvidia_uvm";
 * '-' and '_' are the same to the kernel). That name is what /sys/module shows and what the .modinfo
 * name= says; the file may be named differently (Debian: nvidia-current.ko is "nvidia").
 *
 * Errors: functions return a negative errno and, where they take ret_message, a sentence for a
 * sysadmin that names the module and the fix; callers log it (this library logs only at debug, through
 * the callback set with module_context_set_log(), which also receives libkmod's own log). */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>

#include "macro.h"

struct kmod_ctx;

typedef struct ModuleContext ModuleContext;

/* priority is a syslog level; message has no trailing newline. */
typedef void (*ModuleLogFunc)(void *userdata, int priority, const char *message);

typedef struct ModuleContextConfig {
        /* <root>/lib/modules/<kernel release>; required. libkmod reads only its binary indexes. */
        const char *modules_dir;
        /* modprobe.d directories or files, highest priority first, e.g. <root>/etc/modprobe.d,
         * <root>/run/modprobe.d, <root>/lib/modprobe.d, <root>/usr/lib/modprobe.d. NULL or empty:
         * none at all (never libkmod's defaults, so the host's rules cannot leak into tests). */
        const char *const *config_paths;
        /* Where the kernel's sysfs is ("/sys"); our state checks read <sys_dir>/module/<name>. NULL =
         * "/sys". libkmod itself always reads /sys/module and /proc/modules (tests trap those). */
        const char *sys_dir;
        /* Where firmware= files must exist before a load; NULL = "/lib/firmware". */
        const char *firmware_dir;
        /* The running kernel's release, for the vermagic check and messages; NULL = uname -r. */
        const char *kernel_release;
} ModuleContextConfig;

int module_context_new(const ModuleContextConfig *config, ModuleContext **ret);

/* Which kernel module flavour of NVIDIA's driver lookups accept: NVIDIA's open kernel modules
 * (nvidia.ko's license "Dual MIT/GPL"; Debian: nvidia-open-kernel-dkms, files nvidia-current-open*.ko)
 * or the proprietary ones (nvidia.ko's license "NVIDIA"; nvidia-kernel-dkms, nvidia-current*.ko).
 * Both have the kernel names nvidia*. nvidia.ko is told by its license; nvidia-uvm and the others by
 * the packaged file name (their license is "Dual MIT/GPL" in both flavours), upstream names pass. */
typedef enum ModuleFlavour {
        MODULE_FLAVOUR_ANY,
        MODULE_FLAVOUR_OPEN,
        MODULE_FLAVOUR_PROPRIETARY,
        _MODULE_FLAVOUR_MAX,
} ModuleFlavour;

const char *module_flavour_to_string(ModuleFlavour f);   /* "any", "open", "proprietary" */
void module_context_set_flavour(ModuleContext *c, ModuleFlavour f);
ModuleFlavour module_context_get_flavour(const ModuleContext *c);
ModuleContext *module_context_free(ModuleContext *c);
DEFINE_CLEANUP_FUNC(ModuleContext *, module_context_free);
#define _cleanup_module_context_free_ _cleanup_(module_context_freep)

/* Routes libkmod's log and our debug messages to func, for priorities <= max_priority. Without a
 * callback both are discarded. */
void module_context_set_log(ModuleContext *c, ModuleLogFunc func, void *userdata, int max_priority);
struct kmod_ctx *module_context_get_kmod(ModuleContext *c);

typedef enum ModuleState {
        /* What the kernel says (module_get_state()): */
        MODULE_STATE_LIVE,    /* loaded and initialised */
        MODULE_STATE_COMING,  /* being initialised */
        MODULE_STATE_GOING,   /* being removed */
        MODULE_STATE_BUILTIN, /* built into the kernel: usable, cannot be unloaded */
        MODULE_STATE_ABSENT,  /* not loaded */
        /* What module_status() adds for a module that is not loaded: */
        MODULE_STATE_MISSING, /* no module for the running kernel */
        MODULE_STATE_STALE,   /* the module file was built for another kernel */
        MODULE_STATE_FAILED,  /* the last module_load() failed; the detail says why */
        _MODULE_STATE_MAX,
        _MODULE_STATE_INVALID = -EINVAL,
} ModuleState;

const char *module_state_to_string(ModuleState s);
ModuleState module_state_from_string(const char *s);

/* The kernel's state of a module from <sys_dir>/module/<name>/initstate: a ModuleState (>= 0) or a
 * negative errno when sysfs cannot be read. */
int module_get_state(ModuleContext *c, const char *name);
/* Loaded and usable: live or built in. */
bool module_is_usable(ModuleContext *c, const char *name);

typedef struct ModuleInfo {
        char *kernel_name; /* .modinfo name= ('-' → '_'), or the file's index name when absent */
        char *index_name;  /* the name modules.dep knows it by, e.g. "nvidia_current" */
        char *filename;    /* absolute path of the .ko */
        char *version;     /* may be NULL */
        char *vermagic;    /* may be NULL */
        char *license;     /* "NVIDIA" (proprietary) or "Dual MIT/GPL" (open modules); may be NULL */
        char *signer;      /* from the appended signature or .modinfo; NULL when unsigned */
        char *sig_key;
        char **depends;    /* kernel names of the modules it needs ('-' → '_') */
        char **firmware;   /* firmware= files, relative to the firmware directory */
        char **parameters; /* the parameter names it takes (parm=/parmtype= "NAME:…"), sorted */
        char **softdeps;   /* its own softdep= lines ("pre: ecdh_generic ecdsa_generic"), as modinfo shows */
} ModuleInfo;

ModuleInfo *module_info_free(ModuleInfo *i);
DEFINE_CLEANUP_FUNC(ModuleInfo *, module_info_free);
#define _cleanup_module_info_free_ _cleanup_(module_info_freep)

/* Finds the module file for a kernel name in the modules directory: the name itself, then for
 * nvidia* names Debian's packaged variants nvidia-current<suffix>, nvidia-current-open<suffix> and
 * nvidia-tesla-<branch><suffix> (highest branch first; branches found in modules.dep), where suffix
 * is what follows "nvidia" ("-uvm"). A candidate counts only if its name= is the wanted kernel name
 * and, for nvidia* modules, its flavour is the context's (module_context_set_flavour()).
 * Returns 0, or -ENOENT with a message that names what was searched and says to build with DKMS, or
 * -ENOPKG when only the other flavour is installed (the message names the package to install). */
int module_lookup(ModuleContext *c, const char *name, ModuleInfo **ret, char **ret_message);

/* The release a vermagic names (its first word), newly allocated; NULL on OOM or an empty vermagic. */
char *module_vermagic_release(const char *vermagic);
/* -ESTALE with a message when the module was built for another kernel release than the running one
 * and its vermagic is not otherwise the running kernel's: the rest of the vermagic ("SMP preempt
 * mod_unload modversions") equals the running kernel's, taken from an in-tree module of modules.dep,
 * and names modversions (the kernel then skips the release and the symbol CRCs decide: RHEL's
 * weak-updates rely on it). */
int module_check_vermagic(ModuleContext *c, const ModuleInfo *info, char **ret_message);
/* -ENOENT with a message naming the first firmware= file missing where the kernel's loader looks:
 * <firmware_dir>/updates/<release>, updates, <release>, <firmware_dir> (also .xz and .zst, which the
 * loader decompresses). A missing file is no error for the proprietary module when options (the
 * effective ones, see module_effective_options()) turn GSP off with NVreg_EnableGpuFirmware=0; the
 * open modules always need it. */
int module_check_firmware(ModuleContext *c, const ModuleInfo *info, const char *options, char **ret_message);
/* The open kernel modules, not the proprietary ones: by Debian's file name (nvidia-current-open*),
 * else by the license of an upstream-named file (nvidia.ko: "Dual MIT/GPL" open, "NVIDIA" not). */
bool module_info_is_open(const ModuleInfo *info);
/* The options a load of info's module gets: modprobe.d's for its file name, those for the kernel name
 * when the file is a packaged variant, then extra. NULL on OOM. */
char *module_effective_options(ModuleContext *c, const ModuleInfo *info, const char *extra);

/* Makes a module live, following modprobe.d as modprobe does (docs/driver.md). Returns 0 when it
 * already was (nothing is touched, no syscall), 1 when it was loaded now, or a negative errno with a
 * message. Before loading: lookup (-ENOENT), vermagic (-ESTALE), firmware (-ENOENT), every option's
 * name against the module's parameters (-EINVAL naming it). Then, in modprobe's order: softdep pre:
 * modules, the hard dependencies (each by its kernel name, through this same function), the module
 * itself (through modprobe.d's install command when there is one: Debian's "modprobe -i
 * nvidia-current" redirects without a shell, anything else through /bin/sh, and the module must be
 * live after it, else -ECANCELED), softdep post: modules. softdep/install lines apply under the
 * kernel name and the packaged file name; blacklist lines do not apply (loads by name). The options
 * are modprobe.d's for the file, those for the kernel name when the file is a packaged variant
 * (nvidia-current), then options (may be NULL). An "already loaded" from the kernel (EEXIST) is
 * success. The failure is remembered for module_status() until a later load succeeds. */
int module_load(ModuleContext *c, const char *name, const char *options, char **ret_message);

/* The message module_load() gives for error (a negative errno) from loading info's module with the
 * given options. Exposed so callers and tests get the same words. NULL on OOM. */
char *module_load_error_message(ModuleContext *c, const ModuleInfo *info, int error, const char *options);

/* The nvidia-peermem rule: load it only with a Mellanox/NVIDIA networking device (PCI vendor 0x15b3),
 * ib_core usable, and a peermem whose depends= names ib_core (otherwise it is a stub built without
 * the InfiniBand stack, which fails with EINVAL). Returns 1 = load it, 0 = skip it with *ret_reason
 * set, negative errno on failure. */
int module_peermem_check(ModuleContext *c, bool has_mellanox_device, char **ret_reason);

/* Holders (module names from <sys>/module/<name>/holders/, sorted) and the refcnt. */
int module_get_holders(ModuleContext *c, const char *name, char ***ret_holders, unsigned *ret_refcnt);

/* Unloads the named modules that are loaded, holders first, without force (the kernel's O_NONBLOCK);
 * a modprobe.d remove command other than Debian's "modprobe -r -i …" list runs instead of the removal
 * and must leave the module gone (else -ECANCELED naming the line).
 * Refuses before removing anything when a module is held by one not in the list, by references
 * that are not modules (processes with the device open), or is built in; the message lists them.
 * Returns the number of modules removed, or a negative errno (-EBUSY for a refusal, or the kernel's
 * error: -EAGAIN/-EBUSY become "in use by: …") with a message. */
int module_unload(ModuleContext *c, char *const *names, char **ret_message);

/* One row of the D-Bus Modules property: (name, state, detail). detail is the version for loaded
 * modules, the reason for missing/stale/failed ones. */
typedef struct ModuleStatus {
        char *name;
        ModuleState state;
        char *detail;
} ModuleStatus;

int module_status(ModuleContext *c, const char *name, ModuleStatus *ret);
void module_status_done(ModuleStatus *s);
