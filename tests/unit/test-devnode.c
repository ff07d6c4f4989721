/* SPDX-License-Identifier: MIT */
/* Tests for modules/devnode.c: the node plan from fixture proc trees (GPU minors, uvm/caps/nvswitch
 * majors, mig-minors, params overrides, ModifyDeviceFiles=0, bad input), and applying it to a
 * private dev directory with real mknod (root/CAP_MKNOD; skipped with a message otherwise):
 * creation, no churn, atomic replacement of squatters, /dev/char links, the CAP_MKNOD error. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <linux/capability.h>
#include <cmocka.h>

#include "devnode.h"
#include "fileio.h"
#include "strv.h"

#define DEVICES_BASE                                                                                   \
        "Character devices:\n  1 mem\n  4 tty\n195 nvidia-frontend\n226 drm\n"
#define DEVICES_TAIL "\nBlock devices:\n  7 loop\n235 nvidia-uvm-not-a-char-device\n"

typedef struct Fixture {
        char *root;
        char *proc;
        char *dev;
} Fixture;

static void put(const char *dir, const char *rel, const char *content) {
        _cleanup_free_ char *p = path_join(dir, rel), *d = NULL;
        assert_non_null(p);
        d = strdup(p);
        *strrchr(d, '/') = 0;
        assert_int_equal(mkdir_p(d, 0755), 0);
        assert_int_equal(write_file_atomic(p, NULL, content, strlen(content), 0644), 0);
}

static void put_gpu(const char *proc, const char *bdf, unsigned minor) {
        _cleanup_free_ char *rel = strprintf("driver/nvidia/gpus/%s/information", bdf),
                            *text = strprintf("Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 42\n"
                                              "Bus Location: \t %s\nDevice Minor: \t %u\nGPU Excluded:\t No\n",
                                              bdf, minor);
        put(proc, rel, text);
}

/* Two GPUs with minors 0 and 2 (minors need not be dense), uvm and caps registered, two MIG
 * devices' worth of mig-minors, no params file (driver defaults). */
static int setup(void **state) {
        Fixture *f = calloc(1, sizeof(*f));
        assert_non_null(f);
        f->root = strdup("/tmp/gna-test-devnode-XXXXXX");
        assert_non_null(mkdtemp(f->root));
        f->proc = path_join(f->root, "proc");
        f->dev = path_join(f->root, "dev");
        assert_int_equal(mkdir_p(f->dev, 0755), 0);
        put_gpu(f->proc, "0000:1b:00.0", 0);
        put_gpu(f->proc, "0000:43:00.0", 2);
        put(f->proc, "devices", DEVICES_BASE "235 nvidia-uvm\n236 nvidia-caps\n" DEVICES_TAIL);
        put(f->proc, "modules", "nvidia_uvm 1904640 0 - Live 0x0000000000000000 (POE)\n"
                                "nvidia 62873600 1 nvidia_uvm, Live 0x0000000000000000 (POE)\n");
        put(f->proc, "driver/nvidia-caps/mig-minors",
            "config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\ngpu0/gi1/access 12\n"
            "gpu0/gi1/ci0/access 13\ngpu0/gi1/ci1/access 14\ngpu2/gi3/access 39\ngpu2/gi3/ci0/access 40\n");
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;
        _cleanup_free_ char *cmd = strprintf("rm -rf '%s'", f->root);
        assert_int_equal(system(cmd), 0);
        free(f->root);
        free(f->proc);
        free(f->dev);
        free(f);
        return 0;
}

static void assert_spec(const DevnodePlan *p, const char *name, unsigned major, unsigned minor, mode_t mode,
                        uid_t uid, gid_t gid) {
        const DevnodeSpec *s = devnode_plan_find(p, name);
        if (!s)
                fail_msg("%s is not in the plan", name);
        assert_int_equal(s->major, major);
        assert_int_equal(s->minor, minor);
        assert_int_equal(s->mode, mode);
        assert_int_equal(s->uid, uid);
        assert_int_equal(s->gid, gid);
}

static DevnodePlan *plan_ok(const Fixture *f, const DevnodeOptions *o) {
        DevnodePlan *p = NULL;
        _cleanup_free_ char *err = NULL;
        int r = devnode_plan(f->proc, o, &p, &err);
        if (r < 0)
                fail_msg("devnode_plan: %s (%s)", strerror(-r), strna(err));
        assert_null(err);
        return p;
}

