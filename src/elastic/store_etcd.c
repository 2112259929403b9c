/*
 * store_etcd.c — the store backed by etcd (docs/elastic.md "etcd"): the
 * same set/get/add/cas/delete as the built-in TCP store, spoken to etcd's v3
 * JSON gateway (POST /v3/kv/put, /range, /txn, /deleterange) over HTTP with
 * libcurl, which it loads at run time (dlopen of libcurl.so.4: the library
 * and its static link do not depend on it; without it an etcd store is
 * refused with a message). Keys live under "/dtrain/<first 16 hex of SHA-256(token)>/", so
 * jobs with different tokens share one etcd without meeting; values and
 * keys travel base64-encoded as the gateway wants.
 *
 * compare-and-set is one txn comparing the value (or create_revision 0 for
 * "missing"); add reads the counter and writes it back in a txn guarded by
 * its mod_revision, again until it wins; get waits by polling with a
 * growing pause (1 to 20 ms) until the key exists or the deadline passes.
 * Every request carries a libcurl timeout no later than the caller's
 * deadline.
 *
 * Leases carry the elastic layer's heartbeats (dt__etcd_lease_*: a lease
 * per member, its heartbeat key attached, kept alive by the member's
 * watcher; the key's disappearance is the member's loss). It does not use
 * watches and does not authenticate to etcd (run it on a trusted network,
 * or with client certificates in front of it).
 */
#include "comm/store_int.h" /* the store's backend table */
#include "elastic/elastic.h"
#include "elastic/store_etcd.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <dlfcn.h>
#include <errno.h>
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct etcd {
  CURL *h;
  char url[300];          /* http://host:port */
  char prefix[64];        /* "/dtrain/<hex16>/" */
  char *body;             /* the last reply */
  size_t blen, bcap;
  struct curl_slist *hdr;
};

/* libcurl's functions, resolved once */
static struct {
  CURLcode (*global_init)(long);
  CURL *(*init)(void);
  CURLcode (*setopt)(CURL *, CURLoption, ...);
  CURLcode (*perform)(CURL *);
  CURLcode (*getinfo)(CURL *, CURLINFO, ...);
  const char *(*strerror)(CURLcode);
  void (*cleanup)(CURL *);
  struct curl_slist *(*slist_append)(struct curl_slist *, const char *);
  void (*slist_free_all)(struct curl_slist *);
  int ok;
  char why[200];
} cu;
static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init(void) {
  void *h = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
  if (!h) h = dlopen("libcurl.so", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(cu.why, sizeof cu.why, "%s", dlerror());
    return;
  }
#define SYM(f, n) *(void **)&cu.f = dlsym(h, n)
  SYM(global_init, "curl_global_init");
  SYM(init, "curl_easy_init");
  SYM(setopt, "curl_easy_setopt");
  SYM(perform, "curl_easy_perform");
  SYM(getinfo, "curl_easy_getinfo");
  SYM(strerror, "curl_easy_strerror");
  SYM(cleanup, "curl_easy_cleanup");
  SYM(slist_append, "curl_slist_append");
  SYM(slist_free_all, "curl_slist_free_all");
#undef SYM
  cu.ok = cu.global_init && cu.init && cu.setopt && cu.perform && cu.getinfo && cu.strerror &&
          cu.cleanup && cu.slist_append && cu.slist_free_all;
  if (!cu.ok) snprintf(cu.why, sizeof cu.why, "libcurl lacks a function dtrain needs");
  else cu.global_init(CURL_GLOBAL_DEFAULT);
}

