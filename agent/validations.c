/* SPDX-License-Identifier: MIT */
/* Owns writing and removing the GPU Operator validation files (validations.h).
 *
 * Format, from the operator's validator (NVIDIA/gpu-operator validator/main.go, Driver.createStatusFile):
 * driver-ready holds five "KEY=value" lines, IS_HOST_DRIVER, NVIDIA_DRIVER_ROOT, DRIVER_ROOT_CTR_PATH,
 * NVIDIA_DEV_ROOT and DEV_ROOT_CTR_PATH, which the toolkit, device plugin and DCGM entrypoints source.
 * For a driver found on the host the validator uses the host root for both roots and "/host" (where its
 * pods mount the host's root) for both container paths. Older operator releases wrote an empty file; its
 * readers only test for existence, so the content does not hurt them. */
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fileio.h"
#include "strv.h"
#include "validations.h"

#define DRIVER_READY "driver-ready"

char *validations_owner_marker(const char *run_dir) {
        return strprintf("%s/gpu-node-agent/validations-driver-ready", run_dir);
}

char *validations_driver_ready_text(const char *host_root) {
        return strprintf("IS_HOST_DRIVER=true\n"
                         "NVIDIA_DRIVER_ROOT=%s\n"
                         "DRIVER_ROOT_CTR_PATH=/host\n"
                         "NVIDIA_DEV_ROOT=%s\n"
                         "DEV_ROOT_CTR_PATH=/host\n",
                         host_root, host_root);
}

int validations_update(const char *dir, const char *owner_marker, const char *host_root, const ValidationsState *state,
                       bool *ret_changed) {
        _cleanup_free_ char *path = path_join(dir, DRIVER_READY), *text = validations_driver_ready_text(host_root),
                            *old = NULL;
        int r;

        if (!path || !text)
                return -ENOMEM;
        *ret_changed = false;

        r = read_full_file(path, 1U << 16, &old, NULL);
        if (r < 0 && r != -ENOENT)
                return r;

        if (state->driver) {
                /* The marker first: a crash between the two must not leave a file we would not remove. */
                if (access(owner_marker, F_OK) < 0) {
                        r = write_file_atomic_mkdir(owner_marker, path, strlen(path), 0644);
                        if (r < 0)
                                return r;
                }
                if (old && streq(old, text))
                        return 0;
                r = mkdir_p(dir, 0755);
                if (r < 0)
                        return r;
                r = write_file_atomic(path, NULL, text, strlen(text), 0644);
                if (r < 0)
                        return r;
                *ret_changed = true;
                return 0;
        }

        if (access(owner_marker, F_OK) < 0)
                return 0; /* never written by us */
        if (old && streq(old, text)) {
                if (unlink(path) < 0 && errno != ENOENT)
                        return negative_errno();
                *ret_changed = true;
        }
        /* Gone, replaced by someone else's, or just removed: not ours any more. */
        if (unlink(owner_marker) < 0 && errno != ENOENT)
                return negative_errno();
        return 0;
}
