/* SPDX-License-Identifier: MIT */
/* Owns building the nvidia.com/gpu CdiSpec from an NVML snapshot and the node's files: device entries
 * for full GPUs and MIG devices, and the common edits the toolkit's `nvidia-ctk cdi generate` puts in
 * (control nodes, the driver's user-space libraries found through the ld.so cache or the usual library
 * folders, GSP firmware, utilities, the persistenced socket, nvidia-cdi-hook hooks). Path mapping for a
 * node seen through a root directory is described in cdi.h. Everything is sorted or follows GPU order,
 * so the same node always gives the same bytes and the writer can skip an unchanged file. */
#include <ctype.h>
#include <dirent.h>
#include <stdarg.h>
#include <sys/stat.h>

#include "cdi-internal.h"
#include "escape.h"
#include "cdi.h"
#include "config.h"
#include "fileio.h"
#include "strv.h"

#if defined(__aarch64__)
#  define LIB_TRIPLET "aarch64-linux-gnu"
#  define LDCACHE_ARCH_FLAG 0x0a00
#else
#  define LIB_TRIPLET "x86_64-linux-gnu"
#  define LDCACHE_ARCH_FLAG 0x0300
#endif

#define HOOK_NAME "nvidia-cdi-hook"

static const char *const mount_options[] = { "ro", "nosuid", "nodev", "bind", NULL };

typedef struct Builder {
        const CdiBuildInput *in;
        char **warnings;
        char *hook_path;           /* host view of nvidia-cdi-hook, NULL when absent */
} Builder;

/* path with prefix (a directory) removed; "/" or an unrelated path leaves it as it is. */
static char *strip_prefix(const char *path, const char *prefix) {
        size_t n = prefix ? strlen(prefix) : 0;

        while (n > 0 && prefix[n - 1] == '/')
                n--;
        if (n == 0 || strncmp(path, prefix, n) != 0 || (path[n] != '/' && path[n] != 0))
                return strdup(path);
        return strdup(path[n] ? path + n : "/");
}

/* Collapses "//", "." and ".." lexically, in place (paths here are absolute). */
static void normalize_path(char *p) {
        char *out = p, *s = p;

        while (*s) {
                while (*s == '/')
                        s++;
                char *e = strchrnul(s, '/');
                size_t n = (size_t) (e - s);
                if (n == 0 || (n == 1 && s[0] == '.')) {
                        /* skip */
                } else if (n == 2 && s[0] == '.' && s[1] == '.') {
                        while (out > p && *--out != '/')
                                ;
                } else {
                        *out++ = '/';
                        memmove(out, s, n);
                        out += n;
                }
                s = e;
        }
        if (out == p)
                *out++ = '/';
        *out = 0;
}

static int warn(Builder *b, const char *fmt, ...) _printf_(2, 3);
static int warn(Builder *b, const char *fmt, ...) {
        _cleanup_free_ char *s = NULL;
        va_list ap;

        va_start(ap, fmt);
        int k = vasprintf(&s, fmt, ap);
        va_end(ap);
        if (k < 0)
                return -ENOMEM;
        /* A warning quotes NVML's strings and file names; it goes to the journal and D-Bus. */
        return strv_consume(&b->warnings, escape_message(s));
}

static int add_node(CdiEdits *e, const char *path) {
        for (size_t i = 0; i < e->n_device_nodes; i++)
                if (streq(e->device_nodes[i].path, path))
                        return 0;
        CdiDeviceNode *a = reallocarray(e->device_nodes, e->n_device_nodes + 1, sizeof(CdiDeviceNode));
        if (!a)
                return -ENOMEM;
        e->device_nodes = a;
        a[e->n_device_nodes] = (CdiDeviceNode) { .path = strdup(path) };
        if (!a[e->n_device_nodes++].path)
                return -ENOMEM;
        return 0;
}

