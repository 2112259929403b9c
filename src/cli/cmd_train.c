/*
 * cmd_train.c — `dtrain train [CONFIG] [--set section.key=value ...]
 * [--out DIR] [--workers N]`: builds the configuration (defaults, then the
 * file, then the overrides in order), validates it, hands it to the engine
 * and reports progress: a bar redrawn in place when stderr or stdout is a
 * terminal, one line per epoch otherwise, and a final line with test
 * accuracy and throughput.
 *
 * With --workers N > 1 it loads and checks everything once, then runs a
 * job of the launch layer (dt_job_*, src/launch): N forked worker
 * processes (they share the loaded data copy-on-write) that join over
 * dist.transport (default auto: shm on one host) and train data-parallel;
 * rank 0 prints and writes the one summary.json. The job watches the
 * workers, stops them on a failure, SIGINT or SIGTERM and cleans up; this
 * file only turns its result into an exit status (job_cli.c). The
 * transport is dist.transport unless DTRAIN_TRANSPORT overrides it.
 *
 * Launched jobs (docs/launch.md): under `dtrain launch` (cmd_launch.c) the
 * same path forks this node's workers with their global ranks, node 0
 * serving the rendezvous; under mpirun or srun (rank and size in the
 * environment, dt_job_from_env) this process is one rank. Either way
 * dist.workers becomes the world size, and only rank 0 prints and writes.
 *
 * Bad input of any kind (arguments, config, data files, model) ends with one
 * line on stderr and exit status 2 before anything is written; failures
 * during training give 1. It never writes summary.json itself.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
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
#include "elastic/elastic.h"
#include "engine/engine.h"
#include "obs/obs_diag.h"

static void train_usage(FILE *f) {
  fprintf(f,
          "usage: dtrain train [CONFIG] [--set section.key=value ...] [--out DIR] [--workers N]\n"
          "                    [--resume [DIR]]\n"
          "                    [--servers S] [--standby K]\n"
          "\n"
          "Trains the model of CONFIG (an INI file; without it the built-in CNN on\n"
          "Fashion-MNIST, as in examples/fashion_cnn.ini) and writes DIR/summary.json,\n"
          "DIR/events.jsonl and DIR/config.ini (the effective configuration).\n"
          "\n"
          "  --set section.key=value  override one config key (repeatable), e.g.\n"
          "                           --set optim.lr=0.1 --set train.epochs=5\n"
          "  --out DIR                output directory (default runs/<date>-<time>)\n"
          "  --workers N              local worker processes, data parallel (docs/ddp.md)\n"
          "  --resume [DIR]           continue from the newest valid checkpoint under DIR (a\n"
          "                           checkpoint, its root or a run directory; default:\n"
          "                           ckpt.dir, else --out) (docs/checkpoint.md)\n"
          "  --standby K              elastic: K spare workers, forked with the data loaded,\n"
          "                           replace lost ones (dist.standby; docs/elastic.md)\n"
          "  --servers S              S parameter-server processes besides the workers\n"
          "                           (ps.servers; docs/ps.md)\n"
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
  char loss[32];
  dt__cli_fmt_loss(p->loss, loss, sizeof loss);
  fprintf(v->bar, "\r\033[Kepoch %d/%d [%s] %lld/%lld loss %s %.0f samples/s", p->epoch,
          p->epochs, bar, (long long)p->step_in_epoch, (long long)p->steps_per_epoch, loss,
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
  char tl[32], vl[32];
  dt__cli_fmt_loss(r->train_loss, tl, sizeof tl);
  dt__cli_fmt_loss(r->test_loss, vl, sizeof vl);
  if (r->evaluated)
    printf("epoch %d  train_loss %s  test_loss %s  test_acc %.4f  %.0f samples/s  lr %.4g  "
           "%.1fs\n", r->epoch, tl, vl, r->test_accuracy, r->samples_per_second, r->lr, r->time);
  else
    printf("epoch %d  train_loss %s  %.0f samples/s  lr %.4g  %.1fs\n", r->epoch, tl,
           r->samples_per_second, r->lr, r->time);
  fflush(stdout);
}

static void final_line(const dt_run_summary *s, const char *out) {
  char tl[32];
  dt__cli_fmt_loss(s->test_loss, tl, sizeof tl);
  printf("test accuracy %.4f  test loss %s  %.0f samples/s  %.2f GFLOP/s  (%lld steps, %.1f s "
         "training)  summary: %s/summary.json\n", s->test_accuracy, tl,
         s->samples_per_second, s->gflops, (long long)s->steps, s->train_seconds, out);
}

/* ---- signals ------------------------------------------------------------------ */

