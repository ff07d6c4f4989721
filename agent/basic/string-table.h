/* SPDX-License-Identifier: MIT */
/* Owns the enum <-> name lookups over a `static const char *const table[]` indexed by the enum (as
 * systemd's DEFINE_STRING_TABLE_LOOKUP): an out-of-range value has no name (NULL), an unknown or NULL
 * name maps to the enum's invalid value. */
#pragma once

#include "macro.h"

#define DEFINE_STRING_TABLE_LOOKUP_TO_STRING(name, type, table, max)                    \
        const char *name##_to_string(type i) {                                          \
                if (i < 0 || i >= (max))                                                \
                        return NULL;                                                    \
                return (table)[i];                                                      \
        }

#define DEFINE_STRING_TABLE_LOOKUP_FROM_STRING(name, type, table, max, invalid)         \
        type name##_from_string(const char *s) {                                        \
                for (int i = 0; s && i < (max); i++)                                    \
                        if ((table)[i] && streq((table)[i], s))                         \
                                return (type) i;                                        \
                return (invalid);                                                       \
        }

#define DEFINE_STRING_TABLE_LOOKUP(name, type, table, max, invalid)                     \
        DEFINE_STRING_TABLE_LOOKUP_TO_STRING(name, type, table, max)                    \
        DEFINE_STRING_TABLE_LOOKUP_FROM_STRING(name, type, table, max, invalid)
