/*
 * env.c — what a launcher reads from its surroundings: integers, byte
 * counts and HOST:PORT from flags or DTRAIN_* variables, the rank and world
 * size an external launcher (mpirun, srun) put in the environment, the job
 * token, and the address this machine's tcp transport should listen on: the
 * source address of the route towards the rendezvous host, found with a
 * connected UDP socket and getsockname (no packet is sent), so the address
 * peers see is the one they can reach.
 *
 * It starts nothing and joins nothing (job.c, local.c and external.c do)
 * and prints nothing: every failure is a DT_E* code with one dt_errmsg()
 * line naming the flag or variable it came from.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/core.h"
#include "launch/launch.h"

int dt__parse_int(const char *what, const char *s, long lo, long hi, int *out) {
  char *end;
  errno = 0;
  long v = s ? strtol(s, &end, 10) : 0;
  if (!s || end == s || *end || errno || v < lo || v > hi)
    return dt__seterr(DT_EINVAL, "%s '%s': expects an integer in [%ld, %ld]", what, s ? s : "",
                      lo, hi);
  *out = (int)v;
  return DT_OK;
}

int dt__parse_bytes(const char *what, const char *s, uint64_t max, uint64_t *out) {
  const char *p = s ? s : "";
  while (*p == ' ' || *p == '\t') p++;
  /* strtoull accepts "-5" and negates it: refuse any sign first */
  if (*p < '0' || *p > '9')
    return dt__seterr(DT_EINVAL, "%s: bad value '%s': expects a byte count of 0 or more "
                      "(suffixes K, M, G)", what, s ? s : "");
  char *end;
  errno = 0;
  unsigned long long v = strtoull(p, &end, 10);
  int shift = 0;
  if (*end == 'K' || *end == 'k') shift = 10, end++;
  else if (*end == 'M' || *end == 'm') shift = 20, end++;
  else if (*end == 'G' || *end == 'g') shift = 30, end++;
  if (errno || *end || (shift && v > (~0ull >> shift)) || (v << shift) > max)
    return dt__seterr(DT_EINVAL, "%s: bad value '%s': expects a byte count in [0, %llu] "
                      "(suffixes K, M, G)", what, s, (unsigned long long)max);
  *out = (uint64_t)v << shift;
  return DT_OK;
}

int dt__resolve_ipv4(const char *host, char *ip, size_t cap) {
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  int g = getaddrinfo(host, NULL, &hints, &res);
  if (g || !res) return dt__seterr(DT_ENOENT, "'%s' does not resolve to an IPv4 address", host);
  const struct sockaddr_in *sa = (const struct sockaddr_in *)res->ai_addr;
  inet_ntop(AF_INET, &sa->sin_addr, ip, (socklen_t)cap);
  freeaddrinfo(res);
  return DT_OK;
}

int dt__parse_hostport(const char *what, const char *s, char *host, size_t hcap, int *port,
                       int allow_zero) {
  const char *colon = s ? strrchr(s, ':') : NULL;
  char *end;
  long p = colon ? strtol(colon + 1, &end, 10) : -1;
  if (!colon || colon == s || (size_t)(colon - s) >= hcap || !colon[1] || *end ||
      p < (allow_zero ? 0 : 1) || p > 65535)
    return dt__seterr(DT_EINVAL, "%s '%s': expects HOST:PORT with PORT in 1..65535", what,
                      s ? s : "");
  memcpy(host, s, (size_t)(colon - s));
  host[colon - s] = '\0';
  *port = (int)p;
  return DT_OK;
}

int dt__route_addr(const char *ipv4, char *out, size_t cap) {
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(9); /* discard; nothing is sent */
  if (inet_pton(AF_INET, ipv4, &sa.sin_addr) != 1)
    return dt__seterr(DT_EINVAL, "'%s' is not an IPv4 address", ipv4);
  if (sa.sin_addr.s_addr == htonl(INADDR_ANY)) {
    snprintf(out, cap, "127.0.0.1");
    return DT_OK;
  }
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return dt__seterr(DT_EIO, "socket: %s", strerror(errno));
  socklen_t sl = sizeof sa;
  int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa) ||
                   getsockname(fd, (struct sockaddr *)&sa, &sl)
               ? dt__seterr(DT_EIO, "no route from this machine to %s: %s", ipv4, strerror(errno))
               : DT_OK;
  close(fd);
  if (rc == DT_OK) inet_ntop(AF_INET, &sa.sin_addr, out, (socklen_t)cap);
  return rc;
}

