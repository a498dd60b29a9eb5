#include "server/core/chunk_pool.h"

#include <utility>

namespace gpuexec::core {

std::shared_ptr<ChunkPool> ChunkPool::Create(size_t bytes, size_t max_idle) {
  return std::shared_ptr<ChunkPool>(new ChunkPool(bytes, max_idle));
}

std::shared_ptr<char> ChunkPool::Take(size_t n) {
  // Small ones (a Read's last chunk, or a short Read) are not worth a
  // buffer of the pool's size.
  if (n > bytes_ || n < bytes_ / 2) {
    return std::shared_ptr<char>(new char[n], std::default_delete<char[]>());
  }
  std::unique_ptr<char[]> buffer;
  {
    absl::MutexLock lock(&mu_);
    if (!idle_.empty()) {
      buffer = std::move(idle_.back());
      idle_.pop_back();
    }
  }
  if (buffer == nullptr) buffer.reset(new char[bytes_]);
  return std::shared_ptr<char>(buffer.release(),
                               [self = shared_from_this()](char* p) { self->Give(p); });
}

void ChunkPool::Give(char* buffer) {
  std::unique_ptr<char[]> owned(buffer);
  absl::MutexLock lock(&mu_);
  if (idle_.size() < max_idle_) idle_.push_back(std::move(owned));
}

size_t ChunkPool::idle() const {
  absl::MutexLock lock(&mu_);
  return idle_.size();
}

}  // namespace gpuexec::core
