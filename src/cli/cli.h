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

/* One worker of a local job: rank r of n joins through the store at
 * 127.0.0.1:port with the job token; returns its exit status. */
typedef int (*dt__worker_fn)(int r, int n, int port, const char *token, void *arg);
/* Runs fn in n forked worker processes (local_job.c) and returns the job's
 * exit status. grace: seconds the others get after a worker fails before
 * they are killed. print_pids: print "workers: rank R pid P, ..." first. */
int dt__local_job_run(int n, dt__worker_fn fn, void *arg, double grace, int print_pids);

#endif
