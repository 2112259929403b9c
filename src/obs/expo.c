/*
 * expo.c — the Prometheus text exposition format 0.0.4 of several ranks'
 * pages: for every metric name (in the order of first registration over
 * the ranks) one "# HELP" and one "# TYPE" line, then one sample per rank
 * labelled {job, rank, host} (label values escaped: backslash, double
 * quote, newline); histograms as cumulative _bucket{le=...} series ending
 * with le="+Inf" equal to _count, then _sum and _count; the file ends with
 * a newline. Values are printed as the shortest text that reads back exactly (Inf and NaN spelled +Inf, -Inf,
 * NaN as the format wants). It reads copies of the pages (obs_file.h); it
 * serves nothing (http_mhd.c).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "obs/obs_diag.h"

typedef struct sbuf {
  char **b;
  size_t *len, *cap;
  int oom;
} sbuf;

static void put(sbuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf *s, const char *fmt, ...) {
  if (s->oom) return;
  for (;;) {
    size_t room = *s->cap - *s->len;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(*s->b ? *s->b + *s->len : NULL, *s->b ? room : 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (*s->b && (size_t)n < room) {
      *s->len += (size_t)n;
      return;
    }
    size_t nc = (*s->cap ? *s->cap * 2 : 16384) + (size_t)n;
    char *nb = realloc(*s->b, nc);
    if (!nb) {
      s->oom = 1;
      return;
    }
    *s->b = nb;
    *s->cap = nc;
  }
}

/* The shortest text that reads back as the same double (0.00025, not
 * 0.00025000000000000001). Whole numbers (counts, bytes) print as
 * integers; any other value that has a decimal form of at most 15
 * significant digits is exactly what "%.15g" prints (DBL_DIG), so at most
 * three tries — a scrape formats hundreds of numbers, and trying every
 * precision from 1 up made formatting most of its cost. */
static void num(char *buf, size_t cap, double v) {
  if (isnan(v)) snprintf(buf, cap, "NaN");
  else if (isinf(v)) snprintf(buf, cap, "%s", v > 0 ? "+Inf" : "-Inf");
  else if (fabs(v) < 1e15 && v == (double)(long long)v) { /* range first: the cast of 2.5e20 is UB */
    long long i = (long long)v;
    char t[24];
    int k = 0, neg = i < 0 || (i == 0 && signbit(v));
    unsigned long long u = i < 0 ? 0ull - (unsigned long long)i : (unsigned long long)i;
    do t[k++] = (char)('0' + u % 10); while ((u /= 10) && k < 23);
    size_t o = 0;
    if (neg && o + 1 < cap) buf[o++] = '-';
    while (k > 0 && o + 1 < cap) buf[o++] = t[--k];
    buf[o] = '\0';
  } else {
    snprintf(buf, cap, "%.15g", v);
    if (strtod(buf, NULL) == v) return;
    snprintf(buf, cap, "%.16g", v);
    if (strtod(buf, NULL) == v) return;
    snprintf(buf, cap, "%.17g", v);
  }
}

/* label value escaping of the text format: \\ \" \n */
static void esc(const char *in, char *out, size_t cap) {
  size_t k = 0;
  for (; *in && k + 3 < cap; in++) {
    if (*in == '\\' || *in == '"') out[k++] = '\\', out[k++] = *in;
    else if (*in == '\n') out[k++] = '\\', out[k++] = 'n';
    else out[k++] = *in;
  }
  out[k] = '\0';
}

/* HELP text escaping: \\ and \n */
static void esc_help(const char *in, char *out, size_t cap) {
  size_t k = 0;
  for (; *in && k + 3 < cap; in++) {
    if (*in == '\\') out[k++] = '\\', out[k++] = '\\';
    else if (*in == '\n') out[k++] = '\\', out[k++] = 'n';
    else out[k++] = *in;
  }
  out[k] = '\0';
}

static const char *type_name(uint32_t t) {
  return t == DT_OBS_COUNTER ? "counter" : t == DT_OBS_GAUGE ? "gauge" : "histogram";
}

/* Resident memory of pid from /proc, or -1. */
static double rss_bytes(int pid) {
  char p[64];
  snprintf(p, sizeof p, "/proc/%d/statm", pid);
  FILE *f = fopen(p, "re");
  if (!f) return -1;
  long long size = 0, res = -1;
  int n = fscanf(f, "%lld %lld", &size, &res);
  fclose(f);
  return n == 2 && res >= 0 ? (double)res * (double)sysconf(_SC_PAGESIZE) : -1;
}

