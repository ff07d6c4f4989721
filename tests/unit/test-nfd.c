/* SPDX-License-Identifier: MIT */
/* Tests labels/nfd.c: the feature file text NFD reads, and the writer's promises: atomic replace
 * through the hidden subdirectory, no rewrite when nothing changed, the directory created when only it
 * is missing, and clear errors for a missing parent, a read-only directory and a target that is not a
 * regular file. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <fcntl.h>
#include <ftw.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include "fileio.h"
#include "nfd.h"
#include "strv.h"

#define HEADER "# Written by gpu-node-agent; do not edit (regenerated on change).\n"

typedef struct Fixture {
        char root[64];
        char *dir; /* <root>/features.d, not created */
} Fixture;

static int setup(void **state) {
        Fixture *f = calloc(1, sizeof(Fixture));
        assert_non_null(f);
        snprintf(f->root, sizeof f->root, "/tmp/test-nfd-XXXXXX");
        assert_non_null(mkdtemp(f->root));
        f->dir = path_join(f->root, "features.d");
        assert_non_null(f->dir);
        *state = f;
        return 0;
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *w) {
        return remove(p) < 0 ? -1 : 0;
}

static int teardown(void **state) {
        Fixture *f = *state;
        (void) umount2(f->dir, MNT_DETACH);
        (void) chmod(f->dir, 0755);
        assert_int_equal(nftw(f->root, rm_one, 16, FTW_DEPTH | FTW_PHYS), 0);
        free(f->dir);
        free(f);
        return 0;
}

static LabelSet *sample_set(const char *count) {
        LabelSet *s = label_set_new();
        assert_non_null(s);
        /* Out of order on purpose: the file is sorted by key. */
        assert_int_equal(label_set_put(s, "nvidia.com/gpu.product", "NVIDIA-H100-SXM5-80GB"), 0);
        assert_int_equal(label_set_put(s, "nvidia.com/gpu.present", "true"), 0);
        assert_int_equal(label_set_put(s, "nvidia.com/gpu.count", count), 0);
        assert_int_equal(label_set_put(s, "nvidia.com/gpu-node-agent.state", "ready"), 0);
        return s;
}

static char *read_file(const char *path) {
        char *s = NULL;
        assert_int_equal(read_full_file(path, 1 << 20, &s, NULL), 0);
        return s;
}

static void test_format(void **state) {
        _cleanup_(label_set_freep) LabelSet *s = sample_set("8");
        _cleanup_free_ char *text = NULL;

        assert_int_equal(nfd_format(s, 0, &text), 0);
        assert_string_equal(text,
                            HEADER
                            "nvidia.com/gpu-node-agent.state=ready\n"
                            "nvidia.com/gpu.count=8\n"
                            "nvidia.com/gpu.present=true\n"
                            "nvidia.com/gpu.product=NVIDIA-H100-SXM5-80GB\n");
        text = mfree(text);

        /* 1700000000 s = 2023-11-14T22:13:20Z; sub-second parts are dropped. */
        assert_int_equal(nfd_format(s, UINT64_C(1700000000) * USEC_PER_SEC + 999999, &text), 0);
        assert_string_equal(text,
                            HEADER
                            "# +expiry-time=2023-11-14T22:13:20Z\n"
                            "nvidia.com/gpu-node-agent.state=ready\n"
                            "nvidia.com/gpu.count=8\n"
                            "nvidia.com/gpu.present=true\n"
                            "nvidia.com/gpu.product=NVIDIA-H100-SXM5-80GB\n");
        text = mfree(text);

        /* An empty value is valid for Kubernetes and written as "key=". */
        assert_int_equal(label_set_put(s, "nvidia.com/gpu.sharing-strategy", ""), 0);
        assert_int_equal(nfd_format(s, 0, &text), 0);
        assert_non_null(strstr(text, "\nnvidia.com/gpu.sharing-strategy=\n"));
        text = mfree(text);

        /* Empty set: just the header. */
        _cleanup_(label_set_freep) LabelSet *empty = label_set_new();
        assert_int_equal(nfd_format(empty, 0, &text), 0);
        assert_string_equal(text, HEADER);
}

