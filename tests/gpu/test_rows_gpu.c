/* test_rows_gpu.c (device machine only): row fragments (softmax, layer_norm, rms_norm with
 * and without a residual prologue, every statistic with a per-row input) over N in
 * {1, 7, 127, 1000, 4099, 8192}, cross-entropy's statistics with the column index read or computed
 * (iota), and the streamed rows (softmax, rms_norm, N in {50257,
 * 131072}: no var, which needs the row held), bf16/f16/f32, symbolic and static rows, compiled locally
 * (codegen + NVRTC for this GPU, every candidate of the rows template, compiles in parallel)
 * and launched through libfusemld; each output is checked against the CPU reference
 * (fm_reference_eval, fp64) by ‖out−ref‖/‖ref‖ on random inputs, outputs poisoned with NaN
 * before the launch so unwritten elements fail. NaN where the reference has NaN (var of one
 * element with correction 1) matches.
 *
 * Usage: test_rows_gpu [SEED [KINDS]]   KINDS: kind names, comma-separated (default: all).
 * Prints one line per case and "N passed, N failed". */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen.h"
#include "fm_cuda.h"
#include "fm_fragment.h"
#include "fm_module.h"
#include "fm_nvrtc.h"
#include "fm_reference.h"
#include "gpu_util.h"

#define MAX_JOBS  2048
#define MAX_CASES 320
#define N_THREADS 16

/* K_MASKED: softmax of rows with -inf entries (an attention mask): the first third of a row
 * and every fifth element after it, and every fourth row whole (NaN out, as torch's);
 * K_XENT: cross-entropy's row statistics as the client sends them (the log-sum-exp and the
 * picked logit, from a [.., n] f32 column index and a per-row f32 target, some -1);
 * K_SOFTCAP_XENT: Gemma 2's: the logits softcapped (tanh(x / 30) * 30) and written, beside
 * K_XENT's statistics of them (a row output no reduction precedes: stored in the first pass);
 * K_IOTA_XENT: K_XENT with the column index the fragment's iota (vocabulary 11), not an input,
 * and the logits at a row stride padded to 8 (their vectors end inside odd rows). */
enum {
  K_SOFTMAX,
  K_LAYER_NORM,
  K_RMS_NORM,
  K_RMS_RESIDUAL,
  K_STATS,
  K_MASKED,
  K_XENT,
  K_SOFTCAP_XENT,
  K_IOTA_XENT,
  K__N
};
static const char *const kind_name[K__N] = {"softmax", "layer_norm", "rms_norm",     "rms_residual", "stats",
                                            "masked",  "xent",       "softcap_xent", "iota_xent"};

typedef struct tcase {
  char name[96];
  int kind;
  fm_fragment canon;
  int64_t outer; /* launch dim 0 (symbolic) */
} tcase;

typedef struct job {
  int c; /* case index */
  fm_candidate cand;
  char desc[96];
  fm_compiled k;
  char *err;
  int rc;
} job;

static const fm_cuda *cu;
static fm_device_id dev;
static tcase cases[MAX_CASES];
static job jobs[MAX_JOBS];
static int n_cases, n_jobs, next_job, passed, failed;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- fragments --------------------------------------------------------------------- */

static void tensor(fm_tensor *t, uint32_t id, fm_dtype dt, uint32_t rank, const int64_t *shape) {
  memset(t, 0, sizeof *t);
  t->id = id;
  t->dtype = dt;
  t->rank = rank;
  int64_t s = 1;
  for (uint32_t i = rank; i-- > 0;) {
    t->shape[i] = shape[i];
    t->strides[i] = s;
    s *= shape[i] > 0 ? shape[i] : 1;
  }
  t->align = 16;
}

static void op(fm_fragment *f, fm_op o, uint32_t out, uint32_t nargs, uint32_t a0, uint32_t a1, uint32_t a2,
               double value) {
  fm_opnode *n = &f->ops[f->n_ops++];
  memset(n, 0, sizeof *n);
  n->op = o;
  n->out = out;
  n->nargs = nargs;
  n->args[0] = a0;
  n->args[1] = a1;
  n->args[2] = a2;
  n->value = value;
  n->dim = -1;
  n->correction = 1;
}

