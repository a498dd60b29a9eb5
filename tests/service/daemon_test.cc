// The daemon as a whole: starting without a driver, health, reflection,
// and the other ways in (Unix socket, in-process channel).

#include <fcntl.h>
#include <grpcpp/generic/generic_stub.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "daemon_process.h"
#include "gpuexec/v1/gpuexec.grpc.pb.h"
#include "health_client.h"
#include "service_test_fixture.h"
#include "tests/support/cpu_ticks.h"

namespace gpuexec::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A daemon whose driver library does not exist: it serves, with no devices.
absl::StatusOr<std::unique_ptr<Server>> StartWithoutADriver() {
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.driver_library = "libgpuexec-no-such-driver.so.1";
  options.worker_program = DaemonProgram();
  return Server::Start(options);
}

TEST(DaemonTest, WithoutADriverItServesNoDevicesAndIsNotServing) {
  auto server = StartWithoutADriver();
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*server)->device_count(), 0);
  const std::string target = TargetOf(**server);

  GX_ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(target));
  GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> devices, client.ListDevices());
  EXPECT_TRUE(devices.empty());
  EXPECT_THAT(client.OpenSession({}),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("libgpuexec-no-such-driver")));
  EXPECT_EQ(Health(target, ""), HealthStatus::NOT_SERVING);
  EXPECT_EQ(Health(target, "gpuexec.v1.GpuExec"), HealthStatus::NOT_SERVING);
  EXPECT_EQ(Health(target, "liveness"), HealthStatus::SERVING);
  (*server)->Shutdown();
}

// Watch reports the status now and each change after; at shutdown every name
// turns NOT_SERVING and the stream ends. An unknown name is NOT_FOUND to
// Check and SERVICE_UNKNOWN to Watch.
TEST(DaemonTest, HealthWatchFollowsTheStatusUntilShutdown) {
  auto server = StartWithoutADriver();
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string target = TargetOf(**server);
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));

  grpc::ClientContext check_ctx;
  grpc::health::v1::HealthCheckRequest unknown;
  unknown.set_service("no-such-service");
  HealthStatus response;
  const grpc::Status check = stub->Check(&check_ctx, unknown, &response);
  EXPECT_EQ(check.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(check.error_message(), HasSubstr("no-such-service"));

  grpc::ClientContext unknown_ctx;
  auto unknown_watch = stub->Watch(&unknown_ctx, unknown);
  ASSERT_TRUE(unknown_watch->Read(&response));
  EXPECT_EQ(response.status(), HealthStatus::SERVICE_UNKNOWN);
  unknown_ctx.TryCancel();
  unknown_watch->Finish();

  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckRequest liveness;
  liveness.set_service("liveness");
  auto watch = stub->Watch(&ctx, liveness);
  ASSERT_TRUE(watch->Read(&response));
  EXPECT_EQ(response.status(), HealthStatus::SERVING);
  std::thread stopper([&] { (*server)->Shutdown(); });
  ASSERT_TRUE(watch->Read(&response));
  EXPECT_EQ(response.status(), HealthStatus::NOT_SERVING);
  EXPECT_FALSE(watch->Read(&response));
  EXPECT_TRUE(watch->Finish().ok());
  stopper.join();
}

class DaemonWithDeviceTest : public ServiceTest {
 protected:
  // These tests hold no device memory of their own.
  void TearDown() override {}
};

TEST_F(DaemonWithDeviceTest, HealthIsServing) {
  EXPECT_EQ(Health(target(), ""), HealthStatus::SERVING);
  EXPECT_EQ(Health(target(), "gpuexec.v1.GpuExec"), HealthStatus::SERVING);
}

