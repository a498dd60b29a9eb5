#include "server/shm/command_ring_view.h"

#include <errno.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gpuexec::shm {
namespace {

namespace h = ring::header;

static_assert(__atomic_always_lock_free(8, 0),
              "the command ring needs lock-free 64-bit atomics across processes");

// The futex words are shared with another process: no FUTEX_PRIVATE_FLAG.
long Futex(void* word, int op, uint32_t value, const timespec* timeout) {
  return syscall(SYS_futex, word, op, value, timeout, nullptr, 0);
}

// "<cause>: the command ring's header has <field> <value>, expected
// <expected>".
absl::Status Refuse(absl::string_view cause, absl::string_view field, uint64_t value,
                    absl::string_view expected) {
  return absl::InvalidArgumentError(absl::StrCat(cause, ": the command ring's header has ", field,
                                                 " ", value, ", expected ", expected));
}

// The header's first line, as the client wrote it (copied once).
struct Identity {
  uint64_t magic;
  uint32_t version;
  uint32_t header_bytes;
  uint64_t sq_offset;
  uint64_t sq_bytes;
  uint64_t cq_offset;
  uint64_t cq_bytes;
  uint32_t slot_bytes;
  uint32_t flags;
  uint64_t unused;
};
static_assert(sizeof(Identity) == 64);
static_assert(offsetof(Identity, version) == h::kVersion &&
              offsetof(Identity, header_bytes) == h::kHeaderBytes &&
              offsetof(Identity, sq_offset) == h::kSqOffset &&
              offsetof(Identity, sq_bytes) == h::kSqBytes &&
              offsetof(Identity, cq_offset) == h::kCqOffset &&
              offsetof(Identity, cq_bytes) == h::kCqBytes &&
              offsetof(Identity, slot_bytes) == h::kSlotBytes &&
              offsetof(Identity, flags) == h::kFlags);

}  // namespace

