/*
 * safetensors.c — the safetensors file format (huggingface/safetensors,
 * the published layout): an unsigned 64-bit little-endian header length N,
 * N bytes of JSON ({"name": {"dtype": "F32", "shape": [..], "data_offsets":
 * [begin, end]}, ..., "__metadata__": {"key": "value"}}), then the data
 * section, every tensor's raw little-endian bytes at its offsets.
 *
 * The parser is strict, because checkpoints come from disk: the header must
 * fit in the file, be one JSON object, name only known dtypes, give shapes
 * whose element count times the dtype size equals end - begin, and the
 * tensors must tile the data section exactly (sorted by offset, no gap, no
 * overlap, nothing after the last), as the reference implementation checks.
 * The writer emits names from a restricted alphabet so it never has to
 * escape. It does not read files (read.c) or decide what to store.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt.h"

static const char *const dtype_names[DT_ST_NDTYPES] = {"F32", "F64", "I64", "I32", "U8"};
static const size_t dtype_sizes[DT_ST_NDTYPES] = {4, 8, 8, 4, 1};

const char *dt__st_dtype_name(int d) { return d >= 0 && d < DT_ST_NDTYPES ? dtype_names[d] : "?"; }
size_t dt__st_dtype_size(int d) { return d >= 0 && d < DT_ST_NDTYPES ? dtype_sizes[d] : 0; }

void dt__st_free(dt_st *st) {
  if (!st) return;
  free(st->t);
  for (int i = 0; i < 2 * st->nmeta; i++) free(st->meta[i]);
  free(st->meta);
  memset(st, 0, sizeof *st);
}

const dt_st_tensor *dt__st_find(const dt_st *st, const char *name) {
  for (int i = 0; i < st->n; i++)
    if (!strcmp(st->t[i].name, name)) return &st->t[i];
  return NULL;
}

const char *dt__st_meta(const dt_st *st, const char *key) {
  for (int i = 0; i < st->nmeta; i++)
    if (!strcmp(st->meta[2 * i], key)) return st->meta[2 * i + 1];
  return NULL;
}

static int grow(dt_st *st) {
  if (st->n < st->cap) return DT_OK;
  int cap = st->cap ? 2 * st->cap : 16;
  dt_st_tensor *t = realloc(st->t, (size_t)cap * sizeof *t);
  if (!t) return dt__seterr(DT_ENOMEM, "safetensors: out of memory for %d tensors", cap);
  st->t = t;
  st->cap = cap;
  return DT_OK;
}

static int meta_put(dt_st *st, const char *k, const char *v) {
  char **m = realloc(st->meta, (size_t)(st->nmeta + 1) * 2 * sizeof *m);
  if (!m) return dt__seterr(DT_ENOMEM, "safetensors: out of memory for metadata");
  st->meta = m;
  m[2 * st->nmeta] = strdup(k);
  m[2 * st->nmeta + 1] = strdup(v);
  if (!m[2 * st->nmeta] || !m[2 * st->nmeta + 1]) {
    free(m[2 * st->nmeta]);
    free(m[2 * st->nmeta + 1]);
    return dt__seterr(DT_ENOMEM, "safetensors: out of memory for metadata");
  }
  st->nmeta++;
  return DT_OK;
}

/* ---- parsing ---------------------------------------------------------------------- */

/* A non-negative integer stored exactly in a JSON number (< 2^53). */
static int json_u64(const cJSON *j, uint64_t *out) {
  if (!cJSON_IsNumber(j)) return 0;
  double v = j->valuedouble;
  if (!(v >= 0) || v > 9007199254740992.0 || floor(v) != v) return 0;
  *out = (uint64_t)v;
  return 1;
}