// Server reflection lists the service. The request is encoded by hand
// (ServerReflectionRequest{list_services: ""} is field 7, empty) so that the
// test does not define the reflection messages a second time.
TEST_F(DaemonWithDeviceTest, ReflectionListsTheService) {
  grpc::GenericStub stub(grpc::CreateChannel(target(), grpc::InsecureChannelCredentials()));
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  auto call =
      stub.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag;
  bool ok;
  auto next = [&](intptr_t want) {
    EXPECT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(reinterpret_cast<intptr_t>(tag), want);
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(next(1));
  const char request_bytes[] = {0x3a, 0x00};
  grpc::Slice slice(request_bytes, sizeof(request_bytes));
  grpc::ByteBuffer request(&slice, 1);
  call->Write(request, reinterpret_cast<void*>(2));
  ASSERT_TRUE(next(2));
  grpc::ByteBuffer response;
  call->Read(&response, reinterpret_cast<void*>(3));
  ASSERT_TRUE(next(3));
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_THAT(bytes, HasSubstr("gpuexec.v1.GpuExec"));
  EXPECT_THAT(bytes, HasSubstr("grpc.health.v1.Health"));
  call->WritesDone(reinterpret_cast<void*>(4));
  next(4);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  next(5);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

// A request that is not the method's message is refused with a status that
// says so, and the daemon goes on serving: on the streams the daemon parses
// itself (served raw), and on a method gRPC parses.
TEST_F(DaemonWithDeviceTest, UnparsableRequestsAreRefused) {
  grpc::GenericStub stub(grpc::CreateChannel(target(), grpc::InsecureChannelCredentials()));
  const char junk[] = {'\xff', '\xff', '\xff', '\x01'};
  auto call_with_junk = [&](const std::string& method) {
    grpc::CompletionQueue cq;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto call = stub.PrepareCall(&ctx, method, &cq);
    void* tag;
    bool ok;
    call->StartCall(reinterpret_cast<void*>(1));
    cq.Next(&tag, &ok);
    grpc::Slice slice(junk, sizeof(junk));
    grpc::ByteBuffer request(&slice, 1);
    call->WriteLast(request, grpc::WriteOptions(), reinterpret_cast<void*>(2));
    cq.Next(&tag, &ok);
    grpc::ByteBuffer response;
    call->Read(&response, reinterpret_cast<void*>(3));
    cq.Next(&tag, &ok);
    EXPECT_FALSE(ok) << method << " answered junk with a message";
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(4));
    cq.Next(&tag, &ok);
    return status;
  };
  const grpc::Status read = call_with_junk("/gpuexec.v1.GpuExec/Read");
  EXPECT_EQ(read.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(read.error_message(), HasSubstr("gpuexec.v1.ReadRequest"));
  const grpc::Status execute = call_with_junk("/gpuexec.v1.GpuExec/Execute");
  EXPECT_EQ(execute.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(execute.error_message(), HasSubstr("gpuexec.v1.ExecuteRequest"));
  const grpc::Status write = call_with_junk("/gpuexec.v1.GpuExec/Write");
  EXPECT_EQ(write.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(write.error_message(), HasSubstr("gpuexec.v1.WriteRequest"));
  EXPECT_FALSE(call_with_junk("/gpuexec.v1.GpuExec/Allocate").ok());

  GX_ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(target()));
  GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> devices, client.ListDevices());
  EXPECT_FALSE(devices.empty());
}

// A client that queues tens of thousands of commands wanting answers, never
// reads them, and goes away: its stream still ends, and the daemon shuts
// down promptly (the answers it could not write no longer hold back the
// stream's end).
TEST(DaemonTest, AClientThatNeverReadsItsAnswersDoesNotHoldUpShutdown) {
  auto server = StartServer(ServerOptions());
  ASSERT_TRUE(server.ok()) << server.status();
  GX_ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(TargetOf(**server)));
  GX_ASSERT_OK_AND_ASSIGN(Session session, client.OpenSession({}));
  auto stub = v1::GpuExec::NewStub(
      grpc::CreateChannel(TargetOf(**server), grpc::InsecureChannelCredentials()));
  {
    // Far more answers than the stream's flow-control window holds: the
    // daemon's write stalls, its unwritten answers pile up to its limit,
    // and it stops reading (so this writer stalls too, until the cancel).
    grpc::ClientContext context;
    auto rw = stub->Execute(&context);
    std::thread writer([&] {
      uint64_t id = 1;
      for (int m = 0; m < 1000; ++m) {
        v1::ExecuteRequest request;
        if (m == 0) request.set_session(session.token());
        for (int i = 0; i < 4000; ++i) {
          v1::Command* barrier = request.add_commands();  // answered at once
          barrier->set_id(id++);
          barrier->set_reply(true);
        }
        if (!rw->Write(request)) return;
      }
    });
    absl::SleepFor(absl::Seconds(2));
    context.TryCancel();
    writer.join();
    rw->Finish();
  }
  absl::Notification stopped;
  std::thread stopper([&] {
    (*server)->Shutdown(absl::Seconds(2));
    stopped.Notify();
  });
  if (!stopped.WaitForNotificationWithTimeout(absl::Seconds(30))) {
    std::fprintf(stderr, "the daemon did not shut down within 30 s\n");
    std::_Exit(1);  // the stopper is stuck; nothing else can end this process
  }
  stopper.join();
}

TEST(DaemonTest, ServesOnAUnixSocketAndInProcess) {
  const std::string path = absl::StrCat(::testing::TempDir(), "gpuexec-test-", getpid(), ".sock");
  ServerOptions options;
  options.listen_address = "";
  options.unix_socket = path;
  options.driver_library = TestBackend().driver;
  options.worker_program = DaemonProgram();
  auto server = Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  GX_ASSERT_OK_AND_ASSIGN(Client over_socket, Client::Connect(absl::StrCat("unix:", path)));
  GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> a, over_socket.ListDevices());
  Client in_process((*server)->InProcessChannel());
  GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> b, in_process.ListDevices());
  EXPECT_EQ(a.size(), b.size());
  EXPECT_EQ(static_cast<int>(a.size()), (*server)->device_count());
  (*server)->Shutdown();
  unlink(path.c_str());
}

