/*
 * cpu_quota.c — the CPU quota of the calling process's cgroup, in cores
 * (cgroup v1 cpu.cfs_quota_us / cpu.cfs_period_us, or v2 cpu.max), read
 * fresh on every call because a process can be moved into a cgroup while it
 * runs (the straggler bench does exactly that). The shared-memory window
 * asks it to decide whether polling a peer's word is affordable: under a
 * quota every polled microsecond is one less of compute (docs/ddp.md
 * "Stragglers").
 *
 * It reads only the process's own group, not the ancestors' limits, and
 * does not cache: callers decide how often to ask (a call is two small file
 * reads, ~10-20 us).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

/* The first line of path as a string (trailing newline removed). */
static int read_line(const char *path, char *buf, size_t cap) {
  FILE *f = fopen(path, "re");
  if (!f) return -1;
  char *ok = fgets(buf, (int)cap, f);
  fclose(f);
  if (!ok) return -1;
  buf[strcspn(buf, "\n")] = '\0';
  return 0;
}

/* v1: the cpu controller's group ("N:cpu,cpuacct:/path" or "N:cpu:/path"). */
static double quota_v1(const char *grp) {
  static const char *const roots[] = {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"};
  for (size_t i = 0; i < sizeof roots / sizeof roots[0]; i++) {
    char p[600], v[64];
    snprintf(p, sizeof p, "%s%s/cpu.cfs_quota_us", roots[i], strcmp(grp, "/") ? grp : "");
    if (read_line(p, v, sizeof v) < 0) continue;
    long long q = atoll(v);
    snprintf(p, sizeof p, "%s%s/cpu.cfs_period_us", roots[i], strcmp(grp, "/") ? grp : "");
    if (read_line(p, v, sizeof v) < 0) return 0;
    long long per = atoll(v);
    return q > 0 && per > 0 ? (double)q / (double)per : 0;
  }
  return 0;
}

/* v2: "0::/path" and cpu.max = "max 100000" or "50000 100000". */
static double quota_v2(const char *grp) {
  static const char *const roots[] = {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"};
  for (size_t i = 0; i < sizeof roots / sizeof roots[0]; i++) {
    char p[600], v[64];
    snprintf(p, sizeof p, "%s%s/cpu.max", roots[i], strcmp(grp, "/") ? grp : "");
    if (read_line(p, v, sizeof v) < 0) continue;
    if (!strncmp(v, "max", 3)) return 0;
    long long q = 0, per = 0;
    if (sscanf(v, "%lld %lld", &q, &per) != 2 || q <= 0 || per <= 0) return 0;
    return (double)q / (double)per;
  }
  return 0;
}

/* The calling process's cpu groups, from /proc/self/cgroup: the v1 cpu
 * controller's ("N:cpu,cpuacct:/path" or "N:cpu:/path", not cpuset or
 * cpuacct alone) in *v1, the v2 unified one ("0::/path") in *v2, each
 * empty when absent. -1 when the file cannot be read. */
static int cpu_groups(char *v1, char *v2, size_t cap) {
  FILE *f = fopen("/proc/self/cgroup", "re");
  if (!f) return -1;
  char line[512];
  v1[0] = v2[0] = '\0';
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = '\0';
    char *a = strchr(line, ':'), *b = a ? strchr(a + 1, ':') : NULL;
    if (!b) continue;
    *b = '\0';
    const char *ctl = a + 1, *grp = b + 1;
    char list[128];
    snprintf(list, sizeof list, ",%s,", ctl);
    if (!*ctl)
      snprintf(v2, cap, "%s", grp);
    else if (strstr(list, ",cpu,"))
      snprintf(v1, cap, "%s", grp);
  }
  fclose(f);
  return 0;
}

double dt_cpu_quota(void) {
  char g1[512], g2[512];
  if (cpu_groups(g1, g2, sizeof g1) < 0) return 0;
  double v1 = g1[0] ? quota_v1(g1) : 0, v2 = g2[0] ? quota_v2(g2) : 0;
  /* both hierarchies may limit (a hybrid mount): the tighter one counts */
  if (v1 > 0 && v2 > 0) return v1 < v2 ? v1 : v2;
  return v1 > 0 ? v1 : v2;
}

/* The cgroup's cpu.stat throttled time, seconds (v1 throttled_time in ns,
 * v2 throttled_usec); the group found as dt_cpu_quota finds it. */
static double throttled_in(const char *root, const char *grp, const char *key, double unit) {
  char p[600], line[128];
  snprintf(p, sizeof p, "%s%s/cpu.stat", root, strcmp(grp, "/") ? grp : "");
  FILE *f = fopen(p, "re");
  if (!f) return -1;
  double v = -1;
  const size_t k = strlen(key);
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, key, k) && line[k] == ' ') v = (double)atoll(line + k + 1) * unit;
  fclose(f);
  return v;
}

/* The groups are looked up on every call, not cached: a launcher or a
 * benchmark may move a running worker into a cgroup (bench/straggler.py
 * does), and a cached path would then read the old group's counter. The
 * caller reads it once per re-plan (every dist.balance_every steps), a
 * few microseconds against milliseconds of steps. */
double dt_cpu_throttled(void) {
  char g1[512], g2[512];
  if (cpu_groups(g1, g2, sizeof g1) < 0) return -1;
  double v1 = -1, v2 = g2[0] ? throttled_in("/sys/fs/cgroup", g2, "throttled_usec", 1e-6) : -1;
  if (g1[0]) {
    v1 = throttled_in("/sys/fs/cgroup/cpu", g1, "throttled_time", 1e-9);
    if (v1 < 0) v1 = throttled_in("/sys/fs/cgroup/cpu,cpuacct", g1, "throttled_time", 1e-9);
  }
  /* v1 where the quota is (dt_cpu_quota prefers neither; a hybrid mount
   * with both limiting is not handled: the v1 figure counts) */
  return v1 >= 0 ? v1 : v2;
}
