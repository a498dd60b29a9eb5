#ifndef GPUEXEC_SERVER_WORKER_REQUEST_READER_H_
#define GPUEXEC_SERVER_WORKER_REQUEST_READER_H_

// Reads a device worker's requests from the front process. While the
// device's thread (its executor) keeps up, it reads them itself, between
// its sleeps and its operations: a client that waits for each answer pays
// no handover between threads. Once requests come faster than the
// executor runs them (it holds kHelpAt operations or more), a thread of
// the reader's own takes over reading, parsing and queueing them for as
// long as the executor has work, and lingers kLinger after, so that the
// executor's time goes to the driver's calls: the two run side by side.
// The helper reads only while the executor holds fewer than kReadAhead
// operations, as the executor itself does: what is not read stays in the
// channel, which the front bounds.
//
// One reader at a time (a lock), so requests are queued in the order they
// came whichever thread reads them.

#include <atomic>
#include <cstddef>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/worker/channel.h"

namespace gpuexec::worker {

class RequestReader {
 public:
  // The executor's backlog at which the helper starts, and the most it
  // holds before reading waits.
  static constexpr size_t kHelpAt = 16;
  static constexpr size_t kReadAhead = 256;
  // How long the helper keeps looking after the last request it read and
  // the executor's last operation, before it sleeps.
  static constexpr absl::Duration kLinger = absl::Microseconds(200);

  // `take` queues one request (a frame read), or ends the reading with
  // false (an unreadable request); `on_end` runs once, on the thread that
  // saw the end or took false.
  using Take = std::function<bool(std::string& frame)>;
  RequestReader(Channel* channel, Take take, std::function<void()> on_end);
  ~RequestReader();  // Stop()s
  RequestReader(const RequestReader&) = delete;
  RequestReader& operator=(const RequestReader&) = delete;

  // Starts the helper thread; `backlog` says how many operations the
  // executor holds (any thread). Without it, only the executor reads.
  void StartHelper(std::function<size_t()> backlog);
  // Ends the helper thread (joined); the executor may go on reading.
  void Stop();

  // On the executor: reads what has come, unless the helper is reading.
  void ReadOnExecutor();
  // The executor's park and unpark around its sleep (ExecutorInput).
  bool Park();
  void Unpark();

  // Whether the helper thread is reading now (tests).
  bool helping() const { return helping_.load(std::memory_order_acquire); }

 private:
  // Reads up to `most` requests; how many it took.
  size_t ReadLocked(size_t most) ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_);
  void HelperLoop();

  Channel* const channel_;
  const Take take_;
  const std::function<void()> on_end_;
  std::function<size_t()> backlog_;

  absl::Mutex read_mu_;
  std::string frame_ ABSL_GUARDED_BY(read_mu_);
  bool ended_ ABSL_GUARDED_BY(read_mu_) = false;

  absl::Mutex mu_;
  bool wanted_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> stop_{false};
  std::atomic<bool> helping_{false};
  std::atomic<bool> asleep_{true};
  std::thread helper_;
};

}  // namespace gpuexec::worker

#endif  // GPUEXEC_SERVER_WORKER_REQUEST_READER_H_
