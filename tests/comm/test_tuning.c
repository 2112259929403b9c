/*
 * test_tuning.c — the algorithm choice of src/comm/tuning.c, as a table:
 * for world sizes 2-8 (and one oversubscribed world), one host or several
 * (fake host ids; even, uneven and one rank per host), sizes exactly at and
 * next to every threshold, the call's forced algorithm and DTRAIN_ALGO,
 * the expected allreduce / broadcast / allgather algorithm is chosen, and
 * every rank chooses the same.
 *
 *   - defaults: tree up to 32 KiB (DTRAIN_TREE_MAX_BYTES), RHD below 1 MiB
 *     for more than 2 ranks (DTRAIN_RING_MIN_BYTES), the ring from there;
 *     with more ranks than cores on one host and a power-of-two world RHD
 *     up to 32 MiB (DTRAIN_RING_MIN_OVERSUB_BYTES);
 *   - one rank per host and a world that is not a power of two: the ring
 *     from 32 KiB + 1 (RHD's fold would double one rank's network traffic);
 *   - hier from 64 KiB (DTRAIN_HIER_MIN_BYTES) only when there are several
 *     hosts and some host has several ranks; forced hier elsewhere falls
 *     back to the automatic choice (it would recurse), forced ring/rhd/tree
 *     are kept, forced direct is not an allreduce;
 *   - DTRAIN_ALGO forces the communicator's algorithm unless the config
 *     does; a bad name is ignored; the size knobs move the boundaries.
 * Environment cases run in a fresh process (this binary re-executed with a
 * case name), so knobs read once and cached cannot leak between cases.
 * Ranks are threads over the inproc transport, with a store on port 0.
 * Not here: whether the algorithms are right (test_comm_conformance_mt).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "comm/algo/algo.h"
#include "comm/comm.h"
#include "../dt_skip.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define MAXR 64
#define MAXC 64

enum coll { ALLREDUCE, BROADCAST, ALLGATHER };
static const char *const coll_name[] = {"allreduce", "broadcast", "allgather"};

/* One row of the table: collective, bytes, forced algorithm, expected. */
typedef struct tcase {
  enum coll coll;
  size_t bytes;
  dt_algo forced; /* DT_ALGO_AUTO: the communicator's own (DTRAIN_ALGO or config) */
  dt_algo want;
} tcase;

/* A world: n ranks, rank r on host hosts[r] (NULL: all on one host), the
 * config's forced algorithm, and the table to check on every rank. */
typedef struct world {
  int n;
  const int *hosts;
  dt_algo cfg_algo;
  const tcase *cases;
  int ncases;
  dt_algo want_comm_algo; /* what dt_comm_algo must say */
  int port;
  const char *job;
  /* results */
  dt_algo got[MAXR][MAXC];
  dt_algo comm_algo[MAXR];
  int rc[MAXR];
  char err[MAXR][256];
} world;

typedef struct rank_arg {
  world *w;
  int rank;
} rank_arg;

static dt_algo pick(const dt_comm *c, const tcase *t) {
  dt_algo forced = t->forced != DT_ALGO_AUTO ? t->forced : dt_comm_algo(c);
  switch (t->coll) {
  case ALLREDUCE: return dt__tune_allreduce(c, t->bytes, forced);
  case BROADCAST: return dt__tune_broadcast(c, t->bytes, forced);
  default: return dt__tune_allgather(c, t->bytes, forced);
  }
}

