/*
 * ddp.c — bucketed, overlapped gradient allreduce for data parallelism.
 *
 * Buckets are contiguous spans of the flat gradient buffer, built walking
 * the layers backwards (the order backward produces them) and closed once
 * they hold dist.bucket_bytes. Each bucket counts the layers it still
 * waits for; the grad-ready callback of dt_model_backward decrements it and,
 * at zero, queues the bucket for the communication thread, which scales it
 * by n_local / n_global and sums it over all workers in place. After
 * backward, dt_ddp_finish_step queues whatever is left (robust to a layer
 * that never reported) and waits.
 *
 * Deterministic mode (dt_ddp_create_det, ddp_det.c) sums fixed-point
 * gradients exactly instead; its accumulator, slots and verdict live there.
 *
 * Ranks that share a host over shm keep the gradient buffer in a shared
 * window (comm/window.h): a bucket's "allreduce" is then one pass in which
 * each rank sums its slice over every rank's window, scale included, and
 * writes it back everywhere — no staging copies, no separate scaling pass.
 *
 * With compression (dt_ddp_create_compressed) a bucket's reduction is
 * dt_compress_reduce of comm/compress instead: the scale, the codec, its
 * error feedback and collective in one call; no shared window.
 *
 * The communication thread is the only user of the communicator during a
 * step; it records the first error (with its message, since dt_errmsg is
 * per thread) and skips the remaining buckets of that step, so the compute
 * thread never waits on work that will not happen. Every allreduce has the
 * communicator's deadline, so no wait here is unbounded.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "parallel/ddp_int.h"
#include "tensor/tensor.h"

static int reduce_bucket_now(dt_ddp *d, int i, float scale);

/* One bucket's reduction as the flight recorder, the allreduce histogram
 * and the trace see it (tid 1: the communication thread). */
static int reduce_bucket(dt_ddp *d, int i, float scale, int tid) {
  if (!d->obs) return reduce_bucket_now(d, i, scale);
  dt_obs_fr_note_n(d->obs, "bucket", i);
  int64_t t0 = dt_now_ns();
  int rc = reduce_bucket_now(d, i, scale);
  int64_t t1 = dt_now_ns();
  dt_obs_observe(d->m_ar, (double)(t1 - t0) / 1e9);
  dt_obs_span(d->obs, "allreduce", tid, t0, t1, i);
  return rc;
}

/* Allreduce of bucket i (in place) and, in deterministic mode, conversion
 * back to floats. Returns the allreduce's status. */
static int reduce_bucket_now(dt_ddp *d, int i, float scale) {
  float *g = d->grads + d->b[i].off;
  size_t n = d->b[i].n;
  if (d->cz) return dt_compress_reduce(d->cz, d->comm, d->grads, d->b[i].off, n, scale);
  if (d->det) return dt__ddp_det_reduce(d, i);
  if (d->win && d->apply)
    return dt_comm_window_reduce_apply_f32(d->win, d->b[i].off * sizeof(float), n, scale,
                                           d->apply, d->apply_ud);
  if (d->win) return dt_comm_window_allreduce_f32(d->win, d->b[i].off * sizeof(float), n, scale);
  if (scale != 1.0f)
    for (size_t j = 0; j < n; j++) g[j] *= scale;
  return dt_comm_allreduce(d->comm, g, g, n, DT_F32, DT_OP_SUM);
}

/* The message of reduce_bucket's failure, on the thread that saw it. */
static const char *reduce_errmsg(dt_ddp *d) {
  const char *m = d->win || d->cz || !d->comm ? NULL : dt_comm_errmsg(d->comm);
  return m && *m ? m : dt_errmsg();
}

static void enqueue_locked(dt_ddp *d, int i) {
  if (d->b[i].queued) return;
  d->b[i].queued = 1;
  /* the head rides with the last bucket: every value is converted by now */
  if (d->det && i == d->nb - 1) d->acc[d->nbufs] = (int64_t)d->nbad;
  d->queue[d->qlen++] = i;
  pthread_cond_signal(&d->cv);
}

