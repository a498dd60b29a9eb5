#include "service_test_fixture.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

#ifndef GPUEXEC_TEST_DEFAULT_DRIVER
#error "GPUEXEC_TEST_DEFAULT_DRIVER must name the libcuda test double"
#endif
#ifndef GPUEXEC_TEST_DEFAULT_KERNELS
#error "GPUEXEC_TEST_DEFAULT_KERNELS must name the test double's kernel dir"
#endif

namespace gpuexec::testing {
namespace {

std::string EnvOr(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : fallback;
}

using ModuleLoadsFn = uint64_t (*)();

// Starts the suite's server once; decides whether the backend can serve.
class SuiteEnvironment : public ::testing::Environment {
 public:
  static SuiteEnvironment* Get() { return instance_; }
  SuiteEnvironment() { instance_ = this; }

  void SetUp() override {
    skip_.clear();
    failure_.clear();
    // The build says why this backend cannot serve (a GPU entry whose
    // kernels nvcc did not build).
    if (const char* reason = std::getenv("GPUEXEC_TEST_SKIP");
        reason != nullptr && *reason != '\0') {
      skip_ = reason;
      return;
    }
    const Backend& backend = TestBackend();
    if (driver_handle_ == nullptr) {
      // The server opens the same library; holding it here too lets the
      // suite reach the test double's counters.
      driver_handle_ = dlopen(backend.driver.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (driver_handle_ == nullptr) {
        const char* error = dlerror();
        skip_ = absl::StrCat("driver library ", backend.driver,
                             " cannot be loaded: ", error != nullptr ? error : "(no dlerror)");
        return;
      }
      module_loads_ = reinterpret_cast<ModuleLoadsFn>(dlsym(driver_handle_, "gxfake_module_loads"));
    }
    // The backend cannot serve: a skip on a real driver, a failure on the
    // test double (which must always serve).
    std::string& cannot = module_loads_ != nullptr ? failure_ : skip_;
    for (const char* ext : {"cubin", "ptx", "fatbin"}) {
      std::string path = absl::StrCat(backend.kernels_dir, "/gx_kernels.", ext);
      if (!ReadFile(path)) {
        cannot =
            absl::StrCat("kernel image ", path, " is missing (set ",
                         "GPUEXEC_TEST_KERNELS to a directory with the ", "gx_kernels images)");
        return;
      }
    }
    // The suite's tests fault and hang kernels on purpose, from one peer,
    // more often than the strike limit allows (the limit has tests of its
    // own, on servers of their own).
    ServerOptions suite;
    suite.strike_limit = 0;
    absl::StatusOr<std::unique_ptr<Server>> server = StartServer(suite);
    if (!server.ok()) {
      cannot = absl::StrCat("the server did not start on driver ", backend.driver, ": ",
                            server.status().ToString());
      return;
    }
    server_ = std::move(server).value();
    target_ = TargetOf(*server_);
    if (server_->device_count() == 0) {
      skip_ = absl::StrCat("driver ", backend.driver, " has no usable device");
    }
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(absl::Seconds(10));
    server_.reset();
  }

  const std::string& skip() const { return skip_; }
  const std::string& failure() const { return failure_; }
  Server& server() { return *server_; }
  const std::string& target() const { return target_; }
  ModuleLoadsFn module_loads() const { return module_loads_; }

 private:
  static SuiteEnvironment* instance_;
  void* driver_handle_ = nullptr;
  ModuleLoadsFn module_loads_ = nullptr;
  std::unique_ptr<Server> server_;
  std::string target_;
  std::string skip_;
  std::string failure_;
};

SuiteEnvironment* SuiteEnvironment::instance_ = nullptr;

}  // namespace

const Backend& TestBackend() {
  static const Backend* const backend = [] {
    auto* b = new Backend;
    b->driver = EnvOr("GPUEXEC_TEST_DRIVER", GPUEXEC_TEST_DEFAULT_DRIVER);
    b->kernels_dir = EnvOr("GPUEXEC_TEST_KERNELS", GPUEXEC_TEST_DEFAULT_KERNELS);
    void* handle = dlopen(b->driver.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) {
      b->fake = dlsym(handle, "gxfake_module_loads") != nullptr;
      dlclose(handle);
    }
    return b;
  }();
  return *backend;
}

std::string DaemonProgram() {
  const char* env = std::getenv("GPUEXEC_TEST_DAEMON");
  return env != nullptr && *env != '\0' ? env : GPUEXEC_TEST_DEFAULT_DAEMON;
}

void FillPattern(uint64_t seed, uint8_t* data, size_t size) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
  size_t i = 0;
  while (i < size) {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    uint64_t v = x * 0x2545F4914F6CDD1Dull;
    size_t n = std::min<size_t>(8, size - i);
    std::memcpy(data + i, &v, n);
    i += n;
  }
}

std::vector<uint8_t> Pattern(uint64_t seed, size_t size) {
  std::vector<uint8_t> out(size);
  FillPattern(seed, out.data(), size);
  return out;
}

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return std::nullopt;
  std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (file.bad()) return std::nullopt;
  return bytes;
}

absl::StatusOr<std::unique_ptr<Server>> StartServer(ServerOptions options) {
  options.listen_address = "127.0.0.1:0";
  options.driver_library = TestBackend().driver;
  options.worker_program = DaemonProgram();
  return Server::Start(options);
}

std::string TargetOf(const Server& server) { return absl::StrCat("127.0.0.1:", server.port()); }

// ------------------------------------------------------------ ServiceTest

