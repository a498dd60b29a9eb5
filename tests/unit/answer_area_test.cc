// The worker's side of a command ring's answer area: answers land where a
// client reads them, one slot each and across the area's end; a full area
// posts nothing (the answer goes through the front); a head no honest
// client writes breaks the area for good; a parked client is woken; and
// Map maps only the header page and the area of a ring's memfd.
#include "server/shm/answer_area.h"

#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "gmock/gmock.h"
#include "gpuexec/command_ring.h"
#include "gtest/gtest.h"
#include "tests/support/status_matchers.h"

namespace gpuexec::shm {
namespace {

namespace h = ring::header;
using ::gpuexec::testing::StatusIs;
using ::testing::HasSubstr;
using Posted = AnswerArea::Posted;

constexpr uint64_t kSq = ring::kMinSubmissionBytes;
constexpr uint64_t kCq = ring::kMinCompletionBytes;
constexpr uint64_t kAq = ring::kMinAnswerBytes;  // 64 answers

// A ring's memfd with an answer area, mapped whole as a client maps it.
struct Memfd {
  int fd = -1;
  unsigned char* base = nullptr;
  const uint64_t bytes = ring::kHeaderBytes + kSq + kCq + kAq;

  Memfd() {
    fd = memfd_create("command-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
    base = static_cast<unsigned char*>(
        mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    EXPECT_NE(base, MAP_FAILED);
  }
  ~Memfd() {
    munmap(base, bytes);
    close(fd);
  }
  unsigned char* area() const { return base + ring::kHeaderBytes + kSq + kCq; }
  ring::CompleteHead At(uint64_t position) const {
    ring::CompleteHead c;
    ring::CopyOut(&c, area() + position % kAq, sizeof(c));
    return c;
  }
  uint64_t Word(size_t offset) const { return ring::Load<uint64_t>(base, offset); }
  void SetHead(uint64_t head) { ring::Store<uint64_t>(base, h::kAqHead, head); }
};

TEST(AnswerArea, AnswersLandOneSlotEachAcrossTheAreasEnd) {
  Memfd m;
  GX_ASSERT_OK_AND_ASSIGN(auto area, AnswerArea::Over(m.base, m.area(), kAq));
  uint64_t read = 0;
  for (uint64_t id = 1; id <= 200; ++id) {
    ASSERT_EQ(area->Post(ring::kLaunch, id, id + 1000, id * 7), Posted::kPosted) << id;
    EXPECT_EQ(m.Word(h::kAqTail), id * ring::kSlot);
    // The client reads every few answers, as one that waits for some.
    if (id % 5 == 0) {
      for (; read < m.Word(h::kAqTail); read += ring::kSlot) {
        const ring::CompleteHead c = m.At(read);
        const uint64_t want = read / ring::kSlot + 1;
        EXPECT_EQ(c.kind, ring::kLaunch);
        EXPECT_EQ(c.slots, 1);
        EXPECT_EQ(c.code, 0);
        EXPECT_EQ(c.id, want);
        EXPECT_EQ(c.seq, want + 1000);
        EXPECT_EQ(c.gpu_time_ns, want * 7);
        EXPECT_EQ(c.message_bytes, 0u);
        EXPECT_EQ(c.flags, 0u);
      }
      m.SetHead(read);
    }
  }
  EXPECT_EQ(area->tail(), 200 * ring::kSlot);
  EXPECT_TRUE(area->broken().empty());
}

// A full area is no error: that answer goes another way, and once the
// client reads, answers are posted again.
TEST(AnswerArea, AFullAreaPostsNothingUntilTheClientReads) {
  Memfd m;
  GX_ASSERT_OK_AND_ASSIGN(auto area, AnswerArea::Over(m.base, m.area(), kAq));
  const uint64_t fits = kAq / ring::kSlot;
  for (uint64_t id = 1; id <= fits; ++id) {
    ASSERT_EQ(area->Post(ring::kSynchronize, id, id, 0), Posted::kPosted);
  }
  EXPECT_EQ(area->Post(ring::kSynchronize, fits + 1, fits + 1, 0), Posted::kNoRoom);
  EXPECT_EQ(m.Word(h::kAqTail), kAq) << "nothing was written for the answer that did not fit";
  EXPECT_EQ(m.At(0).id, 1u);
  m.SetHead(ring::kSlot);  // one read
  EXPECT_EQ(area->Post(ring::kSynchronize, fits + 2, fits + 2, 0), Posted::kPosted);
  EXPECT_EQ(m.At(kAq).id, fits + 2);  // in the first slot again
  EXPECT_TRUE(area->broken().empty());
}

// The client owns aq_head and may write anything there: a head past the
// worker's tail, more than the area behind it, or inside a slot breaks
// the area for good, and nothing is written.
TEST(AnswerArea, AHeadNoHonestClientWritesBreaksTheAreaForGood) {
  struct Case {
    uint64_t posted;  // answers posted before the lie
    uint64_t head;
    const char* says;
  };
  const Case cases[] = {
      {3, 4 * ring::kSlot, "impossible answer area head 256: this side's tail is 192"},
      {0, ~uint64_t{0} - 63, "impossible answer area head"},
      {3, 8, "impossible answer area head 8"},
      {100, 100 * ring::kSlot - kAq - ring::kSlot, "in an area of 4096 bytes"},
  };
  for (const Case& c : cases) {
    Memfd m;
    GX_ASSERT_OK_AND_ASSIGN(auto area, AnswerArea::Over(m.base, m.area(), kAq));
    for (uint64_t id = 1; id <= c.posted; ++id) {
      ASSERT_EQ(area->Post(ring::kLaunch, id, id, 0), Posted::kPosted);
      m.SetHead(id * ring::kSlot);  // read at once
    }
    const uint64_t tail = m.Word(h::kAqTail);
    m.SetHead(c.head);
    EXPECT_EQ(area->Post(ring::kLaunch, 9999, 9999, 0), Posted::kBroken) << c.says;
    EXPECT_THAT(area->broken(), HasSubstr(c.says));
    EXPECT_EQ(m.Word(h::kAqTail), tail);
    // An honest head afterwards does not mend it.
    m.SetHead(tail);
    EXPECT_EQ(area->Post(ring::kLaunch, 10000, 10000, 0), Posted::kBroken);
    EXPECT_EQ(m.Word(h::kAqTail), tail);
  }
}

// A client parked on client_wait (after its last look at aq_tail) is woken
// after the post, and its flag taken.
TEST(AnswerArea, APostWakesAParkedClient) {
  Memfd m;
  GX_ASSERT_OK_AND_ASSIGN(auto area, AnswerArea::Over(m.base, m.area(), kAq));
  std::atomic<bool> woke{false};
  ring::Store<uint32_t>(m.base, h::kClientWait, 1, __ATOMIC_SEQ_CST);
  std::thread client([&] {
    const timespec ten_s{10, 0};
    while (ring::Load<uint64_t>(m.base, h::kAqTail) == 0) {
      syscall(SYS_futex, m.base + h::kClientWait, FUTEX_WAIT, 1, &ten_s, nullptr, 0);
    }
    woke = true;
  });
  absl::SleepFor(absl::Milliseconds(20));  // most likely asleep by now
  const auto t0 = absl::Now();
  ASSERT_EQ(area->Post(ring::kSynchronize, 1, 1, 5), Posted::kPosted);
  area->WakeClientIfParked();
  client.join();
  EXPECT_TRUE(woke.load());
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5)) << "woken by the post, not the timeout";
  EXPECT_EQ(ring::Load<uint32_t>(m.base, h::kClientWait), 0u);
}

// Map maps the header page and the area only, at the area's offset in the
// memfd: what it posts is where the client's whole mapping reads it.
TEST(AnswerArea, MapMapsTheHeaderAndTheAreaOfTheMemfd) {
  Memfd m;
  GX_ASSERT_OK_AND_ASSIGN(auto area, AnswerArea::Map(m.fd, ring::kHeaderBytes + kSq + kCq, kAq));
  ASSERT_EQ(area->Post(ring::kLaunch, 42, 7, 123), Posted::kPosted);
  EXPECT_EQ(m.Word(h::kAqTail), ring::kSlot);
  EXPECT_EQ(m.At(0).id, 42u);
  EXPECT_EQ(m.At(0).gpu_time_ns, 123u);
  area.reset();  // unmaps its own mappings; the client's stays
  EXPECT_EQ(m.At(0).seq, 7u);
}

TEST(AnswerArea, SizesAndPlacesOutOfBoundsAreRefused) {
  Memfd m;
  for (uint64_t aq : {uint64_t{0}, uint64_t{2048}, uint64_t{6144}, uint64_t{128} << 10}) {
    EXPECT_THAT(AnswerArea::Map(m.fd, ring::kHeaderBytes + kSq + kCq, aq),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad answer area size")));
    EXPECT_THAT(AnswerArea::Over(m.base, m.area(), aq),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad answer area size")));
  }
  for (uint64_t at : {uint64_t{0}, uint64_t{100}, ring::kHeaderBytes + kSq + kCq + 8}) {
    EXPECT_THAT(AnswerArea::Map(m.fd, at, kAq),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("misplaced answer area")));
  }
}

}  // namespace
}  // namespace gpuexec::shm
