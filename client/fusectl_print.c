/* fusectl_print.c: output helpers: msgpack rendered as JSON, aligned tables, human units.
 *
 * JSON is written here rather than through jansson so that every msgpack value has a
 * faithful rendering (u64 beyond int64, shortest round-trip doubles, bins, non-string keys)
 * and so that nested lists can stay on one line where that reads better. */
#include "fusectl.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fm_msg.h"
#include "fm_text.h"

/* ---- JSON ---- */

static void fm_json_str(FILE *f, const char *p, size_t n) {
  const unsigned char *s = (const unsigned char *)p;
  size_t i = 0;
  fputc('"', f);
  while (i < n) {
    unsigned char c = s[i];
    size_t ul;
    switch (c) {
      case '"':
        fputs("\\\"", f);
        i++;
        continue;
      case '\\':
        fputs("\\\\", f);
        i++;
        continue;
      case '\n':
        fputs("\\n", f);
        i++;
        continue;
      case '\r':
        fputs("\\r", f);
        i++;
        continue;
      case '\t':
        fputs("\\t", f);
        i++;
        continue;
      default:
        break;
    }
    if (c < 0x20 || c == 0x7f) {
      fprintf(f, "\\u%04x", c);
      i++;
      continue;
    }
    ul = fm_text_utf8_len(s + i, n - i);
    if (ul == 2 && c == 0xC2 && s[i + 1] < 0xA0) {
      /* A C1 control (U+0080-U+009F): valid JSON raw, but a terminal may act on it. */
      fprintf(f, "\\u%04x", s[i + 1]);
      i += 2;
    } else if (ul == 0) {
      fputs("\\ufffd", f);
      i++;
    } else {
      fwrite(s + i, 1, ul, f);
      i += ul;
    }
  }
  fputc('"', f);
}

/* The shortest %g form that reads back as the same double. */
static void fm_json_double(FILE *f, double v) {
  char buf[40];
  if (!isfinite(v)) {
    fputs("null", f);
    return;
  }
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (strtod(buf, NULL) == v) break;
  }
  /* Keep it recognisably a real for readers that type numbers by their spelling. */
  if (!strpbrk(buf, ".eEn")) strcat(buf, ".0");
  fputs(buf, f);
}

static void fm_json_indent(FILE *f, int depth) {
  fputc('\n', f);
  for (int i = 0; i < depth; i++) fputs("  ", f);
}

static void fm_json_value(FILE *f, const msgpack_object *o, int depth, int inline_depth, const char *const *omit);

static int fm_json_omitted(const msgpack_object *key, const char *const *omit) {
  for (; omit && *omit; omit++)
    if (fm_msg_str_eq(key, *omit)) return 1;
  return 0;
}

static void fm_json_key(FILE *f, const msgpack_object *k) {
  if (k->type == MSGPACK_OBJECT_STR) {
    fm_json_str(f, k->via.str.ptr, k->via.str.size);
    return;
  }
  /* JSON keys must be strings: render the key compactly, then quote that text. */
  char *text = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&text, &len);
  if (!m) {
    fputs("\"?\"", f);
    return;
  }
  fm_json_value(m, k, 0, 0, NULL);
  fclose(m);
  fm_json_str(f, text, len);
  free(text);
}

static void fm_json_value(FILE *f, const msgpack_object *o, int depth, int inline_depth, const char *const *omit) {
  int multi = depth < inline_depth;
  switch (o->type) {
    case MSGPACK_OBJECT_NIL:
      fputs("null", f);
      return;
    case MSGPACK_OBJECT_BOOLEAN:
      fputs(o->via.boolean ? "true" : "false", f);
      return;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
      fprintf(f, "%" PRIu64, o->via.u64);
      return;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
      fprintf(f, "%" PRId64, o->via.i64);
      return;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
      fm_json_double(f, o->via.f64);
      return;
    case MSGPACK_OBJECT_STR:
      fm_json_str(f, o->via.str.ptr, o->via.str.size);
      return;
    case MSGPACK_OBJECT_BIN:
      fprintf(f, "{\"bin_bytes\": %" PRIu32 "}", o->via.bin.size);
      return;
    case MSGPACK_OBJECT_EXT:
      fprintf(f, "{\"ext_type\": %d, \"ext_bytes\": %" PRIu32 "}", o->via.ext.type, o->via.ext.size);
      return;
    case MSGPACK_OBJECT_ARRAY: {
      const msgpack_object_array *a = &o->via.array;
      if (a->size == 0) {
        fputs("[]", f);
        return;
      }
      fputc('[', f);
      for (uint32_t i = 0; i < a->size; i++) {
        if (i) fputs(multi ? "," : ", ", f);
        if (multi) fm_json_indent(f, depth + 1);
        fm_json_value(f, &a->ptr[i], depth + 1, inline_depth, NULL);
      }
      if (multi) fm_json_indent(f, depth);
      fputc(']', f);
      return;
    }
    case MSGPACK_OBJECT_MAP: {
      const msgpack_object_map *m = &o->via.map;
      int first = 1;
      fputc('{', f);
      for (uint32_t i = 0; i < m->size; i++) {
        const msgpack_object_kv *kv = &m->ptr[i];
        if (fm_json_omitted(&kv->key, omit)) continue;
        if (!first) fputs(multi ? "," : ", ", f);
        first = 0;
        if (multi) fm_json_indent(f, depth + 1);
        fm_json_key(f, &kv->key);
        fputs(": ", f);
        fm_json_value(f, &kv->val, depth + 1, inline_depth, NULL);
      }
      if (multi && !first) fm_json_indent(f, depth);
      fputc('}', f);
      return;
    }
  }
  fputs("null", f);
}

