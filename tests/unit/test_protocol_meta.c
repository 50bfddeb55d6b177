/* test_protocol_meta.c: launch metadata round trip, refusals, grid size; cuBLASLt plans
 * (the "blas" key): both forms' round trip, their scratch size, grid rule "none" and every
 * refusal of a plan that does not fit its kernel. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fm_error.h"
#include "fm_meta.h"
#include "fm_msg.h"
#include "fm_test.h"

static fm_kernel_meta sample(void) {
  fm_kernel_meta m;
  memset(&m, 0, sizeof m);
  strcpy(m.kind, "pointwise");
  strcpy(m.entry, "fm_pw_3f2a");
  m.block[0] = 256;
  m.block[1] = m.block[2] = 1;
  m.smem = 0;
  strcpy(m.grid_rule, "elementwise");
  m.inner = 768;
  m.items_per_block = 2048;
  m.max_blocks = 528;
  m.outer = -1;
  m.n_inputs = 2;
  m.n_outputs = 1;
  return m;
}

/* Packs m, unpacks into out; returns fm_meta_unpack's code. */
static int round_trip(const fm_kernel_meta *m, fm_kernel_meta *out, fm_diag *d) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  int rc = fm_meta_pack(m, &pk);
  if (!rc) {
    msgpack_zone zone;
    msgpack_object o;
    msgpack_zone_init(&zone, 1024);
    rc = fm_msg_unpack((uint8_t *)sb.data, sb.size, &fm_msg_reply_limits, &zone, &o, d);
    if (!rc) rc = fm_meta_unpack(&o, out, d);
    msgpack_zone_destroy(&zone);
  }
  msgpack_sbuffer_destroy(&sb);
  return rc;
}

/* A refusal: FM_ESCHEMA with diag in its reason (what and i name the case when it is not). */
static void expect_schema(const char *what, size_t i, int rc, const fm_diag *d, const char *diag) {
  if (rc != FM_ESCHEMA || !strstr(d->text, diag))
    fprintf(stderr, "  %s case %zu: rc %d \"%s\"\n", what, i, rc, d->text);
  CHECK_EQ_INT(rc, FM_ESCHEMA);
  CHECK_STR_CONTAINS(d->text, diag);
}

static void test_round_trip(void) {
  fm_kernel_meta m = sample(), back;
  fm_diag d = {{0}};
  CHECK_EQ_INT(round_trip(&m, &back, &d), FM_OK);
  CHECK(strcmp(back.kind, "pointwise") == 0 && strcmp(back.entry, "fm_pw_3f2a") == 0);
  CHECK(back.block[0] == 256 && back.block[1] == 1 && back.block[2] == 1);
  CHECK(strcmp(back.grid_rule, "elementwise") == 0);
  CHECK(back.inner == 768 && back.items_per_block == 2048 && back.max_blocks == 528);
  CHECK(back.outer == -1 && back.n_inputs == 2 && back.n_outputs == 1 && back.smem == 0);
  m.outer = 4096;
  m.smem = 1024;
  CHECK_EQ_INT(round_trip(&m, &back, &d), FM_OK);
  CHECK(back.outer == 4096 && back.smem == 1024);
}

static void test_wire_form(void) {
  fm_kernel_meta m = sample();
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  CHECK_EQ_INT(fm_meta_pack(&m, &pk), FM_OK);
  msgpack_zone zone;
  msgpack_object o;
  fm_diag d = {{0}};
  msgpack_zone_init(&zone, 1024);
  CHECK_EQ_INT(fm_msg_unpack((uint8_t *)sb.data, sb.size, &fm_msg_reply_limits, &zone, &o, &d), FM_OK);
  static const char *keys[] = {"kind", "entry", "block", "smem", "grid", "outer", "n_inputs", "n_outputs", "params"};
  CHECK_EQ_INT(o.via.map.size, 9);
  for (uint32_t i = 0; i < o.via.map.size && i < 9; i++) CHECK(fm_msg_str_eq(&o.via.map.ptr[i].key, keys[i]));
  const msgpack_object *p = fm_msg_get(&o, "params");
  CHECK_EQ_INT(p->via.array.size, 4);
  CHECK(fm_msg_str_eq(&p->via.array.ptr[0], "in") && fm_msg_str_eq(&p->via.array.ptr[1], "in") &&
        fm_msg_str_eq(&p->via.array.ptr[2], "out") && fm_msg_str_eq(&p->via.array.ptr[3], "outer"));
  msgpack_zone_destroy(&zone);
  msgpack_sbuffer_destroy(&sb);
}

/* Packs fn over the value of `key` while copying map; with sub, edits key `sub` of the map
 * under `key` instead; a NULL fn drops the key. */
