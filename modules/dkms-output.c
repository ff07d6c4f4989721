/* SPDX-License-Identifier: MIT */
/* Owns reading what dkms says: which module a run builds (from the options, the DKMS tree, or the
 * output), where its make.log is, a full disk, missing headers, autoinstall's per-module summary,
 * and the verdict and sentence made from that plus the exit code. No processes here (dkms.c). */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dkms-internal.h"
#include "fileio.h"
#include "macro.h"
#include "strv.h"

#define ENOSPC_TEXT "No space left on device"

void dkms_output_done(DkmsOutput *o) {
        free(o->dkms_dir);
        strv_free(o->registered);
        free(o->module);
        free(o->label);
        free(o->make_log);
        free(o->failed_name);
        free(o->read_only_path);
        for (size_t i = 0; i < DKMS_TAIL_LINES; i++)
                free(o->tail[i]);
        *o = (DkmsOutput) {};
}

int dkms_output_set_module(DkmsOutput *o, const char *name, size_t name_len, const char *version,
                           size_t version_len) {
        char *m = strprintf("%.*s/%.*s", (int) name_len, name, (int) version_len, version);
        char *label = strprintf("%.*s %.*s", (int) name_len, name, (int) version_len, version);

        if (!m || !label) {
                free(m);
                free(label);
                return -ENOMEM;
        }
        free(o->module);
        o->module = m;
        free(o->label);
        o->label = label;
        return 0;
}

int dkms_output_discover(DkmsOutput *o) {
        _cleanup_closedir_ DIR *d = opendir(o->dkms_dir);
        _cleanup_strv_free_ char **l = NULL;
        struct dirent *de;

        if (!d)
                return 0; /* no tree yet: dkms will say what it does */
        while ((de = readdir(d))) {
                _cleanup_free_ char *p = NULL;
                _cleanup_closedir_ DIR *vd = NULL;
                struct dirent *ve;

                if (de->d_name[0] == '.')
                        continue;
                p = path_join(o->dkms_dir, de->d_name);
                if (!p)
                        return -ENOMEM;
                vd = opendir(p);
                if (!vd)
                        continue; /* mok.key, mok.pub, … */
                while ((ve = readdir(vd))) {
                        _cleanup_free_ char *src = NULL;
                        struct stat st;

                        /* NAME/kernel-KVER-ARCH are the "installed" links, not versions. */
                        if (ve->d_name[0] == '.' || startswith(ve->d_name, "kernel-") ||
                            streq(ve->d_name, "original_module"))
                                continue;
                        src = strprintf("%s/%s/source", p, ve->d_name);
                        if (!src)
                                return -ENOMEM;
                        if (lstat(src, &st) < 0)
                                continue;
                        if (strv_extendf(&l, "%s %s", de->d_name, ve->d_name) < 0)
                                return -ENOMEM;
                }
        }
        strv_sort(l);

        if (l && !o->module) {
                if (strv_length(l) == 1) {
                        const char *sp = strchr(l[0], ' ');
                        if (dkms_output_set_module(o, l[0], sp - l[0], sp + 1, strlen(sp + 1)) < 0)
                                return -ENOMEM;
                } else if (!(o->label = strv_join(l, ", ")))
                        return -ENOMEM;
        }
        strv_free(o->registered);
        o->registered = TAKE_PTR(l);
        return 0;
}

/* The version of a registered module, for a name autoinstall's summary gave us. */
static const char *registered_version(DkmsOutput *o, const char *name) {
        size_t n = strlen(name);

        STRV_FOREACH(e, o->registered)
                if (strncmp(*e, name, n) == 0 && (*e)[n] == ' ')
                        return *e + n + 1;
        return NULL;
}

/* dkms 3.1+: "Autoinstall on 6.14.0-36-generic failed for module(s) nvidia(6)."
 * dkms 3.0:  "dkms autoinstall on 6.2.0-36-generic/x86_64 failed for rtl88x2bu(10) other(10)" */
