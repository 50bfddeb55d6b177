/* fusemld_tuner.c: fusemld-tuner, the worker process that verifies and times candidate
 * kernels on the GPU (the protocol is in daemon/fm_tuner_worker.h). The daemon starts it
 * with fork+exec and `--fd N` (a socketpair end), kills it when a candidate hangs, and
 * restarts it when a candidate breaks its CUDA context.
 *
 * prepare (per fragment):
 *  - verification size: the static shape (a column fragment's [M, N], its outputs being [1, N]);
 *    for a symbolic dim 0 an outer giving ~1M elements,
 *    or for a GEMM with an M bucket (m_hint) the bucket, at most GEMM_VERIFY_ROWS; for a
 *    column fragment with one the bucket, at most an outer giving ~1M elements;
 *  - a GEMM whose fp64 reference would cost more than REF_MACS multiply-adds is checked on
 *    row strips (first, middle, last GEMM_STRIP_ROWS rows): the kernel computes every row,
 *    the reference only the strips' rows (one thread each), and only they are read back and
 *    compared. Rows of a GEMM are independent, so a row is the same fragment with M = 1
 *    over operands offset to it;
 *  - a static pointwise, row or cat fragment of more than FM_SAMPLE_MIN_ELEMENTS is checked
 *    on a sample of blocks (fm_reference_sample.h: strips at the start, middle and end of its
 *    leading dims and random blocks between, each on a thread): the kernel computes every
 *    element, the reference only the blocks', and only they are read back and compared;
 *    a smaller one (and a column fragment) is checked whole, its reference on threads in
 *    bands (stripes of columns) once it passes FM_SAMPLE_THREADS_MIN_ELEMENTS;
 *  - fresh random inputs (never zeros: uniform in [-3, 3), bool 0/1; a product's matrix
 *    operands scaled so that its sums stay the size of an epilogue input, operand_scale)
 *    from the daemon's seed, filled in parallel chunks, and the reference outputs from
 *    fm_reference_eval (fp64, rounded as the kernels store);
 *  - twins: in a chain, an input laid out like the first product's A (the MLP's x, which the
 *    client sends as that operand and again as the residual: one memory through two
 *    parameters) gets a second reference with A's values in its place; a b2b kernel takes
 *    another path when the two pointers are equal (codegen v26);
 *  - a batched GEMM (bmm) with a symbolic batch is verified on at most BMM_VERIFY_BATCHES
 *    products (fewer when their fp64 reference would pass REF_MACS; at least two, so the
 *    batch strides are exercised), each product's reference on a thread of its own;
 *  - timing size: the static shape; for a GEMM or column fragment with an M bucket the
 *    bucket; for any other
 *    symbolic dim 0 an outer giving ~64M elements
 *    (each buffer set capped at 2 GiB); as many buffer sets (up to 16) as it takes for one
 *    rotation to span 3x the L2, so no timed launch finds its operands in L2.
 * run (per candidate): load the CUBIN (load_failed), restore the inputs from a device copy
 * made at prepare (a wrong kernel may have scribbled on them), poison the outputs with 0xFF
 * bytes (an index_add's, which it adds into, zeroed; its index holds rows in range,
 * fm_reference_index_rows), launch (a cuBLASLt plan with its scratch), synchronize
 * (launch_failed: the context is dead, reply and exit), compare: pass iff for every output
 * ||out - ref|| / ||ref|| <= tol (fm_reference_tolerance: bf16 1e-2, f16 2e-3, f32 1e-4, bool
 * exact, or the loosest cast the output is computed through) over the
 * elements whose reference is finite, with no NaN among them, and infinities equal; with
 * twins, launched and compared again with each twin reading A's memory (both paths of the
 * kernel verified). Then time it (twins sharing memory, as in a model): 3 warm-ups, 20
 * launches each between two CUDA events, the median. A cuBLASLt plan without an algo runs
 * that for each of the heuristic's first BLAS_CHOICES choices and answers with the fastest
 * that verified, and its algo. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fm_cuda.h"
#include "fm_fragment.h"
#include "fm_frame.h"
#include "fm_meta.h"
#include "fm_module.h"
#include "fm_msg.h"
#include "fm_reference.h"
#include "fm_reference_sample.h"

#define VERIFY_ELEMENTS                   (1ll << 20)
#define TIMING_ELEMENTS                   (64ll << 20)
#define SET_BYTES_CAP                     (2ull << 30)
#define MAX_SETS                          16
/* A GEMM verified at its M bucket still runs masked edge tiles: 1000 is no multiple of any
 * tile height. */
#define GEMM_VERIFY_ROWS                  1000
#define REF_MACS                          (1ll << 28)
#define GEMM_STRIP_ROWS                   8
#define MAX_STRIPS                        3
#define BMM_VERIFY_BATCHES                16
#define WARMUPS                           3
#define BLAS_CHOICES                      8 /* cuBLASLt heuristic choices a plan's search times */
#define TIMED                             20
#define CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE 38

typedef struct tset {
  fm_CUdeviceptr in[FM_MAX_INPUTS], out[FM_MAX_OUTPUTS];
} tset;

static struct {
  int fd;
  fm_frame_reader rd;
  const fm_cuda *cu;
  fm_CUcontext ctx;
  int l2_bytes;
  /* the prepared fragment */
  int ready;
  fm_fragment *canon;
  int symbolic;
  int64_t outer_v, outer_t;
  /* the blocks of the outputs the reference computed (fm_reference_sample.h); n 0: all */
  fm_sample sample;
  size_t in_bytes_v[FM_MAX_INPUTS], out_bytes_v[FM_MAX_OUTPUTS];
  size_t in_bytes_t[FM_MAX_INPUTS], out_bytes_t[FM_MAX_OUTPUTS];
  uint8_t *h_in[FM_MAX_INPUTS], *h_ref[FM_MAX_OUTPUTS], *h_out[FM_MAX_OUTPUTS];
  /* twins (chains): A's input for an input laid out like it (its memory may be A's), or -1;
     h_ref_twins: the reference with every twin reading A's values (NULL: no twins) */
  int twin_of[FM_MAX_INPUTS];
  uint8_t *h_ref_twins[FM_MAX_OUTPUTS];
  tset verify;
  /* the verification inputs as prepared, on the device: each run restores its inputs from
     them (a device copy, not a pageable upload of up to hundreds of MB per candidate) */
  fm_CUdeviceptr pristine[FM_MAX_INPUTS];
  tset sets[MAX_SETS];
  int n_sets;
  fm_CUevent ev[2 * TIMED];
} W;

