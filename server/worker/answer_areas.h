#ifndef GPUEXEC_SERVER_WORKER_ANSWER_AREAS_H_
#define GPUEXEC_SERVER_WORKER_ANSWER_AREAS_H_

// The worker's command-ring answer areas (gpuexec/command_ring.h,
// kAnswerArea; docs/command-ring-plan.md §3 (c)): where it posts the
// successes of a ring's waiting commands itself, a hop shorter than
// through the front, and the rule that keeps a failure from being read
// after a later command's success:
//
// - an area serves one stream (its session's), and stops for good at the
//   first failure of any request of that stream;
// - a success is posted only when no request of the stream sent before it
//   is still unanswered (one that could yet fail: an UnmapRegion runs
//   outside the stream's order, say).
//
// Everything else (the answer's id, seq and kind) the front chose and
// checked; the area itself is shm::AnswerArea's, which trusts nothing the
// client writes. Thread-safe: requests are tracked on the reading thread,
// replies settled and answers posted on the executor.

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/shm/answer_area.h"
#include "worker.pb.h"

namespace gpuexec::worker {

class AnswerAreas {
 public:
  // Maps area `area` of `fd` (the ring's memfd; the caller closes it) for
  // `stream`'s answers. One area a stream.
  absl::Status Map(uint64_t area, uint64_t stream, int fd, uint64_t offset, uint64_t bytes);
  void Unmap(uint64_t area);
  // Unmaps the area of `stream`, if it has one (the stream is destroyed).
  void UnmapStream(uint64_t stream);

  // Notes a request before it runs (its id, if it names a stream that has
  // an area), so that Post knows what is still unanswered before it.
  void Track(const Request& r);
  // Notes a reply; `failed`: of a request whose stream then posts no more.
  void Settle(uint64_t id, bool failed);
  // Posts the success of request `id` of `stream` where `answer` says,
  // with `gpu_ns` (0 for an untimed stream's); false when it may not (the
  // area stopped, an earlier request of the stream unanswered, no area or
  // no room): the reply then carries the answer through the front.
  bool Post(const DirectAnswer& answer, uint64_t stream, uint64_t id, uint64_t gpu_ns);

  // The stream a request names, 0 for none.
  static uint64_t StreamOf(const Request& r);

 private:
  struct Area {
    uint64_t stream = 0;
    // Shared: a post wakes the client after the lock, while an Unmap may
    // let go of the area.
    std::shared_ptr<shm::AnswerArea> writer;
    bool stopped = false;
    absl::btree_set<uint64_t> pending;  // the stream's requests not yet replied to
  };
  // Post's work under the lock: the area posted in, or none.
  std::shared_ptr<shm::AnswerArea> PostLocked(const DirectAnswer& answer, uint64_t stream,
                                              uint64_t id, uint64_t gpu_ns)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cheap look before the lock: most workers serve no area.
  std::atomic<bool> any_{false};
  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Area> areas_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, uint64_t> area_of_stream_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, uint64_t> pending_area_ ABSL_GUARDED_BY(mu_);  // request -> area
};

}  // namespace gpuexec::worker

#endif  // GPUEXEC_SERVER_WORKER_ANSWER_AREAS_H_