static void test_plan_defaults(void **state) {
        Fixture *f = *state;
        DevnodePlan *p = plan_ok(f, NULL);

        assert_true(p->modify);
        assert_int_equal(p->n_nodes, 7);
        assert_spec(p, "nvidiactl", 195, 255, 0666, 0, 0);
        assert_spec(p, "nvidia0", 195, 0, 0666, 0, 0);
        assert_spec(p, "nvidia2", 195, 2, 0666, 0, 0);
        assert_null(devnode_plan_find(p, "nvidia1"));
        assert_spec(p, "nvidia-uvm", 235, 0, 0666, 0, 0);
        assert_spec(p, "nvidia-uvm-tools", 235, 1, 0666, 0, 0);
        /* As the driver creates them: mig-config root-only, mig-monitor world-readable. */
        assert_spec(p, "nvidia-caps/nvidia-cap1", 236, 1, 0400, 0, 0);
        assert_spec(p, "nvidia-caps/nvidia-cap2", 236, 2, 0444, 0, 0);
        /* nvidia_modeset is not loaded and was not asked for. */
        assert_null(devnode_plan_find(p, "nvidia-modeset"));
        /* Sorted by name, so the plan (and what the caller logs) is stable. */
        for (size_t i = 1; i < p->n_nodes; i++)
                assert_true(strcmp(p->nodes[i - 1].name, p->nodes[i].name) < 0);
        devnode_plan_free(p);
}

static void test_plan_modeset(void **state) {
        Fixture *f = *state;
        DevnodeOptions o = { .modeset = true };
        DevnodePlan *p = plan_ok(f, &o);
        assert_spec(p, "nvidia-modeset", 195, 254, 0666, 0, 0);
        devnode_plan_free(p);

        /* Loaded without being asked for: planned too. */
        put(f->proc, "modules", "nvidia_modeset 1560576 0 - Live 0x0 (POE)\nnvidia 62873600 1 nvidia_modeset, Live 0x0\n");
        p = plan_ok(f, NULL);
        assert_spec(p, "nvidia-modeset", 195, 254, 0666, 0, 0);
        devnode_plan_free(p);
}

static void test_plan_params(void **state) {
        Fixture *f = *state;
        put(f->proc, "driver/nvidia/params", "ResmanDebugLevel: 4294967295\nRmLogonRC: 1\nModifyDeviceFiles: 1\n"
                                             "DeviceFileUID: 1000\nDeviceFileGID: 44\nDeviceFileMode: 432\n"
                                             "RegistryDwords: \"\"\n");
        DevnodePlan *p = plan_ok(f, &(DevnodeOptions) { .modeset = true });
        assert_true(p->modify);
        /* nvidia.ko's nodes take the params; uvm and the capabilities keep theirs (nvidia-modprobe). */
        assert_spec(p, "nvidiactl", 195, 255, 0660, 1000, 44);
        assert_spec(p, "nvidia0", 195, 0, 0660, 1000, 44);
        assert_spec(p, "nvidia2", 195, 2, 0660, 1000, 44);
        assert_spec(p, "nvidia-modeset", 195, 254, 0660, 1000, 44);
        assert_spec(p, "nvidia-uvm", 235, 0, 0666, 0, 0);
        assert_spec(p, "nvidia-caps/nvidia-cap2", 236, 2, 0444, 0, 0);
        devnode_plan_free(p);

        put(f->proc, "driver/nvidia/params", "ModifyDeviceFiles: 0\nDeviceFileMode: 438\n");
        p = plan_ok(f, NULL);
        assert_false(p->modify);
        devnode_plan_free(p);
}

