/*
 * http_mhd.c — the metrics endpoint: libmicrohttpd on one address (loopback
 * unless the user names another), GET /metrics answered with the
 * exposition of every local rank's page read at that moment (expo.c), any
 * other path 404, any other method 405. One internal polling thread; a
 * scrape reads n small files and formats them (well under a millisecond
 * for a few ranks). Each node's launcher (under mpirun/srun: each host's
 * first rank) serves its own ranks; it also answers GET /pages with their
 * raw pages, and a server given peers (under mpirun/srun: rank 0's, one
 * peer per other host) fetches and adds those at every scrape, so one
 * target can show the whole job.
 * Built into the dtrain binary only (CMakeLists.txt: *_mhd.c), not into
 * libdtrain.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "obs/obs_diag.h"

#define MAX_PEERS 64
#define MAX_PEER_PAGES 64 /* ranks one other host may contribute */

struct dt_obs_server {
  struct MHD_Daemon *d;
  char dir[4096];
  int *ranks, n, port;
  pthread_mutex_t mu; /* the peers */
  int npeers;
  struct sockaddr_in peer[MAX_PEERS];
};

/* This server's own ranks' pages, read now: a rank not started yet, a
 * page whose rank moved on to another number (elastic re-forming: obs.h
 * dt_obs_rerank), a rank whose process is gone (its last values would
 * stay forever) are left out. pg holds s->n. Returns how many. */
static int local_pages(struct dt_obs_server *s, struct dt_obs_page *pg) {
  int got = 0;
  for (int i = 0; i < s->n; i++) {
    char p[4200];
    dt__obs_rank_path(s->dir, s->ranks[i], p, sizeof p);
    if (dt__obs_read(p, &pg[got]) == DT_OK && pg[got].rank == s->ranks[i] &&
        !strchr("XZ", dt__obs_proc_state(pg[got].pid)))
      got++;
  }
  return got;
}

/* GET /pages of another host's server into pg (room for MAX_PEER_PAGES):
 * 1 s to connect, 1 s per read; a peer that does not answer is left out of
 * this scrape. Returns how many pages, or < 0. */
static int parse_addr(const char *addr, struct sockaddr_in *sa);

/* The X-Dtrain-States header of an answer to GET /pages: one letter per
 * page, its process's state on that host (/proc/PID/stat: R, S, T, X...),
 * copied into states (max letters; '?' for the missing). */
static void parse_states(const char *b, size_t len, char *states, int max) {
  static const char h[] = "\r\nX-Dtrain-States: ";
  for (int i = 0; i < max; i++) states[i] = '?';
  for (size_t i = 0; i + sizeof h - 1 < len; i++) {
    if (!memcmp(b + i, "\r\n\r\n", 4)) return;
    if (memcmp(b + i, h, sizeof h - 1)) continue;
    const char *v = b + i + sizeof h - 1, *e = b + len;
    for (int k = 0; k < max && v < e && *v >= 'A' && *v <= 'z'; k++, v++) states[k] = *v;
    return;
  }
}