static void *comm_main(void *arg) {
  dt_ddp *d = arg;
  pthread_mutex_lock(&d->mu);
  for (;;) {
    while (!d->stop && d->qnext >= d->qlen) pthread_cond_wait(&d->cv, &d->mu);
    if (d->qnext >= d->qlen && d->stop) break;
    int i = d->queue[d->qnext++];
    int skip = d->err != 0;
    float scale = d->scale;
    pthread_mutex_unlock(&d->mu);
    int rc = DT_OK;
    double t0 = dt_now();
    if (!skip) rc = reduce_bucket(d, i, scale, 1);
    double dt = dt_now() - t0;
    pthread_mutex_lock(&d->mu);
    d->st.comm_seconds += dt;
    if (rc < 0 && !d->err) {
      d->err = rc;
      snprintf(d->errmsg, sizeof d->errmsg, "%s", reduce_errmsg(d));
    }
    d->ndone++;
    pthread_cond_broadcast(&d->done_cv);
  }
  pthread_mutex_unlock(&d->mu);
  return NULL;
}

/* Whether a communication thread should reduce buckets while backward
 * runs. DTRAIN_DDP_OVERLAP=1/0 decides; by default (-1) yes, except when
 * the buckets go through a shared window and this host has fewer cores than
 * 2 threads per worker: the window's reduction is CPU work, not waiting, so
 * a thread can only take it from the compute thread, and the hand-offs cost
 * more than they hide (MLP, 2 workers on 2 cores: 149-155k samples/s with
 * the thread, 175-189k without; the CNN within noise either way). */
static int overlap_pays(dt_ddp *d, dt_comm *c) {
  int64_t v = dt_param(DT_PARAM_DDP_OVERLAP);
  if (v >= 0) return v != 0;
  if (!d->win) return 1;
  struct dt_comm_topo t;
  dt_comm_topology(c, &t);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  return 2L * t.local_size <= cores;
}

/* The weight matrices powersgd may factor: linear and conv layers' weights
 * (out_c rows, the rest of the layer's parameters but its out_c biases). */
static int compressor(dt_ddp *d, dt_model *m, dt_comm *c, const dt_compress_cfg *cz) {
  int nl = dt_model_nlayers(m), nm = 0;
  dt_cz_matrix *mats = calloc((size_t)nl + 1, sizeof *mats);
  if (!mats) return dt__seterr(DT_ENOMEM, "ddp: out of memory");
  for (int i = 0; i < nl; i++) {
    const dt_layer_info *li = dt_model_layer(m, i);
    if ((li->kind != DT_L_LINEAR && li->kind != DT_L_CONV2D) || li->out_c < 1 || !li->nparams)
      continue;
    size_t oc = (size_t)li->out_c;
    if (li->nparams % oc || li->nparams / oc < 2) continue;
    mats[nm++] = (dt_cz_matrix){li->param_off, li->out_c, (int)(li->nparams / oc - 1)};
  }
  int rc = dt_compress_create(&d->cz, cz, dt_model_nparams(m), mats, nm, dt_comm_rank(c),
                              dt_comm_size(c));
  free(mats);
  /* the framed codecs' frames of all buckets in one allgather per step
   * (DTRAIN_CZ_FUSE): each bucket is still encoded as backward makes it */
  int spans = 0;
  for (int i = 0; i < d->nb; i++) spans += d->b[i].n > 0;
  if (rc == DT_OK && dt_param(DT_PARAM_CZ_FUSE)) rc = dt_compress_fuse(d->cz, spans);
  return rc;
}

