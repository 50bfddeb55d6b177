/* fuzz_json.c: libFuzzer harness for fusectl's JSON fragment reader (fusectl_json.c):
 * JSON text -> msgpack, then (as fusectl compile would send it, and the daemon read it)
 * fm_msg_unpack with the request limits -> fm_fragment_decode. Beyond "no crash": a
 * successful conversion appends well-formed msgpack, and a failed one leaves the buffer as
 * it was. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_fragment.h"
#include "fm_msg.h"
#include "fusectl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond, const char *what) {
  if (cond) return;
  fprintf(stderr, "fuzz_json: property violated: %s\n", what);
  abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  msgpack_sbuffer sb;
  msgpack_zone zone;
  msgpack_object obj;
  fm_diag d;
  msgpack_sbuffer_init(&sb);
  int err = fm_ctl_json_to_msgpack((const char *)data, size, "fuzz.json", &sb, &d);
  if (err) {
    check(sb.size == 0, "a failed conversion left bytes behind");
    goto out;
  }
  /* The reply limits admit any depth the JSON reader produces (16): it must be valid msgpack. */
  if (!msgpack_zone_init(&zone, 4096)) goto out;
  int u = fm_msg_check((const uint8_t *)sb.data, sb.size, &fm_msg_reply_limits, &d);
  check(u == 0 || u == FM_ELIMIT, "converted JSON is not well-formed msgpack");
  if (fm_msg_unpack((const uint8_t *)sb.data, sb.size, &fm_msg_request_limits, &zone, &obj, &d) == 0) {
    fm_fragment *f = malloc(sizeof *f);
    if (f) (void)fm_fragment_decode(&obj, f, &d);
    free(f);
  }
  msgpack_zone_destroy(&zone);
out:
  msgpack_sbuffer_destroy(&sb);
  return 0;
}
