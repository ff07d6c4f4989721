/* SPDX-License-Identifier: MIT */
/* Owns the "add or re-arm a one-shot timer" idiom over sd-event (as systemd's event_reset_time()):
 * the first call adds the source and names it, later calls move it and enable it again. */
#pragma once

#include <stdint.h>
#include <systemd/sd-event.h>
#include <time.h>

/* Arms *s to fire once at the absolute time usec on clock. Adds the source (with accuracy and
 * description) when *s is NULL, otherwise moves it and re-enables it (its accuracy is kept). */
int event_reset_time(sd_event *e, sd_event_source **s, clockid_t clock, uint64_t usec, uint64_t accuracy,
                     sd_event_time_handler_t callback, void *userdata, const char *description);

/* The same, usec from now. */
int event_reset_time_relative(sd_event *e, sd_event_source **s, clockid_t clock, uint64_t usec,
                              uint64_t accuracy, sd_event_time_handler_t callback, void *userdata,
                              const char *description);
