/*
 * test_loader_mt.c — the prefetching loader (also run under
 * ThreadSanitizer): every batch is exactly the samples of the epoch order
 * at its positions; prefetch 0, 1, 3 and 8 give identical batches over
 * several epochs, with and without drop_last and shards; shards of one
 * epoch cover every position once; restarting an epoch mid-way and
 * destroying mid-epoch (or before any epoch) neither hangs nor leaks.
 * A watchdog alarm turns any hang into a failure.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "core/core.h"
#include "data/data.h"

/* Sample s has x[s][k] = s * 1000 + k and label s % 10, so a batch row
 * names the sample it came from. */
static dt_dataset make_ds(int64_t n, int64_t dim) {
  dt_dataset ds = {0};
  ds.n = n;
  ds.dim = dim;
  ds.c = ds.h = 1;
  ds.w = (int)dim;
  ds.nclasses = 10;
  ds.x = dt_alloc((size_t)(n * dim) * sizeof(float));
  ds.y = dt_alloc((size_t)n * sizeof(int32_t));
  for (int64_t s = 0; s < n; s++) {
    ds.y[s] = (int32_t)(s % 10);
    for (int64_t k = 0; k < dim; k++) ds.x[s * dim + k] = (float)(s * 1000 + k);
  }
  return ds;
}

/* Runs `epochs` epochs, checks each batch against the order and appends
 * every batch's sample ids to out (caller-sized). Returns ids written. */
static int64_t run(const dt_dataset *ds, dt_loader_cfg cfg, int epochs, int64_t *out) {
  dt_loader *l;
  assert_int_equal(dt_loader_create(&l, ds, &cfg), DT_OK);
  int64_t *order = malloc((size_t)ds->n * sizeof(int64_t));
  int64_t begin = cfg.shard_begin, end = cfg.shard_end;
  if (begin == 0 && end == 0) end = ds->n;
  int64_t w = 0;
  for (int e = 0; e < epochs; e++) {
    assert_int_equal(dt_loader_start_epoch(l, (uint64_t)e), DT_OK);
    dt_epoch_order(order, ds->n, cfg.seed, (uint64_t)e, cfg.shuffle);
    dt_batch b;
    int64_t nb = 0, pos = begin;
    int rc;
    while ((rc = dt_loader_next(l, &b)) == 1) {
      assert_int_equal(b.sample0, pos);
      assert_true(b.n > 0 && b.n <= cfg.batch);
      if (cfg.drop_last) assert_int_equal(b.n, cfg.batch);
      for (int j = 0; j < b.n; j++) {
        int64_t s = order[pos + j];
        assert_int_equal(b.y[j], s % 10);
        assert_true(b.x[j * ds->dim] == (float)(s * 1000));
        assert_true(b.x[j * ds->dim + ds->dim - 1] == (float)(s * 1000 + ds->dim - 1));
        out[w++] = s;
      }
      pos += b.n;
      nb++;
    }
    assert_int_equal(rc, 0);
    assert_int_equal(nb, dt_loader_batches(l));
    assert_int_equal(dt_loader_next(l, &b), 0); /* stays at the end */
    if (!cfg.drop_last) assert_int_equal(pos, end);
    else assert_true(end - pos < cfg.batch);
  }
  free(order);
  dt_loader_destroy(l);
  return w;
}

static void test_equivalence(void **state) {
  (void)state;
  alarm(60);
  dt_dataset ds = make_ds(103, 5);
  static int64_t ref[4 * 103], got[4 * 103];
  const int prefetch[] = {1, 3, 8};
  for (int drop = 0; drop < 2; drop++)
    for (int shard = 0; shard < 2; shard++)
      for (int bs = 1; bs <= 16; bs += 15) {
        dt_loader_cfg cfg = DT_LOADER_CFG_INIT;
        cfg.batch = bs == 1 ? 7 : bs;
        cfg.drop_last = drop;
        cfg.seed = 1234;
        cfg.prefetch = 0;
        if (shard) cfg.shard_begin = 20, cfg.shard_end = 71;
        int64_t n0 = run(&ds, cfg, 4, ref);
        for (int p = 0; p < 3; p++) {
          cfg.prefetch = prefetch[p];
          int64_t n1 = run(&ds, cfg, 4, got);
          assert_int_equal(n0, n1);
          assert_memory_equal(ref, got, (size_t)n0 * sizeof(int64_t));
        }
      }
  /* No shuffle: the identity order. */
  dt_loader_cfg cfg = DT_LOADER_CFG_INIT;
  cfg.shuffle = 0;
  cfg.batch = 10;
  cfg.drop_last = 0;
  int64_t n = run(&ds, cfg, 1, got);
  assert_int_equal(n, 103);
  for (int i = 0; i < 103; i++) assert_int_equal(got[i], i);
  dt_dataset_free(&ds);
  alarm(0);
}

