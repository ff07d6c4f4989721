/* SPDX-License-Identifier: MIT */
/* Owns changing which modules are loaded: module_load() (pre-checks, libkmod's probe, the kernel's
 * errors in words), the nvidia-peermem rule, and module_unload() in holder order without force. */
#include "fileio.h"
#include "module-internal.h"
#include "strv.h"

#define DKMS_MOK_PUB "/var/lib/dkms/mok.pub"

static bool name_is(const char *kernel_name, const char *want) {
        _cleanup_free_ char *a = module_name_normalize(kernel_name), *b = module_name_normalize(want);
        return a && b && streq(a, b);
}

/* The active lockdown mode from <sys>/kernel/security/lockdown ("none [integrity] confidentiality"),
 * or NULL when lockdown is off or unknown. */
static char *lockdown_mode(ModuleContext *c) {
        _cleanup_free_ char *p = strprintf("%s/kernel/security/lockdown", c->sys_dir), *s = NULL;
        char *lb, *rb;

        if (!p || read_one_line_file(p, &s) < 0)
                return NULL;
        lb = strchr(s, '[');
        rb = lb ? strchr(lb, ']') : NULL;
        if (!rb || startswith(lb, "[none]"))
                return NULL;
        return strndup(lb + 1, rb - lb - 1);
}

/* EFI global variable GUID: SecureBoot-<guid> holds 4 attribute bytes, then 1 = enabled. */
#define SECURE_BOOT_EFIVAR "firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"

/* 1 Secure Boot on, 0 off, -ENOENT when there is no EFI variable (legacy boot, or no efivarfs). */
static int secure_boot_state(ModuleContext *c) {
        _cleanup_free_ char *p = strprintf("%s/%s", c->sys_dir, SECURE_BOOT_EFIVAR), *var = NULL;
        size_t n = 0;

        if (!p)
                return -ENOMEM;
        if (read_full_file(p, 64, &var, &n) < 0 || n == 0)
                return -ENOENT;
        return var[n - 1] == 1;
}

/* module.sig_enforce as the kernel shows it (<sys>/module/module/parameters/sig_enforce: Y or N). */
static bool sig_enforce_on(ModuleContext *c) {
        _cleanup_free_ char *p = strprintf("%s/module/module/parameters/sig_enforce", c->sys_dir), *s = NULL;
        return p && read_one_line_file(p, &s) >= 0 && (streq(s, "Y") || streq(s, "1"));
}

/* Why a module's signature was refused, in words: only what is found on (Secure Boot, module.sig_enforce,
 * lockdown) is blamed. */
static char *signature_rejected_message(ModuleContext *c, const ModuleInfo *info, const char *display) {
        _cleanup_free_ char *lockdown = lockdown_mode(c), *signer = NULL;
        int sb = secure_boot_state(c);
        bool enforce = sig_enforce_on(c);
        const char *file = info->filename;

        if (info->signer)
                signer = strprintf("the module is signed by \"%s\"%s%s%s, a key the kernel does not trust", info->signer,
                                   info->sig_key ? " (key " : "", info->sig_key ?: "", info->sig_key ? ")" : "");
        else
                signer = strdup("the module is not signed");
        if (!signer)
                return NULL;

        if (sb > 0) {
                if (info->signer)
                        return strprintf("Failed to load %s (%s): Secure Boot rejected it: the module is signed by "
                                         "\"%s\"%s%s%s, a key that is not enrolled; enroll it with `mokutil --import "
                                         "%s` and reboot to confirm it in MokManager.",
                                         display, file, info->signer, info->sig_key ? " (key " : "",
                                         info->sig_key ?: "", info->sig_key ? ")" : "", DKMS_MOK_PUB);
                return strprintf("Failed to load %s (%s): Secure Boot rejected it: the module is not signed; let "
                                 "DKMS sign it (it uses /var/lib/dkms/mok.key) and enroll that key with `mokutil "
                                 "--import %s`, then reboot to confirm it in MokManager.",
                                 display, file, DKMS_MOK_PUB);
        }
        if (enforce)
                return strprintf("Failed to load %s (%s): the kernel enforces module signatures (module.sig_enforce=1; "
                                 "Secure Boot is %s) and %s; sign it with a key in the kernel's trusted keyrings "
                                 "(with shim: `mokutil --import %s`), or remove module.sig_enforce=1 from the kernel "
                                 "command line.",
                                 display, file, sb == 0 ? "off" : "not in use", signer, DKMS_MOK_PUB);
        if (lockdown)
                return strprintf("Failed to load %s (%s): the kernel is locked down (%s; Secure Boot is %s) and "
                                 "refuses modules without a trusted signature: %s; sign it with a trusted key "
                                 "(with shim: `mokutil --import %s`), or boot without lockdown= on the kernel "
                                 "command line.",
                                 display, file, lockdown, sb == 0 ? "off" : "not in use", signer, DKMS_MOK_PUB);
        return strprintf("Failed to load %s (%s): the kernel rejected its signature (EKEYREJECTED) and %s; neither "
                         "Secure Boot, module.sig_enforce nor lockdown shows as on under %s, so check the kernel's "
                         "signature policy (CONFIG_MODULE_SIG_FORCE) and sign the module with a trusted key.",
                         display, file, signer, c->sys_dir);
}

