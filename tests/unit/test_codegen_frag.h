/* test_codegen_frag.h: building fragments by hand for the codegen tests. Every builder
 * fills the plain structs of fm_fragment.h; tf_finish validates and canonicalizes them
 * through the real protocol code, so the tests see exactly what the daemon hands codegen. */
#ifndef TEST_CODEGEN_FRAG_H
#define TEST_CODEGEN_FRAG_H

#include <stdint.h>

#include "fm_fragment.h"
#include "fm_meta.h"

void tf_init(fm_fragment *f);
/* strides NULL: contiguous row-major over shape (size-1 dims included). */
void tf_input(fm_fragment *f, uint32_t id, fm_dtype dt, uint32_t rank, const int64_t *shape, const int64_t *strides,
              uint32_t align);
void tf_output(fm_fragment *f, uint32_t id, fm_dtype dt, uint32_t rank, const int64_t *shape, const int64_t *strides,
               uint32_t align);
void tf_op(fm_fragment *f, fm_op op, uint32_t out, uint32_t nargs, uint32_t a0, uint32_t a1, uint32_t a2);
void tf_const(fm_fragment *f, uint32_t out, double value);
void tf_cast(fm_fragment *f, uint32_t out, uint32_t arg, fm_dtype to);
/* An iota (vocab 11) of dtype dt: the element's index along the iteration's last dim. */
void tf_iota(fm_fragment *f, uint32_t out, fm_dtype dt);
/* validate + canonicalize into canon; FM_OK or the error (printed with its reason). */
int tf_finish(fm_fragment *f, fm_fragment *canon);

/* Validates f expecting error rc_want with `why` in its reason: 1 when so, else 0 after
 * printing what came instead (the caller CHECKs the result). */
int tf_rejects(fm_fragment *f, int rc_want, const char *why);

/* NVRTC of the kernel of every candidate of canon (fm_codegen_candidates) for sm_90a, and of
 * the default's for sm_80, where this NVRTC knows the arch and the candidate runs there;
 * prints each failure with its log and "N compiles of M kernels". Returns the failures
 * (generation or compile); *compiled, when given, the compiles that succeeded. */
int tf_compile_candidates(const fm_fragment *canon, const char *name, int *compiled);
/* The same, every candidate for sm_80 too (each that runs there). */
int tf_compile_every(const fm_fragment *canon, const char *name, int *compiled);

/* The mainloop of a gemm candidate (fm_codegen_gemm.h's table of named properties: wgmma,
 * tma, persistent, pingpong, ...), through the config the candidate encodes; NULL for a
 * candidate of another template. */
struct fm_candidate;
struct fm_gemm_mainloop;
const struct fm_gemm_mainloop *tf_gemm_mainloop(const struct fm_candidate *c);

/* m packed to its wire form and read back into *back (fm_meta_pack, fm_meta_unpack): what
 * fm_meta_unpack returned, or FM_ENOMEM when packing failed. */
int tf_meta_round_trip(const fm_kernel_meta *m, fm_kernel_meta *back, fm_diag *d);

/* Compares src with tests/unit/golden/<name>.cu (found through FM_SOURCE_DIR, or the build's
 * source dir outside ctest), byte for byte, reporting the first differing line; with
 * FM_UPDATE_GOLDEN=1 it writes the file instead. 1 when they agree (or it was written). */
int tf_golden(const char *name, const char *src);
/* The same for tests/unit/golden/<file> (any text, the name with its extension). */
int tf_golden_file(const char *file, const char *src);

/* Contiguous strides of shape (a symbolic dim 0 gets the product of the others). */
void tf_contiguous(uint32_t rank, const int64_t *shape, int64_t *strides);

/* Two GEMM-family fragments several tests build (raw filled, canon its canonical form):
 *   an MLP block as one chain (the b2b template): y = gelu(x @ W1.t() + b1) @ W2.t() + b2 + r,
 *     x [-1, k1] bf16, W1.t() [k1, n1] and W2.t() [n1, n2] column-major (nn.Linear's
 *     weights), b1 [n1], b2 [n2], r [-1, n2]; m_hint 16384;
 *   attention scores (a bmm): q [-1, 128, 64] bf16 @ k.transpose(-1, -2) (B [-1, 64, 128],
 *     strides [8192, 1, 64]: column-major per product) * 0.125 + mask [128, 128] ->
 *     [-1, 128, 128]; m_hint 48. */
int tf_mlp_chain(fm_fragment *raw, fm_fragment *canon, int64_t k1, int64_t n1, int64_t n2);

/* Max pooling (vocabulary 7) over x [n, c, h, w] (nchw; n -1: symbolic) of dtype dt with
 * window (FM_WIN_* layout) and ceil_mode; every tensor channels-last (strides [h*w*c, 1,
 * w*c, c]) or row-major; pass:
 *   TF_POOL_FORWARD: y = max_pool2d(x), inputs [x], y [n, c, OH, OW];
 *   TF_POOL_ARGMAX:  y and the argmax's tap indices (cast to f16), outputs [y, argmax];
 *   TF_POOL_BACKWARD: grad_x = max_pool2d_backward(gy, argmax), inputs [gy [n, c, OH, OW] of dt,
 *                    argmax of f16, laid out as gy], grad_x [n, c, h, w] of dt.
 * raw filled, canon its canonical form; FM_OK or the error (printed). ResNet's stem:
 * tf_max_pool(.., FM_DT_BF16, {-1, 64, 12, 12}, {3, 3, 2, 2, 1, 1, 1, 1}, 0, 1, ..). */
enum { TF_POOL_FORWARD, TF_POOL_BACKWARD, TF_POOL_ARGMAX };
int tf_max_pool(fm_fragment *raw, fm_fragment *canon, fm_dtype dt, const int64_t nchw[4], const int32_t window[8],
                int ceil_mode, int channels_last, int pass);
int tf_attention_scores(fm_fragment *raw, fm_fragment *canon);

/* The four representative fragments of the golden tests (also used by other tests):
 *   0 flat bf16: y = gelu(x + b) * 0.5, x [4096, 1024] dense, b a [1, 1] scalar;
 *   1 strided: y = silu(x + bias), x [-1, 768] with a padded row stride of 1024, bias [1, 768];
 *   2 multi-output: t = gt(x, 0); y = where(t, x, x * 0.01) (f32); z = cast(y, bf16); t (bool),
 *     x f32 [64, 128];
 *   3 units across odd rows: y = bf16(exp(f32(x) - lse)), x bf16 [-1, 50257] at a padded row
 *     stride of 50304, lse f32 [-1, 1], y contiguous. */
#define TF_N_REPRESENTATIVE 4
int tf_representative(int which, fm_fragment *canon);
extern const char *const tf_representative_name[TF_N_REPRESENTATIVE];

#endif
