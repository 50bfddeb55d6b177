/* test_codegen_golden_sm90.c: the GEMM-family kernels served on H100/H200 (sm_90a), pinned
 * byte for byte, so that a rewrite of the generators that must not change what they write
 * can prove it did not.
 *
 * Two kinds of golden, both under tests/unit/golden/:
 *   sm90_<name>.cu       the whole source of one kernel per mainloop form that is served on
 *                        sm_90a: the TMA mainloop (alone and in a cluster pair), persistent,
 *                        ping-pong, the cp.async wgmma form, sibling products through TMA,
 *                        b2b (TMA, TMA pair), skinny (plain and split in a cluster) and cols in
 *                        a cluster; readable, so a deliberate change shows as a diff;
 *   sm90_candidates.txt  every candidate of seven representative fragments, in order: its
 *                        description, its wire parameters, where it runs, its launch metadata
 *                        and a 64-bit FNV-1a hash and length of its source (or the reason it
 *                        is refused): the rest of the tuning space, and the encoding of
 *                        candidates, pinned without a file per kernel.
 * A deliberate change to generated code (which must also bump FM_CODEGEN_VERSION) is accepted
 * by regenerating with FM_UPDATE_GOLDEN=1 and reviewing the diff; the hashes change too. The
 * version itself (in entry names and headers: "_v29", "codegen v29") is written "v<VERSION>"
 * in these goldens, so a bump alone changes none of them. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen.h"
#include "fm_codegen_gemm.h" /* fm_cg_gemm_candidate_of, the mainloop modes */
#include "fm_strbuf.h"
#include "fm_test.h"
#include "test_codegen_cols_frag.h"
#include "test_codegen_frag.h"

static fm_fragment raw, canon;

enum {
  FRAG_LINEAR,    /* x [-1, 4096] bf16 @ W.t() (4096 x 4096) + bias, gelu; m_hint 16384 */
  FRAG_SHORT_K,   /* x [16384, 256] bf16 @ W.t() (256 x 1024) + bias, gelu, + residual */
  FRAG_SWIGLU,    /* silu(x @ Wg.t()) * (x @ Wu.t()), x [-1, 256], W 256 x 512; m_hint 2048 */
  FRAG_SCORES,    /* bmm: q [-1, 128, 64] @ k [-1, 64, 128] * 0.125 + mask; m_hint 48 */
  FRAG_DECODE,    /* x [8, 4096] bf16 @ W.t() (4096 x 4096) + bias, gelu (skinny) */
  FRAG_MLP,       /* gelu(x @ W1.t() + b1) @ W2.t() + b2 + r, 256 -> 1024 -> 256 (b2b) */
  FRAG_BIAS_GRAD, /* grad.sum(0) of grad [-1, 1024] bf16 (cols) */
  N_FRAGS
};
static const char *const frag_name[N_FRAGS] = {
    "linear_gelu", "short_k_bias_gelu_residual", "swiglu", "bmm_scores", "decode_gelu", "mlp_b2b", "bias_grad"};

/* nn.Linear over x [m, k] (m < 0: symbolic with m_hint) and W [n, k]: + bias, gelu, and a
 * residual [m, n] added last when residual. */
static void build_linear(int64_t m, uint64_t m_hint, int64_t k, int64_t n, int residual) {
  int64_t xs[2] = {m, k}, ws[2] = {k, n}, wst[2] = {1, k}, bs[1] = {n}, os[2] = {m, n};
  tf_init(&raw);
  raw.m_hint = m_hint;
  tf_input(&raw, 1, FM_DT_BF16, 2, xs, NULL, 16);
  tf_input(&raw, 2, FM_DT_BF16, 2, ws, wst, 16);
  tf_input(&raw, 3, FM_DT_BF16, 1, bs, NULL, 16);
  tf_op(&raw, FM_OP_ADDMM, 4, 3, 3, 1, 2);
  tf_op(&raw, FM_OP_GELU, 5, 1, 4, 0, 0);
  if (residual) {
    tf_input(&raw, 6, FM_DT_BF16, 2, os, NULL, 16);
    tf_op(&raw, FM_OP_ADD, 7, 2, 5, 6, 0);
    tf_output(&raw, 7, FM_DT_BF16, 2, os, NULL, 16);
  } else {
    tf_output(&raw, 5, FM_DT_BF16, 2, os, NULL, 16);
  }
}

