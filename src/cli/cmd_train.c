/*
 * cmd_train.c — `dtrain train [CONFIG] [--set section.key=value ...]
 * [--out DIR] [--workers N]`: builds the configuration (defaults, then the
 * file, then the overrides in order), validates it, hands it to the engine
 * and reports progress: a bar redrawn in place when stderr or stdout is a
 * terminal, one line per epoch otherwise, and a final line with test
 * accuracy and throughput.
 *
 * Bad input of any kind (arguments, config, data files, model) ends with one
 * line on stderr and exit status 2 before anything is written; failures
 * during training give 1. It never writes summary.json itself.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/config.h"
#include "core/core.h"
#include "engine/engine.h"

static void train_usage(FILE *f) {
  fprintf(f,
          "usage: dtrain train [CONFIG] [--set section.key=value ...] [--out DIR] [--workers N]\n"
          "\n"
          "Trains the model of CONFIG (an INI file; without it the built-in CNN on\n"
          "Fashion-MNIST, as in examples/fashion_cnn.ini) and writes DIR/summary.json,\n"
          "DIR/events.jsonl and DIR/config.ini (the effective configuration).\n"
          "\n"
          "  --set section.key=value  override one config key (repeatable), e.g.\n"
          "                           --set optim.lr=0.1 --set train.epochs=5\n"
          "  --out DIR                output directory (default runs/<date>-<time>)\n"
          "  --workers N              worker processes (only 1 for now)\n"
          "  -h, --help               this help\n"
          "\n"
          "Config keys and their defaults (docs/config.md explains each):\n");
  char buf[DT_CFG_SPEC_MAX + 64];
  for (int i = 0; dt_config_key_name(i, buf, sizeof buf); i++) fprintf(f, "  %s\n", buf);
}

static int bad(const char *fmt, const char *arg) {
  fprintf(stderr, "dtrain: ");
  fprintf(stderr, fmt, arg);
  fputc('\n', stderr);
  return DT_EXIT_USAGE;
}

static void default_out_dir(char *buf, size_t cap) {
  time_t t = time(NULL);
  struct tm tm;
  localtime_r(&t, &tm);
  char stamp[32];
  strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  snprintf(buf, cap, "runs/%s", stamp);
  struct stat st;
  for (int i = 2; stat(buf, &st) == 0 && i < 1000; i++) snprintf(buf, cap, "runs/%s-%d", stamp, i);
}

/* ---- progress ------------------------------------------------------------- */

typedef struct view {
  FILE *bar;       /* terminal stream for the bar, or NULL */
  double last;     /* time of the last redraw */
  int drawn;       /* a bar is on screen */
} view;

static void on_step(void *ud, const dt_progress *p) {
  view *v = ud;
  if (!v->bar) return;
  double now = dt_now();
  if (now - v->last < 0.1 && p->step_in_epoch != p->steps_per_epoch) return;
  v->last = now;
  enum { W = 30 };
  int fill = p->steps_per_epoch ? (int)(W * p->step_in_epoch / p->steps_per_epoch) : W;
  char bar[W + 1];
  for (int i = 0; i < W; i++) bar[i] = i < fill ? '#' : '.';
  bar[W] = '\0';
  fprintf(v->bar, "\r\033[Kepoch %d/%d [%s] %lld/%lld loss %.4f %.0f samples/s", p->epoch,
          p->epochs, bar, (long long)p->step_in_epoch, (long long)p->steps_per_epoch, p->loss,
          p->samples_per_second);
  fflush(v->bar);
  v->drawn = 1;
}

static void on_epoch(void *ud, const dt_epoch_report *r) {
  view *v = ud;
  if (v->bar && v->drawn) {
    fprintf(v->bar, "\r\033[K");
    fflush(v->bar);
    v->drawn = 0;
  }
  if (r->evaluated)
    printf("epoch %d  train_loss %.4f  test_loss %.4f  test_acc %.4f  %.0f samples/s  lr %.4g  "
           "%.1fs\n", r->epoch, r->train_loss, r->test_loss, r->test_accuracy,
           r->samples_per_second, r->lr, r->time);
  else
    printf("epoch %d  train_loss %.4f  %.0f samples/s  lr %.4g  %.1fs\n", r->epoch, r->train_loss,
           r->samples_per_second, r->lr, r->time);
  fflush(stdout);
}

/* ---- the command ------------------------------------------------------------ */

