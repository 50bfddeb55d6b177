/* e2e_util.c: see e2e_util.h. */
#define _GNU_SOURCE
#include "e2e_util.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fm_frame.h"
#include "fm_msg.h"
#include "fm_proto.h"

void e2e_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

double e2e_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int e2e_setup(e2e_daemon *d, const char *exe) {
  memset(d, 0, sizeof *d);
  d->exe = exe;
  snprintf(d->dir, sizeof d->dir, "/tmp/fm-e2e-XXXXXX");
  if (!mkdtemp(d->dir)) return -1;
  snprintf(d->sock, sizeof d->sock, "%s/fusemld.sock", d->dir);
  snprintf(d->db, sizeof d->db, "%s/kernels.db", d->dir);
  snprintf(d->log, sizeof d->log, "%s/daemon.log", d->dir);
  return 0;
}

static pid_t spawn(e2e_daemon *d, const char *const *extra) {
  const char *argv[32];
  int n = 0;
  argv[n++] = d->exe;
  argv[n++] = "--foreground";
  argv[n++] = "--socket";
  argv[n++] = d->sock;
  argv[n++] = "--db";
  argv[n++] = d->db;
  argv[n++] = "--jobs";
  argv[n++] = "2";
  argv[n++] = "--log-level";
  argv[n++] = "debug";
  /* These tests are about the protocol and the daemon, so they want the same replies with or
   * without a GPU: no tuning (untuned, one compile), unless a test brings its own tuner. */
  int own_tuner = 0;
  for (int i = 0; extra && extra[i]; i++) own_tuner |= strcmp(extra[i], "--tuner-worker") == 0;
  if (!own_tuner) argv[n++] = "--no-tune";
  for (int i = 0; extra && extra[i] && n < 30; i++) argv[n++] = extra[i];
  argv[n] = NULL;
  pid_t pid = fork();
  if (pid != 0) return pid;
  /* Never outlive the test, whatever kills it. */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  int fd = open(d->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
  if (fd >= 0) {
    dup2(fd, STDERR_FILENO);
    dup2(fd, STDOUT_FILENO);
  }
  /* A user's own config must not leak into the test. */
  setenv("XDG_CONFIG_HOME", d->dir, 1);
  execv(d->exe, (char *const *)argv);
  _exit(127);
}

int e2e_start(e2e_daemon *d, const char *const *extra) {
  pid_t pid = spawn(d, extra);
  if (pid < 0) return -1;
  d->pid = pid;
  for (int waited = 0; waited < 20000; waited += 20) {
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) {
      d->pid = 0;
      return -1;
    }
    int fd = e2e_connect(d->sock);
    if (fd >= 0) {
      close(fd);
      return 0;
    }
    e2e_sleep_ms(20);
  }
  return -1;
}

int e2e_run(e2e_daemon *d, const char *const *extra, int timeout_ms) {
  pid_t pid = spawn(d, extra);
  if (pid < 0) return -1;
  for (int waited = 0; waited <= timeout_ms; waited += 10) {
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) return st;
    e2e_sleep_ms(10);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return -1;
}

int e2e_log_contains(const e2e_daemon *d, const char *text) {
  FILE *f = fopen(d->log, "r");
  char line[4096];
  int found = 0;
  while (f && !found && fgets(line, sizeof line, f)) found = strstr(line, text) != NULL;
  if (f) fclose(f);
  return found;
}

int e2e_stop(e2e_daemon *d, int sig, int timeout_ms) {
  if (!d->pid) return -1;
  kill(d->pid, sig);
  for (int waited = 0; waited <= timeout_ms; waited += 10) {
    int st;
    if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
      d->pid = 0;
      return st;
    }
    e2e_sleep_ms(10);
  }
  kill(d->pid, SIGKILL);
  waitpid(d->pid, NULL, 0);
  d->pid = 0;
  return -1;
}

void e2e_teardown(e2e_daemon *d, int dump_log) {
  if (d->pid) e2e_stop(d, SIGKILL, 5000);
  if (dump_log) {
    FILE *f = fopen(d->log, "r");
    if (f) {
      char line[4096];
      fprintf(stderr, "---- daemon log %s ----\n", d->log);
      while (fgets(line, sizeof line, f)) fputs(line, stderr);
      fclose(f);
    }
  }
  const char *names[] = {"fusemld.sock", "kernels.db",     "kernels.db-wal", "kernels.db-shm",
                         "daemon.log",   "activated.sock", "notify.sock"};
  char path[400];
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    snprintf(path, sizeof path, "%s/%s", d->dir, names[i]);
    unlink(path);
  }
  if (d->dir[0] && rmdir(d->dir) != 0) fprintf(stderr, "note: %s left behind: %s\n", d->dir, strerror(errno));
}

