/*
 * test_obs_mt.c — the obs API from several threads at once (the training
 * thread and the communication thread both record): concurrent counter
 * adds and histogram observations are exact, registration of one name from
 * every thread yields one slot, flight-recorder entries and trace spans
 * from every thread are all kept. Also runs under ThreadSanitizer.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "obs/obs_int.h"

#define NT 4
#define N 20000

static dt_obs *o;
static dt_obs_metric *slots[NT];

static void *work(void *arg) {
  int t = (int)(intptr_t)arg;
  dt_obs_metric *c = dt_obs_counter(o, "mt_total", "shared counter");
  dt_obs_metric *h = dt_obs_histogram(o, "mt_seconds", "shared histogram", NULL, 0);
  slots[t] = c;
  for (int i = 0; i < N; i++) {
    dt_obs_add(c, 1);
    dt_obs_observe(h, 1e-3 * (i % 7));
    if (i % 100 == 0) {
      dt_obs_fr_note_n(o, "thread", t); /* this thread's note goes with this thread's entry */
      int64_t k = dt_obs_fr_begin(o, "allreduce", (uint32_t)t, (uint64_t)i, 64, -1);
      dt_obs_span(o, "work", t, i, i + 1, t);
      dt_obs_fr_end(o, k, DT_OK);
    }
  }
  return NULL;
}

/* Every thread records as fast as it can: the ring of 64 wraps all the
 * time, so writers meet in one slot (the claim) and ends find their entry
 * overwritten. */
static void *lap(void *arg) {
  int t = (int)(intptr_t)arg;
  for (int i = 0; i < N; i++) {
    dt_obs_fr_note_n(o, "lap", t);
    int64_t k = dt_obs_fr_begin(o, "send", (uint32_t)t, (uint64_t)i, 8, t);
    dt_obs_fr_end(o, k, i % 3 ? DT_OK : DT_ETIMEDOUT);
  }
  return NULL;
}

static void test_threads(void **st) {
  (void)st;
  assert_int_equal(dt_obs_open(&o, NULL, 0, 1, NULL, NULL), DT_OK);
  assert_int_equal(dt_obs_trace_start(o, 1000, 0), DT_OK);
  pthread_t th[NT];
  for (int t = 0; t < NT; t++) pthread_create(&th[t], NULL, work, (void *)(intptr_t)t);
  for (int t = 0; t < NT; t++) pthread_join(th[t], NULL);
  for (int t = 1; t < NT; t++) assert_ptr_equal(slots[t], slots[0]);
  assert_true(dt_obs_value(slots[0]) == (double)NT * N);
  dt_obs_metric *h = dt_obs_histogram(o, "mt_seconds", "", NULL, 0);
  assert_true(dt_obs_value(h) == (double)NT * N);
  uint64_t sum = 0;
  for (int b = 0; b <= DT_OBS_MAX_BOUNDS; b++) sum += atomic_load(&h->bucket[b]);
  assert_int_equal(sum, (uint64_t)NT * N);
  assert_int_equal(atomic_load(&o->pg->fr_next), (uint64_t)NT * (N / 100));
  assert_int_equal(atomic_load(&o->span_next), (uint64_t)NT * (N / 100));
  for (int i = 0; i < DT_OBS_FR_LEN; i++) {
    char want[24];
    snprintf(want, sizeof want, "thread %u", o->pg->fr[i].stream);
    assert_string_equal(o->pg->fr[i].note, want);
  }
  dt_obs_close(o);
}

static void test_lapping(void **st) {
  (void)st;
  assert_int_equal(dt_obs_open(&o, NULL, 0, 1, NULL, NULL), DT_OK);
  pthread_t th[NT];
  for (int t = 0; t < NT; t++) pthread_create(&th[t], NULL, lap, (void *)(intptr_t)t);
  for (int t = 0; t < NT; t++) pthread_join(th[t], NULL);
  assert_int_equal(atomic_load(&o->pg->fr_next), (uint64_t)NT * N);
  for (int i = 0; i < DT_OBS_FR_LEN; i++) { /* every entry whole: its own thread's */
    const struct dt_obs_fr_entry *e = &o->pg->fr[i];
    char want[24];
    snprintf(want, sizeof want, "lap %u", e->stream);
    assert_true(atomic_load(&((struct dt_obs_fr_entry *)e)->state) >= DT_FR_ENTERED &&
                atomic_load(&((struct dt_obs_fr_entry *)e)->state) <= DT_FR_FAILED);
    assert_string_equal(e->note, want);
    assert_int_equal(e->peer, (int)e->stream);
    assert_string_equal(e->op, "send");
  }
  dt_obs_close(o);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_threads),
                                     cmocka_unit_test(test_lapping)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
