/* test_codegen_skinny.c: the skinny (small-M, weight-streaming) GEMM template without a GPU:
 * when it is a candidate and the default (static M or the M bucket of a symbolic M up to 32,
 * nn.Linear layouts), its launch metadata (block, grid for any M including 0, no dynamic shared
 * memory), what it refuses and why, and NVRTC compiles of every candidate for sm_80 and
 * sm_90a with several epilogues (bias + GELU, residual, an extra output, f16). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen.h"
#include "fm_nvrtc.h"
#include "fm_test.h"
#include "test_codegen_frag.h"

static fm_fragment raw, canon;

enum { EPI_GELU, EPI_RESIDUAL, EPI_EXTRA };

/* nn.Linear: x [M, K] row-major (M < 0: symbolic, with m_hint) @ W.t() (W [N, K], so B
 * [K, N] with strides [1, K]), then: bias + GELU; or residual add (no bias) + relu; or
 * bias + GELU with the pre-activation as a second output. a_col: A column-major instead. */
static int build(int64_t m, uint64_t m_hint, int64_t n, int64_t k, int epi, fm_dtype dt, int a_col) {
  int64_t xs[2] = {m, k}, xst[2] = {1, m < 0 ? 8 : (m + 7) / 8 * 8}, ws[2] = {k, n}, wst[2] = {1, k};
  int64_t bs[1] = {n}, os[2] = {m, n};
  tf_init(&raw);
  raw.m_hint = m_hint;
  tf_input(&raw, 1, dt, 2, xs, a_col ? xst : NULL, 16);
  tf_input(&raw, 2, dt, 2, ws, wst, 16);
  if (epi == EPI_RESIDUAL) {
    tf_input(&raw, 3, dt, 2, os, NULL, 16);
    tf_op(&raw, FM_OP_MM, 4, 2, 1, 2, 0);
    tf_op(&raw, FM_OP_ADD, 5, 2, 4, 3, 0);
    tf_op(&raw, FM_OP_RELU, 6, 1, 5, 0, 0);
    tf_output(&raw, 6, dt, 2, os, NULL, 16);
  } else {
    tf_input(&raw, 3, dt, 1, bs, NULL, 16);
    tf_op(&raw, FM_OP_ADDMM, 4, 3, 3, 1, 2);
    tf_op(&raw, FM_OP_GELU, 6, 1, 4, 0, 0);
    tf_output(&raw, 6, dt, 2, os, NULL, 16);
    if (epi == EPI_EXTRA) tf_output(&raw, 4, dt, 2, os, NULL, 16);
  }
  return tf_finish(&raw, &canon);
}

/* How many of canon's candidates are skinny ones; *def_tmpl: the default's template. */
static int count_skinny(int *def_tmpl) {
  fm_candidate c[64];
  size_t n = fm_codegen_candidates(&canon, c, 64);
  int s = 0;
  *def_tmpl = n ? (int)c[0].tmpl : -1;
  for (size_t i = 0; i < n; i++) {
    if (c[i].tmpl == FM_TMPL_SKINNY) s++;
    for (size_t j = 0; j < i; j++) CHECK(memcmp(&c[i], &c[j], sizeof c[i]) != 0);
  }
  return s;
}

