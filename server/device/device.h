#ifndef GPUEXEC_SERVER_DEVICE_DEVICE_H_
#define GPUEXEC_SERVER_DEVICE_DEVICE_H_

// One GPU: its primary context, module cache, streams, staging buffers and
// the ONE executor thread that makes every driver call of this device.
//
// The interface is operations in, completions out: each method posts an
// operation to the executor and returns at once; the callback runs later on
// the executor thread or on a driver callback thread, and must be cheap and
// must not call back into the Device synchronously in a way that blocks. No
// driver handle crosses this interface: streams and kernels are named by ids
// that are only meaningful to this Device. This is the seam at which the
// executor can move into a worker process.
//
// Faults: the first sticky driver error (an illegal address in a kernel,
// say) marks the device unhealthy; from then on every operation fails with
// ABORTED describing that fault, and completions still pending are failed
// the same way.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/cuda/driver.h"
#include "server/device/executor.h"
#include "server/port/staging.h"
#include "server/port/types.h"

namespace gpuexec::device {

// The shared vocabulary (server/port/types.h), by its names here.
using port::Callback;
using port::DevicePtr;
using port::Done;
using port::GraphId;
using port::KernelId;
using port::KernelInfo;
using port::LaunchOp;
using port::ModuleImage;
using port::StagingPool;
using port::StagingSlot;
using port::StreamId;

// A sticky fault, as the device's owner reports it. `detail` is for the
// operator's log: it names the driver call and every kernel in flight, with
// their sessions. `reason` names none of them (the CUresult and the
// driver's words): it is what the operations that fail for the fault say,
// and what any session may read. `kernels`: the streams with a kernel not
// yet synchronized then, each with its last kernel (the driver does not
// say which one faulted).
struct FaultReport {
  std::string detail;
  std::string reason;
  std::string result;  // the CUresult's name ("CUDA_ERROR_ILLEGAL_ADDRESS")
  std::vector<port::ResetKernel> kernels;
};

// A launch past its stream's kernel time limit: `detail` names it and its
// session (for the log), `reason` neither.
struct HungReport {
  StreamId stream = 0;
  KernelId kernel = 0;
  GraphId graph = 0;  // a graph's replay: `kernel` is its first kernel node's
  std::string detail;
  std::string reason;
  uint64_t limit_ms = 0;
  uint64_t ran_ms = 0;
  // The launches whose watch it is (a run's share one): `limit_ms` is
  // their limits together, and the hung kernel may be any of them.
  uint32_t launches = 1;
};

struct DeviceOptions {
  size_t staging_bytes = 1 << 20;  // per slot
  int staging_slots = 8;
  // Staging memory the caller owns (staging_bytes * staging_slots bytes,
  // shared with the daemon's front process): the device page-locks it with
  // cuMemHostRegister instead of allocating pinned memory of its own.
  uint8_t* staging_memory = nullptr;
  // Called once, on the executor, when the first sticky fault is seen.
  std::function<void(const FaultReport&)> on_fault;
  // Called on the executor when a launch has run past its stream's kernel
  // time limit (again at most once a second while it keeps running).
  std::function<void(const HungReport&)> on_hung;
  // Where the executor reads requests from itself (see ExecutorInput); none
  // when its fd is -1.
  ExecutorInput input;
  // Launches a stream may have queued on the GPU and not yet finished (0:
  // no bound). A launch past it waits here, with everything behind it on
  // its stream, until one has finished: the driver's launch queue is
  // shared, and a launch into a full one blocks the executor, which serves
  // every stream of the device.
  int max_queued_launches = 0;
  // Operations held so (each stream; all streams of the device, counted
  // by the bytes of their parameters and names): past either, a new one is
  // refused with RESOURCE_EXHAUSTED instead of held.
  size_t max_held_per_stream = 8192;
  size_t max_held_bytes = 64 << 20;
  // The tenants' operations take turns on the executor (TurnQueue, by
  // TurnKeys), and it reads new requests between operations
  // (input.between_ops); false: in the order they arrived.
  bool stream_turns = true;
  // How often the watches of launches are looked at while nothing waits on
  // them (no held operation): each look queries an event of every watched
  // stream, which a flood of async launches otherwise pays between every
  // two launches (an event's query costs the driver 1.5 us on an H100).
  // Zero: at every pass of the executor. A Synchronize's own wait is
  // looked at every pass regardless.
  absl::Duration watch_poll_every = absl::Microseconds(20);
  // A run of async launches of one stream (one after another on the
  // executor, nothing else between) shares a watch among this many
  // launches: one event recorded after the last of them (or at the run's
  // end) instead of one after each, which with its entry and the polls'
  // query of it cost the device's thread about 1.2 us a launch (H100).
  // The shared watch's time limit is the sum of its launches', which
  // never passes the operator's limit for the stream (StreamOwner::
  // operator_limit_ms): a session that kept that limit has a watch a
  // launch, one that asked for an eighth of it or less shares among eight.
  // At most a quarter of max_queued_launches, if bound; 1: a watch for
  // every launch.
  int launches_per_watch = 8;
  // Times each launch's driver call (two clock reads a launch) for
  // launch_call_ns(): what the driver's launch costs on the device's
  // thread, beside what the device's own work around it costs (the
  // benchmark's device layer rows).
  bool time_launch_calls = false;
};

class Device {
 public:
  static absl::StatusOr<std::unique_ptr<Device>> Open(const cuda::Driver* driver, int ordinal,
                                                      const DeviceOptions& options);
  // Drains the executor, destroys streams and modules and releases the
  // primary context, all on the executor thread.
  ~Device();