static void *rank_main(void *p) {
  rank_arg *a = p;
  world *w = a->w;
  int r = a->rank;
  dt_store *st = NULL;
  dt_comm *c = NULL;
  if ((w->rc[r] = dt_store_connect(&st, "127.0.0.1", w->port, NULL, 30)) < 0) {
    snprintf(w->err[r], sizeof w->err[r], "store: %s", dt_errmsg());
    return NULL;
  }
  struct dt_comm_config cfg = DT_COMM_CONFIG_INIT;
  cfg.transport = "inproc";
  cfg.rank = r;
  cfg.size = w->n;
  cfg.job = w->job;
  cfg.timeout_s = 60;
  cfg.algo = w->cfg_algo;
  char host[32];
  snprintf(host, sizeof host, "tune-h%d", w->hosts ? w->hosts[r] : 0);
  cfg.host_id = host;
  w->rc[r] = dt_comm_create(&c, st, &cfg);
  dt_store_destroy(st);
  if (w->rc[r] < 0) {
    snprintf(w->err[r], sizeof w->err[r], "comm create: %s", dt_errmsg());
    return NULL;
  }
  w->comm_algo[r] = dt_comm_algo(c);
  for (int i = 0; i < w->ncases; i++) w->got[r][i] = pick(c, &w->cases[i]);
  w->rc[r] = dt_comm_barrier(c); /* nobody leaves while another still creates */
  dt_comm_destroy(c);
  return NULL;
}

/* Runs the world; returns the number of mismatches (each printed). */
static int run_world(world *w, const char *label) {
  static int jobs;
  char job[64];
  snprintf(job, sizeof job, "tune%d-%d", (int)getpid(), jobs++);
  w->job = job;
  dt_store_server *srv = NULL;
  if (dt_store_server_start(&srv, "127.0.0.1", 0, NULL) < 0) {
    fprintf(stderr, "%s: store server: %s\n", label, dt_errmsg());
    return 1;
  }
  w->port = dt_store_server_port(srv);
  pthread_t th[MAXR];
  rank_arg args[MAXR];
  for (int r = 0; r < w->n; r++) {
    args[r] = (rank_arg){w, r};
    if (pthread_create(&th[r], NULL, rank_main, &args[r]) != 0) {
      fprintf(stderr, "%s: cannot start rank %d\n", label, r);
      for (int k = 0; k < r; k++) pthread_join(th[k], NULL);
      dt_store_server_stop(srv);
      return 1;
    }
  }
  for (int r = 0; r < w->n; r++) pthread_join(th[r], NULL);
  dt_store_server_stop(srv);
  int bad = 0;
  for (int r = 0; r < w->n; r++) {
    if (w->rc[r] < 0) {
      fprintf(stderr, "%s: rank %d: rc %d: %s\n", label, r, w->rc[r], w->err[r]);
      bad++;
      continue;
    }
    if (w->comm_algo[r] != w->want_comm_algo) {
      fprintf(stderr, "%s: rank %d: communicator algorithm %s, want %s\n", label, r,
              dt_algo_name(w->comm_algo[r]), dt_algo_name(w->want_comm_algo));
      bad++;
    }
    for (int i = 0; i < w->ncases; i++) {
      const tcase *t = &w->cases[i];
      if (w->got[r][i] != t->want) {
        fprintf(stderr, "%s: rank %d of %d: %s of %zu bytes, forced %s: got %s, want %s\n", label, r,
                w->n, coll_name[t->coll], t->bytes, dt_algo_name(t->forced),
                dt_algo_name(w->got[r][i]), dt_algo_name(t->want));
        bad++;
      }
    }
  }
  return bad;
}

static int check(int n, const int *hosts, dt_algo cfg_algo, dt_algo want_comm, const tcase *cases,
                 int ncases, const char *label) {
  static world w; /* large: not on the stack */
  memset(&w, 0, sizeof w);
  w.n = n;
  w.hosts = hosts;
  w.cfg_algo = cfg_algo;
  w.want_comm_algo = want_comm;
  w.cases = cases;
  w.ncases = ncases;
  return run_world(&w, label);
}
#define CHECK(n, hosts, cases, label)                                                              \
  check(n, hosts, DT_ALGO_AUTO, DT_ALGO_AUTO, cases, (int)(sizeof cases / sizeof *cases), label)

#define AR(b, f, w) {ALLREDUCE, (b), DT_ALGO_##f, DT_ALGO_##w}
#define BC(b, f, w) {BROADCAST, (b), DT_ALGO_##f, DT_ALGO_##w}
#define AG(b, f, w) {ALLGATHER, (b), DT_ALGO_##f, DT_ALGO_##w}

