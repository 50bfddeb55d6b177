/* test_protocol_cat.c: vocabulary 6 (`cat`): what a cat fragment accepts (rotary embeddings'
 * rotate_half, a middle dim, three operands, broadcast operands), the extents validation
 * infers, the canonical form (vocab 6, the dim packed non-negative), and every refusal with
 * its error class and reason: sizes that do not add up, reads that could leave a tensor. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_error.h"
#include "fm_fragment.h"
#include "fm_test.h"
#include "test_protocol_util.h"

#define FRAG(v, inputs, ops, outputs) "{'vocab':" #v ",'inputs':[" inputs "],'ops':[" ops "],'outputs':[" outputs "]}"
#define FRAG6(inputs, ops, outputs)   FRAG(6, inputs, ops, outputs)
#define T(id, dt, shape)              "{'id':" #id ",'dtype':'" dt "','shape':" shape "}"
/* rotate_half of x [-1, 4, 16]: x1 = x[..., :8], x2 = x[..., 8:] as views (strides of x) */
#define X1                            "{'id':0,'dtype':'bf16','shape':[-1,4,8],'strides':[64,16,1]}"
#define X2                            "{'id':1,'dtype':'bf16','shape':[-1,4,8],'strides':[64,16,1],'align':16}"
#define ROT                           "{'op':'neg','out':2,'args':[1]},{'op':'cat','out':3,'args':[2,0],'dim':-1}"

static fm_fragment frag;

static void test_accepts(void) {
  static const char *const ok[] = {
      FRAG6(X1 "," X2, ROT, T(3, "bf16", "[-1,4,16]")),
      /* RoPE: x * cos + rotate_half(x) * sin, cos and sin broadcast over dim 1 */
      FRAG6(X1 "," X2 "," T(4, "bf16", "[-1,4,16]") "," T(5, "bf16", "[-1,1,16]") "," T(6, "bf16", "[-1,1,16]"),
            ROT ",{'op':'mul','out':7,'args':[4,5]},{'op':'mul','out':8,'args':[3,6]},"
                "{'op':'add','out':9,'args':[7,8]}",
            T(9, "bf16", "[-1,4,16]")),
      /* three operands along a middle dim, one computed, one broadcast along the last dim */
      FRAG6(T(0, "f32", "[2,3,8]") "," T(1, "f32", "[2,1,8]") "," T(2, "f32", "[2,4,1]"),
            "{'op':'exp','out':3,'args':[0]},{'op':'cat','out':4,'args':[3,1,2],'dim':1}", T(4, "f32", "[2,8,8]")),
      /* a static dim 0 can be the cat dim; a bool operand promotes */
      FRAG6(T(0, "f16", "[3,8]") "," T(1, "bool", "[5,8]"), "{'op':'cat','out':2,'args':[0,1],'dim':0}",
            T(2, "f16", "[8,8]")),
  };
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
    fm_diag d = {{0}};
    int rc = tp_decode_json(ok[i], &frag, &d);
    if (rc) fprintf(stderr, "  case %zu: %s\n", i, d.text);
    CHECK_EQ_INT(rc, FM_OK);
    CHECK(fm_fragment_is_cat(&frag));
    CHECK(!fm_fragment_is_rows(&frag) && !fm_fragment_is_gemm(&frag));
  }
  /* the last case: the dtype promotes (f16 with bool: f16) */
  CHECK_EQ_INT(frag.ops[0].dtype, FM_DT_F16);
}

static void test_extents(void) {
  fm_diag d = {{0}};
  CHECK_EQ_INT(tp_decode_json(FRAG6(T(0, "f32", "[2,3,8]") "," T(1, "f32", "[2,1,8]") "," T(2, "f32", "[2,4,1]"),
                                    "{'op':'exp','out':3,'args':[0]},{'op':'cat','out':4,'args':[3,1,2],'dim':-2}",
                                    T(4, "f32", "[2,8,8]")),
                              &frag, &d),
               FM_OK);
  CHECK_EQ_INT(frag.ops[1].dim, 1); /* made non-negative */
  static fm_cat_info ci;
  CHECK_EQ_INT(fm_fragment_cat_info(&frag, &ci, &d), FM_OK);
  CHECK_EQ_INT(ci.rank, 3);
  CHECK(ci.ext[3][0] == 2 && ci.ext[3][1] == 3 && ci.ext[3][2] == 8); /* exp(x) */
  CHECK(ci.ext[4][0] == 2 && ci.ext[4][1] == 8 && ci.ext[4][2] == 8); /* 3 + 1 + 4 */
}

