/*
 * http_mhd.c — the metrics endpoint: libmicrohttpd on one address (loopback
 * unless the user names another), GET /metrics answered with the
 * exposition of every local rank's page read at that moment (expo.c), any
 * other path 404, any other method 405. One internal polling thread; a
 * scrape reads n small files and formats them (well under a millisecond
 * for a few ranks). It does not aggregate over nodes: each node's
 * launcher (under mpirun/srun: each host's first rank) serves its own
 * ranks, so Prometheus scrapes one target per node.
 * Built into the dtrain binary only (CMakeLists.txt: *_mhd.c), not into
 * libdtrain.
 */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obs/obs_diag.h"

struct dt_obs_server {
  struct MHD_Daemon *d;
  char dir[4096];
  int *ranks, n, port;
};

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
  if (strcmp(url, "/metrics")) {
    static const char m[] = "dtrain serves /metrics\n";
    resp = MHD_create_response_from_buffer(sizeof m - 1, (void *)m, MHD_RESPMEM_PERSISTENT);
    ret = MHD_queue_response(conn, MHD_HTTP_NOT_FOUND, resp);
    MHD_destroy_response(resp);
    return ret;
  }
  struct dt_obs_page *pg = malloc((size_t)s->n * sizeof *pg);
  int got = 0;
  for (int i = 0; pg && i < s->n; i++) {
    char p[4200];
    dt__obs_rank_path(s->dir, s->ranks[i], p, sizeof p);
    /* left out: a rank not started yet, a page whose rank moved on to
     * another number (elastic re-forming: obs.h dt_obs_rerank), a rank
     * whose process is gone (its last values would stay forever) */
    if (dt__obs_read(p, &pg[got]) == DT_OK && pg[got].rank == s->ranks[i] &&
        !strchr("XZ", dt__obs_proc_state(pg[got].pid)))
      got++;
  }
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
  s->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL_LINUX_ONLY, 0, NULL,
                          NULL, answer, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                          MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)10,
                          MHD_OPTION_CONNECTION_LIMIT, (unsigned int)64, MHD_OPTION_END);
  if (!s->d) {
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

void dt_obs_server_stop(dt_obs_server *s) {
  if (!s) return;
  MHD_stop_daemon(s->d);
  free(s->ranks);
  free(s);
}
