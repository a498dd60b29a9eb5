#ifndef GPUEXEC_TESTS_SUPPORT_WAIT_H_
#define GPUEXEC_TESTS_SUPPORT_WAIT_H_

#include <functional>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace gpuexec::testing {

// Polls `done` (every few milliseconds) until it returns true or `timeout`
// has passed; returns its last answer.
inline bool WaitFor(const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() >= deadline) return done();
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

}  // namespace gpuexec::testing

#endif  // GPUEXEC_TESTS_SUPPORT_WAIT_H_
