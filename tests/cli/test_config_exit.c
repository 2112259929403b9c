/*
 * test_config_exit.c — exit statuses of `dtrain train` for config errors,
 * in process through dt_cli_main: each kind of bad config returns 2, prints
 * exactly one line on stderr naming file:line (or --set) and the key, and
 * creates no output directory. Usage errors return 2, help returns 0.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "cli/cli.h"

static char dir[128];

static int setup(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/dt_test_cfgexit_XXXXXX");
  return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd) ? -1 : 0;
}

/* Runs dt_cli_main with stderr captured; returns the status and the text. */
static int run(char *err, size_t cap, int argc, char **argv) {
  char path[256];
  snprintf(path, sizeof path, "%s/stderr", dir);
  fflush(stderr);
  int saved = dup(2);
  FILE *f = fopen(path, "w+");
  assert_non_null(f);
  dup2(fileno(f), 2);
  int rc = dt_cli_main(argc, argv);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  rewind(f);
  size_t n = fread(err, 1, cap - 1, f);
  err[n] = '\0';
  fclose(f);
  return rc;
}

static void write_ini(const char *name, const char *text, char *path, size_t cap) {
  snprintf(path, cap, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static int count_lines(const char *s) {
  int n = 0;
  for (; *s; s++) n += *s == '\n';
  return n;
}

static void expect(const char *ini, const char *set, const char *want_fmt) {
  char path[256], out[256], err[2048], want[512];
  write_ini("c.ini", ini, path, sizeof path);
  snprintf(out, sizeof out, "%s/out", dir);
  char *argv[8] = {"dtrain", "train", path, "--out", out, NULL, NULL, NULL};
  int argc = 5;
  if (set) {
    argv[argc++] = "--set";
    argv[argc++] = (char *)set;
  }
  int rc = run(err, sizeof err, argc, argv);
  snprintf(want, sizeof want, want_fmt, path);
  if (rc != 2 || count_lines(err) != 1 || !strstr(err, want))
    fail_msg("ini:\n%s\n--set %s\nstatus %d, stderr '%s', want '%s'", ini, set ? set : "-", rc,
             err, want);
  struct stat st;
  assert_int_not_equal(stat(out, &st), 0);
}

static void test_config_errors_exit_2(void **state) {
  (void)state;
  expect("[train]\n[nope]\n", NULL, "%s:2: unknown section [nope]");
  expect("[optim]\nlr = 0.1\nrate = 2\n", NULL, "%s:3: unknown key 'rate' in [optim]");
  expect("[optim]\nlr = abc\n", NULL, "%s:2: optim.lr: not a number: 'abc'");
  expect("[optim]\nlr = 0\n", NULL, "%s:2: optim.lr: must be in (0, 1e+06] (got 0)");
  expect("[train]\nbatch = 0\n", NULL, "%s:2: train.batch: must be in [1, 65536] (got 0)");
  expect("[train]\nepochs = 0\n", NULL, "%s:2: train.epochs: must be");
  expect("[train]\nepochs\n", NULL, "%s:2: malformed line");
  expect("lr = 1\n", NULL, "%s:1: key 'lr' outside any [section]");
  expect("[train]\nbatch = 2\nbatch = 2\n", NULL, "%s:3: train.batch: given twice (first at line 2)");
  expect("[optim]\nmomentum = 0\nnesterov = yes\n", NULL, "%s:3: optim.nesterov");
  expect("[train]\nepochs = 1\n", "optim.lr=x", "dtrain: --set optim.lr: not a number: 'x'");
  expect("[train]\nepochs = 1\n", "optim.lr=-1", "dtrain: --set optim.lr: must be in (0, 1e+06] (got -1)");
  expect("[train]\nepochs = 1\n", "train.nope=1", "dtrain: --set train.nope: unknown key");
}

static void test_usage(void **state) {
  (void)state;
  char err[2048];
  char *a1[] = {"dtrain", "train", "/nonexistent/c.ini", NULL};
  assert_int_equal(run(err, sizeof err, 3, a1), 2);
  assert_non_null(strstr(err, "config '/nonexistent/c.ini': No such file or directory"));
  char *a2[] = {"dtrain", "train", "--workers", "0", NULL};
  assert_int_equal(run(err, sizeof err, 4, a2), 2);
  assert_non_null(strstr(err, "--workers '0': expects a positive integer"));
  char *a3[] = {"dtrain", NULL};
  assert_int_equal(run(err, sizeof err, 1, a3), 2);
  char *a4[] = {"dtrain", "train", "--out", NULL};
  assert_int_equal(run(err, sizeof err, 3, a4), 2);
  assert_non_null(strstr(err, "--out: missing value"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config_errors_exit_2),
      cmocka_unit_test(test_usage),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
