/* fm_meta.c: launch metadata to and from its wire form (fm_meta.h).
 *
 * Unpacking is strict about what a launch depends on (block, grid rule, parameter list) and
 * ignores keys it does not know, so a newer daemon can add fields without breaking clients. */
#include "fm_meta.h"

#include <inttypes.h>
#include <string.h>

#include "fm_fragment.h"
#include "fm_msg.h"

#define RULE_ELEMENTWISE  "elementwise"
#define RULE_ROWS         "rows"
#define RULE_TILES        "tiles"
#define RULE_PERSISTENT   "persistent"
#define RULE_NONE         "none"
#define RULE_BATCHED      "batched"
#define RULE_COLUMNS      "columns"
#define MAX_CLUSTER       8u /* the portable cluster size */
#define MAX_BLOCK_THREADS 1024u

static int is_split(const fm_kernel_meta *m) { return strcmp(m->blas.form, "split") == 0; }

static int has_finish(const fm_kernel_meta *m) { return m->finish.entry[0] != '\0'; }

/* The scratch parameters: a split plan's product ("scratch", and "scratch2" for siblings), a
 * split column reduction's partials ("scratch"). */
static uint32_t n_scratch(const fm_kernel_meta *m) {
  return is_split(m) ? (m->blas.has_b2 ? 2u : 1u) : has_finish(m) ? 1u : 0u;
}

/* Cluster dim i of the compiled-in cluster (1: none; a struct from codegen may say 0). */
static uint32_t cluster_dim(const fm_kernel_meta *m, int i) { return m->cluster[i] ? m->cluster[i] : 1u; }

static int has_cluster(const fm_kernel_meta *m) {
  return cluster_dim(m, 0) * cluster_dim(m, 1) * cluster_dim(m, 2) > 1;
}

static uint64_t round256(uint64_t x) { return (x + 255) & ~(uint64_t)255; }

/* The scratch's part that does not grow with the rows: the workspace (at least 256 bytes for
 * a direct plan, which has nothing else). */
static uint64_t scratch_fixed(const fm_kernel_meta *m) {
  uint64_t fixed = round256(m->blas.workspace);
  return fixed || is_split(m) ? fixed : 256;
}

static int pack_blas(const fm_kernel_meta *m, msgpack_packer *pk) {
  const fm_meta_blas *b = &m->blas;
  int rc = 0;
  fm_pack_cstr(pk, "blas");
  rc |= msgpack_pack_map(pk, 21 + (b->batched ? 1 : 0) + (b->has_b2 ? 1 : 0));
  fm_pack_kv_cstr(pk, "form", b->form);
  fm_pack_kv_cstr(pk, "dtype", b->dtype);
  fm_pack_kv_u64(pk, "a", b->a);
  fm_pack_kv_u64(pk, "b", b->b);
  fm_pack_kv_i64(pk, "bias", b->bias);
  fm_pack_kv_i64(pk, "c", b->c);
  fm_pack_kv_u64(pk, "out", b->out);
  fm_pack_kv_cstr(pk, "act", b->act);
  fm_pack_kv_bool(pk, "a_kmajor", b->a_kmajor != 0);
  fm_pack_kv_bool(pk, "b_kmajor", b->b_kmajor != 0);
  fm_pack_kv_u64(pk, "lda", b->lda);
  fm_pack_kv_u64(pk, "ldb", b->ldb);
  fm_pack_kv_u64(pk, "ldc", b->ldc);
  fm_pack_kv_u64(pk, "ldd", b->ldd);
  fm_pack_kv_i64(pk, "m", b->m);
  fm_pack_kv_u64(pk, "n", b->n);
  fm_pack_kv_u64(pk, "k", b->k);
  fm_pack_cstr(pk, "align");
  rc |= msgpack_pack_array(pk, 4);
  for (int i = 0; i < 4; i++) rc |= msgpack_pack_uint32(pk, b->align[i]);
  fm_pack_kv_u64(pk, "workspace", b->workspace);
  fm_pack_cstr(pk, "scratch");
  rc |= msgpack_pack_array(pk, 2);
  /* fixed + outer * row_bytes: the product's rows come from the launch's outer, which is the
     static M when there is one, so they are never part of fixed */
  rc |= msgpack_pack_uint64(pk, scratch_fixed(m));
  rc |= msgpack_pack_uint64(pk, !is_split(m) ? 0
                                : b->batched ? (uint64_t)b->m * b->n * 2
                                             : b->n * 2 * (b->has_b2 ? 2u : 1u)); /* siblings: both products */
  fm_pack_cstr(pk, "algo");
  if (b->has_algo)
    fm_pack_bin(pk, b->algo, FM_META_ALGO_BYTES);
  else
    rc |= msgpack_pack_nil(pk);
  if (b->has_b2) fm_pack_kv_u64(pk, "b2", b->b2);
  if (b->batched) { /* last: a client that ignored it would run one product (see fm_meta.h) */
    fm_pack_cstr(pk, "batch");
    rc |= msgpack_pack_array(pk, 2);
    rc |= msgpack_pack_uint64(pk, b->stride_a);
    rc |= msgpack_pack_uint64(pk, b->stride_b);
  }
  return rc;
}

uint64_t fm_meta_scratch_result_offset(const fm_kernel_meta *m) {
  return m && m->blas.form[0] ? round256(m->blas.workspace) : 0;
}

