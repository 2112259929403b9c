/*
 * dtrain/job.h — jobs: start the worker processes of a data-parallel job
 * and hand each one a ready communicator.
 *
 * A job is the set of ranks 0..size-1 that train one model together. This
 * header starts them in one of two ways:
 *
 *   - dt_job_create(): this process is the launcher of one node. It forks
 *     `nproc_per_node` workers, serves the rendezvous store (node 0), meets
 *     the other nodes' launchers (several nodes), releases the workers,
 *     watches them by pid and returns when every one has exited. A single
 *     node with `workers = N` is the common case:
 *
 *         struct dt_job_config jc = DT_JOB_CONFIG_INIT;
 *         jc.workers = 2;
 *         dt_job *job = NULL;
 *         int rc = dt_job_create(&job, &jc);
 *         if (rc == DT_OK) rc = dt_job_run(job, my_worker, my_arg);
 *         if (rc < 0) fprintf(stderr, "%s\n", dt_errmsg());
 *         dt_job_destroy(job);
 *
 *     where my_worker(w, arg) runs in each forked worker with w->rank,
 *     w->size and a joined communicator w->comm.
 *
 *   - dt_job_from_env(): this process is already one rank of a job started
 *     by mpirun or srun (their rank and size variables are set). dt_job_run
 *     then joins the others and calls the worker function once, in this
 *     process.
 *
 * Errors: every function that can fail returns DT_OK (0) or a negative
 * DT_E* code (dtrain.h) and leaves one line in dt_errmsg() naming the
 * argument, node or rank. Nothing here calls exit() or prints, except
 * through the config's notify callback (or, when it is NULL, dt_log).
 *
 * Forking: dt_job_run forks the workers first, before it starts any
 * thread of its own; call it while the calling process has one thread
 * (before starting threads of your own), as with any fork without exec.
 * Everything the process holds at that point (a loaded data set, a built
 * model) is shared copy-on-write with the workers.
 */
#ifndef DTRAIN_JOB_H
#define DTRAIN_JOB_H

#include <stddef.h>

#include "dtrain/comm.h" /* dt_comm */
#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_job dt_job;

/* What the job's launcher says while it runs: one line without a trailing
 * newline. DT_JOB_INFO: facts a user may want on stdout ("workers: rank 0
 * pid 811, rank 1 pid 812"); DT_JOB_WARN: something to know ("warning: 64
 * workers on 2 online cores ..."); DT_JOB_ERROR: a failure as it happens
 * ("worker rank 3 (pid 812) was killed by signal 9; stopping the other
 * workers"). Called from the launcher, and from a worker whose
 * communicator cannot be joined (then just before it exits 1). */
enum dt_job_level { DT_JOB_INFO = 0, DT_JOB_WARN = 1, DT_JOB_ERROR = 2 };
typedef void (*dt_job_notify_fn)(void *ud, int level, const char *line);

/* How to start a job. Initialise with DT_JOB_CONFIG_INIT, then set what
 * differs. Strings are borrowed: they must live until dt_job_destroy. */