static void test_format_rejects_invalid(void **state) {
        /* A set built around label_set_put (as a bug would): the formatter checks again. */
        Label bad_value[] = { { (char *) "nvidia.com/gpu.product", (char *) "NVIDIA-TITAN-X-(Pascal)" } };
        Label bad_key[] = { { (char *) "nvidia.com/gpu product", (char *) "x" } };
        Label unsorted[] = { { (char *) "nvidia.com/b", (char *) "x" }, { (char *) "nvidia.com/a", (char *) "y" } };
        LabelSet s;
        char *text = NULL;

        s = (LabelSet) { bad_value, 1 };
        assert_int_equal(nfd_format(&s, 0, &text), -EINVAL);
        s = (LabelSet) { bad_key, 1 };
        assert_int_equal(nfd_format(&s, 0, &text), -EINVAL);
        s = (LabelSet) { unsorted, 2 };
        assert_int_equal(nfd_format(&s, 0, &text), -EINVAL);
        assert_null(text);

        /* A hostile driver's string can make neither a second line, a second label nor a comment. */
        static const char *const hostile[] = { "H100\nnvidia.com/gpu.count=99", "H100=x", "#x", "H100 #x",
                                               "a\\b", "\"H100\"", "H100\r", "\xff" };
        for (size_t i = 0; i < ELEMENTSOF(hostile); i++) {
                Label v[] = { { (char *) "nvidia.com/gpu.product", (char *) hostile[i] } };
                Label k[] = { { (char *) hostile[i], (char *) "x" } };
                _cleanup_(label_set_freep) LabelSet *set = label_set_new();

                assert_non_null(set);
                assert_int_equal(label_set_put(set, "nvidia.com/gpu.product", hostile[i]), -EINVAL);
                assert_int_equal(label_set_put(set, hostile[i], "x"), -EINVAL);
                s = (LabelSet) { v, 1 };
                assert_int_equal(nfd_format(&s, 0, &text), -EINVAL);
                s = (LabelSet) { k, 1 };
                assert_int_equal(nfd_format(&s, 0, &text), -EINVAL);
                assert_null(text);
        }
}

/* Names in dir other than "." and "..", sorted, joined with ' '. */
static char *list_dir(const char *dir) {
        _cleanup_closedir_ DIR *d = opendir(dir);
        char *names[16];
        size_t n = 0;
        struct dirent *de;

        assert_non_null(d);
        while ((de = readdir(d)))
                if (!streq(de->d_name, ".") && !streq(de->d_name, "..")) {
                        assert_true(n < ELEMENTSOF(names));
                        names[n++] = strdup(de->d_name);
                }
        for (size_t i = 1; i < n; i++)
                for (size_t j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
                        char *t = names[j];
                        names[j] = names[j - 1];
                        names[j - 1] = t;
                }
        char *r = calloc(1, 1024);
        assert_non_null(r);
        for (size_t i = 0; i < n; i++) {
                if (i > 0)
                        strcat(r, " ");
                strcat(r, names[i]);
                free(names[i]);
        }
        return r;
}

