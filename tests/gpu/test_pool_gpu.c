/* test_pool_gpu.c (device machine only): the window ops (vocabulary 7: max_pool2d with its
 * argmax, and the backward), every candidate of the pointwise template's extent form checked
 * against the fp64 reference through the shared suite (gpu_suite.h), then ResNet-50's stem
 * pool timed.
 *
 * Cases: {13x13, 3x3 stride 2 padding 1}, {12x10, 2x2 stride 2}, {13x13, 3x3 stride 2 with
 * ceil_mode}, {11x9, 3x2 stride 1x2 padding 1x0 dilation 2x1 with ceil_mode}, each forward
 * (the max and the argmax's tap indices) and backward (from random tap indices), channels-last
 * and row-major, the dtype rotating over bf16 / f16 / f32, N symbolic in half of them; then
 * ResNet-50's stem ([64, 64, 112, 112] channels-last bf16, 3x3 stride 2 padding 1) checked and
 * every candidate timed, forward and backward, with the bandwidth its bytes make. Random
 * inputs hold many ties in bf16 and f16, so a kernel whose argmax differs from the scan's
 * (the first of equal maxima) fails its forward.
 *
 * Usage: test_pool_gpu [SEED [check|time|both|backward]]   (backward: time the stem's backward
 * only) One line per kernel and "N passed, N failed". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_fragment.h"
#include "gpu_suite.h"
#include "test_codegen_frag.h"

typedef struct pool_shape {
  const char *name;
  int64_t h, w;
  int32_t window[8]; /* kh, kw, sh, sw, ph, pw, dh, dw */
  int ceil_mode;
} pool_shape;

static const pool_shape shapes[] = {
    {"3x3 s2 p1", 13, 13, {3, 3, 2, 2, 1, 1, 1, 1}, 0},
    {"2x2 s2", 12, 10, {2, 2, 2, 2, 0, 0, 1, 1}, 0},
    {"3x3 s2 ceil", 13, 13, {3, 3, 2, 2, 0, 0, 1, 1}, 1},
    {"3x2 s1x2 p1x0 d2x1 ceil", 11, 9, {3, 2, 1, 2, 1, 0, 2, 1}, 1},
};
static const fm_dtype dtypes[3] = {FM_DT_BF16, FM_DT_F16, FM_DT_F32};

/* Times every candidate of canon (ResNet's size) and prints the best with its bandwidth. */
static void time_one(const fm_fragment *canon, const char *what, int64_t n, double bytes) {
  char best_desc[96];
  double ms = gs_time(canon, n, 1, best_desc, sizeof best_desc);
  printf("best %s: %.4f ms [%s], %.0f GB/s\n", what, ms, best_desc, bytes / ms / 1e6);
}

int main(int argc, char **argv) {
  uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 0x9001;
  const char *mode = argc > 2 ? argv[2] : "both";
  if (gs_start(seed)) return 2;
  static fm_fragment raw, canon;
  int idx = 0, bad = 0;
  /* "backward": time the backward alone (a profiler's run) */
  const int check = strcmp(mode, "time") != 0 && strcmp(mode, "backward") != 0, time = strcmp(mode, "check") != 0;
  const int first = strcmp(mode, "backward") == 0 ? 1 : 0;
  for (size_t s = 0; check && s < sizeof shapes / sizeof shapes[0]; s++)
    for (int cl = 0; cl < 2; cl++)
      for (int b = 0; b < 2; b++, idx++) {
        const pool_shape *ps = &shapes[s];
        const fm_dtype dt = dtypes[idx % 3];
        const int symbolic = idx % 2 == 0;
        const int64_t n = 3, c = cl ? 8 : 5, nchw[4] = {symbolic ? -1 : n, c, ps->h, ps->w};
        char name[128];
        snprintf(name, sizeof name, "%s %s %s [%lld%s, %lld, %lld, %lld] %s", b ? "max_pool2d_backward" : "max_pool2d",
                 ps->name, fm_dtype_name(dt), (long long)n, symbolic ? " (sym)" : "", (long long)c, (long long)ps->h,
                 (long long)ps->w, cl ? "channels-last" : "row-major");
        if (tf_max_pool(&raw, &canon, dt, nchw, ps->window, ps->ceil_mode, cl, b ? TF_POOL_BACKWARD : TF_POOL_ARGMAX)) {
          printf("FAIL build %s\n", name);
          bad++;
          continue;
        }
        gs_add_case(name, &canon, n, 1);
      }
  /* ResNet-50's stem: [64, 64, 112, 112] channels-last bf16, 3x3 stride 2 padding 1 */
  static const int64_t stem[4] = {-1, 64, 112, 112};
  static const int32_t window[8] = {3, 3, 2, 2, 1, 1, 1, 1};
  const double x_bytes = 64.0 * 64 * 112 * 112 * 2, y_bytes = x_bytes / 4;
  for (int b = 0; b < 2; b++) {
    if (tf_max_pool(&raw, &canon, FM_DT_BF16, stem, window, 0, 1, b ? TF_POOL_BACKWARD : TF_POOL_ARGMAX)) {
      printf("FAIL build ResNet-50 stem\n");
      bad++;
      continue;
    }
    if (check) gs_add_case(b ? "resnet50 stem max_pool2d_backward" : "resnet50 stem max_pool2d", &canon, 64, 1);
  }
  gs_run();
  for (int b = first; time && b < 2; b++) {
    if (tf_max_pool(&raw, &canon, FM_DT_BF16, stem, window, 0, 1, b ? TF_POOL_BACKWARD : TF_POOL_ARGMAX)) continue;
    time_one(&canon,
             b ? "max_pool2d_backward [64, 64, 112, 112] bf16 channels-last"
               : "max_pool2d [64, 64, 112, 112] bf16 channels-last",
             64, x_bytes + 2 * y_bytes); /* forward: x read, y and the f16 argmax written; backward:
                                            gy and the argmax read, grad_x written */
  }
  return gs_finish() || bad ? 1 : 0;
}
