/*
 * strategy_ps.c — the "ps" strategy: training against parameter servers
 * (src/ps, docs/ps.md). Every worker trains on a balanced slice of each
 * global batch (the "shards" source, as ddp); its gradient spans are pushed
 * to the servers holding them as backward finishes them (grad_ready), and
 * step_finish waits for every key's parameters of the next clock. The
 * optimizer runs on the servers: the worker's own optimizer never steps and
 * holds no state. Evaluation and the end of the run first pull the
 * parameters with every worker's pushes in (the same everywhere), then shard
 * and sum over the workers' communicator as ddp does.
 *
 * A model whose first layer is an embedding trains it by rows
 * (forward_begin): before each forward the worker pulls only the rows the
 * batch reads, and backward pushes only their gradients (the model then
 * zeroes only those rows of its gradient, dt__model_set_sparse_grads).
 *
 * Separate servers are the ranks after the workers in the job's
 * communicator (dt__engine_set_job_comm); dt__engine_serve runs one. With
 * ps.colocate the workers' own communicator carries everything and each
 * worker serves one key range inside its own waits.
 *
 * Checkpoints: rank 0 asks every server for every key's record (its
 * parameters and optimizer state, dt_ps_client_export) at the step
 * boundary and writes each server's records as a file of its own,
 * ps-shard-S.safetensors with owner "ps-shard-S" in the manifest; on
 * resume each server reads its own file back (a colocated one in
 * state_import, a separate one in dt__engine_serve before it serves).
 *
 * Replicas (ps.replicas): every process of the job lets the communicator
 * survive a lost peer (dt__comm_tolerate_loss), so the workers go on with
 * a server's replica when it dies (src/ps/client.c).
 *
 * Windows (DTRAIN_PS_WINDOW, docs/ps.md): when the whole job is on one
 * host over shm, each worker's model works in a shared-memory window of its
 * own that every rank maps; servers read dense pushes there and write dense
 * replies there, and only headers travel through the transport.
 *
 * Elastic workers (dist.min_workers, docs/ps.md "Workers leaving"): the
 * job's communicator survives a lost worker (dt__comm_tolerate_loss), the
 * servers take it out of the clocks, and the survivors go on stepping; the
 * workers' own communicator (collectives: epoch numbers, evaluation) is
 * re-formed by src/elastic at their next collective, and membership_change
 * only takes the new one: the parameters and optimizer state are the
 * servers', so nothing else moves. A joiner takes a lost worker's slot at
 * the servers over a communicator of its own (src/ps/server_join.c) and
 * pulls the parameters.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "engine/engine_int.h"
#include "engine/strategy.h"
#include "comm/window.h"
#include "nn/nn.h"
#include "ps/ps.h"

/* Shared-memory windows (docs/ps.md "Windows"): every rank of the job maps
 * every worker's [parameters | gradients]; a worker's model works in its
 * own. */
typedef struct ps_win {
  dt_comm_window *w;
  float **p, **g;    /* per worker (ranks 0..N-1 of the job) */
} ps_win;

typedef struct ps_impl {
  dt_ps_map map;
  dt_ps_opts o;
  ps_win win;
  dt_comm_window *tw; /* direct asp: the keys' shared table (a slot per server) */
  dt_ps_direct *direct;
  dt_ps_server *srv; /* colocated */
  dt_ps_client *cl;
  dt_comm *job;
  dt_step_plan plan;
  uint64_t sent0, recv0;
  int stopped;
  int32_t *rows;     /* embedding first: the rows of the piece's batch */
  int me;            /* this worker's slot at the servers (its rank in the job, or the
                      * slot it joined into) */
  dt_comm *jc;       /* a joiner: its communicator with the servers (server_join.c) */
  int64_t rj_seen;   /* replicas: the rejoins (src/ps/rejoin.c) taken at epoch ends */
  dt_store *rst;     /* ... the job's store, where they are announced */
} ps_impl;

static void ps_opts(const dt_run_cfg *c, int nworkers, dt_ps_opts *o) {
  memset(o, 0, sizeof *o);
  o->nworkers = nworkers;
  o->colocate = c->ps.colocate;
  o->nservers = c->ps.colocate ? nworkers : c->ps.servers;
  o->consistency = c->ps.consistency;
  o->staleness = c->ps.staleness;
  /* ssp with s = 0 is bsp (docs/ps.md) */
  if (o->consistency == DT_PS_SSP && o->staleness == 0) o->consistency = DT_PS_BSP;
  o->backup_workers = c->ps.backup_workers;
  o->significance = c->ps.significance;
  o->optim = c->optim;
  o->replicas = c->ps.replicas > 1 && !c->ps.colocate ? c->ps.replicas : 1;
  o->elastic = c->min_workers > 0 && !c->ps.colocate;
  /* colocated asp/ssp: a server thread answers while its worker computes
   * (bsp: every worker waits for every push anyway, so the worker's own
   * waits serve as well, without a thread on the two cores) */
  o->server_thread = o->colocate && o->consistency != DT_PS_BSP;
}

/* Collective over the job's communicator (workers and servers alike, with
 * the same verdict everywhere): the windows, when every rank is on this
 * host over shm and nothing needs the transport's copies (replicas: a lost
 * server's window would go with it). model (a worker's, NULL for a
 * separate server) then works in its own window. */