static void test_plan_mig(void **state) {
        Fixture *f = *state;
        const DevnodeMigDevice mig[] = { { 0, 1, 0 }, { 0, 1, 1 }, { 2, 3, 0 } };
        /* The driver's capability file for gi1 says 0400 here; it wins over the 0444 default. */
        put(f->proc, "driver/nvidia/capabilities/gpu0/mig/gi1/access",
            "DeviceFileMinor: 12\nDeviceFileMode: 256\nDeviceFileModify: 1\n");
        DevnodePlan *p = plan_ok(f, &(DevnodeOptions) { .mig = mig, .n_mig = ELEMENTSOF(mig) });

        /* ctl, 2 GPUs, 2 uvm, config, monitor, gi1 (shared by two CIs), ci0, ci1, gpu2 gi3, its ci0 */
        assert_int_equal(p->n_nodes, 12);
        assert_spec(p, "nvidia-caps/nvidia-cap12", 236, 12, 0400, 0, 0);
        assert_spec(p, "nvidia-caps/nvidia-cap13", 236, 13, 0444, 0, 0);
        assert_spec(p, "nvidia-caps/nvidia-cap14", 236, 14, 0444, 0, 0);
        assert_spec(p, "nvidia-caps/nvidia-cap39", 236, 39, 0444, 0, 0);
        assert_spec(p, "nvidia-caps/nvidia-cap40", 236, 40, 0444, 0, 0);
        assert_null(devnode_plan_find(p, "nvidia-caps/nvidia-cap3"));
        devnode_plan_free(p);
}

static void test_plan_mig_unknown(void **state) {
        Fixture *f = *state;
        const DevnodeMigDevice mig[] = { { 0, 9, 0 } };
        DevnodePlan *p = NULL;
        _cleanup_free_ char *err = NULL;

        assert_int_equal(devnode_plan(f->proc, &(DevnodeOptions) { .mig = mig, .n_mig = 1 }, &p, &err), -ENXIO);
        assert_null(p);
        assert_non_null(strstr(err, "does not list \"gpu0/gi9/access\""));
        assert_non_null(strstr(err, "/proc/driver/nvidia-caps/mig-minors"));

        /* No nvidia-caps driver at all: MIG nodes cannot exist, and it says so. */
        free(err);
        err = NULL;
        put(f->proc, "devices", DEVICES_BASE "235 nvidia-uvm\n" DEVICES_TAIL);
        assert_int_equal(devnode_plan(f->proc, &(DevnodeOptions) { .mig = mig, .n_mig = 1 }, &p, &err), -ENXIO);
        assert_non_null(strstr(err, "\"nvidia-caps\" is not in"));
}

static void test_plan_no_uvm_no_caps(void **state) {
        Fixture *f = *state;
        put(f->proc, "devices", DEVICES_BASE DEVICES_TAIL);
        DevnodePlan *p = plan_ok(f, NULL);
        _cleanup_free_ char *notes = strv_join(p->notes, "\n");

        assert_int_equal(p->n_nodes, 3); /* nvidiactl, nvidia0, nvidia2 */
        assert_null(devnode_plan_find(p, "nvidia-uvm"));
        /* "nvidia-uvm-not-a-char-device" in the block section must not count. */
        assert_non_null(strstr(notes, "nvidia-uvm is not loaded"));
        assert_non_null(strstr(notes, "/dev/nvidia-uvm-tools are not created"));
        assert_non_null(strstr(notes, "\"nvidia-caps\" is not in"));
        devnode_plan_free(p);
}

static void test_plan_nvswitch(void **state) {
        Fixture *f = *state;
        put(f->proc, "devices", DEVICES_BASE "235 nvidia-uvm\n236 nvidia-caps\n237 nvidia-nvswitch\n" DEVICES_TAIL);
        put(f->proc, "driver/nvidia-nvswitch/permissions", "DeviceFileMode: 438\n");
        put(f->proc, "driver/nvidia-nvswitch/devices/0000:05:00.0/information", "BIOS Version: 96.10.55.00.01\n");
        put(f->proc, "driver/nvidia-nvswitch/devices/0000:06:00.0/information", "BIOS Version: 96.10.55.00.01\n");
        DevnodePlan *p = plan_ok(f, NULL);

        assert_spec(p, "nvidia-nvswitch0", 237, 0, 0666, 0, 0);
        assert_spec(p, "nvidia-nvswitch1", 237, 1, 0666, 0, 0);
        assert_spec(p, "nvidia-nvswitchctl", 237, 255, 0666, 0, 0);
        assert_null(devnode_plan_find(p, "nvidia-nvswitch2"));
        devnode_plan_free(p);
}