static int add_mount(CdiEdits *e, const char *host, const char *container, bool noexec) {
        CdiMount *a = reallocarray(e->mounts, e->n_mounts + 1, sizeof(CdiMount));
        if (!a)
                return -ENOMEM;
        e->mounts = a;
        CdiMount *m = a + e->n_mounts++;
        *m = (CdiMount) { .host_path = strdup(host), .container_path = strdup(container),
                          .options = strv_copy((char **) mount_options) };
        if (!m->host_path || !m->container_path || !m->options)
                return -ENOMEM;
        /* The toolkit mounts the persistenced socket noexec as well. */
        return noexec ? strv_extend(&m->options, "noexec") : 0;
}

/* Takes args. */
static int add_hook(Builder *b, CdiEdits *e, char **args) {
        CdiHook *a = reallocarray(e->hooks, e->n_hooks + 1, sizeof(CdiHook));
        if (!a) {
                strv_free(args);
                return -ENOMEM;
        }
        e->hooks = a;
        CdiHook *h = a + e->n_hooks++;
        *h = (CdiHook) { .hook_name = strdup("createContainer"), .path = strdup(b->hook_path), .args = args };
        return h->hook_name && h->path ? 0 : -ENOMEM;
}

static int add_links_hook(Builder *b, CdiEdits *e, char *const *links) {
        _cleanup_strv_free_ char **args = NULL;

        if (!b->hook_path || strv_length(links) == 0)
                return 0;
        if (strv_extend(&args, HOOK_NAME) < 0 || strv_extend(&args, "create-symlinks") < 0)
                return -ENOMEM;
        STRV_FOREACH(l, links)
                if (strv_extend(&args, "--link") < 0 || strv_extend(&args, *l) < 0)
                        return -ENOMEM;
        return add_hook(b, e, TAKE_PTR(args));
}

static CdiDevice *add_device(CdiSpec *s, const char *name) {
        CdiDevice *a = reallocarray(s->devices, s->n_devices + 1, sizeof(CdiDevice));
        if (!a)
                return NULL;
        s->devices = a;
        a[s->n_devices] = (CdiDevice) { .name = strdup(name) };
        if (!a[s->n_devices].name)
                return NULL;
        return a + s->n_devices++;
}

static int copy_edits(CdiEdits *dst, const CdiEdits *src) {
        for (size_t i = 0; i < src->n_device_nodes; i++)
                if (add_node(dst, src->device_nodes[i].path) < 0)
                        return -ENOMEM;
        for (size_t i = 0; i < src->n_hooks; i++) {
                CdiHook *a = reallocarray(dst->hooks, dst->n_hooks + 1, sizeof(CdiHook));
                if (!a)
                        return -ENOMEM;
                dst->hooks = a;
                a[dst->n_hooks] = (CdiHook) { .hook_name = strdup(src->hooks[i].hook_name),
                                              .path = strdup(src->hooks[i].path),
                                              .args = strv_copy(src->hooks[i].args) };
                CdiHook *h = a + dst->n_hooks++;
                if (!h->hook_name || !h->path || !h->args)
                        return -ENOMEM;
        }
        return 0;
}

/* NVML's UUIDs go into names as they are; garbage must not cost the whole spec. */
static bool name_usable(const CdiSpec *s, const char *name) {
        size_t n = name ? strlen(name) : 0;

        if (n == 0 || !isalnum((unsigned char) name[0]) || !isalnum((unsigned char) name[n - 1]))
                return false;
        for (size_t i = 0; i < n; i++)
                if (!isalnum((unsigned char) name[i]) && !strchr("_.:-", name[i]))
                        return false;
        for (size_t i = 0; i < s->n_devices; i++)
                if (streq(s->devices[i].name, name))
                        return false;
        return true;
}

static bool endswith_bin(const char *s) {
        size_t n = strlen(s);
        return n >= 4 && streq(s + n - 4, ".bin");
}

static bool exists(const char *path) {
        struct stat st;
        return lstat(path, &st) >= 0;
}

