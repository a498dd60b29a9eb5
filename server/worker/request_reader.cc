#include "server/worker/request_reader.h"

#include <algorithm>
#include <utility>

#include "server/common/cpu_relax.h"
#include "server/common/thread_name.h"
#include "server/common/trace.h"

namespace gpuexec::worker {
namespace {

// While it finds nothing, the helper pauses this many times between looks
// and yields its core once every kYieldEvery looks (as the executor does).
constexpr int kPausesPerLook = 4;
constexpr unsigned kYieldEvery = 16;
// The most requests the helper reads under one hold of the reading lock.
constexpr size_t kHelperBatch = 32;

}  // namespace

RequestReader::RequestReader(Channel* channel, Take take, std::function<void()> on_end,
                             absl::Duration linger)
    : channel_(channel), take_(std::move(take)), on_end_(std::move(on_end)), linger_(linger) {}

RequestReader::~RequestReader() { Stop(); }

void RequestReader::SetLoad(std::function<Load()> load) { load_ = std::move(load); }

void RequestReader::StartHelper() { helper_ = std::thread(&RequestReader::HelperLoop, this); }

void RequestReader::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  stop_.store(true, std::memory_order_release);
  if (helper_.joinable()) helper_.join();
}

size_t RequestReader::ReadLocked(size_t most) {
  if (ended_) return 0;
  for (size_t i = 0; i < most; ++i) {
    if (load_ && NewestBytesLocked(load_().backlog) >= kReadAheadBytes) return i;
    const Channel::Poll got = channel_->TryReceive(&frame_);
    if (got == Channel::Poll::kNothing) return i;
    GPUEXEC_TRACE(kWorkerRead);
    const uint64_t before = cost_[reads_ % kSizes];
    cost_[++reads_ % kSizes] = before + frame_.size();
    if (got == Channel::Poll::kEnd || !take_(frame_)) {
      ended_ = true;
      on_end_();
      return i;
    }
  }
  return most;
}

uint64_t RequestReader::NewestBytesLocked(size_t count) const {
  count = std::min<uint64_t>({count, reads_, kSizes - 1});
  return cost_[reads_ % kSizes] - cost_[(reads_ - count) % kSizes];
}

void RequestReader::ReadOnExecutor() {
  if (helping_.load(std::memory_order_acquire) || !read_mu_.TryLock()) return;
  const size_t read = ReadLocked(kReadAhead);
  read_mu_.Unlock();
  if (read > 0 && load_ && asleep_.load(std::memory_order_acquire) && load_().backlog >= kHelpAt) {
    absl::MutexLock lock(&mu_);
    wanted_ = true;
  }
}

bool RequestReader::Park() {
  // The helper reads now: look again rather than sleep (it sleeps itself
  // within kLinger of the last progress, and then this parks).
  if (!read_mu_.TryLock()) return false;
  // A request already received and not yet taken is no reason to wait.
  const bool park = !channel_->HasBuffered() && channel_->ParkReceiver();
  read_mu_.Unlock();
  return park;
}

void RequestReader::Unpark() { channel_->UnparkReceiver(); }

void RequestReader::HelperLoop() {
  NameThisThread("gx-read");
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      auto woken = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return wanted_ || stopping_; };
      mu_.Await(absl::Condition(&woken));
      if (stopping_) return;
      wanted_ = false;
    }
    asleep_.store(false, std::memory_order_release);
    helping_.store(true, std::memory_order_release);
    absl::Time last = absl::Now();
    uint64_t last_ran = load_().ran;
    unsigned looks = 0;
    while (!stop_.load(std::memory_order_acquire)) {
      size_t read = 0;
      const Load now_load = load_();
      if (now_load.backlog < kReadAhead) {
        absl::MutexLock lock(&read_mu_);
        if (ended_) break;
        read = ReadLocked(kHelperBatch);
      }
      const absl::Time now = absl::Now();
      if (read > 0 || now_load.ran != last_ran) {
        last = now;
        last_ran = now_load.ran;
        if (read > 0) continue;
      } else if (now - last >= linger_) {
        break;  // nothing came and nothing ran: the executor reads again
      }
      if (++looks % kYieldEvery == 0) {
        std::this_thread::yield();
      } else {
        for (int i = 0; i < kPausesPerLook; ++i) CpuRelax();
      }
    }
    helping_.store(false, std::memory_order_release);
    asleep_.store(true, std::memory_order_release);
  }
}

}  // namespace gpuexec::worker
