// Command rings on the daemon's host memory socket (gpuexecd
// --shm_socket), against a daemon process: registration and its
// refusals (no rings served, one per session, a session not the caller's,
// a layout version or size that does not fit), commands of a session run
// through its ring in order with those of its gRPC calls, and the ends of a
// ring: its session closing, and its client hanging up the lifeline.
#include <string>
#include <vector>

#include "host_memory_fixture.h"
#include "registered_ring.h"

namespace gpuexec::testing {
namespace {

using ::testing::HasSubstr;

class CommandRingTest : public HostMemoryTest {
 protected:
  // The session's own client stays off the ring: these tests register
  // rings by hand.
  void SetUp() override { Start(true, {"--command_rings"}, /*client_ring=*/false); }
};

TEST_F(CommandRingTest, ASessionsCommandsRunThroughItsRingInOrderWithItsCalls) {
  GX_ASSERT_OK_AND_ASSIGN(Function fill, Kernel("gx_fill_u32"));
  GX_ASSERT_OK_AND_ASSIGN(Buffer buffer, session().Allocate(4096));
  RegisteredRing r(daemon().shm_socket(), session().token());
  ASSERT_TRUE(r.answered());
  ASSERT_EQ(r.answer().code(), 0) << r.answer().message();
  EXPECT_GT(r.answer().command_ring().max_in_flight(), 0u);
  EXPECT_EQ(r.answer().command_ring().max_record_bytes(), ring::kMaxRecordBytes);

  const std::string body =
      FillLaunchBody(fill.handle(), buffer.handle(), 0x5a5a5a5a, 1024, ring::kLaunchSynchronize, 4);
  ASSERT_TRUE(r.ring().Append(ring::kLaunch, body.data(), static_cast<uint32_t>(body.size()), 7));
  r.ring().Publish();
  auto answers = r.ring().Completions(1);
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].head.code, 0) << answers[0].message;
  EXPECT_EQ(answers[0].head.id, 7u);
  // The gRPC Read after the ring's launch sees what it wrote.
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes, buffer.Read(0, 4096));
  for (size_t i = 0; i < bytes.size(); ++i) ASSERT_EQ(bytes[i], 0x5a) << "byte " << i;

  // A buffer no session of this caller has: answered at its seq.
  const std::string foreign =
      FillLaunchBody(fill.handle(), buffer.handle() + 4096, 1, 16, ring::kLaunchSynchronize);
  ASSERT_TRUE(
      r.ring().Append(ring::kLaunch, foreign.data(), static_cast<uint32_t>(foreign.size()), 8));
  ASSERT_TRUE(r.ring().Append(ring::kSynchronize, nullptr, 0u, 9));
  r.ring().Publish();
  answers = r.ring().Completions(2);
  ASSERT_EQ(answers.size(), 2u);
  EXPECT_EQ(answers[0].head.seq, 2u);
  EXPECT_NE(answers[0].head.code, 0);
  EXPECT_THAT(answers[0].message, HasSubstr("buffer"));
  EXPECT_EQ(answers[1].head.id, 9u);
}

TEST_F(CommandRingTest, RegistrationsAreRefusedNamingTheLimitOrTheObject) {
  RegisteredRing first(daemon().shm_socket(), session().token());
  ASSERT_EQ(first.answer().code(), 0) << first.answer().message();
  RegisteredRing second(daemon().shm_socket(), session().token());
  EXPECT_EQ(second.answer().code(), static_cast<int>(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(second.answer().message(), HasSubstr("has a command ring already"));
  RegisteredRing nobody(daemon().shm_socket(), std::string(32, 'a'));
  EXPECT_EQ(nobody.answer().code(), static_cast<int>(absl::StatusCode::kNotFound))
      << nobody.answer().message();
  GX_ASSERT_OK_AND_ASSIGN(Session other, client().OpenSession({}));
  RingShape v7;
  v7.version = 7;
  RegisteredRing version(daemon().shm_socket(), other.token(), v7);
  EXPECT_EQ(version.answer().code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(version.answer().message(), HasSubstr("layout version 7 is not served"));
}

TEST_F(CommandRingTest, ClosingTheSessionClosesItsRingSayingWhy) {
  RegisteredRing r(daemon().shm_socket(), session().token());
  ASSERT_EQ(r.answer().code(), 0) << r.answer().message();
  GX_ASSERT_OK(session().Close());
  ASSERT_TRUE(WaitFor([&] { return r.ring().state() == ring::kClosed; }, absl::Seconds(20)));
  EXPECT_EQ(r.ring().close_code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_THAT(r.ring().close_message(),
              HasSubstr(absl::StrCat("session ", session().token().substr(0, 8), " was closed: ")));
}

TEST_F(CommandRingTest, HangingUpTheLifelineStopsTheRingAndClosesTheSessionWhenAsked) {
  GX_ASSERT_OK_AND_ASSIGN(Session kept, client().OpenSession({}));
  RingShape closes;
  closes.close_session_on_hangup = true;
  RegisteredRing closing(daemon().shm_socket(), session().token(), closes);
  RegisteredRing keeping(daemon().shm_socket(), kept.token());
  ASSERT_EQ(closing.answer().code(), 0) << closing.answer().message();
  ASSERT_EQ(keeping.answer().code(), 0) << keeping.answer().message();
  closing.Hangup();
  keeping.Hangup();
  ASSERT_TRUE(WaitFor([&] { return closing.ring().state() == ring::kClosed; }, absl::Seconds(20)));
  ASSERT_TRUE(WaitFor([&] { return keeping.ring().state() == ring::kClosed; }, absl::Seconds(20)));
  EXPECT_THAT(closing.ring().close_message(), HasSubstr("hung up"));
  ASSERT_TRUE(WaitFor([&] { return !session().KeepAlive().ok(); }, absl::Seconds(20)));
  EXPECT_TRUE(kept.KeepAlive().ok());
  // The session whose ring went may have another.
  RegisteredRing again(daemon().shm_socket(), kept.token());
  EXPECT_EQ(again.answer().code(), 0) << again.answer().message();
}

class CommandRingOffTest : public HostMemoryTest {
 protected:
  void SetUp() override { Start(true, {"--command_rings=false"}); }
};

TEST_F(CommandRingOffTest, ADaemonWithoutRingsRefusesOneAndSaysHowToServeThem) {
  RegisteredRing r(daemon().shm_socket(), session().token());
  EXPECT_EQ(r.answer().code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(r.answer().message(), HasSubstr("--command_rings"));
}

}  // namespace
}  // namespace gpuexec::testing
