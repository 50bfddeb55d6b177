/* gpu_util.c: see gpu_util.h. */
#include "gpu_util.h"

#include "fm_nvrtc.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

uint64_t gu_next(gu_rng *r) {
  r->s ^= r->s >> 12;
  r->s ^= r->s << 25;
  r->s ^= r->s >> 27;
  return r->s * 0x2545F4914F6CDD1DULL;
}

double gu_uniform(gu_rng *r, double lo, double hi) {
  return lo + (hi - lo) * ((double)(gu_next(r) >> 11) / 9007199254740992.0);
}

uint32_t gu_below(gu_rng *r, uint32_t n) { return (uint32_t)(gu_next(r) % n); }

uint16_t gu_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

float gu_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* _Float16 is IEEE binary16 on x86-64 with GCC >= 12 and clang: conversions round to even. */
uint16_t gu_f32_to_f16(float f) {
  _Float16 h = (_Float16)f;
  uint16_t u;
  memcpy(&u, &h, 2);
  return u;
}

float gu_f16_to_f32(uint16_t u) {
  _Float16 h;
  memcpy(&h, &u, 2);
  return (float)h;
}

double gu_load(const void *buf, fm_dtype dt, size_t i) {
  switch (dt) {
    case FM_DT_BOOL:
      return ((const uint8_t *)buf)[i] ? 1.0 : 0.0;
    case FM_DT_F16:
      return gu_f16_to_f32(((const uint16_t *)buf)[i]);
    case FM_DT_BF16:
      return gu_bf16_to_f32(((const uint16_t *)buf)[i]);
    case FM_DT_F32:
      return ((const float *)buf)[i];
    case FM_DT_I64: /* integer values: exact below 2^53 */
      return (double)((const int64_t *)buf)[i];
    default:
      return NAN;
  }
}

void gu_store(void *buf, fm_dtype dt, size_t i, double v) {
  switch (dt) {
    case FM_DT_BOOL:
      ((uint8_t *)buf)[i] = v != 0.0;
      break;
    case FM_DT_F16:
      ((uint16_t *)buf)[i] = gu_f32_to_f16((float)v);
      break;
    case FM_DT_BF16:
      ((uint16_t *)buf)[i] = gu_f32_to_bf16((float)v);
      break;
    case FM_DT_F32:
      ((float *)buf)[i] = (float)v;
      break;
    case FM_DT_I64:
      ((int64_t *)buf)[i] = (int64_t)v;
      break;
    default:
      break;
  }
}

size_t gu_span(const fm_tensor *t, int64_t outer) {
  size_t last = 0;
  for (uint32_t d = 0; d < t->rank; d++) {
    int64_t n = t->shape[d] == FM_DIM_SYMBOLIC ? outer : t->shape[d];
    if (n > 1) last += (size_t)(n - 1) * (size_t)t->strides[d];
  }
  return last + 1;
}

double gu_rel_err(const void *a, fm_dtype adt, const void *b, fm_dtype bdt, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double x = gu_load(a, adt, i), y = gu_load(b, bdt, i);
    if (!isfinite(x) && isfinite(y)) return INFINITY;
    if (isnan(x) || isnan(y)) return INFINITY;
    if (isinf(x) || isinf(y)) {
      if (x != y) return INFINITY;
      continue;
    }
    num += (x - y) * (x - y);
    den += y * y;
  }
  if (den == 0) return num == 0 ? 0 : INFINITY;
  return sqrt(num / den);
}

static int check(const fm_cuda *cu, fm_CUresult r, const char *what) {
  if (r == 0) return 0;
  const char *s = NULL;
  if (cu->cuGetErrorString) cu->cuGetErrorString(r, &s);
  fprintf(stderr, "CUDA error %d in %s: %s\n", r, what, s ? s : "?");
  return -1;
}

fm_CUdeviceptr gu_dalloc(const fm_cuda *cu, size_t bytes) {
  fm_CUdeviceptr p = 0;
  if (check(cu, cu->cuMemAlloc(&p, bytes ? bytes : 1), "cuMemAlloc")) return 0;
  return p;
}

int gu_h2d(const fm_cuda *cu, fm_CUdeviceptr d, const void *h, size_t bytes) {
  return check(cu, cu->cuMemcpyHtoD(d, h, bytes), "cuMemcpyHtoD");
}

int gu_d2h(const fm_cuda *cu, void *h, fm_CUdeviceptr d, size_t bytes) {
  return check(cu, cu->cuMemcpyDtoH(h, d, bytes), "cuMemcpyDtoH");
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

float gu_median(float *v, size_t n) {
  if (!n) return 0;
  qsort(v, n, sizeof *v, cmp_float);
  return n % 2 ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2]);
}

int gu_build_candidate(const fm_fragment *canon, const fm_candidate *c, uint32_t sm_count, const char *arch,
                       const char *name, uint8_t **cubin, size_t *cubin_len, fm_kernel_meta *meta, char **err) {
  char *src = NULL, *log = NULL;
  fm_diag d = {{0}};
  *err = NULL;
  int rc = fm_codegen_generate(canon, c, sm_count, &src, meta, &d);
  if (rc) {
    *err = strdup(d.text);
    return rc;
  }
  rc = fm_nvrtc_compile(src, name, arch, cubin, cubin_len, &log);
  free(src);
  if (rc)
    *err = log ? log : strdup("nvrtc failed");
  else
    free(log);
  return rc;
}

int gu_count_child_tuners(void) {
  int n = 0;
  DIR *d = opendir("/proc");
  struct dirent *e;
  while (d && (e = readdir(d))) {
    char path[300], comm[64] = "";
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    snprintf(path, sizeof path, "/proc/%s/comm", e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    int ours = fgets(comm, sizeof comm, f) && strncmp(comm, "fusemld-tuner", 13) == 0;
    fclose(f);
    /* Only this test's own workers: a daemon running beside it has a worker of its own. */
    snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
    long ppid = -1;
    if (ours && (f = fopen(path, "r"))) {
      char stat[512] = "";
      const char *close_paren = fgets(stat, sizeof stat, f) ? strrchr(stat, ')') : NULL;
      if (close_paren) sscanf(close_paren + 1, " %*c %ld", &ppid);
      fclose(f);
    }
    if (ours && ppid == (long)getpid()) n++;
  }
  if (d) closedir(d);
  return n;
}

int gu_picked(const char *desc) {
  const char *env = getenv("FM_GPU_CANDS");
  char want[96];
  if (!env || !*env) return 1;
  for (const char *p = env; *p;) {
    size_t len = strcspn(p, ";");
    if (len > 0 && len < sizeof want) {
      memcpy(want, p, len);
      want[len] = 0;
      if (strstr(desc, want)) return 1;
    }
    p += len;
    if (*p == ';') p++;
  }
  return 0;
}
