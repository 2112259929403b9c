/*
 * test_job_local.c — local jobs through the public API (dtrain/job.h): a
 * 2- and a 3-worker job run a real allreduce over the communicator the job
 * hands them and every worker's status comes back; a worker returning a
 * status, a worker killed by SIGKILL and a worker that returns while its
 * peers wait in a collective each make dt_job_run return an error naming
 * that rank within seconds, with nothing of the job left in /dev/shm and no
 * worker left running; the memory check refuses 64 workers against a small
 * /dev/shm limit before anything is forked; when the launcher itself is
 * SIGKILLed, its workers die and the shared memory they left is removed. Each test forks its workers
 * through dt_job_run from this single-threaded process.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "core/core.h"
#include "launch/launch.h"

/* Nothing in /dev/shm was created by pid (shm inboxes dtshm-H-R-PID-N,
 * windows dtrain-win-PID-N). */
static int shm_left_by(int pid) {
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  char a[64], b[64];
  snprintf(b, sizeof b, "dtrain-win-%d-", pid);
  while ((e = readdir(d))) {
    unsigned long long h, nonce;
    int r, p;
    if (sscanf(e->d_name, "dtshm-%16llx-%d-%d-%16llx", &h, &r, &p, &nonce) == 4 && p == pid) n++;
    if (!strncmp(e->d_name, b, strlen(b))) n++;
  }
  (void)a;
  closedir(d);
  return n;
}

/* The job's lines: errors go to stderr (they explain a failure), the
 * rest is dropped. */
static void quiet(void *ud, int level, const char *line) {
  (void)ud;
  if (level == DT_JOB_ERROR) fprintf(stderr, "job: %s\n", line);
}

static void check_gone(const dt_job *job) {
  for (int i = 0; i < dt_job_local_size(job); i++) {
    struct dt_job_status st;
    assert_int_equal(dt_job_worker_status(job, i, &st), DT_OK);
    assert_true(st.pid > 0);
    assert_true(kill(st.pid, 0) < 0 && errno == ESRCH); /* reaped, not running */
    assert_int_equal(shm_left_by(st.pid), 0);
  }
}

/* Every rank contributes rank+1; the sum must be n(n+1)/2 everywhere. */
static int sum_worker(const struct dt_job_worker *w, void *arg) {
  (void)arg;
  if (!w->comm || w->local_size != w->size || w->local_rank != w->rank) return 10;
  double x[64], y[64];
  for (int i = 0; i < 64; i++) x[i] = (w->rank + 1) * (i + 1);
  if (dt_comm_allreduce(w->comm, x, y, 64, DT_F64, DT_OP_SUM) < 0) return 11;
  double want = w->size * (w->size + 1) / 2.0;
  for (int i = 0; i < 64; i++)
    if (y[i] != want * (i + 1)) return 12;
  return w->rank == 0 ? 0 : 0;
}

static void run_sum(int n, const char *transport) {
  struct dt_job_config jc = DT_JOB_CONFIG_INIT;
  jc.workers = n;
  jc.transport = transport;
  jc.notify = quiet;
  jc.deadline_s = 60;
  dt_job *job = NULL;
  assert_int_equal(dt_job_create(&job, &jc), DT_OK);
  assert_int_equal(dt_job_size(job), n);
  assert_int_equal(dt_job_local_size(job), n);
  assert_string_equal(dt_job_source(job), "dtrain");
  int rc = dt_job_run(job, sum_worker, NULL);
  if (rc) print_error("dt_job_run: %s\n", dt_errmsg());
  assert_int_equal(rc, DT_OK);
  assert_int_equal(dt_job_failed_worker(job), -1);
  assert_int_equal(dt_job_signal(job), 0);
  for (int i = 0; i < n; i++) {
    struct dt_job_status st;
    assert_int_equal(dt_job_worker_status(job, i, &st), DT_OK);
    assert_int_equal(st.rank, i);
    assert_int_equal(st.exited, 1);
    assert_int_equal(st.code, 0);
    assert_int_equal(st.signal, 0);
  }
  check_gone(job);
  /* a job runs once */
  assert_int_equal(dt_job_run(job, sum_worker, NULL), DT_EINVAL);
  assert_non_null(strstr(dt_errmsg(), "already run"));
  dt_job_destroy(job);
}

static void test_two_workers(void **s) {
  (void)s;
  run_sum(2, NULL);
}
static void test_three_workers(void **s) {
  (void)s;
  run_sum(3, NULL);
}
static void test_three_workers_tcp(void **s) {
  (void)s;
  run_sum(3, "tcp");
}

