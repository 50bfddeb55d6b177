/* test_b2b_gpu.c (device machine only): chained GEMM fragments (back-to-back GEMMs: an MLP
 * block in one kernel, template b2b), every candidate checked against the fp64 reference
 * through the shared suite (gpu_suite.h), then timed against the two GEMM fragments the
 * client would send without chains.
 *
 * Cases: M in {1, 7, 64, 127, 200, 1000, 4099, 8200} x (K1, N1, N2) in {(64, 64, 16), (128, 192, 64),
 * (256, 1024, 256), (64, 128, 48), (192, 256, 128), (64, 128, 256), (64, 128, 144), (128, 256,
 * 128)} (with (64, 128, 256) and (64, 128, 144) the cp.async form stages its last stage in two
 * passes of 128 and of 72 columns); the epilogues rotating over the MLP block (addmm + gelu,
 * addmm + residual), relu between two mm, and silu then a scale by a const between addmm and
 * mm; bf16 and f16; M symbolic (bucket 16384: the template serves no fewer rows) except half
 * of the M = 8200 cases. At odd positions of M the residual, where laid out like x (N2 = K1),
 * is x's memory, as the client sends it (the kernel then reads it from x's rows in shared
 * memory): M = 7 and 8200 (f16) with (128, 256, 128), 1000 (bf16) with (256, 1024, 256); M = 200
 * and 64 with the same shapes read it from a memory of its own. Timing (the residual x's memory, as in a model): the MLP
 * block and, to tell the GELU's share, relu between two mm, each against the two GEMM
 * fragments it replaces.
 *
 * Usage: test_b2b_gpu [SEED [check|time|both]]   One line per kernel and "N passed, N failed". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_fragment.h"
#include "gpu_suite.h"

enum { E_MLP, E_RELU, E_SILU_SCALE, E__N };
static const char *const epi_name[E__N] = {"mlp(gelu,+r)", "relu", "silu*0.5"};

/* x [M, K1] @ W1.t() [K1, N1] -> stage 1 -> @ W2.t() [N1, N2] -> stage 2; M < 0: symbolic.
 * part 0: the chain; 1 / 2: the first / second GEMM alone (what the client sends without
 * chains: h [M, N1] written, then read). */
static int build(int e, fm_dtype dt, int64_t m, uint64_t hint, int64_t k1, int64_t n1, int64_t n2, int part,
                 fm_fragment *canon) {
  static fm_fragment f;
  memset(&f, 0, sizeof f);
  f.vocab = 3;
  f.m_hint = hint;
  if (part != 2) {
    gs_matrix(&f.inputs[f.n_inputs++], 1, dt, m, k1, 0);
    gs_matrix(&f.inputs[f.n_inputs++], 2, dt, k1, n1, 1);
  }
  if (part == 2) gs_matrix(&f.inputs[f.n_inputs++], 9, dt, m, n1, 0); /* h from memory */
  if (part != 1) gs_matrix(&f.inputs[f.n_inputs++], 3, dt, n1, n2, 1);
  uint32_t h = 9;
  if (part != 2) {
    if (e == E_RELU) {
      gs_op(&f, FM_OP_MM, 10, 2, 1, 2, 0);
      gs_op(&f, FM_OP_RELU, 11, 1, 10, 0, 0);
    } else {
      gs_vector(&f.inputs[f.n_inputs++], 4, dt, n1);
      gs_op(&f, FM_OP_ADDMM, 10, 3, 4, 1, 2);
      if (e == E_MLP) {
        gs_op(&f, FM_OP_GELU, 11, 1, 10, 0, 0);
      } else {
        gs_op(&f, FM_OP_SILU, 12, 1, 10, 0, 0);
        memset(&f.ops[f.n_ops], 0, sizeof f.ops[0]);
        f.ops[f.n_ops].op = FM_OP_CONST;
        f.ops[f.n_ops].out = 13;
        f.ops[f.n_ops++].value = 0.5;
        gs_op(&f, FM_OP_MUL, 11, 2, 12, 13, 0);
      }
    }
    h = 11;
  }
  if (part == 1) {
    gs_matrix(&f.outputs[f.n_outputs++], h, dt, m, n1, 0);
    return gs_canon(&f, canon, "gemm 1");
  }
  uint32_t y = 20;
  if (e == E_MLP) {
    gs_vector(&f.inputs[f.n_inputs++], 5, dt, n2);
    gs_matrix(&f.inputs[f.n_inputs++], 6, dt, m, n2, 0);
    gs_op(&f, FM_OP_ADDMM, 20, 3, 5, h, 3);
    gs_op(&f, FM_OP_ADD, 21, 2, 20, 6, 0);
    y = 21;
  } else {
    gs_op(&f, FM_OP_MM, 20, 2, h, 3, 0);
  }
  gs_matrix(&f.outputs[f.n_outputs++], y, dt, m, n2, 0);
  return gs_canon(&f, canon, part ? "gemm 2" : epi_name[e]);
}

