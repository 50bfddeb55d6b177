/* fm_blas.c: a cuBLASLt plan, loaded and run (fm_blas.h). */
#define _GNU_SOURCE
#include "fm_blas.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* cuBLASLt's header has a K&R-style declaration that our warning flags reject. Only its types
 * and constants are used: every function comes from dlsym. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <cublasLt.h>
#pragma GCC diagnostic pop

#define MAX_SEARCH 16

_Static_assert(sizeof(cublasLtMatmulAlgo_t) == FM_META_ALGO_BYTES, "the stored algo is the whole struct");

/* The entry points, resolved once per process. */
static struct {
  int tried;
  int ok;
  char why[256];
  cublasStatus_t (*create)(cublasLtHandle_t *);
  cublasStatus_t (*destroy)(cublasLtHandle_t);
  cublasStatus_t (*desc_create)(cublasLtMatmulDesc_t *, cublasComputeType_t, cudaDataType_t);
  cublasStatus_t (*desc_destroy)(cublasLtMatmulDesc_t);
  cublasStatus_t (*desc_set)(cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t, const void *, size_t);
  cublasStatus_t (*layout_create)(cublasLtMatrixLayout_t *, cudaDataType, uint64_t, uint64_t, int64_t);
  cublasStatus_t (*layout_destroy)(cublasLtMatrixLayout_t);
  cublasStatus_t (*layout_set)(cublasLtMatrixLayout_t, cublasLtMatrixLayoutAttribute_t, const void *, size_t);
  cublasStatus_t (*pref_create)(cublasLtMatmulPreference_t *);
  cublasStatus_t (*pref_destroy)(cublasLtMatmulPreference_t);
  cublasStatus_t (*pref_set)(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t, const void *, size_t);
  cublasStatus_t (*heuristic)(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int,
                              cublasLtMatmulHeuristicResult_t *, int *);
  cublasStatus_t (*check)(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                          cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t *,
                          cublasLtMatmulHeuristicResult_t *);
  cublasStatus_t (*matmul)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void *, const void *, cublasLtMatrixLayout_t,
                           const void *, cublasLtMatrixLayout_t, const void *, const void *, cublasLtMatrixLayout_t,
                           void *, cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t *, void *, size_t, cudaStream_t);
} lt;
static pthread_once_t lt_once = PTHREAD_ONCE_INIT;

static void lt_load(void) {
  static const char *const names[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};
  void *h = NULL;
  /* The copy already in the process first (PyTorch's, or the daemon's worker's), then any. */
  for (size_t i = 0; !h && i < sizeof names / sizeof names[0]; i++) h = dlopen(names[i], RTLD_NOW | RTLD_NOLOAD);
  for (size_t i = 0; !h && i < sizeof names / sizeof names[0]; i++) h = dlopen(names[i], RTLD_NOW);
  if (!h) {
    snprintf(lt.why, sizeof lt.why, "cannot load cuBLASLt (libcublasLt.so.13/.12)");
    return;
  }
#define SYM(field, name)                                         \
  if (!(*(void **)&lt.field = dlsym(h, name))) {                 \
    snprintf(lt.why, sizeof lt.why, "cuBLASLt has no %s", name); \
    return;                                                      \
  }
  SYM(create, "cublasLtCreate")
  SYM(destroy, "cublasLtDestroy")
  SYM(desc_create, "cublasLtMatmulDescCreate")
  SYM(desc_destroy, "cublasLtMatmulDescDestroy")
  SYM(desc_set, "cublasLtMatmulDescSetAttribute")
  SYM(layout_create, "cublasLtMatrixLayoutCreate")
  SYM(layout_destroy, "cublasLtMatrixLayoutDestroy")
  SYM(layout_set, "cublasLtMatrixLayoutSetAttribute")
  SYM(pref_create, "cublasLtMatmulPreferenceCreate")
  SYM(pref_destroy, "cublasLtMatmulPreferenceDestroy")
  SYM(pref_set, "cublasLtMatmulPreferenceSetAttribute")
  SYM(heuristic, "cublasLtMatmulAlgoGetHeuristic")
  SYM(check, "cublasLtMatmulAlgoCheck")
  SYM(matmul, "cublasLtMatmul")
#undef SYM
  lt.ok = 1;
}