static void observe_summary(DkmsOutput *o, const char *line) {
        const char *p = strstr(line, " failed for "), *open;
        size_t nl;

        if (!p || o->failed_name || !(startswith(line, "Autoinstall on ") || startswith(line, "dkms autoinstall on ")))
                return;
        p += strlen(" failed for ");
        if (startswith(p, "module(s) "))
                p += strlen("module(s) ");
        open = strchr(p, '(');
        nl = strcspn(p, " (");
        if (!open || p + nl != open || nl == 0)
                return;
        o->failed_name = strndup(p, nl);
        o->failed_code = atoi(open + 1);
        if (!o->failed_name)
                return;

        /* Name the module that failed, not the last one that was built. */
        const char *cur = o->module;
        if (!cur || strncmp(cur, o->failed_name, nl) != 0 || cur[nl] != '/') {
                const char *ver = registered_version(o, o->failed_name);
                if (ver)
                        (void) dkms_output_set_module(o, o->failed_name, nl, ver, strlen(ver));
                else {
                        free(o->module);
                        o->module = NULL;
                        free(o->label);
                        o->label = strdup(o->failed_name);
                }
        }
}

/* "rm: cannot remove '/var/lib/dkms/x/1/build': Read-only file system" or
 * "/usr/sbin/dkms: line 1079: /var/lib/dkms/x/1/build/make.log: Read-only file system": the path. */
static char *read_only_path(const char *line, const char *marker) {
        size_t n = marker - line;
        const char *start;

        if (n > 0 && line[n - 1] == '\'')
                n--;
        start = line + n;
        while (start > line && start[-1] != '\'' && !(start - line >= 2 && start[-1] == ' ' && start[-2] == ':'))
                start--;
        if (start >= line + n || *start != '/')
                return NULL;
        return strndup(start, line + n - start);
}

void dkms_output_observe(DkmsOutput *o, const char *line) {
        const char *p;

        free(o->tail[o->n_lines % DKMS_TAIL_LINES]);
        o->tail[o->n_lines % DKMS_TAIL_LINES] = strdup(line);
        o->n_lines++;

        if (strstr(line, ENOSPC_TEXT))
                o->saw_enospc = true;
        if ((strstr(line, "kernel headers for kernel") && strstr(line, "cannot be found")) ||
            strstr(line, "Please install the linux-headers-"))
                o->saw_headers = true;
        if (strstr(line, "Bad return status for module build"))
                o->saw_build_failed = true;
        if (strstr(line, "includes a BUILD_EXCLUSIVE directive"))
                o->saw_excluded = true;
        if ((p = strstr(line, ": Read-only file system")) && !o->read_only_path) {
                o->read_only_path = read_only_path(line, p);
                if (!o->read_only_path)
                        o->read_only_path = strdup("(a path dkms names)");
        }

        /* dkms 3.x: "Autoinstall of module nvidia-current/535.261.03 for kernel 6.1.0-57-amd64 (x86_64)" */
        if ((p = strstr(line, "Autoinstall of module "))) {
                const char *m = p + strlen("Autoinstall of module ");
                size_t ml = strcspn(m, " ");
                const char *slash = memchr(m, '/', ml);
                if (slash && slash > m && slash + 1 < m + ml)
                        (void) dkms_output_set_module(o, m, slash - m, slash + 1, m + ml - slash - 1);
        }

        /* "Consult /var/lib/dkms/nvidia-current/535.261.03/build/make.log for more information." */
        if ((p = strstr(line, "/build/make.log"))) {
                const char *start = p;
                while (start > line && start[-1] != ' ')
                        start--;
                free(o->make_log);
                o->make_log = strndup(start, p + strlen("/build/make.log") - start);

                /* …/<name>/<version>/build/make.log */
                const char *ve = p, *vs = ve;
                while (vs > start && vs[-1] != '/')
                        vs--;
                if (vs - 1 > start) {
                        const char *ne = vs - 1, *ns = ne;
                        while (ns > start && ns[-1] != '/')
                                ns--;
                        if (ns < ne && vs < ve && !o->module)
                                (void) dkms_output_set_module(o, ns, ne - ns, vs, ve - vs);
                }
        }

        observe_summary(o, line);
}