int e2e_connect(const char *sock) {
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  size_t n = strlen(sock);
  if (n >= sizeof sa.sun_path) return -1; /* the test's temp paths are short; refuse, never truncate */
  memcpy(sa.sun_path, sock, n + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int e2e_send_raw(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

int e2e_send_frame(int fd, const void *payload, size_t len) {
  uint8_t h[FM_FRAME_HEADER_BYTES];
  fm_frame_header(h, (uint32_t)len);
  if (e2e_send_raw(fd, h, sizeof h)) return -1;
  return e2e_send_raw(fd, payload, len);
}

/* Reads exactly n bytes: 0, -1 EOF/error, -2 timeout. */
static int read_full(int fd, uint8_t *p, size_t n, int timeout_ms) {
  while (n) {
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int r = poll(&pfd, 1, timeout_ms);
    if (r == 0) return -2;
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    ssize_t got = recv(fd, p, n, 0);
    if (got == 0) return -1;
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return -1;
    }
    p += got;
    n -= (size_t)got;
  }
  return 0;
}

int e2e_recv(int fd, int timeout_ms, msgpack_zone *zone, msgpack_object *obj) {
  uint8_t h[4];
  int r = read_full(fd, h, 4, timeout_ms);
  if (r) return r;
  uint32_t len = (uint32_t)h[0] << 24 | (uint32_t)h[1] << 16 | (uint32_t)h[2] << 8 | h[3];
  if (len == 0 || len > FM_FRAME_MAX_REPLY) return -3;
  uint8_t *buf = malloc(len);
  if (!buf) return -3;
  r = read_full(fd, buf, len, timeout_ms);
  if (r) {
    free(buf);
    return r;
  }
  /* msgpack objects point into the buffer: keep it alive in the zone's lifetime. */
  uint8_t *copy = msgpack_zone_malloc(zone, len);
  if (!copy) {
    free(buf);
    return -3;
  }
  memcpy(copy, buf, len);
  free(buf);
  fm_diag d;
  return fm_msg_unpack(copy, len, &fm_msg_reply_limits, zone, obj, &d) == FM_OK ? 0 : -3;
}

int e2e_wait_closed(int fd, int timeout_ms) {
  uint8_t buf[4096];
  for (;;) {
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int r = poll(&pfd, 1, timeout_ms);
    if (r <= 0) return 0;
    ssize_t got = recv(fd, buf, sizeof buf, 0);
    if (got <= 0) return 1;
  }
}

int e2e_main_start(e2e_daemon *d, int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PATH/TO/fusemld\n", argv[0]);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  if (e2e_setup(d, argv[1]) != 0 || e2e_start(d, NULL) != 0) {
    fprintf(stderr, "cannot start %s\n", argv[1]);
    e2e_teardown(d, 1);
    printf("0 passed, 1 failed\n");
    return 1;
  }
  return 0;
}

int e2e_restart(e2e_daemon *d, const char *const *extra) {
  if (d->pid) e2e_stop(d, SIGTERM, 30000);
  return e2e_start(d, extra);
}

long e2e_rss_kb(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%ld/status", (long)pid);
  FILE *f = fopen(path, "r");
  long kb = -1;
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, "VmRSS:", 6) == 0) kb = strtol(line + 6, NULL, 10);
  if (f) fclose(f);
  return kb;
}

void e2e_req_begin(e2e_req *r, const char *op, uint64_t id, uint32_t n_fields) {
  msgpack_sbuffer_init(&r->sb);
  msgpack_packer_init(&r->pk, &r->sb, msgpack_sbuffer_write);
  msgpack_pack_map(&r->pk, n_fields + 2);
  fm_pack_kv_cstr(&r->pk, "op", op);
  fm_pack_kv_u64(&r->pk, "id", id);
}

int e2e_req_send(e2e_req *r, int fd) {
  int rc = e2e_send_frame(fd, r->sb.data, r->sb.size);
  msgpack_sbuffer_destroy(&r->sb);
  return rc;
}

