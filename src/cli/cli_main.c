/*
 * cli_main.c — placeholder dispatcher; replaced by the real subcommands.
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "dtrain.h"

int dt_cli_main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--version")) {
    printf("dtrain %s\n", dt_version());
    return 0;
  }
  fprintf(stderr, "usage: dtrain train [CONFIG] [--set section.key=value ...] [--out DIR]\n");
  return 2;
}
