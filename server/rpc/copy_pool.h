#ifndef GPUEXEC_SERVER_RPC_COPY_POOL_H_
#define GPUEXEC_SERVER_RPC_COPY_POOL_H_

// Threads that copy Write data into staging memory, so that the thread
// polling gRPC's completion queue goes on reading the next message (and
// other clients' messages) while a megabyte is copied: with one polling
// thread, a Write's receive and its copy otherwise take turns.

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace gpuexec::rpc {

class CopyPool {
 public:
  explicit CopyPool(int threads) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
  }
  ~CopyPool() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    for (std::thread& t : threads_) t.join();
  }
  CopyPool(const CopyPool&) = delete;
  CopyPool& operator=(const CopyPool&) = delete;

  void Post(std::function<void()> fn) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(fn));
  }

 private:
  void Run() {
    for (;;) {
      std::function<void()> fn;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](CopyPool* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
              return !p->queue_.empty() || p->stopping_;
            },
            this));
        if (queue_.empty()) return;  // stopping and drained
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
    }
  }

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace gpuexec::rpc

#endif  // GPUEXEC_SERVER_RPC_COPY_POOL_H_
