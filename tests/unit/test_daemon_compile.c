/* test_daemon_compile.c: the worker's job body with the real codegen, NVRTC and store, and
 * the device/key rules (compile-only here: no GPU). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fm_compile.h"
#include "fm_compile_queue.h"
#include "fm_device.h"
#include "fm_msg.h"
#include "fm_nvrtc.h"
#include "fm_test.h"

static char dir[] = "/tmp/fm-test-compile-XXXXXX";

/* x (f32 [-1, 256]) -> relu -> out, packed and decoded through the real wire path. */
static int make_fragment(fm_fragment *canon, uint8_t **bytes, size_t *len) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 4);
  fm_pack_kv_u64(&pk, "vocab", 1);
  for (int t = 0; t < 2; t++) {
    fm_pack_cstr(&pk, t == 0 ? "inputs" : "ops");
    msgpack_pack_array(&pk, 1);
    if (t == 0) {
      msgpack_pack_map(&pk, 5);
      fm_pack_kv_u64(&pk, "id", 0);
      fm_pack_kv_cstr(&pk, "dtype", "f32");
      fm_pack_cstr(&pk, "shape");
      msgpack_pack_array(&pk, 2);
      msgpack_pack_int64(&pk, -1);
      msgpack_pack_int64(&pk, 256);
      fm_pack_cstr(&pk, "strides");
      msgpack_pack_array(&pk, 2);
      msgpack_pack_int64(&pk, 256);
      msgpack_pack_int64(&pk, 1);
      fm_pack_kv_u64(&pk, "align", 16);
    } else {
      msgpack_pack_map(&pk, 3);
      fm_pack_kv_cstr(&pk, "op", "relu");
      fm_pack_kv_u64(&pk, "out", 1);
      fm_pack_cstr(&pk, "args");
      msgpack_pack_array(&pk, 1);
      msgpack_pack_uint32(&pk, 0);
    }
  }
  fm_pack_cstr(&pk, "outputs");
  msgpack_pack_array(&pk, 1);
  msgpack_pack_map(&pk, 5);
  fm_pack_kv_u64(&pk, "id", 1);
  fm_pack_kv_cstr(&pk, "dtype", "f32");
  fm_pack_cstr(&pk, "shape");
  msgpack_pack_array(&pk, 2);
  msgpack_pack_int64(&pk, -1);
  msgpack_pack_int64(&pk, 256);
  fm_pack_cstr(&pk, "strides");
  msgpack_pack_array(&pk, 2);
  msgpack_pack_int64(&pk, 256);
  msgpack_pack_int64(&pk, 1);
  fm_pack_kv_u64(&pk, "align", 16);

  msgpack_zone zone;
  msgpack_object obj;
  fm_diag d;
  fm_fragment *raw = malloc(sizeof *raw);
  msgpack_zone_init(&zone, 4096);
  int err = fm_msg_unpack((const uint8_t *)sb.data, sb.size, &fm_msg_request_limits, &zone, &obj, &d);
  if (!err) err = fm_fragment_decode(&obj, raw, &d);
  if (!err) err = fm_fragment_canonicalize(raw, canon);
  if (!err) err = fm_fragment_canonical_bytes(canon, bytes, len);
  if (err) fprintf(stderr, "fragment: %s\n", d.text);
  msgpack_zone_destroy(&zone);
  msgpack_sbuffer_destroy(&sb);
  free(raw);
  return err;
}

static void test_device_compile_only(void) {
  fm_devinfo dev;
  fm_diag d = {{0}};
  fm_device_id other;
  CHECK_EQ_INT(fm_device_init(&dev, "sm_90a", &d), FM_OK);
  if (dev.gpu) {
    /* On the GPU machine the daemon serves its own device: a real identity and arch. */
    CHECK(strcmp(fm_device_mode(&dev), "gpu") == 0);
    CHECK(strcmp(dev.id.name, "none") != 0 && strncmp(dev.id.arch, "sm_", 3) == 0);
    CHECK(dev.id.sm_count > 0 && dev.id.cc_major >= 7);
  } else {
    CHECK(strcmp(fm_device_mode(&dev), "compile-only") == 0);
    CHECK(strcmp(dev.id.name, "none") == 0 && strcmp(dev.id.arch, "sm_90a") == 0);
    CHECK(strcmp(dev.label, "none/sm_90a") == 0);
    CHECK(dev.why_no_gpu[0] != '\0');
    CHECK_EQ_INT(fm_device_for_arch(&dev, NULL, &other, &d), FM_OK);
    CHECK(strcmp(other.arch, "sm_90a") == 0);
    /* --arch only matters (and is only checked) without a GPU */
    CHECK_EQ_INT(fm_device_init(&dev, "sm_1", &d), FM_EUNSUPPORTED);
    CHECK_STR_CONTAINS(d.text, "sm_1");
  }
  CHECK(dev.nvrtc_major >= 12);
  CHECK(dev.cublaslt_version > 0);
  CHECK_EQ_INT(fm_device_for_arch(&dev, "sm_7", &other, &d), FM_EUNSUPPORTED);
}

