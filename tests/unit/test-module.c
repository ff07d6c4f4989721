/* SPDX-License-Identifier: MIT */
/* Tests for modules/module*.c against fixture module trees (fake .ko files indexed by the real
 * depmod, tests/kmod/mkmodtree.py) and the kmod syscall trap linked into this binary
 * (tests/fakes/kmod-trap.c): the trap's state directory plays /sys, so loads, holders, refcounts
 * and injected kernel errors are real from libkmod's point of view. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/stat.h>
#include <syslog.h>
#include <cmocka.h>

#include "fileio.h"
#include "module.h"
#include "strv.h"

#define KVER "6.1.0-18-amd64"
#define STRV_MAKE(...) ((char **) ((const char *[]) { __VA_ARGS__, NULL }))

typedef struct Test {
        char *state; /* the trap's state directory = our sys_dir */
        ModuleContext *ctx;
        char *tree;
        char **log; /* captured log lines */
} Test;

static const char *fixtures(void) {
        const char *d = getenv("GNA_KMOD_FIXTURES");
        if (!d)
                fail_msg("GNA_KMOD_FIXTURES is not set; run this test through meson test");
        return d;
}

static void capture_log(void *userdata, int priority, const char *message) {
        Test *t = userdata;
        assert_int_equal(strv_extendf(&t->log, "<%d>%s", priority, message), 0);
}

/* A context on one fixture tree; with_config=false passes no modprobe.d at all. */
static void open_tree(Test *t, const char *tree, bool with_config) {
        _cleanup_free_ char *root = path_join(fixtures(), tree), *mdir = strprintf("%s/lib/modules/%s", root, KVER),
                           *conf = path_join(root, "etc/modprobe.d"), *fw = path_join(root, "lib/firmware");
        const char *paths[] = { conf, NULL };
        const char *none[] = { NULL };
        ModuleContextConfig cfg = {
                .modules_dir = mdir,
                .config_paths = with_config ? paths : none,
                .sys_dir = t->state,
                .firmware_dir = fw,
                .kernel_release = KVER,
        };

        t->ctx = module_context_free(t->ctx);
        assert_int_equal(module_context_new(&cfg, &t->ctx), 0);
        module_context_set_log(t->ctx, capture_log, t, LOG_DEBUG);
        free(t->tree);
        t->tree = strdup(tree);
}

static int setup(void **state) {
        Test *t = calloc(1, sizeof(Test));
        assert_non_null(t);
        t->state = strdup("/tmp/gna-test-module-XXXXXX");
        assert_non_null(mkdtemp(t->state));
        assert_int_equal(setenv("GNA_KMOD_TRAP_STATE", t->state, 1), 0);
        unsetenv("GNA_KMOD_TRAP_FAIL");
        open_tree(t, "upstream", true);
        *state = t;
        return 0;
}

static int teardown(void **state) {
        Test *t = *state;
        _cleanup_free_ char *cmd = strprintf("rm -rf '%s'", t->state);
        assert_int_equal(system(cmd), 0);
        unsetenv("GNA_KMOD_TRAP_STATE");
        unsetenv("GNA_KMOD_TRAP_FAIL");
        module_context_free(t->ctx);
        strv_free(t->log);
        free(t->tree);
        free(t->state);
        free(t);
        return 0;
}

/* The trap's record of load/unload calls, one entry per call. */
static char **trap_log(Test *t) {
        _cleanup_free_ char *p = strprintf("%s/.trap/log", t->state), *text = NULL;
        char **l = NULL, *save = NULL;

        if (read_full_file(p, 1 << 20, &text, NULL) < 0)
                return NULL;
        for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
                assert_int_equal(strv_extend(&l, strstrip_trailing(line)), 0);
        return l;
}

static char *sys_file(Test *t, const char *rel) {
        _cleanup_free_ char *p = path_join(t->state, rel);
        char *s = NULL;
        return read_one_line_file(p, &s) >= 0 ? s : NULL;
}

static void write_sys(Test *t, const char *rel, const char *value) {
        _cleanup_free_ char *p = path_join(t->state, rel), *dir = strdup(p);
        *strrchr(dir, '/') = '\0';
        assert_int_equal(mkdir_p(dir, 0755), 0);
        _cleanup_free_ char *line = strprintf("%s\n", value);
        assert_int_equal(write_file_atomic(p, NULL, line, strlen(line), 0644), 0);
}

static void assert_contains(const char *haystack, const char *needle) {
        if (!haystack || !strstr(haystack, needle))
                fail_msg("expected \"%s\" in \"%s\"", needle, strna(haystack));
}

static void assert_endswith(const char *s, const char *suffix) {
        size_t a = strlen(s), b = strlen(suffix);
        if (a < b || !streq(s + a - b, suffix))
                fail_msg("expected \"%s\" to end with \"%s\"", s, suffix);
}

