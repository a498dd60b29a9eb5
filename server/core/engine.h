#ifndef GPUEXEC_SERVER_CORE_ENGINE_H_
#define GPUEXEC_SERVER_CORE_ENGINE_H_

// The daemon's core, free of gRPC: devices, sessions and their handle
// tables, leases, memory limits, the module store, argument checking and
// packing, and the streamed copies. Every operation completes through a
// callback; none blocks its caller on the GPU. The rpc layer translates
// protos to these calls and statuses back.

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gpuexec/sha256.h"
#include "server/common/log.h"
#include "server/core/args.h"
#include "server/core/byte_spans.h"
#include "server/core/chunk_pool.h"
#include "server/core/compute_shares.h"
#include "server/core/drain.h"
#include "server/core/engine_types.h"
#include "server/core/fault_words.h"
#include "server/core/session.h"
#include "server/core/transfers.h"
#include "server/port/device_port.h"
#include "server/port/staging.h"
#include "server/port/types.h"

namespace gpuexec::core {

class Engine {
 public:
  // Loads the driver and opens every device. A driver that cannot be loaded
  // or reports no devices is not an error: the engine then serves with no
  // devices (driver_status() says why).
  // Devices are opened through `open_device` (the daemon's opens each in a
  // worker process of its own): the first says how many there are, the
  // others open side by side.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options,
                                                        port::DevicePortFactory open_device);
  // Closes every session and releases the devices.
  ~Engine();

  const EngineOptions& options() const { return options_; }
  int device_count() const { return static_cast<int>(devices_.size()); }
  // Each device's size, as compute shares are planned on it.
  std::vector<ShareDevice> ShareDevices() const;
  // Whether the driver can cut a device into green contexts.
  bool GreenContexts() const { return green_contexts_; }
  // With --isolation=device: cuts each device's SMs by `plans` (a green
  // context per tenant with a share and one of the rest; a device without
  // a plan is not cut). Waits for every device's answer; the first
  // refusal, naming the device, and the devices cut before it are cut back
  // by `before`. Once every device is cut, the sessions open on a device
  // whose cut changed are closed (their streams run on the old cut, which
  // may overlap another tenant's new part), each told why on its next
  // call. OK at once with a worker per tenant (MPS holds those to their
  // shares).
  absl::Status SetComputeParts(const std::vector<DeviceShares>& plans,
                               const std::vector<DeviceShares>& before);
  bool AnyDeviceHealthy() const;
  // Whether device `index` serves now (false while its worker restarts).
  bool DeviceHealthy(int index) const { return devices_[index]->healthy(); }
  // Called whenever a device starts or stops serving.
  void SetHealthListener(std::function<void()> listener);
  // The process id of a device's worker (0 while it restarts); for tests.
  int WorkerPid(int index) const { return devices_[index]->worker_pid(); }
  // OK when the driver loaded; otherwise why there are no devices.
  const absl::Status& driver_status() const { return driver_status_; }
  size_t session_count() const;
  // Counts for metrics; takes each session's lock in turn, briefly.
  EngineStats Stats() const;

  // Every call names its caller. A session belongs to the tenant that
  // opened it: for any other tenant its token is NOT_FOUND, exactly as a
  // token never issued. ListDevices gives the caller the device figures and
  // the details of its own sessions only.
  void ListDevices(const Caller& caller, Callback<std::vector<DeviceStatus>> done);

