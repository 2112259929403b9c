/*
 * local.c — runs this node's share of a job as worker processes (for
 * `dtrain train --workers N`, `dtrain bench allreduce`, every node of
 * `dtrain launch`, and any C program through dt_job_run).
 *
 * Order matters. The memory check and the core warning come first. The
 * workers are forked while this process has one thread (the store
 * server's thread must not exist yet, or a child could inherit a lock it
 * holds, OpenSSL's say). Then the node that serves the rendezvous store
 * starts it, the launchers of a multi-node job meet (rdzv.c), and only
 * then are the workers released: the store port reaches them through a
 * pipe (0 means quit). Each worker joins the communicator and runs the
 * caller's function. The launcher waits on every worker by pid; after the
 * first failure the others get grace_s to notice the lost peer and exit,
 * then are killed.
 *
 * Signals (cfg.handle_signals): SIGINT and SIGTERM are blocked in the
 * launcher and read from a signalfd while it runs (no handler, no global
 * state); the workers get the caller's mask back at once. The first signal
 * sends SIGTERM to every worker and SIGKILL after grace_s, a second one
 * SIGKILL at once. Whatever ended the job, once every worker has been
 * reaped the launcher unlinks the shared-memory segments its workers
 * created (named by the job's token hash and the creator's pid, so a pid
 * reused since by another process is never touched) and stops the store.
 *
 * Elastic jobs (cfg.min_workers): a lost worker is reported to the store,
 * not fatal; with cfg.spares, spare processes are forked with the workers
 * and block on a pipe each; the launcher wakes one per lost worker with the
 * store port and it runs the callback as a joiner (docs/elastic.md).
 *
 * It does not know what a worker does (the callback does), and it does not
 * watch other nodes' workers: their failures reach this node's workers
 * through the communicator (a lost peer), which then exit.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "core/core.h"
#include "elastic/elastic.h"
#include "launch/job_int.h"

/* ---- signals --------------------------------------------------------------- */

static void signals_take(dt_job *j) {
  j->sigfd = -1;
  if (!j->cfg.handle_signals) return;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  if (sigprocmask(SIG_BLOCK, &set, &j->oldmask) < 0) return;
  j->sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  if (j->sigfd < 0) sigprocmask(SIG_SETMASK, &j->oldmask, NULL);
}

static void signals_give_back(dt_job *j) {
  if (j->sigfd < 0) return;
  struct signalfd_siginfo si;
  while (read(j->sigfd, &si, sizeof si) == (ssize_t)sizeof si) { /* consumed: we handled it */ }
  close(j->sigfd);
  j->sigfd = -1;
  sigprocmask(SIG_SETMASK, &j->oldmask, NULL);
}

/* Reads pending signals; returns how many arrived now. The first sets
 * j->signal. */