static void test_canonical(void) {
  size_t la, lb;
  uint8_t *a = tp_canon_json(FRAG6(X1 "," X2, ROT, T(3, "bf16", "[-1,4,16]")), &la);
  /* the same with other ids, the dim spelt 2, a dead op */
  uint8_t *b = tp_canon_json(FRAG6("{'id':7,'dtype':'bf16','shape':[-1,4,8],'strides':[64,16,1]},"
                                   "{'id':9,'dtype':'bf16','shape':[-1,4,8],'strides':[64,16,1],'align':64}",
                                   "{'op':'exp','out':1,'args':[7]},{'op':'neg','out':20,'args':[9]},"
                                   "{'op':'cat','out':21,'args':[20,7],'dim':2}",
                                   T(21, "bf16", "[-1,4,16]")),
                             &lb);
  CHECK(tp_bytes_eq(a, la, b, lb));
  CHECK(a && la > 8 && a[7] == 6); /* {"vocab": 6, ... */
  static const char dim2[] =
      "\xa3"
      "dim\x02";
  int found = 0;
  for (size_t i = 0; a && i + 5 <= la; i++) found |= memcmp(a + i, dim2, 5) == 0;
  CHECK(found);
  /* the canonical bytes decode to themselves */
  CHECK(tp_canonical_fixed_point(a, la, &frag));
  /* the operands' order is the data's order: another kernel */
  uint8_t *c =
      tp_canon_json(FRAG6(X1 "," X2, "{'op':'neg','out':2,'args':[1]},{'op':'cat','out':3,'args':[0,2],'dim':-1}",
                          T(3, "bf16", "[-1,4,16]")),
                    &lb);
  CHECK(c && !tp_bytes_eq(a, la, c, lb));
  free(c);
  free(a);
  free(b);
}

#define CAT(out, args, dim) "{'op':'cat','out':" #out ",'args':" args ",'dim':" #dim "}"

