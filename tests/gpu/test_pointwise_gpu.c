/* test_pointwise_gpu.c (device machine only): random pointwise fragments of odd sizes,
 * compiled by a real fusemld, loaded and launched through libfusemld, checked against the
 * CPU reference (fm_reference_eval, fp64 math) by ‖out−ref‖/‖ref‖ on fresh random inputs,
 * outputs poisoned with NaN before every launch so unwritten elements fail.
 *
 * Usage: test_pointwise_gpu SOCKET [N_RANDOM] [SEED]
 * Prints one line per case and the closing "N passed, N failed". */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_client.h"
#include "fm_cuda.h"
#include "fm_fragment.h"
#include "fm_reference.h"
#include "frag_builder.h"
#include "gpu_util.h"

static const fm_cuda *cu;
static fm_client *client;
static int passed, failed;

/* Runs fragment b->f at dim-0 size `outer` (and again at a smaller outer when symbolic).
 * Returns 0 if every output matched. */
static int run_case(const char *name, fb *b, int64_t outer, gu_rng *rng, int misalign) {
  fm_fragment canon, tmp = b->f;
  fm_diag d = {{0}};
  int rc = -1;
  fm_compiled k;
  memset(&k, 0, sizeof k);
  fm_module *mod = NULL;
  void *h_in[FM_MAX_INPUTS] = {0}, *h_out[FM_MAX_OUTPUTS] = {0}, *h_ref[FM_MAX_OUTPUTS] = {0};
  fm_CUdeviceptr d_in[FM_MAX_INPUTS] = {0}, d_out[FM_MAX_OUTPUTS] = {0};

  if (fm_fragment_validate(&tmp, &d) || fm_fragment_canonicalize(&tmp, &canon)) {
    fprintf(stderr, "%s: invalid test fragment: %s\n", name, d.text);
    goto done;
  }
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  fm_fragment_pack(&b->f, &pk);
  int err = fm_client_compile(client, (const uint8_t *)sb.data, sb.size, &k, &d);
  msgpack_sbuffer_destroy(&sb);
  if (err) {
    fprintf(stderr, "%s: compile: %s: %s\n", name, fm_err_slug(err), d.text);
    goto done;
  }
  if ((err = fm_module_load(&k, &mod, &d))) {
    fprintf(stderr, "%s: load: %s\n", name, d.text);
    goto done;
  }

  /* Inputs: fresh random values in [-2, 2] (bool: coin flips), in the canonical order,
   * which is the order given (canonicalization keeps input order). */
  for (uint32_t i = 0; i < canon.n_inputs; i++) {
    const fm_tensor *t = &canon.inputs[i];
    size_t n = gu_span(t, outer), es = fm_dtype_size(t->dtype);
    h_in[i] = malloc(n * es);
    for (size_t j = 0; j < n; j++)
      gu_store(h_in[i], t->dtype, j, t->dtype == FM_DT_BOOL ? (double)gu_below(rng, 2) : gu_uniform(rng, -2, 2));
    /* misalign: the base pointer is offset by one element, as the fragment's align promised */
    size_t off = misalign ? es : 0;
    d_in[i] = gu_dalloc(cu, n * es + 16);
    if (!d_in[i] || gu_h2d(cu, d_in[i] + off, h_in[i], n * es)) goto done;
    d_in[i] += off;
  }
  /* integer inputs (labels) and columns compared with an iota: the fragment's constants and
     their neighbours among small integers, the columns with their ends, as the tuner's
     verifier fills them; uploaded again over the random bits */
  fm_reference_integer_inputs(&canon, outer, rng->s, h_in);
  for (uint32_t i = 0; i < canon.n_inputs; i++)
    if (gu_h2d(cu, d_in[i], h_in[i], gu_span(&canon.inputs[i], outer) * fm_dtype_size(canon.inputs[i].dtype)))
      goto done;
  for (uint32_t o = 0; o < canon.n_outputs; o++) {
    const fm_tensor *t = &canon.outputs[o];
    size_t n = gu_span(t, outer), es = fm_dtype_size(t->dtype);
    h_out[o] = malloc(n * es);
    h_ref[o] = malloc(n * 8);
    d_out[o] = gu_dalloc(cu, n * es + 16);
    if (!d_out[o]) goto done;
  }

  int64_t outers[2] = {outer, outer > 2 ? outer / 3 : 1};
  int n_runs = fm_fragment_is_symbolic(&canon) ? 2 : 1;
  for (int run = 0; run < n_runs; run++) {
    int64_t ou = outers[run];
    for (uint32_t o = 0; o < canon.n_outputs; o++) /* poison: 0xFF bytes are NaN in every float type */
      cu->cuMemsetD8(d_out[o], 0xFF, gu_span(&canon.outputs[o], outer) * fm_dtype_size(canon.outputs[o].dtype));
    void *ins[FM_MAX_INPUTS], *outs[FM_MAX_OUTPUTS];
    for (uint32_t i = 0; i < canon.n_inputs; i++) ins[i] = (void *)(uintptr_t)d_in[i];
    for (uint32_t o = 0; o < canon.n_outputs; o++) outs[o] = (void *)(uintptr_t)d_out[o];
    if ((err = fm_module_launch(mod, ins, outs, ou, NULL, &d)) || cu->cuCtxSynchronize()) {
      fprintf(stderr, "%s: launch failed: %s\n", name, d.text);
      goto done;
    }
    /* Reference at f32 output precision: a copy of the fragment whose outputs are f32. */
    fm_fragment ref = canon;
    for (uint32_t o = 0; o < ref.n_outputs; o++)
      if (ref.outputs[o].dtype != FM_DT_BOOL && ref.outputs[o].dtype != FM_DT_I64) ref.outputs[o].dtype = FM_DT_F32;
    if (fm_reference_eval(&ref, ou, (const void *const *)h_in, h_ref, &d)) {
      fprintf(stderr, "%s: reference: %s\n", name, d.text);
      goto done;
    }
    for (uint32_t o = 0; o < canon.n_outputs; o++) {
      const fm_tensor *t = &canon.outputs[o];
      size_t n = gu_span(t, ou);
      if (gu_d2h(cu, h_out[o], d_out[o], n * fm_dtype_size(t->dtype))) goto done;
      double e = gu_rel_err(h_out[o], t->dtype, h_ref[o], ref.outputs[o].dtype, n);
      double tol = fm_reference_tolerance(&canon, o);
      int ok = e <= tol;
      printf("%-4s %s out%u %s outer=%" PRId64 " n=%zu rel_err=%.3e (tol %.0e)\n", ok ? "ok" : "FAIL", name, o,
             fm_dtype_name(t->dtype), ou, n, e, tol);
      if (!ok) goto done;
    }
  }
  rc = 0;
done:
  for (uint32_t i = 0; i < FM_MAX_INPUTS; i++) {
    free(h_in[i]);
    if (d_in[i]) cu->cuMemFree(d_in[i] & ~(fm_CUdeviceptr)15);
  }
  for (uint32_t o = 0; o < FM_MAX_OUTPUTS; o++) {
    free(h_out[o]);
    free(h_ref[o]);
    if (d_out[o]) cu->cuMemFree(d_out[o]);
  }
  if (mod) fm_module_unload(mod);
  fm_compiled_free(&k);
  if (rc) {
    failed++;
    printf("FAIL %s\n", name);
  } else {
    passed++;
  }
  return rc;
}

