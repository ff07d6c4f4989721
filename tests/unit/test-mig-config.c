/* SPDX-License-Identifier: MIT */
/* Tests the mig-parted v1 reader as a user meets it: every file mig-parted ships (tests/fixtures/
 * mig-parted/, copied unchanged) loads with the content its authors meant, the YAML 1.1 spellings Go's
 * YAML library takes are taken, and every mistake is reported with the exact sentence, file, line,
 * column and key a user reads. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "mig-config.h"
#include "strv.h"

#define STRV_MAKE(...) ((char *[]) { __VA_ARGS__, NULL })

static char *fixture(const char *name) {
        const char *src = getenv("GNA_SOURCE_ROOT");
        if (!src)
                fail_msg("GNA_SOURCE_ROOT is not set; run through meson test");
        char *p = strprintf("%s/tests/fixtures/mig-parted/%s", src, name);
        assert_non_null(p);
        return p;
}

static MigConfigFile *load_fixture(const char *name) {
        _cleanup_free_ char *path = fixture(name), *error = NULL;
        MigConfigFile *f = NULL;
        int r = mig_config_file_load(path, &f, &error);
        if (r < 0)
                fail_msg("%s: %s (%s)", name, strerror(-r), strna(error));
        assert_null(error);
        return f;
}

static const MigConfig *find(const MigConfigFile *f, const char *name) {
        const MigConfig *c = NULL;
        _cleanup_free_ char *error = NULL;
        assert_int_equal(mig_config_file_find(f, name, &c, &error), 0);
        assert_non_null(c);
        return c;
}

static unsigned count_of(const MigConfigEntry *e, const char *profile) {
        for (size_t i = 0; i < e->n_requests; i++)
                if (streq(e->requests[i].profile, profile))
                        return e->requests[i].count;
        fail_msg("entry on line %u has no '%s'", e->line, profile);
        return 0;
}

/* Parses text as "mig.yaml" and checks that it fails with exactly this message. */
static void expect_error(const char *text, int code, const char *message) {
        _cleanup_(mig_config_file_freep) MigConfigFile *f = NULL;
        _cleanup_free_ char *error = NULL;
        int r = mig_config_file_parse("mig.yaml", text, strlen(text), &f, &error);
        if (r >= 0)
                fail_msg("accepted:\n%s", text);
        assert_int_equal(r, code);
        assert_null(f);
        if (!error || !streq(error, message))
                fail_msg("for:\n%s\nexpected: %s\n     got: %s", text, message, strna(error));
}

static MigConfigFile *parse_ok(const char *text) {
        MigConfigFile *f = NULL;
        _cleanup_free_ char *error = NULL;
        int r = mig_config_file_parse("mig.yaml", text, strlen(text), &f, &error);
        if (r < 0)
                fail_msg("rejected (%s):\n%s", strna(error), text);
        return f;
}

/* Every geometry file in the fixture folder loads; mig-parted's hooks files (another format) do not. */
static void test_every_shipped_file(void **state) {
        (void) state;
        _cleanup_free_ char *dir = fixture("");
        _cleanup_closedir_ DIR *d = opendir(dir);
        unsigned geometry = 0, hooks = 0;

        assert_non_null(d);
        for (struct dirent *de; (de = readdir(d));) {
                size_t n = strlen(de->d_name);
                if (n < 5 || !streq(de->d_name + n - 5, ".yaml"))
                        continue;
                _cleanup_free_ char *path = fixture(de->d_name), *error = NULL;
                _cleanup_(mig_config_file_freep) MigConfigFile *f = NULL;
                int r = mig_config_file_load(path, &f, &error);
                if (startswith(de->d_name, "hooks-")) {
                        assert_int_equal(r, -EINVAL);
                        hooks++;
                        continue;
                }
                if (r < 0)
                        fail_msg("%s", strna(error));
                assert_true(f->n_configs > 0);
                geometry++;
        }
        assert_int_equal(geometry, 3);
        assert_int_equal(hooks, 2);
}

