// The worker's rule for posting a ring's waiting successes itself: only on
// its area's stream, only when nothing of that stream sent before is still
// unanswered, and never again after any failure of the stream.
#include <sys/mman.h>
#include <unistd.h>

#include "gpuexec/command_ring.h"
#include "gtest/gtest.h"
#include "server/worker/answer_areas.h"
#include "tests/support/status_matchers.h"

namespace gpuexec::worker {
namespace {

constexpr uint64_t kSq = ring::kMinSubmissionBytes;
constexpr uint64_t kCq = ring::kMinCompletionBytes;
constexpr uint64_t kAq = ring::kMinAnswerBytes;
constexpr uint64_t kArea = (uint64_t{1} << 63) | 1;
constexpr uint64_t kStream = 5, kOther = 6;

class AnswerAreasTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fd_ = memfd_create("command-ring", MFD_CLOEXEC);
    ASSERT_GE(fd_, 0);
    ASSERT_EQ(ftruncate(fd_, static_cast<off_t>(ring::kHeaderBytes + kSq + kCq + kAq)), 0);
    base_ = static_cast<unsigned char*>(
        mmap(nullptr, ring::kHeaderBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0));
    ASSERT_NE(base_, MAP_FAILED);
    GX_ASSERT_OK(areas_.Map(kArea, kStream, fd_, ring::kHeaderBytes + kSq + kCq, kAq));
  }
  void TearDown() override {
    munmap(base_, ring::kHeaderBytes);
    close(fd_);
  }
  static Request Launch(uint64_t id, uint64_t stream, bool wait) {
    Request r;
    r.set_id(id);
    r.mutable_launch()->set_stream(stream);
    r.mutable_launch()->set_synchronize(wait);
    return r;
  }
  static DirectAnswer Answer(uint64_t id, uint32_t kind = ring::kLaunch) {
    DirectAnswer a;
    a.set_area(kArea);
    a.set_id(id);
    a.set_seq(id);
    a.set_kind(kind);
    return a;
  }
  uint64_t Posted() const {
    return ring::Load<uint64_t>(base_, ring::header::kAqTail) / ring::kSlot;
  }

  int fd_ = -1;
  unsigned char* base_ = nullptr;
  AnswerAreas areas_;
};

TEST_F(AnswerAreasTest, ASuccessWaitsForNothingSentBeforeIt) {
  areas_.Track(Launch(10, kStream, false));
  areas_.Track(Launch(11, kStream, true));
  // The async launch before it is not answered yet: it could still fail.
  EXPECT_FALSE(areas_.Post(Answer(11), kStream, 11, 100));
  EXPECT_EQ(Posted(), 0u);
  areas_.Settle(10, /*failed=*/false);
  areas_.Track(Launch(12, kStream, true));
  areas_.Settle(11, false);
  // Those sent after it do not hold it back.
  areas_.Track(Launch(13, kStream, false));
  EXPECT_TRUE(areas_.Post(Answer(12), kStream, 12, 100));
  EXPECT_EQ(Posted(), 1u);
}

TEST_F(AnswerAreasTest, AFailureOfTheStreamStopsPostingForGood) {
  areas_.Track(Launch(20, kStream, false));
  areas_.Settle(20, /*failed=*/true);
  areas_.Track(Launch(21, kStream, true));
  EXPECT_FALSE(areas_.Post(Answer(21), kStream, 21, 100));
  areas_.Settle(21, false);
  areas_.Track(Launch(22, kStream, true));
  EXPECT_FALSE(areas_.Post(Answer(22), kStream, 22, 100));
  EXPECT_EQ(Posted(), 0u);
}

TEST_F(AnswerAreasTest, AnotherStreamsFailureDoesNotStopIt) {
  areas_.Track(Launch(30, kOther, false));
  areas_.Settle(30, /*failed=*/true);
  areas_.Track(Launch(31, kStream, true));
  EXPECT_TRUE(areas_.Post(Answer(31), kStream, 31, 100));
  // Nor can another stream post in it.
  areas_.Track(Launch(32, kOther, true));
  EXPECT_FALSE(areas_.Post(Answer(32), kOther, 32, 100));
  EXPECT_EQ(Posted(), 1u);
}

TEST_F(AnswerAreasTest, OnlyWaitingKindsAndOnlyMappedAreasArePosted) {
  areas_.Track(Launch(40, kStream, true));
  EXPECT_FALSE(areas_.Post(Answer(40, ring::kAllocate), kStream, 40, 1));
  DirectAnswer elsewhere = Answer(40);
  elsewhere.set_area(kArea + 1);
  EXPECT_FALSE(areas_.Post(elsewhere, kStream, 40, 1));
  areas_.Unmap(kArea);
  EXPECT_FALSE(areas_.Post(Answer(40), kStream, 40, 1));
  EXPECT_EQ(Posted(), 0u);
  // One area a stream.
  GX_ASSERT_OK(areas_.Map(kArea, kStream, fd_, ring::kHeaderBytes + kSq + kCq, kAq));
  EXPECT_FALSE(areas_.Map(kArea + 1, kStream, fd_, ring::kHeaderBytes + kSq + kCq, kAq).ok());
}

TEST_F(AnswerAreasTest, AnUntimedStreamsAnswerSaysNoTime) {
  areas_.Track(Launch(50, kStream, true));
  DirectAnswer a = Answer(50);
  a.set_untimed(true);
  ASSERT_TRUE(areas_.Post(a, kStream, 50, 123456));
  unsigned char* area = static_cast<unsigned char*>(
      mmap(nullptr, kAq, PROT_READ, MAP_SHARED, fd_, ring::kHeaderBytes + kSq + kCq));
  ASSERT_NE(area, MAP_FAILED);
  ring::CompleteHead c;
  ring::CopyOut(&c, area, sizeof(c));
  EXPECT_EQ(c.id, 50u);
  EXPECT_EQ(c.gpu_time_ns, 0u);
  munmap(area, kAq);
}

}  // namespace
}  // namespace gpuexec::worker
