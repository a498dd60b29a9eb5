#include "server/rpc/front_limits.h"

#include <dirent.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gpuexec/address.h"
#include "server/common/log.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"
#include "server/rpc/identity.h"
#include "server/rpc/server.h"

namespace gpuexec::rpc {
namespace {

// Descriptors open in this process now.
uint64_t OpenDescriptors() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  uint64_t n = 0;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n > 0 ? n - 1 : 0;  // not the directory's own
}

std::string Millis(int64_t ms) {
  if (ms <= 0) return "off";
  if (ms % 1000 == 0) return absl::StrCat(ms / 1000, " s");
  return absl::StrCat(ms, " ms");
}

// A PEM file the TLS listener needs: it must be there and readable at start
// (the watcher then picks up its replacements).
absl::Status CheckPemFile(const std::string& path, absl::string_view flag) {
  std::ifstream in(path);
  std::string first;
  if (!in || !std::getline(in, first)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read ", path));
  }
  if (first.rfind("-----BEGIN ", 0) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " is not a PEM file"));
  }
  return absl::OkStatus();
}

}  // namespace

// What the daemon needs to know before it serves anyone: the TLS files, the
// tenants file, and whether the listen address may be served as configured.
absl::Status CheckSecurity(const ServerOptions& o) {
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  const bool tls = !o.tls_cert.empty();
  if (!o.tls_client_ca.empty() && !tls) {
    return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert and --tls_key");
  }
  if (tls && o.listen_address.empty()) {
    return absl::InvalidArgumentError("--tls_cert: there is no TCP listener (--listen is empty)");
  }
  if (tls) {
    GPUEXEC_RETURN_IF_ERROR(CheckPemFile(o.tls_cert, "--tls_cert"));
    GPUEXEC_RETURN_IF_ERROR(CheckPemFile(o.tls_key, "--tls_key"));
    if (!o.tls_client_ca.empty()) {
      GPUEXEC_RETURN_IF_ERROR(CheckPemFile(o.tls_client_ca, "--tls_client_ca"));
    }
  }
  if (o.listen_address.empty() || IsLoopbackAddress(o.listen_address) || o.allow_unauthenticated) {
    return absl::OkStatus();
  }
  const bool identity = !o.tenants_file.empty() || !o.tls_client_ca.empty();
  if (tls && identity) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "--listen=", o.listen_address, " is not a loopback address, and ",
      tls ? "no identity is configured: give --tenants (bearer tokens) or --tls_client_ca "
            "(client certificates)"
          : "it has no TLS: give --tls_cert and --tls_key, and --tenants or --tls_client_ca",
      "; or --allow_unauthenticated to let anyone who reaches it use the GPUs"));
}

std::shared_ptr<grpc::ServerCredentials> TlsCredentials(const ServerOptions& o,
                                                        rpc::Identity* identity) {
  const unsigned interval =
      static_cast<unsigned>(std::max<int64_t>(1, absl::ToInt64Seconds(o.tls_reload_interval)));
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      o.tls_key, o.tls_cert, o.tls_client_ca.empty() ? std::string() : o.tls_client_ca, interval);
  grpc::experimental::TlsServerCredentialsOptions tls(provider);
  tls.watch_identity_key_cert_pairs();
  if (!o.tls_client_ca.empty()) {
    tls.watch_root_certs();
    tls.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    tls.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::experimental::TlsServerCredentials(tls);
  creds->SetAuthMetadataProcessor(identity->MakeProcessor());
  return creds;
}