typedef void (*override_fn)(msgpack_packer *pk);
static void repack(msgpack_packer *pk, const msgpack_object *map, const char *key, const char *sub, override_fn fn) {
  msgpack_pack_map(pk, map->via.map.size - (fn || sub ? 0 : 1));
  for (uint32_t i = 0; i < map->via.map.size; i++) {
    const msgpack_object_kv *kv = &map->via.map.ptr[i];
    int hit = fm_msg_str_eq(&kv->key, key);
    if (hit && !sub && !fn) continue;
    msgpack_pack_object(pk, kv->key);
    if (!hit)
      msgpack_pack_object(pk, kv->val);
    else if (sub)
      repack(pk, &kv->val, sub, NULL, fn);
    else
      fn(pk);
  }
}

/* Packs m with one field changed (repack) and unpacks it; returns the first error. */
static int unpack_edit(const fm_kernel_meta *m, const char *key, const char *sub, override_fn fn, fm_diag *d) {
  fm_kernel_meta out;
  msgpack_sbuffer sb, sb2;
  msgpack_packer pk, pk2;
  msgpack_zone zone, zone2;
  msgpack_object o, o2;
  msgpack_sbuffer_init(&sb);
  msgpack_sbuffer_init(&sb2);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_packer_init(&pk2, &sb2, msgpack_sbuffer_write);
  msgpack_zone_init(&zone, 1024);
  msgpack_zone_init(&zone2, 1024);
  int rc = fm_meta_pack(m, &pk);
  if (!rc) rc = fm_msg_unpack((uint8_t *)sb.data, sb.size, &fm_msg_reply_limits, &zone, &o, d);
  if (!rc) repack(&pk2, &o, key, sub, fn);
  if (!rc) rc = fm_msg_unpack((uint8_t *)sb2.data, sb2.size, &fm_msg_reply_limits, &zone2, &o2, d);
  if (!rc) rc = fm_meta_unpack(&o2, &out, d);
  msgpack_zone_destroy(&zone2);
  msgpack_zone_destroy(&zone);
  msgpack_sbuffer_destroy(&sb2);
  msgpack_sbuffer_destroy(&sb);
  return rc;
}

static int unpack_with(const char *key, override_fn fn, fm_diag *d) {
  fm_kernel_meta m = sample();
  return unpack_edit(&m, key, NULL, fn, d);
}

static void block_2048(msgpack_packer *pk) {
  msgpack_pack_array(pk, 3);
  msgpack_pack_uint32(pk, 64);
  msgpack_pack_uint32(pk, 32);
  msgpack_pack_uint32(pk, 1);
}
static void block_two(msgpack_packer *pk) {
  msgpack_pack_array(pk, 2);
  msgpack_pack_uint32(pk, 64);
  msgpack_pack_uint32(pk, 1);
}
static void as_str(msgpack_packer *pk) { fm_pack_cstr(pk, "x"); }
static void grid_unknown_rule(msgpack_packer *pk) {
  msgpack_pack_map(pk, 4);
  fm_pack_kv_cstr(pk, "rule", "rowwise");
  fm_pack_kv_u64(pk, "inner", 1);
  fm_pack_kv_u64(pk, "items_per_block", 1);
  fm_pack_kv_u64(pk, "max_blocks", 1);
}
static void grid_zero_items(msgpack_packer *pk) {
  msgpack_pack_map(pk, 4);
  fm_pack_kv_cstr(pk, "rule", "elementwise");
  fm_pack_kv_u64(pk, "inner", 1);
  fm_pack_kv_u64(pk, "items_per_block", 0);
  fm_pack_kv_u64(pk, "max_blocks", 1);
}
static void params_wrong(msgpack_packer *pk) {
  msgpack_pack_array(pk, 4);
  fm_pack_cstr(pk, "in");
  fm_pack_cstr(pk, "out");
  fm_pack_cstr(pk, "in");
  fm_pack_cstr(pk, "outer");
}
static void outer_minus_two(msgpack_packer *pk) { msgpack_pack_int64(pk, -2); }
static void long_entry(msgpack_packer *pk) {
  char s[FM_META_ENTRY_MAX + 1];
  memset(s, 'k', sizeof s - 1);
  s[sizeof s - 1] = '\0';
  fm_pack_cstr(pk, s);
}
static void too_big_u32(msgpack_packer *pk) { msgpack_pack_uint64(pk, (uint64_t)1 << 32); }

