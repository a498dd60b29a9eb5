#include "server/device/executor.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "server/common/thread_name.h"

namespace gpuexec::device {

Executor::Executor(std::string name) : name_(std::move(name)) {}

Executor::~Executor() {
  Stop();
  if (wake_fd_ >= 0) close(wake_fd_);
}

void Executor::Start(Op on_start, Op on_tick, Op on_stop, absl::Duration tick, Poll poll,
                     Input input) {
  if (input.fd >= 0) wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  thread_ = std::thread(&Executor::Loop, this, std::move(on_start), std::move(on_tick),
                        std::move(on_stop), tick, std::move(poll), std::move(input));
  thread_id_ = thread_.get_id();
}

void Executor::Post(Op op) {
  bool wake;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    queue_.push_back(std::move(op));
    wake = sleeping_;
    sleeping_ = false;
  }
  if (wake) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
}

void Executor::WaitIdle(absl::Duration wait, const Input& input) {
  if (input.fd < 0 || wake_fd_ < 0) {
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !queue_.empty() || stopping_; };
    mu_.AwaitWithTimeout(absl::Condition(&ready), wait);
    return;
  }
  if (!queue_.empty() || stopping_) return;
  sleeping_ = true;
  mu_.Unlock();
  if (!input.park || input.park()) {
    pollfd fds[3] = {{wake_fd_, POLLIN, 0}, {input.fd, POLLIN, 0}, {input.fd2, POLLIN, 0}};
    const timespec timeout = absl::ToTimespec(std::min(wait, absl::Seconds(1)));
    (void)ppoll(fds, input.fd2 >= 0 ? 3 : 2, &timeout, nullptr);
    if (fds[0].revents != 0) {
      uint64_t n;
      (void)!read(wake_fd_, &n, sizeof(n));
    }
    if (input.unpark) input.unpark();
  }
  mu_.Lock();
  sleeping_ = false;
}

bool Executor::OnExecutorThread() const { return std::this_thread::get_id() == thread_id_; }

void Executor::Stop() {
  bool wake;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    wake = sleeping_;
  }
  if (wake) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
  if (thread_.joinable() && !OnExecutorThread()) thread_.join();
}

void Executor::Loop(Op on_start, Op on_tick, Op on_stop, absl::Duration tick, Poll poll,
                    Input input) {
  NameThisThread(name_);
  if (on_start) on_start();
  std::deque<Op> batch;
  PollBackoff backoff;
  absl::Time last_tick = absl::Now();
  absl::Time last_work = absl::InfinitePast();
  while (true) {
    absl::Duration wait = tick;
    const bool busy_polling =
        input.busy_poll > absl::ZeroDuration() && absl::Now() - last_work < input.busy_poll;
    if (busy_polling) wait = absl::ZeroDuration();
    if (backoff.pending()) wait = backoff.Pause(absl::Now());
    bool stop = false;
    if (input.on_readable) {
      // Reads what has arrived; its requests are queued for this loop.
      input.on_readable();
    }
    {
      absl::MutexLock lock(&mu_);
      if (wait != absl::ZeroDuration() && queue_.empty() && !stopping_) WaitIdle(wait, input);
      if (!queue_.empty()) {
        batch.swap(queue_);  // everything queued, under one lock
      } else if (stopping_) {
        stop = true;  // stopping and drained
      }
    }
    if (stop) break;
    if (!batch.empty()) {
      last_work = absl::Now();
      backoff.Worked(last_work);
    }
    for (Op& op : batch) op();
    batch.clear();
    if (poll) backoff.Polled(poll(), absl::Now());
    const bool polling = backoff.pending();
    if (!polling && on_tick && absl::Now() - last_tick >= tick) {
      last_tick = absl::Now();
      on_tick();
    } else if ((polling || busy_polling) && wait == absl::ZeroDuration()) {
      std::this_thread::yield();
    }
  }
  if (on_stop) on_stop();
}

}  // namespace gpuexec::device
