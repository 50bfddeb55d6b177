/* fm_codegen.c: the generic candidate API: routes a fragment to the template that serves
 * its kind and translates between fm_candidate and each template's own config. Each template
 * is one row of `templates` below (its default, the candidates timed beside it, its
 * generator, its description and the architecture it needs); the API functions look the row
 * up instead of switching on the template. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen.h"
#include "fm_codegen_gemm.h"

const char *fm_template_name(fm_template t) {
  switch (t) {
#define FM_TMPL_NAME_(n, name, str) \
  case FM_TMPL_##name:              \
    return str;
    FM_TEMPLATE_MAP(FM_TMPL_NAME_)
#undef FM_TMPL_NAME_
    case FM_TMPL_NONE:
      break;
  }
  return "none";
}

/* ---- each template's config <-> the candidate's wire form -------------------------------
 * fm_candidate.p[] is stored in the cache beside each timing and sent to fusectl (the
 * tuner's "params"), so these orders never change; nothing outside this pair of functions
 * per template reads p[] by index (the cuBLASLt form, a single parameter, aside). Unused
 * parameters are 0. */

static fm_candidate from_pw(fm_pw_config c) {
  return (fm_candidate){.tmpl = FM_TMPL_POINTWISE, .p = {c.block, c.vec, c.unroll, c.blocks_per_sm}};
}

static fm_pw_config to_pw(const fm_candidate *k) {
  return (fm_pw_config){.block = k->p[0], .vec = k->p[1], .unroll = k->p[2], .blocks_per_sm = k->p[3]};
}

static fm_candidate from_rows(fm_rows_config c) {
  return (fm_candidate){.tmpl = FM_TMPL_ROWS, .p = {c.variant, c.block, c.vec}};
}

static fm_rows_config to_rows(const fm_candidate *k) {
  return (fm_rows_config){.variant = k->p[0], .block = k->p[1], .vec = k->p[2]};
}

/* One row tile and no cluster are written 0, as they were before either existed (fm_cg_gemm_candidate_of
 * and fm_cg_gemm_config_of, below, are the two for code outside this file). */
static fm_candidate from_gemm(fm_gemm_config c) {
  return (fm_candidate){.tmpl = FM_TMPL_GEMM,
                        .p = {c.bm, c.bn, c.bk, c.stages, c.wm, c.wn, c.raster, c.wgmma, c.rtiles > 1 ? c.rtiles : 0,
                              c.cluster > 1 ? c.cluster : 0}};
}

static fm_gemm_config to_gemm(const fm_candidate *k) {
  return (fm_gemm_config){.bm = k->p[0],
                          .bn = k->p[1],
                          .bk = k->p[2],
                          .stages = k->p[3],
                          .wm = k->p[4],
                          .wn = k->p[5],
                          .raster = k->p[6],
                          .wgmma = k->p[7],
                          .rtiles = k->p[8],
                          .cluster = k->p[9]};
}

fm_candidate fm_cg_gemm_candidate_of(fm_gemm_config c) { return from_gemm(c); }
fm_gemm_config fm_cg_gemm_config_of(const fm_candidate *c) { return to_gemm(c); }

static fm_candidate from_skinny(fm_skinny_config c) {
  return (fm_candidate){.tmpl = FM_TMPL_SKINNY, .p = {c.cols, c.warps, c.unroll, c.pipe, c.split > 1 ? c.split : 0}};
}

static fm_skinny_config to_skinny(const fm_candidate *k) {
  return (fm_skinny_config){.cols = k->p[0], .warps = k->p[1], .unroll = k->p[2], .pipe = k->p[3], .split = k->p[4]};
}

static fm_candidate from_cols(fm_cols_config c) {
  return (fm_candidate){.tmpl = FM_TMPL_COLS,
                        .p = {c.width, c.cluster, c.vec, c.unroll, c.block, c.split > 1 ? c.split : 0}};
}

static fm_cols_config to_cols(const fm_candidate *k) {
  return (fm_cols_config){
      .width = k->p[0], .cluster = k->p[1], .vec = k->p[2], .unroll = k->p[3], .block = k->p[4], .split = k->p[5]};
}

static fm_candidate from_scatter(fm_scatter_config c) {
  return (fm_candidate){.tmpl = FM_TMPL_SCATTER, .p = {c.block, c.vec, c.table, c.lanes_m}};
}
static fm_scatter_config to_scatter(const fm_candidate *k) {
  return (fm_scatter_config){.block = k->p[0], .vec = k->p[1], .table = k->p[2], .lanes_m = k->p[3]};
}
static fm_candidate from_b2b(fm_b2b_config c) { return (fm_candidate){.tmpl = FM_TMPL_B2B, .p = {c.bm, c.form}}; }