/* kind over rows [lead..., n] of dtype dt; symbolic: dim 0 is -1. */
static int build(int kind, fm_dtype dt, int64_t n, int symbolic, fm_fragment *canon) {
  static fm_fragment f;
  fm_diag d = {{0}};
  int64_t x[3], w[3], s[3];
  uint32_t r = symbolic ? 2 : 3;
  if (symbolic) {
    x[0] = -1, x[1] = n;
  } else {
    x[0] = 3, x[1] = 5, x[2] = n;
  }
  for (uint32_t i = 0; i < r; i++) w[i] = i + 1 == r ? n : 1, s[i] = i + 1 == r ? 1 : x[i];
  memset(&f, 0, sizeof f);
  f.vocab = 2;
  f.n_inputs = 1;
  tensor(&f.inputs[0], 0, dt, r, x);
  switch (kind) {
    case K_SOFTMAX:
    case K_MASKED:
      op(&f, FM_OP_SOFTMAX, 10, 1, 0, 0, 0, 0);
      f.n_outputs = 1;
      tensor(&f.outputs[0], 10, dt, r, x);
      break;
    case K_LAYER_NORM:
      f.n_inputs = 3;
      tensor(&f.inputs[1], 1, dt, r, w);
      tensor(&f.inputs[2], 2, dt, r, w);
      op(&f, FM_OP_LAYER_NORM, 10, 3, 0, 1, 2, 1e-5);
      f.n_outputs = 1;
      tensor(&f.outputs[0], 10, dt, r, x);
      break;
    case K_RMS_NORM:
      f.n_inputs = 2;
      tensor(&f.inputs[1], 1, dt, r, w);
      op(&f, FM_OP_RMS_NORM, 10, 2, 0, 1, 0, 1e-6);
      f.n_outputs = 1;
      tensor(&f.outputs[0], 10, dt, r, x);
      break;
    case K_RMS_RESIDUAL: /* s = x + res; y = rms_norm(s, w); outputs y and s */
      f.n_inputs = 3;
      tensor(&f.inputs[1], 1, dt, r, x);
      tensor(&f.inputs[2], 2, dt, r, w);
      op(&f, FM_OP_ADD, 9, 2, 0, 1, 0, 0);
      op(&f, FM_OP_RMS_NORM, 10, 2, 9, 2, 0, 1e-6);
      f.n_outputs = 2;
      tensor(&f.outputs[0], 10, dt, r, x);
      tensor(&f.outputs[1], 9, dt, r, x);
      break;
    case K_STATS: { /* sum, mean, amax, var c=0, var c=1, (x - amax) * scale[.., 1] */
      static const fm_op st[5] = {FM_OP_SUM, FM_OP_MEAN, FM_OP_AMAX, FM_OP_VAR, FM_OP_VAR};
      f.n_inputs = 2;
      tensor(&f.inputs[1], 1, FM_DT_F32, r, s);
      for (uint32_t i = 0; i < 5; i++) {
        op(&f, st[i], 10 + i, 1, 0, 0, 0, 0);
        f.ops[f.n_ops - 1].correction = i == 4;
        tensor(&f.outputs[f.n_outputs++], 10 + i, dt, r, s);
      }
      op(&f, FM_OP_SUB, 20, 2, 0, 12, 0, 0);
      op(&f, FM_OP_MUL, 21, 2, 20, 1, 0, 0);
      op(&f, FM_OP_CAST, 22, 1, 21, 0, 0, 0);
      f.ops[f.n_ops - 1].dtype = dt;
      tensor(&f.outputs[f.n_outputs++], 22, dt, r, x);
      break;
    }
    case K_XENT: /* x32 = f32(x); lse = log(sum(exp(x32 - amax))) + amax; picked = sum(where(cols == t, x32, 0)) */
    case K_SOFTCAP_XENT:         /* the same of x32 = f32(tanh(x / 30) * 30), which is written too */
    case K_IOTA_XENT: {          /* K_XENT's with cols = iota */
      if (kind == K_IOTA_XENT) { /* the logits at a padded row stride, as GPT-2's head writes
                                    them: rows whose vectors end inside them (ragged) */
        const int64_t ld = (n + 7) / 8 * 8;
        f.inputs[0].strides[r - 2] = ld;
        if (r == 3) f.inputs[0].strides[0] = x[1] * ld;
        f.vocab = FM_VOCAB_IOTA;
        f.n_inputs = 2;
        tensor(&f.inputs[1], 2, FM_DT_F32, r, s);
        op(&f, FM_OP_IOTA, 1, 0, 0, 0, 0, 0.0);
        f.ops[f.n_ops - 1].dtype = FM_DT_F32;
      } else {
        f.n_inputs = 3;
        tensor(&f.inputs[1], 1, FM_DT_F32, r, w);
        tensor(&f.inputs[2], 2, FM_DT_F32, r, s);
      }
      uint32_t logits = 0;
      if (kind == K_SOFTCAP_XENT) {
        op(&f, FM_OP_CONST, 20, 0, 0, 0, 0, 30.0);
        op(&f, FM_OP_DIV, 21, 2, 0, 20, 0, 0);
        op(&f, FM_OP_TANH, 22, 1, 21, 0, 0, 0);
        op(&f, FM_OP_MUL, 23, 2, 22, 20, 0, 0);
        op(&f, FM_OP_CAST, 24, 1, 23, 0, 0, 0);
        f.ops[f.n_ops - 1].dtype = dt;
        logits = 24;
      }
      op(&f, FM_OP_CAST, 3, 1, logits, 0, 0, 0);
      f.ops[f.n_ops - 1].dtype = FM_DT_F32;
      op(&f, FM_OP_AMAX, 4, 1, 3, 0, 0, 0);
      op(&f, FM_OP_SUB, 5, 2, 3, 4, 0, 0);
      op(&f, FM_OP_EXP, 6, 1, 5, 0, 0, 0);
      op(&f, FM_OP_SUM, 7, 1, 6, 0, 0, 0);
      op(&f, FM_OP_LOG, 8, 1, 7, 0, 0, 0);
      op(&f, FM_OP_ADD, 9, 2, 8, 4, 0, 0);
      op(&f, FM_OP_EQ, 11, 2, 1, 2, 0, 0);
      op(&f, FM_OP_CONST, 12, 0, 0, 0, 0, 0.0);
      op(&f, FM_OP_WHERE, 13, 3, 11, 3, 12, 0);
      op(&f, FM_OP_SUM, 14, 1, 13, 0, 0, 0);
      f.n_outputs = 2;
      tensor(&f.outputs[0], 9, FM_DT_F32, r, s);
      tensor(&f.outputs[1], 14, FM_DT_F32, r, s);
      if (kind == K_SOFTCAP_XENT) tensor(&f.outputs[f.n_outputs++], logits, dt, r, x);
      break;
    }
    default:
      return -1;
  }
  int rc = fm_fragment_expand(&f, &d);
  if (!rc) rc = fm_fragment_validate(&f, &d);
  if (!rc) rc = fm_fragment_canonicalize(&f, canon);
  if (rc) fprintf(stderr, "build %s: %s: %s\n", kind_name[kind], fm_strerror(rc), d.text);
  return rc;
}