static void test_write_atomic_and_no_churn(void **state) {
        Fixture *f = *state;
        _cleanup_(label_set_freep) LabelSet *s8 = sample_set("8"), *s4 = sample_set("4");
        _cleanup_free_ char *t8 = NULL, *t4 = NULL, *target = path_join(f->dir, "gpu-node-agent");
        _cleanup_free_ char *hidden = path_join(f->dir, ".gpu-node-agent");
        char *error = NULL;
        bool changed = false;
        struct stat st1, st2, st3;

        assert_int_equal(nfd_format(s8, 0, &t8), 0);
        assert_int_equal(nfd_format(s4, 0, &t4), 0);
        assert_int_equal(mkdir(f->dir, 0755), 0);

        assert_int_equal(nfd_write(f->dir, "gpu-node-agent", t8, &changed, &error), 0);
        assert_null(error);
        assert_true(changed);
        _cleanup_free_ char *got = read_file(target);
        assert_string_equal(got, t8);
        assert_int_equal(stat(target, &st1), 0);
        assert_true(S_ISREG(st1.st_mode));
        assert_int_equal(st1.st_mode & 07777, 0644);

        /* NFD sees only the target: the temp file lived in the hidden directory and is gone. */
        _cleanup_free_ char *names = list_dir(f->dir);
        assert_string_equal(names, ".gpu-node-agent gpu-node-agent");
        _cleanup_free_ char *hidden_names = list_dir(hidden);
        assert_string_equal(hidden_names, "");

        /* Same content: nothing written, same inode and mtime. */
        assert_int_equal(nfd_write(f->dir, "gpu-node-agent", t8, &changed, &error), 0);
        assert_false(changed);
        assert_int_equal(stat(target, &st2), 0);
        assert_int_equal(st1.st_ino, st2.st_ino);
        assert_int_equal(st1.st_mtim.tv_sec, st2.st_mtim.tv_sec);
        assert_int_equal(st1.st_mtim.tv_nsec, st2.st_mtim.tv_nsec);

        /* Changed content: replaced by rename, so a reader holding the old file never sees a mix. */
        int fd = open(target, O_RDONLY | O_CLOEXEC);
        assert_true(fd >= 0);
        assert_int_equal(nfd_write(f->dir, "gpu-node-agent", t4, &changed, &error), 0);
        assert_true(changed);
        assert_int_equal(stat(target, &st3), 0);
        assert_int_not_equal(st1.st_ino, st3.st_ino);
        got = mfree(got);
        got = read_file(target);
        assert_string_equal(got, t4);
        char old[1024] = {};
        assert_true(read(fd, old, sizeof old - 1) > 0);
        assert_string_equal(old, t8);
        close(fd);
        names = mfree(names);
        names = list_dir(f->dir);
        assert_string_equal(names, ".gpu-node-agent gpu-node-agent");

        /* A file changed behind our back (e.g. by hand) is put back. */
        FILE *w = fopen(target, "w");
        assert_non_null(w);
        fputs("nvidia.com/gpu.count=99\n", w);
        fclose(w);
        assert_int_equal(nfd_write(f->dir, "gpu-node-agent", t4, &changed, &error), 0);
        assert_true(changed);
        got = mfree(got);
        got = read_file(target);
        assert_string_equal(got, t4);
}

static void test_missing_dir_created(void **state) {
        Fixture *f = *state;
        _cleanup_free_ char *target = path_join(f->dir, "gpu-node-agent"), *got = NULL;
        char *error = NULL;
        bool changed = false;
        struct stat st;

        assert_int_equal(nfd_write(f->dir, "gpu-node-agent", HEADER "a=b\n", &changed, &error), 0);
        assert_null(error);
        assert_true(changed);
        assert_int_equal(stat(f->dir, &st), 0);
        assert_true(S_ISDIR(st.st_mode));
        got = read_file(target);
        assert_string_equal(got, HEADER "a=b\n");
}

static void test_missing_parent(void **state) {
        Fixture *f = *state;
        _cleanup_free_ char *parent = path_join(f->root, "node-feature-discovery");
        _cleanup_free_ char *dir = path_join(parent, "features.d");
        _cleanup_free_ char *error = NULL, *want = NULL;
        bool changed = true;

        assert_int_equal(nfd_write(dir, "gpu-node-agent", HEADER, &changed, &error), -ENOENT);
        assert_false(changed);
        assert_non_null(error);
        assert_true(asprintf(&want,
                             "The NFD feature directory %s does not exist, nor does its parent %s; create "
                             "%s (or deploy Node Feature Discovery), or set labels.directory to the "
                             "features.d directory NFD reads.", dir, parent, dir) > 0);
        assert_string_equal(error, want);
        assert_int_equal(access(parent, F_OK), -1);
}

static void test_dir_is_a_file(void **state) {
        Fixture *f = *state;
        _cleanup_free_ char *error = NULL;
        bool changed = true;

        FILE *w = fopen(f->dir, "w");
        assert_non_null(w);
        fclose(w);
        assert_int_equal(nfd_write(f->dir, "gpu-node-agent", HEADER, &changed, &error), -ENOTDIR);
        assert_false(changed);
        assert_non_null(strstr(error, f->dir));
        assert_non_null(strstr(error, "is not a directory"));
}