static int create(dt_ddp **out, dt_model *m, dt_comm *c, int64_t bucket_bytes, int det,
                  const dt_compress_cfg *cz, int nowin) {
  *out = NULL;
  dt_ddp *d = calloc(1, sizeof *d);
  if (!d) return dt__seterr(DT_ENOMEM, "ddp: out of memory");
  d->model = m;
  d->comm = c;
  d->obs = dt_comm_obs(c);
  d->m_ar = dt_obs_histogram(d->obs, "dtrain_allreduce_seconds",
                             "Time to reduce one gradient bucket over all workers", NULL, 0);
  d->m_wait = dt_obs_counter(d->obs, "dtrain_peer_wait_seconds_total",
                             "Time the training thread waited for gradient reduction after backward");
  d->grads = dt_model_grads(m);
  int nl = dt_model_nlayers(m);
  d->b = calloc((size_t)nl + 1, sizeof *d->b);
  d->queue = calloc((size_t)nl + 1, sizeof *d->queue);
  pthread_mutex_init(&d->mu, NULL);
  pthread_cond_init(&d->cv, NULL);
  pthread_cond_init(&d->done_cv, NULL);
  d->det = det;
  const int rewritten = dt__model_grads_rewritten(m); /* before the stash is set */
  if (!d->b || !d->queue) {
    dt_ddp_destroy(d);
    return dt__seterr(DT_ENOMEM, "ddp: out of memory");
  }
  if (det) {
    int rc = dt__ddp_det_init(d, rewritten);
    if (rc < 0) {
      dt_ddp_destroy(d);
      return rc;
    }
  }
  int64_t cap = bucket_bytes > 0 ? bucket_bytes : 128 << 10;
  if (cap < 4) cap = 4;
  /* Walk layers backwards; a bucket is [lo, hi) growing downwards. */
  bucket *cur = NULL;
  for (int i = nl - 1; i >= 0; i--) {
    const dt_layer_info *li = dt_model_layer(m, i);
    if (!li->nparams) continue;
    if (cur && (int64_t)(cur->n * sizeof(float)) >= cap) cur = NULL;
    if (!cur) {
      cur = &d->b[d->nb++];
      cur->off = li->param_off + li->nparams;
      cur->n = 0;
    }
    /* layers are laid out in order, so this layer ends where the bucket begins */
    cur->off = li->param_off;
    cur->n += li->nparams;
    cur->layers++;
  }
  if (det && d->nb == 0) d->nb = 1; /* no parameters: one empty bucket carries the head */
  d->st.nbuckets = d->nb;
  /* Ranks on one host talking shm: the gradients move into a shared window
   * and each bucket is reduced in one pass over it, with the averaging
   * scale fused in (comm/window.h); in deterministic mode the int64
   * accumulator (head and sums) lives there instead and buckets are summed
   * exactly in one pass. Otherwise (other hosts, a forced tcp or mpi
   * transport, DTRAIN_WINDOW=0) the transport's allreduce. */
  size_t np = dt_model_nparams(m);
  if (det && c && dt_comm_size(c) > 1 && !(cz && cz->codec != DT_CODEC_NONE)) {
    int rc = dt__ddp_det_window(d, c, rewritten);
    if (rc < 0) {
      dt_ddp_destroy(d);
      return rc;
    }
  }
  if (cz && cz->codec != DT_CODEC_NONE) {
    int rc = compressor(d, m, c, cz);
    if (rc < 0) {
      dt_ddp_destroy(d);
      return rc;
    }
  } else if (!det && !nowin && c && dt_comm_size(c) > 1 && np) {
    int rc = dt_comm_window_create(c, np * sizeof(float), &d->win);
    if (rc == DT_OK) {
      dt_model_set_grads(m, dt_comm_window_base(d->win));
      d->grads = dt_model_grads(m);
    } else if (rc != DT_ENOTSUP) {
      dt_ddp_destroy(d);
      return dt__preerr(rc, "ddp: gradient window");
    }
  }
  d->ndone = d->qlen = d->qnext = 0;
  /* one bucket is ready only when backward ends: nothing to overlap, so
   * skip the thread hand-off */
  d->overlap = d->nb > 1 && c && overlap_pays(d, c);
  if (!d->overlap) {
    *out = d;
    return DT_OK;
  }
  if (pthread_create(&d->thread, NULL, comm_main, d)) {
    dt_ddp_destroy(d);
    return dt__seterr(DT_ENOMEM, "ddp: cannot start the communication thread");
  }
  d->started = 1;
  *out = d;
  return DT_OK;
}

