/* SPDX-License-Identifier: MIT */
/* Owns the string tables of stage ids and states. */
#include "stage.h"
#include "string-table.h"
#include "strv.h"

static const char *const stage_names[_STAGE_MAX] = {
        [STAGE_PROBE] = "probe",
        [STAGE_DRIVER] = "driver",
        [STAGE_DEVICES] = "devices",
        [STAGE_FABRIC] = "fabric",
        [STAGE_NVML] = "nvml",
        [STAGE_MIG] = "mig",
        [STAGE_CDI] = "cdi",
        [STAGE_LABELS] = "labels",
        [STAGE_CONSUMERS] = "consumers",
};

static const char *const stage_state_names[_STAGE_STATE_MAX] = {
        [STAGE_PENDING] = "pending",
        [STAGE_RUNNING] = "running",
        [STAGE_DONE] = "done",
        [STAGE_SKIPPED] = "skipped",
        [STAGE_FAILED] = "failed",
};

DEFINE_STRING_TABLE_LOOKUP(stage, StageId, stage_names, _STAGE_MAX, _STAGE_INVALID)
DEFINE_STRING_TABLE_LOOKUP(stage_state, StageState, stage_state_names, _STAGE_STATE_MAX, _STAGE_STATE_INVALID)

char *stage_ready_file_name(StageId id) {
        return strprintf("%s-ready", stage_to_string(id));
}
