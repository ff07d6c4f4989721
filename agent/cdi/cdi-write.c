/* SPDX-License-Identifier: MIT */
/* Owns putting our CDI spec on disk without ever fighting another producer: refusing when another file
 * in the directory declares nvidia.com/gpu (runtimes then drop every device both files name) or when the
 * toolkit's nvidia-cdi-refresh.path unit is enabled (it rewrites the same file), and writing atomically,
 * only when the bytes change, because runtimes watch the directory and reload on every event. */
#include <dirent.h>
#include <fcntl.h>
#include <libgen.h>
#include <sys/stat.h>

#include "cdi.h"
#include "fileio.h"
#include "strv.h"
#include "yaml-reader.h"

#define REFRESH_UNIT "nvidia-cdi-refresh.path"

static bool has_spec_suffix(const char *name) {
        size_t n = strlen(name);
        return (n > 5 && (streq(name + n - 5, ".yaml") || streq(name + n - 5, ".json")));
}

static int check_refresh_unit(const char *etc_dir, char **ret_error) {
        _cleanup_free_ char *unit_dir = strprintf("%s/systemd/system", etc_dir),
                           *masked = strprintf("%s/systemd/system/" REFRESH_UNIT, etc_dir);
        _cleanup_closedir_ DIR *d = NULL;
        struct dirent *de;
        char target[64];

        if (!unit_dir || !masked)
                return -ENOMEM;
        /* A masked unit cannot start, whatever still wants it. */
        ssize_t k = readlink(masked, target, sizeof(target) - 1);
        if (k > 0) {
                target[k] = 0;
                if (streq(target, "/dev/null"))
                        return 0;
        }
        d = opendir(unit_dir);
        if (!d)
                return 0;
        while ((de = readdir(d))) {
                size_t n = strlen(de->d_name);
                if (n < 6 || !streq(de->d_name + n - 6, ".wants"))
                        continue;
                _cleanup_free_ char *p = strprintf("%s/%s/" REFRESH_UNIT, unit_dir, de->d_name);
                struct stat st;
                if (!p)
                        return -ENOMEM;
                if (lstat(p, &st) < 0)
                        continue;
                free(*ret_error);
                *ret_error = strprintf("the NVIDIA Container Toolkit's %s is enabled (%s) and would rewrite the CDI spec "
                                       "the agent writes; run `systemctl mask " REFRESH_UNIT "` to let the agent own it, "
                                       "or set cdi.enabled: false to leave it to the toolkit",
                                       REFRESH_UNIT, p);
                return -EBUSY;
        }
        return 0;
}

int cdi_check_conflicts(const char *spec_path, const char *etc_dir, char **ret_error) {
        _cleanup_free_ char *copy_dir = strdup(spec_path), *copy_base = strdup(spec_path);
        _cleanup_strv_free_ char **names = NULL, **others = NULL;
        _cleanup_closedir_ DIR *d = NULL;
        struct dirent *de;
        int r;

        if (!copy_dir || !copy_base)
                return -ENOMEM;
        if (etc_dir) {
                r = check_refresh_unit(etc_dir, ret_error);
                if (r < 0)
                        return r;
        }

        const char *dir = dirname(copy_dir), *ours = basename(copy_base);
        d = opendir(dir);
        if (!d)
                return errno == ENOENT ? 0 : negative_errno();
        while ((de = readdir(d)))
                if (has_spec_suffix(de->d_name) && !streq(de->d_name, ours) && strv_extend(&names, de->d_name) < 0)
                        return -ENOMEM;
        strv_sort(names);
        STRV_FOREACH(name, names) {
                _cleanup_free_ char *p = path_join(dir, *name), *kind = NULL;
                struct stat st;
                if (!p)
                        return -ENOMEM;
                if (stat(p, &st) < 0 || !S_ISREG(st.st_mode))
                        continue;
                r = cdi_file_kind(p, &kind);
                if (r == -ENOMEM)
                        return r;
                if (kind && streq(kind, CDI_KIND) && strv_extend(&others, p) < 0)
                        return -ENOMEM;
        }
        if (strv_length(others) == 0)
                return 0;

        _cleanup_free_ char *list = strv_join(others, ", ");
        free(*ret_error);
        *ret_error = strprintf("%s declare%s CDI kind " CDI_KIND " in the same directory as the agent's %s; runtimes drop "
                               "every device that two such files both name. Remove %s and stop whatever writes %s (an "
                               "`nvidia-ctk cdi generate` job, the toolkit's nvidia-cdi-refresh), or set cdi.enabled: false",
                               strna(list), strv_length(others) == 1 ? "s" : "", spec_path,
                               strv_length(others) == 1 ? "it" : "them", strv_length(others) == 1 ? "it" : "them");
        return -EEXIST;
}

