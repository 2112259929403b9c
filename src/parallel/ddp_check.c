/*
 * ddp_check.c — the start-up checks of data parallelism (docs/ddp.md):
 * rank 0's parameters (and buffers) broadcast to every rank, a SHA-256 of
 * them compared across ranks, and each rank's config fingerprint compared
 * with rank 0's, naming the first key that differs. They use only the
 * model and the communicator, before any step: nothing of the bucketed
 * exchange in ddp.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "nn/nn.h"
#include "parallel/ddp.h"

static int comm_fail(dt_comm *c, int rc, const char *what) {
  const char *m = dt_comm_errmsg(c);
  return dt__seterr(rc, "%s: %s", what, m && *m ? m : dt_errmsg());
}

static int check_hash(dt_model *m, dt_comm *c, const char *what) {
  int n = dt_comm_size(c);
  char mine[65];
  dt_sha256_hex(dt_model_params(m), dt_model_nparams(m) * sizeof(float), mine);
  char *all = malloc((size_t)n * 64);
  if (!all) return dt__seterr(DT_ENOMEM, "ddp: out of memory");
  int rc = dt_comm_allgather(c, mine, all, 64, DT_U8);
  if (rc < 0) {
    free(all);
    return comm_fail(c, rc, what);
  }
  for (int r = 1; r < n; r++)
    if (memcmp(all, all + (size_t)r * 64, 64)) {
      rc = dt__seterr(DT_EMISMATCH, "%s: parameters of rank %d (sha256 %.16s...) differ from "
                      "rank 0's (%.16s...)", what, r, all + (size_t)r * 64, all);
      break;
    }
  free(all);
  return rc;
}

int dt_ddp_broadcast_params(dt_model *m, dt_comm *c) {
  int rc = dt_comm_broadcast(c, dt_model_params(m), dt_model_nparams(m), DT_F32, 0);
  if (rc < 0) return comm_fail(c, rc, "parameter broadcast from rank 0");
  if (dt_model_nbufs(m)) {
    rc = dt_comm_broadcast(c, dt_model_bufs(m), dt_model_nbufs(m), DT_F32, 0);
    if (rc < 0) return comm_fail(c, rc, "buffer broadcast from rank 0");
  }
  return check_hash(m, c, "parameter broadcast");
}

int dt_ddp_check_params(dt_model *m, dt_comm *c) {
  return check_hash(m, c, "parameter check");
}

const char *dt_ddp_fingerprint_diff(const dt_ddp_fingerprint *a, const dt_ddp_fingerprint *b,
                                    const char *who_b, const char *who_a, char *buf,
                                    size_t cap) {
#define NUM(f, key)                                                                 \
  if (a->f != b->f) {                                                               \
    snprintf(buf, cap, "%s = %lld %s, %lld %s", key, (long long)b->f, who_b,         \
             (long long)a->f, who_a);                                               \
    return buf;                                                                     \
  }
  NUM(workers, "dist.workers")
  NUM(batch, "train.batch")
  NUM(deterministic, "dist.deterministic")
  NUM(micro_batch, "dist.micro_batch")
  NUM(balance, "dist.balance")
  NUM(balance_every, "dist.balance_every")
  NUM(epochs, "train.epochs")
  NUM(seed, "train.seed")
  if (memcmp(a->layers_sha, b->layers_sha, 32)) return "model.layers differ";
  NUM(nparams, "parameter count")
  NUM(train_n, "training samples")
  NUM(test_n, "test samples")
  if (memcmp(a->optim_sha, b->optim_sha, 32)) return "[optim]/[schedule] settings differ";
  if (memcmp(a->config_sha, b->config_sha, 32)) return "the configuration text differs";
#undef NUM
  return NULL;
}

int dt_ddp_check_config(dt_comm *c, const dt_ddp_fingerprint *fp) {
  int n = dt_comm_size(c);
  dt_ddp_fingerprint *all = calloc((size_t)n, sizeof *all);
  if (!all) return dt__seterr(DT_ENOMEM, "ddp: out of memory");
  int rc = dt_comm_allgather(c, fp, all, sizeof *fp, DT_U8);
  if (rc < 0) {
    free(all);
    return comm_fail(c, rc, "config check");
  }
  char buf[160];
  /* Deterministic mode: ranks whose arithmetic differs from rank 0's (the
   * probe of det_probe.c), all of them named. */
  char ranks[160] = "";
  size_t rl = 0;
  int ndiff = 0, first = 0;
  for (int r = 1; r < n; r++) {
    if (all[r].deterministic != all[0].deterministic || all[r].det_probe == all[0].det_probe) continue;
    if (!ndiff) first = r;
    if (rl < sizeof ranks - 16) rl += (size_t)snprintf(ranks + rl, sizeof ranks - rl, "%s%d", ndiff ? ", " : "", r);
    ndiff++;
  }
  if (ndiff) {
    rc = dt__seterr(DT_EMISMATCH, "deterministic mode: rank%s %s compute%s floating point differently from "
                    "rank 0 (probe %016llx on rank %d, %016llx on rank 0: another CPU type, GEMM kernel or "
                    "libm), so the result would depend on the hosts; run the job on hosts of one kind",
                    ndiff > 1 ? "s" : "", ranks, ndiff > 1 ? "" : "s", (unsigned long long)all[first].det_probe,
                    first, (unsigned long long)all[0].det_probe);
    free(all);
    return rc;
  }
  for (int r = 1; r < n; r++) {
    char who[32];
    snprintf(who, sizeof who, "on rank %d", r);
    const char *why = dt_ddp_fingerprint_diff(&all[0], &all[r], who, "on rank 0", buf, sizeof buf);
    if (why) {
      rc = dt__seterr(DT_EMISMATCH, "config of rank %d differs from rank 0's (%s); every "
                      "worker must run the same configuration", r, why);
      break;
    }
  }
  free(all);
  return rc;
}