static int win_open(ps_win *pw, dt_comm *job, dt_ps_opts *o, dt_model *model, size_t np) {
  memset(pw, 0, sizeof *pw);
  if (!dt_param(DT_PARAM_PS_WINDOW) || o->replicas > 1 || np == 0) return DT_OK;
  const size_t pad = (np + 15) & ~(size_t)15;
  int rc = dt_comm_window_create(job, 2 * pad * sizeof(float), &pw->w);
  if (rc == DT_ENOTSUP) {
    pw->w = NULL;
    return DT_OK;
  }
  if (rc < 0) return dt__preerr(rc, "ps: shared-memory window");
  const int N = o->nworkers;
  pw->p = calloc(2 * (size_t)N, sizeof *pw->p);
  if (!pw->p) return dt__seterr(DT_ENOMEM, "ps: out of memory");
  pw->g = pw->p + N;
  for (int w = 0; w < N; w++) {
    pw->p[w] = dt_comm_window_peer(pw->w, w);
    pw->g[w] = pw->p[w] + pad;
  }
  if (model) {
    float *mine = dt_comm_window_base(pw->w);
    DT_CHECK(dt__model_point_params(model, mine));
    dt_model_set_grads(model, mine + pad);
  }
  o->win_params = pw->p;
  o->win_grads = pw->g;
  if (dt_comm_rank(job) == 0)
    DT_LOG_INFO("ps: shared-memory windows: servers read dense pushes in place and write "
                "replies into the workers' parameters");
  return DT_OK;
}

/* The model back in its own buffers (values copied), then the windows go. */
static void win_close(ps_win *pw, dt_model *model) {
  if (pw->w && model) {
    dt__model_point_params(model, NULL);
    dt_model_set_grads(model, NULL);
  }
  dt_comm_window_destroy(pw->w);
  free(pw->p);
  memset(pw, 0, sizeof *pw);
}

/* Direct asp (docs/ps.md): colocated asp whose workers all have windows
 * (one host), without the features that need the servers' messages during
 * steps (rows, the significance filter, lazy replies): every key's master
 * copy goes into a shared table and each worker applies its own pushes; no
 * server thread. Collective (the same verdict everywhere: config and the
 * windows' collective verdict). */
static int direct_open(ps_impl *d, dt_comm *job, const float *init, int me) {
  dt_ps_opts *o = &d->o;
  if (!dt_param(DT_PARAM_PS_DIRECT) || !o->colocate || o->consistency != DT_PS_ASP ||
      !d->win.w || o->replicas > 1 || o->significance > 0 || dt_param(DT_PARAM_PS_LAZY))
    return DT_OK;
  for (int k = 0; k < d->map.nkeys; k++)
    if (d->map.keys[k].rowlen > 1) return DT_OK;
  int rc = dt_comm_window_create(job, dt_ps_direct_bytes(&d->map, o), &d->tw);
  if (rc == DT_ENOTSUP) {
    d->tw = NULL;
    return DT_OK;
  }
  if (rc < 0) return dt__preerr(rc, "ps: direct asp's shared table");
  void **slots = calloc((size_t)d->map.nservers, sizeof *slots);
  if (!slots) return dt__seterr(DT_ENOMEM, "ps: out of memory");
  for (int s = 0; s < d->map.nservers; s++) slots[s] = dt_comm_window_peer(d->tw, s);
  rc = dt_ps_direct_create(&d->direct, &d->map, o, me, slots, init, dt_comm_timeout(job));
  free(slots);
  if (rc < 0) return rc;
  o->direct = d->direct;
  o->server_thread = 0;
  if (me == 0)
    DT_LOG_INFO("ps: direct asp: each worker applies its own pushes to the keys' shared master "
                "copies (no server thread)");
  return DT_OK;
}

static int err_rank(dt_strategy *s, int rc) { return dt__preerr(rc, "rank %d", s->rank); }

/* An error of the client (the servers' side). With elastic workers the
 * loop re-forms the workers on a lost peer or a deadline, but a server
 * lost without a replica cannot be re-formed around: that ends the job
 * (DT_EIO, the message naming the server), never a retry. */
static int err_client(dt_strategy *s, int rc) {
  const ps_impl *d = s->impl;
  if (d && d->o.elastic && (rc == DT_EPEERLOST || rc == DT_ETIMEDOUT || rc == DT_EABORTED ||
                            rc == DT_EMISMATCH))
    rc = dt__preerr(DT_EIO, "%s", dt_strerror(rc));
  return err_rank(s, rc);
}

/* Elastic workers: a collective of the workers failed in a way the loop
 * re-forms around (a member lost, the communicator aborted). That member
 * may have stopped because a server without a replica died: replies go
 * worker by worker, so a server lost between two workers' replies (the
 * last step of an epoch, the reads before evaluation or the end) leaves
 * one worker past its wait, in a collective, while the others fail
 * naming the server. Re-forming cannot bring the server back, and below
 * dist.min_workers the re-forming waits dist.rejoin_timeout (30 s) for
 * joiners first: ask the servers (one HELLO each, dt_ps_client_probe)
 * and end at once naming the lost one. Otherwise the collective's error
 * stands. */
static int err_coll(dt_strategy *s, int rc) {
  ps_impl *d = s->impl;
  if (!d || !d->cl || !d->o.elastic ||
      !(rc == DT_EPEERLOST || rc == DT_ETIMEDOUT || rc == DT_EABORTED || rc == DT_EMISMATCH))
    return rc;
  char why[1024];
  snprintf(why, sizeof why, "%s", dt_errmsg());
  int prc = dt_ps_client_probe(d->cl);
  if (prc < 0) {
    char srv[768];
    snprintf(srv, sizeof srv, "%s", dt_errmsg());
    return err_client(s, dt__seterr(prc, "%s (and the workers' collective failed: %.200s)",
                                    srv, why));
  }
  return dt__seterr(rc, "%s", why);
}

