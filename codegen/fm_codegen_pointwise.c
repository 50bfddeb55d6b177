/* fm_codegen_pointwise.c: the pointwise-chain kernel: a grid-stride loop around
 * fm_compute() (fm_codegen_ops.c), its configurations, and its launch metadata.
 *
 * Shape of the generated kernel (both paths):
 *   for each grid-wide step, thread t of block b owns vectors v0 + u*BLOCK, u < UNROLL
 *   (consecutive threads touch consecutive vectors, so every access is coalesced):
 *     1. issue every load of the step      (memory-level parallelism)
 *     2. compute VEC elements per vector   (fm_compute, fp32 registers)
 *     3. issue every store
 * FLAT path: all tensors dense (or broadcast scalars), the offset of vector v is v*VEC and
 * the last n % VEC elements are done once by block 0. STRIDED path: the element index is
 * split into coordinates of the coalesced dims (divisions by compile-time constants; dim 0
 * is outermost so the runtime size never divides) and each tensor's offset is a dot product
 * with its strides; vectors run along the innermost dim, whose size VEC divides. STRIDED
 * with UNITS, where VEC does not divide it (odd rows) or an input is not contiguous along it,
 * but every output is row-major: a vector is VEC consecutive elements of the iteration, which
 * may span rows; each output stores it as one vector, each input laid out as the outputs are
 * loads it as one, every other input an element at a time at the element's coordinates
 * (stepped from the unit's first, a carry into the next row; one value a row, such as a
 * loss's per-row statistics, where a row starts only), and block 0 does the last n % VEC
 * elements. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_codegen_int.h"

#define FM_CG_MAX_SOURCE     (1u << 20)
#define FM_CG_DEFAULT_SMS    132u /* H100 SXM: sizes the grid cap when the caller has no GPU */
#define FM_CG_THREADS_PER_SM 2048u

static const uint32_t cand_block[] = {128, 256, 512};
static const uint32_t cand_unroll[] = {1, 2, 4, 8};
static const uint32_t cand_bps[] = {4, 8, 16};

/* Register type holding one access of tensor k: a vector word type, or the element type. */
static const char *reg_type(const fm_cg_plan *p, uint32_t k, uint32_t vec) {
  const fm_cg_tensor *t = &p->t[k];
  if (t->access != FM_CG_VECTOR || vec == 1) return fm_cg_storage_type(t->dtype);
  switch (vec * fm_dtype_size(t->dtype)) {
    case 32:
      return "fm_uint4x2";
    case 16:
      return "uint4";
    case 8:
      return "uint2";
    case 4:
      return "unsigned int";
    default:
      return "unsigned short";
  }
}

/* A zero of a register type from reg_type (the words are OR-ed into it). */
static const char *reg_zero(const char *type) {
  if (strcmp(type, "fm_uint4x2") == 0) return "fm_uint4x2()";
  if (strcmp(type, "uint4") == 0) return "make_uint4(0u, 0u, 0u, 0u)";
  if (strcmp(type, "uint2") == 0) return "make_uint2(0u, 0u)";
  if (strcmp(type, "unsigned int") == 0) return "0u";
  return "(unsigned short)0u";
}

static const char *elem_fn(fm_dtype dt, int put) {
  switch (fm_dtype_size(dt)) {
    case 4:
      return put ? "fm_put_f32" : "fm_get_f32";
    case 2:
      return put ? "fm_put_u16" : "fm_get_u16";
    default:
      return put ? "fm_put_u8" : "fm_get_u8";
  }
}

/* Is coordinate g of the STRIDED path used by any loaded or stored tensor? */
static int coord_used(const fm_cg_plan *p, uint32_t g) {
  for (uint32_t k = 0; k < p->n_in + p->n_out; k++) {
    fm_cg_access a = p->t[k].access;
    if ((a == FM_CG_VECTOR || a == FM_CG_SPLAT) && p->t[k].es[g] != 0) return 1;
  }
  return 0;
}

/* Element offset of tensor k for vector v (FLAT) or coordinates c0.. (STRIDED). */
static void emit_offset(fm_strbuf *sb, const fm_cg_plan *p, uint32_t k, uint32_t vec) {
  if (p->flat) {
    if (vec == 1)
      fm_strbuf_append(sb, "v");
    else
      fm_strbuf_printf(sb, "v * %u", vec);
    return;
  }
  const char *sep = "";
  fm_strbuf_append(sb, "(");
  for (uint32_t g = 0; g < p->rank; g++) {
    int64_t s = p->t[k].es[g];
    if (s == 0) continue;
    if (s == 1)
      fm_strbuf_printf(sb, "%sc%u", sep, g);
    else
      fm_strbuf_printf(sb, "%sc%u * %lldLL", sep, g, (long long)s);
    sep = " + ";
  }
  if (!*sep) fm_strbuf_append(sb, "0");
  fm_strbuf_append(sb, ")");
}

