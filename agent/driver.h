/* SPDX-License-Identifier: MIT */
/* Owns the agent side of the driver lifecycle that other parts of the agent share: the Manager's
 * libkmod context (for the running kernel, under the configured root), the DKMS options the config
 * describes (the driver stage and --prepare-kernel use the same), and the driver stage's teardown.
 * The stage itself is stage_driver_run() in stage-driver.c. */
#pragma once

#include "config.h"
#include "dkms.h"
#include "manager.h"
#include "module.h"

/* The libkmod context for m->kernel_release: modules dir <paths.modules>/<kver>, modprobe.d from
 * <paths.etc>/modprobe.d, <root>/run/modprobe.d, <root>/lib/modprobe.d, <root>/usr/lib/modprobe.d (in
 * that priority), sysfs paths.sys, firmware <root>/lib/firmware; libkmod's log goes to ours at debug
 * level. Created on first use and kept in m->module_ctx (owned by the Manager: do not free it; it may
 * be replaced at the next pass, so do not keep the pointer across event-loop iterations). */
int manager_module_context(Manager *m, ModuleContext **ret);

typedef struct ModuleLoadJob ModuleLoadJob;

/* Fills *ret from the config's driver.dkms.* and paths (the strings point into c, which must outlive
 * the options). dkms_module "" means autoinstall. */
void driver_dkms_options(const Config *c, DkmsOptions *ret);

/* After `--prepare-kernel KVER`'s dkms run (whose exit 0 proves nothing: with no DKMS package
 * registered autoinstall builds nothing and exits 0): the core modules must be in
 * <paths.modules>/KVER's index, with a vermagic for KVER (module_check_vermagic()) and the version
 * driver.version (or driver.dkms.module's VERSION) names, when one is set. 0, or a negative errno with
 * a sentence naming what is missing. */
int driver_verify_built(const Config *c, const char *kver, char **ret_error);

/* Releases what the driver stage holds: cancels a DKMS build in flight (its process group is
 * killed), frees the module context, the Modules rows and DkmsState. Called from manager_free(). */
void manager_driver_done(Manager *m);
