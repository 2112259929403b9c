/*
 * test_api_comm_mt.c — dtrain/comm.h through the public API: two ranks (as
 * threads over the in-process transport, meeting through a file store) run
 * every public collective and point-to-point call and get the right
 * numbers; ranks calling different collectives both get DT_EMISMATCH; and
 * every store, communicator and collective call fails on bad input (NULL
 * handles and buffers, bad dtype, op, root, peer, tag, key, address,
 * transport, rank) with the documented code and a message naming it.
 */
#include <pthread.h>
#include <stdlib.h>

#include "api_test.h"

static char dir[64];

static void rm_dir(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

struct rank_arg {
  int rank;
  int mismatch; /* 1: rank 1 calls broadcast where rank 0 calls allreduce */
  int rc;
  char msg[512];
};

#define CHECK(call)                                                                            \
  do {                                                                                         \
    int rc_ = (call);                                                                          \
    if (rc_ != DT_OK) {                                                                        \
      snprintf(a->msg, sizeof a->msg, "rank %d: %s: %s", a->rank, #call, dt_errmsg());        \
      a->rc = rc_;                                                                             \
      goto done;                                                                               \
    }                                                                                          \
  } while (0)
#define WANT(cond)                                                                             \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      snprintf(a->msg, sizeof a->msg, "rank %d: %s is false", a->rank, #cond);                 \
      a->rc = -100;                                                                            \
      goto done;                                                                               \
    }                                                                                          \
  } while (0)

static void *rank_main(void *arg) {
  struct rank_arg *a = arg;
  dt_store *s = NULL;
  dt_comm *c = NULL;
  a->rc = DT_OK;
  CHECK(dt_store_open_file(&s, dir));
  struct dt_comm_config cfg = DT_COMM_CONFIG_INIT;
  cfg.transport = "inproc";
  cfg.rank = a->rank;
  cfg.size = 2;
  cfg.job = a->mismatch ? "api-mismatch" : "api";
  cfg.timeout_s = 30;
  CHECK(dt_comm_create(&c, s, &cfg));
  dt_store_destroy(s);
  s = NULL;
  WANT(dt_comm_rank(c) == a->rank && dt_comm_size(c) == 2);
  int r = a->rank;
  if (a->mismatch) {
    float v[4] = {0};
    int rc = r == 0 ? dt_comm_allreduce(c, v, v, 4, DT_F32, DT_OP_SUM)
                    : dt_comm_broadcast(c, v, 4, DT_F32, 0);
    WANT(rc == DT_EMISMATCH);
    WANT(strstr(dt_comm_errmsg(c), "allreduce") && strstr(dt_comm_errmsg(c), "broadcast"));
    goto done;
  }
  float v[4] = {1.0f + r, 2.0f + r, 3.0f + r, 4.0f + r}, out[8];
  CHECK(dt_comm_allreduce(c, v, out, 4, DT_F32, DT_OP_SUM));
  WANT(out[0] == 3.0f && out[3] == 9.0f);
  CHECK(dt_comm_allreduce(c, v, v, 4, DT_F32, DT_OP_MAX)); /* in place */
  WANT(v[0] == 2.0f && v[3] == 5.0f);
  int64_t b[2] = {r ? 0 : 7, r ? 0 : 8};
  CHECK(dt_comm_broadcast(c, b, 2, DT_I64, 0));
  WANT(b[0] == 7 && b[1] == 8);
  int32_t mine = 10 * (r + 1), all[2];
  CHECK(dt_comm_allgather(c, &mine, all, 1, DT_I32));
  WANT(all[0] == 10 && all[1] == 20);
  double rs_in[4] = {1, 2, 3, 4}, rs_out[2];
  CHECK(dt_comm_reduce_scatter(c, rs_in, rs_out, 2, DT_F64, DT_OP_AVG));
  WANT(rs_out[0] == (r ? 3.0 : 1.0) && rs_out[1] == (r ? 4.0 : 2.0));
  float red = 1.0f, red_out = 0.0f;
  CHECK(dt_comm_reduce(c, &red, r == 1 ? &red_out : NULL, 1, DT_F32, DT_OP_SUM, 1));
  WANT(r == 0 || red_out == 2.0f);
  int32_t to[2] = {100 * r, 100 * r + 1}, from[2];
  CHECK(dt_comm_alltoall(c, to, from, 1, DT_I32));
  WANT(from[0] == 100 * 0 + r && from[1] == 100 * 1 + r);
  char msg[6] = "hello";
  if (r == 0) CHECK(dt_comm_send(c, 1, 5, msg, sizeof msg));
  else {
    char got[6] = "";
    CHECK(dt_comm_recv(c, 0, 5, got, sizeof got));
    WANT(!strcmp(got, "hello"));
  }
  CHECK(dt_comm_barrier(c));
done:
  dt_comm_destroy(c);
  dt_store_destroy(s);
  return NULL;
}