static int signals_poll(dt_job *j) {
  if (j->sigfd < 0) return 0;
  struct signalfd_siginfo si;
  int n = 0;
  while (read(j->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
    if (!j->signal) j->signal = (int)si.ssi_signo;
    n++;
  }
  return n;
}

static int interrupted(dt_job *j) {
  signals_poll(j);
  return j->signal != 0;
}

/* ---- workers ---------------------------------------------------------------- */

/* The shared page of returns: order[0] counts, order[1 + r] is worker r's
 * place in the order of returns (0: not yet), order[1 + n + r] its status
 * + 1. A worker notes itself before its peers can see it leave, so the
 * launcher blames the worker that failed first, not the first it reaps. */
static void note_return(_Atomic int *order, int n, int r, int status) {
  if (!order) return;
  order[1 + n + r] = (status == 0 ? 0 : (status & 255) ? (status & 255) : 1) + 1;
  order[1 + r] = atomic_fetch_add(&order[0], 1) + 1;
}

/* The forked worker r: waits for the store port, joins, runs fn. */
static void worker_main(dt_job *j, int r, int rfd, pid_t parent, dt_job_worker_fn fn,
                        void *arg, _Atomic int *order) {
  if (j->sigfd >= 0) {
    close(j->sigfd);
    sigprocmask(SIG_SETMASK, &j->oldmask, NULL);
  }
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  int port = 0;
  ssize_t got = read(rfd, &port, sizeof port);
  close(rfd);
  /* port 0, or the launcher's death (which closes the pipe), means quit */
  if (getppid() != parent || got != (ssize_t)sizeof port || port <= 0) _exit(1);
  int rank = j->rank0 + r;
  struct dt_comm_config cc;
  dt__job_comm_config(j, rank, &cc);
  dt_store *st = NULL;
  dt_comm *c = NULL;
  /* dt_comm_create ends with a barrier: no worker function starts (and
   * perhaps returns at once) before every peer has finished connecting */
  if (dt_elastic_store_connect(&st, j->store_host, port, j->token, j->cfg.deadline_s) < 0 ||
      dt_comm_create(&c, st, &cc) < 0) {
    dt__job_say(j, DT_JOB_ERROR, "rank %d: joining the job: %s", rank, dt_errmsg());
    note_return(order, j->nlocal, r, 1);
    dt_comm_destroy(c);
    dt_store_destroy(st);
    fflush(stdout);
    fflush(stderr);
    _exit(1);
  }
  dt_store_destroy(st);
  struct dt_job_worker w = {rank, j->world, r, j->nlocal, j->node, j->nnodes, c,
                            j->store_host, port, &cc, 0, NULL};
  int status = fn(&w, arg);
  note_return(order, j->nlocal, r, status);
  /* a failed worker tells its peers why (a lost rank it saw, say) instead
   * of only closing its connections */
  if (status != 0) dt_comm_abort(c, DT_EABORTED, dt_errmsg());
  dt_comm_destroy(c);
  fflush(stdout);
  fflush(stderr);
  _exit(status == 0 ? 0 : (status & 255) ? (status & 255) : 1);
}

/* A spare (local index r >= nlocal): waits until the launcher wakes it
 * with the store port (0 or the pipe's end: quit, quietly), then runs fn
 * as a joiner. */
static void spare_main(dt_job *j, int r, int rfd, pid_t parent, dt_job_worker_fn fn, void *arg) {
  if (j->sigfd >= 0) {
    close(j->sigfd);
    sigprocmask(SIG_SETMASK, &j->oldmask, NULL);
  }
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (j->cfg.spare_ready) j->cfg.spare_ready(arg);
  int port = 0;
  ssize_t got;
  do got = read(rfd, &port, sizeof port);
  while (got < 0 && errno == EINTR);
  close(rfd);
  if (getppid() != parent || got != (ssize_t)sizeof port || port <= 0) _exit(0);
  struct dt_comm_config cc;
  dt__job_comm_config(j, 0, &cc);
  int k = r - j->nlocal;
  struct dt_job_worker w = {j->world + k, j->world, r, j->nlocal, j->node, j->nnodes, NULL,
                            j->store_host, port, &cc, 1, j->spare_id ? &j->spare_id[k] : NULL};
  int status = fn(&w, arg);
  fflush(stdout);
  fflush(stderr);
  _exit(status == 0 ? 0 : (status & 255) ? (status & 255) : 1);
}

/* Elastic: wakes the next spare to replace a lost worker; 1 if one was. */
static int wake_spare(dt_job *j) {
  int n = j->cfg.spares;
  while (j->spares_used < n) {
    int k = j->spares_used++, fd = j->spare_fd[k];
    j->spare_fd[k] = -1;
    if (fd < 0) continue;
    ssize_t w = write(fd, &j->store_port, sizeof j->store_port);
    close(fd);
    if (w == (ssize_t)sizeof j->store_port) {
      dt__job_say(j, DT_JOB_INFO, "elastic: spare %d (pid %d) takes the lost worker's place", k,
                  j->st[j->nlocal + k].pid);
      return 1;
    }
  }
  dt__job_say(j, DT_JOB_WARN, "elastic: no spare left to replace the lost worker (%d used)", n);
  return 0;
}

/* The spares never woken: told to quit. */
static void quit_spares(dt_job *j) {
  for (int k = 0; j->spare_fd && k < j->cfg.spares; k++)
    if (j->spare_fd[k] >= 0) {
      int zero = 0;
      ssize_t w = write(j->spare_fd[k], &zero, sizeof zero);
      (void)w;
      close(j->spare_fd[k]);
      j->spare_fd[k] = -1;
    }
}

static void record(dt_job *j, int r, int st) {
  struct dt_job_status *s = &j->st[r];
  s->exited = WIFEXITED(st);
  s->code = WIFEXITED(st) ? WEXITSTATUS(st) : 0;
  s->signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
}

static void kill_all(dt_job *j, pid_t *pids, int n, int sig, int say) {
  for (int r = 0; r < n; r++)
    if (pids[r] > 0) {
      if (say)
        dt__job_say(j, DT_JOB_ERROR, "worker rank %d (pid %d) did not exit within %.0f s; "
                    "killing it", j->rank0 + r, (int)pids[r], j->cfg.grace_s);
      kill(pids[r], sig);
    }
}

/* Which worker failed first, once some worker has failed: one killed by a
 * signal in this scan (the others' failures follow from it), else the one
 * whose function returned a failure first (order[], even if it has not
 * exited yet), else one that exited non-zero in this scan. -1: none yet. */
static int first_failure(const dt_job *j, const int *fresh, int nfresh, _Atomic int *order) {
  int n = j->nlocal;
  for (int i = 0; i < nfresh; i++)
    if (j->st[fresh[i]].signal) return fresh[i];
  int best = -1, bo = 0;
  for (int r = 0; order && r < n; r++) {
    int o = order[1 + r], st = order[1 + n + r];
    if (o && st > 1 && (best < 0 || o < bo)) best = r, bo = o;
  }
  if (best >= 0) return best;
  return nfresh ? fresh[0] : -1;
}

/* Elastic jobs: worker r is gone. The members learn it through the store
 * (its death is certain, so they need not wait for its heartbeat). */
static int elastic_lost(dt_job *j, int r) {
  const struct dt_job_status *s = &j->st[r];
  int id = s->rank;
  if (r >= j->nlocal) { /* a spare: unwoken ones are no members; woken ones said their id */
    int k = r - j->nlocal;
    if (k >= j->spares_used || !j->spare_id || j->spare_id[k] < 0) return 0;
    id = j->spare_id[k];
  }
  j->lost++;
  if (s->signal)
    dt__job_say(j, DT_JOB_WARN, "worker rank %d (pid %d) was killed by signal %d; the others go "
                "on without it (elastic)", s->rank, s->pid, s->signal);
  else
    dt__job_say(j, DT_JOB_WARN, "worker rank %d (pid %d) exited with status %d", s->rank, s->pid,
                s->code);
  /* a spare will replace it: the members wait for it (P/el/coming) */
  int spare = j->cfg.spares > 0 && j->spares_used < j->cfg.spares, coming = 0;
  if (!j->el_store && j->store_port > 0 &&
      dt_elastic_store_connect(&j->el_store, j->store_host, j->store_port, j->token, 3) < 0) {
    j->el_store = NULL;
    dt__job_say(j, DT_JOB_WARN, "elastic: cannot reach the store to report rank %d: %s", s->rank,
                dt_errmsg());
  } else {
    coming = spare && dt_elastic_spare_coming(j->el_store, j->name, 1, 3) == DT_OK;
    if (dt_elastic_report_dead(j->el_store, j->name, id, 3) < 0)
      dt__job_say(j, DT_JOB_WARN, "elastic: reporting member %d: %s", id, dt_errmsg());
  }
  int woke = j->cfg.spares > 0 && wake_spare(j);
  if (coming && !woke) dt_elastic_spare_coming(j->el_store, j->name, -1, 3);
  return woke;
}

/* Waits for every started worker by pid (pids[r] becomes 0 once reaped).
 * quiet: the workers were told to quit, their exits are no failures. */
static void reap(dt_job *j, pid_t *pids, int n, int quiet, _Atomic int *order) {
  /* spares count once woken (index below nlocal + spares_used) */
  int left = 0;
  for (int r = 0; r < n; r++) left += pids[r] > 0 && r < j->nlocal + j->spares_used;
  int *fresh = calloc((size_t)(n > 0 ? n : 1), sizeof *fresh);
  double kill_at = 0;
  int killed = 0;
  /* a scan costs one waitpid per live worker: scan less often when many */
  int period_ms = 20 * (n > 64 ? n / 64 : 1);
  while (left > 0) {
    int was = j->signal, now = signals_poll(j);
    if (now && !was) {
      kill_all(j, pids, n, SIGTERM, 0);
      kill_at = dt_now() + j->cfg.grace_s;
      killed = 0;
    } else if (now && was) {
      kill_all(j, pids, n, SIGKILL, 0); /* asked twice: no more grace */
      killed = 1;
    }
    int nfresh = 0;
    for (int r = 0; r < n; r++) {
      if (pids[r] <= 0) continue;
      int st;
      pid_t p = waitpid(pids[r], &st, WNOHANG);
      if (p == 0 || (p < 0 && errno == EINTR)) continue;
      pids[r] = 0;
      if (r < j->nlocal + j->spares_used) left--;
      if (p < 0) { /* not our child any more: count it as lost */
        j->st[r].exited = 0;
        j->st[r].signal = SIGKILL;
      } else {
        record(j, r, st);
      }
      int ok = j->st[r].exited && j->st[r].code == 0;
      if (r >= j->nlocal + j->spares_used) continue; /* an unwoken spare: no member */
      if (!ok && !quiet && !j->signal && fresh) fresh[nfresh++] = r; /* after a signal: ours */
    }
    if (j->cfg.expendable_from > 0 && !quiet && !j->signal) {
      /* ranks that may die (servers with replicas): the others go on */
      int keep = 0;
      for (int i = 0; i < nfresh; i++) {
        const struct dt_job_status *s = &j->st[fresh[i]];
        if (s->rank < j->cfg.expendable_from || j->expended >= j->cfg.expendable_max) {
          fresh[keep++] = fresh[i];
          continue;
        }
        j->expended++;
        dt__job_say(j, DT_JOB_WARN, "rank %d (pid %d) %s %d; the others go on without it (%d "
                    "of %d such losses survivable)", s->rank, s->pid,
                    s->signal ? "was killed by signal" : "exited with status",
                    s->signal ? s->signal : s->code, j->expended, j->cfg.expendable_max);
      }
      nfresh = keep;
    }
    if (j->cfg.min_workers > 0 && !quiet && !j->signal) {
      /* elastic: a lost worker is reported to the store; the others go on */
      for (int i = 0; i < nfresh; i++) left += elastic_lost(j, fresh[i]);
      nfresh = 0;
    }
    /* elastic: no failure stops the others (the workers decide themselves) */
    int f = j->failed < 0 && !quiet && !j->signal && j->cfg.min_workers <= 0
                ? first_failure(j, fresh, nfresh, order) : -1;
    if (f >= 0) {
      j->failed = f;
      kill_at = dt_now() + j->cfg.grace_s;
      if (j->st[f].signal)
        dt__job_say(j, DT_JOB_ERROR, "worker rank %d (pid %d) was killed by signal %d; stopping "
                    "the other workers", j->st[f].rank, j->st[f].pid, j->st[f].signal);
    }
    for (int i = 0; i < nfresh; i++) {
      int r = fresh[i];
      if (r != j->failed && j->st[r].signal)
        dt__job_say(j, DT_JOB_ERROR, "worker rank %d (pid %d) was killed by signal %d",
                    j->st[r].rank, j->st[r].pid, j->st[r].signal);
    }
    if (left > 0 && (j->failed >= 0 || j->signal) && !killed && dt_now() > kill_at) {
      kill_all(j, pids, n, SIGKILL, !j->signal);
      killed = 1;
    }
    if (left <= 0) break;
    if (j->cfg.watch && !quiet) j->cfg.watch(j->cfg.watch_ud, j);
    if (j->sigfd >= 0) {
      struct pollfd pf = {j->sigfd, POLLIN, 0};
      poll(&pf, 1, period_ms);
    } else {
      struct timespec ts = {0, period_ms * 1000000L};
      nanosleep(&ts, NULL);
    }
  }
  free(fresh);
}

/* ---- the sweeper: cleanup when the launcher itself is killed ------------------ */

/* Sweeps the job's shared memory, given the worker pids it has. */
static void sweep(const dt_job *j, const int *pids, int n) {
  dt__shm_sweep_job(j->token, j->name, pids, n);
  dt__window_sweep_pids(pids, n);
}

/* Whether pid is gone (or a zombie nobody reaps: as good as gone here). */
static int gone(int pid) {
  if (kill(pid, 0) < 0) return errno == ESRCH;
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "re");
  if (!f) return 1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *rp = strrchr(buf, ')');
  return rp && rp[1] == ' ' && rp[2] == 'Z';
}