/* What the PCI bus under <sys_dir> shows of NVIDIA GPUs (vendor 0x10de, display class 0x03xxxx), for
 * an ENODEV from nvidia's init ("NVRM: No NVIDIA GPU found"): each GPU with the driver it is bound to,
 * or that there is none. At most 4 are named; the rest are counted. */
static char *nvidia_pci_state(ModuleContext *c) {
        _cleanup_free_ char *dir = strprintf("%s/bus/pci/devices", c->sys_dir), *list = NULL;
        _cleanup_closedir_ DIR *d = NULL;
        size_t n = 0;

        if (!dir)
                return NULL;
        d = opendir(dir);
        if (!d)
                return strprintf("%s cannot be read (%s)", dir, strerror(errno));
        for (struct dirent *de; (de = readdir(d));) {
                _cleanup_free_ char *vendor = NULL, *device = NULL, *class = NULL, *link = NULL, *entry = NULL,
                                    *vp = strprintf("%s/%s/vendor", dir, de->d_name),
                                    *cp = strprintf("%s/%s/class", dir, de->d_name),
                                    *dp = strprintf("%s/%s/device", dir, de->d_name),
                                    *lp = strprintf("%s/%s/driver", dir, de->d_name);
                char target[PATH_MAX];
                ssize_t len;

                if (de->d_name[0] == '.' || !vp || !cp || !dp)
                        continue;
                if (read_one_line_file(vp, &vendor) < 0 || !streq(vendor, "0x10de") ||
                    read_one_line_file(cp, &class) < 0 || !startswith(class, "0x03"))
                        continue;
                (void) read_one_line_file(dp, &device);
                len = lp ? readlink(lp, target, sizeof target - 1) : -1;
                if (len > 0) {
                        target[len] = 0;
                        link = strdup(strrchr(target, '/') ? strrchr(target, '/') + 1 : target);
                }
                if (++n > 4)
                        continue;
                entry = strprintf("%s%s%s (10de:%s, %s%s)", list ?: "", list ? ", " : "", de->d_name,
                                  device && startswith(device, "0x") ? device + 2 : strna(device),
                                  link ? "bound to " : "bound to no driver", link ?: "");
                if (!entry)
                        return NULL;
                free(list);
                list = TAKE_PTR(entry);
        }
        if (n == 0)
                return strprintf("%s shows no NVIDIA GPU (vendor 10de, display class)", dir);
        if (n > 4)
                return strprintf("%s shows %zu NVIDIA GPUs: %s and %zu more", dir, n, strna(list), n - 4);
        return strprintf("%s shows %s", dir, strna(list));
}

