/*
 * elastic.c — generations of members in the rendezvous store (elastic.h):
 * the store helpers, create and join, the agreement on the next
 * generation (registrations, deaths reported by launchers, silent
 * heartbeats or expired etcd leases, a majority of the last generation,
 * then one compare-and-set) and the communicator of each generation. The
 * heartbeats and the watcher thread are watch.c's.
 *
 * It deliberately keeps no model state and never reads files: what a
 * member knows (its position) travels as one integer per registration; the
 * engine moves parameters over the new communicator.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "elastic/elastic_int.h"
#include "elastic/store_etcd.h"

void dt__el_sleep(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

void dt__el_key(const dt_elastic *el, char *buf, size_t cap, const char *fmt, int a, int b) {
  char tail[96];
  snprintf(tail, sizeof tail, fmt, a, b);
  snprintf(buf, cap, "%s/el/%s", el->job, tail);
}

/* "G C id,id,..." -> gen, change, members (allocated). */
static int parse_gen(const char *s, int *gen, int64_t *change, int **ids, int *n) {
  char *end;
  long g = strtol(s, &end, 10);
  if (end == s || *end != ' ') return dt__seterr(DT_EPROTO, "elastic: bad generation record '%.40s'", s);
  long long c = strtoll(end + 1, &end, 10);
  if (*end != ' ') return dt__seterr(DT_EPROTO, "elastic: bad generation record '%.40s'", s);
  int cap = 1;
  for (const char *p = end; *p; p++) cap += *p == ',';
  int *v = malloc((size_t)cap * sizeof *v), k = 0;
  if (!v) return dt__seterr(DT_ENOMEM, "elastic: out of memory");
  const char *p = end + 1;
  while (*p && k < cap) {
    long id = strtol(p, &end, 10);
    if (end == p || id < 0) {
      free(v);
      return dt__seterr(DT_EPROTO, "elastic: bad member list in '%.40s'", s);
    }
    v[k++] = (int)id;
    p = *end == ',' ? end + 1 : end;
  }
  *gen = (int)g;
  *change = c;
  *ids = v;
  *n = k;
  return DT_OK;
}

static int read_gen_t(dt_elastic *el, char *buf, size_t cap, double t) {
  char k[256];
  size_t len = 0;
  dt__el_key(el, k, sizeof k, "gen", 0, 0);
  DT_CHECK(dt_store_get(el->st, k, buf, cap - 1, &len, t));
  buf[len] = '\0';
  return DT_OK;
}

static int read_gen(dt_elastic *el, char *buf, size_t cap) {
  return read_gen_t(el, buf, cap, el->cfg.cc.timeout_s);
}

int64_t dt__el_counter_t(dt_store *st, const char *k, int64_t add, double t) {
  int64_t v = 0;
  if (dt_store_add(st, k, add, &v, t) < 0) return -1;
  return v;
}

static int64_t counter(dt_store *st, const char *k, int64_t add) {
  return dt__el_counter_t(st, k, add, 10.0);
}

/* Announces a membership change: the change counter bumped, then the bell
 * of its new value N rung (P/el/bell/N), which wakes at once every watcher
 * parked on it (the built-in store). A bell never rung (its announcer died
 * in between) is made up for by the watchers' own read of the counter every
 * heartbeat_timeout / 4. */
int dt__el_announce(dt_store *st, const char *job, double t) {
  char k[256];
  int64_t v = 0;
  snprintf(k, sizeof k, "%s/el/change", job);
  DT_CHECK(dt_store_add(st, k, 1, &v, t));
  snprintf(k, sizeof k, "%s/el/bell/%lld", job, (long long)v);
  (void)dt_store_set(st, k, "1", 1, t); /* best effort (see above) */
  return DT_OK;
}


/* ---- create / destroy --------------------------------------------------------- */

/* Members: what a joiner reads (the first member to get here writes it;
 * the members' configurations were compared when the job started). */
