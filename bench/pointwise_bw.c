/* pointwise_bw.c (device machine only): the pointwise-chain bandwidth benchmark.
 *
 * Two chains of 5 pointwise ops over 256 MiB of bf16 input: an activation chain,
 * y = silu(gelu(x*1.5 + 0.25) * x), and an arithmetic one, y = relu(x*1.5 + 0.25) * x + 0.125
 * ([32768, 4096]), served by a real fusemld and launched through libfusemld, timed against
 * the device-to-device copy of the same bytes in the same process and run (order
 * alternated, CUDA events, median of many). The fused kernel moves the fewest bytes
 * possible (read x once, write y once: exactly what the copy moves), so its floor is the copy
 * time and the goal is >= 80% of the copy bandwidth. Also timed: the same chain as five
 * separate single-op kernels (what eager runs), and every tuning candidate of the template
 * compiled locally, to show where the heuristic default stands.
 *
 * Usage: pointwise_bw SOCKET OUT.json */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fm_client.h"
#include "fm_codegen.h"
#include "fm_cuda.h"
#include "fm_nvrtc.h"
#include "fm_reference.h"
#include "frag_builder.h"
#include "gpu_util.h"

#define ROWS   32768
#define COLS   4096
#define REPS   30
#define WARMUP 5

static const fm_cuda *cu;

/* The arithmetic chain: y = relu(x*1.5 + 0.25) * x + 0.125 (5 cheap ops). */
static void arith5(fb *b) {
  int64_t s[2] = {FM_DIM_SYMBOLIC, COLS};
  fb_init(b);
  uint32_t x = fb_input(b, FM_DT_BF16, 2, s, NULL, 16);
  uint32_t t = fb_op2(b, FM_OP_MUL, x, fb_const(b, 1.5));
  t = fb_op2(b, FM_OP_ADD, t, fb_const(b, 0.25));
  t = fb_op1(b, FM_OP_RELU, t);
  t = fb_op2(b, FM_OP_MUL, t, x);
  t = fb_op2(b, FM_OP_ADD, t, fb_const(b, 0.125));
  fb_output(b, t, 2, s);
}

/* The activation chain: y = silu(gelu(x*1.5 + 0.25) * x) (two transcendental ops). */
static void chain5(fb *b) {
  int64_t s[2] = {FM_DIM_SYMBOLIC, COLS};
  fb_init(b);
  uint32_t x = fb_input(b, FM_DT_BF16, 2, s, NULL, 16);
  uint32_t t = fb_op2(b, FM_OP_MUL, x, fb_const(b, 1.5));
  t = fb_op2(b, FM_OP_ADD, t, fb_const(b, 0.25));
  t = fb_op1(b, FM_OP_GELU, t);
  t = fb_op2(b, FM_OP_MUL, t, x);
  t = fb_op1(b, FM_OP_SILU, t);
  fb_output(b, t, 2, s);
}

static int compile_remote(fm_client *c, const fm_fragment *f, fm_compiled *k, fm_diag *d) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  fm_fragment_pack(f, &pk);
  int err = fm_client_compile(c, (const uint8_t *)sb.data, sb.size, k, d);
  msgpack_sbuffer_destroy(&sb);
  return err;
}

typedef struct timer {
  fm_CUevent a, b;
} timer;

static float elapsed(timer *t) {
  float ms = 0;
  cu->cuEventSynchronize(t->b);
  cu->cuEventElapsedTime(&ms, t->a, t->b);
  return ms;
}

/* Launch list: one or more modules run in sequence (the unfused chain is five). */
typedef struct step {
  fm_module *m;
  void *in[2];
  void *out[1];
} step;

/* Each timed run follows an untimed one of the same work, which keeps the GPU busy while the
 * host records the start and makes the timed calls: the events then span the GPU's work
 * alone. Timed from an idle GPU they also held the host's calls (a few microseconds a call:
 * bench/NOTES.md, "Timed back to back"). */
static float time_steps(step *s, int n, timer *t) {
  for (int i = 0; i < n; i++) fm_module_launch(s[i].m, s[i].in, s[i].out, ROWS, NULL, NULL); /* the primer */
  cu->cuEventRecord(t->a, NULL);
  for (int i = 0; i < n; i++) fm_module_launch(s[i].m, s[i].in, s[i].out, ROWS, NULL, NULL);
  cu->cuEventRecord(t->b, NULL);
  return elapsed(t);
}

