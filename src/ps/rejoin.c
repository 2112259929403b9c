/*
 * rejoin.c — a new server process in a lost server's slot (replicas,
 * docs/ps.md "A restarted server rejoins"). The job's communicator has a
 * fixed set of processes, so the newcomer cannot come in on it: it takes
 * a number J from the job's store (the counter JOB/ps/rejoins), writes its
 * slot under JOB/ps/rejoin/J and waits for a communicator of the job's
 * layout (workers 0..N-1, server s at N + s) named JOB.psrJ, in which it
 * has the lost server's rank.
 *
 * The workers look at the counter at each epoch's end (after the epoch's
 * collectives: no request of theirs is outstanding) and agree on it (the
 * largest any of them read). For a new J each worker tells every live
 * server DT_PS_REJOIN — its last message on the old communicator — then
 * joins JOB.psrJ and sends everything there from then on. A server takes
 * the workers' messages on the old communicator until each has told; then
 * it finishes what it was sending there and joins JOB.psrJ too, so
 * nobody waits in the communicator's creation for a process that waits
 * for it. Every process then counts the slot live again but *late*: it
 * comes after every other live server in each range's holder list
 * (dt_ps_holders_late), so it takes only the ranges that run on fewer
 * than R copies, and each of those ranges' primaries sends it a copy
 * (server_copy.c: parameters, optimizer state, clocks, at a clock
 * boundary) exactly as to a new holder after a loss. The workers push to
 * it from their next step on; it queues those pushes until its copy is
 * in, then goes on as a replica (in bsp bit for bit the primary's).
 *
 * It does not restart processes (a launcher or an operator does), nor
 * move a range that has its R copies, nor take a slot whose server is
 * alive (the workers skip the rejoin with a warning; the newcomer's wait
 * ends at the deadline), nor rejoin while another server is lost (the
 * communicator needs every other process of the job). A newcomer that
 * dies before the communicator is built costs the job the deadline: every
 * process's creation fails and they go on on the old one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps/client_int.h"
#include "ps/server_int.h"

static const char *job_name(const struct dt_comm_config *cc) {
  return cc->job ? cc->job : "dtrain";
}

/* The rejoin's communicator: the job's layout under JOB.psrJ, this
 * process at `rank`; it survives lost peers as the job's does. */
static int rejoin_comm(const char *host, int port, const struct dt_comm_config *cc, int64_t J,
                       int rank, int size, double timeout, dt_comm **out) {
  dt_store *st = NULL;
  DT_CHECK(dt_store_connect(&st, host, port, cc->token, timeout));
  char name[256];
  snprintf(name, sizeof name, "%s.psr%lld", job_name(cc), (long long)J);
  struct dt_comm_config c = *cc;
  c.job = name;
  c.rank = rank;
  c.size = size;
  c.timeout_s = timeout;
  int rc = dt_comm_create(out, st, &c);
  dt_store_destroy(st);
  if (rc == DT_OK) rc = dt__comm_tolerate_loss(*out);
  return rc;
}

/* ---- a server of the job ---------------------------------------------------------- */

int dt_ps_server_set_rejoins(dt_ps_server *s, const char *host, int port,
                             const struct dt_comm_config *cc) {
  if (!s || !host || port <= 0 || !cc)
    return dt__seterr(DT_EINVAL, "ps server: rejoins need the job's store and comm config");
  if (!s->cp) return DT_OK;
  snprintf(s->rj_host, sizeof s->rj_host, "%s", host);
  s->rj_port = port;
  s->rj_cc = *cc;
  return DT_OK;
}

void dt__pss_rejoin_free(dt_ps_server *s) {
  for (int i = 0; i < s->rj_n; i++) dt_comm_destroy(s->rj_comms[i]);
  free(s->rj_comms);
  s->rj_comms = NULL;
  s->rj_n = 0;
}

int dt__pss_rj_hold(const dt_ps_server *s, int w) {
  return s->rj_told && s->rj_told[w] > s->rj_done;
}

static int in(const int *l, int n, int x) {
  for (int i = 0; i < n; i++)
    if (l[i] == x) return 1;
  return 0;
}

/* Server d counts as live again, after the others: the ranges it is a new
 * holder of get a copy from their primary (when that is this server). */
