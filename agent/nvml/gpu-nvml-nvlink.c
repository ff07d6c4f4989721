/* SPDX-License-Identifier: MIT */
/* Owns reading a GPU's NVLink topology from NVML into GpuInfo.nvlink_*: for each of the
 * NVML_NVLINK_MAX_LINKS links, whether it is active (nvmlDeviceGetNvLinkState) and the PCI address of
 * its far end (nvmlDeviceGetNvLinkRemotePciInfo_v2), a GPU or an NVSwitch; what Slurm's gpu/nvml plugin
 * asks to build Links= (agent/gres.c turns the addresses into that list).
 *
 * The topology changes only with a reset or a driver reload, so it is read once per GPU and cached with
 * the static facts (gpu_nvml_invalidate() forgets it). "No NVLink" is not an error: a missing entry point
 * or NOT_SUPPORTED on the first link (a PCIe GPU without a bridge, or a driver that does not say) leaves
 * nvlink_known false. Per link, INVALID_ARGUMENT means "no such link on this GPU" (fewer links than the
 * maximum) and NOT_SUPPORTED after the first means the links end there, as Slurm reads them. Any other
 * failure is a warning, and the topology is read again next time. */
#include "gpu-nvml-internal.h"
#include "strv.h"

/* As gpu-nvml-read.c's gpu_call_failed: NVML gone as a whole fails the read, anything else is a warning. */
static int nvlink_failed(GpuNvml *n, NvmlSnapshot *s, const char *address, int r) {
        if (r == -ENOMEM || r == -EBADFD || r == -ENODEV || r == -EPROTO)
                return r;
        return strv_extendf(&s->warnings, "GPU %s: %s; its NVLink topology is left unknown.", address,
                            gpu_nvml_last_error(n));
}

static void nvlink_forget(GpuNvmlCached *c) {
        c->nvlink_remotes = strv_free(c->nvlink_remotes);
        c->nvlink_known = false;
        c->facts &= ~GPU_FACT_NVLINK;
}

static int nvlink_read(GpuNvml *n, NvmlSnapshot *s, GpuNvmlCached *c) {
        _cleanup_strv_free_ char **remotes = NULL;
        bool known = false;
        int r;

        for (unsigned link = 0; link < NVML_NVLINK_MAX_LINKS; link++) {
                nvmlEnableState_t active = NVML_FEATURE_DISABLED;
                nvmlPciInfo_t pci = {};
                char address[32];

                r = gpu_nvml_device_get_nvlink_state(n, c->handle, link, &active);
                if (r == -EINVAL)
                        continue;
                if (r == -EOPNOTSUPP || r == -ENOSYS)
                        break;
                if (r < 0)
                        return nvlink_failed(n, s, c->pci_address, r);
                known = true;
                if (active != NVML_FEATURE_ENABLED)
                        continue;

                r = gpu_nvml_device_get_nvlink_remote_pci_info(n, c->handle, link, &pci);
                if (r < 0)
                        return nvlink_failed(n, s, c->pci_address, r);
                /* A far end NVML cannot name (an NVSwitch hidden from this OS) is no GPU: it adds nothing
                 * to Links=, so it is left out rather than guessed at. */
                if (gpu_nvml_normalize_bus_id(pci.busId, address) < 0)
                        continue;
                r = strv_extend(&remotes, address);
                if (r < 0)
                        return r;
        }

        nvlink_forget(c);
        c->nvlink_known = known;
        c->nvlink_remotes = TAKE_PTR(remotes);
        c->facts |= GPU_FACT_NVLINK;
        return 0;
}

int gpu_nvml_read_nvlinks(GpuNvml *n, NvmlSnapshot *s, GpuNvmlCached *c, GpuInfo *g) {
        int r;

        if (!(c->facts & GPU_FACT_NVLINK)) {
                r = nvlink_read(n, s, c);
                if (r < 0 || !(c->facts & GPU_FACT_NVLINK))
                        return r;
        }
        g->nvlink_known = c->nvlink_known;
        if (c->nvlink_remotes) {
                g->nvlink_remotes = strv_copy(c->nvlink_remotes);
                if (!g->nvlink_remotes)
                        return -ENOMEM;
        }
        return 0;
}
