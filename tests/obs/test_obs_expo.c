/*
 * test_obs_expo.c — the Prometheus text exposition (format 0.0.4) of
 * several ranks' pages, checked line by line against the format: the text
 * ends with a newline; every line is a comment (# HELP / # TYPE) or a
 * sample "name{labels} value"; exactly one HELP and one TYPE line per
 * name, before its samples; label values escaped (backslash, quote,
 * newline); every sample carries job, rank and host; histogram buckets
 * cumulative and non-decreasing with le="+Inf" last and equal to _count;
 * counters and gauges with the values written. Also a metric that only
 * some ranks have, and an empty set of pages.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "obs/obs_diag.h"
#include "obs/obs_int.h"

static char *expose(dt_obs **o, int n) {
  struct dt_obs_page *pg = calloc((size_t)n, sizeof *pg);
  for (int i = 0; i < n; i++) assert_int_equal(dt__obs_parse(o[i]->pg, sizeof *pg, &pg[i]), DT_OK);
  char *buf = NULL;
  size_t len = 0, cap = 0;
  assert_int_equal(dt_obs_expose(pg, n, &buf, &len, &cap), DT_OK);
  free(pg);
  assert_non_null(buf);
  assert_int_equal(strlen(buf), len);
  return buf;
}

/* Parses one sample line: name, the label text between braces, value. */
static void sample(const char *line, char *name, char *labels, double *v) {
  const char *b = strchr(line, '{'), *e = strrchr(line, '}');
  assert_non_null(b);
  assert_non_null(e);
  memcpy(name, line, (size_t)(b - line));
  name[b - line] = '\0';
  memcpy(labels, b + 1, (size_t)(e - b - 1));
  labels[e - b - 1] = '\0';
  assert_true(e[1] == ' ');
  const char *t = e + 2;
  if (!strcmp(t, "+Inf")) *v = INFINITY;
  else if (!strcmp(t, "NaN")) *v = NAN;
  else {
    char *end;
    *v = strtod(t, &end);
    assert_true(*end == '\0');
  }
}

/* Checks the whole text; returns the number of sample lines. */
static int check_format(char *text) {
  size_t n = strlen(text);
  assert_true(n > 0 && text[n - 1] == '\n');
  char types[64][64];
  int ntypes = 0, samples = 0;
  char cur[64] = "";
  double last_bucket = -1, prev_le = -INFINITY;
  for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
    if (!strncmp(line, "# HELP ", 7)) continue;
    if (!strncmp(line, "# TYPE ", 7)) {
      char name[64], type[32];
      assert_int_equal(sscanf(line + 7, "%63s %31s", name, type), 2);
      for (int i = 0; i < ntypes; i++) assert_string_not_equal(types[i], name); /* once */
      snprintf(types[ntypes++], 64, "%s", name);
      assert_true(!strcmp(type, "counter") || !strcmp(type, "gauge") || !strcmp(type, "histogram"));
      snprintf(cur, sizeof cur, "%s", name);
      last_bucket = -1;
      prev_le = -INFINITY;
      continue;
    }
    assert_true(line[0] != '#');
    char name[128], labels[512];
    double v;
    sample(line, name, labels, &v);
    samples++;
    assert_int_equal(strncmp(name, cur, strlen(cur)), 0); /* under its TYPE line */
    assert_non_null(strstr(labels, "job=\""));
    assert_non_null(strstr(labels, ",rank=\""));
    assert_non_null(strstr(labels, ",host=\""));
    const char *suf = name + strlen(cur);
    if (!strcmp(suf, "_bucket")) {
      const char *le = strstr(labels, "le=\"");
      assert_non_null(le);
      double lv = !strncmp(le + 4, "+Inf", 4) ? INFINITY : strtod(le + 4, NULL);
      if (lv < prev_le) last_bucket = -1; /* the next rank's buckets */
      else assert_true(v >= last_bucket);  /* cumulative */
      prev_le = lv;
      last_bucket = v;
    } else if (!strcmp(suf, "_count")) {
      assert_true(isinf(prev_le)); /* +Inf came last ... */
      assert_true(v == last_bucket); /* ... and equals _count */
      prev_le = -INFINITY;
      last_bucket = -1;
    }
  }
  return samples;
}

