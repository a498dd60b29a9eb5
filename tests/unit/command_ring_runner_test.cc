// A command ring served by core::CommandRingRunner for an Engine over a
// device port of the test's own (tests/support/fake_port.h): records
// written by hand (tests/support/raw_command_ring.h) run as the Execute
// stream's commands do, answered by the same rules, with an error at the
// right seq; a bad record is answered and the ring goes on; broken framing
// closes the ring; a client that never reads its completions stops the
// ring's thread without anything queuing; Stop closes it with a reason.
#include "server/core/command_ring_runner.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gpuexec/sha256.h"
#include "gtest/gtest.h"
#include "tests/support/await.h"
#include "tests/support/fake_port.h"
#include "tests/support/raw_command_ring.h"
#include "tests/support/wait.h"

namespace gpuexec::core {
namespace {

using ::gpuexec::testing::Await;
using ::gpuexec::testing::FakePort;
using ::gpuexec::testing::RawCommandRing;
using ::gpuexec::testing::WaitFor;
using ::testing::HasSubstr;

constexpr char kImage[] = "GXFAKE1\nk_fill\n";

class CommandRingRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EngineOptions options;
    options.reaper_interval = absl::Milliseconds(10);
    auto open = [](int ordinal, const std::string&,
                   port::DriverInfo* info) -> absl::StatusOr<std::unique_ptr<port::DevicePort>> {
      info->device_count = 1;
      info->driver_version = 13000;
      info->test_double = true;
      FakePort::Options o;
      o.ordinal = ordinal;
      o.memory_bytes = 64 << 20;
      o.staging_bytes = 64 << 10;
      auto port = std::make_unique<FakePort>(o);
      port->AddFillKernel("k_fill");
      return std::unique_ptr<port::DevicePort>(std::move(port));
    };
    auto engine = Engine::Create(options, open);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
    auto session = Await<SessionInfo>(
        [&](Callback<SessionInfo> cb) { engine_->OpenSession(caller_, {0}, cb); });
    ASSERT_TRUE(session.ok()) << session.status();
    token_ = session->token;
    auto upload = engine_->BeginModuleUpload(caller_, token_, Sha256Hex(kImage), sizeof(kImage) - 1,
                                             ModuleKind::kCubin);
    ASSERT_TRUE(upload.ok()) << upload.status();
    ASSERT_TRUE((*upload)->AddChunk(kImage).ok());
    auto module = Await<ModuleResult>([&](Callback<ModuleResult> cb) { (*upload)->Finish(cb); });
    ASSERT_TRUE(module.ok()) << module.status();
    auto function = Await<FunctionResult>([&](Callback<FunctionResult> cb) {
      engine_->GetFunction(caller_, token_, module->handle, "k_fill", cb);
    });
    ASSERT_TRUE(function.ok()) << function.status();
    fill_ = function->handle;
  }
  void TearDown() override {
    runner_.reset();
    engine_.reset();
  }

  void Serve(RawCommandRing& ring, CommandRingOptions options = {}) {
    auto runner = CommandRingRunner::Start(engine_.get(), caller_, token_,
                                           std::make_unique<RingMapping>(ring.Map(), ring.bytes()),
                                           ring.sq_bytes(), ring.cq_bytes(), std::move(options));
    ASSERT_TRUE(runner.ok()) << runner.status();
    runner_ = *std::move(runner);
  }

  bool AppendFill(RawCommandRing& ring, uint64_t buffer, uint32_t value, uint64_t n, uint64_t id,
                  uint32_t flags = 0) {
    const std::string body = ::gpuexec::testing::FillLaunchBody(fill_, buffer, value, n, flags);
    return ring.Append(ring::kLaunch, body.data(), static_cast<uint32_t>(body.size()), id);
  }
  // The buffer's first `n` u32 words, read back through the engine.
  std::vector<uint32_t> Words(uint64_t buffer, uint64_t n) {
    auto source = engine_->BeginRead(caller_, token_, buffer, 0, n * 4, 16 << 10);
    EXPECT_TRUE(source.ok()) << source.status();
    std::string bytes;
    while (source.ok() && (*source)->remaining() > 0) {
      auto chunk = Await<ReadChunk>(
          [&](Callback<ReadChunk> cb) { (*source)->Next([cb](auto c) { cb(std::move(c)); }); });
      if (!chunk.ok()) break;
      bytes.append(chunk->bytes.data(), chunk->bytes.size());
    }
    std::vector<uint32_t> words(bytes.size() / 4);
    std::memcpy(words.data(), bytes.data(), words.size() * 4);
    return words;
  }

  Caller caller_ = DefaultCaller();
  std::unique_ptr<Engine> engine_;
  std::string token_;
  uint64_t fill_ = 0;
  std::unique_ptr<CommandRingRunner> runner_;
};

