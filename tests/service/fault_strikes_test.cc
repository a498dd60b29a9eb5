// Faults as a weapon, and what stops them: strike limits per tenant, with
// and without a tenants file, and a fault that reaches every worker under MPS.

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fault_test_fixture.h"

namespace gpuexec::testing {
namespace {

using ::testing::_;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// Faults as a weapon: a tenant whose kernels keep resetting a device is
// refused launches once it reaches the strike limit, so the reset loop
// stops, and another tenant's buffers live on past it.
TEST_F(FaultTest, AStrikeLimitStopsAFaultLoopAndSparesTheOtherTenant) {
  ServerOptions options;
  options.tenants_file = TwoTenantsFile();
  // The tenants share the device's worker here (with workers of their own,
  // see below, the attacker's faults never reach the bystander at all).
  options.isolation = "device";
  // No strike_limit: with a tenants file it is 3 unless given.
  options.strike_window = absl::Minutes(1);
  options.strike_cooldown = absl::Minutes(1);
  GX_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> server, StartServer(options));
  GX_ASSERT_OK_AND_ASSIGN(Client attacker, ConnectAs(*server, "attack"));
  GX_ASSERT_OK_AND_ASSIGN(Client bystander, ConnectAs(*server, "bystand"));
  const std::string cubin = KernelPath("cubin");
  // Serving again after `resets` resets in all (the fault is seen before
  // the device is restarted: healthy alone can still be the old worker).
  auto healthy_after = [&](uint64_t resets) {
    return WaitFor(
        [&] {
          auto d = bystander.ListDevices();
          return d.ok() && (*d)[kDevice].healthy && (*d)[kDevice].resets >= resets;
        },
        absl::Seconds(10));
  };
  const uint64_t resets_before = (*bystander.ListDevices())[kDevice].resets;
  for (int strike = 1; strike <= 3; ++strike) {
    SCOPED_TRACE(strike);
    GX_ASSERT_OK_AND_ASSIGN(Session s, attacker.OpenSession({kDevice}));
    GX_ASSERT_OK_AND_ASSIGN(Module m, s.LoadModuleFile(cubin));
    GX_ASSERT_OK_AND_ASSIGN(Function fault, m.GetFunction("gx_fault"));
    EXPECT_THAT(s.LaunchAndWait(fault, Config(1, 1), {Arg::U64(16)}),
                StatusIs(absl::StatusCode::kAborted, _));
    ASSERT_TRUE(healthy_after(resets_before + strike));
    // Under MPS (a GPU host with an MPS control daemon) the charge is the
    // same but comes when the fault window (2 s) closes.
    if (UnderMps()) {
      EXPECT_TRUE(WaitFor([&] { return !s.KeepAlive().ok(); }, absl::Seconds(5)));
    }
    EXPECT_THAT(s.KeepAlive(), StatusIs(absl::StatusCode::kNotFound,
                                        HasSubstr(absl::StrCat("strike ", strike, " of 3"))));
  }
  const uint64_t resets = (*bystander.ListDevices())[kDevice].resets;
  // Past the limit: the bystander's new buffer, and the attacker refused.
  GX_ASSERT_OK_AND_ASSIGN(Session kept, bystander.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Buffer buffer, kept.Allocate(1 << 20));
  const std::vector<uint8_t> pattern = Pattern(21, 1 << 20);
  GX_ASSERT_OK(buffer.Write(0, pattern));
  GX_ASSERT_OK_AND_ASSIGN(Session again, attacker.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Module m, again.LoadModuleFile(cubin));
  GX_ASSERT_OK_AND_ASSIGN(Function fault, m.GetFunction("gx_fault"));
  for (int i = 0; i < 3; ++i) {
    EXPECT_THAT(again.LaunchAndWait(fault, Config(1, 1), {Arg::U64(16)}),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         AllOf(HasSubstr("launches of tenant 'attacker' are refused until"),
                               HasSubstr("reset devices 3 times within 60 s (--strike_limit=3)"),
                               HasSubstr("restart gpuexecd"))));
  }
  EXPECT_EQ((*bystander.ListDevices())[kDevice].resets, resets);
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> back, buffer.Read());
  EXPECT_TRUE(back == pattern);
  GX_ASSERT_OK_AND_ASSIGN(Function fill, Kernel(kept, "gx_fill_u32"));
  GX_EXPECT_OK(FillWith(kept, fill, 3));  // the bystander launches as ever
  const std::string metrics = server->RenderMetrics();
  EXPECT_THAT(metrics, HasSubstr("gpuexec_strikes_total 3\n"));
  EXPECT_THAT(metrics, HasSubstr("gpuexec_strike_refusals_total 3\n"));
}

