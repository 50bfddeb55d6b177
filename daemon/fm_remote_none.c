/* fm_remote_none.c: the remote tier of a build without hiredis: unavailable. */
#include "fm_remote.h"

#include <string.h>

int fm_remote_new(const char *url, fm_remote **out, fm_diag *d) {
  fm_redis_url u;
  int err = fm_remote_parse_url(url, &u, d);
  explicit_bzero(&u, sizeof u);
  if (err) return err;
  *out = NULL;
  return fm_diag_set(d, FM_EUNSUPPORTED,
                     "this fusemld was built without hiredis: the remote tier (--remote) is unavailable");
}

void fm_remote_free(fm_remote *r) { (void)r; }

const char *fm_remote_url(const fm_remote *r) {
  (void)r;
  return "";
}

const char *fm_remote_host(const fm_remote *r) {
  (void)r;
  return "";
}

int fm_remote_get(fm_remote *r, const char *rkey, uint8_t **val, size_t *len) {
  (void)r, (void)rkey, (void)val, (void)len;
  return FM_EIO;
}

int fm_remote_put(fm_remote *r, const char *rkey, const uint8_t *val, size_t len) {
  (void)r, (void)rkey, (void)val, (void)len;
  return FM_EIO;
}

void fm_remote_count_refused(fm_remote *r) { (void)r; }

void fm_remote_get_stats(fm_remote *r, fm_remote_stats *out) {
  (void)r;
  memset(out, 0, sizeof *out);
}