static size_t on_data(char *p, size_t sz, size_t n, void *ud) {
  struct etcd *c = ud;
  size_t k = sz * n;
  if (c->blen + k + 1 > c->bcap) {
    size_t cap = (c->blen + k + 1) * 2;
    char *b = realloc(c->body, cap);
    if (!b) return 0;
    c->body = b, c->bcap = cap;
  }
  memcpy(c->body + c->blen, p, k);
  c->blen += k;
  c->body[c->blen] = '\0';
  return k;
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

/* base64 of n bytes (malloc'd, NUL-terminated). */
static char *b64(const void *p, size_t n) {
  char *o = malloc(4 * ((n + 2) / 3) + 1);
  if (o) EVP_EncodeBlock((unsigned char *)o, p, (int)n);
  return o;
}

/* Decodes base64 s into out (malloc'd), *n its length. */
static int unb64(const char *s, unsigned char **out, size_t *n) {
  size_t l = strlen(s);
  if (l % 4) return dt__seterr(DT_EPROTO, "etcd store: base64 of %zu characters in a reply", l);
  unsigned char *o = malloc(l / 4 * 3 + 3);
  if (!o) return dt__seterr(DT_ENOMEM, "etcd store: out of memory");
  int k = l ? EVP_DecodeBlock(o, (const unsigned char *)s, (int)l) : 0;
  if (k < 0) {
    free(o);
    return dt__seterr(DT_EPROTO, "etcd store: bad base64 in a reply");
  }
  if (l >= 1 && s[l - 1] == '=') k--;
  if (l >= 2 && s[l - 2] == '=') k--;
  *out = o;
  *n = (size_t)k;
  return DT_OK;
}

/* The full key (prefix + key) in base64. */
static char *fkey(const struct etcd *c, const char *key) {
  size_t n = strlen(c->prefix) + strlen(key);
  char *k = malloc(n + 1);
  if (!k) return NULL;
  snprintf(k, n + 1, "%s%s", c->prefix, key);
  char *e = b64(k, n);
  free(k);
  return e;
}

/* POSTs JSON body j (freed here) to /v3/<path>; *out is the parsed reply.
 * A request that could not connect (etcd restarting: nothing was sent) is
 * tried again until the deadline; so is any transport failure of an
 * idempotent one (a range, a keep-alive), never of a write whose outcome
 * is unknown. */
static int call_idem(struct etcd *c, const char *path, cJSON *j, double deadline, int idem,
                     cJSON **out) {
  *out = NULL;
  char *txt = j ? cJSON_PrintUnformatted(j) : NULL;
  cJSON_Delete(j);
  if (!txt) return dt__seterr(DT_ENOMEM, "etcd store: out of memory");
  char url[400];
  snprintf(url, sizeof url, "%s/v3/%s", c->url, path);
  CURLcode cc;
  double pause = 0.02;
  for (;;) {
    double left = deadline - dt_now();
    long ms = left > 0.05 ? (long)(left * 1000) : 50;
    c->blen = 0;
    if (c->body) c->body[0] = '\0';
    cu.setopt(c->h, CURLOPT_URL, url);
    cu.setopt(c->h, CURLOPT_POSTFIELDS, txt);
    cu.setopt(c->h, CURLOPT_TIMEOUT_MS, ms);
    cu.setopt(c->h, CURLOPT_CONNECTTIMEOUT_MS, ms);
    cc = cu.perform(c->h);
    int again = cc == CURLE_COULDNT_CONNECT ||
                (idem && cc != CURLE_OK && cc != CURLE_OPERATION_TIMEDOUT);
    if (!again || dt_now() + pause >= deadline) break;
    sleep_s(pause);
    if (pause < 0.2) pause *= 2;
  }
  free(txt);
  if (cc != CURLE_OK)
    return dt__seterr(cc == CURLE_OPERATION_TIMEDOUT ? DT_ETIMEDOUT : DT_EIO,
                      "etcd store %s: %s: %s", c->url, path, cu.strerror(cc));
  long code = 0;
  cu.getinfo(c->h, CURLINFO_RESPONSE_CODE, &code);
  if (code != 200)
    return dt__seterr(DT_EIO, "etcd store %s: %s: HTTP %ld: %.200s", c->url, path, code,
                      c->body ? c->body : "");
  *out = cJSON_Parse(c->body ? c->body : "");
  if (!*out) return dt__seterr(DT_EPROTO, "etcd store %s: %s: reply is not JSON", c->url, path);
  return DT_OK;
}

static int call(struct etcd *c, const char *path, cJSON *j, double deadline, cJSON **out) {
  return call_idem(c, path, j, deadline, 0, out);
}

/* A revision field: etcd's gateway sends int64 as a JSON string, a number is
 * taken too; -1 when it is out of int64's range (a cast would be undefined). */
static int64_t jint(const cJSON *o, const char *name) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
  if (cJSON_IsString(v)) {
    errno = 0;
    long long x = strtoll(v->valuestring, NULL, 10);
    return errno == ERANGE ? -1 : (int64_t)x;
  }
  if (cJSON_IsNumber(v)) {
    double d = v->valuedouble;
    return d >= -9.2e18 && d <= 9.2e18 ? (int64_t)d : -1;
  }
  return 0;
}

