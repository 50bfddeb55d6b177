/* e2e_remote_network.c: a --remote daemon in a sandbox that keeps it off the network says so
 * at startup, naming the drop-in (docs/REMOTE.md, "systemd"), and serves on from its local
 * store. The sandboxes are those systemd/fusemld.service asks for, made the way systemd makes
 * them: RestrictAddressFamilies=AF_UNIX is a seccomp filter failing socket(AF_INET/AF_INET6)
 * with EAFNOSUPPORT; PrivateNetwork=yes is a network namespace of its own (loopback only).
 * Each runs in a child of this test, which then starts the daemon. No Redis needed: the
 * host is never reached. argv: fusemld. Skips (77) where fusemld has no hiredis. */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "e2e_util.h"
#include "fm_test.h"

#define SKIP    77
#define DROP_IN "fusemld-remote.conf"

#if defined(__x86_64__)
#define THIS_AUDIT_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define THIS_AUDIT_ARCH AUDIT_ARCH_AARCH64
#endif

static const char *fusemld;
static char secret[320];

/* RestrictAddressFamilies=AF_UNIX, as systemd installs it (for the families that matter here). */
static int restrict_address_families(char *why, size_t cap) {
#ifdef THIS_AUDIT_ARCH
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, THIS_AUDIT_ARCH, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_socket, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])), /* the family */
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_INET, 2, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_INET6, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EAFNOSUPPORT),
  };
  struct sock_fprog prog = {.len = sizeof f / sizeof f[0], .filter = f};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
    snprintf(why, cap, "seccomp: %s", strerror(errno));
    return -1;
  }
  return 0;
#else
  snprintf(why, cap, "no seccomp filter written for this architecture");
  return -1;
#endif
}

/* PrivateNetwork=yes: a network namespace of our own (in a user namespace when not root),
 * its loopback brought up as systemd does. */
static int private_network(char *why, size_t cap) {
  if (e2e_private_mounts(why, cap)) return -1;
  if (unshare(CLONE_NEWNET) != 0) {
    snprintf(why, cap, "unshare(CLONE_NEWNET): %s", strerror(errno));
    return -1;
  }
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  int ok =
      fd >= 0 && ioctl(fd, SIOCGIFFLAGS, &ifr) == 0 && (ifr.ifr_flags |= IFF_UP, ioctl(fd, SIOCSIFFLAGS, &ifr) == 0);
  if (!ok) snprintf(why, cap, "bringing lo up: %s", strerror(errno));
  if (fd >= 0) close(fd);
  return ok ? 0 : -1;
}

/* Starts a daemon for url in the current process's sandbox; checks what it logged at startup
 * (expect: the text of the report, or NULL for none), that it still compiles, and, when
 * reported, that the failed lookup's line names the drop-in too. */
static void check_daemon(const char *url, const char *expect) {
  e2e_daemon d;
  char origin[16], key[65];
  const char *args[] = {"--remote", url, "--remote-secret-file", secret, "--arch", "sm_90a", NULL};
  CHECK_EQ_INT(e2e_setup(&d, fusemld), 0);
  if (e2e_start(&d, args) != 0) {
    int no_tier = e2e_log_contains(&d, "built without hiredis");
    e2e_teardown(&d, !no_tier);
    if (no_tier) _exit(SKIP);
    CHECK(0);
    return;
  }
  int fd = e2e_connect_hello(&d);
  CHECK_EQ_INT(e2e_compile(fd, 1, 1.0, 2, origin, key), 0);
  CHECK(strcmp(origin, "compiled") == 0);
  close(fd);
  if (expect) {
    CHECK(e2e_log_contains(&d, expect));
    CHECK(e2e_log_contains(&d, DROP_IN));
    CHECK(e2e_log_contains(&d, "unreachable") && e2e_log_contains(&d, "retrying every 1000 ms; if fusemld runs"));
  } else {
    CHECK(!e2e_log_contains(&d, DROP_IN));
  }
  e2e_teardown(&d, fm_test_failed_checks_ > 0);
}

static void sandboxed_restrict_families(void) {
  check_daemon("redis://127.0.0.1:1/0", "may not open IPv4 sockets (Address family not supported");
  check_daemon("redis://[::1]:1/0", "may not open IPv6 sockets");
}

static void sandboxed_private_network(void) {
  check_daemon("redis://192.0.2.1:6379/0", "sees no network interface but loopback");
  check_daemon("redis://127.0.0.1:1/0", NULL); /* loopback is still there: nothing to report */
}

static void unconfined(void) { check_daemon("redis://127.0.0.1:1/0", NULL); }

static int skipped;

/* Runs body in a child confined by confine (NULL: none) and reports it as one test. */
static void run_in_child(const char *name, int (*confine)(char *, size_t), void (*body)(void)) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    char why[256];
    if (confine && confine(why, sizeof why)) {
      printf("skip %s: cannot make the sandbox here (%s)\n", name, why);
      _exit(SKIP);
    }
    body();
    _exit(fm_test_failed_checks_ ? 1 : 0);
  }
  int st = 0;
  int rc = pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) ? WEXITSTATUS(st) : 1;
  if (rc == SKIP) {
    skipped++;
    return;
  }
  if (rc)
    fm_test_failed_++;
  else
    fm_test_passed_++;
  printf("%s %s\n", rc ? "FAIL" : "ok  ", name);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: e2e_remote_network FUSEMLD\n");
    return 2;
  }
  fusemld = argv[1];
  signal(SIGPIPE, SIG_IGN);
  snprintf(secret, sizeof secret, "/tmp/fm-e2e-netsecret-%ld", (long)getpid());
  FILE *f = fopen(secret, "w");
  if (!f) return 1;
  fputs("the cluster secret\n", f);
  fclose(f);
  run_in_child("unconfined", NULL, unconfined);
  run_in_child("restrict_address_families", restrict_address_families, sandboxed_restrict_families);
  run_in_child("private_network", private_network, sandboxed_private_network);
  unlink(secret);
  if (skipped == 3) return SKIP;
  return FM_TEST_DONE();
}
