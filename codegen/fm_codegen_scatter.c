/* fm_codegen_scatter.c: the scatter template (vocabulary 8, `index_add`; fm_fragment.h):
 * src [M, D] rows added at rows index[m] of an f32 [R, D] output by atomic adds.
 *
 * A unit is `vec` elements of src: consecutive ones of one row (lanes along D, one 4-16 byte
 * load where src's rows are contiguous and aligned for it) or, for a src laid out column by
 * column, consecutive rows of one column (lanes along M: a warp's loads cover contiguous
 * bytes where lanes along D would take 2 of each 32-byte sector). A thread reads each row's
 * index, stops the kernel (trap) for one outside [0, R), and adds its elements with atomic
 * adds (REDs: nothing is read back), 2 or 4 floats at once on sm_90 and later; along M it adds
 * the run of elements whose rows share an index as one. Measured on an H200 (the MoE
 * gradient, bf16 [8192, 1024] into [4096, 1024]): four elements a thread, one 16-byte add,
 * 0.022 ms (ATen's scatter_add_ of the same rows cast to f32: 0.033); one element a thread
 * 0.029; eight added one by one 0.098 (a warp's scalar adds to 32 consecutive floats are one
 * request; eight apart, eight).
 *
 * Where R x D floats fit a block's shared memory (`table`), each block adds into its own copy
 * of the output, zeroed first, and adds that copy's non-zero sums to the output once at its
 * end, the grid capped near the SM count: a histogram. Adds to one output row from many src
 * rows serialise at the memory (T5's relative position bias: 8192 ids a row into 32 rows,
 * 90 us a table as global atomics), where the shared copies spread them over the SMs.
 *
 * A grid-stride loop over the M * D / vec units; every size and stride is a constant of the
 * canonical fragment, so a unit's row and column come from a division by a constant. Atomics
 * make the sums' order the hardware's: Inductor's and torch's CUDA index_add_ are not
 * reproducible either, and the verifier compares to 1e-4. */
#include <stdio.h>
#include <string.h>

#include "fm_codegen_int.h"

#define SCATTER_MAX_SOURCE  (64u << 10)
#define SCATTER_DEFAULT_SMS 132u /* H100 SXM: sizes the grid cap when the caller has no GPU */
#define SCATTER_BLOCKS_SM   8u   /* grid cap: blocks per SM (a grid-stride loop past it) */
/* A shared table's limits: its bytes (four 16 KB blocks still fit an SM beside L1), and the
 * blocks an SM runs (each flushes its table once: fewer blocks, fewer global adds) */
#define SCATTER_TABLE_BYTES     (16u << 10)
#define SCATTER_TABLE_BLOCKS_SM 2u
/* The default adds through a shared table where output rows take this many src rows each on
 * average (the contention the table removes; embedding_grad.py's MAX_IDS_PER_ROW) */
#define SCATTER_TABLE_ROWS_PER_ROW 16

typedef struct scatter_gen {
  const fm_tensor *src, *index, *out;
  uint32_t is, ix; /* input positions of src and index */
  int64_t m, dcols, r;
  int64_t s0, s1, xs; /* src's and index's strides, 0 along a dim of one */
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
  g->s0 = g->m > 1 ? g->src->strides[0] : 0;
  g->s1 = g->dcols > 1 ? g->src->strides[1] : 0;
  g->xs = g->m > 1 ? g->index->strides[0] : 0;
  return FM_OK;
}

/* The widest legal vector of src elements along D (lanes_m 0) or M (lanes_m 1): a power of
 * two, at most 16 bytes, the dim it runs along a multiple of it and contiguous, the other
 * dim's stride and the base aligned to it. */
static uint32_t widest_vec(const scatter_gen *g, uint32_t lanes_m) {
  const size_t es = fm_dtype_size(g->src->dtype);
  const int64_t along = lanes_m ? g->m : g->dcols, step = lanes_m ? g->s0 : g->s1, other = lanes_m ? g->s1 : g->s0;
  const int64_t unit_step = along > 1 ? step : 1;
  uint32_t v = (uint32_t)(16 / es);
  while (v > 1 && (unit_step != 1 || along % v || other % v || g->src->align < v * es)) v /= 2;
  return v;
}

static int table_fits(const scatter_gen *g) {
  return g->r * g->dcols <= (int64_t)(SCATTER_TABLE_BYTES / sizeof(float));
}

