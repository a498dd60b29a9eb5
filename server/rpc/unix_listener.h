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
// Connections are bounded: at most Limits::max_connections open at once,
// max_per_uid of one peer uid; a connection past either, or one accepted
// into the last kDescriptorReserve descriptors of the process (kept for
// worker restarts), is closed at once, with a warning at most once a
// minute. gRPC owns a connection once handed over and does not say when it
// closes it: each accept counts the connections still open by their
// descriptor's device and inode (a number reused by a later socket is not
// taken for the earlier one).
//
// One thread accepts; the destructor stops it and joins it.

#include <grpcpp/server.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "server/rpc/identity.h"

namespace gpuexec::rpc {

// Makes a listening Unix socket of `type` (SOCK_STREAM, SOCK_SEQPACKET)
// at `path` as described above: mode 0660 and `group`, never reachable
// with looser permissions; a socket left there before is replaced, any
// other file is not. Returns the descriptor (close-on-exec).
absl::StatusOr<int> BindUnixSocket(const std::string& path, const std::string& group, int type);

// Connections the Unix socket holds at once (see the top of this file).
struct UnixLimits {
  uint32_t max_connections = 1024;  // 0: no bound
  uint32_t max_per_uid = 256;       // 0: no bound
};

class UnixListener {
 public:
  using Limits = UnixLimits;
  // `server` must be started; it and `identity` outlive the listener.
  static absl::StatusOr<std::unique_ptr<UnixListener>> Start(const std::string& path,
                                                             const std::string& group,
                                                             grpc::Server* server,
                                                             Identity* identity,
                                                             const Limits& limits = Limits());
  ~UnixListener();

  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

 private:
  // A connection handed to gRPC, as accepted.
  struct Open {
    int fd;
    uint64_t dev, ino;
    uid_t uid;
  };
  UnixListener(std::string path, int fd, int wake_fd, grpc::Server* server, Identity* identity,
               const Limits& limits);
  void AcceptLoop();
  // Why `uid`'s new connection is refused; empty if it is not. Forgets
  // the connections gRPC has closed since.
  std::string Refusal(int conn, uid_t uid);

  const std::string path_;
  const int fd_;
  const int wake_fd_;  // an eventfd: written to stop the loop
  grpc::Server* const server_;
  Identity* const identity_;
  const Limits limits_;
  std::vector<Open> open_;  // the accepting thread's own
  int64_t last_warning_s_ = 0;
  std::thread thread_;
};

}  // namespace gpuexec::rpc

#endif  // GPUEXEC_SERVER_RPC_UNIX_LISTENER_H_
