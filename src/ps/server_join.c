/*
 * server_join.c — workers joining a running parameter-server job (elastic
 * workers, docs/ps.md "Workers joining"). The job's communicator has a
 * fixed set of ranks, so a joiner cannot come in on it: it announces itself
 * in the job's rendezvous store (the counter JOB/ps/joins), and it and
 * every server build a communicator of their own for it (JOB.psjJ: the
 * joiner rank 0, server s rank 1 + s). Over it the joiner says which
 * worker slot it takes (one whose worker was lost) with a HELLO flagged
 * JOIN; a server checks the slot and the key-range map, takes the slot's
 * old worker out of the clocks if it has not seen it go yet, and from then
 * on serves the slot over the new communicator, its push clocks starting
 * at the live workers' lowest (the clock the members are at: they admit a
 * joiner at a step boundary and push nothing until every server welcomed
 * it). A refused joiner gets DT_PS_ERR and one line of text; the job goes
 * on.
 *
 * Servers look at the counter every 100 ms in their poll loop (one store
 * round trip); the communicator's creation and the greeting are bounded by
 * the job's deadline (at most 10 s). It does not decide who joins: the
 * workers' elastic membership (src/elastic) admits joiners, and the
 * strategy (strategy_ps.c) picks the slot.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps/server_int.h"

#define JOIN_POLL_S 0.1
#define JOIN_TIMEOUT_S 10.0

int dt_ps_server_set_joins(dt_ps_server *s, const char *host, int port,
                           const struct dt_comm_config *cc) {
  if (!s || !host || port <= 0 || !cc)
    return dt__seterr(DT_EINVAL, "ps server: joins need the job's store and comm config");
  if (!s->o.elastic) return DT_OK;
  s->wc = calloc((size_t)s->N, sizeof *s->wc);
  if (!s->wc) return dt__seterr(DT_ENOMEM, "ps server %d: out of memory", s->index);
  double t = cc->timeout_s > 0 && cc->timeout_s < JOIN_TIMEOUT_S ? cc->timeout_s : JOIN_TIMEOUT_S;
  DT_CHECK(dt_store_connect(&s->jst, host, port, cc->token, t));
  s->jcc = *cc;
  snprintf(s->jjob, sizeof s->jjob, "%s", cc->job ? cc->job : "dtrain");
  snprintf(s->jkey, sizeof s->jkey, "%s/ps/joins", s->jjob);
  s->jcc.job = NULL;
  s->jnext = 0;
  return DT_OK;
}

void dt__pss_join_free(dt_ps_server *s) {
  for (int w = 0; s->wc && w < s->N; w++) dt_comm_destroy(s->wc[w]);
  free(s->wc);
  s->wc = NULL;
  dt_store_destroy(s->jst);
  s->jst = NULL;
}

/* A refusal to the joiner: DT_PS_ERR with the code, then the text. */
static void refuse(dt_ps_server *s, dt_comm *jc, int rc, const char *why) {
  DT_LOG_WARN("%s", why);
  uint8_t h[DT_PS_HDR_BYTES];
  char text[DT_PS_ERR_TEXT];
  memset(text, 0, sizeof text);
  snprintf(text, sizeof text, "%s", why);
  dt_ps_msg m = {.type = DT_PS_ERR, .sender = s->index, .clock = rc};
  dt_ps_msg_encode(&m, h);
  if (dt_comm_send(jc, 0, DT_PS_TAG_CTL, h, sizeof h) == DT_OK)
    (void)dt_comm_send(jc, 0, DT_PS_TAG_CTL, text, sizeof text);
}

