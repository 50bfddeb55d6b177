/* fm_codegen_gemm_epilogue.c: the gemm family's generated epilogue: fm_epilogue (the
 * fragment's pointwise ops on 8 fp32 accumulators of a row, each output stored once, 16 bytes
 * at a time where aligned) and the tile epilogues that stage a warp's accumulators through its
 * shared-memory slab and call it (one product, or siblings' two). Used by the gemm template
 * and, fm_epilogue alone, by skinny and the cuBLASLt split form. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen_gemm.h"

/* The start of "raw element -> value" (the caller writes the element and the close). */
static void emit_decode_open(fm_strbuf *sb, fm_dtype dt) {
  switch (dt) {
    case FM_DT_BOOL:
      fm_strbuf_append(sb, "(");
      return;
    case FM_DT_F16:
      fm_strbuf_append(sb, "fm_f16_to_f32(");
      return;
    case FM_DT_BF16:
      fm_strbuf_append(sb, "fm_bf16_to_f32(");
      return;
    default:
      return;
  }
}

static void emit_encode(fm_strbuf *sb, fm_dtype dt, fm_dtype vdt, uint32_t pos) {
  char a[48];
  if (vdt == FM_DT_BOOL && dt != FM_DT_BOOL)
    snprintf(a, sizeof a, "(v%u ? 1.0f : 0.0f)", pos);
  else if (vdt != FM_DT_BOOL && dt == FM_DT_BOOL)
    snprintf(a, sizeof a, "(v%u != 0.0f)", pos);
  else
    snprintf(a, sizeof a, "v%u", pos);
  switch (dt) {
    case FM_DT_BOOL:
      fm_strbuf_printf(sb, "(unsigned char)%s", a);
      return;
    case FM_DT_F16:
      fm_strbuf_printf(sb, "fm_f32_to_f16(%s)", a);
      return;
    case FM_DT_BF16:
      fm_strbuf_printf(sb, "fm_f32_to_bf16(%s)", a);
      return;
    default:
      fm_strbuf_append(sb, a);
      return;
  }
}

/* "m * 1024LL + (n + e) * 1LL" for tensor k, column expression nx (a broadcast dim
 * contributes nothing). */
static void emit_offset(fm_strbuf *sb, const fm_cg_gemm_plan *gp, uint32_t k, const char *nx) {
  int any = 0;
  for (uint32_t j = 0; j < 2; j++) {
    int64_t s = gp->es[k][j];
    if (!s) continue;
    fm_strbuf_printf(sb, "%s%s * %" PRId64 "LL", any ? " + " : "", j ? nx : "m", s);
    any = 1;
  }
  if (!any) fm_strbuf_append(sb, "0");
}

/* Tensor k's 8 elements (n .. n+7 of row m) move as 16-byte accesses when they are
 * contiguous, every row starts on a 16-byte boundary and the element is 2 or 4 bytes
 * (n is a multiple of 8, so the first element is aligned too). */
static int vector_ok(const fm_cg_gemm_plan *gp, uint32_t k) {
  fm_dtype dt = gp->base.t[k].dtype;
  size_t es = fm_dtype_size(dt);
  if (dt == FM_DT_BOOL || (es != 2 && es != 4)) return 0;
  return gp->es[k][1] == 1 && gp->es[k][0] % (int64_t)(16 / es) == 0 && gp->ez[k] % (int64_t)(16 / es) == 0 &&
         gp->base.t[k].align >= 16;
}

/* The epilogue parameter list after (acc, m, n): used inputs, then outputs. */
void fm_cg_gemm_emit_epi_params(fm_strbuf *sb, const fm_cg_gemm_plan *gp, int decl) {
  const fm_cg_plan *p = &gp->base;
  for (uint32_t k = 0; k < p->n_in; k++) {
    if (!gp->used[k]) continue;
    if (decl)
      fm_strbuf_printf(sb, ",\n    const %s *__restrict__ in%u", fm_cg_storage_type(p->t[k].dtype), k);
    else
      fm_strbuf_printf(sb, ", in%u", k);
  }
  for (uint32_t k = 0; k < p->n_out; k++) {
    if (decl)
      fm_strbuf_printf(sb, ",\n    %s *__restrict__ out%u", fm_cg_storage_type(p->t[p->n_in + k].dtype), k);
    else
      fm_strbuf_printf(sb, ", out%u", k);
  }
}

/* Input k is a row vector over the columns (a bias) of 16-bit elements whose 8 move as one
 * 16-byte load: the ping-pong kernel reads a lane's 8 before its mainloop (pre<k>). */
