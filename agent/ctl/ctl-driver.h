/* SPDX-License-Identifier: MIT */
/* Owns `gpunodectl driver …`: status (kernel modules, DKMS, driver and kernel versions) and unload. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <systemd/sd-bus.h>

typedef struct CtlDriverOptions {
        bool json;
        bool legend;
        uint64_t timeout_usec;  /* unload: how long to wait for the agent's answer */
} CtlDriverOptions;

/* CTL_EXIT_OK when args (what follows "driver") name a driver command and nothing more; otherwise
 * prints why and returns CTL_EXIT_USAGE. */
int ctl_driver_check_args(char **args);

/* args: what follows "driver" on the command line ("status" or "unload"; none = status). Checked
 * with ctl_driver_check_args() first. Returns an exit code (ctl-agent.h), having printed what went
 * wrong. */
int ctl_driver(sd_bus *bus, char **args, const CtlDriverOptions *o);