  void OpenSession(const Caller& caller, const SessionAsk& ask, Callback<SessionInfo> done);
  absl::StatusOr<uint64_t> KeepAlive(const Caller& caller, const std::string& token);
  void CloseSession(const Caller& caller, const std::string& token, Done done);
  // Calls `on_close` once, with the reason in words, when the caller's
  // session `token` closes for any reason (on the closing thread, holding
  // no lock of the engine's); NOT_FOUND as for any call when the session is
  // not the caller's or has closed. CancelCloseWatch takes it back.
  absl::StatusOr<uint64_t> WatchClose(const Caller& caller, const std::string& token,
                                      std::function<void(const std::string& why)> on_close);
  void CancelCloseWatch(const Caller& caller, const std::string& token, uint64_t watch);
  // Closes every session of `tenant` (removed from the tenants file), with
  // `why` in the log; returns how many.
  size_t CloseTenant(const std::string& tenant, const std::string& why);
  // Closes the sessions of `tenant` (as the tenants file now has it) on
  // devices it may no longer use; returns how many.
  size_t CloseTenantOffLimits(const Tenant& tenant);
  // Closes every session open on device `device`, with `why` told to each
  // client's next call and logged; returns how many.
  size_t CloseDeviceSessions(int device, const std::string& why);

  // The daemon's drain (drain.h): from StartDrain, OpenSession is refused
  // with UNAVAILABLE naming it; the sessions still open `grace` later are
  // closed, each told the drain. Again while draining: a new deadline.
  DrainState StartDrain(absl::Duration grace, std::string by);
  DrainState ResumeFromDrain();
  DrainState drain_state() const { return drain_.state(); }
  // `done` once no session is open, the drain is resumed, or the engine
  // goes (Drain::AddWaiter).
  absl::Status WhenDrained(Drain::Waiter done) { return drain_.AddWaiter(std::move(done)); }
  // Answers the calls that wait for the drain now (the daemon is stopping).
  void EndDrainWaits() { drain_.Stop(session_count()); }

  absl::StatusOr<std::unique_ptr<ModuleUpload>> BeginModuleUpload(const Caller& caller,
                                                                  const std::string& token,
                                                                  const std::string& sha256,
                                                                  uint64_t size, ModuleKind kind);
  // The compute capability of the device session `token` is on (a compile
  // for it is made for that architecture); NOT_FOUND as for any call.
  absl::StatusOr<std::pair<int, int>> SessionComputeCapability(const Caller& caller,
                                                               const std::string& token);
  void GetFunction(const Caller& caller, const std::string& token, uint64_t module,
                   const std::string& name, Callback<FunctionResult> done);

  void Allocate(const Caller& caller, const std::string& token, uint64_t size,
                Callback<BufferInfo> done);
  // Answered as soon as the handle is gone (its bytes count for the
  // session no more); the device gets the memory back in stream order,
  // after the work queued before, as cuMemFreeAsync does.
  void Free(const Caller& caller, const std::string& token, uint64_t buffer, Done done);
  void Memset(const Caller& caller, const std::string& token, uint64_t buffer, uint64_t offset,
              uint64_t size, uint32_t value, Done done);
  void CopyBuffer(const Caller& caller, const std::string& token, uint64_t dst, uint64_t dst_offset,
                  uint64_t src, uint64_t src_offset, uint64_t size, Done done);
  absl::StatusOr<std::shared_ptr<WriteSink>> BeginWrite(const Caller& caller,
                                                        const std::string& token, uint64_t buffer,
                                                        uint64_t offset);
  absl::StatusOr<std::shared_ptr<ReadSource>> BeginRead(const Caller& caller,
                                                        const std::string& token, uint64_t buffer,
                                                        uint64_t offset, uint64_t size,
                                                        uint32_t chunk);