static void run_pair(int mismatch) {
  snprintf(dir, sizeof dir, "/tmp/dt_api_comm_XXXXXX");
  assert_non_null(mkdtemp(dir));
  pthread_t t[2];
  struct rank_arg a[2] = {{0, mismatch, 0, ""}, {1, mismatch, 0, ""}};
  for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&t[i], NULL, rank_main, &a[i]), 0);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  rm_dir();
  for (int i = 0; i < 2; i++)
    if (a[i].rc != DT_OK) fail_msg("%s (%d)", a[i].msg, a[i].rc);
}

static void test_collectives(void **st) { (void)st; run_pair(0); }
static void test_mismatch(void **st) { (void)st; run_pair(1); }

static void test_names(void **st) {
  (void)st;
  assert_int_equal(dt_dtype_size(DT_F32), 4);
  assert_int_equal(dt_dtype_size(DT_BF16), 2);
  assert_int_equal(dt_dtype_size(DT_DTYPE_COUNT), 0);
  assert_string_equal(dt_dtype_name(DT_I64), "i64");
  assert_string_equal(dt_redop_name(DT_OP_MAX), "max");
  assert_string_equal(dt_algo_name(DT_ALGO_RING), "ring");
  dt_dtype t;
  dt_redop op;
  dt_algo al;
  EXPECT_OK(dt_dtype_parse("float32", &t));
  assert_int_equal(t, DT_F32);
  EXPECT_OK(dt_redop_parse("avg", &op));
  assert_int_equal(op, DT_OP_AVG);
  EXPECT_OK(dt_algo_parse("tree", &al));
  assert_int_equal(al, DT_ALGO_TREE);
  EXPECT_ERR(dt_dtype_parse("float128", &t), DT_EINVAL, "float128");
  EXPECT_ERR(dt_dtype_parse(NULL, &t), DT_EINVAL, "");
  EXPECT_ERR(dt_dtype_parse("f32", NULL), DT_EINVAL, "out");
  EXPECT_ERR(dt_redop_parse("prod", &op), DT_EINVAL, "prod");
  EXPECT_ERR(dt_redop_parse("sum", NULL), DT_EINVAL, "out");
  EXPECT_ERR(dt_algo_parse("magic", &al), DT_EINVAL, "magic");
  EXPECT_ERR(dt_algo_parse("ring", NULL), DT_EINVAL, "out");
}