static void test_plan_bad_input(void **state) {
        Fixture *f = *state;
        DevnodePlan *p = NULL;
        _cleanup_free_ char *err = NULL, *proc2 = path_join(f->root, "empty-proc");

        /* Driver not loaded. */
        assert_int_equal(mkdir_p(proc2, 0755), 0);
        assert_int_equal(devnode_plan(proc2, NULL, &p, &err), -ENOENT);
        assert_non_null(strstr(err, "The nvidia kernel module is not loaded"));
        assert_non_null(strstr(err, "driver/nvidia/gpus does not exist"));

        /* An information file without its minor. */
        free(err);
        err = NULL;
        put(f->proc, "driver/nvidia/gpus/0000:61:00.0/information", "Model: \t\t NVIDIA H100\n");
        assert_int_equal(devnode_plan(f->proc, NULL, &p, &err), -EBADMSG);
        assert_non_null(strstr(err, "0000:61:00.0/information has no valid \"Device Minor:\" line"));
        put(f->proc, "driver/nvidia/gpus/0000:61:00.0/information", "Device Minor: \t 0\n");
        free(err);
        err = NULL;
        assert_int_equal(devnode_plan(f->proc, NULL, &p, &err), -EBADMSG);
        assert_non_null(strstr(err, "Device Minor 0 is also used by another GPU"));
        put(f->proc, "driver/nvidia/gpus/0000:61:00.0/information", "Device Minor: \t 3\n");

        /* A mig-minors without the config line is not the driver's. */
        free(err);
        err = NULL;
        put(f->proc, "driver/nvidia-caps/mig-minors", "monitor 2\ngpu0/gi1/access 12\n");
        assert_int_equal(devnode_plan(f->proc, NULL, &p, &err), -EBADMSG);
        assert_non_null(strstr(err, "mig-minors does not list \"config\"; the driver's proc tree is incomplete."));
        put(f->proc, "driver/nvidia-caps/mig-minors", "config 1\nmonitor 2\n");

        /* A params value that is not a number. */
        free(err);
        err = NULL;
        put(f->proc, "driver/nvidia/params", "DeviceFileMode: 0666abc\n");
        assert_int_equal(devnode_plan(f->proc, NULL, &p, &err), -EBADMSG);
        assert_non_null(strstr(err, "driver/nvidia/params: \"DeviceFileMode\" is not a valid value"));
        put(f->proc, "driver/nvidia/params", "DeviceFileMode: 70000\n");
        free(err);
        err = NULL;
        assert_int_equal(devnode_plan(f->proc, NULL, &p, &err), -EBADMSG);
        assert_null(p);
}

/* ---- apply ---- */

static bool can_mknod(const Fixture *f) {
        _cleanup_free_ char *p = path_join(f->root, "probe-node");
        if (mknod(p, S_IFCHR | 0600, makedev(1, 3)) < 0) {
                print_message("SKIP: mknod needs root or CAP_MKNOD (%s); device-node creation not tested\n",
                              strerror(errno));
                return false;
        }
        unlink(p);
        return true;
}

static void assert_node(const Fixture *f, const char *name, unsigned major, unsigned minor, mode_t mode,
                        ino_t *ret_ino) {
        _cleanup_free_ char *p = path_join(f->dev, name);
        struct stat st;
        assert_int_equal(lstat(p, &st), 0);
        if (!S_ISCHR(st.st_mode))
                fail_msg("%s is not a character device", p);
        assert_int_equal(major(st.st_rdev), major);
        assert_int_equal(minor(st.st_rdev), minor);
        assert_int_equal(st.st_mode & 07777, mode);
        if (ret_ino)
                *ret_ino = st.st_ino;
}

static void assert_link(const Fixture *f, const char *link, const char *target) {
        _cleanup_free_ char *p = strprintf("%s/char/%s", f->dev, link);
        char buf[256] = {};
        assert_true(readlink(p, buf, sizeof(buf) - 1) > 0);
        assert_string_equal(buf, target);
}

static size_t count_dir(const char *dir) {
        _cleanup_closedir_ DIR *d = opendir(dir);
        struct dirent *de;
        size_t n = 0;
        assert_non_null(d);
        while ((de = readdir(d)))
                if (!streq(de->d_name, ".") && !streq(de->d_name, ".."))
                        n++;
        return n;
}