static void count_back(dt_ps_server *s, int d) {
  const dt_ps_map *m = s->map;
  const int S = m->nservers, R = m->replicas > 1 ? m->replicas : 1, me = s->index;
  s->dead[d] = 0;
  s->late[d] = 1;
  for (int w = 0; w < s->N; w++) s->told[(size_t)w * S + d] = 0;
  int *nw = s->hold + (size_t)S * R;
  for (int g = 0; g < S; g++) {
    if (m->srv_key0[g] == m->srv_key0[g + 1]) continue;
    int *old = s->hold + (size_t)g * R, no = s->nhold[g];
    int nn = dt_ps_holders_late(m, g, s->dead, s->late, nw);
    if (nw[0] == me && in(nw, nn, d) && !in(old, no, d)) {
      s->cp_want[(size_t)g * S + d] = 1;
      DT_LOG_WARN("ps server %d: server %d is back; keys %d-%d (server %d's range) get a copy "
                  "on it", me, d, m->srv_key0[g], m->srv_key0[g + 1] - 1, g);
    }
    memcpy(old, nw, (size_t)nn * sizeof *nw);
    s->nhold[g] = nn;
  }
}

/* Every live worker has told of rejoin J: nothing more comes on the old
 * communicator. What this server still sends there finishes, then it
 * joins the rejoin's and serves there. */
static int switch_comm(dt_ps_server *s, int64_t J, int d) {
  const int S = s->map->nservers;
  for (int i = 0; i < s->nk; i++) DT_CHECK(dt__pss_settle(s, &s->keys[i]));
  /* copies on their way finish on the old communicator (a copy still to
   * come from a live server is waited for, up to the deadline) */
  dt__pss_copy_finish(s);
  double t0 = dt_now(), lim = s->rj_cc.timeout_s > 0 ? s->rj_cc.timeout_s : 60;
  for (int idle = 0;;) {
    int waiting = 0;
    for (int i = 0; i < s->nk; i++) waiting |= s->keys[i].live == 0 && s->keys[i].cbusy;
    if (!waiting) break;
    if (dt_now() - t0 > lim)
      return dt__seterr(DT_ETIMEDOUT, "ps server %d: rejoin %lld: a copy still on its way "
                        "after %.0f s", s->index, (long long)J, lim);
    int busy = 0;
    DT_CHECK(dt__pss_copy_poll(s, &busy));
    idle = busy ? 0 : idle + 1;
    dt__ps_backoff(idle);
  }
  dt_comm **l = realloc(s->rj_comms, (size_t)(s->rj_n + 1) * sizeof *l);
  if (!l) return dt__seterr(DT_ENOMEM, "ps server %d: out of memory", s->index);
  s->rj_comms = l;
  dt_comm *nc = NULL;
  int rc = rejoin_comm(s->rj_host, s->rj_port, &s->rj_cc, J, dt_ps_server_rank(&s->o, s->index),
                       s->N + S, lim, &nc);
  if (rc < 0) {
    /* the newcomer never came (it died, or another process failed): the
     * workers fail the same way and go on on the old communicator */
    DT_LOG_WARN("ps server %d: rejoin %lld of server %d failed (%s); going on without it",
                s->index, (long long)J, d, dt_errmsg());
    s->rj_done = J;
    return DT_OK;
  }
  s->rj_comms[s->rj_n++] = nc;
  if (dt_comm_timeout(nc) < 600) dt_comm_set_timeout(nc, 600);
  s->comm = nc;
  for (int w = 0; w < s->N; w++) s->posted[w] = 0;
  s->rj_done = J;
  count_back(s, d);
  DT_LOG_WARN("ps server %d: rejoin %lld: server %d is back in its slot; serving on the rejoin's "
              "communicator", s->index, (long long)J, d);
  return DT_OK;
}

int dt__pss_rejoin_told(dt_ps_server *s, int w, const dt_ps_msg *m) {
  const int d = (int)m->aux;
  if (!s->cp || !s->rj_port)
    return dt__seterr(DT_EPROTO, "ps server %d: worker %d told of a rejoin, but this server has "
                      "no replicas or no store", s->index, w);
  /* (numbers the workers skipped never come) */
  if (m->clock <= s->rj_done)
    return dt__seterr(DT_EPROTO, "ps server %d: worker %d told of rejoin %lld, after %lld",
                      s->index, w, (long long)m->clock, (long long)s->rj_done);
  if (d == s->index || !s->dead[d])
    return dt__seterr(DT_EPROTO, "ps server %d: worker %d says server %d is back, but it was not "
                      "lost here", s->index, w, d);
  s->rj_told[w] = m->clock;
  s->rj_slot = d;
  for (int v = 0; v < s->N; v++)
    if (!s->bye[v] && !s->gone[v] && s->rj_told[v] < m->clock) return DT_OK;
  return switch_comm(s, m->clock, d);
}