int fm_cg_gemm_row_vector16(const fm_cg_gemm_plan *gp, uint32_t k) {
  return gp->used[k] && gp->es[k][0] == 0 && gp->es[k][1] == 1 && vector_ok(gp, k) &&
         fm_dtype_size(gp->base.t[k].dtype) == 2;
}

/* Raw elements of used input k into r<k>[8] (columns past N read nothing). */
static void emit_epi_load(fm_strbuf *sb, const fm_cg_gemm_plan *gp, uint32_t k) {
  const char *st = fm_cg_storage_type(gp->base.t[k].dtype);
  size_t es = fm_dtype_size(gp->base.t[k].dtype);
  if (gp->es[k][1] == 0) { /* one value for the whole row piece */
    fm_strbuf_printf(sb, "  const %s r%u = in%u[", st, k, k);
    emit_offset(sb, gp, k, "n");
    fm_strbuf_append(sb, "];\n");
    return;
  }
  fm_strbuf_printf(sb, "  __align__(16) %s r%u[8];\n", st, k);
  if (vector_ok(gp, k)) {
    fm_strbuf_append(sb, "  if (full) {\n");
    for (size_t v = 0; v < es / 2; v++) {
      fm_strbuf_printf(sb, "    ((uint4 *)r%u)[%zu] = ", k, v);
      if (fm_cg_gemm_row_vector16(gp, k)) fm_strbuf_printf(sb, "pre%u ? *pre%u : ", k, k);
      fm_strbuf_printf(sb, "*(const uint4 *)(in%u + ", k);
      emit_offset(sb, gp, k, "n");
      fm_strbuf_printf(sb, " + %zu);\n", v * 16 / es);
    }
    fm_strbuf_append(sb, "  } else {\n");
  }
  fm_strbuf_append(sb, "#pragma unroll\n  for (int e = 0; e < 8; e++)\n");
  fm_strbuf_printf(sb, "    r%u[e] = n + e < FM_N ? in%u[", k, k);
  emit_offset(sb, gp, k, "(n + e)");
  fm_strbuf_printf(sb, "] : (%s)0;\n", st);
  if (vector_ok(gp, k)) fm_strbuf_append(sb, "  }\n");
}

void fm_cg_emit_st16_words(fm_strbuf *sb, uint32_t k, size_t es, size_t v) {
  for (size_t w = 0; w < 4; w++) {
    size_t e = v * 16 / es + w * 4 / es;
    if (es == 2)
      fm_strbuf_printf(sb, ", (unsigned)o%u[%zu] | (unsigned)o%u[%zu] << 16", k, e, k, e + 1);
    else
      fm_strbuf_printf(sb, ", __float_as_uint(o%u[%zu])", k, e);
  }
}

/* o<k>[8] to output k: one 16-byte store per 16 bytes when whole and aligned, else masked. */
static void emit_epi_store(fm_strbuf *sb, const fm_cg_gemm_plan *gp, uint32_t k) {
  uint32_t t = gp->base.n_in + k;
  size_t es = fm_dtype_size(gp->base.t[t].dtype);
  if (vector_ok(gp, t)) {
    fm_strbuf_append(sb, "  if (full) {\n");
    for (size_t v = 0; v < es / 2; v++) {
      fm_strbuf_printf(sb, "    fm_st16(out%u + ", k);
      emit_offset(sb, gp, t, "n");
      fm_strbuf_printf(sb, " + %zu", v * 16 / es);
      fm_cg_emit_st16_words(sb, k, es, v);
      fm_strbuf_append(sb, ");\n");
    }
    fm_strbuf_append(sb, "  } else {\n");
  }
  fm_strbuf_append(sb, "#pragma unroll\n  for (int e = 0; e < 8; e++)\n");
  fm_strbuf_printf(sb, "    if (n + e < FM_N) out%u[", k);
  emit_offset(sb, gp, t, "(n + e)");
  fm_strbuf_printf(sb, "] = o%u[e];\n", k);
  if (vector_ok(gp, t)) fm_strbuf_append(sb, "  }\n");
}

/* For the ping-pong kernel's early bias read (emitted where an input is row_vector16). */
static const char ld_nc16[] =
    "/* 16 bytes through the read-only path; volatile, so it stays where it is written. */\n"
    "__device__ __forceinline__ uint4 fm_ld_nc16(const void *p) {\n"
    "  uint4 r;\n"
    "  asm volatile(\"ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\" : \"=r\"(r.x), \"=r\"(r.y), \"=r\"(r.z), \"=r\"(r.w)\n"
    "               : \"l\"(__cvta_generic_to_global(p)));\n"
    "  return r;\n"
    "}\n";