/* ---- compile (parallel) ----------------------------------------------------------- */

static void *compile_worker(void *arg) {
  (void)arg;
  for (;;) {
    pthread_mutex_lock(&lock);
    int i = next_job < n_jobs ? next_job++ : -1;
    pthread_mutex_unlock(&lock);
    if (i < 0) return NULL;
    job *j = &jobs[i];
    j->rc = gu_build_candidate(&cases[j->c].canon, &j->cand, dev.sm_count, dev.arch, "rows.cu", &j->k.cubin,
                               &j->k.cubin_len, &j->k.meta, &j->err);
  }
}

/* ---- run and check ------------------------------------------------------------------ */

static double rel_err(const void *a, const void *b, fm_dtype dt, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double x = gu_load(a, dt, i), y = gu_load(b, dt, i);
    if (isnan(y) && isnan(x)) continue; /* torch's NaN (var of one element, c=1) */
    if (!isfinite(x) || !isfinite(y)) {
      if (x != y) return INFINITY;
      continue;
    }
    num += (x - y) * (x - y);
    den += y * y;
  }
  if (den == 0) return num == 0 ? 0 : INFINITY;
  return sqrt(num / den);
}

static void fill(void *h, const fm_tensor *t, size_t n, gu_rng *rng, int which) {
  for (size_t i = 0; i < n; i++) {
    double v = which == 0 ? gu_uniform(rng, -3, 3) : gu_uniform(rng, 0.5, 1.5);
    gu_store(h, t->dtype, i, v);
  }
}

/* The kinds whose inputs are not plain random values: K_MASKED's -inf entries, K_XENT's column
 * index (exact in f32: rows are at most 2^20 long) and targets. */
