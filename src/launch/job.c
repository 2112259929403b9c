/*
 * job.c — the job handle: dt_job_create checks a launcher's configuration
 * and works out this node's share (world size, workers here, their first
 * global rank, the rendezvous address, the tcp listen address, the token,
 * the host identity); dt_job_from_env does the same for a process that
 * mpirun or srun started as one rank; dt_job_run hands over to local.c or
 * external.c; the accessors report how the workers ended.
 *
 * It forks nothing and connects nothing itself.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm/comm.h"
#include "core/core.h"
#include "launch/job_int.h"

void dt__job_say(const dt_job *j, int level, const char *fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (j->cfg.notify) {
    j->cfg.notify(j->cfg.notify_ud, level, line);
    return;
  }
  /* dt_log names the level itself ("dtrain warn: ...") */
  const char *l = line;
  if (!strncmp(l, "warning: ", 9)) l += 9;
  else if (!strncmp(l, "note: ", 6)) l += 6;
  dt_log(level == DT_JOB_ERROR ? DT_LOG_ERROR : level == DT_JOB_WARN ? DT_LOG_WARN
                                                                          : DT_LOG_INFO, "%s", l);
}

void dt__job_comm_config(const dt_job *j, int rank, struct dt_comm_config *cc) {
  *cc = (struct dt_comm_config)DT_COMM_CONFIG_INIT;
  cc->transport = j->transport;
  cc->rank = rank;
  cc->size = j->world;
  cc->job = j->name;
  cc->token = j->token && *j->token ? j->token : NULL;
  cc->timeout_s = j->cfg.deadline_s;
  cc->nconn = j->cfg.tcp_connections;
  cc->bind_addr = j->bind[0] ? j->bind : NULL;
  const char *hid = dt_param_str("DTRAIN_HOST_ID", NULL);
  cc->host_id = hid && *hid ? hid : j->host_id[0] ? j->host_id : NULL;
}

static int job_alloc(dt_job **out, const struct dt_job_config *cfg) {
  *out = NULL;
  dt_job *j = calloc(1, sizeof *j);
  if (!j) return dt__seterr(DT_ENOMEM, "job: out of memory");
  j->cfg = *cfg;
  j->failed = -1;
  j->sigfd = -1;
  j->name = cfg->name && *cfg->name ? cfg->name : "dtrain";
  j->transport = cfg->transport && *cfg->transport ? cfg->transport : "auto";
  if (!(j->cfg.deadline_s > 0)) j->cfg.deadline_s = 60;
  if (!(j->cfg.grace_s >= 0)) j->cfg.grace_s = 8;
  *out = j;
  return DT_OK;
}

static int finish_alloc(dt_job *j) {
  int sp = j->cfg.spares > 0 && !j->external ? j->cfg.spares : 0;
  j->st = calloc((size_t)(j->nlocal + sp), sizeof *j->st);
  if (!j->st) return dt__seterr(DT_ENOMEM, "job: out of memory for %d workers", j->nlocal);
  for (int i = 0; i < j->nlocal; i++) j->st[i].rank = j->rank0 + i;
  for (int i = 0; i < sp; i++) j->st[j->nlocal + i].rank = j->world + i; /* spares: no rank yet */
  return DT_OK;
}

