#ifndef GPUEXEC_SERVER_CORE_ENGINE_TYPES_H_
#define GPUEXEC_SERVER_CORE_ENGINE_TYPES_H_

// The engine's values: its options, the bounds it holds calls to, and what
// its calls take and give back (engine.h). Apart from the Engine class so
// that a reader of either finds one thing in it.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/core/args.h"
#include "server/core/compute_shares.h"
#include "server/core/session.h"
#include "server/port/types.h"

namespace gpuexec::core {

template <typename T>
using Callback = std::function<void(absl::StatusOr<T>)>;
using Done = std::function<void(absl::Status)>;

// The smallest kernel time limit a session may ask for.
inline constexpr uint64_t kMinKernelTimeLimitMs = 100;

// The longest kernel name GetFunction takes (mangled C++ template names
// run to a few hundred bytes).
inline constexpr size_t kMaxKernelNameBytes = 4096;

// Read messages are chunk-sized and gRPC's message limit is 64 MiB.
inline constexpr uint32_t kMaxChunkBytes = 16u << 20;

struct EngineOptions {
  // What the devices are opened with, for the log.
  std::string driver_library = "libcuda.so.1";
  // A launch still running after this long is hung: its device is reset
  // (the port watches it). Sessions may ask for less.
  uint64_t kernel_time_limit_ms = 60'000;
  uint64_t default_lease_ms = 60'000;
  uint64_t max_lease_ms = 600'000;
  uint64_t default_session_memory_bytes = 0;  // 0: the per-session maximum
  uint64_t max_session_memory_bytes = 0;      // 0: the share below
  // With no per-session limit in bytes: this share of its device's memory
  // (0: none).
  double session_memory_share = 0.5;
  // Sessions one tenant may have open at once from one peer (PeerHost:
  // a Unix uid, loopback, an IPv4 host, an IPv6 /64) (0: no limit). Counted
  // per tenant and peer: one tenant behind a shared address (loopback, a
  // NAT) never refuses another's sessions.
  uint32_t max_sessions_per_peer = 256;
  // Sessions a named tenant whose entry sets no max_sessions may have open
  // at once; 0: a quarter of max_sessions (none when that is 0). The
  // implicit tenant (no tenants file) is bounded by max_sessions alone.
  uint32_t tenant_max_sessions = 0;
  // A tenant (without tenants: a peer host) whose kernels reset a device
  // strike_limit times within strike_window has its launches refused for
  // strike_cooldown (0: no limit).
  uint32_t strike_limit = 3;
  absl::Duration strike_window = absl::Minutes(10);
  absl::Duration strike_cooldown = absl::Minutes(10);
  uint64_t daemon_memory_bytes = 0;  // 0: no daemon-wide limit
  uint32_t chunk_bytes = 1 << 20;
  uint32_t staging_buffers = 8;
  uint64_t max_module_bytes = 512ull << 20;
  uint32_t max_sessions = 4096;  // 0: no limit
  // Bytes of module images the daemon keeps (0: no limit). Images no open
  // session holds are evicted, least recently used first, to make room.
  uint64_t module_store_bytes = 1ull << 30;
  // Image bytes received by uploads under way at once; one tenant (or, of
  // the implicit tenant, one peer host) may hold at most half. 0: no limit.
  uint64_t module_upload_budget_bytes = 1ull << 30;
  absl::Duration reaper_interval = absl::Milliseconds(200);
  // Who shares a device's address space: every session (kDevice: one
  // worker per device), or only a tenant's own (kTenant: each named tenant
  // gets a worker of its own on each device it uses, started with its first
  // session there; the implicit tenant keeps the device's shared one).
  // The compute shares in force (set at start and at each reload), for
  // the listing of devices; null: none.
  std::shared_ptr<const SharePlan> shares;
  enum class Isolation { kDevice, kTenant };
  Isolation isolation = Isolation::kDevice;
  // A tenant's worker with no session for this long is ended.
  absl::Duration worker_idle = absl::Minutes(5);
  // Tenant workers one device may have at once (0: no bound); past it a
  // new tenant's OpenSession there is RESOURCE_EXHAUSTED.
  uint32_t max_workers_per_device = 16;
  // The workers of each device are clients of one MPS server: their kernels
  // run side by side, and a fatal fault of one client reaches every client
  // of that GPU. A reset of one worker then opens a fault window of
  // mps_fault_window on its device: the device's other workers are checked
  // (those the fault reached restart too), and when it closes, the sessions
  // all its resets named are charged if they are of one tenant (or peer),
  // else none is.
  bool mps = false;
  absl::Duration mps_fault_window = absl::Seconds(2);
  // Host memory regions (RegisterRegion): off unless the daemon serves a
  // host memory socket. Page-locked bytes: of all sessions' regions (0: no
  // region fits), and of one session's (0: the daemon's limit); regions one
  // session may hold.
  bool host_memory = false;
  uint64_t daemon_pinned_bytes = 0;
  uint64_t max_session_pinned_bytes = 0;
  uint32_t max_regions_per_session = 64;
  // Handles one session may hold: buffers, modules, functions, regions and
  // graphs together (0: no bound).
  uint32_t max_handles_per_session = 65536;
  // Graphs (Engine::BeginGraph): per session, nodes per graph.
  uint32_t max_graphs_per_session = 64;
  uint32_t max_graph_nodes = 4096;
  // What one tenant's graphs and recordings (all its sessions') may keep in
  // the daemon; each session's own bound is kMaxSessionGraphBytes.
  uint64_t tenant_graph_bytes = 256ull << 20;
};

// A graph made by EndGraph.
struct GraphInfo {
  uint64_t handle = 0;
  uint32_t nodes = 0;
  uint64_t instantiate_ns = 0;
};

// New arguments for a graph's replay: argument `argument` of kernel node
// `node` (the nodes counted from 0 in the order recorded).
struct GraphPatch {
  uint32_t node = 0;
  uint32_t argument = 0;
  ArgValue value;
};

struct LaunchGraphSpec {
  std::string session;
  uint64_t graph = 0;
  std::vector<GraphPatch> patches;
  bool synchronize = false;
};

// Patches one replay may carry.
inline constexpr size_t kMaxGraphPatches = 1024;
// What the nodes one replay patches may keep together (each is copied and
// packed again whole): 1 MiB, enough for a patch on each of 1024 nodes of a
// few arguments, or on about 10 nodes of the largest parameter blocks.
inline constexpr uint64_t kMaxRepackedBytes = 1ull << 20;
// What one session's graphs and recording may keep in the daemon: each
// node's parameters and arguments (a node of 32 KiB of raw parameters is
// 64 KiB and more).
inline constexpr uint64_t kMaxSessionGraphBytes = 64ull << 20;

struct DeviceStatus {
  uint32_t index = 0;
  std::string name;
  uint32_t cc_major = 0;
  uint32_t cc_minor = 0;
  uint64_t memory_total = 0;
  uint64_t memory_free = 0;
  bool healthy = false;
  uint32_t multiprocessors = 0;
  // While compute shares are in force on the device: the SMs the caller's
  // tenant may use there, and whether they are a part of its own (else
  // the rest, with the tenants without one). 0: no shares there.
  uint32_t share_sms = 0;
  bool share_own = false;
  uint32_t modules_loaded = 0;
  uint64_t module_loads_total = 0;
  uint32_t sessions = 0;
  // Restarts of the device's worker, the current epoch (1 + restarts), and
  // the last restart: when and why (empty if none).
  uint64_t resets = 0;
  uint64_t epoch = 0;
  std::string last_reset;
  // While the worker does not answer: since when (memory_free is then its
  // last figure).
  std::optional<absl::Time> not_answering_since;
  // Request bytes the device's worker has not taken yet (see
  // EngineOptions::worker_queue_bytes).
  uint64_t worker_unsent_bytes = 0;
  // Requests the device's workers (the shared one and the tenants') have
  // not answered yet.
  uint32_t pending_requests = 0;
  // Worker processes serving the device: its shared one, and one per
  // tenant that has sessions there (or had, within the idle time).
  uint32_t workers = 1;
  // Whether the caller's tenant has a worker of its own there; the resets
  // and the last reset above are then that worker's.
  bool own_worker = false;
};

// A snapshot for metrics: what the engine holds and has done.
struct EngineStats {
  struct PerDevice {
    uint32_t buffers = 0;
    uint64_t memory_held = 0;  // bytes of the sessions' buffers
    uint64_t launches = 0;
    uint64_t bytes_written = 0;
    uint64_t bytes_read = 0;
    uint64_t resets = 0;
    bool healthy = false;
    uint32_t workers = 1;  // its shared worker and its tenants' own
  };
  std::vector<PerDevice> devices;
  struct PerTenant {
    std::string name;
    uint32_t sessions = 0;
    uint32_t sessions_untimed = 0;  // of them, asked for no GPU time
    uint64_t memory_held = 0;
    uint64_t module_bytes = 0;
    uint64_t sessions_opened = 0;
    uint64_t launches = 0;
    uint64_t bytes_written = 0;
    uint64_t bytes_read = 0;
    uint64_t gpu_ns = 0;
    uint32_t workers = 0;  // of its own, on all devices
  };
  // Every tenant that has opened a session since the daemon started.
  std::vector<PerTenant> tenants;
  uint32_t sessions_open = 0;
  uint64_t sessions_opened = 0;
  // Sessions ended by their client, by a lapsed lease, by shutdown.
  uint64_t sessions_closed = 0;
  uint64_t sessions_expired = 0;
  uint64_t strikes = 0;          // resets charged to a tenant or peer
  uint64_t strike_refusals = 0;  // launches refused for it
  // Session open and close lines not written, past their tenant's (or
  // peer's) budget.
  uint64_t session_lines_left_out = 0;
  uint32_t modules_stored = 0;
  uint64_t module_store_bytes = 0;
  uint64_t module_uploads = 0;  // images whose bytes came over the wire
  uint64_t module_upload_bytes = 0;
  uint64_t module_upload_bytes_in_flight = 0;  // held by uploads under way
  uint64_t pinned_bytes = 0;                   // of host memory regions
};

// What OpenSession asks for; 0 takes the daemon's (or the tenant's) value.
struct SessionAsk {
  std::optional<uint32_t> device;  // unset: the least loaded usable one
  uint64_t lease_ms = 0;
  uint64_t memory_limit = 0;
  // 0 or more than the daemon's (or the tenant's) limit takes that limit.
  uint64_t kernel_time_limit_ms = 0;
  // No GPU time: the session's work is queued without timing events, its
  // Synchronize reports 0, and the tenant is charged the host's view of its
  // busy time (port::StreamOwner::untimed).
  bool untimed = false;
};

struct SessionInfo {
  std::string token;
  uint32_t device = 0;
  uint64_t lease_ms = 0;
  uint64_t memory_limit = 0;
  // Set when the asked memory limit was lowered: by how much and by what.
  std::string memory_capped;
  uint64_t kernel_time_limit_ms = 0;
  bool untimed = false;
};

struct BufferInfo {
  uint64_t handle = 0;
  uint64_t size = 0;
};

struct RegionInfo {
  uint64_t handle = 0;
  uint64_t bytes = 0;
};

// A copy between a host memory region and a buffer of one session.
struct RegionCopySpec {
  uint64_t region = 0;
  uint64_t region_offset = 0;
  uint64_t buffer = 0;
  uint64_t buffer_offset = 0;
  uint64_t size = 0;
  bool to_buffer = true;  // region -> buffer; false: buffer -> region
};

enum class ModuleKind { kUnspecified, kCubin, kPtx, kFatbin };

struct ModuleResult {
  uint64_t handle = 0;
  std::string sha256;
  bool uploaded = false;
  // The kernel names its bytes define (ListKernels), at most
  // kMaxListedKernels of them; empty when they cannot be read (a compressed
  // fatbin).
  std::vector<std::string> kernels;
};

// Kernel names a LoadModule response lists at most.
inline constexpr size_t kMaxListedKernels = 4096;

struct FunctionResult {
  uint64_t handle = 0;
  port::KernelInfo kernel;
};

}  // namespace gpuexec::core

#endif  // GPUEXEC_SERVER_CORE_ENGINE_TYPES_H_
