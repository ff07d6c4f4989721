// SPDX-License-Identifier: MIT
/* Stand-in for nvidia.ko: the module the others depend on. It exports symbols its dependents use
 * (so the kernel records them as holders), takes NVreg_* parameters the test reads back from
 * /sys/module/nvidia/parameters, names GSP firmware like the real driver, and creates nothing. */
#include <linux/module.h>
#include <linux/moduleparam.h>

static int NVreg_DeviceFileMode = 0666;
module_param(NVreg_DeviceFileMode, int, 0444);
MODULE_PARM_DESC(NVreg_DeviceFileMode, "mode of /dev/nvidia* (stand-in)");

static int NVreg_EnableGpuFirmware = 18;
module_param(NVreg_EnableGpuFirmware, int, 0444);
MODULE_PARM_DESC(NVreg_EnableGpuFirmware, "GSP firmware policy (stand-in)");

static char *NVreg_RegistryDwords = "";
module_param(NVreg_RegistryDwords, charp, 0444);
MODULE_PARM_DESC(NVreg_RegistryDwords, "registry keys (stand-in)");

int nvidia_stand_in_get(void)
{
	return 0;
}
EXPORT_SYMBOL(nvidia_stand_in_get);

static int __init nvidia_stand_in_init(void)
{
	pr_info("nvidia stand-in: loaded, NVreg_DeviceFileMode=%d NVreg_EnableGpuFirmware=%d\n",
		NVreg_DeviceFileMode, NVreg_EnableGpuFirmware);
	return 0;
}

static void __exit nvidia_stand_in_exit(void)
{
	pr_info("nvidia stand-in: unloaded\n");
}

module_init(nvidia_stand_in_init);
module_exit(nvidia_stand_in_exit);
MODULE_LICENSE("Dual MIT/GPL");
MODULE_DESCRIPTION("gpu-node-agent test stand-in for nvidia.ko");
MODULE_VERSION("550.127.05");
MODULE_FIRMWARE("nvidia/550.127.05/gsp_ga10x.bin");
MODULE_FIRMWARE("nvidia/550.127.05/gsp_tu10x.bin");
