/* SPDX-License-Identifier: MIT */
/* Tests the configuration loader as an administrator meets it: files under a temporary root, the merge
 * order and masking of drop-ins, defaults derived from the root, and the exact error for bad input. */
#include <errno.h>
#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

#include <cmocka.h>

#include "config.h"
#include "fileio.h"
#include "macro.h"
#include "strv.h"

#define MAIN "etc/gpu-node-agent/agent.yaml"
#define VENDOR "usr/lib/gpu-node-agent/conf.d"
#define ADMIN "etc/gpu-node-agent/conf.d"

static int setup_root(void **state) {
        char *root = strdup("/tmp/test-config-XXXXXX");
        assert_non_null(root);
        assert_non_null(mkdtemp(root));
        *state = root;
        return 0;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
        return remove(path);
}

static int teardown_root(void **state) {
        char *root = *state;
        /* Some tests take permissions away; give them back so the tree can be removed. */
        assert_int_equal(nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS), 0);
        free(root);
        return 0;
}

static char *at(const char *root, const char *rel) {
        char *p = path_join(root, rel);
        assert_non_null(p);
        return p;
}

static char *put(const char *root, const char *rel, const char *content) {
        char *p = at(root, rel);
        _cleanup_free_ char *dir = strdup(p);
        assert_non_null(dir);
        *strrchr(dir, '/') = 0;
        assert_int_equal(mkdir_p(dir, 0755), 0);
        FILE *f = fopen(p, "we");
        assert_non_null(f);
        assert_int_equal(fputs(content, f) >= 0, 1);
        assert_int_equal(fclose(f), 0);
        return p;
}

static Config *load_root(const char *root) {
        ConfigLoadOptions o = { .root = root };
        _cleanup_free_ char *error = NULL;
        Config *c = NULL;

        int r = config_load(&o, &c, &error);
        if (r < 0)
                fail_msg("config_load: %s", error);
        assert_null(error);
        assert_non_null(c);
        return c;
}

/* Writes content to <root>/etc/gpu-node-agent/agent.yaml, loads, and checks the return value and the
 * error, whose expected text is what follows "<path of agent.yaml>:". */
static void check_main_error(const char *root, const char *content, int expected_r, const char *expected) {
        _cleanup_free_ char *file = put(root, MAIN, content), *error = NULL, *want = NULL;
        ConfigLoadOptions o = { .root = root };
        Config *c = NULL;

        assert_int_equal(config_load(&o, &c, &error), expected_r);
        assert_null(c);
        assert_non_null(error);
        assert_true(asprintf(&want, "%s:%s", file, expected) >= 0);
        assert_string_equal(error, want);
}

static void test_defaults_under_root(void **state) {
        const char *root = *state;
        Config *c = load_root(root);
        _cleanup_free_ char *sys = at(root, "sys"), *proc = at(root, "proc"), *dev = at(root, "dev"),
                            *modules = at(root, "lib/modules"), *etc = at(root, "etc"), *run = at(root, "run"),
                            *st = at(root, "var/lib/gpu-node-agent"),
                            *labels = at(root, "etc/kubernetes/node-feature-discovery/features.d");

        assert_string_equal(c->paths.root, root);
        assert_string_equal(c->paths.sys, sys);
        assert_string_equal(c->paths.proc, proc);
        assert_string_equal(c->paths.dev, dev);
        assert_string_equal(c->paths.modules, modules);
        assert_string_equal(c->paths.etc, etc);
        assert_string_equal(c->paths.run, run);
        assert_string_equal(c->paths.state, st);
        assert_string_equal(c->paths.pci_ids, ""); /* unset: hwdb, then the system pci.ids */
        assert_string_equal(c->nvml.library, "libnvidia-ml.so.1");
        assert_true(c->labels.enabled);
        assert_string_equal(c->labels.directory, labels);
        assert_string_equal(c->labels.file, "gpu-node-agent");
        assert_int_equal(c->labels.expiry_usec, 0);
        assert_int_equal(c->engine.retry_min_usec, USEC_PER_SEC);
        assert_int_equal(c->engine.retry_max_usec, 300 * USEC_PER_SEC);
        assert_int_equal(c->log_level, LOG_INFO);
        assert_non_null(c->sources);
        assert_int_equal(strv_length(c->sources), 0);
        config_free(c);
}

static void test_defaults_host_root(void **state) {
        const char *root = *state;
        _cleanup_free_ char *missing = at(root, "nothing.yaml"), *empty = put(root, "empty.yaml", ""), *error = NULL;
        char *no_dirs[] = { NULL };
        ConfigLoadOptions o = { .main_file = missing, .dropin_dirs = no_dirs };
        Config *c = NULL;

        /* A main file named explicitly must exist: no silent run on the defaults. */
        assert_int_equal(config_load(&o, &c, &error), -ENOENT);
        assert_null(c);
        assert_non_null(strstr(error, missing));
        assert_non_null(strstr(error, "No such file or directory"));

        o.main_file = empty;
        assert_int_equal(config_load(&o, &c, NULL), 0);
        assert_string_equal(c->paths.root, "/");
        assert_string_equal(c->paths.sys, "/sys");
        assert_string_equal(c->paths.modules, "/lib/modules");
        assert_string_equal(c->paths.state, "/var/lib/gpu-node-agent");
        assert_string_equal(c->labels.directory, "/etc/kubernetes/node-feature-discovery/features.d");
        config_free(c);
        assert_null(config_free(NULL));
}

static void test_merge_order_and_masking(void **state) {
        const char *root = *state;
        /* Created in reverse so that directory order cannot pass for lexical order. */
        free(put(root, ADMIN "/50-z.yaml", "labels:\n  file: admin-z\n"));
        free(put(root, ADMIN "/20-masked.yaml", "labels:\n  expiry: 2min\n"));
        free(put(root, ADMIN "/notes.txt", "this: [is not yaml\n"));
        free(put(root, ADMIN "/.10-hidden.yaml", "bogus: key\n"));
        free(put(root, ADMIN "/10-x.yml", "bogus: key\n"));
        free(put(root, MAIN, "log:\n  level: notice\nlabels:\n  file: main\nnvml:\n  library: /opt/nv.so\n"));
        free(put(root, VENDOR "/30-nulled.yaml", "engine:\n  retry-max: 1h\n"));
        free(put(root, VENDOR "/20-masked.yaml", "labels:\n  expiry: 1h\n  enabled: off\n"));
        free(put(root, VENDOR "/10-b.yaml", "log:\n  level: err\nnvml:\n  library: libb.so\n"));
        free(put(root, VENDOR "/05-a.yaml", "log:\n  level: debug\nlabels:\n  file: vendor\n"));
        _cleanup_free_ char *null_link = at(root, ADMIN "/30-nulled.yaml");
        assert_int_equal(symlink("/dev/null", null_link), 0);

        Config *c = load_root(root);
        _cleanup_free_ char *v1 = at(root, VENDOR "/05-a.yaml"), *v2 = at(root, VENDOR "/10-b.yaml"),
                            *m = at(root, MAIN), *a1 = at(root, ADMIN "/20-masked.yaml"),
                            *a2 = at(root, ADMIN "/50-z.yaml");

        assert_int_equal(strv_length(c->sources), 5);
        assert_string_equal(c->sources[0], v1);
        assert_string_equal(c->sources[1], v2);
        assert_string_equal(c->sources[2], m);
        assert_string_equal(c->sources[3], a1);
        assert_string_equal(c->sources[4], a2);
        assert_int_equal(c->log_level, LOG_NOTICE);              /* agent.yaml beats vendor files */
        assert_string_equal(c->nvml.library, "/opt/nv.so");
        assert_string_equal(c->labels.file, "admin-z");          /* admin conf.d beats agent.yaml */
        assert_int_equal(c->labels.expiry_usec, 120 * USEC_PER_SEC); /* masked vendor file ... */
        assert_true(c->labels.enabled);                           /* ... contributes nothing */
        assert_int_equal(c->engine.retry_max_usec, 300 * USEC_PER_SEC); /* masked by /dev/null */
        config_free(c);
}

