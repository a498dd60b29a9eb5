#ifndef GPUEXEC_CLIENT_CPP_INTERNAL_HOST_MEMORY_H_
#define GPUEXEC_CLIENT_CPP_INTERNAL_HOST_MEMORY_H_

// The client's half of host memory regions (proto/gpuexec/v1/gpuexec.proto,
// "Host memory regions"): the memfd, its registration on the daemon's host
// memory socket, and the registry by which Buffer::Write and ReadInto see
// that a span lies in a region.

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gpuexec/v1/gpuexec.pb.h"

namespace gpuexec {
namespace internal {

// The protocol's granule: a region's size is a multiple of it.
inline constexpr uint64_t kRegionGranule = 4096;
// The largest region asked for (before rounding): far above any host's
// memory, low enough that rounding up and offsets cannot overflow.
inline constexpr uint64_t kMaxRegionBytes = uint64_t{1} << 48;
// The longest message either way on the host memory socket.
inline constexpr size_t kMaxRegionMessageBytes = 4096;

// Owns one file descriptor; closes it when destroyed. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  void Reset();

 private:
  int fd_ = -1;
};

// A memfd of `bytes` (a multiple of kRegionGranule) sealed as the daemon
// requires: against shrinking and growing, never against writes (the
// daemon copies into it). The errno of the failing call maps to a code
// (RESOURCE_EXHAUSTED for a lack of memory or descriptors).
absl::StatusOr<UniqueFd> MakeRegionFd(uint64_t bytes);

// Maps the region's memfd `fd` of `bytes`, shared and writable, for the
// client's side of the copies; the caller munmaps it.
absl::StatusOr<void*> MapRegionFd(int fd, uint64_t bytes);

// Registers `fd` (a region of `bytes`) for the session `token` on the
// daemon's host memory socket at `socket_path`: one connection, one
// request with the descriptor, one answer; each system call bounded by
// `timeout`. Returns the region's handle, or UNAVAILABLE naming the path
// when the socket cannot be reached, or the daemon's own code and message.
// A registration that times out may still be made by the daemon: the
// region then lives, unknown to the client, until the session ends.
absl::StatusOr<uint64_t> RegisterRegion(const std::string& socket_path, const std::string& token,
                                        int fd, uint64_t bytes, absl::Duration timeout);

// The registration RegisterRegion makes, for any request (a command ring's
// too): sends `request` with `fd` on a new connection to `socket_path` and
// returns the daemon's answer, or its code and message when it refused.
// With `keep`, the connection is kept there (a command ring's lifeline).
absl::StatusOr<v1::RegisterRegionResponse> RegisterOnSocket(
    const std::string& socket_path, const v1::RegisterRegionRequest& request, int fd,
    absl::Duration timeout, UniqueFd* keep);

// Where a span lies in a region.
struct RegionHit {
  uint64_t region = 0;
  uint64_t offset = 0;
};

// A session's live regions by the client's address range. A HostMemory
// adds its range once registered and removes it before it unmaps, so that
// an address the kernel hands out again never finds a stale region.
// Thread-safe.
class HostRegions {
 public:
  void Add(const void* data, uint64_t size, uint64_t region);
  void Remove(const void* data);
  // The region holding all of [data, data + size), if one does (size 0
  // never does).
  std::optional<RegionHit> Find(const void* data, uint64_t size) const;

 private:
  mutable absl::Mutex mu_;
  // Start address -> (size, region handle). Ranges never overlap: each is
  // a live mapping of its own.
  std::map<uintptr_t, std::pair<uint64_t, uint64_t>> by_start_ ABSL_GUARDED_BY(mu_);
  // by_start_.size(), read without the lock: a session without regions
  // (nearly every one) pays no lock on each Write and Read.
  std::atomic<size_t> count_{0};
};

}  // namespace internal
}  // namespace gpuexec

#endif  // GPUEXEC_CLIENT_CPP_INTERNAL_HOST_MEMORY_H_
