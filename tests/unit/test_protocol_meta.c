/* test_protocol_meta.c: launch metadata round trip, refusals, grid size. */
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
  static const char *keys[] = {"kind", "entry", "block", "smem", "grid",
                               "outer", "n_inputs", "n_outputs", "params"};
  CHECK_EQ_INT(o.via.map.size, 9);
  for (uint32_t i = 0; i < o.via.map.size && i < 9; i++) CHECK(fm_msg_str_eq(&o.via.map.ptr[i].key, keys[i]));
  const msgpack_object *p = fm_msg_get(&o, "params");
  CHECK_EQ_INT(p->via.array.size, 4);
  CHECK(fm_msg_str_eq(&p->via.array.ptr[0], "in") && fm_msg_str_eq(&p->via.array.ptr[1], "in") &&
        fm_msg_str_eq(&p->via.array.ptr[2], "out") && fm_msg_str_eq(&p->via.array.ptr[3], "outer"));
  msgpack_zone_destroy(&zone);
  msgpack_sbuffer_destroy(&sb);
}

/* Replaces key `key` of a packed sample with a packed override; a NULL pack drops the key. */
typedef void (*override_fn)(msgpack_packer *pk);
static int unpack_with(const char *key, override_fn fn, fm_diag *d) {
  fm_kernel_meta m = sample(), out;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  fm_meta_pack(&m, &pk);
  msgpack_zone zone;
  msgpack_object o;
  msgpack_zone_init(&zone, 1024);
  int rc = fm_msg_unpack((uint8_t *)sb.data, sb.size, &fm_msg_reply_limits, &zone, &o, d);
  /* rebuild the map with the one field changed */
  msgpack_sbuffer sb2;
  msgpack_packer pk2;
  msgpack_sbuffer_init(&sb2);
  msgpack_packer_init(&pk2, &sb2, msgpack_sbuffer_write);
  msgpack_pack_map(&pk2, o.via.map.size - (fn ? 0 : 1));
  for (uint32_t i = 0; i < o.via.map.size; i++) {
    if (fm_msg_str_eq(&o.via.map.ptr[i].key, key)) {
      if (!fn) continue;
      msgpack_pack_object(&pk2, o.via.map.ptr[i].key);
      fn(&pk2);
    } else {
      msgpack_pack_object(&pk2, o.via.map.ptr[i].key);
      msgpack_pack_object(&pk2, o.via.map.ptr[i].val);
    }
  }
  msgpack_zone zone2;
  msgpack_object o2;
  msgpack_zone_init(&zone2, 1024);
  if (!rc) rc = fm_msg_unpack((uint8_t *)sb2.data, sb2.size, &fm_msg_reply_limits, &zone2, &o2, d);
  if (!rc) rc = fm_meta_unpack(&o2, &out, d);
  msgpack_zone_destroy(&zone2);
  msgpack_zone_destroy(&zone);
  msgpack_sbuffer_destroy(&sb2);
  msgpack_sbuffer_destroy(&sb);
  return rc;
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
      {0, "input 3 of 3 inputs"},       {1, "dtype 'f32'"},
      {2, "not one 128-byte swizzle row"}, {3, "ld 100"},
      {4, "a 0 x 4096 matrix"},          {5, "box[1] must be in 1..256"},
      {6, "ld 4100"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    m = with_tmaps();
    fm_meta_tmap *t = &m.tmaps[1];
    switch (bad[i].field) {
      case 0: t->input = 3; break;
      case 1: strcpy(t->dtype, "f32"); break;
      case 2: t->box[0] = 32; break;
      case 3: t->ld = 100; break;
      case 4: t->rows = 0; break;
      case 5: t->box[1] = 512; break;
      case 6: t->ld = 4100; break;   /* 8200 bytes: rows not 16-byte aligned */
    }
    memset(&d, 0, sizeof d);
    int rc = round_trip(&m, &back, &d);
    if (rc != FM_ESCHEMA || !strstr(d.text, bad[i].diag))
      fprintf(stderr, "  tmap case %zu: rc %d \"%s\"\n", i, rc, d.text);
    CHECK_EQ_INT(rc, FM_ESCHEMA);
    CHECK_STR_CONTAINS(d.text, bad[i].diag);
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
  CHECK_EQ_INT(fm_meta_grid_x(&m, 1), 1);            /* 768 items */
  CHECK_EQ_INT(fm_meta_grid_x(&m, 8), 3);            /* 6144 / 2048 */
  CHECK_EQ_INT(fm_meta_grid_x(&m, 9), 4);            /* 6912: rounds up */
  CHECK_EQ_INT(fm_meta_grid_x(&m, 1 << 20), 528);    /* capped */
  CHECK_EQ_INT(fm_meta_grid_x(&m, INT64_MAX), 528);  /* no overflow */
  m.outer = 8; /* static: the argument is ignored */
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
  m.inner = 4;              /* column tiles */
  m.items_per_block = 128;  /* BM */
  m.max_blocks = 132;       /* one block per SM */
  CHECK(fm_meta_rule_known("persistent"));
  CHECK(!fm_meta_rule_known("persistent2"));
  CHECK(!fm_meta_rule_known(NULL));
  CHECK_EQ_INT(fm_meta_grid_x(&m, 0), 0);
  CHECK_EQ_INT(fm_meta_grid_x(&m, -1), 0);
  CHECK_EQ_INT(fm_meta_grid_x(&m, 1), 4);            /* one row tile */
  CHECK_EQ_INT(fm_meta_grid_x(&m, 129), 8);          /* a partial second row tile */
  CHECK_EQ_INT(fm_meta_grid_x(&m, 4096), 128);       /* 32 x 4 tiles: fewer than the cap */
  CHECK_EQ_INT(fm_meta_grid_x(&m, 16384), 132);      /* 512 tiles: capped */
  CHECK_EQ_INT(fm_meta_grid_x(&m, INT64_MAX), 132);  /* no overflow */
  CHECK_EQ_INT(fm_meta_grid_y(&m, 16384), 1);
  CHECK_EQ_INT(fm_meta_grid_y(&m, 0), 0);
  m.outer = 200;   /* static: the argument is ignored */
  CHECK_EQ_INT(fm_meta_grid_x(&m, 1 << 20), 8);
  CHECK_EQ_INT(round_trip(&m, &back, &d), FM_OK);
  CHECK(strcmp(back.grid_rule, "persistent") == 0);
  CHECK_EQ_INT(fm_meta_grid_x(&back, 0), 8);
}

int main(void) {
  RUN(test_round_trip);
  RUN(test_wire_form);
  RUN(test_refusals);
  RUN(test_tmaps);
  RUN(test_grid_x);
  RUN(test_grid_persistent);
  return FM_TEST_DONE();
}
