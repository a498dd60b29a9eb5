#ifndef GPUEXEC_SERVER_DEVICE_EXECUTOR_H_
#define GPUEXEC_SERVER_DEVICE_EXECUTOR_H_

// One thread that runs operations in the order they were posted, except
// that the operations of different streams take turns (TurnQueue). A
// Device owns one: its context is made current on that thread once, and
// every driver call of that device runs there. Operations must not block;
// the executor wakes at least every `tick` to run the idle hook (the device
// uses it to look for faults that left completions pending).

#include <algorithm>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gpuexec::device {

// A file descriptor an Executor's loop also waits on, and what to do when
// it is readable: `on_readable` runs on the executor, must not block, and
// is also called now and then while the loop is busy. With it, a process
// whose work arrives on a socket (a device worker) reads it on the executor
// itself instead of handing it over from another thread.
struct ExecutorInput {
  int fd = -1;
  std::function<void()> on_readable;
  // Another descriptor to wait on (-1: none), and what to do around each
  // sleep: `park` first (false: input may be there already, do not sleep),
  // `unpark` after waking. Both optional; for input that arrives through
  // shared memory, announced on `fd` only to a reader that parked.
  int fd2 = -1;
  std::function<bool()> park;
  std::function<void()> unpark;
  // After running work, keep reading the input without sleeping for this
  // long: the next request of a client that waits for each answer arrives
  // within it, and is then seen without a thread wake-up (tens of
  // microseconds on some hosts). Costs a core while it lasts.
  absl::Duration busy_poll = absl::ZeroDuration();
  // Between two operations of a turn: reads what has arrived (without
  // sending what is done, which `on_readable` also does), so that another
  // stream's request can take its turn; called only while few operations
  // wait. Optional; must not block.
  std::function<void()> between_ops;
  // Sends what is done (the rest of `on_readable`), every few operations of
  // a long turn. Optional; must not block.
  std::function<void()> flush;
};

// How long the loop pauses between polls for GPU events: not at all for
// the first 200 us after the newest work, then a twentieth of the time since
// it, at most 1 ms. Counted from the newest work, not from when polling
// began: a stream of long kernels (another tenant's, in a worker shared by
// tenants) keeps the loop polling for seconds, and a short launch posted
// meanwhile must be seen done within microseconds, not after the pause
// the long wait grew to.
class PollBackoff {
 public:
  static constexpr absl::Duration kSpin = absl::Microseconds(200);
  static constexpr absl::Duration kMaxPause = absl::Milliseconds(1);

  // Ops ran at `now`: what they posted may be done soon.
  void Worked(absl::Time now) { since_ = now; }
  // The poll said whether anything is still pending.
  void Polled(bool pending, absl::Time now) {
    if (pending && !pending_) since_ = now;
    pending_ = pending;
  }
  bool pending() const { return pending_; }
  // The pause before the next poll (zero while not pending: the loop's
  // other waits apply).
  absl::Duration Pause(absl::Time now) const {
    if (!pending_) return absl::ZeroDuration();
    const absl::Duration spent = now - since_;
    return spent < kSpin ? absl::ZeroDuration() : std::min(spent / 20, kMaxPause);
  }

 private:
  bool pending_ = false;
  absl::Time since_;
};

// The order an Executor runs its operations in. An operation with a key
// (a stream's: its work goes to that stream only) may run ahead of other
// keys' operations posted before it, never ahead of its own key's nor past
// an operation without a key (key 0: one that may touch any stream's work,
// such as a module load or a completion handed back), which runs after
// everything posted before it and before everything after. Between two
// such, the keys take turns, an operation each: in a worker that tenants
// share, one session's burst of launches makes another session's launch
// wait for one of them, not for all (keys are tenants': TurnKeys). A
// key's operations must touch its own streams' work only: a session has
// one stream, and nothing of one session's (buffers, regions, graphs) is
// another's. Not thread-safe.
class TurnQueue {
 public:
  using Op = std::function<void()>;
  void Push(uint64_t key, Op op);
  Op Pop();  // the next to run; not empty()
  bool empty() const { return segments_.empty(); }
  size_t size() const { return size_; }