/* ---- the newcomer ----------------------------------------------------------------- */

int dt_ps_rejoin_connect(const char *host, int port, const struct dt_comm_config *cc,
                         const dt_ps_map *map, int nworkers, int slot, dt_comm **out,
                         uint8_t *late, int64_t *number) {
  *out = NULL;
  if (!host || port <= 0 || !cc || !map || slot < 0 || slot >= map->nservers || nworkers < 1)
    return dt__seterr(DT_EINVAL, "ps rejoin: needs the job's store, comm config and a server "
                      "slot (0-%d)", map ? map->nservers - 1 : 0);
  if (map->replicas < 2)
    return dt__seterr(DT_EINVAL, "ps rejoin: server %d's ranges have no other copy to come from "
                      "(ps.replicas = 1)", slot);
  const double t = cc->timeout_s > 0 ? cc->timeout_s : 60;
  dt_store *st = NULL;
  DT_CHECK(dt_store_connect(&st, host, port, cc->token, t));
  char key[300], ckey[300], val[32];
  int64_t J = 0;
  /* the number, then the slot under it (a worker that reads the counter
   * first waits for the slot's key) */
  snprintf(ckey, sizeof ckey, "%s/ps/rejoins", job_name(cc));
  int rc = dt_store_add(st, ckey, 1, &J, t);
  if (rc == DT_OK) {
    snprintf(key, sizeof key, "%s/ps/rejoin/%lld", job_name(cc), (long long)J);
    /* the slot and this process's map digest: the workers skip a newcomer
     * with another map (another model or config) */
    snprintf(val, sizeof val, "%d %016llx", slot, (unsigned long long)dt_ps_map_digest(map));
    rc = dt_store_set(st, key, val, strlen(val), t);
  }
  /* the slots that rejoined before (their newcomer built its communicator
   * and said so under .../ok; a skipped or failed one did not) */
  memset(late, 0, (size_t)map->nservers);
  for (int64_t j = 1; rc == DT_OK && j < J; j++) {
    size_t n = 0;
    snprintf(key, sizeof key, "%s/ps/rejoin/%lld/ok", job_name(cc), (long long)j);
    if (dt_store_get(st, key, val, sizeof val - 1, &n, 0.05) != DT_OK) continue;
    val[n] = 0;
    int v = atoi(val);
    if (v >= 0 && v < map->nservers) late[v] = 1;
  }
  late[slot] = 1;
  if (rc == DT_OK) {
    *number = J;
    DT_LOG_WARN("ps server %d: rejoin %lld: waiting for the workers' next epoch end (at most "
                "%.0f s)", slot, (long long)J, t);
    rc = rejoin_comm(host, port, cc, J, nworkers + slot, nworkers + map->nservers, t, out);
  }
  if (rc == DT_OK) {
    snprintf(key, sizeof key, "%s/ps/rejoin/%lld/ok", job_name(cc), (long long)J);
    snprintf(val, sizeof val, "%d", slot);
    rc = dt_store_set(st, key, val, strlen(val), t);
  }
  dt_store_destroy(st);
  if (rc < 0) {
    dt_comm_destroy(*out);
    *out = NULL;
    return dt__preerr(rc, "ps rejoin (server %d)", slot);
  }
  return DT_OK;
}