int main(int argc, char **argv) {
  /* the template serves M (or the M bucket) >= 8192 only: smaller M run as one symbolic
     kernel of bucket 16384 launched at M rows, so the row edges are checked all the same */
  static const int64_t ms[] = {1, 7, 64, 127, 200, 1000, 4099, 8200};
  static const int64_t shapes[][3] = {{64, 64, 16},    {128, 192, 64}, {256, 1024, 256}, {64, 128, 48},
                                      {192, 256, 128}, {64, 128, 256}, {64, 128, 144},   {128, 256, 128}};
  uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 0xb2b;
  const char *mode = argc > 2 ? argv[2] : "both";
  if (gs_start(seed)) return 2;
  static fm_fragment canon;
  int idx = 0, bad = 0;
  if (strcmp(mode, "time") != 0)
    for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
      gs_share_equal_inputs(mi % 2);
      for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++, idx++) {
        int e = idx % E__N, symbolic = ms[mi] < 8192 || (mi + si) % 2 == 0;
        fm_dtype dt = idx % 2 ? FM_DT_F16 : FM_DT_BF16;
        int64_t m = ms[mi], k1 = shapes[si][0], n1 = shapes[si][1], n2 = shapes[si][2];
        char name[128];
        snprintf(name, sizeof name, "%s %s M=%lld%s K1=%lld N1=%lld N2=%lld%s", epi_name[e], fm_dtype_name(dt),
                 (long long)m, symbolic ? " (sym)" : "", (long long)k1, (long long)n1, (long long)n2,
                 mi % 2 && e == E_MLP && k1 == n2 ? " r=x" : "");
        if (build(e, dt, symbolic ? -1 : m, symbolic ? (uint64_t)(m < 16384 ? 16384 : m) : 0, k1, n1, n2, 0, &canon)) {
          bad++;
          continue;
        }
        gs_add_case(name, &canon, m, k1);
      }
    }
  gs_run();
  gs_share_equal_inputs(1);
  if (strcmp(mode, "check") != 0) {
    /* the benchmark table's MLP block at memory_bound and small: the chain against the two
       GEMM fragments it replaces (each at its own best candidate) */
    static const int epis[] = {E_MLP, E_RELU};
    for (size_t r = 0; r < sizeof epis / sizeof epis[0]; r++) {
      int64_t m = 16384;
      int e = epis[r];
      char d0[96], d1[96], d2[96];
      double t0 = -1, t1 = -1, t2 = -1;
      if (!build(e, FM_DT_BF16, -1, (uint64_t)m, 256, 1024, 256, 0, &canon))
        t0 = gs_time(&canon, m, 256, d0, sizeof d0);
      if (!build(e, FM_DT_BF16, -1, (uint64_t)m, 256, 1024, 256, 1, &canon))
        t1 = gs_time(&canon, m, 256, d1, sizeof d1);
      if (!build(e, FM_DT_BF16, -1, (uint64_t)m, 256, 1024, 256, 2, &canon))
        t2 = gs_time(&canon, m, 1024, d2, sizeof d2);
      printf(
          "%s M=%lld 256->1024->256 bf16: chain %.4f ms [%s]; apart %.4f + %.4f = %.4f ms [%s] [%s]; "
          "%.2fx, chain at %.0f TFLOP/s\n",
          epi_name[e], (long long)m, t0, d0, t1, t2, t1 + t2, d1, d2, (t1 + t2) / t0, 4.0 * m * 256 * 1024 / t0 / 1e9);
    }
  }
  return gs_finish() || bad ? 1 : 0;
}
