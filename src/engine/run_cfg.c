/*
 * run_cfg.c — the defaults of a run (docs/config.md lists them): the
 * 2-conv CNN on Fashion-MNIST with SGD momentum and a cosine schedule —
 * and the one place the names of the run configuration's enums live (the
 * config parser, the records and the launcher all read these tables). Kept
 * apart from the training loop so the config parser can use it alone.
 */
#include <stdio.h>
#include <string.h>

#include "engine/engine.h"

/* Index = enum value; NULL-terminated so parsers can walk them. The
 * transport names live with the transports (comm.h: dt__transport_names). */
const char *const dt__format_names[] = {"idx", "csv", "npy", NULL};
const char *const dt__optim_names[] = {"sgd", "adamw", NULL};
const char *const dt__sched_names[] = {"constant", "step", "cosine", NULL};
const char *const dt__reduce_names[] = {"avg", "sum", NULL};
const char *const dt__balance_names[] = {"static", "dynamic", "steal", NULL};
const char *const dt__schedule_names[] = {"gpipe", "1f1b", NULL};
const char *const dt__log_format_names[] = {"text", "json", NULL};
const char *const dt__ps_consistency_names[] = {"bsp", "ssp", "asp", NULL};
const char *const dt__loss_names[] = {"xent", "mse", NULL};

void dt_run_cfg_defaults(dt_run_cfg *c) {
  if (!c) return;
  memset(c, 0, sizeof *c);
  c->ps.replicas = 1;
  snprintf(c->layers, sizeof c->layers, "%s", DT_DEFAULT_LAYERS);
  c->format = DT_FMT_IDX;
  snprintf(c->train_images, sizeof c->train_images, "%s/train-images-idx3-ubyte.gz", DT_FASHION_DIR);
  snprintf(c->train_labels, sizeof c->train_labels, "%s/train-labels-idx1-ubyte.gz", DT_FASHION_DIR);
  snprintf(c->test_images, sizeof c->test_images, "%s/t10k-images-idx3-ubyte.gz", DT_FASHION_DIR);
  snprintf(c->test_labels, sizeof c->test_labels, "%s/t10k-labels-idx1-ubyte.gz", DT_FASHION_DIR);
  c->normalize = 1;
  c->shuffle = 1;
  c->limit_train = 0;
  c->limit_test = 0;
  c->label_col = 0;
  dt_optim_cfg o = DT_OPTIM_CFG_INIT;
  o.kind = DT_OPT_SGD;
  o.lr = 0.05f;
  o.momentum = 0.9f;
  o.nesterov = 0;
  o.weight_decay = 5e-4f;
  c->optim = o;
  c->epochs = 15;
  c->batch = 64;
  c->seed = 42;
  c->eval_every = 1;
  dt_sched_cfg s = DT_SCHED_CFG_INIT;
  s.kind = DT_SCHED_COSINE;
  s.warmup_steps = 0;
  s.step_size = 1000;
  s.gamma = 0.1f;
  s.min_lr = 0.0f;
  c->sched = s;
  c->workers = 1;
  c->transport = DT_DIST_AUTO;
  c->bucket_bytes = 128 << 10; /* measured: docs/ddp.md */
  c->reduce = DT_DIST_AVG;
  c->scale_lr = 0;
  c->base_batch = 64;
  c->deterministic = 0;
  c->micro_batch = 16; /* 8 before 2026-11-28: 16 halves the per-micro-shard rounding (docs/ddp.md) */
  c->balance = DT_BALANCE_STATIC;
  c->straggler_threshold = 0.25f;
  c->balance_every = 8;
  c->pipeline_stages = 1;
  c->schedule = 1; /* 1f1b */
  c->micro_batches = 1;
  c->stages[0] = 0;
  c->recompute = 0;
  c->pipe_wgrad = -1;
  c->compress = 0;
  c->error_feedback = 1;
  c->compress_ratio = 0.01f;
  c->qsgd_levels = 15;
  c->powersgd_rank = 6; /* from step 0 (docs/compress.md "Accuracy") */
  c->powersgd_warm_rank = -1;  /* 6 below rank 6 (docs/compress.md "Accuracy") */
  c->powersgd_warm_steps = -1; /* two epochs */
  c->compress_warmup_epochs = 0;
  c->compress_start_step = -1; /* the codec's own (docs/compress.md) */
  c->compress_clip = 0;
  c->compress_momentum = 0;
  c->compress_force = 0;
  c->tcp_connections = 0; /* DTRAIN_TCP_NCONN */
  c->obs_metrics[0] = '\0';
  c->obs_trace = 0;
  c->obs_trace_steps = 1000;
  c->obs_log_format = 0;
  c->ckpt_every_steps = 0;
  c->ckpt_every_seconds = 0;
  c->ckpt_epoch_end = 1;
  c->ckpt_on_signal = 1;
  c->ckpt_keep = 3;
  c->ckpt_async = 1;
  c->min_workers = 0;
  c->max_workers = 0;
  c->rejoin_timeout = 30;
  c->heartbeat_timeout = 2;
  c->replace = 0;
  c->standby = 0;
  c->standby_refresh_steps = 10;
}
