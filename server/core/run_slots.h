#ifndef GPUEXEC_SERVER_CORE_RUN_SLOTS_H_
#define GPUEXEC_SERVER_CORE_RUN_SLOTS_H_

// The cores command rings' threads may use at once (gpuexecd
// --ring_threads; docs/command-ring-plan.md, section 3): a ring's thread
// holds a slot while it takes records or spins for more, gives it back
// after each full turn (and before it sleeps), stops spinning at once when
// another ring waits for one, and holds none while it sleeps. A turn that
// follows a spin's find runs on the slot held: nobody waited for it when
// the spin looked. However many rings are served and
// however hard their clients post, their threads take at most this many
// cores between them (the engine's answering threads aside).
//
// Slots go to waiters in the order they asked: a slot given back while
// threads wait is handed to the oldest of them, never taken again by the
// thread that gave it back. So a tenant flooding its rings gets one turn
// per ring in each round, and a quiet ring waits one round at most.

#include <atomic>
#include <list>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gpuexec::core {

class RunSlots {
 public:
  explicit RunSlots(int slots) : free_(slots < 1 ? 1 : slots), slots_(free_) {}
  RunSlots(const RunSlots&) = delete;
  RunSlots& operator=(const RunSlots&) = delete;

  // Takes a slot, waiting `timeout` at most and no longer than `cancel`
  // is false (Wake has it looked at); false if none came.
  bool Acquire(absl::Duration timeout, const std::atomic<bool>* cancel = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (free_ > 0 && waiters_.empty()) {
      --free_;
      return true;
    }
    Waiter me{false, cancel};
    auto at = waiters_.insert(waiters_.end(), &me);
    waiting_.store(static_cast<int>(waiters_.size()), std::memory_order_relaxed);
    mu_.AwaitWithTimeout(absl::Condition(&Waiter::Done, &me), timeout);
    if (!me.granted) {
      waiters_.erase(at);
      waiting_.store(static_cast<int>(waiters_.size()), std::memory_order_relaxed);
    }
    return me.granted;
  }
  // Gives a slot back: to the oldest waiter, if any.
  void Release() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (waiters_.empty()) {
      ++free_;
      return;
    }
    waiters_.front()->granted = true;
    waiters_.pop_front();
    waiting_.store(static_cast<int>(waiters_.size()), std::memory_order_relaxed);
  }
  // Has every waiter look at its `cancel` flag again.
  void Wake() ABSL_LOCKS_EXCLUDED(mu_) { absl::MutexLock lock(&mu_); }
  // Whether a thread waits for a slot: a spinner gives its own back then.
  // One relaxed load, for a spin loop.
  bool Contended() const { return waiters() > 0; }
  int waiters() const { return waiting_.load(std::memory_order_relaxed); }
  int slots() const { return slots_; }

  // A slot held for a scope; ok() says whether it came.
  class Held {
   public:
    Held(RunSlots* slots, absl::Duration timeout, const std::atomic<bool>* cancel = nullptr)
        : slots_(slots), ok_(slots == nullptr || slots->Acquire(timeout, cancel)) {}
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

 private:
  struct Waiter {
    bool granted;
    const std::atomic<bool>* cancel;
    static bool Done(Waiter* w) {
      return w->granted || (w->cancel != nullptr && w->cancel->load(std::memory_order_relaxed));
    }
  };

  absl::Mutex mu_;
  int free_ ABSL_GUARDED_BY(mu_);
  std::list<Waiter*> waiters_ ABSL_GUARDED_BY(mu_);  // oldest first
  std::atomic<int> waiting_{0};                      // waiters_.size(), for Contended
  const int slots_;
};

}  // namespace gpuexec::core

#endif  // GPUEXEC_SERVER_CORE_RUN_SLOTS_H_