/* STRIDED: coordinates of the first element of vector v. */
static void emit_coords(fm_strbuf *sb, const fm_cg_plan *p, uint32_t vec) {
  if (p->rank == 1) {
    if (vec == 1)
      fm_strbuf_append(sb, "        const long long c0 = v;\n");
    else
      fm_strbuf_printf(sb, "        const long long c0 = v * %u;\n", vec);
    return;
  }
  if (vec == 1)
    fm_strbuf_append(sb, "        unsigned long long r = (unsigned long long)v;\n");
  else
    fm_strbuf_printf(sb, "        unsigned long long r = (unsigned long long)v * %uu;\n", vec);
  for (uint32_t g = p->rank; g-- > 1;) {
    if (coord_used(p, g))
      fm_strbuf_printf(sb, "        const long long c%u = (long long)(r %% %lldull);\n", g, (long long)p->dims[g]);
    fm_strbuf_printf(sb, "        r /= %lldull;\n", (long long)p->dims[g]);
  }
  if (coord_used(p, 0)) fm_strbuf_append(sb, "        const long long c0 = (long long)r;\n");
}

static void emit_signature(fm_strbuf *sb, const fm_cg_plan *p, const fm_pw_config *cfg, const char *entry) {
  fm_strbuf_printf(sb, "extern \"C\" __global__ void __launch_bounds__(%u) %s(\n", cfg->block, entry);
  for (uint32_t k = 0; k < p->n_in; k++)
    fm_strbuf_printf(sb, "    const %s *__restrict__ in%u,\n", fm_cg_storage_type(p->t[k].dtype), k);
  for (uint32_t k = 0; k < p->n_out; k++)
    fm_strbuf_printf(sb, "    %s *__restrict__ out%u,\n", fm_cg_storage_type(p->t[p->n_in + k].dtype), k);
  fm_strbuf_append(sb, "    long long outer) {\n");
}

/* STRIDED: does input k vary along the innermost coalesced dim only (a per-channel vector
 * beside a channels-last tensor: batch norm's mean, variance, weight and bias; a bias row
 * beside a matrix), with a block's vectors covering whole rows (block * vec a multiple of the
 * innermost size)? Then a thread's innermost coordinate is the same at every step of the
 * grid-stride loop and for every unrolled u (each moves a multiple of block * vec elements), so
 * its load moves before the loop, and the compiler moves what is computed from such inputs
 * alone (batch norm's 1 / sqrt(var + eps): two MUFU ops an element, twice in a residual
 * block's two norms) out of the loop with it. */
static int hoisted(const fm_cg_plan *p, const fm_pw_config *cfg, uint32_t vec, uint32_t k) {
  const fm_cg_tensor *t = &p->t[k];
  if (p->flat || p->rank < 2 || t->access != FM_CG_VECTOR || fm_cg_plan_units(p, vec)) return 0;
  const uint32_t last = p->rank - 1;
  if (t->es[last] == 0 || p->dims[last] < 1) return 0;
  for (uint32_t g = 0; g < last; g++)
    if (t->es[g] != 0) return 0;
  return ((uint64_t)cfg->block * vec) % (uint64_t)p->dims[last] == 0;
}

/* fm_compute's column argument (a fragment with an iota) for the element whose row-major
 * index is `lin`: lin mod C, or lin itself where the iteration has one dim. */
static void emit_col_of(fm_strbuf *sb, const fm_cg_plan *p, const char *lin) {
  if (p->iota_cols < 0)
    fm_strbuf_printf(sb, "%s", lin);
  else
    fm_strbuf_printf(sb, "%s %% %lldLL", lin, (long long)p->iota_cols);
}

/* The same for element e of a vector whose first element's column is fm_cb (emit_vector_compute):
 * at most one row boundary lies inside a vector no longer than a row, so one compare does. */
static void emit_col_in_vector(fm_strbuf *sb, const fm_cg_plan *p, uint32_t vec) {
  const long long c = (long long)p->iota_cols;
  if (c < 0)
    fm_strbuf_append(sb, "fm_cb + e");
  else if ((long long)vec <= c)
    fm_strbuf_printf(sb, "(fm_cb + e < %lldLL ? fm_cb + e : fm_cb + e - %lldLL)", c, c);
  else
    fm_strbuf_printf(sb, "(fm_cb + e) %% %lldLL", c);
}

/* Arguments of fm_compute for unrolled vector u, element e (vec > 1) or the scalar; a hoisted
 * input (hoist[k]) is its register h<k>. */
