// `gpuexecd --simulator` as a newcomer meets it: a daemon process started
// with that flag alone (no --driver: it finds the double beside itself),
// one simulated device, the shipped saxpy.cubin and saxpy.ptx of
// client/cpp/examples loaded and run, a kernel the simulator has no model
// of refused with a message that says what to do, and the walk-through's
// gpuexec-saxpy run against it through $GPUEXEC_TARGET.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gpuexec/client.h"
#include "gtest/gtest.h"
#include "tests/support/wait.h"

#ifndef GPUEXEC_TEST_DAEMON_PROGRAM
#error "GPUEXEC_TEST_DAEMON_PROGRAM must name the built gpuexecd"
#endif

namespace gpuexec::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Example(const char* name) { return absl::StrCat(GPUEXEC_TEST_EXAMPLES_DIR, "/", name); }

// Runs `argv` with `env` added; returns its exit status and output.
int RunProgram(std::vector<std::string> argv, const std::vector<std::string>& env,
               std::string* output) {
  const std::string out_path =
      absl::StrCat(::testing::TempDir(), "simulator-run-", getpid(), ".out");
  const pid_t pid = fork();
  if (pid == 0) {
    for (const std::string& kv : env) putenv(const_cast<char*>(kv.c_str()));
    FILE* out = std::fopen(out_path.c_str(), "w");
    if (out != nullptr) {
      dup2(fileno(out), 1);
      dup2(fileno(out), 2);
    }
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  std::ifstream in(out_path);
  std::ostringstream text;
  text << in.rdbuf();
  *output = text.str();
  std::remove(out_path.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

class SimulatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    socket_ = absl::StrCat(::testing::TempDir(), "gpuexecd-simulator-", getpid(), ".sock");
    log_ = absl::StrCat(::testing::TempDir(), "gpuexecd-simulator-", getpid(), ".log");
    target_ = absl::StrCat("unix:", socket_);
    pid_ = fork();
    if (pid_ == 0) {
      // No GXFAKE_* from the test's environment: the flag alone decides.
      unsetenv("GXFAKE_DEVICE_COUNT");
      unsetenv("GXFAKE_MEMORY_BYTES");
      FILE* log = std::fopen(log_.c_str(), "w");
      if (log != nullptr) dup2(fileno(log), 2);
      const std::string program = GPUEXEC_TEST_DAEMON_PROGRAM;
      const std::string unix_flag = absl::StrCat("--unix_socket=", socket_);
      execl(program.c_str(), program.c_str(), "--simulator", "--listen=", unix_flag.c_str(),
            "--log_level=info", static_cast<char*>(nullptr));
      _exit(127);
    }
    absl::StatusOr<std::vector<DeviceInfo>> devices = absl::UnavailableError("not yet");
    ASSERT_TRUE(WaitFor(
        [&] {
          auto client = Client::Connect(target_);
          if (client.ok()) devices = client->ListDevices();
          return devices.ok();
        },
        absl::Seconds(30)))
        << devices.status() << "\n"
        << Log();
    devices_ = *devices;
  }

  void TearDown() override {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
    unlink(socket_.c_str());
    std::remove(log_.c_str());
  }

  std::string Log() const {
    std::ifstream in(log_);
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  }

  pid_t pid_ = -1;
  std::string socket_, log_, target_;
  std::vector<DeviceInfo> devices_;
};

TEST_F(SimulatorTest, OneSimulatedDeviceSaidSoInTheLog) {
  ASSERT_EQ(devices_.size(), 1u);
  EXPECT_THAT(devices_[0].name, HasSubstr("simulated"));
  EXPECT_EQ(devices_[0].compute_capability_major, 9u);
  EXPECT_EQ(devices_[0].compute_capability_minor, 0u);
  EXPECT_EQ(devices_[0].multiprocessor_count, 132u);
  EXPECT_EQ(devices_[0].memory_total_bytes, uint64_t{16} << 30);
  EXPECT_TRUE(devices_[0].healthy);
  const std::string log = Log();
  EXPECT_THAT(log, HasSubstr("--simulator: no GPU is used"));
  EXPECT_THAT(log, HasSubstr("1 simulated device(s)"));
  EXPECT_THAT(log, HasSubstr("with 1 simulated device(s); health SERVING"));
  EXPECT_THAT(log, HasSubstr("device 0: simulated H200 (gpuexec)"));
}

TEST_F(SimulatorTest, ShippedSaxpyCubinAndPtxRun) {
  auto client = Client::Connect(target_);
  ASSERT_TRUE(client.ok()) << client.status();
  auto session = client->OpenSession({});
  ASSERT_TRUE(session.ok()) << session.status();
  constexpr uint64_t kN = 5000;
  std::vector<float> x(kN), y(kN);
  for (uint64_t i = 0; i < kN; ++i) {
    x[i] = 0.5f * static_cast<float>(i);
    y[i] = 3.0f - static_cast<float>(i);
  }
  auto dx = session->Allocate(kN * sizeof(float));
  auto dy = session->Allocate(kN * sizeof(float));
  ASSERT_TRUE(dx.ok() && dy.ok());
  ASSERT_TRUE(dx->Write(x).ok());
  for (const char* file : {"saxpy.cubin", "saxpy.ptx"}) {
    SCOPED_TRACE(file);
    ASSERT_TRUE(dy->Write(y).ok());
    auto module = session->LoadModuleFile(Example(file));
    ASSERT_TRUE(module.ok()) << module.status();
    auto saxpy = module->GetFunction("saxpy");
    ASSERT_TRUE(saxpy.ok()) << saxpy.status();
    LaunchConfig config;
    config.grid.x = (kN + 255) / 256;
    config.block.x = 256;
    const float a = 1.5f;
    auto time = session->LaunchAndWait(*saxpy, config,
                                       {Arg::F32(a), Arg::Ptr(*dx), Arg::Ptr(*dy), Arg::U64(kN)});
    ASSERT_TRUE(time.ok()) << time.status();
    auto out = dy->ReadAs<float>(kN);
    ASSERT_TRUE(out.ok()) << out.status();
    for (uint64_t i = 0; i < kN; ++i) ASSERT_EQ((*out)[i], a * x[i] + y[i]) << i;
  }
}

// Kernels from source without a toolkit: the simulator compiles with its
// NVRTC double, whose test markers are inert there (a client's source may
// not make its compile sleep, spin or crash at will).
TEST_F(SimulatorTest, SaxpyFromSourceCompilesAndRunsAndMarkersAreInert) {
  if (!Log().empty() && absl::StrContains(Log(), "kernels from source are off")) {
    GTEST_SKIP() << "compiling is off here: " << Log();
  }
  auto client = Client::Connect(target_);
  ASSERT_TRUE(client.ok()) << client.status();
  auto session = client->OpenSession({});
  ASSERT_TRUE(session.ok()) << session.status();
  std::ifstream in(Example("saxpy.cu"));
  std::ostringstream text;
  text << in.rdbuf();
  CompileSpec spec;
  spec.name = "saxpy.cu";
  spec.source =
      absl::StrCat("// GXFAKE_COMPILE_SLEEP_MS=600000 GXFAKE_COMPILE_CRASH\n", text.str());
  const absl::Time start = absl::Now();
  auto compiled = session->CompileModule(spec);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(60)) << "the sleep marker was obeyed";
  auto saxpy = compiled->module.GetFunction("saxpy");
  ASSERT_TRUE(saxpy.ok()) << saxpy.status();
  constexpr uint64_t kN = 1000;
  auto dx = session->Allocate(kN * sizeof(float));
  auto dy = session->Allocate(kN * sizeof(float));
  ASSERT_TRUE(dx.ok() && dy.ok());
  ASSERT_TRUE(dx->Write(std::vector<float>(kN, 2.0f)).ok());
  ASSERT_TRUE(dy->Write(std::vector<float>(kN, 1.0f)).ok());
  LaunchConfig config;
  config.grid.x = (kN + 255) / 256;
  config.block.x = 256;
  ASSERT_TRUE(session
                  ->LaunchAndWait(*saxpy, config,
                                  {Arg::F32(3.0f), Arg::Ptr(*dx), Arg::Ptr(*dy), Arg::U64(kN)})
                  .ok());
  auto out = dy->ReadAs<float>(kN);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(*out, ::testing::Each(7.0f));
}

