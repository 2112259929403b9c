/*
 * accept_guard.c — accepting connections without spinning when the process
 * runs out of file descriptors (the reserve-descriptor trick), and the two
 * knobs that bound unauthenticated connections (accept_guard.h). It does
 * not track connections: the store server and the tcp listener keep their
 * own lists and call back to drop the oldest idle one.
 */
#define _GNU_SOURCE
#include "comm/accept_guard.h"

#include "core/core.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <unistd.h>

void dt__accept_guard_init(struct dt_accept_guard *g, const char *who) {
  g->spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
  g->paused_until = 0;
  g->who = who;
}

void dt__accept_guard_close(struct dt_accept_guard *g) {
  if (g->spare >= 0) close(g->spare);
  g->spare = -1;
}

static void addr_text(const struct sockaddr_storage *ss, char *who, size_t cap) {
  if (ss->ss_family == AF_INET) {
    const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
    snprintf(who, cap, "%s:%d", ip, ntohs(a->sin_port));
  } else if (ss->ss_family == AF_INET6) {
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
    char ip[INET6_ADDRSTRLEN];
    inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
    snprintf(who, cap, "[%s]:%d", ip, ntohs(a->sin6_port));
  } else {
    snprintf(who, cap, "(peer)");
  }
}

int dt__accept_guarded(struct dt_accept_guard *g, int lfd, char *who, size_t whocap,
                       int (*evict)(void *arg), void *arg) {
  for (;;) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      addr_text(&ss, who, whocap);
      return fd;
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno != EMFILE && errno != ENFILE && errno != ENOBUFS && errno != ENOMEM) return -1;
    if (evict && evict(arg)) continue; /* an idle stranger made room */
    if (g->spare < 0) {
      /* No spare to sacrifice: stop polling the listener for a moment
       * rather than wake up for it in a loop. */
      g->spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (g->spare < 0) {
        DT_LOG_WARN("%s: out of file descriptors; not accepting for 100 ms", g->who);
        g->paused_until = dt_now() + 0.1;
        errno = EMFILE;
        return -1;
      }
    }
    close(g->spare);
    sl = sizeof ss;
    fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC);
    if (fd >= 0) {
      addr_text(&ss, who, whocap);
      close(fd);
      DT_LOG_WARN("%s: dropped connection from %s: out of file descriptors", g->who, who);
    }
    g->spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == EAGAIN) return -1;
    /* Taken off the backlog (or failed otherwise): go on with the next. */
  }
}

int dt__accept_paused(const struct dt_accept_guard *g, double now) { return now < g->paused_until; }

double dt__auth_timeout_s(void) {
  int64_t ms = dt_param(DT_PARAM_AUTH_TIMEOUT_MS);
  return (ms > 0 ? (double)ms : 5000.0) / 1000.0;
}

int dt__auth_pending_max(void) {
  int64_t n = dt_param(DT_PARAM_AUTH_PENDING_MAX);
  return n > 0 && n < (1 << 20) ? (int)n : 256;
}
