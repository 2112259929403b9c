/*
 * test_job_args.c — bad arguments to the job API fail with DT_EINVAL (or
 * DT_ENOENT) and one message naming the argument, never a crash: NULL
 * handles and callbacks, counts out of range, node_rank beyond the node
 * count, inconsistent workers / nnodes / nproc_per_node, several nodes
 * without a rendezvous address or a token, a malformed or unresolvable
 * rdzv, a short token, an unknown transport, mpi for a forked job, and
 * dt_job_from_env outside mpirun/srun or with a bad rank variable. Also the
 * launch helpers the command line uses (byte counts refuse a sign).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "launch/launch.h"

static void bad(const struct dt_job_config *jc, int want, const char *msg) {
  dt_job *job = (dt_job *)0x1;
  int rc = dt_job_create(&job, jc);
  if (rc != want || !strstr(dt_errmsg(), msg))
    print_error("rc %d, message '%s' (want %d, '%s')\n", rc, dt_errmsg(), want, msg);
  assert_int_equal(rc, want);
  assert_null(job);
  assert_non_null(strstr(dt_errmsg(), msg));
}

static void test_create_bad(void **s) {
  (void)s;
  dt_job *job = NULL;
  assert_int_equal(dt_job_create(NULL, NULL), DT_EINVAL);
  assert_int_equal(dt_job_create(&job, NULL), DT_EINVAL);
  assert_non_null(strstr(dt_errmsg(), "cfg is NULL"));
  struct dt_job_config jc = DT_JOB_CONFIG_INIT;
  jc.workers = -1;
  bad(&jc, DT_EINVAL, "workers -1");
  jc.workers = 5000;
  bad(&jc, DT_EINVAL, "workers 5000");
  jc = (struct dt_job_config)DT_JOB_CONFIG_INIT;
  jc.nnodes = 0;
  bad(&jc, DT_EINVAL, "nnodes 0");
  jc = (struct dt_job_config)DT_JOB_CONFIG_INIT;
  jc.nnodes = 2;
  jc.node_rank = 2;
  bad(&jc, DT_EINVAL, "node_rank 2: must be below the node count 2");
  jc = (struct dt_job_config)DT_JOB_CONFIG_INIT;
  jc.nnodes = 2;
  jc.workers = 5;
  bad(&jc, DT_EINVAL, "workers 5 is not a multiple of nnodes 2");
  jc.nproc_per_node = 2;
  bad(&jc, DT_EINVAL, "workers 5 != nnodes 2 x nproc_per_node 2");
  jc = (struct dt_job_config)DT_JOB_CONFIG_INIT;
  jc.nnodes = 2;
  jc.nproc_per_node = 1;
  bad(&jc, DT_EINVAL, "rdzv (HOST:PORT) is required for a job of 2 nodes");
  jc.rdzv = "127.0.0.1:29500";
  unsetenv("DTRAIN_JOB_TOKEN");
  bad(&jc, DT_EINVAL, "DTRAIN_JOB_TOKEN is not set: a job of 2 nodes");
  jc.token = "short";
  bad(&jc, DT_EINVAL, "token is too short (5 characters");
  jc = (struct dt_job_config)DT_JOB_CONFIG_INIT;
  jc.rdzv = "localhost";
  bad(&jc, DT_EINVAL, "rdzv 'localhost': expects HOST:PORT");
  jc.rdzv = "127.0.0.1:70000";
  bad(&jc, DT_EINVAL, "rdzv '127.0.0.1:70000': expects HOST:PORT");
  jc.rdzv = "no-such-host.invalid:29500";
  bad(&jc, DT_EINVAL, "rdzv 'no-such-host.invalid:29500': host does not resolve");
  jc = (struct dt_job_config)DT_JOB_CONFIG_INIT;
  jc.transport = "ib";
  bad(&jc, DT_EINVAL, "transport 'ib': expects auto, shm or tcp");
  jc.transport = "mpi";
  bad(&jc, DT_EINVAL, "transport 'mpi' needs the ranks started by mpirun or srun");
  jc = (struct dt_job_config)DT_JOB_CONFIG_INIT;
  jc.bind_addr = "10.0.0.300";
  bad(&jc, DT_EINVAL, "bind_addr '10.0.0.300': expects an IPv4 address");
}

static int never(const struct dt_job_worker *w, void *arg) {
  (void)w;
  (void)arg;
  return 0;
}

static void test_run_bad(void **s) {
  (void)s;
  assert_int_equal(dt_job_run(NULL, never, NULL), DT_EINVAL);
  assert_non_null(strstr(dt_errmsg(), "job is NULL"));
  struct dt_job_config jc = DT_JOB_CONFIG_INIT;
  jc.workers = 2;
  dt_job *job = NULL;
  assert_int_equal(dt_job_create(&job, &jc), DT_OK);
  assert_int_equal(dt_job_run(job, NULL, NULL), DT_EINVAL);
  assert_non_null(strstr(dt_errmsg(), "worker function is NULL"));
  struct dt_job_status st;
  assert_int_equal(dt_job_worker_status(NULL, 0, &st), DT_EINVAL);
  assert_int_equal(dt_job_worker_status(job, 0, NULL), DT_EINVAL);
  assert_int_equal(dt_job_worker_status(job, 2, &st), DT_EINVAL);
  assert_non_null(strstr(dt_errmsg(), "local_rank 2: expects 0..1"));
  assert_int_equal(dt_job_failed_worker(NULL), -1);
  assert_int_equal(dt_job_signal(NULL), 0);
  dt_job_destroy(job);
  dt_job_destroy(NULL); /* a no-op */
}

