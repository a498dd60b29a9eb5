// A drain in the core: new sessions refused with UNAVAILABLE naming it,
// the open ones served until the deadline and then closed with the drain
// as their reason, waiters answered, and a resume that serves again.
#include "tests/unit/engine_fixture.h"

namespace gpuexec::core {
namespace {

class EngineDrainTest : public EngineTest {};

TEST_F(EngineDrainTest, NewSessionsAreRefusedWhileOpenOnesAreServedUntilTheDeadline) {
  auto open = Open();
  ASSERT_THAT(open, IsOk());
  auto buffer = Allocate(open->token, 256);
  ASSERT_THAT(buffer, IsOk());

  const DrainState st = engine_->StartDrain(absl::Seconds(30), "SIGUSR1");
  EXPECT_TRUE(st.draining);
  EXPECT_THAT(st.Describe(), AllOf(HasSubstr("draining since"), HasSubstr("(SIGUSR1)")));
  EXPECT_THAT(Open(), StatusIs(absl::StatusCode::kUnavailable,
                               AllOf(HasSubstr("draining"), HasSubstr("SIGUSR1"),
                                     HasSubstr("another daemon of the pool"))));
  // The open session is still served.
  EXPECT_THAT(Allocate(open->token, 256), IsOk());
  EXPECT_EQ(engine_->session_count(), 1u);
}

TEST_F(EngineDrainTest, TheDeadlineClosesWhatIsOpenAndTellsEachClientWhy) {
  auto open = Open();
  ASSERT_THAT(open, IsOk());
  absl::Notification answered;
  DrainState heard;
  size_t open_then = 99;
  engine_->StartDrain(absl::Milliseconds(50), "the Drain call of unix:uid=0");
  ASSERT_THAT(engine_->WhenDrained([&](const DrainState& st, size_t sessions_open) {
    heard = st;
    open_then = sessions_open;
    answered.Notify();
  }),
              IsOk());
  ASSERT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(open_then, 0u);
  EXPECT_EQ(heard.closed_at_deadline, 1u);
  EXPECT_THAT(heard.Describe(), HasSubstr("were closed at"));
  EXPECT_EQ(engine_->session_count(), 0u);
  EXPECT_THAT(
      Allocate(open->token, 256),
      StatusIs(absl::StatusCode::kNotFound, AllOf(HasSubstr("was closed"), HasSubstr("drained"),
                                                  HasSubstr("the Drain call of unix:uid=0"))));
}

TEST_F(EngineDrainTest, WaitersHearAtOnceWhenTheLastSessionEndsBeforeTheDeadline) {
  auto open = Open();
  ASSERT_THAT(open, IsOk());
  engine_->StartDrain(absl::Hours(1), "SIGUSR1");
  absl::Notification answered;
  ASSERT_THAT(engine_->WhenDrained([&](const DrainState& st, size_t) {
    EXPECT_EQ(st.closed_at_deadline, 0u);
    answered.Notify();
  }),
              IsOk());
  EXPECT_FALSE(answered.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  ASSERT_THAT(Close(open->token), IsOk());
  EXPECT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

TEST_F(EngineDrainTest, ResumeServesAgainAndAnswersTheWaiters) {
  EXPECT_THAT(engine_->WhenDrained([](const DrainState&, size_t) {}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not draining")));
  auto open = Open();
  ASSERT_THAT(open, IsOk());
  engine_->StartDrain(absl::Hours(1), "SIGUSR1");
  bool heard_draining = true;
  absl::Notification answered;
  ASSERT_THAT(engine_->WhenDrained([&](const DrainState& st, size_t) {
    heard_draining = st.draining;
    answered.Notify();
  }),
              IsOk());
  EXPECT_FALSE(engine_->ResumeFromDrain().draining);
  ASSERT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_FALSE(heard_draining);
  EXPECT_THAT(Open(), IsOk());
  EXPECT_EQ(engine_->drain_state().Describe(), "");
}

TEST_F(EngineDrainTest, WaitersAreBoundedAndAnsweredWhenTheEngineGoes) {
  engine_->StartDrain(absl::Hours(1), "SIGUSR1");
  auto open = Open();  // refused: the drain is on
  ASSERT_FALSE(open.ok());
  // Keep a session open so that the waiters wait: resume, open, drain.
  engine_->ResumeFromDrain();
  ASSERT_THAT(Open(), IsOk());
  engine_->StartDrain(absl::Hours(1), "SIGUSR1");
  std::atomic<int> answered{0};
  for (size_t i = 0; i < Drain::kMaxWaiters; ++i) {
    ASSERT_THAT(engine_->WhenDrained([&](const DrainState&, size_t) { ++answered; }), IsOk());
  }
  EXPECT_THAT(engine_->WhenDrained([](const DrainState&, size_t) {}),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("64 calls wait")));
  engine_->EndDrainWaits();
  EXPECT_EQ(answered.load(), static_cast<int>(Drain::kMaxWaiters));
}

TEST(DrainTest, AGraceIsBoundedAndAskingAgainMovesTheDeadline) {
  Drain d;
  const absl::Time t0 = absl::FromUnixSeconds(1'800'000'000);
  DrainState st = d.Start(t0, absl::Hours(100), "SIGUSR1");
  EXPECT_EQ(st.deadline, t0 + Drain::kMaxGrace);
  st = d.Start(t0 + absl::Seconds(5), absl::Seconds(10), "the Drain call of unix:uid=0");
  EXPECT_EQ(st.since, t0);
  EXPECT_EQ(st.deadline, t0 + absl::Seconds(15));
  EXPECT_EQ(st.by, "the Drain call of unix:uid=0");
  EXPECT_FALSE(d.Tick(t0 + absl::Seconds(14), 3));
  EXPECT_TRUE(d.Tick(t0 + absl::Seconds(15), 3));
  d.Closed(3);
  EXPECT_FALSE(d.Tick(t0 + absl::Seconds(16), 0));
  // A session whose open was under way at the deadline is closed too.
  EXPECT_TRUE(d.Tick(t0 + absl::Seconds(17), 1));
  EXPECT_EQ(d.state().closed_at_deadline, 3u);
}

TEST(DrainTest, NoCallMayWaitOnceTheEngineStops) {
  Drain d;
  d.Start(absl::Now(), absl::Hours(1), "SIGUSR1");
  d.Stop(0);
  EXPECT_THAT(d.AddWaiter([](const DrainState&, size_t) {}),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("stopping")));
}

}  // namespace
}  // namespace gpuexec::core