static void test_fifo_and_devices_are_not_config(void **state) {
        /* A FIFO drop-in must not block the loader (it would hang --check-config and freeze Reload):
         * it is refused at once with its path named. A link to a character device other than /dev/null
         * does not mask the vendor file: it is refused the same way. */
        const char *root = *state;
        _cleanup_free_ char *fifo = at(root, ADMIN "/40-fifo.yaml"), *error = NULL, *want = NULL;
        ConfigLoadOptions o = { .root = root };
        Config *c = NULL;

        free(put(root, MAIN, "labels:\n  file: main\n"));
        free(put(root, ADMIN "/05-empty.yaml", ""));
        assert_int_equal(mkfifo(fifo, 0644), 0);
        assert_int_equal(config_load(&o, &c, &error), -EBADFD);
        assert_null(c);
        want = strprintf("%s: not a regular file (a FIFO, socket or device); only regular files are read as "
                         "configuration", fifo);
        assert_string_equal(error, want);
        assert_int_equal(unlink(fifo), 0);

        free(put(root, VENDOR "/30-zero.yaml", "labels:\n  file: vendor\n"));
        _cleanup_free_ char *zero = at(root, ADMIN "/30-zero.yaml");
        assert_int_equal(symlink("/dev/zero", zero), 0);
        error = mfree(error);
        want = mfree(want);
        assert_int_equal(config_load(&o, &c, &error), -EBADFD);
        want = strprintf("%s: not a regular file (a FIFO, socket or device); only regular files are read as "
                         "configuration", zero);
        assert_string_equal(error, want);

        /* /dev/null itself masks. */
        assert_int_equal(unlink(zero), 0);
        assert_int_equal(symlink("/dev/null", zero), 0);
        c = load_root(root);
        assert_string_equal(c->labels.file, "main");
        config_free(c);
}

static void test_mapping_merge_scalar_replace(void **state) {
        const char *root = *state;
        free(put(root, MAIN, "labels:\n  enabled: false\n  file: main\n  expiry: 30s\n"));
        free(put(root, ADMIN "/10-file.yaml", "labels:\n  file: dropin\n"));

        Config *c = load_root(root);
        assert_false(c->labels.enabled);                  /* the mapping was merged, not replaced */
        assert_string_equal(c->labels.file, "dropin");    /* the scalar was replaced */
        assert_int_equal(c->labels.expiry_usec, 30 * USEC_PER_SEC);
        config_free(c);

        /* A list is replaced whole, not appended to. */
        free(put(root, VENDOR "/10-units.yaml", "mig:\n  hooks:\n    stop-units: [a.service, b.service]\n"));
        c = load_root(root);
        assert_int_equal(strv_length(c->mig.stop_units), 2);
        config_free(c);
        free(put(root, ADMIN "/15-units.yaml", "mig:\n  hooks:\n    stop-units: [c.service]\n"));
        c = load_root(root);
        assert_int_equal(strv_length(c->mig.stop_units), 1);
        assert_string_equal(c->mig.stop_units[0], "c.service");
        config_free(c);
        free(put(root, ADMIN "/15-units.yaml", "mig:\n  hooks:\n    stop-units: []\n"));
        c = load_root(root);
        assert_int_equal(strv_length(c->mig.stop_units), 0);
        config_free(c);

        /* The health keys: lists of XIDs, the hook, the expected GPU count. */
        free(put(root, ADMIN "/16-health.yaml", "probe:\n  expect-gpus: 8\nhealth:\n  xid:\n    ignore: [13, 31]\n"
                                               "    fatal: [79]\n  on-unhealthy: \"true\"\n  recheck-delay: 2s\n"));
        c = load_root(root);
        assert_int_equal(c->probe.expect_gpus, 8);
        assert_true(c->health.enabled);
        assert_int_equal(strv_length(c->health.xid_ignore), 2);
        assert_string_equal(c->health.xid_ignore[1], "31");
        assert_string_equal(c->health.xid_fatal[0], "79");
        assert_string_equal(c->health.on_unhealthy, "true");
        assert_int_equal(c->health.recheck_delay_usec, 2 * USEC_PER_SEC);
        config_free(c);
        free(put(root, ADMIN "/16-health.yaml", "health: ~\nprobe: ~\n"));

        /* A null replaces the whole mapping: the section is back to its defaults. */
        free(put(root, ADMIN "/20-reset.yaml", "labels: ~\nlog:\n  level: null\n"));
        c = load_root(root);
        assert_true(c->labels.enabled);
        assert_string_equal(c->labels.file, "gpu-node-agent");
        assert_int_equal(c->labels.expiry_usec, 0);
        assert_int_equal(c->log_level, LOG_INFO);
        config_free(c);

        /* A mistake in a file is reported even when a later file overrides the key. */
        free(put(root, MAIN, "labels:\n  enabled: maybe\n"));
        _cleanup_free_ char *error = NULL, *main_file = at(root, MAIN), *want = NULL;
        ConfigLoadOptions o = { .root = root };
        assert_int_equal(config_load(&o, &c, &error), -EINVAL);
        assert_true(asprintf(&want, "%s:2:12: labels.enabled: expected a boolean (true/false), got 'maybe'",
                             main_file) >= 0);
        assert_string_equal(error, want);
}

static void test_empty_files(void **state) {
        const char *root = *state;
        free(put(root, MAIN, ""));
        free(put(root, ADMIN "/10-comments.yaml", "# nothing here yet\n\n"));
        free(put(root, ADMIN "/20-doc.yaml", "---\n"));

        Config *c = load_root(root);
        assert_int_equal(strv_length(c->sources), 3);
        assert_int_equal(c->log_level, LOG_INFO);
        config_free(c);
}

