/* test_client_net.c: libfusemld's side of the protocol against a fake server in a thread:
 * connect failures and timeouts, hello, error replies mapped back to codes, id matching,
 * hang-ups, oversized replies, a full compile reply parsed into fm_compiled. (The real daemon
 * is exercised by the end-to-end tests; this pins down the client's framing on its own.) */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "fm_client.h"
#include "fm_frame.h"
#include "fm_msg.h"
#include "fm_proto.h"
#include "fm_test.h"

enum mode {
  SILENT,         /* accepts, reads, never answers */
  HELLO_ERROR,    /* answers hello, then an error reply */
  WRONG_ID,       /* answers hello, then a reply with another id */
  HANGUP,         /* answers hello, then closes */
  COMPILE_OK,     /* answers hello, then a compile reply */
  HUGE_REPLY,     /* answers hello, then announces a reply beyond FM_FRAME_MAX_REPLY */
  OLD_PROTO,      /* answers hello with a protocol we do not speak */
  BAD_HELLO_SLUG, /* answers hello with protocol_version as an error */
};

typedef struct server {
  char dir[32], path[64];
  int lfd;
  enum mode mode;
  pthread_t th;
  /* What the server saw, checked by the test after join. */
  int got_hello_ok; /* hello had op, id, proto, client, pid */
  char client_name[80];
  int got_fragment_ok; /* compile request carried the fragment map intact */
  uint64_t last_id;
} server;

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int read_full(int fd, void *buf, size_t n) {
  char *p = buf;
  while (n) {
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

static int write_full(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* One request frame, unpacked into zone (raw bytes kept alive by the zone too). */
static int srv_read(int fd, msgpack_zone *zone, msgpack_object *o) {
  uint8_t h[4];
  if (read_full(fd, h, 4)) return -1;
  uint32_t len = (uint32_t)h[0] << 24 | (uint32_t)h[1] << 16 | (uint32_t)h[2] << 8 | h[3];
  if (len > FM_FRAME_MAX_REQUEST) return -1;
  char *buf = msgpack_zone_malloc(zone, len);
  if (!buf || read_full(fd, buf, len)) return -1;
  size_t off = 0;
  return msgpack_unpack(buf, len, &off, zone, o) == MSGPACK_UNPACK_SUCCESS ? 0 : -1;
}

static int srv_send(int fd, msgpack_sbuffer *sb) {
  uint8_t h[4];
  fm_frame_header(h, (uint32_t)sb->size);
  int rc = write_full(fd, h, 4) || write_full(fd, sb->data, sb->size);
  msgpack_sbuffer_clear(sb);
  return rc;
}

static void srv_hello_reply(server *s, int fd, uint64_t id, msgpack_sbuffer *sb) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  if (s->mode == BAD_HELLO_SLUG) {
    fm_pack_error_reply(&pk, id, FM_EPROTO_VERSION, "this daemon speaks protocol 7");
  } else {
    msgpack_pack_map(&pk, 7);
    fm_pack_kv_bool(&pk, "ok", true);
    fm_pack_kv_u64(&pk, "id", id);
    fm_pack_kv_u64(&pk, "proto", s->mode == OLD_PROTO ? 99 : FM_PROTO_VERSION);
    fm_pack_kv_cstr(&pk, "server", "fusemld");
    fm_pack_kv_cstr(&pk, "version", FM_VERSION_STRING);
    fm_pack_kv_cstr(&pk, "mode", "compile-only");
    fm_pack_kv_u64(&pk, "max_frame", FM_FRAME_MAX_REQUEST);
  }
  srv_send(fd, sb);
}

static void srv_compile_reply(int fd, uint64_t id, msgpack_sbuffer *sb) {
  msgpack_packer pk;
  fm_kernel_meta m;
  static const uint8_t cubin[5] = {0x7f, 'E', 'L', 'F', 2};
  memset(&m, 0, sizeof m);
  snprintf(m.kind, sizeof m.kind, "pointwise");
  snprintf(m.entry, sizeof m.entry, "fm_pw_0123");
  m.block[0] = 256, m.block[1] = 1, m.block[2] = 1;
  snprintf(m.grid_rule, sizeof m.grid_rule, "elementwise");
  m.inner = 4096;
  m.items_per_block = 2048;
  m.max_blocks = 1024;
  m.outer = -1;
  m.n_inputs = 2;
  m.n_outputs = 1;
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 8);
  fm_pack_kv_bool(&pk, "ok", true);
  fm_pack_kv_u64(&pk, "id", id);
  fm_pack_kv_cstr(&pk, "key", "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF");
  fm_pack_kv_cstr(&pk, "kind", "pointwise");
  fm_pack_kv_cstr(&pk, "state", "untuned");
  fm_pack_kv_cstr(&pk, "origin", "compiled");
  fm_pack_cstr(&pk, "meta");
  fm_meta_pack(&m, &pk);
  fm_pack_cstr(&pk, "cubin");
  fm_pack_bin(&pk, cubin, sizeof cubin);
  srv_send(fd, sb);
}

static void *srv_main(void *arg) {
  server *s = arg;
  msgpack_sbuffer sb;
  msgpack_zone zone;
  msgpack_object req;
  uint64_t id = 0;
  int fd = accept(s->lfd, NULL, NULL);
  if (fd < 0) return NULL;
  msgpack_sbuffer_init(&sb);
  msgpack_zone_init(&zone, 4096);

  if (s->mode == SILENT) goto drain;
  if (srv_read(fd, &zone, &req)) goto out;
  {
    uint64_t proto = 0, pid = 0;
    s->got_hello_ok = fm_msg_str_eq(fm_msg_get(&req, "op"), "hello") &&
                      fm_msg_get_u64(&req, "id", &id, NULL) == FM_OK &&
                      fm_msg_get_u64(&req, "proto", &proto, NULL) == FM_OK && proto == FM_PROTO_VERSION &&
                      fm_msg_copy_str(&req, "client", s->client_name, sizeof s->client_name, NULL) == FM_OK &&
                      fm_msg_get_u64(&req, "pid", &pid, NULL) == FM_OK && pid == (uint64_t)getpid();
  }
  srv_hello_reply(s, fd, id, &sb);
  if (s->mode == OLD_PROTO || s->mode == BAD_HELLO_SLUG) goto drain;
  if (s->mode == HANGUP) goto out;

  if (srv_read(fd, &zone, &req)) goto out;
  fm_msg_get_u64(&req, "id", &id, NULL);
  s->last_id = id;
  if (s->mode == HELLO_ERROR) {
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    fm_pack_error_reply(&pk, id, FM_ECOMPILE, "kernel.cu(12): error: identifier \"x\" is undefined");
    srv_send(fd, &sb);
  } else if (s->mode == WRONG_ID) {
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 3);
    fm_pack_kv_bool(&pk, "ok", true);
    fm_pack_kv_u64(&pk, "id", id + 5);
    fm_pack_kv_bool(&pk, "pong", true);
    srv_send(fd, &sb);
  } else if (s->mode == COMPILE_OK) {
    const msgpack_object *frag = fm_msg_get(&req, "fragment");
    uint64_t vocab = 0;
    s->got_fragment_ok = fm_msg_str_eq(fm_msg_get(&req, "op"), "compile") && frag &&
                         fm_msg_get_u64(frag, "vocab", &vocab, NULL) == FM_OK && vocab == 1 &&
                         fm_msg_get(frag, "ops") && req.via.map.size == 3;
    srv_compile_reply(fd, id, &sb);
  } else if (s->mode == HUGE_REPLY) {
    uint8_t h[4];
    fm_frame_header(h, FM_FRAME_MAX_REPLY + 1);
    write_full(fd, h, 4);
  }

drain:
  /* Hold the connection until the client hangs up. */
  for (;;) {
    char b[4096];
    ssize_t r = read(fd, b, sizeof b);
    if (r == 0 || (r < 0 && errno != EINTR)) break;
  }
out:
  close(fd);
  msgpack_zone_destroy(&zone);
  msgpack_sbuffer_destroy(&sb);
  return NULL;
}