struct fm_blas {
  fm_meta_blas plan;
  pthread_mutex_t lock;
  cublasLtHandle_t handle;
  cublasLtMatmulDesc_t desc;
  cublasLtMatmulPreference_t pref;
  cudaDataType_t dt;
  /* the layouts of the last M (and batch) launched, and the algorithm that runs there */
  int64_t m;     /* -1: none built yet */
  int64_t batch; /* products (1 unless the plan is batched) */
  cublasLtMatrixLayout_t la, lb, lc, ld;
  cublasLtMatmulAlgo_t algo;
  size_t algo_workspace;
  const void *bias_set; /* the bias pointer the descriptor holds (NULL: stand-in) */
  /* the search's results (tuner only) */
  cublasLtMatmulHeuristicResult_t found[MAX_SEARCH];
  int n_found;
};

static int lt_fail(cublasStatus_t s, const char *what, fm_diag *d) {
  return fm_diag_set(d, FM_ECUDA, "cuBLASLt %s failed (status %d)", what, (int)s);
}

static void drop_layouts(fm_blas *b) {
  cublasLtMatrixLayout_t *ls[4] = {&b->la, &b->lb, &b->lc, &b->ld};
  for (int i = 0; i < 4; i++) {
    if (*ls[i]) lt.layout_destroy(*ls[i]);
    *ls[i] = NULL;
  }
  b->m = -1;
}

/* One layout of a batched plan: count products, stride elements apart. */
static cublasStatus_t set_batch(cublasLtMatrixLayout_t l, int64_t count, uint64_t stride) {
  int32_t c = (int32_t)count;
  int64_t s = (int64_t)stride;
  cublasStatus_t r = lt.layout_set(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &c, sizeof c);
  return r ? r : lt.layout_set(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &s, sizeof s);
}

/* Column-major views (module comment): cuBLASLt's A is the fragment's B ([K, N] row-major
 * view), its B the fragment's A ([M, K]), C and D are [N, M] column-major; a batched plan's
 * layouts hold `batch` products each (D dense: M x N apart). */
static int build_layouts(fm_blas *b, int64_t m, int64_t batch, fm_diag *d) {
  const fm_meta_blas *p = &b->plan;
  uint64_t n = p->n, k = p->k, mm = (uint64_t)m;
  cublasStatus_t s;
  drop_layouts(b);
  if ((s = lt.layout_create(&b->la, b->dt, p->b_kmajor ? k : n, p->b_kmajor ? n : k, (int64_t)p->ldb)) ||
      (s = lt.layout_create(&b->lb, b->dt, p->a_kmajor ? k : mm, p->a_kmajor ? mm : k, (int64_t)p->lda)) ||
      (s = lt.layout_create(&b->lc, b->dt, n, mm, (int64_t)(p->c >= 0 ? p->ldc : p->ldd))) ||
      (s = lt.layout_create(&b->ld, b->dt, n, mm, (int64_t)p->ldd)) ||
      (p->batched && ((s = set_batch(b->la, batch, p->stride_b)) || (s = set_batch(b->lb, batch, p->stride_a)) ||
                      (s = set_batch(b->lc, batch, n * mm)) || (s = set_batch(b->ld, batch, n * mm))))) {
    drop_layouts(b);
    return lt_fail(s, "matrix layout", d);
  }
  b->m = m;
  b->batch = batch;
  return FM_OK;
}

/* The heuristic's first max choices for the current layouts into out; how many (>= 1) in *n. */
static int heuristic(fm_blas *b, int max, cublasLtMatmulHeuristicResult_t *out, int *n, fm_diag *d) {
  *n = 0;
  cublasStatus_t s = lt.heuristic(b->handle, b->desc, b->la, b->lb, b->lc, b->ld, b->pref, max, out, n);
  if (s) return lt_fail(s, "heuristic", d);
  if (*n < 1) return fm_diag_set(d, FM_EUNSUPPORTED, "cuBLASLt has no algorithm for this product");
  return FM_OK;
}