static void pack_tensor(msgpack_packer *pk, uint32_t id) {
  msgpack_pack_map(pk, 5);
  fm_pack_kv_u64(pk, "id", id);
  fm_pack_kv_cstr(pk, "dtype", "f32");
  fm_pack_cstr(pk, "shape");
  msgpack_pack_array(pk, 2);
  msgpack_pack_int64(pk, -1);
  msgpack_pack_int64(pk, 256);
  fm_pack_cstr(pk, "strides");
  msgpack_pack_array(pk, 2);
  msgpack_pack_int64(pk, 256);
  msgpack_pack_int64(pk, 1);
  fm_pack_kv_u64(pk, "align", 16);
}

static void pack_op(msgpack_packer *pk, const char *op, uint32_t out, int nargs, uint32_t a, uint32_t b, int has_value,
                    double value) {
  msgpack_pack_map(pk, has_value ? 4 : 3);
  fm_pack_kv_cstr(pk, "op", op);
  fm_pack_kv_u64(pk, "out", out);
  fm_pack_cstr(pk, "args");
  msgpack_pack_array(pk, (size_t)nargs);
  if (nargs > 0) msgpack_pack_uint32(pk, a);
  if (nargs > 1) msgpack_pack_uint32(pk, b);
  if (has_value) fm_pack_kv_f64(pk, "value", value);
}

/* A chain fragment up to its ops: {vocab 1, inputs [x = value 0], ops [const value 1 = c,
 * then n_ops more the caller packs]}; pack_chain_tail ends it with the output. */
static void pack_chain_head(msgpack_packer *pk, int n_ops, double c) {
  msgpack_pack_map(pk, 4);
  fm_pack_kv_u64(pk, "vocab", 1);
  fm_pack_cstr(pk, "inputs");
  msgpack_pack_array(pk, 1);
  pack_tensor(pk, 0);
  fm_pack_cstr(pk, "ops");
  msgpack_pack_array(pk, (size_t)n_ops + 1);
  pack_op(pk, "const", 1, 0, 0, 0, 1, c);
}

static void pack_chain_tail(msgpack_packer *pk, uint32_t out_value) {
  fm_pack_cstr(pk, "outputs");
  msgpack_pack_array(pk, 1);
  pack_tensor(pk, out_value);
}

void e2e_pack_fragment(msgpack_packer *pk, double salt, int n_ops) {
  static const char *const unary[] = {"tanh", "gelu", "sigmoid", "silu", "exp"};
  pack_chain_head(pk, n_ops, salt);
  uint32_t v = 0, next = 2;
  for (int i = 0; i < n_ops; i++, next++) {
    switch (i % 3) {
      case 0:
        pack_op(pk, "mul", next, 2, v, 1, 0, 0);
        break;
      case 1:
        pack_op(pk, unary[(i / 3) % 5], next, 1, v, 0, 0, 0);
        break;
      default:
        pack_op(pk, "add", next, 2, v, 0, 0, 0);
        break;
    }
    v = next;
  }
  pack_chain_tail(pk, v);
}

void e2e_pack_pow_chain(msgpack_packer *pk, double exponent, int n_pows) {
  pack_chain_head(pk, n_pows, exponent);
  uint32_t v = 0;
  for (int i = 0; i < n_pows; i++) {
    uint32_t out = (uint32_t)i + 2;
    pack_op(pk, "pow", out, 2, v, 1, 0, 0);
    v = out;
  }
  pack_chain_tail(pk, v);
}

int e2e_is_ok(const msgpack_object *o) {
  bool ok = false;
  return fm_msg_get_bool(o, "ok", &ok, NULL) == FM_OK && ok;
}

void e2e_str(const msgpack_object *o, const char *key, char *out, size_t cap) {
  if (fm_msg_copy_str(o, key, out, cap, NULL) != FM_OK && cap) out[0] = '\0';
}

