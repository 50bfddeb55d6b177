/* test_protocol_canon.c: canonical form and its packed bytes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_error.h"
#include "fm_fragment.h"
#include "fm_msg.h"
#include "fm_test.h"
#include "test_protocol_util.h"

#define FRAG(inputs, ops, outputs) "{'vocab':1,'inputs':[" inputs "],'ops':[" ops "],'outputs':[" outputs "]}"
#define T(id, dt, shape)           "{'id':" #id ",'dtype':'" dt "','shape':" shape "}"

/* relu(x) + exp(y), scaled */
static const char *base = FRAG(T(0, "f16", "[-1,64]") "," T(1, "f16", "[1,64]"),
                               "{'op':'relu','out':2,'args':[0]},"
                               "{'op':'exp','out':3,'args':[1]},"
                               "{'op':'add','out':4,'args':[2,3]},"
                               "{'op':'const','out':5,'value':2},"
                               "{'op':'mul','out':6,'args':[4,5]}",
                               T(6, "f16", "[-1,64]"));

/* the same computation: other ids, independent ops reordered, a dead op, strides given
 * explicitly (contiguous, and anything on the broadcast dim), align above 16, 2 vs 2.0 */
static const char *same = FRAG(
    "{'id':70,'dtype':'f16','shape':[-1,64],'strides':[64,1],'align':64},"
    "{'id':11,'dtype':'f16','shape':[1,64],'strides':[999,1]}",
    "{'op':'const','out':500,'value':2.0},"
    "{'op':'exp','out':90,'args':[11]},"
    "{'op':'sigmoid','out':91,'args':[90]},"
    "{'op':'relu','out':80,'args':[70]},"
    "{'op':'add','out':100,'args':[80,90]},"
    "{'op':'mul','out':7,'args':[100,500]}",
    "{'id':7,'dtype':'f16','shape':[-1,64],'align':32}");

static void test_equivalents_share_bytes(void) {
  size_t la, lb;
  uint8_t *a = tp_canon_json(base, &la), *b = tp_canon_json(same, &lb);
  CHECK(tp_bytes_eq(a, la, b, lb));
  free(a);
  free(b);
}

static void test_differences_that_matter(void) {
  size_t la, lb;
  uint8_t *a = tp_canon_json(base, &la);
  static const char *different[] = {
      /* inputs swapped: the kernel's parameter order differs */
      FRAG(T(1, "f16", "[1,64]") "," T(0, "f16", "[-1,64]"),
           "{'op':'relu','out':2,'args':[0]},{'op':'exp','out':3,'args':[1]},"
           "{'op':'add','out':4,'args':[2,3]},{'op':'const','out':5,'value':2},{'op':'mul','out':6,'args':[4,5]}",
           T(6, "f16", "[-1,64]")),
      /* another constant */
      FRAG(T(0, "f16", "[-1,64]") "," T(1, "f16", "[1,64]"),
           "{'op':'relu','out':2,'args':[0]},{'op':'exp','out':3,'args':[1]},"
           "{'op':'add','out':4,'args':[2,3]},{'op':'const','out':5,'value':2.5},{'op':'mul','out':6,'args':[4,5]}",
           T(6, "f16", "[-1,64]")),
      /* add's operands swapped (not folded: commutativity is not canonicalized) */
      FRAG(T(0, "f16", "[-1,64]") "," T(1, "f16", "[1,64]"),
           "{'op':'relu','out':2,'args':[0]},{'op':'exp','out':3,'args':[1]},"
           "{'op':'add','out':4,'args':[3,2]},{'op':'const','out':5,'value':2},{'op':'mul','out':6,'args':[4,5]}",
           T(6, "f16", "[-1,64]")),
      /* a stride that matters */
      FRAG("{'id':0,'dtype':'f16','shape':[-1,64],'strides':[128,1]}," T(1, "f16", "[1,64]"),
           "{'op':'relu','out':2,'args':[0]},{'op':'exp','out':3,'args':[1]},"
           "{'op':'add','out':4,'args':[2,3]},{'op':'const','out':5,'value':2},{'op':'mul','out':6,'args':[4,5]}",
           T(6, "f16", "[-1,64]")),
      /* an alignment below 16 */
      FRAG("{'id':0,'dtype':'f16','shape':[-1,64],'align':8}," T(1, "f16", "[1,64]"),
           "{'op':'relu','out':2,'args':[0]},{'op':'exp','out':3,'args':[1]},"
           "{'op':'add','out':4,'args':[2,3]},{'op':'const','out':5,'value':2},{'op':'mul','out':6,'args':[4,5]}",
           T(6, "f16", "[-1,64]")),
      /* a static batch */
      FRAG(T(0, "f16", "[8,64]") "," T(1, "f16", "[1,64]"),
           "{'op':'relu','out':2,'args':[0]},{'op':'exp','out':3,'args':[1]},"
           "{'op':'add','out':4,'args':[2,3]},{'op':'const','out':5,'value':2},{'op':'mul','out':6,'args':[4,5]}",
           T(6, "f16", "[8,64]")),
  };
  for (size_t i = 0; i < sizeof different / sizeof *different; i++) {
    uint8_t *b = tp_canon_json(different[i], &lb);
    CHECK(b != NULL);
    if (tp_bytes_eq(a, la, b, lb)) fprintf(stderr, "  variant %zu collides\n", i);
    CHECK(!tp_bytes_eq(a, la, b, lb));
    free(b);
  }
  free(a);
}

