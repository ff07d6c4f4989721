/* SPDX-License-Identifier: MIT */
/* Owns the module context (libkmod on an explicit modules directory and modprobe.d list, its log
 * routed to the caller), module lookup by kernel name with Debian's packaged names, modinfo, the
 * kernel's state read from the configured sysfs, pre-load checks (vermagic, firmware) and the
 * per-module status for D-Bus. Loading and unloading live in module-load.c. */
#include <stdarg.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <syslog.h>

#include "fileio.h"
#include "module-internal.h"
#include "string-table.h"
#include "strv.h"

static const char *const module_state_table[_MODULE_STATE_MAX] = {
        [MODULE_STATE_LIVE] = "live",       [MODULE_STATE_COMING] = "coming",
        [MODULE_STATE_GOING] = "going",     [MODULE_STATE_BUILTIN] = "builtin",
        [MODULE_STATE_ABSENT] = "absent",   [MODULE_STATE_MISSING] = "missing",
        [MODULE_STATE_STALE] = "stale",     [MODULE_STATE_FAILED] = "failed",
};

DEFINE_STRING_TABLE_LOOKUP(module_state, ModuleState, module_state_table, _MODULE_STATE_MAX, _MODULE_STATE_INVALID)

void module_debug(ModuleContext *c, const char *fmt, ...) {
        _cleanup_free_ char *m = NULL;
        va_list ap;

        if (!c->log_func || c->log_max_priority < LOG_DEBUG)
                return;
        va_start(ap, fmt);
        if (vasprintf(&m, fmt, ap) < 0)
                m = NULL;
        va_end(ap);
        if (m)
                c->log_func(c->log_userdata, LOG_DEBUG, m);
}

/* libkmod's log callback: one formatted line to the caller's function. */
_printf_(6, 0) static void kmod_log_trampoline(void *data, int priority, const char *file, int line, const char *fn,
                                const char *format, va_list args) {
        ModuleContext *c = data;
        _cleanup_free_ char *m = NULL;

        if (!c->log_func || priority > c->log_max_priority)
                return;
        if (vasprintf(&m, format, args) < 0)
                return;
        strstrip_trailing(m);
        c->log_func(c->log_userdata, priority, m);
}

char *module_name_normalize(const char *name) {
        char *n = strdup(name);
        for (char *p = n; p && *p; p++)
                if (*p == '-')
                        *p = '_';
        return n;
}

char *module_name_display(const char *name) {
        char *n = strdup(name);
        /* NVIDIA's file names use dashes; the kernel's own modules (ib_core) keep underscores. */
        if (!n || !startswith(n, "nvidia"))
                return n;
        for (char *p = n; *p; p++)
                if (*p == '_')
                        *p = '-';
        return n;
}

char *module_sys_path(ModuleContext *c, const char *name, const char *sub) {
        _cleanup_free_ char *n = module_name_normalize(name);
        if (!n)
                return NULL;
        return sub ? strprintf("%s/module/%s/%s", c->sys_dir, n, sub) : strprintf("%s/module/%s", c->sys_dir, n);
}

int module_context_new(const ModuleContextConfig *config, ModuleContext **ret) {
        static const char *const no_config[] = { NULL };
        ModuleContext *c;
        struct utsname u;

        assert(config);
        assert(ret);

        if (isempty(config->modules_dir))
                return -EINVAL;
        c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        c->modules_dir = strdup(config->modules_dir);
        c->sys_dir = strdup(config->sys_dir ?: "/sys");
        c->firmware_dir = strdup(config->firmware_dir ?: "/lib/firmware");
        if (config->kernel_release)
                c->kernel_release = strdup(config->kernel_release);
        else if (uname(&u) >= 0)
                c->kernel_release = strdup(u.release);
        if (!c->modules_dir || !c->sys_dir || !c->firmware_dir || !c->kernel_release) {
                module_context_free(c);
                return -ENOMEM;
        }

        /* Never NULL: libkmod would fall back to the host's /etc, /run, /lib modprobe.d. */
        c->kmod = kmod_new(c->modules_dir, config->config_paths ?: no_config);
        if (!c->kmod) {
                module_context_free(c);
                return -ENOMEM;
        }
        /* Until the caller routes it, libkmod's log (stderr by default) goes nowhere. */
        c->log_max_priority = -1;
        kmod_set_log_fn(c->kmod, kmod_log_trampoline, c);
        kmod_set_log_priority(c->kmod, LOG_ERR);

        *ret = c;
        return 0;
}