static void test_errors(void **state) {
        const char *root = *state;

        check_main_error(root, "labels:\n  file: [a, b\n", -EBADMSG,
                         "3:1: invalid YAML: did not find expected ',' or ']' (while parsing a flow sequence)");
        check_main_error(root, "labels:\n  file: x\n  enabled: true: false\n", -EBADMSG,
                         "3:16: invalid YAML: mapping values are not allowed in this context");
        check_main_error(root, "labels:\n\tfile: x\n", -EBADMSG,
                         "2:1: invalid YAML: found character that cannot start any token (while scanning for "
                         "the next token); indent with spaces, YAML does not allow tabs");
        check_main_error(root, "labels:\n  file: \xff\n", -EBADMSG,
                         " invalid YAML: invalid leading UTF-8 octet at byte 16");
        check_main_error(root, "labels:\n  fo: x\n", -EINVAL,
                         "2:3: unknown key 'labels.fo' (valid keys under 'labels': enabled, directory, file, "
                         "expiry, mig-strategy, timestamp)");
        check_main_error(root, "log:\n  level: info\nlabel:\n  file: x\n", -EINVAL,
                         "3:1: unknown key 'label' (valid top-level keys: paths, nvml, labels, sharing, driver, devices, fabric, mig, cdi, gres, validations, probe, health, metrics, engine, log, kubernetes, config)");
        check_main_error(root, "labels:\n  enabled: maybe\n", -EINVAL,
                         "2:12: labels.enabled: expected a boolean (true/false), got 'maybe'");
        check_main_error(root, "labels:\n  enabled:\n    - true\n", -EINVAL,
                         "3:5: labels.enabled: expected a single value, got a list");
        check_main_error(root, "labels: true\n", -EINVAL,
                         "1:9: labels: expected a mapping of keys (indented 'key: value' lines below "
                         "'labels:'), got a plain value");
        check_main_error(root, "paths:\n  sys: sys\n", -EINVAL,
                         "2:8: paths.sys: 'sys' is not an absolute path; write it starting with '/'");
        /* "" means unset only where unset has a meaning (paths.pci-ids: hwdb, then the system pci.ids). */
        check_main_error(root, "paths:\n  state: \"\"\n", -EINVAL,
                         "2:10: paths.state: '' is not an absolute path; write it starting with '/'");
        {
                _cleanup_free_ _unused_ char *f = put(root, MAIN, "paths:\n  pci-ids: \"\"\n");
                Config *c = load_root(root);
                assert_string_equal(c->paths.pci_ids, "");
                config_free(c);
        }
        check_main_error(root, "labels:\n  file: nfd/gpu\n", -EINVAL,
                         "2:9: labels.file: 'nfd/gpu' is not a plain file name; use a name without '/' that "
                         "does not start with '.' (such as gpu-node-agent)");
        check_main_error(root, "labels:\n  file: .gpu\n", -EINVAL,
                         "2:9: labels.file: '.gpu' is not a plain file name; use a name without '/' that "
                         "does not start with '.' (such as gpu-node-agent)");
        check_main_error(root, "nvml:\n  library: lib/libnvidia-ml.so.1\n", -EINVAL,
                         "2:12: nvml.library: 'lib/libnvidia-ml.so.1' is neither a library name (such as "
                         "libnvidia-ml.so.1) nor an absolute path");
        check_main_error(root, "- labels\n- log\n", -EINVAL,
                         "1:1: the top level must be a mapping of keys such as 'labels:', not a list");
        check_main_error(root, "labels\n", -EINVAL,
                         "1:1: the top level must be a mapping of keys such as 'labels:', not a plain value");
        check_main_error(root, "labels:\n  file: a\n  expiry: 1h\n  file: b\n", -EINVAL,
                         "4:3: duplicate key 'file' (already set on line 2); remove one of them");
        check_main_error(root, "engine:\n  retry-max: 5min\n  retry-min: 10min\n", -EINVAL,
                         "3:14: engine.retry-min (10min) must not be larger than engine.retry-max (5min)");
        check_main_error(root, "engine:\n  retry-max: 500ms\n", -EINVAL,
                         "2:14: engine.retry-min (1s) must not be larger than engine.retry-max (500ms)");
        check_main_error(root, "sharing:\n  replicas: 4\n", -EINVAL,
                         "2:13: sharing.replicas is 4 but sharing.strategy is none: set sharing.strategy to "
                         "time-slicing or mps");
        check_main_error(root, "sharing:\n  strategy: mps\n  replicas: 0\n", -EINVAL,
                         "3:13: sharing.replicas: must be at least 1 (1 = no sharing)");
        check_main_error(root, "cdi:\n  device-name-strategy: name\n", -EINVAL,
                         "2:25: cdi.device-name-strategy: expected one of index, uuid, type-index, or several of "
                         "them separated by commas (such as index,uuid), got 'name'");
        check_main_error(root, "cdi:\n  device-name-strategy: index,uuid,index\n", -EINVAL,
                         "2:25: cdi.device-name-strategy: expected one of index, uuid, type-index, or several of "
                         "them separated by commas (such as index,uuid), got 'index,uuid,index' (a name listed "
                         "twice)");
        check_main_error(root, "cdi:\n  device-name-strategy: \",\"\n", -EINVAL,
                         "2:25: cdi.device-name-strategy: expected one of index, uuid, type-index, or several of "
                         "them separated by commas (such as index,uuid), got ','");
        check_main_error(root, "labels:\n  mig-strategy: both\n", -EINVAL,
                         "2:17: labels.mig-strategy: expected one of none, single, mixed, got 'both'");
        check_main_error(root, "mig:\n  hooks:\n    stop-units: kubelet.service\n", -EINVAL,
                         "3:17: mig.hooks.stop-units: expected a list such as [nvidia-dcgm.service, "
                         "kubelet.service], got a plain value");
        check_main_error(root, "mig:\n  hooks:\n    stop-units: [kubelet]\n", -EINVAL,
                         "3:18: mig.hooks.stop-units: 'kubelet' is not a systemd unit name; write it with its "
                         "type, such as nvidia-dcgm.service");
        check_main_error(root, "mig:\n  hooks:\n    stop-units: [a.service, a.service]\n", -EINVAL,
                         "3:29: mig.hooks.stop-units: 'a.service' is listed twice");
        check_main_error(root, "health:\n  xid:\n    fatal: 79\n", -EINVAL,
                         "3:12: health.xid.fatal: expected a list such as [13, 31, 43], got a plain value");
        check_main_error(root, "health:\n  xid:\n    ignore: [13, x1]\n", -EINVAL,
                         "3:18: health.xid.ignore: 'x1' is not an XID; write the number from NVIDIA's XID catalog, "
                         "such as 13 or 79");
        check_main_error(root, "health:\n  xid:\n    ignore: [013]\n", -EINVAL,
                         "3:14: health.xid.ignore: '013' is not an XID; write the number from NVIDIA's XID catalog, "
                         "such as 13 or 79");
        check_main_error(root, "driver:\n  parameters:\n    nvidia-foo: x\n", -EINVAL,
                         "3:5: unknown key 'driver.parameters.nvidia-foo' (valid keys under 'driver.parameters': "
                         "nvidia, nvidia-uvm, nvidia-modeset, nvidia-peermem)");
        check_main_error(root, "engine:\n  retry-min: 0\n", -EINVAL,
                         "2:14: engine.retry-min: must be greater than 0, or a failed stage would be retried "
                         "in a busy loop");
        check_main_error(root, "labels:\n  expiry: 5 parsecs\n", -EINVAL,
                         "2:11: labels.expiry: expected a duration such as 90s, 5min or 1h (a number of "
                         "seconds or a number with one of the units ms, s, min, h, d), got '5 parsecs'");
        check_main_error(root, "log:\n  level: verbose\n", -EINVAL,
                         "2:10: log.level: expected one of emerg, alert, crit, err, warning, notice, info, "
                         "debug, got 'verbose'");
        check_main_error(root, "log: &l\n  level: info\nlabels: *l\n", -EINVAL,
                         "3:9: aliases (*l) are not supported; write the value out");
        check_main_error(root, "log:\n  level: info\n---\nlog:\n  level: debug\n", -EINVAL,
                         "3:1: a second YAML document ('---') is not supported; use one document per file");
        check_main_error(root, "? [a, b]\n: c\n", -EINVAL,
                         "1:3: a key must be a plain word, not a list or a mapping");
}

