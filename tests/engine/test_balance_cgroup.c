/*
 * test_balance_cgroup.c — a real straggler (docs/ddp.md "Stragglers"): rank
 * 1 of 2 forked workers moves itself into a cgroup with a CPU quota of 2% of
 * a core (cgroup v1 cpu.cfs_quota_us, or v2 cpu.max) before it builds its
 * engine. With dist.balance = dynamic its share of the global batch must
 * fall well below one half and the records must name it as the straggler;
 * both ranks end with the same parameters, and those agree with an
 * unthrottled static run to 1e-5 (the split does not change the gradient).
 * The same again with DTRAIN_DYNAMIC_PACE=1 and DTRAIN_DYNAMIC_QUOTA_PCT=100
 * (rank 1 paces itself at the start of each step: a pacing loop that
 * cannot finish under this quota shows as the job's deadline).
 * With dist.balance = steal (deterministic mode) rank 1 paces itself to its
 * quota (dt__balance_pace) and takes well under half of the micro-shards,
 * and both ranks end with the bits of one worker.
 *
 * The quota is small on purpose: on a machine loaded by other jobs every
 * process gets only a fraction of a core anyway, and the balance must see
 * rank 1 as the slow one whatever the load (it charges a rank under a quota
 * its CPU seconds / quota when that exceeds its busy time, balance.c).
 * Sanitizer builds are unoptimised and instrumented: there every rank's
 * fixed work per step (the optimizer over the whole model) costs ~30 ms of
 * CPU, which at 2% of a core made rank 1 alone need ~70 s for 51 steps. They
 * use a 10% quota (rank 1 still about ten times slower than an unthrottled
 * rank) and wait longer for a job.
 * Rank 1 also checks that its cgroup's throttled time (dt_cpu_throttled,
 * cpu.stat) grew over its job: what moves dynamic's margin under a quota.
 * Skips (77) without root or a writable cgroup cpu controller. Removes the
 * cgroup it made.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "comm/comm.h"
#include "core/core.h"
#include "engine/engine.h"
#include "fork_workers.h"
#include "engine_job.h"
#include "../dt_skip.h"

static char cg_dir[300];   /* the cgroup this test made ("" if none) */
static char cg_procs[340]; /* its cgroup.procs */

static int write_file(const char *p, const char *v) {
  FILE *f = fopen(p, "w");
  if (!f) return -1;
  int bad = fputs(v, f) < 0;
  bad |= fclose(f) != 0;
  return bad ? -1 : 0;
}

/* A cgroup limited to quota of a core: v1 first, then v2. 0 or -1. */
static int cg_make(double quota) {
  char p[400], v[64];
  if (access("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", W_OK) == 0) {
    snprintf(cg_dir, sizeof cg_dir, "/sys/fs/cgroup/cpu/dt_test_balance_%d", (int)getpid());
    if (mkdir(cg_dir, 0755) < 0) return cg_dir[0] = '\0', -1;
    snprintf(p, sizeof p, "%s/cpu.cfs_quota_us", cg_dir);
    snprintf(v, sizeof v, "%d", (int)(100000 * quota));
    if (write_file(p, v) < 0) return -1;
  } else if (access("/sys/fs/cgroup/unified/cgroup.subtree_control", W_OK) == 0 ||
             access("/sys/fs/cgroup/cgroup.subtree_control", W_OK) == 0) {
    const char *root = access("/sys/fs/cgroup/unified/cgroup.subtree_control", W_OK) == 0
                           ? "/sys/fs/cgroup/unified" : "/sys/fs/cgroup";
    snprintf(p, sizeof p, "%s/cgroup.subtree_control", root);
    write_file(p, "+cpu"); /* may already be on */
    snprintf(cg_dir, sizeof cg_dir, "%s/dt_test_balance_%d", root, (int)getpid());
    if (mkdir(cg_dir, 0755) < 0) return cg_dir[0] = '\0', -1;
    snprintf(p, sizeof p, "%s/cpu.max", cg_dir);
    snprintf(v, sizeof v, "%d 100000", (int)(100000 * quota));
    if (write_file(p, v) < 0) return -1;
  } else {
    return -1;
  }
  snprintf(cg_procs, sizeof cg_procs, "%s/cgroup.procs", cg_dir);
  return 0;
}

