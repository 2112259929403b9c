/*
 * watch.c — a member's heartbeats and its watcher thread (elastic.h,
 * docs/elastic.md): a heartbeat counter in the built-in store or a lease in
 * etcd; fencing, which stops a member cut off from the store; the lowest
 * member's watch over the others' heartbeats; and the thread that beats,
 * waits for the next change's bell and aborts the current generation's
 * communicator when a change is announced. The agreement on the next
 * generation is elastic.c's.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

#include "core/core.h"
#include "elastic/elastic_int.h"
#include "elastic/store_etcd.h"

/* ---- heartbeats and fencing ----------------------------------------------------- */

/* etcd: this member's lease and its heartbeat key P/el/hb/ID attached to it
 * (made at create, so the key exists before any other member looks). */
int dt__el_lease_start(dt_elastic *el) {
  char k[256];
  DT_CHECK(dt__etcd_lease_grant(el->st, el->ttl, el->cfg.cc.timeout_s, &el->lease));
  dt__el_key(el, k, sizeof k, "hb/%d", el->cfg.id, 0);
  DT_CHECK(dt__etcd_put_leased(el->st, k, "1", el->lease, el->cfg.cc.timeout_s));
  el->next_keep = dt_now() + el->ttl / 4.0;
  return DT_OK;
}

/* Cut off: the reason is kept (the agreement returns it) and the current
 * generation's collectives are aborted. Called with el->mu held. */
static void fence(dt_elastic *el, const char *why) {
  if (el->fenced) return;
  el->fenced = 1;
  snprintf(el->fence_why, sizeof el->fence_why, "%s", why);
  if (el->cur) dt_comm_abort(el->cur, DT_EPEERLOST, "cut off from the job's store");
  el->cur = NULL;
}

/* One heartbeat on store st (the watcher's, or the caller's while a joiner
 * waits): the counter bumped, or the lease renewed when due. 1 when the
 * store took it, 0 when it was not due, -1 when the store was not reached;
 * an expired lease fences this member. */
int dt__el_beat(dt_elastic *el, dt_store *st, double now) {
  if (el->etcd) {
    if (!el->lease || now < el->next_keep) return 0;
    int64_t left = 0;
    if (dt__etcd_lease_keepalive(st, el->lease, el->op_tmo, &left) < 0) return -1;
    if (left <= 0) {
      char why[400];
      snprintf(why, sizeof why, "elastic: member %d: its etcd lease expired (cut off from etcd "
               "for longer than dist.heartbeat_timeout = %.1f s), so the job has gone on without "
               "it; stopping (a member cut off never trains on alone)", el->cfg.id,
               el->cfg.heartbeat_timeout_s);
      pthread_mutex_lock(&el->mu);
      fence(el, why);
      pthread_mutex_unlock(&el->mu);
      return -1;
    }
    el->next_keep = now + el->ttl / 4.0;
    return 1;
  }
  char k[256];
  dt__el_key(el, k, sizeof k, "hb/%d", el->cfg.id, 0);
  return dt__el_counter_t(st, k, 1, el->op_tmo) < 0 ? -1 : 1;
}

/* After a heartbeat's result r: a member that has not reached the store
 * for fence_s is cut off (a cut link, or the store's node lost) and stops;
 * the other side, if it holds a majority, has gone on without it. */
static void beat_result(dt_elastic *el, int r, double now) {
  if (r > 0) el->hb_ok = now;
  if (r >= 0 || now - el->hb_ok <= el->fence_s) return;
  char why[400];
  snprintf(why, sizeof why, "elastic: member %d cannot reach the job's %s at %s:%d for %.1f s "
           "(a cut link, or that node lost); stopping (a member cut off never trains on alone "
           "or writes checkpoints)", el->cfg.id, el->etcd ? "etcd" : "rendezvous store",
           el->etcd ? el->cfg.host + 7 : el->cfg.host, el->cfg.port, now - el->hb_ok);
  pthread_mutex_lock(&el->mu);
  fence(el, why);
  pthread_mutex_unlock(&el->mu);
}

/* Whether this member was cut off: DT_EABORTED with the reason. */
int dt__el_fenced(dt_elastic *el) {
  pthread_mutex_lock(&el->mu);
  int f = el->fenced;
  pthread_mutex_unlock(&el->mu);
  return f ? dt__seterr(DT_EABORTED, "%s", el->fence_why) : DT_OK;
}

/* ---- the watcher ------------------------------------------------------------ */

/* The lowest member of a generation also watches the others' heartbeats:
 * one silent for heartbeat_timeout (frozen, cut off, its host gone) is
 * announced as a change, so nobody waits for it at a collective deadline. */
struct hbw {
  int gen, n, told;
  int *ids;
  int64_t *val;
  double *at;
};

