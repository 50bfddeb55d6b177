/* test_siblings_gpu.c (device machine only): sibling GEMM fragments (two products sharing
 * A: gate and up) with their epilogue, every candidate (the sm_80 mainloop and the TMA forms)
 * checked against the fp64 reference through the shared suite (gpu_suite.h).
 *
 * Cases: M in {1, 7, 64, 127, 200, 1000} x N in {8, 64, 100, 136}, K rotating over
 * {8, 64, 136}; the epilogue rotating over SwiGLU (silu(gate) * up), GeGLU (gelu_tanh),
 * gate + up, SwiGLU of two addmm (biases [N]), SwiGLU with gate as a second output; bf16 and
 * f16; A row- or column-major; both B's K-major (nn.Linear's weights) or N-major; M
 * symbolic in a third of the cases (M bucket 1024 for M = 1000). Then times SwiGLU bf16 at
 * Llama's gate/up shapes with every candidate.
 *
 * Usage: test_siblings_gpu [SEED [check|time]]   Prints one line per kernel and "N passed, N failed". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_fragment.h"
#include "gpu_suite.h"

enum { E_SWIGLU, E_GEGLU, E_SUM, E_BIASES, E_GATE_OUT, E__N };
static const char *const epi_name[E__N] = {"swiglu", "geglu", "gate+up", "swiglu(addmm)", "swiglu+gate"};

/* x [M, K] @ B1, B2 [K, N] (K-major when b_kmajor: weight.t()); M < 0: symbolic. */
static int build(int e, fm_dtype dt, int64_t m, uint64_t hint, int64_t n, int64_t k, int a_col, int b_kmajor,
                 fm_fragment *canon) {
  static fm_fragment f;
  fm_diag d = {{0}};
  memset(&f, 0, sizeof f);
  f.vocab = 3;
  f.m_hint = hint;
  gs_matrix(&f.inputs[f.n_inputs++], 1, dt, m, k, m < 0 ? 0 : a_col);
  gs_matrix(&f.inputs[f.n_inputs++], 2, dt, k, n, b_kmajor);
  gs_matrix(&f.inputs[f.n_inputs++], 3, dt, k, n, b_kmajor);
  if (e == E_BIASES) {
    gs_vector(&f.inputs[f.n_inputs++], 4, dt, n);
    gs_vector(&f.inputs[f.n_inputs++], 5, dt, n);
    gs_op(&f, FM_OP_ADDMM, 10, 3, 4, 1, 2);
    gs_op(&f, FM_OP_ADDMM, 11, 3, 5, 1, 3);
  } else {
    gs_op(&f, FM_OP_MM, 10, 2, 1, 2, 0);
    gs_op(&f, FM_OP_MM, 11, 2, 1, 3, 0);
  }
  if (e == E_SUM) {
    gs_op(&f, FM_OP_ADD, 13, 2, 10, 11, 0);
  } else {
    gs_op(&f, e == E_GEGLU ? FM_OP_GELU_TANH : FM_OP_SILU, 12, 1, 10, 0, 0);
    gs_op(&f, FM_OP_MUL, 13, 2, 12, 11, 0);
  }
  gs_matrix(&f.outputs[f.n_outputs++], 13, dt, m, n, 0);
  f.outputs[0].strides[0] = n; /* dense outputs */
  if (e == E_GATE_OUT) {
    gs_matrix(&f.outputs[f.n_outputs++], 10, dt, m, n, 0);
    f.outputs[1].strides[0] = n;
  }
  int rc = fm_fragment_validate(&f, &d);
  if (!rc) rc = fm_fragment_canonicalize(&f, canon);
  if (rc) printf("FAIL build %s: %s\n", epi_name[e], d.text);
  return rc;
}

int main(int argc, char **argv) {
  static const int64_t ms[] = {1, 7, 64, 127, 200, 1000};
  static const int64_t ns[] = {8, 64, 100, 136}; /* 100: rows not 16-byte aligned */
  static const int64_t ks[] = {8, 64, 136};
  uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 0x51b;
  const char *mode = argc > 2 ? argv[2] : "both";
  if (gs_start(seed)) return 2;
  static fm_fragment canon;
  int idx = 0, bad = 0;
  if (strcmp(mode, "time") != 0)
    for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
      for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++, idx++) {
        int e = idx % E__N, a_col = (int)(mi % 2), b_kmajor = (int)((mi + ni) % 2 == 0);
        int symbolic = (mi + ni) % 3 == 0;
        fm_dtype dt = idx % 2 ? FM_DT_F16 : FM_DT_BF16;
        int64_t m = ms[mi], n = ns[ni], k = ks[(size_t)idx % 3];
        char name[128];
        snprintf(name, sizeof name, "%s %s M=%lld%s N=%lld K=%lld A %s B %s", epi_name[e], fm_dtype_name(dt),
                 (long long)m, symbolic ? " (sym)" : "", (long long)n, (long long)k, a_col && !symbolic ? "col" : "row",
                 b_kmajor ? "K-major" : "N-major");
        if (build(e, dt, symbolic ? -1 : m, symbolic ? (uint64_t)m : 0, n, k, a_col, b_kmajor, &canon)) {
          bad++;
          continue;
        }
        gs_add_case(name, &canon, m, k);
      }
  gs_run();
  if (strcmp(mode, "check") != 0) {
    /* Llama-style gate/up: (M, K, N) of the benchmark's medium and prefill presets */
    static const int64_t shapes[][3] = {{2048, 1024, 4096}, {4096, 4096, 11008}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
      int64_t m = shapes[s][0], k = shapes[s][1], n = shapes[s][2];
      if (build(E_SWIGLU, FM_DT_BF16, -1, (uint64_t)m, n, k, 0, 1, &canon)) continue;
      char best_desc[96];
      double best = gs_time(&canon, m, k, best_desc, sizeof best_desc);
      printf("best swiglu %lldx%lldx%lld (x2) bf16: %.4f ms [%s], %.0f TFLOP/s\n", (long long)m, (long long)k,
             (long long)n, best, best_desc, 4.0 * m * n * k / best / 1e9);
    }
  }
  return gs_finish() || bad ? 1 : 0;
}