TEST_F(SimulatorTest, KernelWithoutAModelIsRefusedWithWhatToDo) {
  auto client = Client::Connect(target_);
  ASSERT_TRUE(client.ok()) << client.status();
  auto session = client->OpenSession({});
  ASSERT_TRUE(session.ok()) << session.status();
  const std::string ptx =
      ".version 8.0\n.target sm_90\n.address_size 64\n"
      ".visible .entry my_kernel(\n\t.param .u64 my_kernel_param_0,\n"
      "\t.param .u32 my_kernel_param_1\n)\n{\n\tret;\n}\n";
  auto module = session->LoadModule(ptx, ModuleKind::kPtx);
  ASSERT_TRUE(module.ok()) << module.status();
  auto kernel = module->GetFunction("my_kernel");
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  auto buffer = session->Allocate(64);
  ASSERT_TRUE(buffer.ok());
  LaunchConfig config;
  auto launched = session->LaunchAndWait(*kernel, config, {Arg::Ptr(*buffer), Arg::U32(16)});
  ASSERT_EQ(launched.status().code(), absl::StatusCode::kFailedPrecondition) << launched.status();
  EXPECT_THAT(std::string(launched.status().message()),
              AllOf(HasSubstr("kernel 'my_kernel'"),
                    HasSubstr("runs only its example kernels (saxpy, add_kernel)"),
                    HasSubstr("run other kernels on a GPU")));
  // The session goes on: the device was not reset.
  EXPECT_TRUE(session->Synchronize().ok());
  auto devices = client->ListDevices();
  ASSERT_TRUE(devices.ok());
  EXPECT_EQ((*devices)[0].resets, 0u);
}

TEST_F(SimulatorTest, WalkThroughExampleRunsWithGpuexecTarget) {
  std::string output;
  const int rc =
      RunProgram({GPUEXEC_TEST_SAXPY_PROGRAM, "--cubin=" + Example("saxpy.cubin"), "--n=4096"},
                 {"GPUEXEC_TARGET=" + target_}, &output);
  EXPECT_EQ(rc, 0) << output;
  EXPECT_THAT(output, HasSubstr("saxpy on 4096 floats"));
  EXPECT_THAT(output, HasSubstr("all match the host"));

  // --help lists the example's own flags.
  ASSERT_EQ(RunProgram({GPUEXEC_TEST_SAXPY_PROGRAM, "--help"}, {}, &output), 1) << output;
  EXPECT_THAT(output,
              AllOf(HasSubstr("--target"), HasSubstr("GPUEXEC_TARGET"), HasSubstr("--cubin")));
}

TEST(SimulatorFlagTest, SimulatorWithDriverIsAUsageError) {
  std::string output;
  EXPECT_EQ(RunProgram({GPUEXEC_TEST_DAEMON_PROGRAM, "--simulator", "--driver=libcuda.so.1"}, {},
                       &output),
            2);
  EXPECT_THAT(output, HasSubstr("--simulator and --driver both choose the driver"));
}

}  // namespace
}  // namespace gpuexec::testing
