#ifndef GPUEXEC_SERVER_RPC_HEALTH_H_
#define GPUEXEC_SERVER_RPC_HEALTH_H_

// The standard gRPC health service (grpc.health.v1.Health: Check and Watch),
// served on the daemon's completion queues beside gpuexec.v1. gRPC's own
// implementation is a callback service, and one callback service on a
// server puts a thread hand-off on every message of every call (see
// async_call.h).

#include <grpcpp/grpcpp.h>

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "server/rpc/async_call.h"

namespace gpuexec::rpc {

class HealthService {
 public:
  using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;

  grpc::Service* service() { return &async_; }
  // Watches open at once, in all and of one peer host (core::PeerHost: an
  // IP address; each Unix-socket connection is a peer of its own, and the
  // Unix socket bounds those); more are RESOURCE_EXHAUSTED. Each costs a
  // little memory until its client goes and a status change or shutdown
  // finds it gone. Set before Listen.
  void SetWatchLimits(int total, int per_peer) {
    max_watches_ = total;
    max_watches_per_peer_ = per_peer;
  }
  void Listen(grpc::ServerCompletionQueue* cq);

  // Sets the status of `name` ("" is the server as a whole) and tells its
  // watchers. After Shutdown, changes nothing.
  void SetServingStatus(const std::string& name, bool serving);
  // Every name NOT_SERVING, watchers told and their calls ended; call before
  // the server's Shutdown.
  void Shutdown();
  // Blocks until every call has ended (see GpuExecService::WaitForCalls).
  void WaitForCalls() { calls_.WaitForZero(); }

  class Check;
  class Watch;

 private:
  friend class Check;
  friend class Watch;
  // The status of `name`; SERVICE_UNKNOWN when it was never set.
  ServingStatus StatusLocked(const std::string& name) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int max_watches_ = 1024;
  int max_watches_per_peer_ = 16;

  grpc::health::v1::Health::AsyncService async_;
  CallCounter calls_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, ServingStatus> status_ ABSL_GUARDED_BY(mu_);
  std::vector<Watch*> watches_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> watches_per_peer_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace gpuexec::rpc

#endif  // GPUEXEC_SERVER_RPC_HEALTH_H_