/* The key's value (malloc'd) and mod_revision; *found 0 when missing. */
static int range(struct etcd *c, const char *key, double deadline, int *found,
                 unsigned char **val, size_t *vlen, int64_t *modrev) {
  *found = 0;
  *val = NULL;
  *vlen = 0;
  *modrev = 0;
  char *k = fkey(c, key);
  cJSON *j = cJSON_CreateObject();
  if (!k || !j || !cJSON_AddStringToObject(j, "key", k)) {
    free(k);
    cJSON_Delete(j);
    return dt__seterr(DT_ENOMEM, "etcd store: out of memory");
  }
  free(k);
  cJSON *r;
  DT_CHECK(call_idem(c, "kv/range", j, deadline, 1, &r));
  cJSON_Delete(r);
  return dt__etcd_range_reply(c->body, c->blen, found, val, vlen, modrev);
}

int dt__etcd_range_reply(const char *text, size_t n, int *found, unsigned char **val,
                         size_t *vlen, int64_t *modrev) {
  *found = 0;
  *val = NULL;
  *vlen = 0;
  *modrev = 0;
  cJSON *r = cJSON_ParseWithLength(text, n);
  if (!r) return dt__seterr(DT_EPROTO, "etcd store: range reply is not JSON");
  const cJSON *kvs = cJSON_GetObjectItemCaseSensitive(r, "kvs");
  const cJSON *kv = cJSON_IsArray(kvs) ? cJSON_GetArrayItem(kvs, 0) : NULL;
  int rc = DT_OK;
  if (kv && !cJSON_IsObject(kv)) {
    rc = dt__seterr(DT_EPROTO, "etcd store: range reply: kvs[0] is not an object");
  } else if (kv) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(kv, "value");
    *found = 1;
    *modrev = jint(kv, "mod_revision");
    if (v && !cJSON_IsString(v)) rc = dt__seterr(DT_EPROTO, "etcd store: range reply: value is not a string");
    else rc = unb64(v ? v->valuestring : "", val, vlen);
    if (rc == DT_OK && *modrev < 0) {
      free(*val);
      *val = NULL;
      rc = dt__seterr(DT_EPROTO, "etcd store: range reply: mod_revision %lld", (long long)*modrev);
    }
  }
  if (rc < 0) *found = 0;
  cJSON_Delete(r);
  return rc;
}

static int e_set(void *self, const char *key, const void *val, size_t len, double t) {
  struct etcd *c = self;
  char *k = fkey(c, key), *v = b64(val, len);
  cJSON *j = cJSON_CreateObject();
  int ok = k && v && j && cJSON_AddStringToObject(j, "key", k) && cJSON_AddStringToObject(j, "value", v);
  free(k);
  free(v);
  if (!ok) {
    cJSON_Delete(j);
    return dt__seterr(DT_ENOMEM, "etcd store: out of memory");
  }
  cJSON *r;
  DT_CHECK(call(c, "kv/put", j, dt_now() + t, &r));
  cJSON_Delete(r);
  return DT_OK;
}

