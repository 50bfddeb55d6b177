/* fm_codegen.c: the generic candidate API: routes a fragment to the template that serves
 * its kind and translates between fm_candidate and each template's own config. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen.h"
#include "fm_codegen_gemm.h"

const char *fm_template_name(fm_template t) {
  switch (t) {
#define FM_TMPL_NAME_(n, name, str) \
  case FM_TMPL_##name: return str;
    FM_TEMPLATE_MAP(FM_TMPL_NAME_)
#undef FM_TMPL_NAME_
    case FM_TMPL_NONE: break;
  }
  return "none";
}

/* ---- each template's config <-> the candidate's wire form -------------------------------
 * fm_candidate.p[] is stored in the cache beside each timing and sent to fusectl (the
 * tuner's "params"), so these orders never change; nothing outside this pair of functions
 * per template reads p[] by index. Unused parameters are 0. */

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

/* The gemm candidate's last word packs three fields (the cache holds it so): the mainloop
 * mode in bits 0..7, the row tiles a block in bits 8..15 (0: one) and the cluster from bit
 * 16 (0: none). Written by from_gemm and read by to_gemm only. */
enum { GEMM_MODE_MASK = 0xffu, GEMM_RTILES_SHIFT = 8, GEMM_RTILES_MASK = 0xffu, GEMM_CLUSTER_SHIFT = 16 };

static fm_candidate from_gemm(fm_gemm_config c) {
  uint32_t extras = c.wgmma | (c.rtiles > 1 ? c.rtiles << GEMM_RTILES_SHIFT : 0u) |
                    (c.cluster > 1 ? c.cluster << GEMM_CLUSTER_SHIFT : 0u);
  return (fm_candidate){.tmpl = FM_TMPL_GEMM, .p = {c.bm, c.bn, c.bk, c.stages, c.wm, c.wn, c.raster, extras}};
}

static fm_gemm_config to_gemm(const fm_candidate *k) {
  return (fm_gemm_config){.bm = k->p[0], .bn = k->p[1], .bk = k->p[2], .stages = k->p[3], .wm = k->p[4],
                          .wn = k->p[5], .raster = k->p[6], .wgmma = k->p[7] & GEMM_MODE_MASK,
                          .rtiles = (k->p[7] >> GEMM_RTILES_SHIFT) & GEMM_RTILES_MASK,
                          .cluster = k->p[7] >> GEMM_CLUSTER_SHIFT};
}

static fm_candidate from_skinny(fm_skinny_config c) {
  return (fm_candidate){.tmpl = FM_TMPL_SKINNY, .p = {c.cols, c.warps, c.unroll, c.pipe, c.split > 1 ? c.split : 0}};
}

static fm_skinny_config to_skinny(const fm_candidate *k) {
  return (fm_skinny_config){.cols = k->p[0], .warps = k->p[1], .unroll = k->p[2], .pipe = k->p[3], .split = k->p[4]};
}

static fm_candidate from_cols(fm_cols_config c) {
  return (fm_candidate){.tmpl = FM_TMPL_COLS, .p = {c.width, c.cluster, c.vec, c.unroll, c.block}};
}

static fm_cols_config to_cols(const fm_candidate *k) {
  return (fm_cols_config){.width = k->p[0], .cluster = k->p[1], .vec = k->p[2], .unroll = k->p[3], .block = k->p[4]};
}

static fm_candidate from_b2b(fm_b2b_config c) {
  return (fm_candidate){.tmpl = FM_TMPL_B2B, .p = {c.bm, c.form}};
}

static fm_b2b_config to_b2b(const fm_candidate *k) { return (fm_b2b_config){.bm = k->p[0], .form = k->p[1]}; }

/* Which template serves a fragment: a chain of two products the b2b one, any other with a
 * matrix product is a GEMM fragment, one reducing over dim 0 a column fragment, one with
 * another reduction a row fragment; every other valid fragment is a pointwise chain. */
static fm_template template_for(const fm_fragment *canon) {
  if (fm_fragment_is_chain(canon)) return FM_TMPL_B2B;
  if (fm_fragment_is_gemm(canon)) return FM_TMPL_GEMM;
  if (fm_fragment_is_cols(canon)) return FM_TMPL_COLS;
  return fm_fragment_is_rows(canon) ? FM_TMPL_ROWS : FM_TMPL_POINTWISE;
}