static int cmp_begin(const void *a, const void *b) {
  const dt_st_tensor *x = *(const dt_st_tensor *const *)a, *y = *(const dt_st_tensor *const *)b;
  return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static int parse_tensor(dt_st *st, const cJSON *it, const char *name) {
  if (strlen(it->string) >= DT_ST_NAME_MAX || !it->string[0])
    return dt__seterr(DT_ECORRUPT, "%s: tensor name of %zu bytes (1 to %d allowed)", name,
                      strlen(it->string), DT_ST_NAME_MAX - 1);
  if (!cJSON_IsObject(it))
    return dt__seterr(DT_ECORRUPT, "%s: tensor '%s' is not a JSON object", name, it->string);
  if (st->n >= DT_ST_TENSORS_MAX)
    return dt__seterr(DT_ECORRUPT, "%s: more than %d tensors", name, DT_ST_TENSORS_MAX);
  DT_CHECK(grow(st));
  dt_st_tensor *t = &st->t[st->n];
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", it->string);
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
  const cJSON *sh = cJSON_GetObjectItemCaseSensitive(it, "shape");
  const cJSON *of = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
  if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(of))
    return dt__seterr(DT_ECORRUPT, "%s: tensor '%s' needs dtype (string), shape and "
                      "data_offsets (arrays)", name, t->name);
  t->dtype = -1;
  for (int d = 0; d < DT_ST_NDTYPES; d++)
    if (!strcmp(dt->valuestring, dtype_names[d])) t->dtype = d;
  if (t->dtype < 0)
    return dt__seterr(DT_ENOTSUP, "%s: tensor '%s' has dtype '%.16s' (this reader knows F32 "
                      "F64 I64 I32 U8)", name, t->name, dt->valuestring);
  int nd = cJSON_GetArraySize(sh);
  if (nd > DT_ST_MAX_DIMS)
    return dt__seterr(DT_ECORRUPT, "%s: tensor '%s' has %d dimensions (at most %d)", name,
                      t->name, nd, DT_ST_MAX_DIMS);
  t->ndim = nd;
  /* element count, guarded against overflow: bounded by the file size later */
  uint64_t elems = 1;
  int i = 0;
  for (const cJSON *d = sh->child; d; d = d->next, i++) {
    uint64_t v;
    if (!json_u64(d, &v))
      return dt__seterr(DT_ECORRUPT, "%s: tensor '%s' dimension %d is not a non-negative "
                        "integer", name, t->name, i);
    t->shape[i] = (int64_t)v;
    if (elems == UINT64_MAX) continue;
    if (v && elems > (UINT64_C(1) << 62) / v) elems = UINT64_MAX;
    else elems *= v;
  }
  if (cJSON_GetArraySize(of) != 2 || !json_u64(of->child, &t->begin) ||
      !json_u64(of->child->next, &t->end) || t->end < t->begin)
    return dt__seterr(DT_ECORRUPT, "%s: tensor '%s' data_offsets is not [begin, end] with "
                      "begin <= end", name, t->name);
  uint64_t want = elems == UINT64_MAX ? UINT64_MAX : elems * dtype_sizes[t->dtype];
  if (elems > (UINT64_C(1) << 59) || want != t->end - t->begin)
    return dt__seterr(DT_ECORRUPT, "%s: tensor '%s' is %s of %llu elements but data_offsets "
                      "span %llu bytes", name, t->name, dtype_names[t->dtype],
                      (unsigned long long)elems, (unsigned long long)(t->end - t->begin));
  st->n++;
  return DT_OK;
}

static int parse_meta(dt_st *st, const cJSON *m, const char *name) {
  if (!cJSON_IsObject(m))
    return dt__seterr(DT_ECORRUPT, "%s: __metadata__ is not a JSON object", name);
  for (const cJSON *kv = m->child; kv; kv = kv->next) {
    if (!cJSON_IsString(kv))
      return dt__seterr(DT_ECORRUPT, "%s: __metadata__ value '%.64s' is not a string", name,
                        kv->string);
    DT_CHECK(meta_put(st, kv->string, kv->valuestring));
  }
  return DT_OK;
}

/* The parse of a file of len bytes whose first have bytes are in buf
 * (have >= 8 + the header's length, or the whole file). */