absl::StatusOr<std::unique_ptr<CommandRingView>> CommandRingView::Open(void* base, size_t bytes,
                                                                       uint64_t sq_bytes,
                                                                       uint64_t cq_bytes,
                                                                       uint64_t aq_bytes) {
  // The request first: it bounds what is read below.
  if (!ring::PowerOfTwoWithin(sq_bytes, ring::kMinSubmissionBytes, ring::kMaxSubmissionBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad submission ring size: ", sq_bytes, " bytes requested, expected a power of two from ",
        ring::kMinSubmissionBytes, " to ", ring::kMaxSubmissionBytes));
  }
  if (!ring::PowerOfTwoWithin(cq_bytes, ring::kMinCompletionBytes, ring::kMaxCompletionBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad completion ring size: ", cq_bytes, " bytes requested, expected a power of two from ",
        ring::kMinCompletionBytes, " to ", ring::kMaxCompletionBytes));
  }
  if (aq_bytes != 0 &&
      !ring::PowerOfTwoWithin(aq_bytes, ring::kMinAnswerBytes, ring::kMaxAnswerBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad answer area size: ", aq_bytes,
                     " bytes requested, expected 0 (none) or a power of two from ",
                     ring::kMinAnswerBytes, " to ", ring::kMaxAnswerBytes));
  }
  const uint64_t want = ring::kHeaderBytes + sq_bytes + cq_bytes + aq_bytes;
  if (bytes != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "wrong mapping size: the command ring's mapping has ", bytes, " bytes, expected ",
        ring::kHeaderBytes, " + ", sq_bytes, " + ", cq_bytes, " + ", aq_bytes, " = ", want));
  }
  if (base == nullptr || reinterpret_cast<uintptr_t>(base) % 8 != 0) {
    return absl::InvalidArgumentError(
        "misaligned mapping: the command ring's mapping must start 8-aligned");
  }
  Identity id;
  ring::CopyOut(&id, base, sizeof(id));
  if (id.magic != ring::kMagic) {
    return absl::InvalidArgumentError(absl::StrCat(
        "not a command ring: the command ring's header has magic 0x", absl::Hex(id.magic),
        ", expected 0x", absl::Hex(ring::kMagic), " (\"GXRING1\")"));
  }
  if (id.version != ring::kVersion) {
    return Refuse("unsupported layout", "version", id.version, absl::StrCat(ring::kVersion));
  }
  if (id.header_bytes != ring::kHeaderBytes) {
    return Refuse("wrong header size", "header_bytes", id.header_bytes,
                  absl::StrCat(ring::kHeaderBytes));
  }
  if (id.sq_offset != ring::kHeaderBytes) {
    return Refuse("misplaced submission ring", "sq_offset", id.sq_offset,
                  absl::StrCat(ring::kHeaderBytes));
  }
  if (id.sq_bytes != sq_bytes) {
    return Refuse("submission ring size differs from the request", "sq_bytes", id.sq_bytes,
                  absl::StrCat(sq_bytes, " (the registration's submission_bytes)"));
  }
  if (id.cq_offset != ring::kHeaderBytes + sq_bytes) {
    return Refuse(
        "misplaced completion ring", "cq_offset", id.cq_offset,
        absl::StrCat(ring::kHeaderBytes, " + sq_bytes = ", ring::kHeaderBytes + sq_bytes));
  }
  if (id.cq_bytes != cq_bytes) {
    return Refuse("completion ring size differs from the request", "cq_bytes", id.cq_bytes,
                  absl::StrCat(cq_bytes, " (the registration's completion_bytes)"));
  }
  if (id.slot_bytes != ring::kSlot) {
    return Refuse("wrong slot size", "slot_bytes", id.slot_bytes, absl::StrCat(ring::kSlot));
  }
  const uint32_t flags = aq_bytes != 0 ? ring::kAnswerArea : 0;
  if (id.flags != flags) {
    return Refuse(aq_bytes != 0 ? "no answer area flagged for the one registered"
                                : "unknown flags or an answer area not registered",
                  "flags", id.flags,
                  aq_bytes != 0 ? "1 (kAnswerArea: the registration's answer_bytes is not 0)"
                                : "0 (the registration's answer_bytes is 0)");
  }
  const uint64_t aq_offset = ring::Load<uint64_t>(base, h::kAqOffset, __ATOMIC_RELAXED);
  const uint64_t aq_at = aq_bytes != 0 ? ring::kHeaderBytes + sq_bytes + cq_bytes : 0;
  if (aq_offset != aq_at) {
    return Refuse("misplaced answer area", "aq_offset", aq_offset,
                  aq_bytes != 0
                      ? absl::StrCat(ring::kHeaderBytes, " + sq_bytes + cq_bytes = ", aq_at)
                      : std::string("0 (no answer area)"));
  }
  const uint64_t aq_told = ring::Load<uint64_t>(base, h::kAqBytes, __ATOMIC_RELAXED);
  if (aq_told != aq_bytes) {
    return Refuse("answer area size differs from the request", "aq_bytes", aq_told,
                  absl::StrCat(aq_bytes, " (the registration's answer_bytes)"));
  }
  // A fresh ring: nothing posted, nobody parked, open.
  struct Word {
    const char* name;
    size_t offset;
    size_t size;
  };
  for (const Word& w : {Word{"sq_tail", h::kSqTail, 8}, Word{"sq_head", h::kSqHead, 8},
                        Word{"daemon_wait", h::kDaemonWait, 4}, Word{"cq_tail", h::kCqTail, 8},
                        Word{"cq_head", h::kCqHead, 8}, Word{"client_wait", h::kClientWait, 4},
                        Word{"state", h::kState, 4}, Word{"close_code", h::kCloseCode, 4},
                        Word{"close_message_bytes", h::kCloseMessageBytes, 4},
                        Word{"aq_tail", h::kAqTail, 8}, Word{"aq_head", h::kAqHead, 8}}) {
    const uint64_t v = w.size == 8 ? ring::Load<uint64_t>(base, w.offset, __ATOMIC_RELAXED)
                                   : ring::Load<uint32_t>(base, w.offset, __ATOMIC_RELAXED);
    if (v != 0) return Refuse("not a fresh ring", w.name, v, "0 (a new ring starts empty)");
  }
  return std::unique_ptr<CommandRingView>(
      new CommandRingView(static_cast<unsigned char*>(base), sq_bytes, cq_bytes));
}