int cdi_spec_write(const char *path, const char *text, bool *ret_changed, char **ret_error) {
        _cleanup_free_ char *old = NULL, *copy = strdup(path), *parent_copy = NULL;
        size_t old_size, size = strlen(text);
        int r;

        if (!copy)
                return -ENOMEM;
        r = cdi_validate_text(path, text, size, ret_error);
        if (r < 0)
                return r;

        /* A write killed between create and rename left ".<name>.XXXXXX" here; runtimes skip it (no
         * .yaml suffix), but nothing else would ever remove it. */
        _cleanup_free_ char *dir_copy = strdup(path);
        if (!dir_copy)
                return -ENOMEM;
        _cleanup_close_ int dir_fd = open(dirname(dir_copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        _cleanup_free_ char *base_copy = strdup(path), *prefix = NULL;
        if (!base_copy)
                return -ENOMEM;
        prefix = strprintf(".%s.", basename(base_copy));
        if (!prefix)
                return -ENOMEM;
        if (dir_fd >= 0)
                (void) cleanup_temp_files_at(dir_fd, prefix);

        r = read_full_file_at(AT_FDCWD, path, READ_FILE_NOFOLLOW, GNA_YAML_SIZE_MAX, &old, &old_size);
        if (r >= 0 && old_size == size && memcmp(old, text, size) == 0) {
                *ret_changed = false;
                return 0;
        }

        const char *dir = dirname(copy);
        parent_copy = strdup(dir);
        if (!parent_copy)
                return -ENOMEM;
        if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
                r = negative_errno();
                free(*ret_error);
                *ret_error = r == -ENOENT
                        ? strprintf("cannot create %s for the CDI spec: %s does not exist (check cdi.spec)", dir,
                                    dirname(parent_copy))
                        : strprintf("cannot create %s for the CDI spec: %s", dir, strerror(-r));
                return r;
        }

        r = write_file_atomic(path, NULL, text, size, 0644);
        if (r < 0) {
                free(*ret_error);
                *ret_error = strprintf("cannot write the CDI spec %s: %s", path, strerror(-r));
                return r;
        }
        *ret_changed = true;
        return 0;
}

int cdi_spec_remove(const char *path, char **ret_error) {
        _cleanup_free_ char *dir_copy = strdup(path), *base_copy = strdup(path), *prefix = NULL;
        struct stat st;

        if (!dir_copy || !base_copy)
                return -ENOMEM;
        const char *name = basename(base_copy);
        prefix = strprintf(".%s.", name);
        if (!prefix)
                return -ENOMEM;
        _cleanup_close_ int dir_fd = open(dirname(dir_copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir_fd < 0)
                return errno == ENOENT ? -ENOENT : negative_errno();
        (void) cleanup_temp_files_at(dir_fd, prefix);
        if (fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                return negative_errno();
        if (!S_ISREG(st.st_mode)) {
                free(*ret_error);
                *ret_error = strprintf("%s is %s, not the CDI spec gpu-node-agent writes; leaving it alone", path,
                                       S_ISLNK(st.st_mode) ? "a symbolic link" : S_ISDIR(st.st_mode) ? "a directory"
                                                                                      : "a special file");
                return -EEXIST;
        }
        if (unlinkat(dir_fd, name, 0) < 0)
                return negative_errno();
        (void) fsync(dir_fd);
        return 0;
}
