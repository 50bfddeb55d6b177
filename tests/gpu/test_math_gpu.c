/* test_math_gpu.c (device machine only): the transcendentals every generated kernel shares
 * (the ops prelude: fm_gelu, fm_gelu_tanh, fm_tanh, fm_sigmoid, fm_silu, fm_exp, and fm_div,
 * here x / 3), element by element against fp64 on a dense sweep of fp32 inputs, in every
 * prelude: FM_FAST_MATH 2 (every output bf16: GELU's shorter fit, within 5e-4), 1 (hardware
 * ex2 / rcp approximations, div.full and the fitted GELU, used when any float input or output
 * is 16-bit) and 0 (the library functions and IEEE division). The fragment suites compare whole tensors by
 * ‖out−ref‖/‖ref‖ after a 16-bit store, which hides an error below bf16's rounding; here
 * each function must stay within rtol·|ref| + atol of fp64 at every one of ~2 million points
 * of [-12, 12], and NaN, ±inf must come out as torch gives them.
 *
 * Usage: test_math_gpu     Prints one line per function and prelude, "N passed, N failed". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen_int.h"
#include "fm_cuda.h"
#include "fm_nvrtc.h"
#include "fm_strbuf.h"
#include "gpu_util.h"

#define N_FUNCS  7
#define SWEEP    2000001
#define SPECIALS 3 /* NaN, +inf, -inf after the sweep */
static const char *const func_name[N_FUNCS] = {"fm_gelu", "fm_gelu_tanh", "fm_tanh", "fm_sigmoid", "fm_silu", "fm_exp", "fm_div"};

