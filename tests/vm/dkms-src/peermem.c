// SPDX-License-Identifier: MIT
/* Stand-in for nvidia-peermem.ko built against the InfiniBand stack: it registers an ib_core
 * client (upstream kernels export no ib_register_peer_memory_client; that is MOFED's) and uses a
 * symbol of nvidia, so depends= names both and both list it as a holder. */
#include <linux/module.h>
#include <rdma/ib_verbs.h>

extern int nvidia_stand_in_get(void);

static int peermem_add(struct ib_device *device)
{
	return 0;
}

static void peermem_remove(struct ib_device *device, void *client_data)
{
}

static struct ib_client peermem_client = {
	.name = "nvidia_peermem_stand_in",
	.add = peermem_add,
	.remove = peermem_remove,
};

static int __init peermem_stand_in_init(void)
{
	int r = nvidia_stand_in_get();

	if (r)
		return r;
	r = ib_register_client(&peermem_client);
	if (!r)
		pr_info("nvidia-peermem stand-in: loaded\n");
	return r;
}

static void __exit peermem_stand_in_exit(void)
{
	ib_unregister_client(&peermem_client);
	pr_info("nvidia-peermem stand-in: unloaded\n");
}

module_init(peermem_stand_in_init);
module_exit(peermem_stand_in_exit);
MODULE_LICENSE("Dual MIT/GPL");
MODULE_DESCRIPTION("gpu-node-agent test stand-in for nvidia-peermem.ko (with ib_core)");
MODULE_VERSION("550.127.05");
