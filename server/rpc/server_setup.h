#ifndef GPUEXEC_SERVER_RPC_SERVER_SETUP_H_
#define GPUEXEC_SERVER_RPC_SERVER_SETUP_H_

// What Server::Start derives from its options before anything serves: the
// checks of the flags no other part owns, the engine's and the workers'
// options, the host's MPS control daemon, the compile service, and the
// lines the daemon logs once it serves. Kept apart from server.cc, which
// brings the parts up and down in order.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/compile/compile_service.h"
#include "server/core/engine.h"
#include "server/rpc/front_limits.h"
#include "server/rpc/identity.h"
#include "server/rpc/server.h"
#include "server/tenants/tenants.h"
#include "server/worker/remote_device.h"

namespace gpuexec::rpc {

// The simulator's libraries: the driver double, and the NVRTC double it
// compiles kernels from source with (CompileModule, without a toolkit).
struct SimulatorPart {
  const char* file;    // "libgpuexec_fakecuda.so"
  const char* subdir;  // its directory in the build tree, from the daemon's
  const char* target;  // its CMake target
};
inline constexpr SimulatorPart kSimulatorDriver = {"libgpuexec_fakecuda.so", "fake_cuda",
                                                   "gpuexec_fakecuda"};
inline constexpr SimulatorPart kSimulatorNvrtc = {"libgpuexec_fakenvrtc.so", "fake_nvrtc",
                                                  "gpuexec_fakenvrtc"};

// A simulator library beside `program` (empty: this process's own): in its
// directory, in ../lib (installed), or in ../tests/<subdir> (the build
// tree).
absl::StatusOr<std::string> SimulatorLibrary(const std::string& program, const SimulatorPart& part);

// The MPS control daemon's pipe directory, as its clients look for it.
std::string MpsPipeDirectory();

// That directory, if an MPS control daemon serves there: a directory (no
// link) of root's or the daemon's own user that no one else may write,
// its `control` a named pipe or a Unix socket of either (what anyone could
// make in /tmp is no control daemon). Else none, and `why_not` (if given)
// says why in words for the log.
std::optional<std::string> MpsControlPipes(std::string* why_not = nullptr);

// The host's physical memory in bytes (0 if unknown).
uint64_t HostMemoryBytes();

// gRPC's own lines through this daemon's log, once per process.
void InstallGrpcLog();

// With --tls_client_ca, warns of the tenants of `file` known by a token
// alone: they can no longer connect over TCP.
void WarnTokenOnlyTenants(const tenants::Directory& dir, const std::string& file);

// Checks the options no part of the daemon checks itself; returns the
// version the daemon reports (the option, or the tests' environment).
absl::StatusOr<std::string> CheckServerOptions(const ServerOptions& options);

// The engine's options from the daemon's, with the driver `driver_library`
// (the simulator's where asked) and the isolation chosen.
core::EngineOptions EngineOptionsFor(const ServerOptions& options,
                                     const std::string& driver_library,
                                     core::EngineOptions::Isolation isolation);

// Every worker's options but its device, tenant and environment.
// `busy_poll_us` and `cores` are the daemon's resolved values.
absl::StatusOr<worker::WorkerOptions> WorkerOptionsFor(const ServerOptions& options,
                                                       const std::string& driver_library,
                                                       int busy_poll_us, unsigned cores);

// The compile service (kernels from source), or why it is off: started
// only with options.compile, warmed for the first device with a compute
// capability among `devices`.
struct Compiles {
  std::unique_ptr<compile::CompileService> service;
  std::string off;  // why it is off (a user's refusal names it); "" when on
};
Compiles StartCompiles(const ServerOptions& options, const std::vector<core::ShareDevice>& devices);

// What the daemon says once it serves: its transport and tenants, MPS,
// isolation, the front's limits, threads, and where it listens.
struct ServingFacts {
  int port = 0;          // the TCP port bound (0: none)
  int metrics_port = 0;  // 0: no metrics endpoint
  int device_count = 0;
  bool healthy = false;
  std::optional<std::string> mps_pipes;  // an MPS control daemon serves there
  std::string mps_why_not;               // else why none was taken
  const core::EngineOptions* engine = nullptr;
  const IsolationChoice* isolation = nullptr;
  const FrontLimits* front = nullptr;
  uint32_t rpc_threads = 0;
  int busy_poll_us = 0;
  bool read_thread = false;
};
void LogServing(const ServerOptions& options, const ServingFacts& facts);

}  // namespace gpuexec::rpc

#endif  // GPUEXEC_SERVER_RPC_SERVER_SETUP_H_
