#ifndef GPUEXEC_SERVER_CORE_SESSION_H_
#define GPUEXEC_SERVER_CORE_SESSION_H_

// A session and the handle tables it owns. Everything a client creates lives
// in exactly one session; handles are random 64-bit ids drawn per session,
// so a handle of another session is simply not found.
//
// Locking: `mu` guards the tables and `closed`. Operations that enqueue
// device work on the session's stream hold `mu` across the check and the
// post, so that device work is ordered before the frees that closing the
// session enqueues.

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/core/args.h"
#include "server/core/tenant.h"
#include "server/port/device_port.h"
#include "server/port/staging.h"
#include "server/port/types.h"

namespace gpuexec::core {

// Running totals of traffic (on one device, or of one tenant).
struct TrafficCounters {
  std::atomic<uint64_t> launches{0};
  std::atomic<uint64_t> bytes_written{0};  // host to device, by Write
  std::atomic<uint64_t> bytes_read{0};     // device to host, by Read
  std::atomic<uint64_t> gpu_ns{0};         // reported by Synchronize
};

// What all sessions of one tenant hold and have done. Made by the engine
// the first time the tenant opens a session and kept for the daemon's life
// (its totals are metrics); shared by the tenant's sessions.
struct TenantUsage {
  explicit TenantUsage(std::string n) : name(std::move(n)) {}
  const std::string name;
  std::atomic<uint32_t> sessions{0};     // changed under the engine's sessions lock
  std::atomic<uint64_t> memory{0};       // device bytes of its sessions' buffers
  std::atomic<uint64_t> pinned{0};       // host bytes of its sessions' regions
  std::atomic<uint64_t> graph_bytes{0};  // what its sessions' graphs keep in the daemon
  std::atomic<uint64_t> sessions_opened{0};
  TrafficCounters traffic;

  // Distinct module images its sessions hold: bytes and how many sessions
  // hold each.
  absl::Mutex mu;
  absl::flat_hash_map<std::string, std::pair<uint64_t, uint32_t>> modules ABSL_GUARDED_BY(mu);
  uint64_t module_bytes ABSL_GUARDED_BY(mu) = 0;
};

// What an allocation is counted as against the memory limits: its size
// rounded up to this. The device's pool hands out no less, and without it a
// tenant under a 1 MiB limit held 245,760 one-byte buffers.
inline constexpr uint64_t kAllocationGranularity = 512;
inline uint64_t ChargedBytes(uint64_t size) {
  return (size + kAllocationGranularity - 1) / kAllocationGranularity * kAllocationGranularity;
}

struct BufferEntry {
  uint64_t handle = 0;
  port::DevicePtr ptr = 0;
  uint64_t size = 0;
  // What the buffer counts for against the memory limits.
  uint64_t charged() const { return ChargedBytes(size); }
  // The device epoch the memory belongs to; once the device was reset the
  // buffer is lost: its handle stays, to say so, until freed.
  uint64_t epoch = 0;
  bool lost = false;
  // Streams in progress (Write, Read) that use the buffer; it cannot be
  // freed while they run.
  int streams_in_use = 0;
};

// A host memory region: a client's memfd that the session's device
// process maps and page-locks (see Engine::RegisterRegion).
struct RegionEntry {
  uint64_t handle = 0;
  // The id the device knows it by (unique in the daemon; the handle is the
  // client's and unique in the session only).
  port::RegionId id = 0;
  uint64_t bytes = 0;
  // The device epoch it was mapped in; it goes with a reset, as buffers do.
  uint64_t epoch = 0;
  bool lost = false;
};

struct FunctionEntry {
  uint64_t handle = 0;
  std::string module_sha256;
  std::string name;
  // The name as messages show it (escaped, bounded), for PackArgs.
  std::string quoted_name;
  port::KernelInfo kernel;
  // Made once, not at every launch: "kernel 'NAME'" for messages, and what
  // the device names a launch of it ("... of session S on device N").
  std::string label;
  std::string launch_what;
};

// A kernel node of a graph: what a patch of its arguments is checked and
// packed against (the arguments as last given: a patch lasts).
struct GraphKernel {
  LaunchSpec spec;
  uint64_t bytes = 0;  // what the node keeps here (Engine::RecordLaunchLocked)
};

// A graph of the session: its recorded launches, memsets and copies, built
// and instantiated on the device (Engine::EndGraph).
struct GraphEntry {
  uint64_t handle = 0;
  port::GraphId id = 0;  // the device's, unique among its live graphs
  uint64_t epoch = 0;    // it goes with a reset, as buffers do
  uint32_t nodes = 0;
  // By node index; none for a memset or copy node.
  std::vector<std::optional<GraphKernel>> kernels;
  // The buffers its nodes use: none can be freed while it lives.
  absl::flat_hash_set<uint64_t> buffers;
  uint64_t bytes = 0;  // counted in Session::graph_bytes
};

// What a session records between BeginGraph and EndGraph: each command
// checked as when it runs, kept instead of run.
struct Recording {
  std::vector<port::GraphNodeOp> nodes;
  std::vector<std::optional<GraphKernel>> kernels;
  absl::flat_hash_set<uint64_t> buffers;
  uint64_t epoch = 0;  // of the buffers recorded (0: none yet)
  // The first command refused while recording: the graph would lack it, so
  // EndGraph makes none and says why.
  absl::Status refused;
  uint64_t bytes = 0;  // counted in Session::graph_bytes
};

// The staging buffers all of one session's transfers (Writes and Reads)
// hold together: at most a quarter of the device's (2 at least), so that a
// session's copies parked behind its own long kernel never hold every
// buffer of the device. A transfer past the share waits for the session's
// own next release.
//
// On a worker several tenants share (the implicit tenant's, or every
// session's under --isolation=device), a session's share also joins its
// tenant's (of the implicit tenant: its peer host's; TenantStaging): all the
// tenant's sessions there together hold at most half of the buffers (2 at
// least), so that one tenant opening more sessions cannot pin every buffer
// behind its kernels (issue 35, N13: 4 sessions pinned all 8).
class StagingShare {
 public:
  // `fraction`: the part of the pool's buffers this share may hold (at
  // least 2).
  explicit StagingShare(double fraction = 0.25) : fraction_(fraction) {}
  void Acquire(port::StagingPool& pool, port::StagingPool::Waiter waiter);
  void Release(port::StagingPool& pool, port::StagingSlot slot);
  // From now on, buffers this share takes are also taken from `parent`'s
  // (the tenant's); once only, before the first Acquire.
  void Join(std::shared_ptr<StagingShare> parent);
  bool joined() const;
  // Buffers held or being acquired now (tests).
  int held() const;

