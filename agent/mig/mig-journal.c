/* SPDX-License-Identifier: MIT */
/* Owns the MIG apply journal's file format, writing and reading (see mig-journal.h). */
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fileio.h"
#include "mig-journal.h"
#include "strv.h"

#define JOURNAL_MAX_SIZE (4u << 20)

struct MigJournal {
        char *path;
        int fd;
};

static bool plain_char(char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || strchr("._:+@/,-", c);
}

static char *escape(const char *s) {
        size_t n = strlen(s);
        char *e = malloc(n * 3 + 1), *p = e;

        if (!e)
                return NULL;
        for (const char *c = s; *c; c++)
                if (plain_char(*c))
                        *p++ = *c;
                else
                        p += sprintf(p, "%%%02X", (unsigned char) *c);
        *p = '\0';
        return e;
}

static int unescape(const char *s, char **ret) {
        char *u = malloc(strlen(s) + 1), *p = u;

        if (!u)
                return -ENOMEM;
        for (const char *c = s; *c; c++) {
                unsigned v;
                if (*c != '%') {
                        *p++ = *c;
                        continue;
                }
                if (sscanf(c + 1, "%2x", &v) != 1 || !c[1] || !c[2]) {
                        free(u);
                        return -EBADMSG;
                }
                *p++ = (char) v;
                c += 2;
        }
        *p = '\0';
        *ret = u;
        return 0;
}

static int write_line(MigJournal *j, const char *line) {
        size_t n = strlen(line), done = 0;

        while (done < n) {
                ssize_t k = write(j->fd, line + done, n - done);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return negative_errno();
                }
                done += (size_t) k;
        }
        if (fsync(j->fd) < 0)
                return negative_errno();
        return 0;
}

int mig_journal_append(MigJournal *j, const char *type, const char *fmt, ...) {
        _cleanup_free_ char *body = NULL, *line = NULL;
        va_list ap;
        int r;

        assert(j);
        va_start(ap, fmt);
        r = vasprintf(&body, fmt, ap);
        va_end(ap);
        if (r < 0)
                return -ENOMEM;
        line = strprintf("%s%s%s\n", type, *body ? " " : "", body);
        if (!line)
                return -ENOMEM;
        return write_line(j, line);
}

static int append_layout(MigJournal *j, const MigGpuState *g) {
        int r;

        r = mig_journal_append(j, "gpu", "pci=%s index=%u mig=%d pending=%d", g->pci_address, g->index,
                               g->mig_current, g->mig_pending);
        for (size_t i = 0; r >= 0 && i < g->n_gis; i++) {
                const MigGiState *gi = &g->gis[i];
                _cleanup_strv_free_ char **cis = NULL;
                _cleanup_free_ char *joined = NULL;

                for (size_t k = 0; k < gi->n_cis; k++)
                        if (strv_extendf(&cis, "%u:%u", gi->ci_ids[k], gi->ci_profile_ids[k]) < 0)
                                return -ENOMEM;
                joined = cis ? strv_join(cis, ",") : strdup("");
                if (!joined)
                        return -ENOMEM;
                r = mig_journal_append(j, "gi", "pci=%s id=%u profile=%u start=%u size=%u cis=%s", g->pci_address,
                                       gi->id, gi->profile_id, gi->start, gi->size, joined);
        }
        return r;
}

int mig_journal_begin(const char *path, const char *config, const MigGpuState *previous, size_t n_previous,
                      MigJournal **ret) {
        _cleanup_(mig_journal_freep) MigJournal *j = NULL;
        _cleanup_free_ char *dir = NULL, *name = NULL;
        char *slash;
        int r;

        j = calloc(1, sizeof *j);
        if (!j)
                return -ENOMEM;
        j->fd = -1;
        j->path = strdup(path);
        dir = strdup(path);
        name = escape(config ?: "");
        if (!j->path || !dir || !name)
                return -ENOMEM;
        slash = strrchr(dir, '/');
        if (slash && slash != dir) {
                *slash = '\0';
                r = mkdir_p(dir, 0755);
                if (r < 0)
                        return r;
        }

        j->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (j->fd < 0)
                return negative_errno();
        r = mig_journal_append(j, "begin", "config=%s", name);
        for (size_t i = 0; r >= 0 && i < n_previous; i++)
                r = append_layout(j, &previous[i]);
        if (r < 0) {
                /* Nothing was changed yet (a full disk, say): a half-written journal would only be mistaken
                 * for a crash at the next start. */
                (void) unlink(path);
                return r;
        }
        r = fsync_parent_dir(path);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(j);
        return 0;
}

int mig_journal_step(MigJournal *j, const char *pci_address, const MigStep *s, unsigned gi_id, unsigned ci_id, int r) {
        return mig_journal_append(j, "step", "pci=%s kind=%s enable=%u profile=%u start=%u size=%u gi=%u ci=%u rc=%d",
                                  pci_address, strna(mig_step_kind_to_string(s->kind)), s->enable, s->profile_id,
                                  s->start, s->size, gi_id, ci_id, r);
}

