/*
 * comm_test_util.h — helpers shared by the comm tests: run one body on N
 * ranks as threads (each rank with its own store client and communicator,
 * over any transport), deterministic exact-valued inputs and references.
 * Header-only (static) so each test stays one executable.
 */
#ifndef DT_COMM_TEST_UTIL_H
#define DT_COMM_TEST_UTIL_H

#define _GNU_SOURCE
#include "comm/comm.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*rank_body)(dt_comm *c, void *arg, char *fail, size_t cap);

struct rank_ctx {
  int rank, size;
  const char *transport;
  const char *job;
  int port;
  double timeout;
  rank_body body;
  void *arg;
  int rc;
  char fail[512];
  dt_comm *comm;
  int host_mod; /* > 0: pretend rank r lives on host "h<r / host_mod>" */
};

static void *rank_main(void *p) {
  struct rank_ctx *r = p;
  dt_store *s = NULL;
  r->rc = dt_store_connect(&s, "127.0.0.1", r->port, NULL, 10);
  if (r->rc < 0) {
    snprintf(r->fail, sizeof r->fail, "store connect: %s", dt_errmsg());
    return NULL;
  }
  struct dt_comm_config cfg = DT_COMM_CONFIG_INIT;
  cfg.transport = r->transport;
  cfg.rank = r->rank;
  cfg.size = r->size;
  cfg.job = r->job;
  cfg.timeout_s = r->timeout;
  char host[32];
  if (r->host_mod > 0) {
    snprintf(host, sizeof host, "h%d", r->rank / r->host_mod);
    cfg.host_id = host;
  }
  r->rc = dt_comm_create(&r->comm, s, &cfg);
  dt_store_destroy(s);
  if (r->rc < 0) {
    snprintf(r->fail, sizeof r->fail, "comm create: %s", dt_errmsg());
    return NULL;
  }
  r->rc = r->body(r->comm, r->arg, r->fail, sizeof r->fail);
  dt_comm_destroy(r->comm);
  return NULL;
}

/* Runs body on n ranks (threads). Returns the number of ranks that failed;
 * their messages are printed. rcs (may be NULL) receives each rank's rc. */
__attribute__((unused)) static int g_host_mod; /* copied into every rank_ctx by run_ranks */
__attribute__((unused)) static int run_ranks(const char *transport, int n, double timeout, rank_body body, void *arg,
                     int *rcs, char (*msgs)[512]) {
  static atomic_int job_ctr;
  dt_store_server *srv;
  if (dt_store_server_start(&srv, "127.0.0.1", 0, NULL) < 0) {
    fprintf(stderr, "store server: %s\n", dt_errmsg());
    return n;
  }
  char job[64];
  snprintf(job, sizeof job, "job%d", atomic_fetch_add(&job_ctr, 1));
  struct rank_ctx *r = calloc((size_t)n, sizeof *r);
  pthread_t *th = calloc((size_t)n, sizeof *th);
  for (int i = 0; i < n; i++) {
    r[i] = (struct rank_ctx){i, n, transport, job, dt_store_server_port(srv), timeout, body, arg, 0, "", NULL, g_host_mod};
    pthread_create(&th[i], NULL, rank_main, &r[i]);
  }
  int bad = 0;
  for (int i = 0; i < n; i++) {
    pthread_join(th[i], NULL);
    if (rcs) rcs[i] = r[i].rc;
    if (msgs) snprintf(msgs[i], 512, "%s", r[i].fail);
    if (r[i].rc < 0 || r[i].fail[0]) {
      if (!rcs) fprintf(stderr, "[%s n=%d rank %d] rc=%d %s\n", transport, n, i, r[i].rc, r[i].fail);
      bad++;
    }
  }
  free(r);
  free(th);
  dt_store_server_stop(srv);
  return bad;
}

/* Input element i of rank r as a small integer in [-5, 5] (per seed). Small
 * integers are exact in every dtype (bf16 has 8 significant bits, f16 11),
 * and so are their sums over <= 8 ranks (|sum| <= 40), so the reduction is
 * exact in any order and results can be compared bit for bit. */
static int small_val(int r, size_t i, int seed) { return (int)((r * 7 + i * 3 + (size_t)seed * 5) % 11) - 5; }

static void store_val(void *buf, size_t i, dt_dtype t, double v) {
  switch (t) {
  case DT_F32: ((float *)buf)[i] = (float)v; break;
  case DT_F64: ((double *)buf)[i] = v; break;
  case DT_BF16: ((uint16_t *)buf)[i] = dt_f32_to_bf16((float)v); break;
  case DT_F16: ((uint16_t *)buf)[i] = dt_f32_to_f16((float)v); break;
  case DT_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
  case DT_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
  case DT_U8: ((uint8_t *)buf)[i] = (uint8_t)(int)v; break;
  default: break;
  }
}

__attribute__((unused)) static void fill_input(void *buf, size_t count, dt_dtype t, int r, int seed) {
  for (size_t i = 0; i < count; i++) store_val(buf, i, t, small_val(r, i, seed));
}

/* Reference allreduce of fill_input over n ranks: exact sum/min/max in
 * int64, then the same final step the library applies (AVG: divide in the
 * dtype's arithmetic, halves via f32, integers truncating). */
__attribute__((unused)) static void reference(void *out, size_t count, dt_dtype t, dt_redop op, int n, int seed) {
  for (size_t i = 0; i < count; i++) {
    int64_t acc = small_val(0, i, seed);
    for (int r = 1; r < n; r++) {
      int64_t v = small_val(r, i, seed);
      if (op == DT_OP_MIN) acc = v < acc ? v : acc;
      else if (op == DT_OP_MAX) acc = v > acc ? v : acc;
      else acc += v;
    }
    store_val(out, i, t, (double)acc);
  }
  dt__reduce_finish(out, count, t, op, n);
}
#endif
