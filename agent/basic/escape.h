/* SPDX-License-Identifier: MIT */
/* Owns the escaping of strings we did not write (NVML's names and UUIDs above all) on their way out of
 * the process: valid UTF-8 for D-Bus and Prometheus, no control characters in a log line. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

/* True when s is valid UTF-8 (no overlong forms, surrogates or code points above U+10FFFF). */
bool utf8_is_valid(const char *s);

/* A copy of s with every byte that is not part of a valid UTF-8 sequence replaced by U+FFFD.
 * NULL on OOM. */
char *utf8_make_valid(const char *s);

/* Escapes in place of the control characters (C0 and DEL) of buf: \n, \r, \t, else \xNN, so that
 * nothing in a message can start a second log line or a "<N>" priority prefix. The result is written to
 * out (size > 0), truncated to fit and always NUL-terminated. */
void escape_control(const char *buf, char *out, size_t size);

/* True when s has a C0 control character or DEL. */
bool string_has_control(const char *s);

/* Replaces, in place, every control character and every byte that is not part of a valid UTF-8
 * sequence by '?': for a short diagnostic from a library (nvmlErrorString) that goes into log lines
 * and D-Bus strings. */
void string_clean(char *s);

/* A copy of s fit to quote in a message that reaches logs and D-Bus: control characters escaped as
 * escape_control() does, bytes that are not UTF-8 as U+FFFD. NULL on OOM. */
char *escape_message(const char *s);
