#ifndef GPUEXEC_SERVER_PORT_STAGING_H_
#define GPUEXEC_SERVER_PORT_STAGING_H_

// A fixed set of pinned host buffers through which every host<->device copy
// of a device streams. The set is the bound on the daemon's memory for
// copies, whatever the size of a transfer. Slots are handed out first come,
// first served; a caller that finds none waits (asynchronously) for the next
// release. The memory itself is owned by whoever serves the device: the
// front process maps it and the device's worker page-locks it.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gpuexec::port {

struct StagingSlot {
  int index = -1;
  uint8_t* data = nullptr;
  size_t capacity = 0;
};

class StagingPool {
 public:
  using Waiter = std::function<void(StagingSlot)>;

  StagingPool() = default;
  // `buffers` are `capacity` bytes each; the pool does not own them.
  void Reset(std::vector<uint8_t*> buffers, size_t capacity);

  size_t capacity() const { return capacity_; }
  size_t size() const { return slots_.size(); }

  // Calls `waiter` with a free slot: now, on this thread, if one is free, or
  // later on the thread of the Release() that frees one. The callee must
  // Release() the slot exactly once. Release() zeroes the slot's
  // `capacity` bytes before anyone else gets it.
  void Acquire(Waiter waiter);
  void Release(StagingSlot slot);
  size_t free_slots() const;

 private:
  mutable absl::Mutex mu_;
  std::vector<StagingSlot> slots_;
  size_t capacity_ = 0;
  std::vector<int> free_ ABSL_GUARDED_BY(mu_);
  std::deque<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpuexec::port

#endif  // GPUEXEC_SERVER_PORT_STAGING_H_
