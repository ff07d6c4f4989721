/* SPDX-License-Identifier: MIT */
/* Owns the holder lists of gpu-holders.h: a walk of every process's fd links and the module
 * holders directory. Read-only; nothing here changes the system. */
#include <ctype.h>
#include <limits.h>

#include "fileio.h"
#include "gpu-holders.h"
#include "macro.h"
#include "strv.h"

static bool is_pid(const char *s) {
        if (!*s)
                return false;
        for (; *s; s++)
                if (!isdigit((unsigned char) *s))
                        return false;
        return true;
}

/* Whether a link target names an NVIDIA node of dev_dir: <dev>/nvidia* or <dev>/nvidia-caps/…. */
static bool is_nvidia_node(const char *target, const char *dev_dir) {
        size_t dl = strlen(dev_dir);

        while (dl > 1 && dev_dir[dl - 1] == '/')
                dl--;
        if (strncmp(target, dev_dir, dl) != 0 || target[dl] != '/')
                return false;
        const char *rest = target + dl + 1;
        if (!startswith(rest, "nvidia"))
                return false;
        const char *slash = strchr(rest, '/');
        /* A node directly in /dev, or one level down in nvidia-caps (nvidia-caps-imex-channels too). */
        return !slash || (startswith(rest, "nvidia-caps") && !strchr(slash + 1, '/'));
}

static int holder_cmp(const void *a, const void *b) {
        pid_t x = ((const GpuHolder *) a)->pid, y = ((const GpuHolder *) b)->pid;
        return x < y ? -1 : x > y;
}

/* The first NVIDIA node process pid has open; 0 none, 1 found (*ret set), negative errno when its
 * fd directory cannot be read. */
static int process_node(const char *proc_dir, const char *pid, const char *dev_dir, char **ret) {
        _cleanup_free_ char *fd_dir = strprintf("%s/%s/fd", proc_dir, pid);
        _cleanup_closedir_ DIR *d = NULL;
        struct dirent *de;

        if (!fd_dir)
                return -ENOMEM;
        d = opendir(fd_dir);
        if (!d)
                return negative_errno();
        while ((de = readdir(d))) {
                char target[PATH_MAX];
                if (de->d_name[0] == '.')
                        continue;
                ssize_t n = readlinkat(dirfd(d), de->d_name, target, sizeof(target) - 1);
                if (n < 0)
                        continue; /* closed meanwhile */
                target[n] = 0;
                if (!is_nvidia_node(target, dev_dir))
                        continue;
                *ret = strdup(target);
                return *ret ? 1 : -ENOMEM;
        }
        return 0;
}

int gpu_holders_processes(const char *proc_dir, const char *dev_dir, pid_t exclude_pid, GpuHolders *holders) {
        _cleanup_closedir_ DIR *d = NULL;
        struct dirent *de;

        assert(proc_dir);
        assert(dev_dir);
        assert(holders);

        d = opendir(proc_dir);
        if (!d)
                return negative_errno();
        while ((de = readdir(d))) {
                _cleanup_free_ char *node = NULL, *comm_path = NULL, *comm = NULL;
                if (!is_pid(de->d_name))
                        continue;
                long pid = strtol(de->d_name, NULL, 10);
                if (pid <= 0 || pid > INT_MAX || (exclude_pid > 0 && pid == exclude_pid))
                        continue;
                int r = process_node(proc_dir, de->d_name, dev_dir, &node);
                if (r == -ENOMEM)
                        return r;
                if (r == -EACCES || r == -EPERM) {
                        holders->n_unreadable++;
                        continue;
                }
                if (r <= 0)
                        continue; /* exited meanwhile, or holds nothing */
                comm_path = strprintf("%s/%s/comm", proc_dir, de->d_name);
                if (!comm_path)
                        return -ENOMEM;
                if (read_one_line_file(comm_path, &comm) < 0) {
                        comm = strdup("?");
                        if (!comm)
                                return -ENOMEM;
                }
                GpuHolder *a = realloc(holders->procs, (holders->n_procs + 1) * sizeof(*a));
                if (!a)
                        return -ENOMEM;
                holders->procs = a;
                holders->procs[holders->n_procs++] = (GpuHolder) {
                        .pid = (pid_t) pid, .comm = TAKE_PTR(comm), .node = TAKE_PTR(node),
                };
        }
        if (holders->n_procs > 1)
                qsort(holders->procs, holders->n_procs, sizeof(*holders->procs), holder_cmp);
        return 0;
}