// A developer alone on their box (no tenants file, no --strike_limit):
// faulting kernels close their sessions but never lock them out.
TEST_F(FaultTest, WithoutTenantsFaultsAreNeverRefusedUnlessALimitIsAsked) {
  GX_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> server, StartServer(ServerOptions()));
  GX_ASSERT_OK_AND_ASSIGN(Client c, Client::Connect(TargetOf(*server)));
  const std::string cubin = KernelPath("cubin");
  const uint64_t resets_before = (*c.ListDevices())[kDevice].resets;
  for (int fault_count = 1; fault_count <= 4; ++fault_count) {
    SCOPED_TRACE(fault_count);
    GX_ASSERT_OK_AND_ASSIGN(Session s, c.OpenSession({kDevice}));
    GX_ASSERT_OK_AND_ASSIGN(Module m, s.LoadModuleFile(cubin));
    GX_ASSERT_OK_AND_ASSIGN(Function fault, m.GetFunction("gx_fault"));
    EXPECT_THAT(s.LaunchAndWait(fault, Config(1, 1), {Arg::U64(16)}),
                StatusIs(absl::StatusCode::kAborted, HasSubstr("made an illegal memory access")));
    ASSERT_TRUE(WaitFor(
        [&] {
          auto d = c.ListDevices();
          return d.ok() && (*d)[kDevice].healthy &&
                 (*d)[kDevice].resets >= resets_before + fault_count;
        },
        absl::Seconds(10)));
    // The strike is counted, with no limit to reach.
    EXPECT_THAT(s.KeepAlive(),
                StatusIs(absl::StatusCode::kNotFound,
                         AllOf(HasSubstr(absl::StrCat("(strike ", fault_count, " for peer ")),
                               Not(HasSubstr(" of 3")))));
  }
  // After four resets in a minute, the fifth kernel still launches.
  GX_ASSERT_OK_AND_ASSIGN(Session s, c.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Function fill, Kernel(s, "gx_fill_u32"));
  GX_EXPECT_OK(FillWith(s, fill, 5));
  GX_ASSERT_OK_AND_ASSIGN(Module m, s.LoadModuleFile(cubin));
  GX_ASSERT_OK_AND_ASSIGN(Function fault, m.GetFunction("gx_fault"));
  EXPECT_THAT(s.LaunchAndWait(fault, Config(1, 1), {Arg::U64(16)}),
              StatusIs(absl::StatusCode::kAborted, _));
  const std::string metrics = server->RenderMetrics();
  EXPECT_THAT(metrics, HasSubstr("gpuexec_strikes_total 5\n"));
  EXPECT_THAT(metrics, HasSubstr("gpuexec_strike_refusals_total 0\n"));
}