absl::StatusOr<IsolationChoice> ChooseIsolation(const ServerOptions& o) {
  using Isolation = core::EngineOptions::Isolation;
  std::vector<std::string> identities;
  if (!o.tenants_file.empty()) identities.push_back("a tenants file (--tenants)");
  if (!o.tls_client_ca.empty()) {
    identities.push_back("client certificates (--tls_client_ca), each name a tenant");
  }
  const std::string several = identities.empty() ? ""
                                                 : absl::StrCat("callers can be several tenants: ",
                                                                absl::StrJoin(identities, " and "));
  // Without a tenants file every Unix-socket uid is the one implicit
  // tenant: a worker per tenant would not part them.
  const std::string unix_note =
      o.unix_socket.empty() || !o.tenants_file.empty()
          ? ""
          : absl::StrCat("every uid that may reach the Unix socket ", o.unix_socket,
                         " (mode 0660, group ",
                         o.unix_socket_group.empty() ? "the daemon's" : o.unix_socket_group,
                         ") is one implicit tenant and shares its worker; give a tenants file "
                         "(--tenants) naming each uid to keep them apart");
  IsolationChoice c;
  if (o.isolation == "tenant") {
    c = {Isolation::kTenant, "--isolation=tenant", unix_note};
  } else if (o.isolation == "device") {
    c = {Isolation::kDevice, "--isolation=device", ""};
    if (!several.empty()) {
      c.warning = absl::StrCat(
          "--isolation=device while ", several,
          ": these tenants share one worker per device, one CUDA context and one address space, "
          "so a kernel of one can read and overwrite another's buffers; leave --isolation unset "
          "(or give 'tenant') to give each tenant a worker of its own");
    }
    if (!unix_note.empty()) {
      c.warning = c.warning.empty() ? unix_note : absl::StrCat(c.warning, "; and ", unix_note);
    }
  } else if (o.isolation.empty()) {
    if (!several.empty()) {
      c = {Isolation::kTenant, several, unix_note};
    } else {
      c = {Isolation::kDevice, "one identity only (no tenants file, no client certificates)",
           unix_note};
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--isolation must be 'tenant' or 'device', not ", Quoted(o.isolation, 32)));
  }
  return c;
}

uint64_t DefaultFrontMemoryBytes(uint64_t host_memory_bytes) {
  constexpr uint64_t kMost = 1ull << 30;
  constexpr uint64_t kLeast = 64ull << 20;
  if (host_memory_bytes == 0) return kMost;
  return std::max(kLeast, std::min(kMost, host_memory_bytes / 4));
}

FrontLimits ResolveFrontLimits(FrontLimits limits, uint64_t host_memory_bytes) {
  if (!limits.memory_bytes.has_value()) {
    limits.memory_bytes = DefaultFrontMemoryBytes(host_memory_bytes);
  }
  return limits;
}

void ApplyFrontLimits(const FrontLimits& limits, grpc::ServerBuilder* builder) {
  if (limits.max_concurrent_streams != 0) {
    builder->AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                                static_cast<int>(limits.max_concurrent_streams));
  }
  if (limits.memory_bytes.value_or(0) != 0) {
    grpc::ResourceQuota quota("gpuexecd-front");
    quota.Resize(static_cast<size_t>(*limits.memory_bytes));
    builder->SetResourceQuota(quota);
  }
  auto as_int = [](int64_t ms) {
    return static_cast<int>(std::min<int64_t>(ms, std::numeric_limits<int>::max()));
  };
  if (limits.handshake_timeout_ms > 0) {
    builder->AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                                as_int(limits.handshake_timeout_ms));
  }
  if (limits.connection_idle_ms > 0) {
    builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, as_int(limits.connection_idle_ms));
  }
  if (limits.connection_age_ms > 0) {
    builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, as_int(limits.connection_age_ms));
    builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                                as_int(limits.connection_age_grace_ms));
  }
  if (limits.min_ping_interval_ms > 0) {
    builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                                as_int(limits.min_ping_interval_ms));
    builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, limits.max_ping_strikes);
  }
}

