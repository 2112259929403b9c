/*
 * csv.c — the CSV reader: one sample per line, comma-separated numbers, the
 * integer class label in a chosen column and features in all the others.
 * An optional header line is skipped when its first field is not a number;
 * blank lines are ignored; "\r\n" endings are accepted; spaces around
 * fields are trimmed. Every error names file:line:column (column counted in
 * characters from 1) and the field. Two passes over the text held in
 * memory: the first checks the shape (every row has the same number of
 * fields) and counts rows, so the allocation is exact and bounded by the
 * file size; the second parses. It does not support quoting, other
 * separators or missing values.
 */
#include "data/data_int.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CSV_MAX_FIELD 63
#define CSV_MAX_LABEL (1 << 20)

typedef struct line {
  const char *p;
  size_t len;
  int64_t no; /* 1-based line number */
} line;

/* Next non-blank line at or after *pos; returns 0 at the end. */
static int next_line(const char *buf, size_t len, size_t *pos, int64_t *lineno, line *ln) {
  while (*pos < len) {
    const char *p = buf + *pos;
    const char *nl = memchr(p, '\n', len - *pos);
    size_t l = nl ? (size_t)(nl - p) : len - *pos;
    *pos += l + (nl ? 1 : 0);
    ++*lineno;
    if (l > 0 && p[l - 1] == '\r') l--;
    size_t k = 0;
    while (k < l && (p[k] == ' ' || p[k] == '\t')) k++;
    if (k == l) continue;
    ln->p = p;
    ln->len = l;
    ln->no = *lineno;
    return 1;
  }
  return 0;
}

static int count_fields(const line *ln) {
  int64_t n = 1;
  for (size_t i = 0; i < ln->len; i++) n += ln->p[i] == ',';
  return n > (1 << 30) ? (1 << 30) : (int)n;
}

/* Parses field [b, e) of a line as a number finite as float32 (features
 * are stored as float: 1e300 passes as a double and becomes inf). Returns 0
 * on success, -1 when the field is not a finite number, -2 when it is one
 * beyond the float32 range. */
static int parse_num(const char *b, const char *e, double *v) {
  while (b < e && (*b == ' ' || *b == '\t')) b++;
  while (e > b && (e[-1] == ' ' || e[-1] == '\t')) e--;
  size_t l = (size_t)(e - b);
  if (l == 0 || l > CSV_MAX_FIELD) return -1;
  char tmp[CSV_MAX_FIELD + 1];
  memcpy(tmp, b, l);
  tmp[l] = '\0';
  char *end;
  double d = strtod(tmp, &end);
  if (end != tmp + l || !isfinite(d)) return -1;
  if (fabs(d) > FLT_MAX) return -2;
  *v = d;
  return 0;
}

static void field_text(const char *b, const char *e, char out[40]) {
  size_t l = (size_t)(e - b);
  if (l > 32) l = 32;
  size_t j = 0;
  for (size_t i = 0; i < l; i++) out[j++] = (b[i] >= 32 && b[i] < 127) ? b[i] : '?';
  if ((size_t)(e - b) > 32) out[j++] = '.', out[j++] = '.', out[j++] = '.';
  out[j] = '\0';
}

int dt__csv_parse_mem(dt_dataset *ds, const char *buf, size_t len, const char *name, int label_col) {
  memset(ds, 0, sizeof *ds);
  if (!name) name = "(memory)";
  size_t pos = 0;
  int64_t lineno = 0, n = 0;
  line ln;
  int ncol = 0, header = 0;
  double v;

  /* Pass 1: header, shape, row count. */
  while (next_line(buf, len, &pos, &lineno, &ln)) {
    int nf = count_fields(&ln);
    if (n == 0 && !header) {
      const char *comma = memchr(ln.p, ',', ln.len);
      if (parse_num(ln.p, comma ? comma : ln.p + ln.len, &v) == -1) {
        header = 1; /* a header row: its field count need not match */
        continue;
      }
    }
    if (ncol == 0) {
      ncol = nf;
      if (ncol < 2)
        return dt__seterr(DT_ECORRUPT, "%s:%lld:1: a row needs a label and at least one feature, found %d field",
                          name, (long long)ln.no, ncol);
    } else if (nf != ncol) {
      return dt__seterr(DT_ECORRUPT, "%s:%lld:1: expected %d fields like the first row, found %d", name,
                        (long long)ln.no, ncol, nf);
    }
    n++;
  }
  if (n == 0) return dt__seterr(DT_ECORRUPT, "%s: no data rows", name);
  int lc = label_col < 0 ? ncol + label_col : label_col;
  if (lc < 0 || lc >= ncol)
    return dt__seterr(DT_EINVAL, "%s: label column %d out of range (rows have %d fields)", name, label_col, ncol);
  int64_t dim = ncol - 1;
  float *x = dt__data_alloc((size_t)n * (size_t)dim * sizeof(float));
  int32_t *y = dt_alloc((size_t)n * sizeof(int32_t));
  if (!x || !y) {
    dt_free(x);
    dt_free(y);
    return dt__seterr(DT_ENOMEM, "%s: cannot allocate %lld x %lld floats", name, (long long)n, (long long)dim);
  }

  /* Pass 2: values. */
  pos = 0;
  lineno = 0;
  int64_t row = 0;
  int32_t maxl = 0;
  int rc = DT_OK;
  if (header) next_line(buf, len, &pos, &lineno, &ln);
  while (row < n && next_line(buf, len, &pos, &lineno, &ln)) {
    const char *b = ln.p, *end = ln.p + ln.len;
    float *xr = x + row * dim;
    for (int f = 0; f < ncol; f++) {
      const char *e = memchr(b, ',', (size_t)(end - b));
      if (!e) e = end;
      char txt[40];
      int pr = parse_num(b, e, &v);
      if (pr != 0) {
        field_text(b, e, txt);
        rc = dt__seterr(DT_ECORRUPT, "%s:%lld:%lld: field %d '%s' is %s", name, (long long)ln.no,
                        (long long)(b - ln.p) + 1, f + 1, txt,
                        pr == -2 ? "beyond the float32 range (|x| > 3.4028235e38)" : "not a finite number");
        goto fail;
      }
      if (f == lc) {
        if (v != floor(v) || v < 0 || v >= CSV_MAX_LABEL) {
          field_text(b, e, txt);
          rc = dt__seterr(DT_ECORRUPT, "%s:%lld:%lld: label '%s' is not an integer in [0, %d)", name,
                          (long long)ln.no, (long long)(b - ln.p) + 1, txt, CSV_MAX_LABEL);
          goto fail;
        }
        y[row] = (int32_t)v;
        if (y[row] > maxl) maxl = y[row];
      } else {
        *xr++ = (float)v;
      }
      b = e + 1;
    }
    row++;
  }
  *ds = (dt_dataset){.n = n, .c = 1, .h = 1, .w = (int)dim, .dim = dim, .nclasses = maxl + 1,
                     .x = x, .y = y};
  return DT_OK;
fail:
  dt_free(x);
  dt_free(y);
  return rc;
}

int dt_csv_load(dt_dataset *ds, const char *path, int label_col) {
  if (!ds) return dt__seterr(DT_EINVAL, "dt_csv_load: ds is NULL");
  memset(ds, 0, sizeof *ds);
  uint8_t *buf = NULL;
  size_t len = 0;
  DT_CHECK(dt__read_file(path, dt__data_max_bytes(), &buf, &len));
  int rc = dt__csv_parse_mem(ds, (const char *)buf, len, path, label_col);
  free(buf);
  return rc;
}