static int check_config(const fm_scatter_config *c, const scatter_gen *g, fm_diag *d) {
  if (c->block < 32 || c->block > 1024 || c->block % 32)
    return fm_diag_set(d, FM_EINVAL, "config: block %u is not a multiple of 32 in 32..1024", c->block);
  if (c->vec < 1 || c->vec > 16 || (c->vec & (c->vec - 1)))
    return fm_diag_set(d, FM_EINVAL, "config: vec %u is not a power of two in 1..16", c->vec);
  if (c->table > 1 || c->lanes_m > 1)
    return fm_diag_set(d, FM_EINVAL, "config: table %u and lanes_m %u are flags (0 or 1)", c->table, c->lanes_m);
  if (c->vec > widest_vec(g, c->lanes_m))
    return fm_diag_set(d, FM_EUNSUPPORTED, "config: vec %u is wider than src's %s allow (%u)", c->vec,
                       c->lanes_m ? "columns" : "rows", widest_vec(g, c->lanes_m));
  if (c->table && !table_fits(g))
    return fm_diag_set(d, FM_EUNSUPPORTED, "config: a [%lld, %lld] f32 table is over %u bytes of shared memory",
                       (long long)g->r, (long long)g->dcols, SCATTER_TABLE_BYTES);
  return FM_OK;
}

/* The unit loop's head: u's first src element (m, d), its load into v (vec > 1) and the
 * index of row m in r. */
static void emit_unit_head(fm_strbuf *sb, const scatter_gen *g, const fm_scatter_config *c) {
  const int64_t n = g->m * g->dcols / c->vec, per = c->lanes_m ? g->m / c->vec : g->dcols / c->vec;
  fm_strbuf_printf(sb,
                   "  for (long long u = (long long)blockIdx.x * %u + threadIdx.x; u < %lldll;\n"
                   "       u += (long long)gridDim.x * %u) {\n",
                   c->block, (long long)n, c->block);
  if (c->lanes_m)
    fm_strbuf_printf(sb, "    const long long d = u / %lldll, m = (u - d * %lldll) * %u;\n", (long long)per,
                     (long long)per, c->vec);
  else
    fm_strbuf_printf(sb, "    const long long m = u / %lldll, d = (u - m * %lldll) * %u;\n", (long long)per,
                     (long long)per, c->vec);
  if (c->vec > 1)
    fm_strbuf_printf(sb,
                     "    const fm_src_vec v = *reinterpret_cast<const fm_src_vec *>(src + m * %lldll + d * %lldll);\n",
                     (long long)g->s0, (long long)g->s1);
  fm_strbuf_printf(sb,
                   "    long long r = index[m * %lldll];\n"
                   "    if (r < 0 || r >= %lldll) __trap(); /* torch's device-side assert */\n",
                   (long long)g->xs, (long long)g->r);
}