static void test_key_depends_on_arch(void) {
  fm_devinfo dev;
  fm_diag d = {{0}};
  fm_fragment *canon = malloc(sizeof *canon);
  uint8_t *bytes = NULL;
  size_t len = 0;
  fm_key k90, k80, again;
  fm_device_id d80;
  CHECK_EQ_INT(fm_device_init(&dev, "sm_90a", &d), FM_OK);
  CHECK_EQ_INT(make_fragment(canon, &bytes, &len), FM_OK);
  CHECK_EQ_INT(fm_device_key(&dev, &dev.id, bytes, len, &k90), FM_OK);
  CHECK_EQ_INT(fm_device_key(&dev, &dev.id, bytes, len, &again), FM_OK);
  CHECK(memcmp(&k90, &again, sizeof k90) == 0);
  if (fm_nvrtc_arch_supported("sm_80")) {
    CHECK_EQ_INT(fm_device_for_arch(&dev, "sm_80", &d80, &d), FM_OK);
    CHECK_EQ_INT(fm_device_key(&dev, &d80, bytes, len, &k80), FM_OK);
    CHECK(memcmp(&k90, &k80, sizeof k90) != 0);
  }
  free(bytes);
  free(canon);
}

static void test_job_compiles_and_stores(void) {
  fm_devinfo dev;
  fm_diag d = {{0}};
  fm_fragment *canon = malloc(sizeof *canon);
  uint8_t *bytes = NULL;
  size_t len = 0;
  fm_key key;
  fm_store *store = NULL;
  fm_compile_job *job = NULL;
  char db[128];
  snprintf(db, sizeof db, "%s/k.db", dir);
  CHECK_EQ_INT(fm_device_init(&dev, "sm_90a", &d), FM_OK);
  CHECK_EQ_INT(make_fragment(canon, &bytes, &len), FM_OK);
  CHECK_EQ_INT(fm_device_key(&dev, &dev.id, bytes, len, &key), FM_OK);
  CHECK_EQ_INT(fm_store_open(db, 0, &store, &d), FM_OK);
  CHECK_EQ_INT(fm_compile_job_new(canon, bytes, len, &key, &dev.id, store, &job), FM_OK);
  fm_compile_run(job);
  CHECK_EQ_INT(job->err, FM_OK);
  CHECK_EQ_INT(job->store_err, FM_OK);
  CHECK(job->cubin_len > 64 && memcmp(job->cubin, "\177ELF", 4) == 0);
  CHECK(strcmp(job->meta.kind, "pointwise") == 0);
  CHECK(job->source && strstr(job->source, "__global__"));
  CHECK(fm_msg_check(job->meta_bytes, job->meta_len, &fm_msg_reply_limits, &d) == FM_OK);

  fm_entry e;
  CHECK_EQ_INT(fm_store_get(store, &key, dev.label, 0, &e), FM_OK);
  CHECK(e.cubin_len == job->cubin_len && memcmp(e.cubin, job->cubin, e.cubin_len) == 0);
  CHECK(e.canonical_len == len && memcmp(e.canonical, bytes, len) == 0);
  CHECK(e.meta_len == job->meta_len);
  CHECK_EQ_INT(e.state, FM_STATE_UNTUNED);
  CHECK(strcmp(e.kind, "pointwise") == 0);
  fm_entry_free(&e);
  fm_compile_job_free(job);
  fm_store_close(store);
  unlink(db);
  char p[160];
  snprintf(p, sizeof p, "%s-wal", db);
  unlink(p);
  snprintf(p, sizeof p, "%s-shm", db);
  unlink(p);
  free(bytes);
  free(canon);
}

/* The compile queue serves owners in turn. One worker; owner A queues three jobs, then B
 * and C one each: A's first goes to the pool at once, then A, B, C, A. The jobs are
 * cancelled before they start (they end at once, err FM_ECLOSED: what a job nobody waits for
 * does), so only the order is at stake. */