/* A small process forked before anything else, which outlives a launcher
 * killed by SIGKILL (nothing else can clean up then): it reads the worker
 * pids from a pipe; -1 means the launcher finished and cleans up itself;
 * end of file without it means the launcher died, and once its workers
 * are gone too (PR_SET_PDEATHSIG, at most a few seconds) it unlinks the
 * job's shared memory. It ignores SIGINT and SIGTERM, which a Ctrl-C sends
 * to the whole process group, so it lives to do that. Returns its pid and
 * the pipe's write end, or -1 (the job then runs without it). */
static pid_t sweeper_start(const dt_job *j, int *wfd) {
  int p[2];
  *wfd = -1;
  if (pipe2(p, O_CLOEXEC) < 0) return -1;
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid != 0) {
    close(p[0]);
    if (pid < 0) {
      close(p[1]);
      return -1;
    }
    *wfd = p[1];
    return pid;
  }
  signal(SIGINT, SIG_IGN);
  signal(SIGTERM, SIG_IGN);
  close(p[1]);
  int *pids = calloc((size_t)j->nlocal, sizeof *pids), n = 0, v;
  while (read(p[0], &v, sizeof v) == (ssize_t)sizeof v) {
    if (v < 0) _exit(0); /* the launcher cleans up */
    if (pids && n < j->nlocal) pids[n++] = v;
  }
  double until = dt_now() + 5;
  for (int i = 0; i < n; i++)
    while (!gone(pids[i]) && dt_now() < until) {
      struct timespec ts = {0, 10 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
  if (pids) sweep(j, pids, n);
  _exit(0);
}

static void sweeper_stop(pid_t pid, int wfd) {
  if (pid <= 0) return;
  int done = -1;
  ssize_t w = write(wfd, &done, sizeof done);
  (void)w;
  close(wfd);
  while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
  }
}

