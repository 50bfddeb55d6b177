/* rows_bw.c (device machine only): row-kernel bandwidth: RMSNorm (x, w), LayerNorm (x, w, b)
 * and softmax (x) over a [16384, 4096] bf16 x (128 MiB), every candidate of the rows template
 * compiled locally (codegen + NVRTC) and launched through libfusemld, timed against the
 * device-to-device copy of the same bytes in the same run (CUDA events, median of REPS).
 * A row kernel reads x once and writes y once (the [1, 4096] weights stay in cache): exactly
 * the copy's traffic, so the copy time is its floor; the goal is >= 85% of the copy
 * bandwidth. The first 64 rows of each output are checked against the CPU reference.
 *
 * Usage: rows_bw OUT.json */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_client.h"
#include "fm_codegen.h"
#include "fm_cuda.h"
#include "fm_nvrtc.h"
#include "fm_reference.h"
#include "gpu_util.h"

#define ROWS       16384
#define COLS       4096
#define CHECK_ROWS 64
#define REPS       30
#define WARMUP     5

static const fm_cuda *cu;
static fm_device_id dev;
static fm_CUevent ev_a, ev_b;

static void tensor(fm_tensor *t, uint32_t id, int64_t d0) {
  memset(t, 0, sizeof *t);
  t->id = id;
  t->dtype = FM_DT_BF16;
  t->rank = 2;
  t->shape[0] = d0;
  t->shape[1] = COLS;
  t->strides[0] = COLS;
  t->strides[1] = 1;
  t->align = 16;
}

/* 0 rms_norm(x, w), 1 layer_norm(x, w, b), 2 softmax(x): x [-1, COLS] bf16 */
static int build(int which, fm_fragment *canon) {
  static fm_fragment f;
  static const fm_op ops[3] = {FM_OP_RMS_NORM, FM_OP_LAYER_NORM, FM_OP_SOFTMAX};
  fm_diag d = {{0}};
  memset(&f, 0, sizeof f);
  f.vocab = 2;
  f.n_inputs = (uint32_t)(which == 0 ? 2 : which == 1 ? 3 : 1);
  tensor(&f.inputs[0], 0, FM_DIM_SYMBOLIC);
  for (uint32_t k = 1; k < f.n_inputs; k++) tensor(&f.inputs[k], k, 1);
  f.n_ops = 1;
  f.ops[0] = (fm_opnode){.op = ops[which],
                         .out = 10,
                         .nargs = f.n_inputs,
                         .args = {0, 1, 2},
                         .value = which == 0 ? 1e-6 : 1e-5,
                         .dim = -1};
  f.n_outputs = 1;
  tensor(&f.outputs[0], 10, FM_DIM_SYMBOLIC);
  int rc = fm_fragment_expand(&f, &d);
  if (!rc) rc = fm_fragment_validate(&f, &d);
  if (!rc) rc = fm_fragment_canonicalize(&f, canon);
  if (rc) fprintf(stderr, "build %d: %s\n", which, d.text);
  return rc;
}

/* Each timed launch follows an untimed one of the same work, which keeps the GPU busy while
 * the host records the start and makes the timed call: the events then span the GPU's work
 * alone. Timed from an idle GPU they also held the host's call (a few microseconds, more for
 * the copy than for a kernel launch: bench/NOTES.md, "Timed back to back"). */
static float time_launch(fm_module *m, void **in, void **out) {
  float ms = 0;
  fm_module_launch(m, in, out, ROWS, NULL, NULL); /* the primer */
  cu->cuEventRecord(ev_a, NULL);
  fm_module_launch(m, in, out, ROWS, NULL, NULL);
  cu->cuEventRecord(ev_b, NULL);
  cu->cuEventSynchronize(ev_b);
  cu->cuEventElapsedTime(&ms, ev_a, ev_b);
  return ms;
}

static float time_copy(fm_CUdeviceptr dst, fm_CUdeviceptr src, size_t bytes) {
  float ms = 0;
  cu->cuMemcpyDtoD(dst, src, bytes); /* the primer (time_launch); device to device it does not block */
  cu->cuEventRecord(ev_a, NULL);
  cu->cuMemcpyDtoD(dst, src, bytes);
  cu->cuEventRecord(ev_b, NULL);
  cu->cuEventSynchronize(ev_b);
  cu->cuEventElapsedTime(&ms, ev_a, ev_b);
  return ms;
}