static int e_get(void *self, const char *key, void *buf, size_t cap, size_t *len, double t) {
  struct etcd *c = self;
  const double deadline = dt_now() + t;
  double pause = 0.001;
  for (;;) {
    int found;
    unsigned char *v;
    size_t n;
    int64_t mr;
    DT_CHECK(range(c, key, deadline, &found, &v, &n, &mr));
    if (found) {
      *len = n;
      if (buf && cap) memcpy(buf, v, n < cap ? n : cap);
      free(v);
      if (buf && cap && n > cap)
        return dt__seterr(DT_ERANGE, "store: value of '%s' is %zu bytes, buffer %zu", key, n, cap);
      return !buf || !cap ? (n ? DT_ERANGE : DT_OK) : DT_OK;
    }
    if (dt_now() + pause > deadline)
      return dt__seterr(DT_ETIMEDOUT, "etcd store %s: key '%s' not set before the deadline",
                        c->url, key);
    sleep_s(pause);
    if (pause < 0.02) pause *= 2;
  }
}

/* One txn: if the key's value equals exp (exp NULL: it is missing; modrev
 * > 0: its mod_revision equals modrev instead) put des; *ok says whether it
 * did. */
static int txn(struct etcd *c, const char *key, const void *exp, size_t elen, int64_t modrev,
               const void *des, size_t dlen, double deadline, int *ok) {
  char *k = fkey(c, key), *d = b64(des, dlen), *e = exp ? b64(exp, elen) : NULL, rev[32];
  cJSON *j = cJSON_CreateObject(), *cmp = cJSON_AddArrayToObject(j, "compare"),
        *succ = cJSON_AddArrayToObject(j, "success"), *c0 = cJSON_CreateObject(),
        *op = cJSON_CreateObject(), *put = cJSON_CreateObject();
  int good = k && d && (e || !exp) && j && cmp && succ && c0 && op && put;
  if (good) {
    cJSON_AddItemToArray(cmp, c0);
    cJSON_AddStringToObject(c0, "key", k);
    cJSON_AddStringToObject(c0, "result", "EQUAL");
    if (modrev > 0) {
      snprintf(rev, sizeof rev, "%lld", (long long)modrev);
      cJSON_AddStringToObject(c0, "target", "MOD");
      cJSON_AddStringToObject(c0, "mod_revision", rev);
    } else if (!exp) {
      cJSON_AddStringToObject(c0, "target", "CREATE");
      cJSON_AddStringToObject(c0, "create_revision", "0");
    } else {
      cJSON_AddStringToObject(c0, "target", "VALUE");
      cJSON_AddStringToObject(c0, "value", e);
    }
    cJSON_AddItemToArray(succ, op);
    cJSON_AddItemToObject(op, "request_put", put);
    cJSON_AddStringToObject(put, "key", k);
    cJSON_AddStringToObject(put, "value", d);
    c0 = op = put = NULL;
  }
  free(k), free(d), free(e);
  cJSON_Delete(c0), cJSON_Delete(op), cJSON_Delete(put);
  if (!good) {
    cJSON_Delete(j);
    return dt__seterr(DT_ENOMEM, "etcd store: out of memory");
  }
  cJSON *r;
  DT_CHECK(call(c, "kv/txn", j, deadline, &r));
  *ok = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "succeeded"));
  cJSON_Delete(r);
  return DT_OK;
}

static int e_add(void *self, const char *key, int64_t d, int64_t *res, double t) {
  struct etcd *c = self;
  const double deadline = dt_now() + t;
  for (;;) {
    int found, ok;
    unsigned char *v;
    size_t n;
    int64_t mr;
    DT_CHECK(range(c, key, deadline, &found, &v, &n, &mr));
    char num[32];
    snprintf(num, sizeof num, "%.*s", (int)(n < 31 ? n : 31), v ? (const char *)v : "");
    free(v);
    long long cur = found ? strtoll(num, NULL, 10) : 0;
    if (d == 0) {
      *res = cur;
      return DT_OK;
    }
    int len = snprintf(num, sizeof num, "%lld", cur + (long long)d);
    DT_CHECK(txn(c, key, found ? "" : NULL, 0, found ? mr : 0, num, (size_t)len, deadline, &ok));
    if (ok) {
      *res = cur + d;
      return DT_OK;
    }
    if (dt_now() > deadline)
      return dt__seterr(DT_ETIMEDOUT, "etcd store %s: add to '%s' kept losing races until the "
                        "deadline", c->url, key);
  }
}

