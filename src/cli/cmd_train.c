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
 * through a TCP store on 127.0.0.1 (ephemeral port, fresh job token) over
 * dist.transport (default auto: shm on one host) and train data-parallel; rank 0 prints
 * and writes the one summary.json. The parent only waits: when a worker
 * fails or dies, the others get a grace period to report the lost rank and
 * exit, then are SIGKILLed by pid; workers die with the parent
 * (PR_SET_PDEATHSIG). The transport is dist.transport unless
 * DTRAIN_TRANSPORT overrides it.
 *
 * Launched jobs (docs/launch.md): under `dtrain launch` (cmd_launch.c) the
 * same path forks this node's workers with their global ranks, node 0
 * serving the rendezvous; under mpirun or srun (rank and size in the
 * environment) this process is one rank and meets the others through a
 * store served by rank 0 at DTRAIN_RDZV or a private file store named
 * after the launcher's job id. Either way dist.workers becomes the world
 * size, and only rank 0 prints and writes.
 *
 * Bad input of any kind (arguments, config, data files, model) ends with one
 * line on stderr and exit status 2 before anything is written; failures
 * during training give 1. It never writes summary.json itself.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
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
          "Across machines: dtrain launch ... -- train CONFIG (dtrain launch --help), or\n"
          "mpirun -n N dtrain train CONFIG --set dist.transport=mpi (also srun): every\n"
          "process is one rank, dist.workers becomes the world size (docs/launch.md).\n"
          "DTRAIN_TRANSPORT overrides dist.transport; DTRAIN_TIMEOUT (seconds, default\n"
          "60) bounds every blocking step.\n"
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

/* ---- workers ------------------------------------------------------------------ */

struct worker_args {
  dt_engine *e;
  const char *out, *text;
  const char *transport; /* "auto", "shm", "tcp" or "mpi" */
  double timeout;
  int describe;          /* rank 0 prints which transport reaches which rank */
  view *v;
};

/* "1 shm, 2-3 tcp": the transport rank 0 uses to each peer, in runs. */
static void describe_links(const dt_comm *c) {
  struct dt_comm_topo t;
  if (dt_comm_topology(c, &t) < 0) return;
  int n = dt_comm_size(c);
  printf("comm: %d ranks on %d host%s; rank 0 reaches", n, t.nhosts, t.nhosts == 1 ? "" : "s");
  for (int p = 1; p < n;) {
    const char *name = dt_comm_transport_name(c, p);
    int q = p;
    while (q + 1 < n && !strcmp(dt_comm_transport_name(c, q + 1), name)) q++;
    if (q == p) printf("%s rank %d over %s", p > 1 ? "," : "", p, name);
    else printf("%s ranks %d-%d over %s", p > 1 ? "," : "", p, q, name);
    p = q + 1;
  }
  printf("\n");
  fflush(stdout);
}

/* Trains as rank r of communicator c (this process's only job from here);
 * returns the exit status. Takes c. */
static int train_on(const struct worker_args *a, dt_comm *c) {
  int r = dt_comm_rank(c);
  view *v = a->v;
  if (r == 0 && a->describe) describe_links(c);
  int rc = dt_engine_set_comm(a->e, c);
  dt_engine_hooks hooks = {NULL, NULL, NULL};
  if (r == 0) hooks = (dt_engine_hooks){on_step, on_epoch, v};
  dt_run_summary s;
  if (rc == DT_OK) rc = dt_engine_run(a->e, a->out, a->text, &hooks, &s);
  if (r == 0 && v->bar && v->drawn) fprintf(v->bar, "\r\033[K");
  int status = DT_EXIT_OK;
  if (rc < 0) {
    const char *m = dt_errmsg();
    /* messages from the engine already name this rank */
    if (!strncmp(m, "rank ", 5)) fprintf(stderr, "dtrain: %s\n", m);
    else fprintf(stderr, "dtrain: rank %d: %s\n", r, m);
    status = rc == DT_EMISMATCH ? DT_EXIT_USAGE : DT_EXIT_FAIL;
  } else if (r == 0) {
    final_line(&s, a->out);
  }
  fflush(stdout);
  fflush(stderr);
  dt_comm_destroy(c);
  return status;
}

static void comm_config(struct dt_comm_config *cc, const struct worker_args *a, int rank,
                        int size, const char *token) {
  *cc = (struct dt_comm_config)DT_COMM_CONFIG_INIT;
  cc->transport = a->transport;
  cc->rank = rank;
  cc->size = size;
  cc->job = "train";
  cc->token = token && *token ? token : NULL;
  cc->timeout_s = a->timeout;
  cc->host_id = dt_param_str("DTRAIN_HOST_ID", NULL);
}

