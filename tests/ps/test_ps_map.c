/*
 * test_ps_map.c — the parameter server's key-range map (src/ps/keymap.c):
 * shares balanced by bytes (every server within an eighth of P/S plus the
 * layer it may keep whole), small layers kept whole, a large layer split
 * between servers, keys covering every float exactly once in order, the
 * same digest for the same input and a different one for another model or
 * server count, refusals of impossible maps, and dense keys cut into
 * pieces (DTRAIN_PS_PIECE, for every layer or per layer) with the same
 * server ranges, rows never cut,
 * and a large first layer cut evenly over the servers (bsp's maps).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "ps/ps.h"

static void check_cover(const dt_ps_map *m, const uint64_t *len, int nl) {
  uint64_t at = 0;
  for (int k = 0; k < m->nkeys; k++) {
    assert_int_equal(m->keys[k].off, at);
    assert_true(m->keys[k].len > 0);
    at += m->keys[k].len;
    /* a key lies inside its layer and its server's range */
    uint64_t lo = 0;
    for (int i = 0; i < m->keys[k].layer; i++) lo += len[i];
    assert_true(m->keys[k].off >= lo && m->keys[k].off + m->keys[k].len <= lo + len[m->keys[k].layer]);
    int s = m->keys[k].server;
    assert_true(m->keys[k].off >= m->srv_lo[s] && m->keys[k].off + m->keys[k].len <= m->srv_lo[s + 1]);
    assert_true(k >= m->srv_key0[s] && k < m->srv_key0[s + 1]);
  }
  assert_int_equal(at, m->nparams);
  (void)nl;
}

static void test_balanced(void **state) {
  (void)state;
  /* an MLP: 784x256+256, 0, 256x128+128, 0, 128x10+10 */
  uint64_t len[] = {0, 200960, 0, 32896, 0, 1290};
  for (int S = 1; S <= 4; S++) {
    dt_ps_map m;
    assert_int_equal(dt_ps_map_build(&m, len, 6, S), DT_OK);
    check_cover(&m, len, 6);
    assert_int_equal(m.nservers, S);
    uint64_t share = m.nparams / (uint64_t)S;
    for (int s = 0; s < S; s++) {
      uint64_t got = m.srv_lo[s + 1] - m.srv_lo[s];
      /* within an eighth of a share of the even split at every boundary */
      assert_true(got + 2 * (share / 8) + 2 >= share && got <= share + 2 * (share / 8) + 2);
    }
    dt_ps_map_free(&m);
  }
  /* 2 servers: the big first layer is split between them, the small ones stay whole */
  dt_ps_map m;
  assert_int_equal(dt_ps_map_build(&m, len, 6, 2), DT_OK);
  assert_int_equal(m.keys[0].layer, 1);
  assert_int_equal(m.keys[1].layer, 1);
  assert_int_equal(m.keys[0].server, 0);
  assert_int_equal(m.keys[1].server, 1);
  for (int k = 2; k < m.nkeys; k++) assert_int_equal(m.keys[k].server, 1);
  assert_int_equal(m.nkeys, 4);
  dt_ps_map_free(&m);
}

static void test_snaps_to_layers(void **state) {
  (void)state;
  /* four equal layers over two servers: the boundary is the middle layer boundary */
  uint64_t len[] = {1000, 1000, 1000, 1000};
  dt_ps_map m;
  assert_int_equal(dt_ps_map_build(&m, len, 4, 2), DT_OK);
  assert_int_equal(m.srv_lo[1], 2000);
  assert_int_equal(m.nkeys, 4);
  dt_ps_map_free(&m);
  /* 1000, 1100: the even split (1050) is 50 from a boundary (< 2100/2/8): snapped */
  uint64_t l2[] = {1000, 1100};
  assert_int_equal(dt_ps_map_build(&m, l2, 2, 2), DT_OK);
  assert_int_equal(m.srv_lo[1], 1000);
  assert_int_equal(m.nkeys, 2);
  dt_ps_map_free(&m);
  /* 100, 10000: far from any boundary: the large layer is split */
  uint64_t l3[] = {100, 10000};
  assert_int_equal(dt_ps_map_build(&m, l3, 2, 2), DT_OK);
  assert_int_equal(m.srv_lo[1], 5050);
  assert_int_equal(m.nkeys, 3);
  check_cover(&m, l3, 2);
  dt_ps_map_free(&m);
}

static void test_digest(void **state) {
  (void)state;
  uint64_t a[] = {10, 20, 30}, b[] = {10, 20, 31};
  dt_ps_map x, y, z, w;
  assert_int_equal(dt_ps_map_build(&x, a, 3, 2), DT_OK);
  assert_int_equal(dt_ps_map_build(&y, a, 3, 2), DT_OK);
  assert_int_equal(dt_ps_map_build(&z, b, 3, 2), DT_OK);
  assert_int_equal(dt_ps_map_build(&w, a, 3, 3), DT_OK);
  assert_memory_equal(x.sha, y.sha, 32);
  assert_memory_not_equal(x.sha, z.sha, 32);
  assert_memory_not_equal(x.sha, w.sha, 32);
  char buf[512];
  size_t n = dt_ps_map_describe(&x, NULL, buf, sizeof buf);
  assert_true(n > 0 && n < sizeof buf);
  assert_non_null(strstr(buf, "server 0"));
  assert_non_null(strstr(buf, "server 1"));
  dt_ps_map_free(&x);
  dt_ps_map_free(&y);
  dt_ps_map_free(&z);
  dt_ps_map_free(&w);
}