uint64_t fm_meta_scratch_second_offset(const fm_kernel_meta *m, int64_t outer) {
  if (!m || !is_split(m) || !m->blas.has_b2) return 0;
  int64_t rows = m->blas.m >= 0 ? m->blas.m : outer;
  return rows > 0 ? (uint64_t)rows * m->blas.n * 2 : 0;
}

uint64_t fm_meta_scratch_bytes(const fm_kernel_meta *m, int64_t outer) {
  if (m && has_finish(m)) return m->finish.scratch;
  if (!m || !m->blas.form[0]) return 0;
  uint64_t fixed = scratch_fixed(m);
  if (!is_split(m)) return fixed;
  int64_t rows = m->blas.m >= 0 ? m->blas.m : outer;
  if (rows < 0) rows = 0;
  /* the matmul result, [rows, n] of a 2-byte dtype (unpack bounds n and the rows), twice for
     siblings; for a batch, outer products of [m, n] (a launch past 2^64 bytes fails its
     allocation) */
  uint64_t bytes = (uint64_t)rows * m->blas.n * 2 * (m->blas.has_b2 ? 2u : 1u);
  if (m->blas.batched && __builtin_mul_overflow(bytes, (uint64_t)(outer > 0 ? outer : 0), &bytes)) return UINT64_MAX;
  return fixed + bytes;
}

int fm_meta_pack(const fm_kernel_meta *m, msgpack_packer *pk) {
  if (!m || !pk || m->n_inputs > FM_MAX_INPUTS || m->n_outputs > FM_MAX_OUTPUTS) return FM_EINVAL;
  if (m->n_tmaps > FM_META_MAX_TMAPS) return FM_EINVAL;
  int split = is_split(m);
  int rc = msgpack_pack_map(
      pk, 9 + (has_cluster(m) ? 1 : 0) + (has_finish(m) ? 1 : 0) + (m->n_tmaps ? 1 : 0) + (m->blas.form[0] ? 1 : 0));
  fm_pack_kv_cstr(pk, "kind", m->kind);
  fm_pack_kv_cstr(pk, "entry", m->entry);
  fm_pack_cstr(pk, "block");
  rc |= msgpack_pack_array(pk, 3);
  for (int i = 0; i < 3; i++) rc |= msgpack_pack_uint32(pk, m->block[i]);
  fm_pack_kv_u64(pk, "smem", m->smem);
  fm_pack_cstr(pk, "grid");
  rc |= msgpack_pack_map(pk, 4);
  fm_pack_kv_cstr(pk, "rule", m->grid_rule);
  fm_pack_kv_u64(pk, "inner", m->inner);
  fm_pack_kv_u64(pk, "items_per_block", m->items_per_block);
  fm_pack_kv_u64(pk, "max_blocks", m->max_blocks);
  fm_pack_kv_i64(pk, "outer", m->outer);
  fm_pack_kv_u64(pk, "n_inputs", m->n_inputs);
  fm_pack_kv_u64(pk, "n_outputs", m->n_outputs);
  fm_pack_cstr(pk, "params");
  rc |= msgpack_pack_array(pk, (size_t)m->n_inputs + m->n_outputs + 1 + m->n_tmaps + n_scratch(m));
  for (uint32_t i = 0; i < m->n_inputs; i++) fm_pack_cstr(pk, "in");
  for (uint32_t i = 0; i < m->n_outputs; i++) fm_pack_cstr(pk, "out");
  fm_pack_cstr(pk, "outer");
  for (uint32_t i = 0; i < m->n_tmaps; i++) fm_pack_cstr(pk, "tmap");
  if (split || has_finish(m)) fm_pack_cstr(pk, "scratch");
  if (split && m->blas.has_b2) fm_pack_cstr(pk, "scratch2");
  if (has_cluster(m)) { /* only where there is one: every other kernel's bytes stay as they were */
    fm_pack_cstr(pk, "cluster");
    rc |= msgpack_pack_array(pk, 3);
    for (int i = 0; i < 3; i++) rc |= msgpack_pack_uint32(pk, cluster_dim(m, i));
  }
  if (has_finish(m)) {
    fm_pack_cstr(pk, "finish");
    rc |= msgpack_pack_map(pk, 5);
    fm_pack_kv_cstr(pk, "entry", m->finish.entry);
    fm_pack_kv_u64(pk, "block", m->finish.block);
    fm_pack_kv_u64(pk, "grid", m->finish.grid);
    fm_pack_kv_u64(pk, "groups", m->finish.groups);
    fm_pack_kv_u64(pk, "scratch", m->finish.scratch);
  }
  if (m->n_tmaps) {
    fm_pack_cstr(pk, "tmaps");
    rc |= msgpack_pack_array(pk, m->n_tmaps);
    for (uint32_t i = 0; i < m->n_tmaps; i++) {
      const fm_meta_tmap *t = &m->tmaps[i];
      rc |= msgpack_pack_map(pk, 6);
      fm_pack_kv_u64(pk, "input", t->input);
      fm_pack_kv_cstr(pk, "dtype", t->dtype);
      fm_pack_kv_i64(pk, "rows", t->rows);
      fm_pack_kv_u64(pk, "cols", t->cols);
      fm_pack_kv_u64(pk, "ld", t->ld);
      fm_pack_cstr(pk, "box");
      rc |= msgpack_pack_array(pk, 2);
      rc |= msgpack_pack_uint32(pk, t->box[0]);
      rc |= msgpack_pack_uint32(pk, t->box[1]);
    }
  }
  if (m->blas.form[0]) rc |= pack_blas(m, pk);
  return rc ? FM_ENOMEM : FM_OK;
}

