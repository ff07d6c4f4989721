/* SPDX-License-Identifier: MIT */
/* Owns the stage model: stage ids and states with their string tables and per-stage results. Below the
 * stages (node.h holds the results): the handlers and their table are in stage-table.h. */
#pragma once

#include <stdint.h>

#include "macro.h"

typedef enum StageId {
        STAGE_PROBE,
        STAGE_DRIVER,
        STAGE_DEVICES,
        STAGE_FABRIC,
        STAGE_NVML,
        STAGE_MIG,
        STAGE_CDI,
        STAGE_LABELS,
        STAGE_CONSUMERS,
        _STAGE_MAX,
        _STAGE_INVALID = -EINVAL,
} StageId;

typedef enum StageState {
        STAGE_PENDING,
        STAGE_RUNNING,
        STAGE_DONE,
        STAGE_SKIPPED,
        STAGE_FAILED,
        _STAGE_STATE_MAX,
        _STAGE_STATE_INVALID = -EINVAL,
} StageState;

typedef struct StageResult {
        StageState state;
        int error;               /* positive errno when failed, else 0 */
        char *message;           /* why skipped/failed, or what was done; may be NULL */
        uint64_t started_usec;   /* CLOCK_REALTIME of the last start, 0 never */
        uint64_t finished_usec;  /* CLOCK_REALTIME of the last finish, 0 while running/never */
        unsigned failures;       /* consecutive failures, drives the retry backoff */
} StageResult;

const char *stage_to_string(StageId id);
/* "<stage>-ready": the readiness file of a stage under <run>/gpu-node-agent/. NULL on OOM. */
char *stage_ready_file_name(StageId id);
StageId stage_from_string(const char *s);
const char *stage_state_to_string(StageState s);
StageState stage_state_from_string(const char *s);