  int ordinal() const { return props_.ordinal; }
  const cuda::DeviceProperties& properties() const { return props_; }
  bool healthy() const { return !faulted_.load(); }
  // The sticky fault that made the device unusable; OK while healthy.
  absl::Status fault() const;
  uint32_t modules_loaded() const { return modules_loaded_.load(); }
  uint64_t module_loads_total() const { return module_loads_total_.load(); }
  // With DeviceOptions::time_launch_calls: the launches' driver calls made
  // so far, and their time in all (any thread).
  struct LaunchCalls {
    uint64_t calls = 0;
    uint64_t ns = 0;
  };
  LaunchCalls launch_calls() const {
    return {launch_calls_.load(std::memory_order_relaxed),
            launch_call_ns_.load(std::memory_order_relaxed)};
  }
  // Operations posted to the device's thread and not yet run, and those it
  // ran since the start (any thread).
  size_t backlog() const { return executor_.backlog(); }
  uint64_t ops_run() const { return executor_.ran(); }
  StagingPool& staging() { return staging_; }

  void QueryMemory(Callback<cuda::MemoryInfo> done);
  // On the executor, after what was posted before it: a cheap driver call
  // (the device's free memory) that finds a sticky fault the device has
  // come to hold without a call of its own failing (under MPS, another
  // client's fatal fault), which it then reports like any other. Then
  // `done`, with no error: the worker answers, whatever the device's state.
  void Probe(std::function<void()> done);

  // Creates the stream `id` (chosen by the caller, unique on this device).
  // A nonzero `kernel_time_limit` makes each launch on it watched: one still
  // running after that long is reported to DeviceOptions::on_hung.
  // The stream runs on the part of `tenant` while the device is cut into
  // parts (SetComputeParts), on the rest's if it has none.
  // A stream of a low-priority owner gets the driver's least priority, any
  // other its greatest: the block scheduler serves the others first.
  // An untimed owner's stream records no timing events; its Synchronize
  // reports the host's view of its busy time (StreamOwner::untimed).
  void CreateStream(StreamId id, absl::Duration kernel_time_limit, port::StreamOwner owner,
                    Done done);
  // Cuts the SMs into a green context per part and one of the rest, for
  // the streams created after it (those before keep theirs, and their
  // green contexts live while they do). Empty: no parts. Refused, keeping
  // the parts in force: a driver without green contexts, or a part the
  // driver cannot make.
  void SetComputeParts(std::vector<port::ComputePart> parts, Done done);
  // Runs `done` once the stream's queued work has finished and the stream is
  // gone.
  void DestroyStream(StreamId stream, Done done);