static void test_error_in_dropin(void **state) {
        const char *root = *state;
        _cleanup_free_ char *file = put(root, ADMIN "/10-x.yaml", "# tuning\nlabels:\n  enabled: yes\n  fo: 1\n");
        _cleanup_free_ char *error = NULL, *want = NULL;
        ConfigLoadOptions o = { .root = root };
        Config *c = NULL;

        assert_int_equal(config_load(&o, &c, &error), -EINVAL);
        assert_true(asprintf(&want, "%s:4:3: unknown key 'labels.fo' (valid keys under 'labels': enabled, "
                             "directory, file, expiry, mig-strategy, timestamp)", file) >= 0);
        assert_string_equal(error, want);
}

static void test_unreadable(void **state) {
        const char *root = *state;
        _cleanup_free_ char *error = NULL, *want = NULL, *main_file = at(root, MAIN), *link = NULL;
        ConfigLoadOptions o = { .root = root };
        Config *c = NULL;

        /* A directory where the file should be: unreadable even for root. */
        assert_int_equal(mkdir_p(main_file, 0755), 0);
        assert_int_equal(config_load(&o, &c, &error), -EISDIR);
        assert_true(asprintf(&want, "%s: cannot read the file: Is a directory", main_file) >= 0);
        assert_string_equal(error, want);
        assert_int_equal(rmdir(main_file), 0);
        free(TAKE_PTR(error));
        free(TAKE_PTR(want));

        /* A dangling symlink in a drop-in directory. */
        link = at(root, ADMIN "/10-gone.yaml");
        free(put(root, ADMIN "/00-ok.yaml", "log:\n  level: debug\n"));
        assert_int_equal(symlink("/nonexistent/config.yaml", link), 0);
        assert_int_equal(config_load(&o, &c, &error), -ENOENT);
        assert_true(asprintf(&want, "%s: cannot read the file: No such file or directory", link) >= 0);
        assert_string_equal(error, want);
        assert_int_equal(unlink(link), 0);
        free(TAKE_PTR(error));
        free(TAKE_PTR(want));

        if (geteuid() == 0)
                return; /* permissions do not stop root */
        free(put(root, MAIN, "log:\n  level: debug\n"));
        assert_int_equal(chmod(main_file, 0), 0);
        assert_int_equal(config_load(&o, &c, &error), -EACCES);
        assert_true(asprintf(&want, "%s: cannot read the file: Permission denied", main_file) >= 0);
        assert_string_equal(error, want);
        assert_int_equal(chmod(main_file, 0644), 0);
}

static void test_yaml11_booleans(void **state) {
        const char *root = *state;
        static const struct {
                const char *text;
                bool value;
        } cases[] = {
                { "true", true },  { "True", true },   { "TRUE", true }, { "yes", true },  { "Yes", true },
                { "ON", true },    { "on", true },     { "false", false }, { "False", false },
                { "no", false },   { "NO", false },    { "off", false }, { "Off", false }, { "\"no\"", false },
        };

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                _cleanup_free_ char *text = NULL;
                assert_true(asprintf(&text, "labels:\n  enabled: %s\n", cases[i].text) >= 0);
                free(put(root, MAIN, text));
                Config *c = load_root(root);
                if (c->labels.enabled != cases[i].value)
                        fail_msg("'%s' read as %s", cases[i].text, c->labels.enabled ? "true" : "false");
                config_free(c);
        }
        check_main_error(root, "labels:\n  enabled: 1\n", -EINVAL,
                         "2:12: labels.enabled: expected a boolean (true/false), got '1'");
}

static void test_durations(void **state) {
        static const struct {
                const char *text;
                uint64_t usec;
        } good[] = {
                { "0", 0 },
                { "90", 90 * USEC_PER_SEC },
                { "90s", 90 * USEC_PER_SEC },
                { "5min", 300 * USEC_PER_SEC },
                { "5 min", 300 * USEC_PER_SEC },
                { "1h", 3600 * USEC_PER_SEC },
                { "2d", 2 * 86400 * USEC_PER_SEC },
                { "500ms", 500 * USEC_PER_MSEC },
                { "1.5s", 1500 * USEC_PER_MSEC },
                { "0.25", 250 * USEC_PER_MSEC },
                { "1.5ms", 1500 },
        };
        static const char *const bad[] = {
                "", "s", "min", "-1s", "+1s", " 5s", "5 ", "5m", "5sec", "1.s", ".5s", "1.2.3s", "1e3", "5s5",
                "0x10", "5 parsecs",
        };
        uint64_t u;

        for (size_t i = 0; i < ELEMENTSOF(good); i++) {
                u = UINT64_MAX;
                if (config_parse_duration(good[i].text, &u) < 0)
                        fail_msg("'%s' rejected", good[i].text);
                assert_int_equal(u, good[i].usec);
        }
        for (size_t i = 0; i < ELEMENTSOF(bad); i++)
                if (config_parse_duration(bad[i], &u) != -EINVAL)
                        fail_msg("'%s' accepted", bad[i]);
        assert_int_equal(config_parse_duration("99999999999999999999d", &u), -ERANGE);
        assert_int_equal(config_parse_duration("300000000d", &u), -ERANGE);

        const char *root = *state;
        free(put(root, MAIN, "labels:\n  expiry: 10min\nengine:\n  retry-min: 250ms\n  retry-max: 2h\n"));
        Config *c = load_root(root);
        assert_int_equal(c->labels.expiry_usec, 600 * USEC_PER_SEC);
        assert_int_equal(c->engine.retry_min_usec, 250 * USEC_PER_MSEC);
        assert_int_equal(c->engine.retry_max_usec, 7200 * USEC_PER_SEC);
        config_free(c);
        check_main_error(root, "labels:\n  expiry: 300000000d\n", -EINVAL,
                         "2:11: labels.expiry: the duration '300000000d' is too large");
}

