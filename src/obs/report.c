/*
 * report.c — `dtrain report RUN_DIR`: one self-contained HTML file (no
 * scripts, no fonts, nothing fetched: inline CSS and SVG drawn here) from
 * what a run left in its directory: events.jsonl (loss and accuracy per
 * epoch, samples/s over time, per-rank compute/wait and straggler flags
 * when the strategy measured them), summary.json or failure.json (the
 * numbers, per-worker time breakdown and bytes), config.ini, the hang
 * diagnosis (diagnosis.txt) and the rank pages (step-time and allreduce
 * histograms). Each chart is an <svg class="chart"> whose data points are
 * <circle class="pt"> or <rect class="pt"> elements, so a test can count
 * them. Missing files leave their section out; only a directory with
 * neither events nor a summary is an error. It does not run anything.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obs/obs_diag.h"

#define MAXS 8 /* series per chart */

typedef struct series {
  const char *name;
  int n;
  double *x, *y;
} series;

static const char *const color[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                    "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};

static char *slurp(const char *path, size_t max) {
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  char *b = malloc(max + 1);
  size_t n = b ? fread(b, 1, max, f) : 0;
  fclose(f);
  if (!b) return NULL;
  b[n] = '\0';
  return b;
}

static void esc(FILE *f, const char *s) {
  for (; s && *s; s++) {
    switch (*s) {
    case '<': fputs("&lt;", f); break;
    case '>': fputs("&gt;", f); break;
    case '&': fputs("&amp;", f); break;
    case '"': fputs("&quot;", f); break;
    default: fputc(*s, f);
    }
  }
}

static void fmt(char *b, size_t cap, double v) {
  double a = fabs(v);
  if (a != 0 && (a >= 1e6 || a < 1e-3)) snprintf(b, cap, "%.3g", v);
  else snprintf(b, cap, "%.4g", v);
}

enum { W = 560, H = 260, L = 70, R = 16, T = 28, B = 40 };

/* A legend entry at *x (the chart's next free place), *x moved past it. */
static void legend(FILE *f, double *x, const char *name, const char *c) {
  fprintf(f, "<rect x=\"%.0f\" y=\"8\" width=\"10\" height=\"10\" fill=\"%s\"/>"
          "<text x=\"%.0f\" y=\"17\" font-size=\"11\">", *x, c, *x + 14);
  esc(f, name);
  fputs("</text>", f);
  *x += 28 + 6.2 * (double)strlen(name);
}

/* A line chart of up to MAXS series (x, y); points as circles. */
static void line_chart(FILE *f, const char *title, const char *xl, const char *yl, series *s,
                       int ns) {
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  int pts = 0;
  for (int k = 0; k < ns; k++)
    for (int i = 0; i < s[k].n; i++) {
      if (!isfinite(s[k].x[i]) || !isfinite(s[k].y[i])) continue;
      x0 = fmin(x0, s[k].x[i]), x1 = fmax(x1, s[k].x[i]);
      y0 = fmin(y0, s[k].y[i]), y1 = fmax(y1, s[k].y[i]);
      pts++;
    }
  if (!pts) return;
  if (y0 > 0 && y0 < 0.5 * y1) y0 = 0;
  if (x1 == x0) x0 -= 0.5, x1 += 0.5;
  if (y1 == y0) y0 -= fabs(y0) * 0.1 + 0.5, y1 += fabs(y1) * 0.1 + 0.5;
  fprintf(f, "<figure><svg class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" "
          "height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\"><title>", W, H, W, H);
  esc(f, title);
  fprintf(f, "</title><rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#fafafa\" "
          "stroke=\"#ccc\"/>", L, T, W - L - R, H - T - B);
  char a[32], b[32];
  for (int g = 0; g <= 4; g++) { /* grid and y labels */
    double v = y0 + (y1 - y0) * g / 4, py = H - B - (H - T - B) * g / 4.0;
    fmt(a, sizeof a, v);
    fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>"
            "<text x=\"%d\" y=\"%.1f\" font-size=\"10\" text-anchor=\"end\">%s</text>", L,
            W - R, py, py, L - 4, py + 3, a);
  }
  fmt(a, sizeof a, x0);
  fmt(b, sizeof b, x1);
  fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"10\">%s</text><text x=\"%d\" y=\"%d\" "
          "font-size=\"10\" text-anchor=\"end\">%s</text><text x=\"%d\" y=\"%d\" "
          "font-size=\"11\" text-anchor=\"middle\">", L, H - B + 14, a, W - R, H - B + 14, b,
          (L + W - R) / 2, H - 6);
  esc(f, xl);
  fprintf(f, "</text><text x=\"12\" y=\"%d\" font-size=\"11\" transform=\"rotate(-90 12 %d)\" "
          "text-anchor=\"middle\">", (T + H - B) / 2, (T + H - B) / 2);
  esc(f, yl);
  fputs("</text>", f);
  double lx = 8;
  for (int k = 0; k < ns; k++) {
    const char *c = color[k % MAXS];
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", c);
    for (int i = 0; i < s[k].n; i++) {
      if (!isfinite(s[k].x[i]) || !isfinite(s[k].y[i])) continue;
      fprintf(f, "%.1f,%.1f ", L + (s[k].x[i] - x0) / (x1 - x0) * (W - L - R),
              H - B - (s[k].y[i] - y0) / (y1 - y0) * (H - T - B));
    }
    fputs("\"/>", f);
    for (int i = 0; i < s[k].n; i++) {
      if (!isfinite(s[k].x[i]) || !isfinite(s[k].y[i])) continue;
      fmt(a, sizeof a, s[k].y[i]);
      fprintf(f, "<circle class=\"pt\" cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"><title>",
              L + (s[k].x[i] - x0) / (x1 - x0) * (W - L - R),
              H - B - (s[k].y[i] - y0) / (y1 - y0) * (H - T - B), c);
      esc(f, s[k].name);
      fprintf(f, ": %s</title></circle>", a);
    }
    legend(f, &lx, s[k].name, c);
  }
  fputs("</svg><figcaption>", f);
  esc(f, title);
  fputs("</figcaption></figure>\n", f);
}