int mig_journal_unit(MigJournal *j, const char *unit) {
        _cleanup_free_ char *e = escape(unit);
        if (!e)
                return -ENOMEM;
        return mig_journal_append(j, "unit", "name=%s", e);
}

int mig_journal_halt(MigJournal *j, const char *pci_address, const char *left) {
        _cleanup_free_ char *e = escape(left ?: "");
        if (!e)
                return -ENOMEM;
        return mig_journal_append(j, "halt", "pci=%s left=%s", pci_address, e);
}

int mig_journal_gpu_end(MigJournal *j, const char *pci_address, const char *result) {
        return mig_journal_append(j, "gpu-end", "pci=%s result=%s", pci_address, result);
}

int mig_journal_end(MigJournal *j, const char *state) {
        int r;

        r = mig_journal_append(j, "end", "state=%s", state);
        if (r < 0)
                return r;
        return mig_journal_remove(j->path);
}

int mig_journal_reopen(MigJournal *j) {
        int fd;

        fd = open(j->path, O_WRONLY | O_APPEND | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
                return negative_errno();
        /* Only in a forked worker: the old number was closed there (closefrom) and may name another file
         * by now (the socket, the driver's), so it is forgotten, not closed. */
        j->fd = fd;
        return 0;
}

int mig_journal_open_append(const char *path, MigJournal **ret) {
        MigJournal *j = calloc(1, sizeof *j);

        if (!j || !(j->path = strdup(path))) {
                free(j);
                return -ENOMEM;
        }
        j->fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC | O_NOFOLLOW);
        if (j->fd < 0) {
                int r = negative_errno();
                free(j->path);
                free(j);
                return r;
        }
        *ret = j;
        return 0;
}

const char *mig_journal_path(const MigJournal *j) {
        return j ? j->path : NULL;
}

MigJournal *mig_journal_free(MigJournal *j) {
        if (!j)
                return NULL;
        if (j->fd >= 0)
                close(j->fd);
        free(j->path);
        return mfree(j);
}

int mig_journal_remove(const char *path) {
        if (unlink(path) < 0)
                return errno == ENOENT ? 0 : negative_errno();
        return fsync_parent_dir(path);
}

MigJournalContents *mig_journal_contents_free(MigJournalContents *c) {
        if (!c)
                return NULL;
        free(c->config);
        mig_gpu_states_free(c->previous, c->n_previous);
        strv_free(c->finished);
        strv_free(c->units);
        strv_free(c->halted);
        free(c->halted_left);
        free(c->end_state);
        return mfree(c);
}

/* ---- reading ---- */

typedef struct Fields {
        char *keys[16];
        char *values[16];
        size_t n;
} Fields;

static const char *field(const Fields *f, const char *key) {
        for (size_t i = 0; i < f->n; i++)
                if (streq(f->keys[i], key))
                        return f->values[i];
        return NULL;
}

static int field_uint(const Fields *f, const char *key, unsigned *ret) {
        const char *v = field(f, key);
        char *end;
        unsigned long u;

        if (!v || !*v)
                return -EBADMSG;
        errno = 0;
        u = strtoul(v, &end, 10);
        if (errno || *end || u > UINT32_MAX)
                return -EBADMSG;
        *ret = (unsigned) u;
        return 0;
}

static int parse_cis(const char *v, MigGiState *gi) {
        size_t n = 0;

        if (!v)
                return -EBADMSG;
        for (const char *c = v; *c; c++)
                n += *c == ',';
        n += *v ? 1 : 0;
        gi->ci_ids = calloc(n ?: 1, sizeof *gi->ci_ids);
        gi->ci_profile_ids = calloc(n ?: 1, sizeof *gi->ci_profile_ids);
        if (!gi->ci_ids || !gi->ci_profile_ids)
                return -ENOMEM;
        for (const char *c = v; *c;) {
                unsigned id, profile;
                int used = 0;

                if (sscanf(c, "%u:%u%n", &id, &profile, &used) != 2 || used == 0)
                        return -EBADMSG;
                gi->ci_ids[gi->n_cis] = id;
                gi->ci_profile_ids[gi->n_cis++] = profile;
                c += used;
                if (*c == ',')
                        c++;
                else if (*c)
                        return -EBADMSG;
        }
        return 0;
}

