#include "server/device/executor.h"

#include <utility>

namespace gpuexec::device {

Executor::Executor(std::string name) : name_(std::move(name)) {}

Executor::~Executor() { Stop(); }

void Executor::Start(Op on_start, Op on_tick, Op on_stop, absl::Duration tick) {
  thread_ = std::thread(&Executor::Loop, this, std::move(on_start), std::move(on_tick),
                        std::move(on_stop), tick);
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

void Executor::Loop(Op on_start, Op on_tick, Op on_stop, absl::Duration tick) {
  if (on_start) on_start();
  while (true) {
    Op op;
    bool idle = false;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || stopping_;
      };
      if (!mu_.AwaitWithTimeout(absl::Condition(&ready), tick)) {
        idle = true;
      } else if (!queue_.empty()) {
        op = std::move(queue_.front());
        queue_.pop_front();
      } else {
        break;  // stopping and drained
      }
    }
    if (idle) {
      if (on_tick) on_tick();
      continue;
    }
    op();
  }
  if (on_stop) on_stop();
}

}  // namespace gpuexec::device