/* SIGTERM/SIGINT while training with checkpoints: the engine reads this
 * flag at every step boundary, rank 0 writes a checkpoint and the run ends
 * (dt_engine_set_stop_flag). The one global of the command: a signal
 * handler has nowhere else to write. */
static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig) { stop_signal = sig; }

/* Installs the handler when the run takes a checkpoint on a signal. */
static void catch_stop(dt_engine *e, const dt_run_cfg *c) {
  if (!c->ckpt_on_signal) return;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  dt_engine_set_stop_flag(e, &stop_signal);
}

/* ---- workers ------------------------------------------------------------------ */

struct worker_args {
  dt_engine *e;
  const dt_run_cfg *cfg;
  int servers;           /* ps.servers: ranks from `workers` on serve */
  int workers;
  const char *out, *text;
  int describe;          /* rank 0 prints which transport reaches which rank */
  view *v;
  int ext;               /* ranks started by mpirun/srun: no launcher serves metrics */
  struct dt__cli_obs *co;
};

/* Under mpirun/srun no launcher serves obs.metrics: the first rank of
 * each host serves every rank of its host (their pages are in the same
 * DIR/obs there), so Prometheus can scrape one target per node; and rank
 * 0's server also fetches the other hosts' pages from their servers
 * (their addresses gathered here, a collective of every rank), so its one
 * target shows the whole job. Every rank keeps what a hang diagnosis
 * reads (obs_cli.c): its host's ranks, whose pages are files here, and the
 * other hosts' endpoints. */
static void serve_host(const struct worker_args *a, dt_comm *world) {
  struct dt_comm_topo t;
  if (!a->ext || !a->co || !world || dt_comm_topology(world, &t) < 0) return;
  int n = dt_comm_size(world), me = dt_comm_rank(world), k = 0, npeers = 0;
  int *r = malloc((size_t)n * sizeof *r);
  char mine[64] = "", *all = calloc((size_t)n, 64), *peers = calloc((size_t)n, 64);
  if (!r || !all || !peers) goto out;
  for (int i = 0; i < n; i++)
    if (dt_comm_host_of(world, i) == t.host) r[k++] = i;
  if (a->co->metrics[0]) {
    if (t.one_per_host_leader) {
      dt__cli_obs_serve_ranks(a->co, r, k);
      if (a->co->srv) dt__cli_obs_advertise(a->co, mine, sizeof mine);
    }
    int gathered = dt_comm_allgather(world, mine, all, 64, DT_U8) == DT_OK;
    if (!gathered)
      fprintf(stderr, "dtrain: warning: rank %d: obs.metrics: the hosts' endpoints were not "
              "gathered: %s\n", me, dt_errmsg());
    int metric_peers = 0;
    for (int i = 0; gathered && i < n; i++) {
      char *p = all + (size_t)i * 64;
      p[63] = '\0';
      /* this very endpoint (the loopback default on several machines): its
       * single thread would wait on itself for a second per scrape */
      if (!*p || dt_comm_host_of(world, i) == t.host || !strcmp(p, mine)) continue;
      snprintf(peers + (size_t)npeers++ * 64, 64, "%s", p);
      if (me != 0 || !a->co->srv) continue;
      if (dt_obs_server_add_peer(a->co->srv, p) < 0)
        fprintf(stderr, "dtrain: warning: %s\n", dt_errmsg());
      else metric_peers++;
    }
    if (metric_peers) {
      printf("metrics: the endpoint of ranks %d-%d also shows the ranks of %d other host%s\n", 0,
             k ? r[k - 1] : 0, metric_peers, metric_peers > 1 ? "s" : "");
      fflush(stdout);
    }
  }
  dt__cli_obs_ext(a->co, me, n, r, k, peers, npeers);
out:
  free(peers);
  free(all);
  free(r);
}

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

/* dist.min_workers > 0: this worker's membership handle, watching the
 * job's communicator, given to the engine. */