// --strike_limit given without tenants: the peer is refused, told until
// when and how to lift it.
TEST_F(FaultTest, AnExplicitStrikeLimitWithoutTenantsRefusesSayingHowToLiftIt) {
  ServerOptions options;
  options.strike_limit = 2;
  options.strike_window = absl::Minutes(1);
  options.strike_cooldown = absl::Minutes(1);
  GX_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> server, StartServer(options));
  GX_ASSERT_OK_AND_ASSIGN(Client c, Client::Connect(TargetOf(*server)));
  const std::string cubin = KernelPath("cubin");
  GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> devices, c.ListDevices());
  ASSERT_GT(devices.size(), static_cast<size_t>(kDevice)) << "the daemon serves no device";
  const uint64_t resets_before = devices[kDevice].resets;
  for (int strike = 1; strike <= 2; ++strike) {
    SCOPED_TRACE(strike);
    GX_ASSERT_OK_AND_ASSIGN(Session s, c.OpenSession({kDevice}));
    GX_ASSERT_OK_AND_ASSIGN(Module m, s.LoadModuleFile(cubin));
    GX_ASSERT_OK_AND_ASSIGN(Function fault, m.GetFunction("gx_fault"));
    EXPECT_THAT(s.LaunchAndWait(fault, Config(1, 1), {Arg::U64(16)}),
                StatusIs(absl::StatusCode::kAborted, _));
    ASSERT_TRUE(WaitFor(
        [&] {
          auto d = c.ListDevices();
          return d.ok() && (*d)[kDevice].healthy && (*d)[kDevice].resets >= resets_before + strike;
        },
        absl::Seconds(10)));
  }
  GX_ASSERT_OK_AND_ASSIGN(Session s, c.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Function fill, Kernel(s, "gx_fill_u32"));
  absl::Status refused = FillWith(s, fill, 5);
  EXPECT_THAT(refused,
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("launches of peer "), HasSubstr(" are refused until "),
                             HasSubstr(" UTC (in "),
                             HasSubstr("reset devices 2 times within 60 s (--strike_limit=2)"),
                             HasSubstr("restart gpuexecd"), HasSubstr("--strike_limit=0"))));
  std::printf("a strike refusal: %s\n", refused.ToString().c_str());
}