static int publish_job(dt_elastic *el) {
  char k[256], v[32];
  bool sw;
  int n = snprintf(v, sizeof v, "%d", el->cfg.size0);
  dt__el_key(el, k, sizeof k, "size0", 0, 0);
  DT_CHECK(dt_store_cas(el->st, k, NULL, 0, v, (size_t)n, &sw, NULL, 0, NULL, el->cfg.cc.timeout_s));
  if (!el->cfg.fp_len) return DT_OK;
  dt__el_key(el, k, sizeof k, "fp", 0, 0);
  return dt_store_cas(el->st, k, NULL, 0, el->cfg.fp, el->cfg.fp_len, &sw, NULL, 0, NULL,
                      el->cfg.cc.timeout_s);
}

/* Joiners: the job's fingerprint checked, then a fresh member id. A refused
 * joiner has changed nothing in the store but the count of ids. */
static int joiner_id(dt_elastic *el) {
  char k[256], v[64];
  size_t len = 0;
  const double tmo = el->cfg.cc.timeout_s;
  dt__el_key(el, k, sizeof k, "size0", 0, 0);
  int rc = dt_store_get(el->st, k, v, sizeof v - 1, &len, tmo);
  if (rc < 0) return dt__preerr(rc, "joining: the job's record %s", k);
  v[len] = '\0';
  int size0 = atoi(v);
  if (size0 < 1 || size0 > MAX_MEMBERS)
    return dt__seterr(DT_EPROTO, "elastic: joining: bad record %s = '%.20s'", k, v);
  if (el->cfg.check_fp) {
    dt__el_key(el, k, sizeof k, "fp", 0, 0);
    char *fp = malloc(65536);
    if (!fp) return dt__seterr(DT_ENOMEM, "elastic: out of memory");
    rc = dt_store_get(el->st, k, fp, 65536, &len, tmo);
    if (rc == DT_OK) rc = el->cfg.check_fp(el->cfg.fp_ud, fp, len);
    free(fp);
    DT_CHECK(rc);
  }
  int64_t n = 0;
  dt__el_key(el, k, sizeof k, "nextid", 0, 0);
  DT_CHECK(dt_store_add(el->st, k, 1, &n, tmo));
  el->cfg.size0 = size0;
  el->cfg.id = size0 + (int)n - 1;
  return DT_OK;
}

