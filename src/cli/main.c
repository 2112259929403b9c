/*
 * main.c — the dtrain command: dispatches to one subcommand per file
 * (cmd_*.c). The only place, with the cli layer, allowed to call exit().
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

int main(int argc, char **argv) {
  return dt_cli_main(argc, argv);
}
