#ifndef GPUEXEC_SERVER_RPC_COMMAND_RING_SERVER_H_
#define GPUEXEC_SERVER_RPC_COMMAND_RING_SERVER_H_

// The command rings the daemon serves on its host memory socket
// (gpuexecd --shm_socket, unless --command_rings=false;
// docs/command-ring-plan.md): what a registration is
// checked against, each ring's runner (core::CommandRingRunner, a thread
// of its own), and the ends of a ring:
// - its lifeline (the socket it was registered on) hangs up: one thread
//   watches every lifeline in an epoll set; the ring stops, and with
//   close_session_on_hangup the session is closed too;
// - its session closes (client, lease, fault, reload, shutdown): told by
//   Engine::WatchClose, the ring is closed with the reason;
// - the ring breaks its framing: the runner closes it itself;
// - the daemon stops: the destructor closes every ring.
// A ring that ended is reaped by the watch thread (its runner joined, its
// lifeline closed); its mapping goes with the last command it started, and
// only then does it stop counting against the limits.
//
// Limits, each refusal naming it: one ring per session, a tenant's
// max_command_rings from all its peers where the tenants file sets one,
// else kMaxRingsPerPeer per tenant and peer (a local user, without a
// tenants file), `max_rings` in all; a tenant whose entry does not allow
// host_memory has none.
// The rings' threads share `ring_threads` run slots (core::RunSlots): the
// cores they take between them, however many rings post.

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gpuexec/v1/gpuexec.pb.h"
#include "server/core/command_ring_runner.h"
#include "server/core/engine.h"
#include "server/core/run_slots.h"
#include "server/rpc/call_budget.h"

namespace gpuexec::rpc {

class CommandRingServer {
 public:
  static constexpr int kMaxRingsPerPeer = 16;
  // How long a ring that ended waits for its started commands' answers
  // before its header says closed without them.
  static constexpr absl::Duration kEndGrace = absl::Seconds(5);
  struct Options {
    int max_rings = 256;
    uint64_t max_in_flight = 1024;  // per ring
    absl::Duration spin = absl::ZeroDuration();
    int ring_threads = 1;  // run slots: cores the rings' threads share
    // Each ring is admitted as a command stream of its session (counted
    // against --max_streams_per_session) and takes its part of its
    // tenant's commands in flight; none: rings are counted here only.
    CallBudget* budget = nullptr;
  };

  // `engine` outlives the server.
  static absl::StatusOr<std::unique_ptr<CommandRingServer>> Start(core::Engine* engine,
                                                                  Options options);
  ~CommandRingServer();
  CommandRingServer(const CommandRingServer&) = delete;
  CommandRingServer& operator=(const CommandRingServer&) = delete;

  // Serves `memfd` (of `bytes`, checked as a region's descriptor is) as the
  // command ring `request` describes, for `caller`'s `session`. On success
  // it sends `answer` on `conn` first, then owns `conn` (the lifeline); on
  // a refusal it sends nothing (the caller answers with the status) and
  // leaves `conn` to the caller. `memfd` stays the caller's either way (the
  // mapping outlives it).
  absl::Status Adopt(
      const core::Caller& caller, const std::string& session, int conn, int memfd, uint64_t bytes,
      const v1::CommandRingRequest& request,
      const std::function<void(int conn, const v1::RegisterRegionResponse&)>& answer);

  // After the tenants file was reloaded: each ring's commands run as its
  // tenant as `find` now has it (by name); a ring whose tenant is gone, or
  // may no longer register host memory, is ended saying so.
  void Reidentify(
      const std::function<std::shared_ptr<const core::Tenant>(const std::string&)>& find);

  // Rings being served (not yet reaped).
  size_t rings() const;
  int ring_threads() const { return slots_.slots(); }

 private:
  struct Ring;
  struct Ledger;
  CommandRingServer(core::Engine* engine, Options options, int epoll_fd, int wake_fd);
  // Calls End through the ledger, which knows whether this server lives.
  static void EndVia(const std::shared_ptr<Ledger>& ledger, uint64_t id, const absl::Status& why,
                     bool hung_up);
  void WatchLoop();
  // Stops ring `id` with `reason` and has the watch thread reap it;
  // `hung_up`: its lifeline did (its header says closed at once, and its
  // session is closed where the registration asked for that).
  void End(uint64_t id, const absl::Status& reason, bool hung_up);
  // Closes and forgets the rings that ended and whose header says closed
  // (`all`: every ring that ended, at shutdown); a ring that ended more
  // than kEndGrace ago has its header closed first. Returns whether an
  // ended ring is left waiting for its commands.
  bool Reap(bool all = false);

  core::Engine* const engine_;
  const Options options_;
  // Every runner's; runners are joined before the server goes.
  core::RunSlots slots_;
  const int epoll_fd_;
  const int wake_fd_;  // an eventfd: reap, or stop
  std::thread thread_;
  // Shared with every ring's release hook and close watch, which may run
  // after this server has gone.
  const std::shared_ptr<Ledger> ledger_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Ring>> rings_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpuexec::rpc

#endif  // GPUEXEC_SERVER_RPC_COMMAND_RING_SERVER_H_
