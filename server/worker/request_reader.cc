#include "server/worker/request_reader.h"

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

RequestReader::RequestReader(Channel* channel, Take take, std::function<void()> on_end)
    : channel_(channel), take_(std::move(take)), on_end_(std::move(on_end)) {}

RequestReader::~RequestReader() { Stop(); }

void RequestReader::StartHelper(std::function<size_t()> backlog) {
  backlog_ = std::move(backlog);
  helper_ = std::thread(&RequestReader::HelperLoop, this);
}

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
    const Channel::Poll got = channel_->TryReceive(&frame_);
    if (got == Channel::Poll::kNothing) return i;
    GPUEXEC_TRACE(kWorkerRead);
    if (got == Channel::Poll::kEnd || !take_(frame_)) {
      ended_ = true;
      on_end_();
      return i;
    }
  }
  return most;
}

void RequestReader::ReadOnExecutor() {
  if (helping_.load(std::memory_order_acquire) || !read_mu_.TryLock()) return;
  const size_t read = ReadLocked(kReadAhead);
  read_mu_.Unlock();
  if (read > 0 && backlog_ && asleep_.load(std::memory_order_acquire) && backlog_() >= kHelpAt) {
    absl::MutexLock lock(&mu_);
    wanted_ = true;
  }
}

bool RequestReader::Park() {
  absl::MutexLock lock(&read_mu_);
  return channel_->ParkReceiver();
}

void RequestReader::Unpark() {
  absl::MutexLock lock(&read_mu_);
  channel_->UnparkReceiver();
}

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
    unsigned looks = 0;
    while (!stop_.load(std::memory_order_acquire)) {
      size_t read = 0;
      const size_t held = backlog_();
      if (held < kReadAhead) {
        absl::MutexLock lock(&read_mu_);
        if (ended_) break;
        read = ReadLocked(kHelperBatch);
      }
      const absl::Time now = absl::Now();
      if (read > 0) {
        last = now;
        continue;
      }
      if (held > 0) {
        last = now;
      } else if (now - last >= kLinger) {
        break;
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
