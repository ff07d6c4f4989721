/* SPDX-License-Identifier: MIT */
/* Owns running libkmod work off the event loop: a function that inserts or removes modules runs in a
 * forked child (spawn_fork(): the daemon's libkmod context is in its memory at the fork, its own process
 * group, nothing of ours inherited but a socket, a timeout with SIGTERM→SIGKILL and a non-blocking reap),
 * and its result — a return value, a sentence and a list of module names — comes back to the loop. Used
 * for nvidia-peermem's optional insert (stage-driver.c) and Unload()'s removals (driver-unload.c):
 * finit_module()/delete_module() run the module's init or exit in the kernel, which for nvidia touches
 * every GPU, and a wedged GPU can keep either in the kernel for long. */
#pragma once

#include <stdint.h>
#include <systemd/sd-event.h>

/* Opaque here: the caller's Node (node.h), handed back to fn and done. */
typedef struct Node Node;

typedef struct ModuleChild ModuleChild;

/* In the child: the work. r < 0 with a sentence in *ret_message for a failure; *ret_names as it likes
 * (the modules it loaded or removed). */
typedef int (*ModuleChildFunc)(Node *n, void *userdata, char **ret_message, char ***ret_names);
/* On the loop, once: r, the message and the names the child sent; or, when it did not finish, -ETIMEDOUT
 * or -EIO with a sentence of ours ("… did not finish within 300 s and is stuck in the kernel"). The child
 * object is freed after this returns: forget the pointer here. */
typedef void (*ModuleChildDone)(Node *n, int r, const char *message, char **names, void *userdata);

/* e: the loop the child is watched on (the Node's event). what: for the messages ("removing the NVIDIA
 * modules"). destroy (may be NULL) frees userdata when the child is freed before done was called. */
int module_child_start(Node *n, sd_event *e, const char *what, uint64_t timeout_usec, ModuleChildFunc fn,
                       void *fn_userdata, ModuleChildDone done, void *userdata, void (*destroy)(void *userdata),
                       ModuleChild **ret);
/* The wire between a child and the loop, also for other forked libkmod work (the driver stage's inserts):
 * the child sends its return value, a sentence and names; the loop receives them (from the socket's
 * buffer once the child has exited) and gets the child's return value back, or -EBADMSG/-ENOMEM. */
int module_child_send(int fd, int r, const char *message, char **names);
int module_child_receive(int fd, char **ret_message, char ***ret_names);

/* Kills the child (no callback, userdata destroyed; the reap follows from the loop). NULL-safe. */
ModuleChild *module_child_free(ModuleChild *c);
