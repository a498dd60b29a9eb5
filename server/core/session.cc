#include "server/core/session.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/common/text.h"

namespace gpuexec::core {

Session::Session(std::string token, std::shared_ptr<TenantUsage> tenant, int device,
                 std::shared_ptr<port::DevicePort> port, port::StreamId stream, uint64_t lease_ms,
                 uint64_t memory_limit)
    : token_(std::move(token)),
      tenant_(std::move(tenant)),
      name_(absl::StrCat("session ", token_.substr(0, 8))),
      device_(device),
      port_(std::move(port)),
      stream_(stream),
      lease_ms_(lease_ms),
      memory_limit_(memory_limit) {}

uint64_t Session::NewHandle() {
  while (true) {
    const uint64_t h = absl::Uniform<uint64_t>(bitgen_);
    if (h != 0 && !buffers.contains(h) && !modules.contains(h) && !functions.contains(h)) return h;
  }
}

absl::Status Session::CheckHandles(uint32_t limit, absl::string_view what) const {
  if (limit == 0 || handles() < limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "session handle limit: ", name_, " holds ", handles(),
      " handles (buffers, modules, functions, host memory regions), at most ", limit,
      " (--max_handles_per_session); ", what,
      " more does not fit. Free what it no longer uses (one buffer can hold many arrays)"));
}

void Session::Touch() { deadline = absl::Now() + absl::Milliseconds(lease_ms_); }

absl::Status Session::ClosedError() const {
  return absl::NotFoundError(absl::StrCat(name_, " is closed"));
}

std::string Session::Describe(const BufferEntry& b) const {
  return absl::StrCat("buffer ", HandleName(b.handle), " of ", name_, " (", ByteSize(b.size),
                      " on device ", device_, ")");
}

std::string Session::Describe(const RegionEntry& r) const {
  return absl::StrCat("host memory region ", HandleName(r.handle), " of ", name_, " (",
                      ByteSize(r.bytes), ")");
}

void StagingShare::Acquire(port::StagingPool& pool, port::StagingPool::Waiter waiter) {
  const int share = std::max(2, static_cast<int>(pool.size() * fraction_));
  std::shared_ptr<StagingShare> parent;
  {
    absl::MutexLock lock(&mu_);
    if (held_ >= share) {
      waiting_.push_back(std::move(waiter));
      return;
    }
    ++held_;
    parent = parent_;
  }
  // Unlocked: the pool may run the waiter at once.
  if (parent != nullptr) return parent->Acquire(pool, std::move(waiter));
  pool.Acquire(std::move(waiter));
}

void StagingShare::Release(port::StagingPool& pool, port::StagingSlot slot) {
  std::shared_ptr<StagingShare> parent;
  {
    absl::MutexLock lock(&mu_);
    parent = parent_;
  }
  if (parent != nullptr) {
    parent->Release(pool, slot);
  } else {
    pool.Release(slot);
  }
  port::StagingPool::Waiter next;
  {
    absl::MutexLock lock(&mu_);
    if (waiting_.empty()) {
      --held_;
      return;
    }
    // The released buffer's place in the share goes to the next waiter.
    next = std::move(waiting_.front());
    waiting_.pop_front();
  }
  if (parent != nullptr) return parent->Acquire(pool, std::move(next));
  pool.Acquire(std::move(next));
}

void StagingShare::Join(std::shared_ptr<StagingShare> parent) {
  absl::MutexLock lock(&mu_);
  if (parent_ == nullptr && held_ == 0) parent_ = std::move(parent);
}

bool StagingShare::joined() const {
  absl::MutexLock lock(&mu_);
  return parent_ != nullptr;
}

int StagingShare::held() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

std::shared_ptr<StagingShare> TenantStaging(const port::StagingPool* pool, const std::string& key) {
  static absl::Mutex mu;
  static auto* shares = new absl::flat_hash_map<std::pair<const port::StagingPool*, std::string>,
                                                std::weak_ptr<StagingShare>>();
  absl::MutexLock lock(&mu);
  // Those of tenants gone are dropped as new ones come.
  if (shares->size() > 64) {
    absl::erase_if(*shares, [](const auto& entry) { return entry.second.expired(); });
  }
  std::weak_ptr<StagingShare>& slot = (*shares)[{pool, key}];
  std::shared_ptr<StagingShare> share = slot.lock();
  if (share == nullptr) {
    share = std::make_shared<StagingShare>(0.5);
    slot = share;
  }
  return share;
}

void BufferUse::Release() {
  if (released_.exchange(true)) return;
  absl::MutexLock lock(&session_->mu);
  auto it = session_->buffers.find(handle_);
  if (it != session_->buffers.end()) --it->second.streams_in_use;
}

std::string NewSessionToken() {
  // Straight from the kernel's generator: std::random_device promises no
  // source (libstdc++ may pick rdrand, or fall back to a pseudo-random one).
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n < 0 && errno != EINTR) {
      // Only a kernel without getrandom(2) (before 3.17) says so; a
      // session token must never be guessable, so the daemon stops.
      std::perror("getrandom");
      std::abort();
    }
  }
  std::string token;
  for (unsigned char b : bytes) absl::StrAppendFormat(&token, "%02x", b);
  return token;
}

std::string HandleName(uint64_t handle) { return absl::StrFormat("%#x", handle); }

}  // namespace gpuexec::core
