/* SPDX-License-Identifier: MIT */
/* Owns the kmod syscall trap: a stand-in kernel for libkmod in tests, in the way kmod's own testsuite
 * fakes the kernel. Preloaded (LD_PRELOAD=kmod-trap.so) or linked into a test binary (under ASan,
 * where preloading fights the sanitizer runtime), it intercepts
 *   - module loads: syscall(SYS_finit_module) (what libkmod 30 uses), syscall(SYS_init_module) and
 *     glibc's init_module() (its fallback on ENOSYS);
 *   - module unloads: glibc's delete_module() (what libkmod 30 uses) and syscall(SYS_delete_module);
 *   - the fixed paths libkmod reads: /sys/module/... through open, open64, openat, openat64, fopen,
 *     fopen64, opendir, stat, stat64, lstat, lstat64, fstatat, fstatat64, access; /proc/modules
 *     (generated from the state) and /proc/cmdline (empty unless the test writes one).
 * The state directory $GNA_KMOD_TRAP_STATE plays /sys: a load creates module/<name>/{initstate,
 * refcnt,holders/,parameters/<p>,version} and a holders/<name> link in each module it depends on;
 * an unload undoes that. Like the kernel, a load refuses an already loaded name (EEXIST) and a module
 * whose depends= are not loaded (ENOENT, the kernel's "Unknown symbol"); an unload refuses a module
 * with holders or references (EAGAIN, as with O_NONBLOCK). The module's name is its .modinfo name=.
 * A module whose .modinfo has trap_init_error=<ERRNO> fails its "init" with it every time (the
 * fixture's nvidia-peermem stub: EINVAL, as NVIDIA's stub does).
 * $GNA_KMOD_TRAP_FAIL="<module>:<ERRNO>[@load|@unload],..." injects errors (EBUSY and EAGAIN default
 * to unloads, the rest to loads); $GNA_KMOD_TRAP_DELAY="<module>:<ms>[@unload],..." makes a load (an unload) take that long. Every call is appended to <state>/.trap/log ("load NAME ARGS",
 * "load-failed NAME ERRNO", "unload NAME", "unload-failed NAME ERRNO") for tests to assert order.
 * $GNA_KMOD_TRAP_DEV=<dir> plays the references open device nodes take: while any process (a walk of
 * the real /proc/<pid>/fd) has a file <dir>/nvidia* open, unloading nvidia fails with EAGAIN, as the
 * kernel refuses to remove a module whose character devices are open.
 * Without $GNA_KMOD_TRAP_STATE paths pass through and loads/unloads fail with EPERM: a test must
 * never reach the real kernel. */

/* meson builds with -D_FILE_OFFSET_BITS=64, which renames open() to open64() etc. in the headers;
 * we must define both names ourselves. */
#undef _FILE_OFFSET_BITS
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

/* Paths are built in fixed PATH_MAX buffers: a truncated one names nothing and fails like a missing
 * file, which is all a test fake needs, so gcc's may-truncate analysis is only noise here. */
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

/* glibc exports these without declaring them. */
int init_module(void *image, unsigned long len, const char *params);
int delete_module(const char *name, unsigned int flags);

#define STATE_ENV "GNA_KMOD_TRAP_STATE"
#define FAIL_ENV "GNA_KMOD_TRAP_FAIL"

