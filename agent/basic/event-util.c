/* SPDX-License-Identifier: MIT */
/* Owns the timer helpers of event-util.h. */
#include "event-util.h"

static int event_reset(sd_event *e, sd_event_source **s, clockid_t clock, uint64_t usec, uint64_t accuracy,
                       sd_event_time_handler_t callback, void *userdata, const char *description,
                       int relative) {
        int r;

        if (!*s) {
                r = relative ? sd_event_add_time_relative(e, s, clock, usec, accuracy, callback, userdata)
                             : sd_event_add_time(e, s, clock, usec, accuracy, callback, userdata);
                if (r < 0)
                        return r;
                if (description)
                        (void) sd_event_source_set_description(*s, description);
                return 0;
        }
        r = relative ? sd_event_source_set_time_relative(*s, usec) : sd_event_source_set_time(*s, usec);
        if (r < 0)
                return r;
        return sd_event_source_set_enabled(*s, SD_EVENT_ONESHOT);
}

int event_reset_time(sd_event *e, sd_event_source **s, clockid_t clock, uint64_t usec, uint64_t accuracy,
                     sd_event_time_handler_t callback, void *userdata, const char *description) {
        return event_reset(e, s, clock, usec, accuracy, callback, userdata, description, 0);
}

int event_reset_time_relative(sd_event *e, sd_event_source **s, clockid_t clock, uint64_t usec,
                              uint64_t accuracy, sd_event_time_handler_t callback, void *userdata,
                              const char *description) {
        return event_reset(e, s, clock, usec, accuracy, callback, userdata, description, 1);
}