/* Joiner number j: its communicator, its greeting, the slot. */
static int admit(dt_ps_server *s, int64_t j) {
  char name[256];
  snprintf(name, sizeof name, "%s.psj%lld", s->jjob, (long long)j);
  struct dt_comm_config cc = s->jcc;
  cc.job = name;
  cc.rank = 1 + s->index;
  cc.size = 1 + s->map->nservers;
  if (!(cc.timeout_s > 0) || cc.timeout_s > JOIN_TIMEOUT_S) cc.timeout_s = JOIN_TIMEOUT_S;
  dt_comm *jc = NULL;
  int rc = dt_comm_create(&jc, s->jst, &cc);
  if (rc < 0) {
    /* a joiner that never came (it died, or was refused by the members'
     * checks first): the job goes on */
    DT_LOG_WARN("ps server %d: joiner %lld did not connect: %s", s->index, (long long)j,
                dt_errmsg());
    return DT_OK;
  }
  uint8_t h[DT_PS_HDR_BYTES];
  rc = dt_comm_recv(jc, 0, DT_PS_TAG_REQ, h, sizeof h);
  if (rc < 0) {
    DT_LOG_WARN("ps server %d: joiner %lld sent no greeting: %s", s->index, (long long)j,
                dt_comm_errmsg(jc));
    dt_comm_destroy(jc);
    return DT_OK;
  }
  /* the slot it claims, before the header is checked against it */
  int32_t w;
  memcpy(&w, h + 8, sizeof w);
  char why[DT_PS_ERR_TEXT];
  if (w < 0 || w >= s->N) {
    snprintf(why, sizeof why, "ps server %d: joiner %lld asks for worker slot %d, but the job has "
             "%d workers (0-%d): refused", s->index, (long long)j, (int)w, s->N, s->N - 1);
    refuse(s, jc, DT_EINVAL, why);
    dt_comm_destroy(jc);
    return DT_OK;
  }
  dt_ps_msg m;
  rc = dt_ps_msg_parse(h, sizeof h, s->map, s->N, s->index, w, &m);
  uint64_t mine = 0;
  for (int i = 0; i < 8; i++) mine |= (uint64_t)s->map->sha[i] << (8 * i);
  const int R = s->map->replicas > 1 ? s->map->replicas : 1;
  if (rc < 0) {
    snprintf(why, sizeof why, "ps server %d: joiner %lld (worker %d): %s", s->index, (long long)j,
             (int)w, dt_errmsg());
  } else if (m.type != DT_PS_HELLO || !(m.flags & DT_PS_F_JOIN)) {
    rc = DT_EPROTO;
    snprintf(why, sizeof why, "ps server %d: joiner %lld (worker %d) sent %s, not a join",
             s->index, (long long)j, (int)w, dt_ps_type_name(m.type));
  } else if (m.aux != mine || m.key != s->map->nkeys || m.count != s->map->nparams ||
             (m.clock ? m.clock : 1) != R) {
    rc = DT_EMISMATCH;
    snprintf(why, sizeof why, "ps server %d: joiner %lld (worker %d) has another key-range map "
             "(%d keys over %llu parameters, digest %016llx; this server: %d keys over %llu, "
             "digest %016llx): refused", s->index, (long long)j, (int)w, m.key,
             (unsigned long long)m.count, (unsigned long long)m.aux, s->map->nkeys,
             (unsigned long long)s->map->nparams, (unsigned long long)mine);
  }
  if (rc < 0) {
    refuse(s, jc, rc, why);
    dt_comm_destroy(jc);
    return DT_OK;
  }
  /* the slot's old worker: out of the clocks if this server has not seen
   * it go (the members re-formed without it) */
  if (!s->gone[w]) DT_CHECK(dt__pss_worker_lost(s, w, "replaced by a joiner"));
  if (s->wc[w]) dt_comm_destroy(s->wc[w]);
  s->wc[w] = jc;
  /* its pushes start at the clock the live workers are at */
  int64_t c = -1;
  for (int i = 0; i < s->nk; i++) {
    skey *k = &s->keys[i];
    int64_t mc = dt__pss_min_clock(s, k);
    if (mc == INT64_MAX) mc = k->wclock[w];
    k->wclock[w] = mc;
    k->want[w] = -1;
    k->sent[w] = 0;
    k->arr[w] = 0;
    if (c < 0 || mc < c) c = mc;
  }
  s->gone[w] = 0;
  s->ngone--;
  s->losing[w] = 0;
  s->bye[w] = 0;
  s->nbye--;
  s->posted[w] = 0;
  s->parked[w] = 0;
  s->marks[w] = 0;
  dt_ps_msg r = {.type = DT_PS_WELCOME, .sender = s->index, .key = s->map->nkeys,
                 .count = s->map->nparams, .aux = mine, .clock = R};
  dt_ps_msg_encode(&r, h);
  rc = dt_comm_send(jc, 0, DT_PS_TAG_CTL, h, sizeof h);
  if (rc < 0) {
    s->losing[w] = 1; /* it left again: removed at the next poll */
    return DT_OK;
  }
  s->st.workers_joined++;
  DT_LOG_INFO("ps server %d: joiner %lld is worker %d from clock %lld on; %d of %d workers",
              s->index, (long long)j, (int)w, (long long)c, s->N - s->ngone, s->N);
  return DT_OK;
}