static void test_from_env(void **s) {
  (void)s;
  struct dt_job_config jc = DT_JOB_CONFIG_INIT;
  dt_job *job = NULL;
  unsetenv("OMPI_COMM_WORLD_RANK");
  unsetenv("PMI_RANK");
  unsetenv("SLURM_PROCID");
  assert_int_equal(dt_job_from_env(&job, &jc), DT_ENOENT);
  assert_null(job);
  assert_non_null(strstr(dt_errmsg(), "no external launcher"));
  assert_int_equal(dt_job_from_env(NULL, &jc), DT_EINVAL);
  setenv("PMI_RANK", "3", 1);
  setenv("PMI_SIZE", "2", 1);
  assert_int_equal(dt_job_from_env(&job, &jc), DT_EINVAL);
  assert_non_null(strstr(dt_errmsg(), "PMI_RANK '3': expects an integer in [0, 1]"));
  setenv("PMI_RANK", "1", 1);
  unsetenv("PMIX_NAMESPACE");
  unsetenv("OMPI_MCA_ess_base_jobid");
  unsetenv("DTRAIN_RDZV");
  assert_int_equal(dt_job_from_env(&job, &jc), DT_EINVAL);
  assert_non_null(strstr(dt_errmsg(), "PMI started 2 ranks but gave no job id"));
  setenv("PMIX_NAMESPACE", "ns1", 1);
  jc.transport = "ib";
  assert_int_equal(dt_job_from_env(&job, &jc), DT_EINVAL);
  assert_non_null(strstr(dt_errmsg(), "transport 'ib'"));
  jc.transport = "mpi";
  assert_int_equal(dt_job_from_env(&job, &jc), DT_OK);
  assert_int_equal(dt_job_size(job), 2);
  assert_int_equal(dt_job_rank0(job), 1);
  assert_string_equal(dt_job_source(job), "PMI");
  dt_job_destroy(job);
  unsetenv("PMI_RANK");
  unsetenv("PMI_SIZE");
  unsetenv("PMIX_NAMESPACE");
}

static void test_helpers(void **s) {
  (void)s;
  uint64_t b;
  assert_int_equal(dt__parse_bytes("--max", "-5", 1ull << 32, &b), DT_EINVAL);
  assert_non_null(strstr(dt_errmsg(), "--max: bad value '-5': expects a byte count of 0 or more"));
  assert_int_equal(dt__parse_bytes("--max", "+5", 1ull << 32, &b), DT_EINVAL);
  assert_int_equal(dt__parse_bytes("--max", "5G", 1ull << 32, &b), DT_EINVAL);
  assert_int_equal(dt__parse_bytes("--max", "99999999999999999999", 1ull << 32, &b), DT_EINVAL);
  assert_int_equal(dt__parse_bytes("--max", "4G", 1ull << 32, &b), DT_OK);
  assert_int_equal(b, 1ull << 32);
  assert_int_equal(dt__parse_bytes("--min", "64K", 1ull << 32, &b), DT_OK);
  assert_int_equal(b, 65536);
  int v;
  assert_int_equal(dt__parse_int("--nnodes", "0", 1, 1024, &v), DT_EINVAL);
  assert_string_equal(dt_errmsg(), "--nnodes '0': expects an integer in [1, 1024]");
  char host[64];
  int port;
  assert_int_equal(dt__parse_hostport("DTRAIN_RDZV", "x:y", host, sizeof host, &port, 0),
                   DT_EINVAL);
  assert_string_equal(dt_errmsg(), "DTRAIN_RDZV 'x:y': expects HOST:PORT with PORT in 1..65535");
  char tok[40];
  dt__make_token(tok, sizeof tok);
  assert_int_equal(strlen(tok), 32);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_create_bad),
      cmocka_unit_test(test_run_bad),
      cmocka_unit_test(test_from_env),
      cmocka_unit_test(test_helpers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