static void test_lookup_upstream(void **state) {
        Test *t = *state;
        _cleanup_module_info_free_ ModuleInfo *nv = NULL, *uvm = NULL, *peermem = NULL;

        assert_int_equal(module_lookup(t->ctx, "nvidia", &nv, NULL), 0);
        assert_endswith(nv->filename, "/lib/modules/" KVER "/updates/dkms/nvidia.ko");
        assert_string_equal(nv->kernel_name, "nvidia");
        assert_string_equal(nv->version, "550.54.15");
        assert_true(startswith(nv->vermagic, KVER " "));
        assert_string_equal(nv->signer, "DKMS module signing key");
        assert_non_null(nv->sig_key);
        assert_int_equal(strv_length(nv->firmware), 2);
        assert_string_equal(nv->firmware[0], "nvidia/550.54.15/gsp_ga10x.bin");
        assert_null(nv->depends);

        /* Both spellings of the kernel name work. */
        assert_int_equal(module_lookup(t->ctx, "nvidia_uvm", &uvm, NULL), 0);
        assert_endswith(uvm->filename, "/nvidia-uvm.ko");
        assert_string_equal(uvm->kernel_name, "nvidia_uvm");
        assert_true(strv_equal(uvm->depends, STRV_MAKE("nvidia")));

        assert_int_equal(module_lookup(t->ctx, "nvidia-peermem", &peermem, NULL), 0);
        assert_true(strv_contains(peermem->depends, "ib_core"));
        assert_true(strv_contains(peermem->depends, "nvidia"));
}

static void test_lookup_debian_naming(void **state) {
        Test *t = *state;
        _cleanup_module_info_free_ ModuleInfo *nv = NULL, *uvm = NULL, *modeset = NULL;

        open_tree(t, "debian", true);
        assert_int_equal(module_lookup(t->ctx, "nvidia", &nv, NULL), 0);
        assert_endswith(nv->filename, "/updates/dkms/nvidia-current.ko");
        assert_string_equal(nv->index_name, "nvidia_current");
        assert_string_equal(nv->kernel_name, "nvidia");

        assert_int_equal(module_lookup(t->ctx, "nvidia-uvm", &uvm, NULL), 0);
        assert_endswith(uvm->filename, "/nvidia-current-uvm.ko");
        assert_string_equal(uvm->kernel_name, "nvidia_uvm");

        assert_int_equal(module_lookup(t->ctx, "nvidia_modeset", &modeset, NULL), 0);
        assert_endswith(modeset->filename, "/nvidia-current-modeset.ko");
}

static void test_lookup_tesla_branches(void **state) {
        Test *t = *state;
        _cleanup_module_info_free_ ModuleInfo *nv = NULL, *uvm = NULL;

        open_tree(t, "tesla", true);
        /* Two branches installed: the newest wins, and its uvm comes from the same branch. */
        assert_int_equal(module_lookup(t->ctx, "nvidia", &nv, NULL), 0);
        assert_endswith(nv->filename, "/nvidia-tesla-535.ko");
        assert_string_equal(nv->version, "535.161.07");
        assert_int_equal(module_lookup(t->ctx, "nvidia-uvm", &uvm, NULL), 0);
        assert_endswith(uvm->filename, "/nvidia-tesla-535-uvm.ko");
}

static void test_lookup_missing(void **state) {
        Test *t = *state;
        _cleanup_module_info_free_ ModuleInfo *info = NULL, *old = NULL;
        _cleanup_free_ char *m1 = NULL, *m2 = NULL;

        assert_int_equal(module_lookup(t->ctx, "nvidia-fs", &info, &m1), -ENOENT);
        assert_null(info);
        assert_contains(m1, "No kernel module nvidia-fs for kernel " KVER);
        assert_contains(m1, "nvidia-current-fs.ko");
        assert_contains(m1, "dkms autoinstall -k " KVER);

        assert_int_equal(module_lookup(t->ctx, "mlx5_core", &info, &m2), -ENOENT);
        assert_contains(m2, "No kernel module mlx5_core for kernel " KVER);
        assert_contains(m2, "install the package that provides it");

        /* Found, but of another driver version: the caller (DKMS) compares. */
        open_tree(t, "wrong-version", true);
        assert_int_equal(module_lookup(t->ctx, "nvidia", &old, NULL), 0);
        assert_string_equal(old->version, "535.161.07");
}

static void test_state_by_kernel_name(void **state) {
        Test *t = *state;
        _cleanup_strv_free_ char **log = NULL;

        open_tree(t, "debian", true);
        assert_int_equal(module_get_state(t->ctx, "nvidia"), MODULE_STATE_ABSENT);

        /* Debian's modules-load.d loaded it at boot: the kernel calls it nvidia, not nvidia-current. */
        write_sys(t, "module/nvidia/initstate", "live");
        write_sys(t, "module/ib_core/parameters/send_queue_size", "128"); /* built in */
        write_sys(t, "module/nvidia_uvm/initstate", "coming");
        assert_int_equal(module_get_state(t->ctx, "nvidia"), MODULE_STATE_LIVE);
        assert_int_equal(module_get_state(t->ctx, "nvidia-current"), MODULE_STATE_ABSENT);
        assert_int_equal(module_get_state(t->ctx, "ib_core"), MODULE_STATE_BUILTIN);
        assert_int_equal(module_get_state(t->ctx, "nvidia-uvm"), MODULE_STATE_COMING);
        assert_true(module_is_usable(t->ctx, "ib-core"));
        assert_false(module_is_usable(t->ctx, "nvidia_uvm"));

        /* Already live is the normal case: nothing happens, no syscall reaches the "kernel". */
        assert_int_equal(module_load(t->ctx, "nvidia", "NVreg_X=1", NULL), 0);
        log = trap_log(t);
        assert_null(log);
}

