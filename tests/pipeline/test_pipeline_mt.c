/*
 * test_pipeline_mt.c — pipeline parallelism through the engine, with stage
 * processes forked by the test and joined through a file store:
 *   - equivalence: P = 2 and 3 stages, gpipe and 1f1b, m in {1, P-1, P, 4P}
 *     micro-batches, on an MLP with dropout and batch norm, end with the
 *     parameters of one process accumulating the same m micro-batches
 *     (batch-norm statistics are per micro-batch, docs/pipeline.md) to 1e-5
 *     relative after 51 steps (the last global batch one sample, so m > n);
 *     every rank holds the same bytes;
 *   - without batch norm, P = 2 equals plain one-process training (local
 *     strategy, whole batch) to 1e-5, and so do hybrid 2 x 2 replicas (the
 *     same bits with the replica reduction in ddp's buckets, with ddp's
 *     thread on, and in one allreduce after the step) and
 *     recomputation, which gives the bits of keeping the activations with
 *     the same weight-gradient products (deferred per step or per group of
 *     rows, or per micro-batch); deferred weight gradients are 1e-6 of per
 *     micro-batch, and recomputation's groups of 64 rows (gpipe: the
 *     forward repeated and the backward made per group; 1f1b: the weight
 *     gradients per group) 1e-6 of one product per step;
 *   - a stage that dies makes the others fail within the deadline naming
 *     its stage and rank;
 *   - ZeRO-1 inside hybrid groups (dist.zero with stages) ends with the
 *     unsharded hybrid run's bits (2 and 3 replicas, SGD and AdamW);
 *   - ZeRO-1 (dist.zero) ends with plain ddp's parameters, the same bits
 *     with 2, 3 and 4 workers, SGD and AdamW.
 * Every child is waited for with a deadline and SIGKILLed past it.
 */
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "comm/comm.h"
#include "core/core.h"
#include "engine/engine.h"
#include "parallel/pipe.h"
#include "../engine/fork_workers.h"
#include "../engine/engine_job.h"

static void base_cfg(dt_run_cfg *c, int workers) {
  dt_run_cfg_defaults(c);
  snprintf(c->layers, sizeof c->layers, "linear(32) relu dropout(0.2) linear(16) batchnorm relu linear(3)");
  c->format = DT_FMT_CSV;
  path(c->train_images, sizeof c->train_images, "train.csv");
  path(c->test_images, sizeof c->test_images, "test.csv");
  c->train_labels[0] = c->test_labels[0] = '\0';
  c->label_col = 0;
  c->epochs = 1;
  c->batch = 32;
  c->optim.lr = 0.05f;
  c->workers = workers;
}

/* The rank that SIGKILLs itself after its 5th step (-1: none). */
static int kill_rank = -1;
static void die_at_step(void *ud, const dt_progress *p) {
  (void)ud;
  if (p->step == 5) raise(SIGKILL);
}

static int child(const dt_run_cfg *c, int rank, const char *tag) {
  dt_engine_hooks hooks = {die_at_step, NULL, NULL};
  return job_worker(c, rank, tag, rank == kill_rank ? &hooks : NULL, 30);
}

/* Runs cfg on N ranks under tag; every rank must succeed and hold the
 * bytes of every other rank that holds the same parameters (a stage holds
 * only its own span: its replicas the same bytes); the whole model put
 * together from the ranks' spans is returned. */
static float *run_ok(dt_run_cfg *cfg, int N, const char *tag, size_t *n) {
  dt_run_cfg cfgs[8];
  int st[8];
  for (int r = 0; r < N; r++) cfgs[r] = *cfg;
  run_job(cfgs, N, tag, st);
  for (int r = 0; r < N; r++) {
    char msg[600];
    read_err(tag, r, msg, sizeof msg);
    if (st[r] != 0) fail_msg("%s: rank %d exit %d: %s", tag, r, st[r], msg);
  }
  float *p0 = read_params(tag, 0, n);
  unsigned char *have = calloc(*n, 1);
  assert_non_null(have);
  for (int r = 0; r < N; r++) {
    size_t m, off, len;
    float *pr = read_params(tag, r, &m);
    assert_int_equal(m, *n);
    read_span(tag, r, &off, &len);
    assert_true(off + len <= m);
    for (size_t i = off; i < off + len; i++) {
      if (have[i]) assert_memory_equal(&pr[i], &p0[i], sizeof(float));
      p0[i] = pr[i];
      have[i] = 1;
    }
    free(pr);
  }
  for (size_t i = 0; i < *n; i++) assert_true(have[i]);
  free(have);
  return p0;
}

