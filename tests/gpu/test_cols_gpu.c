/* test_cols_gpu.c (device machine only): column fragments (vocab 5: reductions over dim 0,
 * the bias gradient grad.sum(0) of a backward pass; template cols), every candidate (every
 * strip width and cluster size S, the vector and the scalar form) checked against the fp64
 * reference through the shared suite (gpu_suite.h), M = 0 checked by hand, then the bias
 * gradient timed against a device-to-device copy of the same bytes.
 *
 * Cases: M in {1, 7, 127, 4099, 16384} x N in {1, 8, 100, 256, 1024, 4096}, rotating over
 * bf16 / f16 / f32, sum / mean / amax, plain or with a prologue and an epilogue (x * s[N] +
 * r[M, 1], the reduction + b[N] cast back, the f32 reduction a second output), a padded row
 * stride (the scalar form where N % 8 == 0 would allow vectors), and M static for one case in
 * four (a static M prunes the clusters that would leave a block without rows; a symbolic one
 * keeps them all, so M = 1 runs clusters whose other blocks add nothing). Timing: bf16 sum at
 * M = 16384, N = 1024 and 256, input buffers rotated so no launch finds them in L2; the floor
 * is the input's bytes at the copy's bandwidth (read + write of the same bytes). Then a batch
 * norm's statistics shapes (64 and 256 channels of 802 816 and 200 704 rows, bf16), where
 * only the split form (G clusters' partials added by a second kernel) fills the GPU.
 *
 * Usage: test_cols_gpu [SEED [check|time|both]]   One line per kernel and "N passed, N failed". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen.h"
#include "fm_fragment.h"
#include "fm_module.h"
#include "gpu_suite.h"

enum { K_PLAIN, K_PROLOGUE, K__N };
static const char *const kind_name[K__N] = {"plain", "prologue"};
static const fm_op reduce_ops[3] = {FM_OP_SUM, FM_OP_MEAN, FM_OP_AMAX};

/* op over dim 0 of x [m, n] (m -1: symbolic; padded: row stride n + 1), dtype dt. */
static int build(int kind, fm_op op, fm_dtype dt, int64_t m, int64_t n, int padded, fm_fragment *canon) {
  static fm_fragment f;
  memset(&f, 0, sizeof f);
  f.vocab = 5;
  gs_matrix(&f.inputs[f.n_inputs++], 1, dt, m, n, 0);
  f.inputs[0].strides[0] = padded ? n + 1 : n;
  f.inputs[0].align = padded ? (uint32_t)fm_dtype_size(dt) : 16;
  uint32_t x = 1;
  if (kind == K_PROLOGUE) { /* x * s + r: per column, per row */
    gs_vector(&f.inputs[f.n_inputs++], 2, FM_DT_F32, n);
    gs_matrix(&f.inputs[f.n_inputs++], 3, dt, m, 1, 0);
    f.inputs[2].strides[0] = 1;
    gs_vector(&f.inputs[f.n_inputs++], 4, dt, n);
    gs_op(&f, FM_OP_MUL, 10, 2, 1, 2, 0);
    gs_op(&f, FM_OP_ADD, 11, 2, 10, 3, 0);
    x = 11;
  }
  gs_op(&f, op, 20, 1, x, 0, 0);
  f.ops[f.n_ops - 1].dim = 0;
  fm_dtype rdt = kind == K_PROLOGUE ? FM_DT_F32 : dt;
  if (kind == K_PROLOGUE) { /* + b, cast back; the f32 reduction too */
    gs_op(&f, FM_OP_ADD, 21, 2, 20, 4, 0);
    gs_op(&f, FM_OP_CAST, 22, 1, 21, 0, 0);
    f.ops[f.n_ops - 1].dtype = dt;
    gs_vector(&f.outputs[f.n_outputs++], 22, dt, n);
  }
  gs_vector(&f.outputs[f.n_outputs++], 20, rdt, n);
  return gs_canon(&f, canon, fm_op_name(op));
}

/* M = 0 through every candidate of sum, mean and amax of a [-1, 256] bf16: the kernel still
 * launches and writes 0, NaN and -inf (torch's sum and mean; amax of nothing is -inf here). */
/* A split candidate's scratch (the groups' partials), as outs[n_outputs]; 0 when none. */
static fm_CUdeviceptr scratch_of(const fm_cuda *cu, fm_module *m, int64_t outer) {
  uint64_t bytes = m ? fm_module_scratch_bytes(m, outer) : 0;
  return bytes ? gu_dalloc(cu, (size_t)bytes) : 0;
}