/* ---- I/O ---- */

static int write_all(const void *p, size_t n) {
  const uint8_t *b = p;
  while (n > 0) {
    ssize_t w = write(W.fd, b, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    b += w;
    n -= (size_t)w;
  }
  return 0;
}

static void send_sb(msgpack_sbuffer *sb) {
  uint8_t hdr[FM_FRAME_HEADER_BYTES];
  fm_frame_header(hdr, (uint32_t)sb->size);
  if (write_all(hdr, sizeof hdr) || write_all(sb->data, sb->size)) exit(1); /* the daemon is gone */
}

/* 1 and the frame, or 0 at EOF. */
static int read_frame(const uint8_t **p, size_t *n) {
  for (;;) {
    if (fm_frame_reader_next(&W.rd, p, n)) return 1;
    uint8_t buf[65536];
    ssize_t got = read(W.fd, buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return 0;
    if (fm_frame_reader_feed(&W.rd, buf, (size_t)got)) return 0;
  }
}

/* A verdict, with the chosen cuBLASLt algorithm when algo is not NULL. */
static void reply_verdict_algo(uint64_t id, const char *verdict, double rel_err, double ms, const char *detail,
                               const uint8_t *algo) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, algo ? 6 : 5);
  fm_pack_kv_u64(&pk, "id", id);
  fm_pack_kv_cstr(&pk, "verdict", verdict);
  fm_pack_kv_f64(&pk, "rel_err", rel_err);
  fm_pack_kv_f64(&pk, "ms", ms);
  fm_pack_kv_cstr(&pk, "detail", detail);
  if (algo) {
    fm_pack_cstr(&pk, "algo");
    fm_pack_bin(&pk, algo, FM_META_ALGO_BYTES);
  }
  send_sb(&sb);
  msgpack_sbuffer_destroy(&sb);
}

static void reply_verdict(uint64_t id, const char *verdict, double rel_err, double ms, const char *detail) {
  reply_verdict_algo(id, verdict, rel_err, ms, detail, NULL);
}

static void reply_status(const char *op, uint64_t id, int ok, const char *device, const char *detail) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, op ? 4 : 3);
  if (op) fm_pack_kv_cstr(&pk, "op", op);
  if (op)
    fm_pack_kv_cstr(&pk, "device", device ? device : "");
  else
    fm_pack_kv_u64(&pk, "id", id);
  fm_pack_kv_bool(&pk, "ok", ok != 0);
  fm_pack_kv_cstr(&pk, "detail", detail ? detail : "");
  send_sb(&sb);
  msgpack_sbuffer_destroy(&sb);
}

/* ---- the prepared fragment ---- */

static uint64_t rng_next(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *s = x;
}

/* Elements spanned by tensor t when dim 0 is `outer` (0 when empty). */
static size_t span_elems(const fm_tensor *t, int64_t outer) {
  int64_t last = 0;
  for (uint32_t d = 0; d < t->rank; d++) {
    int64_t size = (d == 0 && t->shape[0] == FM_DIM_SYMBOLIC) ? outer : t->shape[d];
    if (size == 0) return 0;
    if (size > 1) last += (size - 1) * t->strides[d];
  }
  return (size_t)last + 1;
}

static int64_t inner_elems(const fm_fragment *f) {
  int64_t inner = 1;
  for (uint32_t d = 1; d < f->outputs[0].rank; d++) inner *= f->outputs[0].shape[d];
  return inner;
}

static void release(void) {
  const fm_cuda *cu = W.cu;
  for (uint32_t k = 0; k < FM_MAX_INPUTS; k++) {
    free(W.h_in[k]);
    W.h_in[k] = NULL;
    if (W.verify.in[k]) cu->cuMemFree(W.verify.in[k]);
    if (W.pristine[k]) cu->cuMemFree(W.pristine[k]);
    W.pristine[k] = 0;
    for (int s = 0; s < MAX_SETS; s++)
      if (W.sets[s].in[k]) cu->cuMemFree(W.sets[s].in[k]);
  }
  for (uint32_t k = 0; k < FM_MAX_OUTPUTS; k++) {
    free(W.h_ref[k]);
    free(W.h_out[k]);
    free(W.h_ref_twins[k]);
    W.h_ref[k] = W.h_out[k] = W.h_ref_twins[k] = NULL;
    if (W.verify.out[k]) cu->cuMemFree(W.verify.out[k]);
    for (int s = 0; s < MAX_SETS; s++)
      if (W.sets[s].out[k]) cu->cuMemFree(W.sets[s].out[k]);
  }
  memset(&W.verify, 0, sizeof W.verify);
  memset(W.sets, 0, sizeof W.sets);
  for (uint32_t k = 0; k < FM_MAX_INPUTS; k++) W.twin_of[k] = -1;
  W.ready = 0;
}

/* The factor on input k's random values: a product's matrix operands are scaled so that its
 * sums over K stay the size of an epilogue input (each operand by K^-1/4; one whose partner
 * is computed, a chain's B2, by K^-1/2). Unscaled, values in [-3, 3) summed over K dwarf a
 * bias or a residual, and a kernel that got one of those wrong passed the relative-error
 * check: test_tuner_gpu's planted chain reading its residual from the wrong row of x came out
 * at 0.76% (bf16 tolerance 1%). */
static double operand_scale(const fm_fragment *f, uint32_t k) {
  const int prods[2] = {fm_fragment_gemm_op(f), fm_fragment_gemm_op2(f)};
  for (int i = 0; i < 2; i++) {
    if (prods[i] < 0) continue;
    const fm_opnode *mm = &f->ops[prods[i]];
    const uint32_t a = mm->args[mm->nargs - 2], b = mm->args[mm->nargs - 1];
    if (f->inputs[k].id != a && f->inputs[k].id != b) continue;
    const fm_tensor *bt = NULL;
    int inputs = 0;
    for (uint32_t j = 0; j < f->n_inputs; j++) {
      if (f->inputs[j].id == b) bt = &f->inputs[j];
      inputs += f->inputs[j].id == a || f->inputs[j].id == b;
    }
    const fm_tensor *at = bt ? bt : &f->inputs[k]; /* K: B's rows, else A's columns */
    const int64_t K = bt ? at->shape[at->rank - 2] : at->shape[at->rank - 1];
    return K > 1 ? pow((double)K, inputs >= 2 ? -0.25 : -0.5) : 1.0;
  }
  return 1.0;
}