int dt_ps_server_rejoined(dt_ps_server *s, const uint8_t *late, int64_t number) {
  const dt_ps_map *m = s->map;
  const int S = m->nservers, R = m->replicas > 1 ? m->replicas : 1;
  if (!s->cp) return dt__seterr(DT_EINVAL, "ps server %d: a rejoin needs replicas", s->index);
  /* nothing of its own: every range it holds comes as a copy */
  for (int i = 0; i < s->nk; i++) dt__pss_key_free(&s->keys[i]);
  memset(s->keys, 0, (size_t)m->nkeys * sizeof *s->keys);
  s->nk = 0;
  for (int k = 0; k < m->nkeys; k++) s->kpos[k] = -1;
  memcpy(s->late, late, (size_t)S);
  s->rj_done = number;
  for (int w = 0; w < s->N; w++) s->rj_told[w] = number;
  s->cp_t0 = dt_now_ns();
  int held = 0;
  for (int g = 0; g < S; g++) {
    s->nhold[g] = dt_ps_holders_late(m, g, s->dead, s->late, s->hold + (size_t)g * R);
    if (m->srv_key0[g] == m->srv_key0[g + 1]) continue;
    const int *h = s->hold + (size_t)g * R;
    if (!in(h, s->nhold[g], s->index)) continue;
    if (h[0] == s->index)
      return dt__seterr(DT_EINVAL, "ps server %d: rejoin: it would be range %d's primary (no "
                        "other live server holds it)", s->index, g);
    DT_CHECK(dt__pss_take_range(s, g, h[0], 1));
    held++;
  }
  if (!held)
    DT_LOG_WARN("ps server %d: rejoin %lld: every range has its %d copies; this server is a "
                "spare until a server is lost", s->index, (long long)number, R);
  return DT_OK;
}

/* ---- a worker ---------------------------------------------------------------------- */

int dt_ps_client_rejoin(dt_ps_client *c, const char *host, int port,
                        const struct dt_comm_config *cc, int64_t number, int d) {
  const dt_ps_map *m = c->map;
  const int S = m->nservers;
  if (c->R < 2 || c->local || d < 0 || d >= S)
    return dt__seterr(DT_EINVAL, "ps worker %d: rejoin %lld of server slot %d: needs separate "
                      "servers with replicas", c->me, (long long)number, d);
  int others = 0;
  for (int s = 0; s < S; s++) others += s != d && c->sdead[s];
  if (!c->sdead[d] || others) {
    DT_LOG_WARN("ps worker %d: rejoin %lld of server %d skipped: %s", c->me, (long long)number, d,
                !c->sdead[d] ? "that server was not lost" : "another server is lost too (a "
                "rejoin needs every other process of the job)");
    return DT_OK;
  }
  DT_CHECK(dt__psc_tell_losses(c));
  dt_ps_msg h = {.type = DT_PS_REJOIN, .sender = c->me, .clock = number, .aux = (uint64_t)d};
  uint8_t hb[DT_PS_HDR_BYTES];
  dt_ps_msg_encode(&h, hb);
  for (int s = 0; s < S; s++) {
    if (c->sdead[s]) continue;
    dt_comm_req r;
    int rc = dt_comm_isend(c->comm, dt__psc_srv_rank(c, s), DT_PS_TAG_REQ, hb, sizeof hb, &r);
    if (rc == DT_OK) rc = dt_comm_waitall(c->comm, &r, 1);
    if (rc < 0 && !dt__psc_survivable(c, rc, s))
      return dt__psc_comm_fail(c, rc, "telling the servers of a rejoin");
  }
  dt_comm **l = realloc(c->rj_comms, (size_t)(c->rj_n + 1) * sizeof *l);
  if (!l) return dt__seterr(DT_ENOMEM, "ps worker %d: out of memory", c->me);
  c->rj_comms = l;
  dt_comm *nc = NULL;
  const double t = cc->timeout_s > 0 ? cc->timeout_s : 60;
  int rc = rejoin_comm(host, port, cc, number, c->me, c->o.nworkers + S, t, &nc);
  if (rc < 0) {
    /* the newcomer never came: every process's creation fails alike, and
     * everyone goes on on the old communicator with the slot lost */
    DT_LOG_WARN("ps worker %d: rejoin %lld of server %d failed (%s); going on without it",
                c->me, (long long)number, d, dt_errmsg());
    return DT_OK;
  }
  c->rj_comms[c->rj_n++] = nc;
  c->comm = nc;
  c->sdead[d] = 0;
  c->stold[d] = 0;
  c->late[d] = 1;
  int hl[DT_PS_MAX_REPLICAS];
  for (int g = 0; g < S; g++) {
    if (m->srv_key0[g] == m->srv_key0[g + 1]) continue;
    int n = dt_ps_holders_late(m, g, c->sdead, c->late, hl);
    if (in(hl, n, d))
      DT_LOG_WARN("ps worker %d: keys %d-%d (server %d's range) get a copy on server %d, back "
                  "in its slot (rejoin %lld)", c->me, m->srv_key0[g], m->srv_key0[g + 1] - 1, g,
                  d, (long long)number);
  }
  return DT_OK;
}