#define REAL(ret, name, args)                                                                      \
        static ret(*real_##name) args;                                                             \
        if (!real_##name)                                                                          \
                real_##name = (ret(*) args) dlsym(RTLD_NEXT, #name)

/* ---------------------------------------------------------------- path redirection */

static const char *trap_state(void) {
        const char *s = getenv(STATE_ENV);
        return s && *s ? s : NULL;
}

static bool path_is_under(const char *path, const char *prefix) {
        size_t n = strlen(prefix);
        return strncmp(path, prefix, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

static int mkdir_parents(const char *path) {
        char buf[PATH_MAX];
        if (snprintf(buf, sizeof(buf), "%s", path) >= (int) sizeof(buf))
                return -ENAMETOOLONG;
        for (char *p = buf + 1; *p; p++)
                if (*p == '/') {
                        *p = '\0';
                        if (mkdir(buf, 0755) < 0 && errno != EEXIST)
                                return -errno;
                        *p = '/';
                }
        if (mkdir(buf, 0755) < 0 && errno != EEXIST)
                return -errno;
        return 0;
}

static int write_text(const char *path, const char *text) {
        FILE *f = fopen(path, "we");
        if (!f)
                return -errno;
        fputs(text, f);
        return fclose(f) == 0 ? 0 : -errno;
}

static long read_long(const char *path) {
        char buf[64] = {};
        FILE *f = fopen(path, "re");
        if (!f)
                return 0;
        if (!fgets(buf, sizeof(buf), f))
                buf[0] = '\0';
        fclose(f);
        return strtol(buf, NULL, 10);
}

static bool file_exists(const char *path) {
        return access(path, F_OK) == 0;
}

static void trap_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void trap_log(const char *fmt, ...) {
        char path[PATH_MAX];
        const char *s = trap_state();
        va_list ap;
        FILE *f;

        if (!s)
                return;
        snprintf(path, sizeof(path), "%s/.trap", s);
        (void) mkdir_parents(path);
        snprintf(path, sizeof(path), "%s/.trap/log", s);
        f = fopen(path, "ae");
        if (!f)
                return;
        va_start(ap, fmt);
        vfprintf(f, fmt, ap);
        va_end(ap);
        fputc('\n', f);
        fclose(f);
}

/* Writes what /proc/modules would show for the state: "name size refcnt holders, Live addr". */
static int generate_proc_modules(const char *state, const char *out) {
        char dir[PATH_MAX], p[PATH_MAX];
        struct dirent *de;
        DIR *d;
        FILE *f;

        f = fopen(out, "we");
        if (!f)
                return -errno;
        snprintf(dir, sizeof(dir), "%s/module", state);
        d = opendir(dir);
        while (d && (de = readdir(d))) {
                char holders[1024] = "";
                struct dirent *he;
                DIR *hd;

                if (de->d_name[0] == '.')
                        continue;
                snprintf(p, sizeof(p), "%s/%s/initstate", dir, de->d_name);
                if (!file_exists(p))
                        continue; /* built in: not listed */
                snprintf(p, sizeof(p), "%s/%s/holders", dir, de->d_name);
                hd = opendir(p);
                while (hd && (he = readdir(hd)))
                        if (he->d_name[0] != '.' && strlen(holders) + strlen(he->d_name) + 2 < sizeof(holders)) {
                                strcat(holders, he->d_name);
                                strcat(holders, ",");
                        }
                if (hd)
                        closedir(hd);
                snprintf(p, sizeof(p), "%s/%s/refcnt", dir, de->d_name);
                fprintf(f, "%s 16384 %ld %s Live 0x0000000000000000\n", de->d_name, read_long(p),
                        holders[0] ? holders : "-");
        }
        if (d)
                closedir(d);
        return fclose(f) == 0 ? 0 : -errno;
}

/* Returns the path to use instead of path: into buf when redirected, else path itself. */
static const char *redirect(const char *path, char *buf, size_t size) {
        const char *s = trap_state();

        if (!s || !path)
                return path;
        if (path_is_under(path, "/sys/module")) {
                snprintf(buf, size, "%s%s", s, path + strlen("/sys"));
                return buf;
        }
        if (strcmp(path, "/proc/modules") == 0 || strcmp(path, "/proc/cmdline") == 0) {
                char d[PATH_MAX];
                snprintf(d, sizeof(d), "%s/.trap", s);
                (void) mkdir_parents(d);
                snprintf(buf, size, "%s/.trap/%s", s, path + strlen("/proc/"));
                if (strcmp(path, "/proc/modules") == 0)
                        (void) generate_proc_modules(s, buf);
                else if (!file_exists(buf))
                        (void) write_text(buf, "\n");
                return buf;
        }
        return path;
}

/* ---------------------------------------------------------------- modules */

#ifndef MODULE_NAME_LEN_MAX
#define MODULE_NAME_LEN_MAX 64
#endif

typedef struct Modinfo {
        char name[MODULE_NAME_LEN_MAX];
        char depends[1024];
        char version[128];
        char init_error[32]; /* trap_init_error=: what the module's init returns (a stub's EINVAL) */
} Modinfo;

static void normalize(char *s) {
        for (; *s; s++)
                if (*s == '-')
                        *s = '_';
}

/* Reads name=, depends= and version= from the .modinfo section of an ELF64 relocatable object. */
static int modinfo_parse(const unsigned char *img, size_t size, Modinfo *ret) {
        const Elf64_Ehdr *eh = (const Elf64_Ehdr *) img;
        const Elf64_Shdr *sh, *strsh;

        memset(ret, 0, sizeof(*ret));
        if (size < sizeof(*eh) || memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64)
                return -ENOEXEC;
        if (eh->e_shoff == 0 || eh->e_shoff > size || eh->e_shnum > (size - eh->e_shoff) / sizeof(Elf64_Shdr) ||
            eh->e_shstrndx >= eh->e_shnum)
                return -ENOEXEC;
        sh = (const Elf64_Shdr *) (img + eh->e_shoff);
        strsh = &sh[eh->e_shstrndx];
        if (strsh->sh_offset > size || strsh->sh_size > size - strsh->sh_offset)
                return -ENOEXEC;
        for (unsigned i = 0; i < eh->e_shnum; i++) {
                const char *sname, *p, *end;

                if (sh[i].sh_name >= strsh->sh_size)
                        continue;
                sname = (const char *) img + strsh->sh_offset + sh[i].sh_name;
                if (strcmp(sname, ".modinfo") != 0)
                        continue;
                if (sh[i].sh_offset > size || sh[i].sh_size > size - sh[i].sh_offset)
                        return -ENOEXEC;
                p = (const char *) img + sh[i].sh_offset;
                end = p + sh[i].sh_size;
                while (p < end) {
                        size_t len = strnlen(p, end - p);
                        if (strncmp(p, "name=", 5) == 0)
                                snprintf(ret->name, sizeof(ret->name), "%.*s", (int) len - 5, p + 5);
                        else if (strncmp(p, "depends=", 8) == 0)
                                snprintf(ret->depends, sizeof(ret->depends), "%.*s", (int) len - 8, p + 8);
                        else if (strncmp(p, "version=", 8) == 0)
                                snprintf(ret->version, sizeof(ret->version), "%.*s", (int) len - 8, p + 8);
                        else if (strncmp(p, "trap_init_error=", 16) == 0)
                                snprintf(ret->init_error, sizeof(ret->init_error), "%.*s", (int) len - 16, p + 16);
                        p += len + 1;
                }
        }
        if (!ret->name[0])
                return -ENOEXEC;
        normalize(ret->name);
        normalize(ret->depends);
        return 0;
}

static const struct {
        const char *name;
        int error;
} errno_names[] = {
        { "EPERM", EPERM },     { "ENOENT", ENOENT },   { "EINVAL", EINVAL },
        { "ENOEXEC", ENOEXEC }, { "EKEYREJECTED", EKEYREJECTED },
        { "ENOKEY", ENOKEY },   { "EBUSY", EBUSY },     { "EAGAIN", EAGAIN },
        { "ENODEV", ENODEV },   { "EEXIST", EEXIST },   { "ENOMEM", ENOMEM },
        { "EFAULT", EFAULT },   { "EBADMSG", EBADMSG }, { "ENOSPC", ENOSPC },
};

static const char *errno_name(int e) {
        for (size_t i = 0; i < sizeof(errno_names) / sizeof(errno_names[0]); i++)
                if (errno_names[i].error == e)
                        return errno_names[i].name;
        return "E?";
}

static int errno_from_name(const char *name) {
        for (size_t i = 0; i < sizeof(errno_names) / sizeof(errno_names[0]); i++)
                if (strcmp(errno_names[i].name, name) == 0)
                        return errno_names[i].error;
        return 0;
}

/* Returns the injected errno (positive) for this module and operation, or 0. */
static int injected_error(const char *name, bool unload) {
        const char *spec = getenv(FAIL_ENV);
        char buf[1024], *save = NULL;

        if (!spec || snprintf(buf, sizeof(buf), "%s", spec) >= (int) sizeof(buf))
                return 0;
        for (char *item = strtok_r(buf, ", ", &save); item; item = strtok_r(NULL, ", ", &save)) {
                char *colon = strchr(item, ':'), *at;
                int error = 0;
                bool for_unload;

                if (!colon)
                        continue;
                *colon = '\0';
                at = strchr(colon + 1, '@');
                if (at)
                        *at++ = '\0';
                normalize(item);
                if (strcmp(item, name) != 0)
                        continue;
                error = errno_from_name(colon + 1);
                if (error == 0) {
                        fprintf(stderr, "kmod-trap: unknown errno name '%s' in $%s\n", colon + 1, FAIL_ENV);
                        continue;
                }
                for_unload = at ? strcmp(at, "unload") == 0 : (error == EBUSY || error == EAGAIN);
                if (for_unload == unload)
                        return error;
        }
        return 0;
}

static void module_dir(char *buf, size_t size, const char *state, const char *name, const char *sub) {
        snprintf(buf, size, "%s/module/%s%s%s", state, name, sub ? "/" : "", sub ?: "");
}

/* Loaded as a module (initstate) or built in (a directory without initstate): usable either way. */
static bool module_present(const char *state, const char *name) {
        char p[PATH_MAX];
        struct stat st;
        module_dir(p, sizeof(p), state, name, NULL);
        return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static void record_parameters(const char *state, const char *name, const char *args) {
        char p[PATH_MAX], buf[4096], *s = buf;

        module_dir(p, sizeof(p), state, name, "parameters");
        (void) mkdir_parents(p);
        snprintf(buf, sizeof(buf), "%s", args ?: "");
        /* The kernel's parse_args(): space separated, values may be double-quoted. */
        while (*s) {
                char *key, *value = NULL, *w;
                bool quoted = false;

                while (*s == ' ' || *s == '\t' || *s == '\n')
                        s++;
                if (!*s)
                        break;
                key = w = s;
                for (; *s && (quoted || (*s != ' ' && *s != '\t' && *s != '\n')); s++) {
                        if (*s == '"') {
                                quoted = !quoted;
                                continue;
                        }
                        if (*s == '=' && !value) {
                                *w++ = '\0';
                                value = w;
                                continue;
                        }
                        *w++ = *s;
                }
                if (*s)
                        s++;
                *w = '\0';
                char f[PATH_MAX + 256], v[2048];
                snprintf(f, sizeof(f), "%s/%s", p, key);
                snprintf(v, sizeof(v), "%s\n", value ?: "Y");
                (void) write_text(f, v);
        }
}

static void set_refcnt(const char *state, const char *name, long delta) {
        char p[PATH_MAX], v[32];
        module_dir(p, sizeof(p), state, name, "refcnt");
        if (!file_exists(p))
                return; /* built in: no refcnt */
        snprintf(v, sizeof(v), "%ld\n", read_long(p) + delta);
        (void) write_text(p, v);
}

/* $GNA_KMOD_TRAP_DELAY="<module>:<ms>[@unload],...": that module's "init" (or, with @unload, its "exit")
 * takes this long (nvidia probes every GPU: 1.5 s per GPU is realistic). */
static void injected_delay(const char *name, bool unload) {
        const char *spec = getenv("GNA_KMOD_TRAP_DELAY");
        size_t n = strlen(name);

        for (const char *p = spec; p && *p;) {
                const char *comma = strchr(p, ',');
                size_t len = comma ? (size_t) (comma - p) : strlen(p);

                if (len > n && strncmp(p, name, n) == 0 && p[n] == ':') {
                        char *end;
                        long ms = strtol(p + n + 1, &end, 10);
                        bool for_unload = end < p + len && strncmp(end, "@unload", 7) == 0;

                        if (for_unload != unload) {
                                p = comma ? comma + 1 : NULL;
                                continue;
                        }
                        struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L };
                        while (ms > 0 && nanosleep(&ts, &ts) < 0 && errno == EINTR)
                                ;
                        return;
                }
                p = comma ? comma + 1 : NULL;
        }
}

static int trap_load(const unsigned char *img, size_t size, const char *args) {
        const char *state = trap_state();
        char p[PATH_MAX], deps[1024], *save = NULL;
        Modinfo mi;
        int r;

        if (!state) {
                fprintf(stderr, "kmod-trap: refusing a module load: $%s is not set\n", STATE_ENV);
                return -EPERM;
        }
        r = modinfo_parse(img, size, &mi);
        if (r < 0) {
                trap_log("load-failed ? ENOEXEC");
                return r;
        }
        injected_delay(mi.name, false);
        r = injected_error(mi.name, false);
        if (r > 0) {
                trap_log("load-failed %s %s", mi.name, errno_name(r));
                return -r;
        }
        if (module_present(state, mi.name)) {
                trap_log("load-failed %s EEXIST", mi.name);
                return -EEXIST;
        }
        snprintf(deps, sizeof(deps), "%s", mi.depends);
        for (char *d = strtok_r(deps, ",", &save); d; d = strtok_r(NULL, ",", &save))
                if (!module_present(state, d)) {
                        trap_log("load-failed %s ENOENT (Unknown symbol: %s is not loaded)", mi.name, d);
                        return -ENOENT;
                }
        /* The module's own init failing, e.g. nvidia-peermem built without ib_core: the kernel
         * frees it again and nothing of it stays in sysfs. */
        if (mi.init_error[0]) {
                r = errno_from_name(mi.init_error) ?: EINVAL;
                trap_log("load-failed %s %s (init)", mi.name, errno_name(r));
                return -r;
        }

        module_dir(p, sizeof(p), state, mi.name, "holders");
        r = mkdir_parents(p);
        if (r < 0)
                return r;
        module_dir(p, sizeof(p), state, mi.name, "refcnt");
        (void) write_text(p, "0\n");
        if (mi.version[0]) {
                char v[160];
                module_dir(p, sizeof(p), state, mi.name, "version");
                snprintf(v, sizeof(v), "%s\n", mi.version);
                (void) write_text(p, v);
        }
        record_parameters(state, mi.name, args);
        snprintf(deps, sizeof(deps), "%s", mi.depends);
        save = NULL;
        for (char *d = strtok_r(deps, ",", &save); d; d = strtok_r(NULL, ",", &save)) {
                char link[PATH_MAX + 80], target[PATH_MAX];
                module_dir(target, sizeof(target), state, d, "holders");
                (void) mkdir_parents(target);
                snprintf(link, sizeof(link), "%s/%s", target, mi.name);
                snprintf(target, sizeof(target), "../../%s", mi.name);
                (void) symlink(target, link);
                set_refcnt(state, d, +1);
        }
        /* initstate last: libkmod treats a directory without it as "coming". */
        module_dir(p, sizeof(p), state, mi.name, "initstate");
        (void) write_text(p, "live\n");
        trap_log("load %s %s", mi.name, args ?: "");
        return 0;
}

static int trap_load_fd(int fd, const char *args) {
        struct stat st;
        unsigned char *img;
        ssize_t n;
        int r;

        if (fstat(fd, &st) < 0)
                return -errno;
        img = malloc(st.st_size + 1);
        if (!img)
                return -ENOMEM;
        n = pread(fd, img, st.st_size, 0);
        r = n == st.st_size ? trap_load(img, n, args) : -EIO;
        free(img);
        return r;
}

static int rm_rf(const char *path) {
        struct stat st;
        if (lstat(path, &st) < 0)
                return -errno;
        if (S_ISDIR(st.st_mode)) {
                DIR *d = opendir(path);
                struct dirent *de;
                while (d && (de = readdir(d))) {
                        char p[PATH_MAX + 256];
                        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                                continue;
                        snprintf(p, sizeof(p), "%s/%s", path, de->d_name);
                        (void) rm_rf(p);
                }
                if (d)
                        closedir(d);
                return rmdir(path) < 0 ? -errno : 0;
        }
        return unlink(path) < 0 ? -errno : 0;
}

/* Whether some process has a node <dev>/nvidia* open ($GNA_KMOD_TRAP_DEV); its pid in *ret_pid. */
static bool dev_node_open(const char *dev, pid_t *ret_pid) {
        size_t dl = strlen(dev);
        struct dirent *de;
        DIR *d = opendir("/proc");

        while (d && (de = readdir(d))) {
                char fd_dir[PATH_MAX];
                struct dirent *fe;
                DIR *f;
                if (de->d_name[0] < '0' || de->d_name[0] > '9')
                        continue;
                snprintf(fd_dir, sizeof(fd_dir), "/proc/%s/fd", de->d_name);
                f = opendir(fd_dir);
                while (f && (fe = readdir(f))) {
                        char target[PATH_MAX];
                        ssize_t n = readlinkat(dirfd(f), fe->d_name, target, sizeof(target) - 1);
                        if (n <= 0)
                                continue;
                        target[n] = 0;
                        if (strncmp(target, dev, dl) == 0 && strncmp(target + dl, "/nvidia", 7) == 0) {
                                *ret_pid = (pid_t) atoi(de->d_name);
                                closedir(f);
                                closedir(d);
                                return true;
                        }
                }
                if (f)
                        closedir(f);
        }
        if (d)
                closedir(d);
        return false;
}

static int trap_unload(const char *name_in, unsigned flags) {
        const char *state = trap_state();
        char name[MODULE_NAME_LEN_MAX], p[PATH_MAX], dir[PATH_MAX];
        struct dirent *de;
        DIR *d;
        int r;

        if (!state) {
                fprintf(stderr, "kmod-trap: refusing a module unload: $%s is not set\n", STATE_ENV);
                return -EPERM;
        }
        snprintf(name, sizeof(name), "%s", name_in);
        normalize(name);
        injected_delay(name, true);
        r = injected_error(name, true);
        if (r > 0) {
                trap_log("unload-failed %s %s", name, errno_name(r));
                return -r;
        }
        module_dir(p, sizeof(p), state, name, "initstate");
        if (!file_exists(p)) {
                /* Built in modules cannot be removed either. */
                trap_log("unload-failed %s %s", name, module_present(state, name) ? "EBUSY" : "ENOENT");
                return module_present(state, name) ? -EBUSY : -ENOENT;
        }
        /* The kernel refuses while other modules use this one, and with O_NONBLOCK while anything
         * holds a reference; without O_TRUNC (force) there is no way around either. */
        module_dir(p, sizeof(p), state, name, "holders");
        d = opendir(p);
        while (d && (de = readdir(d)))
                if (de->d_name[0] != '.') {
                        closedir(d);
                        trap_log("unload-failed %s EAGAIN", name);
                        return -EAGAIN;
                }
        if (d)
                closedir(d);
        module_dir(p, sizeof(p), state, name, "refcnt");
        if (read_long(p) > 0 && !(flags & O_TRUNC)) {
                trap_log("unload-failed %s EAGAIN", name);
                return -EAGAIN;
        }
        const char *dev = getenv("GNA_KMOD_TRAP_DEV");
        pid_t holder;
        if (dev && *dev && strcmp(name, "nvidia") == 0 && !(flags & O_TRUNC) && dev_node_open(dev, &holder)) {
                trap_log("unload-failed %s EAGAIN (process %d has a node of %s open)", name, (int) holder, dev);
                return -EAGAIN;
        }

        /* Drop our holder links and the references they stood for. */
        snprintf(dir, sizeof(dir), "%s/module", state);
        d = opendir(dir);
        while (d && (de = readdir(d))) {
                char link[PATH_MAX + 300];
                if (de->d_name[0] == '.')
                        continue;
                snprintf(link, sizeof(link), "%s/%s/holders/%s", dir, de->d_name, name);
                if (unlink(link) == 0)
                        set_refcnt(state, de->d_name, -1);
        }
        if (d)
                closedir(d);
        module_dir(p, sizeof(p), state, name, NULL);
        r = rm_rf(p);
        trap_log("unload %s", name);
        return r;
}

/* ---------------------------------------------------------------- intercepted entry points */

static long set_errno(int r) {
        if (r < 0) {
                errno = -r;
                return -1;
        }
        return r;
}

long syscall(long number, ...) {
        long a[6];
        va_list ap;

        va_start(ap, number);
        for (int i = 0; i < 6; i++)
                a[i] = va_arg(ap, long);
        va_end(ap);

        switch (number) {
        case SYS_finit_module:
                return set_errno(trap_load_fd((int) a[0], (const char *) a[1]));
        case SYS_init_module:
                return set_errno(trap_load((const unsigned char *) a[0], (size_t) a[1], (const char *) a[2]));
        case SYS_delete_module:
                return set_errno(trap_unload((const char *) a[0], (unsigned) a[1]));
        default: {
                REAL(long, syscall, (long, ...));
                return real_syscall(number, a[0], a[1], a[2], a[3], a[4], a[5]);
        }
        }
}

int init_module(void *image, unsigned long len, const char *params) {
        return (int) set_errno(trap_load(image, len, params));
}

int delete_module(const char *name, unsigned int flags) {
        return (int) set_errno(trap_unload(name, flags));
}

#define OPEN_MODE(flags, mode)                                                                     \
        do {                                                                                       \
                if (((flags) & O_CREAT) || ((flags) & O_TMPFILE) == O_TMPFILE) {                                             \
                        va_list ap;                                                        \
                        va_start(ap, flags);                                                       \
                        mode = va_arg(ap, mode_t);                                                 \
                        va_end(ap);                                                                \
                }                                                                                  \
        } while (0)

int open(const char *path, int flags, ...) {
        char buf[PATH_MAX];
        mode_t mode = 0;
        OPEN_MODE(flags, mode);
        REAL(int, open, (const char *, int, ...));
        return real_open(redirect(path, buf, sizeof(buf)), flags, mode);
}

int open64(const char *path, int flags, ...) {
        char buf[PATH_MAX];
        mode_t mode = 0;
        OPEN_MODE(flags, mode);
        REAL(int, open64, (const char *, int, ...));
        return real_open64(redirect(path, buf, sizeof(buf)), flags, mode);
}

int openat(int dirfd, const char *path, int flags, ...) {
        char buf[PATH_MAX];
        mode_t mode = 0;
        OPEN_MODE(flags, mode);
        REAL(int, openat, (int, const char *, int, ...));
        return real_openat(dirfd, redirect(path, buf, sizeof(buf)), flags, mode);
}

int openat64(int dirfd, const char *path, int flags, ...) {
        char buf[PATH_MAX];
        mode_t mode = 0;
        OPEN_MODE(flags, mode);
        REAL(int, openat64, (int, const char *, int, ...));
        return real_openat64(dirfd, redirect(path, buf, sizeof(buf)), flags, mode);
}

FILE *fopen(const char *path, const char *mode) {
        char buf[PATH_MAX];
        REAL(FILE *, fopen, (const char *, const char *));
        return real_fopen(redirect(path, buf, sizeof(buf)), mode);
}

FILE *fopen64(const char *path, const char *mode) {
        char buf[PATH_MAX];
        REAL(FILE *, fopen64, (const char *, const char *));
        return real_fopen64(redirect(path, buf, sizeof(buf)), mode);
}

DIR *opendir(const char *path) {
        char buf[PATH_MAX];
        REAL(DIR *, opendir, (const char *));
        return real_opendir(redirect(path, buf, sizeof(buf)));
}

int access(const char *path, int mode) {
        char buf[PATH_MAX];
        REAL(int, access, (const char *, int));
        return real_access(redirect(path, buf, sizeof(buf)), mode);
}

#define STAT_LIKE(name, st_type)                                                                   \
        int name(const char *path, struct st_type *st) {                                           \
                char buf[PATH_MAX];                                                                \
                REAL(int, name, (const char *, struct st_type *));                                 \
                return real_##name(redirect(path, buf, sizeof(buf)), st);                          \
        }

STAT_LIKE(stat, stat)
STAT_LIKE(stat64, stat64)
STAT_LIKE(lstat, stat)
STAT_LIKE(lstat64, stat64)

int fstatat(int dirfd, const char *path, struct stat *st, int flags) {
        char buf[PATH_MAX];
        REAL(int, fstatat, (int, const char *, struct stat *, int));
        return real_fstatat(dirfd, redirect(path, buf, sizeof(buf)), st, flags);
}

int fstatat64(int dirfd, const char *path, struct stat64 *st, int flags) {
        char buf[PATH_MAX];
        REAL(int, fstatat64, (int, const char *, struct stat64 *, int));
        return real_fstatat64(dirfd, redirect(path, buf, sizeof(buf)), st, flags);
}