static void test_equivalence(void **state) {
  (void)state;
  for (int P = 2; P <= 3; P++) {
    const int ms[4] = {1, P - 1, P, 4 * P};
    for (int k = 0; k < 4; k++) {
      if (k == 1 && P == 2) continue; /* P - 1 = 1 already ran */
      int m = ms[k];
      /* the reference: one process accumulating the same micro-batches */
      dt_run_cfg c;
      base_cfg(&c, 1);
      c.micro_batches = m;
      char tag[32];
      snprintf(tag, sizeof tag, "ref_m%d", m);
      size_t n0, n;
      float *ref = run_ok(&c, 1, tag, &n0);
      /* and with recomputation (batch norm: micro-batch by micro-batch;
       * gpipe's last stage runs each forward only with its backward, the
       * one that counts the statistics) */
      for (int v = 0; v < 4; v++) {
        const int sched = v & 1, rc = v >> 1;
        base_cfg(&c, P);
        c.pipeline_stages = P;
        c.micro_batches = m;
        c.schedule = sched;
        c.recompute = rc;
        snprintf(tag, sizeof tag, "p%d_m%d_%s%s", P, m, sched ? "1f1b" : "gpipe", rc ? "_rc" : "");
        float *p = run_ok(&c, P, tag, &n);
        assert_int_equal(n, n0);
        double rel = rel_diff(p, ref, n);
        printf("# P=%d m=%d %s%s vs one process: relative difference %.3g\n", P, m,
               sched ? "1f1b" : "gpipe", rc ? " recompute" : "", rel);
        assert_true(rel < 1e-5);
        free(p);
      }
      free(ref);
    }
  }
  /* a stage without parameters (cuts 2,3: stage 1 is the dropout alone,
   * which the measured-cost partition picks at times under load): its
   * rank holds an empty span, not the whole model */
  dt_run_cfg c;
  base_cfg(&c, 1);
  c.micro_batches = 4;
  size_t n0, n;
  float *ref = run_ok(&c, 1, "ref_cut", &n0);
  base_cfg(&c, 3);
  c.pipeline_stages = 3;
  c.micro_batches = 4;
  c.schedule = 1;
  c.stages[0] = 2, c.stages[1] = 2, c.stages[2] = 3;
  float *p = run_ok(&c, 3, "p3_cut23", &n);
  assert_int_equal(n, n0);
  double rel = rel_diff(p, ref, n);
  printf("# P=3 m=4 1f1b, stage 1 without parameters, vs one process: relative difference %.3g\n", rel);
  assert_true(rel < 1e-5);
  free(p);
  free(ref);
}

