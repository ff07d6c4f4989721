/* SPDX-License-Identifier: MIT */
/* Owns `gpunodectl doctor` (ctl-doctor.c): a verdict per layer of the node, bottom up, with the fix. */
#pragma once

#include <stdbool.h>
#include <systemd/sd-bus.h>

/* Exit status of doctor: no finding, warnings only, a failed layer. */
enum {
        CTL_DOCTOR_OK = 0,
        CTL_DOCTOR_WARNINGS = 1,
        CTL_DOCTOR_FAILURES = 2,
};

typedef struct CtlDoctorOptions {
        bool json;
        bool legend;
        const char *root;         /* --root: the host root the agent's configuration resolves under */
        const char *config_file;  /* --agent-config: agent.yaml, NULL the default */
        const char *config_dir;   /* --agent-config-dir: a conf.d directory instead of the defaults */
        sd_bus *bus;              /* the system bus, NULL when unreachable (then the agent counts as not running) */
} CtlDoctorOptions;

/* Runs every check and prints the result; returns the exit status (CTL_DOCTOR_*). */
int ctl_doctor(const CtlDoctorOptions *o);