/* The GPU's DRM nodes (card*, renderD*) from sysfs, those present under paths.dev, sorted. */
static int gpu_drm_nodes(const CdiBuildInput *in, const char *bdf, char ***ret) {
        _cleanup_free_ char *d = strprintf("%s/bus/pci/devices/%s/drm", in->sys, bdf);
        _cleanup_closedir_ DIR *dir = NULL;
        _cleanup_strv_free_ char **l = NULL;
        struct dirent *de;

        if (!d)
                return -ENOMEM;
        dir = opendir(d);
        if (!dir)
                return 0;
        while ((de = readdir(dir))) {
                if (!startswith(de->d_name, "card") && !startswith(de->d_name, "renderD"))
                        continue;
                _cleanup_free_ char *node = strprintf("%s/dri/%s", in->dev, de->d_name);
                if (!node)
                        return -ENOMEM;
                if (exists(node) && strv_extend(&l, de->d_name) < 0)
                        return -ENOMEM;
        }
        strv_sort(l);
        *ret = TAKE_PTR(l);
        return 0;
}

/* Adds the device under each name cdi.device-name-strategy asks for (index, uuid, type-index, in that
 * order). what: "GPU 0000:17:00.0" or "MIG device 0:1", for warnings. */
static int add_named(Builder *b, CdiSpec *s, const CdiEdits *e, const char *what, const char *index,
                     const char *uuid, const char *type_index) {
        unsigned want = b->in->device_names ?: CDI_NAMES_DEFAULT;
        const char *names[] = { want & CDI_NAMES_INDEX ? index : NULL, want & CDI_NAMES_UUID ? uuid : NULL,
                                want & CDI_NAMES_TYPE_INDEX ? type_index : NULL };

        if ((want & CDI_NAMES_UUID) && !uuid) {
                _cleanup_strv_free_ char **others = NULL;
                for (size_t i = 0; i < ELEMENTSOF(names); i++)
                        if (names[i] && strv_extendf(&others, "\"%s\"", names[i]) < 0)
                                return -ENOMEM;
                _cleanup_free_ char *list = others ? strv_join(others, " and ") : NULL;
                int k = !others ? warn(b, "%s: NVML gave no UUID, and cdi.device-name-strategy is uuid: it has no "
                                       "CDI device of its own", what)
                        : list  ? warn(b, "%s: NVML gave no UUID; its CDI device is named %s only", what, list)
                                : -ENOMEM;
                if (k < 0)
                        return k;
        }
        for (size_t i = 0; i < ELEMENTSOF(names); i++) {
                if (!names[i])
                        continue;
                if (!name_usable(s, names[i])) {
                        if (warn(b, "%s: \"%s\" cannot be a CDI device name (invalid or used twice); left out", what,
                                 names[i]) < 0)
                                return -ENOMEM;
                        continue;
                }
                CdiDevice *d = add_device(s, names[i]);
                if (!d || copy_edits(&d->edits, e) < 0)
                        return -ENOMEM;
        }
        return 0;
}

static int build_full_gpu(Builder *b, CdiSpec *s, const GpuInfo *g, CdiEdits *all) {
        _cleanup_strv_free_ char **drm = NULL, **links = NULL;
        _cleanup_(cdi_edits_done) CdiEdits e = {};
        int r;

        r = gpu_drm_nodes(b->in, g->pci_address, &drm);
        if (r < 0)
                return r;
        _cleanup_free_ char *node = strprintf("/dev/nvidia%d", g->minor);
        if (!node || add_node(&e, node) < 0)
                return -ENOMEM;
        STRV_FOREACH(d, drm) {
                _cleanup_free_ char *p = strprintf("/dev/dri/%s", *d);
                if (!p || add_node(&e, p) < 0)
                        return -ENOMEM;
                /* The toolkit recreates udev's by-path links, which some graphics stacks look up. */
                if (strv_extendf(&links, "../%s::/dev/dri/by-path/pci-%s-%s", *d, g->pci_address,
                                 startswith(*d, "card") ? "card" : "render") < 0)
                        return -ENOMEM;
        }
        if (add_links_hook(b, &e, links) < 0 || copy_edits(all, &e) < 0)
                return -ENOMEM;

        _cleanup_free_ char *index = strprintf("%u", g->nvml_index), *type_index = strprintf("gpu%u", g->nvml_index),
                           *what = strprintf("GPU %s", g->pci_address);
        if (!index || !type_index || !what)
                return -ENOMEM;
        return add_named(b, s, &e, what, index, g->uuid, type_index);
}