static void test_load_order_and_options(void **state) {
        Test *t = *state;
        _cleanup_strv_free_ char **log = NULL, **log2 = NULL, **holders = NULL;
        _cleanup_free_ char *mode = NULL, *prefetch = NULL, *ats = NULL, *rc = NULL, *ver = NULL;
        unsigned refcnt = 0;

        assert_int_equal(module_load(t->ctx, "nvidia-uvm", "uvm_ats_mode=0", NULL), 1);
        log = trap_log(t);
        assert_int_equal(strv_length(log), 2);
        assert_true(startswith(log[0], "load nvidia "));
        assert_true(startswith(log[1], "load nvidia_uvm "));

        /* modprobe.d's options for each module, ours for the one asked for. */
        mode = sys_file(t, "module/nvidia/parameters/NVreg_DeviceFileMode");
        prefetch = sys_file(t, "module/nvidia_uvm/parameters/uvm_perf_prefetch_enable");
        ats = sys_file(t, "module/nvidia_uvm/parameters/uvm_ats_mode");
        assert_string_equal(mode, "0660");
        assert_string_equal(prefetch, "0");
        assert_string_equal(ats, "0");

        assert_int_equal(module_get_state(t->ctx, "nvidia_uvm"), MODULE_STATE_LIVE);
        assert_int_equal(module_get_holders(t->ctx, "nvidia", &holders, &refcnt), 0);
        assert_true(strv_equal(holders, STRV_MAKE("nvidia_uvm")));
        assert_int_equal(refcnt, 1);
        rc = sys_file(t, "module/nvidia/refcnt");
        assert_string_equal(rc, "1");
        ver = sys_file(t, "module/nvidia/version");
        assert_string_equal(ver, "550.54.15");

        /* Second time: fast path. */
        assert_int_equal(module_load(t->ctx, "nvidia-uvm", "uvm_ats_mode=0", NULL), 0);
        log2 = trap_log(t);
        assert_int_equal(strv_length(log2), 2);
}

static void test_host_config_not_used(void **state) {
        Test *t = *state;
        _cleanup_free_ char *mode = NULL, *ours = NULL;

        /* No modprobe.d given means none, not libkmod's defaults (the host's /etc/modprobe.d). */
        open_tree(t, "upstream", false);
        assert_int_equal(module_load(t->ctx, "nvidia", "NVreg_EnableGpuFirmware=0", NULL), 1);
        mode = sys_file(t, "module/nvidia/parameters/NVreg_DeviceFileMode");
        ours = sys_file(t, "module/nvidia/parameters/NVreg_EnableGpuFirmware");
        assert_null(mode);
        assert_string_equal(ours, "0");
}

static void test_load_debian(void **state) {
        Test *t = *state;
        _cleanup_free_ char *fw = NULL, *mode = NULL, *ours = NULL;
        _cleanup_strv_free_ char **log = NULL;

        open_tree(t, "debian", true);
        assert_int_equal(module_load(t->ctx, "nvidia", "NVreg_OpenRmEnableUnsupportedGpus=1", NULL), 1);
        assert_int_equal(module_get_state(t->ctx, "nvidia"), MODULE_STATE_LIVE);
        /* options for the file name (nvidia-current) from libkmod, for the kernel name (nvidia) as
         * Debian's install line would have passed them, and ours. */
        fw = sys_file(t, "module/nvidia/parameters/NVreg_EnableGpuFirmware");
        mode = sys_file(t, "module/nvidia/parameters/NVreg_DeviceFileMode");
        ours = sys_file(t, "module/nvidia/parameters/NVreg_OpenRmEnableUnsupportedGpus");
        assert_string_equal(fw, "1");
        assert_string_equal(mode, "0660");
        assert_string_equal(ours, "1");

        /* uvm's dependency is nvidia-current by file name; the kernel already has it as "nvidia" and
         * answers EEXIST, which counts as loaded. */
        assert_int_equal(module_load(t->ctx, "nvidia-uvm", NULL, NULL), 1);
        assert_int_equal(module_get_state(t->ctx, "nvidia_uvm"), MODULE_STATE_LIVE);
        log = trap_log(t);
        assert_int_equal(strv_length(log), 3);
        assert_string_equal(log[1], "load-failed nvidia EEXIST");
        assert_true(startswith(log[2], "load nvidia_uvm"));
}

typedef struct ErrorCase {
        const char *fail;
        const char *module;
        int error;
        const char *expect[3];
} ErrorCase;

