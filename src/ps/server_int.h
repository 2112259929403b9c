/*
 * server_int.h — a parameter server's insides, shared by server.c (state,
 * messages, replies, the serving loops) and server_apply.c (how pushes are
 * aggregated and applied under each consistency mode). Nothing outside
 * src/ps/server*.c includes it.
 */
#ifndef DT_PS_SERVER_INT_H
#define DT_PS_SERVER_INT_H

#include "ps/ps.h"

typedef struct skey {
  const dt_ps_key *K;
  int idx;
  float *p;          /* the key's parameters (into s->params) */
  dt_optim *opt;
  int64_t version;   /* bsp: clocks closed; ssp/asp: pushes applied */
  int64_t prever;    /* bsp, fused close: the version already written into both workers'
                      * windows by the close itself (reply() sends the headers only) */
  int64_t *wclock;   /* per worker: pushes received (its next clock) */
  /* bsp */
  int narr;
  uint8_t *arr;      /* per worker: clock `version` push is in */
  float *wweight, *wlr;
  float *pb;         /* per worker: its push (N x len) */
  const float **wsrc; /* per worker: where its push of this clock is (its pb slot,
                       * or the colocated worker's own gradients: zero copy) */
  float *sum;        /* len; also the scratch for async pushes */
  /* replies */
  int64_t *want;     /* per worker: clock of a pending read, -1 none */
  uint32_t *wflags;
  dt_comm_req *sreq; /* per worker: header + payload sends */
  uint8_t *sent;     /* per worker: sreq in flight */
  uint8_t *shdr;     /* per worker: 64-byte header */
  float *snap;       /* per worker: payload copy (async, backups) */
  float *pairs;      /* 2 x len: a sparse push or a push/pull of rows as it arrived */
  /* keys of rows (K->rowlen > 1) */
  size_t nrows;      /* len / rowlen; 0: a dense key */
  size_t stride;     /* floats of a worker's bsp slot in pb: len (+ nrows) */
  int64_t *pcount;   /* per worker: rows in its bsp slot, -1 dense */
  uint32_t *wrows;   /* per worker: the rows of its pending pull (N x nrows) */
  uint64_t *wnrows;
  uint8_t *mark;     /* per row: in this clock's sum */
  uint32_t *pos, *touched; /* per row: its place in sum; the rows summed */
  int rowmode;       /* -1 not yet, 0 dense pushes, 1 row pushes (never mixed) */
  float *rec;        /* a checkpoint record (parameters + optimizer state), on demand */
  /* re-replication (server_copy.c) */
  float *own;        /* the parameters of a range taken over after a loss (others: in
                      * s->params) */
  int live;          /* 1 serving; 0 waiting for its copy; -1 its copy never came */
  int copied;        /* installed from a copy: pushes the copy already holds are dropped */
  float *cbuf;       /* the copy being sent or received: record, then N push clocks */
  uint8_t chdr[DT_PS_HDR_BYTES];
  dt_comm_req *creq; /* 2 per server: header and record, sent or received */
  uint8_t *cpend;    /* per request of creq: in flight */
  int cbusy;         /* requests of creq in flight */
} skey;

/* A message for a key whose copy has not come yet (re-replication): kept,
 * payload and all, until the copy is in, then handled in arrival order. */
typedef struct pss_queued {
  int w;
  dt_ps_msg m;
  float *data;
} pss_queued;

