/* test_bmm_gpu.c (device machine only): batched GEMM fragments (bmm + epilogue), every
 * candidate (the cuBLASLt plan among them: a strided batched product into the scratch, then
 * the split epilogue kernel) checked against the fp64 reference through the shared suite
 * (gpu_suite.h: parallel compiles, libfusemld launches on the "batched" grid, NaN-poisoned
 * outputs, ||out-ref||/||ref||).
 *
 * Cases: M in {1, 7, 64, 127, 200} x N in {8, 64, 100, 136}, K rotating over {8, 64, 136},
 * the batch over a static 1, a static 3, a symbolic 5 and a static 4 whose B is one matrix
 * for all (batch dim 1); the epilogue over plain bmm, scale + a [M, N] mask (attention
 * scores), bias [N] + gelu, residual [Bt, M, N] + relu, bias + gelu with the product as a
 * second output; bf16 and f16; A and B row- or column-major per product. Then times the
 * attention-score shape (64 products of 1024 x 1024 x 64, bf16, * 0.125 + mask) with every
 * candidate against the bytes floor.
 *
 * Usage: test_bmm_gpu [SEED [check|time]]   Prints one line per kernel and "N passed, N failed". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_fragment.h"
#include "gpu_suite.h"

enum { E_BMM, E_SCORES, E_GELU, E_RESIDUAL, E_EXTRA, E__N };
static const char *const epi_name[E__N] = {"bmm", "scale+mask", "bias+gelu", "residual+relu", "bias+gelu+product"};

/* A rank-3 tensor [z, r, c]: each matrix row-major (or column-major with colmajor), its
 * leading dim padded to 16 bytes when pad (the operands: the templates load 16-byte chunks),
 * dense across the batch; a batch dim of 1 gets stride 0. */
static void tensor3(fm_tensor *t, uint32_t id, fm_dtype dt, int64_t z, int64_t r, int64_t c, int colmajor, int pad) {
  memset(t, 0, sizeof *t);
  t->id = id;
  t->dtype = dt;
  t->rank = 3;
  t->shape[0] = z;
  t->shape[1] = r;
  t->shape[2] = c;
  int64_t rs = colmajor ? 1 : pad ? (c + 7) / 8 * 8 : c, cs = colmajor ? (pad ? (r + 7) / 8 * 8 : r) : 1;
  t->strides[1] = rs;
  t->strides[2] = cs;
  t->strides[0] = z == 1 ? 0 : (colmajor ? cs * c : rs * r);
  t->align = 16;
}

/* [z, M, K] @ [zb, K, N] with epilogue e; z < 0: a symbolic batch (m_hint hint). */
static int build(int e, fm_dtype dt, int64_t z, int64_t zb, uint64_t hint, int64_t m, int64_t n, int64_t k, int a_col,
                 int b_col, fm_fragment *canon) {
  static fm_fragment f;
  fm_diag d = {{0}};
  memset(&f, 0, sizeof f);
  f.vocab = 4;
  f.m_hint = hint;
  tensor3(&f.inputs[f.n_inputs++], 1, dt, z, m, k, a_col, 1);
  tensor3(&f.inputs[f.n_inputs++], 2, dt, zb, k, n, b_col, 1);
  gs_op(&f, FM_OP_BMM, 10, 2, 1, 2, 0);
  uint32_t y = 10;
  if (e == E_SCORES) {
    tensor3(&f.inputs[f.n_inputs++], 3, dt, 1, m, n, 0, 0);
    f.inputs[f.n_inputs - 1].rank = 2; /* [M, N]: validation right-aligns it */
    memmove(&f.inputs[f.n_inputs - 1].shape[0], &f.inputs[f.n_inputs - 1].shape[1], 2 * sizeof(int64_t));
    memmove(&f.inputs[f.n_inputs - 1].strides[0], &f.inputs[f.n_inputs - 1].strides[1], 2 * sizeof(int64_t));
    fm_opnode *c = &f.ops[f.n_ops++];
    memset(c, 0, sizeof *c);
    c->op = FM_OP_CONST;
    c->out = 11;
    c->value = 0.125;
    gs_op(&f, FM_OP_MUL, 12, 2, 10, 11, 0);
    gs_op(&f, FM_OP_ADD, 13, 2, 12, 3, 0);
    y = 13;
  } else if (e == E_GELU || e == E_EXTRA) {
    fm_tensor *b = &f.inputs[f.n_inputs++]; /* bias [N] */
    memset(b, 0, sizeof *b);
    b->id = 3;
    b->dtype = dt;
    b->rank = 1;
    b->shape[0] = n;
    b->strides[0] = 1;
    b->align = 16;
    gs_op(&f, FM_OP_ADD, 11, 2, 10, 3, 0);
    gs_op(&f, FM_OP_GELU, 12, 1, 11, 0, 0);
    y = 12;
  } else if (e == E_RESIDUAL) {
    tensor3(&f.inputs[f.n_inputs++], 3, dt, z, m, n, 0, 0);
    gs_op(&f, FM_OP_ADD, 11, 2, 10, 3, 0);
    gs_op(&f, FM_OP_RELU, 12, 1, 11, 0, 0);
    y = 12;
  }
  tensor3(&f.outputs[f.n_outputs++], y, dt, z, m, n, 0, 0);
  if (e == E_EXTRA) tensor3(&f.outputs[f.n_outputs++], 10, dt, z, m, n, 0, 0);
  int rc = fm_fragment_validate(&f, &d);
  if (!rc) rc = fm_fragment_canonicalize(&f, canon);
  if (rc) printf("FAIL build %s: %s\n", epi_name[e], d.text);
  return rc;
}

