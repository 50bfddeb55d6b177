/* test_protocol_text.c: fm_text.h, text made safe for a terminal: what is escaped and how,
 * what is kept, and that a short buffer never ends in half an escape or half a character. */
#include <stdlib.h>
#include <string.h>

#include "fm_test.h"
#include "fm_text.h"

static const char *esc(const char *s, size_t n, unsigned flags) {
  static char out[256];
  fm_text_escape(out, sizeof out, s, n, flags);
  return out;
}

static void test_escaped(void) {
  CHECK(strcmp(esc("a\x1b[31mb", 7, 0), "a\\x1b[31mb") == 0);
  CHECK(strcmp(esc("\x07\x7f\r", 3, 0), "\\x07\\x7f\\x0d") == 0);
  CHECK(strcmp(esc("x\0y", 3, 0), "x\\x00y") == 0); /* a NUL is shown, not an end */
  CHECK(strcmp(esc("\xc2\x9b"
                   "2J",
                   4, 0),
               "\\u009b2J") == 0);                                  /* C1 CSI */
  CHECK(strcmp(esc("\xff\xc3", 2, 0), "\\xff\\xc3") == 0);          /* invalid, truncated UTF-8 */
  CHECK(strcmp(esc("\xc0\xaf", 2, 0), "\\xc0\\xaf") == 0);          /* overlong '/' */
  CHECK(strcmp(esc("\xed\xa0\x80", 3, 0), "\\xed\\xa0\\x80") == 0); /* a surrogate */
  CHECK(strcmp(esc("a\nb\tc", 5, 0), "a\\x0ab\\x09c") == 0);
}

static void test_kept(void) {
  const char *plain = "sm_90a \\n \"q\" caf\xc3\xa9 \xc2\xa0 \xe2\x82\xac \xf0\x9f\x98\x80";
  CHECK(strcmp(esc(plain, strlen(plain), 0), plain) == 0);
  CHECK(strcmp(esc("a\nb\tc", 5, FM_TEXT_KEEP_LINES), "a\nb\tc") == 0);
  CHECK(strcmp(esc("a\r\n", 3, FM_TEXT_KEEP_LINES), "a\\x0d\n") == 0);
}

static void test_short_buffer(void) {
  char out[6];
  /* "ab" fits, "\x1b" (4) does not: stop before it, reporting 2 bytes used. */
  CHECK_EQ_INT(fm_text_escape(out, sizeof out, "ab\x1b", 3, 0), 2);
  CHECK(strcmp(out, "ab") == 0);
  CHECK_EQ_INT(fm_text_escape(out, sizeof out, "a\xe2\x82\xac\xe2\x82\xac", 7, 0), 4);
  CHECK(strcmp(out, "a\xe2\x82\xac") == 0); /* the second euro sign would not fit whole */
  CHECK_EQ_INT(fm_text_escape(out, 1, "abc", 3, 0), 0);
  CHECK(out[0] == '\0');
}

static void test_fwrite_long(void) {
  /* More than fm_text_fwrite's buffer, an escape on every chunk boundary there might be. */
  size_t n = 10000;
  char *s = malloc(n), *got = NULL;
  size_t got_len = 0;
  for (size_t i = 0; i < n; i++) s[i] = i % 7 == 0 ? '\x1b' : 'x';
  FILE *m = open_memstream(&got, &got_len);
  fm_text_fwrite(m, s, n, 0);
  fclose(m);
  size_t want = n + 3 * ((n + 6) / 7); /* each ESC becomes 4 characters */
  CHECK_EQ_INT(got_len, want);
  CHECK(got && !strchr(got, '\x1b'));
  free(s);
  free(got);
}

int main(void) {
  RUN(test_escaped);
  RUN(test_kept);
  RUN(test_short_buffer);
  RUN(test_fwrite_long);
  return FM_TEST_DONE();
}