ModuleContext *module_context_free(ModuleContext *c) {
        if (!c)
                return NULL;
        kmod_unref(c->kmod);
        free(c->modules_dir);
        free(c->sys_dir);
        free(c->firmware_dir);
        free(c->kernel_release);
        free(c->running_flags);
        strv_free(c->failed_names);
        strv_free(c->failed_messages);
        return mfree(c);
}

void module_context_set_log(ModuleContext *c, ModuleLogFunc func, void *userdata, int max_priority) {
        c->log_func = func;
        c->log_userdata = userdata;
        c->log_max_priority = func ? max_priority : -1;
        kmod_set_log_priority(c->kmod, func ? max_priority : LOG_ERR);
}

static const char *const module_flavour_table[_MODULE_FLAVOUR_MAX] = {
        [MODULE_FLAVOUR_ANY] = "any",
        [MODULE_FLAVOUR_OPEN] = "open",
        [MODULE_FLAVOUR_PROPRIETARY] = "proprietary",
};

DEFINE_STRING_TABLE_LOOKUP_TO_STRING(module_flavour, ModuleFlavour, module_flavour_table, _MODULE_FLAVOUR_MAX)

void module_context_set_flavour(ModuleContext *c, ModuleFlavour f) {
        c->flavour = f;
}

ModuleFlavour module_context_get_flavour(const ModuleContext *c) {
        return c->flavour;
}

struct kmod_ctx *module_context_get_kmod(ModuleContext *c) {
        return c->kmod;
}

int module_get_state(ModuleContext *c, const char *name) {
        _cleanup_free_ char *p = module_sys_path(c, name, "initstate"), *dir = module_sys_path(c, name, NULL),
                            *s = NULL;
        struct stat st;
        int r;

        if (!p || !dir)
                return -ENOMEM;
        r = read_one_line_file(p, &s);
        if (r == -ENOENT) {
                /* The kernel makes /sys/module/<name> for built-in modules too (with their
                 * parameters) but gives initstate only to loadable ones. */
                if (stat(dir, &st) >= 0 && S_ISDIR(st.st_mode))
                        return MODULE_STATE_BUILTIN;
                return MODULE_STATE_ABSENT;
        }
        if (r < 0)
                return r;
        if (streq(s, "live"))
                return MODULE_STATE_LIVE;
        if (streq(s, "coming"))
                return MODULE_STATE_COMING;
        if (streq(s, "going"))
                return MODULE_STATE_GOING;
        return -EBADMSG;
}

bool module_is_usable(ModuleContext *c, const char *name) {
        int s = module_get_state(c, name);
        return s == MODULE_STATE_LIVE || s == MODULE_STATE_BUILTIN;
}

ModuleInfo *module_info_free(ModuleInfo *i) {
        if (!i)
                return NULL;
        free(i->kernel_name);
        free(i->index_name);
        free(i->filename);
        free(i->version);
        free(i->vermagic);
        free(i->license);
        free(i->signer);
        free(i->sig_key);
        strv_free(i->depends);
        strv_free(i->firmware);
        strv_free(i->parameters);
        strv_free(i->softdeps);
        return mfree(i);
}

static int set_string(char **field, const char *value) {
        char *v = strdup(value);
        if (!v)
                return -ENOMEM;
        free(*field);
        *field = v;
        return 0;
}

static int split_depends(ModuleInfo *info, const char *value) {
        _cleanup_free_ char *copy = module_name_normalize(value);
        char *save = NULL;

        if (!copy)
                return -ENOMEM;
        for (char *w = strtok_r(copy, ",", &save); w; w = strtok_r(NULL, ",", &save))
                if (*w && strv_extend(&info->depends, w) < 0)
                        return -ENOMEM;
        return 0;
}