int dt_elastic_create(dt_elastic **out, const dt_elastic_cfg *cfg) {
  *out = NULL;
  if (!cfg->join && (cfg->size0 < 1 || cfg->size0 > MAX_MEMBERS || cfg->id < 0))
    return dt__seterr(DT_EINVAL, "elastic: member %d of %d", cfg->id, cfg->size0);
  dt_elastic *el = calloc(1, sizeof *el);
  if (!el) return dt__seterr(DT_ENOMEM, "elastic: out of memory");
  el->cfg = *cfg;
  snprintf(el->job, sizeof el->job, "%s", cfg->cc.job ? cfg->cc.job : "dtrain");
  el->cfg.cc.job = NULL;
  if (!(el->cfg.cc.timeout_s > 0)) el->cfg.cc.timeout_s = 60;
  if (!(el->cfg.heartbeat_timeout_s > 0)) el->cfg.heartbeat_timeout_s = 2;
  const double hbt = el->cfg.heartbeat_timeout_s;
  el->op_tmo = hbt > 1 ? hbt : 1;
  if (el->op_tmo > el->cfg.cc.timeout_s) el->op_tmo = el->cfg.cc.timeout_s;
  el->fence_s = 2 * hbt + 3;
  el->ttl = hbt > 2 ? (int)(hbt + 0.999) : 2;
  el->hb_ok = dt_now();
  pthread_mutex_init(&el->mu, NULL);
  pthread_cond_init(&el->cv, NULL);
  int rc = dt_elastic_store_connect(&el->st, cfg->host, cfg->port, cfg->token, el->cfg.cc.timeout_s);
  if (rc == DT_OK)
    rc = dt_elastic_store_connect(&el->wst, cfg->host, cfg->port, cfg->token, el->cfg.cc.timeout_s);
  if (rc == DT_OK && cfg->join) rc = joiner_id(el);
  el->etcd = rc == DT_OK && dt__etcd_is(el->st);
  /* the watcher's tick (heartbeats; etcd: also the change counter's poll) */
  el->tick = el->cfg.heartbeat_timeout_s / 4; /* 4 beats per timeout, as etcd's renewals */
  if (el->tick > (el->etcd ? 0.05 : 0.5)) el->tick = el->etcd ? 0.05 : 0.5;
  if (el->etcd) rc = dt__el_lease_start(el);
  if (rc == DT_OK) { /* where it runs: a cut link separates sites, never one site */
    char k[256];
    const char *site = el->cfg.cc.bind_addr ? el->cfg.cc.bind_addr : "127.0.0.1";
    dt__el_key(el, k, sizeof k, "site/%d", el->cfg.id, 0);
    rc = dt_store_set(el->st, k, site, strlen(site), el->cfg.cc.timeout_s);
  }
  el->nmembers = el->cfg.size0 > 0 ? el->cfg.size0 : 1;
  el->members = malloc((size_t)el->nmembers * sizeof *el->members);
  if (rc == DT_OK && !el->members) rc = dt__seterr(DT_ENOMEM, "elastic: out of memory");
  if (rc == DT_OK && !cfg->join) rc = publish_job(el);
  if (rc == DT_OK && !cfg->join) {
    /* generation 0: ids 0..size0-1, published once (whoever comes first) */
    char *rec = malloc(GEN_MAX);
    if (!rec) rc = dt__seterr(DT_ENOMEM, "elastic: out of memory");
    size_t n = rec ? (size_t)snprintf(rec, GEN_MAX, "0 0 ") : 0;
    for (int i = 0; rec && i < el->cfg.size0; i++) {
      el->members[i] = i;
      n += (size_t)snprintf(rec + n, GEN_MAX - n, "%s%d", i ? "," : "", i);
    }
    char k[256];
    dt__el_key(el, k, sizeof k, "gen", 0, 0);
    bool sw;
    if (rec) rc = dt_store_cas(el->st, k, NULL, 0, rec, n, &sw, NULL, 0, NULL, el->cfg.cc.timeout_s);
    free(rec);
  }
  if (rc < 0) {
    char why[400];
    snprintf(why, sizeof why, "%s", dt_errmsg());
    dt_elastic_destroy(el);
    if (cfg->join) return dt__seterr(rc, "elastic: joiner refused: %s", why);
    return dt__seterr(rc, "elastic: member %d: %s", cfg->id, why);
  }
  *out = el;
  return DT_OK;
}

int dt_elastic_start(dt_elastic *el, dt_comm *c) {
  pthread_mutex_lock(&el->mu);
  el->cur = c;
  pthread_mutex_unlock(&el->mu);
  if (el->started) return DT_OK;
  if (pthread_create(&el->thread, NULL, dt__el_watch, el) != 0)
    return dt__seterr(DT_EIO, "elastic: cannot start the watcher thread");
  el->started = 1;
  return DT_OK;
}

int dt_elastic_generation(const dt_elastic *el) { return el->gen; }

int dt_elastic_id(const dt_elastic *el) { return el->cfg.id; }

int dt_elastic_saves(const dt_elastic *el) { return el->saver; }

void dt_elastic_release_old(dt_elastic *el) {
  dt_comm_destroy(el->old);
  el->old = NULL;
}

void dt_elastic_destroy(dt_elastic *el) {
  if (!el) return;
  if (el->started) {
    pthread_mutex_lock(&el->mu);
    el->stop = 1;
    pthread_cond_broadcast(&el->cv);
    pthread_mutex_unlock(&el->mu);
    dt_store_interrupt(el->wst); /* out of a GET parked on the bell */
    pthread_join(el->thread, NULL);
  }
  dt_comm_destroy(el->old);
  dt_comm_destroy(el->own);
  dt_store_destroy(el->st);
  dt_store_destroy(el->wst);
  free(el->members);
  pthread_mutex_destroy(&el->mu);
  pthread_cond_destroy(&el->cv);
  free(el);
}