static void test_candidates(void) {
  static const int64_t decode[] = {1, 3, 8, 16};
  int def;
  for (size_t i = 0; i < sizeof decode / sizeof decode[0]; i++) {
    CHECK_EQ_INT(build(decode[i], 0, 4096, 4096, EPI_GELU, FM_DT_BF16, 0), FM_OK);
    CHECK_EQ_INT(fm_codegen_skinny_rows(&canon), decode[i]);
    CHECK(count_skinny(&def) >= 5);
    CHECK_EQ_INT(def, FM_TMPL_SKINNY);
  }
  /* the gemm template's small tiles are still timed beside it */
  fm_candidate c[64];
  size_t n = fm_codegen_candidates(&canon, c, 64);
  int gemm = 0;
  for (size_t i = 0; i < n; i++) gemm += c[i].tmpl == FM_TMPL_GEMM;
  CHECK(gemm >= 2);
  /* 17..32 rows: two row tiles (W read twice), still ahead of the gemm template */
  CHECK_EQ_INT(build(32, 0, 4096, 4096, EPI_GELU, FM_DT_BF16, 0), FM_OK);
  CHECK(count_skinny(&def) >= 5);
  CHECK_EQ_INT(def, FM_TMPL_SKINNY);
  /* prefill sizes: never */
  CHECK_EQ_INT(build(4096, 0, 4096, 4096, EPI_GELU, FM_DT_BF16, 0), FM_OK);
  CHECK_EQ_INT(count_skinny(&def), 0);
  CHECK_EQ_INT(def, FM_TMPL_GEMM);
  CHECK_EQ_INT(build(33, 0, 4096, 4096, EPI_GELU, FM_DT_BF16, 0), FM_OK);
  CHECK_EQ_INT(count_skinny(&def), 0);
  /* symbolic M: the M bucket decides; no bucket means a large batch */
  CHECK_EQ_INT(build(-1, 8, 4096, 4096, EPI_GELU, FM_DT_BF16, 0), FM_OK);
  CHECK_EQ_INT(fm_codegen_skinny_rows(&canon), 8);
  CHECK(count_skinny(&def) >= 5);
  CHECK_EQ_INT(def, FM_TMPL_SKINNY);
  CHECK_EQ_INT(build(-1, 3, 4096, 4096, EPI_GELU, FM_DT_BF16, 0), FM_OK); /* bucket 4 */
  CHECK_EQ_INT(fm_codegen_skinny_rows(&canon), 4);
  CHECK_EQ_INT(build(-1, 20, 4096, 4096, EPI_GELU, FM_DT_BF16, 0), FM_OK); /* bucket 32 */
  CHECK(count_skinny(&def) >= 5);
  CHECK_EQ_INT(def, FM_TMPL_SKINNY);
  CHECK_EQ_INT(build(-1, 33, 4096, 4096, EPI_GELU, FM_DT_BF16, 0), FM_OK); /* bucket 64 */
  CHECK_EQ_INT(count_skinny(&def), 0);
  CHECK_EQ_INT(def, FM_TMPL_GEMM);
  CHECK_EQ_INT(build(-1, 4096, 4096, 4096, EPI_GELU, FM_DT_BF16, 0), FM_OK);
  CHECK_EQ_INT(count_skinny(&def), 0);
  CHECK_EQ_INT(build(-1, 0, 4096, 4096, EPI_GELU, FM_DT_BF16, 0), FM_OK);
  CHECK_EQ_INT(fm_codegen_skinny_rows(&canon), 0);
  CHECK_EQ_INT(count_skinny(&def), 0);
  /* x column-major: the 16-byte loads run along K, so not this template */
  CHECK_EQ_INT(build(8, 0, 4096, 4096, EPI_GELU, FM_DT_BF16, 1), FM_OK);
  CHECK_EQ_INT(count_skinny(&def), 0);
  CHECK_EQ_INT(def, FM_TMPL_GEMM);
  char desc[96];
  CHECK_EQ_INT(build(8, 0, 4096, 4096, EPI_GELU, FM_DT_BF16, 0), FM_OK);
  CHECK_EQ_INT(fm_codegen_default(&canon, &c[0], NULL), FM_OK);
  fm_candidate_describe(&c[0], desc, sizeof desc);
  CHECK_STR_CONTAINS(desc, "skinny cols=8 warps=8 unroll=4 pipe=0");
  CHECK(strcmp(fm_template_name(FM_TMPL_SKINNY), "skinny") == 0);
}