int module_info_from_kmod(ModuleContext *c, struct kmod_module *mod, ModuleInfo **ret) {
        _cleanup_(module_kmod_info_free_listp) struct kmod_list *list = NULL;
        _cleanup_module_info_free_ ModuleInfo *info = NULL;
        struct kmod_list *l;
        const char *path = kmod_module_get_path(mod);
        int r;

        if (!path)
                return -ENOENT;
        info = calloc(1, sizeof(*info));
        if (!info)
                return -ENOMEM;
        info->filename = strdup(path);
        info->index_name = strdup(kmod_module_get_name(mod));
        if (!info->filename || !info->index_name)
                return -ENOMEM;

        r = kmod_module_get_info(mod, &list);
        if (r < 0)
                return r;
        kmod_list_foreach(l, list) {
                const char *k = kmod_module_info_get_key(l), *v = kmod_module_info_get_value(l);
                if (!k || !v)
                        continue;
                if (streq(k, "name"))
                        r = set_string(&info->kernel_name, v);
                else if (streq(k, "version"))
                        r = set_string(&info->version, v);
                else if (streq(k, "vermagic"))
                        r = set_string(&info->vermagic, v);
                else if (streq(k, "license"))
                        r = set_string(&info->license, v);
                else if (streq(k, "signer"))
                        r = set_string(&info->signer, v);
                else if (streq(k, "sig_key"))
                        r = set_string(&info->sig_key, v);
                else if (streq(k, "depends"))
                        r = split_depends(info, v);
                else if (streq(k, "firmware"))
                        r = strv_extend(&info->firmware, v);
                else if (streq(k, "softdep"))
                        r = strv_extend(&info->softdeps, v);
                else if ((streq(k, "parm") || streq(k, "parmtype")) && strchr(v, ':')) {
                        _cleanup_free_ char *pn = strndup(v, strcspn(v, ":"));
                        r = !pn ? -ENOMEM
                                : strv_contains(info->parameters, pn) ? 0 : strv_consume(&info->parameters, TAKE_PTR(pn));
                }
                else
                        r = 0;
                if (r < 0)
                        return r;
        }
        strv_sort(info->parameters);
        /* Modules from before name= was added (Linux 5.3) are known by their file name. */
        r = set_string(&info->kernel_name, info->kernel_name ?: info->index_name);
        if (r < 0)
                return r;
        for (char *p = info->kernel_name; *p; p++)
                if (*p == '-')
                        *p = '_';
        module_debug(c, "modinfo %s: name=%s version=%s vermagic=%s", info->filename, info->kernel_name,
                     strna(info->version), strna(info->vermagic));
        *ret = TAKE_PTR(info);
        return 0;
}

/* modinfo of a module file. */
static int module_info_from_path(ModuleContext *c, const char *path, ModuleInfo **ret) {
        _cleanup_(module_kmod_unrefp) struct kmod_module *mod = NULL;
        int r;

        r = kmod_module_new_from_path(c->kmod, path, &mod);
        if (r < 0)
                return r;
        return module_info_from_kmod(c, mod, ret);
}

/* Debian's nvidia-tesla-<branch> packages, newest branch first, found among modules.dep's keys
 * (libkmod has no listing call but can dump the index). */