static int e_cas(void *self, const char *key, const void *exp, size_t elen, const void *des,
                 size_t dlen, bool *swapped, void *cur, size_t cap, size_t *curlen, double t) {
  struct etcd *c = self;
  const double deadline = dt_now() + t;
  int ok;
  DT_CHECK(txn(c, key, exp ? exp : NULL, elen, 0, des, dlen, deadline, &ok));
  *swapped = ok;
  if (ok) {
    *curlen = dlen;
    if (cur && cap) memcpy(cur, des, dlen < cap ? dlen : cap);
    return DT_OK;
  }
  int found;
  unsigned char *v;
  size_t n;
  int64_t mr;
  DT_CHECK(range(c, key, deadline, &found, &v, &n, &mr));
  *curlen = n;
  if (cur && cap && v) memcpy(cur, v, n < cap ? n : cap);
  free(v);
  return DT_OK;
}

static int e_del(void *self, const char *key, bool *existed, double t) {
  struct etcd *c = self;
  char *k = fkey(c, key);
  cJSON *j = cJSON_CreateObject();
  if (!k || !j || !cJSON_AddStringToObject(j, "key", k)) {
    free(k);
    cJSON_Delete(j);
    return dt__seterr(DT_ENOMEM, "etcd store: out of memory");
  }
  free(k);
  cJSON *r;
  DT_CHECK(call(c, "kv/deleterange", j, dt_now() + t, &r));
  *existed = jint(r, "deleted") > 0;
  cJSON_Delete(r);
  return DT_OK;
}

static void e_destroy(void *self) {
  struct etcd *c = self;
  if (!c) return;
  if (c->h) cu.cleanup(c->h);
  if (c->hdr) cu.slist_free_all(c->hdr);
  free(c->body);
  free(c);
}

static const struct dt_store_backend etcd_backend = {"etcd", e_set, e_get, e_add, e_cas, e_del,
                                                     e_destroy, NULL};

static int etcd_open(struct etcd **out, const char *host, int port, const char *token) {
  pthread_once(&curl_once, curl_init);
  if (!cu.ok)
    return dt__seterr(DT_ENOTSUP, "etcd store %s:%d: needs libcurl (Debian: libcurl4): %s", host,
                      port, cu.why);
  struct etcd *c = calloc(1, sizeof *c);
  if (!c) return dt__seterr(DT_ENOMEM, "etcd store: out of memory");
  snprintf(c->url, sizeof c->url, "http://%s:%d", host, port);
  unsigned char h[32];
  const char *t = token ? token : "";
  SHA256((const unsigned char *)t, strlen(t), h);
  int n = snprintf(c->prefix, sizeof c->prefix, "/dtrain/");
  for (int i = 0; i < 8; i++) n += snprintf(c->prefix + n, sizeof c->prefix - (size_t)n, "%02x", h[i]);
  snprintf(c->prefix + n, sizeof c->prefix - (size_t)n, "/");
  c->h = cu.init();
  c->hdr = cu.slist_append(NULL, "Content-Type: application/json");
  if (!c->h || !c->hdr) {
    e_destroy(c);
    return dt__seterr(DT_ENOMEM, "etcd store: cannot make a libcurl handle");
  }
  cu.setopt(c->h, CURLOPT_HTTPHEADER, c->hdr);
  cu.setopt(c->h, CURLOPT_WRITEFUNCTION, on_data);
  cu.setopt(c->h, CURLOPT_WRITEDATA, c);
  cu.setopt(c->h, CURLOPT_NOSIGNAL, 1L);
  cu.setopt(c->h, CURLOPT_TCP_NODELAY, 1L);
  *out = c;
  return DT_OK;
}