void ServiceTest::SetUp() {
  SuiteEnvironment* env = SuiteEnvironment::Get();
  ASSERT_NE(env, nullptr);
  if (!env->failure().empty()) FAIL() << env->failure();
  if (!env->skip().empty()) GTEST_SKIP() << env->skip();
  GX_ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(env->target()));
  client_.emplace(std::move(client));
  // The baseline of the leak check is taken with the device serving and its
  // worker answering: one a test before reset (under MPS, one its faults
  // reached) reports no figure while it restarts (0 bytes free).
  absl::StatusOr<DeviceInfo> at_start;
  WaitFor(
      [&] {
        at_start = Device();
        return at_start.ok() && at_start->healthy && at_start->not_answering_since.empty() &&
               at_start->memory_free_bytes > 0;
      },
      absl::Seconds(30));
  GX_ASSERT_OK_AND_ASSIGN(device_at_start_, std::move(at_start));
}

void ServiceTest::TearDown() {
  if (!client_) return;
  // Every session of the test is closed by now; what they held must be back.
  DeviceInfo now;
  absl::Status last;
  const bool back = WaitFor(
      [&] {
        absl::StatusOr<DeviceInfo> device = Device();
        last = device.status();
        if (!device.ok()) return false;
        now = *device;
        const uint64_t a = now.memory_free_bytes;
        const uint64_t b = device_at_start_.memory_free_bytes;
        return now.sessions == device_at_start_.sessions &&
               (a > b ? a - b : b - a) <= memory_slack();
      },
      absl::Seconds(10));
  EXPECT_TRUE(back) << "after the test, device " << kDevice << " has " << now.sessions
                    << " sessions open (" << device_at_start_.sessions << " before) and "
                    << now.memory_free_bytes << " bytes free ("
                    << device_at_start_.memory_free_bytes << " before); last ListDevices: " << last;
}

Server& ServiceTest::server() { return SuiteEnvironment::Get()->server(); }

const std::string& ServiceTest::target() { return SuiteEnvironment::Get()->target(); }

absl::StatusOr<Client> ServiceTest::NewClient(const ClientOptions& options) {
  return Client::Connect(target(), options);
}

std::unique_ptr<v1::GpuExec::Stub> ServiceTest::RawStub() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return v1::GpuExec::NewStub(
      grpc::CreateCustomChannel(target(), grpc::InsecureChannelCredentials(), args));
}

absl::StatusOr<Session> ServiceTest::Open(SessionOptions options) {
  if (!options.device) options.device = kDevice;
  return client().OpenSession(options);
}

absl::StatusOr<DeviceInfo> ServiceTest::Device(Client* via) {
  absl::StatusOr<std::vector<DeviceInfo>> devices =
      (via != nullptr ? via : &client())->ListDevices();
  if (!devices.ok()) return devices.status();
  for (const DeviceInfo& d : *devices) {
    if (d.index == kDevice) return d;
  }
  return absl::NotFoundError(absl::StrCat("ListDevices does not list device ", kDevice));
}

std::string ServiceTest::KernelPath(const std::string& extension) const {
  return absl::StrCat(TestBackend().kernels_dir, "/gx_kernels.", extension);
}

absl::StatusOr<Function> ServiceTest::Kernel(Session& session, const std::string& name) {
  absl::StatusOr<Module> module = session.LoadModuleFile(KernelPath("cubin"));
  if (!module.ok()) return module.status();
  return module->GetFunction(name);
}

std::pair<std::string, ModuleKind> ServiceTest::UniqueModuleImage() const {
  // The server lives in this process, so a process-wide counter suffices
  // (also across --gtest_repeat iterations, which share the server).
  static std::atomic<uint64_t> counter{0};
  const uint64_t n = counter.fetch_add(1);
  if (!TestBackend().fake) {
    // PTX takes a comment: a new hash for the same kernels.
    std::string ptx = ReadFile(KernelPath("ptx")).value_or("");
    absl::StrAppend(&ptx, "\n// gpuexec service test image ", n, "\n");
    return {ptx, ModuleKind::kPtx};
  }
  // The test double's images are "GXFAKE1\n" and kernel names, one a line;
  // it ignores names it does not know.
  std::string image = ReadFile(KernelPath("cubin")).value_or("");
  absl::StrAppend(&image, "gx_service_test_image_", n, "\n");
  return {image, ModuleKind::kCubin};
}

uint64_t ServiceTest::memory_slack() const { return TestBackend().fake ? 0 : uint64_t{64} << 20; }

}  // namespace gpuexec::testing

namespace {

// A client that vanishes: started as a process of its own by a test (with
// GX_VANISHING_CLIENT=target), it opens a session with a short lease,
// allocates and writes a buffer, and is killed without closing anything.
int RunVanishingClient(const std::string& target) {
  using namespace gpuexec;
  auto client = Client::Connect(target);
  if (!client.ok()) return 3;
  SessionOptions options;
  options.device = 0;
  options.lease = absl::Seconds(1);
  auto session = client->OpenSession(options);
  if (!session.ok()) return 4;
  auto buffer = session->Allocate(uint64_t{64} << 20);
  if (!buffer.ok()) return 5;
  if (!buffer->Write(0, std::vector<uint8_t>(1 << 20, 0x5a)).ok()) return 6;
  std::printf("vanishing client: session %s holds 64 MiB\n", session->token().substr(0, 8).c_str());
  std::fflush(stdout);
  raise(SIGKILL);
  return 7;
}

}  // namespace

int main(int argc, char** argv) {
  if (const char* target = std::getenv("GX_VANISHING_CLIENT"); target != nullptr) {
    return RunVanishingClient(target);
  }
  ::testing::InitGoogleMock(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new gpuexec::testing::SuiteEnvironment);
  return RUN_ALL_TESTS();
}