static int find_tesla_branches(ModuleContext *c, char ***ret) {
        _cleanup_close_ int fd = -1;
        _cleanup_free_ char *text = NULL;
        _cleanup_strv_free_ char **branches = NULL;
        _cleanup_fclose_ FILE *f = NULL;
        size_t size = 0;
        char *save = NULL;

        fd = memfd_create("modules-dep", MFD_CLOEXEC);
        if (fd < 0)
                return negative_errno();
        if (kmod_dump_index(c->kmod, KMOD_INDEX_MODULES_DEP, fd) < 0) {
                /* No index at all: nothing to find; the lookup reports the missing module. */
                *ret = NULL;
                return 0;
        }
        f = fdopen(TAKE_FD(fd), "re");
        if (!f)
                return negative_errno();
        rewind(f);
        if (getdelim(&text, &size, '\0', f) < 0) {
                *ret = NULL;
                return 0;
        }
        for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
                const char *p = line + strlen("nvidia_tesla_");
                size_t n = 0;

                if (!startswith(line, "nvidia_tesla_"))
                        continue;
                while (p[n] >= '0' && p[n] <= '9')
                        n++;
                if (n == 0 || (p[n] != ' ' && p[n] != '_'))
                        continue;
                _cleanup_free_ char *b = strndup(p, n);
                if (!b)
                        return -ENOMEM;
                if (!strv_contains(branches, b) && strv_consume(&branches, TAKE_PTR(b)) < 0)
                        return -ENOMEM;
        }
        /* Newest first: numerically, "535" > "470". */
        for (size_t i = 1; branches && branches[i]; i++)
                for (size_t j = i; j > 0 && atol(branches[j]) > atol(branches[j - 1]); j--) {
                        char *t = branches[j];
                        branches[j] = branches[j - 1];
                        branches[j - 1] = t;
                }
        *ret = TAKE_PTR(branches);
        return 0;
}

static int lookup_candidates(ModuleContext *c, const char *norm, char ***ret) {
        _cleanup_strv_free_ char **l = NULL, **branches = NULL;
        const char *suffix;
        int r;

        if (strv_extend(&l, norm) < 0)
                return -ENOMEM;
        if (startswith(norm, "nvidia") && (norm[6] == '\0' || norm[6] == '_')) {
                suffix = norm + strlen("nvidia");
                if (strv_extendf(&l, "nvidia_current%s", suffix) < 0 ||
                    strv_extendf(&l, "nvidia_current_open%s", suffix) < 0)
                        return -ENOMEM;
                r = find_tesla_branches(c, &branches);
                if (r < 0)
                        return r;
                STRV_FOREACH(b, branches)
                        if (strv_extendf(&l, "nvidia_tesla_%s%s", *b, suffix) < 0)
                                return -ENOMEM;
        }
        *ret = TAKE_PTR(l);
        return 0;
}

/* Whether a candidate file is of the context's flavour (module_info_is_open()): packaged names by
 * their name, nvidia.ko by its license; other upstream names (nvidia-uvm.ko, "Dual MIT/GPL" in both
 * flavours) pass, since only one flavour is installed under upstream names. */
static bool flavour_matches(ModuleContext *c, const char *norm, const ModuleInfo *info) {
        bool want_open = c->flavour == MODULE_FLAVOUR_OPEN;

        if (streq(norm, "nvidia") || startswith(info->index_name, "nvidia_current") ||
            startswith(info->index_name, "nvidia_tesla"))
                return module_info_is_open(info) == want_open;
        return true;
}

