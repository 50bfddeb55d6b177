/* fm_codegen_scatter.c: the scatter template (vocabulary 8, `index_add`; fm_fragment.h):
 * src [M, D] rows added at rows index[m] of an f32 [R, D] output by atomic adds.
 *
 * A thread takes `vec` consecutive elements of one src row (one 4-16 byte load where src's
 * rows are contiguous and aligned for it), reads that row's index, stops the kernel (trap)
 * for an index outside [0, R), and adds the elements into the output with atomic adds (REDs:
 * nothing is read back), 2 or 4 floats at once on sm_90 and later. Measured on an H200 (the
 * MoE gradient, bf16 [8192, 1024] into [4096, 1024]): four elements a thread, one 16-byte
 * add, 0.022 ms (ATen's scatter_add_ of the same rows cast to f32: 0.033); one element a
 * thread 0.029; eight added one by one 0.098 (a warp's scalar adds to 32 consecutive floats
 * are one request; eight apart, eight). A grid-stride loop over the M * D / vec units; every size
 * and stride is a constant of the canonical fragment, so the unit's row and column come from
 * a division by a constant. Atomics make the sums' order the hardware's: Inductor's and
 * torch's CUDA index_add_ are not reproducible either, and the verifier compares to 1e-4. */
#include <stdio.h>
#include <string.h>

#include "fm_codegen_int.h"

#define SCATTER_MAX_SOURCE  (64u << 10)
#define SCATTER_DEFAULT_SMS 132u /* H100 SXM: sizes the grid cap when the caller has no GPU */
#define SCATTER_BLOCKS_SM   8u   /* grid cap: blocks per SM (a grid-stride loop past it) */

typedef struct scatter_gen {
  const fm_tensor *src, *index, *out;
  uint32_t is, ix; /* input positions of src and index */
  int64_t m, dcols, r;
} scatter_gen;

static int gen_of(const fm_fragment *canon, scatter_gen *g, fm_diag *d) {
  if (fm_fragment_scatter_inputs(canon, &g->is, &g->ix))
    return fm_diag_set(d, FM_EUNSUPPORTED, "scatter template: not a scatter fragment");
  g->src = &canon->inputs[g->is];
  g->index = &canon->inputs[g->ix];
  g->out = &canon->outputs[0];
  g->m = g->src->shape[0];
  g->dcols = g->src->shape[1];
  g->r = g->out->shape[0];
  return FM_OK;
}

/* The widest legal vector of src elements (a power of two, at most 16 bytes): D a multiple of
 * it, src's rows contiguous, each row start and the base aligned to it. */
static uint32_t widest_vec(const scatter_gen *g) {
  const size_t es = fm_dtype_size(g->src->dtype);
  const int64_t s0 = g->m > 1 ? g->src->strides[0] : 0, s1 = g->dcols > 1 ? g->src->strides[1] : 1;
  uint32_t v = (uint32_t)(16 / es);
  while (v > 1 && (s1 != 1 || g->dcols % v || s0 % v || g->src->align < v * es)) v /= 2;
  return v;
}

static int check_config(const fm_scatter_config *c, const scatter_gen *g, fm_diag *d) {
  if (c->block < 32 || c->block > 1024 || c->block % 32)
    return fm_diag_set(d, FM_EINVAL, "config: block %u is not a multiple of 32 in 32..1024", c->block);
  if (c->vec < 1 || c->vec > 16 || (c->vec & (c->vec - 1)))
    return fm_diag_set(d, FM_EINVAL, "config: vec %u is not a power of two in 1..16", c->vec);
  if (c->vec > widest_vec(g))
    return fm_diag_set(d, FM_EUNSUPPORTED, "config: vec %u is wider than src's rows allow (%u)", c->vec, widest_vec(g));
  return FM_OK;
}

static void emit_kernel(fm_strbuf *sb, const scatter_gen *g, const fm_scatter_config *c, const char *entry) {
  const char *st = fm_cg_storage_type(g->src->dtype);
  const char *load = g->src->dtype == FM_DT_BF16 ? "fm_bf16_to_f32" : g->src->dtype == FM_DT_F16 ? "fm_f16_to_f32" : "";
  const size_t es = fm_dtype_size(g->src->dtype);
  const int64_t s0 = g->m > 1 ? g->src->strides[0] : 0, s1 = g->dcols > 1 ? g->src->strides[1] : 0;
  const int64_t xs = g->m > 1 ? g->index->strides[0] : 0;
  const int64_t units = g->dcols / c->vec;
  fm_strbuf_printf(sb,
                   "/* ---- the kernel: out[index[m], d] += src[m, d], M %lld, D %lld, R %lld ---- */\n"
                   "struct __align__(%zu) fm_src_vec { %s e[%u]; };\n"
                   "extern \"C\" __global__ void __launch_bounds__(%u) %s(\n",
                   (long long)g->m, (long long)g->dcols, (long long)g->r, c->vec * es, st, c->vec, c->block, entry);
  for (uint32_t k = 0; k < 2; k++)
    fm_strbuf_printf(sb, "    const %s *__restrict__ in%u,\n", k == g->is ? st : "long long", k);
  fm_strbuf_printf(sb,
                   "    float *__restrict__ out0, long long outer) {\n"
                   "  (void)outer;\n"
                   "  const %s *__restrict__ src = in%u;\n"
                   "  const long long *__restrict__ index = in%u;\n"
                   "  const long long n = %lldll * %lldll;\n"
                   "  for (long long u = (long long)blockIdx.x * %u + threadIdx.x; u < n;\n"
                   "       u += (long long)gridDim.x * %u) {\n"
                   "    const long long m = u / %lldll, d = (u - m * %lldll) * %u;\n"
                   "    const long long r = index[m * %lldll];\n"
                   "    if (r < 0 || r >= %lldll) __trap(); /* torch's device-side assert */\n"
                   "    float *row = out0 + r * %lldll + d;\n",
                   st, g->is, g->ix, (long long)g->m, (long long)units, c->block, c->block, (long long)units,
                   (long long)units, c->vec, (long long)xs, (long long)g->r, (long long)g->dcols);
  if (c->vec > 1) {
    fm_strbuf_printf(sb, "    const fm_src_vec v = *reinterpret_cast<const fm_src_vec *>(src + m * %lldll + d);\n",
                     (long long)s0);
    /* sm_90's vector atomics add 2 or 4 floats at once (a warp's 16-byte adds cover 512
       contiguous bytes); elsewhere, or with an output not aligned for them, one by one */
    const uint32_t w = c->vec >= 4 ? 4 : 2;
    if (g->out->align >= w * 4) {
      fm_strbuf_printf(sb,
                       "#if __CUDA_ARCH__ >= 900\n"
                       "#pragma unroll\n"
                       "    for (int q = 0; q < %u; q++)\n"
                       "      atomicAdd(reinterpret_cast<float%u *>(row) + q, make_float%u(",
                       c->vec / w, w, w);
      for (uint32_t e = 0; e < w; e++) fm_strbuf_printf(sb, "%s%s(v.e[q * %u + %u])", e ? ", " : "", load, w, e);
      fm_strbuf_append(sb, "));\n#else\n");
    }
    fm_strbuf_printf(sb,
                     "#pragma unroll\n"
                     "    for (int e = 0; e < %u; e++) atomicAdd(row + e, %s(v.e[e]));\n",
                     c->vec, load);
    if (g->out->align >= w * 4) fm_strbuf_append(sb, "#endif\n");
  } else
    fm_strbuf_printf(sb, "    atomicAdd(row, %s(src[m * %lldll + d * %lldll]));\n", load, (long long)s0, (long long)s1);
  fm_strbuf_append(sb, "  }\n}\n");
}

