/*
 * fork_workers.h — the engine tests' worker launcher: forks one child per
 * rank (each runs fn and exits with its return value) and waits for all of
 * them with a deadline, SIGKILLing and reaping whatever is left, so no test
 * leaves a process behind or hangs. Header-only (static) so each test stays
 * one executable; include after <cmocka.h>.
 */
#ifndef DT_TEST_FORK_WORKERS_H
#define DT_TEST_FORK_WORKERS_H

#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"

/* status[r] = child r's exit status, 1000 + the signal that ended it, or -1
 * if it was still running at the deadline (then the test fails). */
static void fork_workers(int n, int (*fn)(void *arg, int rank), void *arg, double deadline_s,
                         const char *tag, int *status) {
  pid_t pids[8];
  assert_true(n <= 8);
  fflush(NULL);
  for (int r = 0; r < n; r++) {
    pid_t p = fork();
    assert_true(p >= 0);
    if (p == 0) _exit(fn(arg, r));
    pids[r] = p;
    status[r] = -2;
  }
  double deadline = dt_now() + deadline_s;
  int left = n;
  while (left > 0) {
    for (int r = 0; r < n; r++) {
      if (status[r] != -2) continue;
      int st;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 1000 + WTERMSIG(st);
        left--;
      }
    }
    if (left && dt_now() > deadline) {
      for (int r = 0; r < n; r++)
        if (status[r] == -2) kill(pids[r], SIGKILL);
      for (int r = 0; r < n; r++)
        if (status[r] == -2) {
          waitpid(pids[r], NULL, 0);
          status[r] = -1;
        }
      fail_msg("job %s: workers still running after %.0f s", tag, deadline_s);
    }
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

#endif /* DT_TEST_FORK_WORKERS_H */
