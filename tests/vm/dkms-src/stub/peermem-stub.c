// SPDX-License-Identifier: MIT
/* Stand-in for the nvidia-peermem.ko NVIDIA's build produces when the InfiniBand stack (MOFED
 * peer-memory symbols) is missing: no ib_core dependency, and an init that always fails with
 * EINVAL, which is what a blind `modprobe nvidia-peermem` gets on such a system. */
#include <linux/module.h>

static int __init peermem_stub_init(void)
{
	pr_err("nvidia-peermem stand-in: built without InfiniBand support\n");
	return -EINVAL;
}

module_init(peermem_stub_init);
MODULE_LICENSE("Dual MIT/GPL");
MODULE_DESCRIPTION("gpu-node-agent test stand-in for the nvidia-peermem.ko stub");
MODULE_VERSION("550.127.05");
