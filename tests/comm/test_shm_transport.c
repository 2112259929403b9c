/*
 * test_shm_transport.c — the shm transport through its ops table alone
 * (no communicator): forked processes as ranks exchange every-to-every
 * messages of awkward sizes (0, 1, 7, 1023, 64 KiB - 1, 1 MiB + 3, 5 MiB)
 * with two tags posted out of order, over the single-copy path and over the
 * ring alone with a tiny ring (so messages stream through it and arrive
 * before their receive); payloads that mimic the next lap's record headers
 * are not mistaken for them; a peer killed with SIGKILL makes every survivor,
 * including one waiting on a third rank, fail with DT_EPEERLOST naming it
 * within 5 s; a receive nobody sends fails with DT_ETIMEDOUT at its deadline;
 * a length mismatch is DT_EPROTO; small messages ending in zeros (sent
 * without them) arrive whole, with the zeros, into a dirty buffer, whether
 * the receive was posted before or after; a single-copy message pulled
 * inside irecv is acknowledged at once (the sender's wait does not depend
 * on the receiver calling the transport again); no segment is left in
 * /dev/shm.
 *
 * Every child is started and stopped (reaped, or killed by pid after the
 * test's deadline) by the test that forked it.
 */
#define _GNU_SOURCE
#include "comm/transport.h"

#include <dirent.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#define MAXR 8

struct board {
  char addr[MAXR][DT_TP_ADDR_MAX];
  _Atomic int published, connected, waiting, sent;
  int rc[MAXR];
  double seconds[MAXR];
  char err[MAXR][DT_TP_ERR_MAX];
};

static struct board *B;

#define REQ(b, n, t, p, k) ((struct dt_tp_req){.buf = (b), .len = (n), .tag = (t), .peer = (p), .kind = (k)})
static char job[64];

static const struct dt_transport_ops *T(void) { return &dt__transport_shm; }

/* Spins (yielding) until *v >= n or 20 s pass. */
static int wait_count(_Atomic int *v, int n) {
  double until = dt_now() + 20;
  while (atomic_load(v) < n) {
    if (dt_now() > until) return DT_ETIMEDOUT;
    usleep(200);
  }
  return DT_OK;
}

static void fill(uint8_t *p, size_t n, int from, int to, int tag) {
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(i * 131 + from * 17 + to * 5 + tag * 3);
}

/* Sets up a context with every peer connected; returns eps in eps[]. */
static int setup(int rank, int size, struct dt_tp_ctx **ctx, struct dt_tp_ep **eps) {
  struct dt_tp_init in = {.rank = rank, .size = size, .job = job, .host_id = "testhost",
                         .token = (const uint8_t *)"tok", .token_len = 3, .nconn = 1, .timeout_s = 10};
  int rc = T()->init(&in, ctx, B->addr[rank]);
  if (rc) return rc;
  atomic_fetch_add(&B->published, 1);
  if ((rc = wait_count(&B->published, size))) return rc;
  for (int p = 0; p < size; p++) {
    eps[p] = NULL;
    if (p == rank) continue;
    struct dt_tp_peer peer = {p, "testhost", B->addr[p]};
    if (!T()->can_connect(*ctx, &peer)) return DT_EIO;
    rc = T()->connect(*ctx, &peer, dt_now_ns() + 10000000000ll, &eps[p], B->err[rank]);
    if (rc) return rc;
  }
  atomic_fetch_add(&B->connected, 1);
  return wait_count(&B->connected, size);
}

static void teardown(int size, struct dt_tp_ctx *ctx, struct dt_tp_ep **eps) {
  for (int p = 0; p < size; p++)
    if (eps[p]) T()->close(eps[p]);
  T()->finalize(ctx);
}

static const size_t sizes[] = {0, 1, 7, 1023, 65535, (1u << 20) + 3, 5u << 20};
#define NSIZES (sizeof sizes / sizeof sizes[0])

/* Every rank sends every size to every peer under tags 1 and 2 (tag 2 first),
 * and receives them posting tag 1 first; then checks every byte. */
