#include "server/rpc/observability.h"

#include <google/protobuf/descriptor.h>
#include <grpcpp/server_context.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "server/common/log.h"
#include "server/core/compute_shares.h"

namespace gpuexec::rpc {
namespace {

using grpc::experimental::InterceptionHookPoints;
using grpc::experimental::Interceptor;
using grpc::experimental::InterceptorBatchMethods;
using grpc::experimental::ServerRpcInfo;

constexpr int kCodes = 17;  // grpc::StatusCode OK .. UNAUTHENTICATED

const char* CodeName(int code) {
  static constexpr const char* kNames[kCodes] = {"OK",
                                                 "CANCELLED",
                                                 "UNKNOWN",
                                                 "INVALID_ARGUMENT",
                                                 "DEADLINE_EXCEEDED",
                                                 "NOT_FOUND",
                                                 "ALREADY_EXISTS",
                                                 "PERMISSION_DENIED",
                                                 "RESOURCE_EXHAUSTED",
                                                 "FAILED_PRECONDITION",
                                                 "ABORTED",
                                                 "OUT_OF_RANGE",
                                                 "UNIMPLEMENTED",
                                                 "INTERNAL",
                                                 "UNAVAILABLE",
                                                 "DATA_LOSS",
                                                 "UNAUTHENTICATED"};
  return code >= 0 && code < kCodes ? kNames[code] : "UNKNOWN";
}

const char* TypeName(ServerRpcInfo::Type type) {
  switch (type) {
    case ServerRpcInfo::Type::UNARY:
      return "unary";
    case ServerRpcInfo::Type::CLIENT_STREAMING:
      return "client_stream";
    case ServerRpcInfo::Type::SERVER_STREAMING:
      return "server_stream";
    case ServerRpcInfo::Type::BIDI_STREAMING:
      return "bidi_stream";
  }
  return "unknown";
}

// Codes a client causes by what it sends; the others say something about
// the daemon or its devices and are logged as warnings.
bool CallerCaused(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::UNIMPLEMENTED:
    case grpc::StatusCode::UNAUTHENTICATED:
      return true;
    default:
      return false;
  }
}

// The metrics of one method; per-code children are made on first use.
struct MethodMetrics {
  std::string service, method, type;
  metrics::Counter* started = nullptr;
  absl::Mutex mu;
  std::array<metrics::Counter*, kCodes> handled ABSL_GUARDED_BY(mu) = {};
  std::array<metrics::Histogram*, kCodes> seconds ABSL_GUARDED_BY(mu) = {};
};

// Whether "/package.Service/Method" is a method of a service whose
// descriptor the daemon carries (gpuexec.v1, health, reflection).
bool IsServedMethod(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (path.size() < 4 || path[0] != '/' || slash == 0 || slash == std::string::npos) return false;
  const std::string name = absl::StrCat(path.substr(1, slash - 1), ".", path.substr(slash + 1));
  return google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(name) != nullptr;
}

class RpcObserverFactory;

class CallObserver final : public Interceptor {
 public:
  CallObserver(RpcObserverFactory* factory, MethodMetrics* m, ServerRpcInfo* info)
      : factory_(factory), m_(m), info_(info), start_(absl::Now()) {}

  void Intercept(InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      Finished(methods->GetSendStatus());
    }
    methods->Proceed();
  }

 private:
  void Finished(const grpc::Status& status);

  RpcObserverFactory* factory_;
  MethodMetrics* m_;
  ServerRpcInfo* info_;
  absl::Time start_;
};

class RpcObserverFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  RpcObserverFactory(metrics::Registry* registry, Identity* identity)
      : identity_(identity),
        started_(registry->AddCounter("grpc_server_started_total", "RPCs started on the server.",
                                      {"grpc_service", "grpc_method", "grpc_type"})),
        handled_(registry->AddCounter("grpc_server_handled_total",
                                      "RPCs completed on the server, by status code.",
                                      {"grpc_service", "grpc_method", "grpc_type", "grpc_code"})),
        seconds_(registry->AddHistogram(
            "grpc_server_handling_seconds",
            "Time from the start of an RPC to its status, by status code.",
            {"grpc_service", "grpc_method", "grpc_type", "grpc_code"}, metrics::LatencyBounds())) {}

  Interceptor* CreateServerInterceptor(ServerRpcInfo* info) override {
    MethodMetrics* m = Find(info->method(), info->type());
    m->started->Add();
    return new CallObserver(this, m, info);
  }

  // The counter and histogram of `m` for `code`.
  Identity* identity() const { return identity_; }

  std::pair<metrics::Counter*, metrics::Histogram*> ForCode(MethodMetrics* m, int code) {
    if (code < 0 || code >= kCodes) code = static_cast<int>(grpc::StatusCode::UNKNOWN);
    absl::MutexLock lock(&m->mu);
    if (m->handled[code] == nullptr) {
      const std::vector<std::string> labels = {m->service, m->method, m->type, CodeName(code)};
      m->handled[code] = handled_->With(labels);
      m->seconds[code] = seconds_->With(labels);
    }
    return {m->handled[code], m->seconds[code]};
  }

 private:
  MethodMetrics* Find(const char* full_method, ServerRpcInfo::Type type) {
    // A path no service of the daemon has shares one series: each made-up
    // path a client sends must not make a series of its own, forever.
    std::string key = full_method == nullptr ? "" : full_method;
    if (!IsServedMethod(key)) key = "/unknown/unknown";
    absl::MutexLock lock(&mu_);
    std::unique_ptr<MethodMetrics>& m = methods_[key];
    if (m == nullptr) {
      m = std::make_unique<MethodMetrics>();
      // "/package.Service/Method"
      const size_t slash = key.rfind('/');
      m->service = slash == std::string::npos || slash == 0 ? "unknown" : key.substr(1, slash - 1);
      m->method = slash == std::string::npos ? key : key.substr(slash + 1);
      m->type = TypeName(type);
      m->started = started_->With({m->service, m->method, m->type});
    }
    return m.get();
  }

  Identity* const identity_;
  metrics::Registry::CounterFamily* started_;
  metrics::Registry::CounterFamily* handled_;
  metrics::Registry::HistogramFamily* seconds_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<MethodMetrics>> methods_ ABSL_GUARDED_BY(mu_);
};

void CallObserver::Finished(const grpc::Status& status) {
  const int code = static_cast<int>(status.error_code());
  auto [handled, seconds] = factory_->ForCode(m_, code);
  handled->Add();
  seconds->Observe(absl::ToDoubleSeconds(absl::Now() - start_));
  if (status.ok()) return;
  std::string peer;
  if (grpc::ServerContextBase* ctx = info_->server_context(); ctx != nullptr) {
    // Who, for the log: identified again (failures only), without counting
    // a refusal twice.
    auto caller = factory_->identity()->Identify(*ctx,
                                                 /*count_refusals=*/false);
    peer = caller.ok() ? absl::StrCat(caller->peer, " (tenant '", caller->tenant_name(), "')")
                       : absl::StrCat(ctx->peer(), " (unauthenticated)");
  }
  if (m_->method == "LoadModule" && status.error_code() == grpc::StatusCode::NOT_FOUND) {
    // A header-only upload of an image the daemon lacks: the protocol's
    // cache probe, answered as designed; the bytes follow.
    log::Debug(m_->method, " from ", peer, ": ", status.error_message());
    return;
  }
  LogFailure(m_->method, peer,
             absl::Status(static_cast<absl::StatusCode>(code), status.error_message()));
}

