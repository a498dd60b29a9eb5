#include "internal/command_ring.h"

#include <linux/futex.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gpuexec/command_ring.h"
#include "internal/ring_encode.h"

namespace gpuexec {
namespace internal {
namespace {

namespace h = ring::header;

// The longest a waiting thread sleeps before it looks at the lifeline and
// the ring's state again.
constexpr absl::Duration kParkLimit = absl::Milliseconds(100);
// A spinning thread reads the clock once every this many looks at the ring.
constexpr uint32_t kLooksPerClockRead = 16;
// Ids answered in the answer area kept to drop a second answer: more than
// a worker could have posted between its last reply and its end.
constexpr size_t kDirectKept = 1024;

long Futex(void* word, int op, uint32_t value, const timespec* timeout) {
  // Shared with the daemon's process: no FUTEX_PRIVATE_FLAG.
  return syscall(SYS_futex, word, op, value, timeout, nullptr, 0);
}

void Pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

v1::CommandResult CommandRing::ToResult(uint64_t id, const Result& r) {
  v1::CommandResult out;
  out.set_id(id);
  out.set_code(r.code);
  out.set_message(r.message);
  if (r.kind == ring::kAllocate && r.code == 0) {
    out.mutable_allocate()->set_buffer(r.value0);
    out.mutable_allocate()->set_size(r.value1);
  } else if (r.kind == ring::kEndGraph && r.code == 0) {
    out.mutable_end_graph()->set_graph(r.value0);
    out.mutable_end_graph()->set_nodes(static_cast<uint32_t>(r.value1));
    out.mutable_end_graph()->set_instantiate_ns(r.gpu_time_ns);
  } else if (r.kind == ring::kSynchronize || r.kind == ring::kLaunch ||
             r.kind == ring::kLaunchGraph) {
    out.set_gpu_time_ns(r.gpu_time_ns);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<CommandRing>> CommandRing::Open(const Options& options) {
  std::unique_ptr<CommandRing> r(new CommandRing());
  r->sq_bytes_ = options.submission_bytes;
  r->cq_bytes_ = options.completion_bytes;
  r->aq_bytes_ = options.answer_bytes;
  r->bytes_ = ring::kHeaderBytes + r->sq_bytes_ + r->cq_bytes_ + r->aq_bytes_;
  r->spin_wait_ = options.spin_wait;
  r->daemon_socket_ = options.socket_path;
  auto fd = MakeRegionFd(r->bytes_);
  if (!fd.ok()) return fd.status();
  auto mapped = MapRegionFd(fd->get(), r->bytes_);
  if (!mapped.ok()) return mapped.status();
  r->base_ = static_cast<unsigned char*>(*mapped);
  ring::Store<uint64_t>(r->base_, h::kMagic, ring::kMagic);
  ring::Store<uint32_t>(r->base_, h::kVersion, ring::kVersion);
  ring::Store<uint32_t>(r->base_, h::kHeaderBytes, ring::kHeaderBytes);
  ring::Store<uint64_t>(r->base_, h::kSqOffset, ring::kHeaderBytes);
  ring::Store<uint64_t>(r->base_, h::kSqBytes, r->sq_bytes_);
  ring::Store<uint64_t>(r->base_, h::kCqOffset, ring::kHeaderBytes + r->sq_bytes_);
  ring::Store<uint64_t>(r->base_, h::kCqBytes, r->cq_bytes_);
  ring::Store<uint32_t>(r->base_, h::kSlotBytes, ring::kSlot);
  if (r->aq_bytes_ != 0) {
    ring::Store<uint32_t>(r->base_, h::kFlags, ring::kAnswerArea);
    ring::Store<uint64_t>(r->base_, h::kAqOffset, ring::kHeaderBytes + r->sq_bytes_ + r->cq_bytes_);
    ring::Store<uint64_t>(r->base_, h::kAqBytes, r->aq_bytes_);
  }

  v1::RegisterRegionRequest request;
  request.set_session(options.token);
  request.set_bytes(r->bytes_);
  v1::CommandRingRequest* c = request.mutable_command_ring();
  c->set_layout_version(r->aq_bytes_ != 0 ? ring::kAnswerAreaVersion : ring::kVersion);
  c->set_submission_bytes(r->sq_bytes_);
  c->set_completion_bytes(r->cq_bytes_);
  c->set_answer_bytes(r->aq_bytes_);
  // A client that dies ends its session at once rather than at its lease.
  c->set_close_session_on_hangup(true);
  auto answer =
      RegisterOnSocket(options.socket_path, request, fd->get(), options.timeout, &r->lifeline_);
  if (!answer.ok()) return answer.status();
  if (!answer->has_command_ring() || answer->command_ring().ring() == 0) {
    return absl::DataLossError(absl::StrCat("gpuexec client: the daemon's host memory socket ",
                                            options.socket_path,
                                            " answered a command ring's registration without a "
                                            "ring (a daemon that does not serve them)"));
  }
  r->number_ = answer->command_ring().ring();
  // The registration's answer bounds what follows: its socket is the
  // lifeline now, read only for its end.
  const timeval none{};
  setsockopt(r->lifeline_.get(), SOL_SOCKET, SO_RCVTIMEO, &none, sizeof(none));
  return r;
}

CommandRing::~CommandRing() {
  // The lifeline closes with lifeline_: the daemon stops serving the ring.
  if (base_ != nullptr) munmap(base_, bytes_);
}

uint64_t CommandRing::Load64(size_t offset) const {
  return ring::Load<uint64_t>(base_, offset, __ATOMIC_SEQ_CST);
}

void CommandRing::WakeDaemon() {
  if (ring::Load<uint32_t>(base_, h::kDaemonWait, __ATOMIC_SEQ_CST) != 0 &&
      ring::Exchange<uint32_t>(base_, h::kDaemonWait, 0) != 0) {
    Futex(base_ + h::kDaemonWait, FUTEX_WAKE, 1, nullptr);
  }
}

absl::StatusOr<v1::CommandResult> CommandRing::Submit(const v1::Command& command, bool wait,
                                                      absl::Duration timeout, bool report_deferred,
                                                      bool* not_carried) {
  *not_carried = false;
  const absl::Time deadline =
      timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  if (!broken_.ok()) return broken_;
  const uint64_t id = next_id_;
  // The record carries the ring's own id; a waited command asks for its
  // answer as the stream's do.
  if (!EncodeRecord(command, id, wait || command.reply(), seq_, &record_).ok()) {
    *not_carried = true;
    return v1::CommandResult();
  }
  ++next_id_;
  if (wait) awaited_.insert(id);
  if (absl::Status st = PostLocked(deadline); !st.ok()) {
    awaited_.erase(id);
    return st;
  }
  if (!wait) {
    last_unwaited_ = id;
    return v1::CommandResult();
  }
  for (;;) {
    if (auto it = results_.find(id); it != results_.end()) {
      const Result r = std::move(it->second);
      results_.erase(it);
      awaited_.erase(id);
      ordered_through_ = std::max(ordered_through_, id);
      if (r.code != 0) return absl::Status(static_cast<absl::StatusCode>(r.code), r.message);
      if (report_deferred && !deferred_.ok()) return std::exchange(deferred_, absl::OkStatus());
      return ToResult(command.id(), r);
    }
    if (!broken_.ok()) {
      awaited_.erase(id);
      return broken_;
    }
    if (absl::Now() >= deadline) {
      awaited_.erase(id);
      abandoned_.insert(id);
      return absl::DeadlineExceededError(absl::StrCat(
          "gpuexec client: no answer from the daemon within ", absl::FormatDuration(timeout),
          " on the session's command ring (work the daemon had received goes on)"));
    }
    PollLocked(deadline, /*head=*/false);
  }
}

absl::Status CommandRing::PostLocked(absl::Time deadline) {
  const uint64_t bytes = record_.size();
  for (;;) {
    const uint64_t to_end = sq_bytes_ - tail_ % sq_bytes_;
    const uint64_t need = bytes + (bytes > to_end ? to_end : 0);
    const uint64_t head = Load64(h::kSqHead);
    if (head > tail_) {
      BreakLocked(absl::DataLossError(absl::StrCat("gpuexec client: the daemon's submission head ",
                                                   head, " is past the ring's tail ", tail_,
                                                   " (command ring ", number_, ")")));
    }
    if (!broken_.ok()) return broken_;
    if (tail_ + need - head <= sq_bytes_) {
      if (bytes > to_end) {
        std::string pad;
        (void)EncodePad(static_cast<uint32_t>(to_end / ring::kSlot), &pad);
        ring::CopyIn(base_ + ring::kHeaderBytes + tail_ % sq_bytes_, pad.data(), pad.size());
        tail_ += to_end;
      }
      ring::CopyIn(base_ + ring::kHeaderBytes + tail_ % sq_bytes_, record_.data(), bytes);
      tail_ += bytes;
      ++seq_;
      ring::Store<uint64_t>(base_, h::kSqTail, tail_, __ATOMIC_SEQ_CST);
      WakeDaemon();
      return absl::OkStatus();
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "gpuexec client: the session's command ring had no room for a command within the "
          "call's timeout (the daemon has not started the ",
          (tail_ - head) / ring::kSlot, " slots of commands before it)"));
    }
    PollForHeadLocked(deadline);
  }
}

void CommandRing::PollForHeadLocked(absl::Time deadline) {
  head_waiters_.fetch_add(1);
  PollLocked(deadline);
  head_waiters_.fetch_sub(1);
}

void CommandRing::PollLocked(absl::Time deadline, bool head) {
  if (polling_) {
    // Another thread waits on the ring: wait for its round.
    struct Round {
      CommandRing* ring;
      uint64_t seen;
    } round{this, poll_rounds_};
    mu_.AwaitWithDeadline(absl::Condition(
                              +[](Round* r) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                return r->ring->poll_rounds_ != r->seen;
                              },
                              &round),
                          std::min(deadline, absl::Now() + kParkLimit));
    return;
  }
  polling_ = true;
  const uint64_t cq_seen = cq_head_;
  const uint64_t aq_seen = aq_head_;
  const uint64_t sq_seen = Load64(h::kSqHead);
  auto progressed = [&] {
    return Load64(h::kCqTail) != cq_seen || (aq_bytes_ != 0 && Load64(h::kAqTail) != aq_seen) ||
           ring::Load<uint32_t>(base_, h::kState) != ring::kOpen ||
           ((head || head_waiters_.load(std::memory_order_relaxed) != 0) &&
            Load64(h::kSqHead) != sq_seen);
  };
  mu_.Unlock();
  bool moved = false;
  if (spin_wait_ > absl::ZeroDuration()) {
    // A look after every pause: a pause is 10-150 cycles with the core, so
    // looking only every 64 of them put up to a few microseconds between
    // the daemon's answer and this thread's seeing it. The clock is read
    // less often.
    const absl::Time until = std::min(deadline, absl::Now() + spin_wait_);
    for (uint32_t i = 1; !(moved = progressed()); ++i) {
      if (i % kLooksPerClockRead == 0 && absl::Now() >= until) break;
      Pause();
    }
  }
  if (!moved) {
    const absl::Time until = std::min(deadline, absl::Now() + kParkLimit);
    while (true) {
      // The flag first, then a last look: a daemon that posts after the
      // look sees the flag and wakes this thread.
      ring::Store<uint32_t>(base_, h::kClientWait, 1, __ATOMIC_SEQ_CST);
      if (progressed()) break;
      const absl::Duration left = until - absl::Now();
      if (left <= absl::ZeroDuration()) break;
      const timespec ts = absl::ToTimespec(std::max(left, absl::Microseconds(1)));
      Futex(base_ + h::kClientWait, FUTEX_WAIT, 1, &ts);
      // Woken by what it does not wait for (the head's move): park again.
      if (head || head_waiters_.load(std::memory_order_relaxed) != 0) break;
    }
    ring::Store<uint32_t>(base_, h::kClientWait, 0, __ATOMIC_SEQ_CST);
  }
  mu_.Lock();
  polling_ = false;
  ++poll_rounds_;
  DrainLocked();
  // A round that saw nothing move is the one that asks whether the daemon
  // is still there.
  if (!moved) CheckClosedLocked(/*lifeline=*/true);
}

void CommandRing::DrainLocked() {
  if (!broken_.ok()) return;
  TakeCompletionsLocked();
  if (!broken_.ok()) return;
  // Room in the completion ring is what a daemon waits for only while
  // records are left to start (it parks for room before taking one); one
  // that took them all waits for records, and the next post wakes it.
  // The flag first: the daemon writes it only when it parks, so it is
  // usually in this core's cache, where the submission head the daemon
  // moved since the last look is not (TakeCompletionsLocked's cq_head
  // store was a full barrier, so this load sees a park that began before
  // it).
  if (ring::Load<uint32_t>(base_, h::kDaemonWait, __ATOMIC_SEQ_CST) != 0 &&
      Load64(h::kSqHead) < tail_) {
    WakeDaemon();
  }
  CheckClosedLocked(/*lifeline=*/false);
}

void CommandRing::TakeCompletionsLocked() {
  // The answer area's tail before the completion ring's: a failure the
  // daemon posted before a later command reached the worker is in the
  // completion ring by the time that command's answer is in the area.
  const uint64_t aq_tail = aq_bytes_ != 0 ? Load64(h::kAqTail) : 0;
  const uint64_t tail = Load64(h::kCqTail);
  if (tail < cq_head_ || tail - cq_head_ > cq_bytes_ || tail % ring::kSlot != 0) {
    return BreakLocked(absl::DataLossError(
        absl::StrCat("gpuexec client: the daemon's completion tail ", tail,
                     " is out of bounds (head ", cq_head_, ", command ring ", number_, ")")));
  }
  const unsigned char* cq = base_ + ring::kHeaderBytes + sq_bytes_;
  while (cq_head_ < tail) {
    const uint64_t at = cq_head_ % cq_bytes_;
    ring::CompleteHead head;
    ring::CopyOut(&head, cq + at, sizeof(head));
    const uint64_t size = uint64_t{head.slots} * ring::kSlot;
    if (head.slots == 0 || size > cq_bytes_ - at || size > tail - cq_head_) {
      return BreakLocked(absl::DataLossError(
          absl::StrCat("gpuexec client: a completion at ", cq_head_, " of command ring ", number_,
                       " takes ", head.slots, " slots, past what the daemon posted")));
    }
    cq_head_ += size;
    if (head.kind == ring::kPad) continue;
    Result r;
    r.code = head.code;
    r.kind = head.kind;
    r.gpu_time_ns = head.gpu_time_ns;
    r.value0 = head.value0;
    r.value1 = head.value1;
    const uint64_t n = std::min<uint64_t>(
        {head.message_bytes, ring::kMaxMessageBytes, size - ring::kCompleteHeadBytes});
    r.message.assign(reinterpret_cast<const char*>(cq + at + ring::kCompleteHeadBytes), n);
    TakeResultLocked(head.id, std::move(r), /*direct=*/false);
  }
  ring::Store<uint64_t>(base_, h::kCqHead, cq_head_, __ATOMIC_SEQ_CST);
  if (aq_bytes_ == 0 || aq_tail == aq_head_) return;
  if (aq_tail < aq_head_ || aq_tail - aq_head_ > aq_bytes_ || aq_tail % ring::kSlot != 0) {
    return BreakLocked(absl::DataLossError(
        absl::StrCat("gpuexec client: the daemon's answer area tail ", aq_tail,
                     " is out of bounds (head ", aq_head_, ", command ring ", number_, ")")));
  }
  const unsigned char* aq = base_ + ring::kHeaderBytes + sq_bytes_ + cq_bytes_;
  for (; aq_head_ < aq_tail; aq_head_ += ring::kSlot) {
    ring::CompleteHead head;
    ring::CopyOut(&head, aq + aq_head_ % aq_bytes_, sizeof(head));
    if (head.slots != 1 || head.code != 0) {
      return BreakLocked(absl::DataLossError(absl::StrCat(
          "gpuexec client: an answer at ", aq_head_, " of command ring ", number_,
          " is not a success of one slot (", head.slots, " slots, code ", head.code, ")")));
    }
    Result r;
    r.kind = head.kind;
    r.gpu_time_ns = head.gpu_time_ns;
    TakeResultLocked(head.id, std::move(r), /*direct=*/true);
  }
  ring::Store<uint64_t>(base_, h::kAqHead, aq_head_, __ATOMIC_SEQ_CST);
}

void CommandRing::TakeResultLocked(uint64_t id, Result r, bool direct) {
  if (direct) {
    // Answered in the completion ring already (taken just before): the
    // first answer counts.
    if (results_.contains(id)) return;
    if (direct_.insert(id).second) direct_order_.push_back(id);
    if (direct_order_.size() > kDirectKept) {
      direct_.erase(direct_order_.front());
      direct_order_.pop_front();
    }
  } else if (direct_.erase(id) != 0) {
    return;  // answered in the answer area already: the first answer counts
  }
  if (awaited_.contains(id)) {
    results_[id] = std::move(r);
  } else if (abandoned_.erase(id) == 0 && r.code != 0 && deferred_.ok()) {
    deferred_ = absl::Status(static_cast<absl::StatusCode>(r.code), r.message);
  }
}

void CommandRing::CheckClosedLocked(bool lifeline) {
  if (!broken_.ok()) return;
  if (ring::Load<uint32_t>(base_, h::kState) != ring::kOpen) {
    // The daemon posts a ring's last answers before it says closed: those
    // posted after this round loaded the completion tail are taken now,
    // so that a waiting command gets its answer rather than the close.
    TakeCompletionsLocked();
    if (!broken_.ok()) return;
    const uint32_t n =
        std::min(ring::Load<uint32_t>(base_, h::kCloseMessageBytes), ring::kMaxMessageBytes);
    std::string message(reinterpret_cast<const char*>(base_ + h::kCloseMessage), n);
    int32_t code = ring::Load<int32_t>(base_, h::kCloseCode);
    if (code <= 0 || code > 16) code = static_cast<int32_t>(absl::StatusCode::kUnavailable);
    return BreakLocked(absl::Status(static_cast<absl::StatusCode>(code), message));
  }
  if (!lifeline) return;
  pollfd p{lifeline_.get(), POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) > 0) {
    BreakLocked(absl::UnavailableError(absl::StrCat(
        "gpuexec client: the daemon's host memory socket ", daemon_socket_,
        " ended the command ring's connection (the daemon went away or stopped serving it)")));
  }
}

void CommandRing::BreakLocked(absl::Status why) {
  if (!broken_.ok()) return;
  broken_ = std::move(why);
  if (last_unwaited_ > ordered_through_ && deferred_.ok()) {
    deferred_ = absl::AbortedError(absl::StrCat(
        "gpuexec client: launches queued without waiting may not have run: ", broken_.message()));
  }
}

absl::Status CommandRing::Order(absl::Duration timeout) {
  const absl::Time deadline =
      timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  const uint64_t through = tail_;
  while (Load64(h::kSqHead) < through) {
    if (!broken_.ok()) return broken_;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("gpuexec client: the daemon did not start the session's earlier commands "
                       "within ",
                       absl::FormatDuration(timeout), " (command ring ", number_, ")"));
    }
    PollForHeadLocked(deadline);
  }
  ordered_through_ = std::max(ordered_through_, last_unwaited_);
  return absl::OkStatus();
}

absl::Status CommandRing::TakeDeferred() {
  absl::MutexLock lock(&mu_);
  return std::exchange(deferred_, absl::OkStatus());
}

absl::Status CommandRing::broken() const {
  absl::MutexLock lock(&mu_);
  return broken_;
}

void CommandRing::Shutdown() {
  absl::MutexLock lock(&mu_);
  BreakLocked(absl::FailedPreconditionError("gpuexec client: the session is closed"));
}

}  // namespace internal
}  // namespace gpuexec
