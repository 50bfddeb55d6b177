/* fm_codegen_blas.c: cuBLASLt plans for GEMM fragments (fm_codegen.h): the library competes
 * with the generated kernels, so the tuner never picks something slower than what eager runs.
 *
 * Two forms. Direct: the fragment's epilogue is one cuBLASLt can run itself, so the plan is
 * a single cublasLtMatmul and there is nothing to compile. Split: cuBLASLt writes A@B into a
 * scratch buffer in A's dtype (what eager's addmm writes too), then one generated kernel runs
 * the whole epilogue on it: the same fm_epilogue the gemm template runs on its accumulators,
 * fed 8 columns of a row at a time from the scratch instead. No algorithm is chosen here: the
 * tuner's worker asks cuBLASLt's heuristic, times its first choices and stores the winner. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen.h"
#include "fm_codegen_gemm.h"

#define MAX_SOURCE        (256u * 1024u)
#define EPI_THREADS       256u
#define EPI_BLOCKS_PER_SM 8u
#define DEFAULT_SMS       132u

/* Where a tensor added to the product sits for cuBLASLt: a [1, N] row vector (its BIAS
 * epilogue), an [M, N] row-major matrix (C with beta = 1), or neither. */
typedef enum { ADDEND_NONE, ADDEND_BIAS, ADDEND_C } addend_kind;

/* A row-major [M, N] tensor's leading dim; a stride of 0 is a dim of size 1 (canonical). */
static int64_t row_stride(const fm_tensor *t, int64_t n) { return t->strides[0] ? t->strides[0] : n; }

static addend_kind addend(const fm_fragment *f, const fm_cg_gemm_plan *gp, uint32_t value) {
  if (value >= f->n_inputs) return ADDEND_NONE; /* a computed value: not cuBLASLt's */
  const fm_tensor *t = &f->inputs[value];
  if (t->dtype != gp->dt || t->rank != 2 || t->shape[1] != gp->n) return ADDEND_NONE;
  if (gp->n > 1 && t->strides[1] != 1) return ADDEND_NONE;
  /* one row added to every row: a [1, N] bias, or an [M, N] view of one row (row stride 0,
     an expanded [N]), which is no C: cuBLASLt would read M rows of it */
  if ((t->shape[0] == 1 || t->strides[0] == 0) && gp->m != 1)
    /* the plan promises cuBLASLt a 16-byte aligned bias (gpu/fm_blas.c): a less aligned
       one leaves the epilogue to the split form */
    return t->align >= 16 ? ADDEND_BIAS : ADDEND_NONE;
  /* both symbolic, or the same static M; cuBLASLt takes no C whose rows overlap (ldc < N) */
  if (t->shape[0] == gp->m && row_stride(t, gp->n) >= gp->n) return ADDEND_C;
  return ADDEND_NONE;
}

/* Fills b's addends, activation and output when the fragment is
 *   act?(A@B [+ bias [1, N]] [+ C [M, N]])   (addmm's own bias counts as one of the two)
 * stored once, row-major, in A's dtype, and nothing else is computed: then cuBLASLt runs it
 * all (C is added before the activation in cuBLASLt, as in this chain). 0 when not. */
static int direct_form(const fm_fragment *f, const fm_cg_gemm_plan *gp, fm_meta_blas *b) {
  uint32_t cur = f->n_inputs + (uint32_t)gp->op; /* canonical ids: op i defines n_inputs + i */
  int act = 0;
  b->bias = b->c = -1;
  snprintf(b->act, sizeof b->act, "none");
  if (gp->op != 0 || f->n_outputs != 1) return 0;
  for (uint32_t i = 0; i < f->n_ops; i++) {
    const fm_opnode *o = &f->ops[i];
    uint32_t other;
    if ((int)i == gp->op) {
      if (o->nargs < 3) continue;
      other = o->args[0]; /* addmm's bias */
    } else if (o->op == FM_OP_ADD && o->nargs == 2 && (o->args[0] == cur || o->args[1] == cur) && !act) {
      other = o->args[0] == cur ? o->args[1] : o->args[0];
    } else if ((o->op == FM_OP_RELU || o->op == FM_OP_GELU_TANH) && o->args[0] == cur && !act) {
      act = 1;
      snprintf(b->act, sizeof b->act, "%s", o->op == FM_OP_RELU ? "relu" : "gelu_tanh");
      cur = f->n_inputs + i;
      continue;
    } else {
      return 0;
    }
    switch (addend(f, gp, other)) {
      case ADDEND_BIAS:
        if (b->bias >= 0) return 0;
        b->bias = (int32_t)other;
        break;
      case ADDEND_C:
        if (b->c >= 0) return 0;
        b->c = (int32_t)other;
        b->ldc = (uint64_t)row_stride(&f->inputs[other], gp->n);
        b->align[2] = f->inputs[other].align;
        break;
      default:
        return 0;
    }
    if ((int)i != gp->op) cur = f->n_inputs + i;
  }
  const fm_tensor *out = &f->outputs[0];
  if (out->id != cur || out->dtype != gp->dt || (gp->n > 1 && out->strides[1] != 1)) return 0;
  b->out = 0;
  b->ldd = (uint64_t)row_stride(out, gp->n);
  b->align[3] = out->align;
  return 1;
}

