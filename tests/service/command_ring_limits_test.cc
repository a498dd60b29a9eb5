// A hostile client against the limits of the daemon's command rings: rings
// per peer, in all and per tenant, a ring whose session closed, a ring
// re-identified by a reload of the tenants file, a ring admitted as a
// command stream of its session, and the run slots the rings' threads
// share. Each case against a daemon process, ending as the other hostile
// cases do (command_ring_hostile_fixture.h).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "command_ring_hostile_fixture.h"
#include "server/rpc/command_ring_server.h"
#include "tests/support/cpu_ticks.h"

namespace gpuexec::testing {
namespace {

using ::testing::HasSubstr;

TEST_F(CommandRingHostileTest, RingsAreLimitedPerPeerNamingTheLimit) {
  ASSERT_NO_FATAL_FAILURE(StartRings());
  if (IsSkipped()) return;
  // One peer (this uid, no tenants file) may hold kMaxRingsPerPeer.
  std::vector<Session> sessions;
  std::vector<std::unique_ptr<RegisteredRing>> rings;
  for (int i = 0; i < rpc::CommandRingServer::kMaxRingsPerPeer; ++i) {
    sessions.push_back(Open());
    rings.push_back(
        std::make_unique<RegisteredRing>(daemon().shm_socket(), sessions.back().token()));
    ASSERT_EQ(rings.back()->answer().code(), 0) << i << ": " << rings.back()->answer().message();
  }
  RegisteredRing over(daemon().shm_socket(), session().token());
  EXPECT_EQ(over.answer().code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(
      over.answer().message(),
      HasSubstr(absl::StrCat(rpc::CommandRingServer::kMaxRingsPerPeer, " command rings from")));
  // A ring given back makes room: its lifeline hung up, it is reaped.
  rings.back()->Hangup();
  ASSERT_TRUE(WaitFor([&] { return Registers(session().token()); }, absl::Seconds(20)));
}

TEST_F(CommandRingHostileTest, RingsAreLimitedInAllByTheFlag) {
  ASSERT_NO_FATAL_FAILURE(StartRings({"--max_command_rings=2"}));
  if (IsSkipped()) return;
  Session second = Open(), third = Open();
  RegisteredRing a(daemon().shm_socket(), session().token());
  RegisteredRing b(daemon().shm_socket(), second.token());
  ASSERT_EQ(a.answer().code(), 0) << a.answer().message();
  ASSERT_EQ(b.answer().code(), 0) << b.answer().message();
  RegisteredRing c(daemon().shm_socket(), third.token());
  EXPECT_EQ(c.answer().code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(c.answer().message(), HasSubstr("serves 2 command rings already"));
  EXPECT_THAT(c.answer().message(), HasSubstr("--max_command_rings"));
  // The session without a ring is served over gRPC all the same.
  GX_ASSERT_OK(third.Synchronize());
}

TEST_F(CommandRingHostileTest, ARingWhoseSessionClosedSaysSoWithinItsGraceThoughWorkRuns) {
  ASSERT_NO_FATAL_FAILURE(StartRings());
  if (IsSkipped()) return;
  GX_ASSERT_OK_AND_ASSIGN(Function spin, Kernel("gx_spin"));
  RegisteredRing r(daemon().shm_socket(), session().token());
  ASSERT_EQ(r.answer().code(), 0) << r.answer().message();
  // 12 s of "GPU" work, to be answered when it is done: longer than the
  // grace, short enough for the other sessions of the test to wait for.
  const std::string body = SpinLaunchBody(spin.handle(), 12'000'000'000, ring::kLaunchSynchronize);
  ASSERT_TRUE(r.ring().Append(ring::kLaunch, body.data(), static_cast<uint32_t>(body.size()), 1));
  r.ring().Publish();
  ASSERT_TRUE(WaitFor([&] { return r.ring().sq_head() > 0; }, absl::Seconds(20)));
  const absl::Time closed = absl::Now();
  std::thread closer([&] { (void)session().Close(); });
  ASSERT_TRUE(WaitFor([&] { return r.ring().state() == ring::kClosed; }, absl::Seconds(30)));
  const absl::Duration took = absl::Now() - closed;
  closer.join();
  std::printf("the ring said closed %s after its session's close\n",
              absl::FormatDuration(took).c_str());
  EXPECT_LT(took, absl::Seconds(10));
  EXPECT_THAT(r.ring().close_message(), HasSubstr("(1 command still running was not answered)"));
  EXPECT_THAT(r.ring().close_message(),
              HasSubstr(absl::StrCat("session ", session().token().substr(0, 8), " was closed")));
  ExpectOthersServed();
}

TEST_F(CommandRingHostileTest, ATenantsRingsAreLimitedByItsEntry) {
  const std::string tenants =
      WriteTenants("gx-ring-tenants", "host_memory: true max_command_rings: 2");
  ASSERT_NO_FATAL_FAILURE(StartRings({"--tenants=" + tenants}));
  if (IsSkipped()) return;
  Session second = Open(), third = Open();
  RegisteredRing a(daemon().shm_socket(), session().token());
  RegisteredRing b(daemon().shm_socket(), second.token());
  ASSERT_EQ(a.answer().code(), 0) << a.answer().message();
  ASSERT_EQ(b.answer().code(), 0) << b.answer().message();
  RegisteredRing c(daemon().shm_socket(), third.token());
  EXPECT_EQ(c.answer().code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(c.answer().message(),
              HasSubstr("tenant 'me' command ring limit: 2 of its 2 command rings are served "
                        "(max_command_rings in the tenants file)"));
  // Given back when a ring goes.
  a.Hangup();
  ASSERT_TRUE(WaitFor([&] { return Registers(third.token()); }, absl::Seconds(20)));
}

TEST_F(CommandRingHostileTest, ARingRunsAsItsTenantAsAReloadedFileHasIt) {
  const std::string tenants =
      WriteTenants("gx-ring-reload", "host_memory: true memory_limit_bytes: 1048576");
  ASSERT_NO_FATAL_FAILURE(StartRings({"--tenants=" + tenants}));
  if (IsSkipped()) return;
  RegisteredRing r(daemon().shm_socket(), session().token());
  ASSERT_EQ(r.answer().code(), 0) << r.answer().message();
  uint64_t id = 0;
  auto allocate = [&](uint64_t bytes) {
    ring::AllocateBody body{bytes};
    EXPECT_TRUE(r.ring().AppendBody(ring::kAllocate, body, ++id));
    r.ring().Publish();
    auto answers = r.ring().Completions(1);
    EXPECT_EQ(answers.size(), 1u);
    return answers.empty() ? RawCommandRing::Completion{} : answers[0];
  };
  RawCommandRing::Completion first = allocate(512 << 10);
  ASSERT_EQ(first.head.code, 0) << first.message;
  // The tenant's memory limit lowered: the ring's next Allocate is held to
  // the new one.
  WriteTenants("gx-ring-reload", "host_memory: true memory_limit_bytes: 65536");
  kill(daemon().pid(), SIGHUP);
  // In force once a gRPC call (identified afresh at each call) is refused
  // a KiB; each one allowed before holds only that.
  std::vector<Buffer> held;
  ASSERT_TRUE(WaitFor(
      [&] {
        absl::StatusOr<Buffer> b = session().Allocate(1024);
        if (!b.ok()) return true;
        held.push_back(*std::move(b));
        return false;
      },
      absl::Seconds(20)));
  // 4 KiB more: within the old limit, past the new one.
  const RawCommandRing::Completion refused = allocate(4096);
  EXPECT_EQ(refused.head.code, static_cast<int>(absl::StatusCode::kResourceExhausted))
      << refused.message;
  EXPECT_THAT(refused.message, HasSubstr("tenant 'me' memory limit"));
  // host_memory taken away: the ring ends saying so; the session serves on.
  WriteTenants("gx-ring-reload", "");
  kill(daemon().pid(), SIGHUP);
  ASSERT_TRUE(WaitFor([&] { return r.ring().state() == ring::kClosed; }, absl::Seconds(20)));
  EXPECT_EQ(r.ring().close_code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(r.ring().close_message(), HasSubstr("tenant 'me' may no longer use command rings"));
  GX_ASSERT_OK(session().Synchronize());
}

TEST_F(CommandRingHostileTest, ARingIsACommandStreamOfItsSession) {
  // One command stream a session: the ring is it, and an Execute stream
  // beside it is refused (and the other way round).
  ASSERT_NO_FATAL_FAILURE(StartRings({"--max_streams_per_session=1"}));
  if (IsSkipped()) return;
  RegisteredRing r(daemon().shm_socket(), session().token());
  ASSERT_EQ(r.answer().code(), 0) << r.answer().message();
  const absl::Status refused = session().Synchronize().status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("--max_streams_per_session"));
  // A session whose Execute stream is open has no room for a ring.
  Session second = Open();
  GX_ASSERT_OK(second.Synchronize());
  RegisteredRing refused_ring(daemon().shm_socket(), second.token());
  EXPECT_EQ(refused_ring.answer().code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(refused_ring.answer().message(), HasSubstr("--max_streams_per_session"));
}

TEST_F(CommandRingHostileTest, RingThreadsShareTheirRunSlots) {
  // One slot, and a spin of 2 s after each record: without slots each ring
  // would keep a core busy for 2 s after each command.
  ASSERT_NO_FATAL_FAILURE(StartRings({"--ring_threads=1", "--ring_spin_us=2000000"}));
  if (IsSkipped()) return;
  std::vector<Session> sessions;
  std::vector<std::unique_ptr<RegisteredRing>> rings;
  for (int i = 0; i < 3; ++i) {
    sessions.push_back(Open());
    rings.push_back(
        std::make_unique<RegisteredRing>(daemon().shm_socket(), sessions.back().token()));
    ASSERT_EQ(rings.back()->answer().code(), 0) << rings.back()->answer().message();
  }
  // The first ring's thread spins with the slot; the second's record is
  // served at once all the same: a waiter for a slot ends another's spin.
  ASSERT_TRUE(AppendSync(rings[0]->ring(), 1));
  rings[0]->ring().Publish();
  ASSERT_EQ(rings[0]->ring().Completions(1).size(), 1u);
  const absl::Time sent = absl::Now();
  ASSERT_TRUE(AppendSync(rings[1]->ring(), 2));
  rings[1]->ring().Publish();
  ASSERT_EQ(rings[1]->ring().Completions(1).size(), 1u);
  const absl::Duration waited = absl::Now() - sent;
  std::printf("a record beside another ring's spin was answered in %s\n",
              absl::FormatDuration(waited).c_str());
  EXPECT_LT(waited, absl::Seconds(1));
  // Two rings flooded with records from two threads: a third ring's record
  // still gets a slot (slots go to waiters in turn; a turn is short).
  std::atomic<bool> done{false};
  std::vector<std::thread> flooders;
  for (int i = 0; i < 2; ++i) {
    flooders.emplace_back([&, i] {
      RawCommandRing& q = rings[i]->ring();
      uint64_t id = 100;
      while (!done.load()) {
        while (q.Append(ring::kBarrier, nullptr, 0u, ++id)) {
        }
        q.Publish();
        q.Completions(0, absl::ZeroDuration());
      }
    });
  }
  absl::SleepFor(absl::Milliseconds(200));
  const absl::Time posted = absl::Now();
  ASSERT_TRUE(AppendSync(rings[2]->ring(), 3));
  rings[2]->ring().Publish();
  const size_t answered = rings[2]->ring().Completions(1).size();
  const absl::Duration beside_flood = absl::Now() - posted;
  done.store(true);
  for (std::thread& t : flooders) t.join();
  ASSERT_EQ(answered, 1u);
  std::printf("a record beside two flooded rings on one slot was answered in %s\n",
              absl::FormatDuration(beside_flood).c_str());
  EXPECT_LT(beside_flood, absl::Seconds(2));
  for (int i = 0; i < 2; ++i) {
    // What the flood left is answered before the next part.
    RawCommandRing& q = rings[i]->ring();
    ASSERT_TRUE(WaitFor(
        [&] {
          q.Completions(0, absl::ZeroDuration());
          return q.sq_head() == ring::Load<uint64_t>(q.base(), ring::header::kSqTail);
        },
        absl::Seconds(20)));
  }
  // Three rings that each spin for 2 s take one core between them: no
  // more ticks than the window's wall time on one core.
  const int64_t before = CpuTicks(daemon().pid());
  const absl::Time window = absl::Now();
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(AppendSync(rings[i]->ring(), 10 + i));
    rings[i]->ring().Publish();
  }
  // Each ring's synchronize answered (after what the flood left).
  for (int i = 0; i < 3; ++i) {
    bool answered_sync = false;
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (!answered_sync && absl::Now() < deadline) {
      for (const auto& c : rings[i]->ring().Completions(1, absl::Seconds(1))) {
        answered_sync = answered_sync || c.head.id == static_cast<uint64_t>(10 + i);
      }
    }
    ASSERT_TRUE(answered_sync) << "ring " << i;
  }
  absl::SleepFor(absl::Seconds(2));
  const int64_t spent = CpuTicks(daemon().pid()) - before;
  const double core_ticks =
      absl::ToDoubleSeconds(absl::Now() - window) * static_cast<double>(sysconf(_SC_CLK_TCK));
  std::printf("three spinning rings on one run slot: %ld ticks of daemon CPU in %.0f ticks\n",
              static_cast<long>(spent), core_ticks);
  EXPECT_LE(spent, core_ticks * 1.1 + 10) << "more than one core's ticks over the window";
  ExpectOthersServed();
}

}  // namespace
}  // namespace gpuexec::testing