static int build(int which) {
  if (which == FRAG_BIAS_GRAD) return cf_fragment(0, &canon);
  if (which == FRAG_LINEAR) build_linear(-1, 16384, 4096, 4096, 0);
  if (which == FRAG_SHORT_K) build_linear(16384, 0, 256, 1024, 1);
  if (which == FRAG_DECODE) build_linear(8, 0, 4096, 4096, 0);
  if (which == FRAG_SWIGLU) {
    int64_t x[2] = {-1, 256}, w[2] = {256, 512}, wst[2] = {1, 256}, o[2] = {-1, 512};
    tf_init(&raw);
    tf_input(&raw, 1, FM_DT_BF16, 2, x, NULL, 16);
    tf_input(&raw, 2, FM_DT_BF16, 2, w, wst, 16);
    tf_input(&raw, 3, FM_DT_BF16, 2, w, wst, 16);
    tf_op(&raw, FM_OP_MM, 4, 2, 1, 2, 0);
    tf_op(&raw, FM_OP_MM, 5, 2, 1, 3, 0);
    tf_op(&raw, FM_OP_SILU, 6, 1, 4, 0, 0);
    tf_op(&raw, FM_OP_MUL, 7, 2, 6, 5, 0);
    tf_output(&raw, 7, FM_DT_BF16, 2, o, NULL, 16);
    raw.m_hint = 2048;
  }
  if (which == FRAG_SCORES) return tf_attention_scores(&raw, &canon);
  if (which == FRAG_MLP) return tf_mlp_chain(&raw, &canon, 256, 1024, 256);
  return tf_finish(&raw, &canon);
}

/* s with each "v<FM_CODEGEN_VERSION>" that follows '_' or ' ' written "v<VERSION>" (malloc'd). */
static char *version_neutral(const char *s) {
  char v[16];
  fm_strbuf sb;
  int n = snprintf(v, sizeof v, "v%d", FM_CODEGEN_VERSION);
  fm_strbuf_init(&sb, 1u << 24);
  for (const char *p = s; *p;) {
    const char *hit = strstr(p, v);
    while (hit && ((hit > s && hit[-1] != '_' && hit[-1] != ' ') || (hit[n] >= '0' && hit[n] <= '9')))
      hit = strstr(hit + 1, v);
    if (!hit) {
      fm_strbuf_append(&sb, p);
      break;
    }
    fm_strbuf_appendn(&sb, p, (size_t)(hit - p));
    fm_strbuf_append(&sb, "v<VERSION>");
    p = hit + n;
  }
  char *out = fm_strbuf_take(&sb);
  fm_strbuf_free(&sb);
  return out;
}

