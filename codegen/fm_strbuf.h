/* fm_strbuf.h: a growable string with a sticky error (after SQLite's StrAccum).
 * Appends after a failure are no-ops; check fm_strbuf_error once at the end. */
#ifndef FM_STRBUF_H
#define FM_STRBUF_H

#include <stddef.h>

typedef struct fm_strbuf {
  char *data; /* NUL-terminated when len > 0 */
  size_t len, cap;
  size_t max; /* refuse to grow beyond this (FM_ELIMIT) */
  int err;    /* first error, 0 if none */
} fm_strbuf;

void fm_strbuf_init(fm_strbuf *sb, size_t max);
void fm_strbuf_free(fm_strbuf *sb);
void fm_strbuf_append(fm_strbuf *sb, const char *s);
void fm_strbuf_appendn(fm_strbuf *sb, const char *s, size_t n);
void fm_strbuf_printf(fm_strbuf *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int fm_strbuf_error(const fm_strbuf *sb);
/* Hands the string to the caller (malloc'd, "" if empty) and resets sb; NULL on error. */
char *fm_strbuf_take(fm_strbuf *sb);

#endif
