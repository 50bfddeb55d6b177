/* fm_error.c: lookups over FM_ERR_MAP and the diagnostic formatter. */
#include "fm_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *fm_strerror(int err) {
  switch (err) {
    case FM_OK:
      return "success";
#define FM_ERR_MSG_(value, name, slug, msg) \
  case FM_##name:                           \
    return msg;
      FM_ERR_MAP(FM_ERR_MSG_)
#undef FM_ERR_MSG_
  }
  return "unknown error";
}

const char *fm_err_slug(int err) {
  switch (err) {
    case FM_OK:
      return "ok";
#define FM_ERR_SLUG_(value, name, slug, msg) \
  case FM_##name:                            \
    return slug;
      FM_ERR_MAP(FM_ERR_SLUG_)
#undef FM_ERR_SLUG_
  }
  return "unknown";
}

int fm_err_from_slug(const char *s, size_t len) {
#define FM_ERR_FROM_SLUG_(value, name, slug, msg) \
  if (len == sizeof(slug) - 1 && memcmp(s, slug, len) == 0) return FM_##name;
  FM_ERR_MAP(FM_ERR_FROM_SLUG_)
#undef FM_ERR_FROM_SLUG_
  return FM_EPROTOCOL;
}

int fm_diag_set(fm_diag *d, int err, const char *fmt, ...) {
  if (d) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->text, sizeof d->text, fmt, ap);
    va_end(ap);
  }
  return err;
}