static void test_canonical_structure(void) {
  static fm_fragment f, c;
  fm_diag d = {{0}};
  CHECK_EQ_INT(tp_decode_json(same, &f, &d), FM_OK);
  CHECK_EQ_INT(fm_fragment_canonicalize(&f, &c), FM_OK);
  /* inputs keep their order and become 0, 1; ops in post-order from the output */
  CHECK(c.inputs[0].id == 0 && c.inputs[1].id == 1);
  CHECK_EQ_INT(c.n_ops, 5); /* the sigmoid was dead */
  static const fm_op want[] = {FM_OP_RELU, FM_OP_EXP, FM_OP_ADD, FM_OP_CONST, FM_OP_MUL};
  for (uint32_t j = 0; j < c.n_ops; j++) {
    CHECK_EQ_INT(c.ops[j].op, want[j]);
    CHECK_EQ_INT(c.ops[j].out, 2 + j);
  }
  CHECK(c.ops[2].args[0] == 2 && c.ops[2].args[1] == 3);
  CHECK(c.ops[4].args[0] == 4 && c.ops[4].args[1] == 5);
  CHECK_EQ_INT(c.outputs[0].id, 6);
  /* broadcast dim's stride zeroed, align clamped, the symbolic dim's stride kept */
  CHECK(c.inputs[1].strides[0] == 0 && c.inputs[1].strides[1] == 1);
  CHECK(c.inputs[0].strides[0] == 64);
  CHECK_EQ_INT(c.inputs[0].align, 16);
  CHECK_EQ_INT(c.outputs[0].align, 16);
  CHECK_EQ_INT(c.ops[4].dtype, FM_DT_F16);

  /* in place gives the same */
  static fm_fragment g;
  g = f;
  CHECK_EQ_INT(fm_fragment_canonicalize(&g, &g), FM_OK);
  CHECK(tp_fragment_eq(&g, &c));
}

/* Multiple outputs: the walk goes outputs[0] first, then what outputs[1] adds; an output
 * that stores an input directly refers to the input's position. */
static void test_multi_output_order(void) {
  static fm_fragment f, c;
  fm_diag d = {{0}};
  CHECK_EQ_INT(tp_decode_json(FRAG(T(5, "f32", "[16]"),
                                   "{'op':'tanh','out':9,'args':[5]},"
                                   "{'op':'exp','out':8,'args':[5]},"
                                   "{'op':'add','out':7,'args':[8,9]}",
                                   T(9, "f32", "[16]") "," T(7, "f32", "[16]") "," T(5, "f32", "[16]")),
                              &f, &d),
               FM_OK);
  CHECK_EQ_INT(fm_fragment_canonicalize(&f, &c), FM_OK);
  CHECK_EQ_INT(c.n_ops, 3);
  CHECK(c.ops[0].op == FM_OP_TANH && c.ops[1].op == FM_OP_EXP && c.ops[2].op == FM_OP_ADD);
  CHECK(c.ops[2].args[0] == 2 && c.ops[2].args[1] == 1);
  CHECK(c.outputs[0].id == 1 && c.outputs[1].id == 3 && c.outputs[2].id == 0);
}

static void test_idempotent_and_round_trip(void) {
  static const char **srcs[] = {&base, &same};
  for (size_t i = 0; i < 2; i++) {
    static fm_fragment f, c1, c2, back;
    fm_diag d = {{0}};
    CHECK_EQ_INT(tp_decode_json(*srcs[i], &f, &d), FM_OK);
    CHECK_EQ_INT(fm_fragment_canonicalize(&f, &c1), FM_OK);
    CHECK_EQ_INT(fm_fragment_canonicalize(&c1, &c2), FM_OK);
    CHECK(tp_fragment_eq(&c1, &c2));
    /* decode(pack(canon(f))) == canon(f) */
    msgpack_sbuffer sb;
    CHECK_EQ_INT(tp_pack_fragment(&c1, &sb), FM_OK);
    CHECK_EQ_INT(tp_decode_mp(sb.data, sb.size, &back, &d), FM_OK);
    CHECK(tp_fragment_eq(&back, &c1));
    /* and the canonical bytes are exactly pack(canon(f)) */
    uint8_t *cb;
    size_t cl;
    CHECK_EQ_INT(fm_fragment_canonical_bytes(&f, &cb, &cl), FM_OK);
    CHECK(tp_bytes_eq(cb, cl, sb.data, sb.size));
    free(cb);
    msgpack_sbuffer_destroy(&sb);
  }
}