std::string DescribeFrontLimits(const FrontLimits& limits) {
  return absl::StrCat(
      "front limits: ",
      limits.max_concurrent_streams == 0
          ? std::string("no stream limit")
          : absl::StrCat(limits.max_concurrent_streams, " streams per connection"),
      " (--rpc_max_streams); gRPC memory ",
      limits.memory_bytes.value_or(0) == 0 ? std::string("unbounded")
                                           : absl::StrCat(*limits.memory_bytes >> 20, " MiB"),
      " (--rpc_memory_bytes); handshake within ", Millis(limits.handshake_timeout_ms),
      " (--rpc_handshake_timeout_ms); idle connections closed after ",
      Millis(limits.connection_idle_ms), " (--rpc_connection_idle_ms); connection age limit ",
      Millis(limits.connection_age_ms), " (--rpc_connection_age_ms); pings without data at most ",
      "every ", Millis(limits.min_ping_interval_ms), " (", limits.max_ping_strikes, " strikes)");
}

uint64_t DescriptorLimit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  return rl.rlim_cur == RLIM_INFINITY ? std::numeric_limits<uint64_t>::max() : rl.rlim_cur;
}

absl::StatusOr<DescriptorBudget> RaiseDescriptorLimit(uint64_t needed, const std::string& needs) {
  DescriptorBudget budget;
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot read the descriptor limit (RLIMIT_NOFILE): ", std::strerror(errno)));
  }
  budget.soft_before = rl.rlim_cur;
  if (rl.rlim_cur != rl.rlim_max) {
    rlimit raised = rl;
    raised.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) rl = raised;
  }
  budget.limit = rl.rlim_cur == RLIM_INFINITY ? std::numeric_limits<uint64_t>::max() : rl.rlim_cur;
  budget.needed = needed;
  budget.open = OpenDescriptors();
  if (budget.limit < budget.open + needed) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the descriptor limit (RLIMIT_NOFILE) is ", budget.limit, ", its hard limit, and ",
        budget.open, " are open: the daemon needs ", needed, " more (", needs,
        "); raise the limit (LimitNOFILE= in the systemd unit, ulimit -n, or the container's "
        "nofile ulimit) or lower --max_workers_per_device, --unix_max_connections"));
  }
  return budget;
}

absl::StatusOr<uint64_t> CheckDescriptorBudget(const ServerOptions& options,
                                               core::EngineOptions::Isolation isolation,
                                               uint32_t max_workers_per_device, int device_count) {
  const uint64_t per_device = isolation == core::EngineOptions::Isolation::kTenant
                                  ? (max_workers_per_device == 0 ? 64 : max_workers_per_device)
                                  : 1;
  const uint64_t workers = per_device * static_cast<uint64_t>(std::max(device_count, 0));
  const uint64_t unix_conns = options.unix_socket.empty() ? 0 : options.unix_max_connections;
  const uint64_t metrics_conns =
      options.metrics_address.empty() ? 0 : options.metrics_max_connections;
  const uint64_t needed = workers * 8 + unix_conns + metrics_conns + kDescriptorReserve + 64;
  auto budget = RaiseDescriptorLimit(
      needed, absl::StrCat(workers, " worker(s) at 8 each, ", unix_conns,
                           " Unix-socket connections (--unix_max_connections), ", metrics_conns,
                           " metrics connections (--metrics_max_connections), ",
                           kDescriptorReserve + 64, " for gRPC and restarts"));
  if (!budget.ok()) return budget.status();
  log::Info("gpuexecd: file descriptors: limit ", budget->limit,
            budget->soft_before == budget->limit
                ? std::string()
                : absl::StrCat(" (raised from ", budget->soft_before, ")"),
            ", ", budget->open, " open, ", needed,
            " kept for workers and listeners; TCP connections take the rest but the last ",
            kDescriptorReserve);
  const uint64_t used = budget->open + needed;
  return budget->limit > used ? budget->limit - used : 0;
}

bool InDescriptorReserve(int fd, uint64_t reserve) {
  const uint64_t limit = DescriptorLimit();
  return fd >= 0 && limit != 0 && static_cast<uint64_t>(fd) + reserve >= limit;
}

}  // namespace gpuexec::rpc