/* Lanes along D: the unit's elements added to row r of `sums` (the output or the table). */
static void emit_row_adds(fm_strbuf *sb, const scatter_gen *g, const fm_scatter_config *c, const char *load) {
  fm_strbuf_printf(sb, "    float *row = sums + r * %lldll + d;\n", (long long)g->dcols);
  if (c->vec == 1) {
    fm_strbuf_printf(sb, "    atomicAdd(row, %s(src[m * %lldll + d * %lldll]));\n", load, (long long)g->s0,
                     (long long)g->s1);
    return;
  }
  /* sm_90's vector atomics add 2 or 4 floats at once to global memory (a warp's 16-byte adds
     cover 512 contiguous bytes); elsewhere, into shared memory, or with an output not aligned
     for them, one by one */
  const uint32_t w = c->vec >= 4 ? 4 : 2, vector_adds = !c->table && g->out->align >= w * 4;
  if (vector_adds) {
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
  if (vector_adds) fm_strbuf_append(sb, "#endif\n");
}

/* Lanes along M: the unit's rows m..m+vec-1 of column d, each run of rows with one index
 * summed in a register and added once (a run ends where the next row's index differs). */
static void emit_column_adds(fm_strbuf *sb, const scatter_gen *g, const fm_scatter_config *c, const char *load) {
  if (c->vec == 1) {
    fm_strbuf_printf(sb, "    atomicAdd(sums + r * %lldll + d, %s(src[m * %lldll + d * %lldll]));\n",
                     (long long)g->dcols, load, (long long)g->s0, (long long)g->s1);
    return;
  }
  fm_strbuf_printf(sb,
                   "    float run = %s(v.e[0]);\n"
                   "#pragma unroll\n"
                   "    for (int e = 1; e < %u; e++) {\n"
                   "      const long long next = index[(m + e) * %lldll];\n"
                   "      if (next < 0 || next >= %lldll) __trap();\n"
                   "      if (next != r) {\n"
                   "        atomicAdd(sums + r * %lldll + d, run);\n"
                   "        r = next;\n"
                   "        run = 0.0f;\n"
                   "      }\n"
                   "      run += %s(v.e[e]);\n"
                   "    }\n"
                   "    atomicAdd(sums + r * %lldll + d, run);\n",
                   load, c->vec, (long long)g->xs, (long long)g->r, (long long)g->dcols, load, (long long)g->dcols);
}

static void emit_kernel(fm_strbuf *sb, const scatter_gen *g, const fm_scatter_config *c, const char *entry) {
  const char *st = fm_cg_storage_type(g->src->dtype);
  const char *load = g->src->dtype == FM_DT_BF16 ? "fm_bf16_to_f32" : g->src->dtype == FM_DT_F16 ? "fm_f16_to_f32" : "";
  const size_t es = fm_dtype_size(g->src->dtype);
  const long long cells = (long long)(g->r * g->dcols);
  fm_strbuf_printf(sb,
                   "/* ---- the kernel: out[index[m], d] += src[m, d], M %lld, D %lld, R %lld%s ---- */\n"
                   "struct __align__(%zu) fm_src_vec { %s e[%u]; };\n"
                   "extern \"C\" __global__ void __launch_bounds__(%u) %s(\n",
                   (long long)g->m, (long long)g->dcols, (long long)g->r,
                   c->table ? ", through a table in shared memory" : "", c->vec * es, st, c->vec, c->block, entry);
  for (uint32_t k = 0; k < 2; k++)
    fm_strbuf_printf(sb, "    const %s *__restrict__ in%u,\n", k == g->is ? st : "long long", k);
  fm_strbuf_printf(sb,
                   "    float *__restrict__ out0, long long outer) {\n"
                   "  (void)outer;\n"
                   "  const %s *__restrict__ src = in%u;\n"
                   "  const long long *__restrict__ index = in%u;\n",
                   st, g->is, g->ix);
  if (c->table)
    fm_strbuf_printf(sb,
                     "  __shared__ float sums[%lld];\n"
                     "  for (int i = threadIdx.x; i < %lld; i += %u) sums[i] = 0.0f;\n"
                     "  __syncthreads();\n",
                     cells, cells, c->block);
  else
    fm_strbuf_append(sb, "  float *sums = out0;\n");
  emit_unit_head(sb, g, c);
  if (c->lanes_m)
    emit_column_adds(sb, g, c, load);
  else
    emit_row_adds(sb, g, c, load);
  fm_strbuf_append(sb, "  }\n");
  if (c->table) /* this block's sums into the output, the cells it never added to skipped */
    fm_strbuf_printf(sb,
                     "  __syncthreads();\n"
                     "  for (int i = threadIdx.x; i < %lld; i += %u)\n"
                     "    if (sums[i] != 0.0f) atomicAdd(out0 + i, sums[i]);\n",
                     cells, c->block);
  fm_strbuf_append(sb, "}\n");
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
                   "/* fusemld codegen v%d: scatter kernel (index_add), block %u, vec %u%s%s.\n"
                   " * Generated from a canonical fragment: every name and number below comes from its\n"
                   " * typed fields. One self-contained translation unit (NVRTC has no include path). */\n",
                   FM_CODEGEN_VERSION, cfg->block, cfg->vec, cfg->lanes_m ? ", lanes along M" : "",
                   cfg->table ? ", shared table" : "");
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
  meta->max_blocks = (cfg->table ? SCATTER_TABLE_BLOCKS_SM : SCATTER_BLOCKS_SM) * (sm_count ? sm_count : SCATTER_DEFAULT_SMS);
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
  if (!canon || gen_of(canon, &g, NULL) != FM_OK) return c;
  /* many src rows an output row: a shared table, lanes along M where src's rows are its
     columns' contiguous steps (the widest vector along them); else four elements a thread
     along D, one 16-byte vector atomic of f32 sums (the fastest measured) */
  c.table = table_fits(&g) && g.m >= SCATTER_TABLE_ROWS_PER_ROW * g.r;
  c.lanes_m = c.table && g.dcols > 1 && g.s0 == 1;
  const uint32_t wide = widest_vec(&g, c.lanes_m);
  c.vec = c.lanes_m || wide < 4 ? wide : 4;
  return c;
}

size_t fm_codegen_scatter_candidates(const fm_fragment *canon, fm_scatter_config *out, size_t max) {
  static const uint32_t blocks[] = {128, 256, 512};
  scatter_gen g;
  size_t n = 0;
  if (!canon || gen_of(canon, &g, NULL) != FM_OK) return 0;
  const uint32_t wide = widest_vec(&g, 0);
  const uint32_t vecs[] = {wide, wide > 2 ? wide / 2 : 1, 1}; /* the widest, half of it, scalar */
  for (size_t b = 0; b < sizeof blocks / sizeof blocks[0]; b++)
    for (size_t v = 0; v < sizeof vecs / sizeof vecs[0] && n < max; v++)
      if (v == 0 || vecs[v] != vecs[v - 1]) out[n++] = (fm_scatter_config){.block = blocks[b], .vec = vecs[v]};
  /* a src whose columns are contiguous: lanes along M, the widest vector along them, through
     the output and through a table; a table that fits: lanes along D too */
  const int column_major = g.m > 1 && g.s0 == 1;
  for (size_t b = 1; b < sizeof blocks / sizeof blocks[0]; b++) {
    for (uint32_t table = 0; table <= (uint32_t)table_fits(&g); table++)
      if (column_major && n < max)
        out[n++] = (fm_scatter_config){.block = blocks[b], .vec = widest_vec(&g, 1), .table = table, .lanes_m = 1};
    if (table_fits(&g) && n < max) out[n++] = (fm_scatter_config){.block = blocks[b], .vec = wide, .table = 1};
  }
  return n;
}