static void test_config_default(void **state) {
        (void) state;
        _cleanup_(mig_config_file_freep) MigConfigFile *f = load_fixture("config-default.yaml");
        const MigConfig *c;

        assert_int_equal(f->n_configs, 81);
        assert_string_equal(f->configs[0].name, "all-disabled");
        assert_string_equal(f->configs[80].name, "all-7g.278gb");

        c = find(f, "all-disabled");
        assert_int_equal(c->n_entries, 1);
        assert_true(c->entries[0].all_devices);
        assert_false(c->entries[0].mig_enabled);
        assert_null(c->entries[0].device_filter);

        c = find(f, "all-enabled");
        assert_true(c->entries[0].mig_enabled);
        assert_int_equal(c->entries[0].n_requests, 0);

        c = find(f, "all-1g.24gb-me");
        assert_int_equal(count_of(&c->entries[0], "1g.24gb-me"), 4);
        c = find(f, "all-2g.48gb.me.all");
        assert_int_equal(count_of(&c->entries[0], "2g.48gb+me.all"), 1);
        c = find(f, "all-4g.96gb.gfx");
        assert_int_equal(count_of(&c->entries[0], "4g.96gb+gfx"), 1);

        /* all-balanced: one entry per model family, the last for A30 with a plain string filter */
        c = find(f, "all-balanced");
        assert_int_equal(c->n_entries, 12);
        const MigConfigEntry *a100 = &c->entries[9], *a30 = &c->entries[10], *h200 = &c->entries[6];
        assert_true(strv_equal(a100->device_filter,
                               STRV_MAKE("0x20B010DE", "0x20B110DE", "0x20F110DE", "0x20F610DE")));
        assert_int_equal(a100->n_requests, 3);
        assert_string_equal(a100->requests[0].profile, "1g.5gb");
        assert_int_equal(a100->requests[0].count, 2);
        assert_string_equal(a100->requests[1].profile, "2g.10gb");
        assert_string_equal(a100->requests[2].profile, "3g.20gb");
        assert_true(strv_equal(a30->device_filter, STRV_MAKE("0x20B710DE")));
        assert_int_equal(count_of(a30, "1g.6gb"), 2);
        assert_int_equal(count_of(a30, "2g.12gb"), 1);
        assert_true(strv_equal(h200->device_filter, STRV_MAKE("0x233510DE", "0x233B10DE")));
        assert_int_equal(count_of(h200, "3g.71gb"), 1);
        /* "- device-filter" of the B200 entry is written with spaces inside the brackets */
        assert_true(strv_equal(c->entries[3].device_filter, STRV_MAKE("0x290110DE")));

        /* entry lines point at the entry, for the planner's messages */
        c = find(f, "all-1g.5gb");
        assert_int_equal(c->entries[0].line, 14);

        /* every profile name in the file parses, and every entry says devices: all */
        for (size_t i = 0; i < f->n_configs; i++)
                for (size_t j = 0; j < f->configs[i].n_entries; j++) {
                        const MigConfigEntry *e = &f->configs[i].entries[j];
                        assert_true(e->all_devices);
                        for (size_t k = 0; k < e->n_requests; k++) {
                                MigProfileName n;
                                assert_int_equal(mig_profile_name_parse(e->requests[k].profile, &n), 0);
                        }
                }
}

static void test_examples(void **state) {
        (void) state;
        _cleanup_(mig_config_file_freep) MigConfigFile *f = load_fixture("examples-config.yaml");
        _cleanup_(mig_config_file_freep) MigConfigFile *d = load_fixture("examples-dgx-station-80gb-config.yaml");
        const MigConfig *c;

        assert_int_equal(f->n_configs, 9);
        c = find(f, "custom-config");
        assert_int_equal(c->n_entries, 5);
        assert_false(c->entries[0].all_devices);
        assert_int_equal(c->entries[0].n_devices, 4);
        assert_int_equal(c->entries[0].devices[3], 3);
        assert_false(c->entries[0].mig_enabled);
        assert_int_equal(c->entries[1].n_devices, 1);
        assert_int_equal(c->entries[1].devices[0], 4);
        assert_int_equal(count_of(&c->entries[1], "1g.5gb"), 7);
        assert_int_equal(count_of(&c->entries[4], "3g.20gb"), 1);

        assert_int_equal(d->n_configs, 9);
        /* mig-enabled: false with mig-devices: {} is fine */
        c = find(d, "all-disabled-dgx-station-80");
        assert_false(c->entries[1].mig_enabled);
        assert_true(strv_equal(c->entries[1].device_filter, STRV_MAKE("0x1FB010DE")));
        c = find(d, "balanced-k8s-dgx-station-80");
        assert_int_equal(c->n_entries, 5);
        assert_int_equal(c->entries[4].devices[0], 3);
        assert_int_equal(count_of(&c->entries[2], "2g.20gb"), 3);
        assert_int_equal(count_of(&c->entries[2], "1g.10gb"), 1);
}