/* Stacked bars: n categories (labels), ns stacks of values each. */
static void bar_chart(FILE *f, const char *title, const char *yl, char (*labels)[48], int n,
                      series *s, int ns, const int *mark) {
  double top = 0;
  for (int i = 0; i < n; i++) {
    double t = 0;
    for (int k = 0; k < ns; k++) t += isfinite(s[k].y[i]) && s[k].y[i] > 0 ? s[k].y[i] : 0;
    top = fmax(top, t);
  }
  if (n < 1 || !(top > 0)) return;
  fprintf(f, "<figure><svg class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" "
          "height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\"><title>", W, H, W, H);
  esc(f, title);
  fprintf(f, "</title><rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#fafafa\" "
          "stroke=\"#ccc\"/>", L, T, W - L - R, H - T - B);
  char a[32];
  for (int g = 0; g <= 4; g++) {
    double py = H - B - (H - T - B) * g / 4.0;
    fmt(a, sizeof a, top * g / 4);
    fprintf(f, "<text x=\"%d\" y=\"%.1f\" font-size=\"10\" text-anchor=\"end\">%s</text>", L - 4,
            py + 3, a);
  }
  fprintf(f, "<text x=\"12\" y=\"%d\" font-size=\"11\" transform=\"rotate(-90 12 %d)\" "
          "text-anchor=\"middle\">", (T + H - B) / 2, (T + H - B) / 2);
  esc(f, yl);
  fputs("</text>", f);
  double slot = (double)(W - L - R) / n, bw = slot * 0.6;
  for (int i = 0; i < n; i++) {
    double x = L + slot * i + (slot - bw) / 2, base = H - B;
    for (int k = 0; k < ns; k++) {
      double v = isfinite(s[k].y[i]) && s[k].y[i] > 0 ? s[k].y[i] : 0;
      double h = v / top * (H - T - B);
      fmt(a, sizeof a, v);
      fprintf(f, "<rect class=\"pt\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
              "fill=\"%s\"><title>", x, base - h, bw, h, color[k % MAXS]);
      esc(f, labels[i]);
      fputs(" ", f);
      esc(f, s[k].name);
      fprintf(f, ": %s</title></rect>", a);
      base -= h;
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%d\" font-size=\"10\" text-anchor=\"middle\"%s>", x + bw / 2,
            H - B + 14, mark && mark[i] ? " fill=\"#d62728\" font-weight=\"bold\"" : "");
    esc(f, labels[i]);
    if (mark && mark[i]) fputs(" (straggler)", f);
    fputs("</text>", f);
  }
  double lx = 8;
  for (int k = 0; k < ns; k++) legend(f, &lx, s[k].name, color[k % MAXS]);
  fputs("</svg><figcaption>", f);
  esc(f, title);
  fputs("</figcaption></figure>\n", f);
}

