/* fm_remote_url.c: redis:// URLs (shared by the hiredis and the stub builds).
 *
 *   redis[s]://[[user]:password@]host[:port][/db]
 *
 * as Redis's own clients read it: the userinfo is RFC 3986's, user and password
 * percent-encoded, `:password@` alone meaning Redis's default user (requirepass); an IPv6
 * host is written in brackets. The userinfo ends at the URL's last '@' (a password with a raw
 * '@', '/' or '?' still parses; redis-py reads a raw '@' the same way), the host and port at
 * the next '/'. Nothing that is not understood is ignored: a query, a fragment, a zone id or
 * a stray character is an error. */
#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "fm_remote.h"

#define DB_MAX   1000000
#define BRACKETS " (an IPv6 address goes in brackets: [::1])"

/* shown: url with the text between the userinfo's first ':' and the URL's last '@' replaced by
 * "***" (all of the userinfo when it has no ':': it may be a password missing its colon). Done
 * first, from the '@' alone, whatever else is wrong with the URL (no scheme, say), so no error
 * message can quote a password. */
static void redact(const char *url, char *shown, size_t cap) {
  const char *at = strrchr(url, '@'), *start = strstr(url, "://");
  if (!at) {
    snprintf(shown, cap, "%s", url);
    return;
  }
  start = start && start < at ? start + 3 : url;
  const char *colon = memchr(start, ':', (size_t)(at - start));
  const char *keep_to = colon ? colon + 1 : start;
  snprintf(shown, cap, "%.*s***%s", (int)(keep_to - url), url, at);
}

static int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  c = (char)tolower((unsigned char)c);
  return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Percent-decodes s[0..n) into out; NULL, or what is wrong with it. */
static const char *unescape(const char *s, size_t n, char *out, size_t cap) {
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (c == '%') {
      int hi = i + 1 < n ? hex_digit(s[i + 1]) : -1;
      int lo = i + 2 < n ? hex_digit(s[i + 2]) : -1;
      if (hi < 0 || lo < 0) return "a '%' not followed by two hex digits";
      c = (char)(hi * 16 + lo);
      if (!c) return "an encoded NUL (%00)";
      i += 2;
    }
    if (o + 1 >= cap) return "too long";
    out[o++] = c;
  }
  out[o] = '\0';
  return NULL;
}

/* A host name: letters, digits, '-', '.', '_'. */
static int name_char(char c) { return isalnum((unsigned char)c) || c == '-' || c == '.' || c == '_'; }

/* Digits only (no sign, no space, unlike strtol), at most max; -1 otherwise. */
static long digits(const char *s, size_t n, long max) {
  long v = 0;
  if (n == 0 || n > 9) return -1;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return -1;
    v = v * 10 + (s[i] - '0');
  }
  return v <= max ? v : -1;
}

static int parse_userinfo(const char *s, size_t n, fm_redis_url *u, fm_diag *d) {
  const char *colon = memchr(s, ':', n), *why;
  if (!colon)
    return fm_diag_set(d, FM_EINVAL,
                       "remote %s: the part before '@' needs a password: user:password@, or "
                       ":password@ for Redis's default user",
                       u->shown);
  if ((why = unescape(s, (size_t)(colon - s), u->user, sizeof u->user)))
    return fm_diag_set(d, FM_EINVAL, "remote %s: user name: %s", u->shown, why);
  if ((why = unescape(colon + 1, (size_t)(s + n - colon - 1), u->password, sizeof u->password)))
    return fm_diag_set(d, FM_EINVAL, "remote %s: password: %s", u->shown, why);
  if (!u->password[0]) return fm_diag_set(d, FM_EINVAL, "remote %s: empty password", u->shown);
  return FM_OK;
}