static fm_b2b_config to_b2b(const fm_candidate *k) { return (fm_b2b_config){.bm = k->p[0], .form = k->p[1]}; }

/* ---- each template's row: default, candidates, generator, description, architecture ---- */

/* Where a candidate runs: anywhere, on sm_90 and later (thread block clusters), or on
 * sm_90a only (warpgroup MMA, tensor maps). */
typedef enum { RUNS_ANYWHERE, RUNS_SM90_UP, RUNS_SM90A } runs_where;

typedef int (*generate_fn)(const fm_fragment *canon, const fm_candidate *c, uint32_t sm_count, char **src,
                           fm_kernel_meta *meta, fm_diag *d);

typedef struct template_ops {
  /* The default candidate of a fragment template_for() routes here, or the reason none can
   * serve it (the daemon answers "bypass" with it); NULL: never a default. */
  int (*default_of)(const fm_fragment *canon, fm_candidate *out, fm_diag *d);
  /* The candidates timed beside a default of this template, in order (the default may be
   * among them), at most max; NULL: the default alone. */
  size_t (*list)(const fm_fragment *canon, fm_candidate *out, size_t max);
  generate_fn generate;
  /* "<template> <parameters>", for logs and `fusectl show` */
  void (*describe)(const fm_candidate *c, char *out, size_t cap);
  runs_where (*runs)(const fm_candidate *c); /* NULL: anywhere */
} template_ops;

/* A default is generated once where the template may refuse the fragment, so that the
 * reason becomes the daemon's "bypass" answer; *out = k when it generates. */
static int default_if_generated(generate_fn generate, const fm_fragment *canon, fm_candidate k, fm_candidate *out,
                                fm_diag *d) {
  char *src = NULL;
  fm_kernel_meta meta;
  int rc = generate(canon, &k, 0, &src, &meta, d);
  free(src);
  if (!rc) *out = k;
  return rc;
}

static int scatter_generate_(const fm_fragment *canon, const fm_candidate *c, uint32_t sm_count, char **src,
                             fm_kernel_meta *meta, fm_diag *d) {
  fm_scatter_config sc = to_scatter(c);
  return fm_codegen_scatter(canon, &sc, sm_count, src, meta, d);
}

/* pointwise */
static int pw_default(const fm_fragment *canon, fm_candidate *out, fm_diag *d) {
  (void)d;
  *out = from_pw(fm_codegen_pointwise_default(canon));
  return FM_OK;
}
static size_t pw_list(const fm_fragment *canon, fm_candidate *out, size_t max) {
  fm_pw_config pw[64];
  size_t m = fm_codegen_pointwise_candidates(canon, pw, 64), n = 0;
  for (size_t i = 0; i < m && n < max; i++) out[n++] = from_pw(pw[i]);
  return n;
}
static int pw_generate(const fm_fragment *canon, const fm_candidate *c, uint32_t sm_count, char **src,
                       fm_kernel_meta *meta, fm_diag *d) {
  fm_pw_config pw = to_pw(c);
  return fm_codegen_pointwise(canon, &pw, sm_count, src, meta, d);
}
static void pw_describe(const fm_candidate *c, char *out, size_t cap) {
  fm_pw_config pw = to_pw(c);
  snprintf(out, cap, "pointwise block=%u vec=%u unroll=%u blocks_per_sm=%u", pw.block, pw.vec, pw.unroll,
           pw.blocks_per_sm);
}

/* rows */
static int rows_default(const fm_fragment *canon, fm_candidate *out, fm_diag *d) {
  (void)d;
  *out = from_rows(fm_codegen_rows_default(canon));
  return FM_OK;
}
static size_t rows_list(const fm_fragment *canon, fm_candidate *out, size_t max) {
  fm_rows_config rc[16];
  size_t m = fm_codegen_rows_candidates(canon, rc, 16), n = 0;
  for (size_t i = 0; i < m && n < max; i++) out[n++] = from_rows(rc[i]);
  return n;
}
static int rows_generate(const fm_fragment *canon, const fm_candidate *c, uint32_t sm_count, char **src,
                         fm_kernel_meta *meta, fm_diag *d) {
  fm_rows_config rc = to_rows(c);
  return fm_codegen_rows(canon, &rc, sm_count, src, meta, d);
}
static void rows_describe(const fm_candidate *c, char *out, size_t cap) {
  fm_rows_config rc = to_rows(c);
  snprintf(out, cap, "rows %s block=%u vec=%u",
           rc.variant == FM_ROWS_STREAM  ? "block-per-row streamed"
           : rc.variant == FM_ROWS_BLOCK ? "block-per-row"
                                         : "warp-per-row",
           rc.block, rc.vec);
}