  // Runs `done` (on a driver callback thread) once everything queued on
  // `stream` so far has finished. Copies wait for this before they take a
  // staging buffer, so that no buffer sits idle behind a session's kernel.
  void AfterQueued(StreamId stream, std::string what, Done done);

  // Allocates on `stream` and clears the memory to zeros in stream order:
  // work queued after it sees a zero-filled buffer.
  void Allocate(StreamId stream, uint64_t size, std::string what, Callback<DevicePtr> done);
  // Enqueues the free; `done` reports the enqueue.
  void Free(StreamId stream, DevicePtr ptr, std::string what, Done done);
  void Memset(StreamId stream, DevicePtr ptr, uint8_t value, uint64_t size, std::string what,
              Done done);
  void Copy(StreamId stream, DevicePtr dst, DevicePtr src, uint64_t size, std::string what,
            Done done);

  // Copies `size` bytes from a staging slot to the device; `done` runs when
  // the copy has finished (the slot may be reused then).
  void CopyToDevice(StreamId stream, DevicePtr dst, StagingSlot slot, uint64_t size,
                    std::string what, Done done);
  // Copies to a staging slot; `done` runs when the bytes are in the slot.
  void CopyToHost(StreamId stream, StagingSlot slot, DevicePtr src, uint64_t size, std::string what,
                  Done done);

  // Host memory regions: a memfd a same-host client shares, mapped here and
  // page-locked once (cuMemHostRegister). `fd` is taken (closed here, the
  // mapping kept); the front process checked it, and its size is checked
  // again. The id is the caller's; reusing a live one is refused.
  using RegionId = uint64_t;
  void MapRegion(RegionId region, int fd, uint64_t bytes, std::string what, Done done);
  // Copies `size` bytes between `offset` of a mapped region and device
  // memory on `stream`; `done` once the copy has finished.
  void CopyRegion(StreamId stream, RegionId region, uint64_t offset, DevicePtr ptr, uint64_t size,
                  bool to_device, std::string what, Done done);
  // Unregisters and unmaps the region once the work queued on `stream`
  // so far has finished (at once when the stream is gone); `done` then.
  void UnmapRegion(StreamId stream, RegionId region, Done done);

  // Loads the image unless this device holds it already (one driver load
  // per image per device, whoever asks); `done` says whether this call
  // loaded it (false: it was loaded already).
  void LoadModule(std::shared_ptr<const ModuleImage> image, std::string what, Callback<bool> done);
  // Unloads an image (no session may hold it: its kernels go with it).
  void UnloadModule(std::string sha256);
  // Resolves a kernel of a module this device loaded (loading it if
  // needed) and names it `id` (chosen by the caller) for Launch; one kernel
  // may have several ids.
  void GetKernel(std::shared_ptr<const ModuleImage> image, std::string name, KernelId id,
                 std::string what, Callback<KernelInfo> done);
  // GetKernel of a module already loaded, by its SHA-256.
  void GetLoadedKernel(std::string sha256, std::string name, KernelId id, std::string what,
                       Callback<KernelInfo> done);
  // Enqueues a launch; `done` reports the enqueue.
  void Launch(StreamId stream, LaunchOp op, Done done);
  // Completes when all work enqueued on `stream` so far has finished, with
  // the GPU time since the previous Synchronize (0 if no work ran).
  void Synchronize(StreamId stream, Callback<uint64_t> gpu_ns);
  // A Launch and a Synchronize of its stream in one operation: `done` gets
  // the launch's failure, or what the Synchronize gives, and whether the
  // launch was enqueued.
  using LaunchedAndSynchronized = port::LaunchedAndSynchronized;
  void LaunchAndSynchronize(StreamId stream, LaunchOp op, LaunchedAndSynchronized done);