char *module_load_error_message(ModuleContext *c, const ModuleInfo *info, int error, const char *options) {
        _cleanup_free_ char *display = module_name_display(info->kernel_name), *lockdown = NULL,
                            *release = NULL;
        const char *file = info->filename, *kver = c->kernel_release;

        if (!display)
                return NULL;
        switch (-error) {
        case EKEYREJECTED:
        case ENOKEY:
                return signature_rejected_message(c, info, display);
        case EPERM:
                lockdown = lockdown_mode(c);
                if (lockdown)
                        return strprintf("Failed to load %s (%s): the kernel is locked down (%s) and refuses "
                                         "modules not signed by a trusted key; sign it with a key enrolled with "
                                         "`mokutil --import %s`.",
                                         display, file, lockdown, DKMS_MOK_PUB);
                return strprintf("Failed to load %s (%s): the kernel does not allow loading modules (EPERM: "
                                 "kernel lockdown, kernel.modules_disabled=1, or the service lacks "
                                 "CAP_SYS_MODULE); check /sys/kernel/security/lockdown and "
                                 "/proc/sys/kernel/modules_disabled.",
                                 display, file);
        case EINVAL:
                if (name_is(info->kernel_name, "nvidia_peermem"))
                        return strprintf("Failed to load %s (%s): the kernel rejected it (EINVAL); an nvidia-peermem "
                                         "built without InfiniBand support is a stub that always fails this way: "
                                         "rebuild it against the installed MOFED/ib_core. Check dmesg for details.",
                                         display, file);
                return strprintf("Failed to load %s (%s) with options \"%s\": the kernel rejected a parameter or "
                                 "the module (EINVAL); check dmesg for the parameter it names and fix "
                                 "driver.parameters or modprobe.d.",
                                 display, file, options ?: "");
        case ENOEXEC:
                release = module_vermagic_release(info->vermagic);
                if (release && !streq(release, kver))
                        return strprintf("Failed to load %s (%s): the kernel says it is not a module for this kernel "
                                         "(ENOEXEC: built for %s, running %s); rebuild it with DKMS: dkms "
                                         "autoinstall -k %s.",
                                         display, file, release, kver, kver);
                /* Same release: the headers or kernel configuration differed (vermagic flags). */
                return strprintf("Failed to load %s (%s): the kernel says it is not a module for this kernel "
                                 "(ENOEXEC: built against other headers or another kernel configuration; its "
                                 "vermagic is \"%s\"); rebuild it with DKMS against linux-headers-%s: dkms "
                                 "autoinstall -k %s.",
                                 display, file, strna(info->vermagic), kver, kver);
        case ENOENT:
                return strprintf("Failed to load %s (%s): the kernel could not resolve its symbols (ENOENT, "
                                 "\"Unknown symbol\" in dmesg): a module it needs is not loaded or was built "
                                 "separately; rebuild the driver's modules together with DKMS: dkms autoinstall "
                                 "-k %s.",
                                 display, file, kver);
        case ENODEV: {
                _cleanup_free_ char *pci = nvidia_pci_state(c);
                return strprintf("Failed to load %s (%s): no device for it (ENODEV, the kernel's \"NVRM: No "
                                 "NVIDIA GPU found\"): no NVIDIA GPU is bound to the driver; %s; check `lspci "
                                 "-nnk -d 10de:` for GPUs bound to vfio-pci or nouveau and dmesg for NVRM messages.",
                                 display, file, strna(pci));
        }
        case ESTALE: {
                char *m = NULL;
                (void) module_check_vermagic(c, info, &m);
                return m ?: strprintf("Failed to load %s (%s): built for another kernel than %s; rebuild it with "
                                      "DKMS: dkms autoinstall -k %s.",
                                      display, file, kver, kver);
        }
        default:
                return strprintf("Failed to load %s (%s): %s; check dmesg for details.", display, file,
                                 strerror(-error));
        }
}

/* Options as the kernel will see them: modprobe.d's for the module file, those modprobe.d gives the
 * kernel name when the file is a packaged variant, then the caller's. */
static char *combine_options(ModuleContext *c, const ModuleInfo *info, const char *extra) {
        _cleanup_(kmod_module_unrefp) struct kmod_module *byname = NULL;
        _cleanup_strv_free_ char **parts = NULL;

        if (!streq(info->index_name, info->kernel_name) &&
            kmod_module_new_from_name(c->kmod, info->kernel_name, &byname) >= 0 &&
            !isempty(kmod_module_get_options(byname)) &&
            strv_extend(&parts, kmod_module_get_options(byname)) < 0)
                return NULL;
        if (!isempty(extra) && strv_extend(&parts, extra) < 0)
                return NULL;
        return strv_join(parts, " ");
}

