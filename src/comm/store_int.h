/*
 * store_int.h — internals shared by the store client (store.c), the TCP
 * store server (store_server.c), the file store (store_file.c) and the
 * store-protocol fuzz target: the backend table. The wire message and the
 * challenge-response are in wire.h.
 */
#ifndef DT_COMM_STORE_INT_H
#define DT_COMM_STORE_INT_H

#include "comm/comm.h"
#include "comm/wire.h" /* the store message codec and auth */

/* A store backend. `self` is the backend's state. All calls are already
 * serialised by store.c. */
struct dt_store_backend {
  const char *name;
  int (*set)(void *self, const char *key, const void *val, size_t len, double timeout_s);
  /* wait: if buf == NULL only waits for existence. */
  int (*get)(void *self, const char *key, void *buf, size_t cap, size_t *len, double timeout_s);
  int (*add)(void *self, const char *key, int64_t delta, int64_t *result, double timeout_s);
  int (*cas)(void *self, const char *key, const void *exp, size_t elen, const void *des,
             size_t dlen, bool *swapped, void *cur, size_t cap, size_t *curlen, double timeout_s);
  int (*del)(void *self, const char *key, bool *existed, double timeout_s);
  void (*destroy)(void *self);
  /* Optional, called without the store's lock from any thread: the call in
   * progress (if any) and every later one fail at once (dt_store_interrupt). */
  void (*interrupt)(void *self);
};

int dt__store_wrap(dt_store **out, const struct dt_store_backend *be, void *self);
/* Runs fn(self, arg) under the store's lock if s is a store of backend be
 * (a backend's own operations beyond the table: etcd's leases); else
 * DT_ENOTSUP. */
int dt__store_with(dt_store *s, const struct dt_store_backend *be, int (*fn)(void *self, void *arg),
                   void *arg);

/* Shared semantics of the in-memory table (server and file store): applies
 * compare-and-set to a current value. */
bool dt__kv_cas_match(const void *cur, size_t curlen, bool exists, const void *exp, size_t elen);

#endif
