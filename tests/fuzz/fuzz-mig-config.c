/* SPDX-License-Identifier: MIT */
/* Fuzzes the mig-parted v1 reader (aliases, merge keys, YAML 1.1 scalars) and the device-filter and
 * profile-name syntaxes: every filter and profile the reader accepted must parse again on its own, and
 * the whole input is also tried as one filter and one profile name. */
#include "fuzz-util.h"
#include "mig-config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        _cleanup_(mig_config_file_freep) MigConfigFile *f = NULL;
        _cleanup_free_ char *error = NULL, *text = NULL;

        (void) fuzz_scratch();
        if (size > 1024 * 1024)
                return 0;
        text = strndup((const char *) data, size);
        if (!text)
                return 0;
        uint32_t id, sub;
        bool has_sub;
        MigProfileName pn;
        if (mig_device_filter_parse(text, &id, &sub, &has_sub) >= 0 && !has_sub && sub != 0)
                abort();
        (void) mig_profile_name_parse(text, &pn);

        int r = mig_config_file_parse("fuzz.yaml", (const char *) data, size, &f, &error);
        if (r < 0) {
                if (f || !error)
                        abort();
                return 0;
        }
        if (!f || error)
                abort();
        for (size_t i = 0; i < f->n_configs; i++) {
                const MigConfig *c = &f->configs[i], *found = NULL;
                _cleanup_free_ char *e = NULL;
                if (mig_config_file_find(f, c->name, &found, &e) < 0 || !found)
                        abort();
                for (size_t k = 0; k < c->n_entries; k++) {
                        const MigConfigEntry *en = &c->entries[k];
                        STRV_FOREACH(filter, en->device_filter)
                                if (mig_device_filter_parse(*filter, &id, &sub, &has_sub) < 0)
                                        abort();
                        for (size_t q = 0; q < en->n_requests; q++)
                                if (mig_profile_name_parse(en->requests[q].profile, &pn) < 0)
                                        abort();
                }
        }
        return 0;
}