static int connect_etcd(dt_store **out, const char *host, int port, const char *token,
                        double timeout_s) {
  struct etcd *c;
  DT_CHECK(etcd_open(&c, host, port, token));
  /* reachable now? (retried until the deadline: etcd may still be starting) */
  const double deadline = dt_now() + (timeout_s > 0 ? timeout_s : 60);
  double pause = 0.01;
  for (;;) {
    int found;
    unsigned char *v;
    size_t n;
    int64_t mr;
    int rc = range(c, "ping", deadline, &found, &v, &n, &mr);
    free(v);
    if (rc == DT_OK) break;
    if (dt_now() + pause > deadline) {
      char why[300];
      snprintf(why, sizeof why, "%s", dt_errmsg());
      e_destroy(c);
      return dt__seterr(DT_ETIMEDOUT, "etcd store %s:%d: not reachable: %s", host, port, why);
    }
    sleep_s(pause);
    if (pause < 0.2) pause *= 2;
  }
  return dt__store_wrap(out, &etcd_backend, c);
}

/* ---- leases: the elastic layer's heartbeats (store_etcd.h) ---------------------- */

struct lease_arg {
  int64_t id, ttl;    /* in: the lease (keepalive, put, revoke) or the TTL asked (grant) */
  const char *key, *val;
  double t;
  int64_t out;        /* grant: the lease; keepalive: the TTL left (0: expired) */
  int found;          /* exists */
};

static cJSON *id_req(int64_t id) {
  char v[32];
  snprintf(v, sizeof v, "%lld", (long long)id);
  cJSON *j = cJSON_CreateObject();
  if (j && !cJSON_AddStringToObject(j, "ID", v)) cJSON_Delete(j), j = NULL;
  return j;
}

static int do_grant(void *self, void *arg) {
  struct etcd *c = self;
  struct lease_arg *a = arg;
  cJSON *j = cJSON_CreateObject(), *r;
  if (!j || !cJSON_AddNumberToObject(j, "TTL", (double)a->ttl)) {
    cJSON_Delete(j);
    return dt__seterr(DT_ENOMEM, "etcd store: out of memory");
  }
  DT_CHECK(call(c, "lease/grant", j, dt_now() + a->t, &r));
  a->out = jint(r, "ID");
  cJSON_Delete(r);
  if (a->out <= 0) return dt__seterr(DT_EPROTO, "etcd store %s: lease/grant: no lease ID", c->url);
  return DT_OK;
}

static int do_keepalive(void *self, void *arg) {
  struct etcd *c = self;
  struct lease_arg *a = arg;
  cJSON *j = id_req(a->id), *r;
  if (!j) return dt__seterr(DT_ENOMEM, "etcd store: out of memory");
  DT_CHECK(call_idem(c, "lease/keepalive", j, dt_now() + a->t, 1, &r));
  /* {"result":{..., "ID":"..", "TTL":"2"}}; no TTL: the lease is gone */
  const cJSON *res = cJSON_GetObjectItemCaseSensitive(r, "result");
  int ok = cJSON_IsObject(res);
  a->out = ok ? jint(res, "TTL") : 0;
  cJSON_Delete(r);
  if (!ok) return dt__seterr(DT_EPROTO, "etcd store %s: lease/keepalive: no result", c->url);
  return DT_OK;
}