static int build_mig_device(Builder *b, CdiSpec *s, const GpuInfo *g, const MigDeviceInfo *m,
                            const MigMinors *minors, CdiEdits *all) {
        const MigMinor *gi = cdi_mig_minor_find(minors, (unsigned) g->minor, m->gi_id, MIG_MINOR_GI),
                       *ci = cdi_mig_minor_find(minors, (unsigned) g->minor, m->gi_id, m->ci_id);
        _cleanup_(cdi_edits_done) CdiEdits e = {};

        if (!gi || !ci) {
                _cleanup_free_ char *key = !gi ? strprintf("gpu%d/gi%u/access", g->minor, m->gi_id)
                                               : strprintf("gpu%d/gi%u/ci%u/access", g->minor, m->gi_id, m->ci_id);
                if (!key)
                        return -ENOMEM;
                return warn(b, "MIG device %u:%u (%s): %s has no \"%s\" line; left out of the CDI spec "
                            "(is the nvidia-caps support of the driver loaded?)",
                            g->nvml_index, m->index, strna(m->uuid), "driver/nvidia-caps/mig-minors", key);
        }

        _cleanup_free_ char *parent = strprintf("/dev/nvidia%d", g->minor),
                           *gi_node = strprintf("/dev/nvidia-caps/nvidia-cap%u", gi->minor),
                           *ci_node = strprintf("/dev/nvidia-caps/nvidia-cap%u", ci->minor),
                           *name = strprintf("%u:%u", g->nvml_index, m->index);
        if (!parent || !gi_node || !ci_node || !name || add_node(&e, parent) < 0 || add_node(&e, gi_node) < 0 ||
            add_node(&e, ci_node) < 0 || copy_edits(all, &e) < 0)
                return -ENOMEM;

        _cleanup_free_ char *type_index = strprintf("mig%u:%u", g->nvml_index, m->index),
                           *what = strprintf("MIG device %s", name);
        if (!type_index || !what)
                return -ENOMEM;
        return add_named(b, s, &e, what, name, m->uuid, type_index);
}

/* ---- the driver's user-space files ---- */

typedef struct Found {
        char **paths;              /* full paths in our view, in the order found */
        dev_t *devs;
        ino_t *inos;
        size_t n;
} Found;

static void found_done(Found *f) {
        strv_free(f->paths);
        free(f->devs);
        free(f->inos);
}

/* Adds a regular file once, however many names lead to it (merged /usr, cache and folder scan). */
static int found_add(Found *f, const char *path, const struct stat *st) {
        for (size_t i = 0; i < f->n; i++)
                if (f->devs[i] == st->st_dev && f->inos[i] == st->st_ino)
                        return 0;
        dev_t *d = reallocarray(f->devs, f->n + 1, sizeof(dev_t));
        if (!d)
                return -ENOMEM;
        f->devs = d;
        ino_t *i = reallocarray(f->inos, f->n + 1, sizeof(ino_t));
        if (!i)
                return -ENOMEM;
        f->inos = i;
        if (strv_extend(&f->paths, path) < 0)
                return -ENOMEM;
        f->devs[f->n] = st->st_dev;
        f->inos[f->n++] = st->st_ino;
        return 0;
}

static bool is_driver_lib(const char *name, const char *version) {
        size_t n = strlen(name), v = strlen(version);

        return startswith(name, "lib") && n > 3 + 4 + v && streq(name + n - v, version) &&
               strncmp(name + n - v - 4, ".so.", 4) == 0;
}

