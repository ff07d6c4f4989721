/* SPDX-License-Identifier: MIT */
/* Owns the libkmod child (module-child.h): the fork, the result over a socket as
 * "<r>\0<message>\0<name>\0…", and turning a timeout or a death into a sentence. */
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "module-child.h"
#include "spawn-child.h"
#include "strv.h"

struct ModuleChild {
        Node *node;
        Spawn *child;
        int fd;
        char *what;
        uint64_t timeout_usec;
        ModuleChildFunc fn;
        void *fn_userdata;
        ModuleChildDone done;
        void *userdata;
        void (*destroy)(void *userdata);
};

ModuleChild *module_child_free(ModuleChild *c) {
        if (!c)
                return NULL;
        spawn_free(c->child);
        if (c->destroy)
                c->destroy(c->userdata);
        if (c->fd >= 0)
                close(c->fd);
        free(c->what);
        return mfree(c);
}

int module_child_send(int fd, int r, const char *message, char **names) {
        _cleanup_free_ char *buf = NULL;
        size_t size = 0;
        FILE *f;

        f = open_memstream(&buf, &size);
        if (!f)
                return -ENOMEM;
        fprintf(f, "%d%c%s%c", r, 0, message ? message : "", 0);
        STRV_FOREACH(n, names)
                fprintf(f, "%s%c", *n, 0);
        if (fclose(f) != 0)
                return -ENOMEM;
        for (size_t off = 0; off < size;) {
                ssize_t k = write(fd, buf + off, size - off);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0)
                        return -EIO;
                off += (size_t) k;
        }
        return 0;
}

int module_child_receive(int fd, char **ret_message, char ***ret_names) {
        _cleanup_free_ char *buf = NULL;
        size_t len = 0, cap = 0;
        char *p, *end;
        int r;

        for (;;) {
                if (cap - len < 1024) {
                        char *n = realloc(buf, cap + 4096);
                        if (!n)
                                return -ENOMEM;
                        buf = n;
                        cap += 4096;
                }
                ssize_t k = read(fd, buf + len, cap - len - 1);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0)
                        break;
                len += (size_t) k;
        }
        if (!buf || len == 0 || buf[len - 1] != 0)
                return -EBADMSG;
        end = buf + len;
        r = (int) strtol(buf, NULL, 10);
        p = buf + strlen(buf) + 1;
        if (p >= end)
                return -EBADMSG;
        *ret_message = *p ? strdup(p) : NULL;
        for (p += strlen(p) + 1; p < end; p += strlen(p) + 1)
                if (strv_extend(ret_names, p) < 0)
                        return -ENOMEM;
        return r;
}

static int child_main(int fd, void *userdata) {
        ModuleChild *c = userdata;
        _cleanup_strv_free_ char **names = NULL;
        _cleanup_free_ char *message = NULL;
        int r;

        r = c->fn(c->node, c->fn_userdata, &message, &names);
        return module_child_send(fd, r, message, names) < 0 ? 2 : 0;
}

static void on_exit_child(Spawn *child, const SpawnResult *res, void *userdata) {
        ModuleChild *c = userdata;
        _cleanup_strv_free_ char **names = NULL;
        _cleanup_free_ char *message = NULL;
        int r;

        if (res->exit_status == 0) {
                r = module_child_receive(c->fd, &message, &names);
                if (r == -EBADMSG)
                        message = strprintf("The process %s sent no result.", c->what);
        } else {
                r = res->timed_out ? -ETIMEDOUT : -EIO;
                message = res->timed_out
                        ? strprintf("%c%s did not finish within %" PRIu64 " s%s (a GPU that does not answer?); it "
                                    "was abandoned.", c->what[0] >= 'a' && c->what[0] <= 'z' ? c->what[0] - 'a' + 'A'
                                    : c->what[0], c->what + 1, c->timeout_usec / USEC_PER_SEC,
                                    res->abandoned ? " and is stuck in the kernel" : "")
                        : strprintf("The process %s %s %d.", c->what,
                                    res->signal ? "died with signal" : "exited with status",
                                    res->signal ?: res->exit_status);
        }
        c->child = spawn_free(c->child);
        c->destroy = NULL; /* done owns userdata now */
        c->done(c->node, r, message, names, c->userdata);
        module_child_free(c);
}

int module_child_start(Node *n, sd_event *e, const char *what, uint64_t timeout_usec, ModuleChildFunc fn,
                       void *fn_userdata, ModuleChildDone done, void *userdata, void (*destroy)(void *userdata),
                       ModuleChild **ret) {
        ModuleChild *c;
        int sv[2], r;

        assert(n && e && what && *what && fn && done && ret);
        c = calloc(1, sizeof *c);
        if (!c)
                return -ENOMEM;
        *c = (ModuleChild) { .node = n, .fd = -1, .timeout_usec = timeout_usec, .fn = fn,
                             .fn_userdata = fn_userdata, .done = done, .userdata = userdata };
        /* destroy is set only once started: a failed start leaves userdata to the caller. */
        if (!(c->what = strdup(what))) {
                module_child_free(c);
                return -ENOMEM;
        }
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
                r = negative_errno();
                module_child_free(c);
                return r;
        }
        SpawnOptions o = {
                .timeout_usec = timeout_usec,
                .kill_grace_usec = USEC_PER_SEC,
                .on_exit = on_exit_child,
                .userdata = c,
        };
        r = spawn_fork(e, sv[1], child_main, c, &o, &c->child);
        close(sv[1]);
        c->fd = sv[0];
        if (r >= 0 && fcntl(c->fd, F_SETFL, O_NONBLOCK) < 0)
                r = negative_errno();
        if (r < 0) {
                module_child_free(c);
                return r;
        }
        c->destroy = destroy;
        *ret = c;
        return 0;
}
