// Compute shares in the tenants file, against a server in this process on
// the test double: each tenant worker is an MPS client held to its tenant's
// share (its environment says so), a share a device cannot honour or one
// without MPS is refused at start naming the line, and a reload that
// cannot be honoured keeps the shares in force.
//
// MPS itself is the GPU host's: here a control pipe in a directory of the
// test's own stands for a control daemon (the daemon only looks for it),
// so these cases skip on a real driver, whose workers would try to reach
// it.

#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "tenants_fixture.h"

namespace gpuexec::testing {
namespace {

using ::testing::HasSubstr;

std::string TextOf(std::istream& in) {
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string TextOf(const std::string& path) {
  std::ifstream in(path);
  return TextOf(in);
}

// The worker processes this process started (gpuexecd __worker).
std::set<pid_t> Workers() {
  std::set<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(e.path().filename().string(), &pid)) continue;
    const std::string text = TextOf(e.path() / "stat");
    const size_t close = text.rfind(')');
    if (close == std::string::npos) continue;
    std::vector<std::string> fields = absl::StrSplit(text.substr(close + 2), ' ');
    if (fields.size() < 2 || fields[1] != std::to_string(getpid())) continue;
    const std::string args = TextOf(e.path() / "cmdline");
    if (absl::StrContains(args, "__worker")) out.insert(pid);
  }
  return out;
}

// The value of `name` in `pid`'s environment ("" if not set). A worker is
// not dumpable: reading it takes CAP_SYS_PTRACE (root has it).
std::string EnvOf(pid_t pid, const std::string& name) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/environ"));
  if (!in) {
    ADD_FAILURE() << "cannot read worker " << pid
                  << "'s environment (run as root, or with CAP_SYS_PTRACE)";
    return "";
  }
  const std::string text = TextOf(in);
  for (absl::string_view entry : absl::StrSplit(text, '\0')) {
    if (absl::ConsumePrefix(&entry, name + "=")) return std::string(entry);
  }
  return "";
}

class ComputeSharesTest : public TenantsTest {
 protected:
  void SetUp() override {
    TenantsTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (!TestBackend().fake) GTEST_SKIP() << "the control pipe here is no MPS daemon";
    pipes_ = files_.Path("mps");
    ASSERT_EQ(mkdir(pipes_.c_str(), 0700), 0);
    ASSERT_EQ(mkfifo((pipes_ + "/control").c_str(), 0600), 0);
    setenv("CUDA_MPS_PIPE_DIRECTORY", pipes_.c_str(), 1);
  }
  void TearDown() override {
    TenantsTest::TearDown();
    unsetenv("CUDA_MPS_PIPE_DIRECTORY");
  }

  static ServerOptions ByTenant(const std::string& mps = "auto") {
    ServerOptions o;
    o.isolation = "tenant";
    o.mps = mps;
    return o;
  }

  // The worker that `open` starts.
  pid_t WorkerStartedBy(const std::function<void()>& open) {
    const std::set<pid_t> before = Workers();
    open();
    for (pid_t p : Workers()) {
      if (before.count(p) == 0) return p;
    }
    ADD_FAILURE() << "no worker started";
    return 0;
  }

  std::string pipes_;
};

TEST_F(ComputeSharesTest, EachTenantsWorkerIsAnMpsClientHeldToItsShare) {
  WriteTenants(TwoTenants("  compute_share { fraction: 0.1 }\n"));
  Start(ByTenant());
  GX_ASSERT_OK_AND_ASSIGN(Client a, As(kTokenA));
  GX_ASSERT_OK_AND_ASSIGN(Client b, As(kTokenB));
  std::optional<Session> sa, sb;
  const pid_t wa = WorkerStartedBy([&] { sa = a.OpenSession({kDevice}).value(); });
  const pid_t wb = WorkerStartedBy([&] { sb = b.OpenSession({kDevice}).value(); });
  // 0.1 of the double's 132 SMs is 16 (the nearest multiple of 8): 12% of
  // the threads; team-b, without a share, takes the rest.
  EXPECT_EQ(EnvOf(wa, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "12");
  EXPECT_EQ(EnvOf(wb, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "88");
  EXPECT_EQ(EnvOf(wa, "CUDA_MPS_PIPE_DIRECTORY"), pipes_);
  // Each tenant is told its own share, and no other's.
  GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> da, a.ListDevices());
  GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> db, b.ListDevices());
  EXPECT_EQ(da[kDevice].compute_share_sms, 16u);
  EXPECT_TRUE(da[kDevice].compute_share_own);
  EXPECT_EQ(db[kDevice].compute_share_sms, 116u);
  EXPECT_FALSE(db[kDevice].compute_share_own);
  // Both still work.
  GX_EXPECT_OK(sa->Allocate(4096).status());
  GX_EXPECT_OK(sb->Allocate(4096).status());
}