void fm_cg_gemm_emit_epilogue(fm_strbuf *sb, const fm_fragment *f, const fm_cg_gemm_plan *gp) {
  const fm_cg_plan *p = &gp->base;
  fm_strbuf_append(sb, fm_cg_st16);
  for (uint32_t k = 0; k < p->n_in; k++)
    if (fm_cg_gemm_row_vector16(gp, k)) {
      fm_strbuf_append(sb, ld_nc16);
      break;
    }
  fm_strbuf_append(sb,
                   "/* ---- the epilogue: the fragment's ops on 8 accumulators of one row (columns\n"
                   "   n .. n+7, n a multiple of 8, those past N ignored), each output stored once;\n"
                   "   WHOLE: the caller knows all 8 columns are inside N (no masking compiled in) ---- */\n"
                   "template <bool WHOLE = false>\n"
                   "__device__ __forceinline__ void fm_epilogue(const float (&acc)[8], ");
  /* siblings: the second product's 8 accumulators of the same columns */
  if (gp->op2 >= 0) fm_strbuf_append(sb, "const float (&acc2)[8], ");
  fm_strbuf_append(sb, "const long long m, const long long n");
  fm_cg_gemm_emit_epi_params(sb, gp, 1);
  /* a row vector's 8 elements already loaded by the caller (the ping-pong kernel), if any */
  for (uint32_t k = 0; k < p->n_in; k++)
    if (fm_cg_gemm_row_vector16(gp, k)) fm_strbuf_printf(sb, ",\n    const uint4 *pre%u = nullptr", k);
  fm_strbuf_append(sb, ") {\n  const bool full = WHOLE || n + 8 <= FM_N;\n");
  for (uint32_t k = 0; k < p->n_in; k++)
    if (gp->used[k]) emit_epi_load(sb, gp, k);
  for (uint32_t k = 0; k < p->n_out; k++)
    fm_strbuf_printf(sb, "  __align__(16) %s o%u[8];\n", fm_cg_storage_type(p->t[p->n_in + k].dtype), k);
  fm_strbuf_append(sb, "#pragma unroll\n  for (int e = 0; e < 8; e++) {\n");
  for (uint32_t k = 0; k < p->n_in; k++) {
    if (!gp->used[k]) continue;
    fm_strbuf_printf(sb, "    const %s v%u = ", p->vdt[k] == FM_DT_BOOL ? "bool" : "float", k);
    emit_decode_open(sb, p->vdt[k]);
    fm_strbuf_printf(sb, "r%u%s", k, gp->es[k][1] == 0 ? "" : "[e]");
    fm_strbuf_append(sb, p->vdt[k] == FM_DT_BOOL ? " != 0)" : p->vdt[k] == FM_DT_F32 ? "" : ")");
    fm_strbuf_append(sb, ";\n");
  }
  for (uint32_t i = 0; i < p->n_ops; i++) {
    uint32_t pos = p->n_in + i;
    fm_strbuf_printf(sb, "    const %s v%u = ", p->vdt[pos] == FM_DT_BOOL ? "bool" : "float", pos);
    if ((int)i == gp->op || (int)i == gp->op2) {
      /* the product stays fp32, like every intermediate; addmm adds its bias in fp32 */
      const char *acc = (int)i == gp->op ? "acc" : "acc2";
      if (f->ops[i].nargs == 3) {
        uint32_t b = p->args[i][0];
        if (p->vdt[b] == FM_DT_BOOL)
          fm_strbuf_printf(sb, "(%s[e] + (v%u ? 1.0f : 0.0f))", acc, b);
        else
          fm_strbuf_printf(sb, "(%s[e] + v%u)", acc, b);
      } else {
        fm_strbuf_printf(sb, "%s[e]", acc);
      }
    } else {
      fm_cg_emit_op(sb, f, p, i);
    }
    fm_strbuf_printf(sb, ";  /* %s */\n", fm_op_name(f->ops[i].op));
  }
  for (uint32_t k = 0; k < p->n_out; k++) {
    uint32_t t = p->n_in + k;
    fm_strbuf_printf(sb, "    o%u[e] = ", k);
    emit_encode(sb, p->t[t].dtype, p->vdt[p->t[t].value], p->t[t].value);
    fm_strbuf_append(sb, ";\n");
  }
  fm_strbuf_append(sb, "  }\n");
  for (uint32_t k = 0; k < p->n_out; k++) emit_epi_store(sb, gp, k);
  fm_strbuf_append(sb, "}\n");
}