/* The packed form always spells strides and align; value only on const, dtype only on cast;
 * a const value is always a float64. */
static void test_packed_keys(void) {
  static fm_fragment f;
  fm_diag d = {{0}};
  CHECK_EQ_INT(tp_decode_json(FRAG(T(0, "f32", "[4]"),
                                   "{'op':'const','out':1,'value':3},{'op':'mul','out':2,'args':[0,1]},"
                                   "{'op':'cast','out':3,'args':[2],'dtype':'bf16'}",
                                   T(3, "bf16", "[4]")),
                              &f, &d),
               FM_OK);
  uint8_t *cb;
  size_t cl;
  CHECK_EQ_INT(fm_fragment_canonical_bytes(&f, &cb, &cl), FM_OK);
  msgpack_zone zone;
  msgpack_object o;
  msgpack_zone_init(&zone, 1024);
  CHECK_EQ_INT(fm_msg_unpack(cb, cl, &fm_msg_request_limits, &zone, &o, &d), FM_OK);
  static const char *top[] = {"vocab", "inputs", "ops", "outputs"};
  CHECK_EQ_INT(o.via.map.size, 4);
  for (int i = 0; i < 4; i++) CHECK(fm_msg_str_eq(&o.via.map.ptr[i].key, top[i]));
  const msgpack_object *in0 = &fm_msg_get(&o, "inputs")->via.array.ptr[0];
  static const char *tkeys[] = {"id", "dtype", "shape", "strides", "align"};
  CHECK_EQ_INT(in0->via.map.size, 5);
  for (int i = 0; i < 5; i++) CHECK(fm_msg_str_eq(&in0->via.map.ptr[i].key, tkeys[i]));
  const msgpack_object *ops = fm_msg_get(&o, "ops");
  CHECK_EQ_INT(ops->via.array.size, 3);
  const msgpack_object *k = &ops->via.array.ptr[0];
  CHECK_EQ_INT(k->via.map.size, 4);
  CHECK(fm_msg_get(k, "value")->type == MSGPACK_OBJECT_FLOAT64);
  CHECK(fm_msg_get(k, "dtype") == NULL);
  CHECK(fm_msg_get(k, "args")->via.array.size == 0);
  CHECK_EQ_INT(ops->via.array.ptr[1].via.map.size, 3);
  const msgpack_object *cast = &ops->via.array.ptr[2];
  CHECK(fm_msg_str_eq(fm_msg_get(cast, "dtype"), "bf16"));
  CHECK(fm_msg_get(cast, "value") == NULL);
  msgpack_zone_destroy(&zone);
  free(cb);
}

static void test_invalid_refused(void) {
  static fm_fragment f, c;
  fm_diag d = {{0}};
  CHECK_EQ_INT(tp_decode_json(base, &f, &d), FM_OK);
  f.ops[2].args[1] = 12345; /* undefined */
  CHECK_EQ_INT(fm_fragment_canonicalize(&f, &c), FM_EINVAL);
  uint8_t *cb = (uint8_t *)&c;
  size_t cl = 1;
  CHECK_EQ_INT(fm_fragment_canonical_bytes(&f, &cb, &cl), FM_EINVAL);
  CHECK(cb == NULL && cl == 0);
}

/* A symbolic GEMM (x @ W^T + b), with the M hint spliced in after the vocab. */
#define GEMM(hint, m)                                                                                 \
  "{'vocab':3," hint "'inputs':[{'id':0,'dtype':'bf16','shape':[" m                                   \
  ",64]},"                                                                                            \
  "{'id':1,'dtype':'bf16','shape':[64,128],'strides':[1,64]},{'id':2,'dtype':'bf16','shape':[128]}]," \
  "'ops':[{'op':'addmm','out':3,'args':[2,0,1]}],'outputs':[{'id':3,'dtype':'bf16','shape':[" m ",128]}]}"