int dt__pss_join_poll(dt_ps_server *s, int *busy) {
  *busy = 0;
  double now = dt_now();
  if (now < s->jnext) return DT_OK;
  s->jnext = now + JOIN_POLL_S;
  int64_t v = 0;
  if (dt_store_add(s->jst, s->jkey, 0, &v, 1.0) < 0) return DT_OK; /* tried again later */
  while (s->jseen < v) {
    *busy = 1;
    DT_CHECK(admit(s, ++s->jseen));
  }
  return DT_OK;
}

/* ---- the joiner's side ---------------------------------------------------------- */

int dt_ps_join(const char *host, int port, const struct dt_comm_config *cc, const dt_ps_map *map,
               int slot, dt_comm **out) {
  *out = NULL;
  if (!host || port <= 0 || !cc || !map)
    return dt__seterr(DT_EINVAL, "ps joiner: needs the job's store and comm config");
  double t = cc->timeout_s > 0 && cc->timeout_s < JOIN_TIMEOUT_S ? cc->timeout_s : JOIN_TIMEOUT_S;
  dt_store *st = NULL;
  DT_CHECK(dt_store_connect(&st, host, port, cc->token, t));
  char key[240], name[256];
  snprintf(key, sizeof key, "%s/ps/joins", cc->job ? cc->job : "dtrain");
  int64_t j = 0;
  int rc = dt_store_add(st, key, 1, &j, t);
  struct dt_comm_config jcc = *cc;
  snprintf(name, sizeof name, "%s.psj%lld", cc->job ? cc->job : "dtrain", (long long)j);
  jcc.job = name;
  jcc.rank = 0;
  jcc.size = 1 + map->nservers;
  jcc.timeout_s = t;
  dt_comm *jc = NULL;
  if (rc == DT_OK) rc = dt_comm_create(&jc, st, &jcc);
  dt_store_destroy(st);
  if (rc < 0) return dt__preerr(rc, "ps joiner (worker %d): reaching the servers", slot);
  uint64_t digest = 0;
  for (int i = 0; i < 8; i++) digest |= (uint64_t)map->sha[i] << (8 * i);
  dt_ps_msg h = {.type = DT_PS_HELLO, .sender = slot, .key = map->nkeys, .flags = DT_PS_F_JOIN,
                 .count = map->nparams, .aux = digest,
                 .clock = map->replicas > 1 ? map->replicas : 1};
  uint8_t hb[DT_PS_HDR_BYTES], in[DT_PS_HDR_BYTES];
  dt_ps_msg_encode(&h, hb);
  for (int srv = 0; srv < map->nservers && rc == DT_OK; srv++) {
    rc = dt_comm_send(jc, 1 + srv, DT_PS_TAG_REQ, hb, sizeof hb);
    if (rc == DT_OK) rc = dt_comm_recv(jc, 1 + srv, DT_PS_TAG_CTL, in, sizeof in);
    if (rc < 0) {
      rc = dt__seterr(rc, "ps joiner (worker %d): greeting server %d: %s", slot, srv,
                      dt_comm_errmsg(jc));
      break;
    }
    dt_ps_msg w;
    rc = dt_ps_msg_parse(in, sizeof in, map, slot + 1, -1, srv, &w);
    if (rc == DT_OK && w.type == DT_PS_ERR) {
      char text[DT_PS_ERR_TEXT];
      rc = dt_comm_recv(jc, 1 + srv, DT_PS_TAG_CTL, text, sizeof text);
      text[sizeof text - 1] = 0;
      rc = dt__seterr(w.clock < 0 && w.clock > -1000 ? (int)w.clock : DT_EPROTO, "%s",
                      rc == DT_OK ? text : "refused by a server");
    } else if (rc == DT_OK && w.type != DT_PS_WELCOME) {
      rc = dt__seterr(DT_EPROTO, "ps joiner (worker %d): server %d answered %s", slot, srv,
                      dt_ps_type_name(w.type));
    }
  }
  if (rc < 0) {
    dt_comm_destroy(jc);
    return rc;
  }
  *out = jc;
  return DT_OK;
}
