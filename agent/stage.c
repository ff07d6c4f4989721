/* SPDX-License-Identifier: MIT */
/* Owns the stage table (order, handlers, dependencies) and the string tables of stage ids and states. */
#include "stage.h"

static const char *const stage_names[_STAGE_MAX] = {
        [STAGE_PROBE] = "probe",
        [STAGE_NVML] = "nvml",
        [STAGE_CDI] = "cdi",
        [STAGE_LABELS] = "labels",
};

static const char *const stage_state_names[_STAGE_STATE_MAX] = {
        [STAGE_PENDING] = "pending",
        [STAGE_RUNNING] = "running",
        [STAGE_DONE] = "done",
        [STAGE_SKIPPED] = "skipped",
        [STAGE_FAILED] = "failed",
};

/* Order of this table = order of a pass. */
static const StageDescriptor stage_table[_STAGE_MAX] = {
        { STAGE_PROBE, stage_probe_run, 0 },
        { STAGE_NVML, stage_nvml_run, 1u << STAGE_PROBE },
        { STAGE_CDI, stage_cdi_run, 1u << STAGE_NVML },
        { STAGE_LABELS, stage_labels_run, 1u << STAGE_PROBE },
};

const StageDescriptor *stage_descriptor(StageId id) {
        if (id < 0 || id >= _STAGE_MAX)
                return NULL;
        return &stage_table[id];
}

const char *stage_to_string(StageId id) {
        if (id < 0 || id >= _STAGE_MAX)
                return NULL;
        return stage_names[id];
}

StageId stage_from_string(const char *s) {
        for (int i = 0; s && i < _STAGE_MAX; i++)
                if (streq(stage_names[i], s))
                        return (StageId) i;
        return _STAGE_INVALID;
}

const char *stage_state_to_string(StageState s) {
        if (s < 0 || s >= _STAGE_STATE_MAX)
                return NULL;
        return stage_state_names[s];
}

StageState stage_state_from_string(const char *s) {
        for (int i = 0; s && i < _STAGE_STATE_MAX; i++)
                if (streq(stage_state_names[i], s))
                        return (StageState) i;
        return _STAGE_STATE_INVALID;
}
