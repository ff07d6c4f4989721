/* SPDX-License-Identifier: MIT */
/* Owns the pure-text side of DKMS: `dkms status` parsing (dkms 3 and 2.x formats), the state and
 * outcome string tables, and elapsed-time formatting. The process side lives in dkms.c. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dkms.h"
#include "macro.h"
#include "string-table.h"
#include "strv.h"

static const char *const module_state_table[_DKMS_MODULE_STATE_MAX] = {
        [DKMS_MODULE_ADDED] = "added",
        [DKMS_MODULE_BUILT] = "built",
        [DKMS_MODULE_INSTALLED] = "installed",
        [DKMS_MODULE_BROKEN] = "broken",
};

DEFINE_STRING_TABLE_LOOKUP_TO_STRING(dkms_module_state, DkmsModuleState, module_state_table, _DKMS_MODULE_STATE_MAX)
static DEFINE_STRING_TABLE_LOOKUP_FROM_STRING(module_state_exact, DkmsModuleState, module_state_table,
                                              _DKMS_MODULE_STATE_MAX, _DKMS_MODULE_STATE_INVALID)

DkmsModuleState dkms_module_state_from_string(const char *s) {
        /* RHEL's weak-modules: the module of another kernel is usable as is. */
        if (streq_ptr(s, "installed-weak"))
                return DKMS_MODULE_INSTALLED;
        return module_state_exact_from_string(s);
}

static const char *const outcome_table[_DKMS_OUTCOME_MAX] = {
        [DKMS_OUTCOME_OK] = "ok",
        [DKMS_OUTCOME_BUILD_FAILED] = "build-failed",
        [DKMS_OUTCOME_HEADERS_MISSING] = "headers-missing",
        [DKMS_OUTCOME_MODULE_MISSING] = "module-missing",
        [DKMS_OUTCOME_EXCLUDED] = "excluded-kernel",
        [DKMS_OUTCOME_DISK_FULL] = "disk-full",
        [DKMS_OUTCOME_READ_ONLY] = "read-only",
        [DKMS_OUTCOME_TIMED_OUT] = "timed-out",
        [DKMS_OUTCOME_CANCELLED] = "cancelled",
        [DKMS_OUTCOME_FAILED] = "failed",
};

DEFINE_STRING_TABLE_LOOKUP(dkms_outcome, DkmsOutcome, outcome_table, _DKMS_OUTCOME_MAX, _DKMS_OUTCOME_INVALID)

int dkms_outcome_to_errno(DkmsOutcome o) {
        switch (o) {
        case DKMS_OUTCOME_OK:
                return 0;
        case DKMS_OUTCOME_BUILD_FAILED:
                return -EIO;
        case DKMS_OUTCOME_HEADERS_MISSING:
                return -ENOPKG;
        case DKMS_OUTCOME_MODULE_MISSING:
                return -ENOENT;
        case DKMS_OUTCOME_EXCLUDED:
                return -EOPNOTSUPP;
        case DKMS_OUTCOME_DISK_FULL:
                return -ENOSPC;
        case DKMS_OUTCOME_READ_ONLY:
                return -EROFS;
        case DKMS_OUTCOME_TIMED_OUT:
                return -ETIME;
        case DKMS_OUTCOME_CANCELLED:
                return -ECANCELED;
        case DKMS_OUTCOME_FAILED:
                return -EPROTO;
        case _DKMS_OUTCOME_MAX:
        case _DKMS_OUTCOME_INVALID:
                break;
        }
        return -EINVAL;
}

char *dkms_format_elapsed(char *buf, size_t size, uint64_t usec) {
        uint64_t s = usec / UINT64_C(1000000);

        if (usec > 0 && usec < UINT64_C(1000000))
                snprintf(buf, size, "%" PRIu64 "ms", usec / 1000);
        else if (s < 60)
                snprintf(buf, size, "%" PRIu64 "s", s);
        else if (s < 3600)
                snprintf(buf, size, "%" PRIu64 "m%02" PRIu64 "s", s / 60, s % 60);
        else
                snprintf(buf, size, "%" PRIu64 "h%02" PRIu64 "m%02" PRIu64 "s", s / 3600, s / 60 % 60,
                         s % 60);
        return buf;
}

static char *strndup_trim(const char *s, size_t n) {
        while (n > 0 && isspace((unsigned char) *s))
                s++, n--;
        while (n > 0 && isspace((unsigned char) s[n - 1]))
                n--;
        return strndup(s, n);
}

void dkms_module_list_free(DkmsModule *l, size_t n) {
        for (size_t i = 0; i < n; i++) {
                free(l[i].name);
                free(l[i].version);
                free(l[i].kernel);
                free(l[i].arch);
                free(l[i].note);
        }
        free(l);
}

/* Splits "a, b, c" into fields; at most max. Returns the count, or -ENOMEM, or -EINVAL when there
 * are more fields than max or an empty one. */