static long cores(void) { return sysconf(_SC_NPROCESSORS_ONLN); }

/* ---- one host ------------------------------------------------------------------ */

static void test_two_ranks(void **state) {
  (void)state;
  /* 2 ranks: tree up to 32 KiB, then the ring (RHD is for more than 2) */
  static const tcase t[] = {
      AR(0, AUTO, TREE),          AR(4, AUTO, TREE),          AR(32 * KIB, AUTO, TREE),
      AR(32 * KIB + 1, AUTO, RING), AR(MIB - 1, AUTO, RING),  AR(MIB, AUTO, RING),
      AR(64 * MIB, AUTO, RING),
      /* forced ring / rhd / tree are kept at any size */
      AR(4, RING, RING),          AR(64 * MIB, TREE, TREE),   AR(100 * KIB, RHD, RHD),
      /* hier on one host would recurse: automatic choice instead */
      AR(4, HIER, TREE),          AR(64 * MIB, HIER, RING),
      /* direct is no allreduce algorithm */
      AR(64 * MIB, DIRECT, RING),
      /* broadcast: the tree for 2 ranks at every size; forced ring kept */
      BC(4, AUTO, TREE),          BC(64 * MIB, AUTO, TREE),   BC(4, RING, RING),
      BC(4, RHD, TREE),
      /* allgather: direct while bytes x ranks <= 64 KiB */
      AG(32 * KIB, AUTO, DIRECT), AG(32 * KIB + 1, AUTO, RING), AG(4, RING, RING),
      AG(MIB, DIRECT, DIRECT),
  };
  assert_int_equal(CHECK(2, NULL, t, "2 ranks, 1 host"), 0);
}

static void test_three_ranks(void **state) {
  (void)state;
  /* 3 ranks (not a power of two: oversubscribed or not, the plain
   * thresholds): tree, RHD from 32 KiB + 1, ring from 1 MiB */
  static const tcase t[] = {
      AR(32 * KIB, AUTO, TREE), AR(32 * KIB + 1, AUTO, RHD), AR(MIB - 1, AUTO, RHD),
      AR(MIB, AUTO, RING),      AR(32 * MIB, AUTO, RING),    AR(8, RING, RING),
      AR(64 * MIB, RHD, RHD),   AR(MIB, HIER, RING),
      BC(MIB - 1, AUTO, TREE),  BC(MIB, AUTO, RING),         BC(64 * MIB, TREE, TREE),
      AG(21 * KIB, AUTO, DIRECT), AG(22 * KIB, AUTO, RING), /* 3 x 21 KiB <= 64 KiB < 3 x 22 KiB */
  };
  assert_int_equal(CHECK(3, NULL, t, "3 ranks, 1 host"), 0);
}

/* A power-of-two world on one host: RHD up to 32 MiB when it outnumbers
 * the cores, up to 1 MiB otherwise. */
static void power_of_two_world(int n) {
  int over = n > cores();
  size_t ring_min = over ? 32 * MIB : MIB;
  dt_algo at_1m = over ? DT_ALGO_RHD : DT_ALGO_RING;
  const tcase t[] = {
      AR(32 * KIB, AUTO, TREE),
      AR(32 * KIB + 1, AUTO, RHD),
      AR(MIB - 1, AUTO, RHD),
      {ALLREDUCE, MIB, DT_ALGO_AUTO, at_1m},
      {ALLREDUCE, ring_min - 1, DT_ALGO_AUTO, DT_ALGO_RHD},
      {ALLREDUCE, ring_min, DT_ALGO_AUTO, DT_ALGO_RING},
      AR(64 * MIB, AUTO, RING),
      AR(4 * MIB, RING, RING),
      /* broadcast does not look at oversubscription */
      BC(MIB, AUTO, RING),
  };
  char label[64];
  snprintf(label, sizeof label, "%d ranks, 1 host, %ld cores%s", n, cores(),
           over ? " (oversubscribed)" : "");
  print_message("%s\n", label);
  assert_int_equal(check(n, NULL, DT_ALGO_AUTO, DT_ALGO_AUTO, t, (int)(sizeof t / sizeof *t), label),
                   0);
}