static int start_elastic(const struct dt_job_worker *w, const dt_run_cfg *r, dt_engine *e,
                         const char *text, dt_comm *wc, int size0, dt_elastic **out) {
  *out = NULL;
  if (!w->rdzv_port || !w->comm_config)
    return dt__seterr(DT_ENOTSUP, "dist.min_workers = %d: elastic training needs workers started "
                      "by --workers or dtrain launch (a TCP rendezvous store)", r->min_workers);
  dt_elastic_cfg ec;
  memset(&ec, 0, sizeof ec);
  ec.host = w->rdzv_host;
  ec.port = w->rdzv_port;
  ec.token = w->comm_config->token;
  ec.cc = *w->comm_config;
  ec.id = w->rank;
  ec.size0 = size0;
  ec.min_workers = r->min_workers;
  ec.max_workers = r->max_workers > 0 ? r->max_workers : r->workers;
  ec.rejoin_timeout_s = r->rejoin_timeout;
  ec.heartbeat_timeout_s = r->heartbeat_timeout;
  dt__engine_el_fingerprint(e, text, &ec.fp, &ec.fp_len);
  if (w->joining) {
    /* a joiner: the job's config checked, a member id, admission, the
     * generation's communicator; the engine takes the state when it runs */
    ec.join = 1;
    ec.spare = w->member_id != NULL; /* a spare of the local launcher (counted in el/coming) */
    ec.check_fp = dt__engine_el_check_fp;
    ec.fp_ud = e;
    DT_CHECK(dt_elastic_create(out, &ec));
    if (w->member_id) *w->member_id = dt_elastic_id(*out);
    dt_elastic_gen g;
    int rc = dt_elastic_join(*out, &g);
    if (rc == DT_OK) rc = dt__engine_set_joined(e, *out, &g);
    if (rc < 0) {
      dt_elastic_destroy(*out);
      *out = NULL;
    }
    return rc;
  }
  DT_CHECK(dt_elastic_create(out, &ec));
  int rc = dt_elastic_start(*out, wc);
  if (rc == DT_OK) rc = dt__engine_set_elastic(e, *out, w->rank);
  if (rc < 0) {
    dt_elastic_destroy(*out);
    *out = NULL;
  }
  return rc;
}

/* One worker of a job (--workers, launch, mpirun/srun): trains as its rank
 * over the job's communicator; returns the exit status. */
static int run_worker(const struct dt_job_worker *w, void *arg) {
  const struct worker_args *a = arg;
  dt_comm *c = w->comm, *job = NULL;
  int r = w->rank;
  view *v = a->v;
  if (r == 0 && a->describe) describe_links(c);
  serve_host(a, c);
  int rc = DT_OK;
  /* an elastic parameter-server job (docs/ps.md "Workers leaving"): the
   * workers' communicator is a world of its own, so aborting or re-forming
   * it (src/elastic) leaves the job's, over which the servers are reached */
  const int ps_el = a->servers > 0 && a->cfg->min_workers > 0;
  /* elastic ps: servers watch the store for joiners, a joiner reaches the
   * servers through it (strategy_ps.c) */
  if (ps_el && w->rdzv_port && w->comm_config)
    rc = dt__engine_set_rdzv(a->e, w->rdzv_host, w->rdzv_port, w->comm_config);
  /* replicas: a new server process in a lost server's slot announces itself
   * in the store; the workers and servers take it at an epoch end */
  if (!ps_el && a->servers > 0 && a->cfg->ps.replicas > 1 && w->rdzv_port && w->comm_config)
    rc = dt__engine_set_rdzv(a->e, w->rdzv_host, w->rdzv_port, w->comm_config);
  /* this process is such a server (dtrain launch --join, DTRAIN_PS_REJOIN) */
  if (w->joining && dt_param(DT_PARAM_PS_REJOIN) >= 0) {
    int slot = (int)dt_param(DT_PARAM_PS_REJOIN);
    rc = dt__engine_rejoin_serve(a->e, w->rdzv_host, w->rdzv_port, w->comm_config, slot);
    if (rc < 0) fprintf(stderr, "dtrain: rejoining server %d: %s\n", slot, dt_errmsg());
    fflush(stderr);
    return rc < 0 ? DT_EXIT_FAIL : DT_EXIT_OK;
  }
  if (a->servers > 0 && !w->joining) {
    /* a parameter-server job: workers first, then servers; the engine
     * trains over the workers' communicator and talks to the servers over
     * the job's */
    job = c;
    c = NULL;
    if (ps_el && r < a->workers) {
      rc = w->rdzv_port && w->comm_config ? DT_OK
           : dt__seterr(DT_ENOTSUP, "dist.min_workers with parameter servers needs workers "
                        "started by --workers or dtrain launch (a TCP rendezvous store)");
      dt_store *st = NULL;
      if (rc == DT_OK)
        rc = dt_store_connect(&st, w->rdzv_host, w->rdzv_port, w->comm_config->token,
                              w->comm_config->timeout_s);
      char name[256];
      struct dt_comm_config cc = w->comm_config ? *w->comm_config
                                                : (struct dt_comm_config)DT_COMM_CONFIG_INIT;
      snprintf(name, sizeof name, "%s.psw", cc.job ? cc.job : "dtrain");
      cc.job = name;
      cc.rank = r;
      cc.size = a->workers;
      if (rc == DT_OK) rc = dt_comm_create(&c, st, &cc);
      dt_store_destroy(st);
    } else if (!ps_el) {
      rc = dt_comm_split(job, r < a->workers ? 0 : 1, r, &c);
    }
    if (rc == DT_OK && r >= a->workers) {
      rc = dt__engine_serve(a->e, job, r - a->workers);
      dt_comm_destroy(c);
      if (rc < 0) {
        fprintf(stderr, "dtrain: rank %d (server %d): %s\n", r, r - a->workers, dt_errmsg());
        fflush(stderr);
        return DT_EXIT_FAIL;
      }
      return DT_EXIT_OK;
    }
    if (rc == DT_OK) rc = dt__engine_set_job_comm(a->e, job);
  }
  if (rc == DT_OK && !w->joining) rc = dt_engine_set_comm(a->e, c);
  if (w->joining) c = NULL;
  catch_stop(a->e, a->cfg);
  dt_elastic *el = NULL;
  if (rc == DT_OK && (a->cfg->min_workers > 0 || w->joining))
    rc = start_elastic(w, a->cfg, a->e, a->text, job ? c : w->comm,
                       job ? a->workers : w->size, &el);
  dt_engine_hooks hooks = {NULL, NULL, NULL};
  /* elastic: whoever is rank 0 reports (the engine calls only its hooks) */
  if (r == 0 || el) hooks = (dt_engine_hooks){on_step, on_epoch, v};
  dt_run_summary s;
  if (rc == DT_OK) rc = dt_engine_run(a->e, a->out, a->text, &hooks, &s);
  dt_elastic_destroy(el);
  if (r == 0 && v->bar && v->drawn) fprintf(v->bar, "\r\033[K");
  int status = DT_EXIT_OK;
  if (rc < 0) {
    const char *m = dt_errmsg();
    /* messages from the engine already name this rank */
    if (!strncmp(m, "rank ", 5)) fprintf(stderr, "dtrain: %s\n", m);
    else if (w->joining && !el) fprintf(stderr, "dtrain: joiner (pid %d): %s\n", (int)getpid(), m);
    else if (w->joining) fprintf(stderr, "dtrain: joiner: %s\n", m);
    else fprintf(stderr, "dtrain: rank %d: %s\n", r, m);
    status = rc == DT_EMISMATCH ? DT_EXIT_USAGE : DT_EXIT_FAIL;
    if (rc == DT_EABORTED && stop_signal) status = 128 + stop_signal;
    else if (a->ext && a->co) dt__cli_obs_rank_failed(a->co, rc); /* no launcher diagnoses */
  } else if (s.rank == 0) {
    final_line(&s, a->out);
  }
  if (job) dt_comm_destroy(c);
  fflush(stdout);
  fflush(stderr);
  return status;
}

