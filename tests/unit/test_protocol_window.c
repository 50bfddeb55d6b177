/* test_protocol_window.c: vocabulary 7 (the window ops max_pool2d and max_pool2d_backward):
 * what an extent fragment with a window op accepts (ResNet's channels-last stem, the backward,
 * dilation with ceil_mode, a pool inside a pointwise chain), the pooled sizes, the extents
 * validation infers, the canonical form (vocab 7, window and ceil_mode always packed, every
 * other fragment's bytes unchanged), and every refusal with its error class and reason. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_error.h"
#include "fm_fragment.h"
#include "fm_test.h"
#include "test_protocol_util.h"

#define FRAG(v, inputs, ops, outputs) "{'vocab':" #v ",'inputs':[" inputs "],'ops':[" ops "],'outputs':[" outputs "]}"
#define FRAG7(inputs, ops, outputs)   FRAG(7, inputs, ops, outputs)
#define T(id, dt, shape)              "{'id':" #id ",'dtype':'" dt "','shape':" shape "}"
/* ResNet's stem: x [-1, 64, 12, 12] channels-last bf16, 3x3 stride 2 padding 1 */
#define X                             "{'id':0,'dtype':'bf16','shape':[-1,64,12,12],'strides':[9216,1,768,64]}"
#define GY                            "{'id':1,'dtype':'bf16','shape':[-1,64,6,6],'strides':[2304,1,384,64]}"
#define STEM                          "[3,3,2,2,1,1,1,1]"
#define POOL(out, arg, window)        "{'op':'max_pool2d','out':" #out ",'args':[" #arg "],'window':" window "}"
#define POOL_BW(out, gy, am, window) \
  "{'op':'max_pool2d_backward','out':" #out ",'args':[" #gy "," #am "],'window':" window "}"
/* the argmax's tap indices (f16), laid out as gy */
#define AM "{'id':3,'dtype':'f16','shape':[-1,64,6,6],'strides':[2304,1,384,64]}"
#define Y  T(2, "bf16", "[-1,64,6,6]")
#define GX T(2, "bf16", "[-1,64,12,12]")

static fm_fragment frag;

/* PyTorch's pooling_output_shape, ceil_mode's last-window rule included. */
static void test_pooled_sizes(void) {
  static const struct {
    int64_t in;
    int32_t k, s, p, d;
    int ceil;
    int64_t want;
  } c[] = {
      {112, 3, 2, 1, 1, 0, 56}, {13, 3, 2, 1, 1, 0, 7}, {5, 2, 2, 0, 1, 0, 2},  {5, 2, 2, 0, 1, 1, 3},
      {4, 2, 3, 1, 1, 0, 2},    {4, 2, 3, 1, 1, 1, 2}, /* ceil gives 3; its last window would start past in + p */
      {9, 2, 1, 1, 2, 1, 9},    {10, 3, 3, 1, 1, 1, 4}, {2, 5, 1, 0, 1, 0, -2}, {7, 3, 1, 0, 4, 0, -1},
  };
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    int32_t w[8] = {c[i].k, 1, c[i].s, 1, c[i].p, 0, c[i].d, 1};
    CHECK_EQ_INT((int)fm_window_pooled(c[i].in, w, 0, c[i].ceil), (int)c[i].want);
    int32_t v[8] = {1, c[i].k, 1, c[i].s, 0, c[i].p, 1, c[i].d}; /* the same along W */
    CHECK_EQ_INT((int)fm_window_pooled(c[i].in, v, 1, c[i].ceil), (int)c[i].want);
  }
}