void CollectEngine(core::Engine* engine, Identity* identity, metrics::Sink& sink) {
  // Device figures come from the executors (free memory is a driver call on
  // the device's own thread); a scrape waits for them a short while.
  struct Pending {
    absl::Notification done;
    std::vector<core::DeviceStatus> devices;
  };
  auto pending = std::make_shared<Pending>();
  engine->ListDevices(core::OperatorCaller(),
                      [pending](absl::StatusOr<std::vector<core::DeviceStatus>> d) {
                        if (d.ok()) pending->devices = std::move(d).value();
                        pending->done.Notify();
                      });
  const bool answered = pending->done.WaitForNotificationWithTimeout(absl::Seconds(2));
  const core::EngineStats st = engine->Stats();

  auto gauge = [&sink](const char* name, const char* help) { sink.Declare(name, "gauge", help); };
  auto counter = [&sink](const char* name, const char* help) {
    sink.Declare(name, "counter", help);
  };
  gauge("gpuexec_devices", "Devices the daemon serves.");
  sink.Sample("gpuexec_devices", {}, static_cast<double>(engine->device_count()));

  if (answered) {
    const std::vector<core::DeviceStatus>& devices = pending->devices;
    auto each = [&](const char* name, auto value) {
      for (const core::DeviceStatus& d : devices) {
        sink.Sample(name, {{"device", absl::StrCat(d.index)}}, static_cast<double>(value(d)));
      }
    };
    gauge("gpuexec_device_healthy", "1 while the device serves, 0 while its worker restarts.");
    for (const core::DeviceStatus& d : devices) {
      sink.Sample("gpuexec_device_healthy", {{"device", absl::StrCat(d.index)}, {"name", d.name}},
                  d.healthy ? 1 : 0);
    }
    gauge("gpuexec_device_answering",
          "1 while the device's worker answers within 200 ms; 0 while it does not (stopped, or "
          "stuck in a driver call), when the other figures are the last it gave.");
    each("gpuexec_device_answering", [](const auto& d) { return d.not_answering_since ? 0 : 1; });
    gauge("gpuexec_worker_unsent_bytes",
          "Request bytes the device's worker has not taken yet; at --worker_queue_bytes new work "
          "for the device is refused.");
    each("gpuexec_worker_unsent_bytes", [](const auto& d) { return d.worker_unsent_bytes; });
    gauge("gpuexec_device_memory_total_bytes", "Device memory in all.");
    each("gpuexec_device_memory_total_bytes", [](const auto& d) { return d.memory_total; });
    gauge("gpuexec_device_memory_free_bytes", "Device memory free, as the driver reports it.");
    each("gpuexec_device_memory_free_bytes", [](const auto& d) { return d.memory_free; });
    gauge("gpuexec_device_memory_used_bytes",
          "Device memory in use by anyone (total minus free), the daemon's context included.");
    each("gpuexec_device_memory_used_bytes",
         [](const auto& d) { return d.memory_total - std::min(d.memory_free, d.memory_total); });
    gauge("gpuexec_device_sessions", "Sessions open on the device.");
    each("gpuexec_device_sessions", [](const auto& d) { return d.sessions; });
    gauge("gpuexec_device_modules_loaded", "Module images loaded on the device.");
    each("gpuexec_device_modules_loaded", [](const auto& d) { return d.modules_loaded; });
    counter("gpuexec_device_module_loads_total", "Module images the device has loaded.");
    each("gpuexec_device_module_loads_total", [](const auto& d) { return d.module_loads_total; });
  }

  auto per_device = [&](const char* name, auto value) {
    for (size_t i = 0; i < st.devices.size(); ++i) {
      sink.Sample(name, {{"device", absl::StrCat(i)}}, static_cast<double>(value(st.devices[i])));
    }
  };
  gauge("gpuexec_device_buffers", "Buffers the sessions hold on the device.");
  per_device("gpuexec_device_buffers", [](const auto& d) { return d.buffers; });
  gauge("gpuexec_device_memory_held_bytes", "Bytes of the buffers the sessions hold.");
  per_device("gpuexec_device_memory_held_bytes", [](const auto& d) { return d.memory_held; });
  counter("gpuexec_device_resets_total",
          "Restarts of the device's worker process (a sticky fault, a hung kernel, a crash).");
  per_device("gpuexec_device_resets_total", [](const auto& d) { return d.resets; });
  gauge("gpuexec_device_workers",
        "Worker processes serving the device: its shared one and tenants' own (--isolation).");
  per_device("gpuexec_device_workers", [](const auto& d) { return d.workers; });
  counter("gpuexec_kernel_launches_total", "Kernel launches enqueued.");
  per_device("gpuexec_kernel_launches_total", [](const auto& d) { return d.launches; });
  counter("gpuexec_write_bytes_total", "Bytes copied to the device by Write.");
  per_device("gpuexec_write_bytes_total", [](const auto& d) { return d.bytes_written; });
  counter("gpuexec_read_bytes_total", "Bytes copied from the device by Read.");
  per_device("gpuexec_read_bytes_total", [](const auto& d) { return d.bytes_read; });

  gauge("gpuexec_sessions", "Sessions open.");
  sink.Sample("gpuexec_sessions", {}, st.sessions_open);
  counter("gpuexec_sessions_opened_total", "Sessions opened.");
  sink.Sample("gpuexec_sessions_opened_total", {}, static_cast<double>(st.sessions_opened));
  counter("gpuexec_sessions_closed_total", "Sessions ended, by why.");
  sink.Sample("gpuexec_sessions_closed_total", {{"reason", "client"}},
              static_cast<double>(st.sessions_closed));
  sink.Sample("gpuexec_sessions_closed_total", {{"reason", "lease_expired"}},
              static_cast<double>(st.sessions_expired));
  counter("gpuexec_strikes_total",
          "Device resets charged to a tenant (or peer) whose kernel faulted or hung.");
  sink.Sample("gpuexec_strikes_total", {}, static_cast<double>(st.strikes));
  counter("gpuexec_strike_refusals_total", "Launches refused while their tenant cooled down.");
  sink.Sample("gpuexec_strike_refusals_total", {}, static_cast<double>(st.strike_refusals));
  counter("gpuexec_log_session_lines_left_out_total",
          "Session open and close lines not logged: past 10 a second (100 at once) of one tenant "
          "(without tenants, one peer); each logged line says how many before it were left out.");
  sink.Sample("gpuexec_log_session_lines_left_out_total", {},
              static_cast<double>(st.session_lines_left_out));
  gauge("gpuexec_module_store_images", "Module images in the daemon's store.");
  sink.Sample("gpuexec_module_store_images", {}, st.modules_stored);
  gauge("gpuexec_pinned_bytes", "Page-locked bytes of the sessions' host memory regions.");
  sink.Sample("gpuexec_pinned_bytes", {}, static_cast<double>(st.pinned_bytes));
  gauge("gpuexec_module_store_bytes", "Bytes of the module images in the store.");
  sink.Sample("gpuexec_module_store_bytes", {}, static_cast<double>(st.module_store_bytes));
  counter("gpuexec_module_uploads_total", "Module images whose bytes were uploaded.");
  sink.Sample("gpuexec_module_uploads_total", {}, static_cast<double>(st.module_uploads));
  gauge("gpuexec_module_upload_bytes_in_flight",
        "Bytes received by module uploads not yet finished (see --module_upload_budget_bytes).");
  sink.Sample("gpuexec_module_upload_bytes_in_flight", {},
              static_cast<double>(st.module_upload_bytes_in_flight));
  counter("gpuexec_module_upload_bytes_total", "Bytes of module images uploaded.");
  sink.Sample("gpuexec_module_upload_bytes_total", {}, static_cast<double>(st.module_upload_bytes));

  // By tenant: one series per tenant that has opened a session (tenants are
  // named by the tenants file or a verified certificate, never by a value
  // a caller made up).
  auto per_tenant = [&](const char* name, auto value) {
    for (const auto& t : st.tenants) {
      sink.Sample(name, {{"tenant", t.name}}, static_cast<double>(value(t)));
    }
  };
  gauge("gpuexec_tenant_sessions", "Sessions the tenant has open.");
  per_tenant("gpuexec_tenant_sessions", [](const auto& t) { return t.sessions; });
  gauge("gpuexec_tenant_sessions_untimed",
        "Of the tenant's open sessions, those that asked for no GPU time (OpenSession untimed): "
        "charged the host's view of their busy time, an upper bound.");
  per_tenant("gpuexec_tenant_sessions_untimed", [](const auto& t) { return t.sessions_untimed; });
  gauge("gpuexec_tenant_workers", "Worker processes of the tenant's own, on all devices.");
  per_tenant("gpuexec_tenant_workers", [](const auto& t) { return t.workers; });
  counter("gpuexec_tenant_sessions_opened_total", "Sessions the tenant opened.");
  per_tenant("gpuexec_tenant_sessions_opened_total",
             [](const auto& t) { return t.sessions_opened; });
  gauge("gpuexec_tenant_memory_held_bytes", "Device memory of the tenant's buffers.");
  per_tenant("gpuexec_tenant_memory_held_bytes", [](const auto& t) { return t.memory_held; });
  gauge("gpuexec_tenant_module_bytes", "Bytes of the distinct module images the tenant holds.");
  per_tenant("gpuexec_tenant_module_bytes", [](const auto& t) { return t.module_bytes; });
  counter("gpuexec_tenant_launches_total", "Kernel launches the tenant enqueued.");
  per_tenant("gpuexec_tenant_launches_total", [](const auto& t) { return t.launches; });
  counter("gpuexec_tenant_gpu_seconds_total",
          "GPU time of the tenant's work, as Synchronize reports it.");
  per_tenant("gpuexec_tenant_gpu_seconds_total", [](const auto& t) { return t.gpu_ns / 1e9; });
  counter("gpuexec_tenant_write_bytes_total", "Bytes the tenant copied to devices by Write.");
  per_tenant("gpuexec_tenant_write_bytes_total", [](const auto& t) { return t.bytes_written; });
  counter("gpuexec_tenant_read_bytes_total", "Bytes the tenant copied from devices by Read.");
  per_tenant("gpuexec_tenant_read_bytes_total", [](const auto& t) { return t.bytes_read; });

  // Compute shares in force (the tenants file's, as planned on each device):
  // each tenant's part and the rest the others share; none without shares.
  if (const auto& shares = engine->options().shares; shares != nullptr) {
    gauge("gpuexec_tenant_compute_share_sms",
          "SMs of the device kept for the tenant (its compute share).");
    gauge("gpuexec_device_compute_share_rest_sms",
          "SMs of the device the tenants without a compute share use together.");
    for (const core::DeviceShares& p : shares->plans()) {
      if (!p.any()) continue;
      const std::string device = absl::StrCat(p.device);
      for (const core::DeviceShares::Part& part : p.parts) {
        sink.Sample("gpuexec_tenant_compute_share_sms",
                    {{"tenant", part.tenant}, {"device", device}}, static_cast<double>(part.sms));
      }
      sink.Sample("gpuexec_device_compute_share_rest_sms", {{"device", device}},
                  static_cast<double>(p.rest_sms));
    }
  }

  counter("gpuexec_log_failure_lines_left_out_total",
          "Lines of failed calls and commands not logged: past 20 a second (200 at once), each "
          "logged line says how many before it were left out.");
  sink.Sample("gpuexec_log_failure_lines_left_out_total", {},
              static_cast<double>(FailureLinesLeftOut()));
  counter("gpuexec_auth_refused_total", "Calls refused for their credentials, by reason.");
  for (tenants::Refusal r : tenants::kAllRefusals) {
    sink.Sample("gpuexec_auth_refused_total", {{"reason", tenants::RefusalLabel(r)}},
                static_cast<double>(identity->refused(r)));
  }
}

}  // namespace