int dt_ddp_create(dt_ddp **out, dt_model *m, dt_comm *c, int64_t bucket_bytes) {
  if (!c) {
    *out = NULL;
    return dt__seterr(DT_EINVAL, "ddp: a communicator is needed outside deterministic mode");
  }
  return create(out, m, c, bucket_bytes, 0, NULL, 0);
}

int dt__ddp_create_nowin(dt_ddp **out, dt_model *m, dt_comm *c, int64_t bucket_bytes) {
  if (!c) {
    *out = NULL;
    return dt__seterr(DT_EINVAL, "ddp: a communicator is needed outside deterministic mode");
  }
  return create(out, m, c, bucket_bytes, 0, NULL, 1);
}

int dt_ddp_create_compressed(dt_ddp **out, dt_model *m, dt_comm *c, int64_t bucket_bytes,
                             const dt_compress_cfg *cz) {
  if (!c) {
    *out = NULL;
    return dt__seterr(DT_EINVAL, "ddp: a communicator is needed for compressed gradients");
  }
  return create(out, m, c, bucket_bytes, 0, cz, 0);
}

void dt_ddp_set_step(dt_ddp *d, int64_t step, int epoch) {
  if (d->cz) dt_compress_begin_step(d->cz, step, epoch);
}

void dt_ddp_compress_bytes(const dt_ddp *d, uint64_t *sent, uint64_t *dense) {
  dt_compress_stats st = {0, 0, 0};
  if (d->cz) dt_compress_get_stats(d->cz, &st);
  *sent = st.bytes_sent;
  *dense = st.dense_bytes;
}

struct dt_compress *dt_ddp_compressor(dt_ddp *d) { return d ? d->cz : NULL; }

int dt_ddp_create_det(dt_ddp **out, dt_model *m, dt_comm *c, int64_t bucket_bytes) {
  return create(out, m, c, bucket_bytes, 1, NULL, 0);
}

void dt_ddp_destroy(dt_ddp *d) {
  if (!d) return;
  if (d->started) {
    pthread_mutex_lock(&d->mu);
    d->stop = 1;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->thread, NULL);
  }
  pthread_mutex_destroy(&d->mu);
  pthread_cond_destroy(&d->cv);
  pthread_cond_destroy(&d->done_cv);
  if (d->det) dt__ddp_det_free(d); /* before the window: the gradients may live there */
  if (d->win) {
    if (!d->acc_in_win) dt_model_set_grads(d->model, NULL);
    dt_comm_window_destroy(d->win);
  }
  dt_compress_destroy(d->cz);
  free(d->b);
  free(d->queue);
  free(d);
}

void dt__ddp_reset_locked(dt_ddp *d) {
  d->qlen = d->qnext = d->ndone = 0;
  d->err = 0;
  d->errmsg[0] = '\0';
  for (int i = 0; i < d->nb; i++) {
    d->b[i].pending = d->b[i].layers;
    d->b[i].queued = 0;
  }
}

void dt_ddp_begin_step(dt_ddp *d, int n_local, int n_global) {
  pthread_mutex_lock(&d->mu);
  d->scale = n_global > 0 ? (float)n_local / (float)n_global : 0.0f;
  dt__ddp_reset_locked(d);
  pthread_mutex_unlock(&d->mu);
}

