/*
 * cli_main.c — the dtrain dispatcher: global options (--help, --version)
 * and one subcommand per file (cmd_*.c). It never touches OPENBLAS_CORETYPE:
 * the GEMM-bound layers run on dtrain's own AVX-512 or AVX2 kernels where the
 * CPU has them (src/tensor/gemm_avx*.c), whatever OpenBLAS was pinned to.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "dtrain.h"
#include "tensor/tensor.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: dtrain <command> [options]\n"
          "\n"
          "commands:\n"
          "  train [CONFIG] [--set section.key=value ...] [--out DIR] [--workers N]\n"
          "        train a model (no CONFIG: the built-in CNN on Fashion-MNIST);\n"
          "        under mpirun/srun every process is one rank (docs/launch.md)\n"
          "  launch [--nnodes M] [--node-rank I] [--rdzv HOST:PORT] [--nproc-per-node K]\n"
          "         -- train CONFIG ...\n"
          "        this node's share of a multi-node job (run on every node)\n"
          "  bench allreduce [--workers N] [--transport T] [--algo A] [--min B] [--max B]\n"
          "        allreduce bandwidth between local worker processes (nccl-tests columns)\n"
          "  env [--markdown]\n"
          "        every DTRAIN_* environment knob: value, default, meaning\n"
          "  train CONFIG --resume [DIR]\n"
          "        continue from the newest valid checkpoint (docs/checkpoint.md)\n"
          "  ckpt ls|verify DIR\n"
          "        list / check byte for byte the checkpoints under DIR\n"
          "  export CKPT --out FILE.safetensors\n"
          "        the weights of a checkpoint for PyTorch (tools/torch_safetensors.py)\n"
          "  report RUN_DIR [--out FILE]\n"
          "        one self-contained HTML page of a run: charts, numbers, hang diagnosis\n"
          "\n"
          "options:\n"
          "  -h, --help     this help (dtrain train --help, dtrain launch --help)\n"
          "  -V, --version  print the version\n"
          "\n"
          "Exit status: 0 success, 1 runtime failure, 2 bad input or usage.\n"
          "Config keys and defaults: docs/config.md.\n");
}

int dt_cli_main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return DT_EXIT_USAGE;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
    usage(stdout);
    return DT_EXIT_OK;
  }
  if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V")) {
    printf("dtrain %s\n", dt_version());
    return DT_EXIT_OK;
  }
  /* one row per subcommand (cmd_<name>.c) */
  static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
  } cmds[] = {
      {"train", dt__cmd_train},
      {"launch", dt__cmd_launch},
      {"bench", dt__cmd_bench},
      {"env", dt__cmd_env},
      {"ckpt", dt__cmd_ckpt},
      {"export", dt__cmd_export},
      {"report", dt__cmd_report},
  };
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    if (!strcmp(cmd, cmds[i].name)) return cmds[i].run(argc - 1, argv + 1);
  fprintf(stderr, "dtrain: unknown command '%s' (try dtrain --help)\n", cmd);
  return DT_EXIT_USAGE;
}
