/*
 * spec.c — parses the one-line model spec and infers shapes.
 *
 * Grammar: layers separated by whitespace; a layer is a name optionally
 * followed by "(args)", args separated by commas, positional first, then
 * key=value. Layers:
 *   linear(out)                         fully connected; flattens (C,H,W) input
 *   conv(out, k[, stride][, pad])       2-D convolution, also stride=, pad=
 *   maxpool(k[, stride]) avgpool(k[, stride])  stride defaults to k
 *   relu  gelu  dropout([p=0.5])  flatten
 *   layernorm([eps=1e-5])               over all features of a sample
 *   batchnorm([eps=1e-5][, momentum=0.1])  2d on (C,H,W), 1d on flat input
 *   embedding(rows, dim[, std=1])       first layer only: every input feature
 *                                       is a row id; out: the rows, flat
 *   dot                                 flat input of 2D: the two halves'
 *                                       inner product plus a bias (1 output)
 * Aliases: conv2d, maxpool2d, avgpool2d, fc (for linear).
 * Every error is DT_EINVAL with one line "layer N 'token': what is wrong",
 * N counting from 1. This file allocates only the layer array: no tensors,
 * so a fuzzer can drive it with any input.
 */
#include "nn/spec.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

enum { A_INT, A_FLOAT };
typedef struct argdef {
  const char *name, *alias;
  int type;
  int required;
  double def; /* NAN: "derived" (pool stride = k) */
} argdef;

typedef struct kinddef {
  const char *name, *alias;
  int kind;
  int nargs;
  argdef args[4];
} kinddef;

static const kinddef KINDS[] = {
    {"linear", "fc", DT_L_LINEAR, 1, {{"out", NULL, A_INT, 1, 0}}},
    {"conv", "conv2d", DT_L_CONV2D, 4,
     {{"out", NULL, A_INT, 1, 0},
      {"k", "kernel", A_INT, 1, 0},
      {"stride", NULL, A_INT, 0, 1},
      {"pad", "padding", A_INT, 0, 0}}},
    {"maxpool", "maxpool2d", DT_L_MAXPOOL2D, 2,
     {{"k", "kernel", A_INT, 1, 0}, {"stride", NULL, A_INT, 0, NAN}}},
    {"avgpool", "avgpool2d", DT_L_AVGPOOL2D, 2,
     {{"k", "kernel", A_INT, 1, 0}, {"stride", NULL, A_INT, 0, NAN}}},
    {"relu", NULL, DT_L_RELU, 0, {{0}}},
    {"gelu", NULL, DT_L_GELU, 0, {{0}}},
    {"dropout", NULL, DT_L_DROPOUT, 1, {{"p", NULL, A_FLOAT, 0, 0.5}}},
    {"flatten", NULL, DT_L_FLATTEN, 0, {{0}}},
    {"layernorm", NULL, DT_L_LAYERNORM, 1, {{"eps", NULL, A_FLOAT, 0, 1e-5}}},
    {"batchnorm", NULL, DT_L_BATCHNORM, 2,
     {{"eps", NULL, A_FLOAT, 0, 1e-5}, {"momentum", NULL, A_FLOAT, 0, 0.1}}},
    {"embedding", NULL, DT_L_EMBEDDING, 3,
     {{"rows", NULL, A_INT, 1, 0}, {"dim", NULL, A_INT, 1, 0}, {"std", NULL, A_FLOAT, 0, 1.0}}},
    {"dot", NULL, DT_L_DOT, 0, {{0}}},
};
#define NKINDS (int)(sizeof KINDS / sizeof KINDS[0])

