/*
 * diag.c — hang diagnosis: reads every rank's flight recorder (the pages
 * DIR/obs/rank-R, readable while the ranks are stuck, stopped or dead) and
 * says in one line which rank is behind and where the others wait:
 *
 *   rank 2 never entered allreduce #1234 (bucket 3, 512 KiB); ranks 0,1
 *   waiting in it for 60 s; rank 2 (pid 811) is stopped; its last
 *   operation was allreduce #1233, done 61 s ago
 *
 * The operation the others wait in is the one most ranks have entered and
 * not finished (ties: the lowest sequence number, the earliest to block).
 * A rank with no entry for it "never entered" it; a rank whose process is
 * stopped (state T) or gone is said so. Also writes each rank's recorder
 * as a table (dt_obs_fr_dump). It does not decide when to diagnose: the
 * launcher does (a failed worker, SIGUSR1; under mpirun/srun the ranks
 * themselves, src/cli/obs_cli.c), and a rank dumps its own recorder when a
 * collective fails (engine). dt_obs_diagnose_pages takes pages from
 * anywhere: files of this host's ranks and pages fetched from other hosts'
 * endpoints (with their processes' states as those hosts saw them).
 */
#include "obs/obs_diag.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *state_name(uint32_t s) {
  return s == DT_FR_ENTERED ? "in progress" : s == DT_FR_DONE ? "done" : s == DT_FR_FAILED ? "failed" : "?";
}

static void fmt_bytes(uint64_t b, char *buf, size_t cap) {
  if (b >= (1u << 20) && b % (1u << 20) == 0) snprintf(buf, cap, "%llu MiB", (unsigned long long)(b >> 20));
  else if (b >= 1024 && b % 1024 == 0) snprintf(buf, cap, "%llu KiB", (unsigned long long)(b >> 10));
  else if (b >= (1u << 20)) snprintf(buf, cap, "%.1f MiB", (double)b / (1 << 20));
  else if (b >= 1024) snprintf(buf, cap, "%.1f KiB", (double)b / 1024);
  else snprintf(buf, cap, "%llu B", (unsigned long long)b);
}

/* "allreduce #1234 (bucket 3, 512 KiB)" */
static void describe(const struct dt_obs_fr_entry *e, char *buf, size_t cap) {
  char b[32];
  fmt_bytes(e->bytes, b, sizeof b);
  int n = snprintf(buf, cap, "%s #%llu (", e->op, (unsigned long long)e->seq);
  if (e->note[0]) n += snprintf(buf + n, cap - (size_t)n, "%s, ", e->note);
  if (e->peer >= 0) n += snprintf(buf + n, cap - (size_t)n, "peer %d, ", e->peer);
  snprintf(buf + n, cap - (size_t)n, "%s%s)", b,
           e->stream == DT_OBS_STREAM_WINDOW ? ", shared window" : "");
}

/* Valid entries of a page in the order they began (oldest first). */
static int entries(const struct dt_obs_page *pg, const struct dt_obs_fr_entry **out) {
  int n = 0;
  for (int i = 0; i < DT_OBS_FR_LEN; i++)
    if (atomic_load(&((struct dt_obs_fr_entry *)&pg->fr[i])->state) && pg->fr[i].ticket) out[n++] = &pg->fr[i];
  for (int i = 1; i < n; i++) /* insertion sort by ticket */
    for (int j = i; j > 0 && out[j - 1]->ticket > out[j]->ticket; j--) {
      const struct dt_obs_fr_entry *t = out[j];
      out[j] = out[j - 1];
      out[j - 1] = t;
    }
  return n;
}

/* (a - b) in seconds, without overflow whatever a page holds */
static double secs(int64_t a, int64_t b) { return ((double)a - (double)b) / 1e9; }

static int pending(const struct dt_obs_fr_entry *e) {
  uint32_t s = atomic_load(&((struct dt_obs_fr_entry *)e)->state);
  return s == DT_FR_ENTERED || s == DT_FR_FAILED;
}

