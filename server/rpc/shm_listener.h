#ifndef GPUEXEC_SERVER_RPC_SHM_LISTENER_H_
#define GPUEXEC_SERVER_RPC_SHM_LISTENER_H_

// The daemon's host memory socket (gpuexecd --shm_socket): a SOCK_SEQPACKET
// Unix socket beside the gRPC ones whose only job is to take a same-host
// client's memfd for one of its sessions and answer with a region handle
// (gRPC cannot carry descriptors). The protocol is in the public proto
// ("Host memory regions"): each message one serialized
// RegisterRegionRequest with exactly one descriptor, each answer one
// RegisterRegionResponse. The peer is identified by its credentials
// (SO_PEERCRED) as on the daemon's Unix socket, and the session must be
// that caller's tenant's; the engine checks the descriptor and the limits.
//
// The socket file is made as the daemon's Unix socket is (mode 0660,
// `group`). One thread accepts; each connection is served by a thread of
// its own, at most kMaxConnections at once (more are closed at once), and
// one that sends nothing for kIdleTimeout is closed. The destructor stops
// them all and removes the socket file.

#include <sys/socket.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/core/engine.h"
#include "server/rpc/command_ring_server.h"
#include "server/rpc/identity.h"

namespace gpuexec::rpc {

class ShmListener {
 public:
  static constexpr int kMaxConnections = 32;
  // Of those, from one uid (so that one local user cannot hold them all).
  static constexpr int kMaxConnectionsPerUid = 8;
  static constexpr absl::Duration kIdleTimeout = absl::Seconds(10);
  // How long a registration may take (mapping and page-locking a large
  // region takes tens of milliseconds per GiB).
  static constexpr absl::Duration kRegisterTimeout = absl::Seconds(60);

  // `engine`, `identity` and `rings` outlive the listener; `rings` (may be
  // null: none served) takes the registrations of command rings.
  static absl::StatusOr<std::unique_ptr<ShmListener>> Start(const std::string& path,
                                                            const std::string& group,
                                                            core::Engine* engine,
                                                            Identity* identity,
                                                            CommandRingServer* rings = nullptr);
  ~ShmListener();

  ShmListener(const ShmListener&) = delete;
  ShmListener& operator=(const ShmListener&) = delete;

 private:
  ShmListener(std::string path, int fd, int wake_fd, core::Engine* engine, Identity* identity,
              CommandRingServer* rings);
  void AcceptLoop();
  void Serve(int conn, ucred peer);

  const std::string path_;
  const int fd_;
  const int wake_fd_;  // an eventfd: written to stop the loop
  core::Engine* const engine_;
  Identity* const identity_;
  CommandRingServer* const rings_;
  std::thread thread_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Connections being served (their sockets are shut down to stop them).
  std::vector<int> conns_ ABSL_GUARDED_BY(mu_);
  int serving_ ABSL_GUARDED_BY(mu_) = 0;  // threads serving a connection
  absl::flat_hash_map<uid_t, int> serving_uid_ ABSL_GUARDED_BY(mu_);  // of them, by peer uid
  // Those threads (the accept thread's, then the destructor's); each sets
  // `done` last, and is joined by the accept thread's next round.
  struct ConnThread {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<ConnThread> threads_;
};

}  // namespace gpuexec::rpc

#endif  // GPUEXEC_SERVER_RPC_SHM_LISTENER_H_