static const int64_t dim_pool[] = {1, 3, 7, 9, 33, 127, 1001, 4099};

/* A random chain over the iteration shape; see the file comment. */
static void random_case(gu_rng *r, int idx) {
  fb b;
  fb_init(&b);
  static const fm_dtype dts[] = {FM_DT_BF16, FM_DT_F16, FM_DT_F32};
  fm_dtype dt = dts[gu_below(r, 3)];
  uint32_t rank = 1 + gu_below(r, 3);
  int64_t shape[3];
  int64_t total;
  do {
    total = 1;
    for (uint32_t i = 0; i < rank; i++) total *= shape[i] = dim_pool[gu_below(r, 8)];
  } while (total > (1 << 22));
  int sym = gu_below(r, 2);
  int misalign = gu_below(r, 8) == 0;
  int64_t outer = shape[0];
  int64_t ishape[3];
  memcpy(ishape, shape, sizeof shape);
  if (sym) ishape[0] = FM_DIM_SYMBOLIC;

  uint32_t vals[4];
  uint32_t n_in = 1 + gu_below(r, 3);
  char kinds[8] = {0};
  for (uint32_t i = 0; i < n_in; i++) {
    int64_t s[3];
    memcpy(s, ishape, sizeof s);
    int kind = i == 0 ? 0 : (int)gu_below(r, 5);
    int64_t st[3] = {0, 0, 0}, *stp = NULL;
    if (kind == 1)
      for (uint32_t d = 0; d + 1 < rank; d++) s[d] = 1; /* row broadcast */
    if (kind == 2) s[rank - 1] = 1;                     /* column broadcast */
    if (kind == 3)
      for (uint32_t d = 0; d < rank; d++) s[d] = 1; /* scalar */
    if (kind == 4 && rank == 2 && !sym) {
      st[0] = 1;
      st[1] = shape[0];
      stp = st;
    } /* transposed */
    else if (kind == 4)
      kind = 0;
    fm_dtype idt = (i > 0 && gu_below(r, 6) == 0) ? FM_DT_F32 : dt; /* mixed dtypes */
    kinds[i] = "drcst"[kind];
    vals[i] = fb_input(&b, idt, rank, s, stp, misalign ? (uint32_t)fm_dtype_size(idt) : 16);
  }
  uint32_t cur = vals[0];
  uint32_t extra = 0;
  int steps = 3 + (int)gu_below(r, 6);
  for (int s = 0; s < steps; s++) {
    uint32_t other = vals[gu_below(r, n_in)];
    switch (gu_below(r, 9)) {
      case 0: {
        static const fm_op safe[] = {FM_OP_NEG,  FM_OP_ABS,     FM_OP_RELU, FM_OP_GELU, FM_OP_GELU_TANH,
                                     FM_OP_SILU, FM_OP_SIGMOID, FM_OP_TANH, FM_OP_COS,  FM_OP_SIN};
        cur = fb_op1(&b, safe[gu_below(r, 10)], cur);
        break;
      }
      case 1:
        cur = fb_op1(&b, FM_OP_EXP, fb_op1(&b, FM_OP_TANH, cur));
        break;
      case 2: {
        static const fm_op dom[] = {FM_OP_LOG, FM_OP_SQRT, FM_OP_RSQRT};
        uint32_t pos = fb_op2(&b, FM_OP_ADD, fb_op1(&b, FM_OP_ABS, cur), fb_const(&b, 0.5));
        cur = fb_op1(&b, dom[gu_below(r, 3)], pos);
        break;
      }
      case 3: {
        static const fm_op bin[] = {FM_OP_ADD, FM_OP_SUB, FM_OP_MUL, FM_OP_MAXIMUM, FM_OP_MINIMUM};
        cur = fb_op2(&b, bin[gu_below(r, 5)], cur, other);
        break;
      }
      case 4:
        cur = fb_op2(&b, FM_OP_MUL, cur, fb_const(&b, gu_uniform(r, -1.5, 1.5)));
        break;
      case 5:
        cur = fb_op2(&b, FM_OP_ADD, fb_const(&b, 0.125), cur);
        break;
      case 6: {
        uint32_t den = fb_op2(&b, FM_OP_ADD, fb_op1(&b, FM_OP_ABS, other), fb_const(&b, 1.0));
        cur = fb_op2(&b, FM_OP_DIV, cur, den);
        break;
      }
      case 7: {
        static const double ex[] = {2.0, 3.0, 0.5, 1.5};
        double e = ex[gu_below(r, 4)];
        uint32_t base = e == 2.0 || e == 3.0 ? cur : fb_op1(&b, FM_OP_ABS, cur);
        cur = fb_op2(&b, FM_OP_POW, base, fb_const(&b, e));
        break;
      }
      case 8: {
        static const fm_op cmp[] = {FM_OP_GT, FM_OP_GE, FM_OP_LT, FM_OP_LE, FM_OP_NE};
        uint32_t c = fb_op2(&b, cmp[gu_below(r, 5)], cur, fb_const(&b, 0.0));
        cur = fb_where(&b, c, cur, other);
        break;
      }
    }
    if (s == 1 && gu_below(r, 3) == 0) extra = cur; /* an escaping intermediate */
  }
  if (gu_below(r, 4) == 0 && b.dt[cur - 100] != FM_DT_BF16) cur = fb_cast(&b, cur, FM_DT_BF16);
  fb_output(&b, cur, rank, ishape);
  if (extra && extra != cur) fb_output(&b, extra, rank, ishape);

  char name[96];
  snprintf(name, sizeof name, "rand%02d[%s r%u %" PRId64 "x%" PRId64 "x%" PRId64 "%s%s in=%s]", idx, fm_dtype_name(dt),
           rank, shape[0], rank > 1 ? shape[1] : 1, rank > 2 ? shape[2] : 1, sym ? " sym" : "",
           misalign ? " misaligned" : "", kinds);
  run_case(name, &b, outer, r, misalign);
}