int module_lookup(ModuleContext *c, const char *name, ModuleInfo **ret, char **ret_message) {
        _cleanup_free_ char *norm = module_name_normalize(name), *display = module_name_display(name),
                            *stale_path = NULL, *other_flavour = NULL;
        _cleanup_strv_free_ char **candidates = NULL;
        int r;

        if (!norm || !display)
                return -ENOMEM;
        r = lookup_candidates(c, norm, &candidates);
        if (r < 0)
                return r;
        STRV_FOREACH(cand, candidates) {
                _cleanup_(module_kmod_unrefp) struct kmod_module *mod = NULL;
                _cleanup_module_info_free_ ModuleInfo *info = NULL;

                r = kmod_module_new_from_name(c->kmod, *cand, &mod);
                if (r < 0)
                        return r;
                if (!kmod_module_get_path(mod))
                        continue; /* not in modules.dep */
                if (access(kmod_module_get_path(mod), F_OK) < 0 && errno == ENOENT) {
                        /* modules.dep names a file that is gone (removed without depmod): say
                         * which, and keep looking at the other candidates. */
                        module_debug(c, "modules.dep names %s, which does not exist", kmod_module_get_path(mod));
                        if (!stale_path && !(stale_path = strdup(kmod_module_get_path(mod))))
                                return -ENOMEM;
                        continue;
                }
                r = module_info_from_kmod(c, mod, &info);
                if (r < 0) {
                        if (ret_message)
                                *ret_message = strprintf(
                                        "Cannot read kernel module %s (%s): %s; if the file was removed, run depmod %s.",
                                        display, kmod_module_get_path(mod), strerror(-r), c->kernel_release);
                        return r;
                }
                if (!streq(info->kernel_name, norm)) {
                        module_debug(c, "%s is kernel module %s, not %s", info->filename, info->kernel_name, norm);
                        continue;
                }
                if (c->flavour != MODULE_FLAVOUR_ANY && startswith(norm, "nvidia") &&
                    !flavour_matches(c, norm, info)) {
                        module_debug(c, "%s is not of the %s flavour", info->filename,
                                     module_flavour_to_string(c->flavour));
                        if (!other_flavour && !(other_flavour = strdup(info->filename)))
                                return -ENOMEM;
                        continue;
                }
                module_debug(c, "kernel module %s is %s", norm, info->filename);
                *ret = TAKE_PTR(info);
                return 0;
        }

        if (other_flavour) {
                bool want_open = c->flavour == MODULE_FLAVOUR_OPEN;
                if (ret_message)
                        *ret_message = strprintf(
                                "No %s %s module for kernel %s: only the %s one is installed (%s); install the %s "
                                "kernel modules (Debian: %s; NVIDIA's repositories: %s).",
                                want_open ? "open" : "proprietary", display, c->kernel_release,
                                want_open ? "proprietary" : "open", other_flavour, want_open ? "open" : "proprietary",
                                want_open ? "nvidia-open-kernel-dkms" : "nvidia-kernel-dkms",
                                want_open ? "nvidia-open, kmod-nvidia-open-dkms" : "cuda-drivers, kmod-nvidia-latest-dkms");
                return -ENOPKG;
        }
        if (ret_message && stale_path)
                *ret_message = strprintf(
                        "The module index of kernel %s (%s/modules.dep) names %s for %s, but that file does not "
                        "exist (it was removed without running depmod); reinstall the package that provided it "
                        "or rebuild it with DKMS (dkms autoinstall -k %s), or run depmod %s if it is gone for good.",
                        c->kernel_release, c->modules_dir, stale_path, display, c->kernel_release,
                        c->kernel_release);
        else if (ret_message) {
                if (strv_length(candidates) > 1)
                        *ret_message = strprintf(
                                "No kernel module %s for kernel %s in %s (looked for %s.ko, nvidia-current%s.ko, "
                                "nvidia-current-open%s.ko and nvidia-tesla-<branch>%s.ko); build it with DKMS: "
                                "dkms autoinstall -k %s.",
                                display, c->kernel_release, c->modules_dir, display, display + strlen("nvidia"),
                                display + strlen("nvidia"), display + strlen("nvidia"), c->kernel_release);
                else
                        *ret_message = strprintf(
                                "No kernel module %s for kernel %s in %s; install the package that provides it "
                                "for this kernel, or check the module name.",
                                display, c->kernel_release, c->modules_dir);
        }
        return -ENOENT;
}

char *module_vermagic_release(const char *vermagic) {
        size_t n;
        if (!vermagic)
                return NULL;
        vermagic += strspn(vermagic, " \t");
        n = strcspn(vermagic, " \t");
        return n > 0 ? strndup(vermagic, n) : NULL;
}

/* The vermagic flags ("SMP preempt mod_unload modversions") of the running kernel, from the first
 * in-tree module (kernel/…) in modules.dep whose vermagic names the running release; cached. NULL when
 * no such module is found (then nothing can be compared). */