/* ---- the command ------------------------------------------------------------ */

int dt__cmd_train(int argc, char **argv) { return dt__cmd_train_launch(argc, argv, NULL); }

/* The transport: dist.transport, unless DTRAIN_TRANSPORT overrides it. */
static const char *pick_transport(const dt_config *cfg) {
  const char *env = dt_param_str("DTRAIN_TRANSPORT", NULL);
  if (env && *env) {
    int t = dt__enum_parse(dt__transport_names, env);
    if (t >= 0) return dt__transport_names[t];
    fprintf(stderr, "dtrain: DTRAIN_TRANSPORT '%s': expects auto, shm, tcp or mpi\n", env);
    return NULL;
  }
  int t = cfg->run.transport;
  return dt__transport_names[t >= 0 && t <= DT_DIST_MPI ? t : 0];
}

/* The command line of `dtrain train`. */
struct train_args {
  const char *config_path, *out;
  int resume;                 /* --resume given */
  const char *resume_dir;     /* its DIR, or NULL for the default */
  const char *sets[256];
  int nsets, workers, servers;
  int standby;                /* --standby K: K + 1 (0: not given) */
};

/* Parses argv; returns -1 to go on, else the exit status (help, bad usage). */
static int parse_args(int argc, char **argv, struct train_args *ta) {
  memset(ta, 0, sizeof *ta);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *val = NULL;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      train_usage(stdout);
      return DT_EXIT_OK;
    }
    if (!strcmp(a, "--resume") || !strncmp(a, "--resume=", 9)) {
      /* DIR is optional: the next argument is taken when it is a directory
       * (a CONFIG is a file) */
      struct stat st;
      ta->resume = 1;
      if (a[8] == '=') ta->resume_dir = a + 9;
      else if (i + 1 < argc && argv[i + 1][0] != '-' && stat(argv[i + 1], &st) == 0 &&
               S_ISDIR(st.st_mode))
        ta->resume_dir = argv[++i];
      if (ta->resume_dir && !*ta->resume_dir) return bad("--resume=: empty directory name%s", "");
      continue;
    }
    const char *opts[] = {"--set", "--out", "--workers", "--servers", "--standby"};
    int which = -1;
    for (int j = 0; j < 5; j++) {
      size_t n = strlen(opts[j]);
      if (!strncmp(a, opts[j], n) && (a[n] == '\0' || a[n] == '=')) {
        which = j;
        if (a[n] == '=') val = a + n + 1;
        else if (i + 1 < argc) val = argv[++i];
        else return bad("%s: missing value (see dtrain train --help)", opts[j]);
      }
    }
    if (which == 0) {
      if (ta->nsets == (int)(sizeof ta->sets / sizeof ta->sets[0]))
        return bad("%s: too many --set options", a);
      ta->sets[ta->nsets++] = val;
    } else if (which == 1) {
      if (!*val) return bad("--out: empty directory name%s", "");
      ta->out = val;
    } else if (which == 2) {
      char *end;
      errno = 0;
      long w = strtol(val, &end, 10);
      if (end == val || *end || errno || w < 1 || w > 4096)
        return bad("--workers '%s': expects a positive integer", val);
      ta->workers = (int)w;
    } else if (which == 3) {
      char *end;
      errno = 0;
      long sv = strtol(val, &end, 10);
      if (end == val || *end || errno || sv < 1 || sv > 4096)
        return bad("--servers '%s': expects a positive integer", val);
      ta->servers = (int)sv;
    } else if (which == 4) {
      char *end;
      errno = 0;
      long k = strtol(val, &end, 10);
      if (end == val || *end || errno || k < 0 || k > 4096)
        return bad("--standby '%s': expects an integer in [0, 4096]", val);
      ta->standby = (int)k + 1;
    } else if (a[0] == '-' && a[1]) {
      return bad("train: unknown option '%s' (see dtrain train --help)", a);
    } else if (ta->config_path) {
      return bad("train: more than one CONFIG given ('%s')", a);
    } else {
      ta->config_path = a;
    }
  }
  return -1;
}