char *module_effective_options(ModuleContext *c, const ModuleInfo *info, const char *extra) {
        _cleanup_(kmod_module_unrefp) struct kmod_module *mod = NULL;
        _cleanup_free_ char *rest = combine_options(c, info, extra);
        const char *file_options = NULL;

        if (!rest)
                return NULL;
        if (kmod_module_new_from_name(c->kmod, info->index_name, &mod) >= 0)
                file_options = kmod_module_get_options(mod);
        if (isempty(file_options))
                return TAKE_PTR(rest);
        return strprintf("%s%s%s", file_options, isempty(rest) ? "" : " ", rest);
}

/* Which module of the probe failed: the first dependency that is not usable now, else the module. */
static int find_failed(ModuleContext *c, struct kmod_module *mod, ModuleInfo **ret) {
        _cleanup_(kmod_module_unref_listp) struct kmod_list *deps = kmod_module_get_dependencies(mod);
        struct kmod_list *l;

        kmod_list_foreach(l, deps) {
                _cleanup_(kmod_module_unrefp) struct kmod_module *dep = kmod_module_get_module(l);
                _cleanup_module_info_free_ ModuleInfo *info = NULL;

                if (module_info_from_kmod(c, dep, &info) < 0)
                        continue;
                if (!module_is_usable(c, info->kernel_name)) {
                        *ret = TAKE_PTR(info);
                        return 1;
                }
        }
        return 0;
}

static int load_failed(ModuleContext *c, const char *name, int r, char *message, char **ret_message) {
        module_failure_set(c, name, message ?: strerror(-r));
        if (ret_message)
                *ret_message = message;
        else
                free(message);
        return r;
}

int module_load(ModuleContext *c, const char *name, const char *options, char **ret_message) {
        _cleanup_(kmod_module_unrefp) struct kmod_module *mod = NULL;
        _cleanup_module_info_free_ ModuleInfo *info = NULL, *failed = NULL;
        _cleanup_free_ char *display = module_name_display(name), *all_options = NULL, *msg = NULL;
        int state, r;

        if (!display)
                return -ENOMEM;
        state = module_get_state(c, name);
        if (state < 0)
                return load_failed(c, name, state,
                                   strprintf("Cannot read the state of %s under %s/module: %s.", display, c->sys_dir,
                                             strerror(-state)),
                                   ret_message);
        switch ((ModuleState) state) {
        case MODULE_STATE_LIVE:
        case MODULE_STATE_BUILTIN:
        case MODULE_STATE_COMING: /* someone else (udev, modules-load.d) is loading it right now */
                module_debug(c, "%s is already %s", display, module_state_to_string(state));
                module_failure_set(c, name, NULL);
                return 0;
        case MODULE_STATE_GOING:
                return load_failed(c, name, -EBUSY,
                                   strprintf("Cannot load %s: the kernel is removing it right now; try again "
                                             "when the unload has finished.",
                                             display),
                                   ret_message);
        case MODULE_STATE_ABSENT:
        case MODULE_STATE_MISSING:
        case MODULE_STATE_STALE:
        case MODULE_STATE_FAILED:
        case _MODULE_STATE_MAX:
        case _MODULE_STATE_INVALID:
                break;
        }

        r = module_lookup(c, name, &info, &msg);
        if (r >= 0)
                r = module_check_vermagic(c, info, &msg);
        if (r >= 0) {
                _cleanup_free_ char *effective = module_effective_options(c, info, options);
                if (!effective)
                        return -ENOMEM;
                r = module_check_firmware(c, info, effective, &msg);
        }
        if (r < 0)
                return load_failed(c, name, r, TAKE_PTR(msg), ret_message);

        r = kmod_module_new_from_name(c->kmod, info->index_name, &mod);
        if (r < 0)
                return r;
        all_options = combine_options(c, info, options);
        if (!all_options)
                return -ENOMEM;
        module_debug(c, "loading %s from %s with options \"%s\"", display, info->filename, all_options);

        /* KMOD_PROBE_IGNORE_COMMAND: modprobe.d "install" lines are shell commands; Debian's for nvidia
         * run `modprobe nvidia-current`, whose job (finding the packaged file for the kernel name) we
         * already did above, and running arbitrary commands from a daemon would bypass our checks. */
        r = kmod_module_probe_insert_module(mod, KMOD_PROBE_IGNORE_COMMAND, all_options, NULL, NULL, NULL);
        if (r == -EEXIST)
                r = 0;
        if (r >= 0) {
                module_failure_set(c, name, NULL);
                return 1;
        }

        if (find_failed(c, mod, &failed) > 0) {
                _cleanup_(kmod_module_unrefp) struct kmod_module *fm = NULL;
                _cleanup_free_ char *inner = NULL, *fdisplay = module_name_display(failed->kernel_name);
                const char *fopts = NULL;

                if (kmod_module_new_from_name(c->kmod, failed->index_name, &fm) >= 0)
                        fopts = kmod_module_get_options(fm);
                inner = module_load_error_message(c, failed, r, fopts);
                msg = strprintf("Cannot load %s, which needs %s. %s", display, strna(fdisplay), strna(inner));
        } else {
                /* As the kernel saw them: modprobe.d's for the file, then ours. */
                _cleanup_strv_free_ char **shown = NULL;
                _cleanup_free_ char *joined = NULL;
                const char *file_options = kmod_module_get_options(mod);

                if ((!isempty(file_options) && strv_extend(&shown, file_options) < 0) ||
                    (!isempty(all_options) && strv_extend(&shown, all_options) < 0))
                        return -ENOMEM;
                joined = strv_join(shown, " ");
                msg = module_load_error_message(c, info, r, joined);
        }
        return load_failed(c, name, r, TAKE_PTR(msg), ret_message);
}

