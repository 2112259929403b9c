/*
 * store_etcd.h — what the etcd store (store_etcd.c) exposes besides the
 * store table: the parser of a /v3/kv/range reply, for its fuzz target
 * (tests/fuzz/fuzz_elastic_etcd.c), and the leases the elastic layer's
 * heartbeats use. The store itself is reached through
 * dt_elastic_store_connect (elastic.h).
 */
#ifndef DT_ELASTIC_STORE_ETCD_H
#define DT_ELASTIC_STORE_ETCD_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"

/* The first key of a range reply (n bytes of JSON text): *found, its value
 * (malloc'd, *vlen bytes; NULL when not found) and mod_revision.
 * DT_EPROTO with a message for a reply that is not JSON, a kvs[0] that is
 * not an object, a value that is not a string of base64, a negative
 * revision; then *found is 0 and *val NULL. */
int dt__etcd_range_reply(const char *text, size_t n, int *found, unsigned char **val,
                         size_t *vlen, int64_t *modrev);

/* Leases (the elastic layer's heartbeats): each returns DT_ENOTSUP when st
 * is not an etcd store, else DT_OK or the request's error. t: seconds.
 * dt__etcd_is: 1 for an etcd store. keepalive: *ttl_left is the lease's
 * TTL after the renewal, 0 once it has expired (the member is lost).
 * put_leased: key = val (a C string), deleted by etcd when the lease ends.
 * exists: *found 0 when the key is missing (its lease expired). */
int dt__etcd_is(dt_store *st);
int dt__etcd_lease_grant(dt_store *st, int ttl_s, double t, int64_t *id);
int dt__etcd_lease_keepalive(dt_store *st, int64_t id, double t, int64_t *ttl_left);
int dt__etcd_put_leased(dt_store *st, const char *key, const char *val, int64_t lease, double t);
int dt__etcd_exists(dt_store *st, const char *key, double t, int *found);

#endif
