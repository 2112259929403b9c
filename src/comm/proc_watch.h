/*
 * proc_watch.h — is a peer process on this host frozen? A rank that waits
 * for a same-host peer (shm transport, shared-memory window) can read the
 * peer's /proc/<pid>/stat state: 'T' (stopped by SIGSTOP/SIGTSTP) or 't'
 * (stopped by a tracer) means it will make no progress until someone
 * continues it. Waiters report such a peer after DTRAIN_SHM_STOPPED_S
 * seconds instead of only at the collective deadline.
 *
 * Only for processes on this host; a peer across the network is caught by
 * the deadline alone. /proc is read at most every 250 ms per watch, and
 * not at all in the first 250 ms of a wait (a zeroed watch), so waits that
 * end quickly cost no system call.
 */
#ifndef DT_COMM_PROC_WATCH_H
#define DT_COMM_PROC_WATCH_H

#include "core/core.h"

struct dt_proc_watch {
  int64_t stopped_since; /* 0: not seen stopped */
  int64_t next_check;
};

/* The scheduler state letter of pid ('R', 'S', 'T', ...), or 0 if unknown. */
char dt__proc_state(int pid);
/* True once pid has been seen stopped ('T' or 't') at every check for at
 * least DTRAIN_SHM_STOPPED_S seconds (0 disables: always false). now is
 * dt_now_ns(). *stopped_s gets how long, in seconds. */
bool dt__proc_watch(struct dt_proc_watch *w, int pid, int64_t now, double *stopped_s);

#endif /* DT_COMM_PROC_WATCH_H */