static uint64_t fnv1a(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

/* One line of launch metadata: every field a launch reads. */
static void describe_meta(fm_strbuf *sb, const fm_kernel_meta *m) {
  fm_strbuf_printf(sb,
                   "    meta %s %s block=%ux%ux%u smem=%u grid=%s inner=%" PRIu64 " items=%" PRIu64
                   " max_blocks=%u outer=%" PRId64 " io=%u/%u cluster=%ux%ux%u\n",
                   m->kind, m->entry, m->block[0], m->block[1], m->block[2], m->smem, m->grid_rule, m->inner,
                   m->items_per_block, m->max_blocks, m->outer, m->n_inputs, m->n_outputs, m->cluster[0], m->cluster[1],
                   m->cluster[2]);
  for (uint32_t t = 0; t < m->n_tmaps; t++) {
    const fm_meta_tmap *a = &m->tmaps[t];
    fm_strbuf_printf(sb, "    tmap in%u %s rows=%" PRId64 " cols=%" PRIu64 " ld=%" PRIu64 " box=%ux%u\n", a->input,
                     a->dtype, a->rows, a->cols, a->ld, a->box[0], a->box[1]);
  }
  if (m->blas.form[0])
    fm_strbuf_printf(sb, "    blas %s %s act=%s a=%u b=%u bias=%d c=%d out=%u\n", m->blas.form, m->blas.dtype,
                     m->blas.act, m->blas.a, m->blas.b, m->blas.bias, m->blas.c, m->blas.out);
}

/* Candidates c[0..n) of the fragment built last, as described in the header comment. */
static void list(fm_strbuf *sb, const fm_candidate *c, size_t n) {
  for (size_t i = 0; i < n; i++) {
    char desc[160], *src = NULL;
    fm_kernel_meta meta;
    fm_diag d = {{0}};
    fm_candidate_describe(&c[i], desc, sizeof desc);
    fm_strbuf_printf(sb, "  %zu %s\n    params %s", i, desc, fm_template_name(c[i].tmpl));
    for (int p = 0; p < FM_CANDIDATE_PARAMS; p++) fm_strbuf_printf(sb, " %u", c[i].p[p]);
    fm_strbuf_printf(sb, " runs_on sm_80=%d sm_90a=%d\n", fm_candidate_runs_on(&c[i], "sm_80"),
                     fm_candidate_runs_on(&c[i], "sm_90a"));
    int rc = fm_codegen_generate(&canon, &c[i], 132, &src, &meta, &d);
    if (rc) {
      fm_strbuf_printf(sb, "    refused %d: %s\n", rc, d.text);
    } else {
      describe_meta(sb, &meta);
      char *neutral = src ? version_neutral(src) : NULL;
      if (neutral) fm_strbuf_printf(sb, "    source %zu bytes fnv1a %016" PRIx64 "\n", strlen(neutral), fnv1a(neutral));
      free(neutral);
    }
    free(src);
  }
}

/* Every candidate of fragment `which`. */
static void list_candidates(fm_strbuf *sb, int which) {
  fm_candidate c[64];
  CHECK_EQ_INT(build(which), FM_OK);
  size_t n = fm_codegen_candidates(&canon, c, 64);
  CHECK(n > 0);
  fm_strbuf_printf(sb, "%s: %zu candidates\n", frag_name[which], n);
  list(sb, c, n);
}

/* The gemm forms supported but offered in no list (the plain wgmma mainloop, several row
 * tiles a block), and configs each refused for its own reason, on the linear fragment and
 * on the batched one (no tensor maps there). */
static void list_unoffered(fm_strbuf *sb) {
#define FORM(bm_, bn_, stages_, wm_, raster_, mode_) \
  .bm = bm_, .bn = bn_, .bk = 64, .stages = stages_, .wm = wm_, .wn = 1, .raster = raster_, .wgmma = FM_GEMM_##mode_
  static const fm_gemm_config forms[] = {
      {FORM(128, 256, 4, 8, 8, WGMMA)},                          /* the plain wgmma mainloop */
      {FORM(128, 128, 4, 8, 8, WGMMA_INFLIGHT), .rtiles = 2},    /* 2 row tiles a block, 1 batch in flight */
      {FORM(64, 128, 3, 4, 0, WGMMA), .rtiles = 4},              /* 4 row tiles a block */
      {FORM(128, 256, 4, 8, 8, WGMMA_WS)},                       /* warp-specialised (cp.async) */
      {FORM(128, 256, 4, 8, 8, WGMMA_PERSISTENT), .cluster = 2}, /* persistent in a cluster pair */
      {FORM(128, 256, 4, 8, 8, MODES)},                          /* refused: no mode 7 */
      {FORM(128, 128, 4, 4, 8, WGMMA_PINGPONG), .cluster = 2},   /* refused: ping-pong in a cluster */
      {FORM(128, 256, 4, 8, 8, WGMMA_WS), .rtiles = 2},          /* refused: row tiles warp-specialised */
      {FORM(128, 256, 2, 8, 8, WGMMA_INFLIGHT)},                 /* refused: 1 in flight needs 3 stages */
      {FORM(128, 128, 4, 8, 8, WGMMA_PINGPONG)},                 /* refused: ping-pong takes 4 x 1 warps */
      {FORM(128, 256, 4, 8, 8, WGMMA), .cluster = 2},            /* refused: a cluster without TMA */
      {FORM(256, 128, 3, 16, 8, WGMMA_INFLIGHT)},                /* refused: BM 256 */
  };
#undef FORM
  const int frags[] = {FRAG_LINEAR, FRAG_SCORES, FRAG_SWIGLU};
  for (size_t w = 0; w < sizeof frags / sizeof frags[0]; w++) {
    fm_candidate c[sizeof forms / sizeof forms[0]];
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) c[i] = fm_cg_gemm_candidate_of(forms[i]);
    CHECK_EQ_INT(build(frags[w]), FM_OK);
    fm_strbuf_printf(sb, "%s: gemm forms offered nowhere\n", frag_name[frags[w]]);
    list(sb, c, sizeof forms / sizeof forms[0]);
  }
}