int module_peermem_check(ModuleContext *c, bool has_mellanox_device, char **ret_reason) {
        _cleanup_module_info_free_ ModuleInfo *info = NULL;
        _cleanup_free_ char *msg = NULL;
        int r;

        assert(ret_reason);

        if (!has_mellanox_device) {
                *ret_reason = strdup("nvidia-peermem is not needed: there is no Mellanox/NVIDIA networking device "
                                     "(PCI vendor 0x15b3).");
                return *ret_reason ? 0 : -ENOMEM;
        }
        if (!module_is_usable(c, "ib_core")) {
                *ret_reason = strdup("nvidia-peermem waits for ib_core, which is not loaded; start the InfiniBand "
                                     "stack (MOFED's openibd or rdma-core) and it will be loaded then.");
                return *ret_reason ? 0 : -ENOMEM;
        }
        r = module_lookup(c, "nvidia-peermem", &info, &msg);
        if (r == -ENOENT) {
                *ret_reason = TAKE_PTR(msg);
                return 0;
        }
        if (r < 0) {
                *ret_reason = TAKE_PTR(msg);
                return r;
        }
        if (!strv_contains(info->depends, "ib_core")) {
                *ret_reason = strprintf("nvidia-peermem was built without InfiniBand support (stub: %s does not "
                                        "depend on ib_core) and would fail with EINVAL; rebuild it against the "
                                        "installed MOFED/ib_core (dkms autoinstall -k %s once its headers are "
                                        "installed).",
                                        info->filename, c->kernel_release);
                return *ret_reason ? 0 : -ENOMEM;
        }
        return 1;
}

/* Appends "<name> is in use by …" for every reason the kernel would refuse to remove name now, counting
 * holders in keep (being unloaded with it) as no obstacle. */
static int unload_obstacles(ModuleContext *c, const char *name, char *const *keep, char ***problems) {
        _cleanup_strv_free_ char **holders = NULL, **outside = NULL;
        _cleanup_free_ char *display = module_name_display(name), *list = NULL;
        unsigned refcnt = 0;
        int r;

        r = module_get_holders(c, name, &holders, &refcnt);
        if (r < 0)
                return r;
        STRV_FOREACH(h, holders)
                if (!strv_contains(keep, *h) && strv_extend(&outside, *h) < 0)
                        return -ENOMEM;
        if (outside) {
                list = strv_join(outside, ", ");
                if (!list || strv_extendf(problems, "%s is in use by: %s", strna(display), list) < 0)
                        return -ENOMEM;
        }
        if (refcnt > strv_length(holders) &&
            strv_extendf(problems, "%s has %u reference%s from processes or the kernel (programs with /dev/nvidia* "
                                   "open)",
                         strna(display), refcnt - (unsigned) strv_length(holders),
                         refcnt - strv_length(holders) == 1 ? "" : "s") < 0)
                return -ENOMEM;
        return 0;
}

