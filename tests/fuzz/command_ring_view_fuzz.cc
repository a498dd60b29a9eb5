// The daemon's view of a command ring (server/shm/command_ring_view.h)
// under a client that writes honestly, in pieces, between which a hostile
// client may overwrite any word of the shared mapping: its positions, a
// record's head, or any bytes at all.
//
// Input: a sequence of operations, each led by a control byte c:
//   c < 0x40:  the client appends a record of kind 2 + c % 9 whose body is
//              the next two bytes (little-endian) modulo the largest body,
//              after a pad if it would cross the ring's end (nothing if
//              there is no room past the published sq_head);
//   c < 0x60:  the daemon takes up to (c & 0x1f) + 1 records, then
//              publishes sq_head;
//   c < 0x80:  the daemon posts a completion of the next record taken,
//              with a message of (c & 0x1f) * 40 bytes, keeping the next
//              byte's worth of slots (only where CompletionRoomSlots says
//              both fit, as admission would);
//   c < 0xa0:  the client reads every completion posted, and moves cq_head;
//   c < 0xb0:  the daemon parks with no timeout to wait, or is woken;
//   c < 0xd0:  the client publishes its tail;
//   c < 0xe0:  hostile: the next 8 bytes become sq_tail, cq_head, sq_head
//              or daemon_wait (c % 4);
//   c < 0xf0:  hostile: the next 32 bytes are written as a record's head
//              at the client's tail, which moves by 1 + the next byte's
//              slots and is published;
//   otherwise: hostile: the next 8 bytes are written at the 8-aligned
//              offset (next 3 bytes) of the mapping.
// Checked: with nothing hostile, the records taken are exactly those
// written, in order, the ring never breaks and no post fails, and each
// completion the client reads is the one posted, its message cut as the
// rules say; whatever happens, a record taken is of a size the rules allow,
// a broken ring stays broken, and nothing is read or written out of the
// mapping (the sanitizers).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>

#include "gpuexec/command_ring.h"
#include "server/shm/command_ring_view.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

namespace ring = gpuexec::ring;
namespace h = gpuexec::ring::header;
using gpuexec::shm::CommandRingView;
using gpuexec::shm::NextRecord;

constexpr uint64_t kSq = ring::kMinSubmissionBytes;
constexpr uint64_t kCq = ring::kMinCompletionBytes;
constexpr uint64_t kBytes = ring::kHeaderBytes + kSq + kCq;
constexpr uint32_t kMaxBody = ring::kMaxRecordBytes - ring::kSubmitHeadBytes;

unsigned char BodyByte(uint64_t seq, size_t i) { return static_cast<unsigned char>(seq * 13 + i); }

struct Written {
  uint64_t seq;
  uint16_t kind;
  uint32_t body_bytes;
};

struct Posted {
  uint64_t seq;
  uint32_t message_bytes;  // asked for
};

struct Fuzz {
  const uint8_t* data = nullptr;
  size_t size = 0;
  size_t at = 0;
  unsigned char* base = nullptr;
  bool hostile = false;
  // The client's side.
  uint64_t tail = 0, seq = 1, cq_head = 0;
  std::deque<Written> written;
  std::deque<Posted> posted;
  // The daemon's side.
  std::unique_ptr<CommandRingView> view;
  gpuexec::shm::RecordScratch scratch;
  bool broken = false;
  std::deque<uint64_t> taken;  // seqs not yet answered

  uint8_t Byte() { return at < size ? data[at++] : 0; }
  uint64_t Word(int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= uint64_t{Byte()} << (8 * i);
    return v;
  }

  // The client's raw write of a record at its tail (head and the first
  // body bytes, up to the ring's end).
  void Put(const ring::SubmitHead& head, uint32_t slots) {
    const uint64_t offset = tail % kSq;
    const uint64_t bytes = std::min<uint64_t>(uint64_t{slots} * ring::kSlot, kSq - offset);
    static unsigned char record[ring::kMaxRecordBytes];
    std::memset(record, 0, bytes);
    std::memcpy(record, &head, sizeof(head));
    for (size_t i = sizeof(head); i < std::min<uint64_t>(bytes, sizeof(head) + head.body_bytes);
         ++i) {
      record[i] = BodyByte(head.seq, i - sizeof(head));
    }
    ring::CopyIn(base + ring::kHeaderBytes + offset, record, bytes);
    tail += uint64_t{slots} * ring::kSlot;
  }