static const ErrorCase error_cases[] = {
        /* Nothing under sys says why signatures are enforced: Secure Boot is not blamed. */
        { "nvidia:EKEYREJECTED", "nvidia", -EKEYREJECTED,
          { "rejected its signature (EKEYREJECTED)", "signed by \"DKMS module signing key\"",
            "neither Secure Boot, module.sig_enforce nor lockdown" } },
        { "nvidia:EPERM", "nvidia", -EPERM, { "does not allow loading modules", "kernel.modules_disabled=1", NULL } },
        { "nvidia:EINVAL", "nvidia", -EINVAL, { "rejected a parameter", "check dmesg", "NVreg_DeviceFileMode=0660" } },
        { "nvidia:ENOEXEC", "nvidia", -ENOEXEC, { "not a module for this kernel", "dkms autoinstall -k " KVER, NULL } },
        { "nvidia:ENOENT", "nvidia", -ENOENT, { "Unknown symbol", "dkms autoinstall -k " KVER, NULL } },
        { "nvidia:ENODEV", "nvidia", -ENODEV,
          { "no NVIDIA GPU is bound", "lspci -nnk -d 10de:", "bus/pci/devices cannot be read" } },
        /* A dependency's failure is reported as such. */
        { "nvidia:EKEYREJECTED", "nvidia-uvm", -EKEYREJECTED,
          { "Cannot load nvidia-uvm, which needs nvidia.", "Failed to load nvidia (", "EKEYREJECTED" } },
        { "nvidia-peermem:EINVAL", "nvidia-peermem", -EINVAL,
          { "Failed to load nvidia-peermem", "rebuild it against the installed MOFED/ib_core", "dmesg" } },
};

static void test_load_errors(void **state) {
        Test *t = *state;

        for (size_t i = 0; i < ELEMENTSOF(error_cases); i++) {
                const ErrorCase *e = &error_cases[i];
                _cleanup_free_ char *msg = NULL, *cmd = strprintf("rm -rf '%s'/module '%s'/.trap", t->state, t->state);
                ModuleStatus st = {};

                assert_int_equal(system(cmd), 0);
                open_tree(t, "upstream", true);
                assert_int_equal(setenv("GNA_KMOD_TRAP_FAIL", e->fail, 1), 0);
                assert_int_equal(module_load(t->ctx, e->module, NULL, &msg), e->error);
                for (size_t j = 0; j < ELEMENTSOF(e->expect) && e->expect[j]; j++)
                        assert_contains(msg, e->expect[j]);
                assert_int_equal(module_get_state(t->ctx, e->module), MODULE_STATE_ABSENT);

                /* D-Bus shows the failure until a load succeeds. */
                assert_int_equal(module_status(t->ctx, e->module, &st), 0);
                assert_string_equal(module_state_to_string(st.state), "failed");
                assert_string_equal(st.detail, msg);
                module_status_done(&st);

                unsetenv("GNA_KMOD_TRAP_FAIL");
                assert_int_equal(module_load(t->ctx, e->module, NULL, NULL), 1);
                assert_int_equal(module_status(t->ctx, e->module, &st), 0);
                assert_int_equal(st.state, MODULE_STATE_LIVE);
                module_status_done(&st);
        }
}

static void test_load_eperm_lockdown(void **state) {
        Test *t = *state;
        _cleanup_free_ char *msg = NULL;

        write_sys(t, "kernel/security/lockdown", "none [integrity] confidentiality");
        setenv("GNA_KMOD_TRAP_FAIL", "nvidia:EPERM", 1);
        assert_int_equal(module_load(t->ctx, "nvidia", NULL, &msg), -EPERM);
        assert_contains(msg, "the kernel is locked down (integrity)");
        assert_contains(msg, "mokutil --import");
}

#define SECURE_BOOT_VAR "firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"

static void write_secure_boot(Test *t, bool on) {
        _cleanup_free_ char *p = path_join(t->state, SECURE_BOOT_VAR), *dir = strdup(p);
        const char var[] = { 6, 0, 0, 0, on ? 1 : 0 };

        *strrchr(dir, '/') = '\0';
        assert_int_equal(mkdir_p(dir, 0755), 0);
        assert_int_equal(write_file_atomic(p, NULL, var, sizeof var, 0644), 0);
}

/* EKEYREJECTED names what is on: Secure Boot, module.sig_enforce, or lockdown, never a guess. */
static void test_signature_rejected_causes(void **state) {
        Test *t = *state;
        _cleanup_module_info_free_ ModuleInfo *info = NULL;
        _cleanup_free_ char *plain = NULL, *enforce = NULL, *lockdown = NULL, *sb = NULL;

        assert_int_equal(module_lookup(t->ctx, "nvidia", &info, NULL), 0);

        plain = module_load_error_message(t->ctx, info, -EKEYREJECTED, NULL);
        assert_contains(plain, "neither Secure Boot, module.sig_enforce nor lockdown shows as on");
        assert_null(strstr(plain, "Secure Boot rejected"));

        /* module.sig_enforce=1 with Secure Boot off (the EFI variable says 0). */
        write_secure_boot(t, false);
        write_sys(t, "module/module/parameters/sig_enforce", "Y");
        enforce = module_load_error_message(t->ctx, info, -EKEYREJECTED, NULL);
        assert_contains(enforce, "the kernel enforces module signatures (module.sig_enforce=1; Secure Boot is off)");
        assert_contains(enforce, "signed by \"DKMS module signing key\"");
        assert_contains(enforce, "remove module.sig_enforce=1 from the kernel command line");
        assert_null(strstr(enforce, "Secure Boot rejected"));

        write_sys(t, "module/module/parameters/sig_enforce", "N");
        write_sys(t, "kernel/security/lockdown", "none [integrity] confidentiality");
        lockdown = module_load_error_message(t->ctx, info, -EKEYREJECTED, NULL);
        assert_contains(lockdown, "the kernel is locked down (integrity; Secure Boot is off)");
        assert_null(strstr(lockdown, "Secure Boot rejected"));

        write_secure_boot(t, true);
        sb = module_load_error_message(t->ctx, info, -EKEYREJECTED, NULL);
        assert_contains(sb, "Secure Boot rejected it");
        assert_contains(sb, "mokutil --import /var/lib/dkms/mok.pub");
}