static int body_exchange(int rank, int size) {
  struct dt_tp_ctx *ctx;
  struct dt_tp_ep *eps[MAXR];
  int rc = setup(rank, size, &ctx, eps);
  if (rc) return rc;
  int nmsg = (size - 1) * (int)NSIZES * 2;
  struct dt_tp_req *sr = calloc(nmsg, sizeof *sr), *rr = calloc(nmsg, sizeof *rr);
  struct dt_tp_req **all = calloc(2 * nmsg, sizeof *all);
  uint8_t **sb = calloc(nmsg, sizeof *sb), **rb = calloc(nmsg, sizeof *rb);
  int k = 0, na = 0;
  for (int p = 0; p < size; p++) {
    if (p == rank) continue;
    for (size_t s = 0; s < NSIZES; s++)
      for (int tag = 2; tag >= 1; tag--) {
        sb[k] = malloc(sizes[s] + 1);
        fill(sb[k], sizes[s], rank, p, tag);
        sr[k] = REQ(sb[k], sizes[s], (uint64_t)tag | (7ull << 32), p, DT_TP_SEND);
        if ((rc = T()->isend(eps[p], &sr[k]))) goto out;
        all[na++] = &sr[k];
        k++;
      }
  }
  k = 0;
  for (int p = 0; p < size; p++) {
    if (p == rank) continue;
    for (size_t s = 0; s < NSIZES; s++)
      for (int tag = 1; tag <= 2; tag++) {
        rb[k] = malloc(sizes[s] + 1);
        rr[k] = REQ(rb[k], sizes[s], (uint64_t)tag | (7ull << 32), p, DT_TP_RECV);
        if ((rc = T()->irecv(eps[p], &rr[k]))) goto out;
        all[na++] = &rr[k];
        k++;
      }
  }
  rc = T()->wait(ctx, all, na, dt_now_ns() + 20000000000ll, B->err[rank]);
  if (rc) goto out;
  uint8_t *want = malloc((5u << 20) + 8);
  for (int i = 0; i < k && !rc; i++) {
    int tag = (int)(rr[i].tag & 0xffffffffu);
    fill(want, rr[i].len, rr[i].peer, rank, tag);
    if (rr[i].status != 1 || rr[i].done != rr[i].len || memcmp(want, rb[i], rr[i].len)) {
      snprintf(B->err[rank], DT_TP_ERR_MAX, "rank %d: wrong data from %d, %zu bytes tag %d",
               rank, rr[i].peer, rr[i].len, tag);
      rc = DT_ECORRUPT;
    }
  }
  free(want);
out:
  for (int i = 0; i < nmsg; i++) { free(sb[i]); free(rb[i]); }
  free(sb); free(rb); free(sr); free(rr); free(all);
  teardown(size, ctx, eps);
  return rc;
}

/* Messages whose tails are zero (the shm wire leaves such tails out): all
 * zero, one leading byte, half data; around the 32-byte record size and the
 * 512-byte trimming limit. Rank 0 posts its receives before sending, rank
 * 1 after (its messages from rank 0 arrive unexpected); receive buffers
 * start dirty; one extra message is received one byte too long. */
static const size_t zlen[] = {1, 8, 9, 31, 32, 33, 64, 100, 288, 511, 512, 513, 600};
#define NZ (sizeof zlen / sizeof zlen[0] * 3)

static void zfill(uint8_t *p, size_t n, int v, int from) {
  memset(p, 0, n);
  if (v == 1) p[0] = (uint8_t)(from + 1);
  if (v == 2)
    for (size_t i = 0; i < n / 2; i++) p[i] = (uint8_t)(i * 7 + from + 1) | 1;
}