  void Append(uint16_t kind, uint32_t body_bytes) {
    const uint32_t slots = ring::SlotsFor(ring::kSubmitHeadBytes + body_bytes);
    const uint64_t to_end = kSq - tail % kSq;
    const uint64_t need = slots * ring::kSlot + (slots * ring::kSlot > to_end ? to_end : 0);
    const uint64_t head = ring::Load<uint64_t>(base, h::kSqHead);
    if (head > tail || need > kSq - (tail - head)) return;  // no room (or a poked head)
    if (slots * ring::kSlot > to_end) {
      Put(ring::SubmitHead{ring::kPad, static_cast<uint16_t>(to_end / ring::kSlot), 0, 0, 0, 0, 0},
          static_cast<uint32_t>(to_end / ring::kSlot));
    }
    Put(ring::SubmitHead{kind, static_cast<uint16_t>(slots), 0, seq, seq, body_bytes, 0}, slots);
    written.push_back({seq, kind, body_bytes});
    ++seq;
  }

  void Take(int n) {
    for (int i = 0; i < n; ++i) {
      const NextRecord got = view->Next(scratch);
      if (got.kind == NextRecord::kEmpty) break;
      if (got.kind == NextRecord::kBroken) {
        FUZZ_CHECK(hostile);
        FUZZ_CHECK(!got.why.empty());
        broken = true;
        break;
      }
      FUZZ_CHECK(!broken);  // broken stays broken
      FUZZ_CHECK(got.bytes >= ring::kSubmitHeadBytes && got.bytes <= ring::kMaxRecordBytes);
      ring::SubmitHead head;
      std::memcpy(&head, scratch.bytes, sizeof(head));
      FUZZ_CHECK(head.seq == got.seq && got.bytes == ring::kSubmitHeadBytes + head.body_bytes);
      taken.push_back(got.seq);
      if (hostile) continue;
      FUZZ_CHECK(!written.empty());
      const Written w = written.front();
      written.pop_front();
      FUZZ_CHECK(got.seq == w.seq && head.kind == w.kind && head.body_bytes == w.body_bytes);
      for (uint32_t k = 0; k < w.body_bytes; ++k) {
        FUZZ_CHECK(scratch.bytes[sizeof(head) + k] == BodyByte(w.seq, k));
      }
    }
    view->PublishHead();
  }

  void Post(uint32_t message_bytes, uint64_t keep) {
    if (taken.empty()) return;
    auto room = view->CompletionRoomSlots();
    if (!room.ok()) {
      FUZZ_CHECK(hostile);
      return;
    }
    if (*room < keep + 1) return;  // admission would have waited
    ring::CompleteHead head{};
    head.kind = ring::kLaunch;
    head.seq = taken.front();
    head.id = head.seq;
    const std::string message(message_bytes, static_cast<char>('a' + head.seq % 26));
    const absl::Status posted_ok = view->Post(head, message, keep);
    FUZZ_CHECK(posted_ok.ok() || hostile);
    if (!posted_ok.ok()) return;
    taken.pop_front();
    posted.push_back({head.seq, message_bytes});
  }

  void ReadCompletions() {
    const uint64_t cq_tail = ring::Load<uint64_t>(base, h::kCqTail);
    while (cq_head < cq_tail && !posted.empty()) {
      ring::CompleteHead c;
      ring::CopyOut(&c, base + ring::kHeaderBytes + kSq + cq_head % kCq, sizeof(c));
      if (c.kind == ring::kPad && c.slots != 0) {
        // Fills the ring's end before a completion that did not fit there.
        if (!hostile) FUZZ_CHECK(cq_head % kCq + c.slots * ring::kSlot == kCq);
        cq_head += uint64_t{c.slots} * ring::kSlot;
        continue;
      }
      const Posted p = posted.front();
      posted.pop_front();
      if (!hostile) {
        FUZZ_CHECK(c.seq == p.seq && c.id == p.seq && c.kind == ring::kLaunch);
        FUZZ_CHECK(c.message_bytes <= std::min(p.message_bytes, ring::kMaxMessageBytes));
        FUZZ_CHECK((c.flags == ring::kMessageCut) == (c.message_bytes < p.message_bytes));
        FUZZ_CHECK(c.slots == ring::SlotsFor(ring::kCompleteHeadBytes + c.message_bytes));
        FUZZ_CHECK(cq_head % kCq + c.slots * ring::kSlot <= kCq);  // never wraps
        const unsigned char* m = base + ring::kHeaderBytes + kSq + cq_head % kCq + sizeof(c);
        for (uint32_t k = 0; k < c.message_bytes; ++k) {
          FUZZ_CHECK(m[k] == static_cast<unsigned char>('a' + p.seq % 26));
        }
      }
      if (c.slots == 0) break;  // only a poked ring shows one
      cq_head += uint64_t{c.slots} * ring::kSlot;
    }
    if (!hostile) FUZZ_CHECK(cq_head == cq_tail && posted.empty());
    ring::Store<uint64_t>(base, h::kCqHead, cq_head, __ATOMIC_SEQ_CST);
  }