static int ps_source(const dt_run_cfg *cfg, const dt_dataset *train, dt_batch_source **out) {
  return dt__source_shards(out, train, cfg->batch, cfg->seed, cfg->shuffle, 0);
}

static void ps_teardown(dt_strategy *s);

/* Setup of a worker joining a running job (s->joining): no collective
 * and no server yet; the map, for the slot it will take at the membership
 * change that follows. */
static int setup_joiner(dt_strategy *s) {
  const dt_run_cfg *c = s->cfg;
  if (!s->rdzv_port || !s->rdzv_cc)
    return dt__seterr(DT_ENOTSUP, "ps: a joiner needs the job's rendezvous store "
                      "(dt__engine_set_rdzv)");
  ps_impl *d = calloc(1, sizeof *d);
  if (!d) return dt__seterr(DT_ENOMEM, "ps: out of memory");
  s->impl = d;
  d->me = -1;
  /* the job's worker count: the servers' slots */
  ps_opts(c, c->workers, &d->o);
  int rc = dt_ps_map_from_model(&d->map, s->model, d->o.nservers, d->o.consistency);
  if (rc == DT_OK) rc = dt_ps_map_set_replicas(&d->map, d->o.replicas);
  const dt_layer_info *L0 = dt_model_layer(s->model, 0);
  if (rc == DT_OK && L0 && L0->kind == DT_L_EMBEDDING) {
    d->rows = malloc((size_t)c->batch * (size_t)dt_model_in_dim(s->model) * sizeof *d->rows);
    if (!d->rows) rc = dt__seterr(DT_ENOMEM, "ps: out of memory");
    dt__model_set_sparse_grads(s->model, 1);
  }
  dt__model_set_ready_piece(s->model, (size_t)dt_ps_piece(d->o.consistency));
  if (rc < 0) {
    ps_teardown(s);
    return err_rank(s, rc);
  }
  s->grad_ud = d;
  return DT_OK;
}

/* A joiner at its membership change: the slot (the lowest of the job's
 * worker slots that no member holds), the servers' admission, the client
 * over the joiner's communicator, the current parameters by pull, its
 * clock the members'. */
static int join_servers(dt_strategy *s, int slot, int64_t step) {
  ps_impl *d = s->impl;
  if (slot < 0)
    return dt__seterr(DT_EINVAL, "ps: joiner: every one of the job's %d worker slots is held by a "
                      "member", d->o.nworkers);
  DT_CHECK(dt_ps_join(s->rdzv_host, s->rdzv_port, s->rdzv_cc, &d->map, slot, &d->jc));
  d->me = slot;
  d->o.joined = 1;
  int rc = dt_ps_client_create(&d->cl, &d->map, &d->o, slot, d->jc, dt_model_params(s->model),
                               dt_model_grads(s->model), NULL);
  if (rc == DT_OK) rc = dt_ps_client_start(d->cl);
  if (rc < 0) return rc;
  dt_ps_client_set_clock(d->cl, step);
  dt_comm_bytes(d->jc, &d->sent0, &d->recv0);
  d->job = d->jc;
  DT_LOG_INFO("ps: joiner is worker %d (rank %d of %d) from clock %lld on, its parameters "
              "pulled from the servers", slot, s->rank, s->nranks, (long long)step);
  return DT_OK;
}

