/* test_daemon_remote_url.c: redis:// URLs (fm_remote_parse_url): what parses to what, what is
 * refused with which reason, and that no reason and no shown URL ever holds the password. */
#include <stdio.h>
#include <string.h>

#include "fm_remote.h"
#include "fm_test.h"

static void test_accepted(void) {
  static const struct {
    const char *url, *host, *user, *password, *shown;
    int port, db, tls;
  } cases[] = {
      {"redis://cache", "cache", "", "", "redis://cache", 6379, 0, 0},
      {"redis://cache/", "cache", "", "", "redis://cache/", 6379, 0, 0},
      {"redis://10.0.0.5:7000/3", "10.0.0.5", "", "", "redis://10.0.0.5:7000/3", 7000, 3, 0},
      {"redis://cache.example-1_a:1/1000000", "cache.example-1_a", "", "", "redis://cache.example-1_a:1/1000000", 1,
       1000000, 0},
      {"redis://[::1]:6379/0", "::1", "", "", "redis://[::1]:6379/0", 6379, 0, 0},
      {"redis://[fe80::1:2]", "fe80::1:2", "", "", "redis://[fe80::1:2]", 6379, 0, 0},
      {"redis://[::ffff:10.0.0.1]:65535", "::ffff:10.0.0.1", "", "", "redis://[::ffff:10.0.0.1]:65535", 65535, 0, 0},
      /* Redis 6 ACL user, and the default user (requirepass). */
      {"redis://alice:s3cret@cache:6380/2", "cache", "alice", "s3cret", "redis://alice:***@cache:6380/2", 6380, 2, 0},
      {"redis://:s3cret@cache", "cache", "", "s3cret", "redis://:***@cache", 6379, 0, 0},
      {"redis://alice:s3cret@[::1]:7000", "::1", "alice", "s3cret", "redis://alice:***@[::1]:7000", 7000, 0, 0},
      /* Percent-encoding: '@', ':', '/', '%' and a space inside the password; upper and
       * lower case hex; a raw ':' after the first one and a raw '@' (the last '@' ends it). */
      {"redis://al%69ce:p%40ss%3Aw%2fo%25rd%20x@cache", "cache", "alice", "p@ss:w/o%rd x", "redis://al%69ce:***@cache",
       6379, 0, 0},
      {"redis://u:a:b@c@cache", "cache", "u", "a:b@c", "redis://u:***@cache", 6379, 0, 0},
      {"redis://u:a/b?c#d@cache/1", "cache", "u", "a/b?c#d", "redis://u:***@cache/1", 6379, 1, 0},
      {"rediss://u:pw@cache:6380", "cache", "u", "pw", "rediss://u:***@cache:6380", 6380, 0, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fm_redis_url u;
    fm_diag d = {{0}};
    int err = fm_remote_parse_url(cases[i].url, &u, &d);
    if (err != FM_OK || strcmp(u.host, cases[i].host) || strcmp(u.user, cases[i].user) ||
        strcmp(u.password, cases[i].password) || strcmp(u.shown, cases[i].shown) || u.port != cases[i].port ||
        u.db != cases[i].db || u.tls != cases[i].tls) {
      fprintf(stderr, "  %s: err %d (%s) host \"%s\" user \"%s\" password \"%s\" shown \"%s\" port %d db %d tls %d\n",
              cases[i].url, err, d.text, u.host, u.user, u.password, u.shown, u.port, u.db, u.tls);
      CHECK(0);
    }
  }
}

static void test_refused(void) {
  char long_host[400], long_url[700], long_pw[300];
  memset(long_host, 'h', 256);
  long_host[256] = '\0';
  memset(long_pw, 'p', 256);
  long_pw[256] = '\0';
  snprintf(long_url, sizeof long_url, "redis://%s", long_host);
  char long_pw_url[400];
  snprintf(long_pw_url, sizeof long_pw_url, "redis://:%s@cache", long_pw);
  char too_long[600];
  memset(too_long, 'a', sizeof too_long - 1);
  too_long[sizeof too_long - 1] = '\0';
  memcpy(too_long, "redis://", 8);
  static const struct {
    const char *url, *reason;
  } fixed[] = {
      {"http://cache", "only redis://"},
      {"redis:/cache", "only redis://"},
      {"REDIS://cache", "only redis://"},
      {"", "only redis://"},
      {"redis://", "no host"},
      {"redis://:6379", "no host"},
      {"redis:///0", "no host"},
      {"redis://cache:", "bad port"},
      {"redis://cache:0", "bad port"},
      {"redis://cache:65536", "bad port"},
      {"redis://cache:99999", "bad port"},
      {"redis://cache:-1", "bad port"},
      {"redis://cache:+80", "bad port"},
      {"redis://cache:80x", "bad port"},
      {"redis://cache:1:2", "bad port"},
      {"redis://cache:1/x", "bad database number"},
      {"redis://cache/-1", "bad database number"},
      {"redis://cache/1000001", "bad database number"},
      {"redis://cache/1/2", "bad database number"},
      {"redis://cache/0x1", "bad database number"},
      {"redis://cache?db=1", "query or fragment"},
      {"redis://cache/1#x", "bad database number"},
      {"redis://cache#x", "query or fragment"},
      {"redis://ca che", "space or control character"},
      {"redis://cache\t", "space or control character"},
      {"redis://ca%63he", "'%' cannot be in a host name"},
      {"redis://::1", "no host (an IPv6 address goes in brackets"},
      {"redis://fe80::1", "bad port \":1\" (1 to 65535) (an IPv6 address goes in brackets"},
      {"redis://[::1", "brackets closed"},
      {"redis://[]", "brackets closed"},
      {"redis://[cache]", "not an IPv6 address"},
      {"redis://[10.0.0.1]", "not an IPv6 address"},
      {"redis://[fe80::1%25eth0]", "not an IPv6 address"},
      {"redis://[::1]x", "after the IPv6 address"},
      {"redis://[::1]:", "bad port"},
      {"redis://s3cret@cache", "needs a password"},
      {"redis://alice:@cache", "empty password"},
      {"redis://alice:pw%4@cache", "two hex digits"},
      {"redis://alice:pw%zz@cache", "two hex digits"},
      {"redis://alice:pw%@cache", "two hex digits"},
      {"redis://alice:pw%00x@cache", "encoded NUL"},
      {"redis://al%ice:pw@cache", "user name"},
      {"redis://alice:pw@", "no host"},
  };
  for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
    fm_redis_url u;
    fm_diag d = {{0}};
    int err = fm_remote_parse_url(fixed[i].url, &u, &d);
    if (err != FM_EINVAL || !strstr(d.text, fixed[i].reason)) {
      fprintf(stderr, "  \"%s\": err %d, \"%s\" (expected \"%s\")\n", fixed[i].url, err, d.text, fixed[i].reason);
      CHECK(0);
    }
  }
  struct {
    const char *url, *reason;
  } built[] = {
      {long_url, "host longer than 255"},
      {long_pw_url, "password: too long"},
      {too_long, "longer than 511"},
  };
  for (size_t i = 0; i < sizeof built / sizeof built[0]; i++) {
    fm_redis_url u;
    fm_diag d = {{0}};
    CHECK_EQ_INT(fm_remote_parse_url(built[i].url, &u, &d), FM_EINVAL);
    CHECK_STR_CONTAINS(d.text, built[i].reason);
  }
}