static void test_four_and_eight_ranks(void **state) {
  (void)state;
  power_of_two_world(4);
  power_of_two_world(8);
}

static void test_oversubscribed(void **state) {
  (void)state;
  /* the smallest power-of-two world with more ranks than cores here */
  int n = 2;
  while (n <= cores()) n *= 2;
  if (n > MAXR) DT_SKIP("%ld cores: an oversubscribed world would need %d ranks (> %d)", cores(), n, MAXR);
  power_of_two_world(n);
  /* exactly as many ranks as cores is not oversubscribed (a power-of-two
   * world with more than 2 ranks only: with 2 RHD is never chosen) */
  long nc = cores();
  if (nc > 2 && nc <= MAXR && (nc & (nc - 1)) == 0)
    power_of_two_world((int)nc);
  else
    print_message("%ld cores: the ranks == cores boundary needs a power of two > 2; not checked here\n", nc);
  /* and one rank fewer than that (not a power of two): the plain ring threshold */
  if (n - 1 > 2) {
    const tcase t[] = {AR(MIB - 1, AUTO, RHD), AR(MIB, AUTO, RING)};
    assert_int_equal(check(n - 1, NULL, DT_ALGO_AUTO, DT_ALGO_AUTO, t, 2, "n-1 ranks, 1 host"), 0);
  }
}

/* ---- several hosts -------------------------------------------------------------- */

static void test_hier_where_a_host_has_several_ranks(void **state) {
  (void)state;
  /* 2 hosts x 2 ranks: hier from 64 KiB; below, the one-host rules (tree,
   * then RHD: the oversubscription rule is for one host only) */
  static const int h22[] = {0, 0, 1, 1};
  static const tcase t22[] = {
      AR(32 * KIB, AUTO, TREE), AR(32 * KIB + 1, AUTO, RHD), AR(64 * KIB - 1, AUTO, RHD),
      AR(64 * KIB, AUTO, HIER), AR(MIB, AUTO, HIER),         AR(64 * MIB, AUTO, HIER),
      /* forced hier is kept even where auto would not choose it */
      AR(4, HIER, HIER),        AR(64 * MIB, RING, RING),    AR(MIB, TREE, TREE),
  };
  assert_int_equal(CHECK(4, h22, t22, "2 hosts x 2 ranks"), 0);
  /* uneven: 2 + 1 */
  static const int h21[] = {0, 0, 1};
  static const tcase t21[] = {
      AR(64 * KIB - 1, AUTO, RHD), AR(64 * KIB, AUTO, HIER), AR(8, HIER, HIER),
  };
  assert_int_equal(CHECK(3, h21, t21, "hosts of 2 and 1 ranks"), 0);
  /* hosts interleaved (rank order does not group them): 0 1 0 1 */
  static const int hx[] = {0, 1, 0, 1};
  static const tcase tx[] = {AR(64 * KIB, AUTO, HIER), AR(64 * KIB - 1, AUTO, RHD)};
  assert_int_equal(CHECK(4, hx, tx, "2 interleaved hosts x 2 ranks"), 0);
}

