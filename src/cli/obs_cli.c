/*
 * obs_cli.c — the launcher's side of observability for `dtrain train` and
 * `dtrain launch`: before the workers start it clears the previous run's
 * rank pages (DIR/obs), while they run it serves every local rank's
 * metrics on obs.metrics (one port per node) and, when a worker fails or
 * SIGUSR1 arrives, reads every rank's flight recorder and prints the hang
 * diagnosis naming the rank that is behind (DIR/diagnosis.txt, with each
 * rank's recorder in DIR/obs/flight.txt); after the job it merges the
 * per-rank traces into DIR/trace.json. Under `dtrain launch` the node
 * launchers leave their endpoints in the rendezvous store: node 0's
 * endpoint then shows every node's ranks, and a diagnosis on any node
 * reads every node's recorders (GET /pages). Under mpirun/srun there is no
 * launcher: the first rank of each host serves that host's ranks
 * (dt__cli_obs_serve_ranks, called by cmd_train.c once the ranks have
 * met), a rank whose collective fails prints the job's diagnosis (the
 * first to claim it), and SIGUSR1 (which mpirun forwards to every rank)
 * makes each rank dump its recorder and the lowest live rank diagnose.
 * The work itself is src/obs; this file decides when and prints.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/core.h"
#include "elastic/elastic.h"
#include "obs/obs_diag.h"

static volatile sig_atomic_t usr1_seen;
static volatile sig_atomic_t usr1_fd = -1; /* under mpirun/srun: the answering thread's pipe */
static void on_usr1(int sig) {
  (void)sig;
  usr1_seen = 1;
  int fd = usr1_fd, e = errno;
  if (fd >= 0) (void)!write(fd, "u", 1);
  errno = e;
}

/* Removes an earlier run's files of ranks r0..r0+n-1 (several processes
 * of one job may share DIR under mpirun: each clears only its own). */
static void clear_obs_dir(const char *dir, int r0, int n) {
  static const char *const pat[] = {"%s/rank-%d", "%s/trace-rank-%d.json", "%s/flight-rank-%d.txt"};
  for (int r = r0; r < r0 + n; r++)
    for (int i = 0; i < 3; i++) {
      char p[DT_CFG_PATH_MAX + 64];
      snprintf(p, sizeof p, pat[i], dir, r);
      unlink(p);
    }
}

int dt__cli_obs_begin(struct dt__cli_obs *co, const char *out, int r0, int n, const char *metrics,
                      int trace) {
  memset(co, 0, sizeof *co);
  co->me = -1;
  co->usr1_pipe[0] = co->usr1_pipe[1] = -1;
  snprintf(co->dir, sizeof co->dir, "%s/obs", out);
  snprintf(co->out, sizeof co->out, "%s", out);
  co->r0 = r0;
  co->n = n;
  co->trace = trace;
  snprintf(co->metrics, sizeof co->metrics, "%s", metrics ? metrics : "");
  clear_obs_dir(co->dir, r0, n);
  if (r0 == 0) {
    char p[DT_CFG_PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/diagnosis.txt", out);
    unlink(p);
    snprintf(p, sizeof p, "%s/trace.json", out);
    unlink(p);
    snprintf(p, sizeof p, "%s/obs/flight.txt", out);
    unlink(p);
    snprintf(p, sizeof p, "%s/obs/diagnosis.claim", out);
    unlink(p);
  }
  usr1_seen = 0;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_usr1;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, &co->old_usr1);
  co->have_old = 1;
  return DT_OK;
}

/* Every rank's page this process can read: the files of its own ranks
 * (co->mine, or r0..r0+n-1) and the pages other hosts' (nodes') endpoints
 * answer GET /pages with. pg, ok, ranks hold co->world (or n) entries;
 * returns how many. */