static int parse_core(dt_st *st, const uint8_t *buf, size_t have, size_t len, const char *name) {
  memset(st, 0, sizeof *st);
  if (len < 8) return dt__seterr(DT_ECORRUPT, "%s: %zu bytes, shorter than a header", name, len);
  uint64_t hl = 0;
  for (int i = 7; i >= 0; i--) hl = hl << 8 | buf[i];
  if (hl < 2 || hl > DT_ST_HEADER_MAX || hl > len - 8)
    return dt__seterr(DT_ECORRUPT, "%s: header length %llu does not fit the file (%zu bytes, "
                      "header at most %u)", name, (unsigned long long)hl, len, DT_ST_HEADER_MAX);
  if (have < 8 + hl)
    return dt__seterr(DT_EINVAL, "%s: %zu bytes of a %llu-byte header given", name, have,
                      (unsigned long long)hl);
  if (buf[8] != '{')
    return dt__seterr(DT_ECORRUPT, "%s: the header does not start with '{'", name);
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts((const char *)buf + 8, (size_t)hl, &end, 0);
  if (!root || !cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return dt__seterr(DT_ECORRUPT, "%s: the header is not a JSON object", name);
  }
  /* only padding may follow the JSON inside the header */
  for (const char *p = end; p && p < (const char *)buf + 8 + hl; p++)
    if (*p != ' ' && *p != '\n' && *p != '\t' && *p != '\r' && *p != '\0') {
      cJSON_Delete(root);
      return dt__seterr(DT_ECORRUPT, "%s: bytes after the header's JSON object", name);
    }
  int rc = DT_OK;
  for (const cJSON *it = root->child; it && rc == DT_OK; it = it->next) {
    if (!it->string) rc = dt__seterr(DT_ECORRUPT, "%s: header member without a name", name);
    else if (!strcmp(it->string, "__metadata__")) rc = parse_meta(st, it, name);
    else rc = parse_tensor(st, it, name);
  }
  cJSON_Delete(root);
  if (rc < 0) {
    dt__st_free(st);
    return rc;
  }
  /* duplicate names (cJSON keeps both) and the exact tiling of the data */
  st->data_off = 8 + hl;
  const uint64_t data_len = len - st->data_off;
  dt_st_tensor **by = malloc((size_t)(st->n ? st->n : 1) * sizeof *by);
  if (!by) {
    dt__st_free(st);
    return dt__seterr(DT_ENOMEM, "%s: out of memory", name);
  }
  for (int i = 0; i < st->n; i++) by[i] = &st->t[i];
  qsort(by, (size_t)st->n, sizeof *by, cmp_begin);
  uint64_t pos = 0;
  for (int i = 0; i < st->n && rc == DT_OK; i++) {
    if (by[i]->begin != pos)
      rc = dt__seterr(DT_ECORRUPT, "%s: tensor '%s' starts at byte %llu of the data, expected "
                      "%llu (a gap or an overlap)", name, by[i]->name,
                      (unsigned long long)by[i]->begin, (unsigned long long)pos);
    pos = by[i]->end;
  }
  if (rc == DT_OK && pos != data_len)
    rc = dt__seterr(DT_ECORRUPT, "%s: the tensors cover %llu bytes of data but the file holds "
                    "%llu (truncated or extended)", name, (unsigned long long)pos,
                    (unsigned long long)data_len);
  for (int i = 0; i < st->n && rc == DT_OK; i++)
    for (int j = i + 1; j < st->n && rc == DT_OK; j++)
      if (!strcmp(st->t[i].name, st->t[j].name))
        rc = dt__seterr(DT_ECORRUPT, "%s: tensor '%s' appears twice", name, st->t[i].name);
  free(by);
  if (rc < 0) {
    dt__st_free(st);
    return rc;
  }
  for (int i = 0; i < st->n; i++)
    st->t[i].data = have >= len ? buf + st->data_off + st->t[i].begin : NULL;
  st->data_bytes = data_len;
  return DT_OK;
}

int dt__st_parse(dt_st *st, const uint8_t *buf, size_t len, const char *name) {
  return parse_core(st, buf, len, len, name);
}

int dt__st_parse_head(dt_st *st, const uint8_t *head, size_t have, uint64_t len,
                      const char *name) {
  if (len > (uint64_t)SIZE_MAX) return dt__seterr(DT_ECORRUPT, "%s: too large", name);
  return parse_core(st, head, have < len ? have : (size_t)len, (size_t)len, name);
}

/* ---- writing ---------------------------------------------------------------------- */

/* Names the writer emits: letters, digits, '.', '_', '-', '/' (never escaped). */
static int plain_name(const char *s) {
  if (!s || !*s || strlen(s) >= DT_ST_NAME_MAX) return 0;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
          *s == '.' || *s == '_' || *s == '-' || *s == '/'))
      return 0;
  return 1;
}