/* The unroll of a tile epilogue's loop: "" (whole) or 8 (eight 8-column groups a trip). Whole,
 * the loop is thousands of straight-line instructions run once per tile; in the ping-pong
 * form, whose four epilogue warps run beside the other warpgroup's mainloop, they stalled on
 * instruction fetch (ncu, 16384x1024x256: 26% of stall samples "no instruction"), and two
 * groups a trip measured 3-7% faster there; with the shorter GELU of codegen v19, four groups
 * a trip (more independent chains for a warp that runs alone on its scheduler) measured 1-4%
 * faster again at short K, even elsewhere. Where both warpgroups run the epilogue together,
 * the whole loop stayed faster (its later loads are hoisted over earlier math), by 3-8%
 * (bench/NOTES.md, "The tile epilogue rolled"). With the 9-instruction GELU of codegen v28,
 * eight a trip (one trip per 128-column pass, so its indexing is set up once, not twice)
 * measured 3% faster again at 16384 x 1024 x 256 and the same at 16384 x 256 x 1024. */
static const char *epi_unroll(int rolled) { return rolled ? " 8" : ""; }

/* The epilogue of the tile at row m0 (block-uniform): each warp stages its accumulators
 * through its slab, FM_SCOLS columns at a time, and runs fm_epilogue on 8 columns of a row. */
/* The siblings' epilogue (the slab holds all FM_WCOLS columns of the warp, one pass): the
 * first half of the slab's columns are B's products, the second half B2's of the same output
 * columns, which start at n0 / 2 + wn * FM_WCOLS / 2. */
static void emit_sibling_epilogue(fm_strbuf *sb, const fm_cg_gemm_plan *gp, const char *indent, int rolled) {
  fm_strbuf_printf(sb,
                   "%s{\n"
                   "%s  const bool whole = m0 + FM_BM <= M && n0 / 2 + FM_BN / 2 <= FM_N;\n"
                   "#pragma unroll\n"
                   "%s  for (int mt = 0; mt < FM_MT; mt++) {\n"
                   "%s    fm_stage(slab, acc[mt], lane, 0);\n"
                   "%s    __syncwarp();\n"
                   "%s    const long long mw = m0 + FM_WARP_ROW(wm, mt);\n"
                   "%s    const long long nw = n0 / 2 + wn * (FM_WCOLS / 2);\n"
                   "#pragma unroll%s\n"
                   "%s    for (int g = lane; g < FM_WCOLS; g += 32) {   /* 16 rows x FM_WCOLS / 16 */\n"
                   "%s      const int r = g / (FM_WCOLS / 16), c = g %% (FM_WCOLS / 16) * 8;\n"
                   "%s      if (!whole && (mw + r >= M || nw + c >= FM_N)) continue;\n"
                   "%s      float v[8], v2[8];\n"
                   "%s      fm_unstage(v, slab, r, c);\n"
                   "%s      fm_unstage(v2, slab, r, c + FM_WCOLS / 2);\n"
                   "%s      if (whole) fm_epilogue<true>(v, v2, mw + r, nw + c",
                   indent, indent, indent, indent, indent, indent, indent, epi_unroll(rolled), indent, indent, indent,
                   indent, indent, indent, indent);
  fm_cg_gemm_emit_epi_params(sb, gp, 0);
  fm_strbuf_printf(sb, ");\n%s      else fm_epilogue<false>(v, v2, mw + r, nw + c", indent);
  fm_cg_gemm_emit_epi_params(sb, gp, 0);
  fm_strbuf_printf(sb,
                   ");\n"
                   "%s    }\n"
                   "%s    __syncwarp();   /* the slab is rewritten next */\n"
                   "%s  }\n"
                   "%s}\n",
                   indent, indent, indent, indent);
}

