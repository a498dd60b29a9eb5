#include "server/device/executor.h"

#include <algorithm>
#include <utility>

namespace gpuexec::device {

Executor::Executor(std::string name) : name_(std::move(name)) {}

Executor::~Executor() { Stop(); }

void Executor::Start(Op on_start, Op on_tick, Op on_stop, absl::Duration tick, Poll poll) {
  thread_ = std::thread(&Executor::Loop, this, std::move(on_start), std::move(on_tick),
                        std::move(on_stop), tick, std::move(poll));
  thread_id_ = thread_.get_id();
}

void Executor::Post(Op op) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  queue_.push_back(std::move(op));
}

bool Executor::OnExecutorThread() const { return std::this_thread::get_id() == thread_id_; }

void Executor::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  if (thread_.joinable() && !OnExecutorThread()) thread_.join();
}

void Executor::Loop(Op on_start, Op on_tick, Op on_stop, absl::Duration tick, Poll poll) {
  if (on_start) on_start();
  std::deque<Op> batch;
  bool polling = false;
  absl::Time polling_since;
  absl::Time last_tick = absl::Now();
  while (true) {
    absl::Duration wait = tick;
    if (polling) {
      const absl::Duration spent = absl::Now() - polling_since;
      wait = spent < absl::Microseconds(200) ? absl::ZeroDuration()
                                             : std::min(spent / 20, absl::Milliseconds(1));
    }
    bool stop = false;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !queue_.empty() || stopping_; };
      const bool woke = wait == absl::ZeroDuration()
                            ? ready()
                            : mu_.AwaitWithTimeout(absl::Condition(&ready), wait);
      if (woke) {
        if (!queue_.empty()) {
          batch.swap(queue_);  // everything queued, under one lock
        } else {
          stop = true;  // stopping and drained
        }
      }
    }
    if (stop) break;
    for (Op& op : batch) op();
    batch.clear();
    if (poll) {
      const bool was = polling;
      polling = poll();
      if (polling && !was) polling_since = absl::Now();
    }
    if (!polling && on_tick && absl::Now() - last_tick >= tick) {
      last_tick = absl::Now();
      on_tick();
    } else if (polling && wait == absl::ZeroDuration()) {
      std::this_thread::yield();
    }
  }
  if (on_stop) on_stop();
}

}  // namespace gpuexec::device