int dt_elastic_spare_coming(dt_store *st, const char *job, int delta, double timeout_s) {
  char k[256];
  snprintf(k, sizeof k, "%s/el/coming", job);
  return dt_store_add(st, k, delta, NULL, timeout_s);
}

int dt_elastic_report_dead(dt_store *st, const char *job, int id, double timeout_s) {
  char k[256], *rec = malloc(GEN_MAX);
  if (!rec) return dt__seterr(DT_ENOMEM, "elastic: out of memory");
  /* announce only the loss of a current member (one left out already, an
   * evicted worker that came back and left, changes nothing) */
  int member = 1, g, *ids = NULL, n = 0;
  int64_t c;
  size_t len = 0;
  snprintf(k, sizeof k, "%s/el/gen", job);
  if (dt_store_get(st, k, rec, GEN_MAX - 1, &len, timeout_s) == DT_OK) {
    rec[len] = '\0';
    if (parse_gen(rec, &g, &c, &ids, &n) == DT_OK) {
      member = 0;
      for (int i = 0; i < n; i++) member |= ids[i] == id;
      free(ids);
    }
  }
  free(rec);
  if (member) DT_CHECK(dt__el_announce(st, job, timeout_s));
  snprintf(k, sizeof k, "%s/el/dead/%d", job, id);
  return dt_store_add(st, k, 1, NULL, timeout_s);
}

/* ---- the next generation --------------------------------------------------------- */

/* What a deciding member knows of one member of the current generation. */
struct seen {
  int64_t in;      /* 2 + position once registered (1: no complete state), else 0 */
  int dead;        /* a launcher reported it */
  int64_t hb;      /* last heartbeat value read */
  double hb_at;    /* when it last changed */
};

static int cmp_int(const void *a, const void *b) {
  return *(const int *)a - *(const int *)b;
}

/* Adopts record rec (generation G >= el->gen + 1): members, change counter,
 * and this worker's rank; DT_EABORTED if it is not a member. */
static int adopt(dt_elastic *el, const char *rec, int *rank) {
  int g = 0, *ids = NULL, n = 0;
  int64_t c = 0;
  DT_CHECK(parse_gen(rec, &g, &c, &ids, &n));
  int me = -1;
  for (int i = 0; i < n; i++)
    if (ids[i] == el->cfg.id) me = i;
  if (me < 0) {
    free(ids);
    return dt__seterr(DT_EABORTED, "elastic: member %d is not in generation %d (it was taken for "
                      "dead: frozen or cut off); leaving the job", el->cfg.id, g);
  }
  pthread_mutex_lock(&el->mu);
  free(el->members);
  el->members = ids;
  el->nmembers = n;
  el->gen = g;
  el->seen = c;
  pthread_mutex_unlock(&el->mu);
  *rank = me;
  return DT_OK;
}

/* Whether member id runs where this member does (the same bind address):
 * silent there, it is frozen or starved, not behind a cut link, and is
 * left out like a dead one (it leaves when it finds out). */
static int same_site(dt_elastic *el, int id, double t) {
  char k[256], v[128];
  size_t len = 0;
  const char *mine = el->cfg.cc.bind_addr ? el->cfg.cc.bind_addr : "127.0.0.1";
  dt__el_key(el, k, sizeof k, "site/%d", id, 0);
  if (dt_store_get(el->st, k, v, sizeof v - 1, &len, t) < 0) return 0;
  v[len] = '\0';
  return !strcmp(v, mine);
}

/* Joiners registered for generation g (ids size0.. handed out, not members
 * of the current generation, not reported dead), ascending, at most cap. */