  // CUDA graphs (device_graphs.cc), each of one stream and gone with it.
  // BuildGraph, in stream order: a graph of `nodes` (each after the one
  // before), instantiated and uploaded to the stream; FAILED_PRECONDITION
  // where the driver has no graphs. LaunchGraph patches kernel nodes (for
  // this replay and the later ones), then launches it as one launch: held,
  // timed and watched as a kernel is, a fault or hang naming `what`.
  // DestroyGraph frees it once the stream's work queued before is done.
  void BuildGraph(StreamId stream, GraphId graph, std::vector<port::GraphNodeOp> nodes,
                  std::string what, Callback<port::GraphBuilt> done);
  void LaunchGraph(StreamId stream, GraphId graph, std::vector<port::GraphPatchOp> patches,
                   std::string what, Done done);
  void DestroyGraph(StreamId stream, GraphId graph, Done done);

  // Launches of `stream` enqueued on the GPU and not yet seen finished,
  // and operations held behind the bound (both 0 unless launches are
  // watched: a kernel time limit or max_queued_launches). Executor thread.
  struct QueueDepth {
    size_t launches = 0;
    size_t held = 0;
  };
  void QueueDepthOf(StreamId stream, Callback<QueueDepth> done);

  // Waits for everything (used at shutdown only).
  void Drain();
  // Runs `fn` on the executor after everything posted so far.
  void Post(std::function<void()> fn);

 private:
  struct StreamState;
  struct LoadedModule;
  struct KernelEntry;
  struct HostTask;
  struct GraphState;

  Device(const cuda::Driver* driver, cuda::DeviceProperties props, const DeviceOptions& options);

