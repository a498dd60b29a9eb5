#ifndef GPUEXEC_SERVER_CORE_RUN_SLOTS_H_
#define GPUEXEC_SERVER_CORE_RUN_SLOTS_H_

// The cores command rings' threads may use at once (gpuexecd
// --ring_threads; docs/command-ring-plan.md, section 3): a ring's thread
// holds a slot while it takes records or spins for more, gives it back
// after each turn, stops spinning at once when another ring waits for one,
// and holds none while it sleeps. However many rings are served and
// however hard their clients post, their threads take at most this many
// cores between them (the engine's answering threads aside).

#include <atomic>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gpuexec::core {

class RunSlots {
 public:
  explicit RunSlots(int slots) : free_(slots < 1 ? 1 : slots), slots_(free_) {}
  RunSlots(const RunSlots&) = delete;
  // A slot held for a scope; ok() says whether it came.
  class Held {
   public:
    Held(RunSlots* slots, absl::Duration timeout)
        : slots_(slots), ok_(slots == nullptr || slots->Acquire(timeout)) {}
    ~Held() {
      if (slots_ != nullptr && ok_) slots_->Release();
    }
    Held(const Held&) = delete;
    Held& operator=(const Held&) = delete;
    bool ok() const { return ok_; }

   private:
    RunSlots* const slots_;
    const bool ok_;
  };

  RunSlots& operator=(const RunSlots&) = delete;

  // Takes a slot, waiting `timeout` at most; false if none came.
  bool Acquire(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    waiting_.fetch_add(1, std::memory_order_relaxed);
    const bool got = mu_.AwaitWithTimeout(absl::Condition(this, &RunSlots::HasFree), timeout);
    waiting_.fetch_sub(1, std::memory_order_relaxed);
    if (got) --free_;
    return got;
  }
  void Release() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ++free_;
  }
  // Whether a thread waits for a slot: a spinner gives its own back then.
  // One relaxed load, for a spin loop.
  bool Contended() const { return waiting_.load(std::memory_order_relaxed) > 0; }
  int slots() const { return slots_; }

 private:
  bool HasFree() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return free_ > 0; }

  mutable absl::Mutex mu_;
  int free_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> waiting_{0};
  const int slots_;
};

}  // namespace gpuexec::core

#endif  // GPUEXEC_SERVER_CORE_RUN_SLOTS_H_