DkmsOutcome dkms_output_outcome(DkmsOutput *o, const DkmsVerdict *v) {
        int code = v->exit_status;

        if (v->cancelled)
                return DKMS_OUTCOME_CANCELLED;
        if (v->timed_out)
                return DKMS_OUTCOME_TIMED_OUT;
        if (v->status_run)
                return code == 0 && v->signal == 0 ? DKMS_OUTCOME_OK : DKMS_OUTCOME_FAILED;
        if (v->signal != 0 || code < 0)
                return DKMS_OUTCOME_FAILED;
        /* dkms's words first: a read-only tree is the cause of whatever failed after it, and dkms
         * 3.0 exits 0 when only the copy into /lib/modules hit it. */
        if (o->read_only_path)
                return DKMS_OUTCOME_READ_ONLY;
        if (code == 0)
                return DKMS_OUTCOME_OK;
        if (o->saw_enospc)
                return DKMS_OUTCOME_DISK_FULL;
        if (o->saw_headers || code == 21)
                return DKMS_OUTCOME_HEADERS_MISSING;
        if (o->saw_excluded)
                return DKMS_OUTCOME_EXCLUDED;
        if (o->saw_build_failed)
                return DKMS_OUTCOME_BUILD_FAILED;
        /* dkms 3.1's autoinstall summary gives each module's own code; 3.0's 11 alone says nothing. */
        if (code == 11 && o->failed_code > 0)
                code = o->failed_code;
        switch (code) {
        case 10:
                return DKMS_OUTCOME_BUILD_FAILED;
        case 7:
                return DKMS_OUTCOME_MODULE_MISSING;
        case 77:
                return DKMS_OUTCOME_EXCLUDED;
        default:
                return DKMS_OUTCOME_FAILED;
        }
}

static char *tail_text(DkmsOutput *o) {
        _cleanup_strv_free_ char **l = NULL;
        unsigned n = o->n_lines < DKMS_TAIL_LINES ? o->n_lines : DKMS_TAIL_LINES;

        for (unsigned i = o->n_lines - n; i < o->n_lines; i++)
                if (!isempty(o->tail[i % DKMS_TAIL_LINES]))
                        (void) strv_extend(&l, o->tail[i % DKMS_TAIL_LINES]);
        return l ? strv_join(l, " | ") : strdup("(no output)");
}

/* The make.log to point at: computed under our root for the known module (dkms prints the host
 * path, which under a test root or a relocated tree would mislead), else what dkms printed. */
static char *make_log_path(DkmsOutput *o) {
        if (o->module)
                return strprintf("%s/%s/build/make.log", o->dkms_dir, o->module);
        if (o->make_log)
                return strdup(o->make_log);
        return strprintf("%s/<module>/<version>/build/make.log", o->dkms_dir);
}

/* Last line of make.log that reads like a compiler error, and whether it mentions a full disk. */
static char *make_log_error(const char *path, bool *enospc) {
        _cleanup_free_ char *text = NULL;
        char *last = NULL;

        if (read_full_file(path, 16 * 1024 * 1024, &text, NULL) < 0)
                return NULL;
        if (strstr(text, ENOSPC_TEXT))
                *enospc = true;
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
                /* gcc's "error:"/"fatal error:", modpost's "ERROR:"; not make's "*** … Error 2". */
                if (strstr(line, "error:") || strstr(line, "ERROR:"))
                        last = line;
        if (!last)
                return NULL;
        last += strspn(last, " \t");
        return strndup(last, 300);
}

