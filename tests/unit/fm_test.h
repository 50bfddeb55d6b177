/* fm_test.h: a minimal unit-test harness. Each test binary defines TEST functions,
 * lists them in main with RUN, and ends with FM_TEST_DONE(), which prints the plain
 * closing line "N passed, N failed" and returns nonzero on any failure. */
#ifndef FM_TEST_H
#define FM_TEST_H

#include <stdio.h>
#include <string.h>

static int fm_test_failed_checks_;
static int fm_test_passed_, fm_test_failed_;

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "  %s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      fm_test_failed_checks_++;                                                  \
    }                                                                            \
  } while (0)

#define CHECK_EQ_INT(a, b)                                                                                         \
  do {                                                                                                             \
    long long va_ = (long long)(a), vb_ = (long long)(b);                                                          \
    if (va_ != vb_) {                                                                                              \
      fprintf(stderr, "  %s:%d: CHECK_EQ failed: %s == %lld, %s == %lld\n", __FILE__, __LINE__, #a, va_, #b, vb_); \
      fm_test_failed_checks_++;                                                                                    \
    }                                                                                                              \
  } while (0)

#define CHECK_STR_CONTAINS(hay, needle)                                                                    \
  do {                                                                                                     \
    const char *h_ = (hay), *n_ = (needle);                                                                \
    if (!h_ || !strstr(h_, n_)) {                                                                          \
      fprintf(stderr, "  %s:%d: expected \"%s\" in \"%s\"\n", __FILE__, __LINE__, n_, h_ ? h_ : "(null)"); \
      fm_test_failed_checks_++;                                                                            \
    }                                                                                                      \
  } while (0)

#define RUN(fn)                              \
  do {                                       \
    int before_ = fm_test_failed_checks_;    \
    fn();                                    \
    if (fm_test_failed_checks_ == before_) { \
      fm_test_passed_++;                     \
      printf("ok   %s\n", #fn);              \
    } else {                                 \
      fm_test_failed_++;                     \
      printf("FAIL %s\n", #fn);              \
    }                                        \
  } while (0)

#define FM_TEST_DONE() (printf("%d passed, %d failed\n", fm_test_passed_, fm_test_failed_), fm_test_failed_ ? 1 : 0)

#endif
