#include "server/port/staging.h"

#include <utility>

namespace gpuexec::port {

void StagingPool::Reset(std::vector<uint8_t*> buffers, size_t capacity) {
  absl::MutexLock lock(&mu_);
  slots_.clear();
  free_.clear();
  capacity_ = capacity;
  for (size_t i = 0; i < buffers.size(); ++i) {
    slots_.push_back(StagingSlot{static_cast<int>(i), buffers[i], capacity});
    free_.push_back(static_cast<int>(i));
  }
}

void StagingPool::Acquire(Waiter waiter) {
  StagingSlot slot;
  {
    absl::MutexLock lock(&mu_);
    if (free_.empty()) {
      waiters_.push_back(std::move(waiter));
      return;
    }
    slot = slots_[free_.back()];
    free_.pop_back();
  }
  waiter(slot);
}

void StagingPool::Release(StagingSlot slot) {
  Waiter next;
  {
    absl::MutexLock lock(&mu_);
    if (waiters_.empty()) {
      free_.push_back(slot.index);
      return;
    }
    next = std::move(waiters_.front());
    waiters_.pop_front();
  }
  next(slot);
}

size_t StagingPool::free_slots() const {
  absl::MutexLock lock(&mu_);
  return free_.size();
}

}  // namespace gpuexec::port