struct dt_ps_server {
  const dt_ps_map *map;
  dt_ps_opts o;
  int index, N;
  dt_comm *comm;
  float *params;     /* the server's range */
  float *alias;      /* zero copy: the colocated worker's parameters (whole model) */
  int nk;
  skey *keys;        /* the keys held: its own range's, then its replicas' */
  int *kpos;         /* per key of the map: its place in keys, -1 not held */
  /* remote workers */
  uint8_t *hdr;      /* N x 64 */
  dt_comm_req *req;  /* N */
  uint8_t *posted;
  int rr;            /* blocking mode: the worker waited on next */
  int *bye;          /* per worker: final bye */
  uint8_t *parked;   /* per worker: a push waiting for its clock (replicas, bsp) */
  dt_ps_msg *pmsg;   /* ... that push */
  int64_t *marks;    /* per worker: marks seen */
  /* elastic workers (o.elastic): lost ones are out of every clock */
  uint8_t *gone;     /* per worker: lost and removed */
  uint8_t *losing;   /* per worker: a request with it failed; removed at the next poll */
  int ngone;
  double lost_t;     /* when the last worker was lost, until a clock closes after it (bsp) */
  int lost_w;
  /* joiners (server_join.c): per worker, the communicator a worker that
   * joined later talks over (NULL: the job's); the store they announce
   * themselves in */
  dt_comm **wc;
  struct dt_store *jst;
  struct dt_comm_config jcc;
  char jjob[200], jkey[240];
  int64_t jseen;
  double jnext;
  int nbye;
  uint8_t welcome[DT_PS_HDR_BYTES];
  dt_comm_req wreq[1];
  /* the colocated worker */
  int local;         /* its index, -1 none */
  dt_ps_local_reply local_fn;
  void *local_ud;
  dt_ps_server_stats st;
  int failed;
  int extra;         /* the last message was a checkpoint pull: not a turn of its worker */
  int fused;         /* bsp: two pushes summed and stepped in one pass (DTRAIN_PS_FUSED) */
  /* re-replication (server_copy.c; replicas only, cp != 0) */
  int cp;
  uint8_t *dead;     /* per server: lost, as the workers said (DT_PS_LOST) */
  uint8_t *told;     /* N x S: worker w said server d is lost */
  int *hold, *nhold; /* per range: its holders as this server sees them (S x R) */
  uint8_t *cp_want;  /* S x S: range g (this server its primary) is to be copied to server t */
  int *cp_from;      /* per range this server waits for: the server its copy comes from */
  int *cp_left;      /* ... and its keys still to come */
  int64_t cp_t0;     /* when the last loss was first reported here */
  pss_queued *q;
  int nq, capq;
  /* rejoins (rejoin.c): a new process in a lost server's slot */
  uint8_t *late;     /* per server: came back after a loss (last in every holder list) */
  int64_t *rj_told;  /* per worker: the last rejoin it told of (its messages on the
                      * communicator before it end there) */
  int64_t rj_done;   /* rejoins this server has switched communicators for */
  int rj_slot;       /* the slot of rejoin rj_done + 1, as told */
  char rj_host[256];
  int rj_port;       /* 0: no store, no rejoins */
  struct dt_comm_config rj_cc;
  dt_comm **rj_comms; /* the rejoins' communicators (owned) */
  int rj_n;
  /* DTRAIN_TEST_PS_DIE (tests only, server.c): the clock from which on
   * replies are counted (-1: off), FINAL reads or step reads, and per
   * worker the replies counted */
  int64_t die_at;
  int die_final;
  int *die_n;
};

static inline skey *dt__pss_key(dt_ps_server *s, int idx) { return &s->keys[s->kpos[idx]]; }

/* server.c */
int dt__pss_try_replies(dt_ps_server *s, skey *k);
int dt__pss_wait_sent(dt_ps_server *s, skey *k, int w);
int dt__pss_settle(dt_ps_server *s, skey *k);
int dt__pss_handle(dt_ps_server *s, int w, const dt_ps_msg *m, const float *data);
int dt__pss_key_init(dt_ps_server *s, skey *k, int key);
void dt__pss_key_free(skey *k);
/* server_copy.c */
int dt__pss_copy_init(dt_ps_server *s);
void dt__pss_copy_free(dt_ps_server *s);
int dt__pss_lost(dt_ps_server *s, int w, int d);
int dt__pss_copy_poll(dt_ps_server *s, int *busy);
int dt__pss_must_queue(const dt_ps_server *s, int w, const dt_ps_msg *m);
int dt__pss_enqueue(dt_ps_server *s, int w, const dt_ps_msg *m, float *data);
void dt__pss_copy_finish(dt_ps_server *s);
int dt__pss_worker_lost(dt_ps_server *s, int w, const char *how);
int64_t dt__pss_min_clock(const dt_ps_server *s, const struct skey *k);
/* rejoin.c */
int dt__pss_rejoin_told(dt_ps_server *s, int w, const dt_ps_msg *m);
int dt__pss_rj_hold(const dt_ps_server *s, int w);
void dt__pss_rejoin_free(dt_ps_server *s);
int dt__pss_take_range(dt_ps_server *s, int g, int src, int src_has_it);
/* server_join.c */
int dt__pss_join_poll(dt_ps_server *s, int *busy);
void dt__pss_join_free(dt_ps_server *s);
/* server_apply.c */
int dt__pss_need(const dt_ps_server *s);
/* bsp, two pushes of a dense key, SGD without Nesterov or dampening: the
 * sum and the update in one pass (fused.c); 0 when not applicable */
int dt__pss_fused_sum2_step(const dt_optim_cfg *c, dt_optim *o, size_t n, float *p,
                            const float *a, const float *b, float lr, float *o0, float *o1);
int dt__pss_recheck(dt_ps_server *s, skey *k);
int dt__pss_on_push(dt_ps_server *s, skey *k, int w, const dt_ps_msg *m, const float *data);
float *dt__pss_push_dest(dt_ps_server *s, skey *k, int w, const dt_ps_msg *m);

#endif /* DT_PS_SERVER_INT_H */