  // Executor-thread helpers.
  void OnStart();
  void OnTick();
  // Completes the event waits whose events the GPU has reached; true while
  // some remain.
  bool PollEvents();
  void OnStop();
  absl::Status Check(absl::Status status);
  absl::Status Usable() const;
  // The stream of an operation, or why the operation cannot run.
  absl::StatusOr<StreamState*> ReadyStream(StreamId id);
  // Before work is queued on `s`: records the stream's timing start if
  // this is its first work since the last Synchronize.
  absl::Status MarkWork(StreamState& s);
  // After work was queued on `s`: records the event its GPU time ends at.
  absl::Status EndWork(StreamState& s, const std::string& what);
  // After an async launch on `s` (timed): its end is due, not recorded yet.
  void MarkEndDue(StreamId stream, StreamState& s);
  // Marks the run's end due for `stream` (settling another stream's first):
  // its timed end (StreamState::end_due) and the watch of its launches
  // covered by none yet (StreamState::uncovered).
  void MarkDue(StreamId stream);
  // Watches the launches of `s` covered by none yet through `end`, an
  // event recorded right after the last of them, or one recorded here.
  absl::Status Cover(StreamId id, StreamState& s, std::shared_ptr<cuda::Event> end);
  // What MarkWork changes of a stream, to put back when the launch it was
  // for is not made.
  struct WorkMarks {
    std::shared_ptr<cuda::Event> work_end;
    bool work_end_passed = false;
    bool end_due = false;
    uint64_t work_count = 0;
    std::optional<std::chrono::steady_clock::time_point> busy_since;
  };
  static WorkMarks MarksOf(const StreamState& s);
  static void Restore(StreamState& s, const WorkMarks& marks);
  // A launch (or replay) of `stream` that failed ends its run, so that the
  // run's uncovered launches get their watch now: failing launches, which
  // cost their tenant nothing, cannot keep a hung one unwatched.
  void EndRunOnFailure(StreamId stream, const absl::Status& st);
  // Pushes the watch of `launches` just enqueued on `s` (0 for Cover: none
  // but the uncovered), which also covers the run's uncovered launches:
  // `done` was recorded after the last of them.
  void AddWatch(StreamId id, StreamState& s, std::shared_ptr<cuda::Event> done,
                std::shared_ptr<const std::string> what, std::shared_ptr<cuda::Event> start,
                uint32_t launches);
  // Launches a watch of a run on `s` covers (DeviceOptions::
  // launches_per_watch, StreamState::operator_limit).
  uint32_t LaunchesPerWatch(const StreamState& s) const;
  // Records the due end of a run of launches (StreamState::end_due) and
  // the watch of its uncovered launches, if any, and ends the run: before
  // any operation other than the next launch of that stream, and once
  // nothing more is posted to the executor (or kDueAtMost has passed).
  void SettleDueEnd();
  // Runs `op` on the executor in its stream's order: at once, or once the
  // operations held on the stream have run. A launch is held while its
  // stream has max_queued_launches launches queued. `refuse` ends an
  // operation that will never run (past the bounds on held operations, or
  // held when its stream ends); a release (a Free) is never refused.
  enum class OpKind { kLaunch, kRelease, kOther };
  void OnStream(StreamId stream, OpKind kind, size_t bytes, std::function<void()> op,
                std::function<void(absl::Status)> refuse);
  // Runs a stream's operation, settling a due end first unless it is the
  // next launch of the same stream.
  void RunOnStream(StreamId stream, OpKind kind, const std::function<void()>& op);
  // The launch about to be made on `s` follows an async launch of the same
  // (timed) stream with nothing run between: it is in a run, whose end is
  // due (StreamState::end_due). The run's first launch records a timed
  // event as any launch alone does, so tenants taking turns, or launches
  // one at a time, pay no more than before.
  bool InRun(StreamId stream, const StreamState& s) const;
  bool QueueFull(const StreamState& s) const;
  // Runs the stream's held operations that may run now (all of them once
  // the device has faulted or is stopping).
  void ReleaseHeld(StreamId stream);
  void ReleaseAllHeld();
  // Launches are watched (an event after each): for a time limit or for
  // the bound on queued launches.
  bool Watched(const StreamState& s) const;
  // The bodies of Launch and Synchronize, on the executor.
  // With `then_synchronize`, the launch's stream is synchronized right after
  // it (SynchronizeOn), and only a failure to launch is returned: from the
  // launch on, the callback (taken) reports.
  absl::Status LaunchOn(StreamId stream, StreamState& s, LaunchOp& op,
                        Callback<uint64_t>* then_synchronize = nullptr);
  // Readies `op`'s kernel for it: opted in to its dynamic shared memory and
  // clusters, a cooperative grid checked, the tensor maps encoded into the
  // parameters.
  absl::StatusOr<KernelEntry*> PrepareKernel(LaunchOp& op);
  absl::Status EncodeTensorMaps(const std::vector<port::TensorMapEncoding>& maps,
                                std::string& block, const std::string& what);
  // What every launch on `s` gets around `launch` (a kernel's, a graph's):
  // the GPU time's start, the names a fault or hang reports (`what`, taken,
  // and `kernel`, or `graph` for a replay), then the watch or the end of
  // the work, or the Synchronize of LaunchOn.
  using LaunchFn = absl::FunctionRef<absl::Status(CUstream_st*, const std::string& what)>;
  absl::Status LaunchWatched(StreamId stream, StreamState& s, std::string& what, KernelId kernel,
                             GraphId graph, LaunchFn launch, Callback<uint64_t>* then_synchronize);
  // The bodies of BuildGraph and LaunchGraph, on the executor.
  absl::StatusOr<port::GraphBuilt> BuildOn(StreamState& s, GraphId graph,
                                           std::vector<port::GraphNodeOp>& nodes,
                                           const std::string& what);
  absl::Status ReplayOn(StreamId stream, StreamState& s, GraphId graph,
                        std::vector<port::GraphPatchOp>& patches, std::string& what);
  // A cooperative launch's grid against the blocks of its kernel that the
  // device holds at once: INVALID_ARGUMENT naming both when it is larger.
  absl::Status CheckCoResident(KernelEntry& k, const LaunchOp& op);
  // What an untimed stream's Synchronize reports once its work is seen
  // done: the host's view of its busy time since `busy_since`, up to the
  // `covered`-th work (StreamState::busy_since). `s`: the stream, or null
  // once it is gone.
  uint64_t UntimedNs(StreamState* s, std::chrono::steady_clock::time_point busy_since,
                     uint64_t covered);
  // `recorded`, if given, gets the end event once recorded.
  void SynchronizeOn(StreamId stream, StreamState& s, Callback<uint64_t> gpu_ns,
                     std::shared_ptr<cuda::Event>* recorded = nullptr);
  // Posts GPU work: `enqueue` queues it on the stream; `done` reports the
  // enqueue or, with `wait`, the work's completion.
  void EnqueueWork(StreamId stream, std::string what, bool wait, Done done,
                   std::function<absl::Status(CUstream_st*)> enqueue);
  void ResolveKernel(LoadedModule* m, const std::string& name, KernelId id, const std::string& what,
                     const Callback<KernelInfo>& done);
  // Checks the launches watched for the kernel time limit; true while some
  // are still running.
  bool PollWatches();
  // Watches the launch just enqueued on `s` through `recorded`, an event
  // recorded right after it, or (if null) one recorded here; `start`, if
  // any, was recorded just before the launch.
  absl::Status Watch(StreamId id, StreamState& s, std::shared_ptr<const std::string> what,
                     std::shared_ptr<cuda::Event> start,
                     std::shared_ptr<cuda::Event> recorded = nullptr);
  absl::StatusOr<LoadedModule*> EnsureModule(const std::shared_ptr<const ModuleImage>& image,
                                             const std::string& what);
  // Gives the pool's freed memory back to the device once the frees on
  // `stream` (the legacy stream when null) have completed.
  void GiveBackFreed(CUstream_st* stream);
  // Runs `fn` with the status of the stream's work once all that is queued
  // on it now has finished.
  absl::Status WhenDone(StreamState& s, std::function<void(absl::Status)> fn,
                        const std::string& what);
  // The spare events of a kind. Executor thread only, as are the two below.
  std::vector<cuda::Event>& Spares(bool timing);
  // An event from the spares of its kind (or a new one).
  absl::StatusOr<cuda::Event> SpareEvent(bool timing, const std::string& what);
  // A spare event shared, handed back to the spares when its last holder
  // lets go.
  absl::StatusOr<std::shared_ptr<cuda::Event>> SharedEvent(bool timing, const std::string& what);
  // A spare of each kind the stream takes in hand, made now where there
  // is none: called before a launch is made, so that the event its watch
  // or its end takes after it comes from the spares. A launch the GPU has
  // queued is then never answered as failed, and left unwatched, because
  // the driver could not make an event; the launch is refused before it
  // is made instead.
  absl::Status KeepSpareEvents(const StreamState& s, const std::string& what);
  static void HostTrampoline(void* data);
  void FailPending(const absl::Status& status);