TEST(DaemonTest, NothingToListenOnIsRefused) {
  ServerOptions options;
  options.listen_address = "";
  options.driver_library = "libgpuexec-no-such-driver.so.1";
  options.worker_program = DaemonProgram();
  EXPECT_THAT(Server::Start(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("listen")));
}

TEST(DaemonTest, AnAddressInUseIsRefused) {
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.driver_library = "libgpuexec-no-such-driver.so.1";
  options.worker_program = DaemonProgram();
  auto first = Server::Start(options);
  ASSERT_TRUE(first.ok()) << first.status();
  options.listen_address = absl::StrCat("127.0.0.1:", (*first)->port());
  EXPECT_THAT(Server::Start(options),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cannot listen")));
  (*first)->Shutdown();
}

}  // namespace
}  // namespace gpuexec::testing

// ------------------------------------------------------------ gpuexecd as a process

namespace gpuexec::testing {
namespace {

// Peak resident memory of a process (VmHWM), in bytes; 0 if unknown.
uint64_t PeakRss(pid_t pid) {
  auto status = ReadFile(absl::StrCat("/proc/", pid, "/status"));
  if (!status) return 0;
  const size_t at = status->find("VmHWM:");
  if (at == std::string::npos) return 0;
  return std::strtoull(status->c_str() + at + 6, nullptr, 10) * 1024;
}

// The processes `pid` started that are running.
std::vector<pid_t> Children(pid_t pid) {
  std::vector<pid_t> children;
  for (const auto& task :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"))) {
    auto listed = ReadFile((task.path() / "children").string());
    if (!listed) continue;
    for (absl::string_view c : absl::StrSplit(*listed, ' ', absl::SkipEmpty())) {
      pid_t child = 0;
      if (absl::SimpleAtoi(c, &child)) children.push_back(child);
    }
  }
  return children;
}

// The daemon's stderr into `path`.
DaemonProcess::Options LogTo(const std::string& path) {
  DaemonProcess::Options o;
  o.log_path = path;
  return o;
}

// What a command prints (stdout and stderr), and its exit status.
std::pair<int, std::string> RunCommand(const std::string& command) {
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(DaemonProcessTest, ServesAndStopsCleanlyOnSigterm) {
  DaemonProcess daemon({});
  ASSERT_GT(daemon.pid(), 0);
  ClientOptions options;
  options.connect_timeout = absl::Seconds(20);
  GX_ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(daemon.target(), options));
  GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> devices, client.ListDevices());
  for (const DeviceInfo& d : devices) EXPECT_EQ(d.daemon_address, "") << "none was given";
  EXPECT_EQ(daemon.Stop(), 0);
}

// A daemon in a pool names itself as its clients reach it (in Kubernetes,
// the pod's IP from the downward API); the name is bounded and printable.
TEST(DaemonProcessTest, ListDevicesReportsTheAdvertisedAddress) {
  DaemonProcess daemon({"--advertise_address=10.4.0.17:50051"});
  ClientOptions options;
  options.connect_timeout = absl::Seconds(20);
  GX_ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(daemon.target(), options));
  GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> devices, client.ListDevices());
  ASSERT_FALSE(devices.empty());
  for (const DeviceInfo& d : devices) EXPECT_EQ(d.daemon_address, "10.4.0.17:50051");
  EXPECT_EQ(daemon.Stop(), 0);

  const std::string long_name(300, 'n');
  auto [status, out] = RunCommand(
      absl::StrCat(DaemonProgram(), " --listen=127.0.0.1:0 --driver=", TestBackend().driver,
                   " --advertise_address=", long_name));
  EXPECT_EQ(status, 1) << out;
  EXPECT_THAT(out, HasSubstr("--advertise_address"));
  EXPECT_THAT(out, HasSubstr("at most 253 printable characters"));
  EXPECT_THAT(out, Not(HasSubstr(long_name.substr(0, 100)))) << "the flag's value echoed whole";
}