static int collect(struct dt__cli_obs *co, struct dt_obs_page **pgp, int **okp, int **rkp,
                   char **stp) {
  int world = co->world > 0 ? co->world : co->r0 + co->n;
  struct dt_obs_page *pg = calloc((size_t)world, sizeof *pg);
  int *ok = calloc((size_t)world, sizeof *ok), *rk = calloc((size_t)world, sizeof *rk);
  char *stv = calloc((size_t)world, 1), tst[64];
  struct dt_obs_page *tmp = co->npeers ? malloc(64 * sizeof *tmp) : NULL;
  if (!pg || !ok || !rk || !stv || (co->npeers && !tmp)) {
    free(pg), free(ok), free(rk), free(stv), free(tmp);
    return dt__seterr(DT_ENOMEM, "diagnosis: out of memory");
  }
  for (int r = 0; r < world; r++) rk[r] = r;
  int nmine = co->mine ? co->nmine : co->n;
  for (int i = 0; i < nmine; i++) {
    int r = co->mine ? co->mine[i] : co->r0 + i;
    char path[DT_CFG_PATH_MAX + 64];
    if (r < 0 || r >= world) continue;
    dt__obs_rank_path(co->dir, r, path, sizeof path);
    ok[r] = dt__obs_read(path, &pg[r]) == DT_OK && pg[r].rank == r;
  }
  for (int p = 0; p < co->npeers; p++) {
    int k = co->peers[p][0] ? dt_obs_fetch_pages(co->peers[p], tmp, tst, 64) : 0;
    for (int j = 0; j < k; j++) {
      int r = tmp[j].rank;
      if (r >= 0 && r < world && !ok[r]) pg[r] = tmp[j], ok[r] = 1, stv[r] = tst[j];
    }
  }
  free(tmp);
  /* a job of one node: only its own ranks */
  int first = co->world > 0 ? 0 : co->r0, n = world - first;
  if (first) {
    memmove(pg, pg + first, (size_t)n * sizeof *pg);
    memmove(ok, ok + first, (size_t)n * sizeof *ok);
    memmove(rk, rk + first, (size_t)n * sizeof *rk);
    memmove(stv, stv + first, (size_t)n);
  }
  *pgp = pg, *okp = ok, *rkp = rk, *stp = stv;
  return n;
}

/* Diagnoses now; prints the line and writes the files. why: what asked. */
static void diagnose(struct dt__cli_obs *co, const char *why) {
  char msg[2048], p[DT_CFG_PATH_MAX + 32];
  struct dt_obs_page *pg;
  int *ok, *rk;
  char *stv;
  int n = collect(co, &pg, &ok, &rk, &stv), rc = n;
  snprintf(p, sizeof p, "%s/flight.txt", co->dir);
  if (n >= 0) {
    FILE *dump = fopen(p, "w");
    rc = dt_obs_diagnose_pages(pg, ok, rk, stv, n, dt_now_ns(), msg, sizeof msg, dump);
    if (dump) fclose(dump);
    free(pg), free(ok), free(rk), free(stv);
  }
  if (rc < 0) {
    fprintf(stderr, "dtrain: hang diagnosis failed: %s\n", dt_errmsg());
    return;
  }
  if (rc == 0 && strcmp(why, "SIGUSR1")) return; /* a failure that is no hang */
  fprintf(stderr, "dtrain: hang diagnosis (%s): %s (every rank's last operations: %s)\n", why, msg,
          p);
  fflush(stderr);
  snprintf(p, sizeof p, "%s/diagnosis.txt", co->out);
  FILE *f = fopen(p, "w");
  if (f) {
    fprintf(f, "%s\n", msg);
    fclose(f);
  }
}

/* "0-3" or "0,2,4": the ranks a server serves, for its line. */
static void rank_list(const int *r, int n, char *buf, size_t cap) {
  int contiguous = 1;
  for (int i = 1; i < n; i++) contiguous &= r[i] == r[0] + i;
  if (contiguous) {
    snprintf(buf, cap, "%d-%d", r[0], r[n - 1]);
    return;
  }
  size_t k = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && k + 16 < cap; i++)
    k += (size_t)snprintf(buf + k, cap - k, "%s%d", i ? "," : "", r[i]);
}