/* Follows symlinks the way the node would, with absolute targets taken inside driver_root. */
static int resolve_in_root(const char *driver_root, const char *node_path, char **ret, struct stat *ret_st) {
        _cleanup_free_ char *cur = path_join(driver_root, node_path);

        for (unsigned hops = 0; cur && hops < 16; hops++) {
                struct stat st;
                char target[4096];

                normalize_path(cur);
                if (lstat(cur, &st) < 0)
                        return negative_errno();
                if (!S_ISLNK(st.st_mode)) {
                        if (!S_ISREG(st.st_mode))
                                return -ENOENT;
                        *ret_st = st;
                        *ret = TAKE_PTR(cur);
                        return 0;
                }
                ssize_t k = readlink(cur, target, sizeof(target) - 1);
                if (k < 0)
                        return negative_errno();
                target[k] = 0;
                char *next;
                if (target[0] == '/')
                        next = path_join(driver_root, target);
                else {
                        *strrchr(cur, '/') = 0;
                        next = strprintf("%s/%s", cur, target);
                }
                free(cur);
                cur = next;
        }
        return cur ? -ELOOP : -ENOMEM;
}

/* glibc's ld.so.cache, "glibc-ld.so.cache1.1" format (alone, or after the old "ld.so-1.7.0" table):
 * a 48-byte header, 24-byte entries {flags, key, value, osversion, hwcap}, string offsets relative to
 * that header. Returns the library paths of this machine's ABI, or -EBADMSG when it is not such a file. */
static int ldcache_paths(const char *data, size_t size, char ***ret) {
        static const char old_magic[] = "ld.so-1.7.0", new_magic[] = "glibc-ld.so.cache1.1";
        _cleanup_strv_free_ char **l = NULL;
        size_t base = 0;
        uint32_t n;

        if (size >= 16 && memcmp(data, old_magic, strlen(old_magic)) == 0) {
                memcpy(&n, data + 12, 4);
                base = 16 + (size_t) n * 12;
                base = (base + 7) & ~(size_t) 7;
        }
        if (base > size || size - base < 48 || memcmp(data + base, new_magic, strlen(new_magic)) != 0)
                return -EBADMSG;
        memcpy(&n, data + base + 20, 4);
        if ((size - base - 48) / 24 < n)
                return -EBADMSG;
        for (uint32_t i = 0; i < n; i++) {
                const char *e = data + base + 48 + (size_t) i * 24;
                int32_t flags;
                uint32_t value;
                memcpy(&flags, e, 4);
                memcpy(&value, e + 8, 4);
                if ((flags & 0xff) != 0x03 || (flags & 0xff00) != LDCACHE_ARCH_FLAG)
                        continue;
                if (value >= size - base || !memchr(data + base + value, 0, size - base - value))
                        return -EBADMSG;
                if (strv_extend(&l, data + base + value) < 0)
                        return -ENOMEM;
        }
        *ret = TAKE_PTR(l);
        return 0;
}

static int find_libraries_ldcache(const CdiBuildInput *in, const char *version, Found *f) {
        _cleanup_free_ char *p = path_join(in->driver_root, "etc/ld.so.cache"), *data = NULL;
        _cleanup_strv_free_ char **paths = NULL;
        size_t size;
        int r;

        if (!p)
                return -ENOMEM;
        r = read_full_file(p, 64 * 1024 * 1024, &data, &size);
        if (r < 0)
                return r;
        r = ldcache_paths(data, size, &paths);
        if (r < 0)
                return r;
        STRV_FOREACH(lib, paths) {
                _cleanup_free_ char *full = NULL;
                struct stat st;
                if (resolve_in_root(in->driver_root, *lib, &full, &st) < 0)
                        continue;
                if (is_driver_lib(strrchr(full, '/') + 1, version) && found_add(f, full, &st) < 0)
                        return -ENOMEM;
        }
        return 0;
}