static void test_m_hint_bucket(void) {
  size_t l3000, l4000, l4096, l8, lnone, ls1, ls2;
  uint8_t *h3000 = tp_canon_json(GEMM("'m_hint':3000,", "-1"), &l3000);
  uint8_t *h4000 = tp_canon_json(GEMM("'m_hint':4000,", "-1"), &l4000);
  uint8_t *h4096 = tp_canon_json(GEMM("'m_hint':4096,", "-1"), &l4096);
  uint8_t *h8 = tp_canon_json(GEMM("'m_hint':8,", "-1"), &l8);
  uint8_t *none = tp_canon_json(GEMM("", "-1"), &lnone);
  /* a static M has no bucket: the hint is dropped, the bytes are the hint-less ones */
  uint8_t *s1 = tp_canon_json(GEMM("'m_hint':100,", "100"), &ls1);
  uint8_t *s2 = tp_canon_json(GEMM("", "100"), &ls2);
  CHECK(h3000 && h4000 && h4096 && h8 && none && s1 && s2);
  CHECK(tp_bytes_eq(h3000, l3000, h4000, l4000)); /* one bucket: 4096 */
  CHECK(tp_bytes_eq(h4000, l4000, h4096, l4096));
  CHECK(!tp_bytes_eq(h4096, l4096, h8, l8)); /* another bucket, another key */
  CHECK(!tp_bytes_eq(h4096, l4096, none, lnone));
  CHECK(tp_bytes_eq(s1, ls1, s2, ls2));
  fm_fragment f, c;
  fm_diag d = {{0}};
  CHECK(tp_decode_json(GEMM("'m_hint':3000,", "-1"), &f, &d) == FM_OK && f.m_hint == 3000);
  CHECK(fm_fragment_canonicalize(&f, &c) == FM_OK && c.m_hint == 4096);
  /* the canonical bytes decode back to the bucket */
  fm_fragment back;
  CHECK(tp_decode_mp(h3000, l3000, &back, &d) == FM_OK && back.m_hint == 4096);
  /* a pointwise fragment drops it */
  CHECK(tp_decode_json("{'vocab':1,'m_hint':64,'inputs':[{'id':0,'dtype':'f32','shape':[-1,4]}],"
                       "'ops':[{'op':'relu','out':1,'args':[0]}],"
                       "'outputs':[{'id':1,'dtype':'f32','shape':[-1,4]}]}",
                       &f, &d) == FM_OK);
  CHECK(fm_fragment_canonicalize(&f, &c) == FM_OK && c.m_hint == 0);
  /* a column fragment (the bias gradient grad.sum(0)) with a symbolic M keeps its bucket,
     with a static M drops it */
  CHECK(tp_decode_json("{'vocab':5,'m_hint':3000,'inputs':[{'id':0,'dtype':'bf16','shape':[-1,64]}],"
                       "'ops':[{'op':'sum','out':1,'args':[0],'dim':0}],"
                       "'outputs':[{'id':1,'dtype':'bf16','shape':[64]}]}",
                       &f, &d) == FM_OK);
  CHECK(fm_fragment_canonicalize(&f, &c) == FM_OK && c.m_hint == 4096);
  CHECK(tp_decode_json("{'vocab':5,'m_hint':3000,'inputs':[{'id':0,'dtype':'bf16','shape':[3000,64]}],"
                       "'ops':[{'op':'sum','out':1,'args':[0],'dim':0}],"
                       "'outputs':[{'id':1,'dtype':'bf16','shape':[64]}]}",
                       &f, &d) == FM_OK);
  CHECK(fm_fragment_canonicalize(&f, &c) == FM_OK && c.m_hint == 0);
  /* out of range and mistyped hints are refused with their place */
  CHECK(tp_decode_json(GEMM("'m_hint':0,", "-1"), &f, &d) == FM_ELIMIT && strstr(d.text, "m_hint"));
  CHECK(tp_decode_json(GEMM("'m_hint':4294967296,", "-1"), &f, &d) == FM_ELIMIT);
  CHECK(tp_decode_json(GEMM("'m_hint':-5,", "-1"), &f, &d) == FM_ESCHEMA);
  CHECK(tp_decode_json(GEMM("'m_hint':'big',", "-1"), &f, &d) == FM_ESCHEMA);
  free(h3000), free(h4000), free(h4096), free(h8), free(none), free(s1), free(s2);
}

int main(void) {
  RUN(test_m_hint_bucket);
  RUN(test_equivalents_share_bytes);
  RUN(test_differences_that_matter);
  RUN(test_canonical_structure);
  RUN(test_multi_output_order);
  RUN(test_idempotent_and_round_trip);
  RUN(test_packed_keys);
  RUN(test_invalid_refused);
  return FM_TEST_DONE();
}