static void emit_compute_call(fm_strbuf *sb, const fm_cg_plan *p, uint32_t vec, const uint8_t *hoist, const char *ind) {
  fm_strbuf_printf(sb, "%sfm_compute(", ind);
  const char *sep = "";
  for (uint32_t k = 0; k < p->n_in; k++) {
    const fm_cg_tensor *t = &p->t[k];
    switch (t->access) {
      case FM_CG_UNUSED:
        continue;
      case FM_CG_SCALAR:
        fm_strbuf_printf(sb, "%ss%u", sep, k);
        break;
      case FM_CG_SPLAT:
        fm_strbuf_printf(sb, fm_cg_plan_units(p, vec) ? "%sr%u[u][e]" : "%sr%u[u]", sep, k);
        break;
      case FM_CG_VECTOR:
        if (fm_cg_plan_units(p, vec) && t->gathered)
          fm_strbuf_printf(sb, "%sr%u[u][e]", sep, k);
        else if (vec == 1)
          fm_strbuf_printf(sb, hoist[k] ? "%sh%u" : "%sr%u[u]", sep, k);
        else
          fm_strbuf_printf(sb, hoist[k] ? "%s%s(h%u, e)" : "%s%s(r%u[u], e)", sep, elem_fn(t->dtype, 0), k);
        break;
    }
    sep = ", ";
  }
  for (uint32_t k = 0; k < p->n_out; k++) {
    if (vec == 1)
      fm_strbuf_printf(sb, "%sw%u[u]", sep, k);
    else
      fm_strbuf_printf(sb, "%so%u", sep, k);
    sep = ", ";
  }
  if (p->iota_cols) {
    fm_strbuf_append(sb, sep);
    if (vec == 1)
      emit_col_of(sb, p, "v");
    else
      emit_col_in_vector(sb, p, vec);
  }
  fm_strbuf_append(sb, ");\n");
}

/* Compute of unrolled vector u (vec > 1): each element through fm_compute, packed into the
 * outputs' registers. */
static void emit_vector_compute(fm_strbuf *sb, const fm_cg_plan *p, uint32_t vec, const uint8_t *hoist) {
  for (uint32_t k = 0; k < p->n_out; k++)
    fm_strbuf_printf(sb, "        w%u[u] = %s;\n", k, reg_zero(reg_type(p, p->n_in + k, vec)));
  if (p->iota_cols) { /* the column of the vector's first element: one division a vector */
    char lin[32];
    snprintf(lin, sizeof lin, "v * %uLL", vec);
    fm_strbuf_append(sb, "        const long long fm_cb = ");
    emit_col_of(sb, p, lin);
    fm_strbuf_append(sb, ";\n");
  }
  fm_strbuf_printf(sb,
                   "#pragma unroll\n"
                   "        for (int e = 0; e < %u; ++e) {\n",
                   vec);
  for (uint32_t k = 0; k < p->n_out; k++)
    fm_strbuf_printf(sb, "          %s o%u;\n", fm_cg_storage_type(p->t[p->n_in + k].dtype), k);
  emit_compute_call(sb, p, vec, hoist, "          ");
  for (uint32_t k = 0; k < p->n_out; k++)
    fm_strbuf_printf(sb, "          %s(w%u[u], e, o%u);\n", elem_fn(p->t[p->n_in + k].dtype, 1), k, k);
  fm_strbuf_append(sb, "        }\n");
}

static void emit_step_head(fm_strbuf *sb, const fm_pw_config *cfg) {
  fm_strbuf_printf(sb,
                   "#pragma unroll\n"
                   "    for (int u = 0; u < %u; ++u) {\n"
                   "      const long long v = v0 + u * %u;\n"
                   "      if (v < nv) {\n",
                   cfg->unroll, cfg->block);
}

static void emit_step_tail(fm_strbuf *sb) { fm_strbuf_append(sb, "      }\n    }\n"); }