static const tp_reject rejects[] = {
    /* what a vocabulary-5 fragment (or daemon) says */
    {FRAG(5, X1 "," X2, ROT, T(3, "bf16", "[-1,4,16]")), FM_ESCHEMA, "ops[1].op: 'cat' needs vocab 6"},
    {FRAG(12, X1 "," X2, ROT, T(3, "bf16", "[-1,4,16]")), FM_ESCHEMA,
     "vocab 12 not supported, this daemon speaks 1 to 11"},
    /* operand sizes that do not add up to the output's */
    {FRAG6(X1 "," X2, ROT, T(3, "bf16", "[-1,4,17]")), FM_ESCHEMA,
     "outputs[0]: value 3 is [-1, 4, 16], which does not broadcast to the iteration shape [-1, 4, 17] along dim 2"},
    {FRAG6(X1 "," X2, ROT, T(3, "bf16", "[-1,4,12]")), FM_ESCHEMA, "a cat's operand sizes must add up to the output's"},
    /* a value of the operands' size used at the output's: it would read x1 past its 8 */
    {FRAG6(X1 "," X2, ROT ",{'op':'add','out':4,'args':[3,0]}", T(4, "bf16", "[-1,4,16]")), FM_ESCHEMA,
     "ops[2].args[1]: value 0 is [-1, 4, 8], which does not broadcast with the other operands ([-1, 4, 16] so far) along dim 2"},
    {FRAG6(X1 "," X2, ROT, T(3, "bf16", "[-1,4,16]") "," T(0, "bf16", "[-1,4,16]")), FM_ESCHEMA,
     "outputs[1]: value 0 is [-1, 4, 8], which does not broadcast to the iteration shape"},
    /* an input nothing reads, larger than the iteration shape */
    {FRAG6(X1 "," X2 "," T(9, "bf16", "[-1,4,32]"), ROT, T(3, "bf16", "[-1,4,16]")), FM_ESCHEMA,
     "inputs[2].shape: [-1, 4, 32] does not broadcast to the iteration shape [-1, 4, 16]"},
    /* operands that differ in another dim than the cat's */
    {FRAG6(T(0, "f32", "[2,8]") "," T(1, "f32", "[3,8]"), CAT(2, "[0,1]", 1), T(2, "f32", "[3,16]")), FM_ESCHEMA,
     "ops[0].args[1]: value 1 is [3, 8], which does not broadcast with the other operands ([2, 8] so far) along dim 0"},
    /* along the symbolic dim */
    {FRAG6(T(0, "f32", "[-1,8]") "," T(1, "f32", "[-1,8]"), CAT(2, "[0,1]", 0), T(2, "f32", "[-1,8]")), FM_ESCHEMA,
     "ops[0].args[0]: cat along dim 0, which is symbolic"},
    /* a dim the iteration space does not have */
    {FRAG6(T(0, "f32", "[4,8]") "," T(1, "f32", "[4,8]"), CAT(2, "[0,1]", 2), T(2, "f32", "[4,16]")), FM_ESCHEMA,
     "ops[0].dim: 2 is not a dim of the rank-2 iteration space"},
    {FRAG6(T(0, "f32", "[4,8]") "," T(1, "f32", "[4,8]"), CAT(2, "[0,1]", -3), T(2, "f32", "[4,16]")), FM_ESCHEMA,
     "ops[0].dim: -3 is not a dim"},
    /* argument counts; a missing dim */
    {FRAG6(T(0, "f32", "[4,8]"), CAT(1, "[0]", 1), T(1, "f32", "[4,8]")), FM_ESCHEMA,
     "ops[0].args: 'cat' takes 2 to 8 args, got 1"},
    {FRAG6(T(0, "f32", "[4,1]"), CAT(1, "[0,0,0,0,0,0,0,0,0]", 1), T(1, "f32", "[4,9]")), FM_ELIMIT,
     "ops[0].args: 'cat' takes 2 to 8 args, got 9"},
    {FRAG6(T(0, "f32", "[4,8]"), "{'op':'cat','out':1,'args':[0,0]}", T(1, "f32", "[4,16]")), FM_ESCHEMA,
     "ops[0]: cat needs a 'dim'"},
    {FRAG6(T(0, "f32", "[4,8]"), "{'op':'exp','out':1,'args':[0],'dim':1}", T(1, "f32", "[4,8]")), FM_ESCHEMA,
     "only reductions, softmax and cat take a dim, not 'exp'"},
    {FRAG6(T(0, "f32", "[4,8]"), CAT(1, "[0,5]", 1), T(1, "f32", "[4,16]")), FM_ESCHEMA,
     "ops[0].args[1]: value 5 is not defined before use"},
    /* a cat of a cat */
    {FRAG6(T(0, "f32", "[4,8]"), CAT(1, "[0,0]", 1) "," CAT(2, "[1,0]", 1), T(2, "f32", "[4,24]")), FM_EUNSUPPORTED,
     "ops[1].args[0]: value 1 is computed from a cat; a cat of a cat is not supported"},
    {FRAG6(T(0, "f32", "[4,8]"), CAT(1, "[0,0]", 1) ",{'op':'exp','out':2,'args':[1]}," CAT(3, "[0,2]", 1),
           T(3, "f32", "[4,24]")),
     FM_EUNSUPPORTED, "a cat of a cat is not supported"},
    /* with a reduction or a product */
    {FRAG6(T(0, "f32", "[4,8]"), CAT(1, "[0,0]", 1) ",{'op':'sum','out':2,'args':[1]}", T(2, "f32", "[4,1]")),
     FM_EUNSUPPORTED, "a cat runs in a pointwise fragment only"},
    {FRAG6(T(0, "bf16", "[-1,64]") "," T(1, "bf16", "[64,32]"), "{'op':'mm','out':2,'args':[0,1]}," CAT(3, "[2,2]", 1),
           T(3, "bf16", "[-1,64]")),
     FM_EUNSUPPORTED, "a cat runs in a pointwise fragment only"},
    /* sizes that overflow a dim */
    {FRAG6(T(0, "f32", "[2,2000000000]"), CAT(1, "[0,0]", 1), T(1, "f32", "[2,4000000000]")), FM_ELIMIT,
     "exceeds the limit of 2^31-1"},
    {FRAG6(T(0, "f32", "[1,2000000000]") "," T(1, "f32", "[1,1]"), CAT(2, "[0,0,1]", 1), T(2, "f32", "[1,5]")),
     FM_ELIMIT, "ops[0]: the cat is 4000000000 long along dim 1, above 2^31-1"},
};

static void test_rejections(void) { CHECK_EQ_INT(tp_check_rejects(rejects, sizeof rejects / sizeof *rejects), 0); }

int main(void) {
  RUN(test_accepts);
  RUN(test_extents);
  RUN(test_canonical);
  RUN(test_rejections);
  return FM_TEST_DONE();
}