/* Layouts and algorithm for M = m (and `batch` products): the stored algorithm where cuBLASLt
 * accepts it there within the workspace, else the heuristic's first choice. Called with the
 * lock held. */
static int prepare_m(fm_blas *b, int64_t m, int64_t batch, fm_diag *d) {
  cublasLtMatmulHeuristicResult_t r;
  int err;
  if (b->m == m && b->batch == batch) return FM_OK;
  if ((err = build_layouts(b, m, batch, d))) return err;
  if (b->plan.has_algo) {
    memcpy(&b->algo, b->plan.algo, sizeof b->algo);
    memset(&r, 0, sizeof r);
    if (lt.check(b->handle, b->desc, b->la, b->lb, b->lc, b->ld, &b->algo, &r) == CUBLAS_STATUS_SUCCESS &&
        r.workspaceSize <= b->plan.workspace) {
      b->algo_workspace = r.workspaceSize;
      return FM_OK;
    }
  }
  /* (a result of its own: the tuner's search list must survive an M the choice does not fit) */
  cublasLtMatmulHeuristicResult_t first;
  int n;
  if ((err = heuristic(b, 1, &first, &n, d))) {
    drop_layouts(b);
    return err;
  }
  b->algo = first.algo;
  b->algo_workspace = first.workspaceSize;
  return FM_OK;
}

static cublasLtEpilogue_t epilogue_of(const fm_meta_blas *p) {
  int bias = p->bias >= 0;
  if (strcmp(p->act, "relu") == 0) return bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
  if (strcmp(p->act, "gelu_tanh") == 0) return bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
  return bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}

int fm_blas_open(const fm_kernel_meta *meta, fm_blas **out, fm_diag *d) {
  const fm_meta_blas *p = &meta->blas;
  fm_blas *b;
  cublasStatus_t s;
  int err = FM_OK;
  *out = NULL;
  pthread_once(&lt_once, lt_load);
  if (!lt.ok) return fm_diag_set(d, FM_ENOGPU, "%s", lt.why);
  b = calloc(1, sizeof *b);
  if (!b) return fm_diag_set(d, FM_ENOMEM, "out of memory");
  pthread_mutex_init(&b->lock, NULL);
  b->plan = *p;
  b->m = -1;
  b->dt = strcmp(p->dtype, "bf16") == 0 ? CUDA_R_16BF : CUDA_R_16F;
  if ((s = lt.create(&b->handle))) {
    err = lt_fail(s, "handle creation", d);
    goto fail;
  }
  cublasOperation_t ta = p->b_kmajor ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p->a_kmajor ? CUBLAS_OP_N : CUBLAS_OP_T;
  cublasLtEpilogue_t epi = epilogue_of(p);
  /* Until a launch sets the real one, the bias pointer is a stand-in with the alignment the
     fragment promises (16 bytes): the heuristic reads its alignment from it. */
  const void *bias_stand_in = (const void *)(uintptr_t)16;
  uint64_t ws = p->workspace;
  uint32_t align_a = p->align[1], align_b = p->align[0], align_c = p->align[2], align_d = p->align[3];
  if ((s = lt.desc_create(&b->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)) ||
      (s = lt.desc_set(b->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta)) ||
      (s = lt.desc_set(b->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb)) ||
      (s = lt.desc_set(b->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi)) ||
      (p->bias >= 0 &&
       (s = lt.desc_set(b->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_stand_in, sizeof bias_stand_in))) ||
      (s = lt.pref_create(&b->pref)) ||
      (s = lt.pref_set(b->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws)) ||
      (s = lt.pref_set(b->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof align_a)) ||
      (s = lt.pref_set(b->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof align_b)) ||
      (s = lt.pref_set(b->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof align_c)) ||
      (s = lt.pref_set(b->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof align_d))) {
    err = lt_fail(s, "descriptor setup", d);
    goto fail;
  }
  *out = b;
  return FM_OK;
fail:
  fm_blas_close(b);
  return err;
}

void fm_blas_close(fm_blas *b) {
  if (!b) return;
  drop_layouts(b);
  if (b->pref) lt.pref_destroy(b->pref);
  if (b->desc) lt.desc_destroy(b->desc);
  if (b->handle) lt.destroy(b->handle);
  pthread_mutex_destroy(&b->lock);
  free(b);
}

