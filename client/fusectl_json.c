/* fusectl_json.c: JSON -> msgpack for fusectl's input files.
 *
 * Generic on purpose: the fragment's JSON form has exactly the structure of its msgpack wire
 * form, and the daemon is the one that validates, so fusectl never needs to know the schema
 * (and cannot drift from it). Only the resource limits are checked here. */
#include "fusectl.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

typedef struct fm_jw {
  msgpack_packer pk;
  msgpack_sbuffer *sb;
  int oom;
} fm_jw;

static int fm_jw_write(void *data, const char *buf, size_t len) {
  fm_jw *w = data;
  if (w->oom) return -1;
  if (msgpack_sbuffer_write(w->sb, buf, len) != 0) w->oom = 1;
  return w->oom ? -1 : 0;
}

static int fm_json_pack(fm_jw *w, const json_t *j, int depth, const char *name, fm_diag *d) {
  msgpack_packer *pk = &w->pk;

  switch (json_typeof(j)) {
    case JSON_OBJECT: {
      const char *key;
      json_t *val;
      if (depth > FM_CTL_JSON_MAX_DEPTH) goto too_deep;
      msgpack_pack_map(pk, json_object_size(j));
      json_object_foreach((json_t *)j, key, val) {
        size_t klen = strlen(key);
        msgpack_pack_str(pk, klen);
        msgpack_pack_str_body(pk, key, klen);
        int err = fm_json_pack(w, val, depth + 1, name, d);
        if (err) return err;
      }
      return FM_OK;
    }
    case JSON_ARRAY: {
      size_t i;
      json_t *val;
      if (depth > FM_CTL_JSON_MAX_DEPTH) goto too_deep;
      msgpack_pack_array(pk, json_array_size(j));
      json_array_foreach(j, i, val) {
        int err = fm_json_pack(w, val, depth + 1, name, d);
        if (err) return err;
      }
      return FM_OK;
    }
    case JSON_STRING: {
      size_t n = json_string_length(j);
      msgpack_pack_str(pk, n);
      msgpack_pack_str_body(pk, json_string_value(j), n);
      return FM_OK;
    }
    case JSON_INTEGER:
      msgpack_pack_int64(pk, (int64_t)json_integer_value(j));
      return FM_OK;
    case JSON_REAL:
      msgpack_pack_double(pk, json_real_value(j));
      return FM_OK;
    case JSON_TRUE:
      msgpack_pack_true(pk);
      return FM_OK;
    case JSON_FALSE:
      msgpack_pack_false(pk);
      return FM_OK;
    case JSON_NULL:
      msgpack_pack_nil(pk);
      return FM_OK;
  }
  return fm_diag_set(d, FM_EMALFORMED, "%s: unexpected JSON value type", name);

too_deep:
  return fm_diag_set(d, FM_ELIMIT, "%s: JSON nested deeper than %d levels", name, FM_CTL_JSON_MAX_DEPTH);
}

int fm_ctl_json_to_msgpack(const char *text, size_t len, const char *name, msgpack_sbuffer *out, fm_diag *d) {
  json_error_t jerr;
  json_t *root;
  fm_jw w = {.sb = out, .oom = 0};
  size_t start = out->size;
  int err;

  if (!name) name = "<json>";
  if (len > FM_CTL_JSON_MAX_FILE)
    return fm_diag_set(d, FM_ELIMIT, "%s: %zu bytes; the limit is %u", name, len, FM_CTL_JSON_MAX_FILE);
  /* Duplicate keys are refused: which one wins would be the parser's accident. */
  root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
  if (!root) return fm_diag_set(d, FM_EMALFORMED, "%s:%d:%d: %s", name, jerr.line, jerr.column, jerr.text);
  msgpack_packer_init(&w.pk, &w, fm_jw_write);
  err = fm_json_pack(&w, root, 1, name, d);
  if (!err && w.oom) err = fm_diag_set(d, FM_ENOMEM, "%s: out of memory", name);
  if (err) out->size = start; /* leave out as it was */
  json_decref(root);
  return err;
}

int fm_ctl_json_file_to_msgpack(const char *path, msgpack_sbuffer *out, fm_diag *d) {
  FILE *f = NULL;
  char *buf = NULL;
  size_t n = 0;
  int err;

  f = fopen(path, "rb");
  if (!f) return fm_diag_set(d, FM_EIO, "cannot open %s: %s", path, strerror(errno));
  /* Read one byte past the limit rather than trusting the size stat reports: the file may be
   * a pipe, or grow while we read. */
  buf = malloc(FM_CTL_JSON_MAX_FILE + 1);
  if (!buf) {
    err = fm_diag_set(d, FM_ENOMEM, "out of memory");
    goto out;
  }
  n = fread(buf, 1, FM_CTL_JSON_MAX_FILE + 1, f);
  if (ferror(f)) {
    err = fm_diag_set(d, FM_EIO, "cannot read %s: %s", path, strerror(errno));
    goto out;
  }
  if (n > FM_CTL_JSON_MAX_FILE) {
    err = fm_diag_set(d, FM_ELIMIT, "%s is larger than %u bytes (1 MiB): refusing to read it", path,
                      FM_CTL_JSON_MAX_FILE);
    goto out;
  }
  err = fm_ctl_json_to_msgpack(buf, n, path, out, d);

out:
  free(buf);
  fclose(f);
  return err;
}