  // Host memory regions (engine_regions.cc). RegisterRegion takes `fd` (a
  // client's memfd; closed on every path), checks it (a memfd sealed
  // against shrinking and growing, of exactly `bytes`, a multiple of 4096)
  // and the limits, and has the session's device process map and
  // page-lock it: a handle of the session, like a buffer's.
  void RegisterRegion(const Caller& caller, const std::string& token, int fd, uint64_t bytes,
                      Callback<RegionInfo> done);
  // In stream order with the session's launches; `done` once the copy has
  // finished.
  void RegionCopy(const Caller& caller, const std::string& token, const RegionCopySpec& copy,
                  Done done);
  // Answered once the handle is gone; the device process unpins and unmaps
  // the memory after the copies queued before.
  void ReleaseRegion(const Caller& caller, const std::string& token, uint64_t region, Done done);
  // Page-locked bytes of all sessions' regions now.
  uint64_t pinned_bytes() const { return daemon_pinned_used_.load(); }
  // A command ring's answer area (gpuexec/command_ring.h, kAnswerArea):
  // `bytes` at `offset` of the ring's memfd `fd` (checked by the caller,
  // who keeps it), where the session's device posts the successes of the
  // session's waiting launches itself (LaunchSpec::answer names it). Its
  // id, and what unmaps it (called once, when the ring is done). The
  // device maps it later; should it fail, the answers come the usual way.
  struct AnswerAreaLease {
    uint64_t area = 0;
    std::function<void()> unmap;
  };
  absl::StatusOr<AnswerAreaLease> MapAnswerArea(const Caller& caller, const std::string& token,
                                                int fd, uint64_t offset, uint64_t bytes);

  void Launch(const Caller& caller, LaunchSpec spec, Callback<uint64_t> gpu_ns);
  // Graphs (engine_graphs.cc). Between BeginGraph and EndGraph the
  // session's launches, memsets and copies between its buffers are checked
  // as when they run and recorded instead (each answered OK at once); its
  // transfers, region copies and Synchronize are refused.
  // EndGraph builds, instantiates and uploads the graph on the device.
  absl::Status BeginGraph(const Caller& caller, const std::string& token);
  void EndGraph(const Caller& caller, const std::string& token, Callback<GraphInfo> done);
  // Checks each patch as a launch's argument, then replays the graph on the
  // session's stream after its other work; `synchronize`: waits for it and
  // answers its GPU time.
  void LaunchGraph(const Caller& caller, LaunchGraphSpec spec, Callback<uint64_t> gpu_ns);
  void FreeGraph(const Caller& caller, const std::string& token, uint64_t graph, Done done);
  // `answer`: a command ring's answer area the device may post the success
  // in itself (Engine::MapAnswerArea); `posted` says if it did.
  void Synchronize(const Caller& caller, const std::string& token, Callback<uint64_t> gpu_ns,
                   std::shared_ptr<port::DirectAnswer> answer = nullptr);

 private:
  friend class ModuleUpload;
  friend class WriteSink;
  friend class ReadSource;