/* Without batch norm a micro-batched pipeline is the whole-batch step. */
static void test_plain_reference(void **state) {
  (void)state;
  static const char *mlp = "linear(32) relu dropout(0.2) linear(16) relu linear(3)";
  dt_run_cfg c;
  base_cfg(&c, 1);
  snprintf(c.layers, sizeof c.layers, "%s", mlp);
  size_t n0, n;
  float *ref = run_ok(&c, 1, "plain_local", &n0), *first = NULL;
  /* run 0 makes weight gradients micro-batch by micro-batch; run 4 is run
   * 0 with them deferred (one product per step, pipe.h); recomputation
   * defers them per group of DTRAIN_PIPE_RECOMPUTE_ROWS (64) rows, here the
   * whole step's 32 (run 2), or per micro-batch (run 5, and runs 6 and 7
   * with stages that end in a linear layer and a relu after one, whose
   * repeat stops before them: dt__model_forward_kept) */
  static const struct { int W, P, m, recompute, sched, wgrad; const char *cuts; } runs[] = {
      {2, 2, 4, 0, 1, 0, NULL}, {4, 2, 3, 0, 1, 1, NULL}, {2, 2, 4, 1, 0, 1, NULL},
      {3, 3, 5, 1, 1, 1, "2,4"}, {2, 2, 4, 0, 1, 1, NULL}, {2, 2, 4, 1, 1, 0, NULL},
      {2, 2, 4, 1, 1, 0, "2"},   {3, 3, 4, 1, 0, 0, "2,4"}};
  float *deferred = NULL;
  for (int i = 0; i < 8; i++) {
    base_cfg(&c, runs[i].W);
    c.pipe_wgrad = runs[i].wgrad;
    snprintf(c.layers, sizeof c.layers, "%s", mlp);
    c.pipeline_stages = runs[i].P;
    c.micro_batches = runs[i].m;
    c.recompute = runs[i].recompute;
    c.schedule = runs[i].sched;
    if (runs[i].cuts)
      for (const char *q = runs[i].cuts; *q; q++)
        if (*q >= '0' && *q <= '9') c.stages[1 + c.stages[0]++] = *q - '0';
    char tag[32];
    snprintf(tag, sizeof tag, "plain%d", i);
    float *p = run_ok(&c, runs[i].W, tag, &n);
    assert_int_equal(n, n0);
    double rel = rel_diff(p, ref, n);
    printf("# W=%d P=%d m=%d recompute=%d wgrad=%d vs whole-batch local: relative difference "
           "%.3g\n", runs[i].W, runs[i].P, runs[i].m, runs[i].recompute, runs[i].wgrad, rel);
    assert_true(rel < 1e-5);
    /* recomputation gives the gradients, hence the parameters, of keeping
     * the activations with the same weight-gradient products: run 5
     * (1f1b, recomputed per micro-batch) has run 0's bits; run 2 (gpipe,
     * recomputed in one group of the step's rows) repeats the forward and
     * input-gradient products with 4 micro-batches' rows at once, which
     * has run 4's bits only where the BLAS sums an output element the same
     * way for any row count (bitwise on an AVX-512 EPYC; 2.8e-8 apart on
     * an AVX2 one, 2026-11-27): the same sums to rounding */
    if (i == 0) first = p;
    else if (i == 2) deferred = p;
    else if (i == 4) {
      /* deferred weight gradients: the same sums in another order */
      double d = rel_diff(p, first, n);
      printf("# deferred vs per-micro-batch weight gradients: relative difference %.3g\n", d);
      assert_true(d < 1e-6);
      double g = rel_diff(p, deferred, n);
      printf("# gpipe recomputed in one group vs 1f1b keeping activations: relative difference "
             "%.3g\n", g);
      assert_true(g < 1e-6);
    } else if (i >= 5)
      assert_memory_equal(p, first, n * sizeof(float));
    if (i == 1) {
      /* hybrid 2 x 2: the stage gradients reduced over the replicas in
       * ddp's buckets as the last products make them (the default), with
       * ddp's communication thread forced on and buckets of 256 bytes (the
       * reductions overlap the stage's last weight-gradient products), and in one allreduce after the step
       * (DTRAIN_PIPE_DDP=0): a sum of two replicas in any order, the same
       * bits */
      static const char *env[2][2] = {{"DTRAIN_DDP_OVERLAP", "1"}, {"DTRAIN_PIPE_DDP", "0"}};
      for (int e = 0; e < 2; e++) {
        setenv(env[e][0], env[e][1], 1);
        dt__param_reload();
        snprintf(tag, sizeof tag, "plain1_env%d", e);
        size_t ne;
        dt_run_cfg ce = c;
        if (e == 0) ce.bucket_bytes = 256; /* several buckets: the thread has work */
        float *q = run_ok(&ce, runs[i].W, tag, &ne);
        unsetenv(env[e][0]);
        dt__param_reload();
        assert_int_equal(ne, n);
        printf("# hybrid 2 x 2, %s=%s vs the default: relative difference %.3g\n", env[e][0],
               env[e][1], rel_diff(q, p, n));
        assert_memory_equal(q, p, n * sizeof(float));
        free(q);
      }
    }
    if (i != 0 && i != 2) free(p);
  }
  free(deferred);
  free(first);
  free(ref);
  /* batch 256 in 8 micro-batches of 32 rows, against one product of 256
   * rows per weight gradient: recomputation with gpipe goes backward in 4
   * groups of 2 micro-batches (forward repeated over 64 rows at once), with
   * 1f1b it makes the weight gradients in 4 products of 2 micro-batches'
   * stashed rows (the first overwrites, the others add) */
  float *one = NULL;
  for (int v = 0; v < 3; v++) {
    base_cfg(&c, 2);
    snprintf(c.layers, sizeof c.layers, "%s", mlp);
    c.batch = 256;
    c.pipeline_stages = 2;
    c.micro_batches = 8;
    c.schedule = v == 2;
    c.recompute = v > 0;
    c.pipe_wgrad = 1;
    static const char *tags[3] = {"groups", "groups_gpipe_rc", "groups_1f1b_rc"};
    float *p = run_ok(&c, 2, tags[v], &n);
    if (!v) {
      one = p;
      continue;
    }
    double d = rel_diff(p, one, n);
    printf("# recompute %s, in groups of 64 rows vs none: relative difference %.3g\n",
           v == 2 ? "1f1b" : "gpipe", d);
    assert_true(d < 1e-6);
    free(p);
  }
  free(one);
}

