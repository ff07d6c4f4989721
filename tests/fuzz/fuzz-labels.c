/* SPDX-License-Identifier: MIT */
/* Fuzzes label sanitising and NFD formatting: every line "key=value" of the input goes through
 * label_sanitize() (the value) into a LabelSet; what the set takes must be valid, sanitised text must
 * be a valid value once cut to 63, and nfd_format() must produce lines that parse back to the set. */
#include "fuzz-util.h"
#include "label.h"
#include "nfd.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        _cleanup_(label_set_freep) LabelSet *s = label_set_new();
        _cleanup_free_ char *text = NULL, *file = NULL;

        (void) fuzz_scratch();
        if (!s || size > 64 * 1024)
                return 0;
        text = strndup((const char *) data, size);
        if (!text)
                return 0;

        for (char *save = NULL, *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
                char *eq = strchr(line, '=');
                const char *raw = eq ? eq + 1 : "";
                if (eq)
                        *eq = 0;
                _cleanup_free_ char *v = label_sanitize(raw);
                if (!v)
                        return 0;
                for (const char *c = v; *c; c++)
                        if (!(isalnum((unsigned char) *c) || strchr("-_.", *c)))
                                abort(); /* sanitising leaves only the label charset */
                if (strlen(v) > 63)
                        v[63] = 0;
                /* A value cut at 63 may end in '-', '_' or '.': not valid, and then refused. */
                int r = label_set_put(s, line, v);
                if (r >= 0 && (!label_key_is_valid(line) || !label_value_is_valid(v)))
                        abort();
                if (r >= 0 && !streq_ptr(label_set_get(s, line), v))
                        abort();
        }

        if (nfd_format(s, (uint64_t) size * 1000003ULL * USEC_PER_SEC, &file) < 0)
                return 0;
        /* Every label line is key=value and names a label of the set. */
        size_t n = 0;
        for (char *save = NULL, *line = strtok_r(file, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
                if (line[0] == '#')
                        continue;
                char *eq = strchr(line, '=');
                if (!eq)
                        abort();
                *eq = 0;
                if (!streq_ptr(label_set_get(s, line), eq + 1))
                        abort();
                n++;
        }
        if (n != s->n)
                abort();
        return 0;
}