static void test_root_override(void **state) {
        const char *root = *state;
        _cleanup_free_ char *main_file = put(root, "conf/agent.yaml",
                                             "paths:\n  root: /srv/image\n  sys: /host/sys\n  etc: /srv/etc\n");
        char *no_dirs[] = { NULL };
        ConfigLoadOptions o = { .main_file = main_file, .dropin_dirs = no_dirs };
        Config *c = NULL;

        /* paths.root from the file: the unset paths follow it, the set ones stay. */
        assert_int_equal(config_load(&o, &c, NULL), 0);
        assert_string_equal(c->paths.root, "/srv/image");
        assert_string_equal(c->paths.proc, "/srv/image/proc");
        assert_string_equal(c->paths.sys, "/host/sys");
        assert_string_equal(c->paths.etc, "/srv/etc");
        assert_string_equal(c->labels.directory, "/srv/etc/kubernetes/node-feature-discovery/features.d");
        c = config_free(c);

        /* --root beats paths.root. */
        _cleanup_free_ char *proc = at(root, "proc");
        o.root = root;
        assert_int_equal(config_load(&o, &c, NULL), 0);
        assert_string_equal(c->paths.root, root);
        assert_string_equal(c->paths.proc, proc);
        assert_string_equal(c->paths.sys, "/host/sys");
        config_free(c);
}

static void test_cdi_device_name_strategy(void **state) {
        const char *root = *state;
        static const struct {
                const char *value;
                unsigned bits;
        } cases[] = {
                { "index", CDI_NAMES_INDEX },
                { "uuid", CDI_NAMES_UUID },
                { "type-index", CDI_NAMES_TYPE_INDEX },
                { "index,uuid", CDI_NAMES_INDEX | CDI_NAMES_UUID },
                { "uuid, type-index", CDI_NAMES_UUID | CDI_NAMES_TYPE_INDEX },
                { "Type-Index,index,UUID", CDI_NAMES_INDEX | CDI_NAMES_UUID | CDI_NAMES_TYPE_INDEX },
        };
        Config *c = load_root(root);
        assert_int_equal(c->cdi.device_names, CDI_NAMES_INDEX | CDI_NAMES_UUID); /* nvidia-ctk's default */
        config_free(c);
        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                _cleanup_free_ char *text = strprintf("cdi:\n  device-name-strategy: %s\n", cases[i].value);
                free(put(root, MAIN, text));
                c = load_root(root);
                assert_int_equal(c->cdi.device_names, cases[i].bits);
                config_free(c);
        }
}

static void test_dump_roundtrip(void **state) {
        const char *root = *state;
        free(put(root, VENDOR "/00-defaults.yaml", "log:\n  level: warning\n"));
        free(put(root, MAIN,
                 "paths:\n  pci-ids: /opt/pci ids/pci.ids\n  modules: /chroot/lib/modules\n"
                 "nvml:\n  library: \"lib nv#1: ~.so\"\n"
                 "labels:\n  enabled: no\n  file: \"null\"\n  expiry: 1.5s\n"
                 "engine:\n  retry-min: 0.001ms\n  retry-max: 2d\n"));
        Config *c = load_root(root);
        _cleanup_free_ char *dump = NULL, *dump_file = at(root, "dump.yaml"), *error = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&dump, &size);
        assert_non_null(f);
        assert_int_equal(config_dump(c, f), 0);
        assert_int_equal(fclose(f), 0);

        _cleanup_free_ char *vendor = at(root, VENDOR "/00-defaults.yaml"), *line = NULL;
        assert_true(asprintf(&line, "# sources:\n#   %s\n", vendor) >= 0);
        assert_non_null(strstr(dump, line));
        assert_non_null(strstr(dump, "\nlabels:\n  enabled: false\n"));
        assert_non_null(strstr(dump, "  expiry: 1500ms\n"));
        assert_non_null(strstr(dump, "  retry-min: 0.001ms\n  retry-max: 2d\n"));
        assert_non_null(strstr(dump, "\nlog:\n  level: warning\n"));
        assert_non_null(strstr(dump, "  device-name-strategy: index,uuid\n"));

        free(put(root, "dump.yaml", dump));
        char *no_dirs[] = { NULL };
        ConfigLoadOptions o = { .main_file = dump_file, .dropin_dirs = no_dirs };
        Config *d = NULL;
        if (config_load(&o, &d, &error) < 0)
                fail_msg("the dump does not load: %s\n%s", error, dump);
        assert_string_equal(d->paths.root, c->paths.root);
        assert_string_equal(d->paths.sys, c->paths.sys);
        assert_string_equal(d->paths.proc, c->paths.proc);
        assert_string_equal(d->paths.dev, c->paths.dev);
        assert_string_equal(d->paths.modules, "/chroot/lib/modules");
        assert_string_equal(d->paths.etc, c->paths.etc);
        assert_string_equal(d->paths.run, c->paths.run);
        assert_string_equal(d->paths.state, c->paths.state);
        assert_string_equal(d->paths.pci_ids, "/opt/pci ids/pci.ids");
        assert_string_equal(d->nvml.library, "lib nv#1: ~.so");
        assert_false(d->labels.enabled);
        assert_string_equal(d->labels.directory, c->labels.directory);
        assert_string_equal(d->labels.file, "null");
        assert_int_equal(d->labels.expiry_usec, 1500 * USEC_PER_MSEC);
        assert_int_equal(d->engine.retry_min_usec, 1);
        assert_int_equal(d->engine.retry_max_usec, 2 * 86400 * USEC_PER_SEC);
        assert_int_equal(d->log_level, LOG_WARNING);
        assert_int_equal(strv_length(d->sources), 1);

        /* And the dump of the dump is the same text, but for the sources comment. */
        _cleanup_free_ char *dump2 = NULL;
        f = open_memstream(&dump2, &size);
        assert_non_null(f);
        assert_int_equal(config_dump(d, f), 0);
        assert_int_equal(fclose(f), 0);
        assert_string_equal(strstr(dump2, "\npaths:"), strstr(dump, "\npaths:"));
        config_free(d);
        config_free(c);
}

/* The files the packages install must load; the vendor defaults file changes only labels.expiry (1h,
 * so that the labels of a node whose agent stopped for good expire). */
/* The remote document (config.remote) is merged after agent.yaml and before the administrator's
 * conf.d, is named by its URL in errors and in sources, and may not point the node elsewhere. */
