/*
 * test_obs.c — src/obs without processes: metric registration and updates
 * as another process reads them (the page on disk), the flight recorder's
 * ring, the hang diagnosis over three ranks' pages (the rank that never
 * entered the collective is named with the op, its bucket and size, and
 * the ranks waiting in it), the page reader refusing damaged files, and
 * the trace writer/merger giving valid, nested spans.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "obs/obs_diag.h"
#include "obs/obs_int.h"

static char dir[256];

static int setup(void **st) {
  (void)st;
  snprintf(dir, sizeof dir, "/tmp/dt_test_obs.XXXXXX");
  return mkdtemp(dir) ? 0 : -1;
}
static int teardown(void **st) {
  (void)st;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd);
}

static void read_page(int rank, struct dt_obs_page *pg) {
  char p[300];
  dt__obs_rank_path(dir, rank, p, sizeof p);
  assert_int_equal(dt__obs_read(p, pg), DT_OK);
}

static void test_metrics(void **st) {
  (void)st;
  dt_obs *o = NULL;
  assert_int_equal(dt_obs_open(&o, dir, 1, 2, "job\"x", "host\\1"), DT_OK);
  dt_obs_metric *c = dt_obs_counter(o, "t_bytes_total", "bytes");
  dt_obs_metric *g = dt_obs_gauge(o, "t_loss", "loss");
  double b[] = {0.1, 1, 10};
  dt_obs_metric *h = dt_obs_histogram(o, "t_seconds", "time", b, 3);
  assert_non_null(c);
  assert_non_null(g);
  assert_non_null(h);
  assert_ptr_equal(dt_obs_counter(o, "t_bytes_total", "again"), c); /* same slot */
  assert_null(dt_obs_gauge(o, "t_bytes_total", "other type"));
  assert_null(dt_obs_counter(o, "bad name", "x"));
  assert_null(dt_obs_counter(o, "9starts_with_digit", "x"));
  dt_obs_add(c, 5);
  dt_obs_add(c, 2.5);
  dt_obs_add(c, -1); /* counters never go down */
  dt_obs_set(c, 3);  /* nor by set */
  dt_obs_set(g, 0.25);
  dt_obs_observe(h, 0.05);
  dt_obs_observe(h, 0.5);
  dt_obs_observe(h, 0.5);
  dt_obs_observe(h, 100);
  dt_obs_add(NULL, 1); /* no-ops */
  dt_obs_observe(NULL, 1);
  assert_true(dt_obs_value(c) == 7.5);
  assert_true(dt_obs_value(h) == 4);
  struct dt_obs_page pg;
  read_page(1, &pg); /* what another process sees, while o is open */
  assert_int_equal(pg.rank, 1);
  assert_int_equal(pg.size, 2);
  assert_string_equal(pg.job, "job\"x");
  assert_int_equal(atomic_load(&pg.nmetrics), 3);
  struct dt_obs_slot *hs = &pg.slot[2];
  assert_string_equal(hs->name, "t_seconds");
  assert_int_equal(hs->nbounds, 3);
  assert_int_equal(atomic_load(&hs->bucket[0]), 1);
  assert_int_equal(atomic_load(&hs->bucket[1]), 2);
  assert_int_equal(atomic_load(&hs->bucket[2]), 0);
  assert_int_equal(atomic_load(&hs->bucket[3]), 1);
  assert_true(dt__obs_bits_to_d(atomic_load(&hs->value)) == 101.05);
  dt_obs_close(o);
  dt_obs_close(NULL);
}

/* Elastic re-forming: ranks 0 (lost), 1 and 2 of 3 become 0 and 1 of 2.
 * Each survivor's page says its new rank and is found under its new name
 * (over the lost rank's file); the old name rank-2 still points at the
 * page now saying rank 1, which readers skip by that mismatch. */
