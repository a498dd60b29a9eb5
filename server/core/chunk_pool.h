#ifndef GPUEXEC_SERVER_CORE_CHUNK_POOL_H_
#define GPUEXEC_SERVER_CORE_CHUNK_POOL_H_

// Host buffers of one size, kept for reuse once given back. A Read copies
// each chunk out of staging into such a buffer, which then stays with the
// chunk until the network has sent it; a fresh allocation of a chunk's
// size (1 MiB by default) is a new mapping whose pages fault in on every
// chunk.

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gpuexec::core {

class ChunkPool : public std::enable_shared_from_this<ChunkPool> {
 public:
  // Keeps at most `max_idle` buffers of `bytes` each while unused.
  static std::shared_ptr<ChunkPool> Create(size_t bytes, size_t max_idle);

  // A buffer of `n` bytes, its contents undefined. It goes back to the pool
  // (or is freed) when the last copy of the pointer is gone, on whatever
  // thread that is; the pool lives as long as any of its buffers. Sizes
  // above the pool's or below half of it are allocated and freed plainly.
  std::shared_ptr<char> Take(size_t n);

  size_t idle() const;

 private:
  ChunkPool(size_t bytes, size_t max_idle) : bytes_(bytes), max_idle_(max_idle) {}
  void Give(char* buffer);

  const size_t bytes_;
  const size_t max_idle_;
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<char[]>> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpuexec::core

#endif  // GPUEXEC_SERVER_CORE_CHUNK_POOL_H_