int fm_codegen_default(const fm_fragment *canon, fm_candidate *out, fm_diag *d) {
  if (!canon || !out) return fm_diag_set(d, FM_EINVAL, "codegen: NULL argument");
  switch (template_for(canon)) {
    case FM_TMPL_POINTWISE: *out = from_pw(fm_codegen_pointwise_default(canon)); return FM_OK;
    case FM_TMPL_ROWS: *out = from_rows(fm_codegen_rows_default(canon)); return FM_OK;
    case FM_TMPL_COLS: {
      /* say why not here (too many reductions for shared memory), so the daemon answers
         "bypass" with the reason */
      fm_cols_config cc = fm_codegen_cols_default(canon);
      char *src = NULL;
      fm_kernel_meta meta;
      int rc = fm_codegen_cols(canon, &cc, 0, &src, &meta, d);
      free(src);
      if (rc) return rc;
      *out = from_cols(cc);
      return FM_OK;
    }
    case FM_TMPL_GEMM: {
      /* the layouts and K decide whether the template can run it at all: say why not here,
         so the daemon answers "bypass" with the reason */
      fm_gemm_config gc = fm_codegen_gemm_default(canon);
      if (fm_codegen_gemm_smem(canon, &gc) == 0) {
        char *src = NULL;
        fm_kernel_meta meta;
        int rc = fm_codegen_gemm(canon, &gc, 0, &src, &meta, d);
        free(src);
        /* cuBLASLt takes what the templates refuse (K not a multiple of 8, unaligned rows) */
        if (rc && fm_codegen_blas_candidates(canon, out, 1) == 1) return FM_OK;
        if (rc) return rc;
      }
      /* a decode-sized M streams W: the skinny template (timed against the gemm one) */
      *out = fm_codegen_skinny_preferred(canon) ? from_skinny(fm_codegen_skinny_default(canon))
                                                : from_gemm(gc);
      return FM_OK;
    }
    case FM_TMPL_B2B: {
      /* say why not here (the limits), so the daemon answers "bypass" with the reason and the
         client runs the two GEMMs apart */
      fm_b2b_config bc = fm_codegen_b2b_default(canon);
      char *src = NULL;
      fm_kernel_meta meta;
      int rc = fm_codegen_b2b(canon, &bc, 0, &src, &meta, d);
      free(src);
      if (rc) return rc;
      *out = from_b2b(bc);
      return FM_OK;
    }
    default: break;
  }
  return fm_diag_set(d, FM_EUNSUPPORTED, "no kernel template serves this fragment");
}

size_t fm_codegen_candidates(const fm_fragment *canon, fm_candidate *out, size_t max) {
  fm_candidate def;
  size_t n = 0;
  if (!canon || !out || !max || fm_codegen_default(canon, &def, NULL)) return 0;
  out[n++] = def;
  if (def.tmpl == FM_TMPL_POINTWISE) {
    fm_pw_config pw[64];
    size_t m = fm_codegen_pointwise_candidates(canon, pw, 64);
    for (size_t i = 0; i < m && n < max; i++) {
      fm_candidate k = from_pw(pw[i]);
      if (memcmp(&k, &def, sizeof k) != 0) out[n++] = k; /* the default is already first */
    }
  } else if (def.tmpl == FM_TMPL_ROWS) {
    fm_rows_config rc[16];
    size_t m = fm_codegen_rows_candidates(canon, rc, 16);
    for (size_t i = 0; i < m && n < max; i++) {
      fm_candidate k = from_rows(rc[i]);
      if (memcmp(&k, &def, sizeof k) != 0) out[n++] = k;
    }
  } else if (def.tmpl == FM_TMPL_COLS) {
    fm_cols_config cc[32];
    size_t m = fm_codegen_cols_candidates(canon, cc, 32);
    for (size_t i = 0; i < m && n < max; i++) {
      fm_candidate k = from_cols(cc[i]);
      if (memcmp(&k, &def, sizeof k) != 0) out[n++] = k;
    }
  } else if (def.tmpl == FM_TMPL_B2B) {
    fm_b2b_config bc[8];
    size_t m = fm_codegen_b2b_candidates(canon, bc, 8);
    for (size_t i = 0; i < m && n < max; i++) {
      fm_candidate k = from_b2b(bc[i]);
      if (memcmp(&k, &def, sizeof k) != 0) out[n++] = k;
    }
  } else if (def.tmpl == FM_TMPL_GEMM || def.tmpl == FM_TMPL_SKINNY) {
    /* the library right after the default, so no cap on the list drops it: the chosen kernel
       is then never slower than what eager runs */
    size_t m = n < max ? fm_codegen_blas_candidates(canon, &out[n], max - n) : 0;
    n += m;
    /* a small M times both GEMM templates: the skinny one's first (decode: weight streaming) */
    fm_skinny_config sc[16];
    m = fm_codegen_skinny_candidates(canon, sc, 16);
    for (size_t i = 0; i < m && n < max; i++) {
      fm_candidate k = from_skinny(sc[i]);
      if (memcmp(&k, &def, sizeof k) != 0) out[n++] = k;
    }
    fm_gemm_config gc[48];
    m = fm_codegen_gemm_candidates(canon, gc, sizeof gc / sizeof gc[0]);
    for (size_t i = 0; i < m && n < max; i++) {
      fm_candidate k = from_gemm(gc[i]);
      if (memcmp(&k, &def, sizeof k) != 0) out[n++] = k;
    }
  }
  return n;
}

