/*
 * writer.c — the background checkpoint writer: one thread and one
 * snapshot. The training thread acquires the snapshot (waiting only if the
 * previous one is still being written), copies its flat buffers into it and
 * submits it; the thread writes it (write.c) while training goes on. A
 * failed write (a full disk) is counted and remembered with its message, the
 * older checkpoints stay, and the next snapshot is written as usual: losing
 * a checkpoint must not lose the run.
 *
 * It holds no training state of its own and never decides when to write.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt.h"

struct dt_ckpt_writer {
  char root[DT_CKPT_PATH_MAX];
  int keep;
  dt_ckpt_snap snap;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int pending; /* guarded by mu: a submitted snapshot not yet written */
  int stop;
  dt_ckpt_stats stats;
};

static void *run(void *arg) {
  dt_ckpt_writer *w = arg;
  pthread_mutex_lock(&w->mu);
  for (;;) {
    while (!w->pending && !w->stop) pthread_cond_wait(&w->cv, &w->mu);
    if (!w->pending && w->stop) break;
    pthread_mutex_unlock(&w->mu);
    char dir[DT_CKPT_PATH_MAX + 32];
    double t0 = dt_now(), bytes = 0;
    for (int i = 0; i < w->snap.nfiles; i++)
      bytes += w->snap.files[i].is_st ? (double)w->snap.files[i].st.data_bytes
                                      : (double)w->snap.files[i].len;
    int rc = dt__ckpt_write(w->root, &w->snap, w->keep, dir, sizeof dir);
    double dt = dt_now() - t0;
    char msg[512];
    if (rc < 0) {
      snprintf(msg, sizeof msg, "%s", dt_errmsg());
      DT_LOG_WARN("checkpoint of step %lld not written (training goes on, older checkpoints "
                  "kept): %s", (long long)w->snap.step, msg);
    }
    pthread_mutex_lock(&w->mu);
    if (rc < 0) {
      w->stats.failed++;
      w->stats.failed_step = w->snap.step;
      snprintf(w->stats.last_error, sizeof w->stats.last_error, "%s", msg);
    } else {
      w->stats.written++;
      w->stats.last_step = w->snap.step;
      w->stats.write_seconds += dt;
      w->stats.bytes += bytes;
      snprintf(w->stats.last_dir, sizeof w->stats.last_dir, "%s", dir);
    }
    w->pending = 0;
    pthread_cond_broadcast(&w->cv);
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

int dt__writer_create(dt_ckpt_writer **out, const char *root, int keep) {
  *out = NULL;
  dt_ckpt_writer *w = calloc(1, sizeof *w);
  if (!w) return dt__seterr(DT_ENOMEM, "checkpoint writer: out of memory");
  snprintf(w->root, sizeof w->root, "%s", root);
  w->keep = keep;
  w->stats.failed_step = -1;
  w->stats.last_step = -1;
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  if (pthread_create(&w->thread, NULL, run, w)) {
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
    return dt__seterr(DT_ENOMEM, "checkpoint writer: cannot start its thread");
  }
  *out = w;
  return DT_OK;
}

dt_ckpt_snap *dt__writer_acquire(dt_ckpt_writer *w, double *waited) {
  double t0 = dt_now();
  pthread_mutex_lock(&w->mu);
  while (w->pending) pthread_cond_wait(&w->cv, &w->mu);
  pthread_mutex_unlock(&w->mu);
  if (waited) *waited = dt_now() - t0;
  return &w->snap;
}

void dt__writer_submit(dt_ckpt_writer *w) {
  pthread_mutex_lock(&w->mu);
  w->pending = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

void dt__writer_drain(dt_ckpt_writer *w) {
  pthread_mutex_lock(&w->mu);
  while (w->pending) pthread_cond_wait(&w->cv, &w->mu);
  pthread_mutex_unlock(&w->mu);
}

void dt__writer_stats(dt_ckpt_writer *w, dt_ckpt_stats *st) {
  pthread_mutex_lock(&w->mu);
  *st = w->stats;
  pthread_mutex_unlock(&w->mu);
}

void dt__writer_destroy(dt_ckpt_writer *w) {
  if (!w) return;
  pthread_mutex_lock(&w->mu);
  w->stop = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  pthread_join(w->thread, NULL);
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  dt__snap_free(&w->snap);
  free(w);
}
