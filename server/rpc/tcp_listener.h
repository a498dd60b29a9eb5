#ifndef GPUEXEC_SERVER_RPC_TCP_LISTENER_H_
#define GPUEXEC_SERVER_RPC_TCP_LISTENER_H_

// The daemon's TCP port, accepted here rather than by gRPC: gRPC 1.51
// (Debian 12's) bounds no TCP connections, and a peer with no credentials
// could hold every descriptor of the process with idle connections, after
// which no tenant's worker could start. Each connection accepted here is
// handed to gRPC through an external connection acceptor
// (grpc::ServerBuilder::experimental().AddExternalConnectionAcceptor,
// FROM_FD), which serves it with the port's credentials, TLS included, as
// if gRPC had accepted it.
//
// Connections are bounded as on the Unix socket (unix_listener.h): at most
// Limits::max_connections open at once and max_per_peer from one source
// (an IPv4 address, or an IPv6 /64: an IPv6 host has a /64 to choose
// from); a connection past either, or one accepted into the last
// kDescriptorReserve descriptors of the process (kept for its workers), is
// closed at once, with a warning at most once a minute. gRPC does not say
// when it closes a connection: each accept counts the ones still open by
// their descriptor's device and inode.
//
// One thread accepts; the destructor stops it and joins it.

#include <grpcpp/server_builder.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace gpuexec::rpc {

struct TcpLimits {
  uint32_t max_connections = 8192;  // 0: no bound
  uint32_t max_per_peer = 1024;     // 0: no bound
};

class TcpListener {
 public:
  // Binds and listens on `address` (HOST:PORT, [IPV6]:PORT; a name binds
  // each of its addresses; port 0 picks one), before the server is built.
  static absl::StatusOr<std::unique_ptr<TcpListener>> Bind(const std::string& address);
  ~TcpListener();
  TcpListener(const TcpListener&) = delete;
  TcpListener& operator=(const TcpListener&) = delete;

  int port() const { return port_; }
  // Starts accepting, each connection handed to `acceptor`, whose server
  // must have started.
  void Start(std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor,
             const TcpLimits& limits);

 private:
  struct Open {
    int fd;
    uint64_t dev, ino;
    std::string peer;
  };
  // What a warning is about: each kind is logged at most once a minute,
  // so that one cannot hide another.
  enum class Warned { kAccept, kReserve, kTotal, kPeer, kCount };
  TcpListener(std::string address, std::vector<int> fds, int wake_fd, int port);
  void AcceptLoop();
  // Why a new connection from `peer` is refused (and which kind of
  // refusal), empty if it is not. Forgets the connections gRPC has closed
  // since.
  std::string Refusal(int conn, const std::string& peer, Warned* reason);
  bool WarnNow(Warned reason);

  const std::string address_;
  const std::vector<int> fds_;
  const int wake_fd_;  // an eventfd: written to stop the loop
  const int port_;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor_;
  TcpLimits limits_;
  std::vector<Open> open_;  // the accept thread's only
  int64_t last_warning_s_[static_cast<int>(Warned::kCount)] = {};
  std::thread thread_;
};

}  // namespace gpuexec::rpc

#endif  // GPUEXEC_SERVER_RPC_TCP_LISTENER_H_
