/*
 * test_cli_fmt.c — how the command line prints a loss: four decimals for a
 * finite value, "NaN" for any NaN (glibc prints a negative one as "-nan"),
 * "inf" / "-inf" for infinities.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>

#include "cli/cli.h"

static void test_loss(void **s) {
  (void)s;
  char b[32];
  dt__cli_fmt_loss(0.31274, b, sizeof b);
  assert_string_equal(b, "0.3127");
  dt__cli_fmt_loss(-NAN, b, sizeof b);
  assert_string_equal(b, "NaN");
  dt__cli_fmt_loss(NAN, b, sizeof b);
  assert_string_equal(b, "NaN");
  volatile double zero = 0.0;
  dt__cli_fmt_loss(zero / zero, b, sizeof b); /* the NaN arithmetic makes: negative on x86 */
  assert_string_equal(b, "NaN");
  dt__cli_fmt_loss(INFINITY, b, sizeof b);
  assert_string_equal(b, "inf");
  dt__cli_fmt_loss(-INFINITY, b, sizeof b);
  assert_string_equal(b, "-inf");
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_loss)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