static int joiners(dt_elastic *el, int g, int *ids, int cap) {
  char k[256];
  dt__el_key(el, k, sizeof k, "nextid", 0, 0);
  int64_t nj = counter(el->st, k, 0), n = 0;
  for (int64_t j = 0; j < nj && n < cap; j++) {
    int id = el->cfg.size0 + (int)j, member = 0;
    for (int i = 0; i < el->nmembers; i++) member |= el->members[i] == id;
    if (member) continue;
    dt__el_key(el, k, sizeof k, "g%d/in/%d", g, id);
    if (counter(el->st, k, 0) <= 0) continue;
    dt__el_key(el, k, sizeof k, "dead/%d", id, 0);
    if (counter(el->st, k, 0) > 0) continue;
    ids[n++] = id;
  }
  return (int)n;
}

/* The decided record rec names generation el->gen + 1 or later: adopt it,
 * find the most advanced member, join the generation's communicator. */
static int enter(dt_elastic *el, const char *rec, double t0, dt_elastic_gen *out) {
  char k[256];
  int rank = -1;
  DT_CHECK(adopt(el, rec, &rank));
  /* the most advanced member: largest position, then lowest rank */
  int64_t best = -1;
  int src = -1;
  for (int i = 0; i < el->nmembers; i++) {
    dt__el_key(el, k, sizeof k, "g%d/in/%d", el->gen, el->members[i]);
    int64_t v = counter(el->st, k, 0) - 2;
    if (v > best) best = v, src = i;
  }
  if (src < 0)
    return dt__seterr(DT_EIO, "elastic: no member of generation %d holds a complete state (its "
                      "source was lost while it sent it); the job cannot go on", el->gen);
  /* the generation's own communicator (fresh store prefix and segments) */
  struct dt_comm_config cc = el->cfg.cc;
  snprintf(el->cjob, sizeof el->cjob, "%s.g%d", el->job, el->gen);
  cc.job = el->cjob;
  cc.rank = rank;
  cc.size = el->nmembers;
  dt_comm *c = NULL;
  DT_CHECK(dt_comm_create(&c, el->st, &cc));
  dt_comm_destroy(el->old);
  el->old = el->own;
  el->own = c;
  pthread_mutex_lock(&el->mu);
  el->cur = c;
  pthread_mutex_unlock(&el->mu);
  out->gen = el->gen;
  out->comm = c;
  out->rank = rank;
  out->size = el->nmembers;
  out->source = src;
  out->pos = best;
  DT_LOG_INFO("elastic: generation %d: %d workers (member %d is rank %d) after %.3f s",
              el->gen, el->nmembers, el->cfg.id, rank, dt_now() - t0);
  return DT_OK;
}

