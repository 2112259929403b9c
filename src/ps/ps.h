/*
 * ps.h — the parameter-server layer (docs/ps.md): the key-range map that
 * splits a model's flat parameter buffer over servers (keymap.c), the
 * push/pull wire messages and their parser (msg.c), the server (server.c:
 * aggregation, the consistency controllers, the server-side optimizer) and
 * the worker's client (client.c: pushes as gradients become ready, pulls,
 * waits). The engine's "ps" strategy (src/engine/strategy_ps.c) and the
 * command line's server role are its two users.
 *
 * Roles. A job of N workers and S servers is one communicator of N + S
 * ranks: workers are ranks 0..N-1, server s is rank N + s. With colocated
 * servers (ps.colocate) the communicator holds the N workers only and
 * worker r also serves key range r: its server runs inside the worker's
 * thread, progressed whenever the worker waits (no second thread on the
 * communicator, which is single-threaded), and its own pushes and pulls
 * go through memory.
 *
 * Replicas (ps.replicas = R, separate servers only): key range r is also
 * held by servers r+1..r+R-1 (mod S). Workers send every push to every
 * live holder (each applies it exactly as the primary does: in bsp the
 * same rank-order sums, so the replicas stay bit-identical) and read from
 * the first live one; when it dies they read from the next (client.c).
 * A loss also moves the next free server into a range's holders
 * (dt_ps_holders), which takes a copy of it from the range's primary
 * (server_copy.c: re-replication). A new process in a lost server's
 * slot rejoins at the workers' next epoch end and takes a copy of what
 * runs on fewer than R copies (rejoin.c).
 *
 * It does not train, load data or pick learning rates: workers send the
 * rate with each push.
 */
#ifndef DT_PS_H
#define DT_PS_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "core/core.h"
#include "nn/nn.h"

/* ---- the key-range map (keymap.c) ----------------------------------------- */

/* A key: a contiguous span of the flat parameter buffer inside one layer,
 * held by one server. */
typedef struct dt_ps_key {
  uint64_t off, len; /* floats */
  int server;
  int layer;         /* 0-based layer index */
  uint64_t rowlen;   /* > 1: a key of rows of this many floats (an embedding's),
                      * pushed and pulled row by row; 1: dense */
} dt_ps_key;

typedef struct dt_ps_map {
  int nkeys, nservers;
  int replicas;      /* servers holding each key range (1: no replicas; see
                      * dt_ps_map_holds); not part of the digest */
  uint64_t nparams;
  dt_ps_key *keys;   /* by offset; a server's keys are consecutive */
  int *srv_key0;     /* server s holds keys [srv_key0[s], srv_key0[s + 1]) */
  uint64_t *srv_lo;  /* ... and floats [srv_lo[s], srv_lo[s + 1]) */
  uint8_t sha[32];   /* SHA-256 of the map (compared at start) */
} dt_ps_map;

/* At most this many keys (tags are per key). */
#define DT_PS_MAX_KEYS (1 << 20)

/* Splits nlayers layers of len[i] floats (0 allowed) over nservers servers,
 * balanced by bytes: server boundaries at multiples of nparams / nservers,
 * moved to the nearest layer boundary when one is within an eighth of a
 * share (so small layers stay whole and large ones are split). Keys are the
 * pieces of layers within one server. The same input gives the same map
 * everywhere. DT_EINVAL for nservers < 1, no parameters, or more servers
 * than parameters; DT_ENOMEM. Free with dt_ps_map_free. */
int dt_ps_map_build(dt_ps_map *m, const uint64_t *len, int nlayers, int nservers);
/* The same with rows: layer i is rows of rowlen[i] floats (rowlen NULL: all
 * 1), never cut inside a row; its keys carry rowlen. */
int dt_ps_map_build_rows(dt_ps_map *m, const uint64_t *len, const uint64_t *rowlen, int nlayers,
                         int nservers);
/* The same with dense keys (rowlen 1) longer than piece floats cut into
 * near-equal pieces of at most piece floats (0: no cut), so a large layer's
 * pieces are summed, stepped and sent back one after another (pipelined)
 * rather than as one message. even_first: a dense first layer (the layer
 * backward finishes last) of at least (S-1)/S of the floats is cut into S
 * equal shares, one a server (the later layers go to the last server), so
 * the servers' work after backward is equal (bsp). */