// The front process (gRPC, sessions, module store) never loads the driver:
// each device has a worker process, gpuexecd again, that does. The workers,
// and the warm compile process, end with the daemon.
TEST(DaemonProcessTest, FrontProcessNeverLoadsTheDriverAndWorkersEndWithIt) {
  DaemonProcess daemon({});
  ClientOptions options;
  options.connect_timeout = absl::Seconds(20);
  GX_ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(daemon.target(), options));
  GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> devices, client.ListDevices());
  if (devices.empty()) GTEST_SKIP() << "driver " << TestBackend().driver << " has no device";
  std::string driver = TestBackend().driver;
  driver = driver.substr(driver.rfind('/') + 1);
  driver = driver.substr(0, driver.find(".so") + 3);  // libcuda.so, libgpuexec_fakecuda.so
  auto maps_driver = [&](pid_t pid) {
    auto maps = ReadFile(absl::StrCat("/proc/", pid, "/maps"));
    return maps.has_value() && maps->find(driver) != std::string::npos;
  };
  EXPECT_FALSE(maps_driver(daemon.pid())) << "the front process mapped " << driver;

  // Its children: a worker per device, and the warm compile process
  // (server/compile/zygote.h) where compiles are on.
  const std::vector<pid_t> children = Children(daemon.pid());
  std::vector<pid_t> workers;
  for (pid_t child : children) {
    auto cmdline = ReadFile(absl::StrCat("/proc/", child, "/cmdline"));
    ASSERT_TRUE(cmdline.has_value());
    if (cmdline->find("__worker") != std::string::npos) {
      workers.push_back(child);
    } else {
      EXPECT_NE(cmdline->find(std::string("__compile\0--warm", 17)), std::string::npos)
          << "a child that is neither a worker nor the warm compile process";
      EXPECT_FALSE(maps_driver(child)) << "the compile process mapped " << driver;
    }
  }
  ASSERT_EQ(workers.size(), devices.size()) << "one worker per device";
  for (pid_t w : workers)
    EXPECT_TRUE(maps_driver(w)) << "worker " << w << " has not mapped " << driver;
  EXPECT_EQ(daemon.Stop(), 0);
  for (pid_t c : children) {
    // Reaped by the daemon before it exited: gone, or a zombie of init's.
    auto stat = ReadFile(absl::StrCat("/proc/", c, "/stat"));
    EXPECT_TRUE(!stat.has_value() || stat->find(") Z") != std::string::npos)
        << "child " << c << " outlived the daemon";
  }
}