int dt_elastic_join(dt_elastic *el, dt_elastic_gen *out) {
  if (!el->cfg.join) return dt__seterr(DT_EINVAL, "dt_elastic_join: member %d is no joiner",
                                       el->cfg.id);
  const double t0 = dt_now(), tmo = el->cfg.cc.timeout_s;
  const double until = t0 + tmo + el->cfg.rejoin_timeout_s;
  char k[256], *rec = malloc(GEN_MAX);
  if (!rec) return dt__seterr(DT_ENOMEM, "elastic: out of memory");
  int rc = DT_OK, told = 0, counted = el->cfg.spare;
  for (;;) {
    DT_CHECK_GOTO(read_gen(el, rec, GEN_MAX), rc, done);
    int g = 0, *ids = NULL, n = 0;
    int64_t c = 0;
    DT_CHECK_GOTO(parse_gen(rec, &g, &c, &ids, &n), rc, done);
    int in = 0;
    for (int i = 0; i < n; i++) in |= ids[i] == el->cfg.id;
    free(ids);
    if (in) break;
    if (dt_now() > until) {
      rc = dt__seterr(DT_ETIMEDOUT, "elastic: joiner %d was not admitted within %.0f s "
                      "(generation %d has %d of at most %d workers)", el->cfg.id,
                      dt_now() - t0, g, n, el->cfg.max_workers);
      goto done;
    }
    /* full and nobody re-forming: wait for room (a loss re-forms the group) */
    dt__el_key(el, k, sizeof k, "change", 0, 0);
    int64_t ch = counter(el->st, k, 0);
    if (el->cfg.max_workers > 0 && n >= el->cfg.max_workers && ch <= c) {
      if (!told)
        DT_LOG_INFO("elastic: joiner %d waits: generation %d is full (%d workers, "
                    "dist.max_workers)", el->cfg.id, g, n);
      told = 1;
      if (el->etcd) dt__el_beat(el, el->st, dt_now()); /* its lease lives while it waits */
      dt__el_sleep(0.05);
      continue;
    }
    /* ask for the next generation: register, then announce a change (the
     * members leave their step in flight and re-form with us) */
    dt__el_key(el, k, sizeof k, "g%d/in/%d", g + 1, el->cfg.id);
    int64_t v = 0;
    DT_CHECK_GOTO(dt_store_add(el->st, k, 0, &v, tmo), rc, done);
    if (v <= 0) DT_CHECK_GOTO(dt_store_add(el->st, k, 1, NULL, tmo), rc, done); /* no state */
    if (counted) { /* registered: the members need not wait for this spare any more */
      dt__el_key(el, k, sizeof k, "coming", 0, 0);
      DT_CHECK_GOTO(dt_store_add(el->st, k, -1, NULL, tmo), rc, done);
      counted = 0;
    }
    if (ch <= c) /* nobody re-forming yet: ask for it */
      DT_CHECK_GOTO(dt__el_announce(el->st, el->job, tmo), rc, done);
    /* until generation g + 1 is decided (with us or, in a race, without) */
    while (atoi(rec) <= g && dt_now() < until) {
      if (el->etcd) dt__el_beat(el, el->st, dt_now());
      dt__el_sleep(0.002);
      DT_CHECK_GOTO(read_gen(el, rec, GEN_MAX), rc, done);
    }
  }
  DT_CHECK_GOTO(enter(el, rec, t0, out), rc, done);
  rc = dt_elastic_start(el, out->comm);
done:
  free(rec);
  return rc;
}

