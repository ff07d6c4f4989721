/* SPDX-License-Identifier: MIT */
/* Time limits of the unit tests that prove the event loop keeps its beat, scaled for a busy machine as
 * the integration tests' are (tests/integration/harness.py, timeout_scale()): GNA_TIMEOUT_SCALE (default
 * 1) times the 1-minute load average per CPU when that is above 1, at most 5. A limit scaled this way
 * must stay below the blocking it is there to catch: callers cap it (test_scaled_usec()'s cap). */
#pragma once

#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

static inline double test_load_scale(void) {
        double load[1] = { 0 }, scale = 1.0;
        const char *e = getenv("GNA_TIMEOUT_SCALE");
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);

        if (e && atof(e) > 0)
                scale = atof(e);
        if (getloadavg(load, 1) == 1 && ncpu > 0 && load[0] / (double) ncpu > 1.0)
                scale *= load[0] / (double) ncpu;
        return scale > 5.0 ? 5.0 : scale;
}

/* usec × test_load_scale(), never above cap. */
static inline uint64_t test_scaled_usec(uint64_t usec, uint64_t cap) {
        double v = (double) usec * test_load_scale();
        return v > (double) cap ? cap : (uint64_t) v;
}
