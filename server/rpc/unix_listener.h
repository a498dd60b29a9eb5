#ifndef GPUEXEC_SERVER_RPC_UNIX_LISTENER_H_
#define GPUEXEC_SERVER_RPC_UNIX_LISTENER_H_

// The daemon's Unix socket, accepted here rather than by gRPC so that each
// connection's peer credentials (SO_PEERCRED: uid, gid, pid) are read
// before gRPC serves it: each accepted connection is recorded with
// Identity::SetUnixPeer and handed to the server with
// grpc::AddInsecureChannelFromFd.
//
// The socket file is created with mode 0660 (and `group`, if given), bound
// under a temporary name and renamed into place, so it is never reachable
// with looser permissions. It is removed when the listener goes.
//
// One thread accepts; the destructor stops it and joins it.

#include <grpcpp/server.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "server/rpc/identity.h"

namespace gpuexec::rpc {

// Makes a listening Unix socket of `type` (SOCK_STREAM, SOCK_SEQPACKET)
// at `path` as described above: mode 0660 and `group`, never reachable
// with looser permissions; a socket left there before is replaced, any
// other file is not. Returns the descriptor (close-on-exec).
absl::StatusOr<int> BindUnixSocket(const std::string& path, const std::string& group, int type);

class UnixListener {
 public:
  // `server` must be started; it and `identity` outlive the listener.
  static absl::StatusOr<std::unique_ptr<UnixListener>> Start(const std::string& path,
                                                             const std::string& group,
                                                             grpc::Server* server,
                                                             Identity* identity);
  ~UnixListener();

  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

 private:
  UnixListener(std::string path, int fd, int wake_fd, grpc::Server* server, Identity* identity);
  void AcceptLoop();

  const std::string path_;
  const int fd_;
  const int wake_fd_;  // an eventfd: written to stop the loop
  grpc::Server* const server_;
  Identity* const identity_;
  std::thread thread_;
};

}  // namespace gpuexec::rpc

#endif  // GPUEXEC_SERVER_RPC_UNIX_LISTENER_H_