static void test_apply_create_then_no_churn(void **state) {
        Fixture *f = *state;
        DevnodeResult res;
        _cleanup_free_ char *err = NULL, *summary = NULL;
        ino_t ctl, uvm, cap2;

        if (!can_mknod(f))
                return skip();
        DevnodePlan *p = plan_ok(f, NULL);
        umask(022); /* mknod's mode must not depend on it */
        assert_int_equal(devnode_apply(p, f->dev, &res, &err), 0);
        assert_null(err);
        assert_int_equal(res.created, 7);
        assert_int_equal(res.unchanged + res.replaced + res.fixed + res.skipped, 0);
        assert_int_equal(res.links, 7);

        assert_node(f, "nvidiactl", 195, 255, 0666, &ctl);
        assert_node(f, "nvidia0", 195, 0, 0666, NULL);
        assert_node(f, "nvidia2", 195, 2, 0666, NULL);
        assert_node(f, "nvidia-uvm", 235, 0, 0666, &uvm);
        assert_node(f, "nvidia-uvm-tools", 235, 1, 0666, NULL);
        assert_node(f, "nvidia-caps/nvidia-cap1", 236, 1, 0400, NULL);
        assert_node(f, "nvidia-caps/nvidia-cap2", 236, 2, 0444, &cap2);
        assert_link(f, "195:0", "../nvidia0");
        assert_link(f, "195:255", "../nvidiactl");
        assert_link(f, "235:1", "../nvidia-uvm-tools");
        assert_link(f, "236:1", "../nvidia-caps/nvidia-cap1");
        summary = devnode_result_to_string(p, &res);
        assert_string_equal(summary, "7 device nodes: 7 created; 7 /dev/char links (7 new or corrected)");

        /* Second run: nothing touched, same inodes, no temp files left behind. */
        free(summary);
        assert_int_equal(devnode_apply(p, f->dev, &res, &err), 0);
        assert_int_equal(res.unchanged, 7);
        assert_int_equal(res.created + res.replaced + res.fixed, 0);
        assert_int_equal(res.links, 0);
        assert_int_equal(res.links_ok, 7);
        ino_t again;
        assert_node(f, "nvidiactl", 195, 255, 0666, &again);
        assert_int_equal(again, ctl);
        assert_node(f, "nvidia-uvm", 235, 0, 0666, &again);
        assert_int_equal(again, uvm);
        assert_node(f, "nvidia-caps/nvidia-cap2", 236, 2, 0444, &again);
        assert_int_equal(again, cap2);
        assert_int_equal(count_dir(f->dev), 7); /* 5 nodes, nvidia-caps/, char/: no temporary names left */
        summary = devnode_result_to_string(p, &res);
        assert_string_equal(summary, "7 device nodes: 7 unchanged; 7 /dev/char links (0 new or corrected)");
        devnode_plan_free(p);
}

static void test_apply_replaces_wrong_nodes(void **state) {
        Fixture *f = *state;
        DevnodeResult res;
        _cleanup_free_ char *err = NULL, *n0 = path_join(f->dev, "nvidia0"), *n2 = path_join(f->dev, "nvidia2"),
                            *ctl = path_join(f->dev, "nvidiactl"), *link = strprintf("%s/char/195:255", f->dev);
        ino_t uvm_before, uvm_after;

        if (!can_mknod(f))
                return skip();
        DevnodePlan *p = plan_ok(f, NULL);
        assert_int_equal(devnode_apply(p, f->dev, &res, &err), 0);
        assert_node(f, "nvidia-uvm", 235, 0, 0666, &uvm_before);

        /* A regular file squatting nvidia0 (what a container's bind-mount gone wrong leaves), a node
         * with the wrong minor, a node with the right number but wrong mode, a stale link. */
        assert_int_equal(unlink(n0), 0);
        assert_int_equal(write_file_atomic(n0, NULL, "x", 1, 0644), 0);
        assert_int_equal(unlink(n2), 0);
        assert_int_equal(mknod(n2, S_IFCHR | 0666, makedev(195, 7)), 0);
        assert_int_equal(chmod(ctl, 0600), 0);
        assert_int_equal(unlink(link), 0);
        assert_int_equal(symlink("../nvidia7", link), 0);

        assert_int_equal(devnode_apply(p, f->dev, &res, &err), 0);
        assert_int_equal(res.replaced, 2);
        assert_int_equal(res.fixed, 1);
        assert_int_equal(res.unchanged, 4);
        assert_int_equal(res.links, 1);
        assert_node(f, "nvidia0", 195, 0, 0666, NULL);
        assert_node(f, "nvidia2", 195, 2, 0666, NULL);
        assert_node(f, "nvidiactl", 195, 255, 0666, NULL);
        assert_link(f, "195:255", "../nvidiactl");
        assert_node(f, "nvidia-uvm", 235, 0, 0666, &uvm_after);
        assert_int_equal(uvm_before, uvm_after);
        assert_int_equal(count_dir(f->dev), 7);
        devnode_plan_free(p);
}