char *dkms_output_message(DkmsOutput *o, const DkmsVerdict *v, DkmsOutcome *outcome) {
        const char *what = o->label ?: "the DKMS modules", *kver = v->kver ?: "all kernels";
        _cleanup_free_ char *log = NULL, *err = NULL, *tail = NULL;
        char el[32];

        dkms_format_elapsed(el, sizeof el, v->elapsed_usec);

        switch (*outcome) {
        case DKMS_OUTCOME_OK:
                if (v->status_run)
                        return strprintf("dkms status for %s done.", kver);
                return strprintf("Built and installed %s for %s in %s.", what, kver, el);
        case DKMS_OUTCOME_BUILD_FAILED:
                log = make_log_path(o);
                err = log ? make_log_error(log, &o->saw_enospc) : NULL;
                if (o->saw_enospc) {
                        *outcome = DKMS_OUTCOME_DISK_FULL;
                        return dkms_output_message(o, v, outcome);
                }
                return strprintf("DKMS failed to build %s for %s; the compiler output is in %s%s%s%s",
                                 what, kver, strna(log), err ? " (last error: " : "", err ?: "",
                                 err ? ")" : "");
        case DKMS_OUTCOME_HEADERS_MISSING:
                return strprintf("DKMS cannot build %s for %s: the kernel headers are missing; install "
                                 "them with: apt-get install linux-headers-%s",
                                 what, kver, kver);
        case DKMS_OUTCOME_MODULE_MISSING:
                log = make_log_path(o);
                return strprintf("DKMS built %s for %s but the module file it names is missing (the "
                                 "build produced no .ko); see %s",
                                 what, kver, strna(log));
        case DKMS_OUTCOME_EXCLUDED:
                return strprintf("Kernel %s is excluded by the dkms.conf of %s (BUILD_EXCLUSIVE, e.g. a "
                                 "realtime kernel): the driver cannot be built for it; boot a supported "
                                 "kernel",
                                 kver, what);
        case DKMS_OUTCOME_DISK_FULL:
                log = make_log_path(o);
                return strprintf("DKMS failed to build %s for %s: no space left on device; free space "
                                 "under /var/lib/dkms, /usr/src and /lib/modules and retry (see %s)",
                                 what, kver, strna(log));
        case DKMS_OUTCOME_READ_ONLY:
                return strprintf("DKMS cannot build %s for %s: it could not write %s (read-only file system%s). "
                                 "dkms needs write access to /var/lib/dkms and /lib/modules/%s; when it runs under a "
                                 "service sandbox (ProtectSystem=strict), allow them with ReadWritePaths=, or run "
                                 "the build outside it: gpu-node-agent --prepare-kernel %s",
                                 what, kver, o->read_only_path, v->exit_status == 0 ? ", although dkms exited 0" : "",
                                 kver, kver);
        case DKMS_OUTCOME_TIMED_OUT:
                dkms_format_elapsed(el, sizeof el, v->timeout_usec);
                return strprintf("dkms %s for %s timed out after %s; its process group was killed",
                                 v->status_run ? "status" : "build", kver, el);
        case DKMS_OUTCOME_CANCELLED:
                return strprintf("dkms for %s was cancelled", kver);
        case DKMS_OUTCOME_FAILED:
                tail = tail_text(o);
                if (v->signal > 0)
                        return strprintf("dkms was killed by signal SIG%s: last lines: %s",
                                         sigabbrev_np(v->signal) ?: "?", strna(tail));
                if (v->exit_status == 11 && o->failed_name)
                        return strprintf("dkms exited 11 (%s failed with %i): last lines: %s", o->failed_name,
                                         o->failed_code, strna(tail));
                return strprintf("dkms exited %i: last lines: %s", v->exit_status, strna(tail));
        case _DKMS_OUTCOME_MAX:
        case _DKMS_OUTCOME_INVALID:
                break;
        }
        return NULL;
}