static int split_fields(const char *s, size_t len, char **fields, size_t max) {
        size_t n = 0;
        const char *end = s + len;

        for (const char *p = s; p <= end;) {
                const char *c = memchr(p, ',', end - p);
                const char *stop = c ?: end;

                if (n >= max)
                        return -EINVAL;
                fields[n] = strndup_trim(p, stop - p);
                if (!fields[n])
                        return -ENOMEM;
                if (isempty(fields[n++]))
                        return -EINVAL;
                if (!c)
                        break;
                p = c + 1;
        }
        return (int) n;
}

/* One status line into m; returns 1 when it is a status line, 0 when not, -ENOMEM. */
static int parse_status_line(const char *line, DkmsModule *m) {
        char *fields[4] = {};
        _cleanup_free_ char *state_word = NULL;
        const char *sep, *tail;
        int r, n;

        *m = (DkmsModule) { .state = _DKMS_MODULE_STATE_INVALID };

        /* Kernel releases, arches and module names never contain ": "; the state follows it. */
        sep = strstr(line, ": ");
        if (!sep)
                return 0;

        tail = sep + 2;
        tail += strspn(tail, " \t");
        size_t wl = strcspn(tail, " \t(");
        state_word = strndup(tail, wl);
        if (!state_word)
                return -ENOMEM;
        m->state = dkms_module_state_from_string(state_word);
        if (m->state < 0)
                return 0;

        n = split_fields(line, sep - line, fields, ELEMENTSOF(fields));
        if (n == -ENOMEM) {
                r = -ENOMEM;
                goto fail;
        }

        if (n > 0 && strchr(fields[0], '/')) {
                /* dkms 3: name/version[, kernel, arch] */
                char *slash = strchr(fields[0], '/');
                if (n != 1 && n != 3)
                        goto not_status;
                if (slash == fields[0] || isempty(slash + 1) || strchr(slash + 1, '/'))
                        goto not_status;
                m->name = strndup(fields[0], slash - fields[0]);
                m->version = strdup(slash + 1);
                if (n == 3) {
                        m->kernel = TAKE_PTR(fields[1]);
                        m->arch = TAKE_PTR(fields[2]);
                }
        } else if (n == 2 || n == 4) {
                /* dkms 2.x: name, version[, kernel, arch] */
                m->name = TAKE_PTR(fields[0]);
                m->version = TAKE_PTR(fields[1]);
                if (n == 4) {
                        m->kernel = TAKE_PTR(fields[2]);
                        m->arch = TAKE_PTR(fields[3]);
                }
        } else
                goto not_status;

        if (!m->name || !m->version) {
                r = -ENOMEM;
                goto fail;
        }
        /* Anything name-like must not contain blanks: guards against prose that happens to hold ": ". */
        if (strpbrk(m->name, " \t") || strpbrk(m->version, " \t") ||
            (m->kernel && strpbrk(m->kernel, " \t")) || (m->arch && strpbrk(m->arch, " \t")))
                goto not_status;

        const char *rest = tail + wl;
        rest += strspn(rest, " \t");
        if (*rest) {
                size_t rl = strlen(rest);
                if (*rest == '(' && rl >= 2 && rest[rl - 1] == ')')
                        m->note = strndup_trim(rest + 1, rl - 2);
                else
                        m->note = strndup_trim(rest, rl);
                if (!m->note) {
                        r = -ENOMEM;
                        goto fail;
                }
        }

        for (size_t i = 0; i < ELEMENTSOF(fields); i++)
                free(fields[i]);
        return 1;

not_status:
        r = 0;
fail:
        for (size_t i = 0; i < ELEMENTSOF(fields); i++)
                free(fields[i]);
        free(m->name);
        free(m->version);
        free(m->kernel);
        free(m->arch);
        free(m->note);
        *m = (DkmsModule) { .state = _DKMS_MODULE_STATE_INVALID };
        return r;
}

int dkms_status_parse(const char *text, DkmsModule **ret, size_t *ret_n) {
        DkmsModule *l = NULL;
        size_t n = 0;

        assert(ret);
        assert(ret_n);

        for (const char *p = text ?: ""; *p;) {
                size_t len = strcspn(p, "\n");
                _cleanup_free_ char *line = strndup(p, len);
                DkmsModule m;
                int r;

                if (!line)
                        goto oom;
                for (size_t k = strlen(line); k > 0 && isspace((unsigned char) line[k - 1]); k--)
                        line[k - 1] = 0;
                r = parse_status_line(line, &m);
                if (r < 0)
                        goto oom;
                if (r > 0) {
                        DkmsModule *nl = reallocarray(l, n + 1, sizeof(DkmsModule));
                        if (!nl) {
                                free(m.name), free(m.version), free(m.kernel), free(m.arch), free(m.note);
                                goto oom;
                        }
                        l = nl;
                        l[n++] = m;
                }
                p += len;
                if (*p == '\n')
                        p++;
        }

        *ret = l;
        *ret_n = n;
        return 0;

oom:
        dkms_module_list_free(l, n);
        return -ENOMEM;
}

const DkmsModule *dkms_module_find(const DkmsModule *l, size_t n, const char *name, const char *kernel) {
        for (size_t i = 0; i < n; i++) {
                if (!streq(l[i].name, name))
                        continue;
                if (kernel && !streq_ptr(l[i].kernel, kernel))
                        continue;
                return &l[i];
        }
        return NULL;
}