/* ZeRO-1 (dist.zero = 1) ends where plain ddp ends: the same bits with 2
 * workers (a sum of two is order-free; SGD with momentum and AdamW), 1e-6
 * relative with 3 and 4 under SGD (the ring reduce-scatter adds in another
 * order than ddp's window; AdamW's normalised steps blow such last-bit
 * differences up to 1e-3, docs/pipeline.md); the parameter count (611) is
 * not a multiple of 3 or 4, so the tail path runs too. */
static void test_zero1(void **state) {
  (void)state;
  /* AdamW with 3 and 4 workers too: its normalised steps turn any
   * difference in the order of the gradient sum into 1e-3 after 51 steps */
  static const struct { int W, adamw; } runs[] = {{2, 0}, {2, 1}, {3, 0}, {3, 1}, {4, 1}};
  for (int i = 0; i < 5; i++) {
    dt_run_cfg c;
    base_cfg(&c, runs[i].W);
    if (runs[i].adamw) c.optim.kind = DT_OPT_ADAMW, c.optim.lr = 1e-3f;
    char tag[32];
    size_t n0, n;
    snprintf(tag, sizeof tag, "ddp%d", i);
    float *ref = run_ok(&c, runs[i].W, tag, &n0);
    c.zero = 1;
    snprintf(tag, sizeof tag, "zero%d", i);
    float *p = run_ok(&c, runs[i].W, tag, &n);
    assert_int_equal(n, n0);
    double rel = rel_diff(p, ref, n);
    printf("# ZeRO-1 with %d workers (%s) vs ddp: relative difference %.3g\n", runs[i].W,
           runs[i].adamw ? "adamw" : "sgd", rel);
    /* one host: both sum the scaled gradients in rank order in a shared
     * window (comm/window.h), so the same bits */
    assert_memory_equal(p, ref, n * sizeof(float));
    assert_true(rel < 1e-6);
    free(p);
    free(ref);
  }
}

/* ZeRO-1 inside the hybrid groups (dist.zero = 1 with pipeline stages):
 * each stage's optimizer state sharded over its replicas ends with the
 * bits of the unsharded hybrid run (the update is per parameter; the
 * gradient sum is the same), SGD with momentum and AdamW, 2 and 3
 * replicas of 2 stages (the stages' spans are not multiples of 3: the
 * tail path runs). */
static void test_pipeline_zero1(void **state) {
  (void)state;
  static const struct { int W, adamw; } runs[] = {{4, 0}, {4, 1}, {6, 0}};
  for (int i = 0; i < 3; i++) {
    dt_run_cfg c;
    base_cfg(&c, runs[i].W);
    c.pipeline_stages = 2;
    c.micro_batches = 2;
    if (runs[i].adamw) c.optim.kind = DT_OPT_ADAMW, c.optim.lr = 1e-3f;
    char tag[32];
    size_t n0, n;
    snprintf(tag, sizeof tag, "hyb%d", i);
    float *ref = run_ok(&c, runs[i].W, tag, &n0);
    c.zero = 1;
    snprintf(tag, sizeof tag, "hybzero%d", i);
    float *p = run_ok(&c, runs[i].W, tag, &n);
    assert_int_equal(n, n0);
    printf("# ZeRO-1 in %d replicas x 2 stages (%s) vs unsharded: relative difference %.3g\n",
           runs[i].W / 2, runs[i].adamw ? "adamw" : "sgd", rel_diff(p, ref, n));
    assert_memory_equal(p, ref, n * sizeof(float));
    free(p);
    free(ref);
  }
}

