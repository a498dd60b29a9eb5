#ifndef GPUEXEC_SERVER_SHM_COMMAND_RING_VIEW_H_
#define GPUEXEC_SERVER_SHM_COMMAND_RING_VIEW_H_

// The daemon's view of one command ring (gpuexec/command_ring.h,
// docs/command-ring-plan.md): framing of the submission ring into private
// copies of its records, completions posted into the completion ring, the
// futex words both sides park on, and the close. It knows nothing of
// commands: the records' kinds and bodies are a decoder's (core's), which
// answers each record on its own; what is checked here is the framing, and
// a framing error is fatal to the ring.
//
// The mapping is the caller's: it maps the client's memfd (after
// shm::CheckRegionFd has checked its seals and size), outlives the view and
// unmaps it. The client may rewrite any byte of it at any time, from
// another process, while the view reads. So the view keeps its own copy of
// the header and of every position it owns (its submission head, the next
// seq it expects, its completion tail), reads each shared word or record
// once, with word-sized atomic loads, into private memory, and checks what
// it read before it uses it: never a read or write outside the mapping,
// never a loop that a value in it can lengthen.
//
// Threads (the view holds no lock):
// - one ring thread calls Next, PublishHead and ParkDaemon;
// - Post and CompletionRoomSlots change or read the completion tail: their
//   callers hold one lock of their own around each (one producer at a time;
//   the ring thread takes it too for CompletionRoomSlots at admission);
// - WakeDaemon, WakeClientIfParked and Close may be called from any thread
//   (Close writes only the first time).
// A view does not move: Open returns it on the heap.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gpuexec/command_ring.h"

namespace gpuexec::shm {

// Private memory one record is copied into, for the decoder to read: the
// largest record fits.
struct alignas(8) RecordScratch {
  unsigned char bytes[ring::kMaxRecordBytes];
};

// What Next found.
struct NextRecord {
  enum Kind {
    kRecord,  // a record, copied into the scratch
    kEmpty,   // nothing posted past the head
    kBroken,  // the framing is broken: close the ring with `why`
  };
  Kind kind = kEmpty;
  // kRecord: its head and body, from the scratch's first byte (32 +
  // body_bytes; the scratch holds the record's whole slots), and its seq.
  uint32_t bytes = 0;
  uint64_t seq = 0;
  std::string why;  // kBroken
};

// How ParkDaemon returned.
enum class Park {
  kChanged,   // did not sleep: records, completion room or a wake-up came
  kWoken,     // slept, and was woken (or the futex word changed under it)
  kTimedOut,  // slept the whole timeout
};

class CommandRingView {
 public:
  // Checks the header page of `bytes` of mapping at `base` (8-aligned) as a
  // fresh ring with the registration's `sq_bytes`, `cq_bytes` and
  // `aq_bytes` (0: no answer area): the sizes, powers of two within
  // gpuexec::ring's bounds, the magic, version, flags and offsets, and
  // every position, futex word and the state 0. Reads the header once and
  // keeps its own copy. INVALID_ARGUMENT names the field, its value and
  // what was expected. The view never reads or writes the answer area:
  // that is the worker's (AnswerArea) and the client's.
  static absl::StatusOr<std::unique_ptr<CommandRingView>> Open(void* base, size_t bytes,
                                                               uint64_t sq_bytes, uint64_t cq_bytes,
                                                               uint64_t aq_bytes = 0);
  CommandRingView(const CommandRingView&) = delete;
  CommandRingView& operator=(const CommandRingView&) = delete;

  // ---- Submissions (the ring thread).

  // The next record past the head, copied into `scratch` (pads before it
  // are skipped, and take no seq). Loads sq_tail once; checks it within a
  // ring ahead of the head, the record's head (slots 1..kMaxRecordSlots,
  // inside the published tail, short of the ring's end, as many slots as
  // its body needs, the expected seq) from a private copy, and only then
  // copies the rest. Once broken, always broken.
  NextRecord Next(RecordScratch& scratch);
  // Stores sq_head: every record Next returned so far has been started, and
  // the client may reuse its room (call it after a batch).
  void PublishHead();
  // This side's submission position and the seq the next record must carry.
  uint64_t sq_head() const { return sq_head_; }
  uint64_t next_seq() const { return next_seq_; }