 private:
  const double fraction_;
  mutable absl::Mutex mu_;
  int held_ ABSL_GUARDED_BY(mu_) = 0;  // buffers held, or being acquired
  std::deque<port::StagingPool::Waiter> waiting_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<StagingShare> parent_ ABSL_GUARDED_BY(mu_);
};

// The share of the staging buffers of `pool` that tenant (or peer) `key`
// holds, made at its first use and kept while a session holds it.
std::shared_ptr<StagingShare> TenantStaging(const port::StagingPool* pool, const std::string& key);

class Session {
 public:
  // `port`: what serves the session on `device` (the device's shared
  // worker, or its tenant's own); held for the session's life.
  Session(std::string token, std::shared_ptr<TenantUsage> tenant, int device,
          std::shared_ptr<port::DevicePort> port, port::StreamId stream, uint64_t lease_ms,
          uint64_t memory_limit);

  const std::string& token() const { return token_; }
  // The tenant that opened it: the only one that can name it.
  const std::string& tenant() const { return tenant_->name; }
  // The host it was opened from (PeerHost of the opener's address).
  std::string peer_host;
  // When the memory limit the client asked for was lowered: "8 GiB (...)
  // asked, capped to 4 GiB (...) by --session_memory_share=0.5". Empty
  // otherwise. Set before the session is shared.
  std::string memory_capped;
  // Asked for no GPU time (SessionAsk::untimed): what its synchronizes
  // report is charged to the tenant and answered as 0. Set before the
  // session is shared.
  bool untimed = false;
  // Whom a reset its kernel causes is charged to: "tenant 'NAME'", or
  // without tenants, "peer HOST".
  std::string strike_key;
  // Staging buffers held by its transfers (see StagingShare).
  StagingShare staging;
  TenantUsage& usage() const { return *tenant_; }
  // "session 3f2a91c0" (the token's first 8 characters) for messages.
  const std::string& name() const { return name_; }
  int device() const { return device_; }
  port::DevicePort* port() const { return port_.get(); }
  port::StreamId stream() const { return stream_; }
  uint64_t lease_ms() const { return lease_ms_; }
  uint64_t memory_limit() const { return memory_limit_; }