CommandRingView::CommandRingView(unsigned char* base, uint64_t sq_bytes, uint64_t cq_bytes)
    : base_(base),
      sq_(base + ring::kHeaderBytes),
      cq_(base + ring::kHeaderBytes + sq_bytes),
      sq_bytes_(sq_bytes),
      cq_bytes_(cq_bytes) {}

NextRecord CommandRingView::Broken(std::string why) {
  broken_ = std::move(why);
  NextRecord r;
  r.kind = NextRecord::kBroken;
  r.why = broken_;
  return r;
}

NextRecord CommandRingView::Next(RecordScratch& scratch) {
  if (!broken_.empty()) return Broken(broken_);
  const uint64_t tail = ring::Load<uint64_t>(base_, h::kSqTail);
  seen_sq_tail_.store(tail, std::memory_order_relaxed);
  if (tail < sq_head_ || tail - sq_head_ > sq_bytes_) {
    return Broken(absl::StrCat("impossible submission tail ", tail, ": the daemon's head is ",
                               sq_head_, " in a ring of ", sq_bytes_, " bytes"));
  }
  // At most a pad and a record: a pad fills to the ring's end, and one at
  // its start would fill all of it, more than kMaxRecordSlots.
  for (int round = 0; round < 2; ++round) {
    if (tail == sq_head_) return NextRecord{};
    const uint64_t at = sq_head_ & (sq_bytes_ - 1);
    const uint64_t published = tail - sq_head_;
    const uint64_t to_end = sq_bytes_ - at;
    // The head is in the slot at `at`, inside the ring whatever the tail.
    ring::SubmitHead head;
    ring::CopyOut(&head, sq_ + at, sizeof(head));
    const auto where = [&] {
      return absl::StrCat("submission record at position ", sq_head_, " (offset ", at, "; seq ",
                          next_seq_, " expected)");
    };
    if (head.slots == 0 || head.slots > ring::kMaxRecordSlots) {
      return Broken(absl::StrCat("bad record size: ", where(), " has ", head.slots,
                                 " slots, expected 1 to ", ring::kMaxRecordSlots));
    }
    const uint64_t bytes = uint64_t{head.slots} * ring::kSlot;
    if (bytes > published) {
      return Broken(absl::StrCat("record past the tail: ", where(), " has ", head.slots,
                                 " slots, but the client published only ", published,
                                 " bytes past the head"));
    }
    if (bytes > to_end) {
      return Broken(absl::StrCat("record across the ring's end: ", where(), " has ", head.slots,
                                 " slots, but the ring ends ", to_end,
                                 " bytes on (a record never wraps: pad to the end)"));
    }
    if (head.kind == ring::kPad) {
      if (head.seq != 0 || head.body_bytes != 0 || bytes != to_end) {
        return Broken(absl::StrCat("bad pad: ", where(), " is a pad of ", head.slots,
                                   " slots with seq ", head.seq, " and ", head.body_bytes,
                                   " body bytes, expected seq 0, no body and ",
                                   to_end / ring::kSlot, " slots to the ring's end"));
      }
      sq_head_ += bytes;
      continue;
    }
    if (head.slots != ring::SlotsFor(uint64_t{ring::kSubmitHeadBytes} + head.body_bytes)) {
      return Broken(
          absl::StrCat("bad record size: ", where(), " has ", head.slots, " slots for ",
                       head.body_bytes, " body bytes, expected ",
                       ring::SlotsFor(uint64_t{ring::kSubmitHeadBytes} + head.body_bytes)));
    }
    if (head.seq != next_seq_) {
      return Broken(absl::StrCat("records out of sequence: ", where(), " carries seq ", head.seq));
    }
    // The head as checked, then the rest from the ring: nothing is read
    // twice.
    std::memcpy(scratch.bytes, &head, sizeof(head));
    ring::CopyOut(scratch.bytes + sizeof(head), sq_ + at + sizeof(head), bytes - sizeof(head));
    sq_head_ += bytes;
    ++next_seq_;
    NextRecord r;
    r.kind = NextRecord::kRecord;
    r.bytes = ring::kSubmitHeadBytes + head.body_bytes;
    r.seq = head.seq;
    return r;
  }
  return Broken(absl::StrCat("bad pad: the submission record at position ", sq_head_,
                             " follows a pad"));  // unreachable: a pad ends at offset 0
}