static int find_libraries_dirs(const CdiBuildInput *in, const char *version, Found *f) {
        static const char *const dirs[] = { "usr/lib/" LIB_TRIPLET, "usr/lib64", "usr/lib", "lib/" LIB_TRIPLET };
        dev_t seen_dev[ELEMENTSOF(dirs)];
        ino_t seen_ino[ELEMENTSOF(dirs)];
        size_t n_seen = 0;

        for (size_t i = 0; i < ELEMENTSOF(dirs); i++) {
                _cleanup_free_ char *d = path_join(in->driver_root, dirs[i]);
                _cleanup_strv_free_ char **names = NULL;
                struct stat st;
                bool dup = false;

                if (!d)
                        return -ENOMEM;
                if (stat(d, &st) < 0 || !S_ISDIR(st.st_mode))
                        continue;
                for (size_t j = 0; j < n_seen; j++)
                        dup = dup || (seen_dev[j] == st.st_dev && seen_ino[j] == st.st_ino);
                if (dup)
                        continue;
                seen_dev[n_seen] = st.st_dev;
                seen_ino[n_seen++] = st.st_ino;

                _cleanup_closedir_ DIR *dir = opendir(d);
                struct dirent *de;
                if (!dir)
                        continue;
                while ((de = readdir(dir)))
                        if (is_driver_lib(de->d_name, version) && strv_extend(&names, de->d_name) < 0)
                                return -ENOMEM;
                strv_sort(names);
                STRV_FOREACH(name, names) {
                        _cleanup_free_ char *full = path_join(d, *name);
                        if (!full)
                                return -ENOMEM;
                        if (lstat(full, &st) >= 0 && S_ISREG(st.st_mode) && found_add(f, full, &st) < 0)
                                return -ENOMEM;
                }
        }
        return 0;
}

static int mount_found(Builder *b, CdiEdits *e, const char *full, const char *container_override, bool noexec) {
        _cleanup_free_ char *host = strip_prefix(full, b->in->root),
                           *container = container_override ? strdup(container_override) : strip_prefix(full, b->in->driver_root);
        if (!host || !container)
                return -ENOMEM;
        return add_mount(e, host, container, noexec);
}

static int mount_cmp(const void *a, const void *b) {
        return strcmp(((const CdiMount *) a)->container_path, ((const CdiMount *) b)->container_path);
}

