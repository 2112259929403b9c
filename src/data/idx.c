/*
 * idx.c — the IDX reader (the MNIST family's format): big-endian magic
 * 0x00000803 for u8 images (n x rows x cols) and 0x00000801 for u8 labels
 * (n), either raw or gzip-compressed (detected by the 1f 8b gzip magic, not
 * by the file name). The whole file is read into memory and decoded from
 * there, so the same code serves the path reader and the fuzz target.
 *
 * Nothing in a header is trusted: dimensions must be non-zero, their product
 * must stay under dt__data_max_bytes(), and the decoded payload must be
 * exactly as long as the header says — a short file or trailing bytes are
 * DT_ECORRUPT with the expected and found sizes. For gzip the output buffer
 * grows with the data actually decoded (starting from the gzip trailer's size
 * hint), so a forged header cannot make us allocate gigabytes up front.
 * It does not handle IDX element types other than unsigned byte.
 */
#include "data/data_int.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* A byte source over memory: either a plain copy or a gzip decoder. */
typedef struct src {
  const uint8_t *p;
  size_t len, pos; /* pos: raw read position, or input handed to zlib */
  const char *name;
  int gz;
  int zinit, zdone;
  z_stream zs;
} src;

static int src_open(src *s, const void *buf, size_t len, const char *name) {
  memset(s, 0, sizeof *s);
  s->p = buf;
  s->len = len;
  s->name = name;
  if (len >= 2 && s->p[0] == 0x1f && s->p[1] == 0x8b) {
    s->gz = 1;
    if (inflateInit2(&s->zs, 16 + MAX_WBITS) != Z_OK)
      return dt__seterr(DT_ENOMEM, "%s: cannot initialise zlib", name);
    s->zinit = 1;
  }
  return DT_OK;
}

static void src_close(src *s) {
  if (s->zinit) inflateEnd(&s->zs);
  s->zinit = 0;
}

/* Reads up to n bytes into dst; *got is how many were produced. Fewer than n
 * means the data ended. Corrupt gzip is an error. */
static int src_read(src *s, uint8_t *dst, size_t n, size_t *got) {
  *got = 0;
  if (!s->gz) {
    size_t k = s->len - s->pos < n ? s->len - s->pos : n;
    if (dst) memcpy(dst, s->p + s->pos, k);
    s->pos += k;
    *got = k;
    return DT_OK;
  }
  uint8_t scratch[4096];
  while (*got < n && !s->zdone) {
    if (s->zs.avail_in == 0 && s->pos < s->len) {
      size_t k = s->len - s->pos;
      if (k > (1u << 30)) k = 1u << 30;
      s->zs.next_in = (Bytef *)(s->p + s->pos);
      s->zs.avail_in = (uInt)k;
      s->pos += k;
    }
    size_t want = n - *got;
    if (!dst && want > sizeof scratch) want = sizeof scratch;
    if (want > (1u << 30)) want = 1u << 30;
    s->zs.next_out = dst ? dst + *got : scratch;
    s->zs.avail_out = (uInt)want;
    int r = inflate(&s->zs, Z_NO_FLUSH);
    *got += want - s->zs.avail_out;
    if (r == Z_STREAM_END) {
      size_t left = s->zs.avail_in + (s->len - s->pos);
      if (left == 0) {
        s->zdone = 1;
      } else if (left >= 2 && s->zs.avail_in >= 2 && s->zs.next_in[0] == 0x1f && s->zs.next_in[1] == 0x8b) {
        inflateReset(&s->zs); /* concatenated gzip members are one stream */
      } else {
        return dt__seterr(DT_ECORRUPT, "%s: %zu trailing bytes after the end of the gzip stream", s->name, left);
      }
    } else if (r == Z_BUF_ERROR) {
      if (s->zs.avail_in == 0 && s->pos >= s->len)
        return dt__seterr(DT_ECORRUPT, "%s: gzip stream is truncated (%zu bytes decoded so far)", s->name,
                          (size_t)s->zs.total_out);
    } else if (r != Z_OK) {
      return dt__seterr(DT_ECORRUPT, "%s: corrupt gzip data: %s", s->name, s->zs.msg ? s->zs.msg : "inflate failed");
    }
  }
  return DT_OK;
}

