/*
 * test_ps_msg.c — the parameter server's message header and parser
 * (src/ps/msg.c): every field survives encode and parse; a push for an
 * unknown key, of the wrong size, for a key of another server, with a
 * forged sender, bad magic, another version, an unknown type or flags, or a
 * non-finite learning rate is refused with DT_EPROTO and a message naming
 * the sender and what is wrong.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "ps/ps.h"

static dt_ps_map map;

static int setup(void **state) {
  (void)state;
  uint64_t len[] = {100, 0, 50, 10};
  return dt_ps_map_build(&map, len, 4, 2);
}
static int teardown(void **state) {
  (void)state;
  dt_ps_map_free(&map);
  return 0;
}

/* a key held by server s */
static int key_of(int s) { return map.srv_key0[s]; }

static void test_roundtrip(void **state) {
  (void)state;
  int k = key_of(1);
  dt_ps_msg m = {.type = DT_PS_PUSH, .sender = 1, .key = k, .flags = DT_PS_F_PULL, .clock = 7,
                 .count = map.keys[k].len, .lr = 0.125f, .weight = 0.5f, .aux = 99};
  uint8_t b[DT_PS_HDR_BYTES];
  dt_ps_msg_encode(&m, b);
  dt_ps_msg o;
  assert_int_equal(dt_ps_msg_parse(b, sizeof b, &map, 2, 1, 1, &o), DT_OK);
  assert_int_equal(o.type, DT_PS_PUSH);
  assert_int_equal(o.sender, 1);
  assert_int_equal(o.key, k);
  assert_int_equal(o.flags, DT_PS_F_PULL);
  assert_int_equal(o.clock, 7);
  assert_int_equal(o.count, map.keys[k].len);
  assert_true(o.lr == 0.125f && o.weight == 0.5f);
  assert_int_equal(o.aux, 99);
  /* a reply from server 1 to a worker */
  dt_ps_msg p = {.type = DT_PS_PARAMS, .sender = 1, .key = k, .clock = 3, .count = map.keys[k].len};
  dt_ps_msg_encode(&p, b);
  assert_int_equal(dt_ps_msg_parse(b, sizeof b, &map, 2, -1, 1, &o), DT_OK);
  assert_int_equal(o.clock, 3);
}

static void refused(const dt_ps_msg *m, int to, int from, const char *needle) {
  uint8_t b[DT_PS_HDR_BYTES];
  dt_ps_msg_encode(m, b);
  dt_ps_msg o;
  assert_int_equal(dt_ps_msg_parse(b, sizeof b, &map, 2, to, from, &o), DT_EPROTO);
  if (!strstr(dt_errmsg(), needle)) fail_msg("'%s' lacks '%s'", dt_errmsg(), needle);
}

static void test_refusals(void **state) {
  (void)state;
  int k0 = key_of(0), k1 = key_of(1);
  dt_ps_msg m = {.type = DT_PS_PUSH, .sender = 0, .key = k0, .clock = 0,
                 .count = map.keys[k0].len, .lr = 0.1f, .weight = 1};
  dt_ps_msg x = m;
  x.key = map.nkeys;
  refused(&x, 0, 0, "unknown key");
  x.key = -1;
  refused(&x, 0, 0, "unknown key");
  x = m;
  x.count = m.count + 1;
  refused(&x, 0, 0, "floats (the key has");
  x = m;
  x.key = k1; /* held by server 1, sent to server 0 */
  x.count = map.keys[k1].len;
  refused(&x, 0, 0, "held by server 1");
  x = m;
  refused(&x, 0, 1, "claiming to be from 0");
  x = m;
  x.sender = 5;
  refused(&x, 0, 5, "unknown worker 5");
  x = m;
  x.type = DT_PS_PARAMS;
  refused(&x, 0, 0, "does not take");
  x = m;
  x.type = 77;
  refused(&x, 0, 0, "type 77");
  x = m;
  x.flags = 0x80;
  refused(&x, 0, 0, "unknown flags");
  x = m;
  x.lr = NAN;
  refused(&x, 0, 0, "lr");
  x = m;
  x.clock = -3;
  refused(&x, 0, 0, "negative clock");
  x = m;
  x.type = DT_PS_PULL;
  refused(&x, 0, 0, "a pull carries none");
  /* the window takes dense pushes only */
  x = m;
  x.flags = DT_PS_F_WIN | DT_PS_F_SPARSE;
  refused(&x, 0, 0, "that a window does not take");
  x = m;
  x.flags = DT_PS_F_WIN | DT_PS_F_STATE;
  x.type = DT_PS_PULL;
  x.count = 0;
  refused(&x, 0, 0, "state");
  /* the join flag: a joiner's HELLO only */
  x = m;
  x.flags = DT_PS_F_JOIN | DT_PS_F_PULL;
  refused(&x, 0, 0, "with the join flag");
  uint8_t b[DT_PS_HDR_BYTES];
  dt_ps_msg o;
  dt_ps_msg h = {.type = DT_PS_HELLO, .sender = 1, .key = map.nkeys, .flags = DT_PS_F_JOIN,
                 .count = map.nparams, .aux = 5, .clock = 1};
  dt_ps_msg_encode(&h, b);
  assert_int_equal(dt_ps_msg_parse(b, sizeof b, &map, 2, 0, 1, &o), DT_OK);
  assert_int_equal(o.flags, DT_PS_F_JOIN);
  /* a dense push through the window, with its pull, is taken */
  x = m;
  x.flags = DT_PS_F_WIN | DT_PS_F_PULL;
  dt_ps_msg_encode(&x, b);
  assert_int_equal(dt_ps_msg_parse(b, sizeof b, &map, 2, 0, 0, &o), DT_OK);
  assert_int_equal(o.flags, DT_PS_F_WIN | DT_PS_F_PULL);
  dt_ps_msg_encode(&m, b);
  b[0] ^= 1;
  assert_int_equal(dt_ps_msg_parse(b, sizeof b, &map, 2, 0, 0, &o), DT_EPROTO);
  assert_non_null(strstr(dt_errmsg(), "bad magic"));
  dt_ps_msg_encode(&m, b);
  b[4] = 9;
  assert_int_equal(dt_ps_msg_parse(b, sizeof b, &map, 2, 0, 0, &o), DT_EPROTO);
  assert_non_null(strstr(dt_errmsg(), "protocol version"));
  assert_int_equal(dt_ps_msg_parse(b, 10, &map, 2, 0, 0, &o), DT_EPROTO);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip),
      cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
