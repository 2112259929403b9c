/*
 * comm_create.c — making and freeing communicators: the transport table
 * lookup, rendezvous through the store (world size, assigned ranks, every
 * rank's host identity and transport addresses), one endpoint per peer in
 * increasing rank order over the first transport that reaches it, the
 * world's reference count (sub-communicators share it) and the host
 * topology. Not here: messages, fingerprints, collectives, split (comm.c).
 */
#define _GNU_SOURCE
#include "comm/comm_int.h"
#include "comm/transport.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- transports -------------------------------------------------------- */

/* What a job may ask for (dist.transport, DTRAIN_TRANSPORT, dt_job_config);
 * index = enum dt_dist_transport. "auto" is resolved by the launcher. */
const char *const dt__transport_names[] = {"auto", "shm", "tcp", "mpi", NULL};

const struct dt_transport_ops *dt__transport_find(const char *name) {
  if (!name) return NULL;
  if (!strcmp(name, "tcp")) return &dt__transport_tcp;
  if (!strcmp(name, "inproc")) return &dt__transport_inproc;
  if (!strcmp(name, "shm")) return &dt__transport_shm;
#ifdef DT_WITH_MPI
  if (!strcmp(name, "mpi")) return &dt__transport_mpi;
#endif
  return NULL;
}

/* ---- construction ------------------------------------------------------ */

void dt__world_release(struct world *w) {
  if (!w || --w->refs > 0) return;
  for (int p = 0; p < w->size; p++)
    if (w->ep && w->ep[p]) w->tops[w->tp_of[p]]->close(w->ep[p]);
  for (int i = 0; i < w->ntp; i++) w->tops[i]->finalize(w->tctx[i]);
  for (int p = 0; w->host_id && p < w->size; p++) free(w->host_id[p]);
  free(w->host_id);
  free(w->ep);
  free(w->tp_of);
  pthread_mutex_destroy(&w->amu);
  free(w);
}

dt_comm *dt__comm_alloc(struct world *w, int size) {
  dt_comm *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->w = w;
  c->size = size;
  c->wr = calloc((size_t)size, sizeof *c->wr);
  c->host = calloc((size_t)size, sizeof *c->host);
  c->fp_sent = calloc((size_t)size, 1);
  c->fp_posted = calloc((size_t)size, 1);
  c->fp_in = calloc((size_t)size, FP_MSG);
  c->fp_obuf = calloc((size_t)size, FP_MSG);
  c->fp_sreq = calloc((size_t)size, sizeof *c->fp_sreq);
  c->fp_rreq = calloc((size_t)size, sizeof *c->fp_rreq);
  if (!c->wr || !c->host || !c->fp_sent || !c->fp_posted || !c->fp_in || !c->fp_obuf || !c->fp_sreq || !c->fp_rreq) {
    free(c->wr), free(c->host), free(c->fp_sent), free(c->fp_posted), free(c->fp_in);
    free(c->fp_obuf), free(c->fp_sreq), free(c->fp_rreq), free(c);
    return NULL;
  }
  c->timeout = 60.0;
  return c;
}

void dt__comm_compute_hosts(dt_comm *c) {
  c->nhosts = 0;
  for (int r = 0; r < c->size; r++) {
    c->host[r] = -1;
    for (int q = 0; q < r; q++)
      if (!strcmp(c->w->host_id[c->wr[q]], c->w->host_id[c->wr[r]])) {
        c->host[r] = c->host[q];
        break;
      }
    if (c->host[r] < 0) c->host[r] = c->nhosts++;
  }
}

static void default_host_id(char *out, size_t cap) {
  char hn[256] = "localhost", boot[64] = "";
  gethostname(hn, sizeof hn - 1);
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f) {
    if (!fgets(boot, sizeof boot, f)) boot[0] = '\0';
    fclose(f);
    boot[strcspn(boot, "\n")] = '\0';
  }
  snprintf(out, cap, "%s/%s", hn, boot);
}

/* Finds "name=addr" among the lines of a peer record. */
static bool find_addr(const char *lines, const char *name, char *addr) {
  size_t nl = strlen(name);
  for (const char *l = lines; *l;) {
    size_t len = strcspn(l, "\n");
    if (len > nl && !strncmp(l, name, nl) && l[nl] == '=' && len - nl - 1 < DT_TP_ADDR_MAX) {
      memcpy(addr, l + nl + 1, len - nl - 1);
      addr[len - nl - 1] = '\0';
      return true;
    }
    l += len;
    if (*l) l++;
  }
  return false;
}

