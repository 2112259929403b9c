/*
 * dt_skip.h — skipping inside a cmocka test binary, reported to CTest.
 *
 * cmocka's skip() marks one case as skipped but the binary still exits 0,
 * so CTest would report the whole binary as passed. A case that cannot run
 * here calls DT_SKIP("reason") instead: it prints "SKIP: reason", counts
 * the skip and calls skip(). main() ends with
 *
 *     return dt_skip_status(cmocka_run_group_tests(tests, setup, teardown));
 *
 * which returns the failure count (1 from 77 on) when something failed, and otherwise 77
 * (CTest's SKIP_RETURN_CODE for every test, CMakeLists.txt) if any case was
 * skipped: a binary with a skipped case is reported as skipped, never as
 * passed, and a failure is never hidden by a skip. Test programs without
 * cmocka (test_mpi_ranks, test_ddp_det_mpi) simply return 77.
 *
 * It does not decide what counts as "cannot run here"; each test says why.
 */
#ifndef DT_TESTS_SKIP_H
#define DT_TESTS_SKIP_H

#define DT_SKIP_STATUS 77

static int dt_skipped_cases;

#define DT_SKIP(...)                                                                               \
  do {                                                                                             \
    print_message("SKIP: " __VA_ARGS__);                                                          \
    print_message("\n");                                                                           \
    dt_skipped_cases++;                                                                            \
    skip();                                                                                        \
  } while (0)

static inline int dt_skip_status(int failed) {
  if (failed) return failed < DT_SKIP_STATUS ? failed : 1; /* an exit status is 8 bits */
  if (dt_skipped_cases) {
    print_message("%d case(s) skipped: the binary exits %d (reported as skipped)\n", dt_skipped_cases,
                  DT_SKIP_STATUS);
    return DT_SKIP_STATUS;
  }
  return 0;
}

#endif