static void test_expo(void **st) {
  (void)st;
  dt_obs *o[3];
  for (int r = 0; r < 3; r++) {
    /* a job name with a quote, a backslash and a newline */
    assert_int_equal(dt_obs_open(&o[r], NULL, r, 3, "a\"b\\c\nd", "node-1"), DT_OK);
    dt_obs_add(dt_obs_counter(o[r], "dtrain_samples_total", "Samples \\ seen\nby a rank"), 100 + r);
    dt_obs_set(dt_obs_gauge(o[r], "dtrain_train_loss", "Loss"), 0.5 * r);
    double b[] = {0.001, 0.01, 0.1};
    dt_obs_metric *h = dt_obs_histogram(o[r], "dtrain_step_seconds", "Step", b, 3);
    for (int i = 0; i < 10; i++) dt_obs_observe(h, 0.002 * i * (r + 1));
  }
  dt_obs_set(dt_obs_gauge(o[2], "dtrain_straggler", "only rank 2 has it"), 1);
  char *text = expose(o, 3);
  print_message("%s", text);
  assert_non_null(strstr(text, "dtrain_samples_total{job=\"a\\\"b\\\\c\\nd\",rank=\"1\",host=\"node-1\"} 101\n"));
  assert_non_null(strstr(text, "# HELP dtrain_samples_total Samples \\\\ seen by a rank\n"));
  assert_non_null(strstr(text, "dtrain_train_loss{job=\"a\\\"b\\\\c\\nd\",rank=\"2\",host=\"node-1\"} 1\n"));
  assert_non_null(strstr(text, "dtrain_step_seconds_bucket{job=\"a\\\"b\\\\c\\nd\",rank=\"0\",host=\"node-1\",le=\"0.001\"} 1\n"));
  assert_non_null(strstr(text, "dtrain_step_seconds_count{job=\"a\\\"b\\\\c\\nd\",rank=\"0\",host=\"node-1\"} 10\n"));
  assert_non_null(strstr(text, "# TYPE dtrain_straggler gauge\n"));
  int n = check_format(text);
  /* 3 counters + 3 gauges + 3 x (4 buckets + sum + count) + 1 + 3 rss */
  assert_int_equal(n, 3 + 3 + 18 + 1 + 3);
  free(text);
  for (int r = 0; r < 3; r++) dt_obs_close(o[r]);
}

/* Values print as the shortest text that reads back exactly: whole numbers
 * as integers, 0.1 + 0.2 with all 17 digits, small and huge ones in %g
 * form; each line's number parses back to the very double stored. */
static void test_expo_numbers(void **st) {
  (void)st;
  dt_obs *o;
  assert_int_equal(dt_obs_open(&o, NULL, 0, 1, "j", "h"), DT_OK);
  static const struct { const char *name; double v; const char *text; } c[] = {
      {"n_int", 123456789, "123456789"}, {"n_neg", -3, "-3"},     {"n_zero", 0, "0"},
      {"n_tenth", 0.1, "0.1"},           {"n_small", 2.5e-4, "0.00025"},
      {"n_17", 0.1 + 0.2, "0.30000000000000004"},
      {"n_big", 2.5e20, "2.5e+20"},      {"n_frac", 1.0 / 3, "0.3333333333333333"},
      {"n_2p53", 9007199254740993.0, "9007199254740992"}};
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) dt_obs_set(dt_obs_gauge(o, c[i].name, "x"), c[i].v);
  char *text = expose(&o, 1), want[160];
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    snprintf(want, sizeof want, "\n%s{job=\"j\",rank=\"0\",host=\"h\"} %s\n", c[i].name, c[i].text);
    if (!strstr(text, want)) print_error("missing: %s", want);
    assert_non_null(strstr(text, want));
    assert_true(strtod(c[i].text, NULL) == c[i].v); /* the text served reads back exactly */
  }
  check_format(text);
  free(text);
  dt_obs_close(o);
}

static void test_expo_empty(void **st) {
  (void)st;
  char *buf = NULL;
  size_t len = 0, cap = 0;
  assert_int_equal(dt_obs_expose(NULL, 0, &buf, &len, &cap), DT_OK);
  assert_int_equal(len, 0);
  free(buf);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_expo),
      cmocka_unit_test(test_expo_numbers),
      cmocka_unit_test(test_expo_empty),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