static void test_unsigned_rejected(void **state) {
        Test *t = *state;
        _cleanup_module_info_free_ ModuleInfo *info = NULL;
        _cleanup_free_ char *msg = NULL;

        write_secure_boot(t, true);
        assert_int_equal(module_lookup(t->ctx, "nvidia", &info, NULL), 0);
        info->signer = mfree(info->signer);
        msg = module_load_error_message(t->ctx, info, -EKEYREJECTED, NULL);
        assert_contains(msg, "the module is not signed");
        assert_contains(msg, "mokutil --import /var/lib/dkms/mok.pub");
}

static void test_stale_vermagic(void **state) {
        Test *t = *state;
        _cleanup_free_ char *msg = NULL;
        _cleanup_strv_free_ char **log = NULL;
        ModuleStatus st = {};

        open_tree(t, "stale", true);
        assert_int_equal(module_status(t->ctx, "nvidia", &st), 0);
        assert_int_equal(st.state, MODULE_STATE_STALE);
        assert_string_equal(st.detail, "built for kernel 6.1.0-17-amd64");
        module_status_done(&st);

        /* The kernel would accept it (MODVERSIONS); we refuse before any syscall. */
        assert_int_equal(module_load(t->ctx, "nvidia", NULL, &msg), -ESTALE);
        assert_contains(msg, "nvidia.ko in ");
        assert_contains(msg, "was built for kernel 6.1.0-17-amd64, not the running " KVER);
        assert_contains(msg, "dkms autoinstall -k " KVER);
        log = trap_log(t);
        assert_null(log);
}

static void test_missing_firmware(void **state) {
        Test *t = *state;
        _cleanup_free_ char *msg = NULL;
        _cleanup_strv_free_ char **log = NULL;

        open_tree(t, "no-firmware", true);
        assert_int_equal(module_load(t->ctx, "nvidia", NULL, &msg), -ENOENT);
        assert_contains(msg, "needs the firmware file nvidia/550.54.15/gsp_ga10x.bin, which is missing from ");
        assert_contains(msg, "/no-firmware/lib/firmware");
        assert_contains(msg, "firmware-nvidia-gsp");
        log = trap_log(t);
        assert_null(log);

        /* The same module with the firmware present passes the check. */
        open_tree(t, "upstream", true);
        assert_int_equal(module_load(t->ctx, "nvidia", NULL, NULL), 1);
}

/* The kernel's firmware loader also looks in updates/<release>, updates and <release>. */
static void test_firmware_search_path(void **state) {
        Test *t = *state;
        _cleanup_free_ char *msg = NULL;

        open_tree(t, "firmware-updates", true);
        assert_int_equal(module_load(t->ctx, "nvidia", NULL, &msg), 1);
        assert_null(msg);
}

/* GSP off (NVreg_EnableGpuFirmware=0): the proprietary module runs without the firmware; the open
 * module cannot, so there a missing file stays an error. */
static void test_firmware_gsp_off(void **state) {
        Test *t = *state;
        _cleanup_free_ char *msg = NULL, *open_msg = NULL, *hint = NULL;

        open_tree(t, "no-firmware", true);
        assert_int_equal(module_load(t->ctx, "nvidia", NULL, &hint), -ENOENT);
        assert_contains(hint, "NVreg_EnableGpuFirmware=0");
        assert_int_equal(module_load(t->ctx, "nvidia", "NVreg_EnableGpuFirmware=0x0", &msg), 1);
        assert_null(msg);

        _cleanup_free_ char *cmd = strprintf("rm -rf '%s'/module '%s'/.trap", t->state, t->state);
        assert_int_equal(system(cmd), 0);
        open_tree(t, "open-no-firmware", true);
        assert_int_equal(module_load(t->ctx, "nvidia", "NVreg_EnableGpuFirmware=0", &open_msg), -ENOENT);
        assert_contains(open_msg, "needs the firmware file nvidia/550.54.15/gsp_ga10x.bin");
        assert_null(strstr(open_msg, "NVreg_EnableGpuFirmware=0"));
}

/* Built for the previous release, vermagic otherwise equal to the running kernel's (modversions):
 * the kernel accepts it, so do we. Other flags: refused before any syscall. */
