/* SPDX-License-Identifier: MIT */
/* Owns the agent side of the driver lifecycle that other parts of the agent share: the DKMS options
 * the config describes (the driver stage and --prepare-kernel use the same), and the driver stage's
 * teardown (the libkmod context is driver-modules.h's). The stage itself is stage_driver_run() in
 * stage-driver.c. */
#pragma once

#include "config.h"
#include "dkms.h"
#include "stage-table.h"
#include "module.h"

typedef struct ModuleLoadJob ModuleLoadJob;
typedef struct DriverStage DriverStage;

/* Fills *ret from the config's driver.dkms.* and paths (the strings point into c, which must outlive
 * the options). dkms_module "" means autoinstall. */
void driver_dkms_options(const Config *c, DkmsOptions *ret);

/* After `--prepare-kernel KVER`'s dkms run (whose exit 0 proves nothing: with no DKMS package
 * registered autoinstall builds nothing and exits 0): the core modules must be in
 * <paths.modules>/KVER's index, with a vermagic for KVER (module_check_vermagic()) and the version
 * driver.version (or driver.dkms.module's VERSION) names, when one is set. 0, or a negative errno with
 * a sentence naming what is missing. */
int driver_verify_built(const Config *c, const char *kver, char **ret_error);

/* A when-idle reload is taking the old driver out: our NVML processes are being stopped, or the modules
 * removed. No NVML process may start meanwhile (it would hold /dev/nvidia* and make the kernel refuse). */
bool driver_reload_in_flight(const Node *n);

/* Releases what the driver stage holds: cancels a DKMS build in flight (its process group is
 * killed), frees the module context, the Modules rows and DkmsState. Called from manager_free(). */
void stage_driver_done(Node *n);