static int srv_start(server *s, enum mode mode) {
  struct sockaddr_un sa;
  memset(s, 0, sizeof *s);
  s->mode = mode;
  snprintf(s->dir, sizeof s->dir, "/tmp/fm_test_net_XXXXXX");
  if (!mkdtemp(s->dir)) return -1;
  snprintf(s->path, sizeof s->path, "%s/fusemld.sock", s->dir);
  s->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", s->path);
  if (bind(s->lfd, (struct sockaddr *)&sa, sizeof sa) || listen(s->lfd, 4)) return -1;
  return pthread_create(&s->th, NULL, srv_main, s);
}

static void srv_stop(server *s) {
  pthread_join(s->th, NULL);
  close(s->lfd);
  unlink(s->path);
  rmdir(s->dir);
}

/* ---- tests ---- */

static void test_missing_socket(void) {
  fm_client *c = (fm_client *)1;
  fm_diag d = {{0}};
  int64_t t0 = now_ms();
  int err = fm_client_connect("/tmp/fm_test_no_such_dir/fusemld.sock", "t", 2000, &c, &d);
  CHECK_EQ_INT(err, FM_EIO);
  CHECK(c == NULL);
  CHECK(now_ms() - t0 < 2000); /* fails at once, not after the timeout */
  CHECK_STR_CONTAINS(d.text, "/tmp/fm_test_no_such_dir/fusemld.sock");
  CHECK_STR_CONTAINS(d.text, "No such file");

  char longpath[300];
  memset(longpath, 'a', sizeof longpath - 1);
  longpath[0] = '/';
  longpath[sizeof longpath - 1] = '\0';
  CHECK_EQ_INT(fm_client_connect(longpath, "t", 100, &c, &d), FM_ELIMIT);
}