static int ps_setup(dt_strategy *s) {
  const dt_run_cfg *c = s->cfg;
  dt_comm *job = c->ps.colocate ? s->comm : s->job_comm;
  /* a joiner reaches the servers in membership_change (ps_membership) */
  if (s->joining && !c->ps.colocate) return setup_joiner(s);
  if (!job)
    return dt__seterr(DT_EINVAL, "ps.servers = %d: the engine needs the job's communicator of "
                      "workers and servers (dt__engine_set_job_comm)%s", c->ps.servers,
                      c->ps.colocate ? "; ps.colocate needs at least 2 workers" : "");
  if (c->ps.colocate && c->ps.servers > 0)
    return dt__seterr(DT_EINVAL, "ps.colocate = true and ps.servers = %d: choose one",
                      c->ps.servers);
  if (!c->ps.colocate && dt_comm_size(job) != s->nranks + c->ps.servers)
    return dt__seterr(DT_EINVAL, "ps: the job has %d ranks, not %d workers + %d servers",
                      dt_comm_size(job), s->nranks, c->ps.servers);
  if (s->comm) DT_CHECK(dt__ddp_startup(s));
  ps_impl *d = calloc(1, sizeof *d);
  if (!d) return dt__seterr(DT_ENOMEM, "ps: out of memory");
  s->impl = d;
  d->job = job;
  d->me = s->rank;
  ps_opts(c, s->nranks, &d->o);
  int rc = dt_ps_map_from_model(&d->map, s->model, d->o.nservers, d->o.consistency);
  if (rc == DT_OK) rc = dt_ps_map_set_replicas(&d->map, d->o.replicas);
  /* replicas: a lost server must not end the job (the workers read from
   * its replica instead) */
  if (rc == DT_OK && (d->o.replicas > 1 || d->o.elastic)) rc = dt__comm_tolerate_loss(job);
  if (rc == DT_OK)
    rc = win_open(&d->win, job, &d->o, s->model, dt_model_nparams(s->model));
  if (rc == DT_OK) rc = direct_open(d, job, dt_model_params(s->model), s->rank);
  if (rc == DT_OK && d->o.colocate)
    rc = dt_ps_server_create(&d->srv, &d->map, &d->o, s->rank, job, dt_model_params(s->model));
  if (rc == DT_OK)
    rc = dt_ps_client_create(&d->cl, &d->map, &d->o, s->rank, job, dt_model_params(s->model),
                             dt_model_grads(s->model), d->srv);
  dt_comm_bytes(job, &d->sent0, &d->recv0);
  const dt_layer_info *L0 = dt_model_layer(s->model, 0);
  if (rc == DT_OK && L0 && L0->kind == DT_L_EMBEDDING) {
    d->rows = malloc((size_t)c->batch * (size_t)dt_model_in_dim(s->model) * sizeof *d->rows);
    if (!d->rows) rc = dt__seterr(DT_ENOMEM, "ps: out of memory");
    dt__model_set_sparse_grads(s->model, 1);
  }
  /* the first layer's gradient in the keys' pieces: its last pieces are
   * pushed while backward makes the first ones. Not in direct asp, whose
   * pushes run in the worker's own thread (nothing to overlap): one
   * product is cheaper than the pieces' (docs/ps.md "Pieces") */
  dt__model_set_ready_piece(s->model,
                            d->direct ? 0 : (size_t)dt_ps_piece(d->o.consistency));
  if (rc == DT_OK) rc = dt_ps_client_start(d->cl);
  if (rc < 0) {
    ps_teardown(s);
    return err_rank(s, rc);
  }
  s->grad_ud = d;
  return DT_OK;
}

static int ps_step_begin(dt_strategy *s, const dt_step_plan *plan) {
  ps_impl *d = s->impl;
  d->plan = *plan;
  float w = plan->n_global > 0 ? (float)plan->n_local / (float)plan->n_global : 0.0f;
  dt_ps_client_begin(d->cl, w, dt_sched_lr(s->sched, s->step));
  /* rows: none until a piece names its own (a worker without a piece
   * still pushes every key, with no rows) */
  if (d->rows) {
    int rc = dt_ps_client_rows(d->cl, 0, NULL, 0);
    if (rc < 0) return err_client(s, rc);
  }
  return DT_OK;
}

static int ps_forward_begin(dt_strategy *s, const dt_batch *b, int index, int count) {
  ps_impl *d = s->impl;
  (void)index;
  if (!d->rows) return DT_OK;
  if (count > 1)
    return dt__seterr(DT_EINVAL, "rank %d: ps with an embedding takes one piece per step, not %d",
                      s->rank, count);
  int n = dt__model_embedding_rows(s->model, b->x, b->n, d->rows);
  int rc = n < 0 ? n : dt_ps_client_rows(d->cl, 0, d->rows, n);
  if (rc == DT_OK) rc = dt_ps_client_pull_rows(d->cl);
  return rc < 0 ? err_client(s, rc) : DT_OK;
}

static void ps_grad_ready(void *ud, size_t off, size_t n) {
  ps_impl *d = ud;
  dt_ps_client_ready(d->cl, off, n);
}

static int ps_step_finish(dt_strategy *s, float lr) {
  (void)lr; /* sent with the pushes in step_begin: the same schedule */
  ps_impl *d = s->impl;
  if (!d->plan.pieces)
    memset(dt_model_grads(s->model), 0, dt_model_nparams(s->model) * sizeof(float));
  int rc = dt_ps_client_finish(d->cl);
  if (rc < 0) return err_client(s, rc);
  s->step++;
  return DT_OK;
}

static int ps_eval_begin(dt_strategy *s, int64_t n, int chunk, int64_t *lo, int64_t *hi) {
  ps_impl *d = s->impl;
  /* the same parameters everywhere: every worker's pushes in */
  if (d && !d->stopped) {
    int rc = dt_ps_client_sync(d->cl);
    if (rc < 0) return err_client(s, rc);
  }
  int rc = dt__ddp_eval_begin(s, n, chunk, lo, hi);
  return rc < 0 ? err_coll(s, rc) : DT_OK;
}

static int ps_eval_reduce(dt_strategy *s, dt_tally *t) {
  int rc = dt__ddp_eval_reduce(s, t);
  return rc < 0 ? err_coll(s, rc) : DT_OK;
}

/* Replicas: a new server process in a lost server's slot announces itself
 * in the job's store (src/ps/rejoin.c); at an epoch's end (no request
 * outstanding) the workers agree on the announcements (the most any of
 * them read) and take each: the servers hear of it, everyone moves to the
 * rejoin's communicator and the newcomer gets its copies. */