static void test_remote_layer(void **state) {
        const char *root = *state;
        static const char url[] = "https://config.example/node.yaml";
        _cleanup_free_ _unused_ char *main_file = put(root, MAIN,
                                             "labels:\n  mig-strategy: single\n  expiry: 1h\nsharing:\n  replicas: 1\n"
                                             "config:\n  remote:\n    url: https://config.example/{hostname}.yaml\n"),
                            *admin _unused_ = put(root, ADMIN "/50-local.yaml", "labels:\n  expiry: 2h\n"),
                            *error = NULL;
        const char *doc = "labels:\n  mig-strategy: mixed\n  expiry: 3h\nsharing:\n  strategy: mps\n  replicas: 4\n";
        ConfigLoadOptions o = { .root = root, .remote_name = url, .remote_data = doc, .remote_size = strlen(doc) };
        Config *c = NULL;

        assert_int_equal(config_load(&o, &c, &error), 0);
        assert_int_equal(c->labels.mig_strategy, MIG_STRATEGY_MIXED); /* remote beats agent.yaml */
        assert_int_equal(c->labels.expiry_usec, 7200 * USEC_PER_SEC); /* the local drop-in beats remote */
        assert_int_equal(c->sharing.replicas, 4);
        assert_string_equal(c->remote.url, "https://config.example/{hostname}.yaml");
        assert_int_equal(c->remote.interval_usec, 300 * USEC_PER_SEC);
        assert_int_equal(c->remote.timeout_usec, 30 * USEC_PER_SEC);
        assert_int_equal(strv_length(c->sources), 3);
        assert_string_equal(c->sources[1], url);
        c = config_free(c);

        /* Same validation as a local file, with the URL where the file name would be. */
        doc = "sharing:\n  replicas: lots\n";
        o.remote_data = doc;
        o.remote_size = strlen(doc);
        assert_int_equal(config_load(&o, &c, &error), -EINVAL);
        assert_null(c);
        assert_string_equal(error, "https://config.example/node.yaml:2:13: sharing.replicas: expected a whole "
                                   "number from 0 to 4294967295, got 'lots'");
        error = mfree(error);

        doc = "config:\n  remote:\n    url: https://evil.example/\n";
        o.remote_data = doc;
        o.remote_size = strlen(doc);
        assert_int_equal(config_load(&o, &c, &error), -EINVAL);
        assert_string_equal(error, "https://config.example/node.yaml:3:5: config.remote.url: may not be set by the "
                                   "remote configuration: it decides where the node takes its configuration or "
                                   "its MIG selection from; set it in a local file such as "
                                   "/etc/gpu-node-agent/agent.yaml. The whole document is refused");
        error = mfree(error);

        /* A null section is the remote document setting every key under it (back to its default). */
        doc = "config: ~\n";
        o.remote_data = doc;
        o.remote_size = strlen(doc);
        assert_int_equal(config_load(&o, &c, &error), -EINVAL);
        assert_string_equal(error, "https://config.example/node.yaml:1:1: config: a null section puts "
                                   "config.remote.url back to its default, and the remote configuration may not set "
                                   "that key: it decides where the node takes its configuration or its MIG "
                                   "selection from; set it in a local file such as /etc/gpu-node-agent/agent.yaml. "
                                   "The whole document is refused (it also sets config.remote.ca-file, "
                                   "config.remote.cert, config.remote.key, config.remote.signing-key, "
                                   "config.remote.signature-url, config.remote.interval, config.remote.timeout)");
        error = mfree(error);

        doc = "labels: [unclosed\n";
        o.remote_data = doc;
        o.remote_size = strlen(doc);
        assert_int_equal(config_load(&o, &c, &error), -EBADMSG);
        assert_true(startswith(error, "https://config.example/node.yaml:"));
}

/* Loads agent.yaml (already written) with the remote document doc; returns config_load()'s result and
 * sets *ret_error. */
static int load_remote_doc(const char *root, const char *doc, Config **ret, char **ret_error) {
        ConfigLoadOptions o = { .root = root, .remote_name = "https://cfg.example/n.yaml", .remote_data = doc,
                                .remote_size = strlen(doc) };
        return config_load(&o, ret, ret_error);
}

/* "a.b.c" as a remote document "a:\n  b:\n    c: value\n". */
static char *nested_doc(const char *key, const char *value) {
        _cleanup_free_ char *doc = strdup("");
        size_t depth = 0;
        const char *p = key;

        assert_non_null(doc);
        for (const char *dot; (dot = strchr(p, '.')); p = dot + 1, depth++) {
                char *t = strprintf("%s%*s%.*s:\n", doc, (int) depth * 2, "", (int) (dot - p), p);
                assert_non_null(t);
                free(doc);
                doc = t;
        }
        char *t = strprintf("%s%*s%s: %s\n", doc, (int) depth * 2, "", p, value);
        assert_non_null(t);
        return t;
}

/* Every key the table does not mark remote is refused from the remote document, by name and with its
 * reason, whatever the value (null, which puts it back to its default, included), and the document is
 * refused whole; every key it marks remote is taken. */