/* One forked worker (--workers or launch): join through the TCP store. */
static int run_worker(const struct dt__worker *w, void *arg) {
  const struct worker_args *a = arg;
  dt_store *st = NULL;
  dt_comm *c = NULL;
  struct dt_comm_config cc;
  comm_config(&cc, a, w->rank, w->size, w->token);
  cc.bind_addr = w->bind_addr;
  if (w->host_id && !cc.host_id) cc.host_id = w->host_id;
  if (dt_store_connect(&st, w->store_host, w->store_port, w->token, cc.timeout_s) < 0 ||
      dt_comm_create(&c, st, &cc) < 0) {
    fprintf(stderr, "dtrain: rank %d: joining the job: %s\n", w->rank, dt_errmsg());
    dt_store_destroy(st);
    return DT_EXIT_FAIL;
  }
  dt_store_destroy(st);
  return train_on(a, c);
}

/* ---- ranks started by mpirun / srun ------------------------------------------------ */

/* Removes a store directory and its files (file store: one level). */
static void remove_store_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (d) {
    struct dirent *de;
    char path[PATH_MAX];
    while ((de = readdir(d)))
      if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        unlink(path);
      }
    closedir(d);
  }
  rmdir(dir);
}

/* How the ranks of an external launcher meet: a TCP store served by rank 0
 * at DTRAIN_RDZV (any number of hosts; DTRAIN_JOB_TOKEN needed) or, without
 * it, a file store in DTRAIN_RDZV_DIR/dtrain-rdzv-UID-JOBID (default under
 * /tmp: one host, or a directory every host shares). */
struct ext_plan {
  char host[256], ip[64], bind[64], dir[PATH_MAX];
  int port;            /* 0: file store in dir */
  const char *token;   /* "" = none given */
};

/* Reads the environment; bad input is printed, returns the exit status. */
static int ext_prepare(const struct dt__env_world *ew, struct ext_plan *p) {
  const char *rdzv = dt_param_str("DTRAIN_RDZV", NULL);
  const char *bind_env = dt_param_str("DTRAIN_BIND_ADDR", NULL);
  memset(p, 0, sizeof *p);
  snprintf(p->bind, sizeof p->bind, "127.0.0.1");
  if (rdzv && *rdzv) {
    if (dt__parse_hostport("DTRAIN_RDZV", rdzv, p->host, sizeof p->host, &p->port, 0) < 0)
      return DT_EXIT_USAGE;
    if (dt__resolve_ipv4(p->host, p->ip, sizeof p->ip) < 0) {
      fprintf(stderr, "dtrain: DTRAIN_RDZV '%s': cannot resolve '%s' to an IPv4 address\n", rdzv,
              p->host);
      return DT_EXIT_USAGE;
    }
    if (!(p->token = dt__job_token(1, "a job that meets at DTRAIN_RDZV"))) return DT_EXIT_USAGE;
    if (dt__route_addr(p->ip, p->bind, sizeof p->bind) < 0)
      snprintf(p->bind, sizeof p->bind, "127.0.0.1");
  } else {
    const char *d = dt_param_str("DTRAIN_RDZV_DIR", "/tmp");
    if (!ew->jobid[0]) {
      fprintf(stderr, "dtrain: %s started %d ranks but gave no job id to meet by: set "
              "DTRAIN_RDZV=HOST:PORT (rank 0 serves the rendezvous there)\n", ew->source,
              ew->size);
      return DT_EXIT_USAGE;
    }
    snprintf(p->dir, sizeof p->dir, "%s/dtrain-rdzv-%u-%s", d && *d ? d : "/tmp",
             (unsigned)getuid(), ew->jobid);
    if (!(p->token = dt__job_token(0, NULL))) return DT_EXIT_USAGE;
  }
  if (bind_env && *bind_env) {
    struct in_addr ia;
    if (inet_pton(AF_INET, bind_env, &ia) != 1) {
      fprintf(stderr, "dtrain: DTRAIN_BIND_ADDR '%s': expects an IPv4 address of this "
              "machine\n", bind_env);
      return DT_EXIT_USAGE;
    }
    snprintf(p->bind, sizeof p->bind, "%s", bind_env);
  }
  return DT_EXIT_OK;
}

/* This process is rank ew->rank of ew->size, started by an external
 * launcher: meet as planned, then train. */