TEST_F(CommandRingRunnerTest, CommandsRunInOrderAndAreAnsweredByTheExecuteRules) {
  RawCommandRing ring;
  Serve(ring);
  ASSERT_TRUE(ring.AppendBody(ring::kAllocate, ring::AllocateBody{4096}, 1));
  ring.Publish();
  auto allocated = ring.Completions(1);
  ASSERT_EQ(allocated.size(), 1u);
  EXPECT_EQ(allocated[0].head.code, 0) << allocated[0].message;
  EXPECT_EQ(allocated[0].head.id, 1u);
  EXPECT_EQ(allocated[0].head.seq, 1u);
  EXPECT_EQ(allocated[0].head.kind, ring::kAllocate);
  EXPECT_EQ(allocated[0].head.value1, 4096u);
  const uint64_t buffer = allocated[0].head.value0;
  ASSERT_NE(buffer, 0u);

  // A memset (unanswered), an async launch (unanswered), a launch that
  // synchronizes (answered), a memset with a reply (answered), a
  // synchronize (answered), all posted at once.
  ASSERT_TRUE(ring.AppendBody(ring::kMemset, ring::MemsetBody{buffer, 0, 4096, 0x11, 0}, 2));
  ASSERT_TRUE(AppendFill(ring, buffer, 5, 16, 3));
  ASSERT_TRUE(AppendFill(ring, buffer, 7, 8, 4, ring::kLaunchSynchronize));
  ASSERT_TRUE(ring.AppendBody(ring::kMemset, ring::MemsetBody{buffer, 64 * 4, 4, 0x22, 0}, 5,
                              ring::kReply));
  ASSERT_TRUE(ring.Append(ring::kSynchronize, nullptr, 0u, 6));
  ring.Publish();
  auto answers = ring.Completions(3);
  ASSERT_EQ(answers.size(), 3u);
  EXPECT_EQ(answers[0].head.id, 4u);
  EXPECT_EQ(answers[0].head.kind, ring::kLaunch);
  EXPECT_EQ(answers[1].head.id, 5u);
  EXPECT_EQ(answers[2].head.id, 6u);
  EXPECT_EQ(answers[2].head.kind, ring::kSynchronize);
  for (const auto& a : answers) EXPECT_EQ(a.head.code, 0) << a.message;
  const std::vector<uint32_t> words = Words(buffer, 65);
  ASSERT_EQ(words.size(), 65u);
  EXPECT_EQ(words[0], 7u);
  EXPECT_EQ(words[8], 5u);
  EXPECT_EQ(words[16], 0x11111111u);
  EXPECT_EQ(words[64], 0x22222222u);
  ASSERT_TRUE(WaitFor([&] { return runner_->in_flight() == 0; }, absl::Seconds(20)));
}

