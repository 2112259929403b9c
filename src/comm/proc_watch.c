/*
 * proc_watch.c — frozen-peer detection for same-host waiters (see
 * proc_watch.h): the state letter of /proc/<pid>/stat, sampled at most
 * every 250 ms, and how long a peer has been stopped. It does not signal
 * or continue anyone; the caller decides what a stopped peer means.
 */
#include "comm/proc_watch.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define CHECK_NS 250000000LL

char dt__proc_state(int pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  const char *p = strrchr(buf, ')'); /* the command name may hold spaces and ')' */
  return p && p[1] == ' ' && p[2] ? p[2] : 0;
}

bool dt__proc_watch(struct dt_proc_watch *w, int pid, int64_t now, double *stopped_s) {
  int64_t limit_s = dt_param(DT_PARAM_SHM_STOPPED_S);
  if (limit_s <= 0 || pid <= 0) return false;
  if (!w->next_check) { /* a fresh watch: the first look after CHECK_NS, so short waits never read /proc */
    w->next_check = now + CHECK_NS;
    return false;
  }
  if (now >= w->next_check) {
    w->next_check = now + CHECK_NS;
    char s = dt__proc_state(pid);
    if (s == 'T' || s == 't') {
      if (!w->stopped_since) w->stopped_since = now;
    } else {
      w->stopped_since = 0;
    }
  }
  if (!w->stopped_since) return false;
  double d = (double)(now - w->stopped_since) / 1e9;
  if (stopped_s) *stopped_s = d;
  return d >= (double)limit_s;
}
