/* fm_strbuf.c: the growable string behind all generated source.
 *
 * The first failure (FM_ENOMEM, or FM_ELIMIT past sb->max) is sticky: later appends do
 * nothing, so a generator can emit hundreds of fragments without checking each one and
 * look at fm_strbuf_error once at the end, as SQLite's StrAccum does. */
#include "fm_strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_error.h"

void fm_strbuf_init(fm_strbuf *sb, size_t max) {
  sb->data = NULL;
  sb->len = sb->cap = 0;
  /* 0 would make every append fail; read it as "no limit" instead. */
  sb->max = max ? max : (size_t)-1 / 2;
  sb->err = 0;
}

void fm_strbuf_free(fm_strbuf *sb) {
  free(sb->data);
  sb->data = NULL;
  sb->len = sb->cap = 0;
  sb->err = 0;
}

/* Makes room for n more bytes plus the terminating NUL. Sets the sticky error on failure. */
static int reserve(fm_strbuf *sb, size_t n) {
  if (sb->err) return sb->err;
  if (n > sb->max || sb->len > sb->max - n) {
    sb->err = FM_ELIMIT;
    return sb->err;
  }
  size_t need = sb->len + n + 1;
  if (need <= sb->cap) return 0;
  size_t cap = sb->cap ? sb->cap : 256;
  while (cap < need) cap = cap > ((size_t)-1) / 4 ? need : cap * 2;
  if (cap > sb->max + 1) cap = sb->max + 1; /* never allocate what we may not use */
  char *p = realloc(sb->data, cap);
  if (!p) {
    sb->err = FM_ENOMEM;
    return sb->err;
  }
  sb->data = p;
  sb->cap = cap;
  return 0;
}

void fm_strbuf_appendn(fm_strbuf *sb, const char *s, size_t n) {
  if (reserve(sb, n)) return;
  if (n) memcpy(sb->data + sb->len, s, n);
  sb->len += n;
  sb->data[sb->len] = '\0';
}

void fm_strbuf_append(fm_strbuf *sb, const char *s) { fm_strbuf_appendn(sb, s, strlen(s)); }

void fm_strbuf_printf(fm_strbuf *sb, const char *fmt, ...) {
  if (sb->err) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) {
    sb->err = FM_EINVAL;
    return;
  }
  if (reserve(sb, (size_t)n)) return;
  va_start(ap, fmt);
  vsnprintf(sb->data + sb->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  sb->len += (size_t)n;
}

int fm_strbuf_error(const fm_strbuf *sb) { return sb->err; }

char *fm_strbuf_take(fm_strbuf *sb) {
  char *s = NULL;
  if (sb->err) goto done;
  if (sb->data) {
    s = sb->data;
    sb->data = NULL;
  } else {
    s = malloc(1);
    if (s) s[0] = '\0';
  }
done:
  fm_strbuf_free(sb);
  return s;
}
