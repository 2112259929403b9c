/*
 * test_shm_unlink.c — a killed shm job leaves nothing in /dev/shm. Ranks
 * are forked processes over the shm transport; once their communicator is
 * up (and has run one allreduce) they are killed with SIGKILL: first all of
 * them at once (an OOM kill, or `kill -9` of the process group: nobody is
 * left to clean up), then one of them while the survivors go on (they fail
 * with DT_EPEERLOST and exit). Either way no inbox segment of any of these
 * pids may remain. Before the segment was unlinked as soon as every peer
 * had mapped it, the first case left one segment per rank. The test removes
 * whatever it finds after checking, so a failing run leaves nothing either.
 */
#define _GNU_SOURCE
#include "comm/comm.h"
#include "comm/transport.h"

#include <dirent.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

const void *const test_anchor[] = {&dt__transport_shm};

#define NR 4
struct board {
  _Atomic int up;     /* ranks whose communicator is up and used */
  _Atomic int failed; /* ranks that could not get there */
  char msg[256];
};
static struct board *B;

static void rank_main(const char *dir, int r) {
  dt_store *st = NULL;
  dt_comm *c = NULL;
  if (dt_store_open_file(&st, dir) != DT_OK) goto fail;
  struct dt_comm_config cfg = DT_COMM_CONFIG_INIT;
  cfg.transport = "shm";
  cfg.rank = r;
  cfg.size = NR;
  cfg.job = "shmunlink";
  cfg.host_id = "shmunlinkhost";
  cfg.timeout_s = 30;
  if (dt_comm_create(&c, st, &cfg) != DT_OK) goto fail;
  float v[64] = {1};
  if (dt_comm_allreduce(c, v, v, 64, DT_F32, DT_OP_SUM) != DT_OK) goto fail;
  atomic_fetch_add(&B->up, 1);
  /* Wait in a collective, as a training worker would, until killed or a
   * peer is lost. */
  dt_comm_barrier(c);
  dt_comm_destroy(c);
  dt_store_destroy(st);
  _exit(0);
fail:
  snprintf(B->msg, sizeof B->msg, "rank %d: %s", r, dt_errmsg());
  atomic_fetch_add(&B->failed, 1);
  _exit(1);
}

/* Segments in /dev/shm created by any of pids (names dtshm-<job>-<rank>-<pid>-<nonce>). */
static int leftovers(const pid_t *pids, int n, bool remove, char *names, size_t cap) {
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  int found = 0;
  struct dirent *e;
  names[0] = 0;
  while ((e = readdir(d))) {
    unsigned long long jh, nonce;
    int rank, pid;
    if (sscanf(e->d_name, "dtshm-%16llx-%d-%d-%16llx", &jh, &rank, &pid, &nonce) != 4) continue;
    for (int i = 0; i < n; i++) {
      if (pid != pids[i]) continue;
      found++;
      size_t l = strlen(names);
      snprintf(names + l, cap - l, " %s", e->d_name);
      if (remove) {
        char p[300];
        snprintf(p, sizeof p, "/%s", e->d_name);
        shm_unlink(p);
      }
    }
  }
  closedir(d);
  return found;
}

static void run(bool kill_all) {
  memset(B, 0, sizeof *B);
  char dir[] = "/tmp/dt_shm_unlink_XXXXXX";
  assert_non_null(mkdtemp(dir));
  pid_t pids[NR];
  for (int r = 0; r < NR; r++) {
    pids[r] = fork();
    assert_true(pids[r] >= 0);
    if (pids[r] == 0) rank_main(dir, r);
  }
  double until = dt_now() + 60;
  while (atomic_load(&B->up) + atomic_load(&B->failed) < NR && dt_now() < until) usleep(2000);
  int up = atomic_load(&B->up);
  if (kill_all) {
    for (int r = 0; r < NR; r++) kill(pids[r], SIGKILL);
  } else {
    kill(pids[NR - 1], SIGKILL);
  }
  /* Survivors notice the lost peer within seconds; anything still running
   * after 30 s is killed too (and the test fails below on its leftovers or
   * on the message). */
  until = dt_now() + 30;
  int left = NR;
  bool alive[NR];
  for (int r = 0; r < NR; r++) alive[r] = true;
  while (left) {
    for (int r = 0; r < NR; r++)
      if (alive[r] && waitpid(pids[r], NULL, WNOHANG) == pids[r]) alive[r] = false, left--;
    if (left && dt_now() > until)
      for (int r = 0; r < NR; r++)
        if (alive[r]) kill(pids[r], SIGKILL);
    usleep(2000);
  }
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd)) { /* best effort */ }
  char names[2048];
  int n = leftovers(pids, NR, true, names, sizeof names);
  if (up != NR) fail_msg("only %d of %d ranks got their communicator up: %s", up, NR, B->msg);
  if (n) fail_msg("%s: %d segment(s) left in /dev/shm:%s", kill_all ? "all ranks killed" : "one rank killed",
                  n, names);
}

static void kill_all_ranks(void **state) {
  (void)state;
  run(true);
}

static void kill_one_rank(void **state) {
  (void)state;
  run(false);
}

int main(void) {
  B = mmap(NULL, sizeof *B, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (B == MAP_FAILED) return 1;
  const struct CMUnitTest tests[] = {cmocka_unit_test(kill_all_ranks), cmocka_unit_test(kill_one_rank)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