static int body_zeros(int rank, int size) {
  struct dt_tp_ctx *ctx;
  struct dt_tp_ep *eps[MAXR];
  int rc = setup(rank, size, &ctx, eps);
  if (rc) return rc;
  int peer = 1 - rank;
  static uint8_t sb[NZ + 1][640], rb[NZ + 1][640], want[640];
  struct dt_tp_req sr[NZ + 1], rr[NZ + 1], *all[2 * NZ + 2];
  int na = 0;
  memset(rb, 0xAA, sizeof rb);
  for (int pass = 0; pass < 2; pass++) {
    if ((pass == 0) != (rank == 0)) { /* sends */
      for (size_t k = 0; k < NZ; k++) {
        zfill(sb[k], zlen[k / 3], (int)(k % 3), rank);
        sr[k] = REQ(sb[k], zlen[k / 3], 11, peer, DT_TP_SEND);
        if ((rc = T()->isend(eps[peer], &sr[k]))) goto out;
        all[na++] = &sr[k];
      }
      sr[NZ] = REQ(sb[NZ], 288, 12, peer, DT_TP_SEND); /* zeros: trimmed to nothing */
      memset(sb[NZ], 0, 288);
      if ((rc = T()->isend(eps[peer], &sr[NZ]))) goto out;
      all[na++] = &sr[NZ];
    } else { /* receives */
      for (size_t k = 0; k < NZ; k++) {
        rr[k] = REQ(rb[k], zlen[k / 3], 11, peer, DT_TP_RECV);
        if ((rc = T()->irecv(eps[peer], &rr[k]))) goto out;
        all[na++] = &rr[k];
      }
    }
  }
  rc = T()->wait(ctx, all, na, dt_now_ns() + 20000000000ll, B->err[rank]);
  if (rc) goto out;
  for (size_t k = 0; k < NZ && !rc; k++) {
    zfill(want, zlen[k / 3], (int)(k % 3), peer);
    if (rr[k].status != 1 || memcmp(want, rb[k], zlen[k / 3]) || rb[k][zlen[k / 3]] != 0xAA) {
      snprintf(B->err[rank], DT_TP_ERR_MAX, "rank %d: wrong data, %zu bytes variant %d", rank, zlen[k / 3],
               (int)(k % 3));
      rc = DT_ECORRUPT;
    }
  }
  if (!rc) { /* a 288-byte message received as 289 bytes */
    rr[NZ] = REQ(rb[NZ], 289, 12, peer, DT_TP_RECV);
    struct dt_tp_req *one = &rr[NZ];
    if ((rc = T()->irecv(eps[peer], one)) == DT_OK)
      rc = T()->wait(ctx, &one, 1, dt_now_ns() + 20000000000ll, B->err[rank]);
    rc = rc == DT_EPROTO ? DT_OK : (snprintf(B->err[rank], DT_TP_ERR_MAX, "mismatch gave %d", rc), DT_EIO);
  }
out:
  teardown(size, ctx, eps);
  return rc;
}

/* Rank 0 waits on rank 1, rank 1 and the others wait on the last rank,
 * which the parent kills. */
static int body_kill(int rank, int size) {
  struct dt_tp_ctx *ctx;
  struct dt_tp_ep *eps[MAXR];
  int rc = setup(rank, size, &ctx, eps);
  if (rc) return rc;
  if (rank == size - 1) {
    atomic_fetch_add(&B->waiting, 1);
    for (;;) pause(); /* killed by the parent */
  }
  int from = rank == 0 && size > 2 ? 1 : size - 1;
  char buf[64];
  struct dt_tp_req r = REQ(buf, sizeof buf, 5, from, DT_TP_RECV), *rp = &r;
  if ((rc = T()->irecv(eps[from], &r))) goto out;
  atomic_fetch_add(&B->waiting, 1);
  double t0 = dt_now();
  rc = T()->wait(ctx, &rp, 1, dt_now_ns() + 30000000000ll, B->err[rank]);
  B->seconds[rank] = dt_now() - t0;
  if (rc == DT_EPEERLOST) T()->cancel(ctx, &r);
out:
  teardown(size, ctx, eps);
  return rc;
}