/* Fixed edge cases: tails around the vector width, a rank-0 tensor, a bool mask input. */
static void fixed_cases(gu_rng *r) {
  static const int64_t sizes[] = {1, 7, 8, 9, 15, 17, 4095, 4097, 1000003};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    fb b;
    fb_init(&b);
    int64_t s[1] = {sizes[i]};
    uint32_t x = fb_input(&b, FM_DT_BF16, 1, s, NULL, 16);
    uint32_t y = fb_op2(&b, FM_OP_MUL, fb_op1(&b, FM_OP_GELU, x), fb_const(&b, 0.5));
    fb_output(&b, y, 1, s);
    char name[64];
    snprintf(name, sizeof name, "tail[n=%" PRId64 "]", sizes[i]);
    run_case(name, &b, sizes[i], r, 0);
  }
  {
    fb b;
    fb_init(&b);
    uint32_t x = fb_input(&b, FM_DT_F32, 0, NULL, NULL, 16);
    fb_output(&b, fb_op1(&b, FM_OP_SILU, x), 0, NULL);
    run_case("rank0", &b, 1, r, 0);
  }
  {
    fb b;
    fb_init(&b);
    int64_t s[2] = {FM_DIM_SYMBOLIC, 1027};
    uint32_t x = fb_input(&b, FM_DT_BF16, 2, s, NULL, 16);
    uint32_t m = fb_input(&b, FM_DT_BOOL, 2, s, NULL, 16);
    uint32_t y = fb_where(&b, m, fb_op1(&b, FM_OP_RELU, x), fb_const(&b, 0.0));
    fb_output(&b, y, 2, s);
    run_case("bool_mask[sym x 1027]", &b, 65, r, 0);
  }
  { /* integer values (vocab 10): a language model's labels, a view of the padded rows */
    fb b;
    fb_init(&b);
    b.f.vocab = FM_VOCAB_INTEGER;
    int64_t s[2] = {8, 511}, padded[2] = {512, 1};
    uint32_t y = fb_input(&b, FM_DT_I64, 2, s, padded, 8);
    uint32_t keep = fb_op2(&b, FM_OP_NE, y, fb_const(&b, -100));
    uint32_t inside = fb_op2(&b, FM_OP_LT, y, fb_const(&b, 1000));
    uint32_t target = fb_cast(&b, fb_where(&b, keep, y, fb_const(&b, 0)), FM_DT_F32);
    uint32_t third = fb_op2(&b, FM_OP_ADD, fb_op2(&b, FM_OP_FLOOR_DIV, y, fb_const(&b, 3)), keep);
    fb_output(&b, keep, 2, s);
    fb_output(&b, inside, 2, s);
    fb_output(&b, target, 2, s);
    fb_output(&b, third, 2, s);
    run_case("integer_labels[8 x 511 of 512]", &b, 8, r, 0);
  }
}