static void test_pieces(void **state) {
  (void)state;
  /* the MLP over 2 servers, pieces of at most 32768 floats */
  uint64_t len[] = {0, 200960, 0, 32896, 0, 1290};
  dt_ps_map w, p;
  assert_int_equal(dt_ps_map_build(&w, len, 6, 2), DT_OK);
  assert_int_equal(dt_ps_map_build_pieces(&p, len, NULL, 6, 2, 32768, 0), DT_OK);
  check_cover(&p, len, 6);
  assert_int_equal(p.srv_lo[1], w.srv_lo[1]); /* the same server ranges */
  assert_memory_not_equal(p.sha, w.sha, 32);
  /* layer 2 (floats [0, 200960)): 117573 on server 0 -> 4 pieces, 83387 on
   * server 1 -> 3; layer 4: 2; layer 6: 1 */
  assert_int_equal(p.nkeys, 10);
  assert_int_equal(p.srv_key0[1], 4);
  for (int k = 0; k < p.nkeys; k++) {
    assert_true(p.keys[k].len <= 32768);
    if (k + 1 < p.nkeys && p.keys[k + 1].layer == p.keys[k].layer &&
        p.keys[k + 1].server == p.keys[k].server) { /* near-equal */
      uint64_t a = p.keys[k].len, b = p.keys[k + 1].len;
      assert_true(a + 1 >= b && b + 1 >= a);
    }
  }
  char buf[1024];
  dt_ps_map_describe(&p, NULL, buf, sizeof buf);
  assert_non_null(strstr(buf, "keys 0-3 = layer 2 [0, 117573) (4 pieces)"));
  /* piece 0: the map without pieces */
  dt_ps_map z;
  assert_int_equal(dt_ps_map_build_pieces(&z, len, NULL, 6, 2, 0, 0), DT_OK);
  assert_memory_equal(z.sha, w.sha, 32);
  dt_ps_map_free(&z);
  dt_ps_map_free(&p);
  dt_ps_map_free(&w);
  /* rows (an embedding of 1000 rows of 16) are never cut into pieces */
  uint64_t el[] = {16000, 5000}, rl[] = {16, 1};
  assert_int_equal(dt_ps_map_build_pieces(&p, el, rl, 2, 1, 1000, 0), DT_OK);
  check_cover(&p, el, 2);
  assert_int_equal(p.nkeys, 6);
  assert_int_equal(p.keys[0].len, 16000);
  assert_int_equal(p.keys[0].rowlen, 16);
  dt_ps_map_free(&p);
  /* a piece per layer: only layer 2 cut (the default's choice for a first
   * linear layer); layer 4 stays one key although longer than the piece */
  uint64_t lp[] = {0, 32768, 0, 0, 0, 0};
  assert_int_equal(dt_ps_map_build_layers(&p, len, NULL, lp, 6, 2, 32768, 0), DT_OK);
  check_cover(&p, len, 6);
  assert_int_equal(p.nkeys, 9);
  assert_int_equal(p.srv_key0[1], 4);
  assert_int_equal(p.keys[7].len, 32896);
  assert_int_equal(p.keys[7].layer, 3);
  dt_ps_map_free(&p);
}

static void test_even_first(void **state) {
  (void)state;
  /* the MLP: layer 2 (the first with floats, final last) cut evenly */
  uint64_t len[] = {0, 200960, 0, 32896, 0, 1290};
  dt_ps_map m;
  assert_int_equal(dt_ps_map_build_pieces(&m, len, NULL, 6, 2, 0, 1), DT_OK);
  check_cover(&m, len, 6);
  assert_int_equal(m.srv_lo[1], 100480);
  assert_int_equal(m.nkeys, 4);
  dt_ps_map_free(&m);
  assert_int_equal(dt_ps_map_build_pieces(&m, len, NULL, 6, 3, 0, 1), DT_OK);
  check_cover(&m, len, 6);
  assert_int_equal(m.srv_lo[1], 66986);
  assert_int_equal(m.srv_lo[2], 133973);
  dt_ps_map_free(&m);
  /* a small first layer: balanced by bytes as without */
  uint64_t cnn[] = {320, 0, 18496, 401536, 1290};
  dt_ps_map a, b;
  assert_int_equal(dt_ps_map_build_pieces(&a, cnn, NULL, 5, 2, 0, 1), DT_OK);
  assert_int_equal(dt_ps_map_build(&b, cnn, 5, 2), DT_OK);
  assert_memory_equal(a.sha, b.sha, 32);
  dt_ps_map_free(&a);
  dt_ps_map_free(&b);
}

static void test_refusals(void **state) {
  (void)state;
  uint64_t a[] = {3, 0};
  dt_ps_map m;
  assert_int_equal(dt_ps_map_build(&m, a, 2, 0), DT_EINVAL);
  assert_int_equal(dt_ps_map_build(&m, a, 2, 4), DT_EINVAL);
  assert_non_null(strstr(dt_errmsg(), "4 servers for 3 parameters"));
  uint64_t z[] = {0, 0};
  assert_int_equal(dt_ps_map_build(&m, z, 2, 1), DT_EINVAL);
  assert_int_equal(dt_ps_map_build(&m, a, 2, 3), DT_OK); /* one float each */
  assert_int_equal(m.nkeys, 3);
  dt_ps_map_free(&m);
  dt_ps_map_free(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_balanced),
      cmocka_unit_test(test_snaps_to_layers),
      cmocka_unit_test(test_digest),
      cmocka_unit_test(test_pieces),
      cmocka_unit_test(test_even_first),
      cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
