/* test_protocol_iota.c: vocabulary 11 (iota, the column index computed in the kernel): what
 * a fragment with one accepts (cross-entropy's gradient and its forward statistics, a top-k's
 * i64 picks compared against their columns), the result dtypes and value classes, the
 * canonical form (vocab 11, the dtype packed), and every refusal with its error class and
 * reason: a missing or wrong dtype, args, an f32 iota over a symbolic or too long last dim,
 * an iota beside a product, a column reduction or a cat, an i64 one in a row fragment, what a
 * vocab-10 fragment says. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_error.h"
#include "fm_fragment.h"
#include "fm_test.h"
#include "test_protocol_util.h"

#define FRAG(v, inputs, ops, outputs) "{'vocab':" #v ",'inputs':[" inputs "],'ops':[" ops "],'outputs':[" outputs "]}"
#define FRAG11(inputs, ops, outputs)  FRAG(11, inputs, ops, outputs)
#define T(id, dt, shape)              "{'id':" #id ",'dtype':'" dt "','shape':" shape "}"
#define OP2(name, out, a, b)          "{'op':'" name "','out':" #out ",'args':[" #a "," #b "]}"
#define CONST(out, v)                 "{'op':'const','out':" #out ",'value':" #v "}"
#define IOTA(out, dt)                 "{'op':'iota','out':" #out ",'dtype':'" dt "'}"
#define WHERE(out, c, a, b)           "{'op':'where','out':" #out ",'args':[" #c "," #a "," #b "]}"
/* GPT-2's logits at their padded stride, and the per-row target as f32 */
#define LOGITS                        "{'id':0,'dtype':'bf16','shape':[64,50257],'strides':[50304,1]}"
#define TARGET                        T(1, "f32", "[64,1]")
/* where(iota == t, x - 1, x) */
#define ONE_HOT                       IOTA(2, "f32") "," OP2("eq", 3, 2, 1) "," CONST(4, 1) "," OP2("sub", 5, 0, 4) "," WHERE(6, 3, 5, 0)

static fm_fragment frag;

static void test_accepts(void) {
  fm_diag d = {{0}};
  /* pointwise: the gradient's one-hot (bf16: x - 1 keeps x's dtype) */
  CHECK_EQ_INT(tp_decode_json(FRAG11(LOGITS "," TARGET, ONE_HOT, T(6, "bf16", "[64,50257]")), &frag, &d), FM_OK);
  CHECK(fm_fragment_has_iota(&frag));
  CHECK(!fm_fragment_is_rows(&frag) && !fm_fragment_is_extent(&frag));
  CHECK_EQ_INT(frag.ops[0].dtype, FM_DT_F32);
  CHECK_EQ_INT(frag.ops[1].dtype, FM_DT_BOOL);
  /* rows: the logit at the target column, summed; the iota is a row value, its sum per row */
  int rc = tp_decode_json(FRAG11(LOGITS "," TARGET, ONE_HOT ",{'op':'sum','out':7,'args':[6],'dim':-1,'keepdim':true}",
                                 T(7, "bf16", "[64,1]")),
                          &frag, &d);
  if (rc) fprintf(stderr, "  rows: %s\n", d.text);
  CHECK_EQ_INT(rc, FM_OK);
  CHECK(fm_fragment_is_rows(&frag));
  /* an iota alone reduced: its sum is a per-row value (the row's length fixes it) */
  CHECK_EQ_INT(
      tp_decode_json(FRAG11(T(0, "f32", "[8,16]"),
                            IOTA(1, "f32") "," OP2("add", 2, 0, 1) ",{'op':'amax','out':3,'args':[1],'dim':-1}",
                            T(2, "f32", "[8,16]") "," T(3, "f32", "[8,1]")),
                     &frag, &d),
      FM_OK);
  /* i64: a top-k's picks compared against their columns (an integer fragment) */
  rc = tp_decode_json(
      FRAG11(T(0, "i64", "[8,1]") "," T(1, "bf16", "[8,1]"),
             IOTA(2, "i64") "," OP2("eq", 3, 2, 0) "," CONST(4, 0) "," WHERE(5, 3, 1, 4), T(5, "bf16", "[8,32000]")),
      &frag, &d);
  if (rc) fprintf(stderr, "  i64: %s\n", d.text);
  CHECK_EQ_INT(rc, FM_OK);
  CHECK(fm_fragment_has_integers(&frag));
  CHECK_EQ_INT(frag.ops[0].dtype, FM_DT_I64);
  /* rank 0: the index is 0 */
  CHECK_EQ_INT(tp_decode_json(FRAG11("", IOTA(1, "f32"), T(1, "f32", "[]")), &frag, &d), FM_OK);
}