int main(int argc, char **argv) {
  static const int64_t ms[] = {1, 7, 64, 127, 200};
  static const int64_t ns[] = {8, 64, 100, 136}; /* 100: rows not 16-byte aligned */
  static const int64_t ks[] = {8, 64, 136};
  uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 0xb33;
  const char *mode = argc > 2 ? argv[2] : "both";
  if (gs_start(seed)) return 2;
  static fm_fragment canon;
  int idx = 0, bad = 0;
  if (strcmp(mode, "time") != 0)
    for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
      for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++, idx++) {
        /* the batch kind and the layouts rotate apart from N (idx % 4 would tie them) */
        int e = idx % E__N, batch = (int)((mi + ni) % 4), a_col = (int)(mi % 2), b_col = (idx / 3) % 2 == 0;
        fm_dtype dt = idx % 2 ? FM_DT_F16 : FM_DT_BF16;
        int64_t m = ms[mi], n = ns[ni], k = ks[(size_t)idx % 3];
        /* 0: static 1; 1: static 3; 2: symbolic, launched with 5 (hint 8); 3: 4 by one B */
        int64_t z = batch == 0 ? 1 : batch == 1 ? 3 : batch == 2 ? -1 : 4;
        int64_t zb = batch == 3 ? 1 : z, outer = batch == 2 ? 5 : z;
        char name[128];
        snprintf(name, sizeof name, "%s %s Bt=%lld%s%s M=%lld N=%lld K=%lld A %s B %s", epi_name[e], fm_dtype_name(dt),
                 (long long)outer, z < 0 ? " (sym)" : "", zb == 1 && outer > 1 ? " B shared" : "", (long long)m,
                 (long long)n, (long long)k, a_col ? "col" : "row", b_col ? "col" : "row");
        if (build(e, dt, z, zb, batch == 2 ? 8 : 0, m, n, k, a_col, b_col, &canon)) {
          bad++;
          continue;
        }
        gs_add_case(name, &canon, outer, k);
      }
  gs_run();
  if (strcmp(mode, "check") != 0 && !build(E_SCORES, FM_DT_BF16, -1, -1, 64, 1024, 1024, 64, 0, 1, &canon)) {
    /* q, k, the mask read once, the scores written once */
    char best_desc[96];
    double best = gs_time(&canon, 64, 64, best_desc, sizeof best_desc);
    double bytes = 2.0 * (64.0 * 1024 * 64 * 2 + 1024.0 * 1024 + 64.0 * 1024 * 1024);
    double flops = 2.0 * 64 * 1024 * 1024 * 64;
    printf("best scores 64x1024x1024x64 bf16: %.4f ms [%s], %.0f GB/s, %.0f TFLOP/s\n", best, best_desc,
           bytes / best / 1e6, flops / best / 1e9);
  }
  return gs_finish() || bad ? 1 : 0;
}