void dt_obs_fr_dump(const struct dt_obs_page *pg, FILE *f, int64_t now_ns, int last) {
  const struct dt_obs_fr_entry *v[DT_OBS_FR_LEN];
  int n = entries(pg, v);
  fprintf(f, "rank %d (pid %d, %s): %llu operations, the last %d:\n", pg->rank, pg->pid, pg->host,
          (unsigned long long)atomic_load(&((struct dt_obs_page *)pg)->fr_next),
          last < n ? last : n);
  for (int i = n > last ? n - last : 0; i < n; i++) {
    char d[160];
    describe(v[i], d, sizeof d);
    double ago = secs(now_ns, v[i]->t0_ns);
    double took = v[i]->t1_ns ? secs(v[i]->t1_ns, v[i]->t0_ns) : ago;
    fprintf(f, "  %-48s %-11s began %.3f s ago, %s %.6f s%s%s\n", d,
            state_name(atomic_load(&((struct dt_obs_fr_entry *)v[i])->state)), ago,
            v[i]->t1_ns ? "took" : "running", took, v[i]->rc ? ": " : "",
            v[i]->rc ? dt_strerror(v[i]->rc) : "");
  }
  if (atomic_load(&((struct dt_obs_page *)pg)->failed_rc))
    fprintf(f, "  failed: %s\n", pg->failed_msg);
}

int dt__obs_proc_state(int pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "re");
  if (!f) return 'X';
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  char *p = strrchr(buf, ')'); /* comm may hold spaces and parentheses */
  return p && p[1] == ' ' && p[2] ? p[2] : '?';
}

/* "0,1" from a list of ranks */
static void rank_list(const int *r, int n, char *buf, size_t cap) {
  size_t k = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && k + 12 < cap; i++) k += (size_t)snprintf(buf + k, cap - k, "%s%d", i ? "," : "", r[i]);
}

