#ifndef GPUEXEC_TESTS_SUPPORT_AWAIT_H_
#define GPUEXEC_TESTS_SUPPORT_AWAIT_H_

// Waits for an asynchronous call's callback (the engine's, a device's),
// with a deadline. The result lives on the heap: a callback that comes
// after the deadline writes nowhere it should not.

#include <functional>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace gpuexec::testing {

template <typename T>
absl::StatusOr<T> Await(const std::function<void(std::function<void(absl::StatusOr<T>)>)>& call,
                        absl::Duration timeout = absl::Seconds(20)) {
  auto done = std::make_shared<absl::Notification>();
  auto result = std::make_shared<absl::StatusOr<T>>(absl::UnknownError("no completion"));
  call([done, result](absl::StatusOr<T> r) {
    *result = std::move(r);
    done->Notify();
  });
  if (!done->WaitForNotificationWithTimeout(timeout)) {
    return absl::DeadlineExceededError("the completion never came");
  }
  return *result;
}

}  // namespace gpuexec::testing

#endif  // GPUEXEC_TESTS_SUPPORT_AWAIT_H_