struct dt_job_config {
  int workers;          /* ranks in the whole job; 0: nnodes * nproc_per_node.
                         * For one node this is all you set. 1..4096 */
  int nproc_per_node;   /* workers forked on this node; 0: workers / nnodes */
  int nnodes;           /* nodes (launchers) in the job, 1..1024 */
  int node_rank;        /* this node, 0..nnodes-1; its workers are the global
                         * ranks node_rank*nproc_per_node + 0..nproc_per_node-1 */
  const char *rdzv;     /* "HOST:PORT" of the rendezvous store, served by node
                         * 0 on that exact address (an IPv4 address or a name
                         * resolving to one); NULL: 127.0.0.1 on any free port
                         * (one node only). "0.0.0.0:P" listens on every
                         * interface (said once through notify). */
  const char *bind_addr; /* IPv4 address the workers' tcp transport listens on;
                          * NULL: this machine's address on the route to the
                          * rendezvous host */
  const char *transport; /* "auto" (shm inside a node, tcp between), "shm" or
                          * "tcp"; NULL = "auto" */
  const char *token;    /* job secret (at least 16 characters) authenticating
                         * every connection; NULL: DTRAIN_JOB_TOKEN, or a fresh
                         * random one for a single-node job (required for
                         * several nodes) */
  const char *name;     /* job name, the communicator's store prefix; NULL =
                         * "dtrain" */
  const char *host_id;  /* topology identity of this node's workers (ranks with
                         * the same id use shared memory); NULL: the machine's
                         * for one node, "<hostname>/launch-node-<I>" for
                         * several (so two launchers on one machine are two
                         * hosts). DTRAIN_HOST_ID overrides it. */
  double deadline_s;    /* meeting the other nodes, joining the communicator
                         * and every blocking collective; default 60 */
  double grace_s;       /* after the first worker fails, how long the others
                         * get to notice and exit before SIGKILL; default 8 */
  int handle_signals;   /* 1 (default): while dt_job_run runs, SIGINT and
                         * SIGTERM to the launcher stop the workers (SIGTERM,
                         * SIGKILL after grace_s), remove the job's shared
                         * memory and make dt_job_run return DT_EABORTED;
                         * dt_job_signal() tells which signal. 0: leave the
                         * signal dispositions alone. */
  int check_memory;     /* 1 (default): dt_job_create refuses (DT_ENOMEM) a job
                         * whose workers on this host would need more shared
                         * memory than /dev/shm has free, or more memory in
                         * all than MemAvailable (estimated: the shm
                         * transport's rings, worker_shm_bytes and
                         * worker_bytes per worker) */
  size_t worker_bytes;  /* memory each worker needs beyond what it shares
                         * with the launcher (model, gradients, optimizer
                         * state, batches), for the memory check */
  size_t worker_shm_bytes; /* shared memory each worker maps beyond the
                            * transport's rings (e.g. a gradient window) */
  int print_pids;       /* 1: notify "workers: rank R pid P, ..." once the
                         * workers are released */
  dt_job_notify_fn notify; /* NULL: lines go to dt_log (stderr) */
  void *notify_ud;
  /* Called by the launcher of a local job (dt_job_create) on its own
   * thread: once the workers are released, then about every 20 ms while
   * it waits for them (dt_job_failed_worker tells whether one failed).
   * Serving metrics, diagnosing a hang. NULL: none. It must not block. */
  void (*watch)(void *ud, const dt_job *job);
  void *watch_ud;
  int min_workers;      /* elastic training (docs/elastic.md): 0 (default) a lost
                         * worker ends the job; else the launcher reports a
                         * dead worker to the store and lets the others go on */
  int spares;           /* elastic: processes forked with the workers that wait,
                         * with the data loaded, to replace a lost worker: the
                         * launcher wakes one per loss (fn runs in it with
                         * w->joining = 1); 0 (default): none */
  int join;             /* 1: this process joins a running elastic job whose
                         * store is at rdzv (token required): dt_job_run runs
                         * fn once, here, with w->joining = 1 */
  int tcp_connections;  /* tcp connections per peer (messages of 256 KiB and
                         * more striped over them); 0: DTRAIN_TCP_NCONN (1) */
  const char *rdzv_backend; /* NULL or "builtin": node 0 serves the store at
                             * rdzv; "etcd": rdzv is an etcd server (its v3
                             * JSON gateway) that every process uses instead */
  int expendable_from;  /* > 0: ranks from this one on may die (up to
                         * expendable_max of them) without ending the job:
                         * the launcher says so and the others go on
                         * (parameter servers with replicas, docs/ps.md);
                         * 0 (default): every rank's death ends the job */
  int expendable_max;
  /* elastic: called in each spare process, with dt_job_run's arg, before it
   * waits to be woken (a spare making its memory its own, say, so that
   * taking the state when woken costs no page faults); NULL: none */
  void (*spare_ready)(void *arg);
};
#define DT_JOB_CONFIG_INIT                                                     \
  { 0, 0, 1, 0, NULL, NULL, NULL, NULL, NULL, NULL, 60.0, 8.0, 1, 1, 0, 0, 0, NULL, NULL, NULL, NULL, 0, 0, 0, 0, NULL, 0, 0, NULL }

/* What a worker function gets. Everything is borrowed for the duration of
 * the call. */
struct dt_job_worker {
  int rank, size;             /* global rank and world size */
  int local_rank, local_size; /* among the workers of this node */
  int node_rank, nnodes;
  dt_comm *comm;              /* joined communicator of all `size` ranks; the
                               * job destroys it after the function returns.
                               * NULL only for a world of one under
                               * dt_job_from_env (nobody to talk to) */
  /* Where the job's rendezvous store is and the comm config the job made
   * comm with (elastic training re-forms communicators through them).
   * rdzv_port 0: no TCP store (a file store, or a world of one). */
  const char *rdzv_host;
  int rdzv_port;
  const struct dt_comm_config *comm_config;
  /* 1: a joiner of a running elastic job (dt_job_config.spares, join):
   * comm is NULL, rank is a placeholder; the worker finds its place
   * through the store and writes its member id to *member_id (may be NULL)
   * so the launcher can report its death. */
  int joining;
  int *member_id;
};

