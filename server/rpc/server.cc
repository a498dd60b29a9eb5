#include "server/rpc/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gpuexec/address.h"
#include "gpuexec/command_ring.h"
#include "server/common/cores.h"
#include "server/common/log.h"
#include "server/common/status_macros.h"
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
#include "server/rpc/server_setup.h"
#include "server/rpc/service.h"
#include "server/rpc/shm_listener.h"
#include "server/rpc/standard_metrics.h"
#include "server/rpc/tcp_listener.h"
#include "server/rpc/unix_listener.h"
#include "server/tenants/tenants.h"
#include "server/worker/remote_device.h"

namespace gpuexec {
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

// A worker's MPS pipe directory where none can be: it is then no MPS
// client, whatever serves the host.
constexpr char kNoMpsEnvironment[] = "CUDA_MPS_PIPE_DIRECTORY=/nonexistent/gpuexec-mps-off";

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
  rpc::InstallGrpcLog();
  GPUEXEC_ASSIGN_OR_RETURN(const std::string reported_version, rpc::CheckServerOptions(options));
  auto impl = std::make_unique<Impl>();
  impl->identity = std::make_unique<rpc::Identity>(!options.tls_client_ca.empty());
  impl->tenants_file = options.tenants_file;
  if (!options.tenants_file.empty()) {
    auto dir = tenants::Directory::Load(options.tenants_file);
    if (!dir.ok()) return dir.status();
    log::Info("tenants: ", (*dir)->size(), " tenant(s) from ", options.tenants_file);
    if (!options.tls_client_ca.empty()) rpc::WarnTokenOnlyTenants(**dir, options.tenants_file);
    impl->identity->SetDirectory(*std::move(dir));
  }
  std::string driver_library = options.driver_library;
  if (options.simulator) {
    auto simulator = rpc::SimulatorLibrary(options.worker_program, rpc::kSimulatorDriver);
    if (!simulator.ok()) return simulator.status();
    driver_library = *std::move(simulator);
    // The double reads it at cuInit, in each worker (they inherit it).
    setenv("GXFAKE_SIMULATOR", "1", 1);
    log::Info(
        "gpuexecd: --simulator: no GPU is used; simulated devices run the examples' "
        "kernels on the host (",
        driver_library, ")");
  }
  GPUEXEC_ASSIGN_OR_RETURN(const rpc::IsolationChoice isolation, rpc::ChooseIsolation(options));
  core::EngineOptions eo = rpc::EngineOptionsFor(options, driver_library, isolation.isolation);
  const unsigned cores = UsableCores();  // the defaults that spend them
  const int busy_poll_us =
      options.busy_poll_us >= 0 ? options.busy_poll_us : (cores >= 8 ? 300 : 0);
  // Each device is served by a worker process; this one never loads the
  // driver.
  GPUEXEC_ASSIGN_OR_RETURN(worker::WorkerOptions wo,
                           rpc::WorkerOptionsFor(options, driver_library, busy_poll_us, cores));
  wo.owner = reinterpret_cast<uintptr_t>(impl.get());
  GPUEXEC_ASSIGN_OR_RETURN(const rpc::MpsMode mps_mode, rpc::ParseMpsMode(options.mps));
  GPUEXEC_ASSIGN_OR_RETURN(impl->default_share, rpc::ParseShareFlag(options.default_compute_share));
  if (!impl->default_share.empty() && options.tenants_file.empty()) {
    return absl::InvalidArgumentError(
        "--default_compute_share is the share of each tenant of the tenants file without one of "
        "its own; without a tenants file (--tenants) there is none to give it to");
  }
  // Workers inherit the environment: with an MPS control daemon serving the
  // host they are its clients.
  std::string mps_why_not = "--mps=off";
  std::optional<std::string> mps_pipes =
      mps_mode == rpc::MpsMode::kOff ? std::nullopt : rpc::MpsControlPipes(&mps_why_not);
  std::vector<std::string> mps_environment;
  if (mps_mode == rpc::MpsMode::kOwn) {
    GPUEXEC_ASSIGN_OR_RETURN(impl->mps_control, rpc::MpsControl::Start(options.mps_control));
    mps_pipes = impl->mps_control->pipe_directory();
    mps_environment = {"CUDA_MPS_PIPE_DIRECTORY=" + impl->mps_control->pipe_directory(),
                       "CUDA_MPS_LOG_DIRECTORY=" + impl->mps_control->log_directory()};
  }
  if (mps_mode == rpc::MpsMode::kExternal && !mps_pipes.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--mps=external, but no MPS control daemon serves ", rpc::MpsPipeDirectory(),
                     " (", mps_why_not,
                     "); start one (nvidia-cuda-mps-control -d, with the same "
                     "CUDA_MPS_PIPE_DIRECTORY as the daemon's) or run with --mps=off"));
  }
  if (mps_mode != rpc::MpsMode::kOwn) {
    // The workers look for a control daemon by themselves at each start:
    // they are told the directory checked here, or one where none is, so
    // that they are MPS clients exactly when the daemon counts them so (a
    // daemon started later, or a directory swapped, changes nothing).
    mps_environment = {mps_pipes.has_value() ? "CUDA_MPS_PIPE_DIRECTORY=" + *mps_pipes
                                             : std::string(kNoMpsEnvironment)};
  }
  std::shared_ptr<core::SharePlan> plan = impl->share_plan;
  // Whether MPS still serves when a worker held to a share starts: a client
  // that finds no control daemon runs unheld, so such a worker is refused.
  std::function<bool()> mps_serving;
  if (impl->mps_control != nullptr) {
    mps_serving = [control = impl->mps_control.get()] { return control->Serving(); };
  } else if (mps_pipes.has_value()) {
    // The same directory, as the rules take it now (it may have gone and
    // come back as someone else's).
    mps_serving = [pipes = *mps_pipes] { return rpc::MpsControlPipes() == pipes; };
  }
  const bool own_mps = impl->mps_control != nullptr;
  wo.environment = mps_environment;
  // With one worker a device, that worker holds each tenant to its share
  // itself (green contexts): no MPS limit on it.
  const bool per_tenant = eo.isolation == core::EngineOptions::Isolation::kTenant;
  auto open_device =
      [wo, plan, mps_serving, per_tenant, own_mps](
          int ordinal, const std::string& tenant,
          port::DriverInfo* info) -> absl::StatusOr<std::unique_ptr<port::DevicePort>> {
    worker::WorkerOptions o = wo;
    o.ordinal = ordinal;
    o.tenant = tenant;
    // Checked again at each start: a worker finds a control daemon by
    // itself, where the directory checked at the daemon's start may have
    // gone (or come back as another user's). Then it is kept from any.
    const bool serving = mps_serving && mps_serving();
    if (mps_serving && !serving && !own_mps) {
      for (std::string& e : o.environment) {
        if (absl::StartsWith(e, "CUDA_MPS_PIPE_DIRECTORY=")) {
          e = kNoMpsEnvironment;
        }
      }
    }
    // An MPS client held to its tenant's share, for the worker's life.
    if (const uint32_t percent = per_tenant ? plan->PercentFor(ordinal, tenant) : 0; percent != 0) {
      if (!serving) {
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
      options.command_rings && !options.shm_socket.empty() ? ring::kAnswerAreaVersion : 0,
      static_cast<int>(std::max<uint32_t>(2, rpc_threads)));
  impl->service->SetDrainDeadline(options.drain_deadline);
  impl->drain_deadline = options.drain_deadline;
  rpc::Compiles compiles = rpc::StartCompiles(options, impl->engine->ShareDevices());
  impl->compiles = std::move(compiles.service);
  impl->service->SetCompiler(impl->compiles.get(), compiles.off);
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
  const rpc::FrontLimits front = rpc::ResolveFrontLimits(options.front, rpc::HostMemoryBytes());
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
  rpc::ServingFacts facts;
  facts.port = impl->port;
  facts.metrics_port = impl->metrics_http == nullptr ? 0 : impl->metrics_http->port();
  facts.device_count = impl->engine->device_count();
  facts.healthy = impl->engine->AnyDeviceHealthy();
  facts.mps_pipes = mps_pipes;
  facts.mps_why_not = mps_why_not;
  facts.engine = &eo;
  facts.isolation = &isolation;
  facts.front = &front;
  facts.rpc_threads = rpc_threads;
  facts.busy_poll_us = busy_poll_us;
  facts.read_thread = wo.read_thread;
  rpc::LogServing(options, facts);
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