void fm_cg_gemm_emit_tile_epilogue(fm_strbuf *sb, const fm_cg_gemm_plan *gp, const char *indent, int rolled) {
  if (gp->op2 >= 0) {
    emit_sibling_epilogue(sb, gp, indent, rolled);
    return;
  }
  fm_strbuf_printf(
      sb,
      "%s{\n"
      "%s  /* A tile wholly inside M and N (all but the edges) runs a branch-free copy of\n"
      "%s     the loop: its loads, independent across iterations, are scheduled ahead\n"
      "%s     of earlier iterations' math instead of one round trip per 8 columns. */\n"
      "%s  const bool whole = m0 + FM_BM <= M && n0 + FM_BN <= FM_N;\n"
      "#pragma unroll\n"
      "%s  for (int mt = 0; mt < FM_MT; mt++) {\n"
      "#pragma unroll\n"
      "%s  for (int pass = 0; pass < FM_WCOLS / FM_SCOLS; pass++) {\n"
      "%s    fm_stage(slab, acc[mt], lane, pass);\n"
      "%s    __syncwarp();\n"
      "%s    const long long mw = m0 + FM_WARP_ROW(wm, mt);\n"
      "%s    const long long nw = n0 + wn * FM_WCOLS + pass * FM_SCOLS;\n"
      "%s    if (whole) {\n"
      "#if 32 %% (FM_SCOLS / 8) == 0\n"
      "%s      /* 16 rows x FM_SCOLS / 8 groups, lane + 32 i each: where FM_SCOLS / 8 divides 32 a\n"
      "%s         lane keeps its 8 columns (c) and steps down the rows by a constant, so its\n"
      "%s         addresses advance by a constant too (with s0 / s1 below: 449 instructions a trip\n"
      "%s         of 32 bias + GELU elements where the per-trip indexing took 497) */\n"
      "%s      const int c = lane %% (FM_SCOLS / 8) * 8, r0 = lane / (FM_SCOLS / 8);\n"
      "%s      /* the slab's swizzle depends on a row's parity, the same on every trip when the\n"
      "%s         rows step by an even number */\n"
      "%s      const int s0 = fm_swz(r0, c), s1 = fm_swz(r0, c + 4), even = (32 / (FM_SCOLS / 8)) %% 2 == 0;\n"
      "#pragma unroll%s\n"
      "%s      for (int i = 0; i < 2 * FM_SCOLS / 32; i++) {\n"
      "%s        const int r = r0 + i * (32 / (FM_SCOLS / 8));\n"
      "%s        float v[8];\n"
      "%s        if (even) {\n"
      "%s          *(float4 *)v = *(const float4 *)(slab + r * FM_SLAB_LD + s0);\n"
      "%s          *(float4 *)(v + 4) = *(const float4 *)(slab + r * FM_SLAB_LD + s1);\n"
      "%s        } else {\n"
      "%s          fm_unstage(v, slab, r, c);\n"
      "%s        }\n"
      "#else\n"
      "#pragma unroll%s\n"
      "%s      for (int i = 0; i < 2 * FM_SCOLS / 32; i++) {\n"
      "%s        const int g = lane + 32 * i, r = g / (FM_SCOLS / 8), c = g %% (FM_SCOLS / 8) * 8;\n"
      "%s        float v[8];\n"
      "%s        fm_unstage(v, slab, r, c);\n"
      "#endif\n"
      "%s        fm_epilogue<true>(v, mw + r, nw + c",
      indent, indent, indent, indent, indent, indent, indent, indent, indent, indent, indent, indent, indent, indent,
      indent, indent, indent, indent, indent, indent, epi_unroll(rolled), indent, indent, indent, indent, indent,
      indent, indent, indent, indent, epi_unroll(rolled), indent, indent, indent, indent, indent);
  fm_cg_gemm_emit_epi_params(sb, gp, 0);
  if (rolled) { /* the ping-pong kernel's biases, read before its mainloop */
    fm_strbuf_append(sb, "\n#if FM_EPI_PRELOAD\n");
    for (uint32_t k = 0; k < gp->base.n_in; k++)
      if (fm_cg_gemm_row_vector16(gp, k)) fm_strbuf_printf(sb, "            , &pre%u\n", k);
    fm_strbuf_append(sb, "#endif\n            ");
  }
  fm_strbuf_printf(sb,
                   ");\n"
                   "%s      }\n"
                   "%s    } else {\n"
                   "#pragma unroll%s\n"
                   "%s      for (int g = lane; g < 2 * FM_SCOLS; g += 32) {   /* the edges */\n"
                   "%s        const int r = g / (FM_SCOLS / 8), c = g %% (FM_SCOLS / 8) * 8;\n"
                   "%s        if (mw + r >= M || nw + c >= FM_N) continue;\n"
                   "%s        float v[8];\n"
                   "%s        fm_unstage(v, slab, r, c);\n"
                   "%s        fm_epilogue<false>(v, mw + r, nw + c",
                   indent, indent, rolled ? " 1" : "", indent, indent, indent, indent, indent, indent);
  fm_cg_gemm_emit_epi_params(sb, gp, 0);
  fm_strbuf_printf(sb,
                   ");\n"
                   "%s      }\n"
                   "%s    }\n"
                   "%s    __syncwarp();   /* the slab is rewritten next */\n"
                   "%s  }\n"
                   "%s  }\n"
                   "%s}\n",
                   indent, indent, indent, indent, indent, indent);
}