static float time_copy(fm_CUdeviceptr dst, fm_CUdeviceptr src, size_t bytes, timer *t) {
  cu->cuMemcpyDtoD(dst, src, bytes); /* the primer (time_steps); device to device it does not block */
  cu->cuEventRecord(t->a, NULL);
  cu->cuMemcpyDtoD(dst, src, bytes);
  cu->cuEventRecord(t->b, NULL);
  return elapsed(t);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s SOCKET OUT.json\n", argv[0]);
    return 2;
  }
  fm_diag d = {{0}};
  fm_client *c = NULL;
  if (fm_cuda_load(&cu, &d) || fm_client_connect(argv[1], "pointwise_bw", 120000, &c, &d)) {
    fprintf(stderr, "setup: %s\n", d.text);
    return 1;
  }
  fm_device_id dev;
  fm_cuda_device_id(0, &dev, &d);

  const size_t n = (size_t)ROWS * COLS, bytes = n * 2;
  fb b;
  chain5(&b);
  fm_compiled fused;
  memset(&fused, 0, sizeof fused);
  fm_module *fused_mod = NULL;
  if (compile_remote(c, &b.f, &fused, &d) || fm_module_load(&fused, &fused_mod, &d)) {
    fprintf(stderr, "fused kernel: %s\n", d.text);
    return 1;
  }

  fb ba;
  arith5(&ba);
  fm_compiled arith;
  memset(&arith, 0, sizeof arith);
  fm_module *arith_mod = NULL;
  if (compile_remote(c, &ba.f, &arith, &d) || fm_module_load(&arith, &arith_mod, &d)) {
    fprintf(stderr, "arith kernel: %s\n", d.text);
    return 1;
  }

  /* The unfused chain: one kernel per op, each intermediate a bf16 tensor in memory. */
  int64_t s[2] = {FM_DIM_SYMBOLIC, COLS};
  fm_module *single[5] = {0};
  fm_compiled singles[5];
  memset(singles, 0, sizeof singles);
  for (int i = 0; i < 5; i++) {
    fb u;
    fb_init(&u);
    uint32_t x = fb_input(&u, FM_DT_BF16, 2, s, NULL, 16), y;
    if (i == 3) {
      uint32_t x2 = fb_input(&u, FM_DT_BF16, 2, s, NULL, 16);
      y = fb_op2(&u, FM_OP_MUL, x, x2);
    } else if (i == 0)
      y = fb_op2(&u, FM_OP_MUL, x, fb_const(&u, 1.5));
    else if (i == 1)
      y = fb_op2(&u, FM_OP_ADD, x, fb_const(&u, 0.25));
    else if (i == 2)
      y = fb_op1(&u, FM_OP_GELU, x);
    else
      y = fb_op1(&u, FM_OP_SILU, x);
    fb_output(&u, y, 2, s);
    if (compile_remote(c, &u.f, &singles[i], &d) || fm_module_load(&singles[i], &single[i], &d)) {
      fprintf(stderr, "single op %d: %s\n", i, d.text);
      return 1;
    }
  }

  /* Buffers: x, y, a copy destination, and 2 intermediates for the unfused chain. */
  uint16_t *hx = malloc(bytes), *hy = malloc(bytes);
  gu_rng r = {0x5eed};
  for (size_t i = 0; i < n; i++) hx[i] = gu_f32_to_bf16((float)gu_uniform(&r, -2, 2));
  fm_CUdeviceptr dx = gu_dalloc(cu, bytes), dy = gu_dalloc(cu, bytes), dc = gu_dalloc(cu, bytes),
                 t1 = gu_dalloc(cu, bytes), t2 = gu_dalloc(cu, bytes);
  if (!dx || !dy || !dc || !t1 || !t2 || gu_h2d(cu, dx, hx, bytes)) return 1;