int dt_ps_map_build_pieces(dt_ps_map *m, const uint64_t *len, const uint64_t *rowlen, int nlayers,
                           int nservers, uint64_t piece, int even_first);
/* The same with a piece per layer (lpiece[i] for layer i; lpiece NULL:
 * piece for every layer). */
int dt_ps_map_build_layers(dt_ps_map *m, const uint64_t *len, const uint64_t *rowlen,
                           const uint64_t *lpiece, int nlayers, int nservers, uint64_t piece,
                           int even_first);
/* The piece of a map for consistency mode `consistency` (enum
 * dt_ps_consistency): DTRAIN_PS_PIECE, whose default (-1) is 32768 floats
 * for asp and ssp (whose servers step each push as it comes: measured
 * faster) and 0 for bsp (measured slower in pieces, 2026-11-27). */
uint64_t dt_ps_piece(int consistency);
/* The same from a model's layers, with dt_ps_piece(consistency) as piece and
 * even_first in bsp. With DTRAIN_PS_PIECE's default (-1) only a first
 * linear layer (whose weight gradient backward makes piece by piece) is
 * cut; an explicit value cuts every dense layer. */
int dt_ps_map_from_model(dt_ps_map *m, const dt_model *model, int nservers, int consistency);
void dt_ps_map_free(dt_ps_map *m);
/* At most this many copies of a range (workers keep a holder list on the stack). */
#define DT_PS_MAX_REPLICAS 64
/* Replicated shards: key range r (server r's) is also held by servers r+1,
 * ..., r+R-1 (mod S), which apply the same pushes; the first live one
 * answers reads. DT_EINVAL unless 1 <= R <= nservers and R <= 64. */
int dt_ps_map_set_replicas(dt_ps_map *m, int replicas);
/* Whether server s holds key k (as its primary or as a replica) while no
 * server is lost. */
static inline int dt_ps_map_holds(const dt_ps_map *m, int s, int k) {
  int r = m->keys[k].server, d = ((s - r) % m->nservers + m->nservers) % m->nservers;
  return d < (m->replicas > 1 ? m->replicas : 1);
}
/* The servers holding key range g (server g's) when the servers with
 * dead[s] != 0 are lost (dead NULL: none): the first R live ones of g,
 * g+1, ..., g+S-1 (mod S), the first of them its primary. With no loss
 * that is g..g+R-1; a loss moves the next live server into the list (it
 * takes a copy of the range: re-replication), or, with no server left
 * outside it, the range runs on fewer copies. Writes up to R servers into
 * out and returns how many. Without replicas: g alone, whatever is lost. */
static inline int dt_ps_holders(const dt_ps_map *m, int g, const uint8_t *dead, int *out);
/* The same when the servers with late[s] != 0 came back after a loss (a
 * new process in a lost server's slot, rejoin.c; late NULL: none): they
 * come after every other live server in each range's list (g, g+1, ...
 * among the others first, then among them), so a server that rejoins
 * holds only what runs on fewer than R copies and moves no range off a
 * server that holds it. */
static inline int dt_ps_holders_late(const dt_ps_map *m, int g, const uint8_t *dead,
                                     const uint8_t *late, int *out) {
  const int S = m->nservers, R = m->replicas > 1 ? m->replicas : 1;
  if (R == 1) {
    out[0] = g;
    return 1;
  }
  int n = 0;
  for (int pass = 0; pass < (late ? 2 : 1); pass++)
    for (int j = 0; j < S && n < R; j++) {
      int t = (g + j) % S;
      if ((!dead || !dead[t]) && (late ? (late[t] != 0) == pass : 1)) out[n++] = t;
    }
  return n;
}
static inline int dt_ps_holders(const dt_ps_map *m, int g, const uint8_t *dead, int *out) {
  return dt_ps_holders_late(m, g, dead, NULL, out);
}
/* One line per server: "server 1: keys 3-5, floats [52000, 104100) (407 KiB):
 * layer 3 'linear' [52000, 100480), ..." into buf (always terminated);
 * model may be NULL (layers by number). Returns the length it needed. */
