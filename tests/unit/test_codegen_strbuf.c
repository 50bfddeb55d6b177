/* test_codegen_strbuf.c: fm_strbuf: growth, printf, the max size, the sticky error. */
#include <stdlib.h>
#include <string.h>

#include "fm_error.h"
#include "fm_strbuf.h"
#include "fm_test.h"

static void test_append_and_grow(void) {
  fm_strbuf sb;
  fm_strbuf_init(&sb, 0);
  for (int i = 0; i < 1000; i++) fm_strbuf_append(&sb, "abc");
  fm_strbuf_appendn(&sb, "xyz!", 3);
  CHECK_EQ_INT(fm_strbuf_error(&sb), 0);
  CHECK_EQ_INT(sb.len, 3003);
  CHECK(strncmp(sb.data + 2997, "abcxyz", 7) == 0);
  CHECK_EQ_INT(strlen(sb.data), 3003);
  char *s = fm_strbuf_take(&sb);
  CHECK(s != NULL);
  CHECK_EQ_INT(strlen(s), 3003);
  CHECK(sb.data == NULL && sb.len == 0); /* take resets */
  free(s);
}

static void test_printf(void) {
  fm_strbuf sb;
  fm_strbuf_init(&sb, 0);
  fm_strbuf_printf(&sb, "v%u = %s;", 7u, "x");
  fm_strbuf_printf(&sb, " %lldLL", (long long)1 << 40);
  /* longer than the first allocation: printf must measure, grow, then write */
  char big[600];
  memset(big, 'q', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  fm_strbuf_printf(&sb, "[%s]", big);
  CHECK_EQ_INT(fm_strbuf_error(&sb), 0);
  CHECK(strncmp(sb.data, "v7 = x; 1099511627776LL[qqq", 27) == 0);
  CHECK_EQ_INT(sb.len, 23 + 601);
  fm_strbuf_free(&sb);
}

static void test_take_empty(void) {
  fm_strbuf sb;
  fm_strbuf_init(&sb, 16);
  char *s = fm_strbuf_take(&sb);
  CHECK(s != NULL && s[0] == '\0');
  free(s);
}

static void test_max_is_sticky(void) {
  fm_strbuf sb;
  fm_strbuf_init(&sb, 10);
  fm_strbuf_append(&sb, "0123456789"); /* exactly max: fine */
  CHECK_EQ_INT(fm_strbuf_error(&sb), 0);
  CHECK_EQ_INT(sb.len, 10);
  fm_strbuf_append(&sb, "a"); /* one past: refused */
  CHECK_EQ_INT(fm_strbuf_error(&sb), FM_ELIMIT);
  CHECK_EQ_INT(sb.len, 10);
  /* sticky: nothing is appended after the first error, even what would fit */
  fm_strbuf_free(&sb);
  fm_strbuf_init(&sb, 8);
  fm_strbuf_printf(&sb, "%s", "123456789");
  CHECK_EQ_INT(fm_strbuf_error(&sb), FM_ELIMIT);
  fm_strbuf_append(&sb, "ab");
  fm_strbuf_appendn(&sb, "cd", 2);
  fm_strbuf_printf(&sb, "%d", 1);
  CHECK_EQ_INT(fm_strbuf_error(&sb), FM_ELIMIT);
  CHECK_EQ_INT(sb.len, 0);
  CHECK(fm_strbuf_take(&sb) == NULL); /* an errored buffer hands out nothing */
  CHECK(sb.data == NULL);
  CHECK_EQ_INT(fm_strbuf_error(&sb), 0); /* ... and is reset for reuse */
  fm_strbuf_append(&sb, "ok");
  CHECK(sb.data && strcmp(sb.data, "ok") == 0);
  fm_strbuf_free(&sb);
}

int main(void) {
  RUN(test_append_and_grow);
  RUN(test_printf);
  RUN(test_take_empty);
  RUN(test_max_is_sticky);
  return FM_TEST_DONE();
}