/* Runs one worker's share of the job. Returns the worker's exit status:
 * 0 success, anything else (1..255) failure. After a failure the job
 * aborts the communicator with this thread's dt_errmsg() as the reason, so
 * the peers learn why. In a forked worker the process exits with the
 * status right after the communicator is destroyed. */
typedef int (*dt_job_worker_fn)(const struct dt_job_worker *w, void *arg);

/* Validates cfg and makes a job handle. Nothing is started yet. Bad input
 * (workers out of range, node_rank >= nnodes, a malformed or unresolvable
 * rdzv, a short token, several nodes without rdzv or token, an unknown
 * transport, workers != nnodes * nproc_per_node) is DT_EINVAL naming the
 * field and value. DT_ENOMEM: the memory check refused ("64 workers need
 * about 4.2 GiB of shared memory (...) but /dev/shm has 1.0 GiB free"), or
 * out of memory. On success *out owns copies of nothing: cfg's strings must
 * outlive the job. */
DT_API int dt_job_create(dt_job **out, const struct dt_job_config *cfg);

/* Like dt_job_create, for a process started as one rank by mpirun (Open
 * MPI: OMPI_COMM_WORLD_RANK/SIZE), an MPICH-style PMI launcher
 * (PMI_RANK/SIZE) or srun inside a job step (SLURM_PROCID/NTASKS with
 * SLURM_STEP_ID). The ranks meet through a store: served by rank 0 at
 * DTRAIN_RDZV=HOST:PORT (DTRAIN_JOB_TOKEN required), or else a file store
 * in DTRAIN_RDZV_DIR (default /tmp)/dtrain-rdzv-<uid>-<launcher job id>,
 * removed by rank 0 once everyone has joined. cfg supplies transport
 * ("auto", "shm", "tcp" or "mpi"), name, deadline_s and notify; its
 * counts are ignored. Returns DT_ENOENT (with a message) when no launcher
 * variables are set, DT_EINVAL for a malformed value (naming the variable),
 * DT_OK otherwise. A world of one is returned as such (size 1). */
DT_API int dt_job_from_env(dt_job **out, const struct dt_job_config *cfg);

/* Runs the job: warns through notify when this node's workers exceed its
 * online cores (and when node 0 serves the rendezvous on 0.0.0.0),
 * forks the workers, meets the other nodes, releases the workers, and
 * calls fn(w, arg) in each with a joined communicator. Waits for every
 * worker by pid. Returns DT_OK when every worker returned 0. Otherwise:
 * DT_EPEERLOST (a worker was killed by a signal) or DT_EABORTED (a worker
 * returned non-zero, or the launcher was interrupted) with a message naming
 * the first failed rank and pid; the other workers get grace_s to exit and
 * are then killed. DT_ETIMEDOUT / DT_EAUTH / DT_EIO name the node that did
 * not meet. Under dt_job_from_env fn runs once, here. A job runs once: a
 * second call is DT_EINVAL. */
DT_API int dt_job_run(dt_job *job, dt_job_worker_fn fn, void *arg);

/* How one of this node's workers ended (local_rank 0..local_size-1), valid
 * after dt_job_run. */
struct dt_job_status {
  int rank;      /* global rank */
  int pid;       /* 0 if never started */
  int exited;    /* 1: exited (code holds its status); 0: see signal */
  int code;      /* exit status, 0..255 */
  int signal;    /* signal that killed it, 0 if none */
};
DT_API int dt_job_worker_status(const dt_job *job, int local_rank, struct dt_job_status *out);

/* The local rank of the first worker that failed, or -1. */
DT_API int dt_job_failed_worker(const dt_job *job);

/* SIGINT or SIGTERM if dt_job_run was stopped by that signal, else 0. */
DT_API int dt_job_signal(const dt_job *job);

/* Shape of the job (valid from create). */
DT_API int dt_job_size(const dt_job *job);       /* world size */
DT_API int dt_job_local_size(const dt_job *job); /* workers on this node */
DT_API int dt_job_rank0(const dt_job *job);      /* global rank of local worker 0 */
/* Who started the ranks: "dtrain" for dt_job_create, else "mpirun", "PMI"
 * or "srun". */
DT_API const char *dt_job_source(const dt_job *job);

/* Frees the job. Call after dt_job_run has returned (or instead of it).
 * NULL is a no-op. */
DT_API void dt_job_destroy(dt_job *job);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_JOB_H */