#define P(x) ((void *)(uintptr_t)(x))
  step fused_step = {fused_mod, {P(dx)}, {P(dy)}};
  step arith_step = {arith_mod, {P(dx)}, {P(dc)}};
  step chain[5] = {{single[0], {P(dx)}, {P(t1)}},
                   {single[1], {P(t1)}, {P(t2)}},
                   {single[2], {P(t2)}, {P(t1)}},
                   {single[3], {P(t1), P(dx)}, {P(t2)}},
                   {single[4], {P(t2)}, {P(dy)}}};

  /* Correctness of the fused kernel on the full tensor, against the fp64 reference on a
   * sample of rows (the kernel is the same for every row; rows spread over the tensor). */
  cu->cuMemsetD8(dy, 0xFF, bytes);
  if (fm_module_launch(fused_mod, fused_step.in, fused_step.out, ROWS, NULL, &d)) {
    fprintf(stderr, "launch: %s\n", d.text);
    return 1;
  }
  double rel_err = INFINITY;
  {
    cu->cuCtxSynchronize();
    gu_d2h(cu, hy, dy, bytes);
    fm_fragment canon, tmp = b.f;
    fm_fragment_validate(&tmp, &d);
    fm_fragment_canonicalize(&tmp, &canon);
    canon.outputs[0].dtype = FM_DT_F32;
    const int sample_rows = 512;
    uint16_t *xs = malloc((size_t)sample_rows * COLS * 2), *ys = malloc((size_t)sample_rows * COLS * 2);
    float *ref = malloc((size_t)sample_rows * COLS * 4);
    for (int i = 0; i < sample_rows; i++) {
      size_t row = (size_t)i * (ROWS / sample_rows) + (size_t)(i % 7);
      memcpy(xs + (size_t)i * COLS, hx + row * COLS, COLS * 2);
      memcpy(ys + (size_t)i * COLS, hy + row * COLS, COLS * 2);
    }
    const void *ins[1] = {xs};
    void *outs[1] = {ref};
    if (fm_reference_eval(&canon, sample_rows, ins, outs, &d) == 0)
      rel_err = gu_rel_err(ys, FM_DT_BF16, ref, FM_DT_F32, (size_t)sample_rows * COLS);
    free(xs);
    free(ys);
    free(ref);
  }
  printf("fused chain rel_err %.3e\n", rel_err);

  timer t;
  cu->cuEventCreate(&t.a, 0);
  cu->cuEventCreate(&t.b, 0);
  for (int w = 0; w < WARMUP; w++) {
    time_copy(dc, dx, bytes, &t);
    time_steps(&fused_step, 1, &t);
    time_steps(chain, 5, &t);
    time_steps(&arith_step, 1, &t);
  }
  float copy_ms[REPS], fused_ms[REPS], chain_ms[REPS], arith_ms[REPS];
  for (int i = 0; i < REPS; i++) { /* rotate the order so no version always runs after another */
    arith_ms[i] = time_steps(&arith_step, 1, &t);
    switch (i % 3) {
      case 0:
        copy_ms[i] = time_copy(dc, dx, bytes, &t);
        fused_ms[i] = time_steps(&fused_step, 1, &t);
        chain_ms[i] = time_steps(chain, 5, &t);
        break;
      case 1:
        fused_ms[i] = time_steps(&fused_step, 1, &t);
        chain_ms[i] = time_steps(chain, 5, &t);
        copy_ms[i] = time_copy(dc, dx, bytes, &t);
        break;
      default:
        chain_ms[i] = time_steps(chain, 5, &t);
        copy_ms[i] = time_copy(dc, dx, bytes, &t);
        fused_ms[i] = time_steps(&fused_step, 1, &t);
        break;
    }
  }
  float copy_med = gu_median(copy_ms, REPS), fused_med = gu_median(fused_ms, REPS),
        chain_med = gu_median(chain_ms, REPS), arith_med = gu_median(arith_ms, REPS);
  double moved = 2.0 * (double)bytes; /* read x once, write y once */
  double copy_gbps = moved / (copy_med * 1e6), fused_gbps = moved / (fused_med * 1e6);
  printf(
      "device %s\ncopy %.3f ms (%.0f GB/s)\nfused %.3f ms (%.0f GB/s) = %.1f%% of copy\n"
      "unfused 5 kernels %.3f ms (fused speedup %.2fx)\n",
      dev.name, copy_med, copy_gbps, fused_med, fused_gbps, 100.0 * copy_med / fused_med, chain_med,
      chain_med / fused_med);
  printf("arith chain %.3f ms = %.1f%% of copy\n", arith_med, 100.0 * copy_med / arith_med);

  /* Every candidate of the template, compiled here and timed the same way. */
  fm_fragment canon, tmp = b.f;
  fm_fragment_validate(&tmp, &d);
  fm_fragment_canonicalize(&tmp, &canon);
  fm_pw_config cands[64];
  size_t nc = fm_codegen_pointwise_candidates(&canon, cands, 64);
  FILE *js = fopen(argv[2], "w");
  if (!js) return 1;
  char date[32];
  time_t now = time(NULL);
  strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
  fprintf(js, "{\"benchmark\": \"pointwise_chain5_bf16\", \"device\": \"%s\", \"date\": \"%s\",\n", dev.name, date);
  fprintf(js, " \"shape\": [%d, %d], \"bytes_moved\": %.0f, \"reps\": %d,\n", ROWS, COLS, moved, REPS);
  fprintf(js, " \"copy_ms\": %.4f, \"copy_gbps\": %.1f, \"fused_ms\": %.4f, \"fused_gbps\": %.1f,\n", copy_med,
          copy_gbps, fused_med, fused_gbps);
  fprintf(js, " \"arith_chain_ms\": %.4f, \"arith_fraction_of_copy\": %.4f,\n", arith_med, copy_med / arith_med);
  fprintf(js,
          " \"fused_fraction_of_copy\": %.4f, \"unfused_5_kernels_ms\": %.4f, \"fused_speedup_vs_unfused\": %.3f,\n",
          copy_med / fused_med, chain_med, chain_med / fused_med);
  fprintf(js,
          " \"rel_err\": %.3e, \"served_config\": {\"block\": %u, \"items_per_block\": %" PRIu64
          ", \"max_blocks\": %u},\n \"candidates\": [",
          rel_err, fused.meta.block[0], fused.meta.items_per_block, fused.meta.max_blocks);
  for (size_t i = 0; i < nc; i++) {
    char *src = NULL, *log = NULL;
    uint8_t *cubin = NULL;
    fm_compiled k;
    memset(&k, 0, sizeof k);
    fm_module *m = NULL;
    float ms[REPS];
    if (fm_codegen_pointwise(&canon, &cands[i], dev.sm_count, &src, &k.meta, &d) ||
        fm_nvrtc_compile(src, "cand.cu", dev.arch, &cubin, &k.cubin_len, &log)) {
      fprintf(stderr, "candidate %zu: %s %s\n", i, d.text, log ? log : "");
      free(src);
      free(log);
      free(cubin);
      continue;
    }
    k.cubin = cubin;
    if (fm_module_load(&k, &m, &d) == 0) {
      step st = {m, {P(dx)}, {P(dy)}};
      for (int w = 0; w < WARMUP; w++) time_steps(&st, 1, &t);
      for (int rr = 0; rr < REPS; rr++) ms[rr] = time_steps(&st, 1, &t);
      float med = gu_median(ms, REPS);
      printf("candidate block=%u vec=%u unroll=%u bps=%u: %.3f ms (%.1f%% of copy)\n", cands[i].block, cands[i].vec,
             cands[i].unroll, cands[i].blocks_per_sm, med, 100.0 * copy_med / med);
      fprintf(js, "%s\n  {\"block\": %u, \"vec\": %u, \"unroll\": %u, \"blocks_per_sm\": %u, \"ms\": %.4f}",
              i ? "," : "", cands[i].block, cands[i].vec, cands[i].unroll, cands[i].blocks_per_sm, med);
      fm_module_unload(m);
    }
    free(src);
    free(log);
    free(cubin);
  }
  fprintf(js, "]}\n");
  fclose(js);
  fm_client_close(c);
  int ok = rel_err <= 1e-2 && copy_med / fused_med >= 0.8 && copy_med / arith_med >= 0.8;
  printf(
      "%s: activation chain at %.1f%%, arithmetic chain at %.1f%% of copy bandwidth (goal 80%%), "
      "rel_err %.2e\n",
      ok ? "PASS" : "MISS", 100.0 * copy_med / fused_med, 100.0 * copy_med / arith_med, rel_err);
  return ok ? 0 : 1;
}