static void test_weak_vermagic(void **state) {
        Test *t = *state;
        _cleanup_free_ char *msg = NULL, *stale = NULL;
        _cleanup_strv_free_ char **log = NULL;
        ModuleStatus st = {};

        open_tree(t, "weak", true);
        assert_int_equal(module_status(t->ctx, "nvidia", &st), 0);
        assert_int_equal(st.state, MODULE_STATE_ABSENT);
        module_status_done(&st);
        assert_int_equal(module_load(t->ctx, "nvidia", NULL, &msg), 1);
        assert_null(msg);

        _cleanup_free_ char *cmd = strprintf("rm -rf '%s'/module '%s'/.trap", t->state, t->state);
        assert_int_equal(system(cmd), 0);
        open_tree(t, "stale-flags", true);
        assert_int_equal(module_status(t->ctx, "nvidia", &st), 0);
        assert_int_equal(st.state, MODULE_STATE_STALE);
        module_status_done(&st);
        assert_int_equal(module_load(t->ctx, "nvidia", NULL, &stale), -ESTALE);
        assert_contains(stale, "was built for kernel 6.1.0-17-amd64, not the running " KVER
                               ", and its vermagic flags differ from the running kernel's");
        log = trap_log(t);
        assert_null(log);
}

/* modules.dep names a file that was deleted without depmod: the message names that file. */
static void test_stale_modules_dep(void **state) {
        Test *t = *state;
        _cleanup_module_info_free_ ModuleInfo *info = NULL;
        _cleanup_free_ char *msg = NULL, *load_msg = NULL;

        open_tree(t, "stale-dep", true);
        assert_int_equal(module_lookup(t->ctx, "nvidia", &info, &msg), -ENOENT);
        assert_contains(msg, "/stale-dep/lib/modules/" KVER "/updates/dkms/nvidia.ko for nvidia, but that file does not exist");
        assert_contains(msg, "depmod " KVER);
        assert_int_equal(module_load(t->ctx, "nvidia", NULL, &load_msg), -ENOENT);
        assert_contains(load_msg, "updates/dkms/nvidia.ko for nvidia, but that file does not exist");
}

static void test_peermem_rule(void **state) {
        Test *t = *state;
        _cleanup_free_ char *r1 = NULL, *r2 = NULL, *r3 = NULL, *r4 = NULL;
        _cleanup_strv_free_ char **holders = NULL;

        assert_int_equal(module_peermem_check(t->ctx, false, &r1), 0);
        assert_contains(r1, "no Mellanox/NVIDIA networking device (PCI vendor 0x15b3)");

        assert_int_equal(module_peermem_check(t->ctx, true, &r2), 0);
        assert_contains(r2, "waits for ib_core, which is not loaded");

        assert_int_equal(module_load(t->ctx, "ib_core", NULL, NULL), 1);
        assert_int_equal(module_peermem_check(t->ctx, true, &r3), 1);
        assert_null(r3);
        assert_int_equal(module_load(t->ctx, "nvidia-peermem", NULL, NULL), 1);
        assert_int_equal(module_get_holders(t->ctx, "ib_core", &holders, NULL), 0);
        assert_true(strv_equal(holders, STRV_MAKE("nvidia_peermem")));

        /* Built without the IB stack: skipped with the fix, never loaded. */
        open_tree(t, "peermem-stub", true);
        assert_int_equal(module_peermem_check(t->ctx, true, &r4), 0);
        assert_contains(r4, "nvidia-peermem was built without InfiniBand support (stub");
        assert_contains(r4, "rebuild it against the installed MOFED/ib_core");

        /* Loaded anyway, the stub's init fails, and the error says why. */
        _cleanup_free_ char *msg = NULL;
        assert_int_equal(module_unload(t->ctx, STRV_MAKE("nvidia-peermem"), NULL), 1);
        assert_int_equal(module_load(t->ctx, "nvidia-peermem", NULL, &msg), -EINVAL);
        assert_contains(msg, "Failed to load nvidia-peermem (");
        assert_contains(msg, "a stub that always fails this way: rebuild it against the installed MOFED/ib_core");
        assert_int_equal(module_get_state(t->ctx, "nvidia_peermem"), MODULE_STATE_ABSENT);
}

static void test_unload_holder_order(void **state) {
        Test *t = *state;
        _cleanup_strv_free_ char **log = NULL;
        _cleanup_free_ char *msg = NULL;
        ssize_t drm = -1, modeset = -1, nv = -1, uvm = -1;

        assert_int_equal(module_load(t->ctx, "nvidia-uvm", NULL, NULL), 1);
        assert_int_equal(module_load(t->ctx, "nvidia-drm", NULL, NULL), 1);
        assert_int_equal(module_get_state(t->ctx, "nvidia_modeset"), MODULE_STATE_LIVE);

        assert_int_equal(module_unload(t->ctx, STRV_MAKE("nvidia", "nvidia-modeset", "nvidia-uvm", "nvidia-drm",
                                                         "nvidia-peermem"),
                                       &msg),
                         4);
        assert_null(msg);
        log = trap_log(t);
        for (size_t i = 0; log && log[i]; i++) {
                if (streq(log[i], "unload nvidia"))
                        nv = i;
                else if (streq(log[i], "unload nvidia_modeset"))
                        modeset = i;
                else if (streq(log[i], "unload nvidia_drm"))
                        drm = i;
                else if (streq(log[i], "unload nvidia_uvm"))
                        uvm = i;
                else
                        assert_false(startswith(log[i], "unload"));
        }
        assert_true(drm >= 0 && uvm >= 0);
        assert_true(drm < modeset);
        assert_true(modeset < nv && uvm < nv);
        assert_int_equal(module_get_state(t->ctx, "nvidia"), MODULE_STATE_ABSENT);
}