static void test_candidates(void) {
  fm_strbuf sb;
  fm_strbuf_init(&sb, 1u << 22);
  for (int w = 0; w < N_FRAGS; w++) list_candidates(&sb, w);
  list_unoffered(&sb);
  CHECK_EQ_INT(fm_strbuf_error(&sb), 0);
  char *text = fm_strbuf_take(&sb), *neutral = text ? version_neutral(text) : NULL;
  CHECK(tf_golden_file("sm90_candidates.txt", neutral));
  free(neutral);
  free(text);
  fm_strbuf_free(&sb);
}

/* The kernel of one candidate of fragment `which` against tests/unit/golden/sm90_<name>.cu,
 * with what it was chosen for present whatever the file says. */
static void check_kernel(int which, const fm_candidate *c, const char *name, const char *must) {
  char *src = NULL, file[128];
  fm_kernel_meta meta;
  fm_diag d = {{0}};
  CHECK_EQ_INT(build(which), FM_OK);
  CHECK_EQ_INT(fm_candidate_runs_on(c, "sm_90a"), 1);
  int rc = fm_codegen_generate(&canon, c, 132, &src, &meta, &d);
  if (rc) fprintf(stderr, "  %s: %s\n", name, d.text);
  CHECK_EQ_INT(rc, FM_OK);
  if (!src) return;
  snprintf(file, sizeof file, "sm90_%s.cu", name);
  char *neutral = version_neutral(src);
  CHECK(tf_golden_file(file, neutral));
  free(neutral);
  CHECK(strstr(src, "#include") == NULL);
  CHECK_STR_CONTAINS(src, must);
  free(src);
}

/* A gemm candidate: the tile, the mainloop mode and the cluster. */
static fm_candidate gemm(uint32_t bm, uint32_t bn, uint32_t stages, uint32_t wm, fm_gemm_mode mode, uint32_t cluster) {
  fm_gemm_config c = {.bm = bm,
                      .bn = bn,
                      .bk = 64,
                      .stages = stages,
                      .wm = wm,
                      .wn = 1,
                      .raster = 8,
                      .wgmma = mode,
                      .cluster = cluster};
  return fm_cg_gemm_candidate_of(c);
}

