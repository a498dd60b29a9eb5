// Workers that stop answering, or are reset beside another tenant's work, an
// MPS server that will not restart, and a client that vanishes.

#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fault_test_fixture.h"

extern char** environ;

namespace gpuexec::testing {
namespace {

using ::testing::_;
using ::testing::AllOf;
using ::testing::HasSubstr;

// A worker that stops answering (here: stopped with SIGSTOP, as a driver
// call that never returns would leave it) does not freeze the reports:
// ListDevices and a metrics scrape answer at once from what the daemon last
// knew, saying since when the device has not answered.
TEST_F(FaultTest, AStoppedWorkerDoesNotHoldUpListingsOrMetrics) {
  const int worker = server().worker_pid(kDevice);
  ASSERT_GT(worker, 0);
  GX_ASSERT_OK(client().ListDevices().status());  // a figure to fall back on
  ASSERT_EQ(kill(worker, SIGSTOP), 0);
  struct Resume {
    int pid;
    ~Resume() { kill(pid, SIGCONT); }
  } resume{worker};
  // Long enough for an unanswered ping (one a second, late after 200 ms).
  absl::SleepFor(absl::Milliseconds(1500));
  for (int i = 0; i < 5; ++i) {
    const absl::Time start = absl::Now();
    GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> devices, client().ListDevices());
    const absl::Duration took = absl::Now() - start;
    std::cout << "ListDevices with a stopped worker: " << absl::FormatDuration(took) << "\n";
    EXPECT_LT(took, absl::Milliseconds(100));
    EXPECT_FALSE(devices[kDevice].not_answering_since.empty());
    EXPECT_GT(devices[kDevice].memory_free_bytes, 0u);  // the last figure
  }
  const absl::Time start = absl::Now();
  const std::string metrics = server().RenderMetrics();
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(100));
  EXPECT_THAT(metrics, HasSubstr("gpuexec_device_answering{device=\"0\"} 0"));
  kill(worker, SIGCONT);
  EXPECT_TRUE(WaitFor(
      [&] {
        auto d = client().ListDevices();
        return d.ok() && (*d)[kDevice].not_answering_since.empty();
      },
      absl::Seconds(5)));
  EXPECT_EQ(server().worker_pid(kDevice), worker);  // not restarted: it was only slow
}

