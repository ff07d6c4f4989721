// SPDX-License-Identifier: MIT
/* Stand-in for nvidia-modeset.ko: like the real one, it needs nvidia. */
#include <linux/module.h>

extern int nvidia_stand_in_get(void);

static int __init modeset_stand_in_init(void)
{
	int r = nvidia_stand_in_get();

	if (!r)
		pr_info("nvidia-modeset stand-in: loaded\n");
	return r;
}

static void __exit modeset_stand_in_exit(void)
{
	pr_info("nvidia-modeset stand-in: unloaded\n");
}

module_init(modeset_stand_in_init);
module_exit(modeset_stand_in_exit);
MODULE_LICENSE("Dual MIT/GPL");
MODULE_DESCRIPTION("gpu-node-agent test stand-in for nvidia-modeset.ko");
MODULE_VERSION("550.127.05");
