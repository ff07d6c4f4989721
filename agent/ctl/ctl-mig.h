/* SPDX-License-Identifier: MIT */
/* Owns `gpunodectl mig …`: show, apply, assert and export (ctl-mig.c). */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <systemd/sd-bus.h>

typedef struct CtlMigOptions {
        bool json;
        bool legend;
        const char *config_file;  /* --config as given; NULL = the agent's mig.config-file */
        bool force;               /* apply: even while GPUs of the plan run compute processes */
        bool no_block;            /* apply: return once the agent has accepted the apply */
        uint64_t timeout_usec;    /* apply: how long to wait for the agent's answer */
} CtlMigOptions;

/* CTL_EXIT_OK when args (what follows "mig") name a mig command with the right number of arguments and
 * the options set in o apply to it; otherwise prints why and returns CTL_EXIT_USAGE. */
int ctl_mig_check_args(char **args, const CtlMigOptions *o);

/* Runs the command checked with ctl_mig_check_args(). Returns an exit code (ctl-agent.h), having printed
 * what went wrong: mig apply 0 when the config was applied (also when a GPU waits for a reset, state
 * "rebooting"), mig assert 0 when the node matches and 1 when it does not. */
int ctl_mig(sd_bus *bus, char **args, const CtlMigOptions *o);