/* A stage killed mid-run: every other rank fails (no hang), naming it. */
static void test_stage_killed(void **state) {
  (void)state;
  dt_run_cfg c[3];
  for (int r = 0; r < 3; r++) {
    base_cfg(&c[r], 3);
    c[r].pipeline_stages = 3;
    c[r].micro_batches = 4;
    c[r].epochs = 50;
  }
  kill_rank = 1;
  int st[3];
  double t0 = dt_now();
  run_job(c, 3, "killed", st);
  kill_rank = -1;
  double took = dt_now() - t0;
  printf("# stage 1 killed: ranks exit %d %d %d after %.1f s\n", st[0], st[1], st[2], took);
  assert_int_equal(st[1], 1000 + SIGKILL);
  for (int r = 0; r < 3; r += 2) {
    char msg[600];
    read_err("killed", r, msg, sizeof msg);
    printf("# rank %d: %s", r, msg);
    assert_int_not_equal(st[r], 0);
    assert_non_null(strstr(msg, "rank 1"));
  }
  char msg[600];
  read_err("killed", 0, msg, sizeof msg);
  assert_non_null(strstr(msg, "stage 1"));
}

/* DTRAIN_PIPE_TAIL: the helper thread of the stages before the last (half
 * of the step's last weight-gradient flush, the input-gradient packing
 * during the first forwards) gives the bits of one thread, also when the
 * helper is slow (each job delayed 30 ms: the first backward must wait for
 * the packing, the flush for the other half). Layers wide enough for the
 * packed products (N >= 16) on every stage. */
static void test_tail(void **state) {
  (void)state;
  static const char *mlp = "linear(64) relu linear(48) relu linear(40) relu linear(32) relu linear(3)";
  static const struct { int P, m, sched; } runs[] = {{2, 8, 1}, {3, 4, 0}, {2, 1, 1}};
  for (int i = 0; i < 3; i++) {
    float *ref = NULL;
    size_t n0 = 0;
    for (int v = 0; v < 3; v++) {
      dt_run_cfg c;
      base_cfg(&c, runs[i].P);
      snprintf(c.layers, sizeof c.layers, "%s", mlp);
      c.batch = 256;
      c.pipeline_stages = runs[i].P;
      c.micro_batches = runs[i].m;
      c.schedule = runs[i].sched;
      setenv("DTRAIN_PIPE_TAIL", v ? "1" : "0", 1);
      dt__param_reload();
      dt__pipe_tail_delay_us = v == 2 ? 30000 : 0;
      char tag[32];
      snprintf(tag, sizeof tag, "tail%d_%d", i, v);
      size_t n;
      float *p = run_ok(&c, runs[i].P, tag, &n);
      dt__pipe_tail_delay_us = 0;
      unsetenv("DTRAIN_PIPE_TAIL");
      dt__param_reload();
      if (!v) {
        ref = p, n0 = n;
        continue;
      }
      assert_int_equal(n, n0);
      double d = rel_diff(p, ref, n);
      printf("# P=%d m=%d %s, helper thread%s vs none: relative difference %.3g\n", runs[i].P,
             runs[i].m, runs[i].sched ? "1f1b" : "gpipe", v == 2 ? " (slow)" : "", d);
      assert_memory_equal(p, ref, n * sizeof(float));
      free(p);
    }
    free(ref);
  }
}

/* DTRAIN_PIPE_OFFLOAD: the last stage makes stage 0's first linear
 * layer's weight gradient from the rows stage 0 sends it, by the same call,
 * so the parameters are the bits of stage 0 making it (1f1b and gpipe, a
 * last global batch shorter than m micro-batches' worth, the product
 * placed first, in the middle and last of the last stage's own products
 * (dt__pipe_offload_at), hybrid 2 x 2 with the replica reduction in ddp's
 * buckets (the offload's messages before any report), also on ddp's
 * thread, and after the step)
 * and equal to plain whole-batch training to 1e-5; where it does not apply
 * (3 stages, recomputation, m = 1) it changes nothing. */
