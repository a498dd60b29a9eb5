#include "server/rpc/server.h"

#include <grpc/support/log.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "gpuexec/address.h"
#include "gpuexec/command_ring.h"
#include "server/common/cores.h"
#include "server/common/log.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"
#include "server/common/thread_name.h"
#include "server/core/engine.h"
#include "server/metrics/http_server.h"
#include "server/metrics/metrics.h"
#include "server/rpc/command_ring_server.h"
#include "server/rpc/compute_plan.h"
#include "server/rpc/front_limits.h"
#include "server/rpc/health.h"
#include "server/rpc/identity.h"
#include "server/rpc/mps_control.h"
#include "server/rpc/observability.h"
#include "server/rpc/service.h"
#include "server/rpc/shm_listener.h"
#include "server/rpc/standard_metrics.h"
#include "server/rpc/tcp_listener.h"
#include "server/rpc/unix_listener.h"
#include "server/tenants/tenants.h"
#include "server/worker/remote_device.h"

namespace gpuexec {
namespace {

// The simulator's libraries: the driver double, and the NVRTC double it
// compiles kernels from source with (CompileModule, without a toolkit).
struct SimulatorPart {
  const char* file;    // "libgpuexec_fakecuda.so"
  const char* subdir;  // its directory in the build tree, from the daemon's
  const char* target;  // its CMake target
};
constexpr SimulatorPart kSimulatorDriver = {"libgpuexec_fakecuda.so", "fake_cuda",
                                            "gpuexec_fakecuda"};
constexpr SimulatorPart kSimulatorNvrtc = {"libgpuexec_fakenvrtc.so", "fake_nvrtc",
                                           "gpuexec_fakenvrtc"};

// A simulator library beside `program` (empty: this process's own): in its
// directory, in ../lib (installed), or in ../tests/<subdir> (the build
// tree).
absl::StatusOr<std::string> SimulatorLibrary(const std::string& program,
                                             const SimulatorPart& part) {
  std::string self = program;
  if (self.empty()) {
    char buf[4096];
    const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    if (n > 0) self.assign(buf, static_cast<size_t>(n));
  }
  const size_t slash = self.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : self.substr(0, slash);
  std::vector<std::string> tried;
  for (const std::string& sub :
       {std::string("/"), std::string("/../lib/"), absl::StrCat("/../tests/", part.subdir, "/")}) {
    std::string path = absl::StrCat(dir, sub, part.file);
    if (access(path.c_str(), R_OK) == 0) {
      char* real = realpath(path.c_str(), nullptr);
      if (real != nullptr) path = real;
      std::free(real);
      return path;
    }
    tried.push_back(std::move(path));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("--simulator: the simulator's library ", part.file, " is not installed beside ",
                   self.empty() ? std::string("gpuexecd") : self, " (looked for ",
                   absl::StrJoin(tried, ", "), "); build it (cmake --build build --target ",
                   part.target, ") or install gpuexec's runtime component, which holds it"));
}

// The MPS control daemon's pipe directory, as its clients look for it.
std::string MpsPipeDirectory() {
  const char* env = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  return env != nullptr && *env != '\0' ? env : "/tmp/nvidia-mps";
}

// That directory, if an MPS control daemon serves there: its control pipe
// a FIFO of root's or the daemon's own user (a file anyone could make in
// /tmp is no control daemon).
std::optional<std::string> MpsControlPipes() {
  const std::string pipes = MpsPipeDirectory();
  struct stat st;
  if (lstat(absl::StrCat(pipes, "/control").c_str(), &st) != 0 || !S_ISFIFO(st.st_mode) ||
      (st.st_uid != 0 && st.st_uid != geteuid())) {
    return std::nullopt;
  }
  return pipes;
}

// The host's physical memory in bytes (0 if unknown).
uint64_t HostMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

// gRPC's own lines go through this daemon's log (log::WriteGrpcLine): at
// DEBUG unless the operator set GRPC_VERBOSITY, so that a failed TLS
// handshake comes with gRPC's server-side line, which can name the peer.
// Once per process (gRPC keeps one log function: a client library in the
// same process may install its own after this one).
std::atomic<bool> g_grpc_details{true};
std::atomic<bool> g_grpc_operator{false};

void OnGrpcLog(gpr_log_func_args* args) {
  log::GrpcLine line;
  line.file = args->file != nullptr ? args->file : "";
  line.line = args->line;
  line.severity = args->severity == GPR_LOG_SEVERITY_ERROR  ? log::GrpcSeverity::kError
                  : args->severity == GPR_LOG_SEVERITY_INFO ? log::GrpcSeverity::kInfo
                                                            : log::GrpcSeverity::kDebug;
  line.message = args->message != nullptr ? args->message : "";
  log::WriteGrpcLine(line, g_grpc_details.load(std::memory_order_relaxed),
                     g_grpc_operator.load(std::memory_order_relaxed));
}

void InstallGrpcLog() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* verbosity = std::getenv("GRPC_VERBOSITY");
    g_grpc_operator = verbosity != nullptr;
    g_grpc_details = verbosity == nullptr || absl::EqualsIgnoreCase(verbosity, "debug");
    if (verbosity == nullptr) gpr_set_log_verbosity(GPR_LOG_SEVERITY_DEBUG);
    gpr_set_log_function(&OnGrpcLog);
  });
}