static void test_shards_cover_epoch(void **state) {
  (void)state;
  alarm(60);
  dt_dataset ds = make_ds(100, 3);
  static int64_t got[100];
  char seen[100] = {0};
  int64_t cuts[] = {0, 33, 66, 100}, total = 0;
  for (int r = 0; r < 3; r++) {
    dt_loader_cfg cfg = DT_LOADER_CFG_INIT;
    cfg.batch = 8;
    cfg.drop_last = 0;
    cfg.seed = 9;
    cfg.shard_begin = cuts[r];
    cfg.shard_end = cuts[r + 1];
    int64_t n = run(&ds, cfg, 1, got);
    total += n;
    for (int64_t i = 0; i < n; i++) {
      assert_false(seen[got[i]]);
      seen[got[i]] = 1;
    }
  }
  assert_int_equal(total, 100);
  dt_dataset_free(&ds);
  alarm(0);
}

static void test_early_destroy_and_restart(void **state) {
  (void)state;
  alarm(60);
  dt_dataset ds = make_ds(5000, 64);
  dt_loader_cfg cfg = DT_LOADER_CFG_INIT;
  cfg.batch = 16;
  cfg.prefetch = 4;
  dt_loader *l;
  dt_batch b;
  for (int rep = 0; rep < 50; rep++) {
    /* Destroy before any epoch, right after starting, and after one batch. */
    assert_int_equal(dt_loader_create(&l, &ds, &cfg), DT_OK);
    if (rep % 3 >= 1) assert_int_equal(dt_loader_start_epoch(l, (uint64_t)rep), DT_OK);
    if (rep % 3 == 2) assert_int_equal(dt_loader_next(l, &b), 1);
    dt_loader_destroy(l);
  }
  /* Restart mid-epoch: the new epoch starts from its first batch. */
  assert_int_equal(dt_loader_create(&l, &ds, &cfg), DT_OK);
  assert_int_equal(dt_loader_start_epoch(l, 0), DT_OK);
  for (int i = 0; i < 10; i++) assert_int_equal(dt_loader_next(l, &b), 1);
  assert_int_equal(dt_loader_start_epoch(l, 1), DT_OK);
  int64_t *order = malloc(5000 * sizeof(int64_t));
  dt_epoch_order(order, 5000, cfg.seed, 1, 1);
  int64_t cnt = 0;
  while (dt_loader_next(l, &b) == 1) {
    assert_int_equal(b.sample0, cnt * 16);
    assert_int_equal(b.y[0], order[cnt * 16] % 10);
    assert_true(b.x[0] == (float)(order[cnt * 16] * 1000));
    cnt++;
  }
  assert_int_equal(cnt, 5000 / 16);
  free(order);
  dt_loader_destroy(l);
  dt_loader_destroy(NULL);
  dt_dataset_free(&ds);
  alarm(0);
}

static void test_bad_config(void **state) {
  (void)state;
  dt_dataset ds = make_ds(10, 2);
  dt_loader_cfg cfg = DT_LOADER_CFG_INIT;
  dt_loader *l = (dt_loader *)1;
  cfg.batch = 0;
  assert_int_equal(dt_loader_create(&l, &ds, &cfg), DT_EINVAL);
  assert_null(l);
  cfg.batch = 4;
  cfg.prefetch = -1;
  assert_int_equal(dt_loader_create(&l, &ds, &cfg), DT_EINVAL);
  cfg.prefetch = 2;
  cfg.shard_begin = 5, cfg.shard_end = 11;
  assert_int_equal(dt_loader_create(&l, &ds, &cfg), DT_EINVAL);
  assert_non_null(strstr(dt_errmsg(), "shard [5, 11)"));
  cfg.shard_begin = 6, cfg.shard_end = 5;
  assert_int_equal(dt_loader_create(&l, &ds, &cfg), DT_EINVAL);
  cfg.shard_begin = 0, cfg.shard_end = 0;
  assert_int_equal(dt_loader_create(&l, NULL, &cfg), DT_EINVAL);
  /* next before start_epoch is an error, not a hang. */
  for (int p = 0; p <= 1; p++) {
    cfg.prefetch = p;
    assert_int_equal(dt_loader_create(&l, &ds, &cfg), DT_OK);
    dt_batch b;
    assert_int_equal(dt_loader_next(l, &b), DT_EINVAL);
    assert_int_equal(dt_loader_batches(l), 2); /* 10 / 4, drop_last */
    dt_loader_destroy(l);
  }
  dt_dataset_free(&ds);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_equivalence),
      cmocka_unit_test(test_shards_cover_epoch),
      cmocka_unit_test(test_early_destroy_and_restart),
      cmocka_unit_test(test_bad_config),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
