/*
 * npy.c — the NumPy .npy reader: format versions 1.0, 2.0 and 3.0, the
 * header's Python dict literal parsed strictly ('descr', 'fortran_order',
 * 'shape' and nothing else), little-endian '<f4' / '<f8' / '|u1' features in
 * C order with shape (n, ...), and integer labels of shape (n,). The data
 * must be exactly as long as the header says; features must be finite and
 * labels in [0, 2^20). Every error names the file. It does not read .npz
 * archives, big-endian data, Fortran order, or object/structured dtypes.
 */
#include "data/data_int.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NPY_MAX_DIMS 8
#define NPY_MAX_HEADER (1 << 20)
#define NPY_MAX_LABEL (1 << 20)

typedef struct npy {
  char kind;     /* 'f', 'u' or 'i' */
  int size;      /* bytes per element */
  int ndim;
  int64_t shape[NPY_MAX_DIMS];
  int64_t count; /* product of shape */
  const uint8_t *data;
} npy;

static void skip_ws(const char **p, const char *e) {
  while (*p < e && (**p == ' ' || **p == '\t' || **p == '\n' || **p == '\r')) ++*p;
}

/* A quoted string without escapes into out (at most cap-1 chars). */
static int parse_str(const char **p, const char *e, char *out, size_t cap) {
  if (*p >= e || (**p != '\'' && **p != '"')) return -1;
  char q = *(*p)++;
  size_t n = 0;
  while (*p < e && **p != q) {
    if (**p == '\\' || n + 1 >= cap) return -1;
    out[n++] = *(*p)++;
  }
  if (*p >= e) return -1;
  ++*p;
  out[n] = '\0';
  return 0;
}

static int parse_header(const char *h, size_t hl, const char *name, npy *a, char descr[16]) {
  const char *p = h, *e = h + hl;
  int have_descr = 0, have_fo = 0, have_shape = 0, fortran = 0;
  skip_ws(&p, e);
  if (p >= e || *p++ != '{') return dt__seterr(DT_ECORRUPT, "%s: .npy header is not a dict", name);
  for (;;) {
    skip_ws(&p, e);
    if (p < e && *p == '}') {
      p++;
      break;
    }
    char key[32];
    if (parse_str(&p, e, key, sizeof key) != 0)
      return dt__seterr(DT_ECORRUPT, "%s: .npy header: expected a quoted key at offset %zu", name, (size_t)(p - h));
    skip_ws(&p, e);
    if (p >= e || *p++ != ':') return dt__seterr(DT_ECORRUPT, "%s: .npy header: expected ':' after '%s'", name, key);
    skip_ws(&p, e);
    if (strcmp(key, "descr") == 0 && !have_descr) {
      if (parse_str(&p, e, descr, 16) != 0)
        return dt__seterr(DT_ECORRUPT, "%s: .npy header: 'descr' is not a simple dtype string", name);
      have_descr = 1;
    } else if (strcmp(key, "fortran_order") == 0 && !have_fo) {
      if ((size_t)(e - p) >= 4 && memcmp(p, "True", 4) == 0) {
        fortran = 1;
        p += 4;
      } else if ((size_t)(e - p) >= 5 && memcmp(p, "False", 5) == 0) {
        p += 5;
      } else {
        return dt__seterr(DT_ECORRUPT, "%s: .npy header: 'fortran_order' is not True or False", name);
      }
      have_fo = 1;
    } else if (strcmp(key, "shape") == 0 && !have_shape) {
      if (p >= e || *p++ != '(') return dt__seterr(DT_ECORRUPT, "%s: .npy header: 'shape' is not a tuple", name);
      a->ndim = 0;
      for (;;) {
        skip_ws(&p, e);
        if (p < e && *p == ')') {
          p++;
          break;
        }
        if (p >= e || *p < '0' || *p > '9')
          return dt__seterr(DT_ECORRUPT, "%s: .npy header: bad 'shape' entry at offset %zu", name, (size_t)(p - h));
        if (a->ndim == NPY_MAX_DIMS)
          return dt__seterr(DT_ENOTSUP, "%s: .npy shape has more than %d dimensions", name, NPY_MAX_DIMS);
        int64_t v = 0;
        while (p < e && *p >= '0' && *p <= '9') {
          if (v > ((int64_t)1 << 50)) return dt__seterr(DT_ERANGE, "%s: .npy shape entry too large", name);
          v = v * 10 + (*p++ - '0');
        }
        if (p < e && *p == 'L') p++; /* Python 2 longs */
        a->shape[a->ndim++] = v;
        skip_ws(&p, e);
        if (p < e && *p == ',') {
          p++;
        } else if (!(p < e && *p == ')')) {
          return dt__seterr(DT_ECORRUPT, "%s: .npy header: expected ',' or ')' in 'shape'", name);
        }
      }
      have_shape = 1;
    } else {
      return dt__seterr(DT_ECORRUPT, "%s: .npy header: unexpected or repeated key '%s'", name, key);
    }
    skip_ws(&p, e);
    if (p < e && *p == ',') {
      p++;
    } else if (!(p < e && *p == '}')) {
      return dt__seterr(DT_ECORRUPT, "%s: .npy header: expected ',' or '}' after '%s'", name, key);
    }
  }
  skip_ws(&p, e);
  if (p != e) return dt__seterr(DT_ECORRUPT, "%s: .npy header: garbage after the dict", name);
  if (!have_descr || !have_fo || !have_shape)
    return dt__seterr(DT_ECORRUPT, "%s: .npy header lacks '%s'", name,
                      !have_descr ? "descr" : !have_fo ? "fortran_order" : "shape");
  if (fortran && a->ndim > 1)
    return dt__seterr(DT_ENOTSUP, "%s: Fortran-order arrays are not supported (save with C order)", name);

  /* dtype: byte order, kind, size. */
  const char *d = descr;
  if (*d == '>' && strcmp(d + 1, "u1") && strcmp(d + 1, "i1"))
    return dt__seterr(DT_ENOTSUP, "%s: big-endian dtype '%s' is not supported", name, descr);
  if (*d == '<' || *d == '|' || *d == '>' || *d == '=') d++;
  if ((d[0] != 'f' && d[0] != 'u' && d[0] != 'i') || !d[1] || d[2])
    return dt__seterr(DT_ENOTSUP, "%s: dtype '%s' is not supported", name, descr);
  a->kind = d[0];
  a->size = d[1] - '0';
  if (!(a->size == 1 || a->size == 2 || a->size == 4 || a->size == 8) || (a->kind == 'f' && a->size < 4))
    return dt__seterr(DT_ENOTSUP, "%s: dtype '%s' is not supported", name, descr);
  return DT_OK;
}