/* cols */
static size_t cols_list(const fm_fragment *canon, fm_candidate *out, size_t max) {
  fm_cols_config cc[48];
  size_t m = fm_codegen_cols_candidates(canon, cc, 48), n = 0;
  for (size_t i = 0; i < m && n < max; i++) out[n++] = from_cols(cc[i]);
  return n;
}
static int cols_generate(const fm_fragment *canon, const fm_candidate *c, uint32_t sm_count, char **src,
                         fm_kernel_meta *meta, fm_diag *d) {
  fm_cols_config cc = to_cols(c);
  return fm_codegen_cols(canon, &cc, sm_count, src, meta, d);
}
static int cols_default(const fm_fragment *canon, fm_candidate *out, fm_diag *d) {
  /* too many reductions for shared memory is said here */
  return default_if_generated(cols_generate, canon, from_cols(fm_codegen_cols_default(canon)), out, d);
}
static void cols_describe(const fm_candidate *c, char *out, size_t cap) {
  fm_cols_config cc = to_cols(c);
  char split[24] = "";
  if (cc.split > 1) snprintf(split, sizeof split, " split=%u", cc.split);
  snprintf(out, cap, "cols width=%u cluster=%u vec=%u unroll=%u block=%u%s", cc.width, cc.cluster, cc.vec, cc.unroll,
           cc.block, split);
}
static runs_where cols_runs(const fm_candidate *c) { return to_cols(c).cluster > 1 ? RUNS_SM90_UP : RUNS_ANYWHERE; }

/* gemm (and, by its default, skinny and cuBLASLt: the GEMM family) */
static size_t gemm_family_list(const fm_fragment *canon, fm_candidate *out, size_t max) {
  /* the library first, so no cap on the list drops it: the chosen kernel is then never
     slower than what eager runs */
  size_t n = max ? fm_codegen_blas_candidates(canon, out, max) : 0;
  /* a small M times both GEMM templates: the skinny one's first (decode: weight streaming) */
  fm_skinny_config sc[16];
  size_t m = fm_codegen_skinny_candidates(canon, sc, 16);
  for (size_t i = 0; i < m && n < max; i++) out[n++] = from_skinny(sc[i]);
  fm_gemm_config gc[48];
  m = fm_codegen_gemm_candidates(canon, gc, sizeof gc / sizeof gc[0]);
  for (size_t i = 0; i < m && n < max; i++) out[n++] = from_gemm(gc[i]);
  return n;
}
static int gemm_generate(const fm_fragment *canon, const fm_candidate *c, uint32_t sm_count, char **src,
                         fm_kernel_meta *meta, fm_diag *d) {
  fm_gemm_config gc = to_gemm(c);
  return fm_codegen_gemm(canon, &gc, sm_count, src, meta, d);
}
static int gemm_default(const fm_fragment *canon, fm_candidate *out, fm_diag *d) {
  /* the layouts and K decide whether the template can run it at all: said here */
  fm_gemm_config gc = fm_codegen_gemm_default(canon);
  if (fm_codegen_gemm_smem(canon, &gc) == 0) {
    int rc = default_if_generated(gemm_generate, canon, from_gemm(gc), out, d);
    /* cuBLASLt takes what the templates refuse (K not a multiple of 8, unaligned rows) */
    if (rc && fm_codegen_blas_candidates(canon, out, 1) == 1) return FM_OK;
    if (rc) return rc;
  }
  /* a decode-sized M streams W: the skinny template (timed against the gemm one) */
  *out = fm_codegen_skinny_preferred(canon) ? from_skinny(fm_codegen_skinny_default(canon)) : from_gemm(gc);
  return FM_OK;
}
static void gemm_describe(const fm_candidate *c, char *out, size_t cap) {
  fm_gemm_config g = to_gemm(c);
  const fm_gemm_mainloop *ml = fm_cg_gemm_mainloop(g.wgmma);
  char tiles[40] = "";
  if (g.rtiles > 1) snprintf(tiles, sizeof tiles, " tiles=%u", g.rtiles);
  if (g.cluster > 1) snprintf(tiles + strlen(tiles), sizeof tiles - strlen(tiles), " cluster=%u", g.cluster);
  snprintf(out, cap, "gemm %ux%ux%u stages=%u warps=%ux%u raster=%u%s%s", g.bm, g.bn, g.bk, g.stages, g.wm, g.wn,
           g.raster, ml ? ml->describe : "", tiles);
}
/* the wgmma mainloops, and row tiles or clusters (which only they take) */
static runs_where gemm_runs(const fm_candidate *c) {
  fm_gemm_config g = to_gemm(c);
  return g.wgmma || g.rtiles || g.cluster ? RUNS_SM90A : RUNS_ANYWHERE;
}