int e2e_client(const char *sock) {
  int fd = e2e_connect(sock);
  if (fd >= 0 && e2e_hello(fd) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int e2e_hello(int fd) {
  e2e_req r;
  e2e_req_begin(&r, "hello", 1, 3);
  fm_pack_kv_u64(&r.pk, "proto", FM_PROTO_VERSION);
  fm_pack_kv_cstr(&r.pk, "client", "e2e");
  fm_pack_kv_u64(&r.pk, "pid", (uint64_t)getpid());
  if (e2e_req_send(&r, fd)) return -1;
  msgpack_zone z;
  msgpack_object o;
  msgpack_zone_init(&z, 4096);
  int rc = (e2e_recv(fd, 10000, &z, &o) == 0 && e2e_is_ok(&o)) ? 0 : -1;
  msgpack_zone_destroy(&z);
  return rc;
}

int e2e_connect_hello(const e2e_daemon *d) {
  int fd = e2e_connect(d->sock);
  if (fd >= 0 && e2e_hello(fd)) {
    close(fd);
    return -1;
  }
  return fd;
}

int e2e_compile(int fd, uint64_t id, double salt, int n_ops, char origin[16], char key[65]) {
  e2e_req r;
  e2e_req_begin(&r, "compile", id, 1);
  fm_pack_cstr(&r.pk, "fragment");
  e2e_pack_fragment(&r.pk, salt, n_ops);
  origin[0] = '\0';
  if (key) key[0] = '\0';
  if (e2e_req_send(&r, fd)) return -1;
  msgpack_zone z;
  msgpack_object o;
  msgpack_zone_init(&z, 65536);
  int rc = -1;
  if (e2e_recv(fd, 60000, &z, &o) == 0) {
    if (e2e_is_ok(&o)) {
      e2e_str(&o, "origin", origin, 16);
      if (key) e2e_str(&o, "key", key, 65);
      rc = 0;
    } else {
      e2e_str(&o, "code", origin, 16);
    }
  }
  msgpack_zone_destroy(&z);
  return rc;
}

int64_t e2e_stat(int fd, const char *section, const char *name) {
  e2e_req r;
  e2e_req_begin(&r, "stats", 77, 0);
  if (e2e_req_send(&r, fd)) return -1;
  msgpack_zone z;
  msgpack_object o;
  msgpack_zone_init(&z, 4096);
  int64_t v = -1;
  if (e2e_recv(fd, 10000, &z, &o) == 0 && e2e_is_ok(&o)) {
    const msgpack_object *m = section ? fm_msg_get(&o, section) : &o;
    if (m && fm_msg_get_i64(m, name, &v, NULL) != FM_OK) v = -1;
  }
  msgpack_zone_destroy(&z);
  return v;
}

int e2e_private_mounts(char *why, size_t cap) {
  if (geteuid() != 0) {
    uid_t uid = geteuid();
    gid_t gid = getegid();
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) {
      snprintf(why, cap, "unshare(CLONE_NEWUSER|CLONE_NEWNS): %s", strerror(errno));
      return -1;
    }
    char map[64];
    int fd = open("/proc/self/setgroups", O_WRONLY);
    if (fd >= 0) {
      (void)!write(fd, "deny", 4);
      close(fd);
    }
    const char *files[2] = {"/proc/self/uid_map", "/proc/self/gid_map"};
    unsigned ids[2] = {uid, gid};
    for (int i = 0; i < 2; i++) {
      int n = snprintf(map, sizeof map, "0 %u 1", ids[i]);
      fd = open(files[i], O_WRONLY);
      if (fd < 0 || write(fd, map, (size_t)n) != n) {
        snprintf(why, cap, "writing %s: %s", files[i], strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
      }
      close(fd);
    }
  } else if (unshare(CLONE_NEWNS) != 0) {
    snprintf(why, cap, "unshare(CLONE_NEWNS): %s", strerror(errno));
    return -1;
  }
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
    snprintf(why, cap, "making / private: %s", strerror(errno));
    return -1;
  }
  return 0;
}

int e2e_run_tool(const char *const *argv, const char *out_path, const char *err_path, int timeout_ms) {
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    const char *paths[2] = {out_path, err_path};
    for (int i = 0; i < 2; i++) {
      int fd = open(paths[i] ? paths[i] : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (fd >= 0) dup2(fd, i + 1);
    }
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  for (int waited = 0;; waited += 10) {
    int st;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) return st;
    if (r < 0 || waited >= timeout_ms) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -1;
    }
    e2e_sleep_ms(10);
  }
}

char *e2e_slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n + 4096 + 1 > cap) {
      cap = cap ? 2 * cap : 8192;
      char *nb = realloc(buf, cap);
      if (!nb) break;
      buf = nb;
    }
    size_t r = fread(buf + n, 1, cap - n - 1, f);
    if (r == 0) break;
    n += r;
  }
  fclose(f);
  if (buf) buf[n] = '\0';
  if (len) *len = n;
  return buf;
}