static int add_driver_files(Builder *b, CdiEdits *e, const char *version, char ***ret_lib_dirs, char ***ret_links) {
        static const char *const binaries[] = { "nvidia-smi", "nvidia-debugdump", "nvidia-persistenced",
                                                "nvidia-cuda-mps-control", "nvidia-cuda-mps-server" };
        static const char *const bin_dirs[] = { "usr/bin", "usr/sbin", "bin", "sbin" };
        const CdiBuildInput *in = b->in;
        _cleanup_(found_done) Found libs = {};
        _cleanup_strv_free_ char **dirs = NULL, **links = NULL, **link_names = NULL;
        int r;

        if (version) {
                r = find_libraries_ldcache(in, version, &libs);
                if (r == -ENOMEM)
                        return r;
                /* A cache written before the driver was installed lists none of its libraries. */
                if (libs.n == 0) {
                        r = find_libraries_dirs(in, version, &libs);
                        if (r < 0)
                                return r;
                }
                if (libs.n == 0 && warn(b, "no NVIDIA driver libraries (lib*.so.%s) under %s: the spec has no library "
                                        "mounts (is cdi.driver-root right?)", version, in->driver_root) < 0)
                        return -ENOMEM;
        }
        for (size_t i = 0; i < libs.n; i++) {
                r = mount_found(b, e, libs.paths[i], NULL, false);
                if (r < 0)
                        return r;
        }
        /* Library folders and the toolkit's extra symlinks come from the container side, sorted. */
        if (e->n_mounts > 0)
                qsort(e->mounts, e->n_mounts, sizeof(CdiMount), mount_cmp);
        for (size_t i = 0; i < e->n_mounts; i++) {
                _cleanup_free_ char *dir = strdup(e->mounts[i].container_path);
                if (!dir)
                        return -ENOMEM;
                char *slash = strrchr(dir, '/'), *base = slash + 1;
                const char *target = NULL, *link = NULL;
                *slash = 0;
                if (!strv_contains(dirs, *dir ? dir : "/") && strv_extend(&dirs, *dir ? dir : "/") < 0)
                        return -ENOMEM;
                if (startswith(base, "libcuda.so."))
                        target = "libcuda.so.1", link = "libcuda.so";
                else if (startswith(base, "libGLX_nvidia.so."))
                        target = base, link = "libGLX_indirect.so.0";
                else if (startswith(base, "libnvidia-opticalflow.so."))
                        target = "libnvidia-opticalflow.so.1", link = "libnvidia-opticalflow.so";
                if (!link || strv_contains(link_names, link))
                        continue;
                if (strv_extend(&link_names, link) < 0 || strv_extendf(&links, "%s::%s/%s", target, dir, link) < 0)
                        return -ENOMEM;
        }

        if (version) {
                _cleanup_free_ char *fw = strprintf("%s/lib/firmware/nvidia/%s", in->driver_root, version);
                _cleanup_closedir_ DIR *dir = NULL;
                _cleanup_strv_free_ char **names = NULL;
                struct dirent *de;
                if (!fw)
                        return -ENOMEM;
                normalize_path(fw);
                dir = opendir(fw);
                while (dir && (de = readdir(dir)))
                        if (startswith(de->d_name, "gsp") && endswith_bin(de->d_name) && strv_extend(&names, de->d_name) < 0)
                                return -ENOMEM;
                strv_sort(names);
                STRV_FOREACH(name, names) {
                        _cleanup_free_ char *full = path_join(fw, *name);
                        struct stat st;
                        if (!full)
                                return -ENOMEM;
                        if (lstat(full, &st) >= 0 && S_ISREG(st.st_mode) && mount_found(b, e, full, NULL, false) < 0)
                                return -ENOMEM;
                }
        }

        for (size_t i = 0; i < ELEMENTSOF(binaries); i++)
                for (size_t j = 0; j < ELEMENTSOF(bin_dirs); j++) {
                        _cleanup_free_ char *full = strprintf("%s/%s/%s", in->driver_root, bin_dirs[j], binaries[i]);
                        struct stat st;
                        if (!full)
                                return -ENOMEM;
                        normalize_path(full);
                        if (lstat(full, &st) < 0 || !(S_ISREG(st.st_mode) || S_ISLNK(st.st_mode)))
                                continue;
                        if (mount_found(b, e, full, NULL, false) < 0)
                                return -ENOMEM;
                        break;
                }

        _cleanup_free_ char *socket = path_join(in->run, "nvidia-persistenced/socket");
        if (!socket)
                return -ENOMEM;
        if (exists(socket) && mount_found(b, e, socket, "/run/nvidia-persistenced/socket", true) < 0)
                return -ENOMEM;

        if (e->n_mounts > 0)
                qsort(e->mounts, e->n_mounts, sizeof(CdiMount), mount_cmp);
        *ret_lib_dirs = TAKE_PTR(dirs);
        *ret_links = TAKE_PTR(links);
        return 0;
}

static int add_common_edits(Builder *b, CdiEdits *e, const char *version) {
        static const char *const control[] = { "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools", "nvidiactl" };
        _cleanup_strv_free_ char **lib_dirs = NULL, **links = NULL, **args = NULL;
        int r;

        if (strv_extend(&e->env, "NVIDIA_VISIBLE_DEVICES=void") < 0)
                return -ENOMEM;
        for (size_t i = 0; i < ELEMENTSOF(control); i++) {
                _cleanup_free_ char *p = path_join(b->in->dev, control[i]), *node = strprintf("/dev/%s", control[i]);
                if (!p || !node)
                        return -ENOMEM;
                if (exists(p) && add_node(e, node) < 0)
                        return -ENOMEM;
        }

        r = add_driver_files(b, e, version, &lib_dirs, &links);
        if (r < 0)
                return r;

        if (!b->hook_path)
                return 0;
        /* Links first, then one ldconfig run that sees every library. */
        r = add_links_hook(b, e, links);
        if (r < 0)
                return r;
        if (strv_length(lib_dirs) == 0)
                return 0;
        if (strv_extend(&args, HOOK_NAME) < 0 || strv_extend(&args, "update-ldcache") < 0)
                return -ENOMEM;
        STRV_FOREACH(d, lib_dirs)
                if (strv_extend(&args, "--folder") < 0 || strv_extend(&args, *d) < 0)
                        return -ENOMEM;
        return add_hook(b, e, TAKE_PTR(args));
}

