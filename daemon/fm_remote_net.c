/* fm_remote_net.c: whether the sandbox lets the daemon reach Redis at all (fm_remote.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fm_remote.h"

/* The errors a systemd sandbox gives a process kept off the network. */
static const int denied_errnos[] = {EPERM, EACCES, EAFNOSUPPORT, ENETUNREACH};

int fm_remote_net_denied(const char *why) {
  for (size_t i = 0; i < sizeof denied_errnos / sizeof denied_errnos[0]; i++)
    if (strstr(why, strerror(denied_errnos[i]))) return 1;
  return 0;
}

static int is_loopback(const char *host, int family) {
  unsigned char a[16];
  if (strcmp(host, "localhost") == 0) return 1;
  if (family == AF_INET6) return inet_pton(AF_INET6, host, a) == 1 && memcmp(a, &in6addr_loopback, 16) == 0;
  return inet_pton(AF_INET, host, a) == 1 && a[0] == 127;
}

/* Whether some interface other than loopback is up with an address. Unknown (getifaddrs needs
 * AF_NETLINK, which a sandbox may forbid on its own) counts as yes: only a sure no is reported. */
static int has_network(void) {
  struct ifaddrs *ifs;
  int found = 0;
  if (getifaddrs(&ifs) != 0) return 1;
  for (struct ifaddrs *i = ifs; i && !found; i = i->ifa_next)
    found = i->ifa_addr && (i->ifa_addr->sa_family == AF_INET || i->ifa_addr->sa_family == AF_INET6) &&
            (i->ifa_flags & IFF_UP) && !(i->ifa_flags & IFF_LOOPBACK);
  freeifaddrs(ifs);
  return found;
}

int fm_remote_check_network(const char *host, fm_diag *d) {
  unsigned char a[16];
  /* hiredis tries IPv4 first for a name; an IPv6 literal needs IPv6. */
  int family = inet_pton(AF_INET6, host, a) == 1 ? AF_INET6 : AF_INET;
  int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    int e = errno;
    if (e != EAFNOSUPPORT && e != EPERM && e != EACCES) return FM_OK; /* not the sandbox: e.g. out of fds */
    return fm_diag_set(d, FM_EDENIED,
                       "remote %s: this process may not open %s sockets (%s), so Redis can never "
                       "be reached; %s",
                       host, family == AF_INET6 ? "IPv6" : "IPv4", strerror(e), FM_REMOTE_NET_HINT);
  }
  close(fd);
  if (!is_loopback(host, family) && !has_network())
    return fm_diag_set(d, FM_EDENIED,
                       "remote %s: this process sees no network interface but loopback (a private "
                       "network namespace?), so Redis can never be reached; %s",
                       host, FM_REMOTE_NET_HINT);
  return FM_OK;
}