static int body_timeout(int rank, int size) {
  struct dt_tp_ctx *ctx;
  struct dt_tp_ep *eps[MAXR];
  int rc = setup(rank, size, &ctx, eps);
  if (rc) return rc;
  if (rank == 0) {
    char buf[8];
    struct dt_tp_req r = REQ(buf, sizeof buf, 9, 1, DT_TP_RECV), *rp = &r;
    T()->irecv(eps[1], &r);
    double t0 = dt_now();
    rc = T()->wait(ctx, &rp, 1, dt_now_ns() + 200000000ll, B->err[rank]);
    B->seconds[rank] = dt_now() - t0;
    T()->cancel(ctx, &r);
  } else {
    rc = DT_ETIMEDOUT; /* nothing to do; report the same code */
  }
  atomic_fetch_add(&B->waiting, 1);
  wait_count(&B->waiting, size);
  teardown(size, ctx, eps);
  return rc;
}

/* A single-copy message whose record is already in the ring when the
 * receive is posted is pulled inside irecv, and the wait returns at once;
 * the receiver then leaves the transport alone (as a rank does that goes on
 * to a window reduction). The sender must still get its ACK: before the
 * fix it stayed queued on the receiver until the sender's deadline. */
static int body_cma_ack(int rank, int size) {
  struct dt_tp_ctx *ctx;
  struct dt_tp_ep *eps[MAXR];
  int rc = setup(rank, size, &ctx, eps);
  if (rc) return rc;
  static unsigned char big[200000];
  if (rank == 1) {
    for (size_t i = 0; i < sizeof big; i++) big[i] = (unsigned char)(i * 7 + 1);
    struct dt_tp_req s = REQ(big, sizeof big, 5, 0, DT_TP_SEND), *sp = &s;
    T()->isend(eps[0], &s);
    atomic_store(&B->sent, 1);
    rc = T()->wait(ctx, &sp, 1, dt_now_ns() + 3000000000ll, B->err[rank]);
  } else {
    rc = wait_count(&B->sent, 1);
    usleep(20000); /* the record is in our ring; nothing has read it */
    struct dt_tp_req r = REQ(big, sizeof big, 5, 1, DT_TP_RECV), *rp = &r;
    if (!rc) T()->irecv(eps[1], &r);
    if (!rc) rc = T()->wait(ctx, &rp, 1, dt_now_ns() + 3000000000ll, B->err[rank]);
    for (size_t i = 0; !rc && i < sizeof big; i++)
      if (big[i] != (unsigned char)(i * 7 + 1)) rc = DT_EIO;
  }
  /* rank 0 waits here without calling the transport until rank 1's send
   * completed or failed */
  atomic_fetch_add(&B->waiting, 1);
  wait_count(&B->waiting, size);
  teardown(size, ctx, eps);
  return rc;
}

static int body_mismatch(int rank, int size) {
  struct dt_tp_ctx *ctx;
  struct dt_tp_ep *eps[MAXR];
  int rc = setup(rank, size, &ctx, eps);
  if (rc) return rc;
  char buf[4096] = {0};
  /* Small (ring) and large (single copy) messages, each 1 byte too long. */
  static char big[200000];
  int peer = 1 - rank;
  struct dt_tp_req s1 = REQ(buf, 101, 3, peer, DT_TP_SEND), s2 = REQ(big, sizeof big, 4, peer, DT_TP_SEND);
  struct dt_tp_req r1 = REQ(buf + 200, 100, 3, peer, DT_TP_RECV),
                   r2 = REQ(big, sizeof big - 1, 4, peer, DT_TP_RECV);
  struct dt_tp_req *rs[] = {&r1, &r2};
  if (rank == 0) {
    T()->isend(eps[1], &s1);
    T()->isend(eps[1], &s2);
    struct dt_tp_req *ss[] = {&s1, &s2};
    rc = T()->wait(ctx, ss, 2, dt_now_ns() + 5000000000ll, B->err[rank]);
    /* the large send learns of the mismatch through its ACK */
    rc = (s1.status == 1 && s2.status == DT_EPROTO) ? DT_EPROTO : DT_EIO;
  } else {
    T()->irecv(eps[0], &r1);
    T()->irecv(eps[0], &r2);
    /* wait() returns at the first failure: wait for each on its own */
    T()->wait(ctx, &rs[0], 1, dt_now_ns() + 5000000000ll, B->err[rank]);
    T()->wait(ctx, &rs[1], 1, dt_now_ns() + 5000000000ll, B->err[rank]);
    rc = (r1.status == DT_EPROTO && r2.status == DT_EPROTO) ? DT_EPROTO : DT_EIO;
  }
  teardown(size, ctx, eps);
  return rc;
}