static void emit_main_loop(fm_strbuf *sb, const fm_cg_plan *p, const fm_pw_config *cfg, uint32_t vec) {
  uint32_t per_block = cfg->block * cfg->unroll;
  uint8_t hoist[FM_MAX_INPUTS] = {0};
  int any_hoist = 0;
  for (uint32_t k = 0; k < p->n_in && k < FM_MAX_INPUTS; k++) any_hoist |= hoist[k] = (uint8_t)hoisted(p, cfg, vec, k);
  if (any_hoist) {
    const uint32_t last = p->rank - 1;
    fm_strbuf_printf(sb,
                     "  /* the thread's innermost coordinate, the same at every step: what varies along it\n"
                     "     alone is loaded once */\n"
                     "  const long long hc = ((long long)blockIdx.x * %u + threadIdx.x) * %u %% %lldLL;\n",
                     per_block, vec, (long long)p->dims[last]);
    for (uint32_t k = 0; k < p->n_in; k++) {
      if (!hoist[k]) continue;
      const char *at = p->t[k].es[last] == 1 ? "hc" : NULL;
      char off[48];
      if (!at) snprintf(off, sizeof off, "hc * %lldLL", (long long)p->t[k].es[last]);
      if (vec > 1)
        fm_strbuf_printf(sb, "  const %s h%u = *reinterpret_cast<const %s *>(in%u + %s);\n", reg_type(p, k, vec), k,
                         reg_type(p, k, vec), k, at ? at : off);
      else
        fm_strbuf_printf(sb, "  const %s h%u = in%u[%s];\n", reg_type(p, k, vec), k, k, at ? at : off);
    }
  }
  fm_strbuf_printf(sb,
                   "  for (long long v0 = (long long)blockIdx.x * %u + threadIdx.x; v0 < nv;\n"
                   "       v0 += (long long)gridDim.x * %u) {\n",
                   per_block, per_block);
  for (uint32_t k = 0; k < p->n_in; k++) {
    fm_cg_access a = p->t[k].access;
    if ((a == FM_CG_VECTOR || a == FM_CG_SPLAT) && !hoist[k])
      fm_strbuf_printf(sb, "    %s r%u[%u];\n", reg_type(p, k, vec), k, cfg->unroll);
  }
  for (uint32_t k = 0; k < p->n_out; k++) {
    fm_strbuf_printf(sb, "    %s w%u[%u];\n", reg_type(p, p->n_in + k, vec), k, cfg->unroll);
    if (!p->flat) fm_strbuf_printf(sb, "    long long p%u[%u];\n", k, cfg->unroll);
  }
  /* 1. loads */
  emit_step_head(sb, cfg);
  if (!p->flat) emit_coords(sb, p, vec);
  for (uint32_t k = 0; k < p->n_in; k++) {
    fm_cg_access a = p->t[k].access;
    if ((a != FM_CG_VECTOR && a != FM_CG_SPLAT) || hoist[k]) continue;
    if (a == FM_CG_VECTOR && vec > 1) {
      fm_strbuf_printf(sb, "        r%u[u] = *reinterpret_cast<const %s *>(in%u + ", k, reg_type(p, k, vec), k);
      emit_offset(sb, p, k, vec);
      fm_strbuf_append(sb, ");\n");
    } else {
      fm_strbuf_printf(sb, "        r%u[u] = in%u[", k, k);
      emit_offset(sb, p, k, vec);
      fm_strbuf_append(sb, "];\n");
    }
  }
  if (!p->flat) {
    for (uint32_t k = 0; k < p->n_out; k++) {
      fm_strbuf_printf(sb, "        p%u[u] = ", k);
      emit_offset(sb, p, p->n_in + k, vec);
      fm_strbuf_append(sb, ";\n");
    }
  }
  emit_step_tail(sb);
  /* 2. compute */
  emit_step_head(sb, cfg);
  if (vec == 1)
    emit_compute_call(sb, p, vec, hoist, "        ");
  else
    emit_vector_compute(sb, p, vec, hoist);
  emit_step_tail(sb);
  /* 3. stores */
  emit_step_head(sb, cfg);
  for (uint32_t k = 0; k < p->n_out; k++) {
    uint32_t t = p->n_in + k;
    if (vec > 1) {
      fm_strbuf_printf(sb, "        *reinterpret_cast<%s *>(out%u + ", reg_type(p, t, vec), k);
      if (p->flat)
        emit_offset(sb, p, t, vec);
      else
        fm_strbuf_printf(sb, "p%u[u]", k);
      fm_strbuf_printf(sb, ") = w%u[u];\n", k);
    } else {
      fm_strbuf_printf(sb, "        out%u[", k);
      if (p->flat)
        emit_offset(sb, p, t, vec);
      else
        fm_strbuf_printf(sb, "p%u[u]", k);
      fm_strbuf_printf(sb, "] = w%u[u];\n", k);
    }
  }
  emit_step_tail(sb);
  fm_strbuf_append(sb, "  }\n");
}

/* UNITS: the coordinates of unit v's first element, mutable: emit_unit_step moves them on. */
static void emit_unit_coords(fm_strbuf *sb, const fm_cg_plan *p, uint32_t vec) {
  fm_strbuf_printf(sb, "        unsigned long long r = (unsigned long long)v * %uu;\n", vec);
  for (uint32_t g = p->rank; g-- > 1;) {
    fm_strbuf_printf(sb, "        long long c%u = (long long)(r %% %lldull);\n", g, (long long)p->dims[g]);
    fm_strbuf_printf(sb, "        r /= %lldull;\n", (long long)p->dims[g]);
  }
  fm_strbuf_append(sb, "        long long c0 = (long long)r;\n");
}

/* UNITS: the next element's coordinates: the innermost one up, a carry outwards at its end
 * (dim 0 never ends inside the iteration). */