static void test_no_hier_with_one_rank_per_host(void **state) {
  (void)state;
  /* one rank per host: hier would recurse on the leaders; never chosen,
   * and a forced hier falls back to the automatic choice */
  static const int h2[] = {0, 1};
  static const tcase t2[] = {
      AR(64 * KIB, AUTO, RING), AR(64 * MIB, AUTO, RING), AR(64 * MIB, HIER, RING),
      AR(8, HIER, TREE),
  };
  assert_int_equal(CHECK(2, h2, t2, "2 hosts x 1 rank"), 0);
  static const int h4[] = {0, 1, 2, 3};
  static const tcase t4[] = {
      /* 4 hosts of one rank: not one oversubscribed host, so RHD only
       * below 1 MiB whatever the cores */
      AR(64 * KIB, AUTO, RHD), AR(MIB - 1, AUTO, RHD), AR(MIB, AUTO, RING),
      AR(MIB, HIER, RING),     AR(100 * KIB, HIER, RHD),
  };
  assert_int_equal(CHECK(4, h4, t4, "4 hosts x 1 rank"), 0);
  /* 3 hosts of one rank (not a power of two): the ring above the tree,
   * since RHD's fold would send the vector twice over one rank's link */
  static const int h3[] = {0, 1, 2};
  static const tcase t3[] = {
      AR(32 * KIB, AUTO, TREE), AR(32 * KIB + 1, AUTO, RING), AR(128 * KIB, AUTO, RING),
      AR(MIB - 1, AUTO, RING),  AR(MIB, AUTO, RING),          AR(128 * KIB, RHD, RHD),
  };
  assert_int_equal(CHECK(3, h3, t3, "3 hosts x 1 rank"), 0);
}

/* ---- forced through the config and the environment ---------------------------------- */

static void test_config_algo(void **state) {
  (void)state;
  /* the config's algorithm is the communicator's; a call's own wins */
  static const tcase t[] = {AR(8, AUTO, RING), AR(64 * MIB, AUTO, RING), AR(8, TREE, TREE),
                            BC(8, AUTO, RING)};
  assert_int_equal(check(3, NULL, DT_ALGO_RING, DT_ALGO_RING, t, 4, "config algo ring"), 0);
  static const tcase th[] = {AR(8, AUTO, TREE), AR(MIB, AUTO, RING)}; /* hier on one host: auto */
  assert_int_equal(check(3, NULL, DT_ALGO_HIER, DT_ALGO_HIER, th, 2, "config algo hier, 1 host"), 0);
}

/* Environment cases, each in a fresh process (main's `env` mode). */
static int env_case(const char *name) {
  if (!strcmp(name, "algo_rhd")) { /* DTRAIN_ALGO=rhd */
    static const tcase t[] = {AR(8, AUTO, RHD), AR(64 * MIB, AUTO, RHD), AR(8, TREE, TREE),
                              BC(8, AUTO, TREE)};
    return check(3, NULL, DT_ALGO_AUTO, DT_ALGO_RHD, t, 4, "DTRAIN_ALGO=rhd");
  }
  if (!strcmp(name, "algo_hier")) { /* DTRAIN_ALGO=hier: only where a host has several ranks */
    static const int h22[] = {0, 0, 1, 1};
    static const tcase t[] = {AR(8, AUTO, HIER), AR(64 * MIB, AUTO, HIER)};
    int bad = check(4, h22, DT_ALGO_AUTO, DT_ALGO_HIER, t, 2, "DTRAIN_ALGO=hier, 2 hosts x 2");
    static const int h2[] = {0, 1};
    static const tcase t1[] = {AR(8, AUTO, TREE), AR(64 * MIB, AUTO, RING)};
    return bad + check(2, h2, DT_ALGO_AUTO, DT_ALGO_HIER, t1, 2, "DTRAIN_ALGO=hier, 2 hosts x 1");
  }
  if (!strcmp(name, "algo_config_wins")) { /* DTRAIN_ALGO=rhd, config tree */
    static const tcase t[] = {AR(64 * MIB, AUTO, TREE)};
    return check(3, NULL, DT_ALGO_TREE, DT_ALGO_TREE, t, 1, "config tree over DTRAIN_ALGO=rhd");
  }
  if (!strcmp(name, "algo_bad")) { /* DTRAIN_ALGO=fastest: ignored */
    static const tcase t[] = {AR(8, AUTO, TREE), AR(64 * MIB, AUTO, RING)};
    return check(3, NULL, DT_ALGO_AUTO, DT_ALGO_AUTO, t, 2, "DTRAIN_ALGO=fastest");
  }
  if (!strcmp(name, "knobs")) { /* tree <= 100, ring >= 1000, hier >= 500 */
    static const tcase t[] = {AR(100, AUTO, TREE), AR(101, AUTO, RHD), AR(999, AUTO, RHD),
                              AR(1000, AUTO, RING), BC(999, AUTO, TREE), BC(1000, AUTO, RING)};
    int bad = CHECK(3, NULL, t, "knobs, 3 ranks");
    static const int h22[] = {0, 0, 1, 1};
    static const tcase th[] = {AR(100, AUTO, TREE), AR(499, AUTO, RHD), AR(500, AUTO, HIER)};
    return bad + CHECK(4, h22, th, "knobs, 2 hosts x 2");
  }
  if (!strcmp(name, "knob_oversub")) { /* DTRAIN_RING_MIN_OVERSUB_BYTES=40000 */
    int n = 2;
    while (n <= cores()) n *= 2;
    if (n > MAXR) return 0; /* reported by test_oversubscribed */
    static const tcase t[] = {AR(39999, AUTO, RHD), AR(40000, AUTO, RING), AR(MIB, AUTO, RING)};
    return CHECK(n, NULL, t, "DTRAIN_RING_MIN_OVERSUB_BYTES=40000");
  }
  fprintf(stderr, "unknown env case %s\n", name);
  return 1;
}