/* cuBLASLt reads an operand as a matrix whose leading dim is at least the contiguous dim's
 * extent. The gemm plan's ld is 0 for a stepped dim of size 1 (never stepped: plan() picks
 * one) but also for a dim expanded from a single row or column (stride 0), and below the
 * extent where rows overlap: neither is a matrix cuBLASLt takes. */
static int bad_operand(const fm_tensor *t, uint32_t kdim, int kmajor, int64_t ld) {
  uint32_t contig = kmajor ? kdim : 1 - kdim;
  const int64_t *shape = t->shape + (t->rank - 2); /* the matrix dims (a bmm's: after the batch) */
  if (shape[1 - contig] == 1) return 0;
  return ld == 0 || (shape[contig] > 0 && ld < shape[contig]);
}

/* The alignment of base + i * stride_bytes for every i, given the base's. */
static uint32_t stride_align(uint32_t base, uint64_t stride_bytes) {
  while (stride_bytes && base > 1 && stride_bytes % base) base /= 2;
  return base;
}

/* The plan both forms share: operands, layouts, sizes; any K, leading dim and alignment (the
 * generated templates' limits do not apply). FM_EUNSUPPORTED where the epilogue cannot run
 * (the split form runs it) or cuBLASLt cannot read an operand. */
static int plan(const fm_fragment *canon, fm_cg_gemm_plan *gp, fm_meta_blas *b, fm_diag *d) {
  int rc = fm_cg_gemm_plan_build_any(canon, gp, d);
  if (rc) return rc;
  if (bad_operand(&canon->inputs[gp->ia], 1, gp->a_kmajor, gp->lda) ||
      bad_operand(&canon->inputs[gp->ib], 0, gp->b_kmajor, gp->ldb))
    return fm_diag_set(d, FM_EUNSUPPORTED, "cuBLASLt: an operand is expanded (stride 0) or its rows overlap");
  memset(b, 0, sizeof *b);
  snprintf(b->dtype, sizeof b->dtype, "%s", gp->dt == FM_DT_BF16 ? "bf16" : "f16");
  b->a = gp->ia;
  b->b = gp->ib;
  b->a_kmajor = (uint32_t)gp->a_kmajor;
  b->b_kmajor = (uint32_t)gp->b_kmajor;
  /* a leading dim of 0 (a dim of size 1, never stepped) becomes the matrix's other extent:
     cuBLASLt wants ld >= the rows of its column-major view */
  b->lda = (uint64_t)(gp->lda ? gp->lda : gp->a_kmajor ? gp->k : (gp->m > 0 ? gp->m : 1));
  b->ldb = (uint64_t)(gp->ldb ? gp->ldb : gp->b_kmajor ? gp->k : gp->n);
  b->m = gp->m;
  b->n = (uint64_t)gp->n;
  b->k = (uint64_t)gp->k;
  b->align[0] = canon->inputs[gp->ia].align;
  b->align[1] = canon->inputs[gp->ib].align;
  b->align[2] = b->align[3] = 256; /* the scratch, or unused */
  b->ldc = b->ldd = b->n;
  b->workspace = FM_BLAS_WORKSPACE;
  b->bias = b->c = -1;
  snprintf(b->act, sizeof b->act, "none");
  if (gp->op2 >= 0) { /* siblings: A@B2 too, written after A@B (fm_meta.h) */
    b->has_b2 = 1;
    b->b2 = gp->ib2;
  }
  if (gp->batched) { /* strided batched: every product at its own offset, D dense */
    b->batched = 1;
    b->stride_a = (uint64_t)gp->ez[gp->ia];
    b->stride_b = (uint64_t)gp->ez[gp->ib];
    /* every product's address is as aligned as the base and the stride both allow */
    b->align[0] = stride_align(b->align[0], b->stride_a * 2);
    b->align[1] = stride_align(b->align[1], b->stride_b * 2);
    b->align[3] = stride_align(b->align[3], (uint64_t)(gp->m * gp->n) * 2);
  }
  return FM_OK;
}