static int parse_line(MigJournalContents *c, char *line) {
        Fields f = {};
        char *type, *save = NULL;
        const char *pci;
        int r;

        type = strtok_r(line, " ", &save);
        if (!type)
                return 0;
        for (char *tok; (tok = strtok_r(NULL, " ", &save));) {
                char *eq = strchr(tok, '=');
                if (!eq || f.n >= ELEMENTSOF(f.keys))
                        return -EBADMSG;
                *eq = '\0';
                f.keys[f.n] = tok;
                f.values[f.n++] = eq + 1;
        }
        pci = field(&f, "pci");

        if (streq(type, "begin")) {
                if (!field(&f, "config"))
                        return -EBADMSG;
                free(c->config);
                c->config = NULL;
                return unescape(field(&f, "config"), &c->config);
        }
        if (streq(type, "gpu")) {
                MigGpuState *g;
                unsigned index, mig, pending;

                if (!pci || strlen(pci) >= sizeof g->pci_address || field_uint(&f, "index", &index) < 0 ||
                    field_uint(&f, "mig", &mig) < 0 || field_uint(&f, "pending", &pending) < 0)
                        return -EBADMSG;
                g = realloc(c->previous, (c->n_previous + 1) * sizeof *g);
                if (!g)
                        return -ENOMEM;
                c->previous = g;
                g = &c->previous[c->n_previous++];
                *g = (MigGpuState) { .index = index, .mig_capable = true, .mig_current = mig, .mig_pending = pending };
                strcpy(g->pci_address, pci);
                return 0;
        }
        if (streq(type, "gi")) {
                MigGpuState *g = NULL;
                MigGiState *gi;

                for (size_t i = 0; pci && i < c->n_previous; i++)
                        if (streq(c->previous[i].pci_address, pci))
                                g = &c->previous[i];
                if (!g)
                        return -EBADMSG;
                gi = realloc(g->gis, (g->n_gis + 1) * sizeof *gi);
                if (!gi)
                        return -ENOMEM;
                g->gis = gi;
                gi = &g->gis[g->n_gis++];
                *gi = (MigGiState) {};
                if (field_uint(&f, "id", &gi->id) < 0 || field_uint(&f, "profile", &gi->profile_id) < 0 ||
                    field_uint(&f, "start", &gi->start) < 0 || field_uint(&f, "size", &gi->size) < 0)
                        return -EBADMSG;
                return parse_cis(field(&f, "cis"), gi);
        }
        if (streq(type, "unit")) {
                char *u = NULL;
                if (!field(&f, "name"))
                        return -EBADMSG;
                r = unescape(field(&f, "name"), &u);
                if (r < 0)
                        return r;
                return strv_consume(&c->units, u);
        }
        if (streq(type, "step")) {
                c->n_steps++;
                return 0;
        }
        if (streq(type, "halt")) {
                if (!pci || !field(&f, "left"))
                        return -EBADMSG;
                free(c->halted_left);
                c->halted_left = NULL;
                r = unescape(field(&f, "left"), &c->halted_left);
                if (r < 0)
                        return r;
                return strv_extend(&c->halted, pci);
        }
        if (streq(type, "gpu-end"))
                return pci ? strv_extend(&c->finished, pci) : -EBADMSG;
        if (streq(type, "end")) {
                c->ended = true;
                free(c->end_state);
                c->end_state = strdup(strna(field(&f, "state")));
                return c->end_state ? 0 : -ENOMEM;
        }
        return -EBADMSG;
}

int mig_journal_load(const char *path, MigJournalContents **ret, char **ret_error) {
        _cleanup_(mig_journal_contents_freep) MigJournalContents *c = NULL;
        _cleanup_free_ char *data = NULL;
        size_t size = 0;
        unsigned line_no = 0;
        char *p;
        int r;

        r = read_full_file_at(AT_FDCWD, path, READ_FILE_NOFOLLOW, JOURNAL_MAX_SIZE, &data, &size);
        if (r == -ENOENT)
                return r;
        if (r < 0) {
                if (ret_error)
                        *ret_error = strprintf("Cannot read the MIG journal %s: %s.", path, strerror(-r));
                return r;
        }
        c = calloc(1, sizeof *c);
        if (!c)
                return -ENOMEM;

        p = data;
        for (;;) {
                char *nl = memchr(p, '\n', size - (size_t) (p - data));
                if (!nl)
                        break; /* a torn last line: the step it described did not happen or is re-read */
                *nl = '\0';
                line_no++;
                r = parse_line(c, p);
                if (r == -ENOMEM)
                        return r;
                if (r < 0) {
                        if (ret_error)
                                *ret_error = strprintf("%s:%u: not a MIG journal record; remove the file if it is "
                                                       "not from gpu-node-agent.", path, line_no);
                        return -EBADMSG;
                }
                p = nl + 1;
        }
        if (line_no == 0) {
                /* Not one whole record: the begin record itself did not make it to disk (a full disk, a
                 * crash while writing it), and nothing is changed before it is. Not a crash to recover. */
                (void) mig_journal_remove(path);
                return -ENOENT;
        }
        if (!c->config) {
                if (ret_error)
                        *ret_error = strprintf("%s: no begin record; remove the file if it is not from "
                                               "gpu-node-agent.", path);
                return -EBADMSG;
        }
        *ret = TAKE_PTR(c);
        return 0;
}
