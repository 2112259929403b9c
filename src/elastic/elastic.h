/*
 * elastic.h — elastic membership of a data-parallel job (docs/elastic.md):
 * numbered generations of members kept in the rendezvous store, decided by
 * compare-and-set so every member adopts the same one; heartbeats; a
 * watcher thread that aborts the current communicator as soon as some
 * member (or a launcher) announces a change; and a fresh communicator per
 * generation (its own store prefix, so its shared-memory names are new).
 *
 * A worker makes one dt_elastic with the rendezvous address and its comm
 * config, hands it the job's first communicator (generation 0, members
 * 0..size0-1), and when a collective fails calls dt_elastic_reform with how
 * far it got; that returns the next generation's communicator, this
 * worker's rank in it and the member that holds the most advanced state
 * (the one every member copies from).
 *
 * It does not know about models, steps or strategies (the engine maps
 * "how far" to a position and moves the state); it does not start
 * processes (the launcher does, and tells the store about deaths).
 *
 * Store keys, under the job name P:
 *   P/el/gen          "G C id,id,..." the current generation G, the change
 *                     counter C it accounts for, its members in rank order
 *   P/el/change       counter: bumped by whoever sees a failure
 *   P/el/bell/N       set right after the change counter reached N: wakes the
 *                     watchers parked on it (a GET of a missing key waits)
 *   P/el/hb/ID        counter: member ID's heartbeat (etcd: a key under member
 *                     ID's lease, gone when the lease expires)
 *   P/el/dead/ID      counter > 0: a launcher saw member ID's process die
 *   P/el/gG/in/ID     2 + position: ID is alive and wants generation G (1: it
 *                     holds no complete state: a joiner, or a partial copy)
 *   P/el/size0        the members of generation 0 (joiners' ids follow)
 *   P/el/nextid       counter: joiner ids handed out (id = size0 + n - 1)
 *   P/el/fp           the job's config fingerprint (a joiner compares it)
 *   P/el/coming       counter: spares a launcher woke that have not registered
 *                     yet (the members wait up to 1 s for them, so a loss and
 *                     its replacement make one generation, not two)
 *
 * A new generation needs a majority of the last one's members not known
 * dead (no split brain across a cut link; silent members at its own bind
 * address count as dead); a member that cannot reach the
 * store for 2 x heartbeat_timeout + 3 s (or whose etcd lease expired) is
 * fenced: its collectives are aborted and dt_elastic_reform returns
 * DT_EABORTED with the reason.
 *
 * A joiner (dt_elastic_cfg.join) gets the next free id, checks the job's
 * fingerprint, registers for the next generation and announces a change;
 * the members re-form at once (their step in flight is redone) and the
 * deciding member admits registered joiners after the surviving members,
 * up to max_workers.
 */
#ifndef DT_ELASTIC_H
#define DT_ELASTIC_H

#include <stdint.h>

#include "comm/comm.h"

typedef struct dt_elastic dt_elastic;

typedef struct dt_elastic_cfg {
  const char *host;            /* rendezvous store address */
  int port;
  const char *token;           /* job token (NULL: none) */
  struct dt_comm_config cc;    /* the job's comm config (job = the store prefix) */
  int id;                      /* this worker's member id (its rank in generation 0) */
  int size0;                   /* members of generation 0 (ids 0..size0-1) */
  int min_workers;             /* fewer members than this: wait, then give up */
  double rejoin_timeout_s;     /* how long to wait for members below min_workers */
  double heartbeat_timeout_s;  /* a member silent this long is dead */
  int max_workers;             /* most members of a generation (0: no limit) */
  int join;                    /* 1: a joiner (id and size0 are found in the store) */
  int spare;                   /* 1: a spare its launcher counted in P/el/coming */
  /* The config fingerprint: members publish it, a joiner hands the job's to
   * check_fp, which returns DT_EMISMATCH (message naming the key) to refuse. */
  const void *fp;
  size_t fp_len;
  int (*check_fp)(void *ud, const void *job_fp, size_t len);
  void *fp_ud;
} dt_elastic_cfg;

/* A generation as a member sees it. */
typedef struct dt_elastic_gen {
  int gen;                     /* generation number (0: the job's start) */
  dt_comm *comm;               /* its communicator (owned by the dt_elastic) */
  int rank, size;              /* this worker in it */
  int source;                  /* rank holding the most advanced position */
  int64_t pos;                 /* that position (the largest any member reported) */
} dt_elastic_gen;

/* Connects to the store (two clients: the caller's and the watcher's) and
 * publishes generation 0 if nobody has yet. Does not start the watcher. */
int dt_elastic_create(dt_elastic **out, const dt_elastic_cfg *cfg);
/* Starts heartbeats and the watcher on communicator c (borrowed: the
 * generation-0 communicator, which the caller keeps owning). */
int dt_elastic_start(dt_elastic *el, dt_comm *c);
/* After a failed collective at position pos (any int64 that grows as the
 * run advances; -1: this worker holds no complete state, so it must not be
 * the source): aborts the current communicator, announces the change,
 * registers for the next generation, waits until every member of the
 * current one has registered or is known dead (launcher) or silent
 * (heartbeats), decides the next generation by compare-and-set (or adopts
 * the one another member decided) and joins its communicator. Below
 * min_workers it waits up to rejoin_timeout_s, then fails with
 * DT_ETIMEDOUT saying so. A worker left out of the generation (evicted
 * while frozen) gets DT_EABORTED. The previous communicator stays valid
 * until dt_elastic_release_old. */
int dt_elastic_reform(dt_elastic *el, int64_t pos, dt_elastic_gen *out);
/* Frees the communicator of the previous generation if this dt_elastic
 * made it (call once nothing uses it any more). */
void dt_elastic_release_old(dt_elastic *el);
/* A joiner (cfg.join): waits (bounded by cc.timeout_s + rejoin_timeout_s)
 * until a generation with room for it admits it, and joins that
 * generation's communicator; then starts the watcher on it. *out as for
 * dt_elastic_reform (source and pos: whose state to take). */
int dt_elastic_join(dt_elastic *el, dt_elastic_gen *out);
/* This worker's member id (a joiner's is known after dt_elastic_create). */
int dt_elastic_id(const dt_elastic *el);
/* After dt_elastic_reform gave up below min_workers (DT_ETIMEDOUT): 1 if
 * this member is the one survivor that keeps the job's state (the most
 * advanced registered member, then the lowest id; every survivor agrees). */
int dt_elastic_saves(const dt_elastic *el);
/* The generation this worker is in. */
int dt_elastic_generation(const dt_elastic *el);
/* Stops the watcher, frees the communicators it made. NULL is a no-op. */
void dt_elastic_destroy(dt_elastic *el);

/* A store client: host "etcd://IP" is an etcd server's v3 JSON gateway
 * (store_etcd.c; the job's keys under a prefix made from token), anything
 * else the built-in TCP store (dt_store_connect). */
int dt_elastic_store_connect(dt_store **out, const char *host, int port, const char *token,
                             double timeout_s);
/* etcd: removes every key of the job with this token (node 0's launcher,
 * at its end); the built-in store: nothing to do. */
int dt_elastic_store_clear(const char *host, int port, const char *token, double timeout_s);

/* Launchers: a spare is woken (delta 1; -1 if the wake failed), before
 * the loss it replaces is reported. */
int dt_elastic_spare_coming(dt_store *st, const char *job, int delta, double timeout_s);
/* Launchers: member id's process died (bumps the change counter first). */
int dt_elastic_report_dead(dt_store *st, const char *job, int id, double timeout_s);

#endif /* DT_ELASTIC_H */
