#include "server/device/executor.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "server/common/cpu_relax.h"
#include "server/common/thread_name.h"

namespace gpuexec::device {
namespace {

// The most ops a turn of the loop runs before it polls the GPU's events
// (as many as one read of the input takes in).
constexpr size_t kTurnOps = 256;
// Between a turn's ops, new input is read only while fewer than this many
// ops wait: what is not read stays in the input, which the front bounds
// (--worker_queue_bytes), not in this process's memory.
constexpr size_t kReadAhead = 256;
// Every this many ops of a turn, what is done is sent (input.flush), so
// that answers do not wait for a long turn's end.
constexpr size_t kFlushEvery = 32;
// The most keys whose (empty) queues a TurnQueue keeps between segments.
constexpr size_t kKeptKeys = 64;
// While it looks for new input or the GPU's events without sleeping, the
// loop pauses this many times between looks, and yields its core once
// every kYieldEvery looks (to another thread of the host that wants it).
constexpr int kPausesPerLook = 4;
constexpr uint32_t kYieldEvery = 16;

}  // namespace

void TurnQueue::Push(uint64_t group, uint64_t key, Op op) {
  ++size_;
  if (key == 0) {
    segments_.emplace_back().unkeyed = std::move(op);
    return;
  }
  if (segments_.empty() || segments_.back().keyed == nullptr) {
    segments_.emplace_back().keyed =
        spare_ != nullptr ? std::move(spare_) : std::make_unique<Keyed>();
  }
  Keyed& s = *segments_.back().keyed;
  std::deque<Op>& ops = s.of_key[key];
  if (ops.empty()) {
    Group& g = s.of_group[group];
    if (g.turns.empty()) s.turns.push_back(group);
    g.turns.push_back(key);
  }
  ops.push_back(std::move(op));
}

namespace {

// Puts `turns`' front at its back where it is the one that ran last: it
// had its turn, though it had run out of work then and came back behind
// none.
void PassIfItRanLast(std::deque<uint64_t>& turns, uint64_t last) {
  if (turns.size() > 1 && turns.front() == last) {
    turns.push_back(turns.front());
    turns.pop_front();
  }
}

}  // namespace

TurnQueue::Op TurnQueue::Pop() {
  --size_;
  Op op;
  if (segments_.front().keyed == nullptr) {
    op = std::move(segments_.front().unkeyed);
    last_group_ = 0;
    segments_.pop_front();
    return op;
  }
  Keyed& s = *segments_.front().keyed;
  PassIfItRanLast(s.turns, last_group_);
  const uint64_t group = s.turns.front();
  last_group_ = group;
  s.turns.pop_front();
  Group& g = s.of_group[group];
  PassIfItRanLast(g.turns, g.last_key);
  const uint64_t key = g.turns.front();
  g.last_key = key;
  g.turns.pop_front();
  auto it = s.of_key.find(key);
  op = std::move(it->second.front());
  it->second.pop_front();
  // A key out of operations keeps its (empty) queue: a client that waits
  // for each answer empties it at every operation, and would otherwise
  // pay a queue's allocations for each. Each goes behind the others of
  // its level: the key in its group, the group among the groups.
  if (!it->second.empty()) g.turns.push_back(key);
  if (!g.turns.empty()) s.turns.push_back(group);
  if (s.turns.empty()) {
    // Kept for the next keyed segment, with the queues of its keys unless
    // they are many.
    if (s.of_key.size() > kKeptKeys) s.of_key.clear();
    if (s.of_group.size() > kKeptKeys) s.of_group.clear();
    spare_ = std::move(segments_.front().keyed);
    segments_.pop_front();
  }
  return op;
}

void TurnKeys::Add(uint64_t stream, const port::StreamOwner& owner) {
  // A session of no named tenant is a group of its own.
  if (!owner.shares_turns) return;
  absl::MutexLock lock(&mu_);
  if (group_of_.contains(stream)) return;
  Tenant& t = tenants_[owner.tenant];
  if (t.streams++ == 0) t.group = next_++;
  group_of_[stream] = t.group;
  tenant_of_[stream] = owner.tenant;
}

void TurnKeys::Remove(uint64_t stream) {
  absl::MutexLock lock(&mu_);
  auto it = tenant_of_.find(stream);
  if (it == tenant_of_.end()) return;
  auto t = tenants_.find(it->second);
  if (--t->second.streams == 0) tenants_.erase(t);
  tenant_of_.erase(it);
  group_of_.erase(stream);
}

TurnKeys::Turn TurnKeys::Of(uint64_t stream) const {
  // A stream's own key has the top bit set; tenants' groups count up from
  // 1, so a stream alone is a group no tenant's can be.
  const uint64_t own = (uint64_t{1} << 63) | stream;
  absl::MutexLock lock(&mu_);
  auto it = group_of_.find(stream);
  return Turn{it != group_of_.end() ? it->second : own, own};
}

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

void Executor::Post(Op op, uint64_t key, uint64_t group) {
  bool wake;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    backlog_.fetch_add(1, std::memory_order_relaxed);
    queue_.push_back(Posted{group, key, std::move(op)});
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

void Executor::TakePosted(TurnQueue* ready) {
  for (Posted& p : queue_) ready->Push(p.group, p.key, std::move(p.op));
  queue_.clear();
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
  TurnQueue ready;  // posted, in the order to run
  PollBackoff backoff;
  absl::Time last_tick = absl::Now();
  absl::Time last_work = absl::InfinitePast();
  uint32_t looks = 0;  // passes that looked again without sleeping
  while (true) {
    absl::Duration wait = tick;
    const bool busy_polling =
        input.busy_poll > absl::ZeroDuration() && absl::Now() - last_work < input.busy_poll;
    if (busy_polling) wait = absl::ZeroDuration();
    if (backoff.pending()) wait = backoff.Pause(absl::Now());
    bool stop = false;
    if (ready.size() >= kReadAhead) {
      // A turn left this many: what is unread waits in the input.
      if (input.flush) input.flush();
    } else if (input.on_readable) {
      // Reads what has arrived; its requests are queued for this loop.
      input.on_readable();
    }
    {
      absl::MutexLock lock(&mu_);
      if (wait != absl::ZeroDuration() && queue_.empty() && ready.empty() && !stopping_) {
        WaitIdle(wait, input);
      }
      TakePosted(&ready);
      if (ready.empty() && stopping_) stop = true;  // stopping and drained
    }
    if (stop) break;
    if (!ready.empty()) {
      last_work = absl::Now();
      backoff.Worked(last_work);
    }
    // A turn: what was ready, and what arrives meanwhile (read between
    // ops while few wait, so that another stream's op can take its turn
    // before the rest of a burst), up to kTurnOps before the GPU's events
    // are polled; answers are sent every kFlushEvery ops.
    for (size_t ran = 1; !ready.empty(); ++ran) {
      ready.Pop()();
      backlog_.fetch_sub(1, std::memory_order_relaxed);
      // This thread alone writes it: a plain store, no locked instruction.
      ran_.store(ran_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      if (ready.empty() || ran == kTurnOps) break;
      if (ran % kFlushEvery == 0 && input.flush) input.flush();
      if (ready.size() < kReadAhead && input.between_ops) input.between_ops();
      // Only where something was posted since (a moment's view: what it
      // misses is taken at the next op or the turn's end).
      if (backlog_.load(std::memory_order_relaxed) > ready.size()) {
        absl::MutexLock lock(&mu_);
        TakePosted(&ready);
      }
    }
    if (poll) {
      backoff.Polled(poll(), absl::Now());
      // What the poll finished (a Synchronize's answer) goes now, not after
      // the pause below.
      if (input.flush) input.flush();
    }
    const bool polling = backoff.pending();
    if (!polling && on_tick && absl::Now() - last_tick >= tick) {
      last_tick = absl::Now();
      on_tick();
    } else if ((polling || busy_polling) && wait == absl::ZeroDuration()) {
      // Looking again soon: a few pauses between looks, the core yielded
      // once every kYieldEvery (a yield is a system call, a microsecond
      // or so that every look paid when each yielded).
      if (++looks % kYieldEvery == 0) {
        std::this_thread::yield();
      } else {
        for (int i = 0; i < kPausesPerLook; ++i) CpuRelax();
      }
    }
  }
  if (on_stop) on_stop();
}

}  // namespace gpuexec::device
