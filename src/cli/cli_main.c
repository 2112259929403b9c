/*
 * cli_main.c — the dtrain dispatcher: global options (--help, --version)
 * and one subcommand per file (cmd_*.c). dt__cli_prefer_fast_blas (called
 * by main.c only, so tests calling dt_cli_main never exec) re-executes the
 * command once with OPENBLAS_CORETYPE=SkylakeX when OpenBLAS chose a slower
 * kernel family than the CPU supports (the variable only works before the
 * library loads); a user's own OPENBLAS_CORETYPE is respected.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "dtrain.h"
#include "tensor/tensor.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: dtrain <command> [options]\n"
          "\n"
          "commands:\n"
          "  train [CONFIG] [--set section.key=value ...] [--out DIR] [--workers N]\n"
          "        train a model (no CONFIG: the built-in CNN on Fashion-MNIST)\n"
          "\n"
          "options:\n"
          "  -h, --help     this help (dtrain train --help for the train options)\n"
          "  -V, --version  print the version\n"
          "\n"
          "Exit status: 0 success, 1 runtime failure, 2 bad input or usage.\n"
          "Config keys and defaults: docs/config.md.\n");
}

void dt__cli_prefer_fast_blas(int argc, char **argv) {
  if (argc < 2 || strcmp(argv[1], "train")) return;
  if (getenv("OPENBLAS_CORETYPE") || !dt_tensor_blas_underpowered()) return;
  if (setenv("OPENBLAS_CORETYPE", "SkylakeX", 1)) return;
  execv("/proc/self/exe", argv);
  /* exec failed: go on with the slower kernels */
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
  if (!strcmp(cmd, "train")) {
    return dt__cmd_train(argc - 1, argv + 1);
  }
  fprintf(stderr, "dtrain: unknown command '%s' (try dtrain --help)\n", cmd);
  return DT_EXIT_USAGE;
}