/* A required field: absent or ill-typed both become FM_ESCHEMA, prefixed with where. */
static int required(int rc, const char *where, fm_diag *d) {
  if (rc == FM_OK) return FM_OK;
  if (rc == FM_ENOT_FOUND || rc == FM_ESCHEMA || rc == FM_ELIMIT) {
    if (d) {
      char reason[sizeof d->text];
      memcpy(reason, d->text, sizeof reason);
      fm_diag_set(d, FM_ESCHEMA, "%s: %s", where, reason);
    }
    return rc == FM_ELIMIT ? FM_ELIMIT : FM_ESCHEMA;
  }
  return rc;
}

static int get_u32(const msgpack_object *map, const char *key, const char *where, uint32_t *v, fm_diag *d) {
  uint64_t x;
  int rc = required(fm_msg_get_u64(map, key, &x, d), where, d);
  if (rc) return rc;
  if (x > UINT32_MAX)
    return fm_diag_set(d, FM_ESCHEMA, "%s: field '%s' is %" PRIu64 ", more than 32 bits", where, key, x);
  *v = (uint32_t)x;
  return FM_OK;
}

static int unpack_block(const msgpack_object *obj, fm_kernel_meta *m, fm_diag *d) {
  const msgpack_object *b = fm_msg_get(obj, "block");
  if (!b || b->type != MSGPACK_OBJECT_ARRAY || b->via.array.size != 3)
    return fm_diag_set(d, FM_ESCHEMA, "meta: 'block' must be an array of 3 integers");
  uint64_t threads = 1;
  for (int i = 0; i < 3; i++) {
    const msgpack_object *e = &b->via.array.ptr[i];
    if (e->type != MSGPACK_OBJECT_POSITIVE_INTEGER || e->via.u64 < 1 || e->via.u64 > MAX_BLOCK_THREADS)
      return fm_diag_set(d, FM_ESCHEMA, "meta: block[%d] must be an integer in 1..%u", i, MAX_BLOCK_THREADS);
    m->block[i] = (uint32_t)e->via.u64;
    threads *= e->via.u64;
  }
  if (threads > MAX_BLOCK_THREADS)
    return fm_diag_set(d, FM_ESCHEMA, "meta: block of %" PRIu64 " threads exceeds %u", threads, MAX_BLOCK_THREADS);
  return FM_OK;
}

/* The compiled-in cluster: absent is none ([1, 1, 1]); only rule "columns" sizes its grid by
 * it (grid.y), so a cluster with any other rule is refused rather than launched wrongly. */
static int unpack_cluster(const msgpack_object *obj, fm_kernel_meta *m, fm_diag *d) {
  const msgpack_object *c = fm_msg_get(obj, "cluster");
  uint64_t blocks = 1;
  for (int i = 0; i < 3; i++) m->cluster[i] = 1;
  if (!c) return FM_OK;
  if (c->type != MSGPACK_OBJECT_ARRAY || c->via.array.size != 3)
    return fm_diag_set(d, FM_ESCHEMA, "meta: 'cluster' must be an array of 3 integers");
  for (int i = 0; i < 3; i++) {
    const msgpack_object *e = &c->via.array.ptr[i];
    if (e->type != MSGPACK_OBJECT_POSITIVE_INTEGER || e->via.u64 < 1 || e->via.u64 > MAX_CLUSTER)
      return fm_diag_set(d, FM_ESCHEMA, "meta: cluster[%d] must be an integer in 1..%u", i, MAX_CLUSTER);
    m->cluster[i] = (uint32_t)e->via.u64;
    blocks *= e->via.u64;
  }
  if (blocks > MAX_CLUSTER)
    return fm_diag_set(d, FM_ESCHEMA, "meta: a cluster of %" PRIu64 " blocks exceeds %u", blocks, MAX_CLUSTER);
  if (strcmp(m->grid_rule, RULE_COLUMNS) != 0 || m->cluster[0] != 1 || m->cluster[2] != 1)
    return fm_diag_set(d, FM_ESCHEMA,
                       "meta: cluster [%u, %u, %u] with grid rule '%s' (only 'columns' takes "
                       "one: [1, S, 1])",
                       m->cluster[0], m->cluster[1], m->cluster[2], m->grid_rule);
  return FM_OK;
}

#define FINISH_MAX_SCRATCH ((uint64_t)1 << 32)

/* A split column reduction's second kernel: rule "columns" only; its grid and the groups'
 * scratch are bounded, so no reply can make a client launch a runaway grid or allocate
 * without bound (the partials: groups x reductions x N fp32, at most 4 GiB). */
