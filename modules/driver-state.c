/* SPDX-License-Identifier: MIT */
/* Owns <paths.state>/driver.state, the record of the last good driver load, and the options digest
 * it holds (see driver-state.h for the contract). */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "driver-state.h"
#include "fileio.h"
#include "hash.h"
#include "macro.h"
#include "strv.h"

static char *normalize_entry(const char *e) {
        _cleanup_free_ char *out = malloc(strlen(e) + 1);
        char *w = out;
        bool blank = false;

        if (!out)
                return NULL;
        for (const char *p = e; *p; p++) {
                if (isspace((unsigned char) *p)) {
                        blank = w != out;
                        continue;
                }
                if (blank)
                        *w++ = ' ';
                blank = false;
                *w++ = *p;
        }
        *w = 0;
        return TAKE_PTR(out);
}

int driver_options_digest(char *const *entries, char **ret) {
        _cleanup_strv_free_ char **l = NULL;
        uint64_t h = FNV1A64_INIT;

        assert(ret);

        STRV_FOREACH(e, entries) {
                char *n = normalize_entry(*e);
                if (!n || strv_consume(&l, n) < 0)
                        return -ENOMEM;
        }
        strv_sort(l);
        STRV_FOREACH(e, l)
                h = fnv1a64(h, *e, strlen(*e) + 1); /* the NUL separates entries */

        *ret = strprintf("fnv1a64:%016" PRIx64, h);
        return *ret ? 0 : -ENOMEM;
}

static bool value_ok(const char *s) {
        return !isempty(s) && !strpbrk(s, "\n\r") && !isspace((unsigned char) s[0]);
}

int driver_state_new(const char *kernel, const char *driver_version, const char *options_digest,
                     DriverState **ret) {
        DriverState *s;

        assert(ret);

        if (!value_ok(kernel) || !value_ok(driver_version) || !value_ok(options_digest))
                return -EINVAL;
        s = calloc(1, sizeof(DriverState));
        if (!s)
                return -ENOMEM;
        s->kernel = strdup(kernel);
        s->driver_version = strdup(driver_version);
        s->options_digest = strdup(options_digest);
        if (!s->kernel || !s->driver_version || !s->options_digest) {
                driver_state_free(s);
                return -ENOMEM;
        }
        *ret = s;
        return 0;
}

DriverState *driver_state_free(DriverState *s) {
        if (!s)
                return NULL;
        free(s->kernel);
        free(s->driver_version);
        free(s->options_digest);
        return mfree(s);
}


int driver_state_load(const char *state_dir, DriverState **ret) {
        _cleanup_free_ char *path = NULL, *text = NULL;
        const char *kernel = NULL, *version = NULL, *digest = NULL;
        int r;

        assert(state_dir);
        assert(ret);

        path = path_join(state_dir, DRIVER_STATE_FILE);
        if (!path)
                return -ENOMEM;
        r = read_full_file(path, 64 * 1024, &text, NULL);
        if (r == -EFBIG)
                return -EBADMSG;
        if (r < 0)
                return r;

        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
                char *eq;

                strstrip_trailing(line);
                if (line[0] == '#' || line[0] == 0)
                        continue;
                eq = strchr(line, '=');
                if (!eq)
                        return -EBADMSG;
                *eq = 0;
                /* Unknown keys are ignored: a newer agent may record more. */
                if (streq(line, "KERNEL"))
                        kernel = eq + 1;
                else if (streq(line, "DRIVER_VERSION"))
                        version = eq + 1;
                else if (streq(line, "OPTIONS_DIGEST"))
                        digest = eq + 1;
        }

        r = driver_state_new(kernel, version, digest, ret);
        return r == -EINVAL ? -EBADMSG : r;
}

int driver_state_save(const char *state_dir, const DriverState *s) {
        _cleanup_free_ char *path = NULL, *text = NULL;
        int r;

        assert(state_dir);
        assert(s);

        if (!value_ok(s->kernel) || !value_ok(s->driver_version) || !value_ok(s->options_digest))
                return -EINVAL;
        r = mkdir_p(state_dir, 0755);
        if (r < 0)
                return r;
        path = path_join(state_dir, DRIVER_STATE_FILE);
        text = strprintf("# gpu-node-agent: the last good driver load. Remove this file to force a full\n"
                         "# check (and a DKMS rebuild if needed) at the next start.\n"
                         "KERNEL=%s\nDRIVER_VERSION=%s\nOPTIONS_DIGEST=%s\n",
                         s->kernel, s->driver_version, s->options_digest);
        if (!path || !text)
                return -ENOMEM;
        return write_file_atomic(path, NULL, text, strlen(text), 0644);
}

int driver_state_remove(const char *state_dir) {
        _cleanup_free_ char *path = path_join(state_dir, DRIVER_STATE_FILE);

        if (!path)
                return -ENOMEM;
        if (unlink(path) < 0 && errno != ENOENT)
                return negative_errno();
        return 0;
}

int driver_state_compare(const DriverState *recorded, const DriverState *now, char **ret_reason) {
        char *reason = NULL;

        assert(now);

        if (!recorded)
                reason = strdup("no record of a previous load");
        else if (!streq(recorded->kernel, now->kernel))
                reason = strprintf("kernel changed from %s to %s", recorded->kernel, now->kernel);
        else if (!streq(recorded->driver_version, now->driver_version))
                reason = strprintf("driver version changed from %s to %s", recorded->driver_version,
                                   now->driver_version);
        else if (!streq(recorded->options_digest, now->options_digest))
                reason = strdup("module options changed");
        else {
                if (ret_reason)
                        *ret_reason = NULL;
                return 1;
        }

        if (!reason)
                return -ENOMEM;
        if (ret_reason)
                *ret_reason = reason;
        else
                free(reason);
        return 0;
}
