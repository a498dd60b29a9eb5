#ifndef GPUEXEC_TESTS_SERVICE_SERVICE_TEST_FIXTURE_H_
#define GPUEXEC_TESTS_SERVICE_SERVICE_TEST_FIXTURE_H_

// The service test suite: a real gpuexec::Server in this process, the real
// client library over TCP loopback, and one of two backends chosen by the
// environment:
//   GPUEXEC_TEST_DRIVER   driver library the server opens (default: the
//                         libcuda test double, gpuexec_fakecuda)
//   GPUEXEC_TEST_KERNELS  directory with gx_kernels.{cubin,ptx,fatbin}
//                         (default: the test double's images)
// Where the backend cannot serve (the driver library does not load, no
// device, no kernel images) every test is SKIPPED with the reason.
//
// One server serves the whole suite (the real driver takes ~300 ms to
// start); tests that need special server options start their own.

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gpuexec/client.h"
#include "gpuexec/v1/gpuexec.grpc.pb.h"
#include "gtest/gtest.h"
#include "server/rpc/server.h"
#include "tests/support/status_matchers.h"
#include "tests/support/wait.h"

namespace gpuexec::testing {

// ------------------------------------------------------------ backend

struct Backend {
  std::string driver;       // library path or soname
  std::string kernels_dir;  // holds gx_kernels.{cubin,ptx,fatbin}
  // The libcuda test double (it exports gxfake_module_loads).
  bool fake = false;
};

// The backend chosen by the environment (see the top of this file).
const Backend& TestBackend();

// The gpuexecd binary (GPUEXEC_TEST_DAEMON, else the one built with the
// tests): servers started here run their device workers from it.
std::string DaemonProgram();

// Deterministic bytes (xorshift64*) for patterns.
void FillPattern(uint64_t seed, uint8_t* data, size_t size);
std::vector<uint8_t> Pattern(uint64_t seed, size_t size);

// Reads a whole file; empty optional if it cannot be read.
std::optional<std::string> ReadFile(const std::string& path);

// Starts a server on 127.0.0.1:0 with the test backend's driver and
// `options` (listen address and driver are overwritten).
absl::StatusOr<std::unique_ptr<Server>> StartServer(ServerOptions options);
std::string TargetOf(const Server& server);

// The device index every test uses.
inline constexpr uint32_t kDevice = 0;

// ------------------------------------------------------------ fixture

// The suite's shared server and a client connected to it. SetUp skips (or
// fails, when the fake backend is broken) if the backend cannot serve, and
// records the device's memory; TearDown checks that the test's sessions are
// gone and the device memory is back where it was.
class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  Server& server();
  const std::string& target();
  Client& client() { return *client_; }
  // A new client (its own connection) to the suite's server.
  absl::StatusOr<Client> NewClient(const ClientOptions& options = {});
  // The generated stub on a channel of its own, for requests the client
  // library would never send.
  std::unique_ptr<v1::GpuExec::Stub> RawStub();

  absl::StatusOr<Session> Open(SessionOptions options = {});
  absl::StatusOr<DeviceInfo> Device(Client* via = nullptr);

  std::string KernelPath(const std::string& extension) const;
  // gx_kernels.cubin loaded into `session` and the named kernel of it.
  absl::StatusOr<Function> Kernel(Session& session, const std::string& name);

  // An image no one has loaded before (each call a new one), valid for the
  // backend's driver, with all the gx_* kernels.
  std::pair<std::string, ModuleKind> UniqueModuleImage() const;

  // Memory tolerance of the leak checks: exact on the test double; on a GPU
  // the driver's own bookkeeping moves free memory a little.
  uint64_t memory_slack() const;

  const DeviceInfo& device_at_start() const { return device_at_start_; }

 private:
  std::optional<Client> client_;
  DeviceInfo device_at_start_;
};

// The hostile-input half of the suite (its own name in the output).
class HostileTest : public ServiceTest {};

}  // namespace gpuexec::testing

#endif  // GPUEXEC_TESTS_SERVICE_SERVICE_TEST_FIXTURE_H_
