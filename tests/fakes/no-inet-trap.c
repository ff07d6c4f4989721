/* SPDX-License-Identifier: MIT */
/* An LD_PRELOAD library that refuses IPv4 and IPv6 sockets with EAFNOSUPPORT, as systemd's
 * RestrictAddressFamilies=AF_UNIX AF_NETLINK does (seccomp answers EAFNOSUPPORT): the stock unit's
 * sandbox, for the test that the agent says which drop-in lets it reach its servers. */
#include <dlfcn.h>
#include <errno.h>
#include <sys/socket.h>

int socket(int domain, int type, int protocol) {
        static int (*real)(int, int, int);

        if (domain == AF_INET || domain == AF_INET6) {
                errno = EAFNOSUPPORT;
                return -1;
        }
        if (!real)
                real = (int (*)(int, int, int)) dlsym(RTLD_NEXT, "socket");
        return real(domain, type, protocol);
}