// Under MPS (a real GPU with an MPS control daemon only), a tenant's fatal
// fault or killed hung kernel reaches every worker of the GPU: the daemon
// has the others checked, restarts those it reached, and charges the
// attacker alone (the bystander is idle, so only the attacker is named in
// each fault window). The bystander loses its buffers each time (MPS's caveat)
// but keeps its session, is never refused, and serves again soon after.
TEST_F(FaultTest, UnderMpsAFaultReachesEveryWorkerAndIsChargedToItsTenant) {
  if (!UnderMps()) GTEST_SKIP() << "no MPS control daemon serves this host";
  // The faults below reach the suite's own worker too (MPS's caveat): the
  // leak check after the test compares the device's free memory once that
  // worker serves again and answers (a worker restarting reports no figure:
  // 0 bytes free), within the suite's slack.
  struct SuiteServesAgain {
    std::function<void()> wait;
    ~SuiteServesAgain() { wait(); }
  } suite_serves_again{[this] { WaitAnswering(absl::Seconds(30)); }};
  ASSERT_TRUE(WaitAnswering(absl::Seconds(30)));
  ServerOptions options;
  options.tenants_file = TwoTenantsFile();
  options.strike_limit = 3;
  options.strike_window = absl::Minutes(10);
  options.strike_cooldown = absl::Minutes(10);
  GX_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> server, StartServer(options));
  GX_ASSERT_OK_AND_ASSIGN(Client attacker, ConnectAs(*server, "attack"));
  GX_ASSERT_OK_AND_ASSIGN(Client bystander, ConnectAs(*server, "bystand"));
  GX_ASSERT_OK_AND_ASSIGN(Session kept, bystander.OpenSession({kDevice}));
  const std::string cubin = KernelPath("cubin");
  for (Attack attack : {Attack::kHang, Attack::kFault, Attack::kFault}) {
    const bool hang = attack == Attack::kHang;
    SCOPED_TRACE(hang ? "hung kernel" : "faulting kernel");
    GX_ASSERT_OK_AND_ASSIGN(Buffer held, kept.Allocate(BystanderBytes()));
    GX_ASSERT_OK(held.Write(0, Pattern(51, BystanderBytes())));
    SessionOptions attacking;
    attacking.device = kDevice;
    if (hang) attacking.kernel_time_limit = absl::Milliseconds(100);
    GX_ASSERT_OK_AND_ASSIGN(Session s, attacker.OpenSession(attacking));
    GX_ASSERT_OK_AND_ASSIGN(Function f, Kernel(s, hang ? "gx_spin" : "gx_fault"));
    const absl::Time start = absl::Now();
    EXPECT_THAT(
        s.LaunchAndWait(f, Config(1, 1), {hang ? Arg::U64(uint64_t{1} << 50) : Arg::U64(16)}),
        StatusIs(absl::StatusCode::kAborted, _));
    // The bystander, from the attacker's answer on: its session stays; its
    // work fails until its worker has restarted, then succeeds.
    const absl::Time answered = absl::Now();
    int failed = 0;
    absl::Status last;
    absl::Status served;
    do {
      if (auto alive = kept.KeepAlive(); !alive.ok()) {
        served = alive.status();  // closed: the test fails below
        break;
      }
      absl::StatusOr<Function> fill = Kernel(kept, "gx_fill_u32");
      served = fill.ok() ? FillWith(kept, *fill, 7) : fill.status();
      if (!served.ok()) {
        ++failed;
        last = served;
        absl::SleepFor(absl::Milliseconds(10));
      }
    } while (!served.ok() && absl::Now() - answered < absl::Seconds(20));
    GX_EXPECT_OK(served) << "last failure: " << last;
    auto back = held.Read();
    std::cout << "under MPS, a " << (hang ? "hung" : "faulting") << " kernel of the attacker ("
              << absl::FormatDuration(answered - start) << " to its answer): the bystander "
              << "served again " << absl::FormatDuration(absl::Now() - answered) << " after it, "
              << failed << " of its calls failed meanwhile; its " << (BystanderBytes() >> 20)
              << " MiB buffer "
              << (back.ok() ? "intact" : std::string(back.status().message()).substr(0, 60))
              << "\n";
    // Charged when the fault window (2 s) closes: the attacker alone was
    // named in it.
    EXPECT_TRUE(WaitFor([&] { return !s.KeepAlive().ok(); }, absl::Seconds(5)));
    EXPECT_THAT(s.KeepAlive(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("strike")));
    (void)held.Free();
  }
  // Three strikes, all the attacker's: it is refused, the bystander is not.
  GX_ASSERT_OK_AND_ASSIGN(Session again, attacker.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Function fault, Kernel(again, "gx_fault"));
  EXPECT_THAT(again.LaunchAndWait(fault, Config(1, 1), {Arg::U64(16)}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("launches of tenant 'attacker' are refused until")));
  GX_ASSERT_OK_AND_ASSIGN(Function fill, Kernel(kept, "gx_fill_u32"));
  GX_EXPECT_OK(FillWith(kept, fill, 8));
  EXPECT_THAT(server->RenderMetrics(), HasSubstr("gpuexec_strikes_total 3\n"));
  GX_EXPECT_OK(kept.Close());
}