int dt_job_create(dt_job **out, const struct dt_job_config *cfg) {
  if (!out) return dt__seterr(DT_EINVAL, "dt_job_create: out is NULL");
  *out = NULL;
  if (!cfg) return dt__seterr(DT_EINVAL, "dt_job_create: cfg is NULL");
  if (cfg->workers < 0 || cfg->workers > 4096)
    return dt__seterr(DT_EINVAL, "job: workers %d: expects 1..4096 (0: nnodes x nproc_per_node)",
                      cfg->workers);
  if (cfg->nproc_per_node < 0 || cfg->nproc_per_node > 4096)
    return dt__seterr(DT_EINVAL, "job: nproc_per_node %d: expects 1..4096 (0: workers / nnodes)",
                      cfg->nproc_per_node);
  if (cfg->nnodes < 1 || cfg->nnodes > 1024)
    return dt__seterr(DT_EINVAL, "job: nnodes %d: expects 1..1024", cfg->nnodes);
  if (cfg->node_rank < 0 || cfg->node_rank >= cfg->nnodes)
    return dt__seterr(DT_EINVAL, "job: node_rank %d: must be below the node count %d (node ranks "
                      "are 0..%d)", cfg->node_rank, cfg->nnodes, cfg->nnodes - 1);
  int nproc = cfg->nproc_per_node, world = cfg->workers;
  if (!nproc && !world) nproc = 1;
  if (!nproc) {
    if (world % cfg->nnodes)
      return dt__seterr(DT_EINVAL, "job: workers %d is not a multiple of nnodes %d (set "
                        "nproc_per_node)", world, cfg->nnodes);
    nproc = world / cfg->nnodes;
  }
  if (!world) world = nproc * cfg->nnodes;
  if ((long)nproc * cfg->nnodes != world)
    return dt__seterr(DT_EINVAL, "job: workers %d != nnodes %d x nproc_per_node %d", world,
                      cfg->nnodes, nproc);
  if (world > 4096)
    return dt__seterr(DT_EINVAL, "job: %d nodes x %d workers: at most 4096 workers in a job",
                      cfg->nnodes, nproc);
  if (cfg->transport && *cfg->transport && strcmp(cfg->transport, "auto") &&
      strcmp(cfg->transport, "shm") && strcmp(cfg->transport, "tcp")) {
    if (!strcmp(cfg->transport, "mpi"))
      return dt__seterr(DT_EINVAL, "job: transport 'mpi' needs the ranks started by mpirun or "
                        "srun (dt_job_from_env); a forked job uses auto, shm or tcp");
    return dt__seterr(DT_EINVAL, "job: transport '%s': expects auto, shm or tcp", cfg->transport);
  }
  if (cfg->bind_addr) {
    struct in_addr ia;
    if (inet_pton(AF_INET, cfg->bind_addr, &ia) != 1)
      return dt__seterr(DT_EINVAL, "job: bind_addr '%s': expects an IPv4 address of this machine",
                        cfg->bind_addr);
  }
  if (cfg->spares < 0 || cfg->spares > 4096)
    return dt__seterr(DT_EINVAL, "job: spares %d: expects 0..4096", cfg->spares);
  if ((cfg->spares || cfg->join) && cfg->min_workers <= 0)
    return dt__seterr(DT_EINVAL, "job: %s needs elastic training (min_workers > 0)",
                      cfg->join ? "join" : "spares");
  int etcd = cfg->rdzv_backend && !strcmp(cfg->rdzv_backend, "etcd");
  if (cfg->rdzv_backend && !etcd && strcmp(cfg->rdzv_backend, "builtin"))
    return dt__seterr(DT_EINVAL, "job: rdzv_backend '%s': expects builtin or etcd",
                      cfg->rdzv_backend);
  if (etcd && !cfg->rdzv)
    return dt__seterr(DT_EINVAL, "job: rdzv_backend etcd needs rdzv, the etcd server's HOST:PORT");
  if (cfg->join && !cfg->rdzv)
    return dt__seterr(DT_EINVAL, "job: join needs rdzv, the address of the running job's "
                      "rendezvous store");
  if (cfg->token && strlen(cfg->token) < 16)
    return dt__seterr(DT_EINVAL, "job: token is too short (%zu characters, need at least 16)",
                      strlen(cfg->token));
  dt_job *j;
  int rc;
  DT_CHECK(job_alloc(&j, cfg));
  j->nnodes = cfg->nnodes;
  j->node = cfg->node_rank;
  j->nlocal = nproc;
  j->world = world;
  j->rank0 = j->node * nproc;
  if (cfg->rdzv) {
    DT_CHECK_GOTO(dt__parse_hostport("job: rdzv", cfg->rdzv, j->rdzv_host, sizeof j->rdzv_host,
                                     &j->rdzv_port, 0), rc, fail);
    if (dt__resolve_ipv4(j->rdzv_host, j->rdzv_ip, sizeof j->rdzv_ip) < 0) {
      rc = dt__seterr(DT_EINVAL, "job: rdzv '%s': host does not resolve to an IPv4 address",
                      cfg->rdzv);
      goto fail;
    }
  } else if (j->nnodes > 1) {
    rc = dt__seterr(DT_EINVAL, "job: rdzv (HOST:PORT) is required for a job of %d nodes: an "
                    "address of node 0 that every node reaches", j->nnodes);
    goto fail;
  } else {
    snprintf(j->rdzv_host, sizeof j->rdzv_host, "127.0.0.1");
    snprintf(j->rdzv_ip, sizeof j->rdzv_ip, "127.0.0.1");
  }
  j->etcd = etcd;
  snprintf(j->store_host, sizeof j->store_host, "%s%s", etcd ? "etcd://" : "", j->rdzv_ip);
  if (cfg->bind_addr) {
    snprintf(j->bind, sizeof j->bind, "%s", cfg->bind_addr);
  } else if (dt__route_addr(j->rdzv_ip, j->bind, sizeof j->bind) < 0) {
    rc = dt__seterr(DT_EINVAL, "job: no route from this machine to the rendezvous host %s (%s); "
                    "set bind_addr", j->rdzv_host, j->rdzv_ip);
    goto fail;
  }
  if (cfg->token) {
    j->token = cfg->token;
  } else {
    char who[64];
    snprintf(who, sizeof who, "a job of %d nodes", j->nnodes);
    if (cfg->join) snprintf(who, sizeof who, "a joiner of a running job");
    DT_CHECK_GOTO(dt__job_token(j->nnodes > 1 || cfg->join, who, &j->token), rc, fail);
    if (!*j->token) {
      dt__make_token(j->token_buf, sizeof j->token_buf);
      j->token = j->token_buf;
    }
  }
  if (cfg->host_id) {
    snprintf(j->host_id, sizeof j->host_id, "%s", cfg->host_id);
  } else if (j->nnodes > 1) {
    char hn[256] = "localhost";
    gethostname(hn, sizeof hn - 1);
    snprintf(j->host_id, sizeof j->host_id, "%s/launch-node-%d", hn, j->node);
  }
  if (cfg->join) j->nlocal = 1, j->rank0 = 0;
  if (cfg->check_memory)
    DT_CHECK_GOTO(dt__job_memcheck(j->nlocal + (cfg->spares > 0 ? cfg->spares : 0), j->world,
                                   j->transport, cfg->worker_bytes,
                                   cfg->worker_shm_bytes), rc, fail);
  DT_CHECK_GOTO(finish_alloc(j), rc, fail);
  *out = j;
  return DT_OK;
fail:
  dt_job_destroy(j);
  return rc;
}