static double num(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* ---- sections ------------------------------------------------------------------ */

/* events.jsonl: loss, accuracy, samples/s; per-rank wait and stragglers of the last epoch */
static int epochs_section(FILE *f, const char *dir) {
  char p[4200];
  snprintf(p, sizeof p, "%s/events.jsonl", dir);
  char *text = slurp(p, 64u << 20);
  if (!text) return 0;
  int cap = 1024, n = 0;
  double *v = calloc((size_t)cap * 7, sizeof *v);
  cJSON *last_ranks = NULL;
  for (char *line = strtok(text, "\n"); line && v; line = strtok(NULL, "\n")) {
    cJSON *o = cJSON_Parse(line);
    if (!o) continue;
    if (n == cap) {
      double *nv = realloc(v, (size_t)cap * 2 * 7 * sizeof *v);
      if (!nv) {
        cJSON_Delete(o);
        break;
      }
      /* columns stay [k * cap2 + i]: move them */
      for (int k = 6; k >= 0; k--) memmove(nv + (size_t)k * cap * 2, nv + (size_t)k * cap, (size_t)cap * sizeof *v);
      v = nv, cap *= 2;
    }
    double row[7] = {num(o, "epoch"), num(o, "train_loss"), num(o, "test_loss"),
                     num(o, "train_accuracy"), num(o, "test_accuracy"), num(o, "time"),
                     num(o, "samples_per_second")};
    if (!isfinite(row[0])) {
      cJSON_Delete(o);
      continue;
    }
    for (int k = 0; k < 7; k++) v[(size_t)k * cap + n] = row[k];
    n++;
    cJSON *r = cJSON_DetachItemFromObjectCaseSensitive(o, "ranks");
    if (r) cJSON_Delete(last_ranks), last_ranks = r;
    cJSON_Delete(o);
  }
  free(text);
  if (!v || !n) {
    free(v);
    cJSON_Delete(last_ranks);
    return 0;
  }
  double *c[7];
  for (int k = 0; k < 7; k++) c[k] = v + (size_t)k * cap;
  fputs("<h2>Training</h2>\n<div class=\"row\">", f);
  series loss[2] = {{"train loss", n, c[0], c[1]}, {"test loss", n, c[0], c[2]}};
  line_chart(f, "Loss per epoch", "epoch", "loss", loss, 2);
  series acc[2] = {{"train accuracy", n, c[0], c[3]}, {"test accuracy", n, c[0], c[4]}};
  line_chart(f, "Accuracy per epoch", "epoch", "accuracy", acc, 2);
  series sps[1] = {{"samples/s", n, c[5], c[6]}};
  line_chart(f, "Samples per second over time", "seconds since start", "samples/s", sps, 1);
  fputs("</div>\n", f);
  int nr = cJSON_GetArraySize(last_ranks);
  if (nr > 1) {
    char(*lab)[48] = calloc((size_t)nr, sizeof *lab);
    double *cw = calloc((size_t)nr * 3, sizeof *cw);
    int *mark = calloc((size_t)nr, sizeof *mark);
    for (int i = 0; lab && cw && mark && i < nr; i++) {
      const cJSON *r = cJSON_GetArrayItem(last_ranks, i);
      snprintf(lab[i], sizeof lab[i], "rank %d", i);
      cw[i] = num(r, "compute_seconds");
      cw[nr + i] = num(r, "wait_seconds");
      cw[2 * nr + i] = num(r, "ms_per_sample");
      mark[i] = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "straggler"));
    }
    if (lab && cw && mark) {
      fputs("<h2>Stragglers (last epoch)</h2>\n<div class=\"row\">", f);
      series st[2] = {{"compute", nr, NULL, cw}, {"waiting for peers", nr, NULL, cw + nr}};
      bar_chart(f, "Per-rank compute and waiting, last epoch", "seconds", lab, nr, st, 2, mark);
      series ms[1] = {{"ms per sample", nr, NULL, cw + 2 * nr}};
      bar_chart(f, "Per-rank compute time per sample, last epoch", "ms", lab, nr, ms, 1, mark);
      fputs("</div>\n", f);
    }
    free(lab), free(cw), free(mark);
  }
  cJSON_Delete(last_ranks);
  free(v);
  return 1;
}