  const cuda::Driver* driver_;
  const cuda::DeviceProperties props_;
  const DeviceOptions options_;
  Executor executor_;
  TurnKeys turn_keys_;         // with stream_turns: the turn each stream's ops take
  absl::Status start_status_;  // set by OnStart
  absl::Notification* started_ = nullptr;

  // Executor-thread state.
  cuda::PrimaryContext context_;
  // Events used and given back, to record again instead of creating and
  // destroying them per launch: timing ones (a stream's start of work, the
  // end of each work, a launch's watch) and plain ones (a Synchronize's
  // wait that times nothing, the start of a watched launch). Declared
  // before anything that holds a
  // shared event, whose last release returns it here.
  std::vector<cuda::Event> spare_timing_events_;
  std::vector<cuda::Event> spare_plain_events_;
  // What the driver's errors name: a stream's timing start, a Synchronize.
  const std::string timing_what_;
  const std::string sync_what_;
  std::vector<cuda::PinnedMemory> pinned_;
  // Mapped host memory regions (MapRegion).
  struct Region {
    uint8_t* addr = nullptr;
    uint64_t bytes = 0;
    bool registered = false;
  };
  absl::flat_hash_map<RegionId, Region> regions_;
  void DropRegion(Region& r, const std::string& what);
  bool registered_ = false;  // options_.staging_memory is page-locked
  absl::flat_hash_map<StreamId, std::unique_ptr<StreamState>> streams_;
  // The parts of SetComputeParts (executor thread): each tenant's green
  // context and the rest's (null when no SM is left for it); none: the
  // streams use the primary context.
  struct ComputeParts {
    absl::flat_hash_map<std::string, std::shared_ptr<cuda::GreenContext>> of_tenant;
    std::shared_ptr<cuda::GreenContext> rest;
  };
  std::optional<ComputeParts> parts_;
  cuda::Driver::PriorityRange priorities_;  // read at the start
  // Why the parts last asked for could not be made while the device had
  // none (a new worker): its streams are refused rather than made on every
  // SM, until parts are set again.
  absl::Status parts_refused_;
  // Why each stream that could not be made was not, for the operations
  // that name it (bounded by the streams named; gone with DestroyStream).
  absl::flat_hash_map<StreamId, absl::Status> unmade_streams_;
  absl::flat_hash_map<std::string, std::unique_ptr<LoadedModule>> modules_;
  absl::flat_hash_map<KernelId, KernelEntry*> kernels_;
  // Synchronizes waiting for their events, polled by the executor: a GPU
  // event is seen within microseconds this way, where a host function
  // (cuLaunchHostFunc) takes tens of them to run.
  struct EventWait {
    std::shared_ptr<cuda::Event> event;
    std::function<void(absl::Status)> fn;
    const std::string* what;  // the device's own, for its life
  };
  std::vector<EventWait> event_waits_;
  // Streams with launches watched (see Watched()).
  absl::flat_hash_set<StreamId> watched_;
  absl::Time last_watch_poll_ = absl::InfinitePast();  // watch_poll_every
  StreamId due_end_stream_ = 0;                        // 0: no end or watch is due
  // Since when it is due: a run's end is settled within kDueAtMost even
  // while the executor stays busy (another stream's held operations).
  absl::Time due_since_;
  static constexpr absl::Duration kDueAtMost = absl::Milliseconds(1);
  // The stream whose async launch ran last, with nothing run since: its
  // next launch is in a run (0: none).
  StreamId run_stream_ = 0;
  // Set by OnStop: held operations then fail instead of waiting.
  bool stopping_ = false;
  // Bytes of the operations held on all streams (executor thread).
  size_t held_bytes_ = 0;

  StagingPool staging_;

  std::atomic<bool> faulted_{false};
  mutable absl::Mutex fault_mu_;
  absl::Status fault_ ABSL_GUARDED_BY(fault_mu_);

  // Host tasks handed to the driver and not yet run (touched by driver
  // callback threads and the executor).
  absl::Mutex pending_mu_;
  absl::flat_hash_set<HostTask*> pending_ ABSL_GUARDED_BY(pending_mu_);

  std::atomic<uint32_t> modules_loaded_{0};
  std::atomic<uint64_t> module_loads_total_{0};
  std::atomic<uint64_t> launch_calls_{0};
  std::atomic<uint64_t> launch_call_ns_{0};
};

}  // namespace gpuexec::device

#endif  // GPUEXEC_SERVER_DEVICE_DEVICE_H_
