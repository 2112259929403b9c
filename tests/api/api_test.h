/*
 * api_test.h — what the public-API tests share: they include only
 * <dtrain.h> (the build gives them no src/ include path) and check that a
 * failing call returns the expected DT_E* code AND leaves a dt_errmsg()
 * line naming what was wrong.
 */
#ifndef DT_API_TEST_H
#define DT_API_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include <dtrain.h>

/* call must return rc, and dt_errmsg() must contain needle. */
#define EXPECT_ERR(call, rc, needle)                                                   \
  do {                                                                                 \
    int rc_ = (call);                                                                  \
    if (rc_ != (rc))                                                                   \
      fail_msg("%s: returned %d (%s), expected %d; errmsg: %s", #call, rc_,            \
               dt_strerror(rc_), (int)(rc), dt_errmsg());                              \
    if (!strstr(dt_errmsg(), (needle)))                                                \
      fail_msg("%s: errmsg '%s' does not name '%s'", #call, dt_errmsg(), (needle));    \
  } while (0)

#define EXPECT_OK(call)                                                                \
  do {                                                                                 \
    int rc_ = (call);                                                                  \
    if (rc_ != DT_OK) fail_msg("%s: %s: %s", #call, dt_strerror(rc_), dt_errmsg());    \
  } while (0)

#endif
