// The proxy of a device's worker process: its start, its end, its state.
// The process's supervision is in remote_device_process.cc, the requests
// in remote_device_requests.cc.
#include "server/worker/remote_device.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/log.h"
#include "server/worker/channel.h"
#include "server/worker/convert.h"
#include "server/worker/remote_device_internal.h"
#include "server/worker/worker_main.h"
#include "worker.pb.h"

namespace gpuexec::worker {

using internal::Clock;
using internal::HighFd;

RemoteDevice::RemoteDevice(const WorkerOptions& options) : options_(options) {}

absl::StatusOr<std::unique_ptr<RemoteDevice>> RemoteDevice::Start(const WorkerOptions& options,
                                                                  DriverInfo* info) {
  std::unique_ptr<RemoteDevice> dev(new RemoteDevice(options));
  absl::Status st = dev->Init();
  if (!st.ok()) return st;
  dev->monitor_ = std::thread([d = dev.get()] { d->Monitor(); });
  struct Started {
    RemoteDevice* d;
    static bool Check(Started* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->d->mu_) {
      return s->d->first_ready_ || !s->d->start_status_.ok();
    }
  } started{dev.get()};
  {
    absl::MutexLock lock(&dev->mu_);
    if (!dev->mu_.AwaitWithTimeout(absl::Condition(&Started::Check, &started),
                                   options.start_timeout)) {
      dev->start_status_ = absl::DeadlineExceededError(
          absl::StrCat("device ", options.ordinal, ": its worker did not start within ",
                       absl::FormatDuration(options.start_timeout)));
    }
    *info = dev->driver_info_;
    if (!dev->first_ready_) return dev->start_status_;
  }
  return dev;
}

absl::Status RemoteDevice::Init() {
  const std::string name = absl::StrCat("gpuexec-staging-", options_.ordinal);
  const uint64_t size = options_.staging_bytes * static_cast<uint64_t>(options_.staging_slots);
  // Sealed at its size: a worker cannot shrink it under the front's mapping
  // (a copy into it would then fault the front with SIGBUS).
  staging_fd_ = HighFd(memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (staging_fd_ < 0 || ftruncate(staging_fd_, static_cast<off_t>(size)) != 0 ||
      fcntl(staging_fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return absl::InternalError(absl::StrCat("device ", options_.ordinal,
                                            ": cannot create the shared staging memory (", size,
                                            " bytes): ", strerror(errno)));
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, staging_fd_, 0);
  if (p == MAP_FAILED) {
    return absl::InternalError(absl::StrCat(
        "device ", options_.ordinal, ": cannot map the shared staging memory: ", strerror(errno)));
  }
  staging_memory_ = static_cast<uint8_t*>(p);
  std::vector<uint8_t*> slots;
  for (int i = 0; i < options_.staging_slots; ++i) {
    slots.push_back(staging_memory_ + i * options_.staging_bytes);
  }
  staging_.Reset(std::move(slots), options_.staging_bytes);
  return absl::OkStatus();
}

RemoteDevice::~RemoteDevice() {
  std::shared_ptr<Connection> conn;
  std::vector<ReplyFn> failed;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    state_ = State::kStopping;
    conn = std::move(conn_);
    conn_ = nullptr;
    for (auto& [id, fn] : pending_) failed.push_back(std::move(fn));
    pending_.clear();
  }
  Reply gone;
  ToProto(absl::UnavailableError(absl::StrCat("device ", options_.ordinal, " is shutting down")),
          gone.mutable_status());
  for (auto& fn : failed) fn(gone, 0);
  if (monitor_.joinable()) monitor_.join();
  std::vector<std::shared_ptr<Connection>> all;
  {
    absl::MutexLock lock(&mu_);
    all = std::move(retired_);
  }
  if (conn != nullptr) {
    // The worker sees the end of its socket, drains and exits.
    conn->channel->Shutdown();
    all.push_back(conn);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  for (auto& c : all) {
    while (!c->exited.load() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
    if (!c->exited.load()) {
      log::Warning(Label(), ": worker pid ", c->pid,
                   " did not exit within 10 s of shutdown; killing it");
      c->Kill();
      const absl::Time killed = absl::Now();
      while (!c->exited.load() && absl::Now() - killed < absl::Seconds(2)) {
        absl::SleepFor(absl::Milliseconds(5));
      }
      // A process stuck in the kernel: stop waiting for it.
      c->abandon.store(true);
    }
    if (c->reader.joinable()) c->reader.join();
    c->FailOrphans();
  }
  // Completions that others deferred meanwhile.
  for (;;) {
    std::vector<std::function<void()>> deferred;
    {
      absl::MutexLock lock(&mu_);
      deferred.swap(deferred_);
    }
    if (deferred.empty()) break;
    for (auto& fn : deferred) fn();
  }
  if (staging_memory_ != nullptr) {
    munmap(staging_memory_, options_.staging_bytes * static_cast<uint64_t>(options_.staging_slots));
  }
  if (staging_fd_ >= 0) close(staging_fd_);
}

// ------------------------------------------------------------ state

bool RemoteDevice::healthy() const {
  absl::MutexLock lock(&mu_);
  return state_ == State::kServing;
}

absl::Status RemoteDevice::fault() const {
  absl::MutexLock lock(&mu_);
  if (state_ == State::kServing) return absl::OkStatus();
  if (!down_.ok()) return down_;
  return absl::UnavailableError(absl::StrCat("device ", options_.ordinal, " is starting"));
}

uint64_t RemoteDevice::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

uint64_t RemoteDevice::resets() const {
  absl::MutexLock lock(&mu_);
  return resets_told_;
}

std::optional<ResetInfo> RemoteDevice::last_reset() const {
  absl::MutexLock lock(&mu_);
  return last_reset_;
}

int RemoteDevice::worker_pid() const {
  absl::MutexLock lock(&mu_);
  return conn_ == nullptr ? 0 : conn_->pid;
}

uint32_t RemoteDevice::modules_loaded() const {
  absl::MutexLock lock(&mu_);
  return static_cast<uint32_t>(live_modules_.size());
}

void RemoteDevice::SetListeners(std::function<void(const ResetInfo&)> on_reset,
                                std::function<void()> on_state) {
  absl::MutexLock lock(&mu_);
  listener_ = std::move(on_reset);
  state_listener_ = std::move(on_state);
}

absl::Status RemoteDevice::LostError(uint64_t epoch, const std::string& what) const {
  absl::MutexLock lock(&mu_);
  for (const ResetInfo& r : history_) {
    if (r.epoch == epoch + 1) {
      return absl::AbortedError(absl::StrCat(what, " was lost: device ", options_.ordinal,
                                             " was reset at ", Clock(r.at), " because ", r.why));
    }
  }
  return absl::AbortedError(
      absl::StrCat(what, " was lost: device ", options_.ordinal, " was reset since"));
}

std::string RemoteDevice::Label() const {
  return options_.tenant.empty() ? absl::StrCat("device ", options_.ordinal)
                                 : absl::StrCat("device ", options_.ordinal, " (worker of tenant '",
                                                options_.tenant, "')");
}

absl::Status RemoteDevice::NotServingLocked() const {
  if (!down_.ok()) return down_;
  return absl::UnavailableError(absl::StrCat("device ", options_.ordinal, " is not serving"));
}

absl::Status RemoteDevice::StatusOf(const Reply& reply) {
  return reply.has_status() ? FromProto(reply.status()) : absl::OkStatus();
}

RemoteDevice::ReplyFn RemoteDevice::StatusTo(Done done) {
  return [done = std::move(done)](const Reply& reply, uint64_t) { done(StatusOf(reply)); };
}

RemoteDevice::ReplyFn RemoteDevice::ValueTo(Callback<uint64_t> done) {
  return [done = std::move(done)](const Reply& reply, uint64_t) {
    absl::Status st = StatusOf(reply);
    if (!st.ok()) return done(st);
    done(reply.value());
  };
}

}  // namespace gpuexec::worker