/* Whatever is wrong with a URL that holds a password, the reason quotes it redacted. */
static void test_reason_never_holds_the_password(void) {
  static const char *urls[] = {
      "redis://alice:Hunter2pw@cache:0", "redis://alice:Hunter2pw@ca che", "redis://:Hunter2pw@[::1",
      "redis://alice:Hunter2pw@cache/x", "redis://Hunter2pw@cache",        "redis://alice:Hunter2pw%zz@cache",
      "redis://alice:Hunter2pw@cache?x", "redis://a:b:Hunter2pw@c@ca%che", "http://alice:Hunter2pw@cache",
      "redis://alice:Hunter2pw@",        "alice:Hunter2pw@cache",          "redis:/alice:Hunter2pw@cache",
      "redis://u:Hunter2pw/x@cache:0",   "redis://u:Hunter2pw?x@cache/x",
  };
  for (size_t i = 0; i < sizeof urls / sizeof urls[0]; i++) {
    fm_redis_url u;
    fm_diag d = {{0}};
    CHECK(fm_remote_parse_url(urls[i], &u, &d) != FM_OK);
    if (strstr(d.text, "Hunter2") || strstr(u.shown, "Hunter2")) {
      fprintf(stderr, "  \"%s\": the password shows in \"%s\" / \"%s\"\n", urls[i], d.text, u.shown);
      CHECK(0);
    }
    CHECK(strstr(d.text, "***") || strstr(d.text, "space or control"));
  }
}

int main(void) {
  RUN(test_accepted);
  RUN(test_refused);
  RUN(test_reason_never_holds_the_password);
  return FM_TEST_DONE();
}