int dt__st_add(dt_st *st, const char *name, int dtype, int ndim, const int64_t *shape,
               const void *data) {
  if (!plain_name(name) || !strcmp(name, "__metadata__"))
    return dt__seterr(DT_EINVAL, "safetensors: tensor name '%.64s' (letters, digits . _ - / "
                      "only)", name ? name : "(null)");
  if (dtype < 0 || dtype >= DT_ST_NDTYPES || ndim < 0 || ndim > DT_ST_MAX_DIMS)
    return dt__seterr(DT_EINVAL, "safetensors: tensor '%s': dtype %d, %d dimensions", name,
                      dtype, ndim);
  if (dt__st_find(st, name))
    return dt__seterr(DT_EINVAL, "safetensors: tensor '%s' added twice", name);
  DT_CHECK(grow(st));
  dt_st_tensor *t = &st->t[st->n];
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->dtype = dtype;
  t->ndim = ndim;
  uint64_t elems = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0)
      return dt__seterr(DT_EINVAL, "safetensors: tensor '%s' dimension %d is %lld", name, i,
                        (long long)shape[i]);
    t->shape[i] = shape[i];
    elems *= (uint64_t)shape[i];
  }
  t->begin = st->data_bytes;
  t->end = t->begin + elems * dtype_sizes[dtype];
  t->data = data;
  st->data_bytes = t->end;
  st->n++;
  return DT_OK;
}

int dt__st_add_fd(dt_st *st, const char *name, int dtype, int ndim, const int64_t *shape, int fd,
                  uint64_t foff) {
  if (fd < 0) return dt__seterr(DT_EINVAL, "safetensors: tensor '%.64s': no file", name);
  DT_CHECK(dt__st_add(st, name, dtype, ndim, shape, NULL));
  dt_st_tensor *t = &st->t[st->n - 1];
  t->from_fd = 1;
  t->fd = fd;
  t->foff = foff;
  return DT_OK;
}

int dt__st_set_meta(dt_st *st, const char *key, const char *value) {
  for (const char *p = key; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == '"' || *p == '\\')
      return dt__seterr(DT_EINVAL, "safetensors: metadata key '%.32s' needs escaping", key);
  return meta_put(st, key, value);
}

/* Appends to a growing buffer. */
typedef struct sbuf {
  char *p;
  size_t n, cap;
  int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->n + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
      b->oom = 1;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = '\0';
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* A JSON string literal (metadata values may hold anything). */
static void sb_json(sbuf *b, const char *s) {
  char *j = cJSON_PrintUnformatted(&(cJSON){.type = cJSON_String, .valuestring = (char *)s});
  if (!j) {
    b->oom = 1;
    return;
  }
  sb_str(b, j);
  free(j);
}

int dt__st_header(const dt_st *st, char **out, size_t *len) {
  sbuf b = {0};
  char num[64];
  sb_put(&b, "\0\0\0\0\0\0\0\0", 8);
  sb_str(&b, "{");
  if (st->nmeta) {
    sb_str(&b, "\"__metadata__\":{");
    for (int i = 0; i < st->nmeta; i++) {
      if (i) sb_str(&b, ",");
      sb_json(&b, st->meta[2 * i]);
      sb_str(&b, ":");
      sb_json(&b, st->meta[2 * i + 1]);
    }
    sb_str(&b, "}");
  }
  for (int i = 0; i < st->n; i++) {
    const dt_st_tensor *t = &st->t[i];
    if (i || st->nmeta) sb_str(&b, ",");
    sb_str(&b, "\"");
    sb_str(&b, t->name);
    sb_str(&b, "\":{\"dtype\":\"");
    sb_str(&b, dtype_names[t->dtype]);
    sb_str(&b, "\",\"shape\":[");
    for (int d = 0; d < t->ndim; d++) {
      snprintf(num, sizeof num, "%s%lld", d ? "," : "", (long long)t->shape[d]);
      sb_str(&b, num);
    }
    snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)t->begin,
             (unsigned long long)t->end);
    sb_str(&b, num);
  }
  sb_str(&b, "}");
  while (!b.oom && b.n % 8) sb_str(&b, " ");
  if (b.oom) {
    free(b.p);
    return dt__seterr(DT_ENOMEM, "safetensors: out of memory for the header");
  }
  uint64_t hl = b.n - 8;
  for (int i = 0; i < 8; i++) b.p[i] = (char)(hl >> (8 * i) & 0xff);
  *out = b.p;
  *len = b.n;
  return DT_OK;
}