static void test_hooks_files_rejected(void **state) {
        (void) state;
        _cleanup_free_ char *path = fixture("hooks-minimal.yaml"), *error = NULL, *expected = NULL;
        MigConfigFile *f = NULL;

        assert_int_equal(mig_config_file_load(path, &f, &error), -EINVAL);
        assert_null(f);
        expected = strprintf("%s:2:1: unknown key 'hooks'; a mig-parted config file takes only 'version' and "
                             "'mig-configs'", path);
        assert_string_equal(error, expected);

        free(path);
        path = fixture("hooks-default.yaml");
        assert_int_equal(mig_config_file_load(path, &f, &error), -EINVAL);
        assert_non_null(strstr(error, ":2:1: unknown key 'hooks'"));
}

static void test_find(void **state) {
        (void) state;
        _cleanup_(mig_config_file_freep) MigConfigFile *f = load_fixture("examples-config.yaml");
        _cleanup_free_ char *error = NULL, *expected = NULL;
        const MigConfig *c = NULL;

        assert_int_equal(mig_config_file_find(f, "all-balanced", &c, &error), 0);
        assert_string_equal(c->name, "all-balanced");
        assert_int_equal(mig_config_file_find(f, "all-balance", &c, &error), -ENOENT);
        expected = strprintf("%s has no MIG config named 'all-balance'; it has: all-disabled, all-enabled, "
                             "all-1g.5gb, all-1g.5gb.me, all-1g.10gb, all-2g.10gb, all-3g.20gb, all-balanced, "
                             "custom-config", f->path);
        assert_string_equal(error, expected);
}

static void test_missing_file(void **state) {
        (void) state;
        _cleanup_free_ char *error = NULL;
        MigConfigFile *f = NULL;

        assert_int_equal(mig_config_file_load("/nonexistent/mig.yaml", &f, &error), -ENOENT);
        assert_string_equal(error, "/nonexistent/mig.yaml: cannot read the MIG config file: No such file or directory");
}

static void test_yaml11_booleans(void **state) {
        (void) state;
        static const char *const yes[] = { "true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON", "y", "Y" };
        static const char *const no[] = { "false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF", "n", "N" };

        for (size_t i = 0; i < ELEMENTSOF(yes); i++)
                for (int v = 0; v < 2; v++) {
                        _cleanup_free_ char *text = strprintf("version: v1\nmig-configs:\n  c:\n    - devices: all\n"
                                                              "      mig-enabled: %s\n      mig-devices: {}\n",
                                                              v ? yes[i] : no[i]);
                        _cleanup_(mig_config_file_freep) MigConfigFile *f = parse_ok(text);
                        assert_int_equal(f->configs[0].entries[0].mig_enabled, v);
                }
        expect_error("version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: \"true\"\n", -EINVAL,
                     "mig.yaml:5:20: mig-configs.c[0].mig-enabled: \"true\" is a quoted string, not a boolean; "
                     "write true or false without quotes");
        expect_error("version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: maybe\n", -EINVAL,
                     "mig.yaml:5:20: mig-configs.c[0].mig-enabled: 'maybe' is not a boolean; write true or false");
        expect_error("version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: [true]\n", -EINVAL,
                     "mig.yaml:5:20: mig-configs.c[0].mig-enabled: a list is not a boolean; write true or false");
}