// With --tls_client_ca every TCP client shows a certificate: a tenant known
// by its token alone is let in only with one whose name the file lists.
void WarnTokenOnlyTenants(const tenants::Directory& dir, const std::string& file) {
  const std::vector<std::string> names = dir.TokenOnlyNames();
  if (names.empty()) return;
  constexpr size_t kShown = 10;
  std::vector<std::string> shown;
  for (size_t i = 0; i < names.size() && i < kShown; ++i)
    shown.push_back(absl::StrCat("'", Quoted(names[i]), "'"));
  log::Warning("tenants: --tls_client_ca requires a certificate of every TCP client, and ",
               names.size(), " tenant(s) of ", file, " have a token and no certificate_name (",
               absl::StrJoin(shown, ", "),
               names.size() > kShown ? absl::StrCat(" and ", names.size() - kShown, " more") : "",
               "): they can no longer connect over TCP; give each a certificate_name that its "
               "clients' certificates carry, or serve them on --unix_socket");
}

}  // namespace

class Server::Impl {
 public:
  // Declared first: the interceptors and the metrics endpoint use it until
  // the end.
  metrics::Registry registry;
  std::string tenants_file;
  absl::Duration drain_deadline;
  std::unique_ptr<rpc::Identity> identity;
  // With --mps=own: stopped after the engine (and so every worker) is gone.
  std::unique_ptr<rpc::MpsControl> mps_control;
  // The compute shares in force; each worker's start reads it.
  std::shared_ptr<core::SharePlan> share_plan = std::make_shared<core::SharePlan>();
  core::ComputeShare default_share;
  core::EngineOptions::Isolation isolation = core::EngineOptions::Isolation::kDevice;
  bool mps = false;
  std::unique_ptr<core::Engine> engine;
  std::unique_ptr<metrics::HttpServer> metrics_http;
  // Outlives the service's calls (their compiles answer into them); goes
  // before the engine, which its compiles' modules load into.
  std::unique_ptr<compile::CompileService> compiles;
  std::unique_ptr<rpc::GpuExecService> service;
  rpc::HealthService health;
  // The completion queue the services' calls run on, and the threads that
  // poll it (joined by Shutdown); declared before the server, which goes
  // first.
  std::unique_ptr<grpc::ServerCompletionQueue> queue;
  std::vector<std::thread> pollers;
  std::unique_ptr<grpc::Server> server;
  // Hands its connections to `server`: goes before it.
  std::unique_ptr<rpc::TcpListener> tcp_listener;
  std::unique_ptr<rpc::UnixListener> unix_listener;
  // Outlives the listener that hands it rings; goes before the engine.
  std::unique_ptr<rpc::CommandRingServer> command_rings;
  std::unique_ptr<rpc::ShmListener> shm_listener;
  int port = 0;
  absl::Mutex health_mu;
  bool last_serving ABSL_GUARDED_BY(health_mu) = false;
  bool health_stopped ABSL_GUARDED_BY(health_mu) = false;
  absl::Mutex shutdown_mu;
  bool shut_down ABSL_GUARDED_BY(shutdown_mu) = false;
  absl::Notification done;

  // Plans the compute shares of `dir` on the devices and puts them in
  // force, or says why they cannot be honoured (and keeps those in force).
  absl::Status PlanShares(const tenants::Directory* dir) {
    auto plans = rpc::ComputePlan::Make(dir, engine->ShareDevices(), default_share);
    if (!plans.ok()) return plans.status();
    GPUEXEC_RETURN_IF_ERROR(
        rpc::ComputePlan::CheckMechanism(*plans, isolation, mps, engine->GreenContexts()));
    GPUEXEC_ASSIGN_OR_RETURN(std::vector<std::string> low,
                             rpc::ComputePlan::LowPriorityTenants(dir, isolation, mps));
    // With one worker a device, the workers cut their devices now.
    GPUEXEC_RETURN_IF_ERROR(engine->SetComputeParts(*plans, share_plan->plans()));
    share_plan->Set(*std::move(plans));
    share_plan->SetLowPriority(std::move(low));
    for (const std::string& line : share_plan->Describe()) {
      log::Info("compute shares: ", line);
    }
    return absl::OkStatus();
  }

  void SetHealth(bool serving) {
    health.SetServingStatus("", serving);
    health.SetServingStatus("gpuexec.v1.GpuExec", serving);
  }

  // Health follows the devices: "" and the service serve while one device
  // does; "device/N" follows device N (not serving while its worker
  // restarts). Called whenever a device changes.
  void UpdateHealth() {
    absl::MutexLock lock(&health_mu);
    if (health_stopped) return;
    for (int i = 0; i < engine->device_count(); ++i) {
      health.SetServingStatus(absl::StrCat("device/", i), engine->DeviceHealthy(i));
    }
    const bool now = engine->AnyDeviceHealthy();
    SetHealth(now);
    if (now != last_serving) {
      log::Warning("health: ", now ? "SERVING" : "NOT_SERVING (no device serving)");
      last_serving = now;
    }
  }
};