// What the daemon holds for a worker that has stopped taking requests is
// bounded: past --worker_queue_bytes new work for the device is refused at
// once, naming the bound, and the device serves as before once its worker
// catches up.
TEST_F(FaultTest, AStoppedWorkersQueueIsBounded) {
  ServerOptions options;
  options.worker_queue_bytes = 64 << 10;
  GX_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> server, StartServer(options));
  GX_ASSERT_OK_AND_ASSIGN(Client c, Client::Connect(TargetOf(*server)));
  constexpr int kFlooders = 4;
  std::vector<Session> flooders;
  std::vector<Function> fills;
  std::vector<Buffer> buffers;
  for (int i = 0; i <= kFlooders; ++i) {
    GX_ASSERT_OK_AND_ASSIGN(Session s, c.OpenSession({kDevice}));
    GX_ASSERT_OK_AND_ASSIGN(Function fill, Kernel(s, "gx_fill_u32"));
    GX_ASSERT_OK_AND_ASSIGN(Buffer b, s.Allocate(4096));
    GX_ASSERT_OK(
        s.LaunchAndWait(fill, Config(1, 256), {Arg::Ptr(b), Arg::U32(1), Arg::U64(256)}).status());
    flooders.push_back(std::move(s));
    fills.push_back(fill);
    buffers.push_back(std::move(b));
  }
  Session probe = std::move(flooders.back());
  flooders.pop_back();
  const int worker = server->worker_pid(kDevice);
  ASSERT_GT(worker, 0);
  ASSERT_EQ(kill(worker, SIGSTOP), 0);
  struct Resume {
    int pid;
    ~Resume() { kill(pid, SIGCONT); }
  } resume{worker};
  // Launches the stopped worker never takes, until the daemon holds more
  // than the bound of them (the socket's buffers take the first few
  // hundred KiB).
  auto unsent = [&] {
    const std::string m = server->RenderMetrics();
    const std::string key = "gpuexec_worker_unsent_bytes{device=\"0\"} ";
    const size_t at = m.find(key);
    return at == std::string::npos ? uint64_t{0}
                                   : std::strtoull(m.c_str() + at + key.size(), nullptr, 10);
  };
  int launched = 0;
  bool over = false;
  for (int round = 0; round < 6 && !over; ++round) {
    for (int i = 0; i < kFlooders; ++i) {
      for (int k = 0; k < 1000; ++k) {
        GX_ASSERT_OK(flooders[i].LaunchAsync(fills[i], Config(1, 256),
                                             {Arg::Ptr(buffers[i]), Arg::U32(2), Arg::U64(256)}));
        ++launched;
      }
    }
    over = WaitFor([&] { return unsent() >= options.worker_queue_bytes; }, absl::Milliseconds(500));
  }
  ASSERT_TRUE(over) << launched << " launches left only " << unsent() << " bytes unsent";
  std::cout << launched << " launches queued; " << unsent() << " bytes not taken\n";
  const absl::Time start = absl::Now();
  EXPECT_THAT(
      probe.Launch(fills.back(), Config(1, 256),
                   {Arg::Ptr(buffers.back()), Arg::U32(3), Arg::U64(256)}),
      StatusIs(absl::StatusCode::kResourceExhausted,
               AllOf(HasSubstr("gx_fill_u32"), HasSubstr("device 0's worker has not yet taken"),
                     HasSubstr("--worker_queue_bytes=65536"))));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << "the refusal waited for the worker";
  // Thousands of refused launches are not thousands of log lines.
  EXPECT_THAT(server->RenderMetrics(),
              ::testing::ContainsRegex("gpuexec_log_failure_lines_left_out_total [1-9]"));

  kill(worker, SIGCONT);
  // What was queued runs; each flooder learns of any launch refused.
  for (Session& s : flooders) {
    absl::Status st = s.Synchronize().status();
    EXPECT_TRUE(st.ok() || st.code() == absl::StatusCode::kResourceExhausted) << st;
  }
  EXPECT_TRUE(WaitFor([&] { return unsent() == 0; }, absl::Seconds(5)));
  GX_EXPECT_OK(probe
                   .LaunchAndWait(fills.back(), Config(1, 256),
                                  {Arg::Ptr(buffers.back()), Arg::U32(4), Arg::U64(256)})
                   .status());
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> words, buffers.back().ReadAs<uint32_t>(256));
  EXPECT_EQ(words[0], 4u);
  EXPECT_EQ(server->worker_pid(kDevice), worker);  // it was only slow
  buffers.clear();
  for (Session& s : flooders) GX_EXPECT_OK(s.Close());
  GX_EXPECT_OK(probe.Close());
}

}  // namespace