static int parse_npy(const uint8_t *buf, size_t len, const char *name, npy *a) {
  memset(a, 0, sizeof *a);
  if (len < 10 || memcmp(buf, "\x93NUMPY", 6) != 0)
    return dt__seterr(DT_ECORRUPT, "%s: not a .npy file (bad magic)", name);
  int major = buf[6];
  size_t pre, hl;
  if (major == 1) {
    pre = 10;
    hl = (size_t)buf[8] | (size_t)buf[9] << 8;
  } else if (major == 2 || major == 3) {
    if (len < 12) return dt__seterr(DT_ECORRUPT, "%s: truncated .npy preamble", name);
    pre = 12;
    hl = (size_t)buf[8] | (size_t)buf[9] << 8 | (size_t)buf[10] << 16 | (size_t)buf[11] << 24;
  } else {
    return dt__seterr(DT_ENOTSUP, "%s: .npy format version %d.%d not supported", name, major, buf[7]);
  }
  if (hl > NPY_MAX_HEADER) return dt__seterr(DT_ECORRUPT, "%s: .npy header length %zu too large", name, hl);
  if (hl > len - pre)
    return dt__seterr(DT_ECORRUPT, "%s: truncated: header length %zu but only %zu bytes follow", name, hl, len - pre);
  char descr[16];
  DT_CHECK(parse_header((const char *)buf + pre, hl, name, a, descr));
  size_t max = dt__data_max_bytes();
  uint64_t count = 1;
  for (int i = 0; i < a->ndim; i++) {
    uint64_t s = (uint64_t)a->shape[i];
    if (s != 0 && count > (uint64_t)max / a->size / s)
      return dt__seterr(DT_ERANGE, "%s: .npy shape claims more than %zu bytes (DTRAIN_DATA_MAX_BYTES)", name, max);
    count *= s;
  }
  a->count = (int64_t)count;
  size_t want = (size_t)count * (size_t)a->size, have = len - pre - hl;
  if (have != want)
    return dt__seterr(DT_ECORRUPT, "%s: %s: header says %zu data bytes, found %zu", name,
                      have < want ? "truncated" : "trailing bytes", want, have);
  a->data = buf + pre + hl;
  return DT_OK;
}

/* Element i of an integer array as int64 (unaligned-safe). */
static int64_t int_at(const npy *a, int64_t i) {
  const uint8_t *p = a->data + (size_t)i * a->size;
  switch (a->size) {
  case 1: return a->kind == 'u' ? (int64_t)p[0] : (int64_t)(int8_t)p[0];
  case 2: { uint16_t v; memcpy(&v, p, 2); return a->kind == 'u' ? (int64_t)v : (int64_t)(int16_t)v; }
  case 4: { uint32_t v; memcpy(&v, p, 4); return a->kind == 'u' ? (int64_t)v : (int64_t)(int32_t)v; }
  default: {
    uint64_t v;
    memcpy(&v, p, 8);
    return (a->kind == 'u' && v > (uint64_t)INT64_MAX) ? -1 : (int64_t)v;
  }
  }
}