namespace {

// Why the daemon takes no new session (/readyz), or "".
std::string NotReadyReason(const core::Engine& engine) {
  const core::DrainState drain = engine.drain_state();
  if (drain.draining) return drain.Describe();
  if (!engine.AnyDeviceHealthy()) return "no device serves (see gpuexec_device_healthy)";
  return "";
}

}  // namespace

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() { Shutdown(absl::Seconds(1)); }

uint32_t DefaultRpcThreads(bool tls, unsigned hardware_threads) {
  if (!tls || hardware_threads < 8) return 1;
  return hardware_threads >= 16 ? 4 : 2;
}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options) {
  if (options.listen_address.empty() && options.unix_socket.empty()) {
    return absl::InvalidArgumentError("nothing to listen on: give a TCP address or a Unix socket");
  }
  GPUEXEC_RETURN_IF_ERROR(rpc::CheckSecurity(options));
  InstallGrpcLog();
  if (options.session_memory_share.has_value() &&
      !(*options.session_memory_share >= 0 && *options.session_memory_share <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--session_memory_share ", *options.session_memory_share, " is not a share (0 to 1)"));
  }
  if (options.advertise_address.size() > 253 ||
      !std::all_of(options.advertise_address.begin(), options.advertise_address.end(),
                   [](char c) { return c > ' ' && c < 0x7f; })) {
    return absl::InvalidArgumentError(
        absl::StrCat("--advertise_address ", Quoted(options.advertise_address, 32),
                     " is not an address (host:port, at most 253 printable characters)"));
  }
  std::string reported_version = options.reported_version;
  std::string reported_by = "the reported version";
  std::string what_to_do;
  if (const char* env = std::getenv("GPUEXECD_TEST_REPORTED_VERSION");
      reported_version.empty() && env != nullptr) {
    reported_version = env;
    reported_by = "$GPUEXECD_TEST_REPORTED_VERSION";
    what_to_do = ": it is for tests only; unset it";
  }
  if (reported_version.size() > 64 || !std::all_of(reported_version.begin(), reported_version.end(),
                                                   [](char c) { return c > ' ' && c < 0x7f; })) {
    return absl::InvalidArgumentError(absl::StrCat(
        reported_by, " \"", Quoted(reported_version, 32), "\"",
        " is not a version (MAJOR.MINOR.PATCH, at most 64 printable characters)", what_to_do));
  }
  if (options.max_message_bytes < options.chunk_bytes + (64 << 10)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_message_bytes ", options.max_message_bytes, " leaves no room for a chunk of ",
        options.chunk_bytes, " bytes (--chunk_bytes) and its header"));
  }
  auto impl = std::make_unique<Impl>();
  impl->identity = std::make_unique<rpc::Identity>(!options.tls_client_ca.empty());
  impl->tenants_file = options.tenants_file;
  if (!options.tenants_file.empty()) {
    auto dir = tenants::Directory::Load(options.tenants_file);
    if (!dir.ok()) return dir.status();
    log::Info("tenants: ", (*dir)->size(), " tenant(s) from ", options.tenants_file);
    if (!options.tls_client_ca.empty()) WarnTokenOnlyTenants(**dir, options.tenants_file);
    impl->identity->SetDirectory(*std::move(dir));
  }
  std::string driver_library = options.driver_library;
  if (options.simulator) {
    auto simulator = SimulatorLibrary(options.worker_program, kSimulatorDriver);
    if (!simulator.ok()) return simulator.status();
    driver_library = *std::move(simulator);
    // The double reads it at cuInit, in each worker (they inherit it).
    setenv("GXFAKE_SIMULATOR", "1", 1);
    log::Info(
        "gpuexecd: --simulator: no GPU is used; simulated devices run the examples' "
        "kernels on the host (",
        driver_library, ")");
  }
  core::EngineOptions eo;
  eo.driver_library = driver_library;
  eo.default_lease_ms = options.default_lease_ms;
  eo.max_lease_ms = options.max_lease_ms;
  eo.default_session_memory_bytes = options.default_session_memory_bytes;
  eo.max_session_memory_bytes = options.max_session_memory_bytes;
  // Limits meant for tenants who share a device do not bite a developer
  // alone on their box: without a tenants file, a session may take the
  // whole device and faulting kernels are never refused, unless asked.
  const bool shared = !options.tenants_file.empty();
  eo.session_memory_share = options.session_memory_share.value_or(shared ? 0.5 : 1.0);
  eo.max_sessions_per_peer = options.max_sessions_per_peer;
  eo.tenant_max_sessions = options.tenant_max_sessions;
  eo.strike_limit = options.strike_limit.value_or(shared ? 3 : 0);
  eo.strike_window = options.strike_window;
  eo.strike_cooldown = options.strike_cooldown;
  eo.daemon_memory_bytes = options.daemon_memory_bytes;
  eo.chunk_bytes = options.chunk_bytes;
  eo.staging_buffers = options.staging_buffers;
  eo.reaper_interval = options.reaper_interval;
  eo.max_sessions = options.max_sessions;
  eo.module_store_bytes = options.module_store_bytes;
  eo.module_upload_budget_bytes = options.module_upload_budget_bytes;
  eo.kernel_time_limit_ms = options.kernel_time_limit_ms;
  eo.host_memory = !options.shm_socket.empty();
  eo.daemon_pinned_bytes = options.pinned_bytes != 0 ? options.pinned_bytes : HostMemoryBytes() / 4;
  eo.max_session_pinned_bytes = options.max_session_pinned_bytes;
  eo.max_regions_per_session = options.max_regions_per_session;
  eo.max_handles_per_session = options.max_handles_per_session;
  GPUEXEC_ASSIGN_OR_RETURN(const rpc::IsolationChoice isolation, rpc::ChooseIsolation(options));
  eo.isolation = isolation.isolation;
  eo.worker_idle = options.worker_idle;
  eo.max_workers_per_device = options.max_workers_per_device;
  const unsigned cores = UsableCores();  // the defaults that spend them
  const int busy_poll_us =
      options.busy_poll_us >= 0 ? options.busy_poll_us : (cores >= 8 ? 300 : 0);
  // Each device is served by a worker process; this one never loads the
  // driver.
  worker::WorkerOptions wo;
  wo.owner = reinterpret_cast<uintptr_t>(impl.get());
  // This very program, even if its file was replaced since (an upgrade):
  // front and workers speak the same private protocol.
  wo.program = options.worker_program.empty() ? "/proc/self/exe" : options.worker_program;
  wo.driver_library = driver_library;
  wo.staging_bytes = options.chunk_bytes;
  wo.staging_slots = static_cast<int>(options.staging_buffers);
  wo.max_queued_launches = options.max_queued_launches;
  wo.queue_bytes = options.worker_queue_bytes;
  wo.kernel_time_limit = absl::Milliseconds(options.kernel_time_limit_ms);
  wo.log_level = options.worker_log_level;
  wo.log_format = options.worker_log_format;
  wo.busy_poll = absl::Microseconds(busy_poll_us);
  wo.ring_bytes = options.worker_shared_memory ? wo.ring_bytes : 0;
  wo.stream_turns = options.stream_turns;
  if (options.worker_read_thread == "on" || options.worker_read_thread == "off") {
    wo.read_thread = options.worker_read_thread == "on";
  } else if (options.worker_read_thread.empty() || options.worker_read_thread == "auto") {
    wo.read_thread = cores >= 8;
  } else {
    return absl::InvalidArgumentError(
        "--worker_read_thread must be auto, on or off (the value given is none of them)");
  }
  GPUEXEC_ASSIGN_OR_RETURN(const rpc::MpsMode mps_mode, rpc::ParseMpsMode(options.mps));
  GPUEXEC_ASSIGN_OR_RETURN(impl->default_share, rpc::ParseShareFlag(options.default_compute_share));
  if (!impl->default_share.empty() && options.tenants_file.empty()) {
    return absl::InvalidArgumentError(
        "--default_compute_share is the share of each tenant of the tenants file without one of "
        "its own; without a tenants file (--tenants) there is none to give it to");
  }
  // Workers inherit the environment: with an MPS control daemon serving the
  // host they are its clients.
  std::optional<std::string> mps_pipes =
      mps_mode == rpc::MpsMode::kOff ? std::nullopt : MpsControlPipes();
  std::vector<std::string> mps_environment;
  if (mps_mode == rpc::MpsMode::kOwn) {
    GPUEXEC_ASSIGN_OR_RETURN(impl->mps_control, rpc::MpsControl::Start(options.mps_control));
    mps_pipes = impl->mps_control->pipe_directory();
    mps_environment = {"CUDA_MPS_PIPE_DIRECTORY=" + impl->mps_control->pipe_directory(),
                       "CUDA_MPS_LOG_DIRECTORY=" + impl->mps_control->log_directory()};
  }
  if (mps_mode == rpc::MpsMode::kExternal && !mps_pipes.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--mps=external, but no MPS control daemon serves ", MpsPipeDirectory(),
        " (no control pipe there); start one (nvidia-cuda-mps-control -d, with the same "
        "CUDA_MPS_PIPE_DIRECTORY as the daemon's) or run with --mps=off"));
  }
  if (mps_mode == rpc::MpsMode::kOff && MpsControlPipes().has_value()) {
    // The workers would find the control daemon by themselves.
    mps_environment = {"CUDA_MPS_PIPE_DIRECTORY=/nonexistent/gpuexec-mps-off"};
  }
  std::shared_ptr<core::SharePlan> plan = impl->share_plan;
  // Whether MPS still serves when a worker held to a share starts: a client
  // that finds no control daemon runs unheld, so such a worker is refused.
  std::function<bool()> mps_serving;
  if (impl->mps_control != nullptr) {
    mps_serving = [control = impl->mps_control.get()] { return control->Serving(); };
  } else if (mps_pipes.has_value()) {
    mps_serving = [] { return MpsControlPipes().has_value(); };
  }
  wo.environment = mps_environment;
  // With one worker a device, that worker holds each tenant to its share
  // itself (green contexts): no MPS limit on it.
  const bool per_tenant = eo.isolation == core::EngineOptions::Isolation::kTenant;
  auto open_device =
      [wo, plan, mps_serving, per_tenant](
          int ordinal, const std::string& tenant,
          port::DriverInfo* info) -> absl::StatusOr<std::unique_ptr<port::DevicePort>> {
    worker::WorkerOptions o = wo;
    o.ordinal = ordinal;
    o.tenant = tenant;
    // An MPS client held to its tenant's share, for the worker's life.
    if (const uint32_t percent = per_tenant ? plan->PercentFor(ordinal, tenant) : 0; percent != 0) {
      if (!mps_serving || !mps_serving()) {
        return absl::UnavailableError(absl::StrCat(
            "compute shares are in force on device ", ordinal,
            ", but no MPS control daemon serves any longer, so this worker would not be held "
            "to its share; restart gpuexecd (with --mps=own it starts a control daemon of its "
            "own)"));
      }
      o.environment.push_back(absl::StrCat("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=", percent));
    }
    // Below normal among the MPS clients (checked at start: MPS serves).
    if (per_tenant && plan->LowPriority(tenant)) {
      o.environment.push_back("CUDA_MPS_CLIENT_PRIORITY=1");
    }
    auto dev = worker::RemoteDevice::Start(o, info);
    if (!dev.ok()) return dev.status();
    return std::unique_ptr<port::DevicePort>(std::move(dev).value());
  };
  eo.mps = mps_pipes.has_value();
  eo.shares = impl->share_plan;
  impl->isolation = eo.isolation;
  impl->mps = eo.mps;
  auto engine = core::Engine::Create(eo, open_device);
  if (!engine.ok()) return engine.status();
  impl->engine = std::move(engine).value();
  // Shares are planned on the devices as their workers found them (the
  // devices' shared workers start before, and serve no tenant of a file).
  GPUEXEC_RETURN_IF_ERROR(impl->PlanShares(impl->identity->directory().get()));
  auto tcp_descriptors = rpc::CheckDescriptorBudget(
      options, eo.isolation, eo.max_workers_per_device, impl->engine->device_count());
  if (!tcp_descriptors.ok()) return tcp_descriptors.status();
  rpc::CallLimits call_limits;
  call_limits.data_calls_per_session = options.max_data_calls_per_session;
  call_limits.streams_per_session = options.max_streams_per_session;
  call_limits.tenant_transfer_bytes = options.tenant_transfer_bytes;
  call_limits.tenant_commands = options.tenant_execute_commands;
  call_limits.upload_idle = options.upload_idle;
  const uint32_t rpc_threads = options.rpc_threads != 0
                                   ? options.rpc_threads
                                   : DefaultRpcThreads(!options.tls_cert.empty(), cores);
  // A Read's chunks are sent from the copy threads, and with TLS that is
  // where they are encrypted: as many of them as gRPC threads decrypt
  // (with two, TLS Reads stayed at 2 GB/s whatever the parts and threads).
  impl->service = std::make_unique<rpc::GpuExecService>(
      impl->engine.get(), impl->identity.get(), options.shm_socket, options.advertise_address,
      reported_version, call_limits,
      options.command_rings && !options.shm_socket.empty() ? ring::kVersion : 0,
      static_cast<int>(std::max<uint32_t>(2, rpc_threads)));
  impl->service->SetDrainDeadline(options.drain_deadline);
  impl->drain_deadline = options.drain_deadline;
  impl->service->SetCompiler(nullptr,
                             "it was started without compiling (gpuexecd --compile=false)");
  if (options.compile) {
    absl::Status simulator_without_nvrtc;
    compile::CompileServiceOptions co;
    co.compiler.program =
        options.worker_program.empty() ? "/proc/self/exe" : options.worker_program;
    if (!options.nvrtc.empty()) {
      co.compiler.nvrtc = {options.nvrtc};
    } else if (options.simulator) {
      // The simulator compiles with its NVRTC double: source whose kernels
      // the simulated devices model (the examples') runs without a toolkit.
      // Without it, compiles are off (a real NVRTC's cubins would not run
      // on the simulated devices).
      absl::StatusOr<std::string> nvrtc = SimulatorLibrary(options.worker_program, kSimulatorNvrtc);
      if (nvrtc.ok()) co.compiler.nvrtc = {*nvrtc};
      simulator_without_nvrtc = nvrtc.status();
    }
    // The warm compile process warms NVRTC up for the first device's
    // architecture (zygote.h).
    for (const core::ShareDevice& d : impl->engine->ShareDevices()) {
      if (d.cc_major > 0) {
        co.compiler.warm_up_arch = d.cc_major * 10 + d.cc_minor;
        break;
      }
    }
    co.compiler.limits.memory_bytes = options.compile_memory_bytes;
    co.compiler.limits.cpu_seconds = std::max<uint32_t>(1, options.compile_cpu_s);
    co.compiler.warm = options.warm_compiles;
    co.compiler.time_limit = absl::Seconds(std::max<uint32_t>(1, options.compile_time_limit_s));
    co.compiler.max_running = static_cast<int>(std::max<uint32_t>(1, options.max_compiles));
    co.max_per_tenant = static_cast<int>(std::max<uint32_t>(1, options.max_compiles_per_tenant));
    co.share_across_tenants = options.share_compiles_across_tenants;
    absl::StatusOr<std::unique_ptr<compile::CompileService>> compiles =
        simulator_without_nvrtc.ok() ? compile::CompileService::Start(co) : simulator_without_nvrtc;
    if (compiles.ok()) {
      impl->compiles = *std::move(compiles);
      const compile::Compiler& c = impl->compiles->compiler();
      log::Info("kernels from source: NVRTC ", c.nvrtc_version(), " (", c.nvrtc_path(), "), ",
                co.compiler.max_running, " compile(s) at once, ",
                "the file system shut by Landlock, ", c.starter().mode(),
                co.share_across_tenants ? ", one cache for every tenant" : ", a cache per tenant");
      impl->service->SetCompiler(impl->compiles.get(), "");
    } else {
      log::Warning("kernels from source are off: ", compiles.status().message());
      impl->service->SetCompiler(nullptr, std::string(compiles.status().message()));
    }
  }
  rpc::AddEngineCollector(&impl->registry, impl->engine.get(), impl->identity.get());
  rpc::AddStandardMetrics(&impl->registry, options, impl->compiles.get(),
                          reinterpret_cast<uintptr_t>(impl.get()));
  impl->registry.AddCollector([engine = impl->engine.get()](metrics::Sink& sink) {
    sink.Declare("gpuexec_draining", "gauge",
                 "1 while the daemon drains (new sessions refused; see gpuexec drain), else 0.");
    sink.Sample("gpuexec_draining", {}, engine->drain_state().draining ? 1 : 0);
  });
  if (!options.metrics_address.empty()) {
    metrics::HttpServer::Limits limits;
    limits.max_connections = static_cast<int>(options.metrics_max_connections);
    limits.max_per_peer = static_cast<int>(options.metrics_max_per_peer);
    limits.max_per_network = static_cast<int>(options.metrics_max_per_network);
    limits.cache_ms = static_cast<int>(options.metrics_cache_ms);
    metrics::HttpProbes probes;
    probes.not_ready = [engine = impl->engine.get()] { return NotReadyReason(*engine); };
    auto http = metrics::HttpServer::Start(options.metrics_address, &impl->registry, limits,
                                           std::move(probes));
    if (!http.ok()) return http.status();
    impl->metrics_http = std::move(http).value();
  }

  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> tcp_acceptor;
  if (!options.listen_address.empty()) {
    // The port is the daemon's own (tcp_listener.h): gRPC serves what it
    // accepts, with the port's credentials.
    auto listener = rpc::TcpListener::Bind(options.listen_address);
    if (!listener.ok()) return listener.status();
    impl->tcp_listener = *std::move(listener);
    impl->port = impl->tcp_listener->port();
    tcp_acceptor = builder.experimental().AddExternalConnectionAcceptor(
        grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD,
        options.tls_cert.empty() ? grpc::InsecureServerCredentials()
                                 : rpc::TlsCredentials(options, impl->identity.get()));
  }
  // Chunks are 1 MiB by default; leave room for clients that send larger.
  // A second daemon on the same port is a mistake to report, not a load
  // balancer: no SO_REUSEPORT.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.SetMaxSendMessageSize(64 << 20);
  const rpc::FrontLimits front = rpc::ResolveFrontLimits(options.front, HostMemoryBytes());
  rpc::ApplyFrontLimits(front, &builder);
  impl->health.SetWatchLimits(static_cast<int>(options.health_max_watches),
                              static_cast<int>(options.health_max_watches_per_peer));
  builder.RegisterService(impl->service->service());
  builder.RegisterService(impl->health.service());
  // One queue: with gRPC's epoll poller, whichever thread polls reads
  // every connection's bytes, and a call bound to another thread's queue
  // then costs a hand-off (and a wake-up) per message.
  impl->queue = builder.AddCompletionQueue();
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> observers;
  observers.push_back(rpc::MakeRpcObserver(&impl->registry, impl->identity.get()));
  builder.experimental().SetInterceptorCreators(std::move(observers));
  impl->server = builder.BuildAndStart();
  if (impl->server == nullptr || (!options.listen_address.empty() && impl->port == 0)) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ",
        options.listen_address.empty() ? "" : absl::StrCat("'", options.listen_address, "'"),
        options.unix_socket.empty() ? "" : absl::StrCat(" unix:", options.unix_socket),
        " (address in use or not valid?)"));
  }
  if (impl->tcp_listener != nullptr) {
    rpc::TcpLimits limits;
    // Never more connections than the descriptors left once the workers'
    // and listeners' are counted.
    uint64_t most =
        options.rpc_max_connections == 0 ? *tcp_descriptors : options.rpc_max_connections;
    if (most > *tcp_descriptors) {
      most = *tcp_descriptors;
      log::Info(
          "gpuexecd: at most ", most,
          " TCP connections at once: the descriptors left by the limit (--rpc_max_connections ",
          options.rpc_max_connections, ")");
    }
    limits.max_connections = static_cast<uint32_t>(std::min<uint64_t>(most, UINT32_MAX));
    if (limits.max_connections == 0) limits.max_connections = 1;
    limits.max_per_peer = options.rpc_max_connections_per_peer;
    impl->tcp_listener->Start(std::move(tcp_acceptor), limits);
  }
  if (!options.unix_socket.empty()) {
    rpc::UnixListener::Limits limits;
    limits.max_connections = options.unix_max_connections;
    limits.max_per_uid = options.unix_max_connections_per_uid;
    auto listener = rpc::UnixListener::Start(options.unix_socket, options.unix_socket_group,
                                             impl->server.get(), impl->identity.get(), limits);
    if (!listener.ok()) {
      impl->tcp_listener.reset();
      impl->server->Shutdown();
      return listener.status();
    }
    impl->unix_listener = *std::move(listener);
  }
  if (!options.shm_socket.empty() && options.command_rings) {
    rpc::CommandRingServer::Options ro;
    ro.max_rings = options.max_command_rings;
    ro.budget = impl->service->mutable_budget();
    ro.spin = absl::Microseconds(options.ring_spin_us >= 0 ? options.ring_spin_us : busy_poll_us);
    ro.ring_threads =
        options.ring_threads > 0 ? options.ring_threads : std::max(1, static_cast<int>(cores) / 4);
    auto rings = rpc::CommandRingServer::Start(impl->engine.get(), ro);
    if (!rings.ok()) {
      impl->tcp_listener.reset();
      impl->unix_listener.reset();
      impl->server->Shutdown();
      return rings.status();
    }
    impl->command_rings = *std::move(rings);
  }
  if (!options.shm_socket.empty()) {
    auto listener =
        rpc::ShmListener::Start(options.shm_socket, options.unix_socket_group, impl->engine.get(),
                                impl->identity.get(), impl->command_rings.get());
    if (!listener.ok()) {
      impl->tcp_listener.reset();
      impl->unix_listener.reset();
      impl->server->Shutdown();
      return listener.status();
    }
    impl->shm_listener = *std::move(listener);
    log::Info("host memory regions: served on ", options.shm_socket, ", up to ",
              eo.daemon_pinned_bytes, " page-locked bytes in all");
    if (impl->command_rings != nullptr) {
      log::Info("command rings: served on ", options.shm_socket, ", up to ",
                options.max_command_rings, " at once, their threads on at most ",
                impl->command_rings->ring_threads(), " cores (--ring_threads)");
    }
  }
  impl->service->Listen(impl->queue.get());
  impl->health.Listen(impl->queue.get());
  for (uint32_t i = 0; i < rpc_threads; ++i) {
    impl->pollers.emplace_back([cq = impl->queue.get()] {
      NameThisThread("gx-rpc");
      rpc::Poll(cq);
    });
  }
  {
    absl::MutexLock lock(&impl->health_mu);
    impl->last_serving = impl->engine->AnyDeviceHealthy();
  }
  impl->UpdateHealth();
  // "liveness" says the process serves at all, GPUs or not (for probes
  // that should restart a wedged daemon but not one on a GPU-less node).
  impl->health.SetServingStatus("liveness", true);
  Impl* raw = impl.get();
  impl->engine->SetHealthListener([raw] { raw->UpdateHealth(); });
  std::vector<std::string> addresses;
  if (!options.listen_address.empty()) {
    addresses.push_back(absl::StrCat(
        options.listen_address.substr(0, options.listen_address.rfind(':')), ":", impl->port));
  }
  if (!options.unix_socket.empty()) addresses.push_back(absl::StrCat("unix:", options.unix_socket));
  log::Info("gpuexecd: ", options.tls_cert.empty() ? "plain TCP" : "TLS",
            options.tls_client_ca.empty() ? "" : " with client certificates", "; ",
            options.tenants_file.empty() ? std::string("no tenants file (one tenant)")
                                         : absl::StrCat("tenants from ", options.tenants_file),
            options.allow_unauthenticated ? "; --allow_unauthenticated" : "");
  if (mps_pipes.has_value()) {
    log::Info("gpuexecd: an MPS control daemon serves this host (", *mps_pipes,
              "): the workers are its clients, and kernels of different tenants' workers run "
              "side by side; a fatal fault of one client's kernel reaches every client of that "
              "GPU: the daemon then has the device's other workers checked and restarts those "
              "it reached, and charges a fault only where one tenant's kernels alone were in "
              "flight");
  } else if (eo.isolation == core::EngineOptions::Isolation::kTenant) {
    log::Info("gpuexecd: no MPS control daemon (", MpsPipeDirectory(),
              "): tenants' workers take turns on each GPU (time-sliced)");
  }
  log::Info("gpuexecd: isolation ",
            eo.isolation == core::EngineOptions::Isolation::kTenant
                ? absl::StrCat("by tenant: each tenant's sessions on a device have a worker "
                               "process of their own (at most ",
                               eo.max_workers_per_device, " per device, ended ",
                               absl::ToInt64Seconds(eo.worker_idle), " s after their last session)")
                : std::string("by device: one worker process per device for every session"),
            "; chosen by ", isolation.why);
  if (!isolation.warning.empty()) log::Warning("gpuexecd: ", isolation.warning);
  log::Info("gpuexecd: ", rpc::DescribeFrontLimits(front), "; health watches ",
            options.health_max_watches, " (", options.health_max_watches_per_peer,
            " per peer); Unix-socket connections ", options.unix_max_connections, " (",
            options.unix_max_connections_per_uid, " per uid)");
  log::Info(
      "gpuexecd: ", rpc_threads, " gRPC thread", rpc_threads == 1 ? "" : "s", "; busy polling ",
      busy_poll_us == 0 ? std::string("off") : absl::StrCat(busy_poll_us, " us after each message"),
      "; workers reached through ",
      options.worker_shared_memory ? "shared memory" : "their sockets",
      wo.read_thread ? ", reading on a thread of their own while busy" : "");
  log::Info(
      "gpuexecd serving gpuexec.v1 on ", absl::StrJoin(addresses, " and "), " with ",
      impl->engine->device_count(), options.simulator ? " simulated" : "", " device(s); health ",
      impl->engine->AnyDeviceHealthy() ? "SERVING" : "NOT_SERVING",
      impl->metrics_http == nullptr
          ? ""
          : absl::StrCat("; metrics on ",
                         options.metrics_address.substr(0, options.metrics_address.rfind(':')), ":",
                         impl->metrics_http->port(), "/metrics"));
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