static int check_empty(void) {
  const fm_cuda *cu;
  fm_device_id dev;
  fm_diag d = {{0}};
  static fm_fragment f, canon;
  int bad = 0;
  if (fm_cuda_load(&cu, &d) || fm_cuda_device_id(0, &dev, &d)) return 1;
  memset(&f, 0, sizeof f);
  f.vocab = 5;
  gs_matrix(&f.inputs[f.n_inputs++], 1, FM_DT_BF16, -1, 256, 0);
  for (uint32_t i = 0; i < 3; i++) {
    gs_op(&f, reduce_ops[i], 10 + i, 1, 1, 0, 0);
    f.ops[f.n_ops - 1].dim = 0;
    gs_vector(&f.outputs[f.n_outputs++], 10 + i, FM_DT_BF16, 256);
  }
  if (gs_canon(&f, &canon, "empty")) return 1;
  fm_candidate cand[64];
  size_t nc = fm_codegen_candidates(&canon, cand, 64);
  fm_CUdeviceptr in = gu_dalloc(cu, 16), out[3];
  for (int k = 0; k < 3; k++) out[k] = gu_dalloc(cu, 256 * 2);
  for (size_t i = 0; i < nc; i++) {
    fm_compiled kc = {0};
    fm_module *m = NULL;
    char *err = NULL, desc[96];
    fm_candidate_describe(&cand[i], desc, sizeof desc);
    if (!gu_picked(desc)) continue;
    void *ins[1] = {(void *)(uintptr_t)in}, *outs[4];
    uint16_t h[3][256];
    int ok = !gu_build_candidate(&canon, &cand[i], dev.sm_count, dev.arch, "empty.cu", &kc.cubin, &kc.cubin_len,
                                 &kc.meta, &err) &&
             !fm_module_load(&kc, &m, &d);
    for (int k = 0; ok && k < 3; k++) {
      cu->cuMemsetD8(out[k], 0x55, 256 * 2);
      outs[k] = (void *)(uintptr_t)out[k];
    }
    fm_CUdeviceptr scratch = ok ? scratch_of(cu, m, 0) : 0;
    outs[3] = (void *)(uintptr_t)scratch;
    ok = ok && !fm_module_launch(m, ins, outs, 0, NULL, &d) && !cu->cuCtxSynchronize();
    if (scratch) cu->cuMemFree(scratch);
    for (int k = 0; ok && k < 3; k++) ok = !gu_d2h(cu, h[k], out[k], sizeof h[k]);
    for (int e = 0; ok && e < 256; e++) {
      double s = gu_load(h[0], FM_DT_BF16, e), mn = gu_load(h[1], FM_DT_BF16, e), mx = gu_load(h[2], FM_DT_BF16, e);
      ok = s == 0 && isnan(mn) && isinf(mx) && mx < 0;
    }
    printf("%s M=0 sum/mean/amax [%s]%s%s\n", ok ? "ok  " : "FAIL", desc, err ? ": " : "", err ? err : d.text);
    bad += !ok;
    fm_module_unload(m);
    free(kc.cubin);
    free(err);
  }
  cu->cuMemFree(in);
  for (int k = 0; k < 3; k++) cu->cuMemFree(out[k]);
  return bad;
}

/* The median ms of 20 launches (after 3) of candidate c of canon at m rows, each on the next
 * of n_sets input buffers; -1 when it does not build. */
static double time_rotated(const fm_cuda *cu, const fm_device_id *dev, const fm_fragment *canon, const fm_candidate *c,
                           int64_t m, const fm_CUdeviceptr *sets, int n_sets, fm_CUdeviceptr out, fm_CUevent e0,
                           fm_CUevent e1) {
  fm_compiled kc = {0};
  fm_module *mod = NULL;
  char *err = NULL;
  fm_diag d = {{0}};
  float t[20];
  double ms = -1;
  if (gu_build_candidate(canon, c, dev->sm_count, dev->arch, "time.cu", &kc.cubin, &kc.cubin_len, &kc.meta, &err) ||
      fm_module_load(&kc, &mod, &d))
    goto out;
  fm_CUdeviceptr scratch = scratch_of(cu, mod, m);
  void *outs[2] = {(void *)(uintptr_t)out, (void *)(uintptr_t)scratch};
  for (int r = -3; r < 20; r++) {
    void *ins[1] = {(void *)(uintptr_t)sets[(r + 3) % n_sets]};
    if (r >= 0) cu->cuEventRecord(e0, NULL);
    fm_module_launch(mod, ins, outs, m, NULL, &d);
    if (r >= 0) {
      cu->cuEventRecord(e1, NULL);
      cu->cuEventSynchronize(e1);
      cu->cuEventElapsedTime(&t[r], e0, e1);
    }
  }
  ms = gu_median(t, 20);
  if (scratch) cu->cuMemFree(scratch);
out:
  fm_module_unload(mod);
  free(kc.cubin);
  free(err);
  return ms;
}

/* bf16 grad [m, n] .sum(0): every candidate and a copy of the same bytes, buffers rotated over
 * three times the L2. */