static void test_unload_refused(void **state) {
        Test *t = *state;
        _cleanup_free_ char *m1 = NULL, *m2 = NULL, *m3 = NULL, *m4 = NULL;
        _cleanup_strv_free_ char **log = NULL;

        assert_int_equal(module_load(t->ctx, "nvidia-uvm", NULL, NULL), 1);
        assert_int_equal(module_load(t->ctx, "nvidia-modeset", NULL, NULL), 1);
        /* libkmod saw nvidia live through the trapped /sys/module and did not insert it again. */
        log = trap_log(t);
        assert_int_equal(strv_length(log), 3);
        assert_string_equal(log[2], "load nvidia_modeset");
        log = strv_free(log);

        /* A holder that is not being unloaded: refuse before touching anything. */
        assert_int_equal(module_unload(t->ctx, STRV_MAKE("nvidia", "nvidia-uvm"), &m1), -EBUSY);
        assert_contains(m1, "Refusing to unload the driver: nvidia is in use by: nvidia_modeset");
        log = trap_log(t);
        for (size_t i = 0; log && log[i]; i++)
                assert_false(startswith(log[i], "unload"));

        /* References that are not modules: a process has /dev/nvidia-uvm open. */
        write_sys(t, "module/nvidia_uvm/refcnt", "2");
        assert_int_equal(module_unload(t->ctx, STRV_MAKE("nvidia", "nvidia-uvm", "nvidia-modeset"), &m2), -EBUSY);
        assert_contains(m2, "nvidia-uvm has 2 references from processes or the kernel");
        write_sys(t, "module/nvidia_uvm/refcnt", "0");

        /* The kernel refuses anyway (a reference taken since we looked). */
        setenv("GNA_KMOD_TRAP_FAIL", "nvidia:EBUSY", 1);
        assert_int_equal(module_unload(t->ctx, STRV_MAKE("nvidia", "nvidia-uvm", "nvidia-modeset"), &m3), -EBUSY);
        assert_contains(m3, "Unloaded nvidia-");
        assert_contains(m3, "then stopped: the kernel says nvidia is in use.");
        assert_int_equal(module_get_state(t->ctx, "nvidia"), MODULE_STATE_LIVE);
        assert_int_equal(module_get_state(t->ctx, "nvidia_uvm"), MODULE_STATE_ABSENT);

        /* EAGAIN from the kernel with a holder present names the holder. */
        unsetenv("GNA_KMOD_TRAP_FAIL");
        assert_int_equal(module_load(t->ctx, "nvidia-uvm", NULL, NULL), 1);
        setenv("GNA_KMOD_TRAP_FAIL", "nvidia_uvm:EAGAIN", 1);
        assert_int_equal(module_unload(t->ctx, STRV_MAKE("nvidia-uvm"), &m4), -EAGAIN);
        assert_string_equal(m4, "Cannot unload the driver: the kernel says nvidia-uvm is in use.");
}

static void test_status_listing(void **state) {
        Test *t = *state;
        ModuleStatus live = {}, absent = {}, missing = {};

        assert_int_equal(module_load(t->ctx, "nvidia", NULL, NULL), 1);
        assert_int_equal(module_status(t->ctx, "nvidia", &live), 0);
        assert_string_equal(live.name, "nvidia");
        assert_string_equal(module_state_to_string(live.state), "live");
        assert_string_equal(live.detail, "550.54.15");

        assert_int_equal(module_status(t->ctx, "nvidia_modeset", &absent), 0);
        assert_string_equal(absent.name, "nvidia-modeset");
        assert_string_equal(module_state_to_string(absent.state), "absent");
        assert_string_equal(absent.detail, "550.54.15");

        assert_int_equal(module_status(t->ctx, "nvidia-fs", &missing), 0);
        assert_string_equal(module_state_to_string(missing.state), "missing");
        assert_string_equal(missing.detail, "no module for kernel " KVER);

        assert_int_equal(module_state_from_string("builtin"), MODULE_STATE_BUILTIN);
        assert_int_equal(module_state_from_string("loaded"), _MODULE_STATE_INVALID);
        module_status_done(&live);
        module_status_done(&absent);
        module_status_done(&missing);
}

static void test_log_routed(void **state) {
        Test *t = *state;
        bool ours = false, kmods = false;

        setenv("GNA_KMOD_TRAP_FAIL", "nvidia:ENODEV", 1);
        assert_int_equal(module_load(t->ctx, "nvidia", NULL, NULL), -ENODEV);
        STRV_FOREACH(l, t->log) {
                ours = ours || (startswith(*l, "<7>loading nvidia from ") && strstr(*l, "/updates/dkms/nvidia.ko"));
                /* libkmod's own message for the failed insert, at info level. */
                kmods = kmods || (startswith(*l, "<6>") && strstr(*l, "nvidia.ko") && strstr(*l, "No such device"));
        }
        assert_true(ours);
        assert_true(kmods);
}