void dt__cli_obs_serve_ranks(struct dt__cli_obs *co, const int *ranks, int n) {
  if (!co->metrics[0] || co->srv || co->serve_tried || n < 1) return;
  co->serve_tried = 1;
  if (dt_obs_server_start(&co->srv, co->metrics, co->dir, ranks, n) < 0) {
    fprintf(stderr, "dtrain: warning: %s; training goes on without it\n", dt_errmsg());
    return;
  }
  char host[64], list[256];
  snprintf(host, sizeof host, "%s", co->metrics);
  char *colon = strrchr(host, ':');
  if (colon) *colon = '\0';
  rank_list(ranks, n, list, sizeof list);
  printf("metrics: http://%s:%d/metrics (ranks %s)\n", host, dt_obs_server_port(co->srv), list);
  fflush(stdout);
}

void dt__cli_obs_advertise(const struct dt__cli_obs *co, char *buf, size_t cap) {
  char host[64];
  snprintf(host, sizeof host, "%s", co->metrics);
  char *colon = strrchr(host, ':');
  if (colon) *colon = '\0';
  if (!strcmp(host, "localhost")) snprintf(host, sizeof host, "127.0.0.1");
  if (!strcmp(host, "0.0.0.0")) { /* every address: name one the others can reach */
    struct ifaddrs *ifs = NULL, *i;
    snprintf(host, sizeof host, "127.0.0.1");
    if (getifaddrs(&ifs) == 0) {
      for (i = ifs; i; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && !(i->ifa_flags & IFF_LOOPBACK) &&
            inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, host, sizeof host))
          break;
      freeifaddrs(ifs);
    }
  }
  snprintf(buf, cap, "%s:%d", host, dt_obs_server_port(co->srv));
}

void dt__cli_obs_serve(struct dt__cli_obs *co) {
  if (!co->metrics[0] || co->srv || co->serve_tried) return;
  int *r = malloc((size_t)co->n * sizeof *r);
  if (!r) {
    co->serve_tried = 1;
    fprintf(stderr, "dtrain: warning: obs.metrics: out of memory; training goes on without it\n");
    return;
  }
  for (int i = 0; i < co->n; i++) r[i] = co->r0 + i;
  dt__cli_obs_serve_ranks(co, r, co->n);
  free(r);
}

/* ---- dtrain launch: the node launchers' endpoints ------------------------------ */

void dt__cli_obs_launch(struct dt__cli_obs *co, const struct dt__launch *L) {
  if (!L || L->join || L->nnodes < 2) return;
  co->L = L;
  co->world = L->nnodes * L->nproc;
  co->meet_until = dt_now() + 120;
}

/* Called from the watch (every few tens of ms) until every node's endpoint
 * is known: this node's goes into the store once, the others' are read
 * without waiting; store calls are tried at most once a second, each
 * bounded by half a second, for two minutes. Node 0's endpoint adds the
 * other nodes' ranks; every node's diagnosis reads them. */
