/* fm_remote_url.c: redis:// URLs (shared by the hiredis and the stub builds). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_remote.h"

int fm_remote_parse_url(const char *url, char *host, size_t host_cap, int *port, int *db, fm_diag *d) {
  static const char scheme[] = "redis://";
  const char *p = url, *end;
  *port = 6379;
  *db = 0;
  if (strncmp(p, scheme, sizeof scheme - 1) != 0)
    return fm_diag_set(d, FM_EINVAL, "remote \"%.64s\": only redis://host[:port][/db] is supported", url);
  p += sizeof scheme - 1;
  end = p + strcspn(p, ":/");
  if (end == p || (size_t)(end - p) >= host_cap)
    return fm_diag_set(d, FM_EINVAL, "remote \"%.64s\": no host, or a host too long", url);
  memcpy(host, p, (size_t)(end - p));
  host[end - p] = '\0';
  p = end;
  if (*p == ':') {
    char *e;
    long v = strtol(p + 1, &e, 10);
    if (e == p + 1 || v <= 0 || v > 65535 || (*e && *e != '/'))
      return fm_diag_set(d, FM_EINVAL, "remote \"%.64s\": bad port", url);
    *port = (int)v;
    p = e;
  }
  if (*p == '/' && p[1]) {
    char *e;
    long v = strtol(p + 1, &e, 10);
    if (e == p + 1 || v < 0 || v > 1000000 || *e)
      return fm_diag_set(d, FM_EINVAL, "remote \"%.64s\": bad database number", url);
    *db = (int)v;
  } else if (*p && strcmp(p, "/") != 0) {
    return fm_diag_set(d, FM_EINVAL, "remote \"%.64s\": unexpected \"%.32s\"", url, p);
  }
  return FM_OK;
}