int dt_elastic_reform(dt_elastic *el, int64_t pos, dt_elastic_gen *out) {
  const double t0 = dt_now(), hbt = el->cfg.heartbeat_timeout_s, ot = el->op_tmo;
  const double tmo = el->cfg.cc.timeout_s;
  char k[256], *rec = malloc(GEN_MAX);
  struct seen *sn = calloc((size_t)el->nmembers, sizeof *sn);
  int rc = DT_OK, g = el->gen + 1;
  if (!rec || !sn) {
    rc = dt__seterr(DT_ENOMEM, "elastic: out of memory");
    goto done;
  }
  /* leave the old generation's collectives; tell everyone */
  pthread_mutex_lock(&el->mu);
  dt_comm *cur = el->own ? el->own : el->cur;
  if (cur) dt_comm_abort(cur, DT_EPEERLOST, "membership change");
  el->cur = NULL;
  pthread_mutex_unlock(&el->mu);
  /* Announce and register. Each store call is bounded by op_tmo and tried
   * again until the watcher fences this member (no heartbeat reached the
   * store for fence_s: it is cut off and must stop, not wait the comm
   * deadline). A generation decided without this member (it was frozen,
   * say) needs no announcement: it only has to find out and leave. */
  for (int step = 0; step < 2;) {
    DT_CHECK_GOTO(dt__el_fenced(el), rc, done);
    if (step == 0) {
      rc = read_gen_t(el, rec, GEN_MAX, ot);
      if (rc == DT_OK && atoi(rec) < g) rc = dt__el_announce(el->st, el->job, ot);
    } else {
      dt__el_key(el, k, sizeof k, "g%d/in/%d", g, el->cfg.id);
      rc = dt_store_add(el->st, k, (pos < 0 ? -1 : pos) + 2, NULL, ot);
    }
    if (rc == DT_OK) {
      step++;
      continue;
    }
    if (dt_now() - t0 > tmo + el->fence_s) goto done;
    dt__el_sleep(0.05);
  }

  int below_since = 0;
  double below_t = 0, coming_t = 0;
  for (;;) {
    DT_CHECK_GOTO(dt__el_fenced(el), rc, done);
    rc = read_gen_t(el, rec, GEN_MAX, ot);
    if (rc < 0) { /* the store did not answer: until this member is fenced */
      if (dt_now() - t0 > tmo + el->fence_s) goto done;
      dt__el_sleep(0.05);
      continue;
    }
    int cg = atoi(rec);
    if (cg >= g) break; /* decided (by us or another member) */
    /* who of the current generation is accounted for? */
    int open = 0, alive = 0;
    const double now = dt_now();
    for (int i = 0; i < el->nmembers; i++) {
      struct seen *s = &sn[i];
      int id = el->members[i];
      if (s->in <= 0) {
        dt__el_key(el, k, sizeof k, "g%d/in/%d", g, id);
        s->in = dt__el_counter_t(el->st, k, 0, ot);
      }
      if (s->in > 0) {
        alive++;
        continue;
      }
      if (!s->dead) {
        dt__el_key(el, k, sizeof k, "dead/%d", id, 0);
        s->dead = dt__el_counter_t(el->st, k, 0, ot) > 0;
      }
      if (s->dead) continue;
      dt__el_key(el, k, sizeof k, "hb/%d", id, 0);
      if (el->etcd) {
        /* etcd: its heartbeat key lives as long as its lease; gone, the
         * member is lost (it fences itself when it finds its lease ended) */
        int found = 1;
        if (dt__etcd_exists(el->st, k, ot, &found) == DT_OK && !found) s->dead = 2;
        else open++;
        continue;
      }
      int64_t h = dt__el_counter_t(el->st, k, 0, ot);
      if (h < 0) { /* no answer: nothing learnt */
        open++;
        continue;
      }
      if (h != s->hb || s->hb_at == 0) s->hb = h, s->hb_at = now;
      if (now - s->hb_at < hbt) open++; /* alive by its heartbeat: wait for it */
    }
    if (!open) {
      /* a spare its launcher woke for this loss: wait for it (up to 1 s), so
       * the loss and the replacement make one generation, not two */
      dt__el_key(el, k, sizeof k, "coming", 0, 0);
      if (dt__el_counter_t(el->st, k, 0, ot) > 0) {
        if (coming_t == 0) coming_t = now;
        if (now - coming_t < 1.0) open++;
      }
    }
    if (!open) {
      /* No split brain: the registered members must be a majority of the
       * generation's members not known dead (a launcher reaped them, or
       * their etcd lease expired). A member merely silent may be alive on
       * the other side of a cut link; a minority stops instead of training
       * on alone (and writes no checkpoint). */
      int regd = 0, gone = 0, ns = 0;
      char silent[160] = "";
      for (int i = 0; i < el->nmembers; i++) {
        if (sn[i].in > 0) regd++;
        else if (sn[i].dead || same_site(el, el->members[i], ot)) gone++;
        else if (ns++ < 8) {
          size_t l = strlen(silent);
          snprintf(silent + l, sizeof silent - l, "%s%d", l ? ", " : "", el->members[i]);
        }
      }
      if (2 * regd <= el->nmembers - gone) {
        rc = dt__seterr(DT_EABORTED, "elastic: member %d reaches %d of the %d members of "
                        "generation %d (member%s %s%s silent, not known dead): it cannot tell a "
                        "cut link from their loss, and a minority never trains on alone; stopping "
                        "without a checkpoint", el->cfg.id, regd, el->nmembers - gone, el->gen,
                        ns == 1 ? "" : "s", silent, ns > 8 ? ", ..." : "");
        goto done;
      }
    }
    int maxw = el->cfg.max_workers > 0 ? el->cfg.max_workers : MAX_MEMBERS;
    int *jids = NULL, nj = 0;
    if (!open && alive < maxw) {
      jids = malloc((size_t)(maxw - alive) * sizeof *jids);
      if (!jids) {
        rc = dt__seterr(DT_ENOMEM, "elastic: out of memory");
        goto done;
      }
      nj = joiners(el, g, jids, maxw - alive);
    }
    alive += nj;
    if (!open) {
      if (alive < el->cfg.min_workers) {
        if (!below_since) {
          below_since = 1;
          below_t = now;
          DT_LOG_WARN("elastic: member %d: %d of at least %d workers left; waiting up to %.0f s "
                      "for others (dist.rejoin_timeout)", el->cfg.id, alive, el->cfg.min_workers,
                      el->cfg.rejoin_timeout_s);
        }
        if (now - below_t > el->cfg.rejoin_timeout_s) {
          free(jids);
          /* the job ends: the most advanced survivor (then the lowest
           * id) keeps its state in a checkpoint; all of them agree on who
           * from the same registrations */
          int64_t best = -1;
          int who = -1;
          for (int i = 0; i < el->nmembers; i++)
            if (sn[i].in > 0 && sn[i].in > best) best = sn[i].in, who = el->members[i];
          el->saver = who == el->cfg.id;
          rc = dt__seterr(DT_ETIMEDOUT, "elastic: only %d worker%s left, fewer than "
                          "dist.min_workers = %d, and none joined within dist.rejoin_timeout = "
                          "%.0f s", alive, alive == 1 ? "" : "s", el->cfg.min_workers,
                          el->cfg.rejoin_timeout_s);
          goto done;
        }
      } else {
        /* decide: the registered members, by id; the change counter so far */
        int *ids = malloc((size_t)alive * sizeof *ids), n = 0;
        if (!ids) {
          free(jids);
          rc = dt__seterr(DT_ENOMEM, "elastic: out of memory");
          goto done;
        }
        for (int i = 0; i < el->nmembers; i++)
          if (sn[i].in > 0) ids[n++] = el->members[i];
        qsort(ids, (size_t)n, sizeof *ids, cmp_int);
        if (n > maxw) n = maxw; /* (members above dist.max_workers: the lowest ids stay) */
        for (int i = 0; i < nj && n < maxw; i++) ids[n++] = jids[i]; /* joiners after them */
        dt__el_key(el, k, sizeof k, "change", 0, 0);
        int64_t c = counter(el->st, k, 0);
        char *want = malloc(GEN_MAX);
        size_t wl = 0;
        if (want) {
          wl = (size_t)snprintf(want, GEN_MAX, "%d %lld ", g, (long long)c);
          for (int i = 0; i < n; i++)
            wl += (size_t)snprintf(want + wl, GEN_MAX - wl, "%s%d", i ? "," : "", ids[i]);
        }
        free(ids);
        free(jids);
        if (!want) {
          rc = dt__seterr(DT_ENOMEM, "elastic: out of memory");
          goto done;
        }
        dt__el_key(el, k, sizeof k, "gen", 0, 0);
        bool sw = false;
        rc = dt_store_cas(el->st, k, rec, strlen(rec), want, wl, &sw, NULL, 0, NULL, tmo);
        free(want);
        if (rc < 0) goto done;
        continue; /* re-read: ours, or the one that won */
      }
    }
    free(jids);
    if (dt_now() - t0 > tmo + el->cfg.rejoin_timeout_s + hbt) {
      rc = dt__seterr(DT_ETIMEDOUT, "elastic: member %d: no agreement on generation %d within "
                      "%.0f s", el->cfg.id, g, dt_now() - t0);
      goto done;
    }
    dt__el_sleep(0.002);
  }
  DT_CHECK_GOTO(enter(el, rec, t0, out), rc, done);
done:
  free(rec);
  free(sn);
  return rc;
}