TEST_F(ComputeSharesTest, TheDefaultShareIsEveryTenantsWithoutOne) {
  WriteTenants(TwoTenants("  compute_share { sms: 64 }\n"));
  ServerOptions o = ByTenant();
  o.default_compute_share = "16sm";
  Start(o);
  GX_ASSERT_OK_AND_ASSIGN(Client b, As(kTokenB));
  std::optional<Session> sb;
  const pid_t wb = WorkerStartedBy([&] { sb = b.OpenSession({kDevice}).value(); });
  EXPECT_EQ(EnvOf(wb, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "12");  // 16 of 132
}

TEST_F(ComputeSharesTest, WithoutSharesNoWorkerIsHeld) {
  WriteTenants(TwoTenants());
  Start(ByTenant());
  GX_ASSERT_OK_AND_ASSIGN(Client a, As(kTokenA));
  GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> da, a.ListDevices());
  EXPECT_EQ(da[kDevice].compute_share_sms, 0u);
  std::optional<Session> sa;
  const pid_t wa = WorkerStartedBy([&] { sa = a.OpenSession({kDevice}).value(); });
  EXPECT_EQ(EnvOf(wa, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "");
}

TEST_F(ComputeSharesTest, SharesWithoutMpsAreRefusedAtStart) {
  WriteTenants(TwoTenants("  compute_share { fraction: 0.1 }\n"));
  ServerOptions o = ByTenant("off");
  o.tenants_file = tenants_file_;
  auto server = StartServer(o);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(server.status().message(),
              HasSubstr("tenant 'team-a' has a compute share of device 0, but no MPS control "
                        "daemon serves this host (or --mps=off), so the tenants' workers would be "
                        "time-sliced, not held to their shares"));
  // With one worker for every tenant, shares need green contexts, which a
  // driver before 12.5 lacks.
  setenv("GXFAKE_DRIVER_VERSION", "12040", 1);
  o = ByTenant();
  o.isolation = "device";
  o.tenants_file = tenants_file_;
  server = StartServer(o);
  unsetenv("GXFAKE_DRIVER_VERSION");
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(),
              HasSubstr("but with --isolation=device every tenant runs in one worker, where "
                        "shares need green contexts, which this CUDA driver lacks"));
  // --mps=external needs one serving.
  unsetenv("CUDA_MPS_PIPE_DIRECTORY");
  setenv("CUDA_MPS_PIPE_DIRECTORY", files_.Path("nothing-here").c_str(), 1);
  o = ByTenant("external");
  o.tenants_file = tenants_file_;
  server = StartServer(o);
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(), HasSubstr("--mps=external, but no MPS control daemon"));
}

// A pipe directory that another user could write (or swap) is no control
// daemon's, and workers are then kept from any (they would otherwise look
// for one themselves at each start, where the daemon counts none).
TEST_F(ComputeSharesTest, WorkersAreMpsClientsOnlyWhereTheDaemonCountsThemSo) {
  WriteTenants(TwoTenants(""));
  ASSERT_EQ(chmod(pipes_.c_str(), 0777), 0);
  Start(ByTenant());
  GX_ASSERT_OK_AND_ASSIGN(Client a, As(kTokenA));
  std::optional<Session> sa;
  const pid_t wa = WorkerStartedBy([&] { sa = a.OpenSession({kDevice}).value(); });
  EXPECT_EQ(EnvOf(wa, "CUDA_MPS_PIPE_DIRECTORY"), "/nonexistent/gpuexec-mps-off");
  GX_EXPECT_OK(sa->Allocate(4096).status());
  GX_EXPECT_OK(sa->Close());
}