/* Rotary embeddings over x [-1, 16, 64] (rows padded to 72: a strided view): x * cos +
 * cat([-x2, x1], -1) * sin, cos and sin [-1, 1, 64] broadcast over the heads, in cos's dtype
 * (f32 cos and sin beside bf16 x: a unit of 8 reads two 16-byte vectors of each), the output
 * cast to x's; x's last-dim stride `step` (2: read element by element). */
static void rope_case(gu_rng *r, fm_dtype xdt, fm_dtype csdt, int64_t step, int64_t outer) {
  fb b;
  fb_init(&b);
  b.f.vocab = 6;
  int64_t half[3] = {FM_DIM_SYMBOLIC, 16, 32}, full[3] = {FM_DIM_SYMBOLIC, 16, 64}, cs[3] = {FM_DIM_SYMBOLIC, 1, 64};
  int64_t xs[3] = {16 * 72 * step, 72 * step, step};
  uint32_t x1 = fb_input(&b, xdt, 3, half, xs, 16), x2 = fb_input(&b, xdt, 3, half, xs, 16);
  uint32_t x = fb_input(&b, xdt, 3, full, xs, 16);
  uint32_t c = fb_input(&b, csdt, 3, cs, NULL, 16), s = fb_input(&b, csdt, 3, cs, NULL, 16);
  uint32_t rot = fb_cat(&b, fb_op1(&b, FM_OP_NEG, x2), x1, -1);
  uint32_t y = fb_op2(&b, FM_OP_ADD, fb_op2(&b, FM_OP_MUL, x, c), fb_op2(&b, FM_OP_MUL, rot, s));
  if (b.dt[y - 100] != xdt) y = fb_cast(&b, y, xdt);
  fb_output(&b, y, 3, full);
  char name[96];
  snprintf(name, sizeof name, "rope_units[%s x, %s cos, step %" PRId64 ", %" PRId64 " x 16 x 64]", fm_dtype_name(xdt),
           fm_dtype_name(csdt), step, outer);
  run_case(name, &b, outer, r, 0);
}

