/* SPDX-License-Identifier: MIT */
/* Owns `gpu-node-agent --cleanup`, which the Debian and RPM packages run when the package is removed
 * (after the service stopped): NFD must stop advertising a prepared GPU node that nothing maintains any
 * more, and container runtimes must not keep injecting devices from a spec nobody refreshes. Only files
 * the agent itself writes are removed; another producer's CDI spec of the same name is left alone. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "cdi.h"
#include "cleanup.h"
#include "fileio.h"
#include "log.h"
#include "macro.h"
#include "nfd.h"
#include "stage.h"
#include "strv.h"
#include "validations.h"

/* The first line of every CDI spec the agent writes (cdi-spec.c). */
#define CDI_SPEC_SIGNATURE "# Written by gpu-node-agent"

static int remove_file(const char *path, const char *what) {
        if (unlink(path) < 0) {
                if (errno == ENOENT)
                        return 0;
                return log_error_errno(errno, "Failed to remove %s %s: %m", what, path);
        }
        log_info("Removed %s %s.", what, path);
        return 0;
}

static int cleanup_cdi_spec(const char *spec) {
        _cleanup_free_ char *data = NULL, *error = NULL;
        int r;

        /* Not through a symlink, and only a regular file: what is at our name otherwise is not ours. */
        r = read_full_file_at(AT_FDCWD, spec, READ_FILE_NOFOLLOW, 64 * 1024 * 1024, &data, NULL);
        if (r == -ENOENT)
                return 0;
        if (r == -ELOOP || r == -EBADFD || r == -EISDIR) {
                log_notice("Leaving %s: it is not a regular file, so gpu-node-agent did not write it.", spec);
                return 0;
        }
        if (r < 0)
                return log_error_errno(r, "Failed to read the CDI spec %s: %m", spec);
        if (!startswith(data, CDI_SPEC_SIGNATURE)) {
                log_notice("Leaving the CDI spec %s: it was not written by gpu-node-agent.", spec);
                return 0;
        }
        r = cdi_spec_remove(spec, &error);
        if (r == -ENOENT)
                return 0;
        if (r < 0)
                return log_error_errno(r, "Failed to remove the CDI spec %s: %s", spec, error ?: strerror(-r));
        log_info("Removed the CDI spec %s.", spec);
        return 0;
}

static int cleanup_runtime_file(const char *dir, const char *name) {
        _cleanup_free_ char *p = path_join(dir, name);

        if (!p)
                return log_oom();
        return remove_file(p, "the readiness file");
}

static int cleanup_runtime_dir(const char *run) {
        _cleanup_free_ char *dir = path_join(run, "gpu-node-agent");
        int r, k;

        if (!dir)
                return log_oom();
        r = cleanup_runtime_file(dir, "ready");
        k = cleanup_runtime_file(dir, "state");
        if (k < 0 && r >= 0)
                r = k;
        for (int i = 0; i < _STAGE_MAX; i++) {
                _cleanup_free_ char *name = stage_ready_file_name(i);
                if (!name)
                        return log_oom();
                k = cleanup_runtime_file(dir, name);
                if (k < 0 && r >= 0)
                        r = k;
        }
        /* The directory itself belongs to tmpfiles.d/RuntimeDirectory=; empty, it can go too. */
        if (rmdir(dir) < 0 && errno != ENOENT && errno != ENOTEMPTY && errno != EEXIST)
                log_debug_errno(errno, "Could not remove %s: %m", dir);
        return r;
}

int agent_cleanup_outputs(const Config *c) {
        _cleanup_free_ char *feature_file = NULL, *error = NULL;
        int r = 0, k;

        feature_file = path_join(c->labels.directory, c->labels.file);
        if (!feature_file)
                return log_oom();
        bool existed = access(feature_file, F_OK) >= 0;
        k = nfd_remove(c->labels.directory, c->labels.file, &error);
        if (k < 0)
                r = log_error_errno(k, "Failed to remove the NFD feature file %s: %s", feature_file,
                                    error ?: strerror(-k));
        else if (existed)
                log_info("Removed the NFD feature file %s.", feature_file);

        k = cleanup_cdi_spec(c->cdi.spec);
        if (k < 0 && r >= 0)
                r = k;
        k = cleanup_cdi_spec(c->cdi.imex_spec);
        if (k < 0 && r >= 0)
                r = k;
        /* The operator's pods must not go on trusting a driver nothing verifies. The Slurm GRES file
         * stays: slurmd includes it, and the GPUs it lists are still there. */
        _cleanup_free_ char *marker = validations_owner_marker(c->paths.run);
        bool removed = false;
        if (!marker)
                return log_oom();
        k = validations_update(c->validations.directory, marker, "/", &(ValidationsState) {}, &removed);
        if (k < 0 && r >= 0)
                r = log_error_errno(k, "Failed to remove %s/driver-ready: %m", c->validations.directory);
        else if (removed)
                log_info("Removed the GPU Operator's %s/driver-ready.", c->validations.directory);
        k = cleanup_runtime_dir(c->paths.run);
        if (k < 0 && r >= 0)
                r = k;
        return r;
}