static void test_rerank(void **st) {
  (void)st;
  dt_obs *lost, *a, *b;
  assert_int_equal(dt_obs_open(&lost, dir, 0, 3, "j", "h"), DT_OK);
  assert_int_equal(dt_obs_open(&a, dir, 1, 3, "j", "h"), DT_OK);
  assert_int_equal(dt_obs_open(&b, dir, 2, 3, "j", "h"), DT_OK);
  dt_obs_set(dt_obs_gauge(a, "who", "x"), 1);
  dt_obs_set(dt_obs_gauge(b, "who", "x"), 2);
  dt_obs_close(lost);
  /* in rank order, as dt_obs_rerank's wait makes separate processes do:
   * b's new name is a's old one */
  assert_int_equal(dt_obs_rerank(a, dir, 0, 2), DT_OK);
  assert_int_equal(dt_obs_rerank(b, dir, 1, 2), DT_OK);
  struct dt_obs_page *pg = malloc(sizeof *pg);
  read_page(0, pg);
  assert_int_equal(pg->rank, 0);
  assert_int_equal(pg->size, 2);
  assert_true(dt__obs_bits_to_d(atomic_load(&pg->slot[0].value)) == 1);
  read_page(1, pg);
  assert_int_equal(pg->rank, 1);
  assert_true(dt__obs_bits_to_d(atomic_load(&pg->slot[0].value)) == 2);
  read_page(2, pg); /* the old name: the same page, saying rank 1 */
  assert_int_equal(pg->rank, 1);
  /* writes after the move land in the page under the new name */
  dt_obs_set(dt_obs_gauge(b, "who", "x"), 7);
  read_page(1, pg);
  assert_true(dt__obs_bits_to_d(atomic_load(&pg->slot[0].value)) == 7);
  assert_int_equal(dt_obs_rerank(a, dir, 2, 2), DT_EINVAL);
  assert_int_equal(dt_obs_rerank(NULL, dir, 0, 1), DT_OK);
  free(pg);
  dt_obs_close(a);
  dt_obs_close(b);
}

/* The same across processes, in the order that needs the wait: this
 * process (old rank 2) renumbers to 1 while the child (old rank 1, alive)
 * has not yet renumbered to 0. dt_obs_rerank must wait for the child to
 * name its page rank-0 before taking rank-1, the child's only name (else
 * the child's link fails: its file has no name left to link from). */
static void test_rerank_processes(void **st) {
  (void)st;
  int up[2], go[2]; /* child -> parent, parent -> child */
  assert_int_equal(pipe(up), 0);
  assert_int_equal(pipe(go), 0);
  pid_t kid = fork();
  assert_true(kid >= 0);
  if (kid == 0) {
    dt_obs *a;
    char c;
    if (dt_obs_open(&a, dir, 1, 3, "j", "h") < 0) _exit(2);
    if (write(up[1], "r", 1) != 1) _exit(3); /* opened */
    if (read(go[0], &c, 1) != 1) _exit(4);   /* the parent has begun its rerank (about) */
    struct timespec ts = {0, 200000000};
    nanosleep(&ts, NULL);
    int rc = dt_obs_rerank(a, dir, 0, 2);
    nanosleep(&ts, NULL);
    dt_obs_close(a);
    _exit(rc == DT_OK ? 0 : 1);
  }
  char c;
  assert_int_equal(read(up[0], &c, 1), 1);
  dt_obs *b;
  assert_int_equal(dt_obs_open(&b, dir, 2, 3, "j", "h"), DT_OK);
  assert_int_equal(write(go[1], "g", 1), 1);
  assert_int_equal(dt_obs_rerank(b, dir, 1, 2), DT_OK);
  int status = -1;
  assert_int_equal(waitpid(kid, &status, 0), kid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0); /* the child named its page */
  struct dt_obs_page *pg = malloc(sizeof *pg);
  read_page(0, pg);
  assert_int_equal(pg->rank, 0);
  assert_int_equal(pg->pid, kid);
  read_page(1, pg);
  assert_int_equal(pg->rank, 1);
  assert_int_equal(pg->pid, getpid());
  free(pg);
  dt_obs_close(b);
  close(go[0]);
  close(go[1]);
  close(up[0]);
  close(up[1]);
}

/* Another host's GET /pages answer: an HTTP 200 status line, headers, then
 * whole pages; anything else is refused. */
