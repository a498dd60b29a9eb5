#ifndef GPUEXEC_SERVER_DEVICE_EXECUTOR_H_
#define GPUEXEC_SERVER_DEVICE_EXECUTOR_H_

// One thread that runs operations in the order they were posted, except
// that the operations of different streams take turns (TurnQueue). A
// Device owns one: its context is made current on that thread once, and
// every driver call of that device runs there. Operations must not block;
// the executor wakes at least every `tick` to run the idle hook (the device
// uses it to look for faults that left completions pending).

#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/port/types.h"

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
// such as a module load), which runs after everything posted before it
// and before everything after. Between two such, turns go round on two
// levels: groups (a tenant's streams; TurnKeys) take turns, an operation
// each, and within a group its keys take the group's turns in turn. In a
// worker that tenants share, one tenant's burst of launches makes another
// tenant's launch wait for one of them, not for all, however many
// sessions the first has busy; and one session's burst makes another
// session of the same tenant wait for a turn of it, not for all. A key's
// operations must touch its own stream's work only: a session has one
// stream, and nothing of one session's (buffers, regions, graphs) is
// another's. Not thread-safe.
class TurnQueue {
 public:
  using Op = std::function<void()>;
  // `key` 0: an operation of no one stream (`group` unused).
  void Push(uint64_t group, uint64_t key, Op op);
  void Push(uint64_t key, Op op) { Push(key, key, std::move(op)); }  // a group of its own
  Op Pop();                                                          // the next to run; not empty()
  bool empty() const { return segments_.empty(); }
  size_t size() const { return size_; }

 private:
  // Operations with keys between two without, or one without. The keys'
  // state is made only for the former: an operation without a key (every
  // one, with turns off) costs no deque or map of its own. The state is
  // reused from one keyed segment to the next (spare_), with the (empty)
  // queues of up to kKeptKeys keys and groups: `of_key` and `of_group`
  // hold empty ones too; `turns` lists only the groups with operations,
  // a group's `turns` only its keys with operations.
  struct Group {
    std::deque<uint64_t> turns;  // its keys with operations, in turn
    uint64_t last_key = 0;       // of its keys, the one that ran last
  };
  struct Keyed {
    std::deque<uint64_t> turns;  // the groups with operations, in turn
    absl::flat_hash_map<uint64_t, Group> of_group;
    absl::flat_hash_map<uint64_t, std::deque<Op>> of_key;
  };
  struct Segment {
    Op unkeyed;                    // where `keyed` is null
    std::unique_ptr<Keyed> keyed;  // null: one operation without a key
  };
  std::deque<Segment> segments_;
  std::unique_ptr<Keyed> spare_;  // the last keyed segment's state, for the next
  size_t size_ = 0;
  uint64_t last_group_ = 0;  // the group of the op popped last
};

// The key of operations that only release what completions held (events
// going back to their spares): no tenant's, no stream's, and no key
// TurnKeys gives.
inline constexpr uint64_t kReleaseTurn = uint64_t{1} << 62;

// The turn each stream's operations take in a TurnQueue: a key of the
// stream's own, in its tenant's group where the stream's owner shares its
// tenant's turns (a named tenant: all its sessions share one turn among
// the tenants, so that more sessions buy no more of them), else in a
// group of its own (a session of the implicit tenant, whose callers are no
// one group). A stream has its group from Add, before any of its
// operations is posted, until Remove; the tenant's group goes with its
// last stream. Thread-safe.
class TurnKeys {
 public:
  struct Turn {
    uint64_t group = 0;
    uint64_t key = 0;  // never 0
  };
  void Add(uint64_t stream, const port::StreamOwner& owner);
  void Remove(uint64_t stream);
  Turn Of(uint64_t stream) const;

 private:
  struct Tenant {
    uint64_t group = 0;
    size_t streams = 0;
  };
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::string> tenant_of_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, uint64_t> group_of_ ABSL_GUARDED_BY(mu_);
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
  void Post(Op op, uint64_t key = 0) { Post(std::move(op), key, key); }
  // In `group`'s turns (TurnQueue).
  void Post(Op op, uint64_t key, uint64_t group);
  // Runs what is queued (in the TurnQueue's order), then `on_stop`, and
  // joins the thread. Idempotent.
  void Stop();
  bool OnExecutorThread() const;
  // Operations posted and not yet run, and operations run since the start
  // (any thread; a moment's view).
  size_t backlog() const { return backlog_.load(std::memory_order_relaxed); }
  uint64_t ran() const { return ran_.load(std::memory_order_relaxed); }

 private:
  void Loop(Op on_start, Op on_tick, Op on_stop, absl::Duration tick, Poll poll, Input input);
  // Waits (mu_ held on entry and exit) until work is queued, `input` is
  // readable or `wait` has passed.
  void WaitIdle(absl::Duration wait, const Input& input) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves what was posted into `ready`.
  void TakePosted(TurnQueue* ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string name_;
  absl::Mutex mu_;
  struct Posted {
    uint64_t group;
    uint64_t key;
    Op op;
  };
  std::deque<Posted> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // With an Input: an eventfd that Post() signals while the loop sleeps.
  int wake_fd_ = -1;
  bool sleeping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
  std::thread::id thread_id_;
  std::atomic<size_t> backlog_{0};
  std::atomic<uint64_t> ran_{0};
};

}  // namespace gpuexec::device

#endif  // GPUEXEC_SERVER_DEVICE_EXECUTOR_H_