// Counted at start, checked again at each worker's start: a directory that
// has since become writable by others (or gone) keeps the new worker away.
TEST_F(ComputeSharesTest, AWorkerStartedAfterTheDirectoryChangedIsKeptFromIt) {
  WriteTenants(TwoTenants(""));
  Start(ByTenant());
  GX_ASSERT_OK_AND_ASSIGN(Client a, As(kTokenA));
  GX_ASSERT_OK_AND_ASSIGN(Client b, As(kTokenB));
  std::optional<Session> sa, sb;
  const pid_t wa = WorkerStartedBy([&] { sa = a.OpenSession({kDevice}).value(); });
  EXPECT_EQ(EnvOf(wa, "CUDA_MPS_PIPE_DIRECTORY"), pipes_);
  ASSERT_EQ(chmod(pipes_.c_str(), 0777), 0);
  const pid_t wb = WorkerStartedBy([&] { sb = b.OpenSession({kDevice}).value(); });
  EXPECT_EQ(EnvOf(wb, "CUDA_MPS_PIPE_DIRECTORY"), "/nonexistent/gpuexec-mps-off");
  GX_EXPECT_OK(sb->Allocate(4096).status());
  GX_EXPECT_OK(sa->Close());
  GX_EXPECT_OK(sb->Close());
}

// A tenant of priority LOW: its worker is an MPS client of below-normal
// priority, the other's of normal; without MPS nothing would honour it.
TEST_F(ComputeSharesTest, ALowPriorityTenantsWorkerIsABelowNormalMpsClient) {
  WriteTenants(TwoTenants("  priority: LOW\n"));
  Start(ByTenant());
  GX_ASSERT_OK_AND_ASSIGN(Client a, As(kTokenA));
  GX_ASSERT_OK_AND_ASSIGN(Client b, As(kTokenB));
  std::optional<Session> sa, sb;
  const pid_t wa = WorkerStartedBy([&] { sa = a.OpenSession({kDevice}).value(); });
  const pid_t wb = WorkerStartedBy([&] { sb = b.OpenSession({kDevice}).value(); });
  EXPECT_EQ(EnvOf(wa, "CUDA_MPS_CLIENT_PRIORITY"), "1");
  EXPECT_EQ(EnvOf(wb, "CUDA_MPS_CLIENT_PRIORITY"), "");
  GX_EXPECT_OK(sa->Allocate(4096).status());
  server_->Shutdown(absl::Seconds(10));
  server_.reset();

  ServerOptions o = ByTenant("off");
  o.tenants_file = tenants_file_;
  auto refused = StartServer(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("tenant 'team-a' has priority LOW, but no MPS control daemon serves"));
}

TEST_F(ComputeSharesTest, AShareTheDeviceCannotHonourIsRefusedNamingItsLine) {
  WriteTenants(TwoTenants("  compute_share { sms: 12 }\n"));
  ServerOptions o = ByTenant();
  o.tenants_file = tenants_file_;
  auto server = StartServer(o);
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(),
              HasSubstr("tenants.textproto:5: tenant 'team-a' compute_share: 12 SMs cannot be a "
                        "part of its own on device 0 (132 SMs, parts of at least 8 and a multiple "
                        "of 8)"));
}