static void test_accepts(void) {
  static const char *const ok[] = {
      FRAG7(X, POOL(2, 0, STEM), Y),
      /* the backward; ceil_mode spelt false */
      FRAG7(GY "," AM, "{'op':'max_pool2d_backward','out':2,'args':[1,3],'window':" STEM ",'ceil_mode':false}", GX),
      /* the forward with its argmax, stored as f16 */
      FRAG7(X,
            POOL(2, 0, STEM) ",{'op':'max_pool2d_argmax','out':4,'args':[0],'window':" STEM
                             "},{'op':'cast','out':5,'args':[4],'dtype':'f16'}",
            Y "," T(5, "f16", "[-1,64,6,6]")),
      /* dilation 2 x 1, strides 1 x 3, a 2x3 kernel, ceil_mode: [2, 3, 9, 10] -> [2, 3, 9, 4] */
      FRAG7(T(0, "f32", "[2,3,9,10]"),
            "{'op':'max_pool2d','out':1,'args':[0],'window':[2,3,1,3,1,1,2,1],'ceil_mode':true}",
            T(1, "f32", "[2,3,9,4]")),
      /* a pool in a pointwise chain: relu(max_pool2d(x) + bias), the bias broadcast per channel */
      FRAG7(X "," T(1, "bf16", "[1,64,1,1]"),
            POOL(2, 0, STEM) ",{'op':'add','out':3,'args':[2,1]},{'op':'relu','out':4,'args':[3]}",
            T(4, "bf16", "[-1,64,6,6]")),
  };
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
    fm_diag d = {{0}};
    int rc = tp_decode_json(ok[i], &frag, &d);
    if (rc) fprintf(stderr, "  case %zu: %s\n", i, d.text);
    CHECK_EQ_INT(rc, FM_OK);
    CHECK(fm_fragment_is_extent(&frag) && !fm_fragment_is_cat(&frag));
    CHECK(!fm_fragment_is_rows(&frag) && !fm_fragment_is_gemm(&frag));
  }
  /* the last case's pool: bf16, its window as sent */
  CHECK_EQ_INT(frag.ops[0].dtype, FM_DT_BF16);
  CHECK(frag.ops[0].window[FM_WIN_KH] == 3 && frag.ops[0].window[FM_WIN_SW] == 2 && frag.ops[0].window[FM_WIN_PH] == 1);
  CHECK_EQ_INT(frag.ops[0].ceil_mode, 0);
}

static void test_extents(void) {
  static fm_cat_info ci;
  fm_diag d = {{0}};
  CHECK_EQ_INT(tp_decode_json(FRAG7(X, POOL(2, 0, STEM), Y), &frag, &d), FM_OK);
  CHECK_EQ_INT(fm_fragment_cat_info(&frag, &ci, &d), FM_OK);
  CHECK(ci.ext[1][0] == -1 && ci.ext[1][1] == 64 && ci.ext[1][2] == 6 && ci.ext[1][3] == 6);
  CHECK_EQ_INT(tp_decode_json(FRAG7(GY "," AM, POOL_BW(2, 1, 3, STEM), GX), &frag, &d), FM_OK);
  CHECK_EQ_INT(fm_fragment_cat_info(&frag, &ci, &d), FM_OK);
  CHECK(ci.ext[2][0] == -1 && ci.ext[2][1] == 64 && ci.ext[2][2] == 12 && ci.ext[2][3] == 12);
  CHECK_EQ_INT(frag.ops[0].dtype, FM_DT_BF16); /* gy's */
  CHECK_EQ_INT(tp_decode_json(FRAG7(X, "{'op':'max_pool2d_argmax','out':2,'args':[0],'window':" STEM "}",
                                    T(2, "f32", "[-1,64,6,6]")),
                              &frag, &d),
               FM_OK);
  CHECK_EQ_INT(frag.ops[0].dtype, FM_DT_F32); /* tap indices, exact in fp32 */
}

/* "window" then "ceil_mode" (false) end a pool's canonical map */
static int has_window_tail(const uint8_t *a, size_t la) {
  static const uint8_t tail[] = {0xa6, 'w', 'i',  'n', 'd', 'o', 'w', 0x98, 3,   3,   2,   2,   1,   1,
                                 1,    1,   0xa9, 'c', 'e', 'i', 'l', '_',  'm', 'o', 'd', 'e', 0xc2};
  for (size_t i = 0; a && i + sizeof tail <= la; i++)
    if (memcmp(a + i, tail, sizeof tail) == 0) return 1;
  return 0;
}