// MPS on the double: a control pipe directory makes the daemon treat the
// host as served by MPS, and GXFAKE_REACHED_FILE stands for the fault
// reaching the bystander's worker, given to its worker alone. The
// attacker's worker reports its fault first; the bystander's, reached while
// its kernel is in flight, names that kernel after it. The attacker is
// charged (a strike limit of 1 refuses its next launch); the bystander keeps
// its session, reads that its work was lost, and launches as ever.
TEST_F(FaultTest, TheMpsDoubleChargesTheTenantWhoseWorkerReportedTheFaultFirst) {
  if (!TestBackend().fake) GTEST_SKIP() << "the reach is the double's to stage";
  char dir_template[] = "/tmp/gpuexec-mps-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  // A FIFO of this user's, as a control daemon's pipe is.
  ASSERT_EQ(mkfifo((dir + "/control").c_str(), 0600), 0);
  const std::string reached = dir + "/reached";
  setenv("CUDA_MPS_PIPE_DIRECTORY", dir.c_str(), 1);
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      unsetenv("CUDA_MPS_PIPE_DIRECTORY");
      unsetenv("GXFAKE_REACHED_FILE");
      unlink((dir + "/reached").c_str());
      unlink((dir + "/control").c_str());
      rmdir(dir.c_str());
    }
  } cleanup{dir};
  ServerOptions options;
  options.tenants_file = TwoTenantsFile();
  options.strike_limit = 1;
  options.strike_window = absl::Minutes(1);
  options.strike_cooldown = absl::Minutes(1);
  GX_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> server, StartServer(options));
  GX_ASSERT_OK_AND_ASSIGN(Client attacker, ConnectAs(*server, "attack"));
  GX_ASSERT_OK_AND_ASSIGN(Client bystander, ConnectAs(*server, "bystand"));
  // The bystander's worker starts with the reach armed; the attacker's not.
  setenv("GXFAKE_REACHED_FILE", reached.c_str(), 1);
  GX_ASSERT_OK_AND_ASSIGN(Session kept, bystander.OpenSession({kDevice}));
  unsetenv("GXFAKE_REACHED_FILE");
  GX_ASSERT_OK_AND_ASSIGN(Function spin, Kernel(kept, "gx_spin"));
  GX_ASSERT_OK_AND_ASSIGN(Session s, attacker.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Function fault, Kernel(s, "gx_fault"));
  // The bystander's kernel is in flight (eleven days, as far as this goes).
  GX_ASSERT_OK(kept.Launch(spin, Config(1, 1), {Arg::U64(uint64_t{1} << 50)}));
  EXPECT_THAT(s.LaunchAndWait(fault, Config(1, 1), {Arg::U64(16)}),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("gx_fault")));
  // Then the fault reaches the bystander's worker.
  std::ofstream(reached) << "1";
  EXPECT_TRUE(WaitFor(
      [&] {
        auto d = bystander.ListDevices();
        return d.ok() && (*d)[kDevice].own_worker && (*d)[kDevice].resets >= 1;
      },
      absl::Seconds(5)))
      << "the reach did not reset the bystander's worker";
  // The window (2 s) settles: the attacker alone is charged.
  EXPECT_TRUE(WaitFor([&] { return !s.KeepAlive().ok(); }, absl::Seconds(5)));
  EXPECT_THAT(s.KeepAlive(),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("its kernel 'gx_fault' made an illegal memory access"),
                             HasSubstr("strike 1 of 1 for tenant 'attacker'"))));
  GX_EXPECT_OK(kept.KeepAlive());
  const absl::Status lost = kept.Synchronize().status();
  // Its work was lost with its worker (the reach), and nothing of the
  // attacker's kernel is in what it reads.
  EXPECT_THAT(lost, StatusIs(absl::StatusCode::kAborted,
                             AllOf(HasSubstr("was lost"), HasSubstr("CUDA_ERROR_ILLEGAL_ADDRESS"),
                                   Not(HasSubstr("gx_fault")))));
  std::printf("the bystander reads: %s\n", lost.ToString().c_str());
  GX_ASSERT_OK_AND_ASSIGN(Session again, attacker.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Function fault_again, Kernel(again, "gx_fault"));
  EXPECT_THAT(again.LaunchAndWait(fault_again, Config(1, 1), {Arg::U64(16)}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("launches of tenant 'attacker' are refused until")));
  absl::Status served;
  const absl::Time until = absl::Now() + absl::Seconds(5);
  do {
    absl::StatusOr<Function> fill = Kernel(kept, "gx_fill_u32");
    served = fill.ok() ? FillWith(kept, *fill, 6) : fill.status();
    if (served.code() == absl::StatusCode::kUnavailable) absl::SleepFor(absl::Milliseconds(10));
  } while (served.code() == absl::StatusCode::kUnavailable && absl::Now() < until);
  GX_EXPECT_OK(served);
  EXPECT_THAT(server->RenderMetrics(), HasSubstr("gpuexec_strikes_total 1\n"));
  GX_EXPECT_OK(kept.Close());
}

