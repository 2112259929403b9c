/*
 * cli.h — the command-line layer: argument parsing, config files (INI via
 * libinih) with --set overrides, and one file per subcommand.
 */
#ifndef DT_CLI_H
#define DT_CLI_H

#include <stddef.h>

/* Runs the dtrain command line; returns the process exit status
 * (0 success, 1 runtime failure, 2 bad input / usage). */
int dt_cli_main(int argc, char **argv);

/* Exit statuses. */
enum { DT_EXIT_OK = 0, DT_EXIT_FAIL = 1, DT_EXIT_USAGE = 2 };

/* Subcommands: argv[0] is the subcommand name. */
int dt__cmd_train(int argc, char **argv);
int dt__cmd_bench(int argc, char **argv);
int dt__cmd_env(int argc, char **argv); /* cmd_env.c: every DTRAIN_* knob */

/* Launch paths (cmd_launch.c): `dtrain launch ... -- train ...` hands the
 * train command where this node sits in a multi-node job. */
struct dt__launch {
  int nnodes, node_rank, nproc; /* world = nnodes * nproc */
  char rdzv_host[256];          /* as given (name or address) */
  char rdzv_ip[64];             /* resolved IPv4 */
  int rdzv_port;                /* 0: ephemeral (single node only) */
  char bind_addr[64];           /* tcp transport listen address of this node */
  const char *token;            /* "" = generate (single node) */
  double timeout;               /* DTRAIN_TIMEOUT */
};
int dt__cmd_launch(int argc, char **argv);
/* The train command; launch == NULL is plain `dtrain train`. */
int dt__cmd_train_launch(int argc, char **argv, const struct dt__launch *launch);

/* A job of worker processes forked on this node (local_job.c). */
struct dt__job {
  int nlocal;             /* workers forked here */
  int rank0;              /* global rank of the first of them */
  int world;              /* ranks in the whole job */
  int node, nnodes;       /* this node and the node count (0, 1 for local jobs) */
  const char *serve_addr; /* non-NULL: this node serves the store on serve_addr:rdzv_port */
  const char *rdzv_host;  /* where everyone reaches the store (NULL: 127.0.0.1) */
  int rdzv_port;          /* with serve_addr, 0 = ephemeral */
  const char *token;      /* NULL or "": a fresh one (single-node jobs) */
  const char *bind_addr;  /* tcp listen address of the workers (NULL: 127.0.0.1) */
  const char *host_id;    /* topology id of this node (NULL: the comm default) */
  double timeout;         /* deadline of the node rendezvous, seconds */
  double grace;           /* after a worker fails, seconds the others get */
  int print_pids;         /* print "workers: rank R pid P, ..." first */
};
/* What one forked worker gets. */
struct dt__worker {
  int rank, size, local_rank;
  const char *store_host;
  int store_port;
  const char *token, *bind_addr, *host_id;
};
typedef int (*dt__worker_fn)(const struct dt__worker *w, void *arg);
/* Forks job->nlocal workers running fn (before any thread exists), serves
 * the store if asked, meets the other nodes through it (every node must
 * show up before job->timeout, with the same node count and workers per
 * node), releases the workers and waits for them by pid. Returns the
 * node's exit status. */
int dt__job_run(const struct dt__job *job, dt__worker_fn fn, void *arg);
/* A fresh random job token, hex. */
void dt__make_token(char *hex, size_t cap);
/* A job of n workers on this host only: store on 127.0.0.1, fresh token. */
int dt__local_job_run(int n, dt__worker_fn fn, void *arg, double grace, int print_pids);

/* dist_env.c */
/* Parses an integer in [lo, hi]; on failure prints "dtrain: WHAT 'S':
 * expects ..." and returns -1. */
int dt__parse_int(const char *what, const char *s, long lo, long hi, int *out);
/* HOST:PORT (PORT 1..65535, or 0 if allow_zero); prints the error. */
int dt__parse_hostport(const char *what, const char *s, char *host, size_t hcap, int *port,
                       int allow_zero);
int dt__resolve_ipv4(const char *host, char *ip, size_t cap); /* -1: does not resolve */
/* The local address of the route to ipv4 (connected UDP socket). */
int dt__route_addr(const char *ipv4, char *out, size_t cap);
/* Whether a TCP socket can bind ipv4:port now; why gets strerror. */
int dt__can_bind(const char *ipv4, int port, char *why, size_t cap);
/* Rank and size an external launcher set (mpirun: OMPI_COMM_WORLD_*, PMI_*,
 * srun: SLURM_PROCID/SLURM_NTASKS inside a step). 1 found, 0 none, -1 bad
 * value (printed). */
struct dt__env_world {
  int rank, size;
  const char *source, *rank_var, *size_var;
  char jobid[128]; /* launcher's job id, "" if unknown */
};
int dt__env_world(struct dt__env_world *w);
/* DTRAIN_JOB_TOKEN (at least 16 characters). If unset: "" when
 * !shared_needed, else prints why `who` needs it and returns NULL. */
const char *dt__job_token(int shared_needed, const char *who);

#endif