/* Defaults, file, --workers, --set in order, validation; then a launched
 * job's world size into dist.workers (the workers compare it in their
 * config check; a config that says otherwise is refused). `by` names who
 * started a world of `world` ranks (0: this command). Prints the reason
 * and returns the exit status on failure, -1 on success. */
static int build_config(dt_config *cfg, const struct train_args *ta, int world, const char *by) {
  dt_config_init(cfg);
  int rc = DT_OK;
  if (ta->config_path) rc = dt_config_load(cfg, ta->config_path);
  if (rc == DT_OK && ta->workers) {
    char w[32];
    snprintf(w, sizeof w, "dist.workers=%d", ta->workers);
    rc = dt_config_set(cfg, w);
  }
  if (rc == DT_OK && ta->servers) {
    char sv[32];
    snprintf(sv, sizeof sv, "ps.servers=%d", ta->servers);
    rc = dt_config_set(cfg, sv);
  }
  if (rc == DT_OK && ta->standby) {
    char sb[40];
    snprintf(sb, sizeof sb, "dist.standby=%d", ta->standby - 1);
    rc = dt_config_set(cfg, sb);
  }
  for (int i = 0; rc == DT_OK && i < ta->nsets; i++) rc = dt_config_set(cfg, ta->sets[i]);
  /* a launched parameter-server job: the world is workers + servers */
  if (rc == DT_OK && world && cfg->run.ps.servers > 0) {
    if (world <= cfg->run.ps.servers) {
      fprintf(stderr, "dtrain: ps.servers = %d, but %s started only %d ranks (workers come "
              "first, then the servers)\n", cfg->run.ps.servers, by, world);
      return DT_EXIT_USAGE;
    }
    world -= cfg->run.ps.servers;
    if (cfg->run.workers == 1) cfg->run.workers = world;
  }
  if (rc == DT_OK) rc = dt_config_validate(cfg);
  if (rc == DT_OK) dt_log_set_json(cfg->run.obs_log_format == 1); /* the launcher's lines too */
  if (rc < 0) {
    fprintf(stderr, "dtrain: %s\n", dt_errmsg());
    return rc == DT_ENOMEM ? DT_EXIT_FAIL : DT_EXIT_USAGE;
  }
  if (world) {
    if (cfg->run.workers != 1 && cfg->run.workers != world) {
      fprintf(stderr, "dtrain: dist.workers = %d, but %s started a world of %d ranks (leave "
              "dist.workers at 1 or set it to %d)\n", cfg->run.workers, by, world, world);
      return DT_EXIT_USAGE;
    }
    cfg->run.workers = world;
  }
  return -1;
}

/* The job that runs the workers: from the environment (mpirun/srun), for
 * this node of `dtrain launch` (L), or local --workers. Prints the reason
 * and returns the exit status on failure, -1 on success. */
/* A spare, before it waits: its model and optimizer memory made its own
 * (dt_job_config.spare_ready). */
static void spare_ready(void *arg) { dt__engine_standby_warm(((struct worker_args *)arg)->e); }