static void fill_special(const tcase *c, void *const *h_in, const size_t *n_in, gu_rng *rng) {
  const fm_fragment *f = &c->canon;
  const int64_t n = f->inputs[0].shape[f->inputs[0].rank - 1];
  if (c->kind == K_MASKED)
    for (size_t i = 0; i < n_in[0]; i++) {
      const int64_t row = (int64_t)i / n, j = (int64_t)i % n;
      if (row % 4 == 3 || j < n / 3 || j % 5 == 1) gu_store(h_in[0], f->inputs[0].dtype, i, -INFINITY);
    }
  if (c->kind == K_XENT || c->kind == K_SOFTCAP_XENT || c->kind == K_IOTA_XENT) {
    const int target = c->kind == K_IOTA_XENT ? 1 : 2; /* the iota's fragment reads no columns */
    if (target == 2)
      for (size_t i = 0; i < n_in[1]; i++) gu_store(h_in[1], FM_DT_F32, i, (double)((int64_t)i % n));
    for (size_t i = 0; i < n_in[target]; i++) {
      const double t = floor(gu_uniform(rng, -0.2, 1.0) * (double)n); /* some below 0: ignored, -1 */
      gu_store(h_in[target], FM_DT_F32, i, t < 0 ? -1.0 : t >= (double)n ? (double)(n - 1) : t);
    }
  }
}

static void run_job(job *j, gu_rng *rng) {
  tcase *c = &cases[j->c];
  const fm_fragment *f = &c->canon;
  fm_diag d = {{0}};
  fm_module *m = NULL;
  void *h_in[FM_MAX_INPUTS] = {0}, *h_out[FM_MAX_OUTPUTS] = {0}, *h_ref[FM_MAX_OUTPUTS] = {0};
  fm_CUdeviceptr d_in[FM_MAX_INPUTS] = {0}, d_out[FM_MAX_OUTPUTS] = {0};
  void *ins[FM_MAX_INPUTS], *outs[FM_MAX_OUTPUTS];
  size_t n_in[FM_MAX_INPUTS], n_out[FM_MAX_OUTPUTS];
  int ok = 1;
  if (j->rc) {
    printf("FAIL %s [%s]: compile: %s\n", c->name, j->desc, j->err ? j->err : "?");
    failed++;
    return;
  }
  if (fm_module_load(&j->k, &m, &d)) {
    printf("FAIL %s [%s]: load: %s\n", c->name, j->desc, d.text);
    failed++;
    return;
  }
  for (uint32_t k = 0; k < f->n_inputs; k++) {
    const fm_tensor *t = &f->inputs[k];
    n_in[k] = gu_span(t, c->outer);
    size_t bytes = n_in[k] * fm_dtype_size(t->dtype);
    h_in[k] = malloc(bytes);
    /* rows (x, the residual) signed; weights, biases and per-row scales in [0.5, 1.5] */
    fill(h_in[k], t, n_in[k], rng, n_in[k] != gu_span(&f->inputs[0], c->outer));
  }
  fill_special(c, h_in, n_in, rng);
  for (uint32_t k = 0; k < f->n_inputs; k++) {
    const size_t bytes = n_in[k] * fm_dtype_size(f->inputs[k].dtype);
    d_in[k] = gu_dalloc(cu, bytes);
    gu_h2d(cu, d_in[k], h_in[k], bytes);
    ins[k] = (void *)(uintptr_t)d_in[k];
  }
  for (uint32_t k = 0; k < f->n_outputs; k++) {
    const fm_tensor *t = &f->outputs[k];
    n_out[k] = gu_span(t, c->outer);
    size_t bytes = n_out[k] * fm_dtype_size(t->dtype);
    h_out[k] = malloc(bytes);
    h_ref[k] = malloc(bytes);
    d_out[k] = gu_dalloc(cu, bytes);
    cu->cuMemsetD8(d_out[k], 0xff, bytes); /* NaN in every float dtype */
    outs[k] = (void *)(uintptr_t)d_out[k];
  }
  if (fm_module_launch(m, ins, outs, c->outer, NULL, &d) || cu->cuCtxSynchronize()) {
    printf("FAIL %s [%s]: launch: %s\n", c->name, j->desc, d.text);
    ok = 0;
    goto done;
  }
  if (fm_reference_eval(f, c->outer, (const void *const *)h_in, h_ref, &d)) {
    printf("FAIL %s: reference: %s\n", c->name, d.text);
    ok = 0;
    goto done;
  }
  for (uint32_t k = 0; k < f->n_outputs; k++) {
    const fm_tensor *t = &f->outputs[k];
    gu_d2h(cu, h_out[k], d_out[k], n_out[k] * fm_dtype_size(t->dtype));
    double e = rel_err(h_out[k], h_ref[k], t->dtype, n_out[k]);
    int good = e <= fm_reference_tolerance(f, k);
    if (!good)
      printf("FAIL %s [%s] out%u %s n=%zu rel_err=%.3e (tol %.0e)\n", c->name, j->desc, k, fm_dtype_name(t->dtype),
             n_out[k], e, fm_reference_tolerance(f, k));
    ok &= good;
  }
  if (ok) printf("ok   %s [%s]\n", c->name, j->desc);
done:
  if (ok)
    passed++;
  else
    failed++;
  for (uint32_t k = 0; k < f->n_inputs; k++) {
    free(h_in[k]);
    if (d_in[k]) cu->cuMemFree(d_in[k]);
  }
  for (uint32_t k = 0; k < f->n_outputs; k++) {
    free(h_out[k]);
    free(h_ref[k]);
    if (d_out[k]) cu->cuMemFree(d_out[k]);
  }
  fm_module_unload(m);
}

