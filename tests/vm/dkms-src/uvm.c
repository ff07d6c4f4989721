// SPDX-License-Identifier: MIT
/* Stand-in for nvidia-uvm.ko: uses a symbol of nvidia, so the kernel loads it only after nvidia and
 * lists it in /sys/module/nvidia/holders. */
#include <linux/module.h>
#include <linux/moduleparam.h>

extern int nvidia_stand_in_get(void);

static int uvm_disable_hmm;
module_param(uvm_disable_hmm, int, 0444);
MODULE_PARM_DESC(uvm_disable_hmm, "disable HMM (stand-in)");

static int __init uvm_stand_in_init(void)
{
	int r = nvidia_stand_in_get();

	if (!r)
		pr_info("nvidia-uvm stand-in: loaded\n");
	return r;
}

static void __exit uvm_stand_in_exit(void)
{
	pr_info("nvidia-uvm stand-in: unloaded\n");
}

module_init(uvm_stand_in_init);
module_exit(uvm_stand_in_exit);
MODULE_LICENSE("Dual MIT/GPL");
MODULE_DESCRIPTION("gpu-node-agent test stand-in for nvidia-uvm.ko");
MODULE_VERSION("550.127.05");