/* Every process left goes back to the root group; then the group goes. */
static void cg_remove(void) {
  if (!cg_dir[0]) return;
  char root[300];
  snprintf(root, sizeof root, "%s", cg_dir);
  *strrchr(root, '/') = '\0';
  char rp[340];
  snprintf(rp, sizeof rp, "%s/cgroup.procs", root);
  for (int i = 0; i < 100; i++) {
    FILE *f = fopen(cg_procs, "r");
    int pid;
    while (f && fscanf(f, "%d", &pid) == 1) {
      char v[32];
      snprintf(v, sizeof v, "%d", pid);
      write_file(rp, v);
    }
    if (f) fclose(f);
    if (rmdir(cg_dir) == 0 || errno == ENOENT) break;
    struct timespec ts = {0, 50 * 1000000L};
    nanosleep(&ts, NULL);
  }
  cg_dir[0] = '\0';
}

#include "../dt_sanitizer.h"
#ifdef UNDER_SANITIZER
#define QUOTA 0.10
#else
#define QUOTA 0.02
#endif

static void base_cfg(dt_run_cfg *c, int workers) {
  dt_run_cfg_defaults(c);
  /* big enough that a micro-shard costs tens of microseconds: the quota binds */
  snprintf(c->layers, sizeof c->layers, "linear(256) relu linear(256) relu linear(3)");
  c->format = DT_FMT_CSV;
  path(c->train_images, sizeof c->train_images, "train.csv");
  path(c->test_images, sizeof c->test_images, "test.csv");
  c->train_labels[0] = c->test_labels[0] = '\0';
  c->label_col = 0;
  c->epochs = 1;
  c->batch = 32;
  c->optim.lr = 0.05f;
  c->workers = workers;
  c->balance_every = 2;
}

/* Rank 1 of a "thr" job joins the quota group first. */
static int child(const dt_run_cfg *c, int rank, const char *tag) {
  if (rank == 1 && cg_procs[0] && !strncmp(tag, "thr", 3)) {
    char v[32];
    snprintf(v, sizeof v, "%d", (int)getpid());
    if (write_file(cg_procs, v) < 0) return 4;
    /* the kernel throttles it, and dt_cpu_throttled sees that (what moves
     * dynamic's margin under a quota, balance.c) */
    double t0 = dt_cpu_throttled();
    int rc = job_worker(c, rank, tag, NULL, 120);
    if (rc == 0 && !(t0 >= 0 && dt_cpu_throttled() > t0)) {
      fprintf(stderr, "rank 1: cgroup throttled %.3f s before the job, %.3f s after\n", t0,
              dt_cpu_throttled());
      return 5;
    }
    return rc;
  }
  return job_worker(c, rank, tag, NULL, 120);
}

static char *slurp(const char *file) {
  FILE *f = fopen(file, "r");
  if (!f) return NULL;
  static char buf[1 << 16];
  size_t k = fread(buf, 1, sizeof buf - 1, f);
  buf[k] = '\0';
  fclose(f);
  return buf;
}

static double summary_share(const char *tag, int r) {
  char p[400];
  snprintf(p, sizeof p, "%s/%s_run/summary.json", tmpdir, tag);
  char *s = slurp(p);
  assert_non_null(s);
  char key[32];
  snprintf(key, sizeof key, "\"rank\":\t%d", r);
  char *w = strstr(s, key);
  if (!w) return -1;
  char *sh = strstr(w, "\"share\":");
  return sh ? atof(sh + 8) : -1;
}

static void runn(const char *tag, int n, int balance, int det) {
  dt_run_cfg cfgs[2];
  int st[2];
  for (int r = 0; r < n; r++) {
    base_cfg(&cfgs[r], n);
    cfgs[r].balance = balance;
    cfgs[r].deterministic = det;
    cfgs[r].micro_batch = 4;
  }
  run_job(cfgs, n, tag, st);
  for (int r = 0; r < n; r++) {
    char msg[600];
    read_err(tag, r, msg, sizeof msg);
    if (st[r] != 0) fail_msg("%s: rank %d exit %d: %s", tag, r, st[r], msg);
  }
}