int dt_job_from_env(dt_job **out, const struct dt_job_config *cfg) {
  if (!out) return dt__seterr(DT_EINVAL, "dt_job_from_env: out is NULL");
  *out = NULL;
  if (!cfg) return dt__seterr(DT_EINVAL, "dt_job_from_env: cfg is NULL");
  struct dt__env_world ew;
  int found = dt__env_world(&ew);
  if (found < 0) return found;
  if (!found)
    return dt__seterr(DT_ENOENT, "job: no external launcher in the environment (none of "
                      "OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID with SLURM_STEP_ID is set)");
  const char *t = cfg->transport;
  if (t && *t && dt__enum_parse(dt__transport_names, t) < 0)
    return dt__seterr(DT_EINVAL, "job: transport '%s': expects auto, shm, tcp or mpi", t);
  dt_job *j;
  int rc;
  DT_CHECK(job_alloc(&j, cfg));
  j->external = 1;
  j->ew = ew;
  j->world = ew.size;
  j->nlocal = 1;
  j->rank0 = ew.rank;
  j->nnodes = 1;
  snprintf(j->bind, sizeof j->bind, "127.0.0.1");
  const char *rdzv = dt_param_str("DTRAIN_RDZV", NULL);
  const char *bind_env = dt_param_str("DTRAIN_BIND_ADDR", NULL);
  if (ew.size == 1) {
    j->token = "";
  } else if (rdzv && *rdzv) {
    DT_CHECK_GOTO(dt__parse_hostport("DTRAIN_RDZV", rdzv, j->rdzv_host, sizeof j->rdzv_host,
                                     &j->rdzv_port, 0), rc, fail);
    if (dt__resolve_ipv4(j->rdzv_host, j->rdzv_ip, sizeof j->rdzv_ip) < 0) {
      rc = dt__seterr(DT_EINVAL, "DTRAIN_RDZV '%s': cannot resolve '%s' to an IPv4 address",
                      rdzv, j->rdzv_host);
      goto fail;
    }
    DT_CHECK_GOTO(dt__job_token(1, "a job that meets at DTRAIN_RDZV", &j->token), rc, fail);
    if (dt__route_addr(j->rdzv_ip, j->bind, sizeof j->bind) < 0)
      snprintf(j->bind, sizeof j->bind, "127.0.0.1");
  } else {
    const char *d = dt_param_str("DTRAIN_RDZV_DIR", "/tmp");
    if (!ew.jobid[0]) {
      rc = dt__seterr(DT_EINVAL, "%s started %d ranks but gave no job id to meet by: set "
                      "DTRAIN_RDZV=HOST:PORT (rank 0 serves the rendezvous there)", ew.source,
                      ew.size);
      goto fail;
    }
    snprintf(j->dir, sizeof j->dir, "%s/dtrain-rdzv-%u-%s", d && *d ? d : "/tmp",
             (unsigned)getuid(), ew.jobid);
    DT_CHECK_GOTO(dt__job_token(0, NULL, &j->token), rc, fail);
  }
  if (bind_env && *bind_env) {
    struct in_addr ia;
    if (inet_pton(AF_INET, bind_env, &ia) != 1) {
      rc = dt__seterr(DT_EINVAL, "DTRAIN_BIND_ADDR '%s': expects an IPv4 address of this machine",
                      bind_env);
      goto fail;
    }
    snprintf(j->bind, sizeof j->bind, "%s", bind_env);
  }
  if (cfg->host_id) snprintf(j->host_id, sizeof j->host_id, "%s", cfg->host_id);
  DT_CHECK_GOTO(finish_alloc(j), rc, fail);
  *out = j;
  return DT_OK;
fail:
  dt_job_destroy(j);
  return rc;
}

