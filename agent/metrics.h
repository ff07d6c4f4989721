/* SPDX-License-Identifier: MIT */
/* Owns the node_exporter textfile (metrics.textfile): DCGM exporter–compatible series where a DCGM field
 * exists (DCGM_FI_DEV_XID_ERRORS, ECC and remapped-row counters, with dcgm-exporter's labels gpu, UUID,
 * pci_bus_id, device, modelName, Hostname and, for MIG devices, GPU_I_PROFILE and GPU_I_ID) and our own
 * gpu_node_agent_* gauges and counters (node and stage state, stage durations, passes, health per GPU,
 * the event worker, MIG applies, the last DKMS build). Written atomically and only when the text
 * changed, after every pass and on every health change. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "macro.h"

struct Node;
typedef struct Metrics Metrics;

int metrics_new(Metrics **ret);
Metrics *metrics_free(Metrics *x);
DEFINE_CLEANUP_FUNC(Metrics *, metrics_free);

/* Writes v (NULL: empty) as a label value of the text exposition format: backslash, double quote and
 * newline escaped as \\, \" and \n, bytes that are not UTF-8 as U+FFFD. */
void metrics_put_label_value(FILE *f, const char *v);

/* Renders the textfile from m (NULL text on -ENOMEM). */
int metrics_format(const struct Node *n, char **ret);

/* Writes metrics.textfile when configured and the text changed. Logs a failure once per distinct
 * error; never fails the caller. */
void metrics_update(struct Node *n);

/* Counted for the gpu_node_agent_mig_* counters: an apply finished with state ("success", "rebooting",
 * "failed"), changed = the MIG devices changed. */
void metrics_count_mig_apply(struct Node *n, const char *state, bool changed);
/* A DKMS build started / ended (the gpu_node_agent_dkms_build_seconds gauge: the last build's time). */
void metrics_dkms_started(struct Node *n);
void metrics_dkms_finished(struct Node *n, bool ok);
