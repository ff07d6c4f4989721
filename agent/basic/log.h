/* SPDX-License-Identifier: MIT */
/* Owns the logger: stderr lines, with "<N>" syslog priority prefixes when stderr is the journal (or
 * when asked), plus structured journal entries for notable events. */
#pragma once

#include <stdarg.h>
#include <syslog.h>

#include "macro.h"

typedef enum LogTarget {
        LOG_TARGET_AUTO,    /* prefixes when $JOURNAL_STREAM matches stderr */
        LOG_TARGET_PREFIX,  /* always "<N>" prefixes */
        LOG_TARGET_PLAIN,   /* never */
} LogTarget;

void log_setup(LogTarget target);
void log_set_max_level(int level);
int log_get_max_level(void);

/* Returns -abs(error) (or 0 when error is 0) so callers can "return log_error_errno(r, ...)". */
int log_internal(int level, int error, const char *fmt, ...) _printf_(3, 4);
int log_internalv(int level, int error, const char *fmt, va_list ap) _printf_(3, 0);

/* A notable event: the message on stderr, and when connected to the journal also an entry with the
 * given extra "FIELD=value" strings (NULL-terminated list). */
void log_struct(int level, const char *const *fields, const char *fmt, ...) _printf_(3, 4);

#define log_full_errno(level, error, ...)                                                          \
        ({                                                                                         \
                int _l_ = (level), _e_ = (error);                                                  \
                (log_get_max_level() >= _l_) ? log_internal(_l_, _e_, __VA_ARGS__)                 \
                                             : (_e_ > 0 ? -_e_ : _e_);                             \
        })
#define log_full(level, ...) (void) log_full_errno(level, 0, __VA_ARGS__)

#define log_debug(...) log_full(LOG_DEBUG, __VA_ARGS__)
#define log_info(...) log_full(LOG_INFO, __VA_ARGS__)
#define log_notice(...) log_full(LOG_NOTICE, __VA_ARGS__)
#define log_warning(...) log_full(LOG_WARNING, __VA_ARGS__)
#define log_error(...) log_full(LOG_ERR, __VA_ARGS__)
#define log_debug_errno(e, ...) log_full_errno(LOG_DEBUG, e, __VA_ARGS__)
#define log_info_errno(e, ...) log_full_errno(LOG_INFO, e, __VA_ARGS__)
#define log_warning_errno(e, ...) log_full_errno(LOG_WARNING, e, __VA_ARGS__)
#define log_error_errno(e, ...) log_full_errno(LOG_ERR, e, __VA_ARGS__)
#define log_oom() log_error_errno(ENOMEM, "Out of memory.")
