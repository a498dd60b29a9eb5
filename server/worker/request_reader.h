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
// operations, as the executor itself does; and neither reads while the
// requests behind them (the newest that many read) hold kReadAheadBytes or
// more: what is not read stays in the channel, which the front bounds. It sleeps once
// neither it nor the executor made progress for kLinger (an operation
// that takes long, a module's load, keeps no core spinning).
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
  static constexpr uint64_t kReadAheadBytes = uint64_t{64} << 20;
  // How long the helper keeps looking after the last request it read or
  // the executor's last operation, before it sleeps (by default).
  static constexpr absl::Duration kLinger = absl::Microseconds(200);

  // `take` queues one request (a frame read), or ends the reading with
  // false (an unreadable request); `on_end` runs once, on the thread that
  // saw the end or took false.
  using Take = std::function<bool(std::string& frame)>;
  RequestReader(Channel* channel, Take take, std::function<void()> on_end,
                absl::Duration linger = kLinger);
  ~RequestReader();  // Stop()s
  RequestReader(const RequestReader&) = delete;
  RequestReader& operator=(const RequestReader&) = delete;

  // What the executor holds and has done (any thread).
  struct Load {
    size_t backlog = 0;  // operations posted and not yet run
    uint64_t ran = 0;    // operations run, since the start
  };
  // Tells the reader where to look, before the executor reads: without it
  // neither bound on reading ahead holds, and no helper starts.
  void SetLoad(std::function<Load()> load);
  // Starts the helper thread, after SetLoad and before the executor reads.
  // Without it, only the executor reads.
  void StartHelper();
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
  // The bytes of the newest `count` requests read (at most kSizes - 1).
  uint64_t NewestBytesLocked(size_t count) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_);
  void HelperLoop();

  Channel* const channel_;
  const Take take_;
  const std::function<void()> on_end_;
  const absl::Duration linger_;
  std::function<Load()> load_;

  absl::Mutex read_mu_;
  std::string frame_ ABSL_GUARDED_BY(read_mu_);
  bool ended_ ABSL_GUARDED_BY(read_mu_) = false;
  // The running total of the bytes read, after each of the newest kSizes
  // requests: the newest k held cost_[n] - cost_[n - k].
  static constexpr size_t kSizes = 1024;
  uint64_t cost_[kSizes] ABSL_GUARDED_BY(read_mu_) = {};
  uint64_t reads_ ABSL_GUARDED_BY(read_mu_) = 0;

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