static void test_silent_server_times_out(void) {
  server s;
  fm_client *c = NULL;
  fm_diag d = {{0}};
  CHECK(srv_start(&s, SILENT) == 0);
  int64_t t0 = now_ms();
  int err = fm_client_connect(s.path, "t", 300, &c, &d);
  int64_t dt = now_ms() - t0;
  CHECK_EQ_INT(err, FM_ETIMEOUT);
  CHECK(c == NULL);
  CHECK(dt >= 250 && dt < 3000);
  CHECK_STR_CONTAINS(d.text, "timed out");
  CHECK_STR_CONTAINS(d.text, s.path);
  srv_stop(&s);
}

static void test_error_reply_mapped(void) {
  server s;
  fm_client *c = NULL;
  fm_diag d = {{0}};
  msgpack_zone zone;
  msgpack_object reply;
  CHECK(srv_start(&s, HELLO_ERROR) == 0);
  CHECK_EQ_INT(fm_client_connect(s.path, "test-client", 2000, &c, &d), FM_OK);
  if (c) {
    const msgpack_object *h = fm_client_hello(c);
    CHECK(fm_msg_str_eq(fm_msg_get(h, "server"), "fusemld"));
    msgpack_zone_init(&zone, 1024);
    int err = fm_client_call(c, "ping", 0, NULL, NULL, &zone, &reply, &d);
    CHECK_EQ_INT(err, FM_ECOMPILE);
    CHECK_STR_CONTAINS(d.text, "NVRTC compile failed: kernel.cu(12): error: identifier");
    CHECK(reply.type == MSGPACK_OBJECT_MAP); /* the error reply itself is still returned */
    CHECK(fm_msg_str_eq(fm_msg_get(&reply, "code"), "compile_failed"));
    msgpack_zone_destroy(&zone);
    fm_client_close(c);
  }
  srv_stop(&s);
  CHECK(s.got_hello_ok);
  CHECK(strcmp(s.client_name, "test-client") == 0);
  CHECK(s.last_id > 1); /* ids increase: hello took the first */
}

static void test_wrong_id_is_protocol_error(void) {
  server s;
  fm_client *c = NULL;
  fm_diag d = {{0}};
  msgpack_zone zone;
  msgpack_object reply;
  CHECK(srv_start(&s, WRONG_ID) == 0);
  CHECK_EQ_INT(fm_client_connect(s.path, NULL, 2000, &c, &d), FM_OK);
  if (c) {
    msgpack_zone_init(&zone, 1024);
    CHECK_EQ_INT(fm_client_call(c, "ping", 0, NULL, NULL, &zone, &reply, &d), FM_EPROTOCOL);
    CHECK_STR_CONTAINS(d.text, "with id");
    /* The stream is out of step now: later calls refuse rather than misread. */
    CHECK_EQ_INT(fm_client_call(c, "ping", 0, NULL, NULL, &zone, &reply, &d), FM_ECLOSED);
    CHECK_STR_CONTAINS(d.text, "reconnect");
    msgpack_zone_destroy(&zone);
    fm_client_close(c);
  }
  srv_stop(&s);
  CHECK(strcmp(s.client_name, "libfusemld") == 0); /* the default name */
}

typedef struct big_ctx {
  char *blob;
  size_t len;
} big_ctx;

static void pack_big(msgpack_packer *pk, void *ctx) {
  big_ctx *b = ctx;
  fm_pack_cstr(pk, "pad");
  fm_pack_bin(pk, b->blob, b->len);
}

static void test_hangup_no_sigpipe(void) {
  server s;
  fm_client *c = NULL;
  fm_diag d = {{0}};
  msgpack_zone zone;
  msgpack_object reply;
  big_ctx b = {NULL, 900 * 1024};
  CHECK(srv_start(&s, HANGUP) == 0);
  CHECK_EQ_INT(fm_client_connect(s.path, "t", 2000, &c, &d), FM_OK);
  srv_stop(&s); /* the server has closed its end by now */
  if (c) {
    /* A request larger than the socket buffer: writing it to a closed peer raises SIGPIPE
     * unless the client suppresses it; this process must survive to see FM_ECLOSED. */
    b.blob = malloc(b.len);
    memset(b.blob, 'x', b.len);
    msgpack_zone_init(&zone, 1024);
    CHECK_EQ_INT(fm_client_call(c, "ping", 1, pack_big, &b, &zone, &reply, &d), FM_ECLOSED);
    CHECK_STR_CONTAINS(d.text, "closed the connection");
    msgpack_zone_destroy(&zone);
    free(b.blob);
    fm_client_close(c);
  }
}