void CommandRingView::PublishHead() { ring::Store<uint64_t>(base_, h::kSqHead, sq_head_); }

absl::StatusOr<uint64_t> CommandRingView::CompletionRoomSlots() {
  const uint64_t head = ring::Load<uint64_t>(base_, h::kCqHead);
  seen_cq_head_.store(head, std::memory_order_relaxed);
  if (head > cq_tail_ || cq_tail_ - head > cq_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("impossible completion head ", head,
                                                   ": the daemon's tail is ", cq_tail_,
                                                   " in a ring of ", cq_bytes_, " bytes"));
  }
  return (cq_bytes_ - (cq_tail_ - head)) / ring::kSlot;
}

absl::Status CommandRingView::Post(const ring::CompleteHead& head, absl::string_view message,
                                   uint64_t keep_slots) {
  const uint64_t cq_head = ring::Load<uint64_t>(base_, h::kCqHead);
  if (cq_head > cq_tail_ || cq_tail_ - cq_head > cq_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("impossible completion head ", cq_head,
                                                   ": the daemon's tail is ", cq_tail_,
                                                   " in a ring of ", cq_bytes_, " bytes"));
  }
  const uint64_t free_bytes = cq_bytes_ - (cq_tail_ - cq_head);
  const uint64_t keep = std::min(keep_slots, cq_bytes_ / ring::kSlot) * ring::kSlot;
  if (free_bytes < keep + ring::kCompleteHeadBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "no room for a completion: ", free_bytes, " bytes free in the completion ring, ", keep,
        " kept for commands in flight; the completion of seq ", head.seq, " needs ",
        ring::kCompleteHeadBytes));
  }
  uint64_t at = cq_tail_ & (cq_bytes_ - 1);
  uint64_t avail = free_bytes - keep;  // at least a head
  const uint64_t want = std::min<uint64_t>(message.size(), ring::kMaxMessageBytes);
  const uint64_t need = uint64_t{ring::SlotsFor(ring::kCompleteHeadBytes + want)} * ring::kSlot;
  const uint64_t to_end = cq_bytes_ - at;
  if (need > to_end && to_end + need <= avail) {
    // The whole message fits after the ring's end: a pad fills the end
    // (published with the completion, by the one store of cq_tail below).
    ring::CompleteHead pad{};
    pad.kind = ring::kPad;
    pad.slots = static_cast<uint16_t>(to_end / ring::kSlot);
    ring::CopyIn(cq_ + at, &pad, sizeof(pad));
    cq_tail_ += to_end;
    avail -= to_end;
    at = 0;
  }
  // cq_tail_ is whole slots, so the head's slot is always before the end.
  const uint64_t room = std::min(cq_bytes_ - at, avail);
  const uint64_t cut = std::min(want, room - ring::kCompleteHeadBytes);
  const uint32_t slots = ring::SlotsFor(ring::kCompleteHeadBytes + cut);

  alignas(8) unsigned char out[ring::kCompleteHeadBytes + ring::kMaxMessageBytes] = {};
  ring::CompleteHead written = head;
  written.slots = static_cast<uint16_t>(slots);
  written.message_bytes = static_cast<uint32_t>(cut);
  written.flags = cut < message.size() ? ring::kMessageCut : 0;
  written.reserved = 0;
  std::memcpy(out, &written, sizeof(written));
  if (cut > 0) std::memcpy(out + sizeof(written), message.data(), cut);
  const uint64_t bytes = uint64_t{slots} * ring::kSlot;
  ring::CopyIn(cq_ + at, out, bytes);
  cq_tail_ += bytes;
  ring::Store<uint64_t>(base_, h::kCqTail, cq_tail_, __ATOMIC_SEQ_CST);
  return absl::OkStatus();
}