  // ---- Completions (under the caller's lock).

  // Free whole slots in the completion ring, from a fresh load of cq_head;
  // INVALID_ARGUMENT if that head is one no honest client could have
  // written (past this side's tail, or more than a ring behind it): the
  // ring is broken. For admission, on the ring thread: the head it loads is
  // the one ParkDaemon compares with (Post keeps its own loads to itself).
  absl::StatusOr<uint64_t> CompletionRoomSlots();
  // Writes `head` (its kind, code, id, seq, gpu_time_ns, value0 and value1;
  // the view sets slots, message_bytes and flags) and `message`, then
  // stores cq_tail. Completions never wrap: one whose message does not fit
  // before the ring's end goes after a pad, where the free room less
  // `keep_slots` (room the caller keeps for other commands in flight)
  // allows; otherwise, and past kMaxMessageBytes, the message is cut and
  // flagged ring::kMessageCut. Fails, writing nothing, if
  // the client's head is impossible (INVALID_ARGUMENT) or not even the
  // 64-byte head fits with `keep_slots` kept (RESOURCE_EXHAUSTED: an honest
  // client cannot cause it, since admission reserved the room); either
  // way the ring is broken. Does not wake the client: WakeClientIfParked
  // after a batch.
  absl::Status Post(const ring::CompleteHead& head, absl::string_view message, uint64_t keep_slots);
  uint64_t cq_tail() const { return cq_tail_; }

  // ---- Waiting.

  // Parks the ring thread on daemon_wait (a shared futex: the client is
  // another process): stores 1, then sleeps unless sq_tail or cq_head
  // differ from what Next and CompletionRoomSlots last saw, or a WakeDaemon
  // came since the last park. absl::InfiniteDuration() waits for a wake-up.
  Park ParkDaemon(absl::Duration timeout);
  // Wakes the ring thread for the daemon's own reasons (stop, a command
  // finished while admission waited): the next or current ParkDaemon
  // returns. Always a system call: a client that clears daemon_wait cannot
  // make it miss.
  void WakeDaemon();
  // Wakes the client if it parked on client_wait (taking its flag, so one
  // park costs one wake-up).
  void WakeClientIfParked();

  // Closes the ring: close_code, the message (cut to kMaxMessageBytes) and
  // its length, then state = kClosed, and wakes the client. Only the first
  // call writes.
  void Close(absl::StatusCode code, absl::string_view message);

 private:
  CommandRingView(unsigned char* base, uint64_t sq_bytes, uint64_t cq_bytes);
  NextRecord Broken(std::string why);

  unsigned char* const base_;
  unsigned char* const sq_;  // base_ + kHeaderBytes
  unsigned char* const cq_;  // sq_ + sq_bytes_
  const uint64_t sq_bytes_;  // the checked header's, powers of two
  const uint64_t cq_bytes_;

  // The ring thread's.
  uint64_t sq_head_ = 0;
  uint64_t next_seq_ = 1;
  std::string broken_;  // set: Next is broken for good
  // The producer's (under the caller's lock).
  uint64_t cq_tail_ = 0;
  // What ParkDaemon compares with (set by the ring thread's Next and
  // CompletionRoomSlots, read by its ParkDaemon).
  std::atomic<uint64_t> seen_sq_tail_{0};
  std::atomic<uint64_t> seen_cq_head_{0};
  // A WakeDaemon not yet taken by a ParkDaemon.
  std::atomic<bool> wake_pending_{false};
  std::atomic<bool> closed_{false};
};

}  // namespace gpuexec::shm

#endif  // GPUEXEC_SERVER_SHM_COMMAND_RING_VIEW_H_
