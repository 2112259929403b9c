/*
 * cmd_launch.c — `dtrain launch --nnodes M --node-rank I --rdzv HOST:PORT
 * --nproc-per-node K -- train CONFIG ...`, run once on every machine (the
 * torchrun convention; DTRAIN_NNODES, DTRAIN_NODE_RANK, DTRAIN_RDZV,
 * DTRAIN_NPROC_PER_NODE and DTRAIN_BIND_ADDR do the same for a job system
 * that sets the environment; flags win). It checks the launch options —
 * every problem is one line and exit status 2 — and hands the train command
 * this node's place in the job: node 0 serves the rendezvous store on
 * HOST:PORT, every node forks K workers with global ranks I*K .. I*K+K-1 of
 * a world of M*K, and their tcp transport listens on the address of the
 * route towards HOST (docs/launch.md).
 *
 * `--join` starts one worker that joins a running elastic job whose store
 * is at --rdzv (docs/elastic.md); `--standby K` forks K spare workers that
 * replace lost ones. It does not restart the job (--max-restarts must be
 * 0: elastic jobs go on without a restart) and it does not train: cmd_train.c does, through a job of the launch layer
 * (dt_job_*), which forks the workers and meets the other nodes.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/core.h"

static void launch_usage(FILE *f) {
  fprintf(f,
          "usage: dtrain launch [--nnodes M] [--node-rank I] [--rdzv HOST:PORT]\n"
          "                     [--nproc-per-node K] [--bind-addr IP] [--max-restarts 0]\n"
          "                     -- train [CONFIG] [--set section.key=value ...] [--out DIR]\n"
          "\n"
          "Runs this machine's share of a data-parallel job of M nodes x K worker\n"
          "processes: run it on every node with the same M, K, HOST:PORT and\n"
          "DTRAIN_JOB_TOKEN and a different node rank I. Node 0 serves the rendezvous\n"
          "on HOST:PORT (an address of node 0 that every node reaches); worker k of\n"
          "node I is rank I*K+k of M*K; dist.workers becomes M*K; rank 0 (node 0)\n"
          "prints progress and writes DIR/summary.json.\n"
          "\n"
          "  --nnodes M          nodes in the job (default 1; env DTRAIN_NNODES)\n"
          "  --node-rank I       this node, 0..M-1 (default 0; env DTRAIN_NODE_RANK)\n"
          "  --rdzv HOST:PORT    rendezvous address, needed when M > 1 (env DTRAIN_RDZV;\n"
          "                      default for one node: 127.0.0.1, any free port)\n"
          "  --nproc-per-node K  worker processes on this node (default 1;\n"
          "                      env DTRAIN_NPROC_PER_NODE)\n"
          "  --bind-addr IP      address the workers' tcp transport listens on (env\n"
          "                      DTRAIN_BIND_ADDR; default: this machine's address on\n"
          "                      the route to HOST)\n"
          "  --max-restarts N    only 0: a failed worker ends the job (unless elastic:\n"
          "                      dist.min_workers, docs/elastic.md)\n"
          "  --join              join a running elastic job at --rdzv as one more\n"
          "                      worker (admitted at its next re-forming)\n"
          "  --standby K         K spare workers, data loaded, replace lost ones\n"
          "  --rdzv-backend B    builtin (node 0 serves the store, default) or etcd\n"
          "                      (--rdzv names an etcd server every process uses; env\n"
          "                      DTRAIN_RDZV_BACKEND; docs/elastic.md)\n"
          "\n"
          "Environment: DTRAIN_JOB_TOKEN (required when M > 1, the same on every node;\n"
          "make one with `openssl rand -hex 32`), DTRAIN_TIMEOUT (seconds every\n"
          "blocking step may take, default 60), DTRAIN_TRANSPORT (overrides\n"
          "dist.transport). Flags win over the environment. See docs/launch.md.\n");
}

static int usage_err(const char *fmt, const char *a, const char *b) {
  fprintf(stderr, "dtrain: ");
  fprintf(stderr, fmt, a, b);
  fputc('\n', stderr);
  return DT_EXIT_USAGE;
}

int dt__cmd_launch(int argc, char **argv) {
  enum { NNODES, NODE_RANK, RDZV, NPROC, BIND, RESTARTS, STANDBY, BACKEND, NOPT };
  static const char *const flag[NOPT] = {"--nnodes", "--node-rank", "--rdzv",
                                         "--nproc-per-node", "--bind-addr", "--max-restarts",
                                         "--standby", "--rdzv-backend"};
  static const char *const env[NOPT] = {"DTRAIN_NNODES", "DTRAIN_NODE_RANK", "DTRAIN_RDZV",
                                        "DTRAIN_NPROC_PER_NODE", "DTRAIN_BIND_ADDR", NULL, NULL,
                                        "DTRAIN_RDZV_BACKEND"};
  int join = 0;
  const char *val[NOPT] = {0}, *src[NOPT] = {0};
  int i = 1;
  for (; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      launch_usage(stdout);
      return DT_EXIT_OK;
    }
    if (!strcmp(a, "--")) {
      i++;
      break;
    }
    if (a[0] != '-') break;
    if (!strcmp(a, "--join")) {
      join = 1;
      continue;
    }
    int which = -1;
    for (int j = 0; j < NOPT && which < 0; j++) {
      size_t n = strlen(flag[j]);
      if (strncmp(a, flag[j], n) || (a[n] != '\0' && a[n] != '=')) continue;
      which = j;
      if (a[n] == '=') val[j] = a + n + 1;
      else if (i + 1 < argc) val[j] = argv[++i];
      else return usage_err("%s: missing value (see dtrain launch --help)%s", flag[j], "");
      src[j] = flag[j];
    }
    if (which < 0) return usage_err("launch: unknown option '%s' (see dtrain launch --help)%s", a, "");
  }
  if (i >= argc || strcmp(argv[i], "train"))
    return usage_err("launch: expects '-- train [CONFIG] ...' after the launch options%s%s", "",
                     "");
  for (int j = 0; j < NOPT; j++)
    if (!val[j] && env[j] && dt_param_str(env[j], NULL)) {
      val[j] = dt_param_str(env[j], NULL);
      src[j] = env[j];
    }

  struct dt__launch L;
  memset(&L, 0, sizeof L);
  L.nnodes = 1;
  L.nproc = 1;
  L.join = join;
  L.standby = -1;
  if (val[STANDBY] && dt__parse_int(src[STANDBY], val[STANDBY], 0, 4096, &L.standby) < 0)
    return usage_err("%s%s", dt_errmsg(), "");
  if (join && (val[NNODES] || val[NODE_RANK] || val[NPROC] || val[STANDBY]))
    return usage_err("--join: starts one worker of a running job; not with --nnodes, "
                     "--node-rank, --nproc-per-node or --standby%s%s", "", "");
  if (val[BACKEND] && strcmp(val[BACKEND], "etcd") && strcmp(val[BACKEND], "builtin"))
    return usage_err("%s '%s': expects builtin or etcd", src[BACKEND], val[BACKEND]);
  L.etcd = val[BACKEND] && !strcmp(val[BACKEND], "etcd");
  if (L.etcd && !val[RDZV])
    return usage_err("%s etcd: give --rdzv HOST:PORT, the etcd server (its client port)%s",
                     src[BACKEND], "");
  if (join && !val[RDZV])
    return usage_err("--join: give --rdzv HOST:PORT, the running job's rendezvous store%s%s",
                     "", "");
  int restarts = 0;
  if ((val[NNODES] && dt__parse_int(src[NNODES], val[NNODES], 1, 1024, &L.nnodes) < 0) ||
      (val[NODE_RANK] &&
       dt__parse_int(src[NODE_RANK], val[NODE_RANK], 0, 1 << 20, &L.node_rank) < 0) ||
      (val[NPROC] && dt__parse_int(src[NPROC], val[NPROC], 1, 4096, &L.nproc) < 0) ||
      (val[RESTARTS] && dt__parse_int(src[RESTARTS], val[RESTARTS], 0, 1000, &restarts) < 0))
    return usage_err("%s%s", dt_errmsg(), "");
  if (restarts) return usage_err("--max-restarts %s: restarts are not supported; a failed worker ends the job (use 0)%s", val[RESTARTS], "");
  if (L.node_rank >= L.nnodes) {
    fprintf(stderr, "dtrain: %s %d: must be below the node count %d (node ranks are 0..%d)\n",
            src[NODE_RANK], L.node_rank, L.nnodes, L.nnodes - 1);
    return DT_EXIT_USAGE;
  }
  if ((long)L.nnodes * L.nproc > 4096) {
    fprintf(stderr, "dtrain: %d nodes x %d workers: at most 4096 workers in a job\n", L.nnodes,
            L.nproc);
    return DT_EXIT_USAGE;
  }
  char host[256], ip[64] = "127.0.0.1";
  int port = 0;
  if (val[RDZV]) {
    if (dt__parse_hostport(src[RDZV], val[RDZV], host, sizeof host, &port, 0) < 0)
      return usage_err("%s%s", dt_errmsg(), "");
    if (dt__resolve_ipv4(host, ip, sizeof ip) < 0)
      return usage_err("%s '%s': host does not resolve to an IPv4 address", src[RDZV], val[RDZV]);
    snprintf(L.rdzv, sizeof L.rdzv, "%s", val[RDZV]);
  } else if (L.nnodes > 1) {
    fprintf(stderr, "dtrain: --rdzv HOST:PORT (or DTRAIN_RDZV) is required for a job of %d "
            "nodes: an address of node 0 that every node reaches\n", L.nnodes);
    return DT_EXIT_USAGE;
  }
  if (L.node_rank == 0 && !join && !L.etcd && dt__can_bind(ip, port) < 0) {
    fprintf(stderr, "dtrain: %s %s: node 0 serves the rendezvous there but cannot listen on "
            "%s:%d: %s\n", src[RDZV] ? src[RDZV] : "--rdzv", val[RDZV] ? val[RDZV] : "127.0.0.1",
            ip, port, dt_errmsg());
    return DT_EXIT_USAGE;
  }
  if (val[BIND]) {
    struct in_addr ia;
    if (inet_pton(AF_INET, val[BIND], &ia) != 1)
      return usage_err("%s '%s': expects an IPv4 address of this machine", src[BIND], val[BIND]);
    if (dt__can_bind(val[BIND], 0) < 0) {
      fprintf(stderr, "dtrain: %s '%s': cannot listen there: %s\n", src[BIND], val[BIND],
              dt_errmsg());
      return DT_EXIT_USAGE;
    }
    snprintf(L.bind_addr, sizeof L.bind_addr, "%s", val[BIND]);
  } else {
    char route[64];
    if (dt__route_addr(ip, route, sizeof route) < 0) {
      fprintf(stderr, "dtrain: no route from this machine to the rendezvous host %s (%s); give "
              "--bind-addr\n", val[RDZV] ? host : "127.0.0.1", ip);
      return DT_EXIT_USAGE;
    }
  }
  /* the token is checked here, before the config is loaded */
  char who[64];
  const char *token;
  snprintf(who, sizeof who, join ? "a joiner (--join)" : "a job of %d nodes", L.nnodes);
  if (dt__job_token(L.nnodes > 1 || join, who, &token) < 0) return usage_err("%s%s", dt_errmsg(), "");
  return dt__cmd_train_launch(argc - i, argv + i, &L);
}
