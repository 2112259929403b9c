/*
 * cli.h — the command-line layer: argument parsing, config files (INI via
 * libinih) with --set overrides, and one file per subcommand. Launching
 * (forking workers, meeting nodes, mpirun/srun) is the launch layer's
 * (src/launch, dtrain/job.h); the commands only turn flags into a job
 * config and report what the job says.
 */
#ifndef DT_CLI_H
#define DT_CLI_H

#include <pthread.h>
#include <signal.h>
#include <stddef.h>

#include "engine/engine.h"
#include "launch/launch.h"

/* Runs the dtrain command line; returns the process exit status
 * (0 success, 1 runtime failure, 2 bad input / usage, 130/143 stopped by
 * SIGINT/SIGTERM). */
int dt_cli_main(int argc, char **argv);

/* Exit statuses. */
enum { DT_EXIT_OK = 0, DT_EXIT_FAIL = 1, DT_EXIT_USAGE = 2 };

/* Subcommands: argv[0] is the subcommand name. */
int dt__cmd_train(int argc, char **argv);
int dt__cmd_bench(int argc, char **argv);
int dt__cmd_launch(int argc, char **argv);
int dt__cmd_env(int argc, char **argv); /* cmd_env.c: every DTRAIN_* knob */
int dt__cmd_ckpt(int argc, char **argv);   /* cmd_ckpt.c: ckpt ls|verify */
int dt__cmd_export(int argc, char **argv); /* cmd_ckpt.c: weights out as safetensors */
int dt__cmd_report(int argc, char **argv); /* cmd_report.c: RUN_DIR/report.html */

/* `dtrain launch ... -- train ...` hands the train command where this node
 * sits in a multi-node job (cmd_launch.c checked every value). */
struct dt__launch {
  int nnodes, node_rank, nproc; /* world = nnodes * nproc */
  char rdzv[300];               /* "HOST:PORT", "" for the single-node default */
  char bind_addr[64];           /* "" = the route's source address */
  int join;                     /* --join: one worker joining a running elastic job */
  int standby;                  /* --standby K (-1: not given) */
  int etcd;                     /* --rdzv-backend etcd */
};
/* The train command; launch == NULL is plain `dtrain train`. */
int dt__cmd_train_launch(int argc, char **argv, const struct dt__launch *launch);

/* Shared by the commands that run a job (job_cli.c): prints the job's
 * lines (info to stdout, warnings and errors to stderr as "dtrain: ...")
 * and turns dt_job_run's result into an exit status: 0; 130/143 after
 * SIGINT/SIGTERM (with the one-line reason); the first failed worker's
 * status (2 if it exited 2, else 1; the worker said why); or 1 with the
 * launcher's reason. */
void dt__cli_job_notify(void *ud, int level, const char *line);
int dt__cli_job_status(const dt_job *job, int rc);
/* A loss as printed: "0.3127", "NaN" (never "-nan"), "inf", "-inf". */
void dt__cli_fmt_loss(double x, char *buf, size_t cap);

/* The launcher's observability (obs_cli.c): clears DIR/obs, catches
 * SIGUSR1; watch (a dt_job_config.watch) serves metrics and prints the hang
 * diagnosis on a worker's failure or SIGUSR1; end merges the traces. */
struct dt__cli_obs {
  char out[DT_CFG_PATH_MAX], dir[DT_CFG_PATH_MAX + 8];
  char metrics[64];
  int r0, n, trace, diagnosed, have_old, serve_tried;
  struct sigaction old_usr1;
  struct dt_obs_server *srv;
  /* the whole job, for a diagnosis that names ranks of other hosts/nodes */
  int world;            /* ranks in the job (0: this node's r0..r0+n-1 only) */
  int me;               /* under mpirun/srun: this process's rank; else -1 */
  int *mine, nmine;     /* the ranks whose pages are files here (NULL: r0..r0+n-1) */
  char (*peers)[64];    /* other hosts' (nodes') endpoints, whose GET /pages is read */
  int npeers;
  /* dtrain launch: node launchers leave their endpoints in the rendezvous store */
  const struct dt__launch *L;
  struct dt_store *st;
  double meet_next, meet_until;
  int published, meet_done, *node_known;
  /* under mpirun/srun: the thread that answers SIGUSR1 */
  int usr1_pipe[2], usr1_thread;
  pthread_t usr1_th;
};
int dt__cli_obs_begin(struct dt__cli_obs *co, const char *out, int r0, int n, const char *metrics,
                      int trace);
void dt__cli_obs_watch(void *ud, const dt_job *job);
/* Starts the metrics endpoint (obs.metrics), once; never before a fork. */
void dt__cli_obs_serve(struct dt__cli_obs *co);
/* The same for the n ranks in ranks[] (under mpirun/srun: this host's). */
void dt__cli_obs_serve_ranks(struct dt__cli_obs *co, const int *ranks, int n);
/* "IP:PORT" of the running endpoint as another host can reach it (the
 * address of obs.metrics; for 0.0.0.0 this host's first non-loopback IPv4). */
void dt__cli_obs_advertise(const struct dt__cli_obs *co, char *buf, size_t cap);
/* Under mpirun/srun (this process is rank me of world, the ranks of its
 * host in local[], the other hosts' endpoints in peers[], each "IP:PORT"
 * or "" for a host without one): what a diagnosis reads; starts the thread
 * that answers SIGUSR1 (it dumps this rank's recorder; the lowest rank
 * that is neither stopped nor gone prints the job's diagnosis). */
void dt__cli_obs_ext(struct dt__cli_obs *co, int me, int world, const int *local, int nlocal,
                     const char *peers, int npeers);
/* This rank's run failed with rc under mpirun/srun: the first rank to
 * claim DIR/obs/diagnosis.claim prints the job's hang diagnosis. */
void dt__cli_obs_rank_failed(struct dt__cli_obs *co, int rc);
/* dtrain launch: this node's place in the job (the rendezvous store,
 * where the node launchers leave their metrics endpoints: node 0's then
 * shows every node's ranks, and a diagnosis on any node reads them all). */
void dt__cli_obs_launch(struct dt__cli_obs *co, const struct dt__launch *L);
/* After the job: the diagnosis of a failure the watch had no turn to see
 * (the last worker's exit ends the job's loop before the watch runs). */
void dt__cli_obs_after(struct dt__cli_obs *co, const dt_job *job);
void dt__cli_obs_end(struct dt__cli_obs *co);

#endif