static const char *running_vermagic_flags(ModuleContext *c) {
        _cleanup_free_ char *dep = NULL, *text = NULL;
        char *save = NULL;
        unsigned tried = 0;

        if (c->running_flags_known)
                return c->running_flags;
        c->running_flags_known = true;
        dep = path_join(c->modules_dir, "modules.dep");
        if (!dep || read_full_file(dep, 64 * 1024 * 1024, &text, NULL) < 0)
                return NULL;
        for (char *line = strtok_r(text, "\n", &save); line && tried < 20; line = strtok_r(NULL, "\n", &save)) {
                _cleanup_free_ char *path = NULL, *release = NULL;
                _cleanup_module_info_free_ ModuleInfo *info = NULL;
                char *colon = strchr(line, ':');

                if (!startswith(line, "kernel/") || !colon)
                        continue;
                tried++;
                path = strprintf("%s/%.*s", c->modules_dir, (int) (colon - line), line);
                if (!path || module_info_from_path(c, path, &info) < 0 || !info->vermagic)
                        continue;
                release = module_vermagic_release(info->vermagic);
                if (!release || !streq(release, c->kernel_release))
                        continue;
                const char *flags = info->vermagic + strspn(info->vermagic, " \t");
                flags += strcspn(flags, " \t");
                c->running_flags = strdup(flags + strspn(flags, " \t"));
                if (c->running_flags)
                        strstrip_trailing(c->running_flags);
                return c->running_flags;
        }
        return NULL;
}

/* Whether the kernel accepts info's module despite another release in its vermagic: 1 when the
 * release is the running one, or when the rest of the vermagic equals the running kernel's and names
 * modversions; 0 when no in-tree module names the running release, or negative errno. */
static int module_vermagic_compatible(ModuleContext *c, const ModuleInfo *info) {
        _cleanup_free_ char *release = module_vermagic_release(info->vermagic), *flags = NULL;
        const char *running, *p;

        if (!release || streq(release, c->kernel_release))
                return 1;
        running = running_vermagic_flags(c);
        if (!running)
                return 0;
        p = info->vermagic + strspn(info->vermagic, " \t");
        p += strcspn(p, " \t");
        flags = strdup(p + strspn(p, " \t"));
        if (!flags)
                return -ENOMEM;
        strstrip_trailing(flags);
        /* The kernel skips the release only with MODVERSIONS (then the symbol CRCs decide). */
        return streq(flags, running) && strstr(flags, "modversions") ? 1 : 0;
}

int module_check_vermagic(ModuleContext *c, const ModuleInfo *info, char **ret_message) {
        _cleanup_free_ char *release = module_vermagic_release(info->vermagic), *dir = NULL;
        const char *slash;
        int r;

        if (!release || streq(release, c->kernel_release))
                return 0; /* without a vermagic the kernel's own check decides */
        r = module_vermagic_compatible(c, info);
        if (r < 0)
                return r;
        if (r > 0) {
                /* RHEL's weak-updates, or a module carried over on purpose: the kernel accepts it. */
                module_debug(c, "%s was built for kernel %s; its vermagic otherwise matches the running %s "
                             "(MODVERSIONS), so the kernel's symbol check decides",
                             info->filename, release, c->kernel_release);
                return 0;
        }
        slash = strrchr(info->filename, '/');
        dir = slash ? strndup(info->filename, slash - info->filename) : strdup(".");
        if (ret_message)
                *ret_message = strprintf("%s in %s was built for kernel %s, not the running %s%s; rebuild it with "
                                         "DKMS: dkms autoinstall -k %s.",
                                         slash ? slash + 1 : info->filename, strna(dir), release,
                                         c->kernel_release,
                                         running_vermagic_flags(c) ? ", and its vermagic flags differ from the "
                                                                     "running kernel's"
                                                                   : "",
                                         c->kernel_release);
        return -ESTALE;
}

/* Whether options turn GSP firmware off: the last NVreg_EnableGpuFirmware= wins, as the kernel parses
 * parameters in order; its low 4 bits are the mode (0 = disabled, 1 = enabled, 2 = default). */
static bool options_disable_gsp(const char *options) {
        _cleanup_free_ char *copy = options ? strdup(options) : NULL;
        bool off = false;
        char *save = NULL;

        for (char *w = copy ? strtok_r(copy, " \t", &save) : NULL; w; w = strtok_r(NULL, " \t", &save)) {
                const char *v = w + strlen("NVreg_EnableGpuFirmware=");
                char *end = NULL;
                unsigned long n;

                if (!startswith(w, "NVreg_EnableGpuFirmware="))
                        continue;
                errno = 0;
                n = strtoul(v, &end, 0);
                if (errno == 0 && end != v && *end == '\0')
                        off = (n & 0xF) == 0;
        }
        return off;
}