size_t fm_codegen_blas_candidates(const fm_fragment *canon, fm_candidate *out, size_t max) {
  fm_cg_gemm_plan *gp = malloc(sizeof *gp);
  fm_meta_blas b;
  size_t n = 0;
  if (!gp || !canon || !out || !max) goto out;
  if (!fm_fragment_is_gemm(canon) || plan(canon, gp, &b, NULL)) goto out;
  memset(&out[0], 0, sizeof out[0]);
  out[0].tmpl = FM_TMPL_CUBLASLT;
  /* a batch or siblings always take the split form: its kernel's "batched" grid or "scratch2"
     parameter is what keeps a client that knows neither from running one product (fm_meta.h) */
  out[0].p[0] = !gp->batched && gp->op2 < 0 && direct_form(canon, gp, &b) ? FM_BLAS_DIRECT : FM_BLAS_SPLIT;
  n = 1;
out:
  free(gp);
  return n;
}

/* fm_blas_epi: one thread per 8 columns of a row of the product (grid-stride), read from the
 * scratch (16 bytes at once where the rows allow), then the fragment's epilogue. A batch
 * (bmm): block (y, z) runs FM_ROWS rows of product z (its tensors moved there by the kernel's
 * opening, the scratch here), the grid rule "batched". */
static void emit_epilogue_kernel(fm_strbuf *sb, const fm_fragment *f, const fm_cg_gemm_plan *gp) {
  const char *ty = fm_cg_storage_type(gp->dt);
  const char *dec = gp->dt == FM_DT_BF16 ? "fm_bf16_to_f32" : "fm_f16_to_f32";
  fm_cg_gemm_emit_kernel_open_extra(sb, f, gp, "fm_blas_epi", ty); /* siblings: fm_scratch2 too */
  if (gp->batched)
    fm_strbuf_append(sb,
                     "  fm_scratch += fm_z * M * FM_N;\n"
                     "  const long long groups = (FM_N + 7) / 8, row0 = (long long)blockIdx.y * FM_ROWS;\n"
                     "  const long long total = (M - row0 < FM_ROWS ? M - row0 : FM_ROWS) * groups;\n"
                     "  for (long long i = threadIdx.x; i < total; i += blockDim.x) {\n"
                     "    const long long m = row0 + i / groups;\n"
                     "    const long long n = (i % groups) * 8;\n");
  else
    fm_strbuf_append(sb,
                     "  const long long groups = (FM_N + 7) / 8;\n"
                     "  const long long total = M * groups;\n"
                     "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;\n"
                     "       i += (long long)gridDim.x * blockDim.x) {\n"
                     "    const long long m = i / groups;\n"
                     "    const long long n = (i - m * groups) * 8;\n");
  fm_strbuf_printf(sb,
                   "    const %s *p = fm_scratch + m * FM_N + n;\n"
                   "    __align__(16) %s raw[8];\n"
                   "    float acc[8];\n"
                   "    if (FM_N %% 8 == 0) {\n"
                   "      *(uint4 *)raw = __ldg((const uint4 *)p);\n"
                   "    } else {\n"
                   "#pragma unroll\n"
                   "      for (int e = 0; e < 8; e++) if (n + e < FM_N) raw[e] = p[e];\n"
                   "    }\n"
                   "#pragma unroll\n"
                   "    for (int e = 0; e < 8; e++) acc[e] = n + e < FM_N ? %s(raw[e]) : 0.0f;\n",
                   ty, ty, dec);
  if (gp->op2 >= 0) /* the second product's same 8 elements */
    fm_strbuf_printf(sb,
                     "    const %s *p2 = fm_scratch2 + m * FM_N + n;\n"
                     "    float acc2[8];\n"
                     "    if (FM_N %% 8 == 0) {\n"
                     "      *(uint4 *)raw = __ldg((const uint4 *)p2);\n"
                     "    } else {\n"
                     "#pragma unroll\n"
                     "      for (int e = 0; e < 8; e++) if (n + e < FM_N) raw[e] = p2[e];\n"
                     "    }\n"
                     "#pragma unroll\n"
                     "    for (int e = 0; e < 8; e++) acc2[e] = n + e < FM_N ? %s(raw[e]) : 0.0f;\n",
                     ty, dec);
  fm_strbuf_printf(sb, "    fm_epilogue(acc, %sm, n", gp->op2 >= 0 ? "acc2, " : "");
  fm_cg_gemm_emit_epi_params(sb, gp, 0);
  fm_strbuf_append(sb, ");\n  }\n}\n");
}