// An idle daemon sleeps, and so do its workers and its warm compile
// process (which once spun a core in its wait for the next fork).
TEST(DaemonProcessTest, AnIdleDaemonAndItsProcessesSleep) {
  // The NVRTC double where no other is named, so that a warm compile
  // process starts (where compiles can be sandboxed: Landlock).
  const char* named = std::getenv("GPUEXEC_TEST_NVRTC");
  const std::string nvrtc = named != nullptr ? named : GPUEXEC_TEST_DEFAULT_NVRTC;
  DaemonProcess daemon(std::filesystem::exists(nvrtc) ? std::vector<std::string>{"--nvrtc=" + nvrtc}
                                                      : std::vector<std::string>{});
  ClientOptions options;
  options.connect_timeout = absl::Seconds(20);
  GX_ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(daemon.target(), options));
  GX_ASSERT_OK(client.ListDevices().status());
  // Every child started and past its start-up (the warm process compiles
  // a kernel first).
  (void)WaitFor(
      [&] {
        for (pid_t c : Children(daemon.pid())) {
          auto cmdline = ReadFile(absl::StrCat("/proc/", c, "/cmdline"));
          if (cmdline && cmdline->find("__compile") != std::string::npos) return true;
        }
        return false;
      },
      absl::Seconds(10));
  absl::SleepFor(absl::Seconds(1));
  std::vector<pid_t> pids = Children(daemon.pid());
  pids.push_back(daemon.pid());
  std::vector<int64_t> before;
  for (pid_t p : pids) before.push_back(CpuTicks(p));
  absl::SleepFor(absl::Seconds(2));
  for (size_t i = 0; i < pids.size(); ++i) {
    auto cmdline = ReadFile(absl::StrCat("/proc/", pids[i], "/cmdline"));
    // A tick is 10 ms: a process spinning takes about 200 in these 2 s.
    EXPECT_LE(CpuTicks(pids[i]) - before[i], 10)
        << "process " << pids[i] << " ("
        << (cmdline ? absl::StrReplaceAll(cmdline->substr(0, 120), {{std::string(1, '\0'), " "}})
                    : "gone")
        << ") took CPU while the daemon was idle";
  }
  EXPECT_EQ(daemon.Stop(), 0);
}