/* A gradient padded for a GEMM at a multiple of the unit: cat([x [-1, 48], z [-1, 16]], -1). */
static void pad_case(gu_rng *r) {
  fb b;
  fb_init(&b);
  b.f.vocab = 6;
  int64_t sx[2] = {FM_DIM_SYMBOLIC, 48}, sz[2] = {FM_DIM_SYMBOLIC, 16}, so[2] = {FM_DIM_SYMBOLIC, 64};
  uint32_t x = fb_input(&b, FM_DT_BF16, 2, sx, NULL, 16), z = fb_input(&b, FM_DT_BF16, 2, sz, NULL, 16);
  fb_output(&b, fb_cat(&b, x, z, 1), 2, so);
  run_case("pad_units[bf16 -1 x 48 + 16]", &b, 1001, r, 0);
}

/* A cat along a middle dim (uniform over a unit along the last): cat([exp(a) [-1, 3, 16] f32,
 * x [-1, 2, 16] bf16], 1) * w [-1, 1, 1] f32 (broadcast along the last dim) -> [-1, 5, 16]. */
static void middle_case(gu_rng *r) {
  fb b;
  fb_init(&b);
  b.f.vocab = 6;
  int64_t sa[3] = {FM_DIM_SYMBOLIC, 3, 16}, sb[3] = {FM_DIM_SYMBOLIC, 2, 16}, sw[3] = {FM_DIM_SYMBOLIC, 1, 1};
  int64_t so[3] = {FM_DIM_SYMBOLIC, 5, 16};
  uint32_t a = fb_input(&b, FM_DT_F32, 3, sa, NULL, 16), x = fb_input(&b, FM_DT_BF16, 3, sb, NULL, 16);
  uint32_t w = fb_input(&b, FM_DT_F32, 3, sw, NULL, 16);
  uint32_t ab = fb_cat(&b, fb_op1(&b, FM_OP_EXP, a), x, 1);
  fb_output(&b, fb_op2(&b, FM_OP_MUL, ab, w), 3, so);
  run_case("middle_units[f32 -1 x (3 + 2) x 16]", &b, 23, r, 0);
}

