#include "server/rpc/identity.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/common/log.h"

namespace gpuexec::rpc {
namespace {

constexpr char kAuthorization[] = "authorization";

// A verified client certificate's names: its subject alternative names, or
// its common name when it has none (RFC 6125 deprecates the CN for
// identity; SPIFFE ids, for one, are URI SANs).
std::vector<std::string> CertificateNames(const grpc::AuthContext& auth) {
  std::vector<std::string> names;
  if (!auth.IsPeerAuthenticated()) return names;
  for (const auto& v : auth.FindPropertyValues("x509_subject_alternative_name")) {
    names.emplace_back(v.data(), v.size());
  }
  if (names.empty()) {
    for (const auto& v : auth.FindPropertyValues("x509_common_name")) {
      names.emplace_back(v.data(), v.size());
    }
  }
  return names;
}

}  // namespace

// Runs in gRPC's auth filter for every call on the TLS listener, before
// any handler sees it.
class Identity::Processor final : public grpc::AuthMetadataProcessor {
 public:
  explicit Processor(Identity* identity) : identity_(identity) {}
  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed, OutputMetadata* response) override {
    tenants::Credentials credentials;
    if (auto it = metadata.find(kAuthorization); it != metadata.end()) {
      credentials.authorization = std::string(it->second.data(), it->second.size());
      consumed->emplace(kAuthorization, credentials.authorization.value());
    }
    if (identity_->client_certificates_) credentials.certificate_names = CertificateNames(*context);
    if (!credentials.authorization.has_value() && credentials.certificate_names.empty()) {
      // Health and reflection serve anyone; gpuexec.v1's handlers refuse
      // a call with no tenant.
      return grpc::Status::OK;
    }
    auto tenant = identity_->Resolve(credentials, /*count_refusals=*/true);
    if (!tenant.ok()) {
      log::Info("refused a call on the TLS listener: UNAUTHENTICATED: ", tenant.status().message());
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          std::string(tenant.status().message()));
    }
    context->AddProperty(kTenantProperty, (*tenant)->name);
    return grpc::Status::OK;
  }

 private:
  Identity* identity_;
};

void Identity::SetDirectory(std::shared_ptr<const tenants::Directory> directory) {
  absl::MutexLock lock(&mu_);
  directory_ = std::move(directory);
}

std::shared_ptr<const tenants::Directory> Identity::directory() const {
  absl::MutexLock lock(&mu_);
  return directory_;
}

std::shared_ptr<grpc::AuthMetadataProcessor> Identity::MakeProcessor() {
  return std::make_shared<Processor>(this);
}

void Identity::SetUnixPeer(int fd, const tenants::PeerCredentials& peer) {
  absl::MutexLock lock(&mu_);
  unix_peers_[fd] = peer;
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

absl::StatusOr<core::Caller> Identity::Identify(const grpc::ServerContextBase& ctx,
                                                bool count_refusals) {
  core::Caller caller;
  caller.peer = ctx.peer();
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth != nullptr) {
    // Set by the TLS listener's processor, which has checked the
    // credentials already.
    const auto named = auth->FindPropertyValues(kTenantProperty);
    if (!named.empty()) {
      const std::string name(named.front().data(), named.front().size());
      std::shared_ptr<const tenants::Directory> dir = directory();
      if (dir == nullptr) {
        tenants::Credentials c;
        c.certificate_names = CertificateNames(*auth);
        auto tenant = tenants::IdentifyWithoutFile(c);
        if (!tenant.ok()) return tenant.status();
        caller.tenant = *std::move(tenant);
        return caller;
      }
      caller.tenant = dir->Find(name);
      // Gone with a reload since the processor ran.
      if (caller.tenant == nullptr) {
        return absl::UnauthenticatedError("unknown or revoked credentials");
      }
      return caller;
    }
  }
  tenants::Credentials credentials;
  const auto& metadata = ctx.client_metadata();
  if (auto it = metadata.find(kAuthorization); it != metadata.end()) {
    credentials.authorization = std::string(it->second.data(), it->second.size());
  }
  if (auth != nullptr && client_certificates_) credentials.certificate_names = CertificateNames(*auth);
  int fd = -1;
  if (absl::StartsWith(caller.peer, "fd:") &&
      absl::SimpleAtoi(absl::string_view(caller.peer).substr(3), &fd)) {
    absl::MutexLock lock(&mu_);
    auto it = unix_peers_.find(fd);
    if (it != unix_peers_.end()) {
      credentials.unix_peer = it->second;
      caller.peer = absl::StrCat("unix:uid=", it->second.uid, ",gid=", it->second.gid,
                                 ",pid=", it->second.pid);
    }
  }
  auto tenant = Resolve(credentials, count_refusals);
  if (!tenant.ok()) return tenant.status();
  caller.tenant = *std::move(tenant);
  return caller;
}

}  // namespace gpuexec::rpc