static int take_rejoins(dt_strategy *s) {
  ps_impl *d = s->impl;
  if (!d || d->stopped || d->o.replicas < 2 || d->o.elastic || d->o.joined || !s->rdzv_port ||
      !s->rdzv_cc)
    return DT_OK;
  const char *job = s->rdzv_cc->job ? s->rdzv_cc->job : "dtrain";
  const double t = s->rdzv_cc->timeout_s > 0 ? s->rdzv_cc->timeout_s : 60;
  char key[300], val[32];
  int64_t v = 0;
  if (!d->rst) DT_CHECK(dt_store_connect(&d->rst, s->rdzv_host, s->rdzv_port, s->rdzv_cc->token, t));
  dt_store *st = d->rst;
  snprintf(key, sizeof key, "%s/ps/rejoins", job);
  int rc = dt_store_add(st, key, 0, &v, t);
  double dv = (double)v;
  if (rc == DT_OK && s->comm && s->nranks > 1)
    rc = dt_comm_allreduce(s->comm, &dv, &dv, 1, DT_F64, DT_OP_MAX);
  for (int64_t j = d->rj_seen + 1; rc == DT_OK && j <= (int64_t)dv; j++) {
    size_t n = 0;
    snprintf(key, sizeof key, "%s/ps/rejoin/%lld", job, (long long)j);
    rc = dt_store_get(st, key, val, sizeof val - 1, &n, t);
    if (rc < 0) break;
    val[n] = 0;
    /* "SLOT DIGEST": a newcomer with another key-range map is skipped (it
     * times out; the job goes on without it) */
    char *end = NULL;
    int slot = (int)strtol(val, &end, 10);
    unsigned long long dg = end ? strtoull(end, NULL, 16) : 0;
    if (dg != (unsigned long long)dt_ps_map_digest(&d->map)) {
      DT_LOG_WARN("ps worker %d: rejoin %lld of server %d skipped: the newcomer has another "
                  "key-range map (digest %016llx; here %016llx)", d->me, (long long)j, slot, dg,
                  (unsigned long long)dt_ps_map_digest(&d->map));
      d->rj_seen = j;
      continue;
    }
    rc = dt_ps_client_rejoin(d->cl, s->rdzv_host, s->rdzv_port, s->rdzv_cc, j, slot);
    if (rc == DT_OK) d->rj_seen = j;
  }
  return rc;
}

static int ps_epoch_end(dt_strategy *s, int epoch, dt_tally *t) {
  (void)epoch;
  ps_impl *d = s->impl;
  if (d && !d->stopped) {
    int rc = dt_ps_client_quiesce(d->cl);
    if (rc < 0) return err_client(s, rc);
  }
  int rc = dt__ddp_epoch_reduce(s, t);
  if (rc < 0) return err_coll(s, rc);
  if ((rc = take_rejoins(s)) < 0) return err_client(s, rc);
  return rc;
}

static int ps_run_end(dt_strategy *s, dt_worker_stats *me, dt_worker_stats *all) {
  ps_impl *d = s->impl;
  int rc = dt_ps_client_sync(d->cl);
  if (rc == DT_OK) rc = dt_ps_client_stop(d->cl);
  if (rc < 0) return err_client(s, rc);
  d->stopped = 1;
  if (s->comm && s->nranks > 1) {
    rc = dt_ddp_check_params(s->model, s->comm);
    if (rc < 0) return err_coll(s, err_rank(s, rc));
  }
  dt_ps_client_stats cs;
  dt_ps_client_stats_get(d->cl, &cs);
  uint64_t sent = 0, recv = 0;
  dt_comm_bytes(d->job, &sent, &recv);
  me->comm_seconds = cs.wait_seconds;
  me->compute_seconds = me->train_seconds - cs.wait_seconds;
  me->comm_hidden = 0;
  /* what went through the windows counts as sent and received too */
  me->bytes_sent = (double)(sent - d->sent0) + (double)cs.win_sent;
  me->bytes_received = (double)(recv - d->recv0) + (double)cs.win_received;
  all[0] = *me;
  if (!s->comm || s->nranks < 2) return DT_OK;
  rc = dt_comm_allgather(s->comm, me, all, DT_WORKER_STATS_FIELDS, DT_F64);
  return rc < 0 ? err_coll(s, dt__ddp_comm_err(s, rc, "summary statistics")) : DT_OK;
}

static void ps_teardown(dt_strategy *s) {
  ps_impl *d = s->impl;
  if (d) {
    dt_ps_client_destroy(d->cl);
    dt_ps_server_destroy(d->srv);
    dt_comm_destroy(d->jc);
    dt_store_destroy(d->rst);
    dt_ps_direct_destroy(d->direct);
    dt_comm_window_destroy(d->tw);
    win_close(&d->win, s->model);
    dt_ps_map_free(&d->map);
    free(d->rows);
    dt__model_set_sparse_grads(s->model, 0);
    dt__model_set_ready_piece(s->model, 0);
  }
  free(d);
  s->impl = s->grad_ud = NULL;
}

/* Elastic workers: the survivors' communicator after a worker was lost.
 * The parameters and the optimizer state live on the servers, which took
 * the lost worker out of their clocks already, so every member holds the
 * parameters of the same clock (bsp) and only the buffers (running
 * statistics) and the step count come from the source. The client keeps
 * talking to the servers as the job's rank it started as. */
