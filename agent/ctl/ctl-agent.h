/* SPDX-License-Identifier: MIT */
/* Owns gpunodectl's model of the agent: the Manager and Gpu properties as plain structs, the
 * parsers that fill them from GetAll() and GetManagedObjects() replies, and the exit codes D-Bus
 * errors turn into. Unknown properties are skipped, so a newer agent works with an older client. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <systemd/sd-bus.h>

/* Documented in --help and gpunodectl(1); scripts depend on them. */
enum {
        CTL_EXIT_OK = 0,
        CTL_EXIT_NOT_OK = 1,       /* the operation failed, or wait-ready timed out */
        CTL_EXIT_USAGE = 2,
        CTL_EXIT_UNREACHABLE = 3,  /* no system bus, or the agent is not running / not answering */
        CTL_EXIT_DENIED = 4,
};

typedef struct StageInfo {
        char *name, *state, *message;
        uint64_t started_usec, finished_usec;
} StageInfo;

/* One row of the Modules property. */
typedef struct CtlModule {
        char *name, *state, *detail;
} CtlModule;

typedef struct AgentStatus {
        char *version, *stage, *state, *kernel_release, *config_error;
        char *driver_version, *cuda_version;  /* "" or NULL: NVML unavailable / agent too old */
        char *dkms_state;                     /* NULL: agent too old */
        char *mig_config, *mig_config_state;  /* "" or NULL: MIG not managed / agent too old */
        char *health;                         /* "ok", "degraded: …", "failed: …"; NULL: agent too old */
        uint32_t unhealthy_gpus;
        int ready;
        uint32_t gpu_count;
        char **config_sources;
        StageInfo *stages;
        size_t n_stages;
        CtlModule *modules;
        size_t n_modules;
        int has_modules;                      /* the agent has the Modules property */
} AgentStatus;

typedef struct CtlMigDevice {
        char *uuid, *profile;
        uint32_t gi_id, ci_id;
} CtlMigDevice;

/* Named apart from the agent's own GpuInfo (gpu-nvml.h), which bus.h brings in. */
typedef struct CtlGpu {
        uint32_t index;
        char *pci_address, *name, *driver, *link_speed;
        uint16_t vendor_id, device_id, subsystem_vendor_id, subsystem_device_id;
        uint32_t class_code, link_width;
        int32_t numa_node, iommu_group;
        /* From NVML; "" / NULL / 0 when not known. */
        char *nvml_name, *uuid, *compute_capability, *mig_mode, *mig_mode_pending;
        char *health;                         /* "ok", "degraded: …", "failed: …"; NULL: agent too old */
        uint64_t memory_mib;
        CtlMigDevice *mig_devices;
        size_t n_mig_devices;
} CtlGpu;

void ctl_status_done(AgentStatus *s);
void ctl_gpu_done(CtlGpu *g);

/* Parses a GetAll(org.gpunodeagent.Agent1.Manager) reply (a{sv}) into *st. */
int ctl_parse_status(sd_bus_message *m, AgentStatus *st);

/* Prints what went wrong in words and returns the exit code for it. method is named in permission
 * errors ("Reload"), what gives the context for the rest ("Failed to read the agent status"). */
int ctl_bus_error_exit(const char *method, const char *what, const sd_bus_error *e, int r);

/* GetAll() of the Manager interface: CTL_EXIT_OK with *st filled, or the exit code (printed). */
int ctl_get_status(sd_bus *bus, AgentStatus *st);
/* Collects the org.gpunodeagent.Agent1.Gpu objects of a GetManagedObjects() reply, in reply order. */
int ctl_parse_gpus(sd_bus_message *m, CtlGpu **gpus, size_t *n);

/* Writes g's MIG devices as the JSON member "mig_devices": [{uuid, profile, gi_id, ci_id}, …] of the
 * object being written to f (first: that object's member state, as the ctl_json_kv_* helpers take). */
void ctl_json_mig_devices(FILE *f, bool *first, const CtlGpu *g);