  explicit Engine(const EngineOptions& options);
  // The caller's session named by `token`; NOT_FOUND when there is none or
  // it is another tenant's.
  absl::StatusOr<std::shared_ptr<Session>> FindSession(const Caller& caller,
                                                       const std::string& token);
  // The usage record of tenant `name`, made on first use.
  std::shared_ptr<TenantUsage> UsageOf(const std::string& name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(sessions_mu_);
  // Counts `sha256` (`size` bytes) against the session's tenant before the
  // session is given a handle to it (each distinct image once per tenant,
  // however many of its sessions hold it; RESOURCE_EXHAUSTED past `limits`).
  // False when the session holds the image already (nothing was counted);
  // true: the caller gives it back with ReleaseModule unless the session
  // ends up with a new handle.
  absl::StatusOr<bool> ReserveModule(Session& s, const std::string& sha256, uint64_t size,
                                     const TenantLimits& limits);
  // One holder of `sha256` fewer for the session's tenant.
  void ReleaseModule(Session& s, const std::string& sha256);
  port::DevicePort* DeviceOf(const Session& s) { return s.port(); }
  // The launch checked and packed (the function, its shape, its arguments
  // against the kernel's parameters); `epoch`: of its buffers; `buffers`
  // (optional) gets their handles.
  absl::StatusOr<port::LaunchOp> PackLaunch(Session& s, const LaunchSpec& spec, uint64_t* epoch,
                                            std::vector<uint64_t>* buffers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  // Recording (engine_graphs.cc): the command checked and kept as a node.
  absl::Status RecordLaunchLocked(Session& s, LaunchSpec spec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  absl::Status RecordNodeLocked(Session& s, port::GraphNodeOp node,
                                std::initializer_list<uint64_t> buffers, uint64_t epoch,
                                uint64_t bytes = 256) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  // FAILED_PRECONDITION naming the graph that uses `buffer`, if one does.
  absl::Status NotInGraph(const Session& s, uint64_t buffer) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  // The session's graphs go (it closes).
  void DropGraphsLocked(Session& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  // The buffer, or why not: not found, or lost with its device's memory
  // (then it is marked lost and its memory given back to the limits).
  absl::StatusOr<BufferEntry*> FindBuffer(Session& s, uint64_t handle)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  // Whether `b`'s memory is still on its device; if not, marks it lost and
  // returns why.
  absl::Status CheckAlive(Session& s, BufferEntry& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  // Marks `b` lost and gives its bytes back to the limits; false if it was
  // already.
  bool MarkLost(Session& s, BufferEntry& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  // Work is being queued on the session's stream (see Session::work_epoch).
  void NoteWork(Session& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  // `port` (of device `index`) was reset: every buffer of its sessions is
  // lost.
  void OnDeviceReset(int index, const port::DevicePort* port, const port::ResetInfo& info);
  static absl::Status CheckRange(const Session& s, const BufferEntry& b, uint64_t offset,
                                 uint64_t size, absl::string_view op);
  // `reserved`: ReserveModule counted the image for this session.
  void FinishModule(std::shared_ptr<Session> session,
                    std::shared_ptr<const port::ModuleImage> image, bool uploaded,
                    bool newly_stored, bool reserved, Callback<ModuleResult> done);
  void ReleaseMemory(Session& s, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  void Synchronize(std::shared_ptr<Session> s, Callback<uint64_t> gpu_ns,
                   std::shared_ptr<port::DirectAnswer> answer = nullptr);
  // A Synchronize's answer from the device: its time is charged to the
  // session's tenant, and an untimed session is told 0 (SessionAsk::untimed).
  static void ChargeGpuTime(const Session& s, absl::StatusOr<uint64_t>& ns);
  // After a failed Synchronize that took `work_epoch` from the session.
  static void RestoreWorkEpoch(Session& s, uint64_t work_epoch, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  enum class CloseReason { kClient, kExpired, kShutdown, kRevoked, kFaulted };
  // Removes the session and frees all it holds; `why` goes to the log.
  void Close(std::shared_ptr<Session> session, CloseReason reason, const std::string& why,
             Done done);
  void ReaperLoop();
  // The reaper's part of a drain: closes what the deadline leaves open.
  void TickDrain(absl::Time now);

  const EngineOptions options_;
  std::atomic<uint64_t> next_graph_id_{1};
  absl::Status driver_status_;
  bool test_double_ = false;     // the driver is the test double
  bool green_contexts_ = false;  // the driver has them
  std::vector<std::shared_ptr<port::DevicePort>> devices_;

  mutable absl::Mutex sessions_mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Session>> sessions_
      ABSL_GUARDED_BY(sessions_mu_);
  std::vector<uint32_t> sessions_per_device_ ABSL_GUARDED_BY(sessions_mu_);
  // Strikes: resets each tenant's (or peer's) kernels caused, and until
  // when its launches are refused. Keyed by Session::strike_key.
  struct Strikes {
    std::deque<absl::Time> at;  // within the window
    absl::Time refused_until = absl::InfinitePast();
  };
  absl::Mutex strikes_mu_;
  absl::flat_hash_map<std::string, Strikes> strikes_ ABSL_GUARDED_BY(strikes_mu_);
  std::atomic<uint64_t> strikes_total_{0};
  std::atomic<uint64_t> strike_refusals_{0};
  // Why sessions closed by the daemon (not by their clients) went, for the
  // NOT_FOUND their next call gets: token -> (tenant, why), the last
  // kClosedRemembered.
  static constexpr size_t kClosedRemembered = 1024;
  void RememberClosed(const Session& s, const std::string& why);
  absl::Mutex closed_mu_;
  absl::flat_hash_map<std::string, std::pair<std::string, std::string>> closed_why_
      ABSL_GUARDED_BY(closed_mu_);
  std::deque<std::string> closed_order_ ABSL_GUARDED_BY(closed_mu_);
  // Charges a reset to the sessions its reason names, if they are of one
  // tenant (or peer): closes them, and starts a cooldown at the limit.
  void Strike(int index, const port::ResetInfo& info, std::vector<std::shared_ptr<Session>> named);
  // FAILED_PRECONDITION while `s`'s tenant (or peer) is cooling down.
  absl::Status CheckStrikes(const Session& s);
  // Sessions counted against the limits and not yet in sessions_.
  size_t opening_ ABSL_GUARDED_BY(sessions_mu_) = 0;
  // Session open and close lines: a budget per tenant (without tenants,
  // per peer: Session::strike_key), so that one caller opening and closing
  // sessions in a loop neither fills the log nor uses up everyone's lines.
  // Refused lines are counted (Stats::session_lines_left_out), and the next
  // line of the key says how many went before it. Takes session_lines_mu_
  // (innermost).
  bool TakeSessionLine(const std::string& key, std::string* left_out_note);
  static constexpr double kSessionLinesPerSecond = 10;
  static constexpr double kSessionLinesBurst = 100;
  absl::Mutex session_lines_mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<log::LineBudget>> session_lines_
      ABSL_GUARDED_BY(session_lines_mu_);
  std::atomic<uint64_t> session_lines_left_out_{0};
  // Open sessions by tenant and peer host (see PeerHost): PeerKey's.
  absl::flat_hash_map<std::string, uint32_t> sessions_per_peer_ ABSL_GUARDED_BY(sessions_mu_);
  static std::string PeerKey(const std::string& tenant, const std::string& peer_host) {
    return tenant + '\n' + peer_host;
  }
  absl::flat_hash_map<std::string, std::shared_ptr<TenantUsage>> tenants_
      ABSL_GUARDED_BY(sessions_mu_);
  // The kernels the last reset of each port named (by stream and kernel
  // id, port::ResetInfo::kernels), resolved to their sessions when it came
  // (the sessions may close since): each reader is told its own kernels by
  // name and every other tenant's as "another tenant's kernel". Every
  // named tenant is kept, not the last one. Entries go with their port.
  struct NamedKernel {
    std::string tenant;
    std::string token;         // of the session
    std::string session_name;  // "session 3f2a91c0"
    std::string label;         // the kernel's (fault_words.h's KernelLabel, ReplayLabel)
  };
  struct ResetNames {
    uint64_t epoch = 0;
    KernelReset facts;
    std::vector<NamedKernel> kernels;
    size_t unknown = 0;  // named kernels whose session had gone
  };
  absl::flat_hash_map<const port::DevicePort*, ResetNames> reset_names_
      ABSL_GUARDED_BY(sessions_mu_);
  // `st` (a failure of `s`'s Launch or Synchronize) in words for `s`: what
  // its kernel did, where the port's last reset names one of them; else
  // `st` as it is (its text names no kernel or session). `work_epoch` is
  // the epoch of the work a Synchronize waited for (0: none): where `st`
  // says that work was lost to a reset that names `s`'s own kernels, the
  // answer is what those kernels did, read from the device's own record of
  // the reset (the engine's names may not be in yet).
  absl::Status FaultFor(absl::Status st, Session& s, bool closed, uint64_t work_epoch = 0)
      ABSL_LOCKS_EXCLUDED(sessions_mu_, s.mu);
  // The same, with `s`'s own word on whether it is closed (takes its mu).
  absl::Status FaultFor(absl::Status st, Session& s);
  // `done` for work queued on `s`'s stream at `work_epoch` that is answered
  // without a Synchronize (a launch, a replay): a failure passes through
  // FaultFor, since the reset a kernel of `s` caused can answer the work
  // itself before any Synchronize (the worker finds the fault while the
  // work is still its request), and that answer is then `s`'s first word
  // of the fault.
  Done QueuedWorkDone(std::shared_ptr<Session> s, uint64_t work_epoch, Done done);
  // The facts of the port's last reset as OnDeviceReset recorded them, and
  // the labels of `s`'s kernels among them; false where none is
  // recorded (or, `epoch` not 0, none of that epoch).
  bool RecordedNames(const Session& s, uint64_t epoch, KernelReset* facts,
                     std::vector<std::string>* own) ABSL_LOCKS_EXCLUDED(sessions_mu_);
  // The labels (KernelLabel, or ReplayLabel for a replay) of `s`'s
  // kernels that `info` names.
  static std::vector<std::string> OwnKernels(const port::ResetInfo& info, Session& s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  // `lost` (what `s` had at `epoch` was lost to a reset) in the words of
  // `s`'s own kernels, where the reset that ended that epoch names them
  // (not under MPS, where a fault reaches other clients' kernels):
  // the device records the reset before its new epoch shows, so this needs
  // no wait for OnDeviceReset.
  absl::Status LostTo(Session& s, uint64_t epoch, absl::Status lost)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  // A port's last reset as `caller` reads it (ListDevices' last_reset).
  std::string ResetTextFor(const Caller& caller, const port::DevicePort* port,
                           const port::ResetInfo& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(sessions_mu_);
  // With EngineOptions::mps, per device: the fault window the device's
  // first reset opened, the sessions that first reset named (the tenant
  // whose worker reported the fault first: the reaching faults come
  // later), and the sessions its resets named so far.
  struct MpsWindow {
    bool open = false;
    port::ResetInfo first;
    std::vector<std::shared_ptr<Session>> first_named;
    std::vector<std::shared_ptr<Session>> named;
  };
  std::vector<MpsWindow> mps_windows_ ABSL_GUARDED_BY(sessions_mu_);
  // With EngineOptions::mps, on a port thread: asks every other worker of
  // device `index` for its memory (a driver call, which fails on a worker
  // the fault reached and so resets it) at once and a few times within the
  // window, then settles the window.
  void WatchMpsWindow(int index, const port::DevicePort* reset);
  // Charges the sessions the window's first reset named, if they are of
  // one tenant or peer; where it named none, the window's named sessions
  // if they are of one.
  void SettleMpsWindow(int index);

  // Daemon-wide device memory held by sessions.
  std::atomic<uint64_t> daemon_memory_used_{0};
  // Daemon-wide page-locked bytes of regions, and the next region id.
  std::atomic<uint64_t> daemon_pinned_used_{0};
  std::atomic<uint64_t> next_region_id_{1};
  // Answer areas' ids: a space of their own (the top bit set), since they
  // travel to the device process on the same descriptor socket as regions.
  std::atomic<uint64_t> next_answer_area_{1};
  // Gives a region's bytes back to the session's, its tenant's and the
  // daemon's counts.
  void ReleasePinned(Session& s, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  // The region, or why not: not found, or gone with its device's reset.
  absl::StatusOr<RegionEntry*> FindRegion(Session& s, uint64_t handle)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  // Has the device unmap a region after the work queued on the session's
  // stream, and gives its bytes back then. Called with the session's mu
  // held (the completion takes it).
  void UnpinLater(const std::shared_ptr<Session>& s, port::RegionId id, uint64_t bytes,
                  uint64_t epoch);
  // UnpinLater for every live region of a closing session.
  void DropRegions(const std::shared_ptr<Session>& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu);

  // Read chunks' host copies, reused (the daemon keeps up to 16 idle).
  const std::shared_ptr<ChunkPool> read_chunks_;

  // Totals for metrics: one TrafficCounters per device.
  std::unique_ptr<TrafficCounters[]> traffic_;
  std::atomic<uint64_t> sessions_opened_{0};
  std::atomic<uint64_t> sessions_closed_{0};
  std::atomic<uint64_t> sessions_expired_{0};
  std::atomic<uint64_t> module_uploads_{0};
  // Bytes received by uploads under way (see
  // EngineOptions::module_upload_budget_bytes), in all and by strike key (a
  // tenant, or a peer host of the implicit tenant).
  uint64_t uploading_ ABSL_GUARDED_BY(modules_mu_) = 0;
  absl::flat_hash_map<std::string, uint64_t> uploading_by_ ABSL_GUARDED_BY(modules_mu_);
  absl::Status ChargeUpload(const Session& s, uint64_t bytes, absl::string_view what);
  void UnchargeUpload(const Session& s, uint64_t bytes);
  std::atomic<uint64_t> module_upload_bytes_{0};

  // The module store: images by SHA-256, with a use stamp for eviction.
  struct StoredModule {
    std::shared_ptr<const port::ModuleImage> image;
    uint64_t last_used = 0;
    // Tenants that uploaded its bytes: only they may load it by hash.
    absl::flat_hash_set<std::string> tenants;
  };
  // Evicts images no session holds until `bytes` more fit the budget; each
  // eviction also unloads the image from every device.
  absl::Status MakeRoom(uint64_t bytes, absl::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(modules_mu_);
  void Unstore(const std::string& sha256) ABSL_EXCLUSIVE_LOCKS_REQUIRED(modules_mu_);
  mutable absl::Mutex modules_mu_;
  absl::flat_hash_map<std::string, StoredModule> module_store_ ABSL_GUARDED_BY(modules_mu_);
  uint64_t module_store_used_ ABSL_GUARDED_BY(modules_mu_) = 0;
  uint64_t module_store_clock_ ABSL_GUARDED_BY(modules_mu_) = 0;

  absl::Mutex health_mu_;
  std::function<void()> health_listener_ ABSL_GUARDED_BY(health_mu_);

  Drain drain_;
  absl::Notification stop_reaper_;
  std::thread reaper_;

  // Tenant workers (Isolation::kTenant), per device by tenant name.
  struct TenantPort {
    std::shared_ptr<port::DevicePort> port;  // null while it starts
    uint32_t sessions = 0;
    absl::Time idle_since;
    // OpenSessions waiting for it to start.
    std::vector<std::function<void(absl::StatusOr<std::shared_ptr<port::DevicePort>>)>> waiting;
  };
  port::DevicePortFactory open_device_;
  mutable absl::Mutex ports_mu_;
  std::vector<absl::flat_hash_map<std::string, TenantPort>> tenant_ports_
      ABSL_GUARDED_BY(ports_mu_);
  bool ports_closed_ ABSL_GUARDED_BY(ports_mu_) = false;  // the engine is going
  // Tenant workers ended for idleness whose process is still going (they
  // count against max_workers_per_device until it has), per device.
  std::vector<uint32_t> draining_ ABSL_GUARDED_BY(ports_mu_);
  // Threads that start or end tenant workers; joined when done (`done`).
  struct PortThread {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<PortThread> port_threads_ ABSL_GUARDED_BY(ports_mu_);
  void RunPortThread(std::function<void()> fn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ports_mu_);
  // The port a new session of `caller` on device `index` is served by,
  // through `done` (at once, or once its tenant's worker has started).
  void AcquirePort(const Caller& caller, int index,
                   std::function<void(absl::StatusOr<std::shared_ptr<port::DevicePort>>)> done);
  void StartTenantPort(int index, const std::string& tenant);
  // A session of `s`'s port is gone.
  void ReleasePort(const Session& s);
  // Ends tenant workers idle for worker_idle; joins finished port threads.
  void RetireIdlePorts(absl::Time now);
};

}  // namespace gpuexec::core

#endif  // GPUEXEC_SERVER_CORE_ENGINE_H_