static void test_anchors_aliases_merge(void **state) {
        (void) state;
        static const char text[] =
                "version: v1\n"
                "mig-configs:\n"
                "  off: &off\n"
                "    - devices: all\n"
                "      mig-enabled: no\n"
                "  also-off: *off\n"
                "  mixed:\n"
                "    - &balanced\n"
                "      devices: [0, 1]\n"
                "      mig-enabled: yes\n"
                "      mig-devices: &bal {\"1g.5gb\": 2, \"2g.10gb\": 1, \"3g.20gb\": 1}\n"
                "    - <<: *balanced\n"
                "      devices: [2]\n"
                "      mig-devices:\n"
                "        <<: *bal\n"
                "        \"1g.5gb\": 0\n"
                "    - <<: [*balanced]\n"
                "      devices: [3]\n";
        _cleanup_(mig_config_file_freep) MigConfigFile *f = parse_ok(text);
        const MigConfig *c;

        assert_int_equal(f->n_configs, 3);
        c = find(f, "also-off");
        assert_int_equal(c->n_entries, 1);
        assert_false(c->entries[0].mig_enabled);
        c = find(f, "mixed");
        assert_int_equal(c->n_entries, 3);
        assert_int_equal(c->entries[0].n_devices, 2);
        assert_int_equal(count_of(&c->entries[0], "1g.5gb"), 2);
        /* the merged entry keeps its own devices and mig-devices, and takes mig-enabled from the anchor */
        assert_int_equal(c->entries[1].n_devices, 1);
        assert_int_equal(c->entries[1].devices[0], 2);
        assert_true(c->entries[1].mig_enabled);
        assert_int_equal(c->entries[1].n_requests, 3);
        assert_int_equal(count_of(&c->entries[1], "1g.5gb"), 0);
        assert_int_equal(count_of(&c->entries[1], "3g.20gb"), 1);
        assert_int_equal(c->entries[2].devices[0], 3);
        assert_int_equal(count_of(&c->entries[2], "2g.10gb"), 1);

        expect_error("version: v1\nmig-configs:\n  c: *nowhere\n", -EINVAL,
                     "mig.yaml:3:6: alias *nowhere refers to no anchor (&nowhere) before it");
        expect_error("version: v1\nmig-configs:\n  c:\n    - <<: 5\n      devices: all\n", -EINVAL,
                     "mig.yaml:4:11: mig-configs.c[0]: a merge key ('<<') takes a mapping or a list of mappings, "
                     "not a plain value");
}

static void test_flow_style_and_filters(void **state) {
        (void) state;
        static const char text[] =
                "{version: v1, mig-configs: {a: [{device-filter: \"0x20b010de:0x134F10DE\", devices: all,"
                " mig-enabled: true, mig-devices: {1c.3g.20gb: 2, 7g.40gb: 0}},"
                " {device-filter: [0x233010DE, \"0x233510DE:0x16C110DE\"], devices: [], mig-enabled: off,"
                " mig-devices: }]}}\n";
        _cleanup_(mig_config_file_freep) MigConfigFile *f = parse_ok(text);
        const MigConfigEntry *e = f->configs[0].entries;
        uint32_t pci, sub;
        bool has;

        assert_true(strv_equal(e[0].device_filter, STRV_MAKE("0x20b010de:0x134F10DE")));
        assert_int_equal(count_of(&e[0], "1c.3g.20gb"), 2);
        assert_int_equal(count_of(&e[0], "7g.40gb"), 0);
        assert_true(strv_equal(e[1].device_filter, STRV_MAKE("0x233010DE", "0x233510DE:0x16C110DE")));
        assert_false(e[1].all_devices);
        assert_int_equal(e[1].n_devices, 0);
        assert_false(e[1].mig_enabled);

        assert_int_equal(mig_device_filter_parse("0x20b010de:0x134F10DE", &pci, &sub, &has), 0);
        assert_int_equal(pci, 0x20B010DE);
        assert_int_equal(sub, 0x134F10DE);
        assert_true(has);
        assert_int_equal(mig_device_filter_parse("0x233010DE", &pci, &sub, &has), 0);
        assert_int_equal(pci, 0x233010DE);
        assert_false(has);
        assert_int_equal(mig_device_filter_parse("0x2330", &pci, &sub, &has), -EINVAL);
        assert_int_equal(mig_device_filter_parse("233010DE", &pci, &sub, &has), -EINVAL);
        assert_int_equal(mig_device_filter_parse("0x233010DG", &pci, &sub, &has), -EINVAL);
        assert_int_equal(mig_device_filter_parse("0x233010DE:", &pci, &sub, &has), -EINVAL);
}