int dt__can_bind(const char *ipv4, int port) {
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  if (inet_pton(AF_INET, ipv4, &sa.sin_addr) != 1)
    return dt__seterr(DT_EINVAL, "'%s' is not an IPv4 address", ipv4);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
  if (fd < 0) return dt__seterr(DT_EIO, "socket: %s", strerror(errno));
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int rc = bind(fd, (struct sockaddr *)&sa, sizeof sa) ? dt__seterr(DT_EIO, "%s", strerror(errno))
                                                        : DT_OK;
  close(fd);
  return rc;
}

/* One launcher's pair of variables: rank and size. */
struct env_src {
  const char *rank, *size, *name;
};

int dt__env_world(struct dt__env_world *w) {
  static const struct env_src srcs[] = {
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "mpirun"},
      {"PMI_RANK", "PMI_SIZE", "PMI"},
      {"SLURM_PROCID", "SLURM_NTASKS", "srun"},
  };
  memset(w, 0, sizeof *w);
  for (size_t i = 0; i < sizeof srcs / sizeof srcs[0]; i++) {
    const char *r = getenv(srcs[i].rank), *s = getenv(srcs[i].size);
    if (!r || !s) continue;
    /* An sbatch script itself has SLURM_PROCID and SLURM_NTASKS but is not
     * one task of a step; only srun's tasks (SLURM_STEP_ID set) count. */
    if (!strcmp(srcs[i].name, "srun") && !getenv("SLURM_STEP_ID")) continue;
    DT_CHECK(dt__parse_int(srcs[i].size, s, 1, 1 << 20, &w->size));
    DT_CHECK(dt__parse_int(srcs[i].rank, r, 0, w->size - 1, &w->rank));
    w->source = srcs[i].name;
    w->rank_var = srcs[i].rank;
    w->size_var = srcs[i].size;
    const char *job = getenv("OMPI_MCA_ess_base_jobid");
    if (!job) job = getenv("PMIX_NAMESPACE");
    if (!job && getenv("SLURM_JOB_ID")) {
      snprintf(w->jobid, sizeof w->jobid, "%s.%s", getenv("SLURM_JOB_ID"),
               getenv("SLURM_STEP_ID") ? getenv("SLURM_STEP_ID") : "0");
    } else if (job) {
      snprintf(w->jobid, sizeof w->jobid, "%s", job);
    }
    for (char *p = w->jobid; *p; p++)
      if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
            *p == '.' || *p == '-'))
        *p = '_';
    return 1;
  }
  return 0;
}

int dt__job_token(int shared_needed, const char *who, const char **out) {
  const char *t = dt_param_s(DT_PARAM_JOB_TOKEN);
  *out = NULL;
  if (t && strlen(t) >= 16) {
    *out = t;
    return DT_OK;
  }
  if (t && *t)
    return dt__seterr(DT_EINVAL, "DTRAIN_JOB_TOKEN is too short (%zu characters, need at least "
                      "16; make one with: openssl rand -hex 32)", strlen(t));
  if (!shared_needed) {
    *out = "";
    return DT_OK;
  }
  return dt__seterr(DT_EINVAL, "DTRAIN_JOB_TOKEN is not set: %s needs the same secret on every "
                    "node (make one with `openssl rand -hex 32` and export it everywhere)", who);
}

void dt__make_token(char *hex, size_t cap) {
  unsigned char raw[16] = {0};
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t n = read(fd, raw, sizeof raw);
    (void)n;
    close(fd);
  }
  uint64_t t = (uint64_t)dt_now_ns() ^ ((uint64_t)getpid() << 32);
  for (size_t i = 0; i < 8; i++) raw[i] ^= (unsigned char)(t >> (8 * i));
  if (cap) hex[0] = '\0';
  for (size_t i = 0; i < sizeof raw && 2 * i + 2 < cap; i++) snprintf(hex + 2 * i, 3, "%02x", raw[i]);
}