static int do_put_leased(void *self, void *arg) {
  struct etcd *c = self;
  struct lease_arg *a = arg;
  char *k = fkey(c, a->key), *v = b64(a->val, strlen(a->val)), id[32];
  snprintf(id, sizeof id, "%lld", (long long)a->id);
  cJSON *j = cJSON_CreateObject(), *r;
  int ok = k && v && j && cJSON_AddStringToObject(j, "key", k) &&
           cJSON_AddStringToObject(j, "value", v) && cJSON_AddStringToObject(j, "lease", id);
  free(k);
  free(v);
  if (!ok) {
    cJSON_Delete(j);
    return dt__seterr(DT_ENOMEM, "etcd store: out of memory");
  }
  DT_CHECK(call(c, "kv/put", j, dt_now() + a->t, &r));
  cJSON_Delete(r);
  return DT_OK;
}

static int do_exists(void *self, void *arg) {
  struct etcd *c = self;
  struct lease_arg *a = arg;
  unsigned char *v = NULL;
  size_t n;
  int64_t mr;
  int rc = range(c, a->key, dt_now() + a->t, &a->found, &v, &n, &mr);
  free(v);
  return rc;
}

static int noop(void *self, void *arg) {
  (void)self, (void)arg;
  return DT_OK;
}

int dt__etcd_is(dt_store *st) {
  return dt__store_with(st, &etcd_backend, noop, NULL) == DT_OK;
}

static int with(dt_store *st, int (*fn)(void *, void *), struct lease_arg *a) {
  int rc = dt__store_with(st, &etcd_backend, fn, a);
  if (rc == DT_ENOTSUP) return dt__seterr(DT_ENOTSUP, "leases need the etcd store");
  return rc;
}

int dt__etcd_lease_grant(dt_store *st, int ttl_s, double t, int64_t *id) {
  struct lease_arg a = {.ttl = ttl_s, .t = t};
  DT_CHECK(with(st, do_grant, &a));
  *id = a.out;
  return DT_OK;
}

int dt__etcd_lease_keepalive(dt_store *st, int64_t id, double t, int64_t *ttl_left) {
  struct lease_arg a = {.id = id, .t = t};
  DT_CHECK(with(st, do_keepalive, &a));
  *ttl_left = a.out;
  return DT_OK;
}

int dt__etcd_put_leased(dt_store *st, const char *key, const char *val, int64_t lease, double t) {
  struct lease_arg a = {.id = lease, .key = key, .val = val, .t = t};
  return with(st, do_put_leased, &a);
}

int dt__etcd_exists(dt_store *st, const char *key, double t, int *found) {
  struct lease_arg a = {.key = key, .t = t};
  DT_CHECK(with(st, do_exists, &a));
  *found = a.found;
  return DT_OK;
}

int dt_elastic_store_connect(dt_store **out, const char *host, int port, const char *token,
                             double timeout_s) {
  if (host && !strncmp(host, "etcd://", 7)) return connect_etcd(out, host + 7, port, token, timeout_s);
  return dt_store_connect(out, host, port, token, timeout_s);
}

int dt_elastic_store_clear(const char *host, int port, const char *token, double timeout_s) {
  if (!host || strncmp(host, "etcd://", 7)) return DT_OK; /* the built-in store ends with its job */
  host += 7;
  struct etcd *c;
  DT_CHECK(etcd_open(&c, host, port, token));
  /* every key of the job: [prefix, prefix with its last byte + 1) */
  size_t n = strlen(c->prefix);
  char end[64];
  memcpy(end, c->prefix, n + 1);
  end[n - 1]++;
  char *k = b64(c->prefix, n), *e = b64(end, n);
  cJSON *j = cJSON_CreateObject();
  int ok = k && e && j && cJSON_AddStringToObject(j, "key", k) &&
           cJSON_AddStringToObject(j, "range_end", e);
  free(k);
  free(e);
  if (!ok) {
    cJSON_Delete(j);
    e_destroy(c);
    return dt__seterr(DT_ENOMEM, "etcd store: out of memory");
  }
  cJSON *r = NULL;
  int rc = call(c, "kv/deleterange", j, dt_now() + (timeout_s > 0 ? timeout_s : 60), &r);
  cJSON_Delete(r);
  e_destroy(c);
  return rc;
}
