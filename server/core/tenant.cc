#include "server/core/tenant.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"

namespace gpuexec::core {

const std::string& Caller::tenant_name() const {
  static const std::string* const kNone = new std::string(kDefaultTenant);
  return tenant == nullptr ? *kNone : tenant->name;
}

bool MayUseDevice(const TenantLimits& limits, uint32_t index) {
  auto has = [index](const std::vector<uint32_t>& v) {
    return std::find(v.begin(), v.end(), index) != v.end();
  };
  return !has(limits.excluded_devices) && (limits.devices.empty() || has(limits.devices));
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
  if (peer.rfind("ipv4:", 0) == 0) {
    const size_t colon = peer.rfind(':');
    const std::string host = colon > 5 ? peer.substr(5, colon - 5) : peer.substr(5);
    in_addr a{};
    if (inet_pton(AF_INET, host.c_str(), &a) != 1) return peer;
    if ((ntohl(a.s_addr) >> 24) == 127) return "loopback";
    return "ipv4:" + host;
  }
  if (peer.rfind("ipv6:", 0) == 0) {
    // "ipv6:[addr]:port" (or "ipv6:[addr%zone]:port"); gRPC writes the
    // brackets and the zone's '%' percent-encoded ("ipv6:%5B::1%5D:443").
    std::string decoded;
    for (size_t i = 0; i < peer.size(); ++i) {
      if (peer[i] == '%' && i + 2 < peer.size()) {
        const std::string code = absl::AsciiStrToUpper(peer.substr(i + 1, 2));
        if (code == "5B" || code == "5D" || code == "25") {
          decoded += code == "5B" ? '[' : code == "5D" ? ']' : '%';
          i += 2;
          continue;
        }
      }
      decoded += peer[i];
    }
    const size_t open = decoded.find('[');
    const size_t close = decoded.find(']');
    if (open == std::string::npos || close == std::string::npos || close < open) return peer;
    std::string host = decoded.substr(open + 1, close - open - 1);
    host = host.substr(0, host.find('%'));
    in6_addr a{};
    if (inet_pton(AF_INET6, host.c_str(), &a) != 1) return peer;
    if (IN6_IS_ADDR_LOOPBACK(&a)) return "loopback";
    if (IN6_IS_ADDR_V4MAPPED(&a)) {
      if (a.s6_addr[12] == 127) return "loopback";
      char text[INET_ADDRSTRLEN] = {};
      inet_ntop(AF_INET, &a.s6_addr[12], text, sizeof(text));
      return std::string("ipv4:") + text;
    }
    // The /64 a host chooses its addresses from.
    for (int i = 8; i < 16; ++i) a.s6_addr[i] = 0;
    char text[INET6_ADDRSTRLEN] = {};
    inet_ntop(AF_INET6, &a, text, sizeof(text));
    return std::string("ipv6:[") + text + "]/64";
  }
  return peer;
}

Caller DefaultCaller(std::string peer) { return Caller{DefaultTenant(), std::move(peer)}; }

Caller OperatorCaller() { return Caller{nullptr, "the daemon", true}; }

}  // namespace gpuexec::core