int main(int argc, char **argv) {
  static const char *const names[3] = {"rms_norm", "layer_norm", "softmax"};
  static fm_fragment canon;
  fm_diag d = {{0}};
  if (argc < 2) {
    fprintf(stderr, "usage: %s OUT.json\n", argv[0]);
    return 2;
  }
  if (fm_cuda_load(&cu, &d) || fm_cuda_device_id(0, &dev, &d)) {
    fprintf(stderr, "no GPU: %s\n", d.text);
    return 2;
  }
  /* a current context before any allocation (module loads would otherwise create it) */
  fm_CUdevice cudev;
  fm_CUcontext ctx;
  if (cu->cuDeviceGet(&cudev, 0) || cu->cuDevicePrimaryCtxRetain(&ctx, cudev) || cu->cuCtxSetCurrent(ctx)) {
    fprintf(stderr, "cannot make device 0's primary context current\n");
    return 2;
  }
  FILE *js = fopen(argv[1], "w");
  if (!js) return 2;
  size_t xbytes = (size_t)ROWS * COLS * 2, wbytes = (size_t)COLS * 2;
  uint16_t *hx = malloc(xbytes), *hw = malloc(wbytes), *hb = malloc(wbytes), *hy = malloc(xbytes);
  uint16_t *href = malloc((size_t)CHECK_ROWS * COLS * 2);
  gu_rng rng = {0x5eed};
  for (size_t i = 0; i < (size_t)ROWS * COLS; i++) hx[i] = gu_f32_to_bf16((float)gu_uniform(&rng, -3, 3));
  for (size_t i = 0; i < COLS; i++) {
    hw[i] = gu_f32_to_bf16((float)gu_uniform(&rng, 0.5, 1.5));
    hb[i] = gu_f32_to_bf16((float)gu_uniform(&rng, -0.5, 0.5));
  }
  fm_CUdeviceptr dx = gu_dalloc(cu, xbytes), dy = gu_dalloc(cu, xbytes), dw = gu_dalloc(cu, wbytes),
                 db = gu_dalloc(cu, wbytes);
  gu_h2d(cu, dx, hx, xbytes);
  gu_h2d(cu, dw, hw, wbytes);
  gu_h2d(cu, db, hb, wbytes);
  cu->cuEventCreate(&ev_a, 0);
  cu->cuEventCreate(&ev_b, 0);
  void *in[3] = {(void *)(uintptr_t)dx, (void *)(uintptr_t)dw, (void *)(uintptr_t)db};
  void *out[1] = {(void *)(uintptr_t)dy};

  float ms[REPS];
  for (int w = 0; w < WARMUP; w++) time_copy(dy, dx, xbytes);
  for (int r = 0; r < REPS; r++) ms[r] = time_copy(dy, dx, xbytes);
  float copy_ms = gu_median(ms, REPS);
  double copy_gbps = 2.0 * (double)xbytes / (copy_ms * 1e-3) / 1e9;
  printf("device %s (%s): copy of %zu MiB: %.3f ms (%.0f GB/s read+write)\n", dev.name, dev.arch, xbytes >> 20, copy_ms,
         copy_gbps);
  fprintf(js,
          "{\"device\": \"%s\", \"shape\": [%d, %d], \"dtype\": \"bf16\", \"copy_ms\": %.4f,"
          " \"copy_gbps\": %.1f, \"ops\": [",
          dev.name, ROWS, COLS, copy_ms, copy_gbps);
  int all_ok = 1;
  for (int which = 0; which < 3; which++) {
    if (build(which, &canon)) return 1;
    fm_candidate cand[16];
    size_t nc = fm_codegen_candidates(&canon, cand, 16);
    float best = INFINITY, def_ms = INFINITY;
    double err = INFINITY;
    char best_desc[96] = "";
    fprintf(js, "%s\n {\"op\": \"%s\", \"candidates\": [", which ? "," : "", names[which]);
    for (size_t i = 0; i < nc; i++) {
      char *src = NULL, *log = NULL, desc[96];
      fm_compiled k;
      fm_module *m = NULL;
      memset(&k, 0, sizeof k);
      fm_candidate_describe(&cand[i], desc, sizeof desc);
      if (fm_codegen_generate(&canon, &cand[i], dev.sm_count, &src, &k.meta, &d) ||
          fm_nvrtc_compile(src, "rows.cu", dev.arch, &k.cubin, &k.cubin_len, &log) || fm_module_load(&k, &m, &d)) {
        fprintf(stderr, "%s [%s]: %s %s\n", names[which], desc, d.text, log ? log : "");
        free(src), free(log), free(k.cubin);
        continue;
      }
      for (int w = 0; w < WARMUP; w++) time_launch(m, in, out);
      for (int r = 0; r < REPS; r++) ms[r] = time_launch(m, in, out);
      float med = gu_median(ms, REPS);
      if (i == 0) { /* the default: check it against the reference */
        def_ms = med;
        gu_d2h(cu, hy, dy, (size_t)CHECK_ROWS * COLS * 2);
        const void *rin[3] = {hx, hw, hb};
        void *rout[1] = {href};
        if (fm_reference_eval(&canon, CHECK_ROWS, rin, rout, &d) == 0)
          err = gu_rel_err(hy, FM_DT_BF16, href, FM_DT_BF16, (size_t)CHECK_ROWS * COLS);
      }
      if (med < best) {
        best = med;
        snprintf(best_desc, sizeof best_desc, "%s", desc);
      }
      printf("  %-10s %-40s %.3f ms  %5.1f%% of copy\n", names[which], desc, med, 100.0 * copy_ms / med);
      fprintf(js, "%s{\"config\": \"%s\", \"ms\": %.4f, \"fraction_of_copy\": %.4f}", i ? ", " : "", desc, med,
              copy_ms / med);
      fm_module_unload(m);
      free(src), free(log), free(k.cubin);
    }
    int ok = err <= 1e-2 && copy_ms / def_ms >= 0.85;
    all_ok &= ok;
    printf("%s: %s default %.1f%%, best %.1f%% (%s) of copy bandwidth (goal 85%%), rel_err %.2e\n",
           ok ? "PASS" : "MISS", names[which], 100.0 * copy_ms / def_ms, 100.0 * copy_ms / best, best_desc, err);
    fprintf(js,
            "], \"default_fraction_of_copy\": %.4f, \"best_fraction_of_copy\": %.4f, \"best\": \"%s\","
            " \"rel_err\": %.3e}",
            copy_ms / def_ms, copy_ms / best, best_desc, err);
  }
  fprintf(js, "]}\n");
  fclose(js);
  free(hx), free(hw), free(hb), free(hy), free(href);
  return all_ok ? 0 : 1;
}