/* ---- the run -------------------------------------------------------------------- */

static void warn_host(dt_job *j) {
  struct dt__host_mem m;
  dt__host_mem(&m);
  if (m.cores > 0 && j->nlocal > m.cores)
    dt__job_say(j, DT_JOB_WARN, "warning: %d workers on %d online core%s: each gets less than a "
                "core and they wait for each other (expect slower training than with %d)",
                j->nlocal, m.cores, m.cores == 1 ? "" : "s", m.cores);
  if (j->node == 0 && !strcmp(j->rdzv_ip, "0.0.0.0"))
    dt__job_say(j, DT_JOB_WARN, "note: rdzv 0.0.0.0:%d: the rendezvous store listens on every "
                "interface of this machine (connections still need the job token)",
                j->rdzv_port);
}

int dt__job_run_local(dt_job *j, dt_job_worker_fn fn, void *arg) {
  warn_host(j);
  const int nsp = j->cfg.spares > 0 ? j->cfg.spares : 0, total = j->nlocal + nsp;
  pid_t *pids = calloc((size_t)total, sizeof *pids);
  int *spids = calloc((size_t)total, sizeof *spids);
  int *srfd = calloc((size_t)nsp + 1, sizeof *srfd);
  j->spare_fd = calloc((size_t)nsp + 1, sizeof *j->spare_fd);
  j->spare_id = nsp ? mmap(NULL, (size_t)nsp * sizeof(int), PROT_READ | PROT_WRITE,
                           MAP_SHARED | MAP_ANONYMOUS, -1, 0) : NULL;
  if (j->spare_id == MAP_FAILED) j->spare_id = NULL;
  j->spares_used = 0;
  int pfd[2] = {-1, -1}, prc = 0;
  for (int k = 0; k < nsp; k++) {
    int sp[2] = {-1, -1};
    if (!j->spare_id) prc = -1;
    else j->spare_id[k] = -1;
    if (prc == 0) prc = pipe2(sp, O_CLOEXEC);
    srfd[k] = sp[0];
    j->spare_fd[k] = sp[1];
  }
  if (!pids || !spids || !srfd || !j->spare_fd || prc < 0 || pipe2(pfd, O_CLOEXEC) < 0) {
    for (int k = 0; srfd && j->spare_fd && k < nsp; k++) {
      if (srfd[k] > 0) close(srfd[k]);
      if (j->spare_fd[k] > 0) close(j->spare_fd[k]);
    }
    free(pids);
    free(spids);
    free(srfd);
    free(j->spare_fd);
    j->spare_fd = NULL;
    if (j->spare_id) munmap(j->spare_id, (size_t)nsp * sizeof(int));
    j->spare_id = NULL;
    return dt__seterr(DT_ENOMEM, "job: node %d: out of resources for %d workers: %s", j->node,
                      total, strerror(errno));
  }
  int swfd;
  pid_t swpid = sweeper_start(j, &swfd);
  /* one shared page (or more) where workers note the order they return in */
  size_t order_len = ((size_t)(2 * j->nlocal + 1) * sizeof(int) + 4095) & ~(size_t)4095;
  _Atomic int *order = mmap(NULL, order_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                            -1, 0);
  if (order == MAP_FAILED) order = NULL;
  signals_take(j);
  pid_t parent = getpid();
  fflush(stdout);
  fflush(stderr);
  int started = 0, rc = DT_OK;
  for (int r = 0; r < total; r++) {
    pid_t p = fork();
    if (p == 0) {
      close(pfd[1]);
      if (swfd >= 0) close(swfd);
      for (int k = 0; k < nsp; k++) {
        close(j->spare_fd[k]);
        if (k != r - j->nlocal) close(srfd[k]);
      }
      if (r >= j->nlocal) {
        close(pfd[0]);
        spare_main(j, r, srfd[r - j->nlocal], parent, fn, arg); /* does not return */
      }
      worker_main(j, r, pfd[0], parent, fn, arg, order); /* does not return */
    }
    if (p < 0) {
      rc = dt__seterr(DT_EIO, "job: node %d: fork of worker rank %d: %s", j->node, j->rank0 + r,
                      strerror(errno));
      break;
    }
    pids[r] = p;
    spids[r] = (int)p;
    if (swfd >= 0) {
      int v = (int)p;
      ssize_t w = write(swfd, &v, sizeof v);
      (void)w;
    }
    j->st[r].pid = (int)p;
    started++;
  }
  close(pfd[0]);
  for (int k = 0; k < nsp; k++) close(srfd[k]);
  free(srfd);
  dt_store_server *srv = NULL;
  int port = j->rdzv_port;
  if (rc == DT_OK && j->node == 0 && !j->etcd) {
    rc = dt_store_server_start(&srv, j->rdzv_ip, j->rdzv_port, j->token);
    if (rc < 0) rc = dt__preerr(rc, "node %d: rendezvous store on %s:%d", j->node, j->rdzv_ip,
                                j->rdzv_port);
    else port = dt_store_server_port(srv);
  }
  if (rc == DT_OK && j->nnodes > 1) rc = dt__job_meet_nodes(j, j->store_host, port, interrupted);
  if (rc == DT_OK && interrupted(j)) rc = DT_EABORTED;
  if (rc < 0) port = 0;
  if (rc == DT_OK && j->cfg.print_pids) {
    size_t cap = 32 + (size_t)started * 40, len = 0;
    char *line = malloc(cap);
    if (line) {
      len += (size_t)snprintf(line, cap, "workers:");
      for (int r = 0; r < started && r < j->nlocal; r++)
        len += (size_t)snprintf(line + len, cap - len, " rank %d pid %d%s", j->rank0 + r,
                                (int)pids[r], r + 1 < j->nlocal ? "," : "");
      for (int r = j->nlocal; r < started; r++)
        len += (size_t)snprintf(line + len, cap - len, "%s spare %d pid %d",
                                r == j->nlocal ? ";" : ",", r - j->nlocal, (int)pids[r]);
      dt__job_say(j, DT_JOB_INFO, "%s", line);
      free(line);
    }
  }
  j->store_port = port;
  for (int r = 0; r < started && r < j->nlocal; r++) {
    ssize_t w = write(pfd[1], &port, sizeof port);
    (void)w;
  }
  if (port <= 0) quit_spares(j);
  close(pfd[1]);
  /* the reason (meeting, store) is kept; workers told to quit exit 1 quietly */
  char why[1024];
  snprintf(why, sizeof why, "%s", rc < 0 ? dt_errmsg() : "");
  int failed_before = rc < 0;
  reap(j, pids, started, failed_before, order);
  /* spares never woken: told to quit, and waited for (they only read a pipe) */
  quit_spares(j);
  for (int r = j->nlocal; r < started; r++)
    if (pids[r] > 0) {
      int st;
      double until = dt_now() + 5;
      while (waitpid(pids[r], &st, WNOHANG) == 0 && dt_now() < until) {
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
      }
      if (waitpid(pids[r], &st, WNOHANG) == 0) {
        kill(pids[r], SIGKILL);
        waitpid(pids[r], &st, 0);
      }
      record(j, r, st);
      pids[r] = 0;
    }
  free(j->spare_fd);
  j->spare_fd = NULL;
  if (j->spare_id) munmap(j->spare_id, (size_t)nsp * sizeof(int));
  j->spare_id = NULL;
  if (order) munmap((void *)order, order_len);
  dt_store_destroy(j->el_store);
  j->el_store = NULL;
  dt_store_server_stop(srv);
  /* etcd: the job's keys go (node 0, once its workers are gone) */
  if (j->etcd && j->node == 0 && port > 0 && dt_elastic_store_clear(j->store_host, port, j->token, 3) < 0)
    dt__job_say(j, DT_JOB_WARN, "etcd: the job's keys were not removed: %s", dt_errmsg());
  int swept = dt__shm_sweep_job(j->token, j->name, spids, started) +
              dt__window_sweep_pids(spids, started);
  sweeper_stop(swpid, swfd);
  signals_give_back(j);
  free(pids);
  free(spids);
  if (j->signal) {
    return dt__seterr(DT_EABORTED, "interrupted by %s: stopped %d worker%s%s", 
                      j->signal == SIGINT ? "SIGINT" : j->signal == SIGTERM ? "SIGTERM" : "a signal",
                      started, started == 1 ? "" : "s",
                      swept ? " and removed the job's shared memory" : "");
  }
  if (failed_before) return dt__seterr(rc, "%s", why);
  if (j->cfg.min_workers > 0 && j->failed < 0) {
    /* elastic: the job succeeded if some worker did */
    int ok = 0, first = -1;
    for (int r = 0; r < started && r < j->nlocal + j->spares_used; r++) {
      if (j->st[r].exited && j->st[r].code == 0) ok++;
      else if (first < 0) first = r;
    }
    if (!ok && first >= 0) {
      const struct dt_job_status *s = &j->st[first];
      return dt__seterr(DT_EABORTED, "no worker finished (elastic job): worker rank %d (pid %d) "
                        "%s %d", s->rank, s->pid, s->signal ? "was killed by signal" :
                        "exited with status", s->signal ? s->signal : s->code);
    }
  }
  if (j->failed >= 0) {
    const struct dt_job_status *s = &j->st[j->failed];
    if (s->signal)
      return dt__seterr(DT_EPEERLOST, "worker rank %d (pid %d) was killed by signal %d", s->rank,
                        s->pid, s->signal);
    return dt__seterr(DT_EABORTED, "worker rank %d (pid %d) exited with status %d", s->rank,
                      s->pid, s->code);
  }
  return DT_OK;
}
