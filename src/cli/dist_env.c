/*
 * dist_env.c — what the launch paths read from their surroundings: integers
 * and HOST:PORT from flags or DTRAIN_* variables (flags win), the rank and
 * world size an external launcher (mpirun, srun) put in the environment,
 * the job token, and the address this machine's tcp transport should listen
 * on: the source address of the route towards the rendezvous host, found
 * with a connected UDP socket and getsockname (no packet is sent), so the
 * address peers see is the one they can reach.
 *
 * It starts nothing and joins nothing; cmd_launch.c and cmd_train.c do.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/core.h"

int dt__parse_int(const char *what, const char *s, long lo, long hi, int *out) {
  char *end;
  errno = 0;
  long v = s ? strtol(s, &end, 10) : 0;
  if (!s || end == s || *end || errno || v < lo || v > hi) {
    fprintf(stderr, "dtrain: %s '%s': expects an integer in [%ld, %ld]\n", what, s ? s : "",
            lo, hi);
    return -1;
  }
  *out = (int)v;
  return 0;
}

int dt__resolve_ipv4(const char *host, char *ip, size_t cap) {
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  int g = getaddrinfo(host, NULL, &hints, &res);
  if (g || !res) return -1;
  const struct sockaddr_in *sa = (const struct sockaddr_in *)res->ai_addr;
  inet_ntop(AF_INET, &sa->sin_addr, ip, (socklen_t)cap);
  freeaddrinfo(res);
  return 0;
}

int dt__parse_hostport(const char *what, const char *s, char *host, size_t hcap, int *port,
                       int allow_zero) {
  const char *colon = s ? strrchr(s, ':') : NULL;
  char *end;
  long p = colon ? strtol(colon + 1, &end, 10) : -1;
  if (!colon || colon == s || (size_t)(colon - s) >= hcap || !colon[1] || *end ||
      p < (allow_zero ? 0 : 1) || p > 65535) {
    fprintf(stderr, "dtrain: %s '%s': expects HOST:PORT with PORT in 1..65535\n", what,
            s ? s : "");
    return -1;
  }
  memcpy(host, s, (size_t)(colon - s));
  host[colon - s] = '\0';
  *port = (int)p;
  return 0;
}

int dt__route_addr(const char *ipv4, char *out, size_t cap) {
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(9); /* discard; nothing is sent */
  if (inet_pton(AF_INET, ipv4, &sa.sin_addr) != 1) return -1;
  if (sa.sin_addr.s_addr == htonl(INADDR_ANY)) {
    snprintf(out, cap, "127.0.0.1");
    return 0;
  }
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  socklen_t sl = sizeof sa;
  int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa) || getsockname(fd, (struct sockaddr *)&sa, &sl)
               ? -1 : 0;
  close(fd);
  if (rc == 0) inet_ntop(AF_INET, &sa.sin_addr, out, (socklen_t)cap);
  return rc;
}

int dt__can_bind(const char *ipv4, int port, char *why, size_t cap) {
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  if (inet_pton(AF_INET, ipv4, &sa.sin_addr) != 1) {
    snprintf(why, cap, "'%s' is not an IPv4 address", ipv4);
    return -1;
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
  if (fd < 0) {
    snprintf(why, cap, "socket: %s", strerror(errno));
    return -1;
  }
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int rc = bind(fd, (struct sockaddr *)&sa, sizeof sa);
  if (rc) snprintf(why, cap, "%s", strerror(errno));
  close(fd);
  return rc ? -1 : 0;
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
    if (dt__parse_int(srcs[i].size, s, 1, 1 << 20, &w->size) < 0) return -1;
    if (dt__parse_int(srcs[i].rank, r, 0, w->size - 1, &w->rank) < 0) return -1;
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

const char *dt__job_token(int shared_needed, const char *who) {
  const char *t = dt_param_s(DT_PARAM_JOB_TOKEN);
  if (t && strlen(t) >= 16) return t;
  if (t && *t) {
    fprintf(stderr, "dtrain: DTRAIN_JOB_TOKEN is too short (%zu characters, need at least 16; "
            "make one with: openssl rand -hex 32)\n", strlen(t));
    return NULL;
  }
  if (!shared_needed) return "";
  fprintf(stderr, "dtrain: DTRAIN_JOB_TOKEN is not set: %s needs the same secret on every "
          "node (make one with `openssl rand -hex 32` and export it everywhere)\n", who);
  return NULL;
}