int fm_codegen_generate(const fm_fragment *canon, const fm_candidate *c, uint32_t sm_count,
                        char **src, fm_kernel_meta *meta, fm_diag *d) {
  if (!c) return fm_diag_set(d, FM_EINVAL, "codegen: NULL candidate");
  switch (c->tmpl) {
    case FM_TMPL_POINTWISE: {
      fm_pw_config pw = to_pw(c);
      return fm_codegen_pointwise(canon, &pw, sm_count, src, meta, d);
    }
    case FM_TMPL_ROWS: {
      fm_rows_config rc = to_rows(c);
      return fm_codegen_rows(canon, &rc, sm_count, src, meta, d);
    }
    case FM_TMPL_COLS: {
      fm_cols_config cc = to_cols(c);
      return fm_codegen_cols(canon, &cc, sm_count, src, meta, d);
    }
    case FM_TMPL_GEMM: {
      fm_gemm_config gc = to_gemm(c);
      return fm_codegen_gemm(canon, &gc, sm_count, src, meta, d);
    }
    case FM_TMPL_SKINNY: {
      fm_skinny_config sc = to_skinny(c);
      return fm_codegen_skinny(canon, &sc, sm_count, src, meta, d);
    }
    case FM_TMPL_CUBLASLT: return fm_codegen_blas(canon, c->p[0], sm_count, src, meta, d);
    case FM_TMPL_B2B: {
      fm_b2b_config bc = to_b2b(c);
      return fm_codegen_b2b(canon, &bc, sm_count, src, meta, d);
    }
    default: break;
  }
  return fm_diag_set(d, FM_EUNSUPPORTED, "unknown kernel template %d", (int)c->tmpl);
}

int fm_candidate_runs_on(const fm_candidate *c, const char *arch) {
  /* the wgmma mainloops, and row tiles or clusters (which only they take), need sm_90a */
  fm_gemm_config gc = c && c->tmpl == FM_TMPL_GEMM ? to_gemm(c) : (fm_gemm_config){0};
  if (c && ((c->tmpl == FM_TMPL_GEMM && (gc.wgmma || gc.rtiles || gc.cluster)) || c->tmpl == FM_TMPL_B2B))
    return arch && strcmp(arch, "sm_90a") == 0;
  /* thread block clusters: sm_90 and later */
  if (c && ((c->tmpl == FM_TMPL_COLS && to_cols(c).cluster > 1) || (c->tmpl == FM_TMPL_SKINNY && to_skinny(c).split > 1))) {
    int sm = 0;
    return arch && sscanf(arch, "sm_%d", &sm) == 1 && sm >= 90;
  }
  return 1;
}

void fm_candidate_describe(const fm_candidate *c, char *out, size_t cap) {
  switch (c->tmpl) {
    case FM_TMPL_POINTWISE:
      snprintf(out, cap, "pointwise block=%u vec=%u unroll=%u blocks_per_sm=%u", c->p[0], c->p[1], c->p[2],
               c->p[3]);
      return;
    case FM_TMPL_ROWS:
      snprintf(out, cap, "rows %s block=%u vec=%u", c->p[0] == FM_ROWS_BLOCK ? "block-per-row" : "warp-per-row",
               c->p[1], c->p[2]);
      return;
    case FM_TMPL_GEMM:
    {
      fm_gemm_config g = to_gemm(c);
      const fm_gemm_mainloop *ml = fm_cg_gemm_mainloop(g.wgmma);
      char tiles[40] = "";
      if (g.rtiles > 1) snprintf(tiles, sizeof tiles, " tiles=%u", g.rtiles);
      if (g.cluster > 1) snprintf(tiles + strlen(tiles), sizeof tiles - strlen(tiles), " cluster=%u", g.cluster);
      snprintf(out, cap, "gemm %ux%ux%u stages=%u warps=%ux%u raster=%u%s%s", g.bm, g.bn, g.bk, g.stages, g.wm, g.wn,
               g.raster, ml ? ml->describe : "", tiles);
      return;
    }
    case FM_TMPL_CUBLASLT:
      snprintf(out, cap, "cublaslt %s", c->p[0] == FM_BLAS_DIRECT ? "direct" : "split epilogue");
      return;
    case FM_TMPL_B2B:
      snprintf(out, cap, "b2b bm=%u%s", c->p[0],
               c->p[1] == FM_B2B_TMA_PAIR ? " tma cluster=2" : c->p[1] == FM_B2B_TMA ? " tma" : "");
      return;
    case FM_TMPL_COLS:
      snprintf(out, cap, "cols width=%u cluster=%u vec=%u unroll=%u block=%u", c->p[0], c->p[1], c->p[2], c->p[3],
               c->p[4]);
      return;
    case FM_TMPL_SKINNY:
      snprintf(out, cap, "skinny cols=%u warps=%u unroll=%u pipe=%u%s", c->p[0], c->p[1], c->p[2], c->p[3],
               c->p[4] == 2 ? " split=2" : c->p[4] == 4 ? " split=4" : c->p[4] > 1 ? " split=?" : "");
      return;
    default: snprintf(out, cap, "%s", fm_template_name(c->tmpl)); return;
  }
}
