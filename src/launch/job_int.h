/*
 * job_int.h — the job handle shared by the launch layer's files: job.c
 * (create, from_env, accessors), local.c (forked workers), rdzv.c (the
 * node meeting) and external.c (a rank of mpirun/srun). Nothing outside
 * src/launch includes it.
 */
#ifndef DT_LAUNCH_JOB_INT_H
#define DT_LAUNCH_JOB_INT_H

#include <limits.h>
#include <signal.h>

#include "launch/launch.h"

struct dt_job {
  struct dt_job_config cfg; /* the caller's, with defaults filled in */
  int external;             /* 1: this process is one rank (dt_job_from_env) */
  int world, nlocal, rank0, node, nnodes;
  const char *transport, *name, *token;
  char token_buf[40];       /* a fresh token for a single-node job */
  char rdzv_host[256], rdzv_ip[64];
  char store_host[80];      /* what store clients dial: rdzv_ip, or "etcd://" rdzv_ip */
  int etcd;                 /* rdzv_backend etcd: nobody serves a store */
  int rdzv_port;            /* 0: any free port (single node) */
  char bind[64];
  char host_id[320];        /* "" = the comm default */
  /* external jobs */
  struct dt__env_world ew;
  char dir[PATH_MAX];       /* file store directory ("" with a TCP store) */
  /* results */
  int ran;
  struct dt_job_status *st; /* nlocal of them */
  int failed;               /* local rank of the first failure, -1 */
  int signal;               /* SIGINT/SIGTERM that stopped the job, 0 */
  int sigfd;                /* signalfd while running, -1 */
  /* elastic jobs (cfg.min_workers > 0): deaths are reported, not fatal */
  int store_port;           /* the rendezvous store's port once known */
  struct dt_store *el_store; /* client the launcher reports deaths through */
  int lost;                 /* workers of this node lost so far */
  int expended;             /* expendable ranks (cfg.expendable_from) lost so far */
  /* spares (cfg.spares): local ranks nlocal.. of st[]; each waits on its
   * own pipe (spare_fd) for the store port; woken: it joins */
  int *spare_fd;            /* write ends, -1 once used */
  int *spare_id;            /* shared page: a woken spare's member id, or -1 */
  int spares_used;
  sigset_t oldmask;
};

/* Says one line through cfg.notify (or dt_log) at level (enum dt_job_level). */
void dt__job_say(const dt_job *j, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The comm config of a worker of j with global rank `rank`. */
struct dt_comm_config;
void dt__job_comm_config(const dt_job *j, int rank, struct dt_comm_config *cc);

int dt__job_run_local(dt_job *j, dt_job_worker_fn fn, void *arg);
int dt__job_run_external(dt_job *j, dt_job_worker_fn fn, void *arg);
/* The launchers of j's nodes meet through the store at host:port. stop()
 * polls for an interruption between short waits (may be NULL). */
int dt__job_meet_nodes(dt_job *j, const char *host, int port, int (*stop)(dt_job *));

#endif /* DT_LAUNCH_JOB_INT_H */