TEST_F(ComputeSharesTest, AReloadThatCannotBeHonouredKeepsTheSharesInForce) {
  WriteTenants(TwoTenants("  compute_share { fraction: 0.1 }\n"));
  Start(ByTenant());
  WriteTenants(TwoTenants("  compute_share { sms: 128 }\n"));
  const absl::Status reload = server_->ReloadTenants();
  EXPECT_EQ(reload.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(reload.message(),
              HasSubstr("tenant 'team-a' compute_share: the shares of device 0 leave 4 of its 132 "
                        "SMs to the tenants without a share"));
  GX_ASSERT_OK_AND_ASSIGN(Client a, As(kTokenA));
  std::optional<Session> sa;
  const pid_t wa = WorkerStartedBy([&] { sa = a.OpenSession({kDevice}).value(); });
  EXPECT_EQ(EnvOf(wa, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "12");
  // One that can be honoured is in force for the workers started after it.
  WriteTenants(TwoTenants("  compute_share { fraction: 0.5 }\n"));
  GX_ASSERT_OK(server_->ReloadTenants());
  GX_ASSERT_OK_AND_ASSIGN(Client b, As(kTokenB));
  std::optional<Session> sb;
  const pid_t wb = WorkerStartedBy([&] { sb = b.OpenSession({kDevice}).value(); });
  // team-a 64 SMs (48%): team-b the rest, 52%.
  EXPECT_EQ(EnvOf(wb, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "52");
}

// --mps=own: the daemon's own control daemon (a stand-in for NVIDIA's
// here), in private directories, its workers its clients, gone with it.
TEST_F(ComputeSharesTest, AControlDaemonOfItsOwnServesItsWorkersAndGoesWithIt) {
  unsetenv("CUDA_MPS_PIPE_DIRECTORY");  // not the host's: its own
  const std::string record = files_.Path("mps-record");
  setenv("GPUEXEC_TEST_MPS_RECORD", record.c_str(), 1);
  WriteTenants(TwoTenants("  compute_share { sms: 32 }\n"));
  ServerOptions o = ByTenant("own");
  o.mps_control = GPUEXEC_TEST_MPS_CONTROL;
  Start(o);
  GX_ASSERT_OK_AND_ASSIGN(Client a, As(kTokenA));
  std::optional<Session> sa;
  const pid_t wa = WorkerStartedBy([&] { sa = a.OpenSession({kDevice}).value(); });
  const std::string pipes = EnvOf(wa, "CUDA_MPS_PIPE_DIRECTORY");
  EXPECT_THAT(pipes, HasSubstr("/gpuexec-mps-"));
  EXPECT_EQ(EnvOf(wa, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "24");
  EXPECT_FALSE(EnvOf(wa, "CUDA_MPS_LOG_DIRECTORY").empty());
  struct stat st;
  ASSERT_EQ(stat(pipes.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  sa.reset();
  server_->Shutdown(absl::Seconds(10));
  server_.reset();
  EXPECT_EQ(TextOf(record), absl::StrCat("started ", pipes, " 700\nquit\n"));
  // Its directories went with it.
  EXPECT_NE(stat(pipes.c_str(), &st), 0);
  unsetenv("GPUEXEC_TEST_MPS_RECORD");
}

// A control daemon that ends leaves no worker unheld: the next worker with
// a share is refused, saying why, and the daemon serves on.
TEST_F(ComputeSharesTest, NoWorkerStartsUnheldOnceTheControlDaemonEnded) {
  unsetenv("CUDA_MPS_PIPE_DIRECTORY");
  const std::string record = files_.Path("mps-record");
  setenv("GPUEXEC_TEST_MPS_RECORD", record.c_str(), 1);
  WriteTenants(TwoTenants("  compute_share { sms: 32 }\n"));
  ServerOptions o = ByTenant("own");
  o.mps_control = GPUEXEC_TEST_MPS_CONTROL;
  Start(o);
  unsetenv("GPUEXEC_TEST_MPS_RECORD");
  std::ifstream pid_file(record + ".pid");
  pid_t control = 0;
  ASSERT_TRUE(pid_file >> control);
  ASSERT_EQ(kill(control, SIGKILL), 0);
  // Dead (a zombie until the daemon reaps it) before the next worker.
  ASSERT_TRUE(WaitFor(
      [&] {
        const std::string text = TextOf(absl::StrCat("/proc/", control, "/stat"));
        return text.empty() || absl::StrContains(text, ") Z ");
      },
      absl::Seconds(10)));
  GX_ASSERT_OK_AND_ASSIGN(Client b, As(kTokenB));
  absl::StatusOr<Session> sb = b.OpenSession({kDevice});
  ASSERT_FALSE(sb.ok());
  EXPECT_EQ(sb.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(sb.status().message(), HasSubstr("no MPS control daemon serves any longer"));
}

TEST_F(ComputeSharesTest, AControlDaemonThatDoesNotServeStopsTheStartSayingWhy) {
  WriteTenants(TwoTenants("  compute_share { sms: 32 }\n"));
  ServerOptions o = ByTenant("own");
  o.tenants_file = tenants_file_;
  o.mps_control = files_.Path("no-such-program");
  auto server = StartServer(o);
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(), HasSubstr("could not be started"));
  EXPECT_THAT(server.status().message(), HasSubstr("--mps_control"));
  setenv("GPUEXEC_TEST_MPS_FAIL", "1", 1);
  o.mps_control = GPUEXEC_TEST_MPS_CONTROL;
  server = StartServer(o);
  unsetenv("GPUEXEC_TEST_MPS_FAIL");
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(),
              HasSubstr("ended before it served (exit status 3); its log: "));
  EXPECT_THAT(server.status().message(), HasSubstr("told to fail"));
}

}  // namespace
}  // namespace gpuexec::testing