static void test_pages_parse(void **st) {
  (void)st;
  dt_obs *o;
  assert_int_equal(dt_obs_open(&o, NULL, 2, 3, "j", "hb"), DT_OK);
  dt_obs_add(dt_obs_counter(o, "x_total", "x"), 4);
  static const char head[] = "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n";
  size_t one = sizeof(struct dt_obs_page), hl = sizeof head - 1;
  char *r = malloc(hl + 3 * one);
  memcpy(r, head, hl);
  for (int i = 0; i < 3; i++) memcpy(r + hl + i * one, o->pg, one);
  struct dt_obs_page *out = malloc(2 * one);
  assert_int_equal(dt__obs_pages_parse(r, hl + 2 * one, out, 2), 2);
  assert_int_equal(out[1].rank, 2);
  assert_string_equal(out[1].host, "hb");
  assert_int_equal(dt__obs_pages_parse(r, hl, out, 2), 0);                /* no ranks there */
  assert_int_equal(dt__obs_pages_parse(r, hl + 3 * one, out, 2), DT_ECORRUPT); /* too many */
  assert_int_equal(dt__obs_pages_parse(r, hl + one - 1, out, 2), DT_ECORRUPT); /* torn */
  r[9] = '5'; /* HTTP/1.1 500 */
  assert_int_equal(dt__obs_pages_parse(r, hl + one, out, 2), DT_ECORRUPT);
  r[9] = '2';
  r[hl - 1] = 'x'; /* no end of the headers... */
  r[hl - 3] = 'x';
  assert_int_equal(dt__obs_pages_parse(r, hl, out, 2), DT_ECORRUPT);
  free(out);
  free(r);
  dt_obs_close(o);
}

static void test_page_corrupt(void **st) {
  (void)st;
  dt_obs *o = NULL;
  assert_int_equal(dt_obs_open(&o, dir, 0, 1, NULL, NULL), DT_OK);
  dt_obs_counter(o, "ok_total", "fine");
  dt_obs_close(o);
  struct dt_obs_page *pg = malloc(sizeof *pg), *out = malloc(sizeof *out);
  read_page(0, pg);
  assert_int_equal(dt__obs_parse(pg, sizeof *pg - 1, out), DT_ECORRUPT);
  struct dt_obs_page bad = *pg;
  bad.magic ^= 1;
  assert_int_equal(dt__obs_parse(&bad, sizeof bad, out), DT_ECORRUPT);
  bad = *pg;
  bad.rank = 5;
  assert_int_equal(dt__obs_parse(&bad, sizeof bad, out), DT_ECORRUPT);
  bad = *pg;
  atomic_store(&bad.nmetrics, DT_OBS_MAX_METRICS + 1);
  assert_int_equal(dt__obs_parse(&bad, sizeof bad, out), DT_ECORRUPT);
  bad = *pg;
  memset(bad.slot[0].name, 'x', sizeof bad.slot[0].name); /* no NUL: cut, still valid */
  assert_int_equal(dt__obs_parse(&bad, sizeof bad, out), DT_OK);
  assert_int_equal(strlen(out->slot[0].name), DT_OBS_NAME_MAX - 1);
  bad = *pg;
  bad.slot[0].name[0] = ' ';
  assert_int_equal(dt__obs_parse(&bad, sizeof bad, out), DT_ECORRUPT);
  bad = *pg;
  bad.slot[0].type = 9;
  assert_int_equal(dt__obs_parse(&bad, sizeof bad, out), DT_ECORRUPT);
  char p[300];
  snprintf(p, sizeof p, "%s/nothing", dir);
  assert_int_equal(dt__obs_read(p, out), DT_ENOENT);
  free(pg);
  free(out);
}

/* Three ranks: 0 and 1 entered allreduce #5 (bucket 3, 512 KiB) and wait;
 * rank 2 finished #4 and never entered #5. */
