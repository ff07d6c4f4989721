/* SPDX-License-Identifier: MIT */
/* Owns changing which modules are loaded: module_load() (pre-checks, modprobe.d's install/softdep
 * lines followed as modprobe follows them, the inserts through libkmod, the kernel's errors in words),
 * the nvidia-peermem rule, and module_unload() in holder order without force (modprobe.d's remove
 * lines honoured). We do not use libkmod's probe: with KMOD_PROBE_IGNORE_COMMAND it drops softdeps
 * but still runs dependencies' install commands, and without it every Debian redirect would exec
 * /sbin/modprobe on the host's own modprobe.d instead of the configured one. */
#include <dirent.h>
#include <limits.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fileio.h"
#include "module-internal.h"
#include "strv.h"

static inline const char *strempty(const char *s) {
        return s ?: "";
}

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

/* What the PCI bus shows of NVIDIA GPUs (vendor 0x10de, display class 0x03), for an ENODEV: none, bound
 * to another driver, or without a driver. A sentence, NULL on OOM. */
static char *pci_gpu_state(ModuleContext *c) {
        _cleanup_free_ char *dir = strprintf("%s/bus/pci/devices", c->sys_dir);
        _cleanup_strv_free_ char **other = NULL, **unbound = NULL, **nvidia = NULL;
        _cleanup_closedir_ DIR *d = NULL;
        struct dirent *de;

        if (!dir)
                return NULL;
        d = opendir(dir);
        while (d && (de = readdir(d))) {
                _cleanup_free_ char *vp = NULL, *cp = NULL, *dp = NULL, *vendor = NULL, *class = NULL;
                char target[PATH_MAX];
                ssize_t n;

                if (de->d_name[0] == '.')
                        continue;
                vp = strprintf("%s/%s/vendor", dir, de->d_name);
                cp = strprintf("%s/%s/class", dir, de->d_name);
                dp = strprintf("%s/%s/driver", dir, de->d_name);
                if (!vp || !cp || !dp)
                        return NULL;
                if (read_one_line_file(vp, &vendor) < 0 || read_one_line_file(cp, &class) < 0 ||
                    !streq(vendor, "0x10de") || !startswith(class, "0x03"))
                        continue;
                n = readlink(dp, target, sizeof target - 1);
                if (n < 0) {
                        if (strv_extend(&unbound, de->d_name) < 0)
                                return NULL;
                        continue;
                }
                target[n] = 0;
                const char *drv = strrchr(target, '/') ? strrchr(target, '/') + 1 : target;
                if (streq(drv, "nvidia") ? strv_extend(&nvidia, de->d_name) < 0
                                         : strv_extendf(&other, "%s to %s", de->d_name, drv) < 0)
                        return NULL;
        }
        strv_sort(other);
        strv_sort(unbound);
        if (!other && !unbound && !nvidia)
                return strprintf("the kernel sees no NVIDIA GPU on the PCI bus (no device with vendor 0x10de and "
                                 "a display class under %s): check that this is a GPU host and that no GPU fell off "
                                 "the bus (dmesg, lspci -d 10de:)",
                                 dir);
        _cleanup_free_ char *o = other ? strv_join(other, ", ") : NULL, *u = unbound ? strv_join(unbound, ", ") : NULL;
        return strprintf("%s%s%s%s%s%s", other ? "GPUs bound to other drivers: " : "", strempty(o),
                         other ? " (unbind them, e.g. stop the VM passthrough or blacklist nouveau, so that nvidia "
                                 "can take them)" : "",
                         other && unbound ? "; " : "", unbound ? "GPUs without a driver: " : "",
                         unbound ? strempty(u) : "");
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
                _cleanup_free_ char *pci = pci_gpu_state(c);
                if (pci && !isempty(pci))
                        return strprintf("Failed to load %s (%s): its init found no GPU to drive (ENODEV; dmesg: "
                                         "\"NVRM: No NVIDIA GPU found\"), so no NVIDIA GPU is bound to the driver: %s. "
                                         "dmesg's NVRM lines say why a GPU was refused (e.g. an unsupported GPU for "
                                         "this branch or flavour: Blackwell needs the open modules).",
                                         display, file, pci);
                return strprintf("Failed to load %s (%s): no device for it (ENODEV): no NVIDIA GPU is bound to "
                                 "the driver; check `lspci -nnk -d 10de:` for GPUs bound to vfio-pci or nouveau "
                                 "and dmesg for NVRM messages.",
                                 display, file);
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
        _cleanup_(module_kmod_unrefp) struct kmod_module *byname = NULL;
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
        _cleanup_(module_kmod_unrefp) struct kmod_module *mod = NULL;
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

static int load_failed(ModuleContext *c, const char *name, int r, char *message, char **ret_message) {
        module_failure_set(c, name, message ?: strerror(-r));
        if (ret_message)
                *ret_message = message;
        else
                free(message);
        return r;
}

/* The kernel name of the module a modprobe.d name (either naming style, e.g. "nvidia-current-uvm" or
 * "nvidia-uvm") means: its file's name=, else the name itself. NULL on OOM. */
static char *kernel_name_of(ModuleContext *c, const char *name) {
        _cleanup_(module_kmod_unrefp) struct kmod_module *mod = NULL;
        _cleanup_module_info_free_ ModuleInfo *info = NULL;

        if (kmod_module_new_from_name(c->kmod, name, &mod) >= 0 && kmod_module_get_path(mod) &&
            module_info_from_kmod(c, mod, &info) >= 0)
                return strdup(info->kernel_name);
        return module_name_normalize(name);
}

/* modprobe.d's command of a kind ("install"/"remove") for a module: under its kernel name first,
 * then under its file's name (Debian's nvidia-current). NULL when none. */
static const char *config_command(ModuleContext *c, const ModuleInfo *info, bool install, const char **ret_key) {
        const char *names[] = { info->kernel_name, info->index_name };

        for (size_t i = 0; i < ELEMENTSOF(names); i++) {
                _cleanup_(module_kmod_unrefp) struct kmod_module *mod = NULL;
                const char *cmd;

                if (!names[i] || (i > 0 && streq(names[i], names[0])))
                        continue;
                if (kmod_module_new_from_name(c->kmod, names[i], &mod) < 0)
                        continue;
                cmd = install ? kmod_module_get_install_commands(mod) : kmod_module_get_remove_commands(mod);
                if (!isempty(cmd)) {
                        *ret_key = names[i] == info->kernel_name ? info->kernel_name : info->index_name;
                        /* The string belongs to libkmod's config, which outlives mod. */
                        return cmd;
                }
        }
        return NULL;
}

/* A modprobe.d command made only of `modprobe` calls ("modprobe nvidia ; modprobe -i nvidia-current
 * $CMDLINE_OPTS", Debian's redirects to its renamed files), split into its calls: each a strv of
 * module names, with "-r" first for removals. 0 when the command is anything else (then it is run
 * as modprobe runs it), 1 with *ret, or -ENOMEM. */
static int parse_modprobe_command(const char *cmd, bool removal, char ****ret) {
        _cleanup_free_ char *copy = strdup(cmd);
        char ***calls = NULL;
        size_t n = 0;
        char *save = NULL;

        if (!copy)
                return -ENOMEM;
        for (char *part = strtok_r(copy, ";", &save); part; part = strtok_r(NULL, ";", &save)) {
                _cleanup_strv_free_ char **names = NULL;
                char *wsave = NULL, *w = strtok_r(part, " \t", &wsave);
                bool remove = false;

                if (!w)
                        continue;
                if (!streq(w, "modprobe") && !streq(w, "/sbin/modprobe") && !streq(w, "/usr/sbin/modprobe") &&
                    !streq(w, "/usr/bin/modprobe") && !streq(w, "/bin/modprobe"))
                        goto other;
                for (w = strtok_r(NULL, " \t", &wsave); w; w = strtok_r(NULL, " \t", &wsave)) {
                        if (streq(w, "-i") || streq(w, "--ignore-install") || streq(w, "--ignore-remove") ||
                            streq(w, "$CMDLINE_OPTS") || streq(w, "-q") || streq(w, "--quiet") || streq(w, "-b") ||
                            streq(w, "--use-blacklist"))
                                continue;
                        if (streq(w, "-r") || streq(w, "--remove")) {
                                remove = true;
                                continue;
                        }
                        if (w[0] == '-' || strchr(w, '=') || strchr(w, '$') || strchr(w, '/'))
                                goto other; /* options or words we do not model */
                        if (strv_extend(&names, w) < 0)
                                goto oom;
                }
                /* Removal commands remove; loading commands load (one module plus options, as
                 * modprobe without -a takes only the first name). */
                if (remove != removal || !names || (!removal && strv_length(names) != 1))
                        goto other;
                char ***grown = realloc(calls, (n + 2) * sizeof(char **));
                if (!grown)
                        goto oom;
                calls = grown;
                calls[n++] = TAKE_PTR(names);
                calls[n] = NULL;
        }
        if (!calls)
                return 0;
        *ret = calls;
        return 1;
other:
        for (size_t i = 0; i < n; i++)
                strv_free(calls[i]);
        free(calls);
        return 0;
oom:
        for (size_t i = 0; i < n; i++)
                strv_free(calls[i]);
        free(calls);
        return -ENOMEM;
}

static void calls_free(char ***calls) {
        for (size_t i = 0; calls && calls[i]; i++)
                strv_free(calls[i]);
        free(calls);
}

/* Runs a modprobe.d command as modprobe does: /bin/sh -c, $CMDLINE_OPTS replaced by the options,
 * MODPROBE_MODULE set. Returns the exit status (>= 0), or a negative errno when it cannot run. */
static int run_config_command(ModuleContext *c, const char *module, const char *cmd, const char *options) {
        _cleanup_free_ char *expanded = NULL;
        const char *p = strstr(cmd, "$CMDLINE_OPTS");
        pid_t pid;
        int status;

        expanded = p ? strprintf("%.*s%s%s", (int) (p - cmd), cmd, strempty(options), p + strlen("$CMDLINE_OPTS"))
                     : strdup(cmd);
        if (!expanded)
                return -ENOMEM;
        module_debug(c, "running modprobe.d command for %s: %s", module, expanded);
        pid = fork();
        if (pid < 0)
                return negative_errno();
        if (pid == 0) {
                setenv("MODPROBE_MODULE", module, 1);
                execl("/bin/sh", "sh", "-c", expanded, (char *) NULL);
                _exit(127);
        }
        while (waitpid(pid, &status, 0) < 0)
                if (errno != EINTR)
                        return negative_errno();
        if (WIFSIGNALED(status))
                return 128 + WTERMSIG(status);
        return WEXITSTATUS(status);
}

/* The kernel's own module parameters that every module accepts. */
static bool generic_parameter(const char *name) {
        return streq(name, "dyndbg") || streq(name, "async_probe");
}

/* An option whose parameter the module does not have: the kernel would load it anyway with only a
 * dmesg line ("unknown parameter ignored"), so a typo would pass silently. -EINVAL with a message. */
static int check_parameters(ModuleContext *c, const ModuleInfo *info, const char *options, char **ret_message) {
        _cleanup_free_ char *copy = options ? strdup(options) : NULL;
        char *save = NULL;

        if (options && !copy)
                return -ENOMEM;
        for (char *w = copy ? strtok_r(copy, " \t", &save) : NULL; w; w = strtok_r(NULL, " \t", &save)) {
                _cleanup_free_ char *name = strndup(w, strcspn(w, "=")), *display = NULL, *known = NULL;

                if (!name)
                        return -ENOMEM;
                if (generic_parameter(name) || strv_contains(info->parameters, name))
                        continue;
                display = module_name_display(info->kernel_name);
                known = info->parameters ? strv_join(info->parameters, ", ") : NULL;
                if (ret_message)
                        *ret_message = strprintf(
                                "Not loading %s (%s): it has no parameter \"%s\" (given as \"%s\" in driver.parameters "
                                "or a modprobe.d options line); the kernel would ignore it with only a warning in "
                                "dmesg. Fix the name; %s %s.",
                                strna(display), info->filename, name, w,
                                known ? "its parameters are:" : "it takes no parameters", strempty(known));
                return -EINVAL;
        }
        return 0;
}

static int load_one(ModuleContext *c, const char *name, const char *options, unsigned depth, char **ret_message);

/* Loads each module of list (softdeps) by its kernel name; what names it in the message. */
static int load_list(ModuleContext *c, struct kmod_list *list, const char *display, const char *what,
                     unsigned depth, char **ret_message) {
        struct kmod_list *l;

        kmod_list_foreach(l, list) {
                _cleanup_(module_kmod_unrefp) struct kmod_module *dep = kmod_module_get_module(l);
                _cleanup_free_ char *kname = NULL, *inner = NULL, *ddisplay = NULL;
                int r;

                if (!kmod_module_get_path(dep)) {
                        module_debug(c, "%s of %s: %s is not in modules.dep, skipped as modprobe does", what, display,
                                     kmod_module_get_name(dep));
                        continue;
                }
                kname = kernel_name_of(c, kmod_module_get_name(dep));
                ddisplay = kname ? module_name_display(kname) : NULL;
                if (!ddisplay)
                        return -ENOMEM;
                r = load_one(c, kname, NULL, depth + 1, &inner);
                if (r < 0) {
                        *ret_message = strprintf("Cannot load %s: modprobe.d's %s %s failed. %s", display, what,
                                                 ddisplay, strna(inner));
                        return r;
                }
        }
        return 0;
}

/* The modprobe.d softdeps of the module, under both of its names (kernel name and file name). */
static int load_softdeps(ModuleContext *c, const ModuleInfo *info, bool pre, const char *display, unsigned depth,
                         char **ret_message) {
        const char *names[] = { info->kernel_name, info->index_name };

        for (size_t i = 0; i < ELEMENTSOF(names); i++) {
                _cleanup_(module_kmod_unrefp) struct kmod_module *mod = NULL;
                _cleanup_(module_kmod_unref_listp) struct kmod_list *pre_l = NULL, *post_l = NULL;
                int r;

                if (i > 0 && streq(names[i], names[0]))
                        continue;
                if (kmod_module_new_from_name(c->kmod, names[i], &mod) < 0 ||
                    kmod_module_get_softdeps(mod, &pre_l, &post_l) < 0)
                        continue;
                r = load_list(c, pre ? pre_l : post_l, display, pre ? "softdep pre:" : "softdep post:", depth,
                              ret_message);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* The insert of info's file itself, its hard dependencies first (each by its kernel name, so their
 * modprobe.d rules apply too). 1 loaded now, 0 already there. */
static int insert_file(ModuleContext *c, const ModuleInfo *info, const char *options, const char *display,
                       unsigned depth, char **ret_message) {
        _cleanup_(module_kmod_unrefp) struct kmod_module *mod = NULL;
        _cleanup_free_ char *effective = NULL;
        int r;

        STRV_FOREACH(dep, info->depends) {
                _cleanup_free_ char *inner = NULL, *ddisplay = module_name_display(*dep);

                if (!ddisplay)
                        return -ENOMEM;
                r = load_one(c, *dep, NULL, depth + 1, &inner);
                if (r < 0) {
                        *ret_message = strprintf("Cannot load %s, which needs %s. %s", display, ddisplay, strna(inner));
                        return r;
                }
        }

        effective = module_effective_options(c, info, options);
        if (!effective)
                return -ENOMEM;
        r = check_parameters(c, info, effective, ret_message);
        if (r < 0)
                return r;
        r = kmod_module_new_from_path(c->kmod, info->filename, &mod);
        if (r < 0)
                return r;
        module_debug(c, "loading %s from %s with options \"%s\"", display, info->filename, effective);
        r = kmod_module_insert_module(mod, 0, effective);
        if (r == -EEXIST)
                return 0;
        if (r < 0) {
                *ret_message = module_load_error_message(c, info, r, effective);
                return r;
        }
        return 1;
}

/* A modprobe.d install command, as modprobe would run it. Debian's redirects ("modprobe nvidia ;
 * modprobe -i nvidia-current $CMDLINE_OPTS") are done here, without a shell: each modprobe of another
 * module loads that module, and the one whose kernel name is ours inserts that file. Anything else
 * (an administrator's `install nvidia /bin/false`) runs as it is, and the module must be live after. */
static int run_install(ModuleContext *c, const ModuleInfo *info, const char *key, const char *cmd, const char *options,
                       const char *display, unsigned depth, char **ret_message) {
        char ***calls = NULL;
        int r, loaded = 0;

        r = parse_modprobe_command(cmd, false, &calls);
        if (r < 0)
                return r;
        if (r == 0) {
                int status = run_config_command(c, key, cmd, options);
                if (status < 0) {
                        *ret_message = strprintf("Cannot run the modprobe.d install command for %s (\"%s\"): %s.",
                                                 display, cmd, strerror(-status));
                        return status;
                }
                if (module_is_usable(c, info->kernel_name))
                        return 1;
                if (status == 0)
                        *ret_message = strprintf("Not loading %s: modprobe.d says \"install %s %s\", and that command "
                                                 "exited 0 without loading it. The agent honours install commands as "
                                                 "modprobe does: remove or fix that line to let it load %s.",
                                                 display, key, cmd, display);
                else
                        *ret_message = strprintf("Not loading %s: modprobe.d says \"install %s %s\", and that command "
                                                 "failed with exit status %d. The agent honours install commands as "
                                                 "modprobe does: remove or fix that line to let it load %s.",
                                                 display, key, cmd, status, display);
                return -ECANCELED;
        }

        for (size_t i = 0; calls[i]; i++) {
                _cleanup_free_ char *kname = kernel_name_of(c, calls[i][0]);
                _cleanup_free_ char *inner = NULL;

                if (!kname) {
                        r = -ENOMEM;
                        break;
                }
                if (!streq(kname, info->kernel_name)) {
                        _cleanup_free_ char *ddisplay = module_name_display(kname);
                        r = load_one(c, kname, NULL, depth + 1, &inner);
                        if (r < 0) {
                                *ret_message = strprintf("Cannot load %s: modprobe.d's install command for it first "
                                                         "loads %s, which failed. %s",
                                                         display, strna(ddisplay), strna(inner));
                                break;
                        }
                        continue;
                }
                /* The module itself, from the file the command names (nvidia-current.ko). */
                _cleanup_(module_kmod_unrefp) struct kmod_module *mod = NULL;
                _cleanup_module_info_free_ ModuleInfo *target = NULL;
                if (kmod_module_new_from_name(c->kmod, calls[i][0], &mod) >= 0 && kmod_module_get_path(mod) &&
                    module_info_from_kmod(c, mod, &target) >= 0)
                        r = insert_file(c, target, options, display, depth, ret_message);
                else
                        r = insert_file(c, info, options, display, depth, ret_message);
                if (r < 0)
                        break;
                loaded = r;
        }
        calls_free(calls);
        return r < 0 ? r : loaded;
}

#define LOAD_MAX_DEPTH 8

static int load_one(ModuleContext *c, const char *name, const char *options, unsigned depth, char **ret_message) {
        _cleanup_module_info_free_ ModuleInfo *info = NULL;
        _cleanup_free_ char *display = module_name_display(name), *msg = NULL, *effective = NULL;
        const char *cmd, *key = NULL;
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
        if (depth > LOAD_MAX_DEPTH)
                return load_failed(c, name, -ELOOP,
                                   strprintf("Cannot load %s: its modprobe.d softdeps and install commands name each "
                                             "other in a loop.",
                                             display),
                                   ret_message);

        r = module_lookup(c, name, &info, &msg);
        if (r >= 0)
                r = module_check_vermagic(c, info, &msg);
        if (r >= 0) {
                effective = module_effective_options(c, info, options);
                if (!effective)
                        return -ENOMEM;
                r = module_check_firmware(c, info, effective, &msg);
        }
        if (r >= 0)
                r = check_parameters(c, info, effective, &msg);
        if (r < 0)
                return load_failed(c, name, r, TAKE_PTR(msg), ret_message);

        /* As modprobe: softdep pre: modules, the module (through its install command if modprobe.d has
         * one), softdep post: modules. Blacklists do not apply to modules loaded by name. */
        r = load_softdeps(c, info, true, display, depth, &msg);
        if (r < 0)
                return load_failed(c, name, r, TAKE_PTR(msg), ret_message);
        cmd = config_command(c, info, true, &key);
        if (cmd)
                r = run_install(c, info, key, cmd, options, display, depth, &msg);
        else
                r = insert_file(c, info, options, display, depth, &msg);
        if (r < 0)
                return load_failed(c, name, r, TAKE_PTR(msg), ret_message);
        r = load_softdeps(c, info, false, display, depth, &msg);
        if (r < 0) {
                _cleanup_free_ char *full = strprintf("%s (%s itself is loaded.)", strna(msg), display);
                return load_failed(c, name, r, TAKE_PTR(full), ret_message);
        }
        module_failure_set(c, name, NULL);
        return 1;
}

int module_load(ModuleContext *c, const char *name, const char *options, char **ret_message) {
        int state = module_get_state(c, name);

        /* 0 = it already was live (nothing touched); load_one() reports 1 for anything it did. */
        if (state == MODULE_STATE_LIVE || state == MODULE_STATE_BUILTIN || state == MODULE_STATE_COMING) {
                module_failure_set(c, name, NULL);
                return 0;
        }
        return load_one(c, name, options, 0, ret_message);
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

/* modprobe.d's remove command for a loaded module, as `modprobe -r` honours it: Debian's
 * "modprobe -r -i nvidia-drm nvidia-modeset … nvidia" only lists what the holder-ordered removal here
 * does anyway (0: remove it ourselves); anything else runs, and the module must be gone after (1), else
 * -ECANCELED with a message. */
static int run_remove(ModuleContext *c, const char *name, const char *display, char **ret_message) {
        _cleanup_module_info_free_ ModuleInfo *info = NULL;
        ModuleInfo bare = { .kernel_name = (char *) name, .index_name = (char *) name };
        const char *cmd, *key = NULL;
        char ***calls = NULL;
        int r, status;

        if (module_lookup(c, name, &info, NULL) < 0)
                info = NULL;
        cmd = config_command(c, info ?: &bare, false, &key);
        if (!cmd)
                return 0;
        r = parse_modprobe_command(cmd, true, &calls);
        calls_free(calls);
        if (r != 0)
                return r < 0 ? r : 0;
        status = run_config_command(c, key, cmd, NULL);
        if (status == 0 && module_get_state(c, name) == MODULE_STATE_ABSENT)
                return 1;
        if (ret_message)
                *ret_message = status < 0
                        ? strprintf("Cannot run the modprobe.d remove command for %s (\"%s\"): %s.", display, cmd,
                                    strerror(-status))
                        : strprintf("Not unloading %s: modprobe.d says \"remove %s %s\", and that command %s. The "
                                    "agent honours remove commands as modprobe -r does: remove or fix that line to let "
                                    "it unload %s.",
                                    display, key, cmd, status == 0 ? "exited 0 but left it loaded" : "failed", display);
        return status < 0 ? status : -ECANCELED;
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
                        _cleanup_(module_kmod_unrefp) struct kmod_module *mod = NULL;
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

                        r = run_remove(c, todo[i], display, ret_message);
                        if (r < 0)
                                return r;
                        if (r > 0) {
                                /* modprobe.d's remove command did it. */
                                if (strv_consume(&removed, TAKE_PTR(display)) < 0)
                                        return -ENOMEM;
                                free(todo[i]);
                                memmove(todo + i, todo + i + 1, (strv_length(todo + i + 1) + 1) * sizeof(char *));
                                progress = true;
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