static char *unload_message(char *const *removed, const char *what) {
        _cleanup_free_ char *done = removed ? strv_join(removed, ", ") : NULL;
        if (removed && done)
                return strprintf("Unloaded %s, then stopped: %s.", done, what);
        return strprintf("Cannot unload the driver: %s.", what);
}

int module_unload(ModuleContext *c, char *const *names, char **ret_message) {
        _cleanup_strv_free_ char **todo = NULL, **problems = NULL, **removed = NULL;
        int r;

        /* The loaded ones, by kernel name. */
        STRV_FOREACH(n, names) {
                _cleanup_free_ char *norm = module_name_normalize(*n), *display = module_name_display(*n);
                int state;

                if (!norm || !display)
                        return -ENOMEM;
                state = module_get_state(c, norm);
                if (state < 0) {
                        if (ret_message)
                                *ret_message = strprintf("Cannot read the state of %s under %s/module: %s.",
                                                         display, c->sys_dir, strerror(-state));
                        return state;
                }
                if (state == MODULE_STATE_BUILTIN &&
                    strv_extendf(&problems, "%s is built into the kernel and cannot be unloaded", display) < 0)
                        return -ENOMEM;
                if ((state == MODULE_STATE_LIVE || state == MODULE_STATE_COMING || state == MODULE_STATE_GOING) &&
                    !strv_contains(todo, norm) && strv_extend(&todo, norm) < 0)
                        return -ENOMEM;
        }

        /* Check everything before removing anything, so a refusal leaves the driver as it was. */
        STRV_FOREACH(n, todo) {
                r = unload_obstacles(c, *n, todo, &problems);
                if (r < 0)
                        return r;
        }
        if (problems) {
                _cleanup_free_ char *why = strv_join(problems, "; ");
                if (ret_message)
                        *ret_message = strprintf("Refusing to unload the driver: %s; stop those users first.",
                                                 strna(why));
                return -EBUSY;
        }

        /* Holders first: each round removes the modules no remaining one holds. */
        while (todo && todo[0]) {
                bool progress = false;

                for (size_t i = 0; todo[i];) {
                        _cleanup_(kmod_module_unrefp) struct kmod_module *mod = NULL;
                        _cleanup_strv_free_ char **holders = NULL, **now = NULL;
                        _cleanup_free_ char *display = module_name_display(todo[i]), *why = NULL, *what = NULL;
                        bool held = false;

                        if (!display)
                                return -ENOMEM;
                        r = module_get_holders(c, todo[i], &holders, NULL);
                        if (r < 0)
                                return r;
                        STRV_FOREACH(h, holders)
                                held = held || strv_contains(todo, *h);
                        if (held) {
                                i++;
                                continue;
                        }

                        r = kmod_module_new_from_name(c->kmod, todo[i], &mod);
                        if (r < 0)
                                return r;
                        module_debug(c, "removing %s", todo[i]);
                        /* flags 0: libkmod adds O_NONBLOCK itself; never KMOD_REMOVE_FORCE. */
                        r = kmod_module_remove_module(mod, 0);
                        if (r < 0 && r != -ENOENT) {
                                if (r == -EAGAIN || r == -EBUSY) {
                                        /* Something took a reference since we checked. */
                                        (void) unload_obstacles(c, todo[i], NULL, &now);
                                        why = strv_join(now, "; ");
                                        what = isempty(why) ? strprintf("the kernel says %s is in use", display)
                                                            : TAKE_PTR(why);
                                } else
                                        what = strprintf("cannot unload %s: %s", display, strerror(-r));
                                if (ret_message)
                                        *ret_message = unload_message(removed, strna(what));
                                return r;
                        }
                        if (strv_consume(&removed, TAKE_PTR(display)) < 0)
                                return -ENOMEM;
                        free(todo[i]);
                        memmove(todo + i, todo + i + 1, (strv_length(todo + i + 1) + 1) * sizeof(char *));
                        progress = true;
                }
                if (!progress) {
                        if (ret_message)
                                *ret_message = unload_message(removed, "the modules hold each other in a cycle");
                        return -ELOOP;
                }
        }
        return (int) strv_length(removed);
}