void fm_ctl_print_json(FILE *f, const msgpack_object *o, int inline_depth, const char *const *omit) {
  fm_json_value(f, o, 0, inline_depth, omit);
  fputc('\n', f);
}

/* ---- tables ---- */

void fm_ctl_table_init(fm_ctl_table *t, size_t ncols, unsigned right_align) {
  memset(t, 0, sizeof *t);
  t->ncols = ncols;
  t->right_align = right_align;
}

void fm_ctl_table_row(fm_ctl_table *t, const char *const *cells) {
  if (t->oom) return;
  if (t->nrows == t->cap) {
    size_t cap = t->cap ? 2 * t->cap : 16;
    char **n = realloc(t->cells, cap * t->ncols * sizeof *n);
    if (!n) {
      t->oom = 1;
      return;
    }
    t->cells = n;
    t->cap = cap;
  }
  for (size_t c = 0; c < t->ncols; c++) {
    char *s = strdup(cells[c] ? cells[c] : "");
    if (!s) {
      for (size_t k = 0; k < c; k++) free(t->cells[t->nrows * t->ncols + k]);
      t->oom = 1;
      return;
    }
    t->cells[t->nrows * t->ncols + c] = s;
  }
  t->nrows++;
}

int fm_ctl_table_print(fm_ctl_table *t, FILE *f) {
  size_t width[32] = {0};
  int err = t->oom ? FM_ENOMEM : FM_OK;
  size_t ncols = t->ncols < 32 ? t->ncols : 32;

  for (size_t r = 0; r < t->nrows; r++)
    for (size_t c = 0; c < ncols; c++) {
      size_t w = strlen(t->cells[r * t->ncols + c]);
      if (w > width[c]) width[c] = w;
    }
  for (size_t r = 0; r < t->nrows && !err; r++) {
    for (size_t c = 0; c < ncols; c++) {
      const char *s = t->cells[r * t->ncols + c];
      int last = c + 1 == ncols;
      if (c) fputs("  ", f);
      if (t->right_align & (1u << c))
        fprintf(f, "%*s", (int)width[c], s);
      else if (last)
        fputs(s, f); /* no trailing blanks */
      else
        fprintf(f, "%-*s", (int)width[c], s);
    }
    fputc('\n', f);
  }
  for (size_t i = 0; i < t->nrows * t->ncols; i++) free(t->cells[i]);
  free(t->cells);
  memset(t, 0, sizeof *t);
  return err;
}

/* ---- human units ---- */

void fm_ctl_fmt_bytes(uint64_t n, char *out, size_t cap) {
  static const char *units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = (double)n;
  int u = -1;
  if (n < 1024) {
    snprintf(out, cap, "%" PRIu64 " B", n);
    return;
  }
  while (v >= 1024 && u < 3) {
    v /= 1024;
    u++;
  }
  snprintf(out, cap, "%.1f %s", v, units[u]);
}

void fm_ctl_fmt_age(int64_t then, int64_t now, char *out, size_t cap) {
  int64_t s = now - then;
  if (then <= 0)
    snprintf(out, cap, "never");
  else if (s < 0)
    snprintf(out, cap, "just now");
  else if (s < 60)
    snprintf(out, cap, "%" PRId64 "s ago", s);
  else if (s < 3600)
    snprintf(out, cap, "%" PRId64 "m ago", s / 60);
  else if (s < 86400)
    snprintf(out, cap, "%" PRId64 "h ago", s / 3600);
  else
    snprintf(out, cap, "%" PRId64 "d ago", s / 86400);
}

void fm_ctl_fmt_scalar(const msgpack_object *o, char *out, size_t cap) {
  char *text = NULL;
  size_t len = 0;
  FILE *m;

  if (cap == 0) return;
  out[0] = '\0';
  if (!o) return;
  if (o->type == MSGPACK_OBJECT_STR) {
    fm_text_escape(out, cap, o->via.str.ptr, o->via.str.size, 0);
    return;
  }
  m = open_memstream(&text, &len);
  if (!m) return;
  fm_json_value(m, o, 0, 0, NULL);
  fclose(m);
  snprintf(out, cap, "%s", text ? text : "");
  free(text);
}