static void emit_unit_step(fm_strbuf *sb, const fm_cg_plan *p) {
  fm_strbuf_append(sb, "          ");
  for (uint32_t g = p->rank; g-- > 1;)
    fm_strbuf_printf(sb, "if (++c%u == %lldLL) { c%u = 0; ", g, (long long)p->dims[g], g);
  fm_strbuf_append(sb, "++c0;");
  for (uint32_t g = 1; g < p->rank; g++) fm_strbuf_append(sb, " }");
  fm_strbuf_append(sb, "\n");
}

static int is_gathered(const fm_cg_tensor *t) {
  return t->gathered && (t->access == FM_CG_VECTOR || t->access == FM_CG_SPLAT);
}

/* UNITS: the main loop (loads, compute, stores as the other paths'), a unit per vector. */
static void emit_unit_loop(fm_strbuf *sb, const fm_cg_plan *p, const fm_pw_config *cfg, uint32_t vec) {
  const uint32_t per_block = cfg->block * cfg->unroll;
  const uint8_t no_hoist[FM_MAX_INPUTS] = {0};
  int any_gathered = 0;
  for (uint32_t k = 0; k < p->n_in; k++) any_gathered |= is_gathered(&p->t[k]);
  fm_strbuf_printf(sb,
                   "  for (long long v0 = (long long)blockIdx.x * %u + threadIdx.x; v0 < nv;\n"
                   "       v0 += (long long)gridDim.x * %u) {\n",
                   per_block, per_block);
  for (uint32_t k = 0; k < p->n_in; k++) {
    const fm_cg_tensor *t = &p->t[k];
    if (is_gathered(t))
      fm_strbuf_printf(sb, "    %s r%u[%u][%u];\n", fm_cg_storage_type(t->dtype), k, cfg->unroll, vec);
    else if (t->access == FM_CG_VECTOR)
      fm_strbuf_printf(sb, "    %s r%u[%u];\n", reg_type(p, k, vec), k, cfg->unroll);
  }
  for (uint32_t k = 0; k < p->n_out; k++)
    fm_strbuf_printf(sb, "    %s w%u[%u];\n", reg_type(p, p->n_in + k, vec), k, cfg->unroll);
  /* 1. loads */
  emit_step_head(sb, cfg);
  for (uint32_t k = 0; k < p->n_in; k++)
    if (p->t[k].access == FM_CG_VECTOR && !p->t[k].gathered)
      fm_strbuf_printf(sb, "        r%u[u] = *reinterpret_cast<const %s *>(in%u + v * %u);\n", k, reg_type(p, k, vec),
                       k, vec);
  if (any_gathered) {
    emit_unit_coords(sb, p, vec);
    fm_strbuf_printf(sb,
                     "#pragma unroll\n"
                     "        for (int e = 0; e < %u; ++e) {\n",
                     vec);
    for (uint32_t k = 0; k < p->n_in; k++) {
      if (!is_gathered(&p->t[k])) continue;
      if (p->t[k].access == FM_CG_SPLAT) /* one value a row: loaded where a row starts */
        fm_strbuf_printf(sb, "          r%u[u][e] = (e == 0 || c%u == 0) ? in%u[", k, p->rank - 1, k);
      else
        fm_strbuf_printf(sb, "          r%u[u][e] = in%u[", k, k);
      emit_offset(sb, p, k, vec);
      fm_strbuf_printf(sb, p->t[k].access == FM_CG_SPLAT ? "] : r%u[u][e > 0 ? e - 1 : 0];\n" : "];\n", k);
    }
    emit_unit_step(sb, p);
    fm_strbuf_append(sb, "        }\n");
  }
  emit_step_tail(sb);
  /* 2. compute */
  emit_step_head(sb, cfg);
  emit_vector_compute(sb, p, vec, no_hoist);
  emit_step_tail(sb);
  /* 3. stores */
  emit_step_head(sb, cfg);
  for (uint32_t k = 0; k < p->n_out; k++)
    fm_strbuf_printf(sb, "        *reinterpret_cast<%s *>(out%u + v * %u) = w%u[u];\n", reg_type(p, p->n_in + k, vec),
                     k, vec, k);
  emit_step_tail(sb);
  fm_strbuf_append(sb, "  }\n");
}

/* FLAT or UNITS: the n % VEC elements after the last whole vector, once, by block 0 (with
 * units, each input read at the element's coordinates). */
