/* SPDX-License-Identifier: MIT */
/* Fuzzes CDI spec reading: parse, validate, and for a valid spec the round trip through our writer —
 * the YAML we emit must parse and validate again and emit the same text. */
#include "cdi.h"
#include "fuzz-util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        _cleanup_(cdi_spec_freep) CdiSpec *s = NULL, *again = NULL;
        _cleanup_free_ char *error = NULL, *yaml1 = NULL, *yaml2 = NULL;

        (void) fuzz_scratch();
        if (size > 1024 * 1024)
                return 0;
        int r = cdi_spec_parse("fuzz.yaml", (const char *) data, size, &s, &error);
        if (r < 0) {
                if (!error)
                        abort();
                return 0;
        }
        if (cdi_spec_check(s, &error) < 0) {
                if (!error)
                        abort();
                return 0;
        }
        if (cdi_spec_to_yaml(s, &yaml1) < 0)
                return 0; /* ENOMEM only */
        if (cdi_validate_text("round-trip.yaml", yaml1, strlen(yaml1), &error) < 0) {
                fprintf(stderr, "our own output does not validate: %s\n---\n%s", strna(error), yaml1);
                abort();
        }
        if (cdi_spec_parse("round-trip.yaml", yaml1, strlen(yaml1), &again, &error) < 0 ||
            cdi_spec_to_yaml(again, &yaml2) < 0)
                abort();
        if (!streq(yaml1, yaml2)) {
                fprintf(stderr, "round trip changed the spec:\n%s---\n%s", yaml1, yaml2);
                abort();
        }
        return 0;
}