/* Ping-pong over a 4 KiB ring without single copy, where every payload
 * word holds exactly the sequence value the receiver will expect at that
 * ring offset one lap later: if a stale payload could pass for a record
 * header, the receiver would read garbage here. */
static int body_stale(int rank, int size) {
  struct dt_tp_ctx *ctx;
  struct dt_tp_ep *eps[MAXR];
  int rc = setup(rank, size, &ctx, eps);
  if (rc) return rc;
  static const size_t lens[] = {40, 72, 200, 8, 1000, 24, 0, 120};
  uint64_t msg[128], want[128], pos = 0, ring = 4096;
  uint8_t ack = 1;
  for (int i = 0; i < 400 && !rc; i++) {
    size_t len = lens[i % 8];
    for (size_t j = 0; j < len / 8; j++) want[j] = pos + 32 + 8 * j + ring + 1;
    pos += 32 + ((len + 31) & ~(size_t)31);
    struct dt_tp_req d, a, *dp = &d, *ap = &a;
    if (rank == 0) {
      d = REQ(want, len, 11, 1, DT_TP_SEND);
      a = REQ(&ack, 1, 12, 1, DT_TP_RECV);
      if ((rc = T()->irecv(eps[1], &a)) || (rc = T()->isend(eps[1], &d))) break;
      struct dt_tp_req *v[2] = {dp, ap};
      rc = T()->wait(ctx, v, 2, dt_now_ns() + 5000000000ll, B->err[rank]);
    } else {
      d = REQ(msg, len, 11, 0, DT_TP_RECV);
      a = REQ(&ack, 1, 12, 0, DT_TP_SEND);
      if ((rc = T()->irecv(eps[0], &d))) break;
      if ((rc = T()->wait(ctx, &dp, 1, dt_now_ns() + 5000000000ll, B->err[rank]))) break;
      if (memcmp(msg, want, len)) {
        snprintf(B->err[rank], DT_TP_ERR_MAX, "message %d (%zu bytes) corrupted", i, len);
        rc = DT_ECORRUPT;
        break;
      }
      if ((rc = T()->isend(eps[0], &a))) break;
      rc = T()->wait(ctx, &ap, 1, dt_now_ns() + 5000000000ll, B->err[rank]);
    }
  }
  teardown(size, ctx, eps);
  return rc;
}

typedef int (*body_fn)(int rank, int size);

/* Every rank this test forked: segments are counted by creator pid, so
 * other shm tests running at the same time (ctest -j) do not count. */
static pid_t all_pids[1024];
static int nall_pids;

/* Forks size ranks running body; kill_last: SIGKILL the last rank once every
 * rank waits. Returns after every child is reaped (killing stragglers by pid
 * after 30 s). */