bool module_info_is_open(const ModuleInfo *info) {
        if (!info)
                return false;
        /* Debian's packaged names say it: nvidia-current-open*.ko (nvidia-open-kernel-dkms) against
         * nvidia-current*.ko and nvidia-tesla-*.ko. */
        if (info->index_name && (startswith(info->index_name, "nvidia_current") ||
                                 startswith(info->index_name, "nvidia_tesla")))
                return strstr(info->index_name, "_open") != NULL;
        /* Upstream names: nvidia.ko of the open modules is "Dual MIT/GPL", the proprietary one "NVIDIA"
         * (nvidia-uvm and nvidia-drm are "Dual MIT/GPL" in both, so only nvidia.ko tells). */
        return info->license && strstr(info->license, "MIT");
}

/* Where the kernel's firmware loader looks, in its order (drivers/base/firmware_loader/main.c), below
 * the firmware directory (<root>/lib/firmware): updates/<release>, updates, <release>, itself. */
static int find_firmware(ModuleContext *c, const char *fw, bool *ret_found) {
        static const char *const suffixes[] = { "", ".xz", ".zst" };
        const char *subdirs[] = { "updates/", "updates/", "", "" };
        const bool with_release[] = { true, false, true, false };

        for (size_t d = 0; d < ELEMENTSOF(subdirs); d++)
                for (size_t i = 0; i < ELEMENTSOF(suffixes); i++) {
                        _cleanup_free_ char *p = strprintf("%s/%s%s%s%s%s", c->firmware_dir, subdirs[d],
                                                           with_release[d] ? c->kernel_release : "",
                                                           with_release[d] ? "/" : "", fw, suffixes[i]);
                        if (!p)
                                return -ENOMEM;
                        if (access(p, F_OK) >= 0) {
                                *ret_found = true;
                                return 0;
                        }
                }
        *ret_found = false;
        return 0;
}

int module_check_firmware(ModuleContext *c, const ModuleInfo *info, const char *options, char **ret_message) {
        STRV_FOREACH(fw, info->firmware) {
                bool found = false;
                int r = find_firmware(c, *fw, &found);

                if (r < 0)
                        return r;
                if (found)
                        continue;
                if (!module_info_is_open(info) && options_disable_gsp(options)) {
                        /* The proprietary module runs without GSP then; the open one cannot. */
                        module_debug(c, "firmware %s is missing, but GSP is off (NVreg_EnableGpuFirmware): not "
                                     "needed", *fw);
                        continue;
                }
                if (ret_message) {
                        _cleanup_free_ char *display = module_name_display(info->kernel_name);
                        _cleanup_free_ char *branch =
                                info->version ? strndup(info->version, strcspn(info->version, ".")) : NULL;
                        *ret_message = strprintf(
                                "Kernel module %s needs the firmware file %s, which is missing from %s (searched "
                                "updates/%s, updates, %s and the directory itself, as the kernel does); install "
                                "the GSP firmware package of driver %s (Debian: firmware-nvidia-gsp; NVIDIA's "
                                "repositories: nvidia-firmware-%s)%s.",
                                strna(display), *fw, c->firmware_dir, c->kernel_release, c->kernel_release,
                                info->version ?: "(unknown version)", branch ?: "<branch>",
                                module_info_is_open(info) ? ""
                                                          : ", or run the proprietary module without GSP "
                                                            "(options nvidia NVreg_EnableGpuFirmware=0; not on "
                                                            "Blackwell and newer GPUs)");
                }
                return -ENOENT;
        }
        return 0;
}