/* skinny */
static int skinny_generate(const fm_fragment *canon, const fm_candidate *c, uint32_t sm_count, char **src,
                           fm_kernel_meta *meta, fm_diag *d) {
  fm_skinny_config sc = to_skinny(c);
  return fm_codegen_skinny(canon, &sc, sm_count, src, meta, d);
}
static void skinny_describe(const fm_candidate *c, char *out, size_t cap) {
  fm_skinny_config sc = to_skinny(c);
  snprintf(out, cap, "skinny cols=%u warps=%u unroll=%u pipe=%u%s", sc.cols, sc.warps, sc.unroll, sc.pipe,
           sc.split == 2   ? " split=2"
           : sc.split == 4 ? " split=4"
           : sc.split > 1  ? " split=?"
                           : "");
}
static runs_where skinny_runs(const fm_candidate *c) { return to_skinny(c).split > 1 ? RUNS_SM90_UP : RUNS_ANYWHERE; }

/* cuBLASLt: p[0] is the form */
static int blas_generate(const fm_fragment *canon, const fm_candidate *c, uint32_t sm_count, char **src,
                         fm_kernel_meta *meta, fm_diag *d) {
  return fm_codegen_blas(canon, c->p[0], sm_count, src, meta, d);
}
static void blas_describe(const fm_candidate *c, char *out, size_t cap) {
  snprintf(out, cap, "cublaslt %s", c->p[0] == FM_BLAS_DIRECT ? "direct" : "split epilogue");
}

/* b2b */
static size_t b2b_list(const fm_fragment *canon, fm_candidate *out, size_t max) {
  fm_b2b_config bc[8];
  size_t m = fm_codegen_b2b_candidates(canon, bc, 8), n = 0;
  for (size_t i = 0; i < m && n < max; i++) out[n++] = from_b2b(bc[i]);
  return n;
}
static int b2b_generate(const fm_fragment *canon, const fm_candidate *c, uint32_t sm_count, char **src,
                        fm_kernel_meta *meta, fm_diag *d) {
  fm_b2b_config bc = to_b2b(c);
  return fm_codegen_b2b(canon, &bc, sm_count, src, meta, d);
}
static int b2b_default(const fm_fragment *canon, fm_candidate *out, fm_diag *d) {
  /* the limits are said here, and the client runs the two GEMMs apart */
  return default_if_generated(b2b_generate, canon, from_b2b(fm_codegen_b2b_default(canon)), out, d);
}
static void b2b_describe(const fm_candidate *c, char *out, size_t cap) {
  fm_b2b_config bc = to_b2b(c);
  snprintf(out, cap, "b2b bm=%u%s", bc.bm,
           bc.form == FM_B2B_TMA_PAIR ? " tma cluster=2"
           : bc.form == FM_B2B_TMA    ? " tma"
                                      : "");
}
static runs_where b2b_runs(const fm_candidate *c) {
  (void)c;
  return RUNS_SM90A;
}

/* scatter */
static int scatter_default(const fm_fragment *canon, fm_candidate *out, fm_diag *d) {
  return default_if_generated(scatter_generate_, canon, from_scatter(fm_codegen_scatter_default(canon)), out, d);
}
static size_t scatter_list(const fm_fragment *canon, fm_candidate *out, size_t max) {
  fm_scatter_config sc[16];
  size_t m = fm_codegen_scatter_candidates(canon, sc, 16), n = 0;
  for (size_t i = 0; i < m && n < max; i++) out[n++] = from_scatter(sc[i]);
  return n;
}
static void scatter_describe(const fm_candidate *c, char *out, size_t cap) {
  fm_scatter_config sc = to_scatter(c);
  snprintf(out, cap, "scatter block=%u vec=%u%s%s", sc.block, sc.vec, sc.lanes_m ? " lanes=m" : "",
           sc.table ? " table" : "");
}