/* host[:port] in s[0..n). */
static int parse_hostport(const char *s, size_t n, fm_redis_url *u, fm_diag *d) {
  const char *end = s + n, *p;
  if (n && s[0] == '[') {
    const char *close = memchr(s, ']', n);
    size_t len = close ? (size_t)(close - s - 1) : 0;
    unsigned char addr[16];
    if (!close || len == 0 || len >= sizeof u->host)
      return fm_diag_set(d, FM_EINVAL, "remote %s: an IPv6 host needs its brackets closed: [::1]", u->shown);
    memcpy(u->host, s + 1, len);
    u->host[len] = '\0';
    if (inet_pton(AF_INET6, u->host, addr) != 1)
      return fm_diag_set(d, FM_EINVAL, "remote %s: \"%s\" is not an IPv6 address (zone ids are not supported)",
                         u->shown, u->host);
    p = close + 1;
    if (p < end && *p != ':')
      return fm_diag_set(d, FM_EINVAL, "remote %s: unexpected \"%.*s\" after the IPv6 address", u->shown,
                         (int)(end - p), p);
  } else {
    for (p = s; p < end && *p != ':'; p++)
      if (!name_char(*p)) return fm_diag_set(d, FM_EINVAL, "remote %s: '%c' cannot be in a host name", u->shown, *p);
    if (p == s)
      return fm_diag_set(d, FM_EINVAL, "remote %s: no host%s", u->shown,
                         n > 1 && memchr(s + 1, ':', n - 1) ? BRACKETS : "");
    if ((size_t)(p - s) >= sizeof u->host)
      return fm_diag_set(d, FM_EINVAL, "remote %s: host longer than %zu characters", u->shown, sizeof u->host - 1);
    memcpy(u->host, s, (size_t)(p - s));
    u->host[p - s] = '\0';
  }
  if (p < end) { /* ':' */
    long port = digits(p + 1, (size_t)(end - p - 1), 65535);
    if (port <= 0)
      return fm_diag_set(d, FM_EINVAL, "remote %s: bad port \"%.*s\" (1 to 65535)%s", u->shown, (int)(end - p - 1),
                         p + 1, memchr(p + 1, ':', (size_t)(end - p - 1)) ? BRACKETS : "");
    u->port = (int)port;
  }
  return FM_OK;
}

int fm_remote_parse_url(const char *url, fm_redis_url *u, fm_diag *d) {
  static const struct {
    const char *prefix;
    int tls;
  } schemes[] = {{"redis://", 0}, {"rediss://", 1}};
  memset(u, 0, sizeof *u);
  u->port = 6379;
  redact(url, u->shown, sizeof u->shown);
  if (strlen(url) >= FM_REMOTE_URL_MAX)
    return fm_diag_set(d, FM_EINVAL, "remote URL longer than %d characters", FM_REMOTE_URL_MAX - 1);
  for (const char *c = url; *c; c++)
    if ((unsigned char)*c <= ' ' || *c == 0x7f)
      return fm_diag_set(d, FM_EINVAL, "remote %s: a space or control character in the URL", u->shown);
  const char *p = NULL;
  for (size_t i = 0; i < sizeof schemes / sizeof schemes[0] && !p; i++) {
    size_t n = strlen(schemes[i].prefix);
    if (strncmp(url, schemes[i].prefix, n) == 0) {
      p = url + n;
      u->tls = schemes[i].tls;
    }
  }
  if (!p)
    return fm_diag_set(d, FM_EINVAL, "remote %.64s: only redis://[[user]:password@]host[:port][/db] is supported",
                       u->shown);
  /* The userinfo ends at the last '@' (no later part may hold one), as redact() reads it:
   * every part an error quotes comes after it. */
  const char *at = strrchr(p, '@');
  int err;
  if (at && (err = parse_userinfo(p, (size_t)(at - p), u, d))) return err;
  if (at) p = at + 1;
  const char *auth_end = p + strcspn(p, "/?#");
  if ((err = parse_hostport(p, (size_t)(auth_end - p), u, d))) return err;
  p = auth_end;
  if (*p == '?' || *p == '#')
    return fm_diag_set(d, FM_EINVAL, "remote %s: a query or fragment (\"%.32s\") is not supported", u->shown, p);
  if (*p == '/' && p[1]) {
    long db = digits(p + 1, strlen(p + 1), DB_MAX);
    if (db < 0) return fm_diag_set(d, FM_EINVAL, "remote %s: bad database number \"%.32s\"", u->shown, p + 1);
    u->db = (int)db;
  }
  return FM_OK;
}