int dt__npy_load_mem(dt_dataset *ds, const void *xb, size_t x_len, const char *x_name, const void *yb,
                     size_t y_len, const char *y_name) {
  memset(ds, 0, sizeof *ds);
  if (!x_name) x_name = "(features)";
  if (!y_name) y_name = "(labels)";
  npy X, Y;
  DT_CHECK(parse_npy(xb, x_len, x_name, &X));
  DT_CHECK(parse_npy(yb, y_len, y_name, &Y));
  if (X.kind == 'i' || (X.kind == 'u' && X.size != 1))
    return dt__seterr(DT_ENOTSUP, "%s: features must be float32, float64 or uint8", x_name);
  if (Y.kind == 'f') return dt__seterr(DT_ENOTSUP, "%s: labels must have an integer dtype", y_name);
  if (X.ndim < 1 || X.ndim > 4)
    return dt__seterr(DT_ENOTSUP, "%s: features must have shape (n,), (n,d), (n,h,w) or (n,c,h,w); found %d dims",
                      x_name, X.ndim);
  if (Y.ndim != 1) return dt__seterr(DT_ECORRUPT, "%s: labels must have shape (n,), found %d dims", y_name, Y.ndim);
  int64_t n = X.shape[0];
  if (n == 0 || X.count == 0) return dt__seterr(DT_ECORRUPT, "%s: empty array (a dimension is 0)", x_name);
  if (Y.shape[0] != n)
    return dt__seterr(DT_ECORRUPT, "%s has %lld samples but %s has %lld labels", x_name, (long long)n, y_name,
                      (long long)Y.shape[0]);
  int64_t c = 1, h = 1, w = 1;
  if (X.ndim == 2) w = X.shape[1];
  if (X.ndim == 3) h = X.shape[1], w = X.shape[2];
  if (X.ndim == 4) c = X.shape[1], h = X.shape[2], w = X.shape[3];
  if (c > INT32_MAX || h > INT32_MAX || w > INT32_MAX)
    return dt__seterr(DT_ERANGE, "%s: a dimension exceeds 2^31-1", x_name);
  int64_t dim = X.count / n;
  size_t nel = (size_t)X.count;
  float *x = dt__data_alloc(nel * sizeof(float));
  int32_t *y = dt_alloc((size_t)n * sizeof(int32_t));
  int rc = DT_OK;
  if (!x || !y) {
    rc = dt__seterr(DT_ENOMEM, "%s: cannot allocate %zu floats", x_name, nel);
    goto fail;
  }
  if (X.kind == 'u') {
    for (size_t i = 0; i < nel; i++) x[i] = (float)X.data[i] / 255.0f;
  } else {
    if (X.size == 4) {
      memcpy(x, X.data, nel * sizeof(float));
    } else {
      for (size_t i = 0; i < nel; i++) {
        double v;
        memcpy(&v, X.data + i * 8, 8);
        x[i] = (fabs(v) <= FLT_MAX) ? (float)v : INFINITY; /* NaN and overflow caught below */
      }
    }
    for (size_t i = 0; i < nel; i++) {
      if (!isfinite(x[i])) {
        rc = dt__seterr(DT_ECORRUPT, "%s: element %zu (sample %lld) is not a finite float32", x_name, i,
                        (long long)(i / (size_t)dim));
        goto fail;
      }
    }
  }
  int32_t maxl = 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t v = int_at(&Y, i);
    if (v < 0 || v >= NPY_MAX_LABEL) {
      rc = dt__seterr(DT_ECORRUPT, "%s: label %lld at index %lld is outside [0, %d)", y_name, (long long)v,
                      (long long)i, NPY_MAX_LABEL);
      goto fail;
    }
    y[i] = (int32_t)v;
    if (y[i] > maxl) maxl = y[i];
  }
  *ds = (dt_dataset){.n = n, .c = (int)c, .h = (int)h, .w = (int)w, .dim = dim,
                     .nclasses = maxl + 1, .x = x, .y = y};
  return DT_OK;
fail:
  dt_free(x);
  dt_free(y);
  return rc;
}

int dt_npy_load(dt_dataset *ds, const char *x_path, const char *y_path) {
  if (!ds) return dt__seterr(DT_EINVAL, "dt_npy_load: ds is NULL");
  memset(ds, 0, sizeof *ds);
  uint8_t *xb = NULL, *yb = NULL;
  size_t xl = 0, yl = 0, max = dt__data_max_bytes() + NPY_MAX_HEADER + 16;
  int rc;
  DT_CHECK_GOTO(dt__read_file(x_path, max, &xb, &xl), rc, done);
  DT_CHECK_GOTO(dt__read_file(y_path, max, &yb, &yl), rc, done);
  rc = dt__npy_load_mem(ds, xb, xl, x_path, yb, yl, y_path);
done:
  free(xb);
  free(yb);
  return rc;
}