static double ref_gelu(double x) { return 0.5 * x * erfc(-x / sqrt(2.0)); }
static double ref_gelu_tanh(double x) {
  return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
static double ref_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static double reference(int f, double x) {
  switch (f) {
    case 0:
      return ref_gelu(x);
    case 1:
      return ref_gelu_tanh(x);
    case 2:
      return tanh(x);
    case 3:
      return ref_sigmoid(x);
    case 4:
      return x * ref_sigmoid(x);
    case 5:
      return exp(x);
    default:
      return x / 3.0;
  }
}

/* |got - ref| <= rtol |ref| + abs_tol[fast]. The absolute parts: the library GELU (torch's
 * formula, 0.5 x (1 + erff(x / sqrt 2))) and both tanh-GELUs cancel in 1 + erf / 1 + tanh
 * for negative x exactly as torch's fp32 kernels do: an absolute error of ~1e-7 times x / 2;
 * the fast tanh's absolute error near its switch; the fast GELU's fit beyond its range
 * (|x| > 6.36, where GELU is below 1e-9 and the fit still tracks it). */
static const double rel_tol[3][N_FUNCS] = {
    {2e-5, 2e-5, 1e-5, 1e-5, 1e-5, 1e-5, 1e-7},
    {2e-5, 2e-5, 1e-5, 1e-5, 1e-5, 1e-5, 3e-7},
    {5e-4, 2e-5, 1e-5, 1e-5, 1e-5, 1e-5, 3e-7}};
static const double abs_tol[3][N_FUNCS] = {{1e-6, 2e-6, 1e-7, 1e-12, 1e-12, 0, 0},
                                           {1e-12, 2e-6, 2e-7, 1e-12, 1e-12, 0, 0},
                                           {1e-12, 2e-6, 2e-7, 1e-12, 1e-12, 0, 0}};

static char *source(int fast) {
  fm_strbuf sb;
  fm_strbuf_init(&sb, 1u << 20);
  fm_cg_emit_prelude(&sb, fast);
  fm_strbuf_append(&sb,
                   "extern \"C\" __global__ void fm_math_sweep(const float *x, float *out, int n) {\n"
                   "  const int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                   "  if (i >= n) return;\n"
                   "  const float v = x[i];\n"
                   "  out[i] = fm_gelu(v);\n"
                   "  out[n + i] = fm_gelu_tanh(v);\n"
                   "  out[2 * n + i] = fm_tanh(v);\n"
                   "  out[3 * n + i] = fm_sigmoid(v);\n"
                   "  out[4 * n + i] = fm_silu(v);\n"
                   "  out[5 * n + i] = fm_exp(v);\n"
                   "  out[6 * n + i] = fm_div(v, 3.0f);\n"
                   "}\n");
  if (fm_strbuf_error(&sb)) {
    fm_strbuf_free(&sb);
    return NULL;
  }
  return fm_strbuf_take(&sb);
}

/* What torch gives for NaN, +inf and -inf (-1: not checked: GELU and SiLU of -inf are
 * -inf x 0 in torch's own formulas). */
static int special_ok(int f, int s, float got) {
  if (s == 0) return isnan(got);
  if (s == 1) {
    const float want[N_FUNCS] = {INFINITY, INFINITY, 1.0f, 1.0f, INFINITY, INFINITY, INFINITY};
    return got == want[f];
  }
  const float want[N_FUNCS] = {0, 0, -1.0f, 0.0f, 0, 0.0f, -INFINITY};
  if (f == 0 || f == 1 || f == 4) return 1;
  return got == want[f];
}

static int run_prelude(const fm_cuda *cu, const char *arch, int fast, const float *hx, float *hout, fm_CUdeviceptr dx,
                       fm_CUdeviceptr dout, int n) {
  int failed = 0;
  char *src = source(fast), *log = NULL;
  uint8_t *cubin = NULL;
  size_t len = 0;
  fm_CUmodule mod = NULL;
  fm_CUfunction fn;
  if (!src || fm_nvrtc_compile(src, "math.cu", arch, &cubin, &len, &log) != FM_OK) {
    printf("FAIL fast_math=%d: compile: %s\n", fast, log ? log : "out of memory");
    free(src);
    free(log);
    return N_FUNCS;
  }
  void *params[] = {&dx, &dout, &n};
  if (cu->cuModuleLoadData(&mod, cubin) || cu->cuModuleGetFunction(&fn, mod, "fm_math_sweep") ||
      cu->cuLaunchKernel(fn, (unsigned)((n + 255) / 256), 1, 1, 256, 1, 1, 0, NULL, params, NULL) ||
      cu->cuCtxSynchronize() || gu_d2h(cu, hout, dout, (size_t)N_FUNCS * n * sizeof(float))) {
    printf("FAIL fast_math=%d: load or launch\n", fast);
    failed = N_FUNCS;
    goto out;
  }
  for (int f = 0; f < N_FUNCS; f++) {
    double worst = 0, worst_x = 0, worst_got = 0;
    int bad = 0;
    for (int i = 0; i < SWEEP; i++) {
      const double ref = reference(f, hx[i]), got = hout[(size_t)f * n + i];
      const double excess = fabs(got - ref) - (rel_tol[fast][f] * fabs(ref) + abs_tol[fast][f]);
      if (!(excess <= 0) && (bad++ == 0 || excess > worst)) {
        worst = excess;
        worst_x = hx[i];
        worst_got = got;
      }
    }
    for (int s = 0; s < SPECIALS; s++)
      if (!special_ok(f, s, hout[(size_t)f * n + SWEEP + s])) {
        printf("FAIL fast_math=%d %s(%g) = %g\n", fast, func_name[f], hx[SWEEP + s], hout[(size_t)f * n + SWEEP + s]);
        bad++;
      }
    if (bad) {
      printf("FAIL fast_math=%d %s: %d points out of tolerance; worst at x = %.9g: got %.9g, fp64 %.9g\n", fast,
             func_name[f], bad, worst_x, worst_got, reference(f, worst_x));
      failed++;
    } else {
      printf("ok   fast_math=%d %s: %d points within %.0e relative + %.0e\n", fast, func_name[f], SWEEP,
             rel_tol[fast][f], abs_tol[fast][f]);
    }
  }
out:
  if (mod) cu->cuModuleUnload(mod);
  free(cubin);
  free(log);
  free(src);
  return failed;
}

int main(void) {
  const fm_cuda *cu;
  fm_device_id dev;
  fm_diag d = {{0}};
  fm_CUdevice cdev;
  fm_CUcontext ctx;
  if (fm_cuda_load(&cu, &d) || fm_cuda_device_id(0, &dev, &d)) {
    fprintf(stderr, "no GPU: %s\n", d.text);
    return 2;
  }
  if (cu->cuDeviceGet(&cdev, 0) || cu->cuDevicePrimaryCtxRetain(&ctx, cdev) || cu->cuCtxSetCurrent(ctx)) {
    fprintf(stderr, "cannot make the primary context current\n");
    return 2;
  }
  printf("device %s (%s)\n", dev.name, dev.arch);
  const int n = SWEEP + SPECIALS;
  float *hx = malloc((size_t)n * sizeof *hx), *hout = malloc((size_t)N_FUNCS * n * sizeof *hout);
  fm_CUdeviceptr dx = gu_dalloc(cu, (size_t)n * sizeof *hx), dout = gu_dalloc(cu, (size_t)N_FUNCS * n * sizeof *hout);
  if (!hx || !hout || !dx || !dout) {
    fprintf(stderr, "out of memory\n");
    return 2;
  }
  for (int i = 0; i < SWEEP; i++) hx[i] = (float)(-12.0 + 24.0 * i / (SWEEP - 1));
  hx[SWEEP] = NAN;
  hx[SWEEP + 1] = INFINITY;
  hx[SWEEP + 2] = -INFINITY;
  int failed = 0, passed = 0;
  if (gu_h2d(cu, dx, hx, (size_t)n * sizeof *hx)) return 2;
  for (int fast = 2; fast >= 0; fast--) {
    int f = run_prelude(cu, dev.arch, fast, hx, hout, dx, dout, n);
    failed += f;
    passed += N_FUNCS - f;
  }
  printf("%d passed, %d failed\n", passed, failed);
  cu->cuMemFree(dx);
  cu->cuMemFree(dout);
  cu->cuDevicePrimaryCtxRelease(cdev);
  free(hx);
  free(hout);
  return failed ? 1 : 0;
}