/* A cat of rank 5 (above ATen's batched cat): a ViT's q, k, v gradients [-1, 197, 1, 6, 64] bf16,
 * contiguous as cuDNN's attention backward writes them, into [-1, 197, 3, 6, 64]. */
static void qkv_case(gu_rng *r) {
  fb b;
  fb_init(&b);
  b.f.vocab = 6;
  int64_t sq[5] = {FM_DIM_SYMBOLIC, 197, 1, 6, 64}, so[5] = {FM_DIM_SYMBOLIC, 197, 3, 6, 64};
  uint32_t qkv[3];
  for (int i = 0; i < 3; i++) qkv[i] = fb_input(&b, FM_DT_BF16, 5, sq, NULL, 16);
  fb_output(&b, fb_catn(&b, qkv, 3, 2), 5, so);
  run_case("qkv_rank5_cat[bf16 -1 x 197 x (1 + 1 + 1) x 6 x 64]", &b, 5, r, 0);
}

/* Units across odd rows (the STRIDED path's units): cross-entropy's backward at an odd
 * vocabulary, x bf16 [-1, cols] read at the padded row stride `ld`, per-row lse and w f32
 * [-1, 1], a column row f32 [1, cols]; two row-major outputs, bf16 and f32 (a unit of 8 stores
 * 16 bytes of one, 32 of the other), whose units span rows; the last n % 8 by block 0. */
static void odd_rows_case(gu_rng *r, int64_t cols, int64_t ld, int64_t outer) {
  fb b;
  fb_init(&b);
  int64_t sx[2] = {FM_DIM_SYMBOLIC, cols}, st[2] = {ld, 1}, srow[2] = {FM_DIM_SYMBOLIC, 1}, scol[2] = {1, cols};
  uint32_t x = fb_input(&b, FM_DT_BF16, 2, sx, st, 16);
  uint32_t lse = fb_input(&b, FM_DT_F32, 2, srow, NULL, 4), w = fb_input(&b, FM_DT_F32, 2, srow, NULL, 4);
  uint32_t col = fb_input(&b, FM_DT_F32, 2, scol, NULL, 16);
  uint32_t p = fb_op1(&b, FM_OP_EXP, fb_op2(&b, FM_OP_SUB, fb_cast(&b, x, FM_DT_F32), lse));
  uint32_t g = fb_op2(&b, FM_OP_MUL, fb_op2(&b, FM_OP_SUB, p, col), w);
  fb_output(&b, fb_cast(&b, g, FM_DT_BF16), 2, sx);
  fb_output(&b, g, 2, sx);
  char name[96];
  snprintf(name, sizeof name, "odd_rows_units[bf16 %" PRId64 " x %" PRId64 " of %" PRId64 "]", outer, cols, ld);
  run_case(name, &b, outer, r, 0);
}

/* iota (vocabulary 11): cross-entropy's gradient with the column computed, not read: x of
 * `xdt` [-1, cols] at row stride `ld`, t the target column [-1, 1] (the verifier's columns,
 * -1 and cols among them), (exp(x) - [iota == t]) * 0.5 stored as x's dtype and as f32. With
 * ld > cols and outputs row-major, units that span rows; with ld == cols, vectors along rows. */