/* Rank 1 returns 7 right away; the others return 0. The job blames rank 1
 * even when a peer that its abort caught exits first. */
static int status_worker(const struct dt_job_worker *w, void *arg) {
  (void)arg;
  return w->rank == 1 ? 7 : 0;
}

static void test_worker_status(void **s) {
  (void)s;
  struct dt_job_config jc = DT_JOB_CONFIG_INIT;
  jc.workers = 3;
  jc.notify = quiet;
  dt_job *job = NULL;
  assert_int_equal(dt_job_create(&job, &jc), DT_OK);
  double t0 = dt_now();
  int rc = dt_job_run(job, status_worker, NULL);
  if (!strstr(dt_errmsg(), "worker rank 1 (pid ") || !strstr(dt_errmsg(), "status 7"))
    print_error("dt_job_run: %d after %.1f s: %s\n", rc, dt_now() - t0, dt_errmsg());
  assert_int_equal(rc, DT_EABORTED);
  assert_non_null(strstr(dt_errmsg(), "worker rank 1 (pid "));
  assert_non_null(strstr(dt_errmsg(), "exited with status 7"));
  assert_int_equal(dt_job_failed_worker(job), 1);
  struct dt_job_status st;
  assert_int_equal(dt_job_worker_status(job, 1, &st), DT_OK);
  assert_int_equal(st.exited, 1);
  assert_int_equal(st.code, 7);
  /* the others returned 0, unless rank 1's abort caught them still in the
   * job's joining barrier (then 1): exited either way, never killed */
  for (int i = 0; i < 3; i += 2) {
    assert_int_equal(dt_job_worker_status(job, i, &st), DT_OK);
    assert_int_equal(st.exited, 1);
    assert_true(st.code == 0 || st.code == 1);
  }
  assert_int_equal(dt_job_worker_status(job, 3, &st), DT_EINVAL);
  assert_int_equal(dt_job_worker_status(job, -1, &st), DT_EINVAL);
  check_gone(job);
  dt_job_destroy(job);
}

/* Allreduces until one fails; rank `victim` dies (SIGKILL) or returns 3
 * after the 20th. */
struct fail_arg {
  int victim, kill;
};
static int failing_worker(const struct dt_job_worker *w, void *arg) {
  const struct fail_arg *a = arg;
  float x[1024] = {0}, y[1024];
  for (int it = 0;; it++) {
    if (w->rank == a->victim && it == 20) {
      if (a->kill) raise(SIGKILL);
      return 3;
    }
    if (dt_comm_allreduce(w->comm, x, y, 1024, DT_F32, DT_OP_SUM) < 0) return 1;
  }
}

static void run_failing(int kill_it) {
  struct dt_job_config jc = DT_JOB_CONFIG_INIT;
  jc.workers = 3;
  jc.notify = quiet;
  jc.grace_s = 20; /* the survivors must notice by themselves, well before */
  dt_job *job = NULL;
  struct fail_arg fa = {2, kill_it};
  assert_int_equal(dt_job_create(&job, &jc), DT_OK);
  double t0 = dt_now();
  int rc = dt_job_run(job, failing_worker, &fa);
  double took = dt_now() - t0;
  assert_int_equal(rc, kill_it ? DT_EPEERLOST : DT_EABORTED);
  assert_non_null(strstr(dt_errmsg(), "worker rank 2 (pid "));
  assert_non_null(strstr(dt_errmsg(), kill_it ? "killed by signal 9" : "exited with status 3"));
  assert_int_equal(dt_job_failed_worker(job), 2);
  assert_true(took < 15.0); /* within seconds, not the 60 s deadline */
  struct dt_job_status st;
  for (int i = 0; i < 2; i++) { /* the survivors saw the lost peer and returned 1 */
    assert_int_equal(dt_job_worker_status(job, i, &st), DT_OK);
    assert_int_equal(st.exited, 1);
    assert_int_equal(st.code, 1);
  }
  check_gone(job);
  dt_job_destroy(job);
}

static void test_worker_killed(void **s) {
  (void)s;
  run_failing(1);
}
static void test_worker_fails(void **s) {
  (void)s;
  run_failing(0);
}