int Server::port() const { return impl_->port; }

int Server::metrics_port() const {
  return impl_->metrics_http == nullptr ? 0 : impl_->metrics_http->port();
}

std::string Server::RenderMetrics() { return impl_->registry.Render(); }

absl::Status Server::ReloadTenants() {
  if (impl_->tenants_file.empty()) {
    return absl::FailedPreconditionError("the daemon has no tenants file (--tenants) to reload");
  }
  std::shared_ptr<const tenants::Directory> old = impl_->identity->directory();
  const size_t before = old == nullptr ? 0 : old->size();
  auto dir = tenants::Directory::Load(impl_->tenants_file);
  if (!dir.ok()) {
    log::Error("tenants: not reloaded, the ", before,
               " tenant(s) in force stay: ", dir.status().message());
    return dir.status();
  }
  log::Info("tenants: reloaded ", impl_->tenants_file, ": ", (*dir)->size(),
            " tenant(s), in force for new calls");
  std::shared_ptr<const tenants::Directory> now = *std::move(dir);
  if (absl::Status shares = impl_->PlanShares(now.get()); !shares.ok()) {
    log::Error("tenants: not reloaded, the ", before,
               " tenant(s) in force stay: ", shares.message());
    return shares;
  }
  impl_->identity->SetDirectory(now);
  // Command rings were identified once, at registration: their commands
  // run as the tenant as the file now has it from here on.
  if (impl_->command_rings != nullptr) {
    impl_->command_rings->Reidentify([&now](const std::string& name) { return now->Find(name); });
  }
  // A tenant taken out of the file loses its sessions with it; one that
  // may no longer use a device (its devices, or one dedicated to another
  // tenant now) loses its sessions there.
  if (old != nullptr) {
    for (const std::string& name : old->names()) {
      if (now->Find(name) != nullptr) continue;
      const size_t closed =
          impl_->engine->CloseTenant(name, "its tenant was removed from the tenants file");
      if (closed != 0)
        log::Info("tenants: closed ", closed, " session(s) of removed tenant '", name, "'");
    }
  }
  for (const std::string& name : now->names()) {
    const std::shared_ptr<const core::Tenant> tenant = now->Find(name);
    if (tenant == nullptr) continue;
    const size_t closed = impl_->engine->CloseTenantOffLimits(*tenant);
    if (closed != 0) {
      log::Info("tenants: closed ", closed, " session(s) of tenant '", name,
                "' on devices it may no longer use");
    }
  }
  return absl::OkStatus();
}