int module_get_holders(ModuleContext *c, const char *name, char ***ret_holders, unsigned *ret_refcnt) {
        _cleanup_free_ char *hp = module_sys_path(c, name, "holders"), *rp = module_sys_path(c, name, "refcnt"),
                            *rc = NULL;
        _cleanup_strv_free_ char **holders = NULL;
        _cleanup_closedir_ DIR *d = NULL;
        struct dirent *de;
        unsigned refcnt = 0;

        if (!hp || !rp)
                return -ENOMEM;
        d = opendir(hp);
        if (!d && errno != ENOENT)
                return negative_errno();
        while (d && (de = readdir(d)))
                if (de->d_name[0] != '.' && strv_extend(&holders, de->d_name) < 0)
                        return -ENOMEM;
        strv_sort(holders);
        if (read_one_line_file(rp, &rc) >= 0)
                refcnt = (unsigned) strtoul(rc, NULL, 10);
        if (ret_holders)
                *ret_holders = TAKE_PTR(holders);
        if (ret_refcnt)
                *ret_refcnt = refcnt;
        return 0;
}

void module_failure_set(ModuleContext *c, const char *name, const char *message) {
        _cleanup_free_ char *n = module_name_normalize(name);
        size_t i = 0;

        if (!n)
                return;
        for (; c->failed_names && c->failed_names[i]; i++)
                if (streq(c->failed_names[i], n))
                        break;
        if (c->failed_names && c->failed_names[i]) {
                char *m = message ? strdup(message) : NULL;
                if (message && !m)
                        return;
                free(c->failed_messages[i]);
                c->failed_messages[i] = m ?: strdup("");
                return;
        }
        if (!message)
                return;
        /* Both lists grow together; on OOM the failure is simply not remembered. */
        if (strv_extend(&c->failed_messages, message) < 0)
                return;
        if (strv_consume(&c->failed_names, TAKE_PTR(n)) < 0) {
                size_t last = strv_length(c->failed_messages) - 1;
                free(c->failed_messages[last]);
                c->failed_messages[last] = NULL;
        }
}

const char *module_failure_get(ModuleContext *c, const char *name) {
        _cleanup_free_ char *n = module_name_normalize(name);

        for (size_t i = 0; n && c->failed_names && c->failed_names[i]; i++)
                if (streq(c->failed_names[i], n))
                        return isempty(c->failed_messages[i]) ? NULL : c->failed_messages[i];
        return NULL;
}

int module_status(ModuleContext *c, const char *name, ModuleStatus *ret) {
        _cleanup_module_info_free_ ModuleInfo *info = NULL;
        _cleanup_free_ char *display = module_name_display(name), *detail = NULL, *msg = NULL;
        const char *failure;
        int state, r;

        if (!display)
                return -ENOMEM;
        state = module_get_state(c, name);
        if (state < 0)
                return state;

        if (state != MODULE_STATE_ABSENT) {
                _cleanup_free_ char *vp = module_sys_path(c, name, "version");
                if (!vp)
                        return -ENOMEM;
                if (read_one_line_file(vp, &detail) < 0 && module_lookup(c, name, &info, NULL) >= 0 && info->version)
                        detail = strdup(info->version);
        } else if ((failure = module_failure_get(c, name))) {
                state = MODULE_STATE_FAILED;
                detail = strdup(failure);
        } else {
                r = module_lookup(c, name, &info, &msg);
                if (r == -ENOENT) {
                        state = MODULE_STATE_MISSING;
                        detail = strprintf("no module for kernel %s", c->kernel_release);
                } else if (r < 0) {
                        state = MODULE_STATE_MISSING;
                        detail = TAKE_PTR(msg);
                } else {
                        _cleanup_free_ char *release = module_vermagic_release(info->vermagic);
                        if (release && !streq(release, c->kernel_release) && module_vermagic_compatible(c, info) <= 0) {
                                state = MODULE_STATE_STALE;
                                detail = strprintf("built for kernel %s", release);
                        } else
                                detail = strdup(info->version ?: "");
                }
        }

        *ret = (ModuleStatus) {
                .name = TAKE_PTR(display),
                .state = state,
                .detail = detail ? TAKE_PTR(detail) : strdup(""),
        };
        if (!ret->detail) {
                module_status_done(ret);
                return -ENOMEM;
        }
        return 0;
}

void module_status_done(ModuleStatus *s) {
        if (!s)
                return;
        s->name = mfree(s->name);
        s->detail = mfree(s->detail);
}