int cdi_spec_build(const CdiBuildInput *in, CdiSpec **ret, char ***ret_warnings) {
        _cleanup_(cdi_spec_freep) CdiSpec *s = NULL;
        _cleanup_(cdi_edits_done) CdiEdits all = {};
        static const MigMinors no_minors = {};
        const MigMinors *minors = &no_minors;
        CdiMigMinorsCache *local_minors = NULL; /* when the caller keeps no cache: this build's only */
        _cleanup_free_ char *hook = NULL;
        Builder b = { .in = in };
        int r;

        assert(in && in->snapshot && in->root && in->dev && in->proc && in->sys && in->run && in->driver_root);

        s = calloc(1, sizeof(CdiSpec));
        hook = path_join(in->driver_root, "usr/bin/" HOOK_NAME);
        if (!s || !hook) {
                r = -ENOMEM;
                goto finish;
        }
        if (exists(hook)) {
                b.hook_path = strip_prefix(hook, in->root);
                if (!b.hook_path) {
                        r = -ENOMEM;
                        goto finish;
                }
        }
        /* Only MIG devices need the caps minors; a node without any never reads the file. */
        const NvmlSnapshot *snap = in->snapshot;
        bool any_mig = false;
        for (size_t i = 0; i < snap->n_gpus; i++)
                any_mig = any_mig || (snap->gpus[i].mig_current == GPU_MIG_ENABLED && snap->gpus[i].n_mig_devices > 0);
        if (any_mig) {
                r = cdi_mig_minors_read(in->minors_cache ?: &local_minors, in->proc, &minors);
                if (r == -ENOMEM)
                        goto finish;
                if (r < 0 && warn(&b, "cannot read %s/driver/nvidia-caps/mig-minors: %s", in->proc, strerror(-r)) < 0)
                        goto finish;
        }

        for (size_t i = 0; i < snap->n_gpus; i++) {
                const GpuInfo *g = snap->gpus + i;
                if (g->minor < 0) {
                        r = warn(&b, "GPU %s (%s): NVML did not give its device minor (/dev/nvidiaN); left out of the CDI spec",
                                 g->pci_address, strna(g->uuid));
                } else if (g->mig_current == GPU_MIG_ENABLED) {
                        r = 0;
                        for (size_t j = 0; r >= 0 && j < g->n_mig_devices; j++)
                                r = build_mig_device(&b, s, g, g->mig_devices + j, minors, &all);
                } else
                        r = build_full_gpu(&b, s, g, &all);
                if (r < 0)
                        goto finish;
        }
        if (s->n_devices == 0) {
                r = -ENODEV;
                goto finish;
        }

        CdiDevice *d = add_device(s, "all");
        r = d ? copy_edits(&d->edits, &all) : -ENOMEM;
        if (r >= 0)
                r = add_common_edits(&b, &s->edits, snap->driver_version);
        if (r >= 0) {
                s->kind = strdup(CDI_KIND);
                s->version = strdup(cdi_spec_min_version(s));
                if (!s->kind || !s->version)
                        r = -ENOMEM;
        }
        if (r >= 0)
                *ret = TAKE_PTR(s);
finish:
        cdi_mig_minors_cache_free(local_minors);
        free(b.hook_path);
        if (ret_warnings)
                *ret_warnings = TAKE_PTR(b.warnings);
        else
                strv_free(b.warnings);
        return r < 0 ? r : 0;
}