/* summary.json / failure.json: the numbers, the per-worker breakdown and bytes */
static int summary_section(FILE *f, const char *dir) {
  char p[4200];
  int found = 0;
  static const char *const files[] = {"summary.json", "failure.json"};
  for (int fi = 0; fi < 2; fi++) {
    snprintf(p, sizeof p, "%s/%s", dir, files[fi]);
    char *text = slurp(p, 16u << 20);
    cJSON *o = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (!o) continue;
    found = 1;
    fprintf(f, "<h2>%s</h2>\n<table>", fi ? "Failure" : "Summary");
    const cJSON *it;
    cJSON_ArrayForEach(it, o) {
      if (cJSON_IsArray(it) || cJSON_IsObject(it)) continue;
      fputs("<tr><th>", f);
      esc(f, it->string);
      fputs("</th><td>", f);
      if (cJSON_IsString(it)) esc(f, it->valuestring);
      else if (cJSON_IsBool(it)) fputs(cJSON_IsTrue(it) ? "true" : "false", f);
      else if (cJSON_IsNumber(it)) fprintf(f, "%.6g", it->valuedouble);
      fputs("</td></tr>", f);
    }
    fputs("</table>\n", f);
    const cJSON *pw = cJSON_GetObjectItemCaseSensitive(o, "per_worker");
    int n = cJSON_GetArraySize(pw);
    if (n > 0) {
      char(*lab)[48] = calloc((size_t)n, sizeof *lab);
      double *v = calloc((size_t)n * 5, sizeof *v);
      int *mark = calloc((size_t)n, sizeof *mark);
      for (int i = 0; lab && v && mark && i < n; i++) {
        const cJSON *w = cJSON_GetArrayItem(pw, i);
        double rank = num(w, "rank");
        snprintf(lab[i], sizeof lab[i], "rank %d", isfinite(rank) ? (int)rank : i);
        double tr = num(w, "train_seconds"), comp = num(w, "compute_seconds");
        double comm = num(w, "comm_seconds"), hid = num(w, "comm_hidden_fraction");
        v[i] = comp;                                                     /* compute */
        v[n + i] = isfinite(comm) ? comm * (isfinite(hid) ? hid : 0) : 0; /* overlapped comm */
        v[2 * n + i] = isfinite(tr) && isfinite(comp) ? fmax(0, tr - comp) : NAN; /* waiting */
        v[3 * n + i] = num(w, "bytes_sent");
        v[4 * n + i] = num(w, "bytes_received");
        mark[i] = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(w, "straggler"));
      }
      if (lab && v && mark) {
        fputs("<h3>Per rank</h3>\n<div class=\"row\">", f);
        series t[3] = {{"compute", n, NULL, v}, {"communication hidden under compute", n, NULL, v + n},
                       {"communication / waiting", n, NULL, v + 2 * n}};
        bar_chart(f, "Step time breakdown per rank (whole run)", "seconds", lab, n, t, 3, mark);
        series b[2] = {{"bytes sent", n, NULL, v + 3 * n}, {"bytes received", n, NULL, v + 4 * n}};
        bar_chart(f, "Communication volume per rank", "bytes", lab, n, b, 2, NULL);
        fputs("</div>\n", f);
      }
      free(lab), free(v), free(mark);
    }
    cJSON_Delete(o);
  }
  return found;
}