static void test_apply_params_owner(void **state) {
        Fixture *f = *state;
        DevnodeResult res;
        _cleanup_free_ char *err = NULL, *n0 = path_join(f->dev, "nvidia0");
        struct stat st;

        if (!can_mknod(f))
                return skip();
        put(f->proc, "driver/nvidia/params", "DeviceFileUID: 1000\nDeviceFileGID: 44\nDeviceFileMode: 432\n");
        DevnodePlan *p = plan_ok(f, NULL);
        assert_int_equal(devnode_apply(p, f->dev, &res, &err), 0);
        assert_int_equal(lstat(n0, &st), 0);
        assert_int_equal(st.st_uid, 1000);
        assert_int_equal(st.st_gid, 44);
        assert_int_equal(st.st_mode & 07777, 0660);
        devnode_plan_free(p);
}

static void test_apply_modify_zero(void **state) {
        Fixture *f = *state;
        DevnodeResult res;
        _cleanup_free_ char *err = NULL, *summary = NULL, *n0 = path_join(f->dev, "nvidia0"),
                            *ctl = path_join(f->dev, "nvidiactl");

        if (!can_mknod(f))
                return skip();
        put(f->proc, "driver/nvidia/params", "ModifyDeviceFiles: 0\n");
        DevnodePlan *p = plan_ok(f, NULL);
        /* The admin made nvidia0 by hand; the rest is missing. */
        assert_int_equal(mknod(n0, S_IFCHR | 0666, makedev(195, 0)), 0);
        assert_int_equal(chmod(n0, 0666), 0);
        assert_int_equal(devnode_apply(p, f->dev, &res, &err), 0);
        assert_int_equal(res.created + res.replaced + res.fixed, 0);
        assert_int_equal(res.unchanged, 1);
        assert_int_equal(res.skipped, 6);
        assert_int_equal(access(ctl, F_OK), -1);
        /* The existing node still gets its /dev/char link. */
        assert_int_equal(res.links, 1);
        assert_link(f, "195:0", "../nvidia0");
        summary = devnode_result_to_string(p, &res);
        assert_non_null(strstr(summary, "ModifyDeviceFiles is 0 in /proc/driver/nvidia/params: no device nodes "
                                        "created or changed"));
        devnode_plan_free(p);
}

static void test_apply_errors(void **state) {
        Fixture *f = *state;
        DevnodeResult res;
        _cleanup_free_ char *err = NULL, *file = path_join(f->root, "not-a-dir");
        int r;

        if (!can_mknod(f))
                return skip();
        DevnodePlan *p = plan_ok(f, NULL);

        /* A dev "directory" that is a file: the error names the path and the errno. */
        assert_int_equal(write_file_atomic(file, NULL, "x", 1, 0644), 0);
        assert_int_equal(devnode_apply(p, file, &res, &err), -ENOTDIR);
        assert_non_null(strstr(err, "Cannot open the directory"));
        assert_non_null(strstr(err, "not-a-dir"));
        assert_non_null(strstr(err, strerror(ENOTDIR)));

        /* Without CAP_MKNOD (dropped from the effective set only, so it can be raised again): EPERM,
         * and the sentence says what is needed. */
        struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3 };
        struct __user_cap_data_struct caps[2] = {}, reduced[2];
        assert_int_equal(syscall(SYS_capget, &h, caps), 0);
        memcpy(reduced, caps, sizeof(caps));
        reduced[0].effective &= ~(1U << CAP_MKNOD);
        assert_int_equal(syscall(SYS_capset, &h, reduced), 0);
        free(err);
        err = NULL;
        r = devnode_apply(p, f->dev, &res, &err);
        assert_int_equal(syscall(SYS_capset, &h, caps), 0);
        assert_int_equal(r, -EPERM);
        assert_int_equal(res.created, 0);
        assert_non_null(strstr(err, "Cannot create the device node"));
        assert_non_null(strstr(err, f->dev));
        assert_non_null(strstr(err, ": Operation not permitted. Creating device nodes needs CAP_MKNOD"));
        devnode_plan_free(p);
}