static void fill_random(const fm_tensor *t, uint8_t *p, size_t n, uint64_t *rng, double scale) {
  for (size_t i = 0; i < n; i++) {
    uint64_t r = rng_next(rng);
    float f = (float)(((double)(r >> 11) / 9007199254740992.0 * 6.0 - 3.0) * scale);
    switch (t->dtype) {
      case FM_DT_BOOL:
        p[i] = (uint8_t)(r >> 63);
        break;
      case FM_DT_F32:
        memcpy(p + 4 * i, &f, 4);
        break;
      case FM_DT_BF16: {
        uint16_t h = fm_reference_f32_to_bf16(f);
        memcpy(p + 2 * i, &h, 2);
        break;
      }
      case FM_DT_F16: {
        uint16_t h = fm_reference_f32_to_f16(f);
        memcpy(p + 2 * i, &h, 2);
        break;
      }
      default:
        break;
    }
  }
}

/* Input k's random values in chunks of FILL_CHUNK elements, each from its own stream (the
 * seed and the chunk's index), filled by up to FILL_THREADS threads: a 4096 x 50304 logits
 * input is 200M values, seconds of one core. The values depend on the seed only, not on how
 * many threads ran. */
#define FILL_CHUNK   ((size_t)1 << 20)
#define FILL_THREADS 16

typedef struct fill_job {
  const fm_tensor *t;
  uint8_t *p;
  size_t n, first, step; /* chunks first, first + step, ... */
  uint64_t seed;
  double scale;
} fill_job;

static void *fill_main(void *arg) {
  fill_job *j = arg;
  size_t es = fm_dtype_size(j->t->dtype);
  for (size_t c = j->first; c * FILL_CHUNK < j->n; c += j->step) {
    uint64_t rng = (j->seed ^ (c * 0x9e3779b97f4a7c15ull)) | 1; /* xorshift: never 0 */
    for (int w = 0; w < 4; w++) rng_next(&rng);                 /* spread nearby seeds */
    size_t len = j->n - c * FILL_CHUNK < FILL_CHUNK ? j->n - c * FILL_CHUNK : FILL_CHUNK;
    fill_random(j->t, j->p + c * FILL_CHUNK * es, len, &rng, j->scale);
  }
  return NULL;
}

static void fill_input(const fm_tensor *t, uint8_t *p, size_t n, uint64_t seed, double scale) {
  size_t chunks = (n + FILL_CHUNK - 1) / FILL_CHUNK;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  size_t threads = chunks < FILL_THREADS ? chunks : FILL_THREADS;
  if (cpus > 0 && threads > (size_t)cpus) threads = (size_t)cpus;
  fill_job jobs[FILL_THREADS];
  pthread_t th[FILL_THREADS];
  int started[FILL_THREADS] = {0};
  if (threads < 1) threads = 1;
  for (size_t i = 0; i < threads; i++) {
    jobs[i] = (fill_job){t, p, n, i, threads, seed, scale};
    if (i + 1 < threads && pthread_create(&th[i], NULL, fill_main, &jobs[i]) == 0)
      started[i] = 1;
    else
      fill_main(&jobs[i]); /* the last here, or any whose thread would not start */
  }
  for (size_t i = 0; i < threads; i++)
    if (started[i]) pthread_join(th[i], NULL);
}

static int alloc_dev(fm_CUdeviceptr *p, size_t bytes, char *why, size_t cap) {
  fm_CUresult r = W.cu->cuMemAlloc(p, bytes ? bytes : 1);
  if (r) {
    fm_diag d;
    fm_cuda_fail(W.cu, r, "cuMemAlloc", &d);
    snprintf(why, cap, "%.400s (%zu bytes)", d.text, bytes);
    *p = 0;
    return -1;
  }
  return 0;
}

/* Fills dst (bytes) by repeating the first `src_bytes` of src: timing inputs need realistic
 * values (no NaN storms), not fresh randomness. */
static int tile(fm_CUdeviceptr dst, size_t bytes, fm_CUdeviceptr src, size_t src_bytes) {
  for (size_t off = 0; off < bytes && src_bytes; off += src_bytes) {
    size_t n = bytes - off < src_bytes ? bytes - off : src_bytes;
    if (W.cu->cuMemcpyDtoD(dst + off, src, n)) return -1;
  }
  return 0;
}

/* The reference outputs of a bmm fragment whose kernel runs n products: every product when
 * n <= cap, else three strips of products (first, middle, last), which alone are then read
 * back and compared; each product on a thread of its own (fm_sample_reference: a product is
 * the fragment with a batch of one over tensors offset to it). */
static int reference_bmm(const fm_fragment *f, int64_t n, int64_t cap, const void *const *ins, void *const *outs,
                         fm_diag *d) {
  memset(&W.sample, 0, sizeof W.sample);
  W.sample.cut = 1;
  if (cap > BMM_VERIFY_BATCHES) cap = BMM_VERIFY_BATCHES;
  if (n <= cap) {
    for (int64_t z = 0; z < n; z++) fm_sample_add(&W.sample, z);
  } else {
    int64_t len = cap / MAX_STRIPS > 0 ? cap / MAX_STRIPS : 1;
    int64_t starts[MAX_STRIPS] = {0, n / 2 - len / 2, n - len};
    for (int i = 0; i < MAX_STRIPS; i++)
      for (int64_t z = 0; z < len; z++) fm_sample_add(&W.sample, starts[i] + z);
  }
  return fm_sample_reference(f, n, &W.sample, 0, ins, outs, d);
}

/* The reference outputs of GEMM fragment f (its matmul is ops[gemm]) at M = W.outer_v: all
 * rows when that is cheap, else the strips' rows (first, middle, last GEMM_STRIP_ROWS), each
 * row on a thread of its own as f with M = 1 over operands offset to that row (the fp64 dot
 * products of a large K are seconds of one core). B is told apart by position, never offset:
 * with a static M equal to K its shape alone would not tell it. */