/* histograms of the rank pages: per-rank distribution of step and communication times */
static void pages_section(FILE *f, const char *dir) {
  /* the step, then each strategy's communication: ddp's bucket reductions,
   * a parameter server worker's pushes and wait for parameters, a pipeline
   * stage's waits for its neighbours */
  static const char *const names[] = {"dtrain_step_seconds", "dtrain_allreduce_seconds",
                                      "dtrain_ps_push_seconds", "dtrain_ps_pull_wait_seconds",
                                      "dtrain_pipeline_recv_seconds",
                                      "dtrain_pipeline_send_wait_seconds"};
  static const char *const titles[] = {
      "Step time, fraction of steps per histogram bucket",
      "Gradient bucket allreduce time, fraction per bucket",
      "Parameter server push time (one key), fraction per bucket",
      "Parameter server wait for parameters (end of step), fraction per bucket",
      "Pipeline receive wait (activations or gradients), fraction per bucket",
      "Pipeline send wait, fraction per bucket"};
  const int nnames = (int)(sizeof names / sizeof names[0]);
  char p[4200];
  struct dt_obs_page *pg = malloc(sizeof *pg);
  int any = 0;
  for (int m = 0; pg && m < nnames; m++) {
    series s[MAXS];
    double xs[MAXS][DT_OBS_MAX_BOUNDS + 1], ys[MAXS][DT_OBS_MAX_BOUNDS + 1];
    char nm[MAXS][32];
    int ns = 0;
    for (int r = 0; r < 1024 && ns < MAXS; r++) {
      snprintf(p, sizeof p, "%s/obs/rank-%d", dir, r);
      if (dt__obs_read(p, pg) < 0) break;
      if (pg->rank != r) continue; /* an old name of a page renumbered by elastic re-forming */
      uint32_t k = atomic_load(&pg->nmetrics);
      for (uint32_t i = 0; i < k; i++) {
        const struct dt_obs_slot *sl = &pg->slot[i];
        if (strcmp(sl->name, names[m]) || sl->type != DT_OBS_HISTOGRAM || !sl->nbounds) continue;
        uint64_t tot = 0;
        for (uint32_t b = 0; b <= sl->nbounds; b++) tot += atomic_load(&((struct dt_obs_slot *)sl)->bucket[b]);
        if (!tot) continue;
        int n = 0;
        for (uint32_t b = 0; b < sl->nbounds; b++) {
          xs[ns][n] = log10(sl->bounds[b]);
          ys[ns][n++] = (double)atomic_load(&((struct dt_obs_slot *)sl)->bucket[b]) / (double)tot;
        }
        snprintf(nm[ns], sizeof nm[ns], "rank %d", r);
        s[ns] = (series){nm[ns], n, xs[ns], ys[ns]};
        ns++;
      }
    }
    if (!ns) continue;
    if (!any++) fputs("<h2>Time distributions (metrics)</h2>\n<div class=\"row\">", f);
    line_chart(f, titles[m], "log10(upper bound, seconds)", "fraction", s, ns);
  }
  if (any) fputs("</div>\n", f);
  free(pg);
}

static void text_section(FILE *f, const char *dir, const char *file, const char *title,
                         size_t max) {
  char p[4200];
  snprintf(p, sizeof p, "%s/%s", dir, file);
  char *t = slurp(p, max);
  if (!t) return;
  fprintf(f, "<h2>%s</h2>\n<pre>", title);
  esc(f, t);
  fputs("</pre>\n", f);
  free(t);
}

int dt_obs_report(const char *run_dir, const char *out_path) {
  if (!run_dir || !out_path) return dt__seterr(DT_EINVAL, "report: %s is NULL", run_dir ? "output" : "run directory");
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp", out_path);
  FILE *f = fopen(tmp, "w");
  if (!f) return dt__seterr(DT_EIO, "report: %s: %s", tmp, strerror(errno));
  fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>dtrain report: ", f);
  esc(f, run_dir);
  fputs("</title><style>body{font-family:sans-serif;margin:24px;color:#222}"
        "figure{display:inline-block;margin:8px}figcaption{font-size:12px;text-align:center}"
        "table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #ddd;padding:2px 8px;"
        "text-align:left}pre{background:#f6f6f6;padding:8px;font-size:12px;overflow:auto;"
        "max-height:400px}.diag{color:#b00}</style></head><body>\n<h1>dtrain report</h1>\n<p>", f);
  esc(f, run_dir);
  fputs("</p>\n", f);
  char p[4200];
  snprintf(p, sizeof p, "%s/diagnosis.txt", run_dir);
  char *diag = slurp(p, 1 << 16);
  if (diag) {
    fputs("<h2 class=\"diag\">Hang diagnosis</h2>\n<pre class=\"diag\">", f);
    esc(f, diag);
    fputs("</pre>\n", f);
    free(diag);
  }
  int ev = epochs_section(f, run_dir);
  int su = summary_section(f, run_dir);
  pages_section(f, run_dir);
  text_section(f, run_dir, "obs/flight.txt", "Flight recorder (every rank's last operations)", 1 << 20);
  text_section(f, run_dir, "config.ini", "Configuration", 1 << 20);
  fputs("</body></html>\n", f);
  int bad = ferror(f);
  if (fclose(f) != 0 || bad) {
    remove(tmp);
    return dt__seterr(DT_EIO, "report: writing %s failed", tmp);
  }
  if (!ev && !su) {
    remove(tmp);
    return dt__seterr(DT_ENOENT, "report: %s has no events.jsonl, summary.json or failure.json "
                      "(not a dtrain run directory?)", run_dir);
  }
  if (rename(tmp, out_path) < 0) {
    int e = errno;
    remove(tmp);
    return dt__seterr(DT_EIO, "report: %s: %s", out_path, strerror(e));
  }
  return DT_OK;
}