static void watch_heartbeats(dt_elastic *el, struct hbw *w, double now) {
  pthread_mutex_lock(&el->mu);
  int lead = el->nmembers > 1 && el->members[0] == el->cfg.id;
  if (lead && w->gen != el->gen) {
    free(w->ids), free(w->val), free(w->at);
    w->n = el->nmembers;
    w->ids = malloc((size_t)w->n * sizeof *w->ids);
    w->val = calloc((size_t)w->n, sizeof *w->val);
    w->at = calloc((size_t)w->n, sizeof *w->at);
    if (w->ids) memcpy(w->ids, el->members, (size_t)w->n * sizeof *w->ids);
    w->gen = el->gen;
    w->told = 0;
  }
  pthread_mutex_unlock(&el->mu);
  if (!lead || !w->ids || !w->val || !w->at || w->told) return;
  char k[256];
  for (int i = 0; i < w->n; i++) {
    if (w->ids[i] == el->cfg.id) continue;
    dt__el_key(el, k, sizeof k, "hb/%d", w->ids[i], 0);
    if (el->etcd) {
      /* etcd: the member's heartbeat key lives as long as its lease */
      int found = 1;
      if (dt__etcd_exists(el->wst, k, el->op_tmo, &found) < 0 || found) continue;
      DT_LOG_WARN("elastic: member %d's etcd lease expired (silent for dist.heartbeat_timeout); "
                  "re-forming without it", w->ids[i]);
      dt__el_announce(el->wst, el->job, 10.0);
      w->told = 1;
      return;
    }
    int64_t v = dt__el_counter_t(el->wst, k, 0, el->op_tmo);
    if (v < 0) continue; /* the store did not answer: nothing learnt */
    if (v != w->val[i] || w->at[i] == 0) w->val[i] = v, w->at[i] = now;
    if (now - w->at[i] > el->cfg.heartbeat_timeout_s) {
      DT_LOG_WARN("elastic: member %d has been silent for %.1f s (dist.heartbeat_timeout); "
                  "re-forming without it", w->ids[i], now - w->at[i]);
      dt__el_announce(el->wst, el->job, 10.0);
      w->told = 1;
      return;
    }
  }
}

/* The watcher: a heartbeat every tick (heartbeat_timeout / 4, at most
 * 0.5 s; etcd: 50 ms). With the built-in store a tick is one call while
 * nothing fails (DT_KV_BEAT): the heartbeat, then parked in the store on
 * the next change's bell until the next beat is due, answered with the
 * change counter — one round trip and three wake-ups per tick in all, so
 * an idle watcher disturbs the training threads as little as it can. A
 * change wakes it at once. Otherwise (etcd, between generations) a beat,
 * the change counter every heartbeat_timeout / 4 (etcd: every tick) and,
 * with the built-in store, a GET of the bell parked until the next beat. */
void *dt__el_watch(void *arg) {
  dt_elastic *el = arg;
  prctl(PR_SET_NAME, "dt-watch"); /* its CPU and wake-ups by name (bench/elastic_cost.sh, top -H) */
  char ch[256], bell[256], hb[256];
  dt__el_key(el, ch, sizeof ch, "change", 0, 0);
  dt__el_key(el, hb, sizeof hb, "hb/%d", el->cfg.id, 0);
  struct hbw w = {-1, 0, 0, NULL, NULL, NULL};
  double next_check = 0, next_beat = 0;
  int64_t rang = 0; /* the bell of change counter value `rang` rang (0: none) */
  int beat_ok = 0;  /* the last heartbeat reached the store */
  int park = !el->etcd; /* beat and wait in one call (0 once the store says it cannot) */
  pthread_mutex_lock(&el->mu);
  while (!el->stop) {
    const int on = el->cur != NULL;
    const int64_t next = el->seen + 1; /* the next change's bell */
    pthread_mutex_unlock(&el->mu);
    double now = dt_now();
    int64_t c = -1;
    int waited = 0; /* this pass's beat waited for the bell until the next beat */
    if (now >= next_beat) {
      int r = -1;
      if (park && on) {
        snprintf(bell, sizeof bell, "%s/el/bell/%lld", el->job, (long long)next);
        bool found = false;
        int64_t v = 0;
        int rc = dt__store_beat(el->wst, bell, hb, ch, el->tick, &found, &v);
        if (rc == DT_ENOTSUP) park = 0;
        if (rc == DT_OK) r = 1, c = v, rang = found ? next : 0, waited = 1;
      }
      if (!park || !on) r = dt__el_beat(el, el->wst, now);
      beat_result(el, r, dt_now());
      beat_ok = r > 0;
      next_beat = now + el->tick;
    }
    now = dt_now();
    if (el->etcd || (now >= next_check && !waited)) c = dt__el_counter_t(el->wst, ch, 0, el->op_tmo);
    if (now >= next_check) {
      watch_heartbeats(el, &w, now);
      next_check = now + el->cfg.heartbeat_timeout_s / 4;
    }
    pthread_mutex_lock(&el->mu);
    if (el->fenced && el->cur) fence(el, el->fence_why); /* (a comm set since) */
    if ((c > el->seen || rang > el->seen) && el->cur) {
      /* some member failed or a launcher saw a death: leave any collective
       * of this generation now instead of at its deadline */
      dt_comm_abort(el->cur, DT_EPEERLOST, "membership change announced");
      el->cur = NULL;
    }
    rang = 0;
    if (el->stop) break;
    if (waited) continue; /* the next beat is due */
    if (!el->etcd && !park && el->cur && beat_ok) {
      /* parked on the next change's bell until the next beat or check */
      snprintf(bell, sizeof bell, "%s/el/bell/%lld", el->job, (long long)(el->seen + 1));
      const int64_t nb = el->seen + 1;
      pthread_mutex_unlock(&el->mu);
      double until = next_beat < next_check ? next_beat : next_check, left = until - dt_now();
      char v[8];
      size_t len = 0;
      int rc = DT_ETIMEDOUT;
      if (left > 0.001) rc = dt_store_get(el->wst, bell, v, sizeof v, &len, left);
      else if (left > 0) dt__el_sleep(left);
      if (rc == DT_OK) rang = nb;
      pthread_mutex_lock(&el->mu);
      if (rc == DT_OK || rc == DT_ETIMEDOUT) continue;
      /* the store failed the call: the tick's sleep below, then a beat */
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double t = el->tick;
    ts.tv_sec += (time_t)t;
    ts.tv_nsec += (long)((t - (double)(time_t)t) * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    if (!el->stop) pthread_cond_timedwait(&el->cv, &el->mu, &ts);
  }
  pthread_mutex_unlock(&el->mu);
  free(w.ids), free(w.val), free(w.at);
  return NULL;
}