static void test_target_is_a_directory(void **state) {
        Fixture *f = *state;
        _cleanup_free_ char *target = path_join(f->dir, "gpu-node-agent"), *error = NULL, *want = NULL;
        bool changed = true;

        assert_int_equal(mkdir_p(target, 0755), 0);
        assert_int_equal(nfd_write(f->dir, "gpu-node-agent", HEADER, &changed, &error), -EISDIR);
        assert_false(changed);
        assert_true(asprintf(&want,
                             "%s is a directory, not a regular file, so NFD ignores it and the labels "
                             "cannot be written there; remove it or set labels.file to another name.",
                             target) > 0);
        assert_string_equal(error, want);
}

static void test_bad_name(void **state) {
        Fixture *f = *state;
        _cleanup_free_ char *error = NULL;
        bool changed = true;

        assert_int_equal(nfd_write(f->dir, ".hidden", HEADER, &changed, &error), -EINVAL);
        assert_string_equal(error,
                            "Invalid NFD feature file name '.hidden': it must be a plain file name without "
                            "'/' that does not start with '.' (NFD skips dot-files); fix labels.file.");
        error = mfree(error);
        assert_int_equal(nfd_write(f->dir, "a/b", HEADER, &changed, &error), -EINVAL);
        assert_non_null(strstr(error, "'a/b'"));
        assert_int_equal(access(f->dir, F_OK), -1); /* nothing created */
}

static void test_temp_dir_unusable(void **state) {
        /* The hidden temp directory is in the way as a plain file: the write fails, says where, and the
         * existing labels stay as they were. */
        Fixture *f = *state;
        _cleanup_free_ char *target = path_join(f->dir, "gpu-node-agent");
        _cleanup_free_ char *hidden = path_join(f->dir, ".gpu-node-agent");
        _cleanup_free_ char *error = NULL, *got = NULL, *want = NULL;
        bool changed = false;

        assert_int_equal(nfd_write(f->dir, "gpu-node-agent", HEADER "a=1\n", &changed, &error), 0);
        assert_int_equal(nftw(hidden, rm_one, 4, FTW_DEPTH | FTW_PHYS), 0);
        FILE *w = fopen(hidden, "w");
        assert_non_null(w);
        fclose(w);

        assert_int_equal(nfd_write(f->dir, "gpu-node-agent", HEADER "a=2\n", &changed, &error), -ENOTDIR);
        assert_false(changed);
        assert_true(asprintf(&want, "Cannot write the NFD feature file %s: Not a directory (temporary file "
                             "in %s/); make %s writable or set labels.directory.", target, hidden, f->dir) > 0);
        assert_string_equal(error, want);
        got = read_file(target);
        assert_string_equal(got, HEADER "a=1\n");
}

static void test_read_only_dir(void **state) {
        Fixture *f = *state;
        _cleanup_free_ char *target = path_join(f->dir, "gpu-node-agent"), *error = NULL, *want = NULL;
        _cleanup_free_ char *sub = path_join(f->dir, "sub");
        const char *errtext;
        bool changed = false;
        int r;

        assert_int_equal(mkdir(f->dir, 0755), 0);
        if (unshare(CLONE_NEWNS) >= 0) {
                /* Private mount namespace for this process: a read-only bind mount of the directory. */
                assert_int_equal(mount("none", "/", "none", MS_REC | MS_PRIVATE, NULL), 0);
                assert_int_equal(mount(f->dir, f->dir, "none", MS_BIND, NULL), 0);
                assert_int_equal(mount("none", f->dir, "none", MS_REMOUNT | MS_BIND | MS_RDONLY, NULL), 0);
                r = -EROFS;
                errtext = "Read-only file system";
        } else if (geteuid() != 0) {
                assert_int_equal(chmod(f->dir, 0555), 0);
                r = -EACCES;
                errtext = "Permission denied";
        } else {
                skip(); /* root without mount namespaces: no way to make a directory unwritable */
                return;
        }

        assert_int_equal(nfd_write(f->dir, "gpu-node-agent", HEADER, &changed, &error), r);
        assert_false(changed);
        assert_true(asprintf(&want, "Cannot write the NFD feature file %s: %s", target, errtext) > 0);
        assert_true(startswith(error, want));
        assert_int_equal(access(target, F_OK), -1);

        /* A missing directory under a read-only parent cannot be created either: same kind of message. */
        error = mfree(error);
        want = mfree(want);
        assert_int_equal(nfd_write(sub, "gpu-node-agent", HEADER, &changed, &error), r);
        assert_true(asprintf(&want, "Cannot create the NFD feature directory %s: %s;", sub, errtext) > 0);
        assert_true(startswith(error, want));
}