int dt__cmd_train(int argc, char **argv) {
  const char *config_path = NULL, *out = NULL;
  const char *sets[256];
  int nsets = 0, workers = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *val = NULL;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      train_usage(stdout);
      return DT_EXIT_OK;
    }
    const char *opts[] = {"--set", "--out", "--workers"};
    int which = -1;
    for (int j = 0; j < 3; j++) {
      size_t n = strlen(opts[j]);
      if (!strncmp(a, opts[j], n) && (a[n] == '\0' || a[n] == '=')) {
        which = j;
        if (a[n] == '=') val = a + n + 1;
        else if (i + 1 < argc) val = argv[++i];
        else return bad("%s: missing value (see dtrain train --help)", opts[j]);
      }
    }
    if (which == 0) {
      if (nsets == (int)(sizeof sets / sizeof sets[0])) return bad("%s: too many --set options", a);
      sets[nsets++] = val;
    } else if (which == 1) {
      if (!*val) return bad("--out: empty directory name%s", "");
      out = val;
    } else if (which == 2) {
      char *end;
      errno = 0;
      long w = strtol(val, &end, 10);
      if (end == val || *end || errno || w < 1 || w > 4096)
        return bad("--workers '%s': expects a positive integer", val);
      workers = (int)w;
    } else if (a[0] == '-' && a[1]) {
      return bad("train: unknown option '%s' (see dtrain train --help)", a);
    } else if (config_path) {
      return bad("train: more than one CONFIG given ('%s')", a);
    } else {
      config_path = a;
    }
  }

  /* Configuration: defaults, file, --workers, --set in order, validation. */
  dt_config *cfg = malloc(sizeof *cfg);
  if (!cfg) return bad("%s", "out of memory");
  dt_config_init(cfg);
  int rc = DT_OK;
  if (config_path) rc = dt_config_load(cfg, config_path);
  if (rc == DT_OK && workers) {
    char w[32];
    snprintf(w, sizeof w, "dist.workers=%d", workers);
    rc = dt_config_set(cfg, w);
  }
  for (int i = 0; rc == DT_OK && i < nsets; i++) rc = dt_config_set(cfg, sets[i]);
  if (rc == DT_OK) rc = dt_config_validate(cfg);
  if (rc == DT_OK && cfg->run.workers != 1) {
    fprintf(stderr, "dtrain: %s%d: multiple workers are not yet supported (use 1)\n",
            workers ? "--workers " : "dist.workers = ", cfg->run.workers);
    free(cfg);
    return DT_EXIT_USAGE;
  }
  if (rc < 0) {
    fprintf(stderr, "dtrain: %s\n", dt_errmsg());
    free(cfg);
    return rc == DT_ENOMEM ? DT_EXIT_FAIL : DT_EXIT_USAGE;
  }
  size_t need = dt_config_dump(cfg, NULL, 0);
  char *text = malloc(need + 1);
  if (!text) {
    free(cfg);
    return bad("%s", "out of memory");
  }
  dt_config_dump(cfg, text, need + 1);

  /* Everything that can be bad input is checked here, before any output. */
  dt_engine *e = NULL;
  rc = dt_engine_create(&e, &cfg->run);
  if (rc < 0) {
    fprintf(stderr, "dtrain: %s\n", dt_errmsg());
    free(text);
    free(cfg);
    return rc == DT_ENOMEM ? DT_EXIT_FAIL : DT_EXIT_USAGE;
  }

  char outbuf[DT_CFG_PATH_MAX];
  if (!out) {
    default_out_dir(outbuf, sizeof outbuf);
    out = outbuf;
  }
  /* An output directory that cannot be made is bad input too. */
  rc = dt_mkdirs(out);
  if (rc < 0) {
    fprintf(stderr, "dtrain: --out: %s\n", dt_errmsg());
    dt_engine_destroy(e);
    free(text);
    free(cfg);
    return DT_EXIT_USAGE;
  }
  view v = {NULL, 0, 0};
  if (isatty(STDERR_FILENO)) v.bar = stderr;
  else if (isatty(STDOUT_FILENO)) v.bar = stdout;
  printf("dtrain %s: %s, %zu parameters, %lld train / %lld test samples, %d epochs, batch %d "
         "-> %s\n", dt_version(), cfg->run.layers, dt_model_nparams(dt_engine_model(e)),
         (long long)dt_engine_train_samples(e), (long long)dt_engine_test_samples(e),
         cfg->run.epochs, cfg->run.batch, out);
  fflush(stdout);
  dt_engine_hooks hooks = {on_step, on_epoch, &v};
  dt_run_summary s;
  rc = dt_engine_run(e, out, text, &hooks, &s);
  if (v.bar && v.drawn) fprintf(v.bar, "\r\033[K");
  int status = DT_EXIT_OK;
  if (rc < 0) {
    fprintf(stderr, "dtrain: %s\n", dt_errmsg());
    status = DT_EXIT_FAIL;
  } else {
    printf("test accuracy %.4f  test loss %.4f  %.0f samples/s  %.2f GFLOP/s  (%lld steps, %.1f s "
           "training)  summary: %s/summary.json\n", s.test_accuracy, s.test_loss,
           s.samples_per_second, s.gflops, (long long)s.steps, s.train_seconds, out);
  }
  dt_engine_destroy(e);
  free(text);
  free(cfg);
  return status;
}
