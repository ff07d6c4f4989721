/* SPDX-License-Identifier: MIT */
/* Tests for modules/gpu-holders.c: processes with NVIDIA nodes open, found both in a fixture proc tree
 * and among real child processes holding files under a temporary "dev" directory, module holders
 * from a fixture sys tree, and the refusal sentence built from them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <cmocka.h>

#include "fileio.h"
#include "gpu-holders.h"
#include "strv.h"

static char *tmp;

static void put(const char *rel, const char *content) {
        _cleanup_free_ char *p = path_join(tmp, rel), *d = strdup(p);
        *strrchr(d, '/') = 0;
        assert_int_equal(mkdir_p(d, 0755), 0);
        assert_int_equal(write_file_atomic(p, NULL, content, strlen(content), 0644), 0);
}

static void put_link(const char *rel, const char *target) {
        _cleanup_free_ char *p = path_join(tmp, rel), *d = strdup(p);
        *strrchr(d, '/') = 0;
        assert_int_equal(mkdir_p(d, 0755), 0);
        assert_int_equal(symlink(target, p), 0);
}

static int setup(void **state) {
        tmp = strdup("/tmp/gna-test-holders-XXXXXX");
        assert_non_null(mkdtemp(tmp));
        return 0;
}

static int teardown(void **state) {
        _cleanup_free_ char *cmd = strprintf("rm -rf '%s'", tmp);
        assert_int_equal(system(cmd), 0);
        tmp = mfree(tmp);
        return 0;
}

/* fd links as the kernel shows them, without real processes. */
static void test_fixture_proc(void **state) {
        _cleanup_free_ char *proc = path_join(tmp, "proc");
        GpuHolders h = {};

        put_link("proc/100/fd/3", "/dev/nvidia0");
        put_link("proc/100/fd/4", "/dev/nvidiactl");
        put("proc/100/comm", "python3\n");
        put_link("proc/200/fd/0", "/dev/null");
        put_link("proc/200/fd/1", "socket:[12345]");
        put_link("proc/200/fd/2", "/dev/nvidia-fs-not-ours/x"); /* nvidia* but two levels down */
        put("proc/200/comm", "bash\n");
        put_link("proc/300/fd/5", "/dev/nvidia-caps/nvidia-cap12");
        put("proc/300/comm", "nvidia-smi\n");
        put_link("proc/400/fd/1", "/dev/nvidia-uvm (deleted)");
        put("proc/400/comm", "old-job\n");
        put_link("proc/500/fd/1", "/devices/nvidia0"); /* same prefix, other directory */
        put("proc/500/comm", "confuser\n");
        put_link("proc/600/fd/7", "/dev/nvidia3");     /* no comm: exited between the reads */
        put_link("proc/self/fd/1", "/dev/nvidia0");    /* not a pid directory */
        put("proc/cpuinfo", "processor: 0\n");

        assert_int_equal(gpu_holders_processes(proc, "/dev", 0, &h), 0);
        assert_int_equal(h.n_procs, 4);
        assert_int_equal(h.procs[0].pid, 100);
        assert_string_equal(h.procs[0].comm, "python3");
        assert_true(streq(h.procs[0].node, "/dev/nvidia0") || streq(h.procs[0].node, "/dev/nvidiactl"));
        assert_int_equal(h.procs[1].pid, 300);
        assert_string_equal(h.procs[1].node, "/dev/nvidia-caps/nvidia-cap12");
        assert_int_equal(h.procs[2].pid, 400);
        assert_string_equal(h.procs[2].node, "/dev/nvidia-uvm (deleted)");
        assert_int_equal(h.procs[3].pid, 600);
        assert_string_equal(h.procs[3].comm, "?");
        gpu_holders_done(&h);

        /* The agent leaves itself out while it still holds NVML. */
        assert_int_equal(gpu_holders_processes(proc, "/dev/", 100, &h), 0);
        assert_int_equal(h.n_procs, 3);
        assert_int_equal(h.procs[0].pid, 300);
        gpu_holders_done(&h);

        assert_int_equal(gpu_holders_processes("/nonexistent-proc", "/dev", 0, &h), -ENOENT);
}

static pid_t spawn_holder(const char *name, const char *const *paths, int *ret_release) {
        int ready[2], release[2];
        char c;

        assert_int_equal(pipe(ready), 0);
        assert_int_equal(pipe(release), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                close(ready[0]);
                close(release[1]);
                (void) prctl(PR_SET_NAME, name);
                for (const char *const *p = paths; *p; p++)
                        if (open(*p, O_RDONLY | O_CLOEXEC) < 0)
                                _exit(3);
                (void) !write(ready[1], "r", 1);
                (void) !read(release[0], &c, 1);
                _exit(0);
        }
        close(ready[1]);
        close(release[0]);
        assert_int_equal(read(ready[0], &c, 1), 1);
        close(ready[0]);
        *ret_release = release[1];
        return pid;
}