static void test_diagnose_never_entered(void **st) {
  (void)st;
  dt_obs *o[3];
  for (int r = 0; r < 3; r++) {
    assert_int_equal(dt_obs_open(&o[r], dir, r, 3, "j", "h"), DT_OK);
    for (uint64_t s = 1; s <= 4; s++) {
      int64_t t = dt_obs_fr_begin(o[r], "allreduce", 7, s, 1024, -1);
      dt_obs_fr_end(o[r], t, DT_OK);
    }
  }
  dt_obs_fr_note(o[0], "bucket 3");
  dt_obs_fr_begin(o[0], "allreduce", 7, 5, 512 << 10, -1);
  dt_obs_fr_note_n(o[1], "bucket", 3); /* the same note, formatted by the recorder */
  dt_obs_fr_begin(o[1], "allreduce", 7, 5, 512 << 10, -1);
  char msg[1024];
  int rc = dt_obs_diagnose(dir, 0, 3, dt_now_ns(), msg, sizeof msg, NULL);
  assert_int_equal(rc, 1);
  print_message("%s\n", msg);
  assert_non_null(strstr(msg, "rank 2 never entered allreduce #5 (bucket 3, 512 KiB)"));
  assert_non_null(strstr(msg, "ranks 0,1 waiting in it for"));
  assert_non_null(strstr(msg, "rank 2's last operation was allreduce #4"));
  /* the note went with #5 only */
  struct dt_obs_page pg;
  read_page(0, &pg);
  assert_string_equal(pg.fr[4].note, "bucket 3");
  assert_string_equal(pg.fr[3].note, "");
  read_page(1, &pg);
  assert_string_equal(pg.fr[4].note, "bucket 3");
  /* once rank 2 enters and fails too, nobody is behind */
  int64_t t2 = dt_obs_fr_begin(o[2], "allreduce", 7, 5, 512 << 10, -1);
  dt_obs_fr_end(o[2], t2, DT_ETIMEDOUT);
  rc = dt_obs_diagnose(dir, 0, 3, dt_now_ns(), msg, sizeof msg, NULL);
  print_message("%s\n", msg);
  assert_int_equal(rc, 1);
  assert_null(strstr(msg, "never entered"));
  assert_non_null(strstr(msg, "ranks 0,1,2 all in allreduce #5"));
  /* a rank without a page is named */
  dt_obs_close(o[2]);
  char p[300];
  dt__obs_rank_path(dir, 2, p, sizeof p);
  unlink(p);
  rc = dt_obs_diagnose(dir, 0, 3, dt_now_ns(), msg, sizeof msg, NULL);
  assert_int_equal(rc, 1);
  assert_non_null(strstr(msg, "rank 2 never entered allreduce #5 (bucket 3, 512 KiB) (it left no flight record)"));
  /* everyone done: nothing to say */
  for (int r = 0; r < 2; r++) dt_obs_close(o[r]);
  for (int r = 0; r < 2; r++) assert_int_equal(dt_obs_open(&o[r], dir, r, 2, "j", "h"), DT_OK);
  dt_obs_fr_note(o[1], "rank 1's"); /* a note for another handle is not taken */
  for (int r = 0; r < 2; r++)
    dt_obs_fr_end(o[r], dt_obs_fr_begin(o[r], "barrier", 7, 1, 0, -1), DT_OK);
  assert_int_equal(dt_obs_diagnose(dir, 0, 2, dt_now_ns(), msg, sizeof msg, NULL), 0);
  read_page(0, &pg);
  assert_string_equal(pg.fr[0].note, "");
  read_page(1, &pg);
  assert_string_equal(pg.fr[0].note, "rank 1's");
  for (int r = 0; r < 2; r++) dt_obs_close(o[r]);
}

/* The ring keeps the last DT_OBS_FR_LEN entries; ending an overwritten
 * entry changes nothing. */