static int parse_transports(const char *spec, const struct dt_transport_ops **t, int *n) {
  *n = 0;
  if (!spec || !strcmp(spec, "auto")) {
    t[(*n)++] = &dt__transport_shm;
    t[(*n)++] = &dt__transport_tcp;
    return DT_OK;
  }
  const struct dt_transport_ops *o = dt__transport_find(spec);
  if (!o) return dt__seterr(DT_ENOTSUP, "comm: transport '%s' unknown or not built", spec);
  t[(*n)++] = o;
  return DT_OK;
}

int dt_comm_create(dt_comm **out, dt_store *store, const struct dt_comm_config *cfg_in) {
  struct dt_comm_config cfg = DT_COMM_CONFIG_INIT;
  if (cfg_in) cfg = *cfg_in;
  if (!out) return dt__seterr(DT_EINVAL, "comm create: out is NULL");
  *out = NULL;
  if (!store) return dt__seterr(DT_EINVAL, "comm: no store");
  const char *job = cfg.job ? cfg.job : "dtrain";
  double timeout = cfg.timeout_s > 0 ? cfg.timeout_s : 60.0;
  int64_t deadline = dt_now_ns() + (int64_t)(timeout * 1e9);
  char key[DT_STORE_KEY_MAX];
  int rc;

  int size = cfg.size;
  if (size <= 0) {
    char buf[32] = {0};
    size_t len;
    snprintf(key, sizeof key, "%s/size", job);
    rc = dt_store_get(store, key, buf, sizeof buf - 1, &len, timeout);
    if (rc < 0) return dt__preerr(rc, "comm: world size of job %s", job);
    size = atoi(buf);
    if (size <= 0) return dt__seterr(DT_EINVAL, "comm: store key %s holds bad size '%s'", key, buf);
  }
  int rank = cfg.rank;
  if (rank < 0) {
    int64_t v;
    snprintf(key, sizeof key, "%s/rank_next", job);
    DT_CHECK(dt_store_add(store, key, 1, &v, timeout));
    rank = (int)(v - 1);
  }
  if (rank >= size)
    return dt__seterr(DT_EINVAL, "comm: rank %d out of range for world size %d (job %s)", rank, size, job);

  const struct dt_transport_ops *cand[MAX_TP];
  int ncand;
  DT_CHECK(parse_transports(cfg.transport, cand, &ncand));
  char host_id[256];
  if (cfg.host_id) snprintf(host_id, sizeof host_id, "%s", cfg.host_id);
  else default_host_id(host_id, sizeof host_id);
  const uint8_t *tok;
  size_t toklen;
  dt__auth_token(cfg.token, &tok, &toklen);

  struct world *w = calloc(1, sizeof *w);
  if (!w) return dt__seterr(DT_ENOMEM, "comm: out of memory");
  w->refs = 1;
  pthread_mutex_init(&w->amu, NULL);
  w->rank = rank;
  w->size = size;
  w->tp_of = calloc((size_t)size, sizeof *w->tp_of);
  w->ep = calloc((size_t)size, sizeof *w->ep);
  w->host_id = calloc((size_t)size, sizeof *w->host_id);
  dt_comm *c = NULL;
  char *rec = NULL;
  if (!w->tp_of || !w->ep || !w->host_id) {
    rc = dt__seterr(DT_ENOMEM, "comm: out of memory");
    goto fail;
  }
  /* init transports, build our record "host_id\nname=addr\n..." */
  size_t reccap = 256 + MAX_TP * (DT_TP_ADDR_MAX + 16);
  rec = malloc(reccap);
  if (!rec) {
    rc = dt__seterr(DT_ENOMEM, "comm: out of memory");
    goto fail;
  }
  size_t rl = (size_t)snprintf(rec, reccap, "%s\n", host_id);
  struct dt_tp_init ti = {rank, size, job, cfg.bind_addr ? cfg.bind_addr : "127.0.0.1", host_id,
                          toklen ? tok : NULL, toklen, cfg.nconn > 0 ? cfg.nconn : 0, timeout};
  for (int i = 0; i < ncand; i++) {
    char addr[DT_TP_ADDR_MAX] = "";
    rc = cand[i]->init(&ti, &w->tctx[w->ntp], addr);
    if (rc < 0) {
      if (ncand > 1 && i < ncand - 1) { /* optional transport (auto): skip it */
        DT_LOG_DEBUG("comm: transport %s unavailable: %s", cand[i]->name, dt_errmsg());
        continue;
      }
      dt__preerr(rc, "comm: rank %d: transport %s", rank, cand[i]->name);
      goto fail;
    }
    w->tops[w->ntp++] = cand[i];
    rl += (size_t)snprintf(rec + rl, reccap - rl, "%s=%s\n", cand[i]->name, addr);
  }
  snprintf(key, sizeof key, "%s/addr/%d", job, rank);
  DT_CHECK_GOTO(dt_store_set(store, key, rec, rl, timeout), rc, fail);

  /* read every peer's record, connect in increasing rank order */
  char prec[256 + MAX_TP * (DT_TP_ADDR_MAX + 16)];
  for (int p = 0; p < size; p++) {
    if (p == rank) {
      w->host_id[p] = strdup(host_id);
      w->tp_of[p] = -1;
      if (!w->host_id[p]) { rc = dt__seterr(DT_ENOMEM, "comm: out of memory"); goto fail; }
      continue;
    }
    size_t len;
    snprintf(key, sizeof key, "%s/addr/%d", job, p);
    double left = (double)(deadline - dt_now_ns()) / 1e9;
    rc = dt_store_get(store, key, prec, sizeof prec - 1, &len, left > 0.001 ? left : 0.001);
    if (rc < 0) {
      /* dt_errmsg() is the buffer dt__seterr writes: copy it first */
      char why[256];
      snprintf(why, sizeof why, "%s", dt_errmsg());
      dt__seterr(rc, "comm: rank %d: rank %d of job %s did not join before the deadline (%s)", rank,
                 p, job, why);
      goto fail;
    }
    prec[len] = '\0';
    char *nl = strchr(prec, '\n');
    if (!nl) { rc = dt__seterr(DT_EPROTO, "comm: bad address record for rank %d", p); goto fail; }
    *nl = '\0';
    w->host_id[p] = strdup(prec);
    if (!w->host_id[p]) { rc = dt__seterr(DT_ENOMEM, "comm: out of memory"); goto fail; }
    int chosen = -1;
    for (int i = 0; i < w->ntp && chosen < 0; i++) {
      char addr[DT_TP_ADDR_MAX];
      if (!find_addr(nl + 1, w->tops[i]->name, addr)) continue;
      struct dt_tp_peer peer = {p, w->host_id[p], addr};
      if (!w->tops[i]->can_connect(w->tctx[i], &peer)) continue;
      char err[DT_TP_ERR_MAX] = "";
      rc = w->tops[i]->connect(w->tctx[i], &peer, deadline, &w->ep[p], err);
      if (rc < 0) {
        dt__seterr(rc, "comm: rank %d: cannot connect to rank %d over %s: %s", rank, p,
                   w->tops[i]->name, err);
        goto fail;
      }
      chosen = i;
    }
    if (chosen < 0) {
      rc = dt__seterr(DT_ENOTSUP, "comm: rank %d: no transport reaches rank %d (host %s)", rank, p,
                      w->host_id[p]);
      goto fail;
    }
    w->tp_of[p] = chosen;
  }
  free(rec);
  rec = NULL;
  for (int i = 0; i < w->ntp; i++)
    if (w->tops[i]->setup_done) w->tops[i]->setup_done(w->tctx[i]);
  c = dt__comm_alloc(w, size);
  if (!c) { rc = dt__seterr(DT_ENOMEM, "comm: out of memory"); goto fail; }
  c->rank = rank;
  for (int r = 0; r < size; r++) c->wr[r] = r;
  dt__comm_compute_hosts(c);
  c->timeout = timeout;
  c->ctxid = 1;
  c->algo = cfg.algo;
  const char *env_algo = dt_param_s(DT_PARAM_ALGO);
  if (env_algo && c->algo == DT_ALGO_AUTO) {
    dt_algo a;
    if (dt_algo_parse(env_algo, &a) == DT_OK) c->algo = a;
    else DT_LOG_WARN("DTRAIN_ALGO=%s is not an algorithm; using auto", env_algo);
  }
  /* Creation ends together: without this barrier a rank that connected to
   * everyone could return, finish its work and close its connections while
   * a peer was still waiting for it in the loop above, which then saw a
   * connection that had come and gone and waited out the deadline (the
   * CI failure of test_p2p with 3 tcp ranks, rank 2 idle in the body). */
  rc = dt_comm_barrier(c);
  if (rc < 0) {
    char saved[512];
    snprintf(saved, sizeof saved, "%s", dt_errmsg());
    dt_comm_destroy(c);
    return dt__seterr(rc, "comm: rank %d: creation barrier: %s", rank, saved);
  }
  *out = c;
  return DT_OK;
fail:
  free(rec);
  {
    char saved[512];
    snprintf(saved, sizeof saved, "%s", dt_errmsg());
    dt__world_release(w);
    dt__seterr(rc, "%s", saved);
  }
  return rc;
}

void dt_comm_destroy(dt_comm *c) {
  if (!c) return;
  dt_comm_destroy(c->host_comm);
  dt_comm_destroy(c->leader_comm);
  for (int i = 0; i < 4; i++) dt_free(c->scratch[i]);
  struct world *w = c->w;
  free(c->wr), free(c->host), free(c->fp_sent), free(c->fp_posted), free(c->fp_in);
  free(c->fp_obuf), free(c->fp_sreq), free(c->fp_rreq);
  free(c);
  dt__world_release(w);
}
