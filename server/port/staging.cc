#include "server/port/staging.h"

#include <cstring>
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
  // No tenant's bytes stay in a slot once its copy is done: the memory is
  // shared with a worker, and the next user may be another tenant's
  // session (or another tenant's worker may reach it). About 30 us for a
  // 1 MiB slot beside the 1 MiB copy and its message (ClearsASlotOnRelease).
  if (slot.data != nullptr) std::memset(slot.data, 0, slot.capacity);
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