static int make_job(dt_job **job, const struct dt__launch *L, int ext, const dt_config *cfg,
                    const char *transport, const dt_engine *e, struct dt__cli_obs *co) {
  struct dt_job_config jc = DT_JOB_CONFIG_INIT;
  double timeout = (double)dt_param_int("DTRAIN_TIMEOUT", 60);
  size_t np = dt_model_nparams(dt_engine_model(e));
  jc.transport = transport;
  jc.tcp_connections = cfg->run.tcp_connections;
  jc.name = "train";
  jc.deadline_s = timeout > 0 ? timeout : 60;
  jc.grace_s = (double)dt_param_int("DTRAIN_GRACE_SECONDS", 8);
  jc.print_pids = 1;
  jc.notify = dt__cli_job_notify;
  jc.watch = dt__cli_obs_watch;
  jc.watch_ud = co;
  /* parameters, gradients and up to two optimizer moments, plus room for
   * activations and buffers; the gradient window is shared memory */
  jc.worker_bytes = np * sizeof(float) * 4 + ((size_t)64 << 20);
  jc.worker_shm_bytes = np * sizeof(float) + 4096;
  int rc;
  if (ext) {
    rc = dt_job_from_env(job, &jc);
  } else {
    if (L) {
      jc.nnodes = L->nnodes;
      jc.node_rank = L->node_rank;
      jc.nproc_per_node = L->nproc;
      jc.rdzv = L->rdzv[0] ? L->rdzv : NULL;
      jc.bind_addr = L->bind_addr[0] ? L->bind_addr : NULL;
      jc.rdzv_backend = L->etcd ? "etcd" : NULL;
    } else {
      jc.workers = cfg->run.workers + cfg->run.ps.servers;
    }
    jc.min_workers = cfg->run.min_workers;
    /* (the launcher's join is for elastic jobs; a rejoining server is none) */
    if (L && L->join && dt_param(DT_PARAM_PS_REJOIN) >= 0 && !jc.min_workers) jc.min_workers = 1;
    /* separate servers with replicas: a server may die, the job goes on */
    if (cfg->run.ps.servers > 0 && cfg->run.ps.replicas > 1) {
      jc.expendable_from = cfg->run.workers;
      jc.expendable_max = cfg->run.ps.servers - 1; /* the workers tell which losses they survive */
      /* a lost server's slot may take a new process (a rejoin, docs/ps.md) and
       * lose it again: over the job's life every server forked here may die;
       * a loss that leaves a range without a copy ends the job in the workers */
      jc.expendable_max = cfg->run.ps.servers;
    }
    /* elastic: spares replace lost workers (dist.standby of them; with
     * dist.replace alone, one per worker) */
    jc.spares = cfg->run.standby > 0 ? cfg->run.standby : cfg->run.replace ? cfg->run.workers : 0;
    jc.spare_ready = spare_ready;
    if (L && L->join) jc.join = 1, jc.spares = 0, jc.nnodes = 1, jc.node_rank = 0,
                      jc.nproc_per_node = 1;
    rc = dt_job_create(job, &jc);
  }
  /* every failure here is bad input, the memory check's refusal too */
  if (rc < 0) {
    fprintf(stderr, "dtrain: %s\n", dt_errmsg());
    return DT_EXIT_USAGE;
  }
  return -1;
}