static int reference_gemm(const fm_fragment *f, int gemm, const void *const *ins, void *const *outs, fm_diag *d) {
  const fm_opnode *mm = &f->ops[gemm];
  const fm_tensor *b = NULL;
  uint32_t fixed = 0;
  int g2 = fm_fragment_gemm_op2(f);
  for (uint32_t k = 0; k < f->n_inputs; k++) {
    int is_b = f->inputs[k].id == mm->args[mm->nargs - 1];
    if (is_b) b = &f->inputs[k];
    if (is_b || (g2 >= 0 && f->inputs[k].id == f->ops[g2].args[f->ops[g2].nargs - 1])) fixed |= 1u << k;
  }
  if (!b) return fm_diag_set(d, FM_EINVAL, "the matmul's B is not an input");
  int64_t M = W.outer_v, K = b->shape[0], N = b->shape[1];
  memset(&W.sample, 0, sizeof W.sample);
  if (M * N * K <= REF_MACS || M <= MAX_STRIPS * GEMM_STRIP_ROWS) return fm_reference_eval(f, M, ins, outs, d);
  int64_t starts[MAX_STRIPS] = {0, (M / 2) & ~(int64_t)(GEMM_STRIP_ROWS - 1), M - GEMM_STRIP_ROWS};
  W.sample.cut = 1;
  for (int i = 0; i < MAX_STRIPS; i++)
    for (int64_t r = 0; r < GEMM_STRIP_ROWS; r++) fm_sample_add(&W.sample, starts[i] + r);
  return fm_sample_reference(f, M, &W.sample, fixed, ins, outs, d);
}

/* The reference outputs at the verification size: a GEMM's (above), or a sample of a large
 * pointwise, row or cat fragment's blocks (fm_sample_choose), or every element. */
static int reference_outputs(const fm_fragment *f, int gemm, int bmm, int64_t bmm_cap, uint64_t seed,
                             const void *const *ins, void *const *outs, fm_diag *d) {
  if (bmm) return reference_bmm(f, W.outer_v, bmm_cap, ins, outs, d);
  if (gemm >= 0) return reference_gemm(f, gemm, ins, outs, d);
  fm_sample_choose(f, W.outer_v, seed, &W.sample);
  return fm_sample_reference(f, W.outer_v, &W.sample, 0, ins, outs, d);
}

/* Marks W.twin_of for a chain: an input laid out like the first product's A (dtype, rank,
 * shape, strides), which the client sends when an epilogue reads x (the MLP's residual); 1
 * when there is one. */
static int find_twins(const fm_fragment *f) {
  int any = 0, a = -1, gemm = fm_fragment_gemm_op(f);
  for (uint32_t k = 0; k < FM_MAX_INPUTS; k++) W.twin_of[k] = -1;
  if (!fm_fragment_is_chain(f) || gemm < 0) return 0;
  const fm_opnode *mm = &f->ops[gemm];
  for (uint32_t k = 0; k < f->n_inputs && a < 0; k++)
    if (f->inputs[k].id == mm->args[mm->nargs - 2]) a = (int)k;
  if (a < 0) return 0;
  const fm_tensor *e = &f->inputs[a];
  for (uint32_t k = 0; k < f->n_inputs; k++) {
    const fm_tensor *t = &f->inputs[k];
    int same = (int)k != a && e->dtype == t->dtype && e->rank == t->rank;
    for (uint32_t d = 0; same && d < t->rank; d++) same = e->shape[d] == t->shape[d] && e->strides[d] == t->strides[d];
    if (same) W.twin_of[k] = a;
    any |= same;
  }
  return any;
}

