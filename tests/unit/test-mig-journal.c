/* SPDX-License-Identifier: MIT */
/* Tests for the MIG apply journal (agent/mig/mig-journal.c): the exact file a begin/unit/step/gpu-end
 * sequence writes, reading it back (layouts, finished GPUs, stopped units), end removing it, a torn last
 * line from a crash, escaped names, and the error for a file that is not a journal. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <cmocka.h>

#include "fileio.h"
#include "mig-journal.h"
#include "mig-state.h"
#include "strv.h"

static char *tmp_path(char **dir) {
        char tmpl[] = "/tmp/test-mig-journal-XXXXXX";
        assert_non_null(mkdtemp(tmpl));
        *dir = strdup(tmpl);
        return strprintf("%s/state/mig-journal", tmpl);
}

static void rm_rf(char *dir) {
        _cleanup_free_ char *cmd = strprintf("rm -rf '%s'", dir);
        assert_int_equal(system(cmd), 0);
        free(dir);
}

static int write_text(const char *path, const char *text) {
        return write_file_atomic(path, NULL, text, strlen(text), 0600);
}

static MigGpuState layout(void) {
        static unsigned ci_ids[] = { 0, 1 }, ci_profiles[] = { 0, 1 };
        static MigGiState gis[] = {
                { .id = 1, .profile_id = 9, .start = 0, .size = 4, .ci_ids = ci_ids, .ci_profile_ids = ci_profiles, .n_cis = 2 },
                { .id = 5, .profile_id = 14, .start = 4, .size = 2 },
        };
        MigGpuState g = { .index = 3, .mig_capable = true, .mig_current = true, .mig_pending = true, .gis = gis, .n_gis = 2 };
        strcpy(g.pci_address, "0000:4e:00.0");
        return g;
}

static void test_roundtrip(void **state) {
        _cleanup_free_ char *path = NULL, *data = NULL, *error = NULL;
        _cleanup_(mig_journal_contents_freep) MigJournalContents *c = NULL;
        MigJournal *j = NULL;
        MigGpuState prev[2] = { layout(), { .index = 4, .mig_capable = true } };
        MigStep step = { .kind = MIG_STEP_CREATE_GI, .profile_id = 19, .start = 6, .size = 1 };
        char *dir;

        strcpy(prev[1].pci_address, "0000:87:00.0");
        path = tmp_path(&dir);
        assert_int_equal(mig_journal_begin(path, "my config", prev, 2, &j), 0);
        assert_int_equal(mig_journal_unit(j, "kubelet.service"), 0);
        assert_int_equal(mig_journal_step(j, "0000:4e:00.0", &step, 7, 0, 0), 0);
        assert_int_equal(mig_journal_gpu_end(j, "0000:4e:00.0", "done"), 0);
        j = mig_journal_free(j);

        assert_int_equal(read_full_file(path, 1 << 20, &data, NULL), 0);
        assert_string_equal(data,
                            "begin config=my%20config\n"
                            "gpu pci=0000:4e:00.0 index=3 mig=1 pending=1\n"
                            "gi pci=0000:4e:00.0 id=1 profile=9 start=0 size=4 cis=0:0,1:1\n"
                            "gi pci=0000:4e:00.0 id=5 profile=14 start=4 size=2 cis=\n"
                            "gpu pci=0000:87:00.0 index=4 mig=0 pending=0\n"
                            "unit name=kubelet.service\n"
                            "step pci=0000:4e:00.0 kind=create-gi enable=0 profile=19 start=6 size=1 gi=7 ci=0 rc=0\n"
                            "gpu-end pci=0000:4e:00.0 result=done\n");

        assert_int_equal(mig_journal_load(path, &c, &error), 0);
        assert_string_equal(c->config, "my config");
        assert_false(c->ended);
        assert_int_equal(c->n_steps, 1);
        assert_int_equal(c->n_previous, 2);
        assert_true(mig_state_layout_equal(&c->previous[0], &prev[0]));
        assert_int_equal(c->previous[0].index, 3);
        assert_int_equal(c->previous[0].gis[0].ci_profile_ids[1], 1);
        assert_false(c->previous[1].mig_current);
        assert_true(strv_equal(c->finished, (char *[]) { (char *) "0000:4e:00.0", NULL }));
        assert_true(strv_equal(c->units, (char *[]) { (char *) "kubelet.service", NULL }));
        rm_rf(dir);
}

static void test_end_removes(void **state) {
        _cleanup_free_ char *path = NULL;
        MigJournal *j = NULL;
        char *dir;

        path = tmp_path(&dir);
        assert_int_equal(mig_journal_begin(path, "all-balanced", NULL, 0, &j), 0);
        assert_int_equal(access(path, F_OK), 0);
        assert_int_equal(mig_journal_end(j, "success"), 0);
        j = mig_journal_free(j);
        assert_int_equal(access(path, F_OK), -1);
        assert_int_equal(mig_journal_load(path, &(MigJournalContents *) { NULL }, NULL), -ENOENT);
        assert_int_equal(mig_journal_remove(path), 0);
        rm_rf(dir);
}

static void test_torn_and_garbage(void **state) {
        _cleanup_free_ char *path = NULL, *error = NULL, *dir_state = NULL;
        _cleanup_(mig_journal_contents_freep) MigJournalContents *c = NULL;
        char *dir;

        path = tmp_path(&dir);
        dir_state = strprintf("%s/state", dir);
        assert_int_equal(mkdir_p(dir_state, 0755), 0);

        /* A crash while writing a line: the torn tail is not a record. */
        assert_int_equal(write_text(path, "begin config=x\ngpu pci=0000:01:00.0 index=0 mig=0 pending=0\nstep pci=00"), 0);
        assert_int_equal(mig_journal_load(path, &c, &error), 0);
        assert_int_equal(c->n_previous, 1);
        assert_int_equal(c->n_steps, 0);
        c = mig_journal_contents_free(c);

        assert_int_equal(write_text(path, "begin config=x\nhello world\n"), 0);
        assert_int_equal(mig_journal_load(path, &c, &error), -EBADMSG);
        _cleanup_free_ char *want = strprintf("%s:2: not a MIG journal record; remove the file if it is not from "
                                              "gpu-node-agent.", path);
        assert_string_equal(error, want);
        error = mfree(error);

        assert_int_equal(write_text(path, "gi pci=0000:01:00.0 id=1 profile=9 start=0 size=4 cis=\n"), 0);
        assert_int_equal(mig_journal_load(path, &c, &error), -EBADMSG); /* a GI of no journaled GPU */
        rm_rf(dir);
}

