/* SPDX-License-Identifier: MIT */
/* The MIG part of the org.gpunodeagent.Agent1.Manager interface (bus-mig.c): its properties and methods
 * are listed in bus-manager.c's vtable (one vtable per interface), implemented here. Internal to
 * agent/bus-*.c. */
#pragma once

#include <systemd/sd-bus.h>

#include "manager-bus.h"

/* An apply that failed (its GPUs were rolled back, or the rollback failed too), NVML unreadable. */
#define AGENT_ERROR_FAILED "org.gpunodeagent.Agent1.Error.Failed"

/* Makes m->node.mig (when the mig stage has not yet) and announces its MigConfig/MigConfigState changes.
 * Called when the bus is connected, before the first pass. */
int bus_mig_attach(Manager *m);

/* The ApplyMigConfig() call waiting for its apply to finish, kept with the bus side's state
 * (bus-util.c) so that it is released with the connection when the agent exits mid-apply. */
sd_bus_message **bus_mig_pending_request(Manager *m);

/* The unprivileged callers' budget of MIG reads (bus-util.c keeps it): true when one more fits into the
 * current window of window_usec (at most burst in it), else false with the wait until it ends. */
bool bus_mig_read_budget_take(Manager *m, uint64_t now, unsigned burst, uint64_t window_usec, uint64_t *ret_wait_usec);

int bus_mig_property_get_config(sd_bus *bus, const char *path, const char *interface, const char *property,
                                sd_bus_message *reply, void *userdata, sd_bus_error *error);
int bus_mig_property_get_config_state(sd_bus *bus, const char *path, const char *interface,
                                      const char *property, sd_bus_message *reply, void *userdata,
                                      sd_bus_error *error);
int bus_mig_method_apply(sd_bus_message *msg, void *userdata, sd_bus_error *error);
int bus_mig_method_assert(sd_bus_message *msg, void *userdata, sd_bus_error *error);
int bus_mig_method_export(sd_bus_message *msg, void *userdata, sd_bus_error *error);