static void test_meta(void) {
  fm_candidate c;
  fm_kernel_meta meta;
  char *src = NULL;
  fm_diag d = {{0}};
  /* 8 x 11008 x 4096 (an MLP up projection): 8 columns a block, 1376 blocks of 8 warps */
  CHECK_EQ_INT(build(8, 0, 11008, 4096, EPI_GELU, FM_DT_BF16, 0), FM_OK);
  CHECK_EQ_INT(fm_codegen_default(&canon, &c, &d), FM_OK);
  CHECK_EQ_INT(c.tmpl, FM_TMPL_SKINNY);
  CHECK_EQ_INT(c.p[0], 8);
  CHECK_EQ_INT(fm_codegen_generate(&canon, &c, 132, &src, &meta, &d), FM_OK);
  CHECK(src && strstr(src, "#include") == NULL);
  CHECK_STR_CONTAINS(src, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32");
  CHECK_STR_CONTAINS(src, "ld.global.nc.L1::no_allocate");
  CHECK_STR_CONTAINS(src, "fm_epilogue(");
  CHECK_STR_CONTAINS(src, "#define FM_PIPE 0\n");
  CHECK_STR_CONTAINS(src, "#define FM_X1 0\n"); /* M = 8: rows 8..15 never loaded */
  free(src);
  CHECK_STR_CONTAINS(meta.kind, "gemm");
  CHECK_STR_CONTAINS(meta.grid_rule, "tiles");
  CHECK_STR_CONTAINS(meta.entry, "fm_skinny_c8_w8_u4_p0");
  CHECK_EQ_INT(meta.block[0], 256);
  CHECK_EQ_INT(meta.block[1], 1);
  CHECK_EQ_INT(meta.smem, 0);
  CHECK_EQ_INT(meta.outer, 8);
  CHECK_EQ_INT(meta.items_per_block, 16);
  CHECK_EQ_INT(meta.max_blocks, 1376);
  CHECK_EQ_INT((int)fm_meta_grid_x(&meta, 0), 1376);
  CHECK_EQ_INT((int)fm_meta_grid_y(&meta, 0), 1);
  /* a cp.async ring: 4 warps x 4 stages x 2 chunks x 1 KiB of dynamic shared memory */
  fm_skinny_config ring = {8, 4, 2, 4, 0};
  CHECK_EQ_INT(fm_codegen_skinny(&canon, &ring, 132, &src, &meta, &d), FM_OK);
  CHECK_STR_CONTAINS(src, "cp.async.cg.shared.global");
  CHECK_STR_CONTAINS(src, "#define FM_PIPE 4\n");
  free(src);
  CHECK_EQ_INT(meta.smem, 4 * 4 * 2 * 1024);
  CHECK_EQ_INT(meta.block[0], 128);
  /* 48 KiB of ring and no static shared memory beside it (the sums reuse the ring), so no
     launch needs more than the metadata says */
  fm_skinny_config ring48 = {8, 4, 4, 3, 0};
  CHECK_EQ_INT(fm_codegen_skinny(&canon, &ring48, 132, &src, &meta, &d), FM_OK);
  CHECK_STR_CONTAINS(src, "float *red = (float *)fm_ring;");
  free(src);
  CHECK_EQ_INT(meta.smem, 48 * 1024);
  /* 4096 columns: 512 blocks; N = 100 (odd tile count): 13 */
  CHECK_EQ_INT(build(1, 0, 4096, 11008, EPI_RESIDUAL, FM_DT_BF16, 0), FM_OK);
  CHECK_EQ_INT(fm_codegen_default(&canon, &c, &d), FM_OK);
  CHECK_EQ_INT(c.p[0], 8);
  CHECK_EQ_INT(fm_codegen_generate(&canon, &c, 132, &src, &meta, &d), FM_OK);
  free(src);
  CHECK_EQ_INT(meta.max_blocks, 512);
  CHECK_EQ_INT(build(3, 0, 101, 72, EPI_GELU, FM_DT_F16, 0), FM_OK);
  CHECK_EQ_INT(fm_codegen_default(&canon, &c, &d), FM_OK);
  CHECK_EQ_INT(fm_codegen_generate(&canon, &c, 132, &src, &meta, &d), FM_OK);
  CHECK_STR_CONTAINS(src, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32");
  free(src);
  CHECK_EQ_INT(meta.max_blocks, 13);
  /* symbolic M: a block per 16 rows of the launch's M, none for M = 0 */
  CHECK_EQ_INT(build(-1, 16, 4096, 4096, EPI_EXTRA, FM_DT_BF16, 0), FM_OK);
  CHECK_EQ_INT(fm_codegen_default(&canon, &c, &d), FM_OK);
  CHECK_EQ_INT(c.tmpl, FM_TMPL_SKINNY);
  CHECK_EQ_INT(fm_codegen_generate(&canon, &c, 132, &src, &meta, &d), FM_OK);
  CHECK_STR_CONTAINS(src, "const long long M = outer;");
  CHECK_STR_CONTAINS(src, "#define FM_X1 1\n");
  free(src);
  CHECK_EQ_INT(meta.outer, -1);
  CHECK_EQ_INT((int)fm_meta_grid_y(&meta, 1), 1);
  CHECK_EQ_INT((int)fm_meta_grid_y(&meta, 16), 1);
  CHECK_EQ_INT((int)fm_meta_grid_y(&meta, 17), 2);
  CHECK_EQ_INT((int)fm_meta_grid_y(&meta, 1000), 63);
  CHECK_EQ_INT((int)fm_meta_grid_y(&meta, 0), 0);
  CHECK_EQ_INT((int)fm_meta_grid_x(&meta, 0), 0);
}

static void test_refusals(void) {
  fm_candidate c;
  fm_kernel_meta meta;
  char *src = NULL;
  fm_diag d = {{0}};
  /* K not a multiple of 8: the gemm plan's reason, from either template; the default is then
     the cuBLASLt plan (split: GELU is no cuBLASLt epilogue) */
  CHECK_EQ_INT(build(4, 0, 64, 100, EPI_GELU, FM_DT_BF16, 0), FM_OK);
  CHECK_EQ_INT(fm_codegen_default(&canon, &c, &d), FM_OK);
  CHECK_EQ_INT(c.tmpl, FM_TMPL_CUBLASLT);
  CHECK_EQ_INT((int)c.p[0], FM_BLAS_SPLIT);
  fm_skinny_config sc = {8, 4, 4, 1, 0};
  CHECK_EQ_INT(fm_codegen_skinny(&canon, &sc, 132, &src, &meta, &d), FM_EUNSUPPORTED);
  CHECK_STR_CONTAINS(d.text, "K not a multiple of 8");
  CHECK(src == NULL);
  CHECK_EQ_INT((int)fm_codegen_skinny_candidates(&canon, &sc, 1), 0);
  /* x column-major */
  CHECK_EQ_INT(build(8, 0, 64, 64, EPI_GELU, FM_DT_BF16, 1), FM_OK);
  CHECK_EQ_INT(fm_codegen_skinny(&canon, &sc, 132, &src, &meta, &d), FM_EUNSUPPORTED);
  CHECK_STR_CONTAINS(d.text, "K-major");
  /* configurations outside the space */
  CHECK_EQ_INT(build(8, 0, 64, 64, EPI_GELU, FM_DT_BF16, 0), FM_OK);
  static const fm_skinny_config bad[] = {{12, 4, 4, 0, 0}, {40, 4, 1, 0, 0}, {8, 0, 4, 0, 0}, {8, 17, 4, 0, 0},
                                         {8, 4, 0, 0, 0},  {32, 4, 4, 0, 0}, {8, 4, 4, 5, 0}, {16, 4, 4, 1, 0},
                                         {8, 16, 4, 4, 0}, {8, 8, 4, 0, 3},  {8, 8, 4, 0, 8}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    CHECK_EQ_INT(fm_codegen_skinny(&canon, &bad[i], 132, &src, &meta, &d), FM_EINVAL);
    CHECK(src == NULL);
  }
  CHECK_EQ_INT(fm_codegen_skinny(&canon, &sc, 132, &src, &meta, &d), FM_OK);
  free(src);
}

/* The split form (sm_90 clusters): 2 or 4 blocks per column block share K's chunks and add
 * their partial sums through distributed shared memory; the grid counts every block of each
 * cluster, the candidate runs on sm_90 only, and it compiles for sm_90a. */
static void test_split(void) {
  fm_kernel_meta meta;
  char *src = NULL;
  fm_diag d = {{0}};
  CHECK_EQ_INT(build(8, 0, 4096, 11008, EPI_RESIDUAL, FM_DT_BF16, 0), FM_OK); /* a down projection */
  fm_skinny_config sc = {8, 8, 4, 0, 2};
  CHECK_EQ_INT(fm_codegen_skinny(&canon, &sc, 132, &src, &meta, &d), FM_OK);
  if (src) {
    CHECK_STR_CONTAINS(src, "__cluster_dims__(2, 1, 1)");
    CHECK_STR_CONTAINS(src, "#define FM_SPLIT 2\n");
    CHECK_STR_CONTAINS(src, "ld.shared::cluster.v4.f32");
    CHECK_STR_CONTAINS(src, "barrier.cluster.arrive.release");
    CHECK_STR_CONTAINS(meta.entry, "fm_skinny_c8_w8_u4_p0_k2");
    CHECK_EQ_INT(meta.max_blocks, 1024); /* 512 column blocks x 2 */
    CHECK_EQ_INT((int)fm_meta_grid_x(&meta, 0), 1024);
    CHECK_EQ_INT((int)fm_meta_grid_y(&meta, 0), 1);
    if (fm_nvrtc_arch_supported("sm_90a")) {
      uint8_t *cubin = NULL;
      size_t len = 0;
      char *log = NULL;
      int rc = fm_nvrtc_compile(src, "split.cu", "sm_90a", &cubin, &len, &log);
      CHECK_EQ_INT(rc, FM_OK);
      if (rc && log) fprintf(stderr, "%s\n", log);
      free(cubin);
      free(log);
    }
  }
  free(src);
  src = NULL;
  sc.split = 4;
  CHECK_EQ_INT(fm_codegen_skinny(&canon, &sc, 132, &src, &meta, &d), FM_OK);
  CHECK_EQ_INT(meta.max_blocks, 2048);
  if (src) CHECK_STR_CONTAINS(src, "__cluster_dims__(4, 1, 1)");
  free(src);
  src = NULL;
  sc.split = 1; /* one block along K: no cluster, the sums of the block's own warps */
  CHECK_EQ_INT(fm_codegen_skinny(&canon, &sc, 132, &src, &meta, &d), FM_OK);
  if (src) {
    CHECK(strstr(src, "__cluster_dims__") == NULL);
    CHECK_STR_CONTAINS(src, "#define FM_SPLIT 1\n");
  }
  CHECK_EQ_INT(meta.max_blocks, 512);
  free(src);
  fm_candidate c;
  char desc[96];
  memset(&c, 0, sizeof c);
  c.tmpl = FM_TMPL_SKINNY;
  c.p[0] = 8, c.p[1] = 8, c.p[2] = 4, c.p[3] = 0, c.p[4] = 2;
  fm_candidate_describe(&c, desc, sizeof desc);
  CHECK_STR_CONTAINS(desc, "skinny cols=8 warps=8 unroll=4 pipe=0 split=2");
  CHECK(fm_candidate_runs_on(&c, "sm_90a") && !fm_candidate_runs_on(&c, "sm_80"));
  c.p[4] = 0;
  CHECK(fm_candidate_runs_on(&c, "sm_80"));
}

/* Every candidate compiles for both target generations, for each epilogue and dtype. */
static void test_nvrtc(void) {
  static const char *const archs[] = {"sm_80", "sm_90a"};
  int compiled = 0;
  for (int w = 0; w < 4; w++) {
    fm_skinny_config sc[16];
    if (w == 0) CHECK_EQ_INT(build(8, 0, 100, 72, EPI_GELU, FM_DT_BF16, 0), FM_OK);
    if (w == 1) CHECK_EQ_INT(build(-1, 16, 4096, 4096, EPI_RESIDUAL, FM_DT_F16, 0), FM_OK);
    if (w == 2) CHECK_EQ_INT(build(1, 0, 11008, 4096, EPI_EXTRA, FM_DT_BF16, 0), FM_OK);
    if (w == 3) CHECK_EQ_INT(build(-1, 32, 24, 8, EPI_GELU, FM_DT_BF16, 0), FM_OK);
    size_t n = fm_codegen_skinny_candidates(&canon, sc, 16);
    CHECK(n >= 5);
    for (size_t i = 0; i < n; i++) {
      char *src = NULL;
      fm_kernel_meta m;
      fm_diag d = {{0}};
      int rc = fm_codegen_skinny(&canon, &sc[i], 132, &src, &m, &d);
      CHECK_EQ_INT(rc, FM_OK);
      if (rc) {
        fprintf(stderr, "  fragment %d candidate %zu: %s\n", w, i, d.text);
        continue;
      }
      for (size_t a = 0; a < 2; a++) {
        if (!fm_nvrtc_arch_supported(archs[a]) || (sc[i].split > 1 && a == 0)) continue; /* clusters: sm_90 */
        uint8_t *cubin = NULL;
        size_t len = 0;
        char *log = NULL;
        rc = fm_nvrtc_compile(src, "skinny.cu", archs[a], &cubin, &len, &log);
        CHECK_EQ_INT(rc, FM_OK);
        if (rc)
          fprintf(stderr, "  fragment %d candidate %zu %s:\n%s\n", w, i, archs[a], log ? log : "");
        else
          compiled++;
        free(cubin);
        free(log);
      }
      free(src);
    }
  }
  printf("  %d compiles\n", compiled);
  CHECK(compiled > 0);
}

int main(void) {
  RUN(test_candidates);
  RUN(test_meta);
  RUN(test_refusals);
  RUN(test_split);
  RUN(test_nvrtc);
  return FM_TEST_DONE();
}