static void emit_tail(fm_strbuf *sb, const fm_cg_plan *p, uint32_t vec) {
  const int units = !p->flat;
  const char *i = units ? "v" : "i"; /* emit_coords reads v */
  fm_strbuf_printf(sb,
                   "  /* the last n %% %u elements: once, by the first threads of block 0 */\n"
                   "  if (blockIdx.x == 0 && threadIdx.x < n - nv * %u) {\n"
                   "    const long long %s = nv * %u + threadIdx.x;\n",
                   vec, vec, i, vec);
  if (units) emit_coords(sb, p, 1);
  for (uint32_t k = 0; k < p->n_out; k++)
    fm_strbuf_printf(sb, "    %s o%u;\n", fm_cg_storage_type(p->t[p->n_in + k].dtype), k);
  fm_strbuf_append(sb, "    fm_compute(");
  const char *sep = "";
  for (uint32_t k = 0; k < p->n_in; k++) {
    fm_cg_access a = p->t[k].access;
    if (a == FM_CG_UNUSED) continue;
    if (a == FM_CG_SCALAR) {
      fm_strbuf_printf(sb, "%ss%u", sep, k);
    } else if (units) {
      fm_strbuf_printf(sb, "%sin%u[", sep, k);
      emit_offset(sb, p, k, 1);
      fm_strbuf_append(sb, "]");
    } else {
      fm_strbuf_printf(sb, "%sin%u[i]", sep, k);
    }
    sep = ", ";
  }
  for (uint32_t k = 0; k < p->n_out; k++) {
    fm_strbuf_printf(sb, "%so%u", sep, k);
    sep = ", ";
  }
  if (p->iota_cols) {
    fm_strbuf_append(sb, sep);
    emit_col_of(sb, p, i);
  }
  fm_strbuf_append(sb, ");\n");
  for (uint32_t k = 0; k < p->n_out; k++) fm_strbuf_printf(sb, "    out%u[%s] = o%u;\n", k, i, k);
  fm_strbuf_append(sb, "  }\n");
}

/* The 32-byte register of an f32 vector beside 16-bit ones (fm_codegen_plan.c): two 16-byte
 * words, each loaded and stored as one access; the prelude's element getters and setters
 * reach it through these overloads. Emitted only where a tensor uses it. */
static int has_wide_words(const fm_cg_plan *p, uint32_t vec) {
  for (uint32_t k = 0; k < p->n_in + p->n_out; k++)
    if (strcmp(reg_type(p, k, vec), "fm_uint4x2") == 0) return 1;
  return 0;
}

static void emit_wide_words(fm_strbuf *sb, const fm_cg_plan *p, uint32_t vec) {
  if (has_wide_words(p, vec))
    fm_strbuf_append(sb,
                     "struct __align__(16) fm_uint4x2 { uint4 lo, hi; };\n"
                     "__device__ __forceinline__ unsigned int fm_word(const fm_uint4x2 &r, int k) {\n"
                     "  return k < 4 ? fm_word(r.lo, k) : fm_word(r.hi, k - 4);\n"
                     "}\n"
                     "__device__ __forceinline__ void fm_or_word(fm_uint4x2 &r, int k, unsigned int b) {\n"
                     "  if (k < 4) fm_or_word(r.lo, k, b); else fm_or_word(r.hi, k - 4, b);\n"
                     "}\n");
}

static void emit_kernel(fm_strbuf *sb, const fm_cg_plan *p, const fm_pw_config *cfg, uint32_t vec, const char *entry) {
  emit_wide_words(sb, p, vec);
  emit_signature(sb, p, cfg, entry);
  if (p->symbolic) {
    if (p->inner == 1)
      fm_strbuf_append(sb, "  const long long n = outer;\n");
    else
      fm_strbuf_printf(sb, "  const long long n = outer * %lldLL;\n", (long long)p->inner);
  } else {
    fm_strbuf_printf(sb, "  const long long n = %lldLL;\n", (long long)(p->outer * p->inner));
  }
  if (vec == 1)
    fm_strbuf_append(sb, "  const long long nv = n;\n");
  else
    fm_strbuf_printf(sb, "  const long long nv = n / %u;  /* whole vectors */\n", vec);
  for (uint32_t k = 0; k < p->n_in; k++)
    if (p->t[k].access == FM_CG_SCALAR)
      fm_strbuf_printf(sb, "  const %s s%u = in%u[0];  /* broadcast scalar */\n", fm_cg_storage_type(p->t[k].dtype), k,
                       k);
  const int units = fm_cg_plan_units(p, vec);
  if (units)
    emit_unit_loop(sb, p, cfg, vec);
  else
    emit_main_loop(sb, p, cfg, vec);
  /* STRIDED never has a tail: VEC divides the innermost dim. A static n that VEC divides
   * needs none either. */
  const int tail = vec > 1 && (p->symbolic || (p->outer * p->inner) % vec != 0);
  if ((p->flat || units) && tail) emit_tail(sb, p, vec);
  fm_strbuf_append(sb, "}\n");
}