/* ENODEV from nvidia's init ("NVRM: No NVIDIA GPU found"): the message names the NVIDIA GPUs the PCI bus
 * shows and the driver each is bound to (here vfio-pci and none), so the user sees why. */
static void test_enodev_pci_state(void **state) {
        Test *t = *state;
        _cleanup_free_ char *msg = NULL, *msg2 = NULL, *cmd = strprintf(
                "set -e; d='%s'/bus/pci/devices; mkdir -p \"$d/0000:4c:00.0\" \"$d/0000:5d:00.0\" \"$d/0000:01:00.0\"; "
                "echo 0x10de >\"$d/0000:4c:00.0/vendor\"; echo 0x2335 >\"$d/0000:4c:00.0/device\"; "
                "echo 0x030200 >\"$d/0000:4c:00.0/class\"; ln -s ../../../bus/pci/drivers/vfio-pci \"$d/0000:4c:00.0/driver\"; "
                "echo 0x10de >\"$d/0000:5d:00.0/vendor\"; echo 0x2330 >\"$d/0000:5d:00.0/device\"; "
                "echo 0x030200 >\"$d/0000:5d:00.0/class\"; "
                /* An NVSwitch-like NVIDIA bridge is no GPU. */
                "echo 0x10de >\"$d/0000:01:00.0/vendor\"; echo 0x22a3 >\"$d/0000:01:00.0/device\"; "
                "echo 0x068000 >\"$d/0000:01:00.0/class\"",
                t->state), *none = strprintf("rm -rf '%s'/bus/pci/devices/*", t->state);

        assert_int_equal(system(cmd), 0);
        setenv("GNA_KMOD_TRAP_FAIL", "nvidia:ENODEV", 1);
        assert_int_equal(module_load(t->ctx, "nvidia", NULL, &msg), -ENODEV);
        assert_contains(msg, "NVRM: No NVIDIA GPU found");
        assert_contains(msg, "0000:4c:00.0 (10de:2335, bound to vfio-pci)");
        assert_contains(msg, "0000:5d:00.0 (10de:2330, bound to no driver)");
        assert_null(strstr(msg, "0000:01:00.0"));

        assert_int_equal(system(none), 0);
        assert_int_equal(module_load(t->ctx, "nvidia", NULL, &msg2), -ENODEV);
        assert_contains(msg2, "shows no NVIDIA GPU");
        unsetenv("GNA_KMOD_TRAP_FAIL");
}

static void test_vermagic_release(void **state) {
        _cleanup_free_ char *a = module_vermagic_release("6.1.0-18-amd64 SMP preempt mod_unload modversions "),
                           *b = module_vermagic_release("  6.8.0 "), *c = module_vermagic_release("");
        assert_string_equal(a, "6.1.0-18-amd64");
        assert_string_equal(b, "6.8.0");
        assert_null(c);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_lookup_upstream, setup, teardown),
                cmocka_unit_test_setup_teardown(test_lookup_debian_naming, setup, teardown),
                cmocka_unit_test_setup_teardown(test_lookup_tesla_branches, setup, teardown),
                cmocka_unit_test_setup_teardown(test_lookup_missing, setup, teardown),
                cmocka_unit_test_setup_teardown(test_state_by_kernel_name, setup, teardown),
                cmocka_unit_test_setup_teardown(test_load_order_and_options, setup, teardown),
                cmocka_unit_test_setup_teardown(test_host_config_not_used, setup, teardown),
                cmocka_unit_test_setup_teardown(test_load_debian, setup, teardown),
                cmocka_unit_test_setup_teardown(test_load_errors, setup, teardown),
                cmocka_unit_test_setup_teardown(test_load_eperm_lockdown, setup, teardown),
                cmocka_unit_test_setup_teardown(test_unsigned_rejected, setup, teardown),
                cmocka_unit_test_setup_teardown(test_stale_vermagic, setup, teardown),
                cmocka_unit_test_setup_teardown(test_missing_firmware, setup, teardown),
                cmocka_unit_test_setup_teardown(test_signature_rejected_causes, setup, teardown),
                cmocka_unit_test_setup_teardown(test_firmware_search_path, setup, teardown),
                cmocka_unit_test_setup_teardown(test_firmware_gsp_off, setup, teardown),
                cmocka_unit_test_setup_teardown(test_weak_vermagic, setup, teardown),
                cmocka_unit_test_setup_teardown(test_stale_modules_dep, setup, teardown),
                cmocka_unit_test_setup_teardown(test_peermem_rule, setup, teardown),
                cmocka_unit_test_setup_teardown(test_unload_holder_order, setup, teardown),
                cmocka_unit_test_setup_teardown(test_unload_refused, setup, teardown),
                cmocka_unit_test_setup_teardown(test_status_listing, setup, teardown),
                cmocka_unit_test_setup_teardown(test_log_routed, setup, teardown),
                cmocka_unit_test_setup_teardown(test_enodev_pci_state, setup, teardown),
                cmocka_unit_test(test_vermagic_release),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