/* Both ranks of dynamic run `tag` end with the same parameters, within
 * 1e-5 of the unthrottled static run's a[n], and rank 1's share is below
 * 0.4. */
static void check_dynamic(const float *a, size_t n, const char *tag, const char *what) {
  size_t m, m1;
  float *b = read_params(tag, 0, &m);
  float *b1 = read_params(tag, 1, &m1);
  assert_int_equal(n, m);
  assert_int_equal(m, m1);
  assert_memory_equal(b, b1, m * sizeof(float));
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)a[i] - (double)b[i];
    num += d * d;
    den += (double)a[i] * a[i];
  }
  double share = summary_share(tag, 1);
  printf("# rank 1 under a %.0f%% CPU quota, %s: its share %.3f; vs unthrottled static: "
         "relative difference %.3g\n", 100 * QUOTA, what, share, sqrt(num / den));
  assert_true(sqrt(num / den) < 1e-5);
  assert_true(share > 0 && share < 0.4);
  free(b);
  free(b1);
}

static void test_dynamic_under_quota(void **state) {
  (void)state;
  if (geteuid() != 0) DT_SKIP("needs root to make a cgroup with a CPU quota");
  if (cg_make(QUOTA) < 0) {
    cg_remove();
    DT_SKIP("no writable cgroup cpu controller (v1 cpu.cfs_quota_us or v2 cpu.max)");
  }
#ifdef UNDER_SANITIZER
  job_deadline_s = 120;
#endif
  runn("ref", 2, DT_BALANCE_STATIC, 0);
  runn("thr_dyn", 2, DT_BALANCE_DYNAMIC, 0);
  /* the same with the throttled rank pacing itself and no margin under
   * its quota (the workers are forked after this, and read the knobs then) */
  setenv("DTRAIN_DYNAMIC_PACE", "1", 1);
  setenv("DTRAIN_DYNAMIC_QUOTA_PCT", "100", 1);
  runn("thr_pace", 2, DT_BALANCE_DYNAMIC, 0);
  unsetenv("DTRAIN_DYNAMIC_PACE");
  unsetenv("DTRAIN_DYNAMIC_QUOTA_PCT");
  runn("ref_det", 1, DT_BALANCE_STATIC, 1);
  runn("thr_steal", 2, DT_BALANCE_STEAL, 1);
  cg_remove();
  /* stealing (rank 1 paces itself to its quota): one worker's bits */
  size_t n1, ns, ns1;
  float *d1 = read_params("ref_det", 0, &n1);
  float *s0 = read_params("thr_steal", 0, &ns);
  float *s1 = read_params("thr_steal", 1, &ns1);
  assert_int_equal(n1, ns);
  assert_int_equal(n1, ns1);
  assert_memory_equal(d1, s0, n1 * sizeof(float));
  assert_memory_equal(d1, s1, n1 * sizeof(float));
  double steal_share = summary_share("thr_steal", 1);
  printf("# rank 1 under a %.0f%% CPU quota, steal: its share %.3f, the bits of one worker\n",
         100 * QUOTA, steal_share);
  assert_true(steal_share >= 0 && steal_share < 0.4);
  free(d1);
  free(s0);
  free(s1);
  size_t n;
  float *a = read_params("ref", 0, &n);
  check_dynamic(a, n, "thr_dyn", "dynamic");
  check_dynamic(a, n, "thr_pace", "dynamic paced");
  char p[400];
  snprintf(p, sizeof p, "%s/thr_dyn_run/events.jsonl", tmpdir);
  char *ev = slurp(p);
  assert_non_null(ev);
  if (!strstr(ev, "\"stragglers\":[1]")) fail_msg("events.jsonl does not name rank 1: %s", ev);
  free(a);
}

static int setup(void **state) {
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/dt_test_balance_cg_XXXXXX");
  if (!mkdtemp(tmpdir)) return -1;
  char p[300];
  path(p, sizeof p, "train.csv");
  write_csv(p, 32 * 50 + 1, 7);
  path(p, sizeof p, "test.csv");
  write_csv(p, 301, 8);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dynamic_under_quota),
  };
  int rc = cmocka_run_group_tests(tests, setup, teardown);
  cg_remove();
  return dt_skip_status(rc);
}