static void test_profile_names(void **state) {
        (void) state;
        static const char *const good[] = { "1g.5gb", "7g.40gb", "1g.10gb+me", "1g.24gb+me.all", "1g.24gb+gfx",
                                            "1g.24gb-me", "1c.3g.20gb", "2c.4g.20gb+me", "1g.24gb+gfx,me" };
        static const char *const bad[] = { "", "1g", "1g.5g", "g.5gb", "0g.5gb", "1g.5gb+", "1g.5gb+ME", "1g.5gb me",
                                           "1c1g.5gb", "1c.g.5gb", "1g.05gb", "1g.5gb-me.all", "3g.20gb.me", "1G.5GB" };
        MigProfileName n;

        for (size_t i = 0; i < ELEMENTSOF(good); i++)
                if (mig_profile_name_parse(good[i], &n) < 0)
                        fail_msg("'%s' rejected", good[i]);
        for (size_t i = 0; i < ELEMENTSOF(bad); i++)
                if (mig_profile_name_parse(bad[i], &n) >= 0)
                        fail_msg("'%s' accepted", bad[i]);

        assert_int_equal(mig_profile_name_parse("2c.4g.20gb+me", &n), 0);
        assert_int_equal(n.ci_slices, 2);
        assert_int_equal(n.gi_slices, 4);
        assert_int_equal(n.memory_gb, 20);
        assert_string_equal(n.gi_name, "4g.20gb+me");
        assert_int_equal(mig_profile_name_parse("1g.5gb", &n), 0);
        assert_int_equal(n.ci_slices, 0);
        assert_string_equal(n.gi_name, "1g.5gb");
}

static void test_count_zero_and_empty(void **state) {
        (void) state;
        _cleanup_(mig_config_file_freep) MigConfigFile *f = parse_ok(
                "version: \"v1\"\n"
                "mig-configs:\n"
                "  a:\n"
                "    - devices: all\n"
                "      mig-enabled: true\n"
                "      mig-devices: {\"1g.5gb\": 0}\n"
                "  b:\n"
                "    - devices: all\n"
                "      mig-enabled: false\n"
                "      mig-devices:\n"
                "  c:\n"
                "    - devices: all\n"
                "      mig-enabled: false\n"
                "      mig-devices: {\"1g.5gb\": 0}\n");
        assert_int_equal(f->n_configs, 3);
        assert_int_equal(count_of(&f->configs[0].entries[0], "1g.5gb"), 0);
        assert_int_equal(f->configs[1].entries[0].n_requests, 0);
}