static void test_gemm_tma(void) {
  fm_candidate c = gemm(128, 256, 4, 8, FM_GEMM_WGMMA_TMA, 0);
  check_kernel(FRAG_LINEAR, &c, "gemm_tma", "fm_tma_load");
}
static void test_gemm_tma_cluster2(void) {
  fm_candidate c = gemm(128, 256, 4, 8, FM_GEMM_WGMMA_TMA, 2);
  check_kernel(FRAG_LINEAR, &c, "gemm_tma_cluster2", "__cluster_dims__(2, 1, 1)");
}
static void test_gemm_persistent(void) {
  fm_candidate c = gemm(128, 256, 4, 8, FM_GEMM_WGMMA_PERSISTENT, 0);
  check_kernel(FRAG_LINEAR, &c, "gemm_persistent", "fm_load_tiles");
}
static void test_gemm_pingpong(void) {
  fm_candidate c = gemm(128, 128, 4, 4, FM_GEMM_WGMMA_PINGPONG, 0);
  check_kernel(FRAG_SHORT_K, &c, "gemm_pingpong", "#define FM_WG_PINGPONG 1");
}
static void test_gemm_wgmma_cpasync(void) {
  fm_candidate c = gemm(128, 256, 4, 8, FM_GEMM_WGMMA_INFLIGHT, 0);
  check_kernel(FRAG_LINEAR, &c, "gemm_wgmma_cpasync", "#define FM_WG_TMA 0");
}
static void test_gemm_siblings_tma(void) {
  fm_candidate c = gemm(128, 256, 4, 8, FM_GEMM_WGMMA_TMA, 0);
  check_kernel(FRAG_SWIGLU, &c, "gemm_siblings_tma", "fm_tmb2");
}
static void test_b2b_tma(void) {
  fm_candidate c = {.tmpl = FM_TMPL_B2B, .p = {128, FM_B2B_TMA}};
  check_kernel(FRAG_MLP, &c, "b2b_tma", "fm_tma_load");
}
static void test_b2b_tma_pair(void) {
  fm_candidate c = {.tmpl = FM_TMPL_B2B, .p = {128, FM_B2B_TMA_PAIR}};
  check_kernel(FRAG_MLP, &c, "b2b_tma_pair", "__cluster_dims__");
}
static void test_skinny(void) {
  fm_candidate c;
  fm_diag d = {{0}};
  CHECK_EQ_INT(build(FRAG_DECODE), FM_OK);
  CHECK_EQ_INT(fm_codegen_default(&canon, &c, &d), FM_OK);
  CHECK_EQ_INT(c.tmpl, FM_TMPL_SKINNY);
  check_kernel(FRAG_DECODE, &c, "skinny_default", "fm_mma(");
}
static void test_skinny_split(void) {
  fm_candidate c = {.tmpl = FM_TMPL_SKINNY, .p = {8, 8, 4, 0, 2}};
  check_kernel(FRAG_DECODE, &c, "skinny_split2", "__cluster_dims__(2, 1, 1)");
}
static void test_cols_cluster(void) {
  fm_candidate c[32];
  CHECK_EQ_INT(build(FRAG_BIAS_GRAD), FM_OK);
  size_t n = fm_codegen_candidates(&canon, c, 32), i = 0;
  while (i < n && !(c[i].tmpl == FM_TMPL_COLS && c[i].p[1] > 1)) i++;
  CHECK(i < n);
  if (i < n) check_kernel(FRAG_BIAS_GRAD, &c[i], "cols_cluster", "__cluster_dims__(1, ");
}

int main(void) {
  RUN(test_candidates);
  RUN(test_gemm_tma);
  RUN(test_gemm_tma_cluster2);
  RUN(test_gemm_persistent);
  RUN(test_gemm_pingpong);
  RUN(test_gemm_wgmma_cpasync);
  RUN(test_gemm_siblings_tma);
  RUN(test_b2b_tma);
  RUN(test_b2b_tma_pair);
  RUN(test_skinny);
  RUN(test_skinny_split);
  RUN(test_cols_cluster);
  return FM_TEST_DONE();
}