  absl::Mutex mu;
  bool closed ABSL_GUARDED_BY(mu) = false;
  absl::Time deadline ABSL_GUARDED_BY(mu);
  uint64_t memory_used ABSL_GUARDED_BY(mu) = 0;
  absl::flat_hash_map<uint64_t, BufferEntry> buffers ABSL_GUARDED_BY(mu);
  // Host memory regions, and the page-locked bytes of the live ones;
  // `regions_pending` counts registrations under way (their bytes are in
  // pinned_used already).
  absl::flat_hash_map<uint64_t, RegionEntry> regions ABSL_GUARDED_BY(mu);
  uint64_t pinned_used ABSL_GUARDED_BY(mu) = 0;
  uint32_t regions_pending ABSL_GUARDED_BY(mu) = 0;
  // Module handles hold their image, so they stay valid whatever happens
  // to the daemon's store.
  absl::flat_hash_map<uint64_t, std::shared_ptr<const port::ModuleImage>> modules
      ABSL_GUARDED_BY(mu);
  // Synchronize calls waiting: the lease does not lapse under them.
  int waiting ABSL_GUARDED_BY(mu) = 0;
  // Told once, with the reason in words, when the session closes
  // (Engine::WatchClose): a command ring serving it, for one.
  absl::flat_hash_map<uint64_t, std::function<void(const std::string&)>> close_watches
      ABSL_GUARDED_BY(mu);
  uint64_t next_close_watch ABSL_GUARDED_BY(mu) = 0;
  // The device epoch of the oldest work queued since the last Synchronize
  // (0: none): a Synchronize after a reset says that work was lost.
  uint64_t work_epoch ABSL_GUARDED_BY(mu) = 0;
  absl::flat_hash_map<uint64_t, FunctionEntry> functions ABSL_GUARDED_BY(mu);
  // Graphs, and the one being recorded (Engine::BeginGraph).
  absl::flat_hash_map<uint64_t, GraphEntry> graphs ABSL_GUARDED_BY(mu);
  std::optional<Recording> recording ABSL_GUARDED_BY(mu);
  // Graphs EndGraph is building, and how many of them use each buffer: they
  // count against the graph limit, and their buffers cannot be freed.
  uint32_t graphs_pending ABSL_GUARDED_BY(mu) = 0;
  absl::flat_hash_map<uint64_t, uint32_t> pending_graph_buffers ABSL_GUARDED_BY(mu);
  // Bytes the session's graphs and recording keep in the daemon (their
  // nodes' parameters and arguments), bounded by kMaxSessionGraphBytes.
  uint64_t graph_bytes ABSL_GUARDED_BY(mu) = 0;
  // Changes graph_bytes and its tenant's count together.
  void ChargeGraphBytes(uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    graph_bytes += bytes;
    usage().graph_bytes.fetch_add(bytes);
  }
  void ReleaseGraphBytes(uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    graph_bytes -= bytes;
    usage().graph_bytes.fetch_sub(bytes);
  }
  // FAILED_PRECONDITION naming `call` while the session records a graph.
  absl::Status NotRecording(absl::string_view call) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // `st`, remembered as the recording's first refusal where the session
  // records a graph and `st` is one.
  absl::Status Refuse(absl::Status st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Allocations under way: each will be a handle.
  uint32_t handles_pending ABSL_GUARDED_BY(mu) = 0;
  // Handles the session holds (buffers, modules, functions, regions, graphs) and
  // will hold once the allocations under way are done: what
  // EngineOptions::max_handles_per_session bounds.
  size_t handles() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return buffers.size() + modules.size() + functions.size() + regions.size() + graphs.size() +
           handles_pending;
  }
  // RESOURCE_EXHAUSTED naming `what` (a buffer, a function) when the
  // session holds `limit` handles already (0: no bound).
  absl::Status CheckHandles(uint32_t limit, absl::string_view what) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // A fresh nonzero handle not used in this session.
  uint64_t NewHandle() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Touch() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // NOT_FOUND for calls that reach the session after it closed.
  absl::Status ClosedError() const;

  // "buffer 0x1f.. of session 3f2a91c0 (1048576 bytes on device 0)".
  std::string Describe(const BufferEntry& b) const;
  // "region 0x1f.. of session 3f2a91c0 (1048576 bytes)".
  std::string Describe(const RegionEntry& r) const;

 private:
  const std::string token_;
  const std::shared_ptr<TenantUsage> tenant_;
  const std::string name_;
  const int device_;
  const std::shared_ptr<port::DevicePort> port_;
  const port::StreamId stream_;
  const uint64_t lease_ms_;
  const uint64_t memory_limit_;
  absl::BitGen bitgen_ ABSL_GUARDED_BY(mu);
};

// A buffer's use by a Write or Read in progress: Free refuses the buffer
// until Release() (called at most once in effect; the destructor calls it).
// Construct with the session's mu held.
class BufferUse {
 public:
  BufferUse(Session* session, BufferEntry* buffer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(session->mu)
      : session_(session), handle_(buffer->handle) {
    ++buffer->streams_in_use;
  }
  ~BufferUse() { Release(); }
  BufferUse(const BufferUse&) = delete;
  BufferUse& operator=(const BufferUse&) = delete;
  // Call without the session's mu held.
  void Release();

 private:
  Session* session_;  // outlived: its owner holds the session
  const uint64_t handle_;
  std::atomic<bool> released_{false};
};

// 128 random bits as 32 hex characters, from getrandom(2).
std::string NewSessionToken();
std::string HandleName(uint64_t handle);  // "0x1f2e..."

}  // namespace gpuexec::core

#endif  // GPUEXEC_SERVER_CORE_SESSION_H_