static int run_external(const struct dt__env_world *ew, const struct ext_plan *p,
                        const struct worker_args *a) {
  const char *dir = p->dir, *token = p->token;
  dt_store_server *srv = NULL;
  dt_store *st = NULL;
  dt_comm *c = NULL;
  struct dt_comm_config cc;
  if (!p->port) {
    struct stat sb;
    if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
      fprintf(stderr, "dtrain: rank %d: rendezvous directory %s: %s\n", ew->rank, dir,
              strerror(errno));
      return DT_EXIT_FAIL;
    }
    if (lstat(dir, &sb) < 0 || !S_ISDIR(sb.st_mode) || sb.st_uid != getuid()) {
      fprintf(stderr, "dtrain: rank %d: rendezvous directory %s is not a directory of this "
              "user\n", ew->rank, dir);
      return DT_EXIT_FAIL;
    }
  }
  comm_config(&cc, a, ew->rank, ew->size, token);
  cc.bind_addr = p->bind;
  int rc = DT_OK;
  char tok[40] = {0};
  if (p->port) {
    if (ew->rank == 0) rc = dt_store_server_start(&srv, p->ip, p->port, token);
    if (rc == DT_OK) rc = dt_store_connect(&st, p->host, p->port, token, a->timeout);
  } else {
    rc = dt_store_open_file(&st, dir);
    /* without DTRAIN_JOB_TOKEN the tcp links of this job use a fresh secret
     * that rank 0 leaves in the (private) rendezvous directory */
    size_t tl = 0;
    if (rc == DT_OK && !*token && strcmp(a->transport, "mpi")) {
      if (ew->rank == 0) {
        dt__make_token(tok, sizeof tok);
        rc = dt_store_set(st, "train/token", tok, strlen(tok), a->timeout);
      } else {
        rc = dt_store_get(st, "train/token", tok, sizeof tok - 1, &tl, a->timeout);
        tok[tl < sizeof tok ? tl : sizeof tok - 1] = '\0';
      }
      if (rc == DT_OK) cc.token = tok;
    }
  }
  if (rc == DT_OK) rc = dt_comm_create(&c, st, &cc);
  /* once everyone has joined, nobody reads the store again */
  if (rc == DT_OK) rc = dt_comm_barrier(c);
  if (rc < 0) {
    fprintf(stderr, "dtrain: rank %d (%s %s=%d): joining the job: %s\n", ew->rank, ew->source,
            ew->rank_var, ew->rank, dt_errmsg());
    dt_comm_destroy(c);
    dt_store_destroy(st);
    dt_store_server_stop(srv);
      if (!p->port && ew->rank == 0) remove_store_dir(dir);
    return DT_EXIT_FAIL;
  }
  dt_store_destroy(st);
  dt_store_server_stop(srv);
  if (!p->port && ew->rank == 0) remove_store_dir(dir);
  return train_on(a, c);
}

/* ---- the command ------------------------------------------------------------ */

int dt__cmd_train(int argc, char **argv) { return dt__cmd_train_launch(argc, argv, NULL); }

/* The transport: dist.transport, unless DTRAIN_TRANSPORT overrides it. */
static const char *pick_transport(const dt_config *cfg) {
  static const char *const names[] = {"auto", "shm", "tcp", "mpi"};
  const char *env = dt_param_str("DTRAIN_TRANSPORT", NULL);
  if (env && *env) {
    for (int i = 0; i < 4; i++)
      if (!strcmp(env, names[i])) return names[i];
    fprintf(stderr, "dtrain: DTRAIN_TRANSPORT '%s': expects auto, shm, tcp or mpi\n", env);
    return NULL;
  }
  int t = cfg->run.transport;
  return names[t >= 0 && t < 4 ? t : 0];
}