static void test_canonical(void) {
  size_t la, lb, lc;
  uint8_t *a = tp_canon_json(FRAG7(X, POOL(2, 0, STEM), Y), &la);
  /* other ids, ceil_mode spelt false, a dead op, align 64 */
  uint8_t *b = tp_canon_json(FRAG7("{'id':7,'dtype':'bf16','shape':[-1,64,12,12],'strides':[9216,1,768,64],'align':64}",
                                   "{'op':'exp','out':8,'args':[7]},"
                                   "{'op':'max_pool2d','out':9,'args':[7],'window':" STEM ",'ceil_mode':false}",
                                   T(9, "bf16", "[-1,64,6,6]")),
                             &lb);
  CHECK(tp_bytes_eq(a, la, b, lb));
  CHECK(a && la > 8 && a[7] == 7); /* {"vocab": 7, ... */
  CHECK(has_window_tail(a, la));
  CHECK(tp_canonical_fixed_point(a, la, &frag));
  CHECK(frag.ops[0].window[FM_WIN_PW] == 1 && frag.ops[0].window[FM_WIN_DH] == 1);
  /* ceil_mode and every window field are part of the key */
  uint8_t *c = tp_canon_json(FRAG7(X, "{'op':'max_pool2d','out':2,'args':[0],'window':" STEM ",'ceil_mode':true}",
                                   T(2, "bf16", "[-1,64,7,7]")), /* 12 in: a 7th window starts at 12 - 1 */
                             &lc);
  CHECK(c && !tp_bytes_eq(a, la, c, lc));
  free(c);
  c = tp_canon_json(FRAG7(X, POOL(2, 0, "[3,3,2,2,1,1,1,2]"), T(2, "bf16", "[-1,64,6,5]")), &lc);
  CHECK(c && !tp_bytes_eq(a, la, c, lc));
  free(c);
  /* a vocab-7 fragment without a window op keeps its vocabulary-1 bytes */
  c = tp_canon_json(FRAG7(T(0, "f32", "[4,8]"), "{'op':'relu','out':1,'args':[0]}", T(1, "f32", "[4,8]")), &lc);
  CHECK(c && lc > 8 && c[7] == 1);
  free(c);
  free(a);
  free(b);
  /* the backward: fixed point too */
  a = tp_canon_json(FRAG7(GY "," AM, POOL_BW(2, 1, 3, STEM), GX), &la);
  CHECK(a && has_window_tail(a, la) && tp_canonical_fixed_point(a, la, &frag));
  free(a);
}