 private:
  // Operations with keys between two without, or one without. The keys'
  // state is made only for the former: an operation without a key (every
  // one, with turns off) costs no deque or map of its own. The state is
  // reused from one keyed segment to the next (spare_), with the queues
  // of up to kKeptKeys keys: `of_key` holds empty queues too; `turns`
  // lists only the keys with operations.
  struct Keyed {
    std::deque<uint64_t> turns;  // the keys with operations, in turn
    absl::flat_hash_map<uint64_t, std::deque<Op>> of_key;
  };
  struct Segment {
    Op unkeyed;                    // where `keyed` is null
    std::unique_ptr<Keyed> keyed;  // null: one operation without a key
  };
  std::deque<Segment> segments_;
  std::unique_ptr<Keyed> spare_;  // the last keyed segment's state, for the next
  size_t size_ = 0;
  uint64_t last_key_ = 0;  // the key of the op popped last
};

// The key of operations that only release what completions held (events
// going back to their spares): no tenant's, and above every TurnKeys key.
inline constexpr uint64_t kReleaseTurn = uint64_t{1} << 62;

// The key each stream's operations take turns under in a TurnQueue: its
// tenant's, so that all the sessions of one tenant share a turn (a tenant
// with many busy sessions gets no more turns than one with one; within a
// tenant, operations keep the order they came in). A stream of the
// implicit tenant (no name: callers no tenant names, who are no one group)
// has a key of its own. A stream has its key from Add, before any of its
// operations is posted, until Remove; the tenant's key goes with its last
// stream. Thread-safe.
class TurnKeys {
 public:
  void Add(uint64_t stream, const std::string& tenant);
  void Remove(uint64_t stream);
  // Never 0; a stream never added (or removed) has a key of its own.
  uint64_t Of(uint64_t stream) const;

 private:
  struct Tenant {
    uint64_t key = 0;
    size_t streams = 0;
  };
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::string> tenant_of_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, uint64_t> key_of_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Tenant> tenants_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 1;
};

class Executor {
 public:
  using Op = std::function<void()>;
  using Input = ExecutorInput;

  explicit Executor(std::string name);
  ~Executor();  // Stop()s if still running
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Runs after each batch of ops; true while it waits for something that
  // only polling can see (GPU events), which makes the loop poll again soon
  // instead of sleeping (PollBackoff says how soon).
  using Poll = std::function<bool()>;

  // Starts the thread: `on_start` runs first, `on_tick` whenever the queue
  // stayed empty for `tick`, `on_stop` last (after the queue drained).
  void Start(Op on_start, Op on_tick, Op on_stop, absl::Duration tick, Poll poll = nullptr,
             Input input = {});
  // Queues `op`. After Stop() began, ops are dropped. `key` (not 0) says
  // the op touches the work of one stream only (TurnQueue).
  void Post(Op op, uint64_t key = 0);
  // Runs what is queued (in the TurnQueue's order), then `on_stop`, and
  // joins the thread. Idempotent.
  void Stop();
  bool OnExecutorThread() const;

 private:
  void Loop(Op on_start, Op on_tick, Op on_stop, absl::Duration tick, Poll poll, Input input);
  // Waits (mu_ held on entry and exit) until work is queued, `input` is
  // readable or `wait` has passed.
  void WaitIdle(absl::Duration wait, const Input& input) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves what was posted into `ready`.
  void TakePosted(TurnQueue* ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string name_;
  absl::Mutex mu_;
  std::deque<std::pair<uint64_t, Op>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // With an Input: an eventfd that Post() signals while the loop sleeps.
  int wake_fd_ = -1;
  bool sleeping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
  std::thread::id thread_id_;
};

}  // namespace gpuexec::device

#endif  // GPUEXEC_SERVER_DEVICE_EXECUTOR_H_
