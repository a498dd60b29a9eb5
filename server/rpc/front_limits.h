#ifndef GPUEXEC_SERVER_RPC_FRONT_LIMITS_H_
#define GPUEXEC_SERVER_RPC_FRONT_LIMITS_H_

// What a peer may make the front hold before it has shown any credential:
// HTTP/2 streams per connection, the memory gRPC may take for connections
// and calls, how long a connection may take to say who it is, stay idle or
// ping, and the file descriptors the daemon keeps for itself.
//
// gRPC 1.51 checks a caller's identity only once its stream exists, so
// everything here applies to peers without credentials as much as to
// tenants. What 1.51 cannot bound (README, "Security"): the number of TCP
// connections it accepts (no per-address or total cap in the C-core; a
// silent one now goes after the handshake timeout, one that has spoken
// after the idle limit), and the calls of a rapid-reset flood: 1.51 frees
// a stream at its RST_STREAM but keeps its call until the daemon has taken
// it from the server's queue, so neither the stream limit nor the quota
// holds them (measured in tests/service/flood_test.cc).

#include <grpcpp/server_builder.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "server/core/engine.h"

namespace gpuexec {
struct ServerOptions;
}  // namespace gpuexec

namespace gpuexec::rpc {

class Identity;

// What the daemon needs to know before it serves anyone: the TLS files, the
// tenants file, and whether the listen address may be served as configured.
absl::Status CheckSecurity(const ServerOptions& o);

// The TLS listener's credentials: files watched every
// `tls_reload_interval`, client certificates required with
// `tls_client_ca`, calls identified by `identity`.
std::shared_ptr<grpc::ServerCredentials> TlsCredentials(const ServerOptions& o, Identity* identity);

// Who shares a worker, and why: a worker per tenant wherever callers can
// be several identities (a tenants file, client certificates), unless the
// operator asked for one per device; then a warning says that tenants
// share one address space. A Unix socket without a tenants file makes
// every uid the one implicit tenant: said too.
struct IsolationChoice {
  core::EngineOptions::Isolation isolation;
  std::string why;
  std::string warning;  // logged as a warning when not empty
};
absl::StatusOr<IsolationChoice> ChooseIsolation(const ServerOptions& o);

struct FrontLimits {
  // HTTP/2 streams one connection may have open at once (0: gRPC's own,
  // which is no bound).
  uint32_t max_concurrent_streams = 128;
  // Bytes gRPC may hold for every connection and call together (its
  // ResourceQuota); under pressure it shrinks windows and closes idle
  // connections. 0: no quota; unset: DefaultFrontMemoryBytes of the
  // host's memory.
  std::optional<uint64_t> memory_bytes;
  // A connection that has not finished its HTTP/2 (and TLS) handshake
  // within this long is closed.
  int64_t handshake_timeout_ms = 10'000;
  // A connection with no call open for this long gets a GOAWAY (clients
  // reconnect on their next call; sessions do not depend on a connection).
  // 0: never.
  int64_t connection_idle_ms = 300'000;
  // A connection older than this gets a GOAWAY, and `age_grace_ms` for its
  // calls to end (0: no age limit). Off by default: a session's command
  // stream lives as long as the session.
  int64_t connection_age_ms = 0;
  int64_t connection_age_grace_ms = 60'000;
  // Pings a client may send without data: no more often than this, and
  // `max_ping_strikes` too-early pings close the connection.
  int64_t min_ping_interval_ms = 60'000;
  int max_ping_strikes = 2;
};

// The default of FrontLimits::memory_bytes: a quarter of the host's memory,
// at most 1 GiB (at least 64 MiB).
uint64_t DefaultFrontMemoryBytes(uint64_t host_memory_bytes);

// `limits` with every unset field given its default.
FrontLimits ResolveFrontLimits(FrontLimits limits, uint64_t host_memory_bytes);

// Sets `limits` (resolved) on the server being built: channel arguments
// and the resource quota.
void ApplyFrontLimits(const FrontLimits& limits, grpc::ServerBuilder* builder);

// One line for the start-up log: the limits in force.
std::string DescribeFrontLimits(const FrontLimits& limits);

// The process's file descriptors: the soft limit raised to the hard one.
struct DescriptorBudget {
  uint64_t soft_before = 0;
  uint64_t limit = 0;  // the soft limit now
  uint64_t needed = 0;
  uint64_t open = 0;  // descriptors open when it was checked
};

// Raises RLIMIT_NOFILE's soft limit to its hard limit and checks that it
// leaves `needed` descriptors beyond those open now. FAILED_PRECONDITION,
// naming the limit and what to do, when it does not.
absl::StatusOr<DescriptorBudget> RaiseDescriptorLimit(uint64_t needed, const std::string& needs);

// RaiseDescriptorLimit for what `o` configures: the workers of
// `device_count` devices (about 8 descriptors each in the front), the Unix
// socket's and metrics' connections, kDescriptorReserve and gRPC's own;
// logs the limit in force. Returns the descriptors left over for TCP
// connections.
absl::StatusOr<uint64_t> CheckDescriptorBudget(const ServerOptions& o,
                                               core::EngineOptions::Isolation isolation,
                                               uint32_t max_workers_per_device, int device_count);

// The soft RLIMIT_NOFILE now (0 if unknown).
uint64_t DescriptorLimit();

// Whether an accepted descriptor `fd` leaves fewer than `reserve` below the
// soft limit: accept() returns the lowest free number, so a number this
// high means the table is nearly full. Listeners of the daemon's own close
// such connections at once, keeping the last descriptors for worker
// restarts and the daemon's own files.
bool InDescriptorReserve(int fd, uint64_t reserve);

// Descriptors kept free for worker starts and restarts, and the daemon's
// own files.
inline constexpr uint64_t kDescriptorReserve = 64;

}  // namespace gpuexec::rpc

#endif  // GPUEXEC_SERVER_RPC_FRONT_LIMITS_H_