static void launch_meet(struct dt__cli_obs *co) {
  const struct dt__launch *L = co->L;
  if (!L || co->meet_done || !co->srv) return;
  double now = dt_now();
  if (now < co->meet_next) return;
  co->meet_next = now + 1;
  if (now > co->meet_until) {
    fprintf(stderr, "dtrain: warning: obs.metrics: the other nodes' endpoints were not all found "
            "in the rendezvous store within 2 minutes; node %d shows its own ranks\n", L->node_rank);
    co->meet_done = 1;
    goto out;
  }
  if (!co->peers && !(co->peers = calloc((size_t)L->nnodes, sizeof *co->peers))) return;
  if (!co->node_known && !(co->node_known = calloc((size_t)L->nnodes, sizeof *co->node_known)))
    return;
  if (!co->st) {
    char host[256], ip[64], store[80];
    int port = 0;
    const char *token = "";
    if (dt__parse_hostport("--rdzv", L->rdzv, host, sizeof host, &port, 0) < 0 ||
        dt__resolve_ipv4(host, ip, sizeof ip) < 0 || dt__job_token(1, "obs", &token) < 0)
      return;
    snprintf(store, sizeof store, "%s%s", L->etcd ? "etcd://" : "", ip);
    if (dt_elastic_store_connect(&co->st, store, port, token, 0.5) < 0) {
      co->st = NULL;
      return;
    }
  }
  char key[64], val[64];
  if (!co->published) {
    dt__cli_obs_advertise(co, val, sizeof val);
    snprintf(key, sizeof key, "obs/metrics/%d", L->node_rank);
    if (dt_store_set(co->st, key, val, strlen(val), 0.5) < 0) return;
    co->published = 1;
  }
  int missing = 0;
  for (int i = 0; i < L->nnodes; i++) {
    if (i == L->node_rank || co->node_known[i]) continue;
    size_t len = 0;
    snprintf(key, sizeof key, "obs/metrics/%d", i);
    if (dt_store_get(co->st, key, val, sizeof val - 1, &len, 0.01) < 0) {
      missing++;
      continue;
    }
    val[len] = '\0';
    co->node_known[i] = 1;
    snprintf(co->peers[co->npeers++], 64, "%s", val);
    if (L->node_rank == 0 && dt_obs_server_add_peer(co->srv, val) < 0)
      fprintf(stderr, "dtrain: warning: %s\n", dt_errmsg());
  }
  if (missing) return;
  co->meet_done = 1;
  if (L->node_rank == 0) {
    printf("metrics: the endpoint of ranks %d-%d also shows the ranks of %d other node%s\n", co->r0,
           co->r0 + co->n - 1, L->nnodes - 1, L->nnodes > 2 ? "s" : "");
    fflush(stdout);
  }
out:
  dt_store_destroy(co->st);
  co->st = NULL;
}

/* ---- mpirun/srun: the ranks diagnose themselves ------------------------------------- */

/* The lowest rank whose page is here and whose process is neither
 * stopped nor gone (a page from another host: as that host saw it). */
static int lowest_live(struct dt__cli_obs *co) {
  struct dt_obs_page *pg;
  int *ok, *rk, best = -1;
  char *stv;
  int n = collect(co, &pg, &ok, &rk, &stv);
  if (n < 0) return -1;
  for (int i = 0; i < n && best < 0; i++)
    if (ok[i] && !strchr("TtXZ", stv[i] ? stv[i] : dt__obs_proc_state(pg[i].pid))) best = rk[i];
  free(pg), free(ok), free(rk), free(stv);
  return best;
}

/* This rank's own recorder into DIR/obs/flight-rank-R.txt. */
static void dump_self(struct dt__cli_obs *co) {
  char p[DT_CFG_PATH_MAX + 64];
  struct dt_obs_page pg;
  dt__obs_rank_path(co->dir, co->me, p, sizeof p);
  if (dt__obs_read(p, &pg) < 0) return;
  snprintf(p, sizeof p, "%s/flight-rank-%d.txt", co->dir, co->me);
  FILE *f = fopen(p, "w");
  if (!f) return;
  dt_obs_fr_dump(&pg, f, dt_now_ns(), DT_OBS_FR_LEN);
  fclose(f);
}

static void *usr1_main(void *arg) {
  struct dt__cli_obs *co = arg;
  char b;
  for (;;) {
    ssize_t k = read(co->usr1_pipe[0], &b, 1);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break; /* the write end closed: the run is over */
    dump_self(co);
    if (lowest_live(co) == co->me) diagnose(co, "SIGUSR1");
  }
  return NULL;
}

