/*
 * cmd_train.c — `dtrain train [CONFIG] [--set section.key=value ...]
 * [--out DIR] [--workers N]`: builds the configuration (defaults, then the
 * file, then the overrides in order), validates it, hands it to the engine
 * and reports progress: a bar redrawn in place when stderr or stdout is a
 * terminal, one line per epoch otherwise, and a final line with test
 * accuracy and throughput.
 *
 * With --workers N > 1 it loads and checks everything once, then forks N (local_job.c)
 * worker processes (they share the loaded data copy-on-write) that join
 * through a TCP store on 127.0.0.1 (ephemeral port, fresh job token) with
 * transport auto (shm on one host) and train data-parallel; rank 0 prints
 * and writes the one summary.json. The parent only waits: when a worker
 * fails or dies, the others get a grace period to report the lost rank and
 * exit, then are SIGKILLed by pid; workers die with the parent
 * (PR_SET_PDEATHSIG). `dtrain launch` and mpirun are not handled here yet.
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
#include "comm/comm.h"
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
          "  --workers N              local worker processes, data parallel (docs/ddp.md)\n"
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

static void final_line(const dt_run_summary *s, const char *out) {
  printf("test accuracy %.4f  test loss %.4f  %.0f samples/s  %.2f GFLOP/s  (%lld steps, %.1f s "
         "training)  summary: %s/summary.json\n", s->test_accuracy, s->test_loss,
         s->samples_per_second, s->gflops, (long long)s->steps, s->train_seconds, out);
}

/* ---- local workers ------------------------------------------------------------ */

/* One worker process: join the job, train, report. Returns its exit status. */
static int worker_main(dt_engine *e, int r, int n, int port, const char *token, const char *out,
                       const char *text, view *v) {
  double timeout = (double)dt_param_int("DTRAIN_TIMEOUT", 60);
  dt_store *st = NULL;
  dt_comm *c = NULL;
  struct dt_comm_config cc = DT_COMM_CONFIG_INIT;
  cc.transport = dt_param_str("DTRAIN_TRANSPORT", "auto");
  cc.rank = r;
  cc.size = n;
  cc.job = "train";
  cc.token = token;
  cc.timeout_s = timeout > 0 ? timeout : 60;
  if (dt_store_connect(&st, "127.0.0.1", port, token, cc.timeout_s) < 0 ||
      dt_comm_create(&c, st, &cc) < 0) {
    fprintf(stderr, "dtrain: rank %d: joining the job: %s\n", r, dt_errmsg());
    dt_store_destroy(st);
    return DT_EXIT_FAIL;
  }
  dt_store_destroy(st);
  int rc = dt_engine_set_comm(e, c);
  dt_engine_hooks hooks = {NULL, NULL, NULL};
  if (r == 0) hooks = (dt_engine_hooks){on_step, on_epoch, v};
  dt_run_summary s;
  if (rc == DT_OK) rc = dt_engine_run(e, out, text, &hooks, &s);
  if (r == 0 && v->bar && v->drawn) fprintf(v->bar, "\r\033[K");
  int status = DT_EXIT_OK;
  if (rc < 0) {
    const char *m = dt_errmsg();
    /* messages from the engine already name this rank */
    if (!strncmp(m, "rank ", 5)) fprintf(stderr, "dtrain: %s\n", m);
    else fprintf(stderr, "dtrain: rank %d: %s\n", r, m);
    status = rc == DT_EMISMATCH ? DT_EXIT_USAGE : DT_EXIT_FAIL;
  } else if (r == 0) {
    final_line(&s, out);
  }
  fflush(stdout);
  fflush(stderr);
  dt_comm_destroy(c);
  return status;
}

struct worker_args {
  dt_engine *e;
  const char *out, *text;
  view *v;
};

static int run_worker(int r, int n, int port, const char *token, void *arg) {
  struct worker_args *w = arg;
  return worker_main(w->e, r, n, port, token, w->out, w->text, w->v);
}

static int run_workers(dt_engine *e, int n, const char *out, const char *text, view *v) {
  struct worker_args w = {e, out, text, v};
  return dt__local_job_run(n, run_worker, &w,
                           (double)dt_param_int("DTRAIN_GRACE_SECONDS", 8), 1);
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
  char wk[48] = "";
  if (cfg->run.workers > 1)
    snprintf(wk, sizeof wk, " (global, %d workers)", cfg->run.workers);
  printf("dtrain %s: %s, %zu parameters, %lld train / %lld test samples, %d epochs, batch %d%s "
         "-> %s\n", dt_version(), cfg->run.layers, dt_model_nparams(dt_engine_model(e)),
         (long long)dt_engine_train_samples(e), (long long)dt_engine_test_samples(e),
         cfg->run.epochs, cfg->run.batch, wk, out);
  fflush(stdout);
  if (cfg->run.workers > 1) {
    int st = run_workers(e, cfg->run.workers, out, text, &v);
    dt_engine_destroy(e);
    free(text);
    free(cfg);
    return st;
  }
  dt_engine_hooks hooks = {on_step, on_epoch, &v};
  dt_run_summary s;
  rc = dt_engine_run(e, out, text, &hooks, &s);
  if (v.bar && v.drawn) fprintf(v.bar, "\r\033[K");
  int status = DT_EXIT_OK;
  if (rc < 0) {
    fprintf(stderr, "dtrain: %s\n", dt_errmsg());
    status = DT_EXIT_FAIL;
  } else {
    final_line(&s, out);
  }
  dt_engine_destroy(e);
  free(text);
  free(cfg);
  return status;
}