static int fetch_peer(const struct sockaddr_in *a, struct dt_obs_page *pg, char *states) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return DT_EIO;
  struct timeval tv = {1, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  static const char req[] = "GET /pages HTTP/1.0\r\n\r\n";
  size_t cap = MAX_PEER_PAGES * sizeof *pg + 4096, len = 0;
  char *buf = malloc(cap);
  int rc = DT_EIO;
  if (buf && connect(fd, (const struct sockaddr *)a, sizeof *a) == 0 &&
      send(fd, req, sizeof req - 1, MSG_NOSIGNAL) == (ssize_t)(sizeof req - 1)) {
    for (;;) {
      ssize_t k = recv(fd, buf + len, cap - len, 0);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) {
        if (k == 0) rc = dt__obs_pages_parse(buf, len, pg, MAX_PEER_PAGES);
        if (k == 0 && rc > 0 && states) parse_states(buf, len, states, rc);
        break;
      }
      len += (size_t)k;
      if (len == cap) break; /* more than a host may send */
    }
  }
  free(buf);
  close(fd);
  return rc;
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_len, void **con_cls) {
  (void)version, (void)upload, (void)upload_len, (void)con_cls;
  struct dt_obs_server *s = cls;
  struct MHD_Response *resp;
  enum MHD_Result ret;
  if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
    static const char m[] = "only GET\n";
    resp = MHD_create_response_from_buffer(sizeof m - 1, (void *)m, MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(resp, "Allow", "GET, HEAD");
    ret = MHD_queue_response(conn, MHD_HTTP_METHOD_NOT_ALLOWED, resp);
    MHD_destroy_response(resp);
    return ret;
  }
  if (!strcmp(url, "/pages")) { /* this host's raw pages, for the job's server */
    struct dt_obs_page *pg = malloc((size_t)s->n * sizeof *pg);
    int got = pg ? local_pages(s, pg) : 0;
    /* the state of each page's process, which the other host cannot see */
    char states[MAX_PEER_PAGES + 1];
    int ns = got < MAX_PEER_PAGES ? got : MAX_PEER_PAGES;
    for (int i = 0; i < ns; i++) states[i] = (char)dt__obs_proc_state(pg[i].pid);
    states[ns] = '\0';
    resp = MHD_create_response_from_buffer((size_t)got * sizeof *pg, pg ? (void *)pg : (void *)"",
                                           pg ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(resp, "Content-Type", "application/octet-stream");
    if (ns) MHD_add_response_header(resp, "X-Dtrain-States", states);
    ret = MHD_queue_response(conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return ret;
  }
  if (strcmp(url, "/metrics")) {
    static const char m[] = "dtrain serves /metrics\n";
    resp = MHD_create_response_from_buffer(sizeof m - 1, (void *)m, MHD_RESPMEM_PERSISTENT);
    ret = MHD_queue_response(conn, MHD_HTTP_NOT_FOUND, resp);
    MHD_destroy_response(resp);
    return ret;
  }
  pthread_mutex_lock(&s->mu);
  int np = s->npeers;
  struct sockaddr_in peer[MAX_PEERS];
  memcpy(peer, s->peer, sizeof peer);
  pthread_mutex_unlock(&s->mu);
  size_t room = (size_t)s->n + (size_t)np * MAX_PEER_PAGES;
  struct dt_obs_page *pg = malloc(room * sizeof *pg);
  int got = pg ? local_pages(s, pg) : 0;
  struct dt_obs_page *tmp = np ? malloc(MAX_PEER_PAGES * sizeof *tmp) : NULL;
  for (int i = 0; pg && tmp && i < np; i++) {
    int k = fetch_peer(&peer[i], tmp, NULL);
    for (int j = 0; j < k; j++) { /* a rank twice (a peer that is this host after all): once */
      int dup = 0;
      for (int q = 0; q < got && !dup; q++) dup = pg[q].rank == tmp[j].rank;
      if (dup) continue;
      pg[got] = tmp[j];
      pg[got++].pid = 0; /* another host's process: no resident memory read from here */
    }
  }
  free(tmp);
  char *buf = NULL;
  size_t len = 0, cap = 0;
  int rc = pg ? dt_obs_expose(pg, got, &buf, &len, &cap) : DT_ENOMEM;
  free(pg);
  if (rc < 0) {
    free(buf);
    static const char m[] = "out of memory\n";
    resp = MHD_create_response_from_buffer(sizeof m - 1, (void *)m, MHD_RESPMEM_PERSISTENT);
    ret = MHD_queue_response(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, resp);
    MHD_destroy_response(resp);
    return ret;
  }
  resp = MHD_create_response_from_buffer(len, buf ? buf : (void *)"", buf ? MHD_RESPMEM_MUST_FREE
                                                                          : MHD_RESPMEM_PERSISTENT);
  MHD_add_response_header(resp, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
  ret = MHD_queue_response(conn, MHD_HTTP_OK, resp);
  MHD_destroy_response(resp);
  return ret;
}

int dt_obs_server_start(dt_obs_server **out, const char *addr, const char *obs_dir,
                        const int *ranks, int n) {
  *out = NULL;
  if (!addr || !obs_dir || n < 1) return dt__seterr(DT_EINVAL, "obs.metrics: bad arguments");
  const char *colon = strrchr(addr, ':');
  char host[64];
  if (!colon || (size_t)(colon - addr) >= sizeof host)
    return dt__seterr(DT_EINVAL, "obs.metrics = '%s': expects HOST:PORT", addr);
  memcpy(host, addr, (size_t)(colon - addr));
  host[colon - addr] = '\0';
  char *end;
  long port = strtol(colon + 1, &end, 10);
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  if (!strcmp(host, "localhost")) snprintf(host, sizeof host, "127.0.0.1");
  if (*end || port < 0 || port > 65535 || inet_pton(AF_INET, host, &sa.sin_addr) != 1)
    return dt__seterr(DT_EINVAL, "obs.metrics = '%s': expects an IPv4 HOST:PORT", addr);
  struct dt_obs_server *s = calloc(1, sizeof *s);
  if (!s) return dt__seterr(DT_ENOMEM, "obs.metrics: out of memory");
  snprintf(s->dir, sizeof s->dir, "%s", obs_dir);
  if (!(s->ranks = malloc((size_t)n * sizeof *s->ranks))) {
    free(s);
    return dt__seterr(DT_ENOMEM, "obs.metrics: out of memory");
  }
  for (int i = 0; i < n; i++) s->ranks[i] = ranks ? ranks[i] : i;
  s->n = n;
  pthread_mutex_init(&s->mu, NULL);
  s->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL_LINUX_ONLY, 0, NULL,
                          NULL, answer, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                          MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)10,
                          MHD_OPTION_CONNECTION_LIMIT, (unsigned int)64, MHD_OPTION_END);
  if (!s->d) {
    pthread_mutex_destroy(&s->mu);
    free(s->ranks);
    free(s);
    return dt__seterr(DT_EIO, "obs.metrics: cannot listen on %s (in use, or not this machine's "
                      "address)", addr);
  }
  const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
  s->port = di ? di->port : (int)port;
  *out = s;
  return DT_OK;
}

int dt_obs_server_port(const dt_obs_server *s) { return s ? s->port : 0; }

int dt_obs_fetch_pages(const char *addr, struct dt_obs_page *out, char *states, int max) {
  struct sockaddr_in sa;
  if (!addr || !out || max < 1 || parse_addr(addr, &sa) < 0)
    return dt__seterr(DT_EINVAL, "obs: peer '%s': expects IPv4:PORT", addr ? addr : "");
  struct dt_obs_page *tmp = malloc(MAX_PEER_PAGES * sizeof *tmp);
  if (!tmp) return dt__seterr(DT_ENOMEM, "obs: out of memory");
  char st[MAX_PEER_PAGES];
  int k = fetch_peer(&sa, tmp, st);
  if (k < 0) {
    free(tmp);
    return dt__seterr(k, "obs: %s did not answer GET /pages", addr);
  }
  if (k > max) k = max;
  for (int i = 0; i < k; i++) {
    out[i] = tmp[i];
    if (states) states[i] = st[i];
  }
  free(tmp);
  return k;
}

static int parse_addr(const char *addr, struct sockaddr_in *out) {
  const char *colon = strrchr(addr, ':');
  char host[64];
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  char *end;
  long port = colon ? strtol(colon + 1, &end, 10) : -1;
  if (!colon || (size_t)(colon - addr) >= sizeof host || *end || port < 1 || port > 65535)
    return DT_EINVAL;
  memcpy(host, addr, (size_t)(colon - addr));
  host[colon - addr] = '\0';
  if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) return DT_EINVAL;
  sa.sin_port = htons((uint16_t)port);
  *out = sa;
  return DT_OK;
}

int dt_obs_server_add_peer(dt_obs_server *s, const char *addr) {
  if (!s || !addr) return dt__seterr(DT_EINVAL, "obs.metrics: bad peer");
  struct sockaddr_in sa;
  if (parse_addr(addr, &sa) < 0)
    return dt__seterr(DT_EINVAL, "obs.metrics: peer '%s': expects IPv4:PORT", addr);
  pthread_mutex_lock(&s->mu);
  int rc = DT_OK;
  if (s->npeers < MAX_PEERS) s->peer[s->npeers++] = sa;
  else rc = dt__seterr(DT_EINVAL, "obs.metrics: more than %d hosts", MAX_PEERS);
  pthread_mutex_unlock(&s->mu);
  return rc;
}

void dt_obs_server_stop(dt_obs_server *s) {
  if (!s) return;
  MHD_stop_daemon(s->d);
  pthread_mutex_destroy(&s->mu);
  free(s->ranks);
  free(s);
}