size_t dt_ps_map_describe(const dt_ps_map *m, const dt_model *model, char *buf, size_t cap);

/* ---- workers joining (server_join.c) ------------------------------------- */

struct dt_ps_server;

/* Elastic workers: server s watches the job's store (host:port, cc the
 * job's communicator config; cc->job names the job) for joiners and admits
 * them in its poll loop. A no-op unless s's options say elastic. */
int dt_ps_server_set_joins(struct dt_ps_server *s, const char *host, int port,
                           const struct dt_comm_config *cc);
/* A joiner: announces itself in the store, builds the communicator with
 * every server of map (its rank 0) and asks each to admit it as worker
 * `slot`. On success *out is that communicator (the caller's; its client
 * then runs with dt_ps_opts.joined). A refusal is the server's one line
 * (DT_EINVAL for a slot the job does not have, DT_EMISMATCH for another
 * map); every wait is bounded (at most 10 s). */
int dt_ps_join(const char *host, int port, const struct dt_comm_config *cc, const dt_ps_map *map,
               int slot, dt_comm **out);

/* ---- a server process rejoining (rejoin.c) ------------------------------- */

/* The map's digest as a number (its first 8 bytes, as HELLO carries it). */
static inline uint64_t dt_ps_map_digest(const dt_ps_map *m) {
  uint64_t d = 0;
  for (int i = 0; i < 8; i++) d |= (uint64_t)m->sha[i] << (8 * i);
  return d;
}

/* Replicas: server s may take part in rejoins — a new process in a lost
 * server's slot — through the job's store (host:port, cc the job's comm
 * config). A no-op without replicas. */
int dt_ps_server_set_rejoins(struct dt_ps_server *s, const char *host, int port,
                             const struct dt_comm_config *cc);
/* The newcomer in lost server `slot`: takes the next rejoin number
 * (*number), marks in late[] (map->nservers bytes) every slot that
 * rejoined so far and its own, and waits (up to cc's deadline) for the
 * workers' next epoch end to build the rejoin's communicator with it
 * (*out, the job's ranks: it at nworkers + slot). DT_EINVAL without
 * replicas or for a slot out of range. */
int dt_ps_rejoin_connect(const char *host, int port, const struct dt_comm_config *cc,
                         const dt_ps_map *map, int nworkers, int slot, struct dt_comm **out,
                         uint8_t *late, int64_t *number);
/* The newcomer's server (created on that communicator with the slot's
 * index) drops the ranges it would hold at start and waits for a copy of
 * every range that now lists it (dt_ps_holders_late with late), from
 * each range's primary. */
int dt_ps_server_rejoined(struct dt_ps_server *s, const uint8_t *late, int64_t number);
struct dt_ps_client;
/* A worker at an epoch's end (no request outstanding), once the workers
 * agree that rejoin `number` of server slot d is announced: tells every
 * live server (its last message on its communicator), joins the rejoin's
 * communicator and talks to every server there from now on; d counts as
 * live again, after the others in each holder list. Skipped with a
 * warning when d was not lost here or another server is lost too. */
int dt_ps_client_rejoin(struct dt_ps_client *c, const char *host, int port,
                        const struct dt_comm_config *cc, int64_t number, int d);

/* ---- wire messages (msg.c) ----------------------------------------------- */

enum dt_ps_type {
  DT_PS_HELLO = 1, /* worker -> server: aux = map digest, key = nkeys, count = nparams */
  DT_PS_WELCOME,   /* server -> worker: the same fields, the server's map */
  DT_PS_PUSH,      /* worker -> server: a key's gradient (count floats follow) */
  DT_PS_PULL,      /* worker -> server: a key's parameters, at clock */
  DT_PS_PARAMS,    /* server -> worker: a key's parameters (count floats follow) */
  DT_PS_BYE,       /* worker -> server: this worker is done */
  DT_PS_ERR,       /* server -> worker: a refusal; a DT_PS_ERR_TEXT message follows */
  DT_PS_LOST,      /* worker -> server: server `aux` is lost (replicas); sent to every
                    * live server before this worker's next push */
  DT_PS_COPY,      /* server -> server (re-replication): a key's record (count floats:
                    * parameters, then optimizer state; then the workers' push clocks,
                    * N int64), at version `clock`, optimizer step count `aux`,
                    * the key's row mode + 1 in `flags` */
  DT_PS_REJOIN,    /* worker -> server: server `aux`, lost, is back (a new process in its
                    * slot), rejoin number `clock` of the job: this worker's last message
                    * on this communicator; the next ones come on the rejoin's (rejoin.c) */
  DT_PS_TYPE_MAX
};