static void iota_grad_case(gu_rng *r, fm_dtype xdt, int64_t cols, int64_t ld, int64_t outer) {
  fb b;
  fb_init(&b);
  b.f.vocab = FM_VOCAB_IOTA;
  int64_t sx[2] = {FM_DIM_SYMBOLIC, cols}, st[2] = {ld, 1}, srow[2] = {FM_DIM_SYMBOLIC, 1};
  uint32_t x = fb_input(&b, xdt, 2, sx, st, 16), t = fb_input(&b, FM_DT_F32, 2, srow, NULL, 4);
  uint32_t p = fb_op1(&b, FM_OP_EXP, fb_cast(&b, x, FM_DT_F32));
  uint32_t hot = fb_op2(&b, FM_OP_EQ, fb_iota(&b, FM_DT_F32), t);
  uint32_t g =
      fb_op2(&b, FM_OP_MUL, fb_where(&b, hot, fb_op2(&b, FM_OP_SUB, p, fb_const(&b, 1.0)), p), fb_const(&b, 0.5));
  fb_output(&b, fb_cast(&b, g, xdt), 2, sx);
  fb_output(&b, g, 2, sx);
  char name[96];
  snprintf(name, sizeof name, "iota_grad[%s %" PRId64 " x %" PRId64 " of %" PRId64 "]", fm_dtype_name(xdt), outer, cols,
           ld);
  run_case(name, &b, outer, r, 0);
}

/* iota of each rank and dtype: rank 1 (the column is the element's index; a tail), rank 3
 * static (an i64 iota compared with i64 picks [7, 9, 1], a top-k's backward), and an f32
 * iota stored as it is beside one added to a broadcast row. */
static void iota_cases(gu_rng *r) {
  iota_grad_case(r, FM_DT_BF16, 1001, 1008, 37);
  iota_grad_case(r, FM_DT_F16, 65, 72, 33);
  iota_grad_case(r, FM_DT_F32, 4099, 4100, 5);
  iota_grad_case(r, FM_DT_BF16, 512, 512, 9);
  fb b;
  fb_init(&b);
  b.f.vocab = FM_VOCAB_IOTA;
  int64_t flat[1] = {1001};
  uint32_t x = fb_input(&b, FM_DT_F16, 1, flat, NULL, 16);
  fb_output(&b, fb_op2(&b, FM_OP_MUL, fb_iota(&b, FM_DT_F32), x), 1, flat);
  run_case("iota_rank1[f16 1001]", &b, 1, r, 0);
  fb_init(&b);
  b.f.vocab = FM_VOCAB_IOTA;
  int64_t cube[3] = {7, 9, 127}, picks[3] = {7, 9, 1};
  uint32_t idx = fb_input(&b, FM_DT_I64, 3, picks, NULL, 8), src = fb_input(&b, FM_DT_BF16, 3, picks, NULL, 2);
  uint32_t col = fb_iota(&b, FM_DT_I64);
  fb_output(&b, fb_where(&b, fb_op2(&b, FM_OP_EQ, col, idx), src, fb_const(&b, 0.0)), 3, cube);
  fb_output(&b, col, 3, cube);
  run_case("iota_i64[bf16 7 x 9 x 127]", &b, 1, r, 0);
  fb_init(&b);
  b.f.vocab = FM_VOCAB_IOTA;
  int64_t sq[2] = {33, 127}, row[2] = {1, 127};
  uint32_t y = fb_input(&b, FM_DT_BF16, 2, row, NULL, 2), cf = fb_iota(&b, FM_DT_F32);
  fb_output(&b, cf, 2, sq);
  fb_output(&b, fb_cast(&b, fb_op2(&b, FM_OP_ADD, cf, y), FM_DT_BF16), 2, sq);
  run_case("iota_f32[bf16 33 x 127]", &b, 1, r, 0);
}

/* A loss's gradient written padded for a GEMM, the padding a cat (GPT-2's 50 257 columns and
 * zeros to 50 304): (exp(x - lse) - [col == t]) * w cast to x's dtype, x [-1, cols] read at the
 * padded stride `ld`, col the column row [1, cols] f32, then cat with zeros z [-1, ld - cols]
 * into [-1, ld]. The split falls inside a unit: that unit element by element, the others as
 * units (x read as vectors, z's branch element by element). */
