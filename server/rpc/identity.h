#ifndef GPUEXEC_SERVER_RPC_IDENTITY_H_
#define GPUEXEC_SERVER_RPC_IDENTITY_H_

// Who is calling: a call's credentials gathered from its transport, and the
// tenant the tenants directory says they name.
//
//  - TLS listener: an AuthMetadataProcessor (MakeProcessor) checks the
//    bearer token and the client certificate before the call reaches a
//    handler and refuses bad ones with UNAUTHENTICATED.
//  - Every gpuexec.v1 call, whatever its listener: Identify reads the
//    call's own `authorization` metadata, the connection's verified
//    certificate and, for the Unix socket, the peer's uid and gid that
//    UnixListener recorded for the connection at accept time (gRPC names
//    such a connection's peer "fd:N"; the socket's device and inode are
//    checked too, so a number reused by a later connection is not taken
//    for the earlier one).
//
// gpuexec.v1 handlers call Identify first; grpc.health.v1 and reflection
// answer anyone who reaches the port.
//
// Thread-safe. The directory is swapped whole on reload; each call uses
// the one it found.

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/auth_metadata_processor.h>

#include <array>
#include <atomic>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/core/tenant.h"
#include "server/tenants/tenants.h"

namespace gpuexec::rpc {

class Identity {
 public:
  // `client_certificates`: the TLS listener asks for client certificates
  // (mutual TLS), so a verified certificate can name a tenant.
  explicit Identity(bool client_certificates) : client_certificates_(client_certificates) {}

  // The tenants file in force; null: none (every caller is the default
  // tenant, or the tenant its client certificate names).
  void SetDirectory(std::shared_ptr<const tenants::Directory> directory);
  std::shared_ptr<const tenants::Directory> directory() const;

  // The caller of a gpuexec.v1 call, or UNAUTHENTICATED (counted, unless
  // `count_refusals` is false: the log's second look at a failed call).
  absl::StatusOr<core::Caller> Identify(const grpc::ServerContextBase& ctx,
                                        bool count_refusals = true);

  // The caller behind a Unix socket connection of the daemon's own (the
  // host memory socket), by its peer credentials alone.
  absl::StatusOr<core::Caller> IdentifyUnixPeer(const tenants::PeerCredentials& peer);

  // For the TLS listener's credentials.
  std::shared_ptr<grpc::AuthMetadataProcessor> MakeProcessor();

  // The peer of a Unix socket connection handed to gRPC as file `fd`.
  void SetUnixPeer(int fd, const tenants::PeerCredentials& peer);

  // Changes whenever the directory does: a stream that started under an
  // older one identifies its caller again.
  uint64_t generation() const { return generation_.load(std::memory_order_acquire); }

  // Refused authentications so far, by reason.
  uint64_t refused(tenants::Refusal reason) const {
    return refused_[static_cast<size_t>(reason)].load(std::memory_order_relaxed);
  }

 private:
  class Processor;

  absl::StatusOr<std::shared_ptr<const core::Tenant>> Resolve(
      const tenants::Credentials& credentials, bool count_refusals);
  void CountRefusal(tenants::Refusal reason);

  const bool client_certificates_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const tenants::Directory> directory_ ABSL_GUARDED_BY(mu_);
  struct UnixPeer {
    tenants::PeerCredentials credentials;
    uint64_t dev = 0;
    uint64_t ino = 0;
  };
  absl::flat_hash_map<int, UnixPeer> unix_peers_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> generation_{0};
  std::array<std::atomic<uint64_t>, std::size(tenants::kAllRefusals)> refused_{};
};

}  // namespace gpuexec::rpc

#endif  // GPUEXEC_SERVER_RPC_IDENTITY_H_