static void test_empty_is_no_crash(void **state) {
        /* A full disk leaves the journal empty, or with a torn begin record: nothing had been changed
         * (the begin record is on disk before any step), so it is removed, not reported as a crash. */
        _cleanup_free_ char *path = NULL, *error = NULL, *dir_state = NULL, *broken = NULL;
        _cleanup_(mig_journal_contents_freep) MigJournalContents *c = NULL;
        char *dir;

        path = tmp_path(&dir);
        dir_state = strprintf("%s/state", dir);
        broken = strprintf("%s.broken", path);
        assert_int_equal(mkdir_p(dir_state, 0755), 0);

        assert_int_equal(write_text(path, ""), 0);
        assert_int_equal(mig_journal_load(path, &c, &error), -ENOENT);
        assert_null(error);
        assert_int_equal(access(path, F_OK), -1);

        assert_int_equal(write_text(path, "begin conf"), 0);
        assert_int_equal(mig_journal_load(path, &c, &error), -ENOENT);
        assert_null(error);
        assert_int_equal(access(path, F_OK), -1);
        assert_int_equal(access(broken, F_OK), -1);
        rm_rf(dir);
}

static void test_halt_record(void **state) {
        _cleanup_free_ char *path = NULL, *error = NULL;
        _cleanup_(mig_journal_contents_freep) MigJournalContents *c = NULL;
        _cleanup_(mig_journal_freep) MigJournal *j = NULL;
        MigGpuState g = layout();
        char *dir;

        path = tmp_path(&dir);
        assert_int_equal(mig_journal_begin(path, "all-1g", &g, 1, &j), 0);
        assert_int_equal(mig_journal_halt(j, "0000:4e:00.0", "1g.10gb@0, 1g.10gb@1"), 0);
        j = mig_journal_free(j);
        assert_int_equal(mig_journal_load(path, &c, &error), 0);
        assert_false(c->ended);
        assert_int_equal(strv_length(c->halted), 1);
        assert_string_equal(c->halted[0], "0000:4e:00.0");
        assert_string_equal(c->halted_left, "1g.10gb@0, 1g.10gb@1");
        rm_rf(dir);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_roundtrip),
                cmocka_unit_test(test_end_removes),
                cmocka_unit_test(test_torn_and_garbage),
                cmocka_unit_test(test_empty_is_no_crash),
                cmocka_unit_test(test_halt_record),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
