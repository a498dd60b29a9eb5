#ifndef GPUEXEC_SERVER_RPC_OBSERVABILITY_H_
#define GPUEXEC_SERVER_RPC_OBSERVABILITY_H_

// What the daemon tells its operators: RPC counts and latencies (a gRPC
// server interceptor, so that handlers stay thin), one log line per failed
// call, and the engine's and devices' figures read at scrape time.

#include <grpcpp/support/server_interceptor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/core/engine.h"
#include "server/metrics/metrics.h"
#include "server/rpc/identity.h"

namespace gpuexec::rpc {

// Counts every call by service, method and type, and on completion by
// status code, with its latency; logs calls that fail. `registry` must
// outlive the server the factory is installed in.
// `identity` names the tenant of a failed call in its log line.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeRpcObserver(
    metrics::Registry* registry, Identity* identity);

// One log line for a failed call or command: "Launch from ipv4:... failed:
// INVALID_ARGUMENT: ...", at info level when the caller caused it (bad
// arguments, unknown handles, limits), else at warning. At most 20 lines a
// second (200 at once): the rest are counted (FailureLinesLeftOut) and the
// next line logged says how many it follows.
void LogFailure(absl::string_view method, absl::string_view peer, const absl::Status& status);
uint64_t FailureLinesLeftOut();

// The failed commands of one command stream (an Execute call, a command
// ring), through LogFailure: a run of failures alike (the same command,
// code and message, as the queued launches of a session its client closed)
// is its first line, then one line saying how many more there were, when
// a different failure comes or the stream ends. A client failing commands
// by the thousand spends the daemon's shared lines once, not every other
// tenant's share of them. Thread-safe.
class CommandFailureLog {
 public:
  explicit CommandFailureLog(std::string peer) : peer_(std::move(peer)) {}
  ~CommandFailureLog();
  CommandFailureLog(const CommandFailureLog&) = delete;
  CommandFailureLog& operator=(const CommandFailureLog&) = delete;

  void Failed(absl::string_view op, const absl::Status& status);

 private:
  void FlushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string peer_;
  absl::Mutex mu_;
  std::string op_ ABSL_GUARDED_BY(mu_);
  absl::Status last_ ABSL_GUARDED_BY(mu_);
  uint64_t alike_ ABSL_GUARDED_BY(mu_) = 0;  // since the line of last_
};

// Adds the engine's gauges and counters (sessions, buffers, modules,
// per-device memory, launches, bytes) to `registry`. `engine` must outlive
// the registry's scrapes.
// With each tenant's figures and the refused authentications (`identity`).
void AddEngineCollector(metrics::Registry* registry, core::Engine* engine, Identity* identity);

}  // namespace gpuexec::rpc

#endif  // GPUEXEC_SERVER_RPC_OBSERVABILITY_H_