Park CommandRingView::ParkDaemon(absl::Duration timeout) {
  void* word = base_ + h::kDaemonWait;
  ring::Store<uint32_t>(base_, h::kDaemonWait, 1, __ATOMIC_SEQ_CST);
  // After the flag, as the client posts before it reads the flag: either
  // this sees what it posted, or it sees the flag and wakes the futex.
  const uint64_t tail = ring::Load<uint64_t>(base_, h::kSqTail, __ATOMIC_SEQ_CST);
  const uint64_t cq_head = ring::Load<uint64_t>(base_, h::kCqHead, __ATOMIC_SEQ_CST);
  const bool wake = wake_pending_.exchange(false);
  const bool moved = tail != seen_sq_tail_.exchange(tail, std::memory_order_relaxed);
  const bool freed = cq_head != seen_cq_head_.exchange(cq_head, std::memory_order_relaxed);
  if (wake || moved || freed) {
    ring::Store<uint32_t>(base_, h::kDaemonWait, 0, __ATOMIC_RELAXED);
    return Park::kChanged;
  }
  timespec ts;
  const timespec* until = nullptr;
  if (timeout != absl::InfiniteDuration()) {
    ts = absl::ToTimespec(std::max(timeout, absl::ZeroDuration()));
    until = &ts;
  }
  // EAGAIN: the word changed before the sleep (a wake-up); EINTR: a signal.
  const long rc = Futex(word, FUTEX_WAIT, 1, until);
  const bool timed_out = rc != 0 && errno == ETIMEDOUT;
  ring::Store<uint32_t>(base_, h::kDaemonWait, 0, __ATOMIC_RELAXED);
  // A WakeDaemon during the sleep is answered by this return: the caller
  // looks at its reasons next.
  wake_pending_.exchange(false);
  return timed_out ? Park::kTimedOut : Park::kWoken;
}

void CommandRingView::WakeDaemon() {
  wake_pending_.store(true);
  ring::Exchange<uint32_t>(base_, h::kDaemonWait, 0);
  Futex(base_ + h::kDaemonWait, FUTEX_WAKE, INT_MAX, nullptr);
}

void CommandRingView::WakeClientIfParked() {
  if (ring::Load<uint32_t>(base_, h::kClientWait, __ATOMIC_SEQ_CST) != 0 &&
      ring::Exchange<uint32_t>(base_, h::kClientWait, 0) != 0) {
    Futex(base_ + h::kClientWait, FUTEX_WAKE, INT_MAX, nullptr);
  }
}

void CommandRingView::Close(absl::StatusCode code, absl::string_view message) {
  if (closed_.exchange(true)) return;
  const size_t n = std::min<size_t>(message.size(), ring::kMaxMessageBytes);
  alignas(8) unsigned char text[ring::kMaxMessageBytes] = {};
  if (n > 0) std::memcpy(text, message.data(), n);
  ring::Store<int32_t>(base_, h::kCloseCode, static_cast<int32_t>(code), __ATOMIC_RELAXED);
  ring::CopyIn(base_ + h::kCloseMessage, text, sizeof(text));
  ring::Store<uint32_t>(base_, h::kCloseMessageBytes, static_cast<uint32_t>(n), __ATOMIC_RELAXED);
  ring::Store<uint32_t>(base_, h::kState, ring::kClosed, __ATOMIC_SEQ_CST);
  // Whether or not the client says it parked: it may be waiting for this.
  ring::Exchange<uint32_t>(base_, h::kClientWait, 0);
  Futex(base_ + h::kClientWait, FUTEX_WAKE, INT_MAX, nullptr);
}

}  // namespace gpuexec::shm