int fm_codegen_scatter(const fm_fragment *canon, const fm_scatter_config *cfg, uint32_t sm_count, char **src,
                       fm_kernel_meta *meta, fm_diag *d) {
  if (!canon || !cfg || !src || !meta) return fm_diag_set(d, FM_EINVAL, "codegen: NULL argument");
  *src = NULL;
  scatter_gen g;
  int rc = gen_of(canon, &g, d);
  if (rc || (rc = check_config(cfg, &g, d))) return rc;
  char entry[FM_META_ENTRY_MAX];
  snprintf(entry, sizeof entry, "fm_scatter_v%d", FM_CODEGEN_VERSION);
  fm_strbuf sb;
  fm_strbuf_init(&sb, SCATTER_MAX_SOURCE);
  fm_strbuf_printf(&sb,
                   "/* fusemld codegen v%d: scatter kernel (index_add), block %u, vec %u.\n"
                   " * Generated from a canonical fragment: every name and number below comes from its\n"
                   " * typed fields. One self-contained translation unit (NVRTC has no include path). */\n",
                   FM_CODEGEN_VERSION, cfg->block, cfg->vec);
  fm_cg_emit_prelude(&sb, fm_cg_fast_math(canon));
  emit_kernel(&sb, &g, cfg, entry);
  if (fm_strbuf_error(&sb)) {
    rc = fm_diag_set(d, FM_ECODEGEN, "codegen: source buffer: %s", fm_strerror(fm_strbuf_error(&sb)));
    fm_strbuf_free(&sb);
    return rc;
  }
  memset(meta, 0, sizeof *meta);
  snprintf(meta->kind, sizeof meta->kind, "pointwise");
  snprintf(meta->entry, sizeof meta->entry, "%s", entry);
  meta->block[0] = cfg->block;
  meta->block[1] = meta->block[2] = 1;
  snprintf(meta->grid_rule, sizeof meta->grid_rule, "elementwise");
  meta->inner = (uint64_t)g.dcols;
  meta->items_per_block = (uint64_t)cfg->block * cfg->vec;
  meta->max_blocks = SCATTER_BLOCKS_SM * (sm_count ? sm_count : SCATTER_DEFAULT_SMS);
  meta->outer = g.m;
  meta->n_inputs = 2;
  meta->n_outputs = 1;
  *src = fm_strbuf_take(&sb);
  fm_strbuf_free(&sb);
  return *src ? FM_OK : fm_diag_set(d, FM_ENOMEM, "codegen: out of memory");
}

fm_scatter_config fm_codegen_scatter_default(const fm_fragment *canon) {
  scatter_gen g;
  fm_scatter_config c = {.block = 256, .vec = 1};
  /* four elements a thread: one 16-byte vector atomic of f32 sums (the fastest measured) */
  if (canon && gen_of(canon, &g, NULL) == FM_OK) c.vec = widest_vec(&g) < 4 ? widest_vec(&g) : 4;
  return c;
}

size_t fm_codegen_scatter_candidates(const fm_fragment *canon, fm_scatter_config *out, size_t max) {
  static const uint32_t blocks[] = {128, 256, 512};
  scatter_gen g;
  size_t n = 0;
  if (!canon || gen_of(canon, &g, NULL) != FM_OK) return 0;
  const uint32_t wide = widest_vec(&g);
  const uint32_t vecs[] = {wide, wide > 2 ? wide / 2 : 1, 1}; /* the widest, half of it, scalar */
  for (size_t b = 0; b < sizeof blocks / sizeof blocks[0]; b++)
    for (size_t v = 0; v < sizeof vecs / sizeof vecs[0] && n < max; v++)
      if (v == 0 || vecs[v] != vecs[v - 1]) out[n++] = (fm_scatter_config){.block = blocks[b], .vec = vecs[v]};
  return n;
}
