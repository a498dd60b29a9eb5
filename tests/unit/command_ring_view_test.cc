#include "server/shm/command_ring_view.h"

#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/status_matchers.h"

namespace gpuexec::shm {
namespace {

namespace h = ring::header;
using ::gpuexec::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr uint64_t kSq = ring::kMinSubmissionBytes;  // 64 KiB
constexpr uint64_t kCq = ring::kMinCompletionBytes;  // 16 KiB

// A fresh ring in a memfd, set up as a client sets it up, and the client's
// side of it: a writer of records and pads that keeps its own tail and
// seq, and the words it publishes.
struct Ring {
  unsigned char* base = nullptr;
  size_t bytes = 0;
  uint64_t tail = 0;  // the client's own
  uint64_t seq = 1;

  // `aq`: an answer area of that many bytes, flagged and placed.
  explicit Ring(uint64_t aq = 0) {
    bytes = ring::kHeaderBytes + kSq + kCq + aq;
    const int fd = memfd_create("command-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
    base = static_cast<unsigned char*>(
        mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    EXPECT_NE(base, MAP_FAILED);
    close(fd);
    Set<uint64_t>(h::kMagic, ring::kMagic);
    Set<uint32_t>(h::kVersion, ring::kVersion);
    Set<uint32_t>(h::kHeaderBytes, ring::kHeaderBytes);
    Set<uint64_t>(h::kSqOffset, ring::kHeaderBytes);
    Set<uint64_t>(h::kSqBytes, kSq);
    Set<uint64_t>(h::kCqOffset, ring::kHeaderBytes + kSq);
    Set<uint64_t>(h::kCqBytes, kCq);
    Set<uint32_t>(h::kSlotBytes, ring::kSlot);
    if (aq != 0) {
      Set<uint32_t>(h::kFlags, ring::kAnswerArea);
      Set<uint64_t>(h::kAqOffset, ring::kHeaderBytes + kSq + kCq);
      Set<uint64_t>(h::kAqBytes, aq);
    }
  }
  ~Ring() { munmap(base, bytes); }

  template <typename T>
  void Set(size_t offset, T v) {
    ring::Store<T>(base, offset, v, __ATOMIC_SEQ_CST);
  }
  template <typename T>
  T Get(size_t offset) {
    return ring::Load<T>(base, offset, __ATOMIC_SEQ_CST);
  }
  std::unique_ptr<CommandRingView> Open() {
    auto view = CommandRingView::Open(base, bytes, kSq, kCq);
    EXPECT_TRUE(view.ok()) << view.status();
    return view.ok() ? std::move(*view) : nullptr;
  }

  // Writes a record's head and body at the tail's slot, and moves the tail
  // by `slots`, publishing nothing.
  void Raw(uint16_t kind, uint16_t slots, uint64_t record_seq, const std::string& body,
           uint32_t body_bytes) {
    alignas(8) unsigned char rec[ring::kMaxRecordBytes + ring::kSlot] = {};
    ring::SubmitHead head{kind, slots, 0, record_seq * 1000, record_seq, body_bytes, 0};
    std::memcpy(rec, &head, sizeof(head));
    std::memcpy(rec + sizeof(head), body.data(), body.size());
    const uint64_t at = tail % kSq;
    const uint64_t n = std::min<uint64_t>(uint64_t{slots} * ring::kSlot, kSq - at);
    ring::CopyIn(base + ring::kHeaderBytes + at, rec, std::min<uint64_t>(n, sizeof(rec)));
    tail += uint64_t{slots} * ring::kSlot;
  }
  // An honest record of `kind` with `body`, after a pad if it would cross
  // the ring's end; false if there is no room past the daemon's sq_head.
  bool Append(uint16_t kind, const std::string& body) {
    const uint32_t slots = ring::SlotsFor(ring::kSubmitHeadBytes + body.size());
    const uint64_t to_end = kSq - tail % kSq;
    const uint64_t need = slots * ring::kSlot + (slots * ring::kSlot > to_end ? to_end : 0);
    if (need > kSq - (tail - Get<uint64_t>(h::kSqHead))) return false;
    if (slots * ring::kSlot > to_end) Pad();
    Raw(kind, static_cast<uint16_t>(slots), seq++, body, static_cast<uint32_t>(body.size()));
    return true;
  }
  void Pad() { Raw(ring::kPad, static_cast<uint16_t>((kSq - tail % kSq) / ring::kSlot), 0, "", 0); }
  // Publishes the tail and wakes the daemon if it parked, as a client does.
  void Publish() {
    Set<uint64_t>(h::kSqTail, tail);
    if (Get<uint32_t>(h::kDaemonWait) != 0 && ring::Exchange<uint32_t>(base, h::kDaemonWait, 0)) {
      syscall(SYS_futex, base + h::kDaemonWait, FUTEX_WAKE, 1, nullptr, nullptr, 0);
    }
  }
  // Parks as a client does on client_wait until `done`.
  void ParkClientUntil(const std::function<bool()>& done) {
    Set<uint32_t>(h::kClientWait, 1);
    const timespec limit{30, 0};
    while (!done()) {
      const long rc = syscall(SYS_futex, base + h::kClientWait, FUTEX_WAIT, 1, &limit, nullptr, 0);
      ASSERT_TRUE(rc == 0 || errno == EAGAIN || errno == EINTR) << strerror(errno);
    }
  }
  // The completion at cq position `position`, and its message.
  ring::CompleteHead Completion(uint64_t position, std::string* message = nullptr) {
    ring::CompleteHead head;
    const unsigned char* at = base + ring::kHeaderBytes + kSq + position % kCq;
    ring::CopyOut(&head, at, sizeof(head));
    if (message != nullptr) {
      message->assign(reinterpret_cast<const char*>(at + sizeof(head)),
                      std::min(head.message_bytes, ring::kMaxMessageBytes));
    }
    return head;
  }
};

std::string Body(size_t n, int salt) {
  std::string body(n, '\0');
  for (size_t i = 0; i < n; ++i) body[i] = static_cast<char>(salt * 31 + i * 7);
  return body;
}

ring::CompleteHead Answer(uint64_t seq, int32_t code = 0) {
  ring::CompleteHead head{};
  head.kind = ring::kLaunch;
  head.code = code;
  head.id = seq * 1000;
  head.seq = seq;
  head.gpu_time_ns = 77;
  return head;
}

// What a test checks of a completion's head, in one line.
std::string Shape(const ring::CompleteHead& c) {
  return "seq " + std::to_string(c.seq) + " id " + std::to_string(c.id) + " code " +
         std::to_string(c.code) + " slots " + std::to_string(c.slots) + " message " +
         std::to_string(c.message_bytes) + " flags " + std::to_string(c.flags);
}

// Waits (bounded) until process `pid`'s main thread sleeps with `word` at
// 1: then it is in FUTEX_WAIT, its only sleep after the flag is set.
bool WaitUntilParked(pid_t pid, const unsigned char* base, size_t word) {
  const std::string stat = "/proc/" + std::to_string(pid) + "/stat";
  for (int i = 0; i < 10000; ++i) {
    if (ring::Load<uint32_t>(base, word, __ATOMIC_SEQ_CST) == 1) {
      std::ifstream in(stat);
      std::string line;
      std::getline(in, line);
      const size_t paren = line.rfind(')');
      if (paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'S') {
        return true;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

TEST(CommandRingView, AFreshRingOpens) {
  Ring r;
  auto view = r.Open();
  ASSERT_NE(view, nullptr);
  RecordScratch scratch;
  EXPECT_EQ(view->Next(scratch).kind, NextRecord::kEmpty);
  EXPECT_EQ(view->next_seq(), 1u);
  EXPECT_EQ(*view->CompletionRoomSlots(), kCq / ring::kSlot);
}

TEST(CommandRingView, TheRequestAndTheMappingAreChecked) {
  struct Case {
    uint64_t sq, cq, extra_bytes, shift;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases = {
      {65535, kCq, 0, 0, {"bad submission ring size: 65535 bytes requested", "65536"}},
      {32768, kCq, 0, 0, {"bad submission ring size: 32768", "65536 to 4194304"}},
      {kSq, 2 << 20, 0, 0, {"bad completion ring size: 2097152", "16384 to 1048576"}},
      {kSq, kCq, 4096, 0, {"wrong mapping size", "has 90112 bytes", "16384 + 0 = 86016"}},
      {kSq, kCq, 0, 4, {"misaligned mapping"}},
  };
  for (const Case& c : cases) {
    Ring r;
    auto view = CommandRingView::Open(r.base + c.shift, r.bytes + c.extra_bytes, c.sq, c.cq);
    for (const std::string& s : c.says) {
      EXPECT_THAT(view, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(s))) << c.says[0];
    }
  }
}

TEST(CommandRingView, EveryHeaderFieldIsChecked) {
  struct Case {
    size_t offset;
    int width;
    uint64_t value;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases = {
      {h::kMagic, 8, 0x1234, {"not a command ring", "magic 0x1234", "31474e49525847"}},
      {h::kVersion, 4, 2, {"unsupported layout: ", "version 2, expected 1"}},
      {h::kHeaderBytes, 4, 8192, {"wrong header size", "header_bytes 8192, expected 4096"}},
      {h::kSqOffset, 8, 0, {"misplaced submission ring", "sq_offset 0, expected 4096"}},
      {h::kSqBytes, 8, 2 * kSq, {"ring size differs", "sq_bytes 131072, expected 65536"}},
      {h::kCqOffset, 8, 4096, {"misplaced completion", "cq_offset 4096, expected 4096 + "}},
      {h::kCqBytes, 8, kCq / 2, {"ring size differs", "cq_bytes 8192, expected 16384"}},
      {h::kSlotBytes, 4, 128, {"wrong slot size", "slot_bytes 128, expected 64"}},
      {h::kFlags, 4, 1, {"unknown flags", "flags 1, expected 0"}},
      // Every position, futex word and the state must be 0.
      {h::kSqTail, 8, 64, {"not a fresh ring: ", "sq_tail 64, expected 0"}},
      {h::kSqHead, 8, 64, {"not a fresh ring: ", "sq_head 64, expected 0"}},
      {h::kDaemonWait, 4, 1, {"not a fresh ring: ", "daemon_wait 1, expected 0"}},
      {h::kCqTail, 8, 64, {"not a fresh ring: ", "cq_tail 64, expected 0"}},
      {h::kCqHead, 8, 64, {"not a fresh ring: ", "cq_head 64, expected 0"}},
      {h::kClientWait, 4, 1, {"not a fresh ring: ", "client_wait 1, expected 0"}},
      {h::kState, 4, 1, {"not a fresh ring: ", "state 1, expected 0"}},
      {h::kCloseCode, 4, 3, {"not a fresh ring: ", "close_code 3, expected 0"}},
      {h::kCloseMessageBytes, 4, 9, {"not a fresh ring: ", "close_message_bytes 9, expected 0"}},
      // No answer area registered: its words are 0.
      {h::kAqOffset, 8, 4096, {"misplaced answer area", "aq_offset 4096, expected 0"}},
      {h::kAqBytes, 8, 4096, {"answer area size differs", "aq_bytes 4096, expected 0"}},
      {h::kAqTail, 8, 64, {"not a fresh ring: ", "aq_tail 64, expected 0"}},
      {h::kAqHead, 8, 64, {"not a fresh ring: ", "aq_head 64, expected 0"}},
  };
  for (const Case& c : cases) {
    Ring r;
    if (c.width == 8) r.Set<uint64_t>(c.offset, c.value);
    if (c.width == 4) r.Set<uint32_t>(c.offset, static_cast<uint32_t>(c.value));
    auto view = CommandRingView::Open(r.base, r.bytes, kSq, kCq);
    for (const std::string& s : c.says) {
      EXPECT_THAT(view, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(s))) << c.says[1];
    }
  }
}

// A ring with an answer area opens as registered: the flag, the area's
// place after the completion ring and its size as the registration's;
// anything else is refused naming the field.
TEST(CommandRingView, AnAnswerAreaIsCheckedAsRegistered) {
  constexpr uint64_t kAq = ring::kMinAnswerBytes;
  {
    Ring r(kAq);
    auto view = CommandRingView::Open(r.base, r.bytes, kSq, kCq, kAq);
    EXPECT_TRUE(view.ok()) << view.status();
  }
  struct Case {
    size_t offset;
    int width;
    uint64_t value;
    uint64_t asked;  // the registration's answer_bytes
    std::vector<std::string> says;
  };
  const std::vector<Case> cases = {
      {h::kFlags, 4, 0, kAq, {"no answer area flagged", "flags 0, expected 1"}},
      {h::kFlags, 4, 3, kAq, {"no answer area flagged", "flags 3, expected 1"}},
      {h::kAqOffset,
       8,
       ring::kHeaderBytes + kSq,
       kAq,
       {"misplaced answer area", "aq_offset 69632, expected 4096 + sq_bytes + cq_bytes = 86016"}},
      {h::kAqBytes, 8, 2 * kAq, kAq, {"answer area size differs", "aq_bytes 8192, expected 4096"}},
      {h::kAqTail, 8, 64, kAq, {"not a fresh ring: ", "aq_tail 64, expected 0"}},
      {h::kAqHead, 8, 64, kAq, {"not a fresh ring: ", "aq_head 64, expected 0"}},
      // An area the registration did not ask for is refused too.
      {h::kFlags, 4, 1, 0, {"an answer area not registered", "flags 1, expected 0"}},
  };
  for (const Case& c : cases) {
    Ring r(kAq);
    if (c.width == 8) r.Set<uint64_t>(c.offset, c.value);
    if (c.width == 4) r.Set<uint32_t>(c.offset, static_cast<uint32_t>(c.value));
    auto view =
        CommandRingView::Open(r.base, c.asked == 0 ? r.bytes - kAq : r.bytes, kSq, kCq, c.asked);
    for (const std::string& s : c.says) {
      EXPECT_THAT(view, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(s))) << c.says[1];
    }
  }
  // Sizes out of bounds, before anything is read.
  for (uint64_t aq : {uint64_t{2048}, uint64_t{6144}, uint64_t{128} << 10}) {
    Ring r(kAq);
    EXPECT_THAT(CommandRingView::Open(r.base, r.bytes, kSq, kCq, aq),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("bad answer area size"), HasSubstr("4096 to 65536"))));
  }
}

TEST(CommandRingView, RecordsAndPadsComeOutInOrderAcrossTheRingsEnd) {
  Ring r;
  auto view = r.Open();
  RecordScratch scratch;
  uint64_t want_seq = 1, pads = 0;
  std::vector<std::string> queued;
  for (int i = 0; i < 400; ++i) {
    // Sizes from an empty record to the largest, crossing the end often.
    const size_t n =
        i % 50 == 7 ? ring::kMaxRecordBytes - ring::kSubmitHeadBytes : (i * 397) % 3000;
    const uint64_t before = r.tail;
    if (!r.Append(ring::kLaunch, Body(n, i))) {
      r.Publish();
      for (;;) {
        const NextRecord got = view->Next(scratch);
        if (got.kind == NextRecord::kEmpty) break;
        ASSERT_EQ(got.kind, NextRecord::kRecord) << got.why;
        ASSERT_EQ(got.seq, want_seq);
        ASSERT_GE(got.bytes, ring::kSubmitHeadBytes);
        const char* body = reinterpret_cast<const char*>(scratch.bytes) + ring::kSubmitHeadBytes;
        ASSERT_EQ(std::string(body, got.bytes - ring::kSubmitHeadBytes), queued[want_seq++ - 1]);
      }
      EXPECT_EQ(view->sq_head(), r.tail);
      view->PublishHead();
      EXPECT_EQ(r.Get<uint64_t>(h::kSqHead), r.tail);
      ASSERT_TRUE(r.Append(ring::kLaunch, Body(n, i)));
    }
    if ((before % kSq) + (r.tail - before) > kSq) ++pads;
    queued.push_back(Body(n, i));
  }
  r.Publish();
  for (NextRecord got = view->Next(scratch); got.kind == NextRecord::kRecord;
       got = view->Next(scratch)) {
    EXPECT_EQ(got.seq, want_seq++);
  }
  EXPECT_EQ(want_seq, 401u);
  EXPECT_EQ(view->next_seq(), 401u);
  EXPECT_GT(pads, 5u);
  EXPECT_GT(r.tail, 8 * kSq);
}

TEST(CommandRingView, APadAloneIsSkippedAndTakesNoSeq) {
  Ring r;
  auto view = r.Open();
  RecordScratch scratch;
  r.Raw(ring::kLaunch, ring::kMaxRecordSlots, 1, "", ring::kMaxRecordBytes - 32);
  r.seq = 2;
  r.Publish();
  ASSERT_EQ(view->Next(scratch).kind, NextRecord::kRecord);
  view->PublishHead();
  r.Pad();  // 384 slots to the end: the record would not fit
  r.Publish();
  EXPECT_EQ(view->Next(scratch).kind, NextRecord::kEmpty);
  EXPECT_EQ(view->sq_head(), kSq);
  EXPECT_EQ(view->next_seq(), 2u);
  ASSERT_TRUE(r.Append(ring::kBarrier, ""));
  r.Publish();
  const NextRecord got = view->Next(scratch);
  EXPECT_EQ(got.kind, NextRecord::kRecord);
  EXPECT_EQ(got.seq, 2u);
  EXPECT_EQ(got.bytes, ring::kSubmitHeadBytes);
}

TEST(CommandRingView, EachFramingBreakBreaksTheRingForGood) {
  struct Break {
    int consumed;  // records of 40 slots taken first
    // The record then written at the tail (kind 0: none).
    uint16_t kind, slots;
    uint64_t seq;
    uint32_t body_bytes;
    int64_t tail;  // published; -1: the record's end
    std::vector<std::string> says;
  };
  const std::vector<Break> breaks = {
      {1, 0, 0, 0, 0, 2496, {"impossible submission tail 2496: the daemon's head is 2560"}},
      {0, 0, 0, 0, 0, kSq + 64, {"impossible submission tail 65600", "in a ring of 65536 bytes"}},
      {0,
       ring::kLaunch,
       0,
       1,
       0,
       64,
       {"bad record size: submission record at position 0 (offset 0; seq 1 expected)",
        "0 slots, expected 1 to 640"}},
      {0, ring::kLaunch, 641, 1, 641 * 64 - 32, -1, {"641 slots, expected 1 to 640"}},
      {0,
       ring::kLaunch,
       3,
       1,
       150,
       128,
       {"record past the tail", "3 slots, but the client published only 128 bytes"}},
      // 25 records of 40 slots leave 24 slots before the end.
      {25,
       ring::kLaunch,
       30,
       26,
       30 * 64 - 32,
       -1,
       {"record across the ring's end", "offset 64000; seq 26 expected", "ends 1536 bytes on"}},
      {0, ring::kLaunch, 1, 2, 8, -1, {"records out of sequence", "expected) carries seq 2"}},
      {0, ring::kMemset, 3, 1, 32, -1, {"3 slots for 32 body bytes, expected 1"}},
      {0,
       ring::kPad,
       1,
       0,
       0,
       -1,
       {"bad pad", "pad of 1 slots with seq 0 and 0 body bytes", "1024 slots to the ring's end"}},
      {25, ring::kPad, 24, 26, 0, -1, {"bad pad", "with seq 26"}},
      {25, ring::kPad, 24, 0, 8, -1, {"bad pad", "and 8 body bytes"}},
  };
  for (const Break& b : breaks) {
    Ring r;
    auto view = r.Open();
    RecordScratch scratch;
    for (int i = 0; i < b.consumed; ++i) {
      ASSERT_TRUE(r.Append(ring::kLaunch, Body(40 * 64 - 32, i)));
      r.Publish();
      ASSERT_EQ(view->Next(scratch).kind, NextRecord::kRecord);
    }
    if (b.kind != 0) r.Raw(b.kind, b.slots, b.seq, "", b.body_bytes);
    if (b.tail >= 0) r.tail = static_cast<uint64_t>(b.tail);
    r.Publish();
    for (int again = 0; again < 2; ++again) {
      const NextRecord got = view->Next(scratch);
      ASSERT_EQ(got.kind, NextRecord::kBroken) << b.says[0];
      for (const std::string& s : b.says) EXPECT_THAT(got.why, HasSubstr(s));
    }
  }
}

TEST(CommandRingView, CompletionsFollowEachOtherWithTheirMessages) {
  Ring r;
  auto view = r.Open();
  ASSERT_TRUE(view->Post(Answer(1), "", 0).ok());
  ASSERT_TRUE(view->Post(Answer(2, 3), "argument 3 is a buffer of another session", 0).ok());
  const std::string long_message(3000, 'm');
  ASSERT_TRUE(view->Post(Answer(3, 5), long_message, 0).ok());
  EXPECT_EQ(r.Get<uint64_t>(h::kCqTail), (1 + 2 + 17) * 64u);
  EXPECT_EQ(view->cq_tail(), (1 + 2 + 17) * 64u);
  std::string message;
  EXPECT_EQ(Shape(r.Completion(0, &message)), "seq 1 id 1000 code 0 slots 1 message 0 flags 0");
  EXPECT_EQ(r.Completion(0).gpu_time_ns, 77u);
  EXPECT_EQ(Shape(r.Completion(64, &message)), "seq 2 id 2000 code 3 slots 2 message 41 flags 0");
  EXPECT_EQ(message, "argument 3 is a buffer of another session");
  EXPECT_EQ(Shape(r.Completion(192, &message)),
            "seq 3 id 3000 code 5 slots 17 message 1024 flags 1");
  EXPECT_EQ(message, long_message.substr(0, 1024));
  EXPECT_EQ(*view->CompletionRoomSlots(), kCq / 64 - 20);
  r.Set<uint64_t>(h::kCqHead, 192);
  EXPECT_EQ(*view->CompletionRoomSlots(), kCq / 64 - 17);
}

TEST(CommandRingView, AMessageThatDoesNotFitBeforeTheEndFollowsAPad) {
  Ring r;
  auto view = r.Open();
  // Up to two slots before the end, the client reading as it goes.
  for (uint64_t seq = 1; view->cq_tail() < kCq - 128; ++seq) {
    ASSERT_TRUE(view->Post(Answer(seq), "", 0).ok());
    r.Set<uint64_t>(h::kCqHead, view->cq_tail());
  }
  ASSERT_TRUE(view->Post(Answer(500, 13), std::string(500, 'x'), 0).ok());
  const ring::CompleteHead pad = r.Completion(kCq - 128);
  EXPECT_EQ(pad.kind, ring::kPad);
  EXPECT_EQ(pad.slots, 2u);
  std::string message;
  EXPECT_EQ(Shape(r.Completion(kCq, &message)),
            "seq 500 id 500000 code 13 slots 9 message 500 flags 0");
  EXPECT_EQ(message, std::string(500, 'x'));
  EXPECT_EQ(view->cq_tail(), kCq + 9 * 64);
}

TEST(CommandRingView, AMessageIsCutBeforeTheRingsEndWhenThereIsNoRoomPastIt) {
  Ring r;
  auto view = r.Open();
  for (uint64_t seq = 1; view->cq_tail() < kCq - 128; ++seq) {
    ASSERT_TRUE(view->Post(Answer(seq), "", 0).ok());
    r.Set<uint64_t>(h::kCqHead, view->cq_tail());
  }
  // Room for the pad but not the whole message after it: cut where it is.
  const uint64_t slots = kCq / 64;
  ASSERT_TRUE(view->Post(Answer(500, 13), std::string(500, 'x'), slots - 4).ok());
  std::string message;
  EXPECT_EQ(Shape(r.Completion(kCq - 128, &message)),
            "seq 500 id 500000 code 13 slots 2 message 64 flags 1");
  EXPECT_EQ(message, std::string(64, 'x'));
  // The next starts the ring again.
  r.Set<uint64_t>(h::kCqHead, view->cq_tail());
  ASSERT_TRUE(view->Post(Answer(501, 13), "whole", 0).ok());
  EXPECT_EQ(Shape(r.Completion(kCq, &message)),
            "seq 501 id 501000 code 13 slots 2 message 5 flags 0");
  EXPECT_EQ(message, "whole");
}

TEST(CommandRingView, RoomKeptForCommandsInFlightIsHonoured) {
  Ring r;
  auto view = r.Open();
  const uint64_t slots = kCq / 64;
  const std::string message(1000, 'k');
  ASSERT_TRUE(view->Post(Answer(1, 2), message, slots - 6).ok());
  EXPECT_EQ(Shape(r.Completion(0)), "seq 1 id 1000 code 2 slots 6 message 320 flags 1");
  // With 250 free, keeping 249 leaves the head alone; keeping 250, nothing.
  ASSERT_TRUE(view->Post(Answer(2, 2), message, slots - 7).ok());
  EXPECT_EQ(Shape(r.Completion(6 * 64)), "seq 2 id 2000 code 2 slots 1 message 0 flags 1");
  EXPECT_THAT(view->Post(Answer(3, 2), message, slots - 7),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("no room for a completion: 15936 bytes free"),
                             HasSubstr("15936 kept"), HasSubstr("seq 3"))));
  EXPECT_EQ(view->cq_tail(), 7 * 64u);
  // A keep larger than any ring is no overflow.
  EXPECT_FALSE(view->Post(Answer(3), "", ~uint64_t{0}).ok());
}

TEST(CommandRingView, AnImpossibleCompletionHeadBreaksTheRing) {
  Ring r;
  auto view = r.Open();
  ASSERT_TRUE(view->Post(Answer(1), "", 0).ok());
  r.Set<uint64_t>(h::kCqHead, 128);
  EXPECT_THAT(view->CompletionRoomSlots(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("impossible completion head 128: the daemon's tail is 64")));
  EXPECT_THAT(view->Post(Answer(2), "", 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("impossible completion")));
  EXPECT_EQ(view->cq_tail(), 64u);
  // A ring and more behind the tail.
  for (uint64_t seq = 2; view->cq_tail() < kCq + 64; ++seq) {
    r.Set<uint64_t>(h::kCqHead, view->cq_tail());
    ASSERT_TRUE(view->Post(Answer(seq), "", 0).ok());
  }
  r.Set<uint64_t>(h::kCqHead, 0);
  EXPECT_THAT(view->CompletionRoomSlots(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("impossible completion")));
}

// A client scribbling over the whole mapping while the daemon reads and
// posts: the ring may break, but no record of an impossible size comes out
// and nothing outside the mapping is touched (the sanitizers' builds).
TEST(CommandRingView, AClientScribblingConcurrentlyCanOnlyBreakTheRing) {
  Ring r;
  auto view = r.Open();
  std::atomic<bool> done{false};
  std::thread client([&r, &done] {
    std::mt19937_64 random(7);
    for (int i = 0; i < 20000; ++i) {
      if (i % 4 == 0 && r.Append(ring::kLaunch, Body(random() % 3000, i))) r.Publish();
      // Mostly inside the submission ring; now and then anywhere.
      const uint64_t at = i % 64 == 0 ? random() % r.bytes : 4096 + random() % kSq;
      r.Set<uint64_t>(at & ~uint64_t{7}, random() % 2 ? random() : random() % 256);
    }
    done = true;
  });
  RecordScratch scratch;
  for (uint64_t seq = 1; !done; ++seq) {
    const NextRecord got = view->Next(scratch);
    if (got.kind == NextRecord::kRecord) {
      EXPECT_GE(got.bytes, ring::kSubmitHeadBytes);
      EXPECT_LE(got.bytes, ring::kMaxRecordBytes);
    }
    view->PublishHead();
    (void)view->Post(Answer(seq), "message", seq % 8);
    (void)view->CompletionRoomSlots();
    if (seq % 16 == 0) (void)view->ParkDaemon(absl::ZeroDuration());
  }
  client.join();
  // What is left comes out, or the ring is broken: either way, it ends.
  int left = 0;
  while (view->Next(scratch).kind == NextRecord::kRecord) ASSERT_LT(++left, 1024);
}

TEST(CommandRingView, ParkingWithNothingToDoTimesOut) {
  Ring r;
  auto view = r.Open();
  EXPECT_EQ(view->ParkDaemon(absl::Milliseconds(20)), Park::kTimedOut);
  EXPECT_EQ(r.Get<uint32_t>(h::kDaemonWait), 0u);
  // A record posted since Next looked, or room freed since the daemon
  // looked: no sleep, once.
  ASSERT_TRUE(r.Append(ring::kBarrier, ""));
  r.Set<uint64_t>(h::kSqTail, r.tail);  // without a wake-up
  EXPECT_EQ(view->ParkDaemon(absl::Seconds(30)), Park::kChanged);
  EXPECT_EQ(view->ParkDaemon(absl::Milliseconds(1)), Park::kTimedOut);
  ASSERT_TRUE(view->Post(Answer(1), "", 0).ok());
  ASSERT_TRUE(view->CompletionRoomSlots().ok());
  r.Set<uint64_t>(h::kCqHead, 64);
  EXPECT_EQ(view->ParkDaemon(absl::Seconds(30)), Park::kChanged);
  // A wake-up of the daemon's own before the park.
  view->WakeDaemon();
  EXPECT_EQ(view->ParkDaemon(absl::Seconds(30)), Park::kChanged);
}

TEST(CommandRingView, AClientThreadWakesTheParkedDaemon) {
  Ring r;
  auto view = r.Open();
  RecordScratch scratch;
  ASSERT_EQ(view->Next(scratch).kind, NextRecord::kEmpty);
  std::thread client([&r] {
    EXPECT_TRUE(WaitUntilParked(getpid(), r.base, h::kDaemonWait));
    EXPECT_TRUE(r.Append(ring::kSynchronize, ""));
    r.Publish();
  });
  EXPECT_EQ(view->ParkDaemon(absl::Seconds(30)), Park::kWoken);
  client.join();
  EXPECT_EQ(view->Next(scratch).kind, NextRecord::kRecord);
  // And the daemon's own wake-up, from another thread.
  std::thread stopper([&r, &view] {
    EXPECT_TRUE(WaitUntilParked(getpid(), r.base, h::kDaemonWait));
    view->WakeDaemon();
  });
  EXPECT_EQ(view->ParkDaemon(absl::InfiniteDuration()), Park::kWoken);
  stopper.join();
}

TEST(CommandRingView, AClientProcessWakesTheParkedDaemonThroughTheSharedFutex) {
  Ring r;
  auto view = r.Open();
  RecordScratch scratch;
  ASSERT_EQ(view->Next(scratch).kind, NextRecord::kEmpty);
  const pid_t parent = getpid();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The client: its own address space, the same memfd.
    const bool parked = WaitUntilParked(parent, r.base, h::kDaemonWait);
    r.Append(ring::kLaunch, Body(100, 1));
    r.Publish();
    _exit(parked ? 0 : 1);
  }
  EXPECT_EQ(view->ParkDaemon(absl::Seconds(30)), Park::kWoken);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const NextRecord got = view->Next(scratch);
  ASSERT_EQ(got.kind, NextRecord::kRecord);
  EXPECT_EQ(got.bytes, 132u);
  EXPECT_EQ(std::memcmp(scratch.bytes + 32, Body(100, 1).data(), 100), 0);
}

TEST(CommandRingView, TheDaemonWakesAParkedClient) {
  Ring r;
  auto view = r.Open();
  view->WakeClientIfParked();  // not parked: nothing
  EXPECT_EQ(r.Get<uint32_t>(h::kClientWait), 0u);
  const pid_t tid = getpid();
  std::thread waker([&r, &view, tid] {
    EXPECT_TRUE(WaitUntilParked(tid, r.base, h::kClientWait));
    ASSERT_TRUE(view->Post(Answer(1), "", 0).ok());
    view->WakeClientIfParked();
  });
  r.ParkClientUntil([&r] { return r.Get<uint64_t>(h::kCqTail) != 0; });
  waker.join();
  EXPECT_EQ(r.Get<uint32_t>(h::kClientWait), 0u);
}

TEST(CommandRingView, CloseIsVisibleToTheClientAndWakesIt) {
  Ring r;
  auto view = r.Open();
  const pid_t tid = getpid();
  std::thread closer([&r, &view, tid] {
    EXPECT_TRUE(WaitUntilParked(tid, r.base, h::kClientWait));
    view->Close(absl::StatusCode::kUnavailable, std::string(2000, 'c'));
  });
  r.ParkClientUntil([&r] { return r.Get<uint32_t>(h::kState) == ring::kClosed; });
  closer.join();
  EXPECT_EQ(r.Get<int32_t>(h::kCloseCode), static_cast<int32_t>(absl::StatusCode::kUnavailable));
  EXPECT_EQ(r.Get<uint32_t>(h::kCloseMessageBytes), ring::kMaxMessageBytes);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(r.base + h::kCloseMessage), 1024),
            std::string(1024, 'c'));
  // The first reason stays.
  view->Close(absl::StatusCode::kInternal, "later");
  EXPECT_EQ(r.Get<int32_t>(h::kCloseCode), static_cast<int32_t>(absl::StatusCode::kUnavailable));
  EXPECT_EQ(r.Get<uint32_t>(h::kCloseMessageBytes), 1024u);

  Ring short_close;
  auto other = short_close.Open();
  other->Close(absl::StatusCode::kUnauthenticated, "tenant revoked");
  EXPECT_EQ(short_close.Get<uint32_t>(h::kState), ring::kClosed);
  EXPECT_EQ(short_close.Get<uint32_t>(h::kCloseMessageBytes), 14u);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(short_close.base + h::kCloseMessage), 16),
            std::string("tenant revoked\0\0", 16));
}

}  // namespace
}  // namespace gpuexec::shm
