/*
 * cmd_report.c — `dtrain report RUN_DIR [--out FILE]`: writes one
 * self-contained HTML file (RUN_DIR/report.html unless --out says
 * otherwise) with the run's charts, numbers, hang diagnosis and
 * configuration; src/obs/report.c does the work. Exit 2 for bad usage or a
 * directory that is not a run's, 1 when the file cannot be written.
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "obs/obs_diag.h"

static void report_usage(FILE *f) {
  fprintf(f, "usage: dtrain report RUN_DIR [--out FILE]\n"
             "\n"
             "Writes RUN_DIR/report.html (or FILE): one self-contained HTML page, no\n"
             "network needed, with loss and accuracy per epoch, samples/s over time,\n"
             "per-rank step-time breakdown and stragglers, communication volume, time\n"
             "distributions from the metrics, the hang diagnosis if there was one, the\n"
             "summary and the configuration (docs/observability.md).\n");
}

int dt__cmd_report(int argc, char **argv) {
  const char *dir = NULL, *out = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      report_usage(stdout);
      return DT_EXIT_OK;
    }
    if (!strcmp(a, "--out")) {
      if (i + 1 >= argc || !*argv[i + 1]) {
        fprintf(stderr, "dtrain: report: --out: missing file name\n");
        return DT_EXIT_USAGE;
      }
      out = argv[++i];
    } else if (!strncmp(a, "--out=", 6) && a[6]) {
      out = a + 6;
    } else if (a[0] == '-' && a[1]) {
      fprintf(stderr, "dtrain: report: unknown option '%s' (see dtrain report --help)\n", a);
      return DT_EXIT_USAGE;
    } else if (dir) {
      fprintf(stderr, "dtrain: report: more than one RUN_DIR given ('%s')\n", a);
      return DT_EXIT_USAGE;
    } else {
      dir = a;
    }
  }
  if (!dir) {
    report_usage(stderr);
    return DT_EXIT_USAGE;
  }
  char path[DT_CFG_PATH_MAX + 16];
  if (!out) {
    snprintf(path, sizeof path, "%s/report.html", dir);
    out = path;
  }
  int rc = dt_obs_report(dir, out);
  if (rc < 0) {
    fprintf(stderr, "dtrain: %s\n", dt_errmsg());
    return rc == DT_ENOENT || rc == DT_EINVAL ? DT_EXIT_USAGE : DT_EXIT_FAIL;
  }
  printf("report: %s\n", out);
  return DT_EXIT_OK;
}