static void test_store_errors(void **st) {
  (void)st;
  snprintf(dir, sizeof dir, "/tmp/dt_api_store_XXXXXX");
  assert_non_null(mkdtemp(dir));
  dt_store *s = NULL;
  EXPECT_ERR(dt_store_open_file(NULL, dir), DT_EINVAL, "out");
  EXPECT_ERR(dt_store_open_file(&s, NULL), DT_EINVAL, "directory");
  EXPECT_ERR(dt_store_open_file(&s, "/proc/no/such/dir"), DT_EIO, "/proc/no/such/dir");
  EXPECT_OK(dt_store_open_file(&s, dir));
  EXPECT_ERR(dt_store_set(NULL, "k", "v", 1, 1), DT_EINVAL, "store s is NULL");
  EXPECT_ERR(dt_store_get(NULL, "k", NULL, 0, NULL, 1), DT_EINVAL, "store s is NULL");
  EXPECT_ERR(dt_store_add(NULL, "k", 1, NULL, 1), DT_EINVAL, "store s is NULL");
  EXPECT_ERR(dt_store_set(s, "", "v", 1, 1), DT_EINVAL, "key");
  EXPECT_ERR(dt_store_set(s, NULL, "v", 1, 1), DT_EINVAL, "key");
  EXPECT_ERR(dt_store_set(s, "big", "v", (size_t)DT_STORE_VAL_MAX + 1, 1), DT_EINVAL, "big");
  EXPECT_ERR(dt_store_get(s, "never-set", NULL, 0, NULL, 0.2), DT_ETIMEDOUT, "never-set");
  EXPECT_OK(dt_store_set(s, "k", "value", 5, 1));
  char buf[3];
  size_t len = 0;
  EXPECT_ERR(dt_store_get(s, "k", buf, sizeof buf, &len, 1), DT_ERANGE, "");
  assert_int_equal(len, 5);
  int64_t v = 0;
  EXPECT_OK(dt_store_add(s, "n", 5, &v, 1));
  EXPECT_OK(dt_store_add(s, "n", -2, &v, 1));
  assert_int_equal(v, 3);
  /* communicator creation */
  dt_comm *c = (dt_comm *)&c;
  struct dt_comm_config cfg = DT_COMM_CONFIG_INIT;
  cfg.transport = "inproc", cfg.rank = 0, cfg.size = 1, cfg.timeout_s = 5;
  EXPECT_ERR(dt_comm_create(NULL, s, &cfg), DT_EINVAL, "out");
  EXPECT_ERR(dt_comm_create(&c, NULL, &cfg), DT_EINVAL, "store");
  assert_null(c);
  cfg.rank = 3;
  EXPECT_ERR(dt_comm_create(&c, s, &cfg), DT_EINVAL, "rank 3");
  cfg.rank = 0, cfg.transport = "carrier-pigeon";
  EXPECT_ERR(dt_comm_create(&c, s, &cfg), DT_ENOTSUP, "carrier-pigeon");
  assert_null(c);
  dt_store_destroy(s);
  dt_store_destroy(NULL);
  rm_dir();
  /* TCP store client and server */
  EXPECT_ERR(dt_store_connect(NULL, "127.0.0.1", 1, NULL, 1), DT_EINVAL, "out");
  EXPECT_ERR(dt_store_connect(&s, NULL, 1234, NULL, 1), DT_EINVAL, "(null)");
  EXPECT_ERR(dt_store_connect(&s, "127.0.0.1", 0, NULL, 1), DT_EINVAL, "127.0.0.1:0");
  EXPECT_ERR(dt_store_connect_addr(&s, "no-port-here", NULL, 1), DT_EINVAL, "no-port-here");
  EXPECT_ERR(dt_store_connect_addr(NULL, "127.0.0.1:1", NULL, 1), DT_EINVAL, "out");
  dt_store_server *srv = NULL;
  EXPECT_ERR(dt_store_server_start(NULL, NULL, 0, NULL), DT_EINVAL, "out");
  EXPECT_ERR(dt_store_server_start(&srv, NULL, 70000, NULL), DT_EINVAL, "70000");
  assert_int_equal(dt_store_server_port(NULL), -1);
  EXPECT_OK(dt_store_server_start(&srv, NULL, 0, "secret"));
  int port = dt_store_server_port(srv);
  assert_true(port > 0);
  /* a wrong token is refused */
  int rc = dt_store_connect(&s, "127.0.0.1", port, "wrong", 5);
  if (rc == DT_OK) {
    rc = dt_store_set(s, "k", "v", 1, 5);
    dt_store_destroy(s);
  }
  assert_int_equal(rc, DT_EAUTH);
  EXPECT_OK(dt_store_connect(&s, "127.0.0.1", port, "secret", 5));
  EXPECT_OK(dt_store_set(s, "k", "v", 1, 5));
  dt_store_destroy(s);
  dt_store_server_stop(srv);
  dt_store_server_stop(NULL);
}