static const tp_reject rejects[] = {
    /* what a vocabulary-6 fragment (or daemon) says */
    {FRAG(6, X, POOL(2, 0, STEM), Y), FM_ESCHEMA, "ops[0].op: 'max_pool2d' needs vocab 7"},
    {FRAG(12, X, POOL(2, 0, STEM), Y), FM_ESCHEMA, "vocab 12 not supported, this daemon speaks 1 to 11"},
    /* operands that are not fragment inputs */
    {FRAG7(X, "{'op':'relu','out':1,'args':[0]}," POOL(2, 1, STEM), Y), FM_EUNSUPPORTED,
     "ops[1].args[0]: a max_pool2d reads fragment inputs only"},
    {FRAG7(GY "," AM, "{'op':'neg','out':4,'args':[1]}," POOL_BW(2, 4, 3, STEM), GX), FM_EUNSUPPORTED,
     "ops[1].args[0]: a max_pool2d_backward reads fragment inputs only"},
    {FRAG7(X, "{'op':'const','out':1,'value':1}," POOL(2, 1, STEM), Y), FM_EUNSUPPORTED,
     "ops[1].args[0]: a max_pool2d reads fragment inputs only"},
    /* the window array */
    {FRAG7(X, "{'op':'max_pool2d','out':2,'args':[0]}", Y), FM_ESCHEMA, "ops[0]: max_pool2d needs a 'window'"},
    {FRAG7(X, POOL(2, 0, "[3,3,2,2,1,1,1]"), Y), FM_ESCHEMA,
     "ops[0].window: expected 8 integers [kh, kw, sh, sw, ph, pw, dh, dw], got 7"},
    {FRAG7(X, POOL(2, 0, "[3,3,2,2,1,1,1,1,1]"), Y), FM_ESCHEMA, "ops[0].window: expected 8 integers"},
    {FRAG7(X, POOL(2, 0, "3"), Y), FM_ESCHEMA, "ops[0].window: expected an array of 8 integers, got an integer"},
    {FRAG7(X, POOL(2, 0, "[3,3,2.0,2,1,1,1,1]"), Y), FM_ESCHEMA, "ops[0].window[2]: expected an integer, got a float"},
    {FRAG7(X, POOL(2, 0, "[3,3,2,2,1,'1',1,1]"), Y), FM_ESCHEMA, "ops[0].window[5]: expected an integer, got a str"},
    {FRAG7(X, POOL(2, 0, "[3,3,2,2,1,1,1,1099511627776]"), Y), FM_ELIMIT,
     "ops[0].window[7]: 1099511627776 is out of range"},
    /* the window's ranges */
    {FRAG7(X, POOL(2, 0, "[0,3,2,2,0,1,1,1]"), Y), FM_ESCHEMA,
     "ops[0].window[0]: the kernel height (kh) is 0, below 1"},
    {FRAG7(X, POOL(2, 0, "[3,65,2,2,1,1,1,1]"), Y), FM_ELIMIT,
     "ops[0].window[1]: the kernel width (kw) is 65, above the limit of 64"},
    {FRAG7(X, POOL(2, 0, "[3,3,0,2,1,1,1,1]"), Y), FM_ESCHEMA,
     "ops[0].window[2]: the stride height (sh) is 0, below 1"},
    {FRAG7(X, POOL(2, 0, "[3,3,2,1048577,1,1,1,1]"), Y), FM_ELIMIT,
     "ops[0].window[3]: the stride width (sw) is 1048577, above the limit of 1048576"},
    {FRAG7(X, POOL(2, 0, "[3,3,2,2,1,1,-1,1]"), Y), FM_ESCHEMA,
     "ops[0].window[6]: the dilation height (dh) is -1, below 1"},
    {FRAG7(X, POOL(2, 0, "[3,3,2,2,1,1,1,2000000]"), Y), FM_ELIMIT,
     "ops[0].window[7]: the dilation width (dw) is 2000000, above the limit of 1048576"},
    {FRAG7(X, POOL(2, 0, "[3,3,2,2,2,1,1,1]"), Y), FM_ESCHEMA,
     "ops[0].window[4]: the padding height (ph) is 2; pad should be at most half of kernel size 3"},
    {FRAG7(X, POOL(2, 0, "[3,2,2,2,1,-1,1,1]"), Y), FM_ESCHEMA,
     "ops[0].window[5]: the padding width (pw) is -1; pad should be at most half of kernel size 2"},
    /* ceil_mode; the keys on other ops */
    {FRAG7(X, "{'op':'max_pool2d','out':2,'args':[0],'window':" STEM ",'ceil_mode':1}", Y), FM_ESCHEMA,
     "ops[0].ceil_mode: expected a bool, got an integer"},
    {FRAG7(X, "{'op':'relu','out':2,'args':[0],'window':" STEM "}", T(2, "bf16", "[-1,64,12,12]")), FM_ESCHEMA,
     "ops[0].window: only the window ops (max_pool2d, its argmax and backward) take a window, not 'relu'"},
    {FRAG7(X, "{'op':'relu','out':2,'args':[0],'ceil_mode':true}", T(2, "bf16", "[-1,64,12,12]")), FM_ESCHEMA,
     "ops[0].ceil_mode: only the window ops (max_pool2d, its argmax and backward) take a ceil_mode, not 'relu'"},
    {FRAG7(X, "{'op':'max_pool2d','out':2,'args':[0],'window':" STEM ",'dim':1}", Y), FM_ESCHEMA,
     "only reductions, softmax and cat take a dim, not 'max_pool2d'"},
    {FRAG7(X, "{'op':'max_pool2d','out':2,'args':[0,0],'window':" STEM "}", Y), FM_ESCHEMA,
     "ops[0].args: 'max_pool2d' takes 1 arg, got 2"},
    {FRAG7(X, "{'op':'max_pool2d_backward','out':2,'args':[0],'window':" STEM "}", Y), FM_ESCHEMA,
     "ops[0].args: 'max_pool2d_backward' takes 2 args, got 1"},
    {FRAG7(GY "," X, POOL_BW(2, 1, 0, STEM), GX), FM_ESCHEMA,
     "ops[0].args[1]: the argmax is [-1, 64, 12, 12], but max_pool2d of the result's [-1, 64, 12, 12] is "
     "[-1, 64, 6, 6]"},
    {FRAG7(GY "," AM, POOL_BW(2, 1, 3, STEM), T(2, "bf16", "[-1,64,15,15]")), FM_ESCHEMA,
     "ops[0].args[0]: gy is [-1, 64, 6, 6], but max_pool2d of the result's [-1, 64, 15, 15] is [-1, 64, 8, 8]"},
    /* tap indices a dtype cannot hold exactly: 17 x 17 taps in bf16 */
    {FRAG7(T(1, "f32", "[1,1,2,2]") "," T(3, "bf16", "[1,1,2,2]"), POOL_BW(2, 1, 3, "[17,17,16,16,0,0,1,1]"),
           T(2, "f32", "[1,1,32,32]")),
     FM_ESCHEMA, "ops[0].args[1]: 'max_pool2d_backward' reads tap indices up to 288, which bf16 does not hold exactly"},
    /* shapes: the rank, sizes the window does not fit, the output's shape, gy's */
    {FRAG7(T(0, "f32", "[12,12]"), POOL(1, 0, STEM), T(1, "f32", "[6,6]")), FM_ESCHEMA,
     "ops[0]: 'max_pool2d' pools the last two dims of a rank >= 3 tensor; the rank is 2"},
    {FRAG7(T(0, "f32", "[1,1,2,2]"), POOL(1, 0, "[5,2,1,1,0,0,1,1]"), T(1, "f32", "[1,1,1,1]")), FM_ESCHEMA,
     "ops[0]: 'max_pool2d' over an input height of 2: the window (kernel 5, dilation 1, padding 0) leaves no output"},
    {FRAG7(T(0, "f32", "[1,1,8,3]"), POOL(1, 0, "[2,2,1,1,0,0,1,3]"), T(1, "f32", "[1,1,7,1]")), FM_ESCHEMA,
     "ops[0]: 'max_pool2d' over an input width of 3: the window (kernel 2, dilation 3, padding 0) leaves no output"},
    {FRAG7(X, POOL(2, 0, STEM), T(2, "bf16", "[-1,64,7,7]")), FM_ESCHEMA,
     "outputs[0]: value 2 is [-1, 64, 6, 6], which does not broadcast to the iteration shape [-1, 64, 7, 7] along dim 2"},
    {FRAG7(T(1, "bf16", "[-1,64,5,6]") "," AM, POOL_BW(2, 1, 3, STEM), GX), FM_ESCHEMA,
     "ops[0].args[0]: gy is [-1, 64, 5, 6], but max_pool2d of the result's [-1, 64, 12, 12] is [-1, 64, 6, 6]"},
    {FRAG7(GY "," T(3, "f16", "[-1,32,6,6]"), POOL_BW(2, 1, 3, STEM), GX), FM_ESCHEMA,
     "ops[0].args[1]: the argmax is [-1, 32, 6, 6], but max_pool2d of the result's [-1, 64, 12, 12] is [-1, 64, 6, 6]"},
    /* dtypes */
    {FRAG7(GY "," T(3, "bool", "[-1,64,6,6]"), POOL_BW(2, 1, 3, STEM), GX), FM_ESCHEMA,
     "ops[0].args: 'max_pool2d_backward' pools a floating-point tensor, value 3 is bool"},
    {FRAG7(T(0, "bool", "[2,3,4,4]"), POOL(1, 0, "[2,2,2,2,0,0,1,1]"), T(1, "bool", "[2,3,2,2]")), FM_ESCHEMA,
     "ops[0].args: 'max_pool2d' pools a floating-point tensor, value 0 is bool"},
    /* beside a reduction or a product */
    {FRAG7(X, POOL(2, 0, STEM) ",{'op':'sum','out':3,'args':[2]}", T(3, "bf16", "[-1,64,6,1]")), FM_EUNSUPPORTED,
     "ops[0]: a max_pool2d runs in a pointwise fragment only (not with a reduction or a matrix product)"},
    {FRAG7(T(0, "bf16", "[-1,64]") "," T(1, "bf16", "[64,32]") "," T(3, "bf16", "[2,4,8,8]"),
           "{'op':'mm','out':2,'args':[0,1]}," POOL(4, 3, "[2,2,2,2,0,0,1,1]"), T(2, "bf16", "[-1,32]")),
     FM_EUNSUPPORTED, "a max_pool2d runs in a pointwise fragment only"},
};