// With a worker per tenant (the default with a tenants file), a tenant's
// faulting or hung kernels reset its own worker only: another tenant's
// buffer and its fill-and-read rounds on the same device go on without an
// error. Prints the attacker's resets, the bystander's rounds and its
// slowest round.
void FaultTest::AttackBesideABystander(Attack attack) {
  if (UnderMps()) {
    GTEST_SKIP() << "under MPS a fatal fault reaches every client of the GPU: see "
                    "UnderMpsAFaultReachesEveryWorkerAndIsChargedToItsTenant";
  }
  ServerOptions options;
  options.tenants_file = TwoTenantsFile();
  options.strike_limit = 0;  // the attack goes on: isolation alone protects
  GX_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> server, StartServer(options));
  GX_ASSERT_OK_AND_ASSIGN(Client attacker, ConnectAs(*server, "attack"));
  GX_ASSERT_OK_AND_ASSIGN(Client bystander, ConnectAs(*server, "bystand"));
  // For the record: what a tenant's worker costs. Its first session starts
  // it (cold), a second finds it (warm); the device memory its context
  // takes shows in the device's free memory (none on the double).
  const uint64_t free_before = (*bystander.ListDevices())[kDevice].memory_free_bytes;
  absl::Time start = absl::Now();
  GX_ASSERT_OK_AND_ASSIGN(Session kept, bystander.OpenSession({kDevice}));
  const absl::Duration cold = absl::Now() - start;
  start = absl::Now();
  GX_ASSERT_OK_AND_ASSIGN(Session warm, bystander.OpenSession({kDevice}));
  const absl::Duration warmed = absl::Now() - start;
  GX_ASSERT_OK(warm.Close());
  const uint64_t free_after = (*bystander.ListDevices())[kDevice].memory_free_bytes;
  std::cout << "a tenant's first session on a device (its worker starts): "
            << absl::FormatDuration(cold) << "; its next: " << absl::FormatDuration(warmed)
            << "; device memory its idle worker takes: "
            << (free_before > free_after ? (free_before - free_after) >> 20 : 0) << " MiB\n";
  const size_t held_bytes = BystanderBytes();
  GX_ASSERT_OK_AND_ASSIGN(Buffer held, kept.Allocate(held_bytes));
  const std::vector<uint8_t> pattern = Pattern(33, held_bytes);
  GX_ASSERT_OK(held.Write(0, pattern));
  GX_ASSERT_OK_AND_ASSIGN(Function fill, Kernel(kept, "gx_fill_u32"));

  // The bystander's rounds run all through the attacker's loop.
  std::atomic<bool> stop{false};
  std::atomic<int> rounds{0};
  std::atomic<int> errors{0};
  absl::Duration worst;
  std::thread rounds_thread([&] {
    while (!stop.load()) {
      const absl::Time start = absl::Now();
      if (absl::Status st = FillWith(kept, fill, static_cast<uint32_t>(rounds.load())); !st.ok()) {
        if (errors++ == 0) ADD_FAILURE() << "the bystander's round: " << st;
      }
      worst = std::max(worst, absl::Now() - start);
      ++rounds;
    }
  });
  const std::string cubin = KernelPath("cubin");
  const char* kernel = attack == Attack::kFault ? "gx_fault" : "gx_spin";
  SessionOptions attacking;
  attacking.device = kDevice;
  // A hung kernel: the shortest time limit a session may ask for.
  if (attack == Attack::kHang) attacking.kernel_time_limit = absl::Milliseconds(100);
  int resets = 0;
  const absl::Duration attack_time = AttackTime();
  const absl::Time until = absl::Now() + attack_time;
  while (absl::Now() < until) {
    auto s = attacker.OpenSession(attacking);
    if (!s.ok()) {
      // Its worker is restarting.
      EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable) << s.status();
      absl::SleepFor(absl::Milliseconds(5));
      continue;
    }
    auto m = s->LoadModuleFile(cubin);
    if (m.ok()) {
      auto f = m->GetFunction(kernel);
      // gx_fault's address 16 is unmapped; gx_spin's 2^50 ns, eleven days.
      const Arg arg = attack == Attack::kFault ? Arg::U64(16) : Arg::U64(uint64_t{1} << 50);
      if (f.ok()) {
        auto ran = s->LaunchAndWait(*f, Config(1, 1), {arg});
        if (!ran.ok() && ran.status().code() == absl::StatusCode::kAborted) ++resets;
      }
    }
    (void)s->Close();
  }
  stop.store(true);
  rounds_thread.join();
  std::cout << "in " << absl::FormatDuration(attack_time) << ": " << resets
            << (attack == Attack::kFault ? " faulting" : " hung")
            << " kernels of the attacker, each resetting its worker; " << rounds.load()
            << " fill-and-read rounds of the bystander meanwhile, " << errors.load()
            << " errors, the slowest " << absl::FormatDuration(worst) << "; its "
            << (held_bytes >> 20) << " MiB buffer ";
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> back, held.Read());
  std::cout << (back == pattern ? "intact" : "CHANGED") << "\n";
  EXPECT_GE(resets, 3);
  EXPECT_GT(rounds.load(), 0);
  EXPECT_EQ(errors.load(), 0);
  EXPECT_TRUE(back == pattern) << "the bystander's buffer changed";
  GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> seen_by_bystander, bystander.ListDevices());
  EXPECT_TRUE(seen_by_bystander[kDevice].own_worker);
  EXPECT_EQ(seen_by_bystander[kDevice].resets, 0u);
  EXPECT_EQ(seen_by_bystander[kDevice].workers, 2u);  // the shared one and its own
  GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> seen_by_attacker, attacker.ListDevices());
  EXPECT_TRUE(seen_by_attacker[kDevice].own_worker);
  EXPECT_GE(seen_by_attacker[kDevice].resets, 3u);
  EXPECT_THAT(seen_by_attacker[kDevice].last_reset, HasSubstr(kernel));
  EXPECT_THAT(server->RenderMetrics(),
              AllOf(HasSubstr("gpuexec_device_workers{device=\"0\"} 3"),
                    HasSubstr("gpuexec_tenant_workers{tenant=\"attacker\"} 1"),
                    HasSubstr("gpuexec_tenant_workers{tenant=\"bystander\"} 1")));
  GX_EXPECT_OK(held.Free());
  GX_EXPECT_OK(kept.Close());
}