int dt__cmd_train_launch(int argc, char **argv, const struct dt__launch *L) {
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

  /* Who starts the ranks: `dtrain launch` (L), an external launcher (mpirun,
   * srun: rank and size in the environment), or this command (--workers). */
  struct dt__env_world ew = {0};
  int ext = L ? 0 : dt__env_world(&ew);
  if (ext < 0) return DT_EXIT_USAGE;
  if (ext && ew.size == 1) ext = 0; /* a world of one: an ordinary run */
  if (L && workers)
    return bad("--workers: not with dtrain launch (the world is --nnodes x --nproc-per-node)%s",
               "");
  if (ext && workers) {
    fprintf(stderr, "dtrain: --workers %d: this process is already rank %d of %d started by %s "
            "(%s); use one or the other\n", workers, ew.rank, ew.size, ew.source, ew.size_var);
    return DT_EXIT_USAGE;
  }
  int world = L ? L->nnodes * L->nproc : ext ? ew.size : 0;

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
  /* Launched jobs: dist.workers is the world size (the workers compare it
   * in their config check); a config that says otherwise is refused. */
  if (world) {
    const char *by = L ? "dtrain launch" : ew.source;
    if (cfg->run.workers != 1 && cfg->run.workers != world) {
      fprintf(stderr, "dtrain: dist.workers = %d, but %s started a world of %d ranks (leave "
              "dist.workers at 1 or set it to %d)\n", cfg->run.workers, by, world, world);
      free(cfg);
      return DT_EXIT_USAGE;
    }
    cfg->run.workers = world;
  }
  const char *transport = pick_transport(cfg);
  if (!transport) {
    free(cfg);
    return DT_EXIT_USAGE;
  }
  struct ext_plan plan;
  if (ext && (rc = ext_prepare(&ew, &plan)) != DT_EXIT_OK) {
    free(cfg);
    return rc;
  }
  if (!strcmp(transport, "mpi") && !ext && cfg->run.workers > 1) {
    fprintf(stderr, "dtrain: dist.transport = mpi needs the ranks started by mpirun or srun "
            "(%s forks its own workers: use auto, shm or tcp)\n",
            L ? "dtrain launch" : "--workers");
    free(cfg);
    return DT_EXIT_USAGE;
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
  /* Only the process (node) where rank 0 runs writes anything. */
  int has_rank0 = L ? L->node_rank == 0 : ext ? ew.rank == 0 : 1;
  /* The run owns its output directory (DIR/.lock, held by this process
   * and the workers it forks): one that cannot be made is bad input; one
   * that another run holds is refused, naming its pid. */
  rc = has_rank0 ? dt_engine_set_out_dir(e, out) : DT_OK;
  if (rc < 0) {
    fprintf(stderr, "dtrain: --out: %s\n", dt_errmsg());
    dt_engine_destroy(e);
    free(text);
    free(cfg);
    return rc == DT_EAGAIN ? DT_EXIT_FAIL : DT_EXIT_USAGE;
  }
  view v = {NULL, 0, 0};
  if (isatty(STDERR_FILENO)) v.bar = stderr;
  else if (isatty(STDOUT_FILENO)) v.bar = stdout;
  char wk[96] = "";
  if (L && L->nnodes > 1)
    snprintf(wk, sizeof wk, " (global, %d workers: %d nodes x %d)", cfg->run.workers, L->nnodes,
             L->nproc);
  else if (ext)
    snprintf(wk, sizeof wk, " (global, %d workers started by %s)", cfg->run.workers, ew.source);
  else if (cfg->run.workers > 1)
    snprintf(wk, sizeof wk, " (global, %d workers)", cfg->run.workers);
  if (has_rank0)
    printf("dtrain %s: %s, %zu parameters, %lld train / %lld test samples, %d epochs, batch %d%s "
           "-> %s\n", dt_version(), cfg->run.layers, dt_model_nparams(dt_engine_model(e)),
           (long long)dt_engine_train_samples(e), (long long)dt_engine_test_samples(e),
           cfg->run.epochs, cfg->run.batch, wk, out);
  else if (L && L->nproc == 1)
    printf("dtrain %s: node %d of %d, rank %d of %d (rank 0, on node 0, reports)\n",
           dt_version(), L->node_rank, L->nnodes, L->node_rank, cfg->run.workers);
  else if (L)
    printf("dtrain %s: node %d of %d, ranks %d-%d of %d (rank 0, on node 0, reports)\n",
           dt_version(), L->node_rank, L->nnodes, L->node_rank * L->nproc,
           L->node_rank * L->nproc + L->nproc - 1, cfg->run.workers);
  fflush(stdout);
  double timeout = (double)dt_param_int("DTRAIN_TIMEOUT", 60);
  struct worker_args wa = {e, out, text, transport, timeout > 0 ? timeout : 60, L || ext, &v};
  if (L || ext || cfg->run.workers > 1) {
    int st;
    if (ext) {
      st = run_external(&ew, &plan, &wa);
    } else if (L) {
      char hid[320], hn[256] = "localhost";
      gethostname(hn, sizeof hn - 1);
      snprintf(hid, sizeof hid, "%s/launch-node-%d", hn, L->node_rank);
      struct dt__job j = {0};
      j.nlocal = L->nproc;
      j.rank0 = L->node_rank * L->nproc;
      j.world = cfg->run.workers;
      j.node = L->node_rank;
      j.nnodes = L->nnodes;
      j.serve_addr = L->node_rank == 0 ? L->rdzv_ip : NULL;
      j.rdzv_host = L->rdzv_ip;
      j.rdzv_port = L->rdzv_port;
      j.token = L->token;
      j.bind_addr = L->bind_addr;
      j.host_id = hid;
      j.timeout = wa.timeout;
      j.grace = (double)dt_param_int("DTRAIN_GRACE_SECONDS", 8);
      j.print_pids = 1;
      st = dt__job_run(&j, run_worker, &wa);
    } else {
      st = dt__local_job_run(cfg->run.workers, run_worker, &wa,
                             (double)dt_param_int("DTRAIN_GRACE_SECONDS", 8), 1);
    }
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