// One line per event that matters, each with a time and a level letter;
// --log_level drops the lower levels.
TEST(DaemonProcessTest, LogsOneLinePerEvent) {
  const std::string log_path = absl::StrCat(::testing::TempDir(), "gpuexecd-log-", getpid());
  {
    DaemonProcess daemon({"--log_level=info", "--default_lease_ms=300"}, LogTo(log_path));
    ClientOptions options;
    options.connect_timeout = absl::Seconds(20);
    GX_ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(daemon.target(), options));
    GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> devices, client.ListDevices());
    if (devices.empty()) GTEST_SKIP() << "driver " << TestBackend().driver << " has no device";
    {
      GX_ASSERT_OK_AND_ASSIGN(Session closed_by_client, client.OpenSession({}));
      GX_ASSERT_OK(closed_by_client.Close());
    }
    GX_ASSERT_OK_AND_ASSIGN(Session lapses, client.OpenSession({}));
    GX_ASSERT_OK_AND_ASSIGN(Buffer b, lapses.Allocate(4096));
    ASSERT_TRUE(WaitFor([&] { return ReadFile(log_path)->find("lapsed") != std::string::npos; },
                        absl::Seconds(10)));
    EXPECT_THAT(b.Free(), StatusIs(absl::StatusCode::kNotFound,
                                   HasSubstr("was closed: its lease of 300 ms lapsed")));
    EXPECT_EQ(daemon.Stop(), 0);
  }
  const std::string log = *ReadFile(log_path);
  std::vector<std::string> lines = absl::StrSplit(log, '\n', absl::SkipEmpty());
  for (const std::string& line : lines) {
    // 2026-11-30T06:59:50.921Z I ...
    EXPECT_THAT(line, ::testing::MatchesRegex("[0-9-]+T[0-9:.]+Z [DIWE] .+")) << line;
  }
  auto has = [&](const std::string& what) {
    return std::any_of(lines.begin(), lines.end(),
                       [&](const std::string& l) { return l.find(what) != std::string::npos; });
  };
  EXPECT_TRUE(has("I CUDA driver")) << log;
  EXPECT_TRUE(has("I device 0: ")) << log;
  EXPECT_TRUE(has("I gpuexecd serving gpuexec.v1 on unix:")) << log;
  // The audit trail: tenant and peer of each session opened and closed.
  EXPECT_TRUE(has(" of tenant 'default' from unix:uid=")) << log;
  EXPECT_TRUE(has(" opened on device 0 (lease 300 ms")) << log;
  EXPECT_TRUE(has(" of tenant 'default' closed: its client (unix:uid=")) << log;
  EXPECT_TRUE(has(") closed it; freed 0 buffer(s)")) << log;
  EXPECT_TRUE(has(" closed: its lease of 300 ms lapsed; freed 1 buffer(s), 4096 bytes")) << log;
  EXPECT_TRUE(has("I Free from ")) << log;
  EXPECT_TRUE(has("failed: NOT_FOUND: session ")) << log;
  EXPECT_TRUE(has("I signal 15: shutting down")) << log;
  EXPECT_TRUE(has("I gpuexecd stopped")) << log;

  // At --log_level=warning none of those informational lines appear.
  {
    DaemonProcess quiet({"--log_level=warning"}, LogTo(log_path));
    ClientOptions options;
    options.connect_timeout = absl::Seconds(20);
    GX_ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(quiet.target(), options));
    GX_ASSERT_OK_AND_ASSIGN(Session s, client.OpenSession({}));
    GX_ASSERT_OK(s.Close());
    EXPECT_EQ(quiet.Stop(), 0);
  }
  const std::string quiet_log = *ReadFile(log_path);
  EXPECT_EQ(quiet_log.find(" I "), std::string::npos) << quiet_log;
  unlink(log_path.c_str());
}

// The tenants file is reread on SIGHUP: a bad one is refused with one log
// line and the one in force stays; a good one is in force at once.
TEST(DaemonProcessTest, SighupReloadsTheTenantsFileAndABadOneKeepsTheOld) {
  const std::string dir = ::testing::TempDir();
  const std::string file = absl::StrCat(dir, "gpuexecd-tenants-", getpid(), ".textproto");
  const std::string log_path = absl::StrCat(dir, "gpuexecd-tenants-", getpid(), ".log");
  auto write = [&](const std::string& text) {
    std::ofstream(file + ".new") << text;
    ASSERT_EQ(rename((file + ".new").c_str(), file.c_str()), 0);
  };
  write(absl::StrCat("tenant { name: \"local\" uid: ", getuid(), " }\n"));
  DaemonProcess daemon({"--tenants=" + file, "--log_level=info"}, LogTo(log_path));
  ClientOptions options;
  options.connect_timeout = absl::Seconds(20);
  GX_ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(daemon.target(), options));
  GX_ASSERT_OK(client.ListDevices().status());
  auto logged = [&](const std::string& what) {
    return WaitFor([&] { return ReadFile(log_path).value_or("").find(what) != std::string::npos; },
                   absl::Seconds(10));
  };

  write("tenant {\n  name: \"local\"\n  uid: 1\n  gid: x\n}\n");
  ASSERT_EQ(kill(daemon.pid(), SIGHUP), 0);
  EXPECT_TRUE(logged("E tenants: not reloaded, the 1 tenant(s) in force stay: "))
      << *ReadFile(log_path);
  EXPECT_TRUE(logged(".textproto:4:")) << *ReadFile(log_path);
  GX_EXPECT_OK(client.ListDevices().status());

  // Our uid out of the file: this client is nobody now.
  write("tenant { name: \"other\" uid: 1 }\n");
  ASSERT_EQ(kill(daemon.pid(), SIGHUP), 0);
  EXPECT_TRUE(logged("I tenants: reloaded ")) << *ReadFile(log_path);
  EXPECT_THAT(client.ListDevices(),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("names no tenant")));
  EXPECT_EQ(daemon.Stop(), 0);
  unlink(file.c_str());
  unlink(log_path.c_str());
}

