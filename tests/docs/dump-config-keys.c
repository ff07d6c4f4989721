/* SPDX-License-Identifier: MIT */
/* Prints agent/config.c's key table (config_keys_dump()) for tests/docs/test-config-keys.py, which holds
 * the reference docs to it and regenerates their "remote" column from it. */
#include <stdio.h>

#include "config.h"

int main(void) {
        return config_keys_dump(stdout) < 0 ? 1 : 0;
}
