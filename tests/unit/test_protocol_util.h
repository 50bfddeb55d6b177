/* test_protocol_util.h: helpers shared by the protocol tests: JSON (via jansson) to msgpack,
 * so fragments can be written readably, and decoding through the real request path. */
#ifndef TEST_PROTOCOL_UTIL_H
#define TEST_PROTOCOL_UTIL_H

#include <jansson.h>
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

#include "fm_fragment.h"
#include "fm_msg.h"

/* Not every test uses every helper. */
#define TP_FN static __attribute__((unused))

TP_FN int tp_pack_json(msgpack_packer *pk, const json_t *j) {
  switch (json_typeof(j)) {
    case JSON_OBJECT: {
      const char *k;
      json_t *v;
      msgpack_pack_map(pk, json_object_size(j));
      json_object_foreach((json_t *)j, k, v) {
        msgpack_pack_str_with_body(pk, k, strlen(k));
        if (tp_pack_json(pk, v)) return -1;
      }
      return 0;
    }
    case JSON_ARRAY: {
      size_t i;
      json_t *v;
      msgpack_pack_array(pk, json_array_size(j));
      json_array_foreach((json_t *)j, i, v) {
        if (tp_pack_json(pk, v)) return -1;
      }
      return 0;
    }
    case JSON_STRING:
      return msgpack_pack_str_with_body(pk, json_string_value(j), json_string_length(j));
    case JSON_INTEGER:
      return msgpack_pack_int64(pk, json_integer_value(j));
    case JSON_REAL:
      return msgpack_pack_double(pk, json_real_value(j));
    case JSON_TRUE:
      return msgpack_pack_true(pk);
    case JSON_FALSE:
      return msgpack_pack_false(pk);
    case JSON_NULL:
      return msgpack_pack_nil(pk);
  }
  return -1;
}

/* JSON text (single quotes allowed for readability in C strings) to msgpack bytes in sb
 * (caller destroys). Returns 0 on success. */
TP_FN int tp_json_to_mp(const char *src, msgpack_sbuffer *sb) {
  char *s = strdup(src);
  for (char *p = s; *p; p++)
    if (*p == '\'') *p = '"';
  json_error_t err;
  json_t *j = json_loads(s, JSON_DECODE_ANY, &err);
  free(s);
  msgpack_sbuffer_init(sb);
  if (!j) {
    fprintf(stderr, "  bad test JSON: %s (line %d col %d)\n", err.text, err.line, err.column);
    return -1;
  }
  msgpack_packer pk;
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  int rc = tp_pack_json(&pk, j);
  json_decref(j);
  return rc;
}

/* Decodes a msgpack fragment the way the daemon does: bounded check, unpack, decode. */
TP_FN int tp_decode_mp(const void *buf, size_t len, fm_fragment *f, fm_diag *d) {
  msgpack_zone zone;
  msgpack_object obj;
  msgpack_zone_init(&zone, 4096);
  int rc = fm_msg_unpack(buf, len, &fm_msg_request_limits, &zone, &obj, d);
  if (!rc) rc = fm_fragment_decode(&obj, f, d);
  msgpack_zone_destroy(&zone);
  return rc;
}

TP_FN int tp_decode_json(const char *src, fm_fragment *f, fm_diag *d) {
  msgpack_sbuffer sb;
  int rc = tp_json_to_mp(src, &sb) ? FM_EINVAL : tp_decode_mp(sb.data, sb.size, f, d);
  msgpack_sbuffer_destroy(&sb);
  return rc;
}

/* Canonical bytes of a JSON fragment (malloc'd, *len set); NULL if it does not decode. */
TP_FN uint8_t *tp_canon_json(const char *src, size_t *len) {
  static fm_fragment f;
  fm_diag d = {{0}};
  uint8_t *out = NULL;
  *len = 0;
  if (tp_decode_json(src, &f, &d)) {
    fprintf(stderr, "  decode failed: %s\n", d.text);
    return NULL;
  }
  if (fm_fragment_canonical_bytes(&f, &out, len)) return NULL;
  return out;
}

/* A fragment (JSON) that must be refused with code rc and diag in the reason. */
typedef struct tp_reject {
  const char *json;
  int rc;
  const char *diag;
} tp_reject;

/* Decodes every case; returns how many were not refused as they say (each printed). */
TP_FN int tp_check_rejects(const tp_reject *cases, size_t n) {
  static fm_fragment f;
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    fm_diag d = {{0}};
    int rc = tp_decode_json(cases[i].json, &f, &d);
    if (rc == cases[i].rc && strstr(d.text, cases[i].diag)) continue;
    fprintf(stderr, "  case %zu: got %s \"%s\", want %s \"%s\"\n", i, fm_err_slug(rc), d.text, fm_err_slug(cases[i].rc),
            cases[i].diag);
    bad++;
  }
  return bad;
}

/* Packs a fragment (not canonicalized) to bytes; caller destroys sb. */
TP_FN int tp_pack_fragment(const fm_fragment *f, msgpack_sbuffer *sb) {
  msgpack_packer pk;
  msgpack_sbuffer_init(sb);
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  return fm_fragment_pack(f, &pk);
}

TP_FN int tp_bytes_eq(const void *a, size_t alen, const void *b, size_t blen) {
  return a && b && alen == blen && memcmp(a, b, alen) == 0;
}

/* Whether canonical bytes decode (into *f) and canonicalize to themselves: the canonical
 * form is a fixed point. */
TP_FN int tp_canonical_fixed_point(const uint8_t *bytes, size_t len, fm_fragment *f) {
  fm_diag d = {{0}};
  uint8_t *again = NULL;
  size_t alen = 0;
  int ok = tp_decode_mp(bytes, len, f, &d) == FM_OK && fm_fragment_canonical_bytes(f, &again, &alen) == FM_OK &&
           tp_bytes_eq(again, alen, bytes, len);
  free(again);
  return ok;
}

/* Field-by-field equality of two fragments (padding and unused slots are not compared). */
TP_FN int tp_fragment_eq(const fm_fragment *a, const fm_fragment *b) {
  if (a->vocab != b->vocab || a->n_inputs != b->n_inputs || a->n_ops != b->n_ops || a->n_outputs != b->n_outputs)
    return 0;
  for (int side = 0; side < 2; side++) {
    uint32_t n = side ? a->n_outputs : a->n_inputs;
    for (uint32_t k = 0; k < n; k++) {
      const fm_tensor *x = side ? &a->outputs[k] : &a->inputs[k];
      const fm_tensor *y = side ? &b->outputs[k] : &b->inputs[k];
      if (x->id != y->id || x->dtype != y->dtype || x->rank != y->rank || x->align != y->align) return 0;
      for (uint32_t i = 0; i < x->rank; i++)
        if (x->shape[i] != y->shape[i] || x->strides[i] != y->strides[i]) return 0;
    }
  }
  for (uint32_t j = 0; j < a->n_ops; j++) {
    const fm_opnode *x = &a->ops[j], *y = &b->ops[j];
    if (x->op != y->op || x->out != y->out || x->nargs != y->nargs || x->dtype != y->dtype ||
        memcmp(&x->value, &y->value, sizeof x->value) != 0 || memcmp(x->window, y->window, sizeof x->window) != 0 ||
        x->ceil_mode != y->ceil_mode)
      return 0;
    for (uint32_t i = 0; i < x->nargs; i++)
      if (x->args[i] != y->args[i]) return 0;
  }
  return 1;
}

#endif