static void run(int size, body_fn body, bool kill_last, int *rcs) {
  memset(B, 0, sizeof *B);
  snprintf(job, sizeof job, "shmtest-%d-%f", (int)getpid(), dt_now());
  pid_t pids[MAXR];
  for (int r = 0; r < size; r++) {
    pids[r] = fork();
    assert_true(pids[r] >= 0);
    if (pids[r] > 0 && nall_pids < 1024) all_pids[nall_pids++] = pids[r];
    if (pids[r] == 0) {
      /* cmocka's handlers must not run a second test suite in the child. */
      signal(SIGSEGV, SIG_DFL);
      signal(SIGBUS, SIG_DFL);
      signal(SIGILL, SIG_DFL);
      signal(SIGFPE, SIG_DFL);
      signal(SIGABRT, SIG_DFL);
      int rc = body(r, size);
      B->rc[r] = rc;
      _exit(0);
    }
  }
  if (kill_last) {
    assert_int_equal(wait_count(&B->waiting, size), DT_OK);
    usleep(20000); /* let the survivors settle into their sleep */
    kill(pids[size - 1], SIGKILL);
  }
  double until = dt_now() + 30;
  int left = size;
  bool alive[MAXR];
  for (int r = 0; r < size; r++) alive[r] = true;
  while (left) {
    for (int r = 0; r < size; r++) {
      int st;
      if (alive[r] && waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        alive[r] = false;
        left--;
      }
    }
    if (left && dt_now() > until) {
      for (int r = 0; r < size; r++)
        if (alive[r]) { kill(pids[r], SIGKILL); waitpid(pids[r], NULL, 0); }
      fail_msg("ranks still running after 30 s");
    }
    usleep(1000);
  }
  for (int r = 0; r < size; r++) rcs[r] = B->rc[r];
}

static int count_segments(void) {
  int n = 0;
  DIR *d = opendir("/dev/shm");
  struct dirent *e;
  char pat[32];
  snprintf(pat, sizeof pat, "dtshm-");
  while (d && (e = readdir(d))) {
    unsigned long long jh, nonce;
    int rank, pid;
    if (strncmp(e->d_name, pat, strlen(pat)) ||
        sscanf(e->d_name + strlen(pat), "%16llx-%d-%d-%16llx", &jh, &rank, &pid, &nonce) != 4)
      continue;
    for (int i = 0; i < nall_pids; i++) n += all_pids[i] == pid;
  }
  if (d) closedir(d);
  return n;
}

static void exchange_sizes(void **state) {
  (void)state;
  int before = count_segments();
  int rcs[MAXR];
  const int worlds[] = {2, 3, 5};
  for (int w = 0; w < 3; w++) {
    /* size 3 moves everything from 64 KiB up single-copy, the others use
     * the default threshold */
    if (worlds[w] == 3) setenv("DTRAIN_SHM_CMA_BYTES", "65536", 1);
    dt__param_reload(); /* the knob table caches the environment */
    run(worlds[w], body_exchange, false, rcs);
    unsetenv("DTRAIN_SHM_CMA_BYTES");
    dt__param_reload(); /* the knob table caches the environment */
    for (int r = 0; r < worlds[w]; r++) {
      if (rcs[r]) fail_msg("size %d rank %d: %s (%s)", worlds[w], r, dt_strerror(rcs[r]), B->err[r]);
    }
  }
  assert_int_equal(count_segments(), before);
}

static void exchange_ring_only(void **state) {
  (void)state;
  setenv("DTRAIN_SHM_CMA_BYTES", "0", 1);
  dt__param_reload(); /* the knob table caches the environment */
  setenv("DTRAIN_SHM_RING_BYTES", "4096", 1);
  dt__param_reload(); /* the knob table caches the environment */
  int rcs[MAXR];
  run(3, body_exchange, false, rcs);
  unsetenv("DTRAIN_SHM_CMA_BYTES");
  dt__param_reload(); /* the knob table caches the environment */
  unsetenv("DTRAIN_SHM_RING_BYTES");
  dt__param_reload(); /* the knob table caches the environment */
  for (int r = 0; r < 3; r++)
    if (rcs[r]) fail_msg("rank %d: %s (%s)", r, dt_strerror(rcs[r]), B->err[r]);
}

static void stale_payload_not_a_header(void **state) {
  (void)state;
  setenv("DTRAIN_SHM_CMA_BYTES", "0", 1);
  dt__param_reload(); /* the knob table caches the environment */
  setenv("DTRAIN_SHM_RING_BYTES", "4096", 1);
  dt__param_reload(); /* the knob table caches the environment */
  int rcs[MAXR];
  run(2, body_stale, false, rcs);
  unsetenv("DTRAIN_SHM_CMA_BYTES");
  dt__param_reload(); /* the knob table caches the environment */
  unsetenv("DTRAIN_SHM_RING_BYTES");
  dt__param_reload(); /* the knob table caches the environment */
  for (int r = 0; r < 2; r++)
    if (rcs[r]) fail_msg("rank %d: %s (%s)", r, dt_strerror(rcs[r]), B->err[r]);
}