static int prepare(const uint8_t *canonical, size_t len, uint64_t seed, char *why, size_t cap) {
  msgpack_zone zone;
  msgpack_object obj;
  fm_diag d = {{0}};
  int rc = -1;
  release();
  if (!W.canon) W.canon = malloc(sizeof *W.canon);
  if (!W.canon) {
    snprintf(why, cap, "out of memory");
    return -1;
  }
  msgpack_zone_init(&zone, 4096);
  if (fm_msg_unpack(canonical, len, &fm_msg_reply_limits, &zone, &obj, &d) || fm_fragment_decode(&obj, W.canon, &d)) {
    snprintf(why, cap, "bad fragment: %.400s", d.text);
    goto out;
  }
  const fm_fragment *f = W.canon;
  int64_t inner = f->outputs[0].rank ? inner_elems(f) : 1;
  W.symbolic = fm_fragment_is_symbolic(f);
  memset(&W.sample, 0, sizeof W.sample);
  int gemm = fm_fragment_gemm_op(f), bmm = fm_fragment_is_bmm(f);
  int64_t bmm_cap = 0; /* bmm: the products whose reference fits REF_MACS (2..BMM_VERIFY_BATCHES) */
  if (bmm) {
    const fm_tensor *o = &f->outputs[0];
    int64_t macs = o->shape[1] * o->shape[2];
    for (uint32_t k = 0; k < f->n_inputs; k++)
      if (f->inputs[k].id == f->ops[gemm].args[0]) macs *= f->inputs[k].shape[2];
    bmm_cap = REF_MACS / (macs > 0 ? macs : 1);
    bmm_cap = bmm_cap < 2 ? 2 : bmm_cap > BMM_VERIFY_BATCHES ? BMM_VERIFY_BATCHES : bmm_cap;
  }
  if (W.symbolic && bmm) {
    /* outer is the batch: verify a few products, time the bucket's */
    W.outer_t = f->m_hint ? (int64_t)f->m_hint : BMM_VERIFY_BATCHES;
    W.outer_v = bmm_cap < W.outer_t ? bmm_cap : W.outer_t;
  } else if (W.symbolic && gemm >= 0 && f->m_hint) {
    W.outer_t = (int64_t)f->m_hint;
    W.outer_v = W.outer_t < GEMM_VERIFY_ROWS ? W.outer_t : GEMM_VERIFY_ROWS;
  } else if (W.symbolic) {
    W.outer_v = VERIFY_ELEMENTS / (inner ? inner : 1);
    if (W.outer_v < 1) W.outer_v = 1;
    W.outer_t = TIMING_ELEMENTS / (inner ? inner : 1);
    if (W.outer_t < 1) W.outer_t = 1;
    /* a column fragment's M bucket (the canonical form keeps m_hint nowhere else here):
       timed at it, verified on at most as many rows */
    if (f->m_hint) {
      W.outer_t = (int64_t)f->m_hint;
      if (W.outer_v > W.outer_t) W.outer_v = W.outer_t;
    }
  } else if (fm_fragment_is_cols(f)) { /* the outputs are [1, N]: M is the inputs' */
    fm_cols_info ci;
    W.outer_v = W.outer_t = fm_fragment_cols_info(f, &ci, NULL) == FM_OK ? ci.m : 1;
  } else {
    W.outer_v = W.outer_t = f->outputs[0].rank ? f->outputs[0].shape[0] : 1;
  }
  /* Cap a timing set at SET_BYTES_CAP by shrinking the symbolic outer. */
  for (;;) {
    size_t set = 0;
    for (uint32_t k = 0; k < f->n_inputs; k++)
      set += span_elems(&f->inputs[k], W.outer_t) * fm_dtype_size(f->inputs[k].dtype);
    for (uint32_t k = 0; k < f->n_outputs; k++)
      set += span_elems(&f->outputs[k], W.outer_t) * fm_dtype_size(f->outputs[k].dtype);
    if (!W.symbolic || set <= SET_BYTES_CAP || W.outer_t <= W.outer_v) {
      W.n_sets = set ? (int)((3ull * (uint64_t)W.l2_bytes + set - 1) / set) : 1;
      if (W.n_sets < 1) W.n_sets = 1;
      if (W.n_sets > MAX_SETS) W.n_sets = MAX_SETS;
      break;
    }
    W.outer_t /= 2;
  }

  /* Verification data on the host: random inputs, the reference outputs. */
  const void *ins[FM_MAX_INPUTS];
  void *outs[FM_MAX_OUTPUTS];
  uint64_t rng = seed ? seed : 0x9e3779b97f4a7c15ull;
  for (uint32_t k = 0; k < f->n_inputs; k++) {
    size_t n = span_elems(&f->inputs[k], W.outer_v), es = fm_dtype_size(f->inputs[k].dtype);
    W.in_bytes_v[k] = n * es;
    W.in_bytes_t[k] = span_elems(&f->inputs[k], W.outer_t) * es;
    W.h_in[k] = malloc(W.in_bytes_v[k] ? W.in_bytes_v[k] : 1);
    if (!W.h_in[k]) goto oom;
    fill_input(&f->inputs[k], W.h_in[k], n, rng ^ (uint64_t)(k + 1) * 0x2545F4914F6CDD1Dull, operand_scale(f, k));
    ins[k] = W.h_in[k];
  }
  { /* a pooling gradient's argmax holds tap indices: random floats would name no tap, and
       every gradient would be zero */
    void *taps[FM_MAX_INPUTS];
    for (uint32_t k = 0; k < f->n_inputs; k++) taps[k] = W.h_in[k];
    if (fm_reference_window_taps(f, W.outer_v, rng, taps)) {
      snprintf(why, cap, "reference: a pooling gradient's tap indices");
      goto out;
    }
    /* labels or token numbers: small integers, the fragment's constants among them */
    fm_reference_integer_inputs(f, W.outer_v, rng, taps);
    /* likewise an index_add's index (rows of the output) and take_rows' (rows of its src),
       both ends of the range among them */
    if (fm_reference_index_rows(f, rng, taps)) {
      snprintf(why, cap, "reference: an index_add's index rows");
      goto out;
    }
  }
  for (uint32_t k = 0; k < f->n_outputs; k++) {
    size_t es = fm_dtype_size(f->outputs[k].dtype);
    W.out_bytes_v[k] = span_elems(&f->outputs[k], W.outer_v) * es;
    W.out_bytes_t[k] = span_elems(&f->outputs[k], W.outer_t) * es;
    W.h_ref[k] = calloc(1, W.out_bytes_v[k] ? W.out_bytes_v[k] : 1);
    W.h_out[k] = malloc(W.out_bytes_v[k] ? W.out_bytes_v[k] : 1);
    if (!W.h_ref[k] || !W.h_out[k]) goto oom;
    outs[k] = W.h_ref[k];
  }
  if (reference_outputs(f, gemm, bmm, bmm_cap, seed, ins, outs, &d)) {
    snprintf(why, cap, "reference: %.400s", d.text);
    goto out;
  }
  if (find_twins(f)) { /* the second reference: each twin reads A's values */
    for (uint32_t k = 0; k < f->n_inputs; k++)
      if (W.twin_of[k] >= 0) ins[k] = W.h_in[W.twin_of[k]];
    for (uint32_t k = 0; k < f->n_outputs; k++) {
      W.h_ref_twins[k] = calloc(1, W.out_bytes_v[k] ? W.out_bytes_v[k] : 1);
      if (!W.h_ref_twins[k]) goto oom;
      outs[k] = W.h_ref_twins[k];
    }
    if (reference_outputs(f, gemm, bmm, bmm_cap, seed, ins, outs, &d)) {
      snprintf(why, cap, "reference (twins): %.400s", d.text);
      goto out;
    }
  }
  /* Device buffers: the verification set, then the timing sets (inputs tiled from it). */
  for (uint32_t k = 0; k < f->n_inputs; k++) {
    if (alloc_dev(&W.verify.in[k], W.in_bytes_v[k], why, cap)) goto out;
    if (W.cu->cuMemcpyHtoD(W.verify.in[k], W.h_in[k], W.in_bytes_v[k])) goto copy_failed;
    if (alloc_dev(&W.pristine[k], W.in_bytes_v[k], why, cap)) goto out;
    if (W.cu->cuMemcpyDtoD(W.pristine[k], W.verify.in[k], W.in_bytes_v[k])) goto copy_failed;
  }
  for (uint32_t k = 0; k < f->n_outputs; k++)
    if (alloc_dev(&W.verify.out[k], W.out_bytes_v[k], why, cap)) goto out;
  for (int s = 0; s < W.n_sets; s++) {
    for (uint32_t k = 0; k < f->n_inputs; k++) {
      if (alloc_dev(&W.sets[s].in[k], W.in_bytes_t[k], why, cap)) goto out;
      if (tile(W.sets[s].in[k], W.in_bytes_t[k], W.verify.in[k], W.in_bytes_v[k])) goto copy_failed;
    }
    for (uint32_t k = 0; k < f->n_outputs; k++)
      if (alloc_dev(&W.sets[s].out[k], W.out_bytes_t[k], why, cap)) goto out;
  }
  if (W.cu->cuCtxSynchronize()) goto copy_failed;
  W.ready = 1;
  rc = 0;
  goto out;
copy_failed:
  snprintf(why, cap, "copying the inputs to the GPU failed");
  goto out;
oom:
  snprintf(why, cap, "out of host memory");
out:
  msgpack_zone_destroy(&zone);
  if (rc) release();
  return rc;
}

