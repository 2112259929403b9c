/*
 * cli.h — the command-line layer: argument parsing, config files (INI via
 * libinih) with --set overrides, and one file per subcommand.
 */
#ifndef DT_CLI_H
#define DT_CLI_H

/* Runs the dtrain command line; returns the process exit status
 * (0 success, 1 runtime failure, 2 bad input / usage). */
int dt_cli_main(int argc, char **argv);

/* Exit statuses. */
enum { DT_EXIT_OK = 0, DT_EXIT_FAIL = 1, DT_EXIT_USAGE = 2 };

/* Subcommands: argv[0] is the subcommand name. */
int dt__cmd_train(int argc, char **argv);
int dt__cmd_bench(int argc, char **argv);

#endif