/* Whether kind `name` is in the comma-separated list (every kind when there is none). */
static int wanted_kind(const char *list, const char *name) {
  if (!list) return 1;
  size_t n = strlen(name);
  for (const char *p = list; *p;) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len == n && !strncmp(p, name, n)) return 1;
    p += len + (end != NULL);
  }
  return 0;
}

int main(int argc, char **argv) {
  static const int64_t ns[] = {1, 7, 127, 1000, 4099, 8192, 50257, 131072};
  static const fm_dtype dts[] = {FM_DT_BF16, FM_DT_F16, FM_DT_F32};
  uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 0x5eed;
  fm_diag d = {{0}};
  const char *kinds = argc > 2 ? argv[2] : NULL;
  int known = !kinds;
  for (int kind = 0; kind < K__N && !known; kind++) known = wanted_kind(kinds, kind_name[kind]);
  if (!known) {
    fprintf(stderr, "test_rows_gpu: no kind in \"%s\"; kinds:", kinds);
    for (int kind = 0; kind < K__N; kind++) fprintf(stderr, " %s", kind_name[kind]);
    fprintf(stderr, "\n");
    return 2;
  }
  if (fm_cuda_load(&cu, &d) || fm_cuda_device_id(0, &dev, &d)) {
    fprintf(stderr, "no GPU: %s\n", d.text);
    return 2;
  }
  printf("device %s (%s, %u SMs), seed %#" PRIx64 "\n", dev.name, dev.arch, dev.sm_count, seed);
  for (int kind = 0; kind < K__N; kind++)
    for (size_t ni = 0; wanted_kind(kinds, kind_name[kind]) && ni < sizeof ns / sizeof ns[0]; ni++)
      for (size_t di = 0; di < sizeof dts / sizeof dts[0]; di++) {
        int symbolic = (ni + di + (size_t)kind) % 3 != 0; /* two in three symbolic */
        if (ns[ni] > FM_MAX_ROW_HELD && (kind == K_LAYER_NORM || kind == K_STATS)) continue;
        if ((kind == K_XENT || kind == K_SOFTCAP_XENT || kind == K_IOTA_XENT) && ns[ni] == 1)
          continue; /* a class index needs two classes to mean anything */
        tcase *c = &cases[n_cases];
        c->kind = kind;
        snprintf(c->name, sizeof c->name, "%s %s N=%lld %s", kind_name[kind], fm_dtype_name(dts[di]), (long long)ns[ni],
                 symbolic ? "[-1 (37), N]" : "[3, 5, N]");
        c->outer = symbolic ? 37 : 3;
        if (build(kind, dts[di], ns[ni], symbolic, &c->canon)) {
          failed++;
          continue;
        }
        fm_candidate cand[16];
        size_t m = fm_codegen_candidates(&c->canon, cand, 16);
        for (size_t i = 0; i < m && n_jobs < MAX_JOBS; i++) {
          job *j = &jobs[n_jobs++];
          memset(j, 0, sizeof *j);
          j->c = n_cases;
          j->cand = cand[i];
          fm_candidate_describe(&cand[i], j->desc, sizeof j->desc);
        }
        n_cases++;
      }
  printf("%d cases, %d kernels to compile\n", n_cases, n_jobs);
  fflush(stdout);
  pthread_t th[N_THREADS];
  for (int i = 0; i < N_THREADS; i++) pthread_create(&th[i], NULL, compile_worker, NULL);
  for (int i = 0; i < N_THREADS; i++) pthread_join(th[i], NULL);
  gu_rng rng = {seed};
  for (int i = 0; i < n_jobs; i++) {
    run_job(&jobs[i], &rng);
    free(jobs[i].k.cubin);
    free(jobs[i].err);
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