/* The first line: what is trained, by how many, where it goes. */
static void header(const dt_config *cfg, const dt_engine *e, const struct dt__launch *L,
                   const struct dt__env_world *ew, int ext, int has_rank0, const char *out) {
  char wk[96] = "";
  if (L && L->nnodes > 1)
    snprintf(wk, sizeof wk, " (global, %d workers: %d nodes x %d)", cfg->run.workers, L->nnodes,
             L->nproc);
  else if (ext)
    snprintf(wk, sizeof wk, " (global, %d workers started by %s)", cfg->run.workers, ew->source);
  else if (cfg->run.workers > 1)
    snprintf(wk, sizeof wk, " (global, %d workers)", cfg->run.workers);
  if (has_rank0)
    printf("dtrain %s: %s, %zu parameters, %lld train / %lld test samples, %d epochs, batch %d%s "
           "-> %s\n", dt_version(), cfg->run.layers, dt_model_nparams(dt_engine_model(e)),
           (long long)dt_engine_train_samples(e), (long long)dt_engine_test_samples(e),
           cfg->run.epochs, cfg->run.batch, wk, out);
  if (has_rank0 && (cfg->run.ps.servers > 0 || cfg->run.ps.colocate)) {
    char *map = NULL;
    if (dt__engine_ps_describe((dt_engine *)e, &map) == DT_OK) {
      printf("ps: %s, %d %sserver%s, consistency %s\n", cfg->run.ps.colocate ? "colocated" : "separate",
             cfg->run.ps.colocate ? cfg->run.workers : cfg->run.ps.servers,
             cfg->run.ps.colocate ? "colocated " : "",
             (cfg->run.ps.colocate ? cfg->run.workers : cfg->run.ps.servers) == 1 ? "" : "s",
             dt__ps_consistency_names[cfg->run.ps.consistency]);
      fputs(map, stdout);
    }
    free(map);
  }
  else if (L && L->join && dt_param(DT_PARAM_PS_REJOIN) >= 0)
    printf("dtrain %s: server %d of the job at %s, rejoining (at the workers' next epoch end)\n",
           dt_version(), (int)dt_param(DT_PARAM_PS_REJOIN), L->rdzv);
  else if (L && L->join)
    printf("dtrain %s: joining the elastic job at %s (admitted at its next re-forming)\n",
           dt_version(), L->rdzv);
  else if (L && L->nproc == 1)
    printf("dtrain %s: node %d of %d, rank %d of %d (rank 0, on node 0, reports)\n",
           dt_version(), L->node_rank, L->nnodes, L->node_rank, cfg->run.workers);
  else if (L)
    printf("dtrain %s: node %d of %d, ranks %d-%d of %d (rank 0, on node 0, reports)\n",
           dt_version(), L->node_rank, L->nnodes, L->node_rank * L->nproc,
           L->node_rank * L->nproc + L->nproc - 1, cfg->run.workers);
  fflush(stdout);
}