static void test_errors(void **state) {
        (void) state;
#define HEAD "version: v1\nmig-configs:\n  c:\n"
        expect_error("", -EINVAL, "mig.yaml: the file is empty; a MIG config file starts with 'version: v1' and "
                                  "'mig-configs:'");
        expect_error("# only a comment\n", -EINVAL, "mig.yaml: the file is empty; a MIG config file starts with "
                                                    "'version: v1' and 'mig-configs:'");
        expect_error("- a\n", -EINVAL, "mig.yaml:1:1: the top level must be a mapping with 'version: v1' and "
                                       "'mig-configs:', not a list");
        expect_error("mig-configs: {}\n", -EINVAL,
                     "mig.yaml:1:1: version: missing; add 'version: v1' (mig-parted's config format)");
        expect_error("version: v2\nmig-configs: {}\n", -EINVAL,
                     "mig.yaml:1:10: version: 'v2' is not supported; this reader takes mig-parted's v1 format "
                     "(version: v1)");
        expect_error("version: v1\n", -EINVAL,
                     "mig.yaml:1:1: mig-configs: missing; add the named configs under 'mig-configs:'");
        expect_error("version: v1\nmig-configs: {}\n", -EINVAL,
                     "mig.yaml:2:14: mig-configs: is empty; add at least one named config");
        expect_error("version: v1\nmig-configs: [a]\n", -EINVAL,
                     "mig.yaml:2:14: mig-configs: must be a mapping of config names to lists of entries, not a list");
        expect_error("version: v1\nversions: v1\nmig-configs: {}\n", -EINVAL,
                     "mig.yaml:2:1: unknown key 'versions'; a mig-parted config file takes only 'version' and "
                     "'mig-configs'");
        expect_error(HEAD "    devices: all\n", -EINVAL,
                     "mig.yaml:4:5: mig-configs.c: must be a list of entries (- devices: …), not a mapping of keys");
        expect_error("version: v1\nmig-configs:\n  c: []\n", -EINVAL,
                     "mig.yaml:3:6: mig-configs.c: has no entries; add at least one, such as '- devices: all' with "
                     "'mig-enabled: false'");
        expect_error(HEAD "  d: []\n", -EINVAL,
                     "mig.yaml:3:5: mig-configs.c: must be a list of entries (- devices: …), not an empty value");
        expect_error(HEAD "    - all\n", -EINVAL,
                     "mig.yaml:4:7: mig-configs.c[0]: an entry must be a mapping with 'devices' and 'mig-enabled', "
                     "not a plain value");
        expect_error(HEAD "    - devices: all\n      mig-enable: true\n", -EINVAL,
                     "mig.yaml:5:7: mig-configs.c[0]: unknown key 'mig-enable'; an entry takes only 'device-filter', "
                     "'devices', 'mig-enabled' and 'mig-devices'");
        expect_error(HEAD "    - mig-enabled: false\n", -EINVAL,
                     "mig.yaml:4:7: mig-configs.c[0].devices: missing; write 'devices: all' or a list of GPU indices "
                     "such as [0, 1]");
        expect_error(HEAD "    - devices: some\n      mig-enabled: false\n", -EINVAL,
                     "mig.yaml:4:16: mig-configs.c[0].devices: 'some' is neither 'all' nor a list of GPU indices "
                     "such as [0, 1]");
        expect_error(HEAD "    - devices: {a: 1}\n      mig-enabled: false\n", -EINVAL,
                     "mig.yaml:4:16: mig-configs.c[0].devices: must be 'all' or a list of GPU indices such as [0, 1], "
                     "not a mapping of keys");
        expect_error(HEAD "    - devices: [0, -1]\n      mig-enabled: false\n", -EINVAL,
                     "mig.yaml:4:20: mig-configs.c[0].devices[1]: '-1' is not a GPU index; write a whole number (0 is "
                     "the first GPU in PCI address order)");
        expect_error(HEAD "    - devices: all\n", -EINVAL,
                     "mig.yaml:4:7: mig-configs.c[0].mig-enabled: missing; write 'mig-enabled: true' or 'false'");
        expect_error(HEAD "    - devices: all\n      mig-enabled: true\n", -EINVAL,
                     "mig.yaml:4:7: mig-configs.c[0].mig-devices: missing; with mig-enabled: true list the devices as "
                     "profile: count, or write 'mig-devices: {}' for MIG mode without devices");
        expect_error(HEAD "    - devices: all\n      mig-enabled: false\n      mig-devices: {\"1g.5gb\": 7}\n", -EINVAL,
                     "mig.yaml:6:20: mig-configs.c[0].mig-devices: must be empty when mig-enabled is false; remove "
                     "it, or set mig-enabled: true");
        expect_error(HEAD "    - devices: all\n      mig-enabled: true\n      mig-devices: [\"1g.5gb\"]\n", -EINVAL,
                     "mig.yaml:6:20: mig-configs.c[0].mig-devices: must be a mapping of MIG profile names to counts "
                     "such as {\"1g.10gb\": 7}, not a list");
        expect_error(HEAD "    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"1g.5gb\": 2\n"
                          "        \"1g.7g\": 1\n", -EINVAL,
                     "mig.yaml:8:9: mig-configs.c[0].mig-devices: '1g.7g' is not a MIG profile name (expected "
                     "<G>g.<GB>gb or <C>c.<G>g.<GB>gb, optionally followed by +me, +me.all, +gfx or -me)");
        expect_error(HEAD "    - devices: all\n      mig-enabled: true\n      mig-devices: {3c.2g.10gb: 1}\n", -EINVAL,
                     "mig.yaml:6:21: mig-configs.c[0].mig-devices: '3c.2g.10gb' asks for a compute instance of 3 "
                     "slices inside a GPU instance of 2; <C> in <C>c.<G>g.<GB>gb cannot exceed <G>");
        expect_error(HEAD "    - devices: all\n      mig-enabled: true\n      mig-devices: {1g.5gb: -1}\n", -EINVAL,
                     "mig.yaml:6:29: mig-configs.c[0].mig-devices.1g.5gb: '-1' is not a count; write a whole number "
                     "of devices (0 = none of this profile)");
        expect_error(HEAD "    - devices: all\n      mig-enabled: true\n      mig-devices: {1g.5gb: \"2\"}\n", -EINVAL,
                     "mig.yaml:6:29: mig-configs.c[0].mig-devices.1g.5gb: '2' is not a count; write a whole number "
                     "of devices (0 = none of this profile)");
        expect_error(HEAD "    - devices: all\n      mig-enabled: true\n      mig-devices: {1g.5gb: 5000}\n", -EINVAL,
                     "mig.yaml:6:29: mig-configs.c[0].mig-devices.1g.5gb: 5000 is more than any GPU can hold; counts "
                     "go up to 1000");
        expect_error(HEAD "    - devices: all\n      device-filter: \"0x2330\"\n      mig-enabled: false\n", -EINVAL,
                     "mig.yaml:5:22: mig-configs.c[0].device-filter: '0x2330' is not a PCI id; write 0xDDDDVVVV "
                     "(device id, then vendor id, e.g. 0x233010DE), optionally followed by :0xSSSSVVVV (subsystem "
                     "device and vendor id)");
        expect_error(HEAD "    - devices: all\n      device-filter: [\"0x233010DE\", 0x2330]\n"
                          "      mig-enabled: false\n",
                     -EINVAL,
                     "mig.yaml:5:37: mig-configs.c[0].device-filter[1]: '0x2330' is not a PCI id; write 0xDDDDVVVV "
                     "(device id, then vendor id, e.g. 0x233010DE), optionally followed by :0xSSSSVVVV (subsystem "
                     "device and vendor id)");
        expect_error(HEAD "    - devices: all\n      device-filter: []\n      mig-enabled: false\n", -EINVAL,
                     "mig.yaml:5:22: mig-configs.c[0].device-filter: an empty list matches no GPU; remove the key to "
                     "match every GPU, or list PCI ids such as \"0x233010DE\"");
        expect_error(HEAD "    - devices: all\n      device-filter: [{a: b}]\n      mig-enabled: false\n", -EINVAL,
                     "mig.yaml:5:23: mig-configs.c[0].device-filter[0]: must be a PCI id string such as "
                     "\"0x233010DE\" or a list of them, not a mapping of keys");
        expect_error(HEAD "    - devices: all\n      mig-enabled: false\n      devices: [0]\n", -EINVAL,
                     "mig.yaml:6:7: duplicate key 'devices' (already set on line 4); remove one of them");
        expect_error(HEAD "    - devices: all\n      mig-enabled: false\n  c:\n    - devices: all\n"
                          "      mig-enabled: true\n      mig-devices: {}\n", -EINVAL,
                     "mig.yaml:6:3: duplicate key 'c' (already set on line 3); remove one of them");
        expect_error(HEAD "    - devices: all\n\tmig-enabled: false\n", -EBADMSG,
                     "mig.yaml:5:1: invalid YAML: found a tab character that violates indentation (while scanning "
                     "a plain scalar); indent with spaces, YAML does not allow tabs");
        expect_error(HEAD "    - devices: all\n      mig-enabled: false\n---\nversion: v1\n", -EINVAL,
                     "mig.yaml:6:1: a second YAML document ('---') is not supported; use one document per file");
        expect_error("version: v1\nmig-configs:\n  ? [a]\n  : []\n", -EINVAL,
                     "mig.yaml:3:5: a key must be a plain word, not a list or a mapping");
#undef HEAD
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_every_shipped_file),
                cmocka_unit_test(test_config_default),
                cmocka_unit_test(test_examples),
                cmocka_unit_test(test_hooks_files_rejected),
                cmocka_unit_test(test_find),
                cmocka_unit_test(test_missing_file),
                cmocka_unit_test(test_yaml11_booleans),
                cmocka_unit_test(test_anchors_aliases_merge),
                cmocka_unit_test(test_flow_style_and_filters),
                cmocka_unit_test(test_profile_names),
                cmocka_unit_test(test_count_zero_and_empty),
                cmocka_unit_test(test_errors),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
