#ifndef GPUEXEC_SERVER_CORE_TENANT_H_
#define GPUEXEC_SERVER_CORE_TENANT_H_

// Who is calling, as the engine sees it: a tenant (named by the transport's
// credentials, see server/tenants) and what it may use. The engine keeps
// each tenant's sessions apart from every other tenant's and holds the
// tenant to its limits; it never sees a credential.
//
// A Tenant is immutable: reloading the tenants file makes new ones, and a
// call keeps the one it started with.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/core/compute_shares.h"

namespace gpuexec::core {

struct TenantLimits {
  std::vector<uint32_t> devices;  // empty: every device
  // Devices dedicated to other tenants: never this one's, whatever
  // `devices` says.
  std::vector<uint32_t> excluded_devices;
  uint64_t memory_bytes = 0;          // device memory of all its sessions; 0: none
  uint32_t max_sessions = 0;          // 0: none
  uint64_t max_lease_ms = 0;          // 0: the daemon's
  uint64_t kernel_time_limit_ms = 0;  // 0: the daemon's
  uint64_t module_bytes = 0;          // distinct module images held; 0: none
  // Host memory regions (the daemon's --shm_socket): whether the tenant may
  // register them, and the page-locked bytes of all its sessions' regions
  // (0: the daemon's limits alone). The implicit tenant may.
  bool host_memory = false;
  uint64_t pinned_bytes = 0;
  // Command rings of all its sessions at once (0: a fixed number per peer).
  uint32_t max_command_rings = 0;
  // Compiles of kernels from source at once, running or waiting (0: the
  // daemon's --max_compiles_per_tenant).
  uint32_t max_compiles = 0;
  // Its part of each device's SMs (none: the rest, with the others
  // without one).
  ComputeShare compute_share;
  // Its work yields to the other tenants' (priority LOW): a lower MPS client
  // priority for its workers, a lower stream priority in a shared worker.
  bool low_priority = false;
};

struct Tenant {
  std::string name;
  TenantLimits limits;
};

// Whether a tenant with these limits may open sessions on device `index`:
// not one dedicated to another tenant, and one of its `devices` if it
// names any.
bool MayUseDevice(const TenantLimits& limits, uint32_t index);

// The tenant of a daemon that has none configured: everyone who may reach
// it (loopback and the Unix socket, by default) is this one tenant.
inline constexpr char kDefaultTenant[] = "default";

// One call's caller. `peer` is the transport's address, for the log only.
struct Caller {
  std::shared_ptr<const Tenant> tenant;
  std::string peer;
  // The daemon's own view (metrics): every tenant's figures. Never set for
  // a remote caller.
  bool sees_all = false;

  const std::string& tenant_name() const;
};

// The principal a peer address stands for, the unit that per-peer limits
// and (without tenants) strikes count: something a caller cannot multiply
// by choosing its source address.
//   "unix:uid=1000,gid=1000,pid=42"   -> "unix:uid=1000" (the kernel says)
//   "ipv4:127.0.0.9:34780", "ipv6:[::1]:5", "ipv6:[::ffff:127.0.0.1]:5"
//                                     -> "loopback" (any local user: one
//                                        principal; the Unix socket tells
//                                        local users apart)
//   "ipv4:10.0.3.7:34780"             -> "ipv4:10.0.3.7"
//   "ipv6:[2001:db8:1:2:a:b:c:d]:5"   -> "ipv6:[2001:db8:1:2::]/64" (a
//                                        host holds a /64 to choose from)
// Anything else is returned as it is.
std::string PeerHost(const std::string& peer);

// The implicit tenant, without limits of its own.
std::shared_ptr<const Tenant> DefaultTenant();
// A caller of the implicit tenant (tests and in-process callers).
Caller DefaultCaller(std::string peer = "in-process");
// The daemon itself, for its metrics.
Caller OperatorCaller();

}  // namespace gpuexec::core

#endif  // GPUEXEC_SERVER_CORE_TENANT_H_