namespace {

TEST_F(FaultTest, ATenantsFaultsResetOnlyItsOwnWorker) { AttackBesideABystander(Attack::kFault); }

TEST_F(FaultTest, ATenantsHungKernelsResetOnlyItsOwnWorker) {
  AttackBesideABystander(Attack::kHang);
}

// Under MPS, after a fatal fault the server takes no new client until all
// of its clients are gone: a restarted worker's cuInit fails with
// CUDA_ERROR_MPS_SERVER_NOT_READY meanwhile. The daemon tries again every
// 100 ms within the same reset (no new epoch, no growing backoff), and the
// device serves as soon as the server takes the worker. On the double, a
// file stands for the server's state.
TEST_F(FaultTest, ARestartTheMpsServerDoesNotTakeYetIsTriedAgainSoon) {
  if (!TestBackend().fake) GTEST_SKIP() << "the MPS server's state is the double's to stage";
  char dir_template[] = "/tmp/gpuexec-mps-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string not_ready = absl::StrCat(dir_template, "/not-ready");
  std::ofstream(not_ready) << "1";
  GX_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> server, StartServer(ServerOptions()));
  // Workers started from now on see the variable (the first one is up).
  setenv("GXFAKE_INIT_NOT_READY_FILE", not_ready.c_str(), 1);
  struct Unset {
    ~Unset() { unsetenv("GXFAKE_INIT_NOT_READY_FILE"); }
  } unset;
  GX_ASSERT_OK_AND_ASSIGN(Client c, Client::Connect(TargetOf(*server)));
  const uint64_t resets_before = (*c.ListDevices())[kDevice].resets;
  {
    GX_ASSERT_OK_AND_ASSIGN(Session s, c.OpenSession({kDevice}));
    GX_ASSERT_OK_AND_ASSIGN(Function fault, Kernel(s, "gx_fault"));
    EXPECT_THAT(s.LaunchAndWait(fault, Config(1, 1), {Arg::U64(16)}),
                StatusIs(absl::StatusCode::kAborted, _));
  }
  absl::SleepFor(absl::Milliseconds(800));  // several tries
  GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> waiting, c.ListDevices());
  EXPECT_FALSE(waiting[kDevice].healthy);
  EXPECT_EQ(waiting[kDevice].resets, resets_before + 1) << "each try is not a reset of its own";
  EXPECT_THAT(c.OpenSession({kDevice}),
              StatusIs(absl::StatusCode::kUnavailable,
                       AllOf(HasSubstr("device 0 is restarting"),
                             HasSubstr("CUDA_ERROR_MPS_SERVER_NOT_READY"))));
  // The server takes clients again: served within a try or two.
  const absl::Time ready = absl::Now();
  ASSERT_EQ(unlink(not_ready.c_str()), 0);
  rmdir(dir_template);
  EXPECT_TRUE(WaitFor(
      [&] {
        auto d = c.ListDevices();
        return d.ok() && (*d)[kDevice].healthy;
      },
      absl::Seconds(2)));
  Record("MPS server ready again, to the device serving", absl::Now() - ready);
  EXPECT_LT(absl::Now() - ready, absl::Milliseconds(500));
  GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> served, c.ListDevices());
  EXPECT_EQ(served[kDevice].resets, resets_before + 1);
  GX_ASSERT_OK_AND_ASSIGN(Session again, c.OpenSession({kDevice}));
  GX_EXPECT_OK(FillAndCheck(again, 9));
  GX_EXPECT_OK(again.Close());
}