static uint32_t be32(const uint8_t *b) {
  return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

/* Grows *out (elements of es bytes, have used) to ncap elements, keeping
 * dt_alloc's alignment (realloc would not). */
static int grow(void **out, size_t have, size_t ncap, size_t es, const char *name) {
  void *np = dt__data_alloc(ncap * es);
  if (!np) return dt__seterr(DT_ENOMEM, "%s: cannot allocate %zu bytes", name, ncap * es);
  if (*out) memcpy(np, *out, have * es);
  dt_free(*out);
  *out = np;
  return DT_OK;
}

/* Decodes one IDX file held in memory. With to_float the u8 payload is
 * converted chunk by chunk into floats in [0,1] (no u8 copy of the whole
 * payload is ever made, which halves the memory touched when loading);
 * otherwise *data holds the bytes. */
static int idx_decode(const void *buf, size_t len, const char *name, int want_ndim, int to_float, void **data,
                      int64_t dims[3]) {
  *data = NULL;
  if (!name) name = "(memory)";
  if (want_ndim != 1 && want_ndim != 3) return dt__seterr(DT_EINVAL, "%s: IDX rank %d not supported", name, want_ndim);
  const char *what = want_ndim == 3 ? "images" : "labels";
  uint32_t want_magic = 0x00000800u | (uint32_t)want_ndim;
  src s;
  int rc = src_open(&s, buf, len, name);
  if (rc < 0) return rc;
  uint8_t hdr[16];
  size_t hlen = 4 + 4 * (size_t)want_ndim, got, es = to_float ? sizeof(float) : 1;
  void *out = NULL;

  DT_CHECK_GOTO(src_read(&s, hdr, 4, &got), rc, fail);
  if (got < 4) {
    rc = dt__seterr(DT_ECORRUPT, "%s: truncated: %zu bytes, shorter than the 4-byte IDX magic", name, got);
    goto fail;
  }
  uint32_t magic = be32(hdr);
  if (magic != want_magic) {
    rc = dt__seterr(DT_ECORRUPT, "%s: wrong magic 0x%08x, expected 0x%08x (IDX u8 %s, %d-D)", name, magic,
                    want_magic, what, want_ndim);
    goto fail;
  }
  DT_CHECK_GOTO(src_read(&s, hdr + 4, hlen - 4, &got), rc, fail);
  if (got < hlen - 4) {
    rc = dt__seterr(DT_ECORRUPT, "%s: truncated header: expected %zu bytes, found %zu", name, hlen, 4 + got);
    goto fail;
  }
  size_t max = dt__data_max_bytes();
  uint64_t total = 1;
  for (int i = 0; i < want_ndim; i++) {
    uint32_t d = be32(hdr + 4 + 4 * i);
    dims[i] = d;
    if (d == 0) {
      rc = dt__seterr(DT_ECORRUPT, "%s: dimension %d of the IDX header is 0", name, i);
      goto fail;
    }
    if (total > (uint64_t)max / d) {
      rc = dt__seterr(DT_ERANGE, "%s: IDX header claims more than %zu data bytes (DTRAIN_DATA_MAX_BYTES); dims %u at index %d",
                      name, max, d, i);
      goto fail;
    }
    total *= d;
  }
  size_t payload = (size_t)total, cap;

  if (!s.gz) {
    /* Raw: the length is known, so check it before allocating anything. */
    size_t have = len - hlen;
    if (have != payload) {
      rc = dt__seterr(DT_ECORRUPT, "%s: %s: header says %zu data bytes after the %zu-byte header, found %zu",
                      name, have < payload ? "truncated" : "trailing bytes", payload, hlen, have);
      goto fail;
    }
    cap = payload;
  } else {
    /* Grow with the data actually decoded; start from the trailer's size
     * hint (decoded length mod 2^32) so the real files need one allocation. */
    const uint8_t *b = buf;
    size_t hint = len >= 4 ? (size_t)b[len - 4] | (size_t)b[len - 3] << 8 | (size_t)b[len - 2] << 16 |
                                 (size_t)b[len - 1] << 24
                           : 0;
    hint = hint > hlen ? hint - hlen : 0;
    /* The trailer is input too: deflate cannot expand more than ~1032:1, so
     * a larger hint is a lie and must not size the first allocation. */
    if (hint / 1032 > len) hint = len * 1032;
    cap = hint > ((size_t)1 << 20) ? hint : ((size_t)1 << 20);
    if (cap > payload) cap = payload;
  }
  DT_CHECK_GOTO(grow(&out, 0, cap, es, name), rc, fail);
  size_t have = 0;
  for (;;) {
    if (!to_float) {
      DT_CHECK_GOTO(src_read(&s, (uint8_t *)out + have, cap - have, &got), rc, fail);
      have += got;
    } else {
      uint8_t chunk[16384];
      do {
        size_t want = cap - have < sizeof chunk ? cap - have : sizeof chunk;
        DT_CHECK_GOTO(src_read(&s, chunk, want, &got), rc, fail);
        /* Division (not multiplication by 1/255) matches torchvision's
         * ToTensor bit for bit; it still vectorises. */
        float *restrict xf = (float *)out + have;
        const uint8_t *restrict c8 = chunk;
        for (size_t i = 0; i < got; i++) xf[i] = (float)c8[i] / 255.0f;
        have += got;
        if (got < want) break;
      } while (have < cap);
    }
    if (have < cap || cap == payload) break;
    size_t ncap = cap * 2 < payload ? cap * 2 : payload;
    DT_CHECK_GOTO(grow(&out, have, ncap, es, name), rc, fail);
    cap = ncap;
  }
  if (have < payload) {
    rc = dt__seterr(DT_ECORRUPT, "%s: truncated: header says %zu data bytes after the %zu-byte header, found %zu",
                    name, payload, hlen, have);
    goto fail;
  }
  if (s.gz) {
    /* Anything the stream still decodes to is trailing garbage. */
    size_t extra = 0;
    do {
      DT_CHECK_GOTO(src_read(&s, NULL, 4096, &got), rc, fail);
      extra += got;
    } while (got > 0);
    if (extra) {
      rc = dt__seterr(DT_ECORRUPT, "%s: trailing bytes: header says %zu data bytes after the %zu-byte header, found %zu",
                      name, payload, hlen, payload + extra);
      goto fail;
    }
  }
  src_close(&s);
  *data = out;
  return DT_OK;
fail:
  dt_free(out);
  src_close(&s);
  return rc;
}

int dt__idx_parse_mem(const void *buf, size_t len, const char *name, int want_ndim, uint8_t **data,
                      int64_t dims[3]) {
  void *p = NULL;
  int rc = idx_decode(buf, len, name, want_ndim, 0, &p, dims);
  *data = p;
  return rc;
}

int dt__idx_load_mem(dt_dataset *ds, const void *img, size_t img_len, const char *img_name, const void *lab,
                     size_t lab_len, const char *lab_name) {
  memset(ds, 0, sizeof *ds);
  int64_t idims[3] = {0}, ldims[3] = {0};
  void *xv = NULL;
  uint8_t *lb = NULL;
  int32_t *y = NULL;
  int rc;
  DT_CHECK_GOTO(idx_decode(img, img_len, img_name, 3, 1, &xv, idims), rc, fail);
  DT_CHECK_GOTO(dt__idx_parse_mem(lab, lab_len, lab_name, 1, &lb, ldims), rc, fail);
  if (idims[0] != ldims[0]) {
    rc = dt__seterr(DT_ECORRUPT, "%s has %lld images but %s has %lld labels", img_name, (long long)idims[0],
                    lab_name, (long long)ldims[0]);
    goto fail;
  }
  if (idims[1] > INT_MAX || idims[2] > INT_MAX) {
    rc = dt__seterr(DT_ERANGE, "%s: image size %lldx%lld too large", img_name, (long long)idims[1],
                    (long long)idims[2]);
    goto fail;
  }
  int64_t n = idims[0];
  y = dt_alloc((size_t)n * sizeof(int32_t));
  if (!y) {
    rc = dt__seterr(DT_ENOMEM, "%s: cannot allocate %lld labels", lab_name, (long long)n);
    goto fail;
  }
  int maxl = 0;
  for (int64_t i = 0; i < n; i++) {
    y[i] = lb[i];
    if (lb[i] > maxl) maxl = lb[i];
  }
  dt_free(lb);
  *ds = (dt_dataset){.n = n, .c = 1, .h = (int)idims[1], .w = (int)idims[2],
                     .dim = idims[1] * idims[2], .nclasses = maxl + 1, .x = xv, .y = y};
  return DT_OK;
fail:
  dt_free(xv);
  dt_free(lb);
  dt_free(y);
  return rc;
}

int dt_idx_load(dt_dataset *ds, const char *images_path, const char *labels_path) {
  if (!ds) return dt__seterr(DT_EINVAL, "dt_idx_load: ds is NULL");
  memset(ds, 0, sizeof *ds);
  uint8_t *ib = NULL, *lb = NULL;
  size_t il = 0, ll = 0;
  size_t max = dt__data_max_bytes();
  int rc;
  DT_CHECK_GOTO(dt__read_file(images_path, max, &ib, &il), rc, done);
  DT_CHECK_GOTO(dt__read_file(labels_path, max, &lb, &ll), rc, done);
  rc = dt__idx_load_mem(ds, ib, il, images_path, lb, ll, labels_path);
done:
  free(ib);
  free(lb);
  return rc;
}
