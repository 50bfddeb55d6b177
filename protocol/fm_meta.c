/* fm_meta.c: launch metadata to and from its wire form (fm_meta.h).
 *
 * Unpacking is strict about what a launch depends on (block, grid rule, parameter list) and
 * ignores keys it does not know, so a newer daemon can add fields without breaking clients. */
#include "fm_meta.h"

#include <inttypes.h>
#include <string.h>

#include "fm_fragment.h"
#include "fm_msg.h"

#define RULE_ELEMENTWISE "elementwise"
#define RULE_ROWS "rows"
#define RULE_TILES "tiles"
#define MAX_BLOCK_THREADS 1024u

int fm_meta_pack(const fm_kernel_meta *m, msgpack_packer *pk) {
  if (!m || !pk || m->n_inputs > FM_MAX_INPUTS || m->n_outputs > FM_MAX_OUTPUTS) return FM_EINVAL;
  int rc = msgpack_pack_map(pk, 9);
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
  rc |= msgpack_pack_array(pk, (size_t)m->n_inputs + m->n_outputs + 1);
  for (uint32_t i = 0; i < m->n_inputs; i++) fm_pack_cstr(pk, "in");
  for (uint32_t i = 0; i < m->n_outputs; i++) fm_pack_cstr(pk, "out");
  fm_pack_cstr(pk, "outer");
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

static int get_u32(const msgpack_object *map, const char *key, const char *where, uint32_t *v,
                   fm_diag *d) {
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
      return fm_diag_set(d, FM_ESCHEMA, "meta: block[%d] must be an integer in 1..%u", i,
                         MAX_BLOCK_THREADS);
    m->block[i] = (uint32_t)e->via.u64;
    threads *= e->via.u64;
  }
  if (threads > MAX_BLOCK_THREADS)
    return fm_diag_set(d, FM_ESCHEMA, "meta: block of %" PRIu64 " threads exceeds %u", threads,
                       MAX_BLOCK_THREADS);
  return FM_OK;
}

static int unpack_grid(const msgpack_object *obj, fm_kernel_meta *m, fm_diag *d) {
  const msgpack_object *g = fm_msg_get(obj, "grid");
  int rc;
  if (!g || g->type != MSGPACK_OBJECT_MAP)
    return fm_diag_set(d, FM_ESCHEMA, "meta: 'grid' must be a map");
  if ((rc = required(fm_msg_copy_str(g, "rule", m->grid_rule, sizeof m->grid_rule, d), "meta.grid", d)))
    return rc;
  /* A rule this client does not know cannot be launched correctly: refuse it here, where
   * the reason is clear, rather than compute a wrong grid later. */
  if (strcmp(m->grid_rule, RULE_ELEMENTWISE) != 0 && strcmp(m->grid_rule, RULE_ROWS) != 0 &&
      strcmp(m->grid_rule, RULE_TILES) != 0)
    return fm_diag_set(d, FM_ESCHEMA, "meta.grid: rule '%s' is not known to this client",
                       m->grid_rule);
  if ((rc = required(fm_msg_get_u64(g, "inner", &m->inner, d), "meta.grid", d))) return rc;
  if ((rc = required(fm_msg_get_u64(g, "items_per_block", &m->items_per_block, d), "meta.grid", d)))
    return rc;
  if ((rc = get_u32(g, "max_blocks", "meta.grid", &m->max_blocks, d))) return rc;
  if (m->items_per_block == 0 || m->max_blocks == 0)
    return fm_diag_set(d, FM_ESCHEMA, "meta.grid: items_per_block and max_blocks must be >= 1");
  return FM_OK;
}

/* params must be exactly the documented order: "in" x n_inputs, "out" x n_outputs, "outer". */
static int check_params(const msgpack_object *obj, const fm_kernel_meta *m, fm_diag *d) {
  const msgpack_object *p = fm_msg_get(obj, "params");
  uint32_t n = m->n_inputs + m->n_outputs + 1;
  if (!p || p->type != MSGPACK_OBJECT_ARRAY || p->via.array.size != n)
    return fm_diag_set(d, FM_ESCHEMA, "meta: 'params' must be an array of %u names", n);
  for (uint32_t i = 0; i < n; i++) {
    const char *want = i < m->n_inputs ? "in" : i < m->n_inputs + m->n_outputs ? "out" : "outer";
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
  if ((rc = required(fm_msg_copy_str(obj, "entry", m->entry, sizeof m->entry, d), "meta", d)))
    return rc;
  if (m->entry[0] == '\0') return fm_diag_set(d, FM_ESCHEMA, "meta: 'entry' is empty");
  if ((rc = unpack_block(obj, m, d))) return rc;
  if ((rc = get_u32(obj, "smem", "meta", &m->smem, d))) return rc;
  if ((rc = unpack_grid(obj, m, d))) return rc;
  if ((rc = required(fm_msg_get_i64(obj, "outer", &m->outer, d), "meta", d))) return rc;
  if (m->outer < -1) return fm_diag_set(d, FM_ESCHEMA, "meta: outer %" PRId64 " < -1", m->outer);
  if ((rc = get_u32(obj, "n_inputs", "meta", &m->n_inputs, d))) return rc;
  if ((rc = get_u32(obj, "n_outputs", "meta", &m->n_outputs, d))) return rc;
  if (m->n_inputs > FM_MAX_INPUTS || m->n_outputs > FM_MAX_OUTPUTS)
    return fm_diag_set(d, FM_ESCHEMA, "meta: %u inputs / %u outputs exceed %d / %d", m->n_inputs,
                       m->n_outputs, FM_MAX_INPUTS, FM_MAX_OUTPUTS);
  return check_params(obj, m, d);
}

static int is_tiles(const fm_kernel_meta *m) {
  return strncmp(m->grid_rule, RULE_TILES, sizeof m->grid_rule) == 0;
}

uint64_t fm_meta_grid_y(const fm_kernel_meta *m, int64_t outer) {
  if (!m || !is_tiles(m)) return m && fm_meta_grid_x(m, outer) ? 1 : 0;
  int64_t o = m->outer >= 0 ? m->outer : outer;
  if (o <= 0 || m->items_per_block == 0 || m->max_blocks == 0) return 0;
  return (uint64_t)o / m->items_per_block + ((uint64_t)o % m->items_per_block != 0);
}

uint64_t fm_meta_grid_x(const fm_kernel_meta *m, int64_t outer) {
  if (m && is_tiles(m)) return fm_meta_grid_y(m, outer) ? m->max_blocks : 0;
  /* "rows" counts rows (inner = rows per unit of dim 0, items_per_block = rows per block)
   * where "elementwise" counts elements: the arithmetic is the same. */
  if (!m || (strncmp(m->grid_rule, RULE_ELEMENTWISE, sizeof m->grid_rule) != 0 &&
             strncmp(m->grid_rule, RULE_ROWS, sizeof m->grid_rule) != 0) ||
      m->items_per_block == 0) return 0;
  /* A static fragment's launch size is fixed by the kernel, whatever the caller passes. */
  int64_t o = m->outer >= 0 ? m->outer : outer;
  if (o <= 0 || m->inner == 0) return 0;
  uint64_t n;
  if (__builtin_mul_overflow((uint64_t)o, m->inner, &n)) n = UINT64_MAX;
  uint64_t g = n / m->items_per_block + (n % m->items_per_block != 0);
  if (m->max_blocks && g > m->max_blocks) g = m->max_blocks;
  return g;
}