static void test_collective_errors(void **st) {
  (void)st;
  snprintf(dir, sizeof dir, "/tmp/dt_api_coll_XXXXXX");
  assert_non_null(mkdtemp(dir));
  float v[4] = {0}, w[4] = {0};
  /* NULL communicator */
  EXPECT_ERR(dt_comm_allreduce(NULL, v, w, 4, DT_F32, DT_OP_SUM), DT_EINVAL, "communicator c");
  EXPECT_ERR(dt_comm_broadcast(NULL, v, 4, DT_F32, 0), DT_EINVAL, "communicator c");
  EXPECT_ERR(dt_comm_reduce(NULL, v, w, 4, DT_F32, DT_OP_SUM, 0), DT_EINVAL, "communicator c");
  EXPECT_ERR(dt_comm_allgather(NULL, v, w, 4, DT_F32), DT_EINVAL, "communicator c");
  EXPECT_ERR(dt_comm_reduce_scatter(NULL, v, w, 2, DT_F32, DT_OP_SUM), DT_EINVAL, "communicator c");
  EXPECT_ERR(dt_comm_alltoall(NULL, v, w, 2, DT_F32), DT_EINVAL, "communicator c");
  EXPECT_ERR(dt_comm_barrier(NULL), DT_EINVAL, "communicator c");
  EXPECT_ERR(dt_comm_send(NULL, 1, 0, v, 4), DT_EINVAL, "communicator c");
  EXPECT_ERR(dt_comm_recv(NULL, 1, 0, v, 4), DT_EINVAL, "communicator c");
  assert_int_equal(dt_comm_rank(NULL), -1);
  assert_int_equal(dt_comm_size(NULL), 0);
  assert_string_equal(dt_comm_errmsg(NULL), "");
  dt_comm_set_timeout(NULL, 1.0);
  dt_comm_abort(NULL, DT_EABORTED, "nothing");
  dt_comm_destroy(NULL);

  /* a one-rank communicator */
  dt_store *s = NULL;
  dt_comm *c = NULL;
  EXPECT_OK(dt_store_open_file(&s, dir));
  struct dt_comm_config cfg = DT_COMM_CONFIG_INIT;
  cfg.transport = "inproc", cfg.rank = 0, cfg.size = 1, cfg.job = "solo", cfg.timeout_s = 5;
  EXPECT_OK(dt_comm_create(&c, s, &cfg));
  dt_store_destroy(s);
  EXPECT_ERR(dt_comm_allreduce(c, NULL, w, 4, DT_F32, DT_OP_SUM), DT_EINVAL, "sendbuf");
  EXPECT_ERR(dt_comm_allreduce(c, v, NULL, 4, DT_F32, DT_OP_SUM), DT_EINVAL, "recvbuf");
  EXPECT_ERR(dt_comm_allreduce(c, v, w, 4, DT_DTYPE_COUNT, DT_OP_SUM), DT_EINVAL, "dtype");
  EXPECT_ERR(dt_comm_allreduce(c, v, w, 4, DT_F32, (dt_redop)9), DT_EINVAL, "op 9");
  EXPECT_ERR(dt_comm_allreduce(c, v, w, 4, DT_U8, DT_OP_SUM), DT_EINVAL, "u8");
  EXPECT_ERR(dt_comm_broadcast(c, NULL, 4, DT_F32, 0), DT_EINVAL, "buf");
  EXPECT_ERR(dt_comm_broadcast(c, v, 4, DT_F32, 1), DT_EINVAL, "root 1");
  EXPECT_ERR(dt_comm_broadcast(c, v, 4, DT_F32, -1), DT_EINVAL, "root -1");
  EXPECT_ERR(dt_comm_reduce(c, v, NULL, 4, DT_F32, DT_OP_SUM, 0), DT_EINVAL, "recvbuf");
  EXPECT_ERR(dt_comm_reduce(c, v, w, 4, DT_F32, DT_OP_SUM, 2), DT_EINVAL, "root 2");
  EXPECT_ERR(dt_comm_allgather(c, v, NULL, 4, DT_F32), DT_EINVAL, "recvbuf");
  EXPECT_ERR(dt_comm_reduce_scatter(c, NULL, w, 4, DT_F32, DT_OP_SUM), DT_EINVAL, "sendbuf");
  EXPECT_ERR(dt_comm_alltoall(c, v, v, 4, DT_F32), DT_EINVAL, "in place");
  EXPECT_ERR(dt_comm_send(c, 0, 0, v, 4), DT_EINVAL, "peer 0"); /* itself */
  EXPECT_ERR(dt_comm_send(c, 5, 0, v, 4), DT_EINVAL, "peer 5");
  EXPECT_ERR(dt_comm_recv(c, 0, -1, v, 4), DT_EINVAL, "tag -1");
  EXPECT_ERR(dt_comm_send(c, 0, 0, NULL, 4), DT_EINVAL, "buf");
  /* a one-rank allreduce is a copy; errors above changed nothing */
  v[0] = 3.0f;
  EXPECT_OK(dt_comm_allreduce(c, v, w, 4, DT_F32, DT_OP_SUM));
  assert_true(w[0] == 3.0f);
  EXPECT_OK(dt_comm_barrier(c));
  dt_comm_set_timeout(c, 2.0);
  dt_comm_abort(c, DT_EABORTED, "test abort"); /* then destroy still cleans up */
  dt_comm_destroy(c);
  rm_dir();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_names),
      cmocka_unit_test(test_store_errors),
      cmocka_unit_test(test_collective_errors),
      cmocka_unit_test(test_collectives),
      cmocka_unit_test(test_mismatch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
