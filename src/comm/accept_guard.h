/*
 * accept_guard.h — what the store server and the tcp transport's listener
 * share to survive hostile clients: accepting when the process is out of
 * file descriptors, and the limits on connections that have not proved the
 * job token yet. Not here: the handshakes themselves (wire.c, auth).
 */
#ifndef DT_COMM_ACCEPT_GUARD_H
#define DT_COMM_ACCEPT_GUARD_H

#include <stddef.h>
#include <sys/socket.h>

/* A listening socket's companion: one spare descriptor held open so that
 * when accept4 fails with EMFILE/ENFILE the pending connection can still be
 * taken off the backlog (close the spare, accept, close it, reopen the
 * spare) instead of leaving the listener readable forever, which made a
 * poll loop spin at 100% CPU. */
struct dt_accept_guard {
  int spare;             /* /dev/null, or -1 when it could not be reopened */
  double paused_until;   /* no spare: stop polling the listener until then */
  const char *who;       /* "store server", "tcp: rank 3", for log lines */
};

/* Opens the spare descriptor. Never fails (without it EMFILE pauses the
 * listener for 100 ms instead). */
void dt__accept_guard_init(struct dt_accept_guard *g, const char *who);
void dt__accept_guard_close(struct dt_accept_guard *g);

/* accept4(lfd, ..., SOCK_NONBLOCK | SOCK_CLOEXEC) that handles running out
 * of descriptors: returns the new fd (peer address in *who, "ip:port"), or
 * -1 with errno EAGAIN when the backlog is empty, or -1 with errno EMFILE
 * when the process is out of descriptors. In that case, when `evict`
 * (called first, if not NULL) frees a descriptor by dropping an idle
 * unauthenticated connection, the accept is retried; otherwise the new
 * connection is accepted on the spare and closed at once with a log line
 * naming its address, or, with no spare, the listener pauses 100 ms. */
int dt__accept_guarded(struct dt_accept_guard *g, int lfd, char *who, size_t whocap,
                       int (*evict)(void *arg), void *arg);

/* True while the listener should not be polled (see paused_until). */
int dt__accept_paused(const struct dt_accept_guard *g, double now);

/* Knobs: DTRAIN_AUTH_TIMEOUT_MS (a connection that has not authenticated
 * within this long is closed; default 5000) and DTRAIN_AUTH_PENDING_MAX
 * (beyond this many unauthenticated connections the oldest is closed once
 * it has waited a second; default 256; the tcp listener never uses less
 * than the world size). */
double dt__auth_timeout_s(void);
int dt__auth_pending_max(void);

#endif /* DT_COMM_ACCEPT_GUARD_H */