static const char *self_exe;

/* Runs env case `name` in a fresh process with VAR=VALUE pairs set. */
static void run_env_case(const char *name, const char *const *env) {
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    unsetenv("DTRAIN_ALGO");
    for (int i = 0; env[i]; i += 2) setenv(env[i], env[i + 1], 1); /* read fresh after exec */
    execl(self_exe, self_exe, "env", name, (char *)NULL);
    _exit(127);
  }
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fail_msg("env case %s: status 0x%x", name, st);
}

static void test_env_algo(void **state) {
  (void)state;
  run_env_case("algo_rhd", (const char *const[]){"DTRAIN_ALGO", "rhd", NULL});
  run_env_case("algo_hier", (const char *const[]){"DTRAIN_ALGO", "hier", NULL});
  run_env_case("algo_config_wins", (const char *const[]){"DTRAIN_ALGO", "rhd", NULL});
  run_env_case("algo_bad", (const char *const[]){"DTRAIN_ALGO", "fastest", NULL});
}

static void test_env_knobs(void **state) {
  (void)state;
  run_env_case("knobs", (const char *const[]){"DTRAIN_TREE_MAX_BYTES", "100", "DTRAIN_RING_MIN_BYTES",
                                              "1000", "DTRAIN_HIER_MIN_BYTES", "500", NULL});
  run_env_case("knob_oversub", (const char *const[]){"DTRAIN_RING_MIN_OVERSUB_BYTES", "40000", NULL});
}

int main(int argc, char **argv) {
  self_exe = argv[0];
  if (argc == 3 && !strcmp(argv[1], "env")) return env_case(argv[2]) ? 1 : 0;
  /* the table assumes the default thresholds */
  static const char *const knobs[] = {"DTRAIN_ALGO", "DTRAIN_TREE_MAX_BYTES", "DTRAIN_RING_MIN_BYTES",
                                      "DTRAIN_RING_MIN_OVERSUB_BYTES", "DTRAIN_HIER_MIN_BYTES"};
  for (size_t i = 0; i < sizeof knobs / sizeof *knobs; i++) unsetenv(knobs[i]);
  dt__param_reload(); /* the knob table caches the environment */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_two_ranks),
      cmocka_unit_test(test_three_ranks),
      cmocka_unit_test(test_four_and_eight_ranks),
      cmocka_unit_test(test_oversubscribed),
      cmocka_unit_test(test_hier_where_a_host_has_several_ranks),
      cmocka_unit_test(test_no_hier_with_one_rank_per_host),
      cmocka_unit_test(test_config_algo),
      cmocka_unit_test(test_env_algo),
      cmocka_unit_test(test_env_knobs),
  };
  return dt_skip_status(cmocka_run_group_tests(tests, NULL, NULL));
}
