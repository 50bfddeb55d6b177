/* fm_text.h: text from a peer made safe to show on a terminal (fusectl, libfusemld).
 *
 * A daemon's replies, the entries of a store and error messages end up on terminals. A
 * control character in them (ESC starts sequences that retitle the window, move the cursor or
 * rewrite what was printed) or invalid UTF-8 must not reach one as it is. Escaped:
 *   C0 controls and DEL       -> \xNN      (\n and \t kept with FM_TEXT_KEEP_LINES)
 *   C1 controls U+0080-U+009F -> \u00NN    (8-bit CSI and friends)
 *   each byte of invalid UTF-8 -> \xNN
 * Everything else (printable ASCII, backslash included, and valid UTF-8 above U+009F) is kept,
 * so ordinary text reads unchanged. The escaping is for display: it is not reversible. */
#ifndef FM_TEXT_H
#define FM_TEXT_H

#include <stddef.h>
#include <stdio.h>

#define FM_TEXT_KEEP_LINES 0x1u /* keep \n and \t: multi-line text such as source code */

/* Length of the valid UTF-8 sequence at s (n bytes available, n >= 1), or 0 if it is not
 * valid UTF-8 (overlong forms, surrogates and code points past U+10FFFF are not). */
size_t fm_text_utf8_len(const unsigned char *s, size_t n);

/* Writes s[0..n) escaped into out (cap bytes; NUL-terminated when cap > 0), stopping before
 * a character or escape that would not fit whole. Returns how many bytes of s were used. */
size_t fm_text_escape(char *out, size_t cap, const char *s, size_t n, unsigned flags);

/* Writes s[0..n) escaped to f. */
void fm_text_fwrite(FILE *f, const char *s, size_t n, unsigned flags);

#endif
