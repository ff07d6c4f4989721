/* SPDX-License-Identifier: MIT */
/* Fuzzes the configuration loader with drop-ins: the input's parts (FUZZ_SEPARATOR) become agent.yaml,
 * a vendor drop-in, an admin drop-in that overrides it and a second admin drop-in, and the fifth the
 * remote document (config.remote: the allowlist of remote keys, its serial), loaded and validated as the
 * daemon does. Invariant: success gives a Config and no error, failure an error sentence and no Config;
 * the same input loads the same way twice. */
#include "config.h"
#include "fuzz-util.h"

#define MAIN "etc/gpu-node-agent/agent.yaml"
#define VENDOR "usr/lib/gpu-node-agent/conf.d"
#define ADMIN "etc/gpu-node-agent/conf.d"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        static const char *const files[] = { MAIN, VENDOR "/10-a.yaml", ADMIN "/10-a.yaml", ADMIN "/20-b.yaml" };
        const char *root = fuzz_scratch();

        if (size > 256 * 1024)
                return 0;
        fuzz_clean(root);
        for (size_t i = 0; i < ELEMENTSOF(files); i++) {
                size_t n;
                _cleanup_free_ char *part = fuzz_part(data, size, (unsigned) i, &n);
                if (!part)
                        break;
                _cleanup_free_ char *p = path_join(root, files[i]), *dir = strdup(p);
                if (!p || !dir)
                        abort();
                *strrchr(dir, '/') = 0;
                (void) mkdir_p(dir, 0755);
                fuzz_write(p, part, n);
        }

        size_t remote_size = 0;
        _cleanup_free_ char *remote = fuzz_part(data, size, ELEMENTSOF(files), &remote_size);
        int results[2];
        for (int k = 0; k < 2; k++) {
                ConfigLoadOptions o = { .root = root, .remote_name = remote ? "https://cfg.example/n.yaml" : NULL,
                                        .remote_data = remote, .remote_size = remote_size };
                _cleanup_free_ char *error = NULL;
                Config *c = NULL;
                int r = config_load(&o, &c, &error);
                if (r >= 0 && (!c || error))
                        abort();
                if (r < 0 && (c || !error || !*error))
                        abort();
                config_free(c);
                results[k] = r;
        }
        if (results[0] != results[1])
                abort();
        return 0;
}