int fm_blas_run(fm_blas *b, void *const *inputs, void *d_out, void *workspace, int64_t outer, void *stream,
                fm_diag *d) {
  const fm_meta_blas *p = &b->plan;
  const float alpha = 1.0f, beta = p->c >= 0 ? 1.0f : 0.0f;
  /* a batched plan: outer products of the static M */
  int64_t m = p->m >= 0 ? p->m : outer, batch = p->batched ? outer : 1;
  cublasStatus_t s;
  int err;
  if (m <= 0 || batch <= 0) return FM_OK; /* an empty product */
  if (batch > INT32_MAX) return fm_diag_set(d, FM_ELIMIT, "cuBLASLt: %lld products", (long long)batch);
  pthread_mutex_lock(&b->lock);
  if ((err = prepare_m(b, m, batch, d))) goto out;
  if (p->bias >= 0 && inputs[p->bias] != b->bias_set) { /* a weight: set once, usually */
    const void *bias = inputs[p->bias];
    if ((s = lt.desc_set(b->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias))) {
      err = lt_fail(s, "bias pointer", d);
      goto out;
    }
    b->bias_set = bias;
  }
  const void *c = p->c >= 0 ? inputs[p->c] : d_out;
  s = lt.matmul(b->handle, b->desc, &alpha, inputs[p->b], b->la, inputs[p->a], b->lb, &beta, c, b->lc, d_out, b->ld,
                &b->algo, b->algo_workspace ? workspace : NULL, b->algo_workspace, (cudaStream_t)stream);
  if (!s && p->has_b2) { /* siblings: A@B2 right after A@B (the same shapes and layouts) */
    void *d_out2 = (char *)d_out + (size_t)m * p->n * 2;
    s = lt.matmul(b->handle, b->desc, &alpha, inputs[p->b2], b->la, inputs[p->a], b->lb, &beta, d_out2, b->lc, d_out2,
                  b->ld, &b->algo, b->algo_workspace ? workspace : NULL, b->algo_workspace, (cudaStream_t)stream);
  }
  if (s) err = lt_fail(s, "matmul", d);
out:
  pthread_mutex_unlock(&b->lock);
  return err;
}

int fm_blas_search(fm_blas *b, int64_t outer, int max, fm_diag *d) {
  int64_t m = b->plan.m >= 0 ? b->plan.m : outer, batch = b->plan.batched ? outer : 1;
  int err;
  if (m <= 0 || batch <= 0 || batch > INT32_MAX)
    return fm_diag_set(d, FM_EINVAL, "cuBLASLt search at M = %lld, %lld products", (long long)m, (long long)batch);
  if (max > MAX_SEARCH) max = MAX_SEARCH;
  pthread_mutex_lock(&b->lock);
  err = build_layouts(b, m, batch, d);
  if (!err) err = heuristic(b, max < 1 ? 1 : max, b->found, &b->n_found, d);
  if (!err) {
    b->algo = b->found[0].algo;
    b->algo_workspace = b->found[0].workspaceSize;
  } else {
    drop_layouts(b);
  }
  pthread_mutex_unlock(&b->lock);
  return err ? err : b->n_found;
}

int fm_blas_choose(fm_blas *b, int i, fm_diag *d) {
  if (i < 0 || i >= b->n_found) return fm_diag_set(d, FM_EINVAL, "cuBLASLt choice %d of %d", i, b->n_found);
  pthread_mutex_lock(&b->lock);
  memcpy(b->plan.algo, &b->found[i].algo, FM_META_ALGO_BYTES);
  b->plan.has_algo = 1;
  b->m = -1; /* the next launch re-checks it at its own M */
  pthread_mutex_unlock(&b->lock);
  return FM_OK;
}

int fm_blas_algo(fm_blas *b, uint8_t out[FM_META_ALGO_BYTES]) {
  pthread_mutex_lock(&b->lock);
  int has = (int)b->plan.has_algo;
  if (has) memcpy(out, b->plan.algo, FM_META_ALGO_BYTES);
  pthread_mutex_unlock(&b->lock);
  return has ? FM_OK : FM_ENOT_FOUND;
}
