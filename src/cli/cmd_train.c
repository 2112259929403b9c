/*
 * cmd_train.c — `dtrain train [CONFIG] [--set section.key=value ...]
 * [--out DIR] [--workers N]`: builds the configuration (defaults, then the
 * file, then the overrides in order), validates it, hands it to the engine
 * and reports progress: a bar redrawn in place when stderr or stdout is a
 * terminal, one line per epoch otherwise, and a final line with test
 * accuracy and throughput.
 *
 * With --workers N > 1 it loads and checks everything once, then forks N
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
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
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

static void make_token(char *hex, size_t cap) {
  unsigned char raw[16] = {0};
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t n = read(fd, raw, sizeof raw);
    (void)n;
    close(fd);
  }
  uint64_t t = (uint64_t)dt_now_ns() ^ ((uint64_t)getpid() << 32);
  for (size_t i = 0; i < 8; i++) raw[i] ^= (unsigned char)(t >> (8 * i));
  for (size_t i = 0; i < sizeof raw && 2 * i + 2 < cap; i++) snprintf(hex + 2 * i, 3, "%02x", raw[i]);
}

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

/* Waits for every worker. After the first failure the rest get `grace`
 * seconds to notice the lost peer and exit, then are killed. Returns the
 * exit status of the job. */
static int reap_workers(pid_t *pids, int n, double grace) {
  int left = n, status = DT_EXIT_OK;
  double kill_at = 0;
  while (left > 0) {
    int st;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p > 0) {
      for (int r = 0; r < n; r++) {
        if (pids[r] != p) continue;
        pids[r] = 0;
        left--;
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) break;
        if (WIFSIGNALED(st))
          fprintf(stderr, "dtrain: worker rank %d (pid %d) was killed by signal %d%s\n", r,
                  (int)p, WTERMSIG(st), status ? "" : "; stopping the other workers");
        if (status == DT_EXIT_OK) {
          kill_at = dt_now() + grace;
          status = WIFEXITED(st) && WEXITSTATUS(st) == DT_EXIT_USAGE ? DT_EXIT_USAGE
                                                                     : DT_EXIT_FAIL;
        }
        break;
      }
      continue;
    }
    if (p < 0 && errno != EINTR) break;
    if (status != DT_EXIT_OK && dt_now() > kill_at) {
      for (int r = 0; r < n; r++)
        if (pids[r] > 0) {
          fprintf(stderr, "dtrain: worker rank %d (pid %d) did not exit within %.0f s; killing "
                  "it\n", r, (int)pids[r], grace);
          kill(pids[r], SIGKILL);
        }
      kill_at = dt_now() + 3600; /* report once; waitpid reaps them next */
    }
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  return status;
}

static int run_workers(dt_engine *e, int n, const char *out, const char *text, view *v) {
  char token[40] = {0};
  make_token(token, sizeof token);
  pid_t *pids = calloc((size_t)n, sizeof *pids);
  int pfd[2];
  if (!pids || pipe(pfd)) {
    free(pids);
    fprintf(stderr, "dtrain: out of resources\n");
    return DT_EXIT_FAIL;
  }
  pid_t parent = getpid();
  fflush(stdout);
  fflush(stderr);
  /* Fork while this process has one thread: the store server's thread must
   * not exist yet, or a child could inherit a lock it holds (OpenSSL's,
   * say). The workers learn the store's port through the pipe; port 0 (or
   * the parent's death, which closes the pipe) tells them to quit. */
  int started = 0;
  for (int r = 0; r < n; r++) {
    pid_t p = fork();
    if (p == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      close(pfd[1]);
      int port = 0;
      ssize_t got = read(pfd[0], &port, sizeof port);
      close(pfd[0]);
      if (getppid() != parent || got != (ssize_t)sizeof port || port <= 0) _exit(DT_EXIT_FAIL);
      _exit(worker_main(e, r, n, port, token, out, text, v));
    }
    if (p < 0) {
      fprintf(stderr, "dtrain: fork: %s\n", strerror(errno));
      break;
    }
    pids[r] = p;
    started++;
  }
  close(pfd[0]);
  dt_store_server *srv = NULL;
  int port = 0;
  if (started == n && dt_store_server_start(&srv, "127.0.0.1", 0, token) == DT_OK)
    port = dt_store_server_port(srv);
  else if (started == n)
    fprintf(stderr, "dtrain: store: %s\n", dt_errmsg());
  printf("workers:");
  for (int r = 0; r < started; r++)
    printf(" rank %d pid %d%s", r, (int)pids[r], r + 1 < started ? "," : "");
  printf("\n");
  fflush(stdout);
  for (int r = 0; r < started; r++) {
    ssize_t w = write(pfd[1], &port, sizeof port);
    (void)w;
  }
  close(pfd[1]);
  int status = started < n || port == 0 ? DT_EXIT_FAIL : DT_EXIT_OK;
  int st = reap_workers(pids, started, (double)dt_param_int("DTRAIN_GRACE_SECONDS", 8));
  if (status == DT_EXIT_OK) status = st;
  dt_store_server_stop(srv);
  free(pids);
  return status;
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