static const template_ops templates[] = {
    [FM_TMPL_POINTWISE] = {.default_of = pw_default, .list = pw_list, .generate = pw_generate, .describe = pw_describe},
    [FM_TMPL_ROWS] = {.default_of = rows_default,
                      .list = rows_list,
                      .generate = rows_generate,
                      .describe = rows_describe},
    [FM_TMPL_COLS] = {.default_of = cols_default,
                      .list = cols_list,
                      .generate = cols_generate,
                      .describe = cols_describe,
                      .runs = cols_runs},
    [FM_TMPL_GEMM] = {.default_of = gemm_default,
                      .list = gemm_family_list,
                      .generate = gemm_generate,
                      .describe = gemm_describe,
                      .runs = gemm_runs},
    [FM_TMPL_SKINNY] = {.list = gemm_family_list,
                        .generate = skinny_generate,
                        .describe = skinny_describe,
                        .runs = skinny_runs},
    [FM_TMPL_CUBLASLT] = {.generate = blas_generate, .describe = blas_describe},
    [FM_TMPL_SCATTER] = {.default_of = scatter_default,
                         .list = scatter_list,
                         .generate = scatter_generate_,
                         .describe = scatter_describe},
    [FM_TMPL_B2B] = {.default_of = b2b_default,
                     .list = b2b_list,
                     .generate = b2b_generate,
                     .describe = b2b_describe,
                     .runs = b2b_runs},
};
#define N_TEMPLATES (sizeof templates / sizeof templates[0])

/* The row of template t; NULL for none or an unknown number. */
static const template_ops *ops_of(fm_template t) {
  return (unsigned)t < N_TEMPLATES && templates[t].generate ? &templates[t] : NULL;
}

/* Which template serves a fragment: an index_add the scatter one, a chain of two products
 * the b2b one, any other with a
 * matrix product is a GEMM fragment, one reducing over dim 0 a column fragment, one with
 * another reduction a row fragment; every other valid fragment is a pointwise chain. */
static fm_template template_for(const fm_fragment *canon) {
  if (fm_fragment_is_scatter(canon)) return FM_TMPL_SCATTER;
  if (fm_fragment_is_chain(canon)) return FM_TMPL_B2B;
  if (fm_fragment_is_gemm(canon)) return FM_TMPL_GEMM;
  if (fm_fragment_is_cols(canon)) return FM_TMPL_COLS;
  return fm_fragment_is_rows(canon) ? FM_TMPL_ROWS : FM_TMPL_POINTWISE;
}

int fm_codegen_default(const fm_fragment *canon, fm_candidate *out, fm_diag *d) {
  if (!canon || !out) return fm_diag_set(d, FM_EINVAL, "codegen: NULL argument");
  const template_ops *ops = ops_of(template_for(canon));
  if (ops && ops->default_of) return ops->default_of(canon, out, d);
  return fm_diag_set(d, FM_EUNSUPPORTED, "no kernel template serves this fragment");
}

/* The most candidates a template's list gives (the GEMM family's: 1 + 16 + 48). */
#define LIST_MAX 96

size_t fm_codegen_candidates(const fm_fragment *canon, fm_candidate *out, size_t max) {
  fm_candidate def;
  size_t n = 0;
  if (!canon || !out || !max || fm_codegen_default(canon, &def, NULL)) return 0;
  out[n++] = def;
  const template_ops *ops = ops_of(def.tmpl);
  if (!ops || !ops->list) return n;
  fm_candidate more[LIST_MAX];
  size_t m = ops->list(canon, more, LIST_MAX);
  for (size_t i = 0; i < m && n < max; i++)
    if (memcmp(&more[i], &def, sizeof def) != 0) out[n++] = more[i]; /* the default is already first */
  return n;
}

int fm_codegen_generate(const fm_fragment *canon, const fm_candidate *c, uint32_t sm_count, char **src,
                        fm_kernel_meta *meta, fm_diag *d) {
  if (!c) return fm_diag_set(d, FM_EINVAL, "codegen: NULL candidate");
  const template_ops *ops = ops_of(c->tmpl);
  if (!ops) return fm_diag_set(d, FM_EUNSUPPORTED, "unknown kernel template %d", (int)c->tmpl);
  return ops->generate(canon, c, sm_count, src, meta, d);
}

int fm_candidate_runs_on(const fm_candidate *c, const char *arch) {
  const template_ops *ops = c ? ops_of(c->tmpl) : NULL;
  runs_where where = ops && ops->runs ? ops->runs(c) : RUNS_ANYWHERE;
  if (where == RUNS_SM90A) return arch && strcmp(arch, "sm_90a") == 0;
  if (where == RUNS_SM90_UP) {
    int sm = 0;
    return arch && sscanf(arch, "sm_%d", &sm) == 1 && sm >= 90;
  }
  return 1;
}

void fm_candidate_describe(const fm_candidate *c, char *out, size_t cap) {
  const template_ops *ops = ops_of(c->tmpl);
  if (ops)
    ops->describe(c, out, cap);
  else
    snprintf(out, cap, "%s", fm_template_name(c->tmpl));
}
