#include "server/rpc/identity.h"

#include <grpc/grpc_security_constants.h>
#include <sys/stat.h>

#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/common/log.h"
#include "server/rpc/observability.h"

namespace gpuexec::rpc {
namespace {

constexpr char kAuthorization[] = "authorization";

// A verified client certificate's names: its DNS and URI subject
// alternative names, or its common name when it has no SAN at all (RFC 6125
// deprecates the CN for identity; SPIFFE ids, for one, are URI SANs). IP
// and e-mail SANs name no tenant.
std::vector<std::string> CertificateNames(const grpc::AuthContext& auth) {
  std::vector<std::string> names;
  if (!auth.IsPeerAuthenticated()) return names;
  for (const char* property : {GRPC_PEER_DNS_PROPERTY_NAME, GRPC_PEER_URI_PROPERTY_NAME}) {
    for (const auto& v : auth.FindPropertyValues(property)) names.emplace_back(v.data(), v.size());
  }
  if (names.empty() && auth.FindPropertyValues(GRPC_X509_SAN_PROPERTY_NAME).empty()) {
    for (const auto& v : auth.FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME)) {
      names.emplace_back(v.data(), v.size());
    }
  }
  return names;
}

// What a call's transport says about its caller.
tenants::Credentials CredentialsOf(
    const grpc::AuthContext* auth,
    const std::multimap<grpc::string_ref, grpc::string_ref>& metadata, bool client_certificates) {
  tenants::Credentials c;
  if (auto it = metadata.find(kAuthorization); it != metadata.end()) {
    c.authorization = std::string(it->second.data(), it->second.size());
  }
  if (auth != nullptr && client_certificates) c.certificate_names = CertificateNames(*auth);
  return c;
}

}  // namespace

// Runs in gRPC's auth filter for every call on the TLS listener, before
// any handler sees it, and refuses bad credentials there. It records
// nothing: the auth context it is given is the connection's, shared by all
// of the connection's calls, so each call is identified again, from its own
// metadata, by its handler.
class Identity::Processor final : public grpc::AuthMetadataProcessor {
 public:
  explicit Processor(Identity* identity) : identity_(identity) {}
  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed, OutputMetadata* response) override {
    const tenants::Credentials credentials =
        CredentialsOf(context, metadata, identity_->client_certificates_);
    if (!credentials.authorization.has_value() && credentials.certificate_names.empty()) {
      // Health and reflection serve anyone; gpuexec.v1's handlers refuse
      // a call with no credentials.
      return grpc::Status::OK;
    }
    auto tenant = identity_->Resolve(credentials, /*count_refusals=*/true);
    if (!tenant.ok()) {
      // Any peer can send these as fast as it likes: one line under the
      // failed calls' budget, whose left-out lines the metrics count
      // (gpuexec_log_failure_lines_left_out_total). gRPC tells the
      // processor nothing of the peer's address.
      LogFailure("a call on the TLS listener", "a peer without valid credentials",
                 absl::UnauthenticatedError(tenant.status().message()));
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          std::string(tenant.status().message()));
    }
    return grpc::Status::OK;
  }

 private:
  Identity* identity_;
};

void Identity::SetDirectory(std::shared_ptr<const tenants::Directory> directory) {
  absl::MutexLock lock(&mu_);
  directory_ = std::move(directory);
  generation_.fetch_add(1, std::memory_order_release);
}

std::shared_ptr<const tenants::Directory> Identity::directory() const {
  absl::MutexLock lock(&mu_);
  return directory_;
}

std::shared_ptr<grpc::AuthMetadataProcessor> Identity::MakeProcessor() {
  return std::make_shared<Processor>(this);
}

void Identity::SetUnixPeer(int fd, const tenants::PeerCredentials& peer) {
  struct stat st;
  if (fstat(fd, &st) != 0) return;
  absl::MutexLock lock(&mu_);
  unix_peers_[fd] = UnixPeer{peer, st.st_dev, st.st_ino};
}

void Identity::CountRefusal(tenants::Refusal reason) {
  refused_[static_cast<size_t>(reason)].fetch_add(1, std::memory_order_relaxed);
}

absl::StatusOr<std::shared_ptr<const core::Tenant>> Identity::Resolve(
    const tenants::Credentials& credentials, bool count_refusals) {
  std::shared_ptr<const tenants::Directory> dir = directory();
  if (dir == nullptr) return tenants::IdentifyWithoutFile(credentials);
  tenants::Refusal why = tenants::Refusal::kNoCredentials;
  auto tenant = dir->Identify(credentials, &why);
  if (!tenant.ok() && count_refusals) CountRefusal(why);
  return tenant;
}

absl::StatusOr<core::Caller> Identity::IdentifyUnixPeer(const tenants::PeerCredentials& peer) {
  core::Caller caller;
  caller.peer = absl::StrCat("unix:uid=", peer.uid, ",gid=", peer.gid, ",pid=", peer.pid);
  tenants::Credentials credentials;
  credentials.unix_peer = peer;
  auto tenant = Resolve(credentials, /*count_refusals=*/true);
  if (!tenant.ok()) return tenant.status();
  caller.tenant = *std::move(tenant);
  return caller;
}

absl::StatusOr<core::Caller> Identity::Identify(const grpc::ServerContextBase& ctx,
                                                bool count_refusals) {
  core::Caller caller;
  caller.peer = ctx.peer();
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  tenants::Credentials credentials =
      CredentialsOf(auth.get(), ctx.client_metadata(), client_certificates_);
  int fd = -1;
  if (absl::StartsWith(caller.peer, "fd:") &&
      absl::SimpleAtoi(absl::string_view(caller.peer).substr(3), &fd)) {
    // The connection's socket, checked to be the one accepted under that
    // number (not a later one that reused it).
    struct stat st;
    const bool open = fstat(fd, &st) == 0;
    absl::MutexLock lock(&mu_);
    auto it = unix_peers_.find(fd);
    if (open && it != unix_peers_.end() && it->second.dev == st.st_dev &&
        it->second.ino == st.st_ino) {
      const tenants::PeerCredentials& p = it->second.credentials;
      credentials.unix_peer = p;
      caller.peer = absl::StrCat("unix:uid=", p.uid, ",gid=", p.gid, ",pid=", p.pid);
    }
  }
  auto tenant = Resolve(credentials, count_refusals);
  if (!tenant.ok()) return tenant.status();
  caller.tenant = *std::move(tenant);
  return caller;
}

}  // namespace gpuexec::rpc