  void Run() {
    while (at < size) {
      const uint8_t c = Byte();
      if (c < 0x40) {
        Append(static_cast<uint16_t>(2 + c % 9), static_cast<uint32_t>(Word(2) % (kMaxBody + 1)));
      } else if (c < 0x60) {
        Take((c & 0x1f) + 1);
      } else if (c < 0x80) {
        Post((c & 0x1f) * 40, Byte());
      } else if (c < 0xa0) {
        ReadCompletions();
      } else if (c < 0xb0) {
        if (c & 1) view->WakeDaemon();
        (void)view->ParkDaemon(absl::ZeroDuration());
      } else if (c < 0xd0) {
        ring::Store<uint64_t>(base, h::kSqTail, tail, __ATOMIC_SEQ_CST);
      } else if (c < 0xe0) {
        hostile = true;
        const size_t words[] = {h::kSqTail, h::kCqHead, h::kSqHead, h::kDaemonWait};
        const size_t word = words[c % 4];
        const uint64_t v = Word(8);
        if (word == h::kDaemonWait) {
          ring::Store<uint32_t>(base, word, static_cast<uint32_t>(v), __ATOMIC_SEQ_CST);
        } else {
          ring::Store<uint64_t>(base, word, v, __ATOMIC_SEQ_CST);
        }
      } else if (c < 0xf0) {
        hostile = true;
        ring::SubmitHead head;
        unsigned char raw[sizeof(head)];
        for (unsigned char& b : raw) b = Byte();
        std::memcpy(&head, raw, sizeof(head));
        head.body_bytes = std::min(head.body_bytes, kMaxBody);  // what Put copies of a body
        Put(head, 1 + Byte());
        ring::Store<uint64_t>(base, h::kSqTail, tail, __ATOMIC_SEQ_CST);
      } else {
        hostile = true;
        const uint64_t offset = (Word(3) % kBytes) & ~uint64_t{7};
        ring::Store<uint64_t>(base, offset, Word(8), __ATOMIC_SEQ_CST);
      }
    }
    // Whatever is left is published and taken; a closed ring says so.
    ring::Store<uint64_t>(base, h::kSqTail, tail, __ATOMIC_SEQ_CST);
    Take(kSq / ring::kSlot);
    view->Close(absl::StatusCode::kInvalidArgument, "end of input");
    FUZZ_CHECK(ring::Load<uint32_t>(base, h::kState) == ring::kClosed);
    if (!hostile) FUZZ_CHECK(written.empty());
  }
};

void Initialize(unsigned char* base) {
  std::memset(base, 0, kBytes);
  ring::Store<uint64_t>(base, h::kMagic, ring::kMagic);
  ring::Store<uint32_t>(base, h::kVersion, ring::kVersion);
  ring::Store<uint32_t>(base, h::kHeaderBytes, ring::kHeaderBytes);
  ring::Store<uint64_t>(base, h::kSqOffset, ring::kHeaderBytes);
  ring::Store<uint64_t>(base, h::kSqBytes, kSq);
  ring::Store<uint64_t>(base, h::kCqOffset, ring::kHeaderBytes + kSq);
  ring::Store<uint64_t>(base, h::kCqBytes, kCq);
  ring::Store<uint32_t>(base, h::kSlotBytes, ring::kSlot);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Exactly the mapping's bytes, so that any access past it is reported.
  static unsigned char* const base =
      static_cast<unsigned char*>(std::aligned_alloc(ring::kHeaderBytes, kBytes));
  Initialize(base);
  auto view = CommandRingView::Open(base, kBytes, kSq, kCq);
  FUZZ_CHECK(view.ok());
  auto fuzz = std::make_unique<Fuzz>();
  fuzz->data = data;
  fuzz->size = size;
  fuzz->base = base;
  fuzz->view = std::move(*view);
  fuzz->Run();
  return 0;
}