void dt_ddp_grad_ready(void *ud, size_t off, size_t n) {
  dt_ddp *d = ud;
  if (!n) return;
  if (d->det) {
    dt__ddp_det_grad_ready(d, off, n);
    if (!d->flushing || !d->last) return; /* kept in its slot, or not the last micro-shard */
  }
  if (!d->overlap) return;
  pthread_mutex_lock(&d->mu);
  for (int i = 0; i < d->nb; i++) {
    bucket *b = &d->b[i];
    if (off >= b->off && off < b->off + b->n) {
      if (b->pending > 0 && --b->pending == 0) enqueue_locked(d, i);
      break;
    }
  }
  pthread_mutex_unlock(&d->mu);
}

void dt_ddp_all_ready(dt_ddp *d) {
  /* deterministic: no micro-shard here, so this worker adds zeros */
  if (d->det && d->shard == 0) memset(d->acc, 0, (d->head + d->nparams) * sizeof *d->acc);
  dt__ddp_slots_settle(d);
  if (!d->overlap) return;
  pthread_mutex_lock(&d->mu);
  for (int i = 0; i < d->nb; i++) enqueue_locked(d, i);
  pthread_mutex_unlock(&d->mu);
}

/* Without overlap: every bucket on the calling thread, in queue order. */
static int finish_inline(dt_ddp *d) {
  double t0 = dt_now();
  int rc = DT_OK;
  dt__ddp_slots_settle(d);
  if (d->det) d->acc[d->nbufs] = (int64_t)d->nbad;
  for (int i = 0; i < d->nb && rc == DT_OK; i++) rc = reduce_bucket(d, i, d->scale, 0);
  double dt = dt_now() - t0;
  dt_obs_add(d->m_wait, dt);
  pthread_mutex_lock(&d->mu);
  d->st.comm_seconds += dt;
  d->st.exposed_seconds += dt;
  d->st.steps++;
  pthread_mutex_unlock(&d->mu);
  if (rc < 0) {
    /* the reason may be this thread's own message buffer: copy it first */
    char why[512];
    snprintf(why, sizeof why, "%s", reduce_errmsg(d));
    return dt__seterr(rc, "gradient allreduce: %s: %s", dt_strerror(rc), why);
  }
  return dt__ddp_det_verdict(d);
}

int dt_ddp_finish_step(dt_ddp *d) {
  if (!d->overlap) return finish_inline(d);
  dt__ddp_slots_settle(d);
  double t0 = dt_now();
  pthread_mutex_lock(&d->mu);
  for (int i = 0; i < d->nb; i++) enqueue_locked(d, i);
  while (d->ndone < d->nb) pthread_cond_wait(&d->done_cv, &d->mu);
  int rc = d->err;
  double waited = dt_now() - t0;
  d->st.exposed_seconds += waited;
  dt_obs_add(d->m_wait, waited);
  d->st.steps++;
  pthread_mutex_unlock(&d->mu);
  if (rc < 0) return dt__seterr(rc, "gradient allreduce: %s: %s", dt_strerror(rc), d->errmsg);
  return dt__ddp_det_verdict(d);
}

int dt_ddp_set_apply(dt_ddp *d, dt_window_apply_fn fn, void *ud) {
  if (fn && (d->det || d->cz || !d->win))
    return dt__seterr(DT_ENOTSUP, "ddp: the update in the reduction needs a shared gradient "
                      "window, plain float sums and no compression");
  d->apply = fn;
  d->apply_ud = ud;
  return DT_OK;
}

double dt_ddp_blocked_seconds(const dt_ddp *d) {
  return d->win ? dt_comm_window_blocked(d->win) : -1;
}

int dt_ddp_set_shares(dt_ddp *d, const double *weights) {
  return d->win ? dt_comm_window_set_shares(d->win, weights) : DT_OK;
}

void dt_ddp_get_stats(const dt_ddp *d, dt_ddp_stats *out) {
  pthread_mutex_lock((pthread_mutex_t *)&d->mu);
  *out = d->st;
  if (d->win) dt_comm_window_bytes(d->win, &out->window_written, &out->window_read);
  pthread_mutex_unlock((pthread_mutex_t *)&d->mu);
}