// A fault can reach an idle worker from outside (under MPS, another
// client's): no call of its own fails, yet the MPS server takes no new
// client until it is gone. Its pings (one a second) make a driver call
// that finds the fault: the device resets within seconds with nobody
// calling, and serves again. On the double, a file stands for the reach
// (the worker that finds it removes it).
TEST_F(FaultTest, AnIdleWorkerFindsAFaultThatReachedItFromOutside) {
  if (!TestBackend().fake) GTEST_SKIP() << "the reach is the double's to stage";
  char dir_template[] = "/tmp/gpuexec-reach-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string reached = absl::StrCat(dir_template, "/reached");
  setenv("GXFAKE_REACHED_FILE", reached.c_str(), 1);
  struct Unset {
    ~Unset() { unsetenv("GXFAKE_REACHED_FILE"); }
  } unset;
  GX_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> server, StartServer(ServerOptions()));
  GX_ASSERT_OK_AND_ASSIGN(Client c, Client::Connect(TargetOf(*server)));
  GX_ASSERT_OK_AND_ASSIGN(Session s, c.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Buffer held, s.Allocate(4096));
  const uint64_t resets_before = (*c.ListDevices())[kDevice].resets;
  const int worker = server->worker_pid(kDevice);
  std::ofstream(reached) << "1";
  const absl::Time start = absl::Now();
  // Nobody calls (worker_pid asks the daemon, not the worker): the worker
  // finds it by itself, and is replaced.
  EXPECT_TRUE(WaitFor(
      [&] {
        const int now = server->worker_pid(kDevice);
        return now != worker;
      },
      absl::Seconds(3)));
  Record("a fault that reached an idle worker, to its reset", absl::Now() - start);
  EXPECT_NE(access(reached.c_str(), F_OK), 0) << "the worker took the reach";
  rmdir(dir_template);
  EXPECT_TRUE(WaitFor(
      [&] {
        auto d = c.ListDevices();
        return d.ok() && (*d)[kDevice].healthy;
      },
      absl::Seconds(3)));
  GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> after, c.ListDevices());
  EXPECT_EQ(after[kDevice].resets, resets_before + 1);
  EXPECT_THAT(after[kDevice].last_reset, HasSubstr("CUDA_ERROR_ILLEGAL_ADDRESS"));
  EXPECT_THAT(held.Read(), StatusIs(absl::StatusCode::kAborted, HasSubstr("was lost")));
  GX_EXPECT_OK(FillAndCheck(s, 4));  // the session itself lives on
  GX_EXPECT_OK(s.Close());
}

TEST_F(FaultTest, VanishedClientIsFreedWhenItsLeaseLapses) {
  const DeviceInfo before = DeviceAt(kDevice);
  // A client process of its own that holds 64 MiB and is killed.
  std::string self(4096, '\0');
  self.resize(static_cast<size_t>(readlink("/proc/self/exe", self.data(), self.size())));
  const std::string env = absl::StrCat("GX_VANISHING_CLIENT=", target());
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  envp.push_back(const_cast<char*>(env.c_str()));
  envp.push_back(nullptr);
  char* argv[] = {self.data(), nullptr};
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv, envp.data()), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "the client did not get as far as its kill (status " << status << ")";
  const absl::Time gone = absl::Now();
  const DeviceInfo held = DeviceAt(kDevice);
  EXPECT_EQ(held.sessions, before.sessions + 1);
  EXPECT_LE(held.memory_free_bytes + (uint64_t{64} << 20),
            before.memory_free_bytes + memory_slack());

  // Its lease (1 s) lapses; the session and its memory are gone.
  EXPECT_TRUE(WaitFor(
      [&] {
        DeviceInfo now = DeviceAt(kDevice);
        const uint64_t a = now.memory_free_bytes;
        const uint64_t b = before.memory_free_bytes;
        return now.sessions == before.sessions && (a > b ? a - b : b - a) <= memory_slack();
      },
      absl::Seconds(10)));
  std::printf("vanished client's memory back at baseline %.0f ms after it died\n",
              absl::ToDoubleMilliseconds(absl::Now() - gone));
}

}  // namespace
}  // namespace gpuexec::testing