/* vocab 11 in the canonical bytes; two iotas of different dtypes stay two; the dtype packed. */
static void test_canonical(void) {
  fm_diag d = {{0}};
  fm_fragment canon;
  CHECK_EQ_INT(tp_decode_json(FRAG11(LOGITS "," TARGET, ONE_HOT, T(6, "bf16", "[64,50257]")), &frag, &d), FM_OK);
  CHECK_EQ_INT(fm_fragment_canonicalize(&frag, &canon), FM_OK);
  CHECK_EQ_INT(canon.vocab, 11);
  CHECK_EQ_INT(fm_fragment_validate(&canon, &d), FM_OK);
  uint8_t *bytes = NULL;
  size_t len = 0;
  CHECK_EQ_INT(fm_fragment_canonical_bytes(&frag, &bytes, &len), FM_OK);
  int has_dtype = 0; /* "iota", then its "dtype" before the next op's fields */
  for (size_t i = 0; bytes && i + 4 < len; i++)
    if (memcmp(bytes + i, "iota", 4) == 0)
      for (size_t j = i + 4; j + 5 < len && j < i + 40; j++) has_dtype |= memcmp(bytes + j, "dtype", 5) == 0;
  CHECK(has_dtype);
  free(bytes);
  /* the same fragment with an arange input instead keeps vocab 1: no key changes */
  CHECK_EQ_INT(tp_decode_json(
                   FRAG11(T(0, "f32", "[8,16]") "," T(1, "f32", "[1,16]"), OP2("add", 2, 0, 1), T(2, "f32", "[8,16]")),
                   &frag, &d),
               FM_OK);
  CHECK_EQ_INT(fm_fragment_canonicalize(&frag, &canon), FM_OK);
  CHECK_EQ_INT(canon.vocab, 1);
}

static const tp_reject rejects[] = {
    /* what a vocabulary-10 fragment (or daemon) says */
    {FRAG(10, T(0, "f32", "[8,16]"), IOTA(1, "f32") "," OP2("add", 2, 0, 1), T(2, "f32", "[8,16]")), FM_ESCHEMA,
     "ops[0].op: 'iota' needs vocab 11 (the fragment says vocab 10)"},
    /* its dtype: required, f32 or i64 */
    {FRAG11(T(0, "f32", "[8,16]"), "{'op':'iota','out':1}," OP2("add", 2, 0, 1), T(2, "f32", "[8,16]")), FM_ESCHEMA,
     "ops[0]: iota needs a 'dtype'"},
    {FRAG11(T(0, "bf16", "[8,16]"), IOTA(1, "bf16") "," OP2("add", 2, 0, 1), T(2, "bf16", "[8,16]")), FM_ESCHEMA,
     "ops[0].dtype: iota gives f32 or i64, not bf16"},
    {FRAG11(T(0, "f32", "[8,16]"), IOTA(1, "bool") "," OP2("add", 2, 0, 1), T(2, "f32", "[8,16]")), FM_ESCHEMA,
     "ops[0].dtype: iota gives f32 or i64, not bool"},
    /* no args */
    {FRAG11(T(0, "f32", "[8,16]"), "{'op':'iota','out':1,'args':[0],'dtype':'f32'}", T(1, "f32", "[8,16]")), FM_ESCHEMA,
     "ops[0].args: 'iota' takes 0 args, got 1"},
    /* an f32 iota's indices must be exact: a static last dim of at most 2^24 */
    {FRAG11(T(0, "f32", "[-1]"), IOTA(1, "f32") "," OP2("add", 2, 0, 1), T(2, "f32", "[-1]")), FM_EUNSUPPORTED,
     "ops[0]: an f32 iota along a last dim of symbolic size"},
    {FRAG11(T(0, "f32", "[2,16777217]"), IOTA(1, "f32") "," OP2("add", 2, 0, 1), T(2, "f32", "[2,16777217]")),
     FM_EUNSUPPORTED, "ops[0]: an f32 iota along a last dim of more than 2^24"},
    /* pointwise and row fragments only */
    {FRAG11(T(0, "bf16", "[-1,64]") "," T(1, "bf16", "[64,128]"),
            OP2("mm", 2, 0, 1) "," IOTA(3, "f32") "," OP2("add", 4, 2, 3), T(4, "f32", "[-1,128]")),
     FM_EUNSUPPORTED, "iota runs in a pointwise or row fragment only"},
    {FRAG11(T(0, "f32", "[64,16]"), IOTA(1, "f32") "," OP2("mul", 2, 0, 1) ",{'op':'sum','out':3,'args':[2],'dim':0}",
            T(3, "f32", "[1,16]")),
     FM_EUNSUPPORTED, "iota runs in a pointwise or row fragment only"},
    {FRAG11(T(0, "f32", "[8,16]"), IOTA(1, "f32") ",{'op':'cat','out':2,'args':[0,1],'dim':1}", T(2, "f32", "[8,32]")),
     FM_EUNSUPPORTED, "iota runs in a pointwise or row fragment only"},
    /* an i64 iota is an integer value: not in a row fragment */
    {FRAG11(T(0, "f32", "[8,16]"),
            IOTA(1, "i64") "," CONST(2, 3) "," OP2("eq", 3, 1, 2) "," CONST(4, 0) "," WHERE(
                5, 3, 0, 4) ",{'op':'sum','out':6,'args':[5],'dim':-1}",
            T(6, "f32", "[8,1]")),
     FM_EUNSUPPORTED, "integer values run in a pointwise fragment only"},
};

static void test_rejections(void) { CHECK_EQ_INT(tp_check_rejects(rejects, sizeof rejects / sizeof *rejects), 0); }

/* A C-built fragment gets the same checks: an iota retyped after decoding. */
static void test_validate_struct(void) {
  fm_diag d = {{0}};
  CHECK_EQ_INT(tp_decode_json(FRAG11(LOGITS "," TARGET, ONE_HOT, T(6, "bf16", "[64,50257]")), &frag, &d), FM_OK);
  frag.ops[0].dtype = FM_DT_F16;
  CHECK_EQ_INT(fm_fragment_validate(&frag, &d), FM_ESCHEMA);
  CHECK_STR_CONTAINS(d.text, "iota gives f32 or i64, not f16");
}

int main(void) {
  RUN(test_accepts);
  RUN(test_canonical);
  RUN(test_rejections);
  RUN(test_validate_struct);
  return FM_TEST_DONE();
}