static char order[8];
static int n_done;

static void record(fm_compile_job *job) {
  if (n_done < (int)sizeof order - 1) order[n_done++] = *(const char *)job->ctx;
  CHECK_EQ_INT(job->err, FM_ECLOSED);
  fm_compile_job_free(job);
}

/* A job for the relu fragment on dev, not stored; NULL on failure. */
static fm_compile_job *relu_job(const fm_devinfo *dev) {
  fm_fragment *canon = malloc(sizeof *canon);
  uint8_t *bytes = NULL;
  size_t len = 0;
  fm_key key;
  fm_compile_job *job = NULL;
  if (canon && make_fragment(canon, &bytes, &len) == FM_OK && fm_device_key(dev, &dev->id, bytes, len, &key) == FM_OK)
    fm_compile_job_new(canon, bytes, len, &key, &dev->id, NULL, &job);
  free(bytes);
  free(canon);
  return job;
}

static void test_queue_serves_owners_in_turn(void) {
  uv_loop_t loop;
  fm_cqueue *q = NULL;
  fm_devinfo dev;
  fm_diag d = {{0}};
  static const char names[] = "AAABC";
  int owner_a, owner_b, owner_c;
  const void *owners[] = {&owner_a, &owner_a, &owner_a, &owner_b, &owner_c};
  CHECK_EQ_INT(uv_loop_init(&loop), 0);
  CHECK_EQ_INT(fm_cqueue_new(&loop, 1, &q), FM_OK);
  CHECK_EQ_INT(fm_device_init(&dev, "sm_90a", &d), FM_OK);
  for (int i = 0; i < 5; i++) {
    fm_compile_job *job = relu_job(&dev);
    CHECK(job != NULL);
    if (!job) break;
    atomic_store(&job->cancel, 1);
    CHECK_EQ_INT(fm_cqueue_submit(q, owners[i], job, record, (void *)&names[i]), FM_OK);
  }
  CHECK_EQ_INT(fm_cqueue_waiting(q), 4);
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK_EQ_INT(n_done, 5);
  CHECK(strcmp(order, "AABCA") == 0);
  CHECK_EQ_INT(fm_cqueue_waiting(q), 0);
  fm_cqueue_free(q);
  CHECK_EQ_INT(uv_loop_close(&loop), 0);
}

/* Background compiles (a background tune's candidates) go only when no owner waits: with
 * one worker, three background jobs queued before owners A (two) and B (one) run after them,
 * except the first, which found the pool idle. */
static void test_queue_background_after_owners(void) {
  uv_loop_t loop;
  fm_cqueue *q = NULL;
  fm_devinfo dev;
  fm_diag d = {{0}};
  static const char names[] = "xyzAAB";
  int owner_a, owner_b;
  const void *owners[] = {NULL, NULL, NULL, &owner_a, &owner_a, &owner_b};
  n_done = 0;
  memset(order, 0, sizeof order);
  CHECK_EQ_INT(uv_loop_init(&loop), 0);
  CHECK_EQ_INT(fm_cqueue_new(&loop, 1, &q), FM_OK);
  CHECK_EQ_INT(fm_device_init(&dev, "sm_90a", &d), FM_OK);
  for (int i = 0; i < 6; i++) {
    fm_compile_job *job = relu_job(&dev);
    CHECK(job != NULL);
    if (!job) break;
    atomic_store(&job->cancel, 1);
    if (owners[i])
      CHECK_EQ_INT(fm_cqueue_submit(q, owners[i], job, record, (void *)&names[i]), FM_OK);
    else
      fm_cqueue_submit_background(q, job, record, (void *)&names[i]);
  }
  CHECK_EQ_INT(fm_cqueue_waiting(q), 5);
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK_EQ_INT(n_done, 6);
  CHECK(strcmp(order, "xABAyz") == 0);
  if (strcmp(order, "xABAyz") != 0) fprintf(stderr, "  order %s\n", order);
  CHECK_EQ_INT(fm_cqueue_waiting(q), 0);
  fm_cqueue_free(q);
  CHECK_EQ_INT(uv_loop_close(&loop), 0);
}

int main(void) {
  if (!mkdtemp(dir)) return 1;
  RUN(test_device_compile_only);
  RUN(test_key_depends_on_arch);
  RUN(test_job_compiles_and_stores);
  RUN(test_queue_serves_owners_in_turn);
  RUN(test_queue_background_after_owners);
  rmdir(dir);
  return FM_TEST_DONE();
}