static void test_offload(void **state) {
  (void)state;
  static const char *mlp = "linear(64) relu linear(48) relu linear(40) relu linear(32) relu linear(3)";
  static const struct { int W, P, m, sched, recompute; const char *env, *val, *at; } runs[] = {
      {2, 2, 8, 1, 0, NULL, NULL, NULL},
      {2, 2, 8, 0, 0, NULL, NULL, NULL},
      {2, 2, 4, 1, 0, NULL, NULL, "9"},
      {2, 2, 4, 1, 0, NULL, NULL, "0"},
      {4, 2, 4, 1, 0, NULL, NULL, NULL},
      {4, 2, 4, 1, 0, "DTRAIN_DDP_OVERLAP", "1", NULL}, /* ddp's thread reducing during the flush */
      {4, 2, 4, 1, 0, "DTRAIN_PIPE_DDP", "0", NULL},
      {3, 3, 4, 1, 0, NULL, NULL, NULL},
      {2, 2, 4, 1, 1, NULL, NULL, NULL},
      {2, 2, 1, 1, 0, NULL, NULL, NULL}};
  dt_run_cfg c;
  base_cfg(&c, 1);
  snprintf(c.layers, sizeof c.layers, "%s", mlp);
  c.batch = 256;
  size_t n0, n;
  float *ref = run_ok(&c, 1, "off_local", &n0);
  for (int i = 0; i < 10; i++) {
    float *p[2];
    for (int v = 0; v < 2; v++) {
      base_cfg(&c, runs[i].W);
      snprintf(c.layers, sizeof c.layers, "%s", mlp);
      c.batch = 256;
      c.pipeline_stages = runs[i].P;
      c.micro_batches = runs[i].m;
      c.schedule = runs[i].sched;
      c.recompute = runs[i].recompute;
      if (runs[i].val && runs[i].val[0] == '1') c.bucket_bytes = 256; /* the thread has work */
      setenv("DTRAIN_PIPE_OFFLOAD", v ? "1" : "0", 1);
      if (runs[i].env) setenv(runs[i].env, runs[i].val, 1);
      dt__pipe_offload_at = runs[i].at ? atoi(runs[i].at) : -1;
      dt__param_reload();
      char tag[32];
      snprintf(tag, sizeof tag, "off%d_%d", i, v);
      p[v] = run_ok(&c, runs[i].W, tag, &n);
      unsetenv("DTRAIN_PIPE_OFFLOAD");
      if (runs[i].env) unsetenv(runs[i].env);
      dt__pipe_offload_at = -1;
      dt__param_reload();
      assert_int_equal(n, n0);
    }
    double d = rel_diff(p[1], p[0], n), r = rel_diff(p[1], ref, n);
    char env[48] = "";
    if (runs[i].env) snprintf(env, sizeof env, " %s=%s", runs[i].env, runs[i].val);
    printf("# W=%d P=%d m=%d %s%s%s%s%s: offload vs none %.3g, vs whole-batch local %.3g\n",
           runs[i].W, runs[i].P, runs[i].m, runs[i].sched ? "1f1b" : "gpipe",
           runs[i].recompute ? " recompute" : "", env,
           runs[i].at ? " product at layer " : "", runs[i].at ? runs[i].at : "", d, r);
    assert_memory_equal(p[1], p[0], n * sizeof(float));
    assert_true(r < 1e-5);
    free(p[0]);
    free(p[1]);
  }
  free(ref);
}

static int setup(void **state) {
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/dt_test_pipe_XXXXXX");
  if (!mkdtemp(tmpdir)) return -1;
  char p[300];
  path(p, sizeof p, "train.csv");
  write_csv(p, 32 * 50 + 1, 7); /* 51 steps; the last global batch holds 1 sample */
  path(p, sizeof p, "test.csv");
  write_csv(p, 301, 8);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_equivalence),
      cmocka_unit_test(test_plain_reference),
      cmocka_unit_test(test_stage_killed),
      cmocka_unit_test(test_zero1),
      cmocka_unit_test(test_pipeline_zero1),
      cmocka_unit_test(test_tail),
      cmocka_unit_test(test_offload),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