int dt__cmd_train_launch(int argc, char **argv, const struct dt__launch *L) {
  struct train_args ta;
  int status = parse_args(argc, argv, &ta);
  if (status >= 0) return status;
  if (L && L->standby >= 0) ta.standby = L->standby + 1;

  /* Who starts the ranks: `dtrain launch` (L), an external launcher (mpirun,
   * srun: rank and size in the environment), or this command (--workers). */
  struct dt__env_world ew = {0};
  int ext = L ? 0 : dt__env_world(&ew);
  if (ext < 0) return bad("%s", dt_errmsg());
  if (ext && ew.size == 1) ext = 0; /* a world of one: an ordinary run */
  if (L && ta.workers)
    return bad("--workers: not with dtrain launch (the world is --nnodes x --nproc-per-node)%s",
               "");
  if (ext && ta.workers) {
    fprintf(stderr, "dtrain: --workers %d: this process is already rank %d of %d started by %s "
            "(%s); use one or the other\n", ta.workers, ew.rank, ew.size, ew.source, ew.size_var);
    return DT_EXIT_USAGE;
  }
  int world = L && !L->join ? L->nnodes * L->nproc : ext ? ew.size : 0;

  dt_config *cfg = malloc(sizeof *cfg);
  char *text = NULL;
  dt_engine *e = NULL;
  dt_job *job = NULL;
  struct dt__cli_obs co;
  int obs_on = 0;
  const char *transport, *out = ta.out;
  char outbuf[DT_CFG_PATH_MAX];
  if (!cfg) {
    status = bad("%s", "out of memory");
    goto done;
  }
  if ((status = build_config(cfg, &ta, world, L ? "dtrain launch" : ew.source)) >= 0) goto done;
  /* a joiner trains with the data-parallel strategy of a job of several
   * workers; their number is the job's business (not compared) */
  if (L && L->join && cfg->run.workers < 2)
    cfg->run.workers = cfg->run.min_workers > 2 ? cfg->run.min_workers : 2;
  if (!(transport = pick_transport(cfg))) {
    status = DT_EXIT_USAGE;
    goto done;
  }
  if (!strcmp(transport, "mpi") && !ext && cfg->run.workers > 1) {
    fprintf(stderr, "dtrain: dist.transport = mpi needs the ranks started by mpirun or srun "
            "(%s forks its own workers: use auto, shm or tcp)\n",
            L ? "dtrain launch" : "--workers");
    status = DT_EXIT_USAGE;
    goto done;
  }
  size_t need = dt_config_dump(cfg, NULL, 0);
  if (!(text = malloc(need + 1))) {
    status = bad("%s", "out of memory");
    goto done;
  }
  dt_config_dump(cfg, text, need + 1);

  /* Everything that can be bad input is checked here, before any output. */
  int rc = dt_engine_create(&e, &cfg->run);
  if (rc < 0) {
    fprintf(stderr, "dtrain: %s\n", dt_errmsg());
    status = rc == DT_ENOMEM ? DT_EXIT_FAIL : DT_EXIT_USAGE;
    goto done;
  }
  /* --resume: the checkpoint is found, checked and loaded now, before any
   * worker is forked (each inherits it); none valid is bad input. */
  if (ta.resume) {
    const char *from = ta.resume_dir ? ta.resume_dir
                       : cfg->run.ckpt_dir[0] ? cfg->run.ckpt_dir : out;
    if (!from) {
      status = bad("--resume: name the checkpoint (--resume DIR) or the run's --out%s", "");
      goto done;
    }
    rc = dt_engine_resume(e, from);
    if (rc < 0) {
      fprintf(stderr, "dtrain: --resume: %s\n", dt_errmsg());
      status = rc == DT_ENOMEM ? DT_EXIT_FAIL : DT_EXIT_USAGE;
      goto done;
    }
    int64_t step = 0;
    const char *dir = dt_engine_resumed_from(e, &step);
    printf("resuming from %s (step %lld)\n", dir, (long long)step);
    fflush(stdout);
  }
  /* A world of one trains here, without a job: nothing to fork (and the
   * single-worker engine has started its loader thread already). */
  int multi = cfg->run.workers + cfg->run.ps.servers > 1 || (L && L->join);
  if (L && L->join && !cfg->run.min_workers && dt_param(DT_PARAM_PS_REJOIN) < 0) {
    fprintf(stderr, "dtrain: --join: the job must be elastic (dist.min_workers, as the running "
            "job's config sets it)\n");
    status = DT_EXIT_USAGE;
    goto done;
  }
  if (multi && (status = make_job(&job, L, ext, cfg, transport, e, &co)) >= 0) goto done;
  if (!out) {
    default_out_dir(outbuf, sizeof outbuf);
    out = outbuf;
  }
  /* Only the process (node) where rank 0 runs writes anything. The run
   * owns its output directory (DIR/.lock, held by this process and the
   * workers it forks): one that cannot be made is bad input; one that
   * another run holds is refused, naming its pid. */
  int has_rank0 = L ? L->node_rank == 0 && !L->join : ext ? ew.rank == 0 : 1;
  if (has_rank0 && (rc = dt_engine_set_out_dir(e, out)) < 0) {
    const char *m = dt_errmsg();
    fprintf(stderr, "dtrain: %s%s\n", strncmp(m, "ckpt.dir", 8) ? "--out: " : "", m);
    status = rc == DT_EAGAIN ? DT_EXIT_FAIL : DT_EXIT_USAGE;
    goto done;
  }
  view v = {NULL, 0, 0};
  if (isatty(STDERR_FILENO)) v.bar = stderr;
  else if (isatty(STDOUT_FILENO)) v.bar = stdout;
  header(cfg, e, L, &ew, ext, has_rank0, out);
  /* this node's ranks: their pages, metrics, diagnosis and traces */
  int r0 = L ? L->node_rank * L->nproc : ext ? ew.rank : 0;
  int nloc = L ? L->nproc : 1;
  if (multi && !ext) nloc = L ? L->nproc : cfg->run.workers;
  dt__cli_obs_begin(&co, out, r0, nloc, cfg->run.obs_metrics, cfg->run.obs_trace);
  dt__cli_obs_launch(&co, L);
  obs_on = 1;
  if (multi) {
    /* elastic with spares: the standby copy they share with this node's
     * workers (mapped before the fork) */
    const dt_run_cfg *rc_ = &cfg->run;
    if (!ext && !(L && L->join) && rc_->min_workers > 0 && (rc_->standby > 0 || rc_->replace) &&
        rc_->standby_refresh_steps > 0 && dt__engine_standby_map(e) < 0)
      fprintf(stderr, "dtrain: warning: %s; spares take the state by broadcast\n", dt_errmsg());
    struct worker_args wa = {e, &cfg->run, cfg->run.ps.servers, cfg->run.workers, out, text, L || ext, &v,
                             ext, &co};
    int jrc = dt_job_run(job, run_worker, &wa);
    if (!ext) dt__cli_obs_after(&co, job);
    status = dt__cli_job_status(job, jrc);
    goto done;
  }
  dt_engine_hooks hooks = {on_step, on_epoch, &v};
  dt_run_summary s;
  dt__cli_obs_serve(&co);
  catch_stop(e, &cfg->run);
  rc = dt_engine_run(e, out, text, &hooks, &s);
  if (v.bar && v.drawn) fprintf(v.bar, "\r\033[K");
  if (rc < 0) {
    fprintf(stderr, "dtrain: %s\n", dt_errmsg());
    status = rc == DT_EABORTED && stop_signal ? 128 + stop_signal : DT_EXIT_FAIL;
  } else {
    final_line(&s, out);
    status = DT_EXIT_OK;
  }
done:
  if (obs_on) dt__cli_obs_end(&co);
  dt_job_destroy(job);
  dt_engine_destroy(e);
  free(text);
  free(cfg);
  return status;
}