static void reap(pid_t pid, int release) {
        int status;
        close(release);
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* Real processes, a temporary directory standing in for /dev. */
static void test_live_processes(void **state) {
        _cleanup_free_ char *dev = path_join(tmp, "dev"), *n0 = path_join(dev, "nvidia0"),
                            *cap = path_join(dev, "nvidia-caps/nvidia-cap1"), *other = path_join(dev, "sda"),
                            *devx = path_join(tmp, "devx/nvidia0"), *ctl = path_join(dev, "nvidiactl"),
                            *expected = NULL, *msg = NULL;
        GpuHolders h = {};
        int rel1, rel2, rel3;

        put("dev/nvidia0", "");
        put("dev/nvidiactl", "");
        put("dev/nvidia-caps/nvidia-cap1", "");
        put("dev/sda", "");
        put("devx/nvidia0", "");

        pid_t a = spawn_holder("gpu-holder-a", (const char *const[]) { other, n0, NULL }, &rel1);
        pid_t b = spawn_holder("gpu-holder-b", (const char *const[]) { other, devx, NULL }, &rel2);
        pid_t c = spawn_holder("gpu-holder-c", (const char *const[]) { cap, NULL }, &rel3);
        /* A node replaced while open stays held: the link reads "… (deleted)". */
        assert_int_equal(unlink(cap), 0);
        _cleanup_close_ int self_fd = open(ctl, O_RDONLY | O_CLOEXEC);
        assert_true(self_fd >= 0);

        assert_int_equal(gpu_holders_processes("/proc", dev, getpid(), &h), 0);
        assert_int_equal(h.n_procs, 2);
        GpuHolder *ha = h.procs[0].pid == a ? &h.procs[0] : &h.procs[1];
        GpuHolder *hc = h.procs[0].pid == c ? &h.procs[0] : &h.procs[1];
        assert_int_equal(ha->pid, a);
        assert_string_equal(ha->comm, "gpu-holder-a");
        assert_string_equal(ha->node, n0);
        assert_int_equal(hc->pid, c);
        assert_string_equal(hc->comm, "gpu-holder-c");
        expected = strprintf("%s (deleted)", cap);
        assert_string_equal(hc->node, expected);
        for (size_t i = 0; i < h.n_procs; i++)
                assert_int_not_equal(h.procs[i].pid, b);
        gpu_holders_done(&h);

        /* Without excluding ourselves, this test process shows up too. */
        assert_int_equal(gpu_holders_processes("/proc", dev, 0, &h), 0);
        assert_int_equal(h.n_procs, 3);
        gpu_holders_done(&h);

        reap(c, rel3);
        reap(b, rel2);
        assert_int_equal(gpu_holders_processes("/proc", dev, getpid(), &h), 0);
        assert_int_equal(h.n_procs, 1);
        msg = gpu_holders_to_string(&h);
        free(expected);
        expected = strprintf("The GPU is in use: process %d (gpu-holder-a, %s). Stop them, then retry.", (int) a, n0);
        assert_string_equal(msg, expected);
        gpu_holders_done(&h);
        reap(a, rel1);

        assert_int_equal(gpu_holders_processes("/proc", dev, getpid(), &h), 0);
        assert_int_equal(h.n_procs, 0);
        assert_false(gpu_holders_busy(&h));
        free(msg);
        msg = gpu_holders_to_string(&h);
        assert_string_equal(msg, "");
        gpu_holders_done(&h);
}

static void test_module_holders(void **state) {
        _cleanup_free_ char *sys = path_join(tmp, "sys"), *proc = path_join(tmp, "proc"), *msg = NULL;
        GpuHolders h = {};

        put("sys/module/nvidia/initstate", "live\n");
        put("sys/module/nvidia/holders/nvidia_uvm/initstate", "live\n");
        put("sys/module/nvidia/holders/nvidia_modeset/initstate", "live\n");
        put("sys/module/nvidia_uvm/initstate", "live\n");
        put("sys/module/nvidia_uvm/holders/.keep", "");

        assert_int_equal(gpu_holders_modules(sys, "nvidia", &h), 0);
        assert_int_equal(strv_length(h.modules), 2);
        assert_string_equal(h.modules[0], "nvidia_modeset");
        assert_string_equal(h.modules[1], "nvidia_uvm");
        assert_true(gpu_holders_busy(&h));
        gpu_holders_done(&h);

        /* '-' spelled names, no holders. */
        assert_int_equal(gpu_holders_modules(sys, "nvidia-uvm", &h), 0);
        assert_null(h.modules);
        /* Not loaded. */
        assert_int_equal(gpu_holders_modules(sys, "nvidia-peermem", &h), -ENOENT);

        /* Together: a process and modules, in one sentence. */
        put_link("proc/4242/fd/3", "/dev/nvidiactl");
        put("proc/4242/comm", "nvidia-persiste\n");
        assert_int_equal(gpu_holders_collect(proc, sys, "/dev", 0, &h), 0);
        msg = gpu_holders_to_string(&h);
        assert_string_equal(msg, "The GPU is in use: process 4242 (nvidia-persiste, /dev/nvidiactl); kernel modules "
                                 "nvidia_modeset, nvidia_uvm hold nvidia. Stop them, then retry.");
        gpu_holders_done(&h);
        free(msg);

        /* Only a module. */
        _cleanup_free_ char *empty_proc = path_join(tmp, "proc-empty");
        assert_int_equal(mkdir_p(empty_proc, 0755), 0);
        assert_int_equal(gpu_holders_collect(empty_proc, sys, "/dev", 0, &h), 0);
        msg = gpu_holders_to_string(&h);
        assert_string_equal(msg, "The GPU is in use: kernel modules nvidia_modeset, nvidia_uvm hold nvidia. Stop "
                                 "them, then retry.");
        gpu_holders_done(&h);
        free(msg);
        msg = NULL;

        /* nvidia not loaded at all: nothing holds it. */
        _cleanup_free_ char *empty_sys = path_join(tmp, "sys-empty");
        assert_int_equal(mkdir_p(empty_sys, 0755), 0);
        assert_int_equal(gpu_holders_collect(empty_proc, empty_sys, "/dev", 0, &h), 0);
        assert_false(gpu_holders_busy(&h));
        gpu_holders_done(&h);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_fixture_proc, setup, teardown),
                cmocka_unit_test_setup_teardown(test_live_processes, setup, teardown),
                cmocka_unit_test_setup_teardown(test_module_holders, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