static void test_remote_allowlist(void **state) {
        const char *root = *state;
        _cleanup_free_ char *table = NULL, *main_file = put(root, MAIN, "nvml:\n  library: /opt/nvml.so\n");
        size_t size, n_refused = 0, n_allowed = 0;
        FILE *f = open_memstream(&table, &size);

        assert_non_null(f);
        assert_int_equal(config_keys_dump(f), 0);
        assert_int_equal(fclose(f), 0);
        for (char *line = table, *next; line && *line; line = next) {
                _cleanup_free_ char *doc = NULL, *error = NULL, *want = NULL;
                Config *c = NULL;

                next = strchr(line, '\n');
                *next++ = 0;
                char *def = strchr(line, '\t'), *remote = def ? strchr(def + 1, '\t') : NULL;
                assert_non_null(remote);
                *def = *remote = 0;
                remote++;
                doc = nested_doc(line, "~");
                int r = load_remote_doc(root, doc, &c, &error);
                if (streq(remote, "yes")) {
                        if (r < 0)
                                fail_msg("%s (remote) refused: %s", line, error);
                        n_allowed++;
                        config_free(c);
                        continue;
                }
                assert_true(startswith(remote, "no ("));
                assert_int_equal(r, -EINVAL);
                assert_null(c);
                assert_true(asprintf(&want, ": %s: may not be set by the remote configuration: it ", line) >= 0);
                if (!startswith(error, "https://cfg.example/n.yaml:") || !strstr(error, want) ||
                    !strstr(error, "The whole document is refused"))
                        fail_msg("%s: unexpected refusal: %s", line, error);
                n_refused++;
        }
        /* The policy keys, and everything that names what runs or is written as root refused. */
        assert_true(n_allowed >= 25);
        assert_true(n_refused >= 40);

        /* Real values of the keys an attacker would want, each alone, each refused by name. */
        static const struct {
                const char *key, *value, *why;
        } evil[] = {
                { "nvml.library", "/tmp/evil.so", "names a shared object the agent loads as root" },
                { "health.on-unhealthy", "\"touch /tmp/pwned\"", "is a shell command the agent runs as root" },
                { "driver.dkms.program", "/tmp/evil", "names a program the agent runs as root" },
                { "driver.dkms.module", "evil/1.0", "to a program's command line" },
                { "driver.parameters.nvidia", "\"NVreg_RegistryDwords=x\"", "to the kernel as module options" },
                { "paths.state", "/tmp", "names a file or directory" },
                { "paths.root", "/tmp", "names a file or directory" },
                { "labels.directory", "/etc/cron.d", "names a file or directory" },
                { "labels.file", "passwd", "names a file or directory" },
                { "gres.slurm.file", "/etc/passwd", "names a file or directory" },
                { "metrics.textfile", "/etc/cron.d/x.prom", "names a file or directory" },
                { "mig.config-file", "/tmp/mig.yaml", "names a file or directory" },
                { "mig.hooks.stop-units", "[sshd.service]", "names systemd units" },
                { "mig.selected-from", "node-label", "its MIG selection from" },
                { "cdi.spec", "/etc/ld.so.preload", "names a file or directory" },
                { "kubernetes.kubeconfig", "/tmp/k.conf", "names a file or directory" },
                { "kubernetes.node-name", "other-node", "which Kubernetes node" },
                { "config.remote.signing-key", "/tmp/k.pem", "names a file or directory" },
                { "config.remote.interval", "1s", "where the node takes its configuration" },
                { "driver.enabled", "false", "kernel modules, device nodes or system services" },
        };
        for (size_t i = 0; i < ELEMENTSOF(evil); i++) {
                _cleanup_free_ char *doc = nested_doc(evil[i].key, evil[i].value), *error = NULL, *want = NULL;
                Config *c = NULL;

                assert_int_equal(load_remote_doc(root, doc, &c, &error), -EINVAL);
                assert_null(c);
                /* The leaf's key sits on the last line, indented two columns a level. */
                size_t depth = 0;
                for (const char *p = evil[i].key; (p = strchr(p, '.')); p++)
                        depth++;
                assert_true(asprintf(&want, "https://cfg.example/n.yaml:%zu:%zu: %s: may not be set by the remote "
                                            "configuration: it ", depth + 1, depth * 2 + 1, evil[i].key) >= 0);
                if (!startswith(error, want) || !strstr(error, evil[i].why))
                        fail_msg("%s: %s", evil[i].key, error);
        }

        /* All of them in one document: the first is named with where and why, the others listed. */
        _cleanup_free_ char *error = NULL;
        Config *c = NULL;
        assert_int_equal(load_remote_doc(root, "log:\n  level: debug\nnvml:\n  library: /tmp/evil.so\n"
                                               "health:\n  on-unhealthy: reboot\npaths:\n  state: /tmp\n", &c, &error),
                         -EINVAL);
        assert_string_equal(error, "https://cfg.example/n.yaml:4:3: nvml.library: may not be set by the remote "
                                   "configuration: it names a shared object the agent loads as root; set it in a "
                                   "local file such as /etc/gpu-node-agent/agent.yaml. The whole document is refused "
                                   "(it also sets health.on-unhealthy, paths.state)");
        error = mfree(error);

        /* A document of policy keys only applies, every one of them, over the local files. */
        const char *policy =
                "serial: 2026120101\n"
                "nvml:\n  timeout: 45s\n"
                "labels:\n  enabled: false\n  expiry: 1h\n  mig-strategy: mixed\n  timestamp: true\n"
                "sharing:\n  strategy: time-slicing\n  replicas: 4\n  rename-by-default: true\n"
                "driver:\n  version: 550.127.05\n  reload-on-mismatch: when-idle\n  dkms:\n    timeout: 1h\n"
                "fabric:\n  timeout: 5min\n  imex: off\n  imex-channels: 4\n"
                "mig:\n  selected: all-1g.10gb\n  reset: never\n"
                "cdi:\n  enabled: false\n  device-name-strategy: uuid\n"
                "gres:\n  slurm:\n    enabled: true\n"
                "validations:\n  operator-compat: true\n"
                "probe:\n  expect-gpus: 8\n"
                "health:\n  enabled: false\n  xid:\n    ignore: [13, 31]\n    fatal: [79]\n  recheck-delay: 1min\n"
                "engine:\n  retry-min: 2s\n  retry-max: 10min\n"
                "log:\n  level: debug\n";
        if (load_remote_doc(root, policy, &c, &error) < 0)
                fail_msg("%s", error);
        assert_int_equal(c->nvml.timeout_usec, 45 * USEC_PER_SEC);
        assert_string_equal(c->nvml.library, "/opt/nvml.so"); /* the local file's */
        assert_false(c->labels.enabled);
        assert_int_equal(c->labels.mig_strategy, MIG_STRATEGY_MIXED);
        assert_int_equal(c->sharing.replicas, 4);
        assert_string_equal(c->driver.version, "550.127.05");
        assert_int_equal(c->driver.reload_on_mismatch, 1);
        assert_int_equal(c->fabric.imex_channels, 4);
        assert_string_equal(c->mig.selected, "all-1g.10gb");
        assert_int_equal(c->cdi.device_names, CDI_NAMES_UUID);
        assert_true(c->gres.slurm_enabled);
        assert_true(c->validations.operator_compat);
        assert_int_equal(c->probe.expect_gpus, 8);
        assert_int_equal(strv_length(c->health.xid_ignore), 2);
        assert_string_equal(c->health.xid_fatal[0], "79");
        assert_int_equal(c->engine.retry_max_usec, 600 * USEC_PER_SEC);
        assert_int_equal(c->log_level, LOG_DEBUG);
        c = config_free(c);

        /* A null section of policy keys only is fine; one with a local key under it is not. */
        assert_int_equal(load_remote_doc(root, "sharing: ~\nhealth:\n  xid: ~\n", &c, &error), 0);
        c = config_free(c);
        assert_int_equal(load_remote_doc(root, "nvml: ~\n", &c, &error), -EINVAL);
        assert_string_equal(error, "https://cfg.example/n.yaml:1:1: nvml: a null section puts nvml.library back to "
                                   "its default, and the remote configuration may not set that key: it names a "
                                   "shared object the agent loads as root; set it in a local file such as "
                                   "/etc/gpu-node-agent/agent.yaml. The whole document is refused");
}

/* The serial of a remote document: the document's version for the signature's rollback check, not a
 * key of the configuration. */
static void test_remote_serial(void **state) {
        const char *root = *state;
        _cleanup_free_ char *main_file _unused_ = put(root, MAIN, ""), *error = NULL;
        uint64_t serial = 0;
        Config *c = NULL;

        assert_int_equal(config_remote_document_serial("u", "serial: 18446744073709551615\nlog:\n  level: debug\n",
                                                       47, &serial, &error), 0);
        assert_true(serial == UINT64_MAX);
        assert_int_equal(config_remote_document_serial("u", "log:\n  level: debug\n", 20, &serial, &error), -ENOENT);
        assert_int_equal(config_remote_document_serial("u", "serial: -1\n", 11, &serial, &error), -EINVAL);
        assert_string_equal(error, "u:1:9: serial: expected a whole number from 0 to 18446744073709551615 (the "
                                   "document's version, raised with every change, such as 2026120101), got -1");
        error = mfree(error);

        assert_int_equal(load_remote_doc(root, "serial: 7\nlog:\n  level: debug\n", &c, &error), 0);
        assert_int_equal(c->log_level, LOG_DEBUG);
        c = config_free(c);
        assert_int_equal(load_remote_doc(root, "serial: [1]\n", &c, &error), -EINVAL);
        assert_string_equal(error, "https://cfg.example/n.yaml:1:9: serial: expected a whole number from 0 to "
                                   "18446744073709551615 (the document's version, raised with every change, such as "
                                   "2026120101), got a list");
        error = mfree(error);
        check_main_error(root, "serial: 3\n", -EINVAL,
                         "1:1: unknown key 'serial' (valid top-level keys: paths, nvml, labels, sharing, driver, "
                         "devices, fabric, mig, cdi, gres, validations, probe, health, metrics, engine, log, "
                         "kubernetes, config); only the remote document (config.remote) carries a serial");
}