int dt_obs_expose(const struct dt_obs_page *pages, int n, char **buf, size_t *len, size_t *cap) {
  sbuf s = {buf, len, cap, 0};
  char (*lab)[400] = calloc((size_t)(n > 0 ? n : 1), sizeof *lab);
  if (!lab) return dt__seterr(DT_ENOMEM, "metrics: out of memory");
  for (int r = 0; r < n; r++) {
    char j[160], h[160];
    esc(pages[r].job, j, sizeof j);
    esc(pages[r].host, h, sizeof h);
    snprintf(lab[r], sizeof lab[r], "job=\"%s\",rank=\"%d\",host=\"%s\"", j, pages[r].rank, h);
  }
  char v[64];
  /* every name once, in order of first appearance over the ranks */
  for (int r = 0; r < n; r++) {
    uint32_t k = atomic_load(&((struct dt_obs_page *)&pages[r])->nmetrics);
    for (uint32_t i = 0; i < k; i++) {
      const struct dt_obs_slot *m = &pages[r].slot[i];
      int seen = 0;
      for (int q = 0; q < r && !seen; q++) {
        uint32_t kq = atomic_load(&((struct dt_obs_page *)&pages[q])->nmetrics);
        for (uint32_t j = 0; j < kq && !seen; j++) seen = !strcmp(pages[q].slot[j].name, m->name);
      }
      if (seen) continue;
      char help[2 * DT_OBS_HELP_MAX];
      esc_help(m->help, help, sizeof help);
      put(&s, "# HELP %s %s\n# TYPE %s %s\n", m->name, help, m->name, type_name(m->type));
      for (int q = r; q < n; q++) {
        uint32_t kq = atomic_load(&((struct dt_obs_page *)&pages[q])->nmetrics);
        const struct dt_obs_slot *x = NULL;
        for (uint32_t j = 0; j < kq && !x; j++)
          if (!strcmp(pages[q].slot[j].name, m->name) && pages[q].slot[j].type == m->type)
            x = &pages[q].slot[j];
        if (!x) continue;
        if (x->type != DT_OBS_HISTOGRAM) {
          num(v, sizeof v, dt__obs_bits_to_d(atomic_load(&((struct dt_obs_slot *)x)->value)));
          put(&s, "%s{%s} %s\n", x->name, lab[q], v);
          continue;
        }
        /* cumulative buckets; +Inf is the sum of all of them and is what
         * _count says (counted from the same copy, so they agree) */
        uint64_t cum = 0;
        for (uint32_t b = 0; b <= x->nbounds && b <= DT_OBS_MAX_BOUNDS; b++) {
          cum += atomic_load(&((struct dt_obs_slot *)x)->bucket[b]);
          if (b < x->nbounds) num(v, sizeof v, x->bounds[b]);
          else snprintf(v, sizeof v, "+Inf");
          put(&s, "%s_bucket{%s,le=\"%s\"} %llu\n", x->name, lab[q], v, (unsigned long long)cum);
        }
        num(v, sizeof v, dt__obs_bits_to_d(atomic_load(&((struct dt_obs_slot *)x)->value)));
        put(&s, "%s_sum{%s} %s\n%s_count{%s} %llu\n", x->name, lab[q], v, x->name, lab[q],
            (unsigned long long)cum);
      }
    }
  }
  /* resident memory of every rank that is still alive */
  int any = 0;
  for (int r = 0; r < n; r++) {
    double rss = rss_bytes(pages[r].pid);
    if (rss < 0) continue;
    if (!any++)
      put(&s, "# HELP dtrain_resident_memory_bytes Resident memory of the rank's process\n"
              "# TYPE dtrain_resident_memory_bytes gauge\n");
    num(v, sizeof v, rss);
    put(&s, "dtrain_resident_memory_bytes{%s} %s\n", lab[r], v);
  }
  if (!*len) put(&s, "%s", ""); /* an empty exposition is "" plus nothing */
  free(lab);
  if (s.oom) return dt__seterr(DT_ENOMEM, "metrics: out of memory");
  return DT_OK;
}