static int membership_impl(dt_strategy *s, const dt_membership *m) {
  ps_impl *d = s->impl;
  if (!m->comm || m->source < 0 || m->source >= m->nranks || m->rank < 0 ||
      m->rank >= m->nranks)
    return dt__seterr(DT_EINVAL, "strategy 'ps': membership change needs a communicator and "
                      "ranks in range (rank %d, source %d of %d)", m->rank, m->source, m->nranks);
  if (!d)
    return dt__seterr(DT_EINVAL, "strategy 'ps': membership change before setup");
  if (!d->o.elastic)
    return dt__seterr(DT_ENOTSUP, "strategy 'ps': membership changes need dist.min_workers and "
                      "separate servers");
  s->comm = m->comm;
  s->rank = m->rank;
  s->nranks = m->nranks;
  dt_model *md = s->model;
  int rc = DT_OK;
  if (dt_model_nbufs(md))
    rc = dt_comm_broadcast(m->comm, dt_model_bufs(md), dt_model_nbufs(md), DT_F32, m->source);
  int64_t step = s->step;
  if (rc == DT_OK) rc = dt_comm_broadcast(m->comm, &step, 1, DT_I64, m->source);
  if (rc < 0) return dt__ddp_comm_err(s, rc, "membership change: state from the source");
  if (!d->cl) s->step = step; /* a joiner */
  /* not DT_EMISMATCH: re-forming again would not make the steps agree */
  if (step != s->step)
    return dt__seterr(DT_EIO, "rank %d: membership change: step %lld here, %lld on the "
                      "source (rank %d); a ps worker never skips or redoes a pushed clock",
                      s->rank, (long long)s->step, (long long)step, m->source);
  /* the members' slots; a joiner takes the lowest free one (several
   * joiners: in rank order) */
  const int N = d->o.nworkers;
  int32_t *slots = calloc((size_t)m->nranks, sizeof *slots);
  if (!slots) return dt__seterr(DT_ENOMEM, "ps: out of memory");
  int32_t mine = d->cl ? d->me : -1;
  rc = dt_comm_allgather(m->comm, &mine, slots, 1, DT_I32);
  int slot = -1, joiners = 0;
  if (rc == DT_OK) {
    for (int r = 0; r < m->nranks; r++) {
      if (slots[r] >= 0) continue;
      /* joiner r takes the (joiners before it + 1)-th free slot */
      int take = -1, seen = 0;
      for (int w = 0; w < N && take < 0; w++) {
        int held = 0;
        for (int q = 0; q < m->nranks; q++) held |= slots[q] == w;
        if (!held && seen++ == joiners) take = w;
      }
      if (r == m->rank) slot = take;
      joiners++;
    }
  }
  free(slots);
  if (rc < 0) return dt__ddp_comm_err(s, rc, "membership change: the workers' slots");
  int jrc = DT_OK;
  if (!d->cl) jrc = join_servers(s, slot, step);
  /* nobody pushes before every joiner was admitted by every server (its
   * clocks start at the members'): a barrier that also says whether the
   * joiners made it */
  int32_t bad = jrc < 0, any = 0;
  char why[512] = "";
  if (jrc < 0) snprintf(why, sizeof why, "%s", dt_errmsg());
  rc = dt_comm_allreduce(m->comm, &bad, &any, 1, DT_I32, DT_OP_SUM);
  if (rc < 0) return dt__ddp_comm_err(s, rc, "membership change: the joiners' admission");
  /* a joiner the servers refused stops (not recoverable: it would only
   * be refused again); the members go on, and re-form without it at
   * their next collective, which it is no longer there for */
  if (jrc < 0) return dt__seterr(DT_EIO, "%s", why);
  if (any && s->rank == 0)
    DT_LOG_WARN("ps: %d joiner(s) not admitted by the servers; the members go on and re-form "
                "without them", (int)any);
  if (joiners > any && s->rank == 0)
    DT_LOG_INFO("ps: %d joiner(s) admitted at step %lld", joiners - (int)any,
                (long long)s->step);
  if (s->rank == 0)
    DT_LOG_INFO("ps: %d workers go on at step %lld; the servers' clocks count only them",
                s->nranks, (long long)s->step);
  return DT_OK;
}

/* (a collective of the change failing for a lost member: the servers are
 * asked first, err_coll) */
static int ps_membership(dt_strategy *s, const dt_membership *m) {
  int rc = membership_impl(s, m);
  return rc < 0 ? err_coll(s, rc) : DT_OK;
}

static int ps_export(dt_strategy *s, const dt_state_writer *w) {
  ps_impl *d = s->impl;
  if (!d || !w->put_file)
    return dt__seterr(DT_ENOTSUP, "strategy '%s': the servers' state needs a checkpoint with "
                      "files of their own", s->ops->name);
  const dt_ps_map *m = &d->map;
  size_t total = 0;
  for (int k = 0; k < m->nkeys; k++) total += dt_ps_key_state_floats(&d->o, &m->keys[k]);
  float *buf = dt_alloc(total * sizeof(float));
  int64_t *steps = calloc((size_t)m->nkeys, sizeof *steps);
  int rc = buf && steps ? DT_OK : dt__seterr(DT_ENOMEM, "ps checkpoint: out of memory");
  if (rc == DT_OK) rc = dt_ps_client_export(d->cl, buf, steps);
  if (rc == DT_OK) rc = w->put(w->ud, "step", &s->step, sizeof s->step);
  if (rc == DT_OK) rc = w->put(w->ud, "ps.map", m->sha, sizeof m->sha);
  size_t off = 0;
  for (int k = 0; k < m->nkeys && rc == DT_OK; k++) {
    char file[64], owner[32], name[32];
    const size_t n = dt_ps_key_state_floats(&d->o, &m->keys[k]);
    snprintf(file, sizeof file, "ps-shard-%d.safetensors", m->keys[k].server);
    snprintf(owner, sizeof owner, "ps-shard-%d", m->keys[k].server);
    snprintf(name, sizeof name, "key.%d", k);
    rc = w->put_file(w->ud, file, owner, name, buf + off, n * sizeof(float));
    snprintf(name, sizeof name, "key.%d.step", k);
    if (rc == DT_OK) rc = w->put_file(w->ud, file, owner, name, &steps[k], sizeof steps[k]);
    off += n;
  }
  dt_free(buf);
  free(steps);
  return rc < 0 ? err_rank(s, rc) : DT_OK;
}

