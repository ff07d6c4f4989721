/* SPDX-License-Identifier: MIT */
/* Owns the fake NVML's NVLink entry points: nvmlDeviceGetNvLinkState and
 * nvmlDeviceGetNvLinkRemotePciInfo(_v2), from the node description's per-GPU "nvlink:" list (the far
 * end of each active link, a GPU or an NVSwitch, by PCI address). As on real hardware: a GPU without
 * "nvlink:" answers NOT_SUPPORTED; links past the listed ones are inactive (FEATURE_DISABLED) up to
 * NVML_NVLINK_MAX_LINKS, beyond which a link index is INVALID_ARGUMENT; a MIG device handle has no
 * NVLink (NOT_SUPPORTED). */
#include <stdio.h>

#include "fake-nvml.h"

FAKE_DECLARE(nvmlDeviceGetNvLinkState, gna_nvmlDeviceGetNvLinkState_fn);
FAKE_DECLARE(nvmlDeviceGetNvLinkRemotePciInfo_v2, gna_nvmlDeviceGetNvLinkRemotePciInfo_v2_fn);
FAKE_DECLARE(nvmlDeviceGetNvLinkRemotePciInfo, gna_nvmlDeviceGetNvLinkRemotePciInfo_v2_fn);

static nvmlReturn_t link_of(nvmlDevice_t device, unsigned link, const FakeGpu **ret) {
        const FakeGpu *g = fake_device(device, NULL);

        if (!g)
                return fake_mig_device(device, NULL) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
        if (!g->has_nvlink)
                return NVML_ERROR_NOT_SUPPORTED;
        if (link >= NVML_NVLINK_MAX_LINKS)
                return NVML_ERROR_INVALID_ARGUMENT;
        *ret = g;
        return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive) {
        const FakeGpu *g = NULL;
        nvmlReturn_t r;

        if (fake_enter(__func__, &r))
                return fake_leave(__func__, r);
        r = link_of(device, link, &g);
        if (r == NVML_SUCCESS && !isActive)
                r = NVML_ERROR_INVALID_ARGUMENT;
        if (r == NVML_SUCCESS)
                *isActive = link < g->n_nvlink ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
        return fake_leave(__func__, r);
}

static nvmlReturn_t remote_pci(nvmlDevice_t device, unsigned link, nvmlPciInfo_t *pci) {
        const FakeGpu *g = NULL;
        nvmlReturn_t r = link_of(device, link, &g);

        if (r != NVML_SUCCESS)
                return r;
        if (!pci)
                return NVML_ERROR_INVALID_ARGUMENT;
        if (link >= g->n_nvlink)
                return NVML_ERROR_NOT_FOUND; /* an inactive link has no far end */
        const FakeNvLink *l = &g->nvlink[link];
        *pci = (nvmlPciInfo_t) { .domain = l->domain, .bus = l->bus, .device = l->device };
        snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", l->domain, l->bus, l->device,
                 l->function);
        snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.%X", l->domain, l->bus, l->device, l->function);
        return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci) {
        nvmlReturn_t r;

        if (fake_enter(__func__, &r))
                return fake_leave(__func__, r);
        return fake_leave(__func__, remote_pci(device, link, pci));
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci) {
        nvmlReturn_t r;

        if (fake_enter(__func__, &r))
                return fake_leave(__func__, r);
        return fake_leave(__func__, remote_pci(device, link, pci));
}
