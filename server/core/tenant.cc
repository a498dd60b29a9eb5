#include "server/core/tenant.h"

#include <utility>

namespace gpuexec::core {

const std::string& Caller::tenant_name() const {
  static const std::string* const kNone = new std::string(kDefaultTenant);
  return tenant == nullptr ? *kNone : tenant->name;
}

std::shared_ptr<const Tenant> DefaultTenant() {
  static const std::shared_ptr<const Tenant>* const kTenant = [] {
    auto t = std::make_shared<Tenant>(Tenant{kDefaultTenant, {}});
    // Everyone who reaches a daemon without tenants is one user: the host
    // memory socket, when served, is theirs.
    t->limits.host_memory = true;
    return new std::shared_ptr<const Tenant>(std::move(t));
  }();
  return *kTenant;
}

std::string PeerHost(const std::string& peer) {
  if (peer.rfind("unix:", 0) == 0) return peer.substr(0, peer.find(','));
  if (peer.rfind("ipv4:", 0) == 0 || peer.rfind("ipv6:", 0) == 0) {
    const size_t colon = peer.rfind(':');
    if (colon > 5) return peer.substr(0, colon);
  }
  return peer;
}

Caller DefaultCaller(std::string peer) { return Caller{DefaultTenant(), std::move(peer)}; }

Caller OperatorCaller() { return Caller{nullptr, "the daemon", true}; }

}  // namespace gpuexec::core