// Two tenants on one worker (--isolation=device): a reset one tenant's
// kernel caused is told to the other without that kernel's name or its
// session: its lost buffer, its listing; the tenant that caused it reads
// its own kernel by name.
TEST_F(FaultTest, AnotherTenantsFaultIsToldWithoutItsKernelOrSession) {
  ServerOptions options;
  options.tenants_file = TwoTenantsFile();
  options.isolation = "device";
  options.strike_limit = 0;
  GX_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> server, StartServer(options));
  GX_ASSERT_OK_AND_ASSIGN(Client attacker, ConnectAs(*server, "attack"));
  GX_ASSERT_OK_AND_ASSIGN(Client bystander, ConnectAs(*server, "bystand"));
  GX_ASSERT_OK_AND_ASSIGN(Session kept, bystander.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Buffer held, kept.Allocate(4096));
  GX_ASSERT_OK_AND_ASSIGN(Session s, attacker.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Function fault, Kernel(s, "gx_fault"));
  const std::string prefix = s.token().substr(0, 8);
  EXPECT_THAT(s.LaunchAndWait(fault, Config(1, 1), {Arg::U64(16)}),
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr(absl::StrCat("kernel 'gx_fault' of session ", prefix))));
  ASSERT_TRUE(WaitFor(
      [&] {
        auto d = bystander.ListDevices();
        return d.ok() && (*d)[kDevice].healthy && (*d)[kDevice].resets >= 1;
      },
      absl::Seconds(10)));
  const absl::Status lost = held.Read(0, 16).status();
  EXPECT_THAT(lost, StatusIs(absl::StatusCode::kAborted,
                             AllOf(HasSubstr("was lost"), HasSubstr("CUDA_ERROR_ILLEGAL_ADDRESS"),
                                   Not(HasSubstr("gx_fault")), Not(HasSubstr(prefix)))));
  GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> seen_by_bystander, bystander.ListDevices());
  EXPECT_THAT(seen_by_bystander[kDevice].last_reset,
              AllOf(HasSubstr("another tenant's kernel"), Not(HasSubstr("gx_fault")),
                    Not(HasSubstr(prefix))));
  GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> seen_by_attacker, attacker.ListDevices());
  EXPECT_THAT(seen_by_attacker[kDevice].last_reset,
              HasSubstr(absl::StrCat("kernel 'gx_fault' of session ", prefix)));
  std::printf("the bystander reads: %s\nand lists: %s\n", lost.ToString().c_str(),
              seen_by_bystander[kDevice].last_reset.c_str());
  GX_EXPECT_OK(held.Free());
  GX_EXPECT_OK(kept.Close());
}