static int unpack_finish(const msgpack_object *obj, fm_kernel_meta *m, fm_diag *d) {
  const msgpack_object *o = fm_msg_get(obj, "finish");
  fm_meta_finish *f = &m->finish;
  uint64_t grid, groups;
  int rc;
  if (!o) return FM_OK;
  if (o->type != MSGPACK_OBJECT_MAP) return fm_diag_set(d, FM_ESCHEMA, "meta: 'finish' must be a map");
  if (strcmp(m->grid_rule, RULE_COLUMNS) != 0)
    return fm_diag_set(d, FM_ESCHEMA, "meta: 'finish' with grid rule '%s' (only 'columns' takes one)", m->grid_rule);
  if ((rc = required(fm_msg_copy_str(o, "entry", f->entry, sizeof f->entry, d), "meta.finish", d))) return rc;
  if (!f->entry[0]) return fm_diag_set(d, FM_ESCHEMA, "meta.finish: 'entry' is empty");
  if ((rc = get_u32(o, "block", "meta.finish", &f->block, d))) return rc;
  if (f->block < 32 || f->block > MAX_BLOCK_THREADS || f->block % 32)
    return fm_diag_set(d, FM_ESCHEMA, "meta.finish: block %u (a multiple of 32 up to %u)", f->block, MAX_BLOCK_THREADS);
  if ((rc = required(fm_msg_get_u64(o, "grid", &grid, d), "meta.finish", d))) return rc;
  if ((rc = required(fm_msg_get_u64(o, "groups", &groups, d), "meta.finish", d))) return rc;
  if (grid < 1 || grid > 0x7fffffffu) return fm_diag_set(d, FM_ESCHEMA, "meta.finish: grid %" PRIu64, grid);
  if (groups < 2 || groups > FM_META_MAX_GROUPS)
    return fm_diag_set(d, FM_ESCHEMA, "meta.finish: groups %" PRIu64 " (2..%u)", groups, FM_META_MAX_GROUPS);
  f->grid = (uint32_t)grid;
  f->groups = (uint32_t)groups;
  if ((rc = required(fm_msg_get_u64(o, "scratch", &f->scratch, d), "meta.finish", d))) return rc;
  if (f->scratch == 0 || f->scratch > FINISH_MAX_SCRATCH)
    return fm_diag_set(d, FM_ESCHEMA, "meta.finish: scratch of %" PRIu64 " bytes", f->scratch);
  return FM_OK;
}

static int unpack_grid(const msgpack_object *obj, fm_kernel_meta *m, fm_diag *d) {
  const msgpack_object *g = fm_msg_get(obj, "grid");
  int rc;
  if (!g || g->type != MSGPACK_OBJECT_MAP) return fm_diag_set(d, FM_ESCHEMA, "meta: 'grid' must be a map");
  if ((rc = required(fm_msg_copy_str(g, "rule", m->grid_rule, sizeof m->grid_rule, d), "meta.grid", d))) return rc;
  /* A rule this client does not know cannot be launched correctly: refuse it here, where
   * the reason is clear, rather than compute a wrong grid later. */
  if (!fm_meta_rule_known(m->grid_rule))
    return fm_diag_set(d, FM_ESCHEMA, "meta.grid: rule '%s' is not known to this client", m->grid_rule);
  if ((rc = required(fm_msg_get_u64(g, "inner", &m->inner, d), "meta.grid", d))) return rc;
  if ((rc = required(fm_msg_get_u64(g, "items_per_block", &m->items_per_block, d), "meta.grid", d))) return rc;
  if ((rc = get_u32(g, "max_blocks", "meta.grid", &m->max_blocks, d))) return rc;
  if (m->items_per_block == 0 || m->max_blocks == 0)
    return fm_diag_set(d, FM_ESCHEMA, "meta.grid: items_per_block and max_blocks must be >= 1");
  return FM_OK;
}

/* One tensor map: every field is what the launch's encode depends on, so each is checked
 * here against the limits cuTensorMapEncodeTiled and the 128-byte swizzle impose. */
static int unpack_tmap(const msgpack_object *o, const fm_kernel_meta *m, fm_meta_tmap *t, fm_diag *d) {
  uint64_t input;
  int rc;
  if (o->type != MSGPACK_OBJECT_MAP) return fm_diag_set(d, FM_ESCHEMA, "meta.tmaps: entries must be maps");
  if ((rc = required(fm_msg_get_u64(o, "input", &input, d), "meta.tmaps", d))) return rc;
  if (input >= m->n_inputs)
    return fm_diag_set(d, FM_ESCHEMA, "meta.tmaps: input %" PRIu64 " of %u inputs", input, m->n_inputs);
  t->input = (uint32_t)input;
  if ((rc = required(fm_msg_copy_str(o, "dtype", t->dtype, sizeof t->dtype, d), "meta.tmaps", d))) return rc;
  if (strcmp(t->dtype, "bf16") != 0 && strcmp(t->dtype, "f16") != 0)
    return fm_diag_set(d, FM_ESCHEMA, "meta.tmaps: dtype '%s' (bf16 or f16)", t->dtype);
  t->elem_bytes = 2;
  if ((rc = required(fm_msg_get_i64(o, "rows", &t->rows, d), "meta.tmaps", d))) return rc;
  if ((rc = required(fm_msg_get_u64(o, "cols", &t->cols, d), "meta.tmaps", d))) return rc;
  if ((rc = required(fm_msg_get_u64(o, "ld", &t->ld, d), "meta.tmaps", d))) return rc;
  const msgpack_object *b = fm_msg_get(o, "box");
  if (!b || b->type != MSGPACK_OBJECT_ARRAY || b->via.array.size != 2)
    return fm_diag_set(d, FM_ESCHEMA, "meta.tmaps: 'box' must be [box_cols, box_rows]");
  for (int i = 0; i < 2; i++) {
    const msgpack_object *e = &b->via.array.ptr[i];
    if (e->type != MSGPACK_OBJECT_POSITIVE_INTEGER || e->via.u64 < 1 || e->via.u64 > 256)
      return fm_diag_set(d, FM_ESCHEMA, "meta.tmaps: box[%d] must be in 1..256", i);
    t->box[i] = (uint32_t)e->via.u64;
  }
  if (t->rows < -1 || t->rows == 0 || t->cols == 0 || t->cols >= (1ull << 32) ||
      (t->rows > 0 && (uint64_t)t->rows >= (1ull << 32)))
    return fm_diag_set(d, FM_ESCHEMA, "meta.tmaps: a %" PRId64 " x %" PRIu64 " matrix", t->rows, t->cols);
  if (t->ld < t->cols || (t->ld * t->elem_bytes) % 16 || t->ld >= (1ull << 36))
    return fm_diag_set(d, FM_ESCHEMA, "meta.tmaps: ld %" PRIu64 " (>= cols, 16-byte rows)", t->ld);
  if (t->box[0] * t->elem_bytes != 128)
    return fm_diag_set(d, FM_ESCHEMA, "meta.tmaps: box_cols %u is not one 128-byte swizzle row", t->box[0]);
  return FM_OK;
}