static void test_rejections(void) { CHECK_EQ_INT(tp_check_rejects(rejects, sizeof rejects / sizeof *rejects), 0); }

/* A C-built fragment gets the same checks as a decoded one. */
static void test_validate_struct(void) {
  fm_diag d = {{0}};
  CHECK_EQ_INT(tp_decode_json(FRAG7(X, POOL(2, 0, STEM), Y), &frag, &d), FM_OK);
  frag.ops[0].window[FM_WIN_KW] = 0;
  CHECK_EQ_INT(fm_fragment_validate(&frag, &d), FM_ESCHEMA);
  CHECK_STR_CONTAINS(d.text, "ops[0].window[1]: the kernel width (kw) is 0, below 1");
  frag.ops[0].window[FM_WIN_KW] = 3;
  frag.ops[0].window[FM_WIN_PW] = 2;
  CHECK_EQ_INT(fm_fragment_validate(&frag, &d), FM_ESCHEMA);
  CHECK_STR_CONTAINS(d.text, "pad should be at most half of kernel size 3");
}

int main(void) {
  RUN(test_pooled_sizes);
  RUN(test_accepts);
  RUN(test_extents);
  RUN(test_canonical);
  RUN(test_rejections);
  RUN(test_validate_struct);
  return FM_TEST_DONE();
}
