/* SPDX-License-Identifier: MIT */
/* Owns the stage table: order, handlers, dependencies. */
#include "stage-table.h"

#define DEP(s) (1u << (s))

/* Order of this table = order of a pass. The labels need only the probe: with the driver or NVML down
 * they still go out (PCI-only, degraded). CDI describes whatever exists, so a failed MIG apply does not
 * hold it back; it regenerates after the mig stage in the same pass. The consumers (Slurm, GPU Operator
 * validations, IMEX) depend on nothing: they must also see a broken driver, to withdraw driver-ready. */
static const StageDescriptor stage_table[_STAGE_MAX] = {
        { STAGE_PROBE, stage_probe_run, 0 },
        { STAGE_DRIVER, stage_driver_run, DEP(STAGE_PROBE) },
        { STAGE_DEVICES, stage_devices_run, DEP(STAGE_DRIVER) },
        { STAGE_FABRIC, stage_fabric_run, DEP(STAGE_DEVICES) },
        { STAGE_NVML, stage_nvml_run, DEP(STAGE_DRIVER) },
        { STAGE_MIG, stage_mig_run, DEP(STAGE_NVML) },
        { STAGE_CDI, stage_cdi_run, DEP(STAGE_NVML) },
        { STAGE_LABELS, stage_labels_run, DEP(STAGE_PROBE) },
        { STAGE_CONSUMERS, stage_consumers_run, 0 },
};

const StageDescriptor *stage_descriptor(StageId id) {
        if (id < 0 || id >= _STAGE_MAX)
                return NULL;
        return &stage_table[id];
}