static void emit_header(fm_strbuf *sb, const fm_cg_plan *p, const fm_pw_config *cfg, uint32_t vec) {
  fm_strbuf_printf(sb,
                   "/* fusemld codegen v%d: pointwise kernel, %s path, vec %u, unroll %u, "
                   "block %u.\n"
                   " * Generated from a canonical fragment: every name and number below comes "
                   "from its\n * typed fields. One self-contained translation unit (NVRTC has "
                   "no include path). */\n",
                   FM_CODEGEN_VERSION,
                   p->flat                    ? "FLAT"
                   : fm_cg_plan_units(p, vec) ? "STRIDED with UNITS"
                                              : "STRIDED",
                   vec, cfg->unroll, cfg->block);
  if (!p->flat) {
    fm_strbuf_append(sb, "/* coalesced dims: [");
    for (uint32_t g = 0; g < p->rank; g++) {
      if (g == 0 && p->symbolic && p->dims[0] == 1)
        fm_strbuf_append(sb, "outer");
      else if (g == 0 && p->symbolic)
        fm_strbuf_printf(sb, "outer x %lld", (long long)p->dims[0]);
      else
        fm_strbuf_printf(sb, "%s%lld", g ? ", " : "", (long long)p->dims[g]);
    }
    fm_strbuf_append(sb, "] */\n");
  }
}

static int check_config(const fm_pw_config *c, fm_diag *d) {
  if (c->block < 32 || c->block > 1024 || c->block % 32)
    return fm_diag_set(d, FM_EINVAL, "config: block %u is not a multiple of 32 in 32..1024", c->block);
  if (c->unroll < 1 || c->unroll > 8) return fm_diag_set(d, FM_EINVAL, "config: unroll %u is not in 1..8", c->unroll);
  if (c->vec > 16 || (c->vec & (c->vec - 1)))
    return fm_diag_set(d, FM_EINVAL, "config: vec %u is not 0 or a power of two <= 16", c->vec);
  if (c->blocks_per_sm < 1 || c->blocks_per_sm > 64)
    return fm_diag_set(d, FM_EINVAL, "config: blocks_per_sm %u is not in 1..64", c->blocks_per_sm);
  return FM_OK;
}

static void fill_meta(const fm_cg_plan *p, const fm_pw_config *cfg, uint32_t vec, uint32_t sm_count, const char *entry,
                      fm_kernel_meta *m) {
  memset(m, 0, sizeof *m);
  snprintf(m->kind, sizeof m->kind, "pointwise");
  snprintf(m->entry, sizeof m->entry, "%s", entry);
  m->block[0] = cfg->block;
  m->block[1] = m->block[2] = 1;
  m->smem = 0;
  snprintf(m->grid_rule, sizeof m->grid_rule, "elementwise");
  m->inner = (uint64_t)p->inner;
  m->items_per_block = (uint64_t)cfg->block * vec * cfg->unroll;
  uint64_t max_blocks = (uint64_t)cfg->blocks_per_sm * (sm_count ? sm_count : FM_CG_DEFAULT_SMS);
  m->max_blocks = max_blocks > 0x7fffffffu ? 0x7fffffffu : (uint32_t)max_blocks;
  m->outer = p->symbolic ? -1 : p->outer;
  m->n_inputs = p->n_in;
  m->n_outputs = p->n_out;
}

int fm_codegen_pointwise(const fm_fragment *canon, const fm_pw_config *cfg, uint32_t sm_count, char **src,
                         fm_kernel_meta *meta, fm_diag *d) {
  fm_strbuf sb;
  fm_strbuf_init(&sb, FM_CG_MAX_SOURCE);
  fm_cg_plan *p = NULL;
  int rc = FM_OK;
  uint32_t vec;
  char entry[FM_META_ENTRY_MAX];
  if (!canon || !src || !meta) return fm_diag_set(d, FM_EINVAL, "codegen: NULL argument");
  *src = NULL;
  fm_pw_config c = cfg ? *cfg : fm_codegen_pointwise_default(canon);
  if ((rc = check_config(&c, d))) goto out;
  if (fm_fragment_is_extent(canon)) { /* loads at computed indices: a form of its own */
    rc = fm_codegen_cat(canon, &c, sm_count, src, meta, d);
    goto out;
  }
  /* The plan is a few tens of KiB: keep it off worker-thread stacks. */
  p = malloc(sizeof *p);
  if (!p) {
    rc = fm_diag_set(d, FM_ENOMEM, "codegen: out of memory");
    goto out;
  }
  if ((rc = fm_cg_plan_build(canon, p, d))) goto out;
  vec = fm_cg_plan_vec(p, c.vec);
  snprintf(entry, sizeof entry, "fm_pointwise_v%d", FM_CODEGEN_VERSION);

  emit_header(&sb, p, &c, vec);
  fm_cg_emit_prelude(&sb, fm_cg_fast_math(canon));
  if ((rc = fm_cg_emit_compute(&sb, canon, p, d))) goto out;
  fm_strbuf_append(&sb, "/* ---- the kernel ---- */\n");
  emit_kernel(&sb, p, &c, vec, entry);
  if (fm_strbuf_error(&sb)) {
    rc = fm_diag_set(d, FM_ECODEGEN, "codegen: source buffer: %s", fm_strerror(fm_strbuf_error(&sb)));
    goto out;
  }
  fill_meta(p, &c, vec, sm_count, entry, meta);
  *src = fm_strbuf_take(&sb);
  if (!*src) rc = fm_diag_set(d, FM_ENOMEM, "codegen: out of memory");
out:
  fm_strbuf_free(&sb);
  free(p);
  return rc;
}