void Server::Drain(const std::string& by) { impl_->engine->StartDrain(impl_->drain_deadline, by); }

std::string Server::NotReady() const { return NotReadyReason(*impl_->engine); }

int Server::device_count() const { return impl_->engine->device_count(); }

int Server::worker_pid(int index) const { return impl_->engine->WorkerPid(index); }

std::shared_ptr<grpc::Channel> Server::InProcessChannel() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  return impl_->server->InProcessChannel(args);
}

void Server::Shutdown(absl::Duration deadline) {
  {
    absl::MutexLock lock(&impl_->shutdown_mu);
    if (impl_->shut_down) return;
    impl_->shut_down = true;
  }
  impl_->engine->SetHealthListener(nullptr);
  {
    absl::MutexLock lock(&impl_->health_mu);
    impl_->health_stopped = true;
  }
  impl_->health.Shutdown();        // every name NOT_SERVING; watches end
  impl_->engine->EndDrainWaits();  // calls waiting for a drain are answered
  impl_->tcp_listener.reset();     // no new connections
  impl_->unix_listener.reset();
  impl_->shm_listener.reset();
  impl_->server->Shutdown(absl::ToChronoTime(absl::Now() + deadline));
  impl_->server->Wait();
  // Queued compiles are failed; running ones end (within the compile time
  // limit) and answer their calls.
  if (impl_->compiles != nullptr) impl_->compiles->Stop();
  // Calls may still wait for the engine; their queues serve them until the
  // last one ends.
  impl_->service->WaitForCalls();
  impl_->compiles.reset();
  impl_->health.WaitForCalls();
  impl_->queue->Shutdown();
  for (std::thread& t : impl_->pollers) t.join();
  impl_->command_rings.reset();  // rings post into the engine
  impl_->metrics_http.reset();   // its scrapes read the engine
  impl_->engine.reset();         // closes sessions, releases devices
  log::Info("gpuexecd stopped");
  impl_->done.Notify();
}

void Server::Wait() { impl_->done.WaitForNotification(); }

}  // namespace gpuexec