static void test_apply_symlinked_subdirs(void **state) {
        /* /dev/char and /dev/nvidia-caps planted as symlinks to another directory: no node or link is
         * created through them, the error names the path, and the other nodes are still made. */
        Fixture *f = *state;
        DevnodeResult res;
        _cleanup_free_ char *err = NULL, *victim = path_join(f->root, "victim"), *ch = path_join(f->dev, "char"),
                            *caps = path_join(f->dev, "nvidia-caps"), *ctl = path_join(f->dev, "nvidiactl");
        struct stat st;

        if (!can_mknod(f))
                return skip();
        DevnodePlan *p = plan_ok(f, NULL);
        assert_int_equal(mkdir(victim, 0755), 0);
        assert_int_equal(symlink(victim, ch), 0);
        assert_int_equal(symlink(victim, caps), 0);

        assert_int_equal(devnode_apply(p, f->dev, &res, &err), -ELOOP);
        _cleanup_free_ char *want = strprintf("Refusing to use %s: it is a symbolic link, not a directory; no "
                                              "device nodes or links are created through it.", caps);
        assert_true(startswith(err, want));
        assert_int_equal(count_dir(victim), 0);
        assert_int_equal(lstat(ctl, &st), 0);
        assert_true(S_ISCHR(st.st_mode));
        assert_int_equal(res.links, 0);

        /* With nvidia-caps fixed, /dev/char is still refused and stays a link. */
        assert_int_equal(unlink(caps), 0);
        err = mfree(err);
        assert_int_equal(devnode_apply(p, f->dev, &res, &err), -ELOOP);
        want = mfree(want);
        want = strprintf("Refusing to use %s: it is a symbolic link", ch);
        assert_true(startswith(err, want));
        assert_int_equal(count_dir(victim), 0);
        assert_int_equal(lstat(ch, &st), 0);
        assert_true(S_ISLNK(st.st_mode));
        devnode_plan_free(p);
}

static void test_kind_strings(void **state) {
        for (int k = 0; k < _DEVNODE_KIND_MAX; k++)
                assert_int_equal(devnode_kind_from_string(devnode_kind_to_string((DevnodeKind) k)), k);
        assert_int_equal(devnode_kind_from_string("bogus"), _DEVNODE_KIND_INVALID);
        assert_null(devnode_kind_to_string(_DEVNODE_KIND_MAX));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_kind_strings),
                cmocka_unit_test_setup_teardown(test_apply_symlinked_subdirs, setup, teardown),
                cmocka_unit_test_setup_teardown(test_plan_defaults, setup, teardown),
                cmocka_unit_test_setup_teardown(test_plan_modeset, setup, teardown),
                cmocka_unit_test_setup_teardown(test_plan_params, setup, teardown),
                cmocka_unit_test_setup_teardown(test_plan_mig, setup, teardown),
                cmocka_unit_test_setup_teardown(test_plan_mig_unknown, setup, teardown),
                cmocka_unit_test_setup_teardown(test_plan_no_uvm_no_caps, setup, teardown),
                cmocka_unit_test_setup_teardown(test_plan_nvswitch, setup, teardown),
                cmocka_unit_test_setup_teardown(test_plan_bad_input, setup, teardown),
                cmocka_unit_test_setup_teardown(test_apply_create_then_no_churn, setup, teardown),
                cmocka_unit_test_setup_teardown(test_apply_replaces_wrong_nodes, setup, teardown),
                cmocka_unit_test_setup_teardown(test_apply_params_owner, setup, teardown),
                cmocka_unit_test_setup_teardown(test_apply_modify_zero, setup, teardown),
                cmocka_unit_test_setup_teardown(test_apply_errors, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