static int unpack_tmaps(const msgpack_object *obj, fm_kernel_meta *m, fm_diag *d) {
  const msgpack_object *a = fm_msg_get(obj, "tmaps");
  if (!a) return FM_OK; /* the usual case: no tensor maps */
  if (a->type != MSGPACK_OBJECT_ARRAY || a->via.array.size > FM_META_MAX_TMAPS)
    return fm_diag_set(d, FM_ESCHEMA, "meta: 'tmaps' must be an array of at most %d maps", FM_META_MAX_TMAPS);
  m->n_tmaps = a->via.array.size;
  for (uint32_t i = 0; i < m->n_tmaps; i++) {
    int rc = unpack_tmap(&a->via.array.ptr[i], m, &m->tmaps[i], d);
    if (rc) return rc;
  }
  return FM_OK;
}

#define BLAS_MAX_DIM       ((uint64_t)1 << 31)
#define BLAS_MAX_LD        ((uint64_t)1 << 40)
#define BLAS_MAX_WORKSPACE ((uint64_t)256 << 20)

static int get_index(const msgpack_object *o, const char *key, uint32_t n, int optional, int32_t *v, fm_diag *d) {
  int64_t x;
  int rc = required(fm_msg_get_i64(o, key, &x, d), "meta.blas", d);
  if (rc) return rc;
  if (x < (optional ? -1 : 0) || x >= (int64_t)n)
    return fm_diag_set(d, FM_ESCHEMA, "meta.blas: '%s' is %" PRId64 " (of %u)", key, x, n);
  *v = (int32_t)x;
  return FM_OK;
}

static int get_ld(const msgpack_object *o, const char *key, uint64_t *v, fm_diag *d) {
  int rc = required(fm_msg_get_u64(o, key, v, d), "meta.blas", d);
  if (rc == FM_OK && *v >= BLAS_MAX_LD)
    return fm_diag_set(d, FM_ESCHEMA, "meta.blas: '%s' %" PRIu64 " is too large", key, *v);
  return rc;
}