/* Records "layer N 'token': <detail>" and returns DT_EINVAL. */
static int lerr(int idx, const char *tok, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int lerr(int idx, const char *tok, const char *fmt, ...) {
  char detail[320];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  return dt__seterr(DT_EINVAL, "layer %d '%s': %s", idx + 1, tok, detail);
}

/* Copies [s, s+n) into dst (cap bytes) for messages: non-printable bytes
 * become '?', long text is cut with "...". */
static void printable(char *dst, size_t cap, const char *s, size_t n) {
  size_t keep = n < cap - 1 ? n : cap - 4;
  for (size_t i = 0; i < keep; i++) {
    unsigned char ch = (unsigned char)s[i];
    dst[i] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
  }
  if (keep < n) {
    memcpy(dst + keep, "...", 4);
  } else {
    dst[keep] = '\0';
  }
}

static int is_name_char(char ch) { return isalnum((unsigned char)ch) || ch == '_'; }
static int is_space(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v'; }

/* Parses one trimmed argument value. */
static int parse_value(int idx, const char *tok, const argdef *d, const char *s, size_t n,
                       double *out) {
  char buf[64], shown[48];
  printable(shown, sizeof shown, s, n);
  if (n == 0) return lerr(idx, tok, "empty value for '%s'", d->name);
  if (n >= sizeof buf) return lerr(idx, tok, "value '%s' for '%s' is too long", shown, d->name);
  memcpy(buf, s, n);
  buf[n] = '\0';
  if (d->type == A_INT) {
    size_t i = 0;
    int neg = 0;
    if (buf[0] == '+' || buf[0] == '-') neg = buf[i++] == '-';
    if (!buf[i]) return lerr(idx, tok, "'%s' must be an integer, got '%s'", d->name, shown);
    long long v = 0;
    for (; buf[i]; i++) {
      if (buf[i] < '0' || buf[i] > '9')
        return lerr(idx, tok, "'%s' must be an integer, got '%s'", d->name, shown);
      v = v * 10 + (buf[i] - '0');
      if (v > DT__SPEC_MAX_INT)
        return lerr(idx, tok, "'%s' = %s is out of range (max %d)", d->name, shown,
                    DT__SPEC_MAX_INT);
    }
    *out = (double)(neg ? -v : v);
    return DT_OK;
  }
  char *end = NULL;
  double v = strtod(buf, &end);
  if (end == buf || *end != '\0' || !isfinite(v))
    return lerr(idx, tok, "'%s' must be a number, got '%s'", d->name, shown);
  *out = v;
  return DT_OK;
}

/* Parses "a, b, key=v" (the text between the parentheses) into vals[]. */
static int parse_args(int idx, const char *tok, const kinddef *k, const char *s, size_t n,
                      double vals[4]) {
  int given[4] = {0};
  int npos = 0, seen_kw = 0;
  size_t i = 0;
  /* "name()" and "name( )" mean no arguments. */
  size_t j = 0;
  while (j < n && is_space(s[j])) j++;
  if (j == n) goto defaults;
  while (i <= n) {
    size_t a = i;
    while (i < n && s[i] != ',') i++;
    size_t b = i; /* [a, b) is one argument */
    while (a < b && is_space(s[a])) a++;
    while (b > a && is_space(s[b - 1])) b--;
    if (a == b) return lerr(idx, tok, "empty argument");
    const char *eq = memchr(s + a, '=', b - a);
    int slot = -1;
    const char *vs = s + a;
    size_t vn = b - a;
    if (eq) {
      size_t kb = (size_t)(eq - s), ka = a;
      while (kb > ka && is_space(s[kb - 1])) kb--;
      char key[32];
      printable(key, sizeof key, s + ka, kb - ka);
      for (int q = 0; q < k->nargs; q++) {
        const argdef *d = &k->args[q];
        if ((strlen(d->name) == kb - ka && !memcmp(d->name, s + ka, kb - ka)) ||
            (d->alias && strlen(d->alias) == kb - ka && !memcmp(d->alias, s + ka, kb - ka)))
          slot = q;
      }
      if (slot < 0) {
        if (k->nargs == 0) return lerr(idx, tok, "'%s' takes no arguments", k->name);
        return lerr(idx, tok, "unknown argument '%s' for '%s'", key, k->name);
      }
      vs = eq + 1;
      vn = (size_t)(s + b - vs);
      while (vn && is_space(*vs)) vs++, vn--;
      seen_kw = 1;
    } else {
      if (k->nargs == 0) return lerr(idx, tok, "'%s' takes no arguments", k->name);
      if (seen_kw) return lerr(idx, tok, "positional argument after key=value");
      if (npos >= k->nargs)
        return lerr(idx, tok, "too many arguments ('%s' takes at most %d)", k->name, k->nargs);
      slot = npos++;
    }
    if (given[slot]) return lerr(idx, tok, "argument '%s' given twice", k->args[slot].name);
    DT_CHECK(parse_value(idx, tok, &k->args[slot], vs, vn, &vals[slot]));
    given[slot] = 1;
    i++; /* skip the comma (or step past the end) */
  }
defaults:
  for (int q = 0; q < k->nargs; q++) {
    if (given[q]) continue;
    if (k->args[q].required)
      return lerr(idx, tok, "missing argument '%s'", k->args[q].name);
    vals[q] = k->args[q].def;
  }
  return DT_OK;
}

/* Shape inference for one layer: validates arguments against its input
 * (c,h,w, flat) and fills info and the derived fields. */
static int infer(int idx, dt__layer_spec *l, const double v[4], int *c, int *h, int *w,
                 int *flat) {
  dt_layer_info *in = &l->info;
  const char *tok = l->token;
  size_t inel = (size_t)*c * (size_t)*h * (size_t)*w;
  in->in_c = *c, in->in_h = *h, in->in_w = *w;
  l->flat_in = *flat;
  size_t oc = (size_t)*c, oh = (size_t)*h, ow = (size_t)*w;
  switch (in->kind) {
  case DT_L_LINEAR: {
    if (v[0] < 1) return lerr(idx, tok, "out features must be >= 1");
    l->oc = (int)v[0];
    in->nparams = inel * (size_t)l->oc + (size_t)l->oc;
    if (inel * (size_t)l->oc > DT__SPEC_MAX_PARAMS)
      return lerr(idx, tok, "%zu x %d weights are too many", inel, l->oc);
    in->fwd_flops = 2.0 * (double)inel * l->oc;
    oc = (size_t)l->oc, oh = ow = 1;
    *flat = 1;
    break;
  }
  case DT_L_CONV2D: {
    if (v[0] < 1) return lerr(idx, tok, "out channels must be >= 1");
    if (v[1] < 1) return lerr(idx, tok, "kernel size must be >= 1");
    if (v[2] < 1) return lerr(idx, tok, "stride must be >= 1");
    if (v[3] < 0) return lerr(idx, tok, "padding must be >= 0");
    l->oc = (int)v[0], l->k = (int)v[1], l->stride = (int)v[2], l->pad = (int)v[3];
    if (*flat)
      return lerr(idx, tok, "expects a (C,H,W) input but gets a flat vector of %zu features", inel);
    long ph = (long)*h + 2L * l->pad, pw = (long)*w + 2L * l->pad;
    if (l->k > ph || l->k > pw)
      return lerr(idx, tok, "kernel %d is larger than the padded input %ldx%ld", l->k, ph, pw);
    oh = (size_t)((ph - l->k) / l->stride + 1);
    ow = (size_t)((pw - l->k) / l->stride + 1);
    oc = (size_t)l->oc;
    double dnw = (double)l->oc * *c * (double)l->k * l->k;
    if (dnw > (double)DT__SPEC_MAX_PARAMS)
      return lerr(idx, tok, "%.0f weights are too many", dnw);
    size_t nw = (size_t)dnw;
    in->nparams = nw + (size_t)l->oc;
    in->fwd_flops = 2.0 * (double)nw * (double)oh * (double)ow;
    break;
  }
  case DT_L_MAXPOOL2D:
  case DT_L_AVGPOOL2D: {
    if (v[0] < 1) return lerr(idx, tok, "kernel size must be >= 1");
    l->k = (int)v[0];
    l->stride = isnan(v[1]) ? l->k : (int)v[1];
    if (l->stride < 1) return lerr(idx, tok, "stride must be >= 1");
    if (*flat)
      return lerr(idx, tok, "expects a (C,H,W) input but gets a flat vector of %zu features", inel);
    if (l->k > *h || l->k > *w)
      return lerr(idx, tok, "kernel %d is larger than the input %dx%d (output would be empty)",
                  l->k, *h, *w);
    oh = (size_t)((*h - l->k) / l->stride + 1);
    ow = (size_t)((*w - l->k) / l->stride + 1);
    in->fwd_flops = (double)l->k * l->k * (double)(oc * oh * ow);
    break;
  }
  case DT_L_RELU: in->fwd_flops = (double)inel; break;
  case DT_L_GELU: in->fwd_flops = 10.0 * (double)inel; break;
  case DT_L_DROPOUT:
    if (!(v[0] >= 0.0 && v[0] < 1.0)) return lerr(idx, tok, "p must be in [0, 1)");
    l->p = (float)v[0];
    in->fwd_flops = (double)inel;
    break;
  case DT_L_FLATTEN:
    oc = inel, oh = ow = 1;
    *flat = 1;
    break;
  case DT_L_LAYERNORM:
    if (!(v[0] > 0.0)) return lerr(idx, tok, "eps must be > 0");
    l->eps = (float)v[0];
    in->nparams = 2 * inel;
    in->fwd_flops = 8.0 * (double)inel;
    break;
  case DT_L_BATCHNORM:
    if (!(v[0] > 0.0)) return lerr(idx, tok, "eps must be > 0");
    if (!(v[1] >= 0.0 && v[1] <= 1.0)) return lerr(idx, tok, "momentum must be in [0, 1]");
    l->eps = (float)v[0], l->momentum = (float)v[1];
    /* BatchNorm1d over features on a flat input, BatchNorm2d over channels
     * otherwise, as PyTorch users would write it. */
    l->bn_c = *flat ? (int)inel : *c;
    l->bn_s = *flat ? 1 : *h * *w;
    in->nparams = 2 * (size_t)l->bn_c;
    in->nbufs = 2 * (size_t)l->bn_c;
    in->fwd_flops = 8.0 * (double)inel;
    break;
  case DT_L_EMBEDDING: {
    if (idx != 0) return lerr(idx, tok, "an embedding must be the first layer (its input is ids)");
    if (v[0] < 1 || v[1] < 1) return lerr(idx, tok, "rows and dim must be >= 1");
    if (!(v[2] > 0.0)) return lerr(idx, tok, "std must be > 0");
    l->oc = (int)v[1];   /* dim */
    l->k = (int)v[0];    /* rows */
    l->eps = (float)v[2]; /* init std */
    if ((double)v[0] * v[1] > (double)DT__SPEC_MAX_PARAMS)
      return lerr(idx, tok, "%.0f x %.0f weights are too many", v[0], v[1]);
    in->nparams = (size_t)l->k * (size_t)l->oc;
    in->fwd_flops = (double)inel * l->oc;
    oc = inel * (size_t)l->oc, oh = ow = 1;
    *flat = 1;
    break;
  }
  case DT_L_DOT:
    if (inel < 2 || inel % 2)
      return lerr(idx, tok, "needs an even number of input features (two halves), got %zu", inel);
    in->nparams = 1;
    in->fwd_flops = (double)inel;
    oc = 1, oh = ow = 1;
    *flat = 1;
    break;
  }
  if ((double)oc * (double)oh * (double)ow > (double)DT__SPEC_MAX_ELEMS)
    return lerr(idx, tok, "output of %zux%zux%zu elements per sample is too large", oc, oh, ow);
  *c = (int)oc, *h = (int)oh, *w = (int)ow;
  in->out_c = *c, in->out_h = *h, in->out_w = *w;
  return DT_OK;
}

void dt__spec_free(dt__spec *s) {
  if (!s) return;
  free(s->L);
  memset(s, 0, sizeof *s);
}

int dt__spec_parse(dt__spec *out, const char *text, int c, int h, int w) {
  memset(out, 0, sizeof *out);
  if (!text) return dt__seterr(DT_EINVAL, "model spec is NULL");
  if (c < 1 || h < 1 || w < 1 || c > DT__SPEC_MAX_INT || h > DT__SPEC_MAX_INT ||
      w > DT__SPEC_MAX_INT || (size_t)c * h * w > DT__SPEC_MAX_ELEMS)
    return dt__seterr(DT_EINVAL, "model input shape %dx%dx%d is invalid", c, h, w);
  dt__spec s = {0};
  int cap = 0, rc = DT_OK, flat = 0;
  s.max_elems = (size_t)c * h * w;
  const char *p = text;
  for (;;) {
    while (is_space(*p)) p++;
    if (!*p) break;
    int idx = s.n;
    const char *start = p;
    /* The token runs to the closing parenthesis, or to whitespace if the
     * layer has no arguments. */
    while (is_name_char(*p)) p++;
    size_t namelen = (size_t)(p - start);
    const char *q = p;
    while (is_space(*q)) q++;
    const char *args = NULL, *argend = NULL;
    if (namelen && *q == '(') {
      args = q + 1;
      argend = args;
      while (*argend && *argend != ')' && *argend != '(') argend++;
      p = *argend == ')' ? argend + 1 : argend;
    } else if (namelen == 0) {
      while (*p && !is_space(*p)) p++;
    }
    dt__layer_spec l;
    memset(&l, 0, sizeof l);
    printable(l.token, sizeof l.token, start, (size_t)(p - start));
    if (idx >= DT__SPEC_MAX_LAYERS) {
      rc = lerr(idx, l.token, "too many layers (max %d)", DT__SPEC_MAX_LAYERS);
      goto fail;
    }
    if (namelen == 0) {
      rc = lerr(idx, l.token, "expected a layer name");
      goto fail;
    }
    if (args && *argend != ')') {
      rc = lerr(idx, l.token, *argend == '(' ? "unexpected '(' inside arguments" : "missing ')'");
      goto fail;
    }
    if (!is_space(*p) && *p) {
      /* "relu)" or "linear(10)x": junk glued to the token. */
      const char *e = p;
      while (*e && !is_space(*e)) e++;
      printable(l.token, sizeof l.token, start, (size_t)(e - start));
      rc = lerr(idx, l.token, "unexpected text after the layer");
      goto fail;
    }
    const kinddef *k = NULL;
    for (int i = 0; i < NKINDS; i++) {
      const char *nm[2] = {KINDS[i].name, KINDS[i].alias};
      for (int j = 0; j < 2; j++)
        if (nm[j] && strlen(nm[j]) == namelen && !memcmp(nm[j], start, namelen)) k = &KINDS[i];
    }
    if (!k) {
      char name[48];
      printable(name, sizeof name, start, namelen);
      rc = lerr(idx, l.token,
                "unknown layer '%s' (known: linear conv maxpool avgpool relu gelu dropout "
                "flatten layernorm batchnorm embedding dot)",
                name);
      goto fail;
    }
    double vals[4] = {0, 0, 0, 0};
    DT_CHECK_GOTO(parse_args(idx, l.token, k, args ? args : "", args ? (size_t)(argend - args) : 0,
                             vals),
                  rc, fail);
    l.info.kind = k->kind;
    l.info.name = k->name;
    DT_CHECK_GOTO(infer(idx, &l, vals, &c, &h, &w, &flat), rc, fail);
    l.info.param_off = s.nparams;
    l.info.buf_off = s.nbufs;
    s.nparams += l.info.nparams;
    s.nbufs += l.info.nbufs;
    if (s.nparams > DT__SPEC_MAX_PARAMS) {
      rc = lerr(idx, l.token, "model has too many parameters (max %zu)", DT__SPEC_MAX_PARAMS);
      goto fail;
    }
    size_t outel = (size_t)c * h * w;
    if (outel > s.max_elems) s.max_elems = outel;
    if (s.n == cap) {
      int ncap = cap ? cap * 2 : 16;
      dt__layer_spec *nl = realloc(s.L, (size_t)ncap * sizeof *nl);
      if (!nl) {
        rc = dt__seterr(DT_ENOMEM, "model spec: out of memory");
        goto fail;
      }
      s.L = nl, cap = ncap;
    }
    s.L[s.n++] = l;
  }
  if (s.n == 0) {
    rc = dt__seterr(DT_EINVAL, "model spec is empty");
    goto fail;
  }
  *out = s;
  return DT_OK;
fail:
  dt__spec_free(&s);
  return rc;
}
