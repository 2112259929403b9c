/*
 * elastic_int.h — what the two halves of the elastic layer share: the
 * member's state (struct dt_elastic), the store helpers, and the watcher
 * (watch.c: heartbeats, fencing, the thread that aborts a generation when
 * a change is announced) as elastic.c (create, join, the agreement on the
 * next generation) calls it. Not a public header.
 */
#ifndef DT_ELASTIC_INT_H
#define DT_ELASTIC_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "elastic/elastic.h"

#define MAX_MEMBERS 4096
#define GEN_MAX (32 + MAX_MEMBERS * 8)

struct dt_elastic {
  dt_elastic_cfg cfg;
  char job[128];
  dt_store *st, *wst;           /* caller's and watcher's store clients */
  int gen;
  int64_t seen;                 /* change counter accounted for by this generation */
  int *members, nmembers;       /* ids of the current generation, rank order */
  dt_comm *cur, *own, *old;     /* watched; made here (current); made here (previous) */
  char cjob[160];               /* the current generation's comm prefix */
  pthread_t thread;
  int started;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int stop;
  double tick;
  int saver;                    /* gave up below min_workers and keeps the state */
  /* heartbeats: counters in the built-in store, a lease per member in etcd */
  int etcd;
  int64_t lease;                /* this member's lease (etcd), 0: none */
  int ttl;                      /* its TTL, s */
  double next_keep;             /* when the lease is renewed next */
  double op_tmo;                /* a store call of the watcher or the agreement, s */
  double hb_ok;                 /* the store last took this member's heartbeat */
  double fence_s;               /* without the store this long, a member stops */
  int fenced;                   /* cut off (store unreachable, lease expired): stop */
  char fence_why[400];
};


/* store helpers (elastic.c) */
void dt__el_sleep(double s);
/* P/el/ followed by fmt (with a, b) in buf */
void dt__el_key(const dt_elastic *el, char *buf, size_t cap, const char *fmt, int a, int b);
/* counter k plus add (0: a read); -1 when the store was not reached */
int64_t dt__el_counter_t(dt_store *st, const char *k, int64_t add, double t);
/* a membership change: the change counter bumped, its bell rung */
int dt__el_announce(dt_store *st, const char *job, double t);

/* heartbeats, fencing and the watcher (watch.c) */
int dt__el_lease_start(dt_elastic *el);
int dt__el_beat(dt_elastic *el, dt_store *st, double now);
int dt__el_fenced(dt_elastic *el);
void *dt__el_watch(void *arg);

#endif /* DT_ELASTIC_INT_H */