static void test_ring(void **st) {
  (void)st;
  dt_obs *o;
  assert_int_equal(dt_obs_open(&o, NULL, 0, 1, NULL, NULL), DT_OK); /* memory only */
  int64_t first = dt_obs_fr_begin(o, "send", 1, 0, 8, 1);
  for (int i = 1; i < DT_OBS_FR_LEN + 10; i++) dt_obs_fr_end(o, dt_obs_fr_begin(o, "send", 1, (uint64_t)i, 8, 1), DT_OK);
  dt_obs_fr_end(o, first, DT_EIO); /* long gone */
  dt_obs_close(o);
  assert_int_equal(dt_obs_open(&o, dir, 0, 1, NULL, NULL), DT_OK);
  int64_t t = 0;
  for (int i = 0; i < DT_OBS_FR_LEN + 10; i++) t = dt_obs_fr_begin(o, "recv", 1, (uint64_t)i, 8, 0);
  dt_obs_fr_end(o, t, DT_OK);
  struct dt_obs_page pg;
  read_page(0, &pg);
  int newest = 0, failed = 0;
  for (int i = 0; i < DT_OBS_FR_LEN; i++) {
    assert_true(pg.fr[i].seq >= 10);
    newest += pg.fr[i].seq == DT_OBS_FR_LEN + 9 && atomic_load(&pg.fr[i].state) == DT_FR_DONE;
    failed += atomic_load(&pg.fr[i].state) == DT_FR_FAILED;
  }
  assert_int_equal(newest, 1);
  assert_int_equal(failed, 0);
  dt_obs_close(o);
}

static void test_trace(void **st) {
  (void)st;
  dt_obs *o[2];
  for (int r = 0; r < 2; r++) {
    assert_int_equal(dt_obs_open(&o[r], dir, r, 2, NULL, NULL), DT_OK);
    assert_int_equal(dt_obs_trace_start(o[r], 0, 0), DT_EINVAL);
    assert_int_equal(dt_obs_trace_start(o[r], 1, 1000), DT_OK); /* 32 spans kept */
    for (int i = 0; i < 40; i++) dt_obs_span(o[r], "work", 0, 1000 + i * 100, 1000 + i * 100 + 50, i);
    char p[300];
    snprintf(p, sizeof p, "%s/trace-rank-%d.json", dir, r);
    assert_int_equal(dt_obs_trace_write(o[r], p), DT_OK);
    dt_obs_close(o[r]);
  }
  char out[300];
  snprintf(out, sizeof out, "%s/trace.json", dir);
  assert_int_equal(dt_obs_trace_merge(dir, 2, out), DT_OK);
  FILE *f = fopen(out, "r");
  assert_non_null(f);
  char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  int spans = 0;
  for (char *p = buf; (p = strstr(p, "\"ph\":\"X\"")); p++) spans++;
  assert_int_equal(spans, 64); /* 32 per rank: the oldest 8 dropped */
  assert_non_null(strstr(buf, "\"args\":{\"n\":39}"));
  assert_null(strstr(buf, "\"args\":{\"n\":7}}"));
  assert_non_null(strstr(buf, "\"pid\":1"));
  assert_int_equal(dt_obs_trace_merge("/nonexistent-dir", 2, out), DT_ENOENT);
  /* "step" spans of the training thread: only the last `steps` steps stay */
  dt_obs *s;
  assert_int_equal(dt_obs_open(&s, dir, 0, 1, NULL, NULL), DT_OK);
  assert_int_equal(dt_obs_trace_start(s, 2, 0), DT_OK);
  for (int i = 0; i < 5; i++) {
    dt_obs_span(s, "forward", 0, i * 100, i * 100 + 40, -1);
    dt_obs_span(s, "step", 0, i * 100, i * 100 + 90, i);
  }
  snprintf(out, sizeof out, "%s/steps.json", dir);
  assert_int_equal(dt_obs_trace_write(s, out), DT_OK);
  dt_obs_close(s);
  f = fopen(out, "r");
  n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  spans = 0;
  for (char *p = buf; (p = strstr(p, "\"ph\":\"X\"")); p++) spans++;
  assert_int_equal(spans, 4); /* steps 3 and 4 with their forward spans */
  assert_null(strstr(buf, "\"args\":{\"n\":2}"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_metrics, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rerank, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rerank_processes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_pages_parse, setup, teardown),
      cmocka_unit_test_setup_teardown(test_page_corrupt, setup, teardown),
      cmocka_unit_test_setup_teardown(test_diagnose_never_entered, setup, teardown),
      cmocka_unit_test_setup_teardown(test_ring, setup, teardown),
      cmocka_unit_test_setup_teardown(test_trace, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
