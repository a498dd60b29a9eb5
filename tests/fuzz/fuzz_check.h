#ifndef GPUEXEC_TESTS_FUZZ_FUZZ_CHECK_H_
#define GPUEXEC_TESTS_FUZZ_FUZZ_CHECK_H_

// An invariant a harness checks: a failure aborts, which libFuzzer reports
// as a crash with the input that did it.

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond)                                                            \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

#endif  // GPUEXEC_TESTS_FUZZ_FUZZ_CHECK_H_