/* The cuBLASLt plan: every field the launch builds its descriptors from is checked here. */
static int unpack_blas(const msgpack_object *obj, fm_kernel_meta *m, fm_diag *d) {
  const msgpack_object *o = fm_msg_get(obj, "blas");
  fm_meta_blas *b = &m->blas;
  int32_t x = 0; /* set by each get_index that succeeds (gcc -O2 cannot tell) */
  bool flag;
  int rc;
  if (!o) return FM_OK;
  if (o->type != MSGPACK_OBJECT_MAP) return fm_diag_set(d, FM_ESCHEMA, "meta: 'blas' must be a map");
  if (strcmp(m->kind, "cublaslt") != 0)
    return fm_diag_set(d, FM_ESCHEMA, "meta: 'blas' in a kernel of kind '%s'", m->kind);
  if ((rc = required(fm_msg_copy_str(o, "form", b->form, sizeof b->form, d), "meta.blas", d))) return rc;
  if (strcmp(b->form, "direct") != 0 && strcmp(b->form, "split") != 0)
    return fm_diag_set(d, FM_ESCHEMA, "meta.blas: form '%s' (direct or split)", b->form);
  if ((rc = required(fm_msg_copy_str(o, "dtype", b->dtype, sizeof b->dtype, d), "meta.blas", d))) return rc;
  if (strcmp(b->dtype, "bf16") != 0 && strcmp(b->dtype, "f16") != 0)
    return fm_diag_set(d, FM_ESCHEMA, "meta.blas: dtype '%s' (bf16 or f16)", b->dtype);
  if ((rc = get_index(o, "a", m->n_inputs, 0, &x, d))) return rc;
  b->a = (uint32_t)x;
  if ((rc = get_index(o, "b", m->n_inputs, 0, &x, d))) return rc;
  b->b = (uint32_t)x;
  if (fm_msg_get(o, "b2")) {
    if ((rc = get_index(o, "b2", m->n_inputs, 0, &x, d))) return rc;
    b->has_b2 = 1;
    b->b2 = (uint32_t)x;
  }
  if ((rc = get_index(o, "bias", m->n_inputs, 1, &b->bias, d))) return rc;
  if ((rc = get_index(o, "c", m->n_inputs, 1, &b->c, d))) return rc;
  if ((rc = get_index(o, "out", m->n_outputs, 0, &x, d))) return rc;
  b->out = (uint32_t)x;
  if ((rc = required(fm_msg_copy_str(o, "act", b->act, sizeof b->act, d), "meta.blas", d))) return rc;
  if (strcmp(b->act, "none") != 0 && strcmp(b->act, "relu") != 0 && strcmp(b->act, "gelu_tanh") != 0)
    return fm_diag_set(d, FM_ESCHEMA, "meta.blas: act '%s' (none, relu or gelu_tanh)", b->act);
  if ((b->has_b2 || b->batched) && !is_split(m))
    return fm_diag_set(d, FM_ESCHEMA, "meta.blas: a sibling or batched plan is the split form");
  if (is_split(m) && (b->bias >= 0 || b->c >= 0 || strcmp(b->act, "none") != 0))
    return fm_diag_set(d, FM_ESCHEMA, "meta.blas: the split form takes no bias, c or act");
  if ((rc = required(fm_msg_get_bool(o, "a_kmajor", &flag, d), "meta.blas", d))) return rc;
  b->a_kmajor = flag;
  if ((rc = required(fm_msg_get_bool(o, "b_kmajor", &flag, d), "meta.blas", d))) return rc;
  b->b_kmajor = flag;
  if ((rc = get_ld(o, "lda", &b->lda, d)) || (rc = get_ld(o, "ldb", &b->ldb, d)) ||
      (rc = get_ld(o, "ldc", &b->ldc, d)) || (rc = get_ld(o, "ldd", &b->ldd, d)))
    return rc;
  if ((rc = required(fm_msg_get_i64(o, "m", &b->m, d), "meta.blas", d))) return rc;
  if ((rc = required(fm_msg_get_u64(o, "n", &b->n, d), "meta.blas", d))) return rc;
  if ((rc = required(fm_msg_get_u64(o, "k", &b->k, d), "meta.blas", d))) return rc;
  if (b->m < -1 || b->m == 0 || (b->m > 0 && (uint64_t)b->m >= BLAS_MAX_DIM) || b->n == 0 || b->n >= BLAS_MAX_DIM ||
      b->k == 0 || b->k >= BLAS_MAX_DIM)
    return fm_diag_set(d, FM_ESCHEMA, "meta.blas: a %" PRId64 " x %" PRIu64 " x %" PRIu64 " product", b->m, b->n, b->k);
  const msgpack_object *al = fm_msg_get(o, "align");
  if (!al || al->type != MSGPACK_OBJECT_ARRAY || al->via.array.size != 4)
    return fm_diag_set(d, FM_ESCHEMA, "meta.blas: 'align' must be [a, b, c, d]");
  for (int i = 0; i < 4; i++) {
    const msgpack_object *e = &al->via.array.ptr[i];
    if (e->type != MSGPACK_OBJECT_POSITIVE_INTEGER || e->via.u64 < 1 || e->via.u64 > FM_MAX_ALIGN ||
        (e->via.u64 & (e->via.u64 - 1)))
      return fm_diag_set(d, FM_ESCHEMA, "meta.blas: align[%d] must be a power of two up to %u", i, FM_MAX_ALIGN);
    b->align[i] = (uint32_t)e->via.u64;
  }
  if ((rc = required(fm_msg_get_u64(o, "workspace", &b->workspace, d), "meta.blas", d))) return rc;
  if (b->workspace > BLAS_MAX_WORKSPACE)
    return fm_diag_set(d, FM_ESCHEMA, "meta.blas: workspace of %" PRIu64 " bytes", b->workspace);
  const msgpack_object *algo = fm_msg_get(o, "algo");
  if (!algo) return fm_diag_set(d, FM_ESCHEMA, "meta.blas: missing 'algo'");
  if (algo->type == MSGPACK_OBJECT_BIN) {
    if (algo->via.bin.size != FM_META_ALGO_BYTES)
      return fm_diag_set(d, FM_ESCHEMA, "meta.blas: algo of %u bytes (%d)", algo->via.bin.size, FM_META_ALGO_BYTES);
    memcpy(b->algo, algo->via.bin.ptr, FM_META_ALGO_BYTES);
    b->has_algo = 1;
  } else if (algo->type != MSGPACK_OBJECT_NIL) {
    return fm_diag_set(d, FM_ESCHEMA, "meta.blas: 'algo' must be 64 bytes or nil");
  }
  const msgpack_object *batch = fm_msg_get(o, "batch");
  if (batch) {
    if (batch->type != MSGPACK_OBJECT_ARRAY || batch->via.array.size != 2 ||
        batch->via.array.ptr[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
        batch->via.array.ptr[1].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
        batch->via.array.ptr[0].via.u64 >= (uint64_t)FM_MAX_STRIDE ||
        batch->via.array.ptr[1].via.u64 >= (uint64_t)FM_MAX_STRIDE)
      return fm_diag_set(d, FM_ESCHEMA, "meta.blas: 'batch' must be [stride_a, stride_b]");
    if (!is_split(m) || b->m < 1)
      return fm_diag_set(d, FM_ESCHEMA, "meta.blas: a batched plan is the split form of a static M");
    b->batched = 1;
    b->stride_a = batch->via.array.ptr[0].via.u64;
    b->stride_b = batch->via.array.ptr[1].via.u64;
  }
  return FM_OK;
}

/* What ties the rule, the entry and the plan together: a "none" rule launches no kernel, so
 * it is only right for a direct plan, and every other launch needs a kernel. */
static int check_plan(const fm_kernel_meta *m, fm_diag *d) {
  int none = strcmp(m->grid_rule, RULE_NONE) == 0, direct = strcmp(m->blas.form, "direct") == 0;
  if (strcmp(m->kind, "cublaslt") == 0 && !m->blas.form[0])
    return fm_diag_set(d, FM_ESCHEMA, "meta: kind 'cublaslt' without 'blas'");
  if (none != direct)
    return fm_diag_set(d, FM_ESCHEMA, "meta: grid rule '%s' with %s plan", m->grid_rule,
                       direct ? "a direct" : "no direct");
  if (!direct && m->entry[0] == '\0') return fm_diag_set(d, FM_ESCHEMA, "meta: 'entry' is empty");
  if (m->blas.batched != (strcmp(m->grid_rule, RULE_BATCHED) == 0 && m->blas.form[0]))
    return fm_diag_set(d, FM_ESCHEMA, "meta: a batched plan's kernel has grid rule 'batched' (and only it)");
  if (direct && m->n_tmaps) return fm_diag_set(d, FM_ESCHEMA, "meta: tensor maps without a kernel");
  return FM_OK;
}

/* params must be exactly the documented order: "in" x n_inputs, "out" x n_outputs, "outer",
 * "tmap" x n_tmaps, then "scratch" (and "scratch2") for a split cuBLASLt plan or a split
 * column reduction. */
static int check_params(const msgpack_object *obj, const fm_kernel_meta *m, fm_diag *d) {
  const msgpack_object *p = fm_msg_get(obj, "params");
  uint32_t ns = n_scratch(m), n = m->n_inputs + m->n_outputs + 1 + m->n_tmaps + ns;
  if (!p || p->type != MSGPACK_OBJECT_ARRAY || p->via.array.size != n)
    return fm_diag_set(d, FM_ESCHEMA, "meta: 'params' must be an array of %u names", n);
  for (uint32_t i = 0; i < n; i++) {
    const char *want = i < m->n_inputs                   ? "in"
                       : i < m->n_inputs + m->n_outputs  ? "out"
                       : i == m->n_inputs + m->n_outputs ? "outer"
                       : i < n - ns                      ? "tmap"
                       : i == n - ns                     ? "scratch"
                                                         : "scratch2";
    if (!fm_msg_str_eq(&p->via.array.ptr[i], want))
      return fm_diag_set(d, FM_ESCHEMA, "meta: params[%u] must be \"%s\"", i, want);
  }
  return FM_OK;
}

int fm_meta_unpack(const msgpack_object *obj, fm_kernel_meta *m, fm_diag *d) {
  int rc;
  if (!obj || !m) return fm_diag_set(d, FM_EINVAL, "fm_meta_unpack: NULL argument");
  memset(m, 0, sizeof *m);
  if (obj->type != MSGPACK_OBJECT_MAP) return fm_diag_set(d, FM_ESCHEMA, "meta: expected a map");
  if ((rc = required(fm_msg_copy_str(obj, "kind", m->kind, sizeof m->kind, d), "meta", d))) return rc;
  if ((rc = required(fm_msg_copy_str(obj, "entry", m->entry, sizeof m->entry, d), "meta", d))) return rc;
  if ((rc = unpack_block(obj, m, d))) return rc;
  if ((rc = get_u32(obj, "smem", "meta", &m->smem, d))) return rc;
  if ((rc = unpack_grid(obj, m, d))) return rc;
  if ((rc = required(fm_msg_get_i64(obj, "outer", &m->outer, d), "meta", d))) return rc;
  if (m->outer < -1) return fm_diag_set(d, FM_ESCHEMA, "meta: outer %" PRId64 " < -1", m->outer);
  if ((rc = get_u32(obj, "n_inputs", "meta", &m->n_inputs, d))) return rc;
  if ((rc = get_u32(obj, "n_outputs", "meta", &m->n_outputs, d))) return rc;
  if (m->n_inputs > FM_MAX_INPUTS || m->n_outputs > FM_MAX_OUTPUTS)
    return fm_diag_set(d, FM_ESCHEMA, "meta: %u inputs / %u outputs exceed %d / %d", m->n_inputs, m->n_outputs,
                       FM_MAX_INPUTS, FM_MAX_OUTPUTS);
  if ((rc = unpack_cluster(obj, m, d))) return rc;
  if ((rc = unpack_finish(obj, m, d))) return rc;
  if ((rc = unpack_tmaps(obj, m, d))) return rc;
  if ((rc = unpack_blas(obj, m, d))) return rc;
  if ((rc = check_plan(m, d))) return rc;
  return check_params(obj, m, d);
}

int fm_meta_rule_known(const char *rule) {
  return rule && (strcmp(rule, RULE_ELEMENTWISE) == 0 || strcmp(rule, RULE_ROWS) == 0 ||
                  strcmp(rule, RULE_TILES) == 0 || strcmp(rule, RULE_PERSISTENT) == 0 || strcmp(rule, RULE_NONE) == 0 ||
                  strcmp(rule, RULE_BATCHED) == 0 || strcmp(rule, RULE_COLUMNS) == 0);
}

static int is_tiles(const fm_kernel_meta *m) { return strncmp(m->grid_rule, RULE_TILES, sizeof m->grid_rule) == 0; }

static int is_batched(const fm_kernel_meta *m) { return strncmp(m->grid_rule, RULE_BATCHED, sizeof m->grid_rule) == 0; }

static int is_columns(const fm_kernel_meta *m) { return strncmp(m->grid_rule, RULE_COLUMNS, sizeof m->grid_rule) == 0; }

/* "columns": a block per strip of columns (max_blocks strips) times the cluster's S blocks
 * sharing its rows, times the G groups of a split reduction (grid.y); launched for every
 * M >= 0, M = 0 too (the results are still written: sum 0, mean NaN, amax -inf). */
static uint64_t columns_grid(const fm_kernel_meta *m, int64_t outer, int dim) {
  int64_t o = m->outer >= 0 ? m->outer : outer;
  if (o < 0 || m->max_blocks == 0) return 0;
  uint64_t groups = has_finish(m) ? m->finish.groups : 1;
  return dim == 0 ? m->max_blocks : dim == 1 ? cluster_dim(m, 1) * groups : 1;
}

/* "batched": the products (grid.z) of the launch: outer, or the static batch. */
uint64_t fm_meta_grid_z(const fm_kernel_meta *m, int64_t outer) {
  if (m && is_columns(m)) return columns_grid(m, outer, 2);
  if (!m || !is_batched(m)) return m && fm_meta_grid_x(m, outer) ? 1 : 0;
  int64_t o = m->outer >= 0 ? m->outer : outer;
  if (o <= 0 || m->inner == 0 || m->items_per_block == 0 || m->max_blocks == 0) return 0;
  return (uint64_t)o;
}

uint64_t fm_meta_grid_y(const fm_kernel_meta *m, int64_t outer) {
  if (m && is_columns(m)) return columns_grid(m, outer, 1);
  if (m && is_batched(m)) { /* the row tiles of one product: inner = its static M */
    if (!fm_meta_grid_z(m, outer)) return 0;
    return m->inner / m->items_per_block + (m->inner % m->items_per_block != 0);
  }
  if (!m || !is_tiles(m)) return m && fm_meta_grid_x(m, outer) ? 1 : 0;
  int64_t o = m->outer >= 0 ? m->outer : outer;
  if (o <= 0 || m->items_per_block == 0 || m->max_blocks == 0) return 0;
  return (uint64_t)o / m->items_per_block + ((uint64_t)o % m->items_per_block != 0);
}

/* "persistent": ceil(outer / items_per_block) row tiles times `inner` column tiles, at most
 * max_blocks blocks (the kernel strides over the tiles, so any grid is correct). */
static uint64_t persistent_grid(const fm_kernel_meta *m, int64_t outer) {
  int64_t o = m->outer >= 0 ? m->outer : outer;
  if (o <= 0 || m->items_per_block == 0 || m->inner == 0) return 0;
  uint64_t rows = (uint64_t)o / m->items_per_block + ((uint64_t)o % m->items_per_block != 0), tiles;
  if (__builtin_mul_overflow(rows, m->inner, &tiles)) tiles = UINT64_MAX;
  return m->max_blocks && tiles > m->max_blocks ? m->max_blocks : tiles;
}

uint64_t fm_meta_grid_x(const fm_kernel_meta *m, int64_t outer) {
  if (m && is_columns(m)) return columns_grid(m, outer, 0);
  if (m && (is_tiles(m) || is_batched(m))) return fm_meta_grid_y(m, outer) ? m->max_blocks : 0;
  if (m && strncmp(m->grid_rule, RULE_PERSISTENT, sizeof m->grid_rule) == 0) return persistent_grid(m, outer);
  /* "rows" counts rows (inner = rows per unit of dim 0, items_per_block = rows per block)
   * where "elementwise" counts elements: the arithmetic is the same. */
  if (!m ||
      (strncmp(m->grid_rule, RULE_ELEMENTWISE, sizeof m->grid_rule) != 0 &&
       strncmp(m->grid_rule, RULE_ROWS, sizeof m->grid_rule) != 0) ||
      m->items_per_block == 0)
    return 0;
  /* A static fragment's launch size is fixed by the kernel, whatever the caller passes. */
  int64_t o = m->outer >= 0 ? m->outer : outer;
  if (o <= 0 || m->inner == 0) return 0;
  uint64_t n;
  if (__builtin_mul_overflow((uint64_t)o, m->inner, &n)) n = UINT64_MAX;
  uint64_t g = n / m->items_per_block + (n % m->items_per_block != 0);
  if (m->max_blocks && g > m->max_blocks) g = m->max_blocks;
  return g;
}