/* ---- verification ---- */

static double load_elem(fm_dtype dt, const uint8_t *p) {
  uint16_t h;
  float f;
  switch (dt) {
    case FM_DT_BOOL:
      return p[0] ? 1.0 : 0.0;
    case FM_DT_F32:
      memcpy(&f, p, 4);
      return f;
    case FM_DT_BF16:
      memcpy(&h, p, 2);
      return fm_reference_bf16_to_f32(h);
    case FM_DT_F16:
      memcpy(&h, p, 2);
      return fm_reference_f16_to_f32(h);
    case FM_DT_I64: { /* integer values (vocab 10): exact below 2^53, compared exactly */
      int64_t v;
      memcpy(&v, p, 8);
      return (double)v;
    }
    default:
      return NAN;
  }
}

/* Compares output k over the iteration shape, or over the sample's blocks when the reference
 * computed only those; returns its relative error (INFINITY for a NaN where the reference is
 * finite, a differing infinity, or a wrong bool), and in *peak the largest error of an
 * element relative to the largest reference element. */
static double compare_output(uint32_t k, const uint8_t *ref, double *peak, char *why, size_t cap) {
  const fm_tensor *t = &W.canon->outputs[k];
  size_t es = fm_dtype_size(t->dtype);
  int64_t size[FM_MAX_RANK];
  for (uint32_t d = 0; d < t->rank; d++) size[d] = (d == 0 && t->shape[0] == FM_DIM_SYMBOLIC) ? W.outer_v : t->shape[d];
  uint32_t cut = W.sample.n ? W.sample.cut : 0;
  int blocks = W.sample.n ? W.sample.n : 1;
  double num = 0, den = 0, worst = 0, largest = 0;
  int64_t e = 0;
  for (int b = 0; b < blocks; b++) {
    int64_t base = W.sample.n ? fm_sample_offset(W.canon, W.outer_v, &W.sample, b, t) : 0;
    int64_t idx[FM_MAX_RANK] = {0}, n = 1;
    for (uint32_t d = cut; d < t->rank; d++) n *= size[d];
    for (int64_t i = 0; i < n; i++, e++) {
      int64_t off = base;
      for (uint32_t d = cut; d < t->rank; d++) off += idx[d] * t->strides[d];
      double r = load_elem(t->dtype, ref + (size_t)off * es);
      double o = load_elem(t->dtype, W.h_out[k] + (size_t)off * es);
      const int exact = t->dtype == FM_DT_BOOL || t->dtype == FM_DT_I64;
      if (exact ? r != o : (isinf(r) ? o != r : (isfinite(r) && !isfinite(o)))) {
        snprintf(why, cap, "outputs[%u] element %lld: got %g, reference %g", k, (long long)e, o, r);
        return INFINITY;
      }
      if (isfinite(r)) {
        num += (o - r) * (o - r);
        den += r * r;
        worst = fmax(worst, fabs(o - r));
        largest = fmax(largest, fabs(r));
      }
      for (int d = (int)t->rank - 1; d >= (int)cut; d--) {
        if (++idx[d] < size[d]) break;
        idx[d] = 0;
      }
    }
  }
  *peak = largest > 0 ? worst / largest : worst;
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

/* Exits the process after replying: a failed launch leaves the context unusable. */
static void launch_failed(uint64_t id, const char *what) {
  reply_verdict(id, "launch_failed", -1, -1, what);
  exit(3);
}

/* Copies output k back to the host: only the memory spans of the sample's blocks when the
 * reference computed a sample (a large GEMM: 24 rows instead of every row) and they are
 * smaller than the whole. */
static fm_CUresult read_back(uint32_t k) {
  const fm_tensor *t = &W.canon->outputs[k];
  size_t es = fm_dtype_size(t->dtype), spans = 0;
  int64_t extent = 1; /* elements a block spans: the last element of the uncut dims, plus one */
  for (uint32_t d = W.sample.cut; d < t->rank; d++) {
    int64_t size = (d == 0 && t->shape[0] == FM_DIM_SYMBOLIC) ? W.outer_v : t->shape[d];
    if (size > 1) extent += (size - 1) * t->strides[d];
  }
  if (W.sample.n) spans = (size_t)W.sample.n * (size_t)extent * es;
  if (!W.sample.n || spans >= W.out_bytes_v[k])
    return W.cu->cuMemcpyDtoH(W.h_out[k], W.verify.out[k], W.out_bytes_v[k]);
  for (int b = 0; b < W.sample.n; b++) {
    size_t off = (size_t)fm_sample_offset(W.canon, W.outer_v, &W.sample, b, t) * es;
    size_t len = (size_t)extent * es;
    if (off >= W.out_bytes_v[k]) continue;
    if (len > W.out_bytes_v[k] - off) len = W.out_bytes_v[k] - off;
    fm_CUresult r = W.cu->cuMemcpyDtoH(W.h_out[k] + off, W.verify.out[k] + off, len);
    if (r) return r;
  }
  return 0;
}

/* One verification launch of m: the inputs restored (a wrong kernel may have scribbled on
 * them; a wild write that hit the pristine copy too could only make later candidates fail,
 * never pass: the reference is the host's), each twin reading A's memory when
 * twins is set, the outputs poisoned, then compared with the reference (refs). 0 and the
 * worst relative error in *rel, or 1 with the reason in why. A launch failure exits. */
static int check_launch(uint64_t id, fm_module *m, fm_CUdeviceptr scratch, int twins, uint8_t *const *refs, double *rel,
                        char *why, size_t cap) {
  const fm_cuda *cu = W.cu;
  const fm_fragment *f = W.canon;
  fm_diag d = {{0}};
  void *ins[FM_MAX_INPUTS], *outs[FM_MAX_OUTPUTS + 1];
  fm_CUresult r;
  for (uint32_t i = 0; i < f->n_inputs; i++) {
    cu->cuMemcpyDtoD(W.verify.in[i], W.pristine[i], W.in_bytes_v[i]);
    ins[i] = (void *)(uintptr_t)W.verify.in[W.twin_of[i] >= 0 && twins ? (uint32_t)W.twin_of[i] : i];
  }
  for (uint32_t i = 0; i < f->n_outputs; i++) {
    /* an index_add adds into its output, which its caller zeroes (and a row no index names
       stays 0, as the reference's does) */
    cu->cuMemsetD8(W.verify.out[i], fm_fragment_is_scatter(f) ? 0 : 0xFF, W.out_bytes_v[i]);
    outs[i] = (void *)(uintptr_t)W.verify.out[i];
  }
  outs[f->n_outputs] = (void *)(uintptr_t)scratch;
  if (fm_module_launch(m, ins, outs, W.outer_v, NULL, &d)) launch_failed(id, d.text);
  if ((r = cu->cuCtxSynchronize()) != 0) {
    fm_cuda_fail(cu, r, "verification launch", &d);
    launch_failed(id, d.text);
  }
  for (uint32_t i = 0; i < f->n_outputs; i++) {
    if ((r = read_back(i)) != 0) {
      fm_cuda_fail(cu, r, "reading the outputs back", &d);
      launch_failed(id, d.text);
    }
    double peak = 0, e = compare_output(i, refs[i], &peak, why, cap);
    double tol = fm_reference_tolerance(f, i);
    if (!(e <= tol)) {
      if (!why[0]) snprintf(why, cap, "outputs[%u]: relative error %.3g > %.3g", i, e, tol);
      *rel = isfinite(e) ? e : -1;
      return 1;
    }
    /* an iota's compare selects one element a row (a one-hot): selected at the wrong column,
       two elements of a long row are off by a whole value, which the norm above averages
       below its tolerance; every element stays within the tolerance of the largest one */
    if (fm_fragment_has_iota(f) && !(peak <= tol)) {
      snprintf(why, cap, "outputs[%u]: an element off by %.3g of the largest > %.3g", i, peak, tol);
      *rel = e;
      return 1;
    }
    if (e > *rel) *rel = e;
  }
  return 0;
}

/* Verifies m at the verification size: 0 and the worst relative error in *rel, or 1 with the
 * reason in why (wrong). With twins (a chain's x sent twice), twice: every input a memory of
 * its own, then each twin reading A's (the path a model's launches take). */
static int verify(uint64_t id, fm_module *m, fm_CUdeviceptr scratch, double *rel, char *why, size_t cap) {
  *rel = 0;
  if (check_launch(id, m, scratch, 0, W.h_ref, rel, why, cap)) return 1;
  if (!W.h_ref_twins[0]) return 0;
  if (check_launch(id, m, scratch, 1, W.h_ref_twins, rel, why, cap)) {
    char first[400];
    snprintf(first, sizeof first, "%s", why);
    snprintf(why, cap, "with the twin inputs sharing memory: %s", first);
    return 1;
  }
  return 0;
}

/* The median time of m at the timing size, rotating the buffer sets so no launch finds its
 * operands in L2; the spread in why. A launch failure exits. */
static double time_launches(uint64_t id, fm_module *m, fm_CUdeviceptr scratch, char *why, size_t cap) {
  const fm_cuda *cu = W.cu;
  const fm_fragment *f = W.canon;
  fm_diag d = {{0}};
  void *ins[FM_MAX_INPUTS], *outs[FM_MAX_OUTPUTS + 1];
  float times[TIMED];
  fm_CUresult r;
  outs[f->n_outputs] = (void *)(uintptr_t)scratch;
  for (int i = 0; i < WARMUPS + TIMED; i++) {
    const tset *s = &W.sets[i % W.n_sets];
    for (uint32_t j = 0; j < f->n_inputs; j++) /* twins share memory, as in a model */
      ins[j] = (void *)(uintptr_t)s->in[W.twin_of[j] >= 0 ? (uint32_t)W.twin_of[j] : j];
    for (uint32_t j = 0; j < f->n_outputs; j++) outs[j] = (void *)(uintptr_t)s->out[j];
    int t = i - WARMUPS;
    if (t >= 0) cu->cuEventRecord(W.ev[2 * t], NULL);
    if (fm_module_launch(m, ins, outs, W.outer_t, NULL, &d)) launch_failed(id, d.text);
    if (t >= 0) cu->cuEventRecord(W.ev[2 * t + 1], NULL);
  }
  if ((r = cu->cuCtxSynchronize()) != 0) {
    fm_cuda_fail(cu, r, "timing launches", &d);
    launch_failed(id, d.text);
  }
  for (int t = 0; t < TIMED; t++) {
    if (cu->cuEventElapsedTime(&times[t], W.ev[2 * t], W.ev[2 * t + 1])) times[t] = INFINITY;
  }
  qsort(times, TIMED, sizeof times[0], cmp_float);
  snprintf(why, cap, "median of %d at outer %lld, %d buffer set(s); min %.4f max %.4f ms", TIMED, (long long)W.outer_t,
           W.n_sets, times[0], times[TIMED - 1]);
  return (times[TIMED / 2 - 1] + times[TIMED / 2]) / 2.0;
}

/* A cuBLASLt plan without an algorithm: each of the heuristic's first choices at the timing
 * size is verified and timed, the fastest kept; the reply carries its algo (the plan). */
static void search_blas(uint64_t id, fm_module *m, fm_CUdeviceptr scratch) {
  fm_diag d = {{0}};
  char why[512] = "", best_why[512] = "";
  double best_ms = INFINITY, best_rel = -1;
  int best = -1, wrong = 0;
  uint8_t algo[FM_META_ALGO_BYTES];
  int n = fm_module_blas_search(m, W.outer_t, BLAS_CHOICES, &d);
  if (n < 0) {
    reply_verdict(id, "load_failed", -1, -1, d.text);
    return;
  }
  for (int i = 0; i < n; i++) {
    double rel;
    why[0] = '\0';
    if (fm_module_blas_choose(m, i, &d)) continue;
    if (verify(id, m, scratch, &rel, why, sizeof why)) {
      wrong++;
      snprintf(best_why, sizeof best_why, "choice %d: %.480s", i, why); /* kept if none verifies */
      continue;
    }
    double ms = time_launches(id, m, scratch, why, sizeof why);
    if (ms < best_ms) {
      best_ms = ms;
      best_rel = rel;
      best = i;
      snprintf(best_why, sizeof best_why, "cuBLASLt choice %d of %d (%d wrong); %.400s", i, n, wrong, why);
    }
  }
  if (best < 0 || fm_module_blas_choose(m, best, &d) || fm_module_blas_algo(m, algo)) {
    reply_verdict(id, "wrong", -1, -1, best_why[0] ? best_why : "no cuBLASLt choice verified");
    return;
  }
  reply_verdict_algo(id, "ok", best_rel, best_ms, best_why, algo);
}

static void run(uint64_t id, const fm_compiled *k) {
  const fm_fragment *f = W.canon;
  fm_module *m = NULL;
  fm_diag d = {{0}};
  char why[512] = "";
  fm_CUdeviceptr scratch = 0;
  double rel;

  if (fm_module_load(k, &m, &d)) {
    reply_verdict(id, "load_failed", -1, -1, d.text);
    return;
  }
  if (k->meta.n_inputs != f->n_inputs || k->meta.n_outputs != f->n_outputs) {
    reply_verdict(id, "load_failed", -1, -1, "metadata does not match the fragment's inputs/outputs");
    goto out;
  }
  uint64_t sv = fm_module_scratch_bytes(m, W.outer_v), st = fm_module_scratch_bytes(m, W.outer_t);
  if ((sv || st) && alloc_dev(&scratch, sv > st ? sv : st, why, sizeof why)) {
    reply_verdict(id, "load_failed", -1, -1, why);
    goto out;
  }
  if (k->meta.blas.form[0] && !k->meta.blas.has_algo) {
    search_blas(id, m, scratch);
    goto out;
  }
  if (verify(id, m, scratch, &rel, why, sizeof why)) {
    reply_verdict(id, "wrong", rel, -1, why);
    goto out;
  }
  double ms = time_launches(id, m, scratch, why, sizeof why);
  reply_verdict(id, "ok", rel, ms, why);
out:
  if (scratch) W.cu->cuMemFree(scratch);
  fm_module_unload(m);
}

/* ---- main ---- */

static int init_cuda(char *name, size_t cap, char *why, size_t why_cap) {
  fm_diag d = {{0}};
  fm_CUdevice dev;
  fm_CUresult r;
  if (fm_cuda_load(&W.cu, &d)) {
    snprintf(why, why_cap, "%s", d.text);
    return -1;
  }
  if ((r = W.cu->cuDeviceGet(&dev, 0)) || (r = W.cu->cuDevicePrimaryCtxRetain(&W.ctx, dev)) ||
      (r = W.cu->cuCtxSetCurrent(W.ctx))) {
    fm_cuda_fail(W.cu, r, "creating the context", &d);
    snprintf(why, why_cap, "%s", d.text);
    return -1;
  }
  W.cu->cuDeviceGetName(name, (int)cap, dev);
  if (W.cu->cuDeviceGetAttribute(&W.l2_bytes, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, dev)) W.l2_bytes = 50 << 20;
  for (int i = 0; i < 2 * TIMED; i++) {
    if ((r = W.cu->cuEventCreate(&W.ev[i], 0)) != 0) {
      fm_cuda_fail(W.cu, r, "cuEventCreate", &d);
      snprintf(why, why_cap, "%s", d.text);
      return -1;
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  char name[192] = "", why[1024] = "";
  W.fd = -1;
  for (int i = 1; i + 1 < argc; i++)
    if (strcmp(argv[i], "--fd") == 0) W.fd = atoi(argv[i + 1]);
  if (W.fd < 0) {
    fprintf(stderr, "usage: fusemld-tuner --fd N (started by fusemld)\n");
    return 2;
  }
  /* A context of our own, never an MPS client's: a fault must not reach other processes. */
  for (int again = 1; again;) {
    again = 0;
    for (char **e = environ; e && *e; e++) {
      if (strncmp(*e, "CUDA_MPS_", 9) == 0) {
        char var[256];
        size_t n = strcspn(*e, "=");
        snprintf(var, sizeof var, "%.*s", (int)n, *e);
        unsetenv(var);
        again = 1;
        break;
      }
    }
  }
  fm_frame_reader_init(&W.rd, FM_FRAME_MAX_REPLY);
  if (init_cuda(name, sizeof name, why, sizeof why)) {
    reply_status("ready", 0, 0, "", why);
    return 1;
  }
  reply_status("ready", 0, 1, name, "");

  const uint8_t *p;
  size_t n;
  while (read_frame(&p, &n)) {
    msgpack_zone zone;
    msgpack_object req;
    fm_diag d = {{0}};
    uint64_t id = 0;
    msgpack_zone_init(&zone, 4096);
    if (fm_msg_unpack(p, n, &fm_msg_reply_limits, &zone, &req, &d)) {
      msgpack_zone_destroy(&zone);
      return 1;
    }
    fm_msg_get_u64(&req, "id", &id, NULL);
    const msgpack_object *op = fm_msg_get(&req, "op");
    if (fm_msg_str_eq(op, "prepare")) {
      const uint8_t *canonical;
      size_t len;
      uint64_t seed = 0;
      fm_msg_get_u64(&req, "seed", &seed, NULL);
      if (fm_msg_get_bin(&req, "canonical", &canonical, &len, &d))
        reply_status(NULL, id, 0, NULL, "prepare without \"canonical\"");
      else if (prepare(canonical, len, seed, why, sizeof why))
        reply_status(NULL, id, 0, NULL, why);
      else
        reply_status(NULL, id, 1, NULL, "");
    } else if (fm_msg_str_eq(op, "run")) {
      fm_compiled k;
      const uint8_t *cubin;
      const msgpack_object *meta = fm_msg_get(&req, "meta");
      memset(&k, 0, sizeof k);
      if (!W.ready) {
        reply_verdict(id, "load_failed", -1, -1, "run before prepare");
      } else if (fm_msg_get_bin(&req, "cubin", &cubin, &k.cubin_len, &d) || !meta ||
                 fm_meta_unpack(meta, &k.meta, &d)) {
        reply_verdict(id, "load_failed", -1, -1, d.text[0] ? d.text : "run without cubin/meta");
      } else {
        /* A copy: the driver wants an ELF image aligned as malloc aligns, not a frame offset. */
        k.cubin = malloc(k.cubin_len ? k.cubin_len : 1);
        if (!k.cubin) {
          reply_verdict(id, "load_failed", -1, -1, "out of host memory");
        } else {
          memcpy(k.cubin, cubin, k.cubin_len);
          snprintf(k.kind, sizeof k.kind, "%s", k.meta.kind);
          run(id, &k);
          free(k.cubin);
        }
      }
    } else {
      reply_status(NULL, id, 0, NULL, "unknown op");
    }
    msgpack_zone_destroy(&zone);
  }
  release();
  free(W.canon);
  return 0;
}
