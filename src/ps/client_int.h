/*
 * client_int.h — the worker client's insides, shared by client.c (requests,
 * pushes, the steps and the public calls) and client_wait.c (replies,
 * waits, fail-over to replicas, marks and the colocated server thread).
 * Nothing outside src/ps/client*.c includes it.
 */
#ifndef DT_PS_CLIENT_INT_H
#define DT_PS_CLIENT_INT_H

#include <pthread.h>
#include <stdbool.h>

#include "obs/obs.h"
#include "ps/ps.h"


enum { K_PUSHED = 1, K_WAIT = 2, K_DONE = 4, K_LOST = 8, K_STAGED = 16, K_DEFER = 32 };

struct dt_ps_client {
  dt_obs *obs;         /* pushes and the pull wait as spans and histograms */
  dt_obs_metric *m_push, *m_pull;
  const dt_ps_map *map;
  dt_ps_opts o;
  int me;
  dt_comm *comm;
  float *params, *grads;
  dt_ps_server *local;
  int local_idx;
  int64_t clock, marks;
  float weight, lr;
  int nk;
  int R, nslot;        /* replicas of each key range; request slots per key (2 + 2R) */
  uint8_t *hout, *hin; /* per key: R 64-byte request headers (one per replica), a reply header */
  dt_comm_req *kreq;   /* per key: recv hdr, recv payload, then send hdr + payload per replica */
  int *kpeer;          /* per key and slot: the server of that request */
  uint8_t *kst;        /* K_* */
  uint8_t *nreq;       /* per key: requests in kreq in use */
  /* replicas: the read each key waits for, to ask the next replica for it */
  int64_t *rclock;
  uint32_t *rflags;
  int *rfrom;          /* per key: the server its reply comes from */
  uint8_t *sdead;      /* per server: lost */
  uint8_t *stold;      /* per server: its loss told to every live server (DT_PS_LOST) */
  int untold;          /* a loss not told yet: told before the next request */
  uint8_t *late;       /* per server: came back after a loss (rejoin.c) */
  dt_comm **rj_comms;  /* the rejoins' communicators (owned; the last is comm) */
  int rj_n;
  int64_t lost_ns;     /* when the last loss was seen (0: no fail-over pending) */
  int lost_srv;
  int64_t *kver;       /* per key: version of the parameters held */
  /* lazy replies (colocated asp): a push's reply lands in stage and is
   * copied into the parameters at the next step's begin, or before the
   * key's next push, never while forward or backward may read them */
  int lazy;
  float *stage;        /* nparams floats */
  int64_t *kfwd;       /* per key: the version this step's forward read */
  float *resid;        /* significance filter: the update not pushed yet (nparams) */
  float *pairs;        /* significance filter: (index, value) pairs (2 x nparams) */
  /* keys of rows */
  int64_t *knrows;     /* per key: rows named this step, -1 none (whole key) */
  uint32_t *rows;      /* the row numbers, key by key (krow0[k]) */
  size_t *krow0, *kbuf0;
  float *rbuf;         /* per key (kbuf0[k]): pulled rows, or a push's numbers + values */
  /* a checkpoint export in progress */
  float *xbuf;
  size_t *xoff;        /* per key: its record's place in xbuf (nk + 1) */
  int64_t *xsteps;
  size_t ready_lo;
  int next_key;        /* pushes go from the last key down */
  int ndefer;          /* direct asp: pushes put off (K_DEFER) because another worker
                        * held the key; tried again later in backward, waited for
                        * at the step's end */
  dt_ps_client_stats st;
  /* the server thread (colocated, server_thread) */
  int threaded;
  pthread_t thr;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int park, quit, spin;
  int err;             /* a push or a poll failed during backward (reported by finish) */
  char errmsg[512];
  /* under a CPU quota below one core (dt_cpu_quota, read every 100 ms), a
   * wait sleeps between polls instead of spinning: every polled microsecond
   * is charged to the quota (DTRAIN_PS_QUOTA_SLEEP; client_wait.c) */
  int qsleep, quota_bound;
  int64_t quota_next;
};

static inline int dt__psc_srv_rank(const dt_ps_client *c, int s) {
  return dt_ps_server_rank(&c->o, s);
}

/* client.c: sends request m for key k (see there). */
int dt__psc_request(dt_ps_client *c, const dt_ps_msg *m, const float *payload, int expect);
/* client.c: this worker's HELLO (its key map's size and digest), the
 * message a server answers with WELCOME: at start and in a probe. */
dt_ps_msg dt__psc_hello(const dt_ps_client *c);

/* client_wait.c */
void dt__psc_local_reply(void *ud, const dt_ps_msg *m, const float *payload);
int dt__psc_comm_fail(dt_ps_client *c, int rc, const char *what);
int dt__psc_holder(const dt_ps_client *c, int k);
int dt__psc_survivable(dt_ps_client *c, int rc, int srv);
int dt__psc_quota_bound(dt_ps_client *c);
int dt__psc_tell_losses(dt_ps_client *c);
int dt__psc_poll_local(dt_ps_client *c, int *busy);
int dt__psc_reap(dt_ps_client *c, int k0, int block);
int dt__psc_wait_all(dt_ps_client *c);
int dt__psc_mark(dt_ps_client *c, uint32_t flags);
int dt__psc_start_thread(dt_ps_client *c);
void dt__psc_stop_thread(dt_ps_client *c);
void dt__psc_enter(dt_ps_client *c);
void dt__psc_leave(dt_ps_client *c);

#endif /* DT_PS_CLIENT_INT_H */