int dt_obs_diagnose_pages(const struct dt_obs_page *pg, const int *ok, const int *ranks,
                          const char *states, int n, int64_t now_ns, char *msg, size_t cap,
                          FILE *dump) {
  msg[0] = '\0';
  if (n < 1) return 0;
  int *in = calloc((size_t)n, sizeof *in);
  const struct dt_obs_fr_entry **last = calloc((size_t)n, sizeof *last);
  const struct dt_obs_fr_entry **match = calloc((size_t)n, sizeof *match);
  if (!in || !last || !match) {
    free(in), free(last), free(match);
    return dt__seterr(DT_ENOMEM, "diagnosis: out of memory");
  }
  for (int i = 0; i < n; i++) {
    if (!ok[i]) continue;
    const struct dt_obs_fr_entry *v[DT_OBS_FR_LEN];
    int k = entries(&pg[i], v);
    last[i] = k ? v[k - 1] : NULL;
    if (dump) dt_obs_fr_dump(&pg[i], dump, now_ns, DT_OBS_FR_LEN);
  }
  /* the operation most ranks are in (entered, not done) */
  const struct dt_obs_fr_entry *target = NULL;
  int best = 0;
  for (int i = 0; i < n; i++) {
    if (!ok[i] || !last[i] || !pending(last[i])) continue;
    int c = 0;
    for (int j = 0; j < n; j++)
      c += ok[j] && last[j] && pending(last[j]) && last[j]->stream == last[i]->stream &&
           last[j]->seq == last[i]->seq;
    if (c > best || (c == best && target && last[i]->seq < target->seq)) best = c, target = last[i];
  }
  int rc = 0;
  if (!target) {
    size_t k = (size_t)snprintf(msg, cap, "no rank is inside a collective or point-to-point "
                                "operation");
    for (int i = 0; i < n && k < cap; i++)
      if (!ok[i]) k += (size_t)snprintf(msg + k, cap - k, "; rank %d left no flight record", ranks[i]);
    goto out;
  }
  rc = 1;
  /* who is in it, who never entered it, who finished it */
  int nin = 0, *waiting = in;
  double longest = 0;
  for (int i = 0; i < n; i++) {
    if (!ok[i]) continue;
    const struct dt_obs_fr_entry *v[DT_OBS_FR_LEN];
    int k = entries(&pg[i], v);
    for (int j = 0; j < k; j++)
      if (v[j]->stream == target->stream && v[j]->seq == target->seq) match[i] = v[j];
    if (match[i] && pending(match[i])) {
      waiting[nin++] = ranks[i];
      int64_t end = match[i]->t1_ns ? match[i]->t1_ns : now_ns;
      double w = secs(end, match[i]->t0_ns);
      if (w > longest) longest = w;
    }
  }
  char what[200], list[256];
  describe(target, what, sizeof what);
  rank_list(waiting, nin, list, sizeof list);
  size_t k = 0;
  int late = 0;
  for (int i = 0; i < n && k < cap; i++) {
    if (ok[i] && match[i]) continue;
    late++;
    if (!ok[i]) k += (size_t)snprintf(msg + k, cap - k, "%srank %d never entered %s (it left no "
                                      "flight record)", k ? "; " : "", ranks[i], what);
    else k += (size_t)snprintf(msg + k, cap - k, "%srank %d never entered %s", k ? "; " : "", ranks[i],
                              what);
  }
  if (k < cap) {
    if (late)
      k += (size_t)snprintf(msg + k, cap - k, "; rank%s %s waiting in it for %.3g s", nin > 1 ? "s" : "",
                            list, longest);
    else
      k += (size_t)snprintf(msg + k, cap - k, "rank%s %s all in %s for %.3g s, none finished it",
                            nin > 1 ? "s" : "", list, what, longest);
  }
  /* what the others are doing: stopped or gone processes, their last operation */
  for (int i = 0; i < n && k < cap; i++) {
    if (!ok[i]) continue;
    /* a page fetched from another host: its process's state as that host saw it */
    int st = states && states[i] ? states[i] : pg[i].pid > 0 ? dt__obs_proc_state(pg[i].pid) : '?';
    int behind = !match[i];
    if (st == 'T' || st == 't')
      k += (size_t)snprintf(msg + k, cap - k, "; rank %d (pid %d) is stopped", ranks[i], pg[i].pid);
    else if ((st == 'X' || st == 'Z') && behind)
      k += (size_t)snprintf(msg + k, cap - k, "; rank %d (pid %d) has exited", ranks[i], pg[i].pid);
    if (behind && k < cap) {
      if (last[i]) {
        char d[200];
        describe(last[i], d, sizeof d);
        if (pending(last[i]))
          k += (size_t)snprintf(msg + k, cap - k, "; rank %d is in %s since %.3g s", ranks[i], d,
                                secs(now_ns, last[i]->t0_ns));
        else
          k += (size_t)snprintf(msg + k, cap - k, "; rank %d's last operation was %s, done %.3g s ago",
                                ranks[i], d, secs(now_ns, last[i]->t1_ns));
      } else {
        k += (size_t)snprintf(msg + k, cap - k, "; rank %d has recorded no operation", ranks[i]);
      }
    }
  }
out:
  free(in), free(last), free(match);
  return rc;
}

int dt_obs_diagnose(const char *obs_dir, int r0, int n, int64_t now_ns, char *msg, size_t cap,
                    FILE *dump) {
  msg[0] = '\0';
  if (n < 1) return 0;
  struct dt_obs_page *pg = calloc((size_t)n, sizeof *pg);
  int *ranks = calloc((size_t)n, sizeof *ranks), *ok = calloc((size_t)n, sizeof *ok);
  if (!pg || !ranks || !ok) {
    free(pg), free(ranks), free(ok);
    return dt__seterr(DT_ENOMEM, "diagnosis: out of memory");
  }
  for (int i = 0; i < n; i++) {
    char path[4200];
    ranks[i] = r0 + i;
    dt__obs_rank_path(obs_dir, r0 + i, path, sizeof path);
    ok[i] = dt__obs_read(path, &pg[i]) == DT_OK && pg[i].rank == r0 + i;
  }
  int rc = dt_obs_diagnose_pages(pg, ok, ranks, NULL, n, now_ns, msg, cap, dump);
  free(pg), free(ranks), free(ok);
  return rc;
}
