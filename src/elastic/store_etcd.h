/*
 * store_etcd.h — the one parser of etcd's replies the etcd store
 * (store_etcd.c) exposes, for its fuzz target (tests/fuzz/fuzz_elastic_etcd.c):
 * a /v3/kv/range reply. The store itself is reached through
 * dt_elastic_store_connect (elastic.h).
 */
#ifndef DT_ELASTIC_STORE_ETCD_H
#define DT_ELASTIC_STORE_ETCD_H

#include <stddef.h>
#include <stdint.h>

/* The first key of a range reply (n bytes of JSON text): *found, its value
 * (malloc'd, *vlen bytes; NULL when not found) and mod_revision.
 * DT_EPROTO with a message for a reply that is not JSON, a kvs[0] that is
 * not an object, a value that is not a string of base64, a negative
 * revision; then *found is 0 and *val NULL. */
int dt__etcd_range_reply(const char *text, size_t n, int *found, unsigned char **val,
                         size_t *vlen, int64_t *modrev);

#endif
