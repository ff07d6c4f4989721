/* SPDX-License-Identifier: MIT */
/* Owns the process-wide logger state (the one allowed file-scope global besides arg_*). */
#include <stdio.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <systemd/sd-journal.h>

#include "escape.h"
#include "log.h"
#include "strv.h"

static struct {
        int max_level;
        bool prefix;
        bool journal;
} logger = { .max_level = LOG_INFO };

static bool stderr_is_journal(void) {
        const char *e = getenv("JOURNAL_STREAM");
        unsigned long long dev, ino;
        struct stat st;

        if (!e || sscanf(e, "%llu:%llu", &dev, &ino) != 2)
                return false;
        if (fstat(STDERR_FILENO, &st) < 0)
                return false;
        return (unsigned long long) st.st_dev == dev && (unsigned long long) st.st_ino == ino;
}

void log_setup(LogTarget target) {
        const char *e = getenv("GPU_NODE_AGENT_LOG_LEVEL");

        logger.journal = stderr_is_journal();
        logger.prefix = target == LOG_TARGET_PREFIX || (target == LOG_TARGET_AUTO && logger.journal);
        if (e) {
                static const char *const names[] = { "emerg", "alert", "crit", "err",
                                                     "warning", "notice", "info", "debug" };
                for (size_t i = 0; i < ELEMENTSOF(names); i++)
                        if (streq(e, names[i]))
                                logger.max_level = (int) i;
        }
}

void log_set_max_level(int level) {
        logger.max_level = level;
}

int log_get_max_level(void) {
        return logger.max_level;
}

int log_internalv(int level, int error, const char *fmt, va_list ap) {
        int saved = errno;

        if (error < 0)
                error = -error;
        if (level <= logger.max_level) {
                if (error != 0)
                        errno = error; /* for %m */
                /* One write per line so that concurrent writers do not interleave mid-line. The message
                 * carries strings we did not write (NVML's names, file contents): its control characters
                 * are escaped, so that none can end the line and forge another one or its "<N>" prefix. */
                char msg[4096], buf[4096];
                vsnprintf(msg, sizeof msg, fmt, ap);
                escape_control(msg, buf, sizeof buf);
                if (logger.prefix)
                        fprintf(stderr, "<%d>%s\n", level, buf);
                else
                        fprintf(stderr, "%s\n", buf);
                fflush(stderr);
        }
        errno = saved;
        return -error;
}

int log_internal(int level, int error, const char *fmt, ...) {
        va_list ap;
        int r;

        va_start(ap, fmt);
        r = log_internalv(level, error, fmt, ap);
        va_end(ap);
        return r;
}

void log_struct(int level, const char *const *fields, const char *fmt, ...) {
        char msg[4096];
        va_list ap;

        if (level > logger.max_level)
                return;
        char raw[4096];
        va_start(ap, fmt);
        vsnprintf(raw, sizeof raw, fmt, ap);
        va_end(ap);
        escape_control(raw, msg, sizeof msg);

        if (!logger.journal) {
                log_internal(level, 0, "%s", msg);
                return;
        }

        /* Under systemd the journal gets one entry with the extra fields; stderr stays quiet so the
         * message is not recorded twice. */
        _cleanup_strv_free_ char **f = NULL;
        if (strv_extendf(&f, "MESSAGE=%s", msg) < 0 || strv_extendf(&f, "PRIORITY=%d", level) < 0 ||
            strv_extend(&f, "SYSLOG_IDENTIFIER=gpu-node-agent") < 0) {
                log_internal(level, 0, "%s", msg);
                return;
        }
        for (const char *const *i = fields; i && *i; i++)
                if (strv_extend(&f, *i) < 0)
                        break;

        size_t n = strv_length(f);
        struct iovec iov[n];
        for (size_t i = 0; i < n; i++)
                iov[i] = (struct iovec) { .iov_base = f[i], .iov_len = strlen(f[i]) };
        if (sd_journal_sendv(iov, (int) n) < 0)
                log_internal(level, 0, "%s", msg);
}