static void test_refusals(void) {
  struct {
    const char *key;
    override_fn fn;
    const char *diag;
  } cases[] = {
      {"kind", NULL, "meta: missing field 'kind'"},
      {"entry", long_entry, "meta: field 'entry'"},
      {"block", block_2048, "block of 2048 threads"},
      {"block", block_two, "'block' must be an array of 3"},
      {"smem", as_str, "meta: field 'smem': expected an unsigned integer"},
      {"smem", too_big_u32, "more than 32 bits"},
      {"grid", grid_unknown_rule, "rule 'rowwise' is not known"},
      {"grid", grid_zero_items, "items_per_block and max_blocks must be >= 1"},
      {"grid", NULL, "'grid' must be a map"},
      {"outer", outer_minus_two, "outer -2"},
      {"params", params_wrong, "params[1] must be \"in\""},
      {"params", NULL, "'params' must be an array of 4"},
      {"n_inputs", NULL, "missing field 'n_inputs'"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    fm_diag d = {{0}};
    int rc = unpack_with(cases[i].key, cases[i].fn, &d);
    if (rc == FM_OK || !strstr(d.text, cases[i].diag))
      fprintf(stderr, "  case %zu (%s): rc %d \"%s\"\n", i, cases[i].key, rc, d.text);
    CHECK(rc == FM_ESCHEMA || rc == FM_ELIMIT);
    CHECK_STR_CONTAINS(d.text, cases[i].diag);
  }
  /* an unknown extra key is ignored: newer daemons may add fields */
  fm_diag d = {{0}};
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  fm_kernel_meta m = sample(), out;
  fm_meta_pack(&m, &pk);
  sb.data[0] = (char)0x8a; /* 9 entries -> 10 */
  fm_pack_kv_u64(&pk, "future", 1);
  msgpack_zone zone;
  msgpack_object o;
  msgpack_zone_init(&zone, 1024);
  CHECK_EQ_INT(fm_msg_unpack((uint8_t *)sb.data, sb.size, &fm_msg_reply_limits, &zone, &o, &d), FM_OK);
  CHECK_EQ_INT(fm_meta_unpack(&o, &out, &d), FM_OK);
  msgpack_zone_destroy(&zone);
  msgpack_sbuffer_destroy(&sb);
}

/* A gemm meta with the TMA mainloop's two tensor maps. */
static fm_kernel_meta with_tmaps(void) {
  fm_kernel_meta m = sample();
  strcpy(m.kind, "gemm");
  strcpy(m.grid_rule, "tiles");
  m.n_inputs = 3;
  m.n_tmaps = 2;
  for (int i = 0; i < 2; i++) {
    fm_meta_tmap *t = &m.tmaps[i];
    t->input = (uint32_t)i;
    strcpy(t->dtype, i ? "f16" : "bf16");
    t->elem_bytes = 2;
    t->rows = i ? 1024 : -1;
    t->cols = 4096;
    t->ld = 4104;
    t->box[0] = 64;
    t->box[1] = i ? 256 : 128;
  }
  return m;
}

/* Tensor maps travel after the other keys, add "tmap" params after "outer", and every field
 * the encode depends on is checked: a bad one is refused with its reason. */
static void test_tmaps(void) {
  fm_kernel_meta m = with_tmaps(), back;
  fm_diag d = {{0}};
  CHECK_EQ_INT(round_trip(&m, &back, &d), FM_OK);
  CHECK_EQ_INT((int)back.n_tmaps, 2);
  for (int i = 0; i < 2; i++) {
    CHECK_EQ_INT((int)back.tmaps[i].input, i);
    CHECK_EQ_INT((int)back.tmaps[i].rows, i ? 1024 : -1);
    CHECK(back.tmaps[i].cols == 4096 && back.tmaps[i].ld == 4104 && back.tmaps[i].elem_bytes == 2);
    CHECK(back.tmaps[i].box[0] == 64 && back.tmaps[i].box[1] == (i ? 256u : 128u));
  }
  CHECK(strcmp(back.tmaps[0].dtype, "bf16") == 0 && strcmp(back.tmaps[1].dtype, "f16") == 0);
  /* no tensor maps: the wire form stays the 9 keys (test_wire_form) */
  m = sample();
  CHECK_EQ_INT(round_trip(&m, &back, &d), FM_OK);
  CHECK_EQ_INT((int)back.n_tmaps, 0);

  struct {
    int field;
    const char *diag;
  } bad[] = {
      {0, "input 3 of 3 inputs"},
      {1, "dtype 'f32'"},
      {2, "not one 128-byte swizzle row"},
      {3, "ld 100"},
      {4, "a 0 x 4096 matrix"},
      {5, "box[1] must be in 1..256"},
      {6, "ld 4100"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    m = with_tmaps();
    fm_meta_tmap *t = &m.tmaps[1];
    switch (bad[i].field) {
      case 0:
        t->input = 3;
        break;
      case 1:
        strcpy(t->dtype, "f32");
        break;
      case 2:
        t->box[0] = 32;
        break;
      case 3:
        t->ld = 100;
        break;
      case 4:
        t->rows = 0;
        break;
      case 5:
        t->box[1] = 512;
        break;
      case 6:
        t->ld = 4100;
        break; /* 8200 bytes: rows not 16-byte aligned */
    }
    memset(&d, 0, sizeof d);
    expect_schema("tmap", i, round_trip(&m, &back, &d), &d, bad[i].diag);
  }
  /* more tensor maps than a launch holds are refused when packing */
  m = with_tmaps();
  m.n_tmaps = FM_META_MAX_TMAPS + 1;
  CHECK_EQ_INT(round_trip(&m, &back, &d), FM_EINVAL);
}

static void test_grid_x(void) {
  fm_kernel_meta m = sample(); /* inner 768, 2048 per block, cap 528, symbolic */
  CHECK_EQ_INT(fm_meta_grid_x(&m, 0), 0);
  CHECK_EQ_INT(fm_meta_grid_x(&m, -5), 0);
  CHECK_EQ_INT(fm_meta_grid_x(&m, 1), 1);           /* 768 items */
  CHECK_EQ_INT(fm_meta_grid_x(&m, 8), 3);           /* 6144 / 2048 */
  CHECK_EQ_INT(fm_meta_grid_x(&m, 9), 4);           /* 6912: rounds up */
  CHECK_EQ_INT(fm_meta_grid_x(&m, 1 << 20), 528);   /* capped */
  CHECK_EQ_INT(fm_meta_grid_x(&m, INT64_MAX), 528); /* no overflow */
  m.outer = 8;                                      /* static: the argument is ignored */
  CHECK_EQ_INT(fm_meta_grid_x(&m, 1000), 3);
  m.inner = 0;
  CHECK_EQ_INT(fm_meta_grid_x(&m, 8), 0);
  m = sample();
  strcpy(m.grid_rule, "other");
  CHECK_EQ_INT(fm_meta_grid_x(&m, 8), 0);
}

/* The persistent GEMM rule: row tiles x column tiles, capped at the blocks the device holds;
 * it survives the wire and is one a client knows. */
static void test_grid_persistent(void) {
  fm_kernel_meta m = sample(), back;
  fm_diag d;
  strcpy(m.grid_rule, "persistent");
  m.inner = 4;             /* column tiles */
  m.items_per_block = 128; /* BM */
  m.max_blocks = 132;      /* one block per SM */
  CHECK(fm_meta_rule_known("persistent"));
  CHECK(!fm_meta_rule_known("persistent2"));
  CHECK(!fm_meta_rule_known(NULL));
  CHECK_EQ_INT(fm_meta_grid_x(&m, 0), 0);
  CHECK_EQ_INT(fm_meta_grid_x(&m, -1), 0);
  CHECK_EQ_INT(fm_meta_grid_x(&m, 1), 4);           /* one row tile */
  CHECK_EQ_INT(fm_meta_grid_x(&m, 129), 8);         /* a partial second row tile */
  CHECK_EQ_INT(fm_meta_grid_x(&m, 4096), 128);      /* 32 x 4 tiles: fewer than the cap */
  CHECK_EQ_INT(fm_meta_grid_x(&m, 16384), 132);     /* 512 tiles: capped */
  CHECK_EQ_INT(fm_meta_grid_x(&m, INT64_MAX), 132); /* no overflow */
  CHECK_EQ_INT(fm_meta_grid_y(&m, 16384), 1);
  CHECK_EQ_INT(fm_meta_grid_y(&m, 0), 0);
  m.outer = 200; /* static: the argument is ignored */
  CHECK_EQ_INT(fm_meta_grid_x(&m, 1 << 20), 8);
  CHECK_EQ_INT(round_trip(&m, &back, &d), FM_OK);
  CHECK(strcmp(back.grid_rule, "persistent") == 0);
  CHECK_EQ_INT(fm_meta_grid_x(&back, 0), 8);
}

/* The columns rule: a block per strip (max_blocks), grid.y the cluster's S from the `cluster`
 * key, launched at every M >= 0 (0 too: the outputs are written); the key round-trips, only
 * with that rule, and within the portable cluster size. */
static void test_grid_columns(void) {
  fm_kernel_meta m = sample(), back;
  fm_diag d = {{0}};
  strcpy(m.kind, "columns");
  strcpy(m.grid_rule, "columns");
  m.inner = 1000;         /* N */
  m.items_per_block = 64; /* columns per strip */
  m.max_blocks = 16;      /* ceil(1000 / 64) */
  CHECK(fm_meta_rule_known("columns"));
  CHECK(!fm_meta_rule_known("column"));
  CHECK_EQ_INT(fm_meta_grid_x(&m, 0), 16); /* M = 0 still launches */
  CHECK_EQ_INT(fm_meta_grid_y(&m, 0), 1);  /* no cluster */
  CHECK_EQ_INT(fm_meta_grid_z(&m, 0), 1);
  CHECK_EQ_INT(fm_meta_grid_x(&m, 16384), 16);
  CHECK_EQ_INT(fm_meta_grid_x(&m, -1), 0); /* a symbolic kernel needs an M */
  CHECK_EQ_INT(fm_meta_grid_y(&m, -1), 0);
  m.cluster[0] = m.cluster[2] = 1;
  m.cluster[1] = 4;
  CHECK_EQ_INT(fm_meta_grid_y(&m, 16384), 4);
  CHECK_EQ_INT(round_trip(&m, &back, &d), FM_OK);
  CHECK(strcmp(back.grid_rule, "columns") == 0 && strcmp(back.kind, "columns") == 0);
  CHECK_EQ_INT(back.cluster[0], 1);
  CHECK_EQ_INT(back.cluster[1], 4);
  CHECK_EQ_INT(back.cluster[2], 1);
  CHECK_EQ_INT(fm_meta_grid_x(&back, 7), 16);
  CHECK_EQ_INT(fm_meta_grid_y(&back, 7), 4);
  m.outer = 300; /* static M: the argument is ignored */
  CHECK_EQ_INT(fm_meta_grid_y(&m, -1), 4);
  /* without a cluster no key is packed (every other kernel's bytes stay as they were), and
     unpacking gives [1, 1, 1] */
  fm_kernel_meta plain = sample();
  CHECK_EQ_INT(round_trip(&plain, &back, &d), FM_OK);
  CHECK_EQ_INT(back.cluster[0] * back.cluster[1] * back.cluster[2], 1);
  static const struct {
    const char *rule;
    uint32_t c[3];
    const char *diag;
  } bad[] = {
      {"tiles", {1, 2, 1}, "only 'columns' takes one"},
      {"columns", {2, 1, 1}, "only 'columns' takes one: [1, S, 1]"},
      {"columns", {1, 16, 1}, "cluster[1] must be an integer in 1..8"},
      {"columns", {1, 8, 2}, "exceeds 8"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    m = sample();
    strcpy(m.grid_rule, bad[i].rule);
    memcpy(m.cluster, bad[i].c, sizeof m.cluster);
    memset(&d, 0, sizeof d);
    expect_schema("cluster", i, round_trip(&m, &back, &d), &d, bad[i].diag);
  }
}

/* A split column reduction: G groups of clusters (grid.y S * G), a second kernel (finish)
 * and a scratch of the groups' partials the caller allocates, the last parameter of both;
 * the key round-trips and every field a launch depends on is bounded. */
static void test_grid_columns_split(void) {
  fm_kernel_meta m = sample(), back;
  fm_diag d = {{0}};
  strcpy(m.kind, "columns");
  strcpy(m.grid_rule, "columns");
  m.inner = 64, m.items_per_block = 16, m.max_blocks = 4;
  m.cluster[0] = m.cluster[2] = 1;
  m.cluster[1] = 8;
  strcpy(m.finish.entry, "fm_cols_finish");
  m.finish.block = 256, m.finish.grid = 1, m.finish.groups = 16, m.finish.scratch = 16 * 2 * 64 * 4;
  CHECK_EQ_INT(fm_meta_grid_x(&m, 802816), 4);
  CHECK_EQ_INT(fm_meta_grid_y(&m, 802816), 8 * 16);
  CHECK_EQ_INT(fm_meta_grid_y(&m, 0), 8 * 16); /* M = 0 still writes the outputs */
  CHECK_EQ_INT(fm_meta_scratch_bytes(&m, 802816), 16 * 2 * 64 * 4);
  CHECK_EQ_INT(round_trip(&m, &back, &d), FM_OK);
  CHECK(strcmp(back.finish.entry, "fm_cols_finish") == 0);
  CHECK_EQ_INT(back.finish.block, 256);
  CHECK_EQ_INT(back.finish.grid, 1);
  CHECK_EQ_INT(back.finish.groups, 16);
  CHECK_EQ_INT(fm_meta_scratch_bytes(&back, 5), 16 * 2 * 64 * 4);
  CHECK_EQ_INT(fm_meta_grid_y(&back, 5), 128);
  static const struct {
    const char *rule;
    uint32_t block, grid, groups;
    uint64_t scratch;
    const char *diag;
  } bad[] = {
      {"elementwise", 256, 1, 16, 8192, "only 'columns' takes one"},
      {"columns", 33, 1, 16, 8192, "meta.finish: block 33"},
      {"columns", 2048, 1, 16, 8192, "meta.finish: block 2048"},
      {"columns", 256, 0, 16, 8192, "meta.finish: grid 0"},
      {"columns", 256, 1, 1, 8192, "meta.finish: groups 1"},
      {"columns", 256, 1, 4096, 8192, "meta.finish: groups 4096"},
      {"columns", 256, 1, 16, 0, "meta.finish: scratch of 0 bytes"},
      {"columns", 256, 1, 16, (uint64_t)1 << 40, "meta.finish: scratch of"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    fm_kernel_meta b = m;
    strcpy(b.grid_rule, bad[i].rule);
    if (strcmp(bad[i].rule, "columns") != 0) memset(b.cluster, 0, sizeof b.cluster);
    b.finish.block = bad[i].block, b.finish.grid = bad[i].grid, b.finish.groups = bad[i].groups;
    b.finish.scratch = bad[i].scratch;
    memset(&d, 0, sizeof d);
    expect_schema("finish", i, round_trip(&b, &back, &d), &d, bad[i].diag);
  }
}

/* A cuBLASLt plan for x [M, 256] @ W.t() (K-major B, N 512) with inputs x, W, bias, residual.
 * direct: bias, c and relu through cuBLASLt, no kernel, an algorithm chosen; split: the
 * epilogue kernel's launch, no algorithm yet, a static M. */
static fm_kernel_meta blas_sample(int split) {
  fm_kernel_meta m = sample();
  fm_meta_blas *b = &m.blas;
  strcpy(m.kind, "cublaslt");
  m.n_inputs = 4;
  strcpy(b->form, split ? "split" : "direct");
  strcpy(b->dtype, split ? "f16" : "bf16");
  b->a = 0, b->b = 1, b->out = 0;
  b->bias = split ? -1 : 2;
  b->c = split ? -1 : 3;
  strcpy(b->act, split ? "none" : "relu");
  b->a_kmajor = 1, b->b_kmajor = !split;
  b->lda = 256, b->ldb = split ? 512 : 256, b->ldc = 576, b->ldd = 512;
  b->m = split ? 40 : -1;
  b->n = 512, b->k = 256;
  b->align[0] = 16, b->align[1] = 8, b->align[2] = 4, b->align[3] = 256;
  b->workspace = split ? 1000 : 4u << 20;
  if (split) {
    strcpy(m.entry, "fm_blas_epi");
    m.outer = 40;
    m.inner = 64; /* ceil(N / 8) */
    m.items_per_block = 256;
    return m;
  }
  m.entry[0] = '\0';
  strcpy(m.grid_rule, "none");
  m.block[0] = 1;
  m.inner = 0;
  m.items_per_block = m.max_blocks = 1;
  b->has_algo = 1;
  for (int i = 0; i < FM_META_ALGO_BYTES; i++) b->algo[i] = (uint8_t)(7 * i + 1);
  return m;
}

static void check_blas_equal(const fm_meta_blas *x, const fm_meta_blas *y) {
  CHECK(strcmp(x->form, y->form) == 0 && strcmp(x->dtype, y->dtype) == 0 && strcmp(x->act, y->act) == 0);
  CHECK(x->a == y->a && x->b == y->b && x->bias == y->bias && x->c == y->c && x->out == y->out);
  CHECK(x->a_kmajor == y->a_kmajor && x->b_kmajor == y->b_kmajor);
  CHECK(x->lda == y->lda && x->ldb == y->ldb && x->ldc == y->ldc && x->ldd == y->ldd);
  CHECK(x->m == y->m && x->n == y->n && x->k == y->k && x->workspace == y->workspace);
  CHECK(memcmp(x->align, y->align, sizeof x->align) == 0);
  CHECK_EQ_INT(x->has_algo, y->has_algo);
  CHECK(memcmp(x->algo, y->algo, sizeof x->algo) == 0);
}

/* The wire's "blas": {..., scratch: [fixed, row_bytes]} of m, which a caller without this C
 * code (the Python client) allocates as fixed + outer * row_bytes. */
static void wire_scratch(const fm_kernel_meta *m, uint64_t *fixed, uint64_t *row) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_zone zone;
  msgpack_object o;
  fm_diag d = {{0}};
  *fixed = *row = UINT64_MAX;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_zone_init(&zone, 1024);
  CHECK_EQ_INT(fm_meta_pack(m, &pk), FM_OK);
  CHECK_EQ_INT(fm_msg_unpack((uint8_t *)sb.data, sb.size, &fm_msg_reply_limits, &zone, &o, &d), FM_OK);
  /* the plan is the last key */
  CHECK(fm_msg_str_eq(&o.via.map.ptr[o.via.map.size - 1].key, "blas"));
  const msgpack_object *s = fm_msg_get(fm_msg_get(&o, "blas"), "scratch");
  CHECK(s && s->type == MSGPACK_OBJECT_ARRAY && s->via.array.size == 2);
  if (s && s->type == MSGPACK_OBJECT_ARRAY && s->via.array.size == 2) {
    *fixed = s->via.array.ptr[0].via.u64;
    *row = s->via.array.ptr[1].via.u64;
  }
  msgpack_zone_destroy(&zone);
  msgpack_sbuffer_destroy(&sb);
}

/* Both forms survive the wire field by field; the scratch the caller allocates holds the
 * workspace (rounded up to 256, at least 256) and, for the split form, the [M, N] product
 * after it; the wire's [fixed, row_bytes] says the same. */
static void test_blas_round_trip(void) {
  fm_kernel_meta m = blas_sample(0), back;
  fm_diag d = {{0}};
  uint64_t fixed, row;
  CHECK_EQ_INT(round_trip(&m, &back, &d), FM_OK);
  CHECK(strcmp(back.kind, "cublaslt") == 0 && back.entry[0] == '\0');
  CHECK(strcmp(back.grid_rule, "none") == 0);
  CHECK_EQ_INT(back.blas.has_algo, 1);
  check_blas_equal(&m.blas, &back.blas);
  CHECK_EQ_INT(fm_meta_scratch_bytes(&back, 1000), 4u << 20);
  CHECK_EQ_INT(fm_meta_scratch_result_offset(&back), 4u << 20);
  wire_scratch(&m, &fixed, &row);
  CHECK_EQ_INT(fixed, 4u << 20);
  CHECK_EQ_INT(row, 0);
  m.blas.workspace = 0; /* a direct plan's scratch is never empty */
  CHECK_EQ_INT(fm_meta_scratch_bytes(&m, 5), 256);
  CHECK_EQ_INT(fm_meta_scratch_result_offset(&m), 0);
  m.blas.workspace = 257;
  CHECK_EQ_INT(fm_meta_scratch_bytes(&m, 5), 512);

  m = blas_sample(1);
  CHECK_EQ_INT(round_trip(&m, &back, &d), FM_OK);
  CHECK(strcmp(back.entry, "fm_blas_epi") == 0 && strcmp(back.grid_rule, "elementwise") == 0);
  CHECK_EQ_INT(back.blas.has_algo, 0);
  check_blas_equal(&m.blas, &back.blas);
  /* static M = 40: the launch's outer does not matter */
  CHECK_EQ_INT(fm_meta_scratch_result_offset(&back), 1024);
  CHECK_EQ_INT(fm_meta_scratch_bytes(&back, 7), 1024 + 40 * 512 * 2);
  CHECK_EQ_INT(fm_meta_scratch_bytes(&back, 0), 1024 + 40 * 512 * 2);
  wire_scratch(&m, &fixed, &row);
  CHECK_EQ_INT(fixed + (uint64_t)m.outer * row, fm_meta_scratch_bytes(&m, m.outer));
  /* symbolic M: the outer of the launch, none for an outer below 1 */
  m.blas.m = m.outer = -1;
  CHECK_EQ_INT(round_trip(&m, &back, &d), FM_OK);
  CHECK_EQ_INT(back.blas.m, -1);
  CHECK_EQ_INT(fm_meta_scratch_bytes(&back, 7), 1024 + 7 * 512 * 2);
  CHECK_EQ_INT(fm_meta_scratch_bytes(&back, -1), 1024);
  wire_scratch(&m, &fixed, &row);
  CHECK_EQ_INT(fixed, 1024);
  CHECK_EQ_INT(row, 512 * 2);
  /* no plan: no scratch */
  m = sample();
  CHECK_EQ_INT(fm_meta_scratch_bytes(&m, 100), 0);
  CHECK_EQ_INT(fm_meta_scratch_result_offset(&m), 0);
  CHECK_EQ_INT(fm_meta_scratch_bytes(NULL, 100), 0);
}

static void algo_63(msgpack_packer *pk) {
  uint8_t b[FM_META_ALGO_BYTES - 1] = {0};
  fm_pack_bin(pk, b, sizeof b);
}
static void algo_str(msgpack_packer *pk) { fm_pack_cstr(pk, "algo"); }
/* A split plan's params (4 inputs, 1 output) without the trailing "scratch". */
static void params_no_scratch(msgpack_packer *pk) {
  msgpack_pack_array(pk, 6);
  for (int i = 0; i < 4; i++) fm_pack_cstr(pk, "in");
  fm_pack_cstr(pk, "out");
  fm_pack_cstr(pk, "outer");
}

/* Every plan that does not fit its kernel, its inputs or cuBLASLt's limits is refused with
 * FM_ESCHEMA and a reason. */
static void test_blas_refusals(void) {
  struct {
    const char *diag;
    int split;
  } bad[] = {
      /*  0 */ {"'blas' in a kernel of kind 'gemm'", 0},
      /*  1 */ {"kind 'cublaslt' without 'blas'", 1},
      /*  2 */ {"grid rule 'none' with no direct plan", 0},
      /*  3 */ {"grid rule 'none' with no direct plan", 1},
      /*  4 */ {"grid rule 'elementwise' with a direct plan", 0},
      /*  5 */ {"form 'foo' (direct or split)", 0},
      /*  6 */ {"dtype 'f32' (bf16 or f16)", 1},
      /*  7 */ {"'a' is 4 (of 4)", 0},
      /*  8 */ {"'b' is 7 (of 4)", 0},
      /*  9 */ {"'out' is 1 (of 1)", 0},
      /* 10 */ {"'bias' is -2 (of 4)", 0},
      /* 11 */ {"'c' is 4 (of 4)", 0},
      /* 12 */ {"act 'silu' (none, relu or gelu_tanh)", 0},
      /* 13 */ {"the split form takes no bias, c or act", 1},
      /* 14 */ {"the split form takes no bias, c or act", 1},
      /* 15 */ {"align[0] must be a power of two up to 256", 0},
      /* 16 */ {"align[3] must be a power of two up to 256", 1},
      /* 17 */ {"workspace of 268435457 bytes", 0},
      /* 18 */ {"a -1 x 0 x 256 product", 0},
      /* 19 */ {"a 0 x 512 x 256 product", 1},
      /* 20 */ {"'lda' 1099511627776 is too large", 0},
      /* 21 */ {"'entry' is empty", 1},
      /* 22 */ {"'entry' is empty", 0},
      /* 23 */ {"tensor maps without a kernel", 0},
      /* 24 */ {"a sibling or batched plan is the split form", 0},
      /* 25 */ {"'b2' is 4 (of 4)", 1},
      /* 26 */ {"a batched plan's kernel has grid rule 'batched'", 1},
      /* 27 */ {"a batched plan is the split form of a static M", 0},
      /* 28 */ {"a batched plan is the split form of a static M", 1},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    fm_kernel_meta m = blas_sample(bad[i].split), back;
    fm_meta_blas *b = &m.blas;
    switch (i) {
      case 0:
        strcpy(m.kind, "gemm");
        break;
      case 1:
        b->form[0] = '\0';
        break;
      case 2:
        m = sample();
        strcpy(m.grid_rule, "none");
        break;
      case 3:
        strcpy(m.grid_rule, "none");
        break;
      case 4:
        strcpy(m.entry, "fm_k"), strcpy(m.grid_rule, "elementwise");
        break;
      case 5:
        strcpy(b->form, "foo");
        break;
      case 6:
        strcpy(b->dtype, "f32");
        break;
      case 7:
        b->a = 4;
        break;
      case 8:
        b->b = 7;
        break;
      case 9:
        b->out = 1;
        break;
      case 10:
        b->bias = -2;
        break;
      case 11:
        b->c = 4;
        break;
      case 12:
        strcpy(b->act, "silu");
        break;
      case 13:
        b->bias = 2;
        break;
      case 14:
        strcpy(b->act, "relu");
        break;
      case 15:
        b->align[0] = 3;
        break;
      case 16:
        b->align[3] = 512;
        break;
      case 17:
        b->workspace = (256u << 20) + 1;
        break;
      case 18:
        b->n = 0;
        break;
      case 19:
        b->m = 0;
        break;
      case 20:
        b->lda = 1ull << 40;
        break;
      case 21:
        m.entry[0] = '\0';
        break;
      case 22:
        m = sample();
        m.entry[0] = '\0';
        break;
      case 23:
        m.n_tmaps = 1, m.tmaps[0] = (fm_meta_tmap){0, 2, "bf16", -1, 256, 256, {64, 64}};
        break;
      case 24:
        b->has_b2 = 1, b->b2 = 1;
        break; /* siblings on a direct plan */
      case 25:
        b->has_b2 = 1, b->b2 = 4;
        break;
      case 26:
        b->batched = 1, b->stride_a = b->stride_b = 64;
        break; /* rule "elementwise" */
      case 27:
        b->batched = 1;
        break; /* on a direct plan */
      case 28:
        b->batched = 1, b->m = -1;
        break; /* a symbolic M */
    }
    fm_diag d = {{0}};
    expect_schema("blas", i, round_trip(&m, &back, &d), &d, bad[i].diag);
  }
  /* what only a hand-made map can say */
  struct {
    int split;
    const char *key, *sub;
    override_fn fn;
    const char *diag;
  } edits[] = {
      {0, "blas", "algo", algo_63, "algo of 63 bytes (64)"},
      {0, "blas", "algo", algo_str, "'algo' must be 64 bytes or nil"},
      {0, "blas", "algo", NULL, "missing 'algo'"},
      {1, "blas", "form", NULL, "meta.blas: missing field 'form'"},
      {0, "blas", "align", NULL, "'align' must be [a, b, c, d]"},
      {1, "params", NULL, params_no_scratch, "'params' must be an array of 7 names"},
      {0, "blas", NULL, NULL, "kind 'cublaslt' without 'blas'"},
      {0, "blas", NULL, as_str, "'blas' must be a map"},
  };
  for (size_t i = 0; i < sizeof edits / sizeof *edits; i++) {
    fm_kernel_meta m = blas_sample(edits[i].split);
    fm_diag d = {{0}};
    int rc = unpack_edit(&m, edits[i].key, edits[i].sub, edits[i].fn, &d);
    expect_schema("blas edit", i, rc, &d, edits[i].diag);
  }
  /* the copy itself is sound: both plans unpack when no key matches */
  for (int split = 0; split < 2; split++) {
    fm_kernel_meta m = blas_sample(split);
    fm_diag d = {{0}};
    CHECK_EQ_INT(unpack_edit(&m, "blas", "no such key", as_str, &d), FM_OK);
  }
}

/* Rule "none" is one a client knows, and it launches nothing. */
static void test_grid_none(void) {
  fm_kernel_meta m = blas_sample(0);
  CHECK_EQ_INT(fm_meta_rule_known("none"), 1);
  CHECK_EQ_INT(fm_meta_rule_known("None"), 0);
  CHECK_EQ_INT(fm_meta_grid_x(&m, 4096), 0);
  CHECK_EQ_INT(fm_meta_grid_y(&m, 4096), 0);
  m.outer = 64;
  m.inner = 8;
  CHECK_EQ_INT(fm_meta_grid_x(&m, 4096), 0);
  CHECK_EQ_INT(fm_meta_grid_y(&m, 4096), 0);
  /* the split form's epilogue launches like any elementwise kernel: 40 rows x 64 groups */
  m = blas_sample(1);
  CHECK_EQ_INT(fm_meta_grid_x(&m, 0), 10);
  CHECK_EQ_INT(fm_meta_grid_y(&m, 0), 1);
}

int main(void) {
  RUN(test_round_trip);
  RUN(test_wire_form);
  RUN(test_refusals);
  RUN(test_tmaps);
  RUN(test_grid_x);
  RUN(test_grid_persistent);
  RUN(test_grid_columns);
  RUN(test_grid_columns_split);
  RUN(test_blas_round_trip);
  RUN(test_blas_refusals);
  RUN(test_grid_none);
  return FM_TEST_DONE();
}