static void test_remove(void **state) {
        Fixture *f = *state;
        _cleanup_free_ char *names = NULL;
        bool changed;

        /* Nothing there, not even the directory: fine. */
        assert_int_equal(nfd_remove(f->dir, "gpu-node-agent", NULL), 0);

        assert_int_equal(nfd_write(f->dir, "gpu-node-agent", HEADER, &changed, NULL), 0);
        assert_int_equal(nfd_write(f->dir, "other-source", HEADER, &changed, NULL), 0);
        /* A temp file left by a crash between create and rename goes too. */
        _cleanup_free_ char *stale = path_join(f->dir, ".gpu-node-agent/gpu-node-agent.AbC123");
        FILE *w = fopen(stale, "w");
        assert_non_null(w);
        fclose(w);

        assert_int_equal(nfd_remove(f->dir, "gpu-node-agent", NULL), 0);
        names = list_dir(f->dir);
        assert_string_equal(names, ".other-source other-source"); /* other files untouched */
        assert_int_equal(nfd_remove(f->dir, "gpu-node-agent", NULL), 0);

        /* A directory in place of the file is not ours to delete. */
        _cleanup_free_ char *target = path_join(f->dir, "gpu-node-agent");
        assert_int_equal(mkdir(target, 0755), 0);
        assert_true(nfd_remove(f->dir, "gpu-node-agent", NULL) < 0);
        assert_int_equal(access(target, F_OK), 0);
}

static void test_too_big(void **state) {
        Fixture *f = *state;
        _cleanup_free_ char *big = malloc(65538), *error = NULL;
        bool changed = true;

        assert_non_null(big);
        memset(big, '#', 65537);
        big[65537] = 0;
        assert_int_equal(nfd_write(f->dir, "gpu-node-agent", big, &changed, &error), -EFBIG);
        assert_false(changed);
        assert_non_null(strstr(error, "gpu-node-agent would be 65537 bytes, over the 65536 bytes NFD reads"));
}

/* A victim directory with one file; returns its path. The file must survive whatever we do. */
static char *make_victim(const Fixture *f) {
        char *v = path_join(f->root, "victim");
        _cleanup_free_ char *file = path_join(v, "precious");
        assert_int_equal(mkdir(v, 0755), 0);
        FILE *w = fopen(file, "w");
        assert_non_null(w);
        fputs("keep me\n", w);
        fclose(w);
        return v;
}

static void test_hidden_dir_symlink_never_followed(void **state) {
        /* features.d/.gpu-node-agent planted as a symlink to another directory: the write refuses
         * with the path named, removal leaves the link and the directory behind it alone. */
        Fixture *f = *state;
        _cleanup_free_ char *victim = make_victim(f), *hidden = NULL, *error = NULL, *names = NULL,
                            *target = NULL;
        bool changed = true;

        assert_int_equal(mkdir(f->dir, 0755), 0);
        hidden = path_join(f->dir, ".gpu-node-agent");
        assert_int_equal(symlink(victim, hidden), 0);

        assert_int_equal(nfd_write(f->dir, "gpu-node-agent", HEADER "a=1\n", &changed, &error), -ELOOP);
        assert_false(changed);
        _cleanup_free_ char *want = strprintf("Refusing to use %s for the NFD feature file's temporary files: it "
                                              "is a symbolic link, not a directory gpu-node-agent created", hidden);
        assert_true(startswith(error, want));
        names = list_dir(victim);
        assert_string_equal(names, "precious");

        error = mfree(error);
        assert_int_equal(nfd_remove(f->dir, "gpu-node-agent", &error), -ELOOP);
        want = mfree(want);
        want = strprintf("%s/.gpu-node-agent is not a directory gpu-node-agent created (a symbolic link)", f->dir);
        assert_true(startswith(error, want));
        names = mfree(names);
        names = list_dir(victim);
        assert_string_equal(names, "precious");
        struct stat st;
        assert_int_equal(lstat(hidden, &st), 0);
        assert_true(S_ISLNK(st.st_mode));

        /* Our file name as a symlink is not ours to delete either. */
        assert_int_equal(unlink(hidden), 0);
        target = path_join(f->dir, "gpu-node-agent");
        _cleanup_free_ char *vfile = path_join(victim, "precious");
        assert_int_equal(symlink(vfile, target), 0);
        error = mfree(error);
        assert_int_equal(nfd_remove(f->dir, "gpu-node-agent", &error), -EEXIST);
        assert_non_null(strstr(error, "is a symbolic link, not the feature file gpu-node-agent writes; leaving it alone."));
        assert_int_equal(lstat(target, &st), 0);
        names = mfree(names);
        names = list_dir(victim);
        assert_string_equal(names, "precious");
}

