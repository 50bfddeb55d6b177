/* test_codegen_rows_frag.h: row fragments (vocab 2) for the rows template's tests, built as
 * structs, expanded (composites), validated and canonicalized through the real protocol code. */
#ifndef TEST_CODEGEN_ROWS_FRAG_H
#define TEST_CODEGEN_ROWS_FRAG_H

#include "fm_fragment.h"

/* A reduction of arg over the last dim (dim -1); correction only matters for var. */
void rf_reduce(fm_fragment *f, fm_op op, uint32_t out, uint32_t arg, uint32_t correction);
/* softmax / layer_norm / rms_norm with nargs args and eps (a composite, expanded later). */
void rf_composite(fm_fragment *f, fm_op op, uint32_t out, uint32_t nargs, uint32_t a0, uint32_t a1, uint32_t a2,
                  double eps);
/* expand + validate + canonicalize */
int rf_finish(fm_fragment *f, fm_fragment *canon);

/* The representative row fragments (golden files and NVRTC compiles):
 *   0 rows_layer_norm_bf16: y = layer_norm(x, w, b, 1e-5), x [-1, 4096] bf16, w, b [1, 4096];
 *   1 rows_rms_norm_residual: s = x + r; y = rms_norm(s, w, 1e-6); outputs y and s (bf16,
 *     [-1, 2048]);
 *   2 rows_softmax_f32: y = softmax(x), x [64, 1000] f32;
 * and, for compiles only:
 *   3 every statistic of an f16 [-1, 7] row (sum, mean, amax, var c=1, var c=0 as f32; mean
 *     also keepdim=false);
 *   4 a transposed f32 [8, 33] input (last stride 8: scalar, strided path), sum + x / sum;
 *   5 a padded bf16 [-1, 127] input (row stride 128) with a per-row scale [-1, 1] input;
 *   6 rows of one element, bf16 [-1, 1]: softmax and var with correction 1 (NaN);
 * and two streamed rows (longer than registers hold):
 *   7 rows_log_softmax_stream: log_softmax in f32 of bf16 [-1, 50257] logits at row stride
 *     50304 (a padded vocabulary; golden too);
 *   8 rows_center_stream: (x - mean) / amax, bf16 [-1, 40960] (whole tiles), the mean also
 *     a per-row output;
 *   9 rows_cross_entropy_stream: cross-entropy's forward as the client sends it, bf16
 *     [-1, 32000] logits, a [1, 32000] f32 column index and a [-1, 1] f32 target: the
 *     log-sum-exp and the picked logit per row;
 *  10 rows_softcap_cross_entropy_stream: Gemma 2's: the logits softcapped (tanh(x / 30) * 30)
 *     and written in bf16, and fragment 9's statistics of them. */
#define RF_N_REPRESENTATIVE 3
#define RF_N_FRAGMENTS      11
int rf_fragment(int which, fm_fragment *canon);
extern const char *const rf_name[RF_N_FRAGMENTS];

#endif