/* Server `index` takes the records of every key it holds (its own range,
 * and with replicas those of the ranges it replicates) from their ranges'
 * shard files. */
static int restore_server(dt_ps_server *srv, const dt_ps_map *m, const dt_ps_opts *o, int index,
                          const dt_state_reader *r) {
  /* direct asp: the records go into the shared table */
  uint8_t sha[32];
  size_t len = 0;
  DT_CHECK(r->get(r->ud, "ps.map", sha, sizeof sha, &len));
  if (len != sizeof sha || memcmp(sha, m->sha, sizeof sha))
    return dt__seterr(DT_EMISMATCH, "ps server %d: the checkpoint holds another key-range map "
                      "(another model or server count)", index);
  if (!r->get_file)
    return dt__seterr(DT_ENOTSUP, "ps server %d: no shard files to resume from", index);
  size_t cap = 0;
  for (int k = 0; k < m->nkeys; k++)
    if (dt_ps_map_holds(m, index, k) && dt_ps_key_state_floats(o, &m->keys[k]) > cap)
      cap = dt_ps_key_state_floats(o, &m->keys[k]);
  float *buf = dt_alloc((cap ? cap : 1) * sizeof(float));
  if (!buf) return dt__seterr(DT_ENOMEM, "ps server %d: out of memory", index);
  int rc = DT_OK;
  for (int k = 0; k < m->nkeys && rc == DT_OK; k++) {
    if (!dt_ps_map_holds(m, index, k)) continue;
    char file[64], name[32];
    snprintf(file, sizeof file, "ps-shard-%d.safetensors", m->keys[k].server);
    const size_t n = dt_ps_key_state_floats(o, &m->keys[k]);
    int64_t step = 0;
    snprintf(name, sizeof name, "key.%d", k);
    rc = r->get_file(r->ud, file, name, buf, n * sizeof(float), &len);
    if (rc == DT_OK && len != n * sizeof(float))
      rc = dt__seterr(DT_ECORRUPT, "%s: '%s' holds %zu bytes, key %d needs %zu", file, name, len,
                      k, n * sizeof(float));
    snprintf(name, sizeof name, "key.%d.step", k);
    if (rc == DT_OK) rc = r->get_file(r->ud, file, name, &step, sizeof step, &len);
    if (rc == DT_OK && len != sizeof step)
      rc = dt__seterr(DT_ECORRUPT, "%s: '%s' is not a step count", file, name);
    if (rc == DT_OK)
      rc = o->direct ? dt_ps_direct_restore(o->direct, k, buf, step)
                     : dt_ps_server_restore(srv, k, buf, step);
  }
  dt_free(buf);
  return rc;
}

static int ps_import(dt_strategy *s, const dt_state_reader *r) {
  ps_impl *d = s->impl;
  int64_t step = 0;
  size_t len = 0;
  DT_CHECK(r->get(r->ud, "step", &step, sizeof step, &len));
  if (len != sizeof step || step < 0)
    return dt__seterr(DT_ECORRUPT, "ps checkpoint: a bad step count");
  /* a colocated server reads its own shard; separate ones did before serving */
  if (d && d->srv) DT_CHECK(restore_server(d->srv, &d->map, &d->o, s->rank, r));
  /* direct asp: nobody pushes into a range before its owner restored it */
  if (d && d->direct) DT_CHECK(dt_ps_client_quiesce(d->cl));
  s->step = step;
  return DT_OK;
}

const struct dt_strategy_ops dt__strategy_ps = {
    .name = "ps",
    .fixed_point = 0,
    .open_source = ps_source,
    .setup = ps_setup,
    .step_begin = ps_step_begin,
    .forward_begin = ps_forward_begin,
    .backward_begin = NULL,
    .grad_ready = ps_grad_ready,
    .step_finish = ps_step_finish,
    .eval_begin = ps_eval_begin,
    .eval_reduce = ps_eval_reduce,
    .epoch_end = ps_epoch_end,
    .state_export = ps_export,
    .state_import = ps_import,
    .membership_change = ps_membership,
    .run_end = ps_run_end,
    .teardown = ps_teardown,
};

/* ---- the server role and the map, for the command line ------------------------ */

int dt__engine_set_rdzv(dt_engine *e, const char *host, int port, const struct dt_comm_config *cc) {
  if (!e) return dt__seterr(DT_EINVAL, "dt__engine_set_rdzv: NULL engine");
  e->strat.rdzv_host = host;
  e->strat.rdzv_port = port;
  e->strat.rdzv_cc = cc;
  return DT_OK;
}

int dt__engine_set_job_comm(dt_engine *e, dt_comm *job) {
  if (!e || !job) return dt__seterr(DT_EINVAL, "dt__engine_set_job_comm: NULL argument");
  e->job_comm = job;
  dt__engine_lend(e);
  return DT_OK;
}