void dt__cli_obs_ext(struct dt__cli_obs *co, int me, int world, const int *local, int nlocal,
                     const char *peers, int npeers) {
  co->me = me;
  co->world = world;
  if (nlocal > 0 && (co->mine = malloc((size_t)nlocal * sizeof *co->mine))) {
    memcpy(co->mine, local, (size_t)nlocal * sizeof *local);
    co->nmine = nlocal;
  }
  if (npeers > 0 && (co->peers = calloc((size_t)npeers, sizeof *co->peers))) {
    for (int i = 0; i < npeers; i++) snprintf(co->peers[i], 64, "%s", peers + (size_t)i * 64);
    co->npeers = npeers;
  }
  if (co->usr1_thread || pipe2(co->usr1_pipe, O_CLOEXEC) < 0) return;
  /* the handler never blocks: a full pipe has a wake-up pending anyway */
  fcntl(co->usr1_pipe[1], F_SETFL, O_NONBLOCK);
  if (pthread_create(&co->usr1_th, NULL, usr1_main, co) != 0) {
    close(co->usr1_pipe[0]), close(co->usr1_pipe[1]);
    co->usr1_pipe[0] = co->usr1_pipe[1] = -1;
    return;
  }
  co->usr1_thread = 1;
  usr1_fd = co->usr1_pipe[1];
}

void dt__cli_obs_rank_failed(struct dt__cli_obs *co, int rc) {
  if (co->me < 0 || !(rc == DT_ETIMEDOUT || rc == DT_EPEERLOST || rc == DT_EMISMATCH ||
                      rc == DT_EABORTED))
    return;
  char p[DT_CFG_PATH_MAX + 32];
  snprintf(p, sizeof p, "%s/diagnosis.claim", co->dir);
  int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return; /* another rank diagnoses */
  close(fd);
  char why[64];
  snprintf(why, sizeof why, "rank %d failed", co->me);
  diagnose(co, why);
}

/* ---- the launcher's watch ---------------------------------------------------------- */

void dt__cli_obs_watch(void *ud, const dt_job *job) {
  struct dt__cli_obs *co = ud;
  dt__cli_obs_serve(co); /* after the fork: the server's thread is the launcher's alone */
  launch_meet(co);
  if (usr1_seen) {
    usr1_seen = 0;
    diagnose(co, "SIGUSR1");
  }
  if (!co->diagnosed && dt_job_failed_worker(job) >= 0) {
    co->diagnosed = 1;
    diagnose(co, "a worker failed");
  }
}

void dt__cli_obs_after(struct dt__cli_obs *co, const dt_job *job) {
  if (job && !co->diagnosed && dt_job_failed_worker(job) >= 0) {
    co->diagnosed = 1;
    diagnose(co, "a worker failed");
  }
}

void dt__cli_obs_end(struct dt__cli_obs *co) {
  if (co->usr1_thread) {
    usr1_fd = -1;
    close(co->usr1_pipe[1]);
    pthread_join(co->usr1_th, NULL);
    close(co->usr1_pipe[0]);
    co->usr1_thread = 0;
  }
  dt_store_destroy(co->st);
  co->st = NULL;
  free(co->mine);
  free(co->peers);
  free(co->node_known);
  co->mine = NULL, co->peers = NULL, co->node_known = NULL;
  co->npeers = co->nmine = 0;
  dt_obs_server_stop(co->srv);
  co->srv = NULL;
  if (co->have_old) sigaction(SIGUSR1, &co->old_usr1, NULL);
  co->have_old = 0;
  if (co->trace && co->r0 == 0) { /* the node of rank 0 (several nodes: its own ranks) */
    char p[DT_CFG_PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/trace.json", co->out);
    if (dt_obs_trace_merge(co->dir, co->r0 + co->n, p) < 0)
      fprintf(stderr, "dtrain: warning: %s\n", dt_errmsg());
  }
}
