/* SPDX-License-Identifier: MIT */
/* Owns the escaping helpers of escape.h. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "escape.h"
#include "macro.h"

/* Length of the valid UTF-8 sequence at p, 0 when p does not start one. */
static size_t utf8_sequence(const unsigned char *p) {
        uint32_t c;
        size_t n;

        if (p[0] < 0x80)
                return 1;
        if (p[0] >= 0xc2 && p[0] <= 0xdf)
                n = 2, c = p[0] & 0x1f;
        else if (p[0] >= 0xe0 && p[0] <= 0xef)
                n = 3, c = p[0] & 0x0f;
        else if (p[0] >= 0xf0 && p[0] <= 0xf4)
                n = 4, c = p[0] & 0x07;
        else
                return 0;
        for (size_t i = 1; i < n; i++) {
                if ((p[i] & 0xc0) != 0x80) /* also stops at the NUL */
                        return 0;
                c = (c << 6) | (p[i] & 0x3f);
        }
        if ((n == 3 && c < 0x800) || (n == 4 && (c < 0x10000 || c > 0x10ffff)) || (c >= 0xd800 && c <= 0xdfff))
                return 0;
        return n;
}

bool utf8_is_valid(const char *s) {
        for (const unsigned char *p = (const unsigned char *) s; *p;) {
                size_t n = utf8_sequence(p);
                if (n == 0)
                        return false;
                p += n;
        }
        return true;
}

char *utf8_make_valid(const char *s) {
        size_t len = strlen(s);
        char *out = malloc(len * 3 + 1), *o = out; /* each bad byte becomes 3 */

        if (!out)
                return NULL;
        for (const unsigned char *p = (const unsigned char *) s; *p;) {
                size_t n = utf8_sequence(p);
                if (n == 0) {
                        memcpy(o, "\xef\xbf\xbd", 3);
                        o += 3;
                        p++;
                        continue;
                }
                memcpy(o, p, n);
                o += n;
                p += n;
        }
        *o = '\0';
        return out;
}

static bool is_control(unsigned char c) {
        return c < 0x20 || c == 0x7f;
}

bool string_has_control(const char *s) {
        for (const unsigned char *p = (const unsigned char *) s; *p; p++)
                if (is_control(*p))
                        return true;
        return false;
}

void escape_control(const char *buf, char *out, size_t size) {
        size_t o = 0;

        for (const unsigned char *p = (const unsigned char *) buf; *p; p++) {
                char e[5];
                size_t n;

                if (!is_control(*p)) {
                        e[0] = (char) *p;
                        e[1] = '\0';
                } else if (*p == '\n')
                        memcpy(e, "\\n", 3);
                else if (*p == '\r')
                        memcpy(e, "\\r", 3);
                else if (*p == '\t')
                        memcpy(e, "\\t", 3);
                else
                        snprintf(e, sizeof e, "\\x%02x", *p);
                n = strlen(e);
                if (o + n >= size)
                        break;
                memcpy(out + o, e, n);
                o += n;
        }
        out[o] = '\0';
}

void string_clean(char *s) {
        for (unsigned char *p = (unsigned char *) s; *p;) {
                size_t n = is_control(*p) ? 0 : utf8_sequence(p);
                if (n == 0) {
                        *p++ = '?';
                        continue;
                }
                p += n;
        }
}

char *escape_message(const char *s) {
        size_t size = strlen(s) * 4 + 1; /* \xNN for every byte at most */
        _cleanup_free_ char *e = malloc(size);

        if (!e)
                return NULL;
        escape_control(s, e, size);
        return utf8_make_valid(e);
}
