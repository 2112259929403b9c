/*
 * rdzv.c — the launchers of a multi-node job meet: every node's launcher
 * connects to the rendezvous store (served by node 0), puts its record
 * under "launch/node/<i>" with compare-and-set (a node rank claimed twice
 * is refused, naming the host that has it), then waits, up to the job's
 * deadline, for every other node's record and checks that all were started
 * with the same node count and workers per node. Waits are cut into short
 * slices so an interruption (SIGINT to the launcher) is noticed at once.
 *
 * It does not start the store (local.c does, on node 0) and does not
 * release the workers.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "core/core.h"
#include "elastic/elastic.h"
#include "launch/job_int.h"

#define SLICE 0.25 /* seconds between checks for an interruption */

/* Ranks of node i, "2-3" or "2". */
static void node_ranks(const dt_job *j, int i, char *buf, size_t cap) {
  int a = i * j->nlocal, b = a + j->nlocal - 1;
  if (a == b) snprintf(buf, cap, "%d", a);
  else snprintf(buf, cap, "%d-%d", a, b);
}

static int stopped(dt_job *j, int (*stop)(dt_job *)) {
  if (!stop || !stop(j)) return 0;
  return dt__seterr(DT_EABORTED, "node %d: interrupted while meeting the other nodes", j->node);
}

/* Names every node still missing, from node i on. */
static int report_missing(dt_job *j, dt_store *st, int i, const char *host, int port) {
  char missing[256] = "", rk[32], key[64], cur[512];
  size_t curlen;
  int nmiss = 0;
  for (int k = i; k < j->nnodes; k++) {
    if (k == j->node) continue;
    snprintf(key, sizeof key, "launch/node/%d", k);
    if (k > i && dt_store_get(st, key, cur, sizeof cur - 1, &curlen, 0.01) == DT_OK) continue;
    node_ranks(j, k, rk, sizeof rk);
    size_t ml = strlen(missing);
    snprintf(missing + ml, sizeof missing - ml, "%s%d (ranks %s)", nmiss ? ", " : "", k, rk);
    nmiss++;
  }
  return dt__seterr(DT_ETIMEDOUT, "node %d: node%s %s did not join the rendezvous at %s:%d "
                    "within %.0f s (DTRAIN_TIMEOUT)", j->node, nmiss > 1 ? "s" : "", missing,
                    host, port, j->cfg.deadline_s);
}

int dt__job_meet_nodes(dt_job *j, const char *host, int port, int (*stop)(dt_job *)) {
  double deadline = dt_now() + j->cfg.deadline_s;
  dt_store *st = NULL;
  int rc;
  for (;;) {
    double left = deadline - dt_now();
    /* a longer slice here: a handshake cut short under load is retried,
     * but should not need to be */
    rc = dt_elastic_store_connect(&st, host, port, j->token, left < 4 * SLICE ? (left > 0.01 ? left : 0.01)
                                                                     : 4 * SLICE);
    if (rc == DT_OK) break;
    if (rc == DT_EAUTH || dt_now() >= deadline)
      return dt__preerr(rc, "node %d: cannot reach the rendezvous store at %s:%d (served by node "
                        "0) within %.0f s", j->node, host, port, j->cfg.deadline_s);
    DT_CHECK(stopped(j, stop));
  }
  char key[64], rec[512], hn[256] = "?", cur[512];
  gethostname(hn, sizeof hn - 1);
  int n = snprintf(rec, sizeof rec, "%d %d %d %s %s", j->nnodes, j->nlocal, (int)getpid(),
                   j->bind, hn);
  snprintf(key, sizeof key, "launch/node/%d", j->node);
  bool swapped = false;
  size_t curlen = 0;
  rc = dt_store_cas(st, key, NULL, 0, rec, (size_t)n, &swapped, cur, sizeof cur - 1, &curlen,
                    j->cfg.deadline_s);
  if (rc < 0) {
    rc = dt__preerr(rc, "node %d: rendezvous", j->node);
    goto out;
  }
  if (!swapped) {
    cur[curlen] = '\0';
    const char *who = strrchr(cur, ' ');
    rc = dt__seterr(DT_EINVAL, "node %d: --node-rank %d is already taken by host %s (two nodes "
                    "with the same node rank?)", j->node, j->node, who ? who + 1 : "?");
    goto out;
  }
  for (int i = 0; i < j->nnodes; i++) {
    if (i == j->node) continue;
    snprintf(key, sizeof key, "launch/node/%d", i);
    for (;;) {
      double left = deadline - dt_now();
      rc = dt_store_get(st, key, cur, sizeof cur - 1, &curlen,
                        left < SLICE ? (left > 0.01 ? left : 0.01) : SLICE);
      if (rc != DT_ETIMEDOUT) break;
      if (dt_now() >= deadline) {
        rc = report_missing(j, st, i, host, port);
        goto out;
      }
      if ((rc = stopped(j, stop)) < 0) goto out;
    }
    if (rc < 0) {
      rc = dt__preerr(rc, "node %d: rendezvous: waiting for node %d", j->node, i);
      goto out;
    }
    cur[curlen] = '\0';
    int nn = 0, np = 0;
    if (sscanf(cur, "%d %d", &nn, &np) != 2 || nn != j->nnodes || np != j->nlocal) {
      const char *who = strrchr(cur, ' ');
      rc = dt__seterr(DT_EINVAL, "node %d: node %d (host %s) was started with --nnodes %d "
                      "--nproc-per-node %d, this node with --nnodes %d --nproc-per-node %d",
                      j->node, i, who ? who + 1 : "?", nn, np, j->nnodes, j->nlocal);
      goto out;
    }
  }
  rc = DT_OK;
out:
  dt_store_destroy(st);
  return rc;
}
