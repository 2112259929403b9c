/*
 * dt_sanitizer.h — UNDER_SANITIZER is defined when the test is compiled
 * with ASan or TSan (gcc's __SANITIZE_* macros, clang's __has_feature).
 * Tests whose timing margins assume an optimised, uninstrumented build
 * (a slowed rank's sleep against the other rank's own time per sample, a
 * CPU quota against a rank's work) pick other margins under it.
 */
#ifndef DT_TESTS_SANITIZER_H
#define DT_TESTS_SANITIZER_H

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define UNDER_SANITIZER 1
#endif
#endif

#endif