static void test_remote_errors(void **state) {
        const char *root = *state;

        check_main_error(root, "config:\n  remote:\n    url: http://config.example/x.yaml\n", -EINVAL,
                         "3:10: config.remote.url: 'http://config.example/x.yaml' is not an https:// URL; the "
                         "configuration is only fetched over TLS");
        check_main_error(root, "config:\n  remote:\n    url: https://h/x\n    cert: /etc/c.pem\n", -EINVAL,
                         "4:11: config.remote.cert and config.remote.key go together: set both for mutual TLS, "
                         "or neither");
        check_main_error(root, "config:\n  remote:\n    ca-file: ca.pem\n", -EINVAL,
                         "3:14: config.remote.ca-file: 'ca.pem' is not an absolute path; write it starting with '/'");
        check_main_error(root, "config:\n  remote:\n    url: https://h/{host}.yaml\n", -EINVAL,
                         "3:10: config.remote.url: unknown placeholder {host}; the placeholders are {hostname}, "
                         "{machine-id} and {product}");
        check_main_error(root, "config:\n  remote:\n    timeout: 0\n", -EINVAL,
                         "3:14: config.remote.timeout: must be greater than 0, or a server that never answers would "
                         "hold the fetch forever");
        check_main_error(root, "config:\n  remote:\n    signing-key: keys/fleet.pub\n", -EINVAL,
                         "3:18: config.remote.signing-key: 'keys/fleet.pub' is not an absolute path; write it "
                         "starting with '/'");
        check_main_error(root, "config:\n  remote:\n    signing-key: /nonexistent/fleet.pub\n", -EINVAL,
                         "3:18: config.remote.signing-key: /nonexistent/fleet.pub: cannot read the public key: No "
                         "such file or directory");
        check_main_error(root, "config:\n  remote:\n    signature-url: http://h/x.sig\n", -EINVAL,
                         "3:20: config.remote.signature-url: 'http://h/x.sig' is not an https:// URL");
        check_main_error(root, "config:\n  remote:\n    signature-url: https://h/{host}.sig\n", -EINVAL,
                         "3:20: config.remote.signature-url: unknown placeholder {host}; the placeholders are "
                         "{hostname}, {machine-id} and {product}");
        _cleanup_free_ char *key = put(root, "fleet.pub", "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n"
                                                         "-----END PRIVATE KEY-----\n"),
                            *yaml = strprintf("config:\n  remote:\n    signing-key: %s\n", key), *want = NULL;
        assert_non_null(yaml);
        assert_true(asprintf(&want, "3:18: config.remote.signing-key: %s is a private key; the node needs only the "
                                    "public key (openssl pkey -in KEY -pubout -out %s), and the private key belongs "
                                    "where the documents are signed", key, key) >= 0);
        check_main_error(root, yaml, -EINVAL, want);
}

static void test_shipped_files(void **state) {
        const char *src = getenv("GNA_SOURCE_ROOT");
        if (!src)
                skip();
        _cleanup_free_ char *confd = at(src, "conf.d"), *example = at(src, "conf.d/examples/agent.yaml"),
                            *empty = put(*state, "none.yaml", ""), *error = NULL;
        char *vendor_only[] = { confd, (char *) "/nonexistent", NULL };
        ConfigLoadOptions o = { .root = *state, .main_file = empty, .dropin_dirs = vendor_only };
        Config *c = NULL, *d = load_root(*state);

        assert_int_equal(config_load(&o, &c, &error), 0);
        assert_int_equal(strv_length(c->sources), 2); /* 00-defaults.yaml and the empty main file */
        assert_int_equal(d->labels.expiry_usec, 0);
        assert_int_equal(c->labels.expiry_usec, 3600 * USEC_PER_SEC);
        assert_string_equal(c->paths.pci_ids, d->paths.pci_ids);
        assert_string_equal(c->paths.sys, d->paths.sys);
        assert_string_equal(c->labels.directory, d->labels.directory);
        assert_int_equal(c->labels.enabled, d->labels.enabled);
        assert_int_equal(c->engine.retry_max_usec, d->engine.retry_max_usec);
        assert_int_equal(c->log_level, d->log_level);
        c = config_free(c);

        o.main_file = example;
        if (config_load(&o, &c, &error) < 0)
                fail_msg("%s", error);
        assert_int_equal(c->labels.expiry_usec, 3600 * USEC_PER_SEC);
        config_free(c);
        config_free(d);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_defaults_under_root, setup_root, teardown_root),
                cmocka_unit_test_setup_teardown(test_defaults_host_root, setup_root, teardown_root),
                cmocka_unit_test_setup_teardown(test_merge_order_and_masking, setup_root, teardown_root),
                cmocka_unit_test_setup_teardown(test_fifo_and_devices_are_not_config, setup_root, teardown_root),
                cmocka_unit_test_setup_teardown(test_mapping_merge_scalar_replace, setup_root, teardown_root),
                cmocka_unit_test_setup_teardown(test_empty_files, setup_root, teardown_root),
                cmocka_unit_test_setup_teardown(test_errors, setup_root, teardown_root),
                cmocka_unit_test_setup_teardown(test_error_in_dropin, setup_root, teardown_root),
                cmocka_unit_test_setup_teardown(test_unreadable, setup_root, teardown_root),
                cmocka_unit_test_setup_teardown(test_yaml11_booleans, setup_root, teardown_root),
                cmocka_unit_test_setup_teardown(test_durations, setup_root, teardown_root),
                cmocka_unit_test_setup_teardown(test_root_override, setup_root, teardown_root),
                cmocka_unit_test_setup_teardown(test_cdi_device_name_strategy, setup_root, teardown_root),
                cmocka_unit_test_setup_teardown(test_dump_roundtrip, setup_root, teardown_root),
                cmocka_unit_test_setup_teardown(test_remote_layer, setup_root, teardown_root),
                cmocka_unit_test_setup_teardown(test_remote_allowlist, setup_root, teardown_root),
                cmocka_unit_test_setup_teardown(test_remote_serial, setup_root, teardown_root),
                cmocka_unit_test_setup_teardown(test_remote_errors, setup_root, teardown_root),
                cmocka_unit_test_setup_teardown(test_shipped_files, setup_root, teardown_root),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
