/* fm_nvrtc.c: CUDA C -> CUBIN with NVRTC.
 *
 * Thread-safe: NVRTC programs are independent objects and we keep no state of our own, so
 * worker threads compile concurrently. The options are fixed and host-independent (no
 * include paths, no -arch=native): they are part of the cache key, and the same source
 * must compile to the same CUBIN on every node. */
#include "fm_nvrtc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nvrtc.h>

/* The targets we build for; whether this NVRTC knows each one is asked at run time. */
static const struct {
  const char *name;
  int sm;
} known_archs[] = {
    {"sm_80", 80},  {"sm_86", 86},   {"sm_89", 89},    {"sm_90", 90},
    {"sm_90a", 90}, {"sm_100", 100}, {"sm_100a", 100}, {"sm_120", 120},
};

#define FM_NVRTC_NOPTS 3

int fm_nvrtc_version(uint32_t *major, uint32_t *minor) {
  int ma = 0, mi = 0;
  if (!major || !minor) return FM_EINVAL;
  if (nvrtcVersion(&ma, &mi) != NVRTC_SUCCESS) return FM_ECOMPILE;
  *major = (uint32_t)ma;
  *minor = (uint32_t)mi;
  return FM_OK;
}

int fm_nvrtc_arch_supported(const char *arch) {
  int sm = -1, n = 0, ok = 0;
  int *archs = NULL;
  if (!arch) return 0;
  for (size_t i = 0; i < sizeof known_archs / sizeof known_archs[0]; i++)
    if (strcmp(arch, known_archs[i].name) == 0) sm = known_archs[i].sm;
  if (sm < 0) return 0;
  if (nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS || n <= 0) return 0;
  archs = malloc((size_t)n * sizeof *archs);
  if (!archs) return 0;
  if (nvrtcGetSupportedArchs(archs) == NVRTC_SUCCESS)
    for (int i = 0; i < n; i++)
      if (archs[i] == sm) ok = 1;
  free(archs);
  return ok;
}

/* The options as separate strings (what NVRTC takes) into storage `arch_opt`. */
static void make_options(const char *arch, char *arch_opt, size_t cap, const char *opts[FM_NVRTC_NOPTS]) {
  snprintf(arch_opt, cap, "--gpu-architecture=%s", arch);
  opts[0] = arch_opt;
  opts[1] = "-default-device"; /* unannotated functions are device code */
  opts[2] = "--std=c++17";
}

const char *fm_nvrtc_options(const char *arch, char *buf, size_t cap) {
  char arch_opt[64];
  const char *opts[FM_NVRTC_NOPTS];
  if (!arch || !buf || cap == 0 || strlen(arch) > 32) return NULL;
  make_options(arch, arch_opt, sizeof arch_opt, opts);
  int n = snprintf(buf, cap, "%s %s %s", opts[0], opts[1], opts[2]);
  if (n < 0 || (size_t)n >= cap) return NULL;
  return buf;
}

/* NVRTC's program log, malloc'd (NULL if there is none or no memory). */
static char *program_log(nvrtcProgram prog) {
  size_t n = 0;
  if (nvrtcGetProgramLogSize(prog, &n) != NVRTC_SUCCESS || n == 0) return NULL;
  char *log = malloc(n + 1);
  if (!log) return NULL;
  if (nvrtcGetProgramLog(prog, log) != NVRTC_SUCCESS) {
    free(log);
    return NULL;
  }
  log[n] = '\0';
  return log;
}

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = malloc(n);
  if (p) memcpy(p, s, n);
  return p;
}

static int map_result(nvrtcResult r) {
  switch (r) {
    case NVRTC_SUCCESS:
      return FM_OK;
    case NVRTC_ERROR_OUT_OF_MEMORY:
      return FM_ENOMEM;
    case NVRTC_ERROR_INVALID_INPUT:
    case NVRTC_ERROR_INVALID_PROGRAM:
    case NVRTC_ERROR_INVALID_OPTION:
      return FM_EINVAL;
    default:
      return FM_ECOMPILE;
  }
}

int fm_nvrtc_compile(const char *src, const char *name, const char *arch, uint8_t **cubin, size_t *cubin_len,
                     char **log) {
  nvrtcProgram prog = NULL;
  char arch_opt[64];
  const char *opts[FM_NVRTC_NOPTS];
  uint8_t *bin = NULL;
  size_t len = 0;
  int rc = FM_OK;
  nvrtcResult r;

  if (log) *log = NULL;
  if (!src || !arch || !cubin || !cubin_len) return FM_EINVAL;
  *cubin = NULL;
  *cubin_len = 0;
  if (!fm_nvrtc_arch_supported(arch)) {
    if (log) *log = dup_str("fusemld: target architecture not supported by this NVRTC");
    return FM_EINVAL;
  }
  make_options(arch, arch_opt, sizeof arch_opt, opts);

  r = nvrtcCreateProgram(&prog, src, name ? name : "fusemld.cu", 0, NULL, NULL);
  if (r != NVRTC_SUCCESS) {
    rc = map_result(r);
    prog = NULL;
    goto out;
  }
  r = nvrtcCompileProgram(prog, FM_NVRTC_NOPTS, opts);
  if (r != NVRTC_SUCCESS) {
    /* A compile error is FM_ECOMPILE whatever NVRTC calls it; the log says why. */
    rc = r == NVRTC_ERROR_OUT_OF_MEMORY ? FM_ENOMEM : FM_ECOMPILE;
    if (log) {
      *log = program_log(prog);
      if (!*log) *log = dup_str(nvrtcGetErrorString(r));
    }
    goto out;
  }
  if ((r = nvrtcGetCUBINSize(prog, &len)) != NVRTC_SUCCESS || len == 0) {
    rc = r != NVRTC_SUCCESS ? map_result(r) : FM_ECOMPILE;
    if (log) *log = dup_str(r != NVRTC_SUCCESS ? nvrtcGetErrorString(r) : "NVRTC produced no CUBIN");
    goto out;
  }
  bin = malloc(len);
  if (!bin) {
    rc = FM_ENOMEM;
    goto out;
  }
  if ((r = nvrtcGetCUBIN(prog, (char *)bin)) != NVRTC_SUCCESS) {
    rc = map_result(r);
    if (log) *log = dup_str(nvrtcGetErrorString(r));
    goto out;
  }
  *cubin = bin;
  *cubin_len = len;
  bin = NULL;
out:
  free(bin);
  if (prog) nvrtcDestroyProgram(&prog);
  return rc;
}