static void killed_peer(void **state) {
  (void)state;
  int rcs[MAXR];
  for (int size = 2; size <= 4; size++) {
    run(size, body_kill, true, rcs);
    char name[32];
    snprintf(name, sizeof name, "rank %d", size - 1);
    for (int r = 0; r < size - 1; r++) {
      if (rcs[r] != DT_EPEERLOST)
        fail_msg("size %d rank %d: want DT_EPEERLOST, got %s (%s)", size, r, dt_strerror(rcs[r]), B->err[r]);
      if (!strstr(B->err[r], name)) fail_msg("rank %d: message '%s' does not name %s", r, B->err[r], name);
      if (B->seconds[r] > 5.0) fail_msg("rank %d noticed only after %.2f s", r, B->seconds[r]);
    }
  }
}

static void zero_tails(void **state) {
  (void)state;
  int rcs[MAXR];
  for (int tiny = 0; tiny < 2; tiny++) {
    if (tiny) setenv("DTRAIN_SHM_RING_BYTES", "4096", 1); /* records wrap around the ring */
    dt__param_reload(); /* the knob table caches the environment */
    run(2, body_zeros, false, rcs);
    unsetenv("DTRAIN_SHM_RING_BYTES");
    dt__param_reload(); /* the knob table caches the environment */
    for (int r = 0; r < 2; r++)
      if (rcs[r]) fail_msg("ring %s rank %d: %s (%s)", tiny ? "4 KiB" : "default", r, dt_strerror(rcs[r]), B->err[r]);
  }
}

static void deadline(void **state) {
  (void)state;
  int rcs[MAXR];
  run(2, body_timeout, false, rcs);
  assert_int_equal(rcs[0], DT_ETIMEDOUT);
  assert_true(B->seconds[0] >= 0.19 && B->seconds[0] < 2.0);
  assert_non_null(strstr(B->err[0], "rank 1"));
}

static void cma_ack_after_early_pull(void **state) {
  (void)state;
  int rcs[MAXR];
  setenv("DTRAIN_SHM_CMA_BYTES", "65536", 1); /* the 200000-byte message goes single-copy */
  dt__param_reload(); /* the knob table caches the environment */
  atomic_store(&B->sent, 0);
  run(2, body_cma_ack, false, rcs);
  unsetenv("DTRAIN_SHM_CMA_BYTES");
  dt__param_reload(); /* the knob table caches the environment */
  for (int r = 0; r < 2; r++)
    if (rcs[r]) fail_msg("rank %d: %s (%s)", r, dt_strerror(rcs[r]), B->err[r]);
}

static void length_mismatch(void **state) {
  (void)state;
  int rcs[MAXR];
  setenv("DTRAIN_SHM_CMA_BYTES", "65536", 1); /* the 200000-byte message goes single-copy */
  dt__param_reload(); /* the knob table caches the environment */
  run(2, body_mismatch, false, rcs);
  unsetenv("DTRAIN_SHM_CMA_BYTES");
  dt__param_reload(); /* the knob table caches the environment */
  assert_int_equal(rcs[0], DT_EPROTO);
  assert_int_equal(rcs[1], DT_EPROTO);
}

int main(void) {
  B = mmap(NULL, sizeof *B, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (B == MAP_FAILED) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(exchange_sizes), cmocka_unit_test(exchange_ring_only),
      cmocka_unit_test(stale_payload_not_a_header),
      cmocka_unit_test(killed_peer),    cmocka_unit_test(deadline),
      cmocka_unit_test(length_mismatch), cmocka_unit_test(zero_tails),
      cmocka_unit_test(cma_ack_after_early_pull),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