/* Rows of one product per block of the batched split kernel: about four 8-column groups a
 * thread, at least one row. */
static uint32_t batched_rows(const fm_cg_gemm_plan *gp) {
  uint64_t groups = (uint64_t)(gp->n + 7) / 8, rows = 4u * EPI_THREADS / groups;
  if (rows < 1) rows = 1;
  if (rows > (uint64_t)gp->m) rows = (uint64_t)gp->m;
  return (uint32_t)rows;
}

int fm_codegen_blas(const fm_fragment *canon, uint32_t form, uint32_t sm_count, char **src, fm_kernel_meta *meta,
                    fm_diag *d) {
  fm_cg_gemm_plan *gp = NULL;
  fm_strbuf sb;
  int rc;
  if (src) *src = NULL;
  if (!canon || !src || !meta) return fm_diag_set(d, FM_EINVAL, "codegen: NULL argument");
  if (form != FM_BLAS_DIRECT && form != FM_BLAS_SPLIT)
    return fm_diag_set(d, FM_EINVAL, "codegen: cuBLASLt form %u (1 direct, 2 split)", form);
  fm_strbuf_init(&sb, MAX_SOURCE);
  memset(meta, 0, sizeof *meta);
  gp = malloc(sizeof *gp);
  if (!gp) {
    rc = fm_diag_set(d, FM_ENOMEM, "codegen: out of memory");
    goto out;
  }
  if ((rc = plan(canon, gp, &meta->blas, d))) goto out;
  snprintf(meta->kind, sizeof meta->kind, "cublaslt");
  meta->outer = gp->batched ? gp->batch : gp->m;
  meta->n_inputs = canon->n_inputs;
  meta->n_outputs = canon->n_outputs;
  meta->block[0] = meta->block[1] = meta->block[2] = 1;
  meta->items_per_block = meta->max_blocks = 1;
  if (form == FM_BLAS_DIRECT) {
    if (gp->batched || gp->op2 >= 0 || !direct_form(canon, gp, &meta->blas)) {
      rc = fm_diag_set(d, FM_EUNSUPPORTED, "codegen: cuBLASLt cannot run this epilogue by itself");
      goto out;
    }
    snprintf(meta->blas.form, sizeof meta->blas.form, "direct");
    snprintf(meta->grid_rule, sizeof meta->grid_rule, "none");
    goto out; /* nothing to compile */
  }
  snprintf(meta->blas.form, sizeof meta->blas.form, "split");
  fm_strbuf_printf(&sb, "/* fusemld cuBLASLt split epilogue: A@B from the scratch, then the fragment's epilogue */\n");
  fm_cg_emit_prelude(&sb, fm_cg_fast_math(canon));
  fm_strbuf_printf(&sb, "#define FM_THREADS %u\n#define FM_N %" PRId64 "\n", EPI_THREADS, gp->n);
  if (gp->batched) fm_strbuf_printf(&sb, "#define FM_ROWS %u\n", batched_rows(gp));
  fm_cg_gemm_emit_epilogue(&sb, canon, gp);
  emit_epilogue_kernel(&sb, canon, gp);
  if ((rc = fm_strbuf_error(&sb))) {
    rc = fm_diag_set(d, rc, "codegen: the kernel source exceeds %u bytes", MAX_SOURCE);
    goto out;
  }
  snprintf(meta->entry, sizeof meta->entry, "fm_blas_epi");
  meta->block[0] = EPI_THREADS;
  snprintf(meta->grid_rule, sizeof meta->grid_rule, "elementwise");
  meta->inner = (uint64_t)(gp->n + 7) / 8;
  meta->items_per_block = EPI_THREADS;
  meta->max_blocks = (sm_count ? sm_count : DEFAULT_SMS) * EPI_BLOCKS_PER_SM;
  if (gp->batched) { /* (1, row blocks of one product, the products) */
    snprintf(meta->grid_rule, sizeof meta->grid_rule, "batched");
    meta->inner = (uint64_t)gp->m;
    meta->items_per_block = batched_rows(gp);
    meta->max_blocks = 1;
  }
  *src = fm_strbuf_take(&sb);
  if (!*src) rc = fm_diag_set(d, FM_ENOMEM, "codegen: out of memory");
out:
  fm_strbuf_free(&sb);
  free(gp);
  return rc;
}