static void test_memory_refused(void **s) {
  (void)s;
  setenv("DTRAIN_SHM_LIMIT_BYTES", "16777216", 1); /* 16 MiB: 64 workers need ~230 MiB of rings */
  dt__param_reload(); /* knobs are read once and cached */
  struct dt_job_config jc = DT_JOB_CONFIG_INIT;
  jc.workers = 64;
  jc.notify = quiet;
  dt_job *job = NULL;
  assert_int_equal(dt_job_create(&job, &jc), DT_ENOMEM); /* before anything is forked */
  assert_null(job);
  const char *m = dt_errmsg();
  assert_non_null(strstr(m, "64 workers need about "));
  assert_non_null(strstr(m, "/dev/shm has 16.0 MiB free"));
  jc.check_memory = 0; /* the check can be turned off */
  assert_int_equal(dt_job_create(&job, &jc), DT_OK);
  dt_job_destroy(job);
  /* tcp has no rings: the same job passes the check (not run here) */
  assert_int_equal(dt__job_memcheck(64, 64, "tcp", 0, 0), DT_OK);
  assert_int_equal(dt__job_memcheck(64, 64, "shm", 0, 0), DT_ENOMEM);
  unsetenv("DTRAIN_SHM_LIMIT_BYTES");
  dt__param_reload();
  /* MemAvailable: per-worker memory beyond what the host has */
  assert_int_equal(dt__job_memcheck(2, 2, "tcp", (size_t)1 << 62, 0), DT_ENOMEM);
  assert_non_null(strstr(dt_errmsg(), "MemAvailable"));
}

/* Each worker leaves a shared-memory name behind, as a worker killed
 * before its peers mapped its segment would (window naming:
 * dtrain-win-PID-NONCE), tells the test its pid, and waits. */
static int leaky_worker(const struct dt_job_worker *w, void *arg) {
  const int *fd = arg;
  char n[96];
  int pid = (int)getpid();
  snprintf(n, sizeof n, "/dtrain-win-%d-%016llx", pid, 0x5eedull + (unsigned long long)w->rank);
  int s = shm_open(n, O_CREAT | O_RDWR | O_EXCL, 0600);
  if (s >= 0) close(s);
  if (write(fd[1], &pid, sizeof pid) != (ssize_t)sizeof pid) return 1;
  for (;;) pause();
}

/* Alive and not a zombie nobody reaps. */
static int alive(int pid) {
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "re");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *rp = strrchr(buf, ')');
  return !(rp && rp[2] == 'Z');
}

/* The launcher itself is SIGKILLed: its workers die with it, and the
 * sweeper it forked first removes the shared memory they left. */
static void test_launcher_killed(void **s) {
  (void)s;
  int fd[2];
  assert_int_equal(pipe(fd), 0);
  pid_t launcher = fork();
  assert_true(launcher >= 0);
  if (launcher == 0) {
    struct dt_job_config jc = DT_JOB_CONFIG_INIT;
    jc.workers = 2;
    jc.notify = quiet;
    dt_job *job = NULL;
    if (dt_job_create(&job, &jc) < 0) _exit(3);
    dt_job_run(job, leaky_worker, fd);
    _exit(4);
  }
  int pids[2] = {0, 0};
  for (int i = 0; i < 2; i++) {
    struct pollfd pf = {fd[0], POLLIN, 0};
    assert_int_equal(poll(&pf, 1, 60000), 1);
    assert_int_equal(read(fd[0], &pids[i], sizeof pids[i]), (ssize_t)sizeof pids[i]);
  }
  close(fd[0]);
  close(fd[1]);
  assert_int_equal(shm_left_by(pids[0]) + shm_left_by(pids[1]), 2);
  kill(launcher, SIGKILL);
  int st;
  assert_int_equal(waitpid(launcher, &st, 0), launcher);
  assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  double end = dt_now() + 15;
  while ((alive(pids[0]) || alive(pids[1]) || shm_left_by(pids[0]) || shm_left_by(pids[1])) &&
         dt_now() < end)
    poll(NULL, 0, 20);
  assert_false(alive(pids[0]) || alive(pids[1]));
  assert_int_equal(shm_left_by(pids[0]) + shm_left_by(pids[1]), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_two_workers),   cmocka_unit_test(test_three_workers),
      cmocka_unit_test(test_three_workers_tcp), cmocka_unit_test(test_worker_status),
      cmocka_unit_test(test_worker_killed), cmocka_unit_test(test_worker_fails),
      cmocka_unit_test(test_memory_refused), cmocka_unit_test(test_launcher_killed),
  };
  if (getenv("DT_TEST_FILTER")) cmocka_set_test_filter(getenv("DT_TEST_FILTER"));
  return cmocka_run_group_tests(tests, NULL, NULL);
}