static void test_compile_reply_parsed(void) {
  server s;
  fm_client *c = NULL;
  fm_compiled k;
  fm_diag d = {{0}};
  msgpack_sbuffer frag;
  msgpack_packer pk;
  char hex[FM_KEY_HEX];

  msgpack_sbuffer_init(&frag);
  msgpack_packer_init(&pk, &frag, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 4);
  fm_pack_kv_u64(&pk, "vocab", 1);
  fm_pack_cstr(&pk, "inputs");
  msgpack_pack_array(&pk, 0);
  fm_pack_cstr(&pk, "ops");
  msgpack_pack_array(&pk, 0);
  fm_pack_cstr(&pk, "outputs");
  msgpack_pack_array(&pk, 0);

  CHECK(srv_start(&s, COMPILE_OK) == 0);
  /* Through FUSEML_SOCKET, as a job would find a non-default daemon. */
  setenv("FUSEML_SOCKET", s.path, 1);
  CHECK_EQ_INT(fm_client_connect(NULL, "t", 2000, &c, &d), FM_OK);
  unsetenv("FUSEML_SOCKET");
  if (c) {
    /* Refused locally: not a map. */
    CHECK_EQ_INT(fm_client_compile(c, (const uint8_t *)"\x91\x01", 2, &k, &d), FM_EINVAL);
    int err = fm_client_compile(c, (const uint8_t *)frag.data, frag.size, &k, &d);
    if (err) fprintf(stderr, "  compile: %s\n", d.text);
    CHECK_EQ_INT(err, FM_OK);
    if (!err) {
      fm_key_to_hex(&k.key, hex);
      CHECK(strcmp(hex, "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff") == 0);
      CHECK(strcmp(k.kind, "pointwise") == 0);
      CHECK(strcmp(k.state, "untuned") == 0);
      CHECK(strcmp(k.origin, "compiled") == 0);
      CHECK(strcmp(k.meta.entry, "fm_pw_0123") == 0);
      CHECK_EQ_INT(k.meta.outer, -1);
      CHECK_EQ_INT(k.meta.n_inputs, 2);
      CHECK_EQ_INT(k.cubin_len, 5);
      CHECK(k.cubin && memcmp(k.cubin,
                              "\x7f"
                              "ELF\x02",
                              5) == 0);
      fm_compiled_free(&k);
      CHECK(k.cubin == NULL && k.cubin_len == 0);
    }
    fm_client_close(c);
  }
  srv_stop(&s);
  CHECK(s.got_fragment_ok);
  msgpack_sbuffer_destroy(&frag);
}

static void test_huge_reply_refused(void) {
  server s;
  fm_client *c = NULL;
  fm_diag d = {{0}};
  msgpack_zone zone;
  msgpack_object reply;
  CHECK(srv_start(&s, HUGE_REPLY) == 0);
  CHECK_EQ_INT(fm_client_connect(s.path, "t", 2000, &c, &d), FM_OK);
  if (c) {
    msgpack_zone_init(&zone, 1024);
    CHECK_EQ_INT(fm_client_call(c, "ping", 0, NULL, NULL, &zone, &reply, &d), FM_ETOOBIG);
    CHECK_STR_CONTAINS(d.text, "limit");
    msgpack_zone_destroy(&zone);
    fm_client_close(c);
  }
  srv_stop(&s);
}

static void test_protocol_mismatch(void) {
  server s;
  fm_client *c = NULL;
  fm_diag d = {{0}};
  CHECK(srv_start(&s, OLD_PROTO) == 0);
  CHECK_EQ_INT(fm_client_connect(s.path, "t", 2000, &c, &d), FM_EPROTO_VERSION);
  CHECK(c == NULL);
  CHECK_STR_CONTAINS(d.text, "99");
  srv_stop(&s);

  CHECK(srv_start(&s, BAD_HELLO_SLUG) == 0);
  CHECK_EQ_INT(fm_client_connect(s.path, "t", 2000, &c, &d), FM_EPROTO_VERSION);
  CHECK_STR_CONTAINS(d.text, "this daemon speaks protocol 7");
  CHECK_STR_CONTAINS(d.text, s.path);
  srv_stop(&s);
}

int main(void) {
  RUN(test_missing_socket);
  RUN(test_silent_server_times_out);
  RUN(test_error_reply_mapped);
  RUN(test_wrong_id_is_protocol_error);
  RUN(test_hangup_no_sigpipe);
  RUN(test_compile_reply_parsed);
  RUN(test_huge_reply_refused);
  RUN(test_protocol_mismatch);
  return FM_TEST_DONE();
}