/* Memory-bound streaming wants enough bytes in flight per thread: 16-bit tensors move half
 * the bytes per element, so they unroll twice as far as f32 for the same traffic. */
fm_pw_config fm_codegen_pointwise_default(const fm_fragment *canon) {
  fm_pw_config c = {.block = 256, .vec = 0, .unroll = 2, .blocks_per_sm = 8};
  fm_cg_plan *p = canon ? malloc(sizeof *p) : NULL;
  if (p && fm_cg_plan_build(canon, p, NULL) == FM_OK && p->flat) {
    size_t widest = 1;
    for (uint32_t k = 0; k < p->n_in + p->n_out; k++)
      if (p->t[k].access == FM_CG_VECTOR && fm_dtype_size(p->t[k].dtype) > widest)
        widest = fm_dtype_size(p->t[k].dtype);
    if (widest <= 2) c.unroll = 4;
  }
  free(p);
  return c;
}

/* The widest vector of a (non-extent) fragment where some tensor's is 32 bytes, else 0. */
static uint32_t wide_vec(const fm_fragment *canon) {
  uint32_t wide = 0;
  fm_cg_plan *p = canon && !fm_fragment_is_extent(canon) ? malloc(sizeof *p) : NULL;
  if (p && fm_cg_plan_build(canon, p, NULL) == FM_OK && has_wide_words(p, p->max_vec)) wide = p->max_vec;
  free(p);
  return wide;
}

/* The vec of the other form where a fragment may run with units or with vectors along its
 * rows: the rows' (max_vec) where the default runs with units, the units' where it does not;
 * else 0. */
static uint32_t other_form(const fm_fragment *canon) {
  uint32_t other = 0;
  fm_cg_plan *p = canon && !fm_fragment_is_extent(canon) ? malloc(sizeof *p) : NULL;
  if (p && fm_cg_plan_build(canon, p, NULL) == FM_OK && p->unit_vec > p->max_vec)
    other = fm_cg_plan_units(p, fm_cg_plan_vec(p, 0)) ? p->max_vec : p->unit_vec;
  free(p);
  return other;
}

/* The default first, then block x unroll x blocks_per_sm, keeping only grids that fit in
 * one wave at full occupancy (block * blocks_per_sm <= 2048 threads per SM): a grid-stride
 * kernel gains nothing from a second wave, and this leaves 24 points. An extent fragment's
 * points store the widest units its outputs allow; the default at one element a thread is
 * timed beside them (a unit's elements are computed one after another: where each is long,
 * a thread per element may win). Where a vector holds 32 bytes of some tensor, the default
 * at 16 bytes of it is timed too; where a fragment may run with units or with vectors along
 * its rows, the default in the other form. */
size_t fm_codegen_pointwise_candidates(const fm_fragment *canon, fm_pw_config *out, size_t max) {
  size_t n = 0;
  if (!out || max == 0) return 0;
  fm_pw_config def = fm_codegen_pointwise_default(canon);
  out[n++] = def;
  for (size_t b = 0; b < sizeof cand_block / sizeof cand_block[0]; b++)
    for (size_t u = 0; u < sizeof cand_unroll / sizeof cand_unroll[0]; u++)
      for (size_t s = 0; s < sizeof cand_bps / sizeof cand_bps[0]; s++) {
        fm_pw_config c = {cand_block[b], 0, cand_unroll[u], cand_bps[s]};
        if (c.block * c.blocks_per_sm > FM_CG_THREADS_PER_SM) continue;
        if (c.block == def.block && c.unroll == def.unroll && c.blocks_per_sm == def.blocks_per_sm && c.vec == def.vec)
          continue;
        if (n == max) return n;
        out[n++] = c;
      }
  if (canon && fm_fragment_is_extent(canon) && fm_cg_cat_widest_unit(canon) > 1 && n < max) {
    fm_pw_config one = def;
    one.vec = 1;
    out[n++] = one;
  }
  const uint32_t other = other_form(canon);
  if (other && n < max) { /* units stored across rows, or vectors along them: both timed */
    fm_pw_config form = def;
    form.vec = other;
    out[n++] = form;
  }
  const uint32_t wide = wide_vec(canon);
  if (wide && n < max) { /* 16 bytes of the widest tensor, as before 32-byte vectors: timed beside them */
    fm_pw_config half = def;
    half.vec = wide / 2;
    out[n++] = half;
  }
  return n;
}
