/* fm_text.c: escaping text for a terminal (fm_text.h). */
#include "fm_text.h"

#include <stdint.h>

size_t fm_text_utf8_len(const unsigned char *s, size_t n) {
  size_t len, i;
  uint32_t cp;
  if (s[0] < 0x80) return 1;
  if ((s[0] & 0xE0) == 0xC0)
    len = 2, cp = s[0] & 0x1F;
  else if ((s[0] & 0xF0) == 0xE0)
    len = 3, cp = s[0] & 0x0F;
  else if ((s[0] & 0xF8) == 0xF0)
    len = 4, cp = s[0] & 0x07;
  else
    return 0;
  if (len > n) return 0;
  for (i = 1; i < len; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    cp = cp << 6 | (s[i] & 0x3F);
  }
  if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
      (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
    return 0;
  return len;
}

/* One character of s as it is shown: written to out (at most 7 bytes + NUL), its length in
 * *out_len. Returns the bytes of s it stands for (>= 1). */
static size_t escape_one(const unsigned char *s, size_t n, unsigned flags, char out[8], size_t *out_len) {
  static const char hex[] = "0123456789abcdef";
  size_t ul = fm_text_utf8_len(s, n);
  unsigned char c = s[0];
  int keep =
      ul > 0 && (c >= 0x80 || (c >= 0x20 && c != 0x7f) || ((flags & FM_TEXT_KEEP_LINES) && (c == '\n' || c == '\t')));
  if (ul == 2 && c == 0xC2 && s[1] < 0xA0) { /* a C1 control */
    out[0] = '\\', out[1] = 'u', out[2] = '0', out[3] = '0';
    out[4] = hex[s[1] >> 4], out[5] = hex[s[1] & 15];
    *out_len = 6;
    return 2;
  }
  if (keep) {
    for (size_t i = 0; i < ul; i++) out[i] = (char)s[i];
    *out_len = ul;
    return ul;
  }
  out[0] = '\\', out[1] = 'x', out[2] = hex[c >> 4], out[3] = hex[c & 15];
  *out_len = 4;
  return 1;
}

size_t fm_text_escape(char *out, size_t cap, const char *s, size_t n, unsigned flags) {
  const unsigned char *p = (const unsigned char *)s;
  size_t used = 0, len = 0;
  if (cap == 0) return 0;
  while (used < n) {
    char one[8];
    size_t one_len, took = escape_one(p + used, n - used, flags, one, &one_len);
    if (len + one_len >= cap) break;
    for (size_t i = 0; i < one_len; i++) out[len++] = one[i];
    used += took;
  }
  out[len] = '\0';
  return used;
}

void fm_text_fwrite(FILE *f, const char *s, size_t n, unsigned flags) {
  char buf[4096];
  while (n > 0) {
    size_t used = fm_text_escape(buf, sizeof buf, s, n, flags);
    fputs(buf, f);
    s += used;
    n -= used;
  }
}