int dt_job_run(dt_job *job, dt_job_worker_fn fn, void *arg) {
  if (!job) return dt__seterr(DT_EINVAL, "dt_job_run: job is NULL");
  if (!fn) return dt__seterr(DT_EINVAL, "dt_job_run: worker function is NULL");
  if (job->ran) return dt__seterr(DT_EINVAL, "dt_job_run: this job has already run (a job runs once)");
  job->ran = 1;
  if (job->cfg.join) {
    /* a joiner: fn once, here; it finds its place through the store */
    struct dt_comm_config cc;
    dt__job_comm_config(job, 0, &cc);
    struct dt_job_worker w = {job->world, job->world, 0, 1, 0, 1, NULL, job->store_host,
                              job->rdzv_port, &cc, 1, NULL};
    job->st[0].pid = (int)getpid();
    int status = fn(&w, arg);
    job->st[0].exited = 1;
    job->st[0].code = status & 255;
    if (status != 0) {
      job->failed = 0;
      return dt__seterr(DT_EABORTED, "the joiner (pid %d) ended with status %d", (int)getpid(),
                        status);
    }
    return DT_OK;
  }
  return job->external ? dt__job_run_external(job, fn, arg) : dt__job_run_local(job, fn, arg);
}

int dt_job_worker_status(const dt_job *job, int local_rank, struct dt_job_status *out) {
  if (!job || !out) return dt__seterr(DT_EINVAL, "dt_job_worker_status: %s is NULL",
                                      job ? "out" : "job");
  if (local_rank < 0 || local_rank >= job->nlocal)
    return dt__seterr(DT_EINVAL, "dt_job_worker_status: local_rank %d: expects 0..%d",
                      local_rank, job->nlocal - 1);
  *out = job->st[local_rank];
  return DT_OK;
}

int dt_job_failed_worker(const dt_job *job) { return job ? job->failed : -1; }
int dt_job_signal(const dt_job *job) { return job ? job->signal : 0; }
int dt_job_size(const dt_job *job) { return job ? job->world : 0; }
int dt_job_local_size(const dt_job *job) { return job ? job->nlocal : 0; }
int dt_job_rank0(const dt_job *job) { return job ? job->rank0 : 0; }
const char *dt_job_source(const dt_job *job) {
  return !job ? "" : job->external ? job->ew.source : "dtrain";
}

void dt_job_destroy(dt_job *job) {
  if (!job) return;
  free(job->st);
  free(job);
}