log::LineBudget& FailureLines() {
  // 20 lines a second, 200 at once: a burst of real trouble is all there;
  // a client failing commands by the thousand is a line now and then.
  static log::LineBudget* budget = new log::LineBudget(20, 200);
  return *budget;
}

namespace {

// The address and the tenant in a failed call's `peer`, for the log's
// fields. CallObserver::Finished words it "ipv4:10.0.0.7:41174 (tenant
// 'alice')" or "... (unauthenticated)"; the other callers pass the address
// alone. Tenant names are letters, digits and ".-_" (tenants::ValidName), so
// the quote ends the name.
struct PeerParts {
  absl::string_view address;
  absl::string_view tenant;
};
PeerParts SplitPeer(absl::string_view peer) {
  PeerParts parts{peer, {}};
  if (absl::ConsumeSuffix(&parts.address, " (unauthenticated)")) return parts;
  constexpr absl::string_view kTenant = " (tenant '";
  const size_t at = peer.rfind(kTenant);
  if (at == absl::string_view::npos || !absl::EndsWith(peer, "')")) return parts;
  parts.address = peer.substr(0, at);
  parts.tenant = peer.substr(at + kTenant.size());
  parts.tenant.remove_suffix(2);
  return parts;
}

}  // namespace

void LogFailure(absl::string_view method, absl::string_view peer, const absl::Status& status) {
  uint64_t left_out = 0;
  // A steady clock: a step of the wall clock must not stop the refill.
  const absl::Time now =
      absl::FromUnixNanos(std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::chrono::steady_clock::now().time_since_epoch())
                              .count());
  if (!FailureLines().Take(now, &left_out)) return;
  const std::string more =
      left_out == 0 ? std::string()
                    : absl::StrCat(" (", left_out, " failure line(s) left out before this one)");
  const int code = static_cast<int>(status.code());
  const PeerParts parts = SplitPeer(peer);
  log::Fields fields;
  fields.method = method;
  fields.code = CodeName(code);
  fields.tenant = parts.tenant;
  fields.peer = parts.address;
  if (CallerCaused(static_cast<grpc::StatusCode>(code))) {
    log::InfoWith(fields, method, " from ", peer, " failed: ", CodeName(code), ": ",
                  status.message(), more);
  } else {
    log::WarningWith(fields, method, " from ", peer, " failed: ", CodeName(code), ": ",
                     status.message(), more);
  }
}

uint64_t FailureLinesLeftOut() { return FailureLines().left_out_total(); }

CommandFailureLog::~CommandFailureLog() {
  absl::MutexLock lock(&mu_);
  FlushLocked();
}

void CommandFailureLog::Failed(absl::string_view op, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (!last_.ok() && op == op_ && status == last_) {
    ++alike_;
    return;
  }
  FlushLocked();
  op_ = std::string(op);
  last_ = status;
  LogFailure(op, peer_, status);
}

void CommandFailureLog::FlushLocked() {
  if (alike_ == 0) return;
  LogFailure(op_, peer_,
             absl::Status(last_.code(), absl::StrCat(alike_,
                                                     " more command(s) of the stream failed "
                                                     "alike: ",
                                                     last_.message())));
  alike_ = 0;
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeRpcObserver(
    metrics::Registry* registry, Identity* identity) {
  return std::make_unique<RpcObserverFactory>(registry, identity);
}

void AddEngineCollector(metrics::Registry* registry, core::Engine* engine, Identity* identity) {
  registry->AddCollector(
      [engine, identity](metrics::Sink& sink) { CollectEngine(engine, identity, sink); });
}

}  // namespace gpuexec::rpc