int dt__engine_serve(dt_engine *e, dt_comm *job, int index) {
  if (!e || !job) return dt__seterr(DT_EINVAL, "dt__engine_serve: NULL argument");
  const dt_run_cfg *c = &e->cfg;
  dt_ps_opts o;
  ps_opts(c, c->workers, &o);
  dt_ps_map map;
  DT_CHECK(dt_ps_map_from_model(&map, e->model, o.nservers, o.consistency));
  dt_ps_server *srv = NULL;
  ps_win win = {0};
  int rc = dt_ps_map_set_replicas(&map, o.replicas);
  if (rc == DT_OK && (o.replicas > 1 || o.elastic)) rc = dt__comm_tolerate_loss(job);
  if (rc == DT_OK) rc = win_open(&win, job, &o, NULL, dt_model_nparams(e->model));
  if (rc == DT_OK) rc = dt_ps_server_create(&srv, &map, &o, index, job, dt_model_params(e->model));
  /* elastic workers: joiners announce themselves in the job's store */
  if (rc == DT_OK && o.elastic && e->strat.rdzv_port && e->strat.rdzv_cc)
    rc = dt_ps_server_set_joins(srv, e->strat.rdzv_host, e->strat.rdzv_port, e->strat.rdzv_cc);
  /* replicas: a new process in a lost server's slot may rejoin (rejoin.c) */
  if (rc == DT_OK && o.replicas > 1 && e->strat.rdzv_port && e->strat.rdzv_cc)
    rc = dt_ps_server_set_rejoins(srv, e->strat.rdzv_host, e->strat.rdzv_port, e->strat.rdzv_cc);
  /* a resumed run: this server's records from its shard of the checkpoint */
  if (rc == DT_OK && e->ck.res) {
    dt_state_reader rd;
    dt__ckpt_reader(e->ck.res, &rd);
    rc = restore_server(srv, &map, &o, index, &rd);
  }
  /* a server waits on workers between their messages (evaluation, data):
   * give it the deadline of a long pause, not of one message */
  if (rc == DT_OK && dt_comm_timeout(job) < 600) dt_comm_set_timeout(job, 600);
  if (rc == DT_OK) rc = dt_ps_server_run(srv);
  dt_ps_server_destroy(srv);
  win_close(&win, NULL);
  dt_ps_map_free(&map);
  return rc;
}

/* A new server process in lost server `index`'s slot of a running job
 * (dtrain launch --join with DTRAIN_PS_REJOIN, src/ps/rejoin.c): waits for
 * the workers' next epoch end, takes a copy of every range that runs on
 * fewer than ps.replicas copies and serves as their backup until the
 * workers say goodbye. */
int dt__engine_rejoin_serve(dt_engine *e, const char *host, int port,
                            const struct dt_comm_config *cc, int index) {
  if (!e || !host || port <= 0 || !cc)
    return dt__seterr(DT_EINVAL, "ps rejoin: needs the job's rendezvous store (dtrain launch "
                      "--join --rdzv HOST:PORT)");
  const dt_run_cfg *c = &e->cfg;
  if (c->ps.colocate || c->ps.servers < 1 || index >= c->ps.servers)
    return dt__seterr(DT_EINVAL, "ps rejoin: server slot %d, but the job has %d separate "
                      "servers", index, c->ps.colocate ? 0 : c->ps.servers);
  dt_ps_opts o;
  ps_opts(c, c->workers, &o);
  dt_ps_map map;
  DT_CHECK(dt_ps_map_from_model(&map, e->model, o.nservers, o.consistency));
  dt_ps_server *srv = NULL;
  dt_comm *comm = NULL;
  uint8_t *late = calloc((size_t)o.nservers, 1);
  int64_t number = 0;
  int rc = late ? dt_ps_map_set_replicas(&map, o.replicas) : dt__seterr(DT_ENOMEM, "ps: out of memory");
  if (rc == DT_OK)
    rc = dt_ps_rejoin_connect(host, port, cc, &map, o.nworkers, index, &comm, late, &number);
  if (rc == DT_OK) rc = dt_ps_server_create(&srv, &map, &o, index, comm, dt_model_params(e->model));
  if (rc == DT_OK) rc = dt_ps_server_set_rejoins(srv, host, port, cc);
  if (rc == DT_OK) rc = dt_ps_server_rejoined(srv, late, number);
  if (rc == DT_OK && dt_comm_timeout(comm) < 600) dt_comm_set_timeout(comm, 600);
  if (rc == DT_OK) rc = dt_ps_server_run(srv);
  dt_ps_server_destroy(srv);
  dt_comm_destroy(comm);
  free(late);
  dt_ps_map_free(&map);
  return rc;
}

int dt__engine_ps_describe(dt_engine *e, char **out) {
  *out = NULL;
  const dt_run_cfg *c = &e->cfg;
  int S = c->ps.colocate ? c->workers : c->ps.servers;
  dt_ps_opts o;
  ps_opts(c, c->workers, &o);
  dt_ps_map map;
  DT_CHECK(dt_ps_map_from_model(&map, e->model, S, o.consistency));
  if (!c->ps.colocate && c->ps.replicas > 1 && dt_ps_map_set_replicas(&map, c->ps.replicas) < 0) {
    dt_ps_map_free(&map);
    return dt__preerr(DT_EINVAL, "ps");
  }
  size_t n = dt_ps_map_describe(&map, e->model, NULL, 0);
  char *buf = malloc(n + 1);
  if (buf) dt_ps_map_describe(&map, e->model, buf, n + 1);
  dt_ps_map_free(&map);
  if (!buf) return dt__seterr(DT_ENOMEM, "ps: out of memory");
  *out = buf;
  return DT_OK;
}