int gpu_holders_modules(const char *sys_dir, const char *module, GpuHolders *holders) {
        _cleanup_free_ char *name = strdup(module), *mod_dir = NULL, *dir = NULL;
        _cleanup_closedir_ DIR *d = NULL;
        struct dirent *de;
        int r;

        assert(sys_dir);
        assert(holders);
        if (!name)
                return -ENOMEM;
        for (char *c = name; *c; c++)
                if (*c == '-')
                        *c = '_';
        mod_dir = strprintf("%s/module/%s", sys_dir, name);
        dir = strprintf("%s/module/%s/holders", sys_dir, name);
        if (!mod_dir || !dir)
                return -ENOMEM;
        if (access(mod_dir, F_OK) < 0)
                return negative_errno();
        d = opendir(dir);
        if (!d)
                return errno == ENOENT ? 0 : negative_errno(); /* built-in or no holders directory */
        while ((de = readdir(d))) {
                if (de->d_name[0] == '.' || strv_contains(holders->modules, de->d_name))
                        continue;
                r = strv_extend(&holders->modules, de->d_name);
                if (r < 0)
                        return r;
        }
        strv_sort(holders->modules);
        return 0;
}

int gpu_holders_collect(const char *proc_dir, const char *sys_dir, const char *dev_dir, pid_t exclude_pid,
                        GpuHolders *holders) {
        int r = gpu_holders_processes(proc_dir, dev_dir, exclude_pid, holders);
        if (r < 0)
                return r;
        r = gpu_holders_modules(sys_dir, "nvidia", holders);
        return r == -ENOENT ? 0 : r;
}

void gpu_holders_done(GpuHolders *holders) {
        if (!holders)
                return;
        for (size_t i = 0; i < holders->n_procs; i++) {
                free(holders->procs[i].comm);
                free(holders->procs[i].node);
        }
        free(holders->procs);
        strv_free(holders->modules);
        *holders = (GpuHolders) {};
}

char *gpu_holders_to_string(const GpuHolders *h) {
        _cleanup_strv_free_ char **procs = NULL;
        _cleanup_free_ char *plist = NULL, *mlist = NULL, *unreadable = NULL;

        if (!gpu_holders_busy(h))
                return strdup("");
        for (size_t i = 0; i < h->n_procs; i++)
                if (strv_extendf(&procs, "%d (%s, %s)", (int) h->procs[i].pid, h->procs[i].comm, h->procs[i].node) < 0)
                        return NULL;
        plist = strv_join(procs, ", ");
        mlist = strv_join(h->modules, ", ");
        if (!plist || !mlist)
                return NULL;
        unreadable = h->n_unreadable > 0 ? strprintf(" (%zu more processes could not be inspected)", h->n_unreadable)
                                         : strdup("");
        if (!unreadable)
                return NULL;
        return strprintf("The GPU is in use:%s%s%s%s%s%s%s. Stop them, then retry.",
                         h->n_procs > 0 ? (h->n_procs == 1 ? " process " : " processes ") : "", plist, unreadable,
                         h->n_procs > 0 && !isempty(mlist) ? ";" : "",
                         !isempty(mlist) ? (strv_length(h->modules) == 1 ? " kernel module " : " kernel modules ") : "",
                         mlist, !isempty(mlist) ? (strv_length(h->modules) == 1 ? " holds nvidia" : " hold nvidia") : "");
}
