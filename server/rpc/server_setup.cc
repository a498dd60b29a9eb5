#include "server/rpc/server_setup.h"

#include <grpc/support/log.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/common/log.h"
#include "server/common/text.h"

namespace gpuexec::rpc {
namespace {

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

bool Printable(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c > ' ' && c < 0x7f; });
}

}  // namespace

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

std::string MpsPipeDirectory() {
  const char* env = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  return env != nullptr && *env != '\0' ? env : "/tmp/nvidia-mps";
}

std::optional<std::string> MpsControlPipes(std::string* why_not) {
  auto refuse = [why_not](std::string why) -> std::optional<std::string> {
    if (why_not != nullptr) *why_not = std::move(why);
    return std::nullopt;
  };
  std::string pipes = MpsPipeDirectory();
  // A trailing slash would make lstat follow a link.
  while (pipes.size() > 1 && pipes.back() == '/') pipes.pop_back();
  struct stat st;
  if (pipes.empty() || pipes[0] != '/' || lstat(pipes.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return refuse(absl::StrCat("no directory ", pipes, " (an absolute path, not a link)"));
  }
  char resolved[PATH_MAX];
  if (realpath(pipes.c_str(), resolved) == nullptr) {
    return refuse(absl::StrCat("no directory ", pipes));
  }
  // Each directory from / down, as the links above it resolve: root's or
  // this user's, and writable by no one else (a shared one only where
  // sticky, as /tmp; the last not even so). Else another user could point
  // it, or swap it later, at any root socket named control.
  const std::string real = resolved;
  for (size_t end = 1;; end = real.find('/', end + 1)) {
    const std::string dir = end == std::string::npos ? real : real.substr(0, end);
    const bool last = end == std::string::npos;
    if (lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return refuse(absl::StrCat("no directory ", dir));
    }
    const bool shared = (st.st_mode & (S_IWGRP | S_IWOTH)) != 0;
    if ((st.st_uid != 0 && st.st_uid != geteuid()) ||
        (shared && (last || (st.st_mode & S_ISVTX) == 0))) {
      return refuse(absl::StrCat(dir, " is not a directory of root or uid ", geteuid(),
                                 " (this daemon's) that no one else may write",
                                 last ? "" : " (or a sticky one, as /tmp)"));
    }
    if (last) break;
  }
  const std::string control = real + "/control";
  if (lstat(control.c_str(), &st) != 0) return refuse(absl::StrCat("no ", control));
  // NVIDIA documents the directory as holding named pipes and Unix
  // sockets: either is the control daemon's door, of root's or this user's.
  if (!S_ISFIFO(st.st_mode) && !S_ISSOCK(st.st_mode)) {
    return refuse(absl::StrCat(control, " is neither a named pipe nor a Unix socket"));
  }
  if (st.st_uid != 0 && st.st_uid != geteuid()) {
    return refuse(absl::StrCat(control, " belongs to uid ", st.st_uid, ", neither root nor ",
                               geteuid(), " (this daemon's)"));
  }
  return real;
}

uint64_t HostMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
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
absl::StatusOr<std::string> CheckServerOptions(const ServerOptions& options) {
  if (options.session_memory_share.has_value() &&
      !(*options.session_memory_share >= 0 && *options.session_memory_share <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--session_memory_share ", *options.session_memory_share, " is not a share (0 to 1)"));
  }
  if (options.advertise_address.size() > 253 || !Printable(options.advertise_address)) {
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
  if (reported_version.size() > 64 || !Printable(reported_version)) {
    return absl::InvalidArgumentError(absl::StrCat(
        reported_by, " \"", Quoted(reported_version, 32), "\"",
        " is not a version (MAJOR.MINOR.PATCH, at most 64 printable characters)", what_to_do));
  }
  if (options.max_message_bytes < options.chunk_bytes + (64 << 10)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_message_bytes ", options.max_message_bytes, " leaves no room for a chunk of ",
        options.chunk_bytes, " bytes (--chunk_bytes) and its header"));
  }
  return reported_version;
}

core::EngineOptions EngineOptionsFor(const ServerOptions& options,
                                     const std::string& driver_library,
                                     core::EngineOptions::Isolation isolation) {
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
  eo.isolation = isolation;
  eo.worker_idle = options.worker_idle;
  eo.max_workers_per_device = options.max_workers_per_device;
  return eo;
}

absl::StatusOr<worker::WorkerOptions> WorkerOptionsFor(const ServerOptions& options,
                                                       const std::string& driver_library,
                                                       int busy_poll_us, unsigned cores) {
  worker::WorkerOptions wo;
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
  return wo;
}

Compiles StartCompiles(const ServerOptions& options,
                       const std::vector<core::ShareDevice>& devices) {
  Compiles out;
  if (!options.compile) {
    out.off = "it was started without compiling (gpuexecd --compile=false)";
    return out;
  }
  absl::Status simulator_without_nvrtc;
  compile::CompileServiceOptions co;
  co.compiler.program = options.worker_program.empty() ? "/proc/self/exe" : options.worker_program;
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
  for (const core::ShareDevice& d : devices) {
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
  if (!compiles.ok()) {
    log::Warning("kernels from source are off: ", compiles.status().message());
    out.off = std::string(compiles.status().message());
    return out;
  }
  out.service = *std::move(compiles);
  const compile::Compiler& c = out.service->compiler();
  log::Info("kernels from source: NVRTC ", c.nvrtc_version(), " (", c.nvrtc_path(), "), ",
            co.compiler.max_running, " compile(s) at once, ", "the file system shut by Landlock, ",
            c.starter().mode(),
            co.share_across_tenants ? ", one cache for every tenant" : ", a cache per tenant");
  return out;
}

void LogServing(const ServerOptions& options, const ServingFacts& facts) {
  const core::EngineOptions& eo = *facts.engine;
  std::vector<std::string> addresses;
  if (!options.listen_address.empty()) {
    addresses.push_back(absl::StrCat(
        options.listen_address.substr(0, options.listen_address.rfind(':')), ":", facts.port));
  }
  if (!options.unix_socket.empty()) addresses.push_back(absl::StrCat("unix:", options.unix_socket));
  log::Info("gpuexecd: ", options.tls_cert.empty() ? "plain TCP" : "TLS",
            options.tls_client_ca.empty() ? "" : " with client certificates", "; ",
            options.tenants_file.empty() ? std::string("no tenants file (one tenant)")
                                         : absl::StrCat("tenants from ", options.tenants_file),
            options.allow_unauthenticated ? "; --allow_unauthenticated" : "");
  if (facts.mps_pipes.has_value()) {
    log::Info("gpuexecd: an MPS control daemon serves this host (", *facts.mps_pipes,
              "): the workers are its clients, and kernels of different tenants' workers run "
              "side by side; a fatal fault of one client's kernel reaches every client of that "
              "GPU: the daemon then has the device's other workers checked and restarts those "
              "it reached, and charges a fault only where one tenant's kernels alone were in "
              "flight");
  } else if (options.mps != "off") {
    log::Info("gpuexecd: no MPS control daemon (", facts.mps_why_not,
              "): the workers are kept from any",
              eo.isolation == core::EngineOptions::Isolation::kTenant
                  ? "; tenants' workers take turns on each GPU (time-sliced)"
                  : "");
  }
  log::Info("gpuexecd: isolation ",
            eo.isolation == core::EngineOptions::Isolation::kTenant
                ? absl::StrCat("by tenant: each tenant's sessions on a device have a worker "
                               "process of their own (at most ",
                               eo.max_workers_per_device, " per device, ended ",
                               absl::ToInt64Seconds(eo.worker_idle), " s after their last session)")
                : std::string("by device: one worker process per device for every session"),
            "; chosen by ", facts.isolation->why);
  if (!facts.isolation->warning.empty()) log::Warning("gpuexecd: ", facts.isolation->warning);
  log::Info("gpuexecd: ", DescribeFrontLimits(*facts.front), "; health watches ",
            options.health_max_watches, " (", options.health_max_watches_per_peer,
            " per peer); Unix-socket connections ", options.unix_max_connections, " (",
            options.unix_max_connections_per_uid, " per uid)");
  log::Info("gpuexecd: ", facts.rpc_threads, " gRPC thread", facts.rpc_threads == 1 ? "" : "s",
            "; busy polling ",
            facts.busy_poll_us == 0 ? std::string("off")
                                    : absl::StrCat(facts.busy_poll_us, " us after each message"),
            "; workers reached through ",
            options.worker_shared_memory ? "shared memory" : "their sockets",
            facts.read_thread ? ", reading on a thread of their own while busy" : "");
  log::Info("gpuexecd serving gpuexec.v1 on ", absl::StrJoin(addresses, " and "), " with ",
            facts.device_count, options.simulator ? " simulated" : "", " device(s); health ",
            facts.healthy ? "SERVING" : "NOT_SERVING",
            facts.metrics_port == 0 ? ""
                                    : absl::StrCat("; metrics on ",
                                                   options.metrics_address.substr(
                                                       0, options.metrics_address.rfind(':')),
                                                   ":", facts.metrics_port, "/metrics"));
}

}  // namespace gpuexec::rpc
