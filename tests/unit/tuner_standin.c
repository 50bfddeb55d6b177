/* tuner_standin.c: a stand-in for fusemld-tuner (no GPU): speaks the worker protocol of
 * daemon/fm_tuner_worker.h and misbehaves on purpose, so CI can test the daemon's
 * kill-and-restart path.
 *
 * Environment:
 *   FM_STANDIN_PLAN    comma-separated behaviour per candidate index (run "index"):
 *                        ok:MS    verdict ok with time MS
 *                        wrong    verdict wrong
 *                        abort    abort() mid-request (the daemon sees EOF: fault)
 *                        hang     sleep forever (the daemon's deadline: timeout)
 *                        launch   verdict launch_failed, then exit (as after a sticky error)
 *                        load     verdict load_failed
 *                      an index past the list answers ok:(10 + index)
 *   FM_STANDIN_NOGPU   set: the ready message says there is no GPU
 *   FM_STANDIN_PIDDIR  set: each start creates PIDDIR/<pid> (tests check none is left)
 *   FM_STANDIN_TRACE   set: each request appends a line to this file, "prepare <fnv>" (a hash
 *                      of the canonical fragment) or "run <index>", before it is answered
 *   FM_STANDIN_RUN_MS  set: each run request takes this many milliseconds (a slow GPU) */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fm_frame.h"
#include "fm_msg.h"

static int fd = -1;

static void send_sb(msgpack_sbuffer *sb) {
  uint8_t hdr[FM_FRAME_HEADER_BYTES];
  fm_frame_header(hdr, (uint32_t)sb->size);
  if (write(fd, hdr, sizeof hdr) != (ssize_t)sizeof hdr) exit(1);
  size_t off = 0;
  while (off < sb->size) {
    ssize_t w = write(fd, sb->data + off, sb->size - off);
    if (w <= 0) exit(1);
    off += (size_t)w;
  }
}

static void reply(uint64_t id, const char *verdict, double rel, double ms) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 5);
  fm_pack_kv_u64(&pk, "id", id);
  fm_pack_kv_cstr(&pk, "verdict", verdict);
  fm_pack_kv_f64(&pk, "rel_err", rel);
  fm_pack_kv_f64(&pk, "ms", ms);
  fm_pack_kv_cstr(&pk, "detail", "stand-in");
  send_sb(&sb);
  msgpack_sbuffer_destroy(&sb);
}

static void status(const char *op, uint64_t id, int ok, const char *detail) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 4);
  if (op)
    fm_pack_kv_cstr(&pk, "op", op);
  else
    fm_pack_kv_u64(&pk, "id", id);
  fm_pack_kv_bool(&pk, "ok", ok != 0);
  fm_pack_kv_cstr(&pk, "device", "stand-in");
  fm_pack_kv_cstr(&pk, "detail", detail);
  send_sb(&sb);
  msgpack_sbuffer_destroy(&sb);
}

/* The plan entry for index i, copied into out ("" if none). */
static void plan_entry(uint64_t i, char *out, size_t cap) {
  const char *p = getenv("FM_STANDIN_PLAN");
  out[0] = '\0';
  for (uint64_t k = 0; p && *p; k++) {
    size_t n = strcspn(p, ",");
    if (k == i) {
      snprintf(out, cap, "%.*s", (int)n, p);
      return;
    }
    p += n;
    if (*p == ',') p++;
  }
}

static void trace(const char *fmt, unsigned long long v) {
  const char *path = getenv("FM_STANDIN_TRACE");
  if (!path) return;
  FILE *f = fopen(path, "a");
  if (!f) return;
  fprintf(f, fmt, v);
  fclose(f);
}

/* FNV-1a of the canonical bytes: tells fragments apart in the trace. */
static unsigned long long fnv(const uint8_t *p, size_t n) {
  unsigned long long h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

int main(int argc, char **argv) {
  for (int i = 1; i + 1 < argc; i++)
    if (strcmp(argv[i], "--fd") == 0) fd = atoi(argv[i + 1]);
  if (fd < 0) return 2;
  const char *dir = getenv("FM_STANDIN_PIDDIR");
  if (dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/%ld", dir, (long)getpid());
    int f = open(path, O_CREAT | O_WRONLY, 0600);
    if (f >= 0) close(f);
  }
  if (getenv("FM_STANDIN_NOGPU")) {
    status("ready", 0, 0, "stand-in: no GPU here");
    return 1;
  }
  status("ready", 0, 1, "");

  fm_frame_reader rd;
  fm_frame_reader_init(&rd, FM_FRAME_MAX_REPLY);
  for (;;) {
    const uint8_t *p;
    size_t n;
    while (!fm_frame_reader_next(&rd, &p, &n)) {
      uint8_t buf[65536];
      ssize_t got = read(fd, buf, sizeof buf);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0 || fm_frame_reader_feed(&rd, buf, (size_t)got)) return 0;
    }
    msgpack_zone z;
    msgpack_object req;
    uint64_t id = 0, index = 0;
    char entry[64];
    msgpack_zone_init(&z, 4096);
    if (fm_msg_unpack(p, n, &fm_msg_reply_limits, &z, &req, NULL)) return 1;
    fm_msg_get_u64(&req, "id", &id, NULL);
    fm_msg_get_u64(&req, "index", &index, NULL);
    if (fm_msg_str_eq(fm_msg_get(&req, "op"), "prepare")) {
      const uint8_t *c = NULL;
      size_t len = 0;
      int ok = fm_msg_get_bin(&req, "canonical", &c, &len, NULL) == FM_OK && len > 0;
      trace("prepare %016llx\n", ok ? fnv(c, len) : 0);
      status(NULL, id, ok, "");
    } else {
      const char *run_ms = getenv("FM_STANDIN_RUN_MS");
      trace("run %llu\n", (unsigned long long)index);
      if (run_ms) usleep((useconds_t)(atoi(run_ms) * 1000));
      plan_entry(index, entry, sizeof entry);
      if (strncmp(entry, "ok:", 3) == 0)
        reply(id, "ok", 1e-4, atof(entry + 3));
      else if (strcmp(entry, "wrong") == 0)
        reply(id, "wrong", 0.5, -1);
      else if (strcmp(entry, "load") == 0)
        reply(id, "load_failed", -1, -1);
      else if (strcmp(entry, "abort") == 0)
        abort();
      else if (strcmp(entry, "hang") == 0)
        for (;;) pause();
      else if (strcmp(entry, "launch") == 0) {
        reply(id, "launch_failed", -1, -1);
        msgpack_zone_destroy(&z);
        fm_frame_reader_free(&rd);
        return 3;
      } else
        reply(id, "ok", 1e-4, 10.0 + (double)index);
    }
    msgpack_zone_destroy(&z);
  }
}