// The same loop for AttackTime() (10 s on a GPU), the tenants sharing the
// device's worker: the device resets at most strike_limit times, every
// later launch of the attacker is refused, and the bystander, whose buffers
// go with each of those resets, keeps the one it wrote after the last.
TEST_F(FaultTest, AStrikeLimitHoldsThroughALongFaultLoop) {
  ServerOptions options;
  options.tenants_file = TwoTenantsFile();
  options.isolation = "device";
  options.strike_limit = 3;
  options.strike_window = absl::Minutes(10);
  options.strike_cooldown = absl::Minutes(10);
  GX_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> server, StartServer(options));
  GX_ASSERT_OK_AND_ASSIGN(Client attacker, ConnectAs(*server, "attack"));
  GX_ASSERT_OK_AND_ASSIGN(Client bystander, ConnectAs(*server, "bystand"));
  const uint64_t resets_before = (*bystander.ListDevices())[kDevice].resets;
  const size_t held_bytes = BystanderBytes();
  const std::vector<uint8_t> pattern = Pattern(41, held_bytes);

  // The bystander: a buffer of `pattern` and fill-and-read rounds beside
  // it; when a reset takes them, a new session, buffer and pattern.
  std::optional<Session> kept;
  std::optional<Buffer> held;
  std::optional<Function> fill;
  auto renew = [&]() -> absl::Status {
    held.reset();
    kept.reset();
    absl::StatusOr<Session> s = bystander.OpenSession({kDevice});
    if (!s.ok()) return s.status();
    kept.emplace(*std::move(s));
    absl::StatusOr<Buffer> b = kept->Allocate(held_bytes);
    if (!b.ok()) return b.status();
    held.emplace(*std::move(b));
    if (absl::Status st = held->Write(0, pattern); !st.ok()) return st;
    absl::StatusOr<Function> f = Kernel(*kept, "gx_fill_u32");
    if (!f.ok()) return f.status();
    fill.emplace(*std::move(f));
    return absl::OkStatus();
  };
  GX_ASSERT_OK(renew());
  std::atomic<bool> stop{false};
  std::atomic<int> rounds{0};
  std::atomic<int> losses{0};
  std::thread rounds_thread([&] {
    bool lost = false;
    while (!stop.load()) {
      if (lost) {
        if (!renew().ok()) {  // the device is restarting
          absl::SleepFor(absl::Milliseconds(5));
          continue;
        }
        lost = false;
      }
      if (!FillWith(*kept, *fill, static_cast<uint32_t>(rounds.load())).ok()) {
        ++losses;
        lost = true;
        continue;
      }
      ++rounds;
    }
    while (lost && !renew().ok()) absl::SleepFor(absl::Milliseconds(5));
  });

  const std::string cubin = KernelPath("cubin");
  int faults = 0, refused = 0, other = 0;
  std::string refusal;
  const absl::Duration attack_time = AttackTime();
  const absl::Time until = absl::Now() + attack_time;
  while (absl::Now() < until) {
    auto s = attacker.OpenSession({kDevice});
    if (!s.ok()) {
      EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable) << s.status();
      absl::SleepFor(absl::Milliseconds(5));
      continue;
    }
    auto m = s->LoadModuleFile(cubin);
    auto f = m.ok() ? m->GetFunction("gx_fault") : absl::StatusOr<Function>(m.status());
    if (f.ok()) {
      auto ran = s->LaunchAndWait(*f, Config(1, 1), {Arg::U64(16)});
      if (ran.status().code() == absl::StatusCode::kAborted) {
        ++faults;
      } else if (ran.status().code() == absl::StatusCode::kFailedPrecondition) {
        if (refused++ == 0) refusal = std::string(ran.status().message());
      } else {
        ++other;
      }
    } else if (f.status().code() != absl::StatusCode::kUnavailable) {
      ++other;
    }
    (void)s->Close();
  }
  stop.store(true);
  rounds_thread.join();
  const uint64_t resets = (*bystander.ListDevices())[kDevice].resets - resets_before;
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> back, held->Read());
  std::cout << "in " << absl::FormatDuration(attack_time) << " of a fault loop with a strike "
            << "limit of 3: " << resets << " resets; " << faults << " faulting launches, "
            << refused << " refused (\"" << refusal << "\"); the bystander: " << rounds.load()
            << " fill-and-read rounds, " << losses.load() << " lost to the resets, its "
            << (held_bytes >> 20) << " MiB buffer written after the last reset "
            << (back == pattern ? "intact" : "CHANGED") << "\n";
  // A reset while the bystander's kernels were in flight too is charged to
  // neither (the driver does not say whose kernel faulted in a shared
  // context): seen on the H200 once in four faults. Workers of their own
  // (--isolation=tenant) tell them apart.
  const uint64_t charged = StrikesIn(server->RenderMetrics());
  std::cout << resets - charged << " of the resets charged to nobody (kernels of both in flight)\n";
  EXPECT_EQ(charged, 3u);
  EXPECT_EQ(static_cast<uint64_t>(faults), resets);
  EXPECT_GT(refused, 0);
  EXPECT_EQ(other, 0);
  EXPECT_THAT(refusal, HasSubstr("launches of tenant 'attacker' are refused until"));
  // Each reset costs the bystander at most the round in flight; the
  // uncharged ones above are resets too.
  EXPECT_LE(static_cast<uint64_t>(losses.load()), resets);
  EXPECT_GT(rounds.load(), 0);
  EXPECT_TRUE(back == pattern) << "the bystander's buffer changed";
  held.reset();
  GX_EXPECT_OK(kept->Close());
}

}  // namespace
}  // namespace gpuexec::testing
