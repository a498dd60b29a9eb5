#ifndef GPUEXEC_CLIENT_CPP_INTERNAL_COMMAND_RING_H_
#define GPUEXEC_CLIENT_CPP_INTERNAL_COMMAND_RING_H_

// A session's command ring, the client's side (gpuexec/command_ring.h,
// docs/command-ring-plan.md): a sealed memfd of a submission ring and a
// completion ring, registered on the daemon's host memory socket, whose
// connection stays open as the ring's lifeline. Commands are written as
// records (ring_encode.h) and the daemon's answers read back, with no
// system call on the way when both sides are awake: the client spins for
// ClientOptions::spin_wait, then sleeps on the ring's futex word.
//
// It trusts the daemon's positions no further than their bounds: a
// completion tail behind the head or more than a ring ahead, or a
// completion that crosses the ring's end, breaks the ring (DATA_LOSS) and
// the session's commands go on the Execute stream.

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gpuexec/v1/gpuexec.pb.h"
#include "internal/host_memory.h"

namespace gpuexec {
namespace internal {

class CommandRing {
 public:
  struct Options {
    std::string socket_path;  // the daemon's host memory socket
    std::string token;        // the session's
    // How long a waiting call polls the completion ring before it sleeps.
    absl::Duration spin_wait = absl::ZeroDuration();
    // Bounds the registration's connect, send and answer.
    absl::Duration timeout = absl::Seconds(60);
    // Powers of two within gpuexec/command_ring.h's bounds: 256 KiB holds
    // about 2,000 launches of a few arguments each.
    uint64_t submission_bytes = 256 << 10;
    uint64_t completion_bytes = 64 << 10;
    // An answer area (gpuexec/command_ring.h, kAnswerArea) of this many
    // bytes, where the daemon's worker posts the successes of waiting
    // commands itself; 0: none. Only for a daemon that serves layout
    // version 2 (ring::kAnswerAreaVersion).
    uint64_t answer_bytes = 0;
  };

  // Makes, maps and registers a ring for the session. The daemon's refusal
  // (rings not served, one per session, ...) comes back as its status.
  static absl::StatusOr<std::unique_ptr<CommandRing>> Open(const Options& options);
  ~CommandRing();
  CommandRing(const CommandRing&) = delete;
  CommandRing& operator=(const CommandRing&) = delete;

  // As Commands::Submit. When the ring has no record for `command`
  // (ring_encode.h), nothing is posted, `*not_carried` is set, and the
  // caller sends it on the Execute stream.
  absl::StatusOr<v1::CommandResult> Submit(const v1::Command& command, bool wait,
                                           absl::Duration timeout, bool report_deferred,
                                           bool* not_carried);
  // Waits until every record posted so far has started (the daemon's
  // submission head reached them): an Execute barrier without a round trip.
  absl::Status Order(absl::Duration timeout);
  // The first failure of a command posted without waiting, not reported
  // yet; cleared.
  absl::Status TakeDeferred();
  // OK while the ring serves; then why not (the daemon closed it, the
  // daemon went away, Shutdown).
  absl::Status broken() const;
  void Shutdown();
  // The daemon's number for the ring (its log names it).
  uint64_t number() const { return number_; }
  // The ring's mapping, for tests that play the daemon's part in it.
  unsigned char* mapping_for_testing() const { return base_; }
  // Rounds of waiting so far (PollLocked's), for tests.
  uint64_t poll_rounds() const {
    absl::MutexLock lock(&mu_);
    return poll_rounds_;
  }

 private:
  // A completion as read out of the ring.
  struct Result {
    int32_t code = 0;
    std::string message;
    uint16_t kind = 0;
    uint64_t gpu_time_ns = 0;
    uint64_t value0 = 0, value1 = 0;
  };

  CommandRing() = default;
  static v1::CommandResult ToResult(uint64_t id, const Result& r);
  // Posts the record in record_ (a pad first where it would cross the
  // end), waiting for room until `deadline`.
  absl::Status PostLocked(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One round of waiting for the daemon: spins, then sleeps on the client
  // futex word (at most kParkLimit, or until `deadline`), without the lock;
  // then reads the completions posted meanwhile. The round ends at a
  // completion, the ring's close, or (with `head`, or while a thread waits
  // for it: head_waiters_) the submission head's move, so that a waiting
  // command takes one round, not one for its start and one for its answer.
  // A thread that finds another at it waits for that one's round instead.
  void PollLocked(absl::Time deadline, bool head = true) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PollLocked for a thread that waits for the submission head to move.
  void PollForHeadLocked(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the completions posted, wakes a daemon parked for their room,
  // then looks at the ring's state.
  void DrainLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the completions posted up to the completion tail as loaded now
  // into results_ (or deferred_), and publishes the completion head; then
  // the answer area's answers, up to its tail as loaded before the
  // completion tail (a failure posted before a later command's answer is
  // taken first).
  void TakeCompletionsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One answer, from either place: to its waiter, or a failure to
  // deferred_. `direct`: from the answer area.
  void TakeResultLocked(uint64_t id, Result r, bool direct) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void BreakLocked(absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Breaks the ring when the daemon closed it (after taking the answers it
  // posted before it said so), and with `lifeline` also when it hung up
  // the lifeline. That look is a system call: a round that read
  // completions skips it (a daemon that answers is there).
  void CheckClosedLocked(bool lifeline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WakeDaemon();
  uint64_t Load64(size_t offset) const;

  unsigned char* base_ = nullptr;
  size_t bytes_ = 0;
  uint64_t sq_bytes_ = 0, cq_bytes_ = 0, aq_bytes_ = 0;
  absl::Duration spin_wait_;
  std::string daemon_socket_;
  UniqueFd lifeline_;
  uint64_t number_ = 0;

  mutable absl::Mutex mu_;
  std::string record_ ABSL_GUARDED_BY(mu_);  // the record being posted
  uint64_t tail_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t cq_head_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t aq_head_ ABSL_GUARDED_BY(mu_) = 0;
  // The last ids answered in the answer area (at most kDirectKept), whose
  // second answer in the completion ring, if one comes, is dropped.
  absl::flat_hash_set<uint64_t> direct_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> direct_order_ ABSL_GUARDED_BY(mu_);
  bool polling_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t poll_rounds_ ABSL_GUARDED_BY(mu_) = 0;
  // Threads in PollForHeadLocked; read by the polling thread as it spins.
  std::atomic<uint32_t> head_waiters_{0};
  // The last command posted without waiting, and the last one known to
  // have started with every one before it.
  uint64_t last_unwaited_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t ordered_through_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_set<uint64_t> awaited_ ABSL_GUARDED_BY(mu_);
  // Waited for by a caller that gave up (timed out): its answer is dropped.
  absl::flat_hash_set<uint64_t> abandoned_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Result> results_ ABSL_GUARDED_BY(mu_);
  absl::Status deferred_ ABSL_GUARDED_BY(mu_);
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

}  // namespace internal
}  // namespace gpuexec

#endif  // GPUEXEC_CLIENT_CPP_INTERNAL_COMMAND_RING_H_