static void straddle_case(gu_rng *r, fm_dtype xdt, int64_t cols, int64_t ld, int64_t outer) {
  fb b;
  fb_init(&b);
  b.f.vocab = 6;
  int64_t sx[2] = {FM_DIM_SYMBOLIC, cols}, st[2] = {ld, 1}, srow[2] = {FM_DIM_SYMBOLIC, 1}, scol[2] = {1, cols};
  int64_t sz[2] = {FM_DIM_SYMBOLIC, ld - cols}, so[2] = {FM_DIM_SYMBOLIC, ld};
  uint32_t x = fb_input(&b, xdt, 2, sx, st, 16);
  uint32_t lse = fb_input(&b, FM_DT_F32, 2, srow, NULL, 4), t = fb_input(&b, FM_DT_F32, 2, srow, NULL, 4);
  uint32_t col = fb_input(&b, FM_DT_F32, 2, scol, NULL, 16);
  uint32_t z = fb_input(&b, xdt, 2, sz, NULL, (uint32_t)fm_dtype_size(xdt));
  uint32_t p = fb_op1(&b, FM_OP_EXP, fb_op2(&b, FM_OP_SUB, fb_cast(&b, x, FM_DT_F32), lse));
  uint32_t hot = fb_op2(&b, FM_OP_EQ, col, t);
  uint32_t g =
      fb_op2(&b, FM_OP_MUL, fb_where(&b, hot, fb_op2(&b, FM_OP_SUB, p, fb_const(&b, 1.0)), p), fb_const(&b, 0.25));
  fb_output(&b, fb_cat(&b, fb_cast(&b, g, xdt), z, 1), 2, so);
  char name[96];
  snprintf(name, sizeof name, "straddle_units[%s %" PRId64 " x (%" PRId64 " + %" PRId64 ")]", fm_dtype_name(xdt), outer,
           cols, ld - cols);
  run_case(name, &b, outer, r, 0);
}

/* Cat fragments whose units never straddle a branch (codegen's unit form), ones with a split
 * inside a unit, and one that is read element by element. */
static void cat_cases(gu_rng *r) {
  middle_case(r);
  rope_case(r, FM_DT_BF16, FM_DT_BF16, 1, 37);
  rope_case(r, FM_DT_BF16, FM_DT_F32, 1, 9);
  rope_case(r, FM_DT_F32, FM_DT_F32, 1, 5);
  rope_case(r, FM_DT_F16, FM_DT_F16, 2, 7);
  pad_case(r);
  qkv_case(r);
  straddle_case(r, FM_DT_BF16, 1001, 1008, 37);
  straddle_case(r, FM_DT_F16, 50257, 50304, 3);
  straddle_case(r, FM_DT_F32, 4099, 4104, 5);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s SOCKET [N_RANDOM] [SEED]\n", argv[0]);
    return 2;
  }
  int n_random = argc > 2 ? atoi(argv[2]) : 80;
  uint64_t seed = argc > 3 ? strtoull(argv[3], NULL, 0) : 20261122;
  fm_diag d = {{0}};
  if (fm_cuda_load(&cu, &d)) {
    fprintf(stderr, "no GPU: %s\n", d.text);
    return 1;
  }
  if (fm_client_connect(argv[1], "test_pointwise_gpu", 120000, &client, &d)) {
    fprintf(stderr, "connect %s: %s\n", argv[1], d.text);
    return 1;
  }
  printf("seed %" PRIu64 "\n", seed);
  gu_rng r = {seed | 1};
  fixed_cases(&r);
  cat_cases(&r);
  odd_rows_case(&r, 1001, 1008, 37);
  odd_rows_case(&r, 5, 8, 3);         /* rows shorter than a unit: several carries in one */
  odd_rows_case(&r, 50257, 50304, 9); /* GPT-2's vocabulary */
  iota_cases(&r);
  for (int i = 0; i < n_random; i++) random_case(&r, i);
  fm_client_close(client);
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