/* flags */
#define DT_PS_F_PULL 1u  /* PUSH: reply with the key's parameters when readable */
#define DT_PS_F_FINAL 2u /* PULL: wait for every worker's pushes up to clock */
#define DT_PS_F_SPARSE 4u /* PUSH: count (index, value) pairs, 2 x count floats follow
                           * (the index's bits as a uint32); count may be 0 */
#define DT_PS_F_ROWS 8u   /* a key of rows (rowlen > 1), count rows of it:
                           * PUSH: count row numbers (uint32, within the key),
                           *   then count x rowlen floats, as one payload;
                           * PULL: count row numbers follow;
                           * PARAMS: count x rowlen floats, in the pull's order */
#define DT_PS_F_STATE 16u /* checkpoints: PULL (count 0) answered at once by PARAMS
                           * with the key's parameters then its optimizer state
                           * (count = len + state floats; aux = the optimizer's
                           * step count) */
#define DT_PS_F_WIN 32u   /* shared-memory windows (dt_ps_opts.win_params): PUSH: no
                           * payload, the server reads the gradient in the worker's
                           * window; PUSH/PULL: the reply's parameters are written
                           * into the worker's window, PARAMS (so flagged) carries
                           * none. Dense keys only (not with SPARSE, ROWS, STATE) */
#define DT_PS_F_JOIN 64u  /* HELLO: a worker joining a running job, over a communicator
                           * of its own (server_join.c), taking slot `sender` */

/* A decoded header (64 bytes on the wire, little-endian). */
typedef struct dt_ps_msg {
  int type;
  int32_t sender;  /* worker index, or server index */
  int32_t key;     /* key index (HELLO/WELCOME: nkeys) */
  uint32_t flags;
  int64_t clock;   /* PUSH: the worker's clock (its step); PULL: the clock it reads at;
                    * PARAMS: the key's version; ERR: the DT_E* code */
  uint64_t count;  /* floats following (sparse push: pairs; HELLO/WELCOME: nparams) */
  float lr;        /* PUSH: learning rate */
  float weight;    /* PUSH: the worker's share of the global batch */
  uint64_t aux;    /* HELLO/WELCOME: map digest; PUSH: version the gradient was computed
                    * at; PARAMS: the oldest worker clock included */
} dt_ps_msg;

#define DT_PS_HDR_BYTES 64
#define DT_PS_ERR_TEXT 256
#define DT_PS_MAGIC 0x31535044u /* "DPS1" */
#define DT_PS_VERSION 1

void dt_ps_msg_encode(const dt_ps_msg *m, uint8_t out[DT_PS_HDR_BYTES]);
/* Decodes and checks a header that arrived at `to` (a server index, or -1
 * at a worker) from `from` (a worker index at a server, a server index at a
 * worker), against the map and nworkers: magic, version, type for the
 * direction, sender = from, key in range and held by that server, count
 * equal to the key's length for PUSH/PARAMS (0 for the others but
 * HELLO/WELCOME), lr and weight finite, clock >= 0. DT_EPROTO with a message
 * naming the sender, the key and what is wrong. */
int dt_ps_msg_parse(const uint8_t *buf, size_t len, const dt_ps_map *map, int nworkers, int to,
                    int from, dt_ps_msg *out);
/* Decodes and checks a COPY header that server `to` got from server
 * `from`: magic, version, type, sender, key in range, count = the key's
 * record (len, 2 len or 3 len floats), clock >= 0, flags <= 2. DT_EPROTO
 * naming the sender. */
int dt_ps_msg_parse_copy(const uint8_t *buf, size_t len, const dt_ps_map *map, int from,
                         dt_ps_msg *out);
const char *dt_ps_type_name(int type);

/* Tags: requests (header, then payload), server control (ERR, WELCOME),
 * and a pair per key for the parameters a worker pulls. */
#define DT_PS_TAG_REQ 0x5000
#define DT_PS_TAG_REQ_DATA 0x5001
#define DT_PS_TAG_CTL 0x5002
#define DT_PS_TAG_CTL_TEXT 0x5003
#define DT_PS_TAG_KEY(k) (0x10000 + 2 * (k))

/* ---- options ------------------------------------------------------------- */

enum dt_ps_consistency { DT_PS_BSP, DT_PS_SSP, DT_PS_ASP };

typedef struct dt_ps_opts {
  int nworkers, nservers;
  int colocate;         /* servers inside workers: server s is rank s */
  int consistency;      /* enum dt_ps_consistency */
  int staleness;        /* ssp: s */
  int backup_workers;   /* bsp: a clock closes with nworkers - b pushes */
  float significance;   /* > 0: push only entries whose update (lr x accumulated
                         * gradient) exceeds this fraction of |parameter|; the
                         * rest stays in the worker's residual (error feedback) */
  dt_optim_cfg optim;   /* the server-side optimizer */
  int server_thread;    /* colocated: the server runs on a thread of its own
                         * (client.c), not only inside its worker's waits */
  int replicas;         /* separate servers holding each key range (1: none) */
  /* Elastic workers (dist.min_workers, docs/ps.md "Workers leaving"): a
   * worker lost mid-run is removed from the clocks (bsp/ssp close and
   * bound over the live workers) instead of ending the job. */
  int elastic;
  /* A worker that joined a running job (server_join.c): its communicator
   * is the one it joined on, the servers at ranks 1..S there. */
  int joined;
  /* Shared-memory windows (one host, docs/ps.md "Windows"): per worker, its
   * model's parameters and gradients as this process maps them (NULL: no
   * windows; then every payload travels through the transport) */
  float *const *win_params, *const *win_grads;
  /* Direct asp (colocated asp with windows, direct.c): every key's master
   * copy in shared memory, each push applied by its worker (NULL: no) */
  struct dt_ps_direct *direct;
} dt_ps_opts;

/* The world rank of server s and of worker w under opts. */
static inline int dt_ps_server_rank(const dt_ps_opts *o, int s) {
  return o->joined ? 1 + s : o->colocate ? s : o->nworkers + s;
}

/* ---- direct asp (direct.c) ---------------------------------------------- */

/* Colocated asp on one host (docs/ps.md "direct pushes"): the keys' master
 * parameters, optimizer state, versions and push clocks in shared memory,
 * server s's keys in its slot; a worker steps its own pushes under a
 * per-key lock and copies the result into its parameters. */
typedef struct dt_ps_direct dt_ps_direct;
/* Bytes of every server's slot (the largest slot: the same on every rank). */
size_t dt_ps_direct_bytes(const dt_ps_map *map, const dt_ps_opts *o);
/* Worker `me` of o with slots[s] = server s's slot as this process maps it
 * (zeroed); initialises its own server's keys from init (the whole model's
 * parameters). Every worker must create its table before any pushes (the
 * client's start passes a mark). timeout: seconds a lock may be waited for. */
int dt_ps_direct_create(dt_ps_direct **out, const dt_ps_map *map, const dt_ps_opts *o, int me,
                        void *const *slots, const float *init, double timeout);
void dt_ps_direct_destroy(dt_ps_direct *d);
/* Applies key k's gradient g scaled by w (the worker's share of the
 * batch) with rate lr divided by the staleness (the key's version now
 * minus `read`, the version the worker's parameters of k are at), then
 * copies the key's new parameters into out and their version into *ver —
 * SGD (with momentum, no Nesterov or dampening) and AdamW in one pass over
 * the key; the other optimizers scale g in place first. try: when another
 * worker holds the key, returns 1 at once without applying anything (g
 * untouched; else it waits for the key). */
int dt_ps_direct_push(dt_ps_direct *d, int k, float *g, float w, float lr, int64_t read,
                      float *out, int64_t *ver, int try);
/* 1 when every worker's pushes of every key up to `clock` are applied. */
int dt_ps_direct_all_in(const dt_ps_direct *d, int64_t clock);
/* Key k's master parameters into out, their version into *ver. */
int dt_ps_direct_read(dt_ps_direct *d, int k, float *out, int64_t *ver);
/* Checkpoints: key k's record (parameters, then optimizer state, as
 * dt_ps_key_state_floats) and step count, out of and into the table. */
int dt_ps_direct_record(dt_ps_direct *d, int k, float *rec, int64_t *step);
int dt_ps_direct_restore(dt_ps_direct *d, int k, const float *rec, int64_t step);

/* ---- server (server.c) --------------------------------------------------- */

typedef struct dt_ps_server dt_ps_server;

/* What a server measured (dt_ps_server_stats). */
typedef struct dt_ps_server_stats {
  int64_t pushes, pulls, dropped;   /* dropped: late pushes of a closed clock */
  int64_t clocks;                   /* clocks closed (bsp), summed over keys */
  int64_t reads, max_missing;       /* reads answered; most clocks a read missed */
  int64_t violations;               /* ssp reads that missed more than s clocks */
  int64_t min_clock_seen;           /* unused; reserved */
  double busy_seconds;
  int64_t win_sent, win_received;   /* bytes of replies written into and pushes read
                                     * from workers' shared-memory windows */
  int64_t workers_lost;             /* elastic: workers removed from the clocks */
  int64_t workers_joined;           /* elastic: joiners admitted into a lost worker's slot */
} dt_ps_server_stats;

/* A server for index `index` of map, talking over comm (ranks as in opts).
 * init holds the whole model's starting parameters (nparams floats): the
 * server copies its range. */
int dt_ps_server_create(dt_ps_server **out, const dt_ps_map *map, const dt_ps_opts *opts,
                        int index, dt_comm *comm, const float *init);
void dt_ps_server_destroy(dt_ps_server *s);
/* Serves until every worker said BYE (separate server processes). Errors
 * name the worker and the key. */
int dt_ps_server_run(dt_ps_server *s);
/* Makes progress without blocking (colocated servers); *busy set when
 * something was handled. */
int dt_ps_server_poll(dt_ps_server *s, int *busy);
/* True once every worker said BYE. */
int dt_ps_server_done(const dt_ps_server *s);
void dt_ps_server_stats_get(const dt_ps_server *s, dt_ps_server_stats *out);
/* The server's range of the parameters (tests). */
const float *dt__ps_server_params(const dt_ps_server *s);
/* Floats of a key's checkpoint record: its parameters, then its optimizer
 * state (none, one or two per parameter, by the optimizer). */
size_t dt_ps_key_state_floats(const dt_ps_opts *o, const dt_ps_key *K);
/* Resume: key `key` (of this server) takes the record src (parameters,
 * then optimizer state) and the optimizer step count. DT_EINVAL for a key
 * of another server. Before serving, or while nothing reads the key. */
int dt_ps_server_restore(dt_ps_server *s, int key, const float *src, int64_t step);

/* The colocated path: a worker in the same process hands the server its
 * messages directly (payload: count floats, read during the call) and the
 * server hands replies back through this callback (params of key, count
 * floats, valid during the call). */
typedef void (*dt_ps_local_reply)(void *ud, const dt_ps_msg *m, const float *payload);
void dt_ps_server_set_local(dt_ps_server *s, int worker, dt_ps_local_reply fn, void *ud);
int dt_ps_server_local(dt_ps_server *s, const dt_ps_msg *m, const float *payload);
/* Zero copy for a colocated bsp server driven by its worker's thread: its
 * keys' parameters live in the worker's own parameter buffer (params, the
 * whole model; the server's values are copied there), so the optimizer
 * writes where the worker reads and its local reply moves nothing; the
 * worker's dense pushes are summed straight from the buffer it pushed
 * (which must not change until the key's reply). DT_EINVAL otherwise. */
int dt__ps_server_zero_copy(dt_ps_server *s, float *params);
/* A poll loop's wait after `idle` rounds with nothing done: none at first,
 * then yields, then short sleeps (server.c; the client's waits use it too). */
void dt__ps_backoff(int idle);
/* Sleeps ns nanoseconds with this thread's timer slack set to 1 us (the
 * default 50 us would make a 20 us sleep ~70 us). */
void dt__ps_sleep_ns(long ns);

/* ---- worker client (client.c) -------------------------------------------- */

typedef struct dt_ps_client dt_ps_client;

typedef struct dt_ps_client_stats {
  int64_t pushed_floats, pulled_floats, skipped_floats;
  double wait_seconds;      /* time spent waiting for parameters */
  int64_t max_staleness;    /* largest version gap of a push (asp) */
  int64_t failovers;        /* servers lost and survived (replicas) */
  double failover_seconds;  /* the last loss: from noticing it to the next completed clock */
  int64_t win_sent, win_received; /* bytes of pushes and replies that went through the
                                   * shared-memory windows instead of the transport
                                   * (with a colocated server's, as the transport
                                   * counts them) */
} dt_ps_client_stats;

/* Worker `worker` of opts over comm; params/grads are the model's buffers
 * (nparams floats each; the client writes pulled parameters into params).
 * local: this process's server when colocated, else NULL. */
int dt_ps_client_create(dt_ps_client **out, const dt_ps_map *map, const dt_ps_opts *opts,
                        int worker, dt_comm *comm, float *params, float *grads,
                        dt_ps_server *local);
void dt_ps_client_destroy(dt_ps_client *c);
/* Start: HELLO to every server and its WELCOME back; a server with another
 * map is DT_EMISMATCH naming it and both digests. Then pulls every key at
 * clock 0. */
int dt_ps_client_start(dt_ps_client *c);
/* A step: weight = this worker's share of the global batch, lr = the
 * step's learning rate. Pushes happen in dt_ps_client_ready as spans of
 * gradients become final; finish pushes the rest, then waits for every
 * key's parameters for the next clock. */
void dt_ps_client_begin(dt_ps_client *c, float weight, float lr);
/* Keys of rows (an embedding layer's, 0-based `layer`): this step reads
 * only rows[0..n) (sorted, distinct, of the layer); its pushes of those
 * keys carry just those rows. Call after begin. DT_EINVAL for a layer that
 * is not one of rows, or rows out of order or range. */
int dt_ps_client_rows(dt_ps_client *c, int layer, const int32_t *rows, int n);
/* Pulls the rows named by dt_ps_client_rows at the current clock into the
 * parameters (before forward), and waits for them. */
int dt_ps_client_pull_rows(dt_ps_client *c);
/* Checkpoints: every key's record from its server (dt_ps_key_state_floats
 * floats each, in key order, into buf) and its optimizer step count (into
 * steps[key]), answered at once: in bsp, at a step boundary, the state that
 * produced the parameters this worker holds. */
int dt_ps_client_export(dt_ps_client *c, float *buf, int64_t *steps);
void dt_ps_client_ready(dt_ps_client *c, size_t off, size_t n);
int dt_ps_client_finish(dt_ps_client *c);
/* Pulls every key with every worker's pushes up to the current clock (the
 * same parameters on every worker: evaluation, the end). */
int dt_ps_client_sync(dt_ps_client *c);
/* Says BYE to every server; a colocated worker then keeps serving until
 * every worker has said it. */
int dt_ps_client_stop(dt_ps_client *c);
/* Colocated: returns once every worker has reached this point, serving
 * meanwhile, so a collective on the communicator that follows cannot block
 * a worker still waiting for this worker's server. A no-op otherwise. */
int dt_ps_client_quiesce(dt_ps_client *c);
/* Separate servers: whether every server is still there, when a collective
 * of the workers failed for a lost member (elastic workers): a HELLO to
 * each live server, answered by its WELCOME (nothing changes there); a lost
 * one fails the exchange as any wait for it (shm: its pid is watched; tcp:
 * its connection closed). A lost server with a replica is survived
 * (counted lost, as in a wait); one without ends with DT_EPEERLOST naming
 * it, as a wait for its keys would. No request may be outstanding. DT_OK
 * with colocated servers (they die with their workers). */
int dt_ps_client_probe(dt_ps_client *c);
void dt_ps_client_stats_get(const dt_ps_client *c, dt_ps_client_stats *out);
int64_t dt_ps_client_clock(const dt_ps_client *c);
/* A joiner (dt_ps_join): its next push is at clock (the members' step). */
void dt_ps_client_set_clock(dt_ps_client *c, int64_t clock);

#endif /* DT_PS_H */
