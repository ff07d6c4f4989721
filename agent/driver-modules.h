/* SPDX-License-Identifier: MIT */
/* Owns the Node's libkmod context for the running kernel, under the configured root: the driver stage
 * (stage-driver.c) and Unload() (driver-unload.c) share it. */
#pragma once

#include "module.h"
#include "node.h"

/* The libkmod context for n->kernel_release: modules dir <paths.modules>/<kver>, modprobe.d from
 * <paths.etc>/modprobe.d, <root>/run/modprobe.d, <root>/lib/modprobe.d, <root>/usr/lib/modprobe.d (in
 * that priority), sysfs paths.sys, firmware <root>/lib/firmware; libkmod's log goes to ours at debug
 * level. Created on first use and kept in n->module_ctx (owned by the Node: do not free it; it may
 * be replaced at the next pass, so do not keep the pointer across event-loop iterations). */
int driver_module_context(Node *n, ModuleContext **ret);