TEST(DaemonProcessTest, CheckTenantsValidatesAFileAndExits) {
  const std::string file = absl::StrCat(::testing::TempDir(), "check-", getpid(), ".textproto");
  std::ofstream(file) << "tenant { name: \"a\" uid: 1 }\ntenant { name: \"b\" gid: 2 }\n";
  auto [ok_status, ok_out] = RunCommand(absl::StrCat(DaemonProgram(), " --check_tenants=", file));
  EXPECT_EQ(ok_status, 0) << ok_out;
  EXPECT_THAT(ok_out, HasSubstr("2 tenant(s), valid: a, b"));
  std::ofstream(file) << "tenant {\n  name: \"a\"\n  uid: 1\n  max_sessions: -1\n}\n";
  auto [bad_status, bad_out] = RunCommand(absl::StrCat(DaemonProgram(), " --check_tenants=", file));
  EXPECT_EQ(bad_status, 1) << bad_out;
  EXPECT_THAT(bad_out, HasSubstr(".textproto:4:"));
  unlink(file.c_str());
}

TEST(DaemonProcessTest, ANonLoopbackAddressWithoutIdentityRefusesToStartInOneLine) {
  auto [status, out] = RunCommand(
      absl::StrCat(DaemonProgram(), " --listen=0.0.0.0:0 --driver=", TestBackend().driver));
  EXPECT_EQ(status, 1) << out;
  std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 1u) << out;
  EXPECT_THAT(lines[0], HasSubstr("E gpuexecd cannot start: FAILED_PRECONDITION: "
                                  "--listen=0.0.0.0:0 is not a loopback address"));
}

TEST(DaemonProcessTest, BadFlagsExitNonZero) {
  DaemonProcess daemon({"--log_level=chatty"});
  EXPECT_EQ(daemon.Stop() == 0, false);
}

// Copies stream through a fixed set of pinned staging buffers, so the
// daemon's memory does not grow with the size of a Write.
TEST(DaemonProcessTest, PeakMemoryStaysBoundedDuringAOneGiBWrite) {
  if (TestBackend().fake) {
    GTEST_SKIP() << "the test double keeps device memory in the daemon's own RSS; this runs "
                    "on a real GPU";
  }
  DaemonProcess daemon({});
  ClientOptions options;
  options.connect_timeout = absl::Seconds(20);
  GX_ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(daemon.target(), options));
  GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> devices, client.ListDevices());
  if (devices.empty()) GTEST_SKIP() << "driver " << TestBackend().driver << " has no device";
  GX_ASSERT_OK_AND_ASSIGN(Session session, client.OpenSession({}));
  constexpr uint64_t kSize = 1ull << 30;
  GX_ASSERT_OK_AND_ASSIGN(Buffer buffer, session.Allocate(kSize));
  const uint64_t before = PeakRss(daemon.pid());
  std::vector<uint8_t> data = Pattern(7, kSize);
  GX_ASSERT_OK(buffer.Write(0, data));
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> back, buffer.Read(0, kSize));
  EXPECT_TRUE(back == data);
  const uint64_t peak = PeakRss(daemon.pid());
  std::printf("daemon peak RSS: %.1f MiB before, %.1f MiB after 1 GiB written and read\n",
              before / 1048576.0, peak / 1048576.0);
  EXPECT_GT(peak, 0u);
  EXPECT_LT(peak, 256ull << 20);
  GX_EXPECT_OK(session.Close());
  EXPECT_EQ(daemon.Stop(), 0);
}

}  // namespace
}  // namespace gpuexec::testing