TEST_F(CommandRingRunnerTest, AFailureIsAnsweredAtItsSeqAndTheRingGoesOn) {
  RawCommandRing ring;
  Serve(ring);
  ASSERT_TRUE(ring.AppendBody(ring::kAllocate, ring::AllocateBody{1024}, 1));
  ring.Publish();
  const uint64_t buffer = ring.Completions(1).at(0).head.value0;
  for (uint64_t i = 2; i <= 11; ++i) {
    ASSERT_TRUE(AppendFill(ring, i == 8 ? buffer + 1000 : buffer, 1, 16, i));
  }
  // A record of a kind no ring carries: answered, and the ring goes on.
  const uint64_t junk = 0;
  ASSERT_TRUE(ring.Append(99, &junk, sizeof(junk), 12));
  ASSERT_TRUE(ring.Append(ring::kSynchronize, nullptr, 0u, 13));
  ring.Publish();
  auto answers = ring.Completions(3);
  ASSERT_EQ(answers.size(), 3u);
  EXPECT_EQ(answers[0].head.seq, 8u);
  EXPECT_EQ(answers[0].head.id, 8u);
  EXPECT_NE(answers[0].head.code, 0);
  EXPECT_THAT(answers[0].message, HasSubstr("buffer"));
  EXPECT_EQ(answers[1].head.seq, 12u);
  EXPECT_EQ(answers[1].head.code, static_cast<int32_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(answers[1].message, HasSubstr("record 12"));
  EXPECT_EQ(answers[2].head.seq, 13u);
  EXPECT_EQ(answers[2].head.code, 0) << answers[2].message;
  EXPECT_EQ(ring.state(), ring::kOpen);
}

TEST_F(CommandRingRunnerTest, BrokenFramingClosesTheRingNamingWhy) {
  RawCommandRing ring;
  absl::Notification closed;
  CommandRingOptions options;
  options.on_close = [&](const absl::Status&) { closed.Notify(); };
  Serve(ring, std::move(options));
  // seq 5 where 1 is due.
  ring.Raw(ring::SubmitHead{ring::kBarrier, 1, 0, 1, 5, 0, 0}, nullptr, 0);
  ring.Publish();
  ASSERT_TRUE(closed.WaitForNotificationWithTimeout(absl::Seconds(20)));
  ASSERT_TRUE(WaitFor([&] { return runner_->ended(); }, absl::Seconds(20)));
  EXPECT_EQ(ring.state(), ring::kClosed);
  EXPECT_EQ(ring.close_code(), static_cast<int32_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ring.close_message(), HasSubstr("out of sequence"));
  EXPECT_THAT(ring.close_message(), HasSubstr("register a new ring"));
}

TEST_F(CommandRingRunnerTest, AClientThatNeverReadsStopsTheRingWithoutAQueue) {
  RawCommandRing ring(64 << 10, 16 << 10);  // 256 completion slots
  Serve(ring);
  // Barriers are always answered: 400 of them need more heads than the
  // completion ring holds.
  for (uint64_t i = 1; i <= 400; ++i) ASSERT_TRUE(ring.Append(ring::kBarrier, nullptr, 0u, i));
  ring.Publish();
  // The thread stops where the completion ring is full, and holds nothing.
  ASSERT_TRUE(WaitFor(
      [&] {
        return ring::Load<uint64_t>(ring.base(), ring::header::kCqTail) == (16 << 10) &&
               runner_->in_flight() == 0;
      },
      absl::Seconds(20)));
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(ring.sq_head(), 256u * 64u);
  // Reading them lets it go on to the end.
  auto answers = ring.Completions(400);
  ASSERT_EQ(answers.size(), 400u);
  for (uint64_t i = 0; i < 400; ++i) EXPECT_EQ(answers[i].head.seq, i + 1);
  // The head is published after the turn that answered the last of them.
  EXPECT_TRUE(WaitFor([&] { return ring.sq_head() == 400u * 64u; }, absl::Seconds(20)))
      << ring.sq_head();
}

TEST_F(CommandRingRunnerTest, StopClosesTheRingWithItsReasonAndEndsAParkedThread) {
  RawCommandRing ring;
  Serve(ring);
  ASSERT_TRUE(ring.Append(ring::kBarrier, nullptr, 0u, 1));
  ring.Publish();
  ASSERT_EQ(ring.Completions(1).size(), 1u);
  runner_->Stop(absl::FailedPreconditionError("session 1234abcd was closed"));
  ASSERT_TRUE(WaitFor([&] { return runner_->ended(); }, absl::Seconds(20)));
  EXPECT_EQ(ring.state(), ring::kClosed);
  EXPECT_EQ(ring.close_code(), static_cast<int32_t>(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(ring.close_message(), "session 1234abcd was closed");
  // Records after the stop are not taken.
  ASSERT_TRUE(ring.Append(ring::kBarrier, nullptr, 0u, 2));
  ring.Publish();
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(ring.Completions(0, absl::ZeroDuration()).size(), 0u);
}

TEST_F(CommandRingRunnerTest, AThreadRequeuedOffItsFutexStillStops) {
  RawCommandRing ring;
  Serve(ring);
  // Let the thread park on daemon_wait, then move it, as a hostile client
  // can, onto a futex word nobody will ever wake.
  ASSERT_TRUE(
      WaitFor([&] { return ring::Load<uint32_t>(ring.base(), ring::header::kDaemonWait) == 1; },
              absl::Seconds(20)));
  absl::SleepFor(absl::Milliseconds(20));
  uint32_t nowhere = 0;
  syscall(SYS_futex, ring.base() + ring::header::kDaemonWait, FUTEX_CMP_REQUEUE, 0, INT_MAX,
          &nowhere, 1);
  const absl::Time stopped = absl::Now();
  runner_->Stop(absl::CancelledError("the client hung up"));
  ASSERT_TRUE(WaitFor([&] { return runner_->ended(); }, absl::Seconds(20)));
  EXPECT_LT(absl::Now() - stopped, kRingIdleParkLimit + absl::Seconds(1));
  runner_.reset();  // joins
}

// The voluntary context switches of this process's threads named `name`
// (each park of a ring's thread that ends is one).
uint64_t SwitchesOf(const std::string& name) {
  uint64_t total = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string got;
    if (!std::getline(comm, got) || got != name) continue;
    std::ifstream status(task.path() / "status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("voluntary_ctxt_switches:", 0) == 0) {
        total += std::stoull(line.substr(line.find(':') + 1));
      }
    }
  }
  return total;
}

TEST_F(CommandRingRunnerTest, AnIdleRingsThreadSleepsLongerAndLonger) {
  RawCommandRing ring;
  Serve(ring);
  ASSERT_TRUE(ring.Append(ring::kBarrier, nullptr, 0u, 1));
  ring.Publish();
  ASSERT_EQ(ring.Completions(1).size(), 1u);
  // Idle from here: parks of 250 ms, then 500, 1000, 2000 and 4000 ms (at
  // most 4 end in 3 s), where parks of 250 ms each would end 12 times.
  const uint64_t before = SwitchesOf("gx-ring");
  absl::SleepFor(absl::Seconds(3));
  const uint64_t parks = SwitchesOf("gx-ring") - before;
  EXPECT_LE(parks, 6u);
  // And a record after the long sleep is still served at once.
  ASSERT_TRUE(ring.Append(ring::kBarrier, nullptr, 0u, 2));
  const absl::Time posted = absl::Now();
  ring.Publish();
  ASSERT_EQ(ring.Completions(1).size(), 1u);
  EXPECT_LT(absl::Now() - posted, kRingParkLimit);
}

}  // namespace
}  // namespace gpuexec::core