static void test_hidden_dir_not_ours(void **state) {
        /* A world-writable hidden directory is someone else's playground: refused, left alone. */
        Fixture *f = *state;
        _cleanup_free_ char *hidden = NULL, *error = NULL;
        bool changed;

        assert_int_equal(mkdir(f->dir, 0755), 0);
        hidden = path_join(f->dir, ".gpu-node-agent");
        assert_int_equal(mkdir(hidden, 0777), 0);
        assert_int_equal(chmod(hidden, 0777), 0);
        assert_int_equal(nfd_write(f->dir, "gpu-node-agent", HEADER, &changed, &error), -EPERM);
        assert_non_null(strstr(error, "it is a directory, not a directory gpu-node-agent created"));
        assert_int_equal(access(hidden, F_OK), 0);
}

static void test_leftover_temp_cleaned_on_write(void **state) {
        /* A writer killed between create and rename left a 0-byte temp file: the next write removes it,
         * even when the labels did not change; names that are not our temp pattern stay. */
        Fixture *f = *state;
        _cleanup_free_ char *hidden = NULL, *stale = NULL, *other = NULL, *names = NULL;
        bool changed;

        assert_int_equal(nfd_write(f->dir, "gpu-node-agent", HEADER, &changed, NULL), 0);
        hidden = path_join(f->dir, ".gpu-node-agent");
        stale = path_join(hidden, "gpu-node-agent.Zz9xQ1");
        other = path_join(hidden, "notes.txt");
        FILE *w = fopen(stale, "w");
        assert_non_null(w);
        fclose(w);
        w = fopen(other, "w");
        assert_non_null(w);
        fclose(w);
        assert_int_equal(nfd_write(f->dir, "gpu-node-agent", HEADER, &changed, NULL), 0);
        assert_false(changed);
        names = list_dir(hidden);
        assert_string_equal(names, "notes.txt");
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_format),
                cmocka_unit_test(test_format_rejects_invalid),
                cmocka_unit_test_setup_teardown(test_write_atomic_and_no_churn, setup, teardown),
                cmocka_unit_test_setup_teardown(test_missing_dir_created, setup, teardown),
                cmocka_unit_test_setup_teardown(test_missing_parent, setup, teardown),
                cmocka_unit_test_setup_teardown(test_dir_is_a_file, setup, teardown),
                cmocka_unit_test_setup_teardown(test_target_is_a_directory, setup, teardown),
                cmocka_unit_test_setup_teardown(test_bad_name, setup, teardown),
                cmocka_unit_test_setup_teardown(test_temp_dir_unusable, setup, teardown),
                cmocka_unit_test_setup_teardown(test_remove, setup, teardown),
                cmocka_unit_test_setup_teardown(test_too_big, setup, teardown),
                cmocka_unit_test_setup_teardown(test_hidden_dir_symlink_never_followed, setup, teardown),
                cmocka_unit_test_setup_teardown(test_hidden_dir_not_ours, setup, teardown),
                cmocka_unit_test_setup_teardown(test_leftover_temp_cleaned_on_write, setup, teardown),
                /* Last: it may move this process into its own mount namespace. */
                cmocka_unit_test_setup_teardown(test_read_only_dir, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