static void time_bias_grad(int64_t m, int64_t n) {
  const fm_cuda *cu;
  fm_device_id dev;
  fm_diag d = {{0}};
  static fm_fragment canon;
  if (fm_cuda_load(&cu, &d) || fm_cuda_device_id(0, &dev, &d) ||
      build(K_PLAIN, FM_OP_SUM, FM_DT_BF16, -1, n, 0, &canon))
    return;
  size_t bytes = (size_t)(m * n * 2);
  int l2 = 50 << 20, n_sets;
  cu->cuDeviceGetAttribute(&l2, 38 /* CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE */, 0);
  n_sets = (int)((3ull * (size_t)l2 + bytes - 1) / bytes);
  n_sets = n_sets < 2 ? 2 : n_sets > 32 ? 32 : n_sets;
  fm_CUdeviceptr sets[32], out = gu_dalloc(cu, (size_t)n * 2), dst = gu_dalloc(cu, bytes);
  for (int s = 0; s < n_sets; s++) {
    sets[s] = gu_dalloc(cu, bytes);
    cu->cuMemsetD8(sets[s], 0x3c, bytes); /* 0x3c3c: a bf16 near 0.0115, never zero */
  }
  fm_CUevent e0, e1;
  cu->cuEventCreate(&e0, 0);
  cu->cuEventCreate(&e1, 0);
  float t[20];
  for (int r = -3; r < 20; r++) {
    if (r >= 0) cu->cuEventRecord(e0, NULL);
    cu->cuMemcpyDtoD(dst, sets[(r + 3) % n_sets], bytes);
    if (r >= 0) {
      cu->cuEventRecord(e1, NULL);
      cu->cuEventSynchronize(e1);
      cu->cuEventElapsedTime(&t[r], e0, e1);
    }
  }
  double copy_ms = gu_median(t, 20), copy_gbps = 2.0 * (double)bytes / (copy_ms * 1e-3) / 1e9;
  double floor_ms = (double)bytes / (copy_gbps * 1e9) * 1e3, best = INFINITY, def = -1;
  char best_desc[96] = "";
  fm_candidate cand[64];
  size_t nc = fm_codegen_candidates(&canon, cand, 64);
  for (size_t i = 0; i < nc; i++) {
    char desc[96];
    fm_candidate_describe(&cand[i], desc, sizeof desc);
    if (!fm_candidate_runs_on(&cand[i], dev.arch)) continue;
    double ms = time_rotated(cu, &dev, &canon, &cand[i], m, sets, n_sets, out, e0, e1);
    printf("time [%s]: %.4f ms\n", desc, ms);
    if (i == 0) def = ms;
    if (ms > 0 && ms < best) {
      best = ms;
      snprintf(best_desc, sizeof best_desc, "%s", desc);
    }
  }
  printf(
      "bias grad bf16 [%lld, %lld].sum(0): best %.4f ms [%s], default %.4f ms; copy of %.1f MiB %.4f ms "
      "(%.0f GB/s read+write, %d buffer sets): floor %.4f ms, best at %.0f%% of copy bandwidth\n",
      (long long)m, (long long)n, best, best_desc, def, bytes / 1048576.0, copy_ms, copy_gbps, n_sets, floor_ms,
      100.0 * floor_ms / best);
  cu->cuEventDestroy(e0);
  cu->cuEventDestroy(e1);
  for (int s = 0; s < n_sets; s++) cu->cuMemFree(sets[s]);
  cu->cuMemFree(out);
  cu->cuMemFree(dst);
}

int main(int argc, char **argv) {
  static const int64_t ms[] = {1, 7, 127, 4099, 16384};
  static const int64_t ns[] = {1, 8, 100, 256, 1024, 4096};
  static const fm_dtype dts[] = {FM_DT_BF16, FM_DT_F16, FM_DT_F32};
  uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 0xc015;
  const char *mode = argc > 2 ? argv[2] : "both";
  if (gs_start(seed)) return 2;
  static fm_fragment canon;
  int idx = 0, bad = 0;
  if (strcmp(mode, "time") != 0) {
    for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
      for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++, idx++) {
        fm_dtype dt = dts[idx % 3];
        fm_op op = reduce_ops[(idx / 3) % 3];
        int kind = idx % K__N, symbolic = idx % 4 != 0, padded = idx % 5 == 4;
        int64_t m = ms[mi], n = ns[ni];
        char name[128];
        snprintf(name, sizeof name, "%s %s %s M=%lld%s N=%lld%s", fm_op_name(op), fm_dtype_name(dt), kind_name[kind],
                 (long long)m, symbolic ? " (sym)" : "", (long long)n, padded ? " padded" : "");
        if (build(kind, op, dt, symbolic ? -1 : m, n, padded, &canon)) {
          bad++;
          continue;
        }
        gs_add_case(name, &canon, m, 1);
      }
    gs_run();
    bad += check_empty();
  }
  if (strcmp(mode, "check") != 0) {
    time_bias_grad(16384, 1024);
    time_bias_grad(16384, 256);
    time_bias_grad(802816, 64); /* ResNet-50's first batch norms at batch 64 */
    time_bias_grad(200704, 256);
  }
  return gs_finish() || bad ? 1 : 0;
}
