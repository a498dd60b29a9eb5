#ifndef GPUEXEC_SERVER_WORKER_REMOTE_DEVICE_H_
#define GPUEXEC_SERVER_WORKER_REMOTE_DEVICE_H_

// One GPU as the daemon's front process sees it: a worker process that
// owns the device (see worker_main.h), started, watched and restarted from
// here. The front process never loads the driver.
//
// It is the core's port to the device (server/port/device_port.h), served
// by the worker's device::Device, and made safe across restarts:
//   * Stream and kernel ids are chosen here and outlive a worker: a new
//     worker gets its streams created, and its modules loaded again from the
//     images the sessions hold, lazily before the first operation that needs
//     them.
//   * Device memory does not outlive a worker: each restart raises the
//     port's epoch, so that no stale pointer ever reaches a new worker.
//
// A restart happens when the worker reports a sticky fault, when a launch
// runs past its stream's kernel time limit, when the worker stops
// answering, or when it dies. Operations in flight fail with ABORTED naming
// the device, the time and the reason; the reset listener hears of it (the
// core then marks that device's buffers lost). Quick successive restarts
// back off, up to 30 s.

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/port/device_port.h"
#include "server/port/staging.h"
#include "server/port/types.h"

namespace gpuexec::worker {

class Channel;
class Request;
class Reply;

struct WorkerOptions {
  // The program to start as the worker (gpuexecd itself).
  std::string program;
  // Which daemon of this process the worker serves (tests run several in
  // one process): LiveWorkerProcesses lists each daemon's own.
  uint64_t owner = 0;
  std::string driver_library = "libcuda.so.1";
  int ordinal = 0;
  // The tenant whose sessions this worker serves alone (empty: any); named
  // in its log lines.
  std::string tenant;
  uint64_t staging_bytes = 1 << 20;
  int staging_slots = 8;
  // Launches a stream may have queued on the GPU (see
  // device::DeviceOptions); 0: no bound.
  uint32_t max_queued_launches = 256;
  // Request bytes written to the worker's channel and not yet taken by it,
  // past which new requests fail with RESOURCE_EXHAUSTED (requests that
  // release something always go). 0: no bound.
  uint64_t queue_bytes = 64ull << 20;
  // The daemon's kernel time limit: the worker is also ended when it has
  // not answered a ping for this long plus 30 s.
  absl::Duration kernel_time_limit = absl::Seconds(60);
  std::string log_level = "info";
  std::string log_format = "text";  // the daemon's --log_format
  // How long the worker's executor, and the front's reader of its replies,
  // keep looking for the next message before they sleep (0: they sleep at
  // once).
  absl::Duration busy_poll = absl::ZeroDuration();
  // Requests and replies travel through shared-memory rings of this many
  // bytes each way (a power of two, at least 4096), polled while busy, and
  // the socket only tells each side that the other ended; 0: through the
  // socket.
  uint64_t ring_bytes = 1 << 20;
  // The device's streams take turns in the worker (DeviceOptions).
  bool stream_turns = true;
  // The worker reads requests on a thread of their own while its device's
  // thread has a backlog (request_reader.h; false, as gpuexecd's default:
  // that thread reads all).
  bool read_thread = false;
  // How long the first start may take.
  absl::Duration start_timeout = absl::Seconds(120);
  // NAME=value settings of the worker's environment, in place of the
  // daemon's own of those names (an MPS client's thread percentage and
  // pipe directory).
  std::vector<std::string> environment;
};

using port::DriverInfo;
using port::ResetInfo;

// A worker process of this front, from its start until the front sees its
// end (before it is reaped, so that a listed pid is never another's): for
// the metrics read at scrape time (process_* of each worker).
struct WorkerProcess {
  uint64_t owner = 0;  // WorkerOptions::owner
  pid_t pid = 0;
  int ordinal = 0;
  std::string tenant;  // empty: the device's shared worker
};
// The worker processes of `owner`'s RemoteDevices now. Thread safe; one may
// end right after.
std::vector<WorkerProcess> LiveWorkerProcesses(uint64_t owner);
// The CUDA driver version the last worker to start reported (0: none yet).
int ReportedDriverVersion();

class RemoteDevice final : public port::DevicePort {
 public:
  // Starts the device's worker and waits until it serves. Fails with the
  // worker's reason (no driver, no such device, ...); `info` is filled
  // whenever the driver loaded, even if the device did not open.
  static absl::StatusOr<std::unique_ptr<RemoteDevice>> Start(const WorkerOptions& options,
                                                             DriverInfo* info);
  // Ends the worker: closes its socket (it drains and exits), and kills it
  // if it has not exited within 10 s.
  ~RemoteDevice();

  // The port (server/port/device_port.h), served by the worker.
  int ordinal() const override { return options_.ordinal; }
  const port::DeviceProperties& properties() const override { return props_; }
  // Serving: the worker is up. False while it restarts.
  bool healthy() const override;
  absl::Status fault() const override;
  uint64_t epoch() const override;
  uint64_t resets() const override;
  std::optional<ResetInfo> last_reset() const override;
  // The process id of the current worker (0 while there is none).
  int worker_pid() const override;
  uint32_t modules_loaded() const override;
  uint64_t module_loads_total() const override { return module_loads_total_.load(); }
  port::StagingPool& staging() override { return staging_; }
  void SetListeners(std::function<void(const ResetInfo&)> on_reset,
                    std::function<void()> on_state) override;
  absl::Status LostError(uint64_t epoch, const std::string& what) const override;

  template <typename T>
  using Callback = port::Callback<T>;
  using Done = port::Done;
  using StreamId = port::StreamId;
  using DevicePtr = port::DevicePtr;
  using Allocation = port::Allocation;

  // The device's memory as its worker reports it. Never waits long for a
  // worker that does not answer (one stopped, or stuck in a driver call):
  // once a ping or an earlier query has gone unanswered for
  // kAnswerWithin, it answers at once with the last figure the worker gave
  // (zeros if none), and a query that waits that long is answered so too.
  // not_answering_since() then says since when.
  void QueryMemory(Callback<port::MemoryInfo> done) override;
  std::optional<absl::Time> not_answering_since() const override;
  // Request bytes written to the worker's channel and not yet taken.
  uint64_t unsent_bytes() const override;
  uint32_t pending_requests() const override;
  static constexpr absl::Duration kAnswerWithin = absl::Milliseconds(200);
  // Streams are created in the worker when first used; this only names one.
  StreamId CreateStream(absl::Duration kernel_time_limit, port::StreamOwner owner) override;
  void SetComputeParts(std::vector<port::ComputePart> parts, Done done) override;
  void DestroyStream(StreamId stream, Done done) override;
  void AfterQueued(StreamId stream, uint64_t epoch, std::string what, Done done) override;
  void Allocate(StreamId stream, uint64_t size, std::string what,
                Callback<Allocation> done) override;
  void Free(StreamId stream, DevicePtr ptr, uint64_t epoch, std::string what, Done done) override;
  void Memset(StreamId stream, DevicePtr ptr, uint64_t epoch, uint8_t value, uint64_t size,
              std::string what, Done done) override;
  void Copy(StreamId stream, DevicePtr dst, DevicePtr src, uint64_t epoch, uint64_t size,
            std::string what, Done done) override;
  void CopyToDevice(StreamId stream, DevicePtr dst, uint64_t epoch, port::StagingSlot slot,
                    uint64_t size, std::string what, Done done) override;
  void CopyToHost(StreamId stream, port::StagingSlot slot, DevicePtr src, uint64_t epoch,
                  uint64_t size, std::string what, Done done) override;
  void MapRegion(port::RegionId region, int fd, uint64_t bytes, std::string what,
                 port::Callback<uint64_t> done) override;
  void CopyRegion(StreamId stream, port::RegionId region, uint64_t offset, DevicePtr ptr,
                  uint64_t epoch, uint64_t size, bool to_device, std::string what,
                  Done done) override;
  void UnmapRegion(StreamId stream, port::RegionId region, uint64_t epoch, Done done) override;
  // The worker posts the stream's waiting successes itself until any of
  // its requests fails, in the worker or here (a request refused before it
  // was sent): from then on, no request carries an answer (remote_device_areas.cc).
  void MapAnswerArea(uint64_t area, StreamId stream, int fd, uint64_t offset, uint64_t bytes,
                     Done done) override;
  void UnmapAnswerArea(uint64_t area, Done done) override;
  void LoadModule(std::shared_ptr<const port::ModuleImage> image, std::string what,
                  Done done) override;
  void UnloadModule(const std::string& sha256) override;
  // The kernel's id is the same for every caller and every worker.
  void GetKernel(std::shared_ptr<const port::ModuleImage> image, std::string name, std::string what,
                 Callback<port::KernelInfo> done) override;
  void Launch(StreamId stream, port::LaunchOp op, uint64_t epoch, Done done) override;
  // If the device was reset since `work_epoch`, the answer is ABORTED with
  // the reset's reason (that work was lost).
  void Synchronize(StreamId stream, uint64_t work_epoch, Callback<uint64_t> gpu_ns) override;
  void SynchronizeAnswering(StreamId stream, uint64_t work_epoch,
                            std::shared_ptr<port::DirectAnswer> answer,
                            Callback<uint64_t> gpu_ns) override;
  // A Launch and a Synchronize of its stream right behind it, in one
  // request and one answer (the launch's failure, or the Synchronize's).
  void LaunchAndSynchronize(StreamId stream, port::LaunchOp op, uint64_t epoch, uint64_t work_epoch,
                            port::LaunchedAndSynchronized done) override;
  // Graphs: built, replayed and freed by the worker, on the stream. A
  // graph lives in the worker it was built in: one of an earlier epoch is
  // gone (its replay is ABORTED, its destruction answered at once).
  void BuildGraph(StreamId stream, port::GraphId graph, std::vector<port::GraphNodeOp> nodes,
                  uint64_t epoch, std::string what, Callback<port::GraphBuilt> done) override;
  void LaunchGraph(StreamId stream, port::GraphId graph, std::vector<port::GraphPatchOp> patches,
                   uint64_t epoch, std::string what, Done done) override;
  void DestroyGraph(StreamId stream, port::GraphId graph, uint64_t epoch, Done done) override;

 private:
  struct Connection;

  struct KernelRecord {
    std::string sha256;
    std::string name;
    std::weak_ptr<const port::ModuleImage> image;
    std::optional<port::KernelInfo> info;
  };
  enum class State { kStarting, kServing, kBackingOff, kStopping };
  // Called with the reply and the epoch of the worker that sent it (0 when
  // the call failed before reaching one).
  using ReplyFn = std::function<void(const Reply&, uint64_t epoch)>;

  explicit RemoteDevice(const WorkerOptions& options);
  // The table behind LiveWorkerProcesses() (worker_processes.cc).
  void ListWorker(pid_t pid) const;
  static void UnlistWorker(pid_t pid);
  static void NoteDriverVersion(int version);
  // "device 0", or "device 0 (worker of tenant 'a')", for the log.
  std::string Label() const;
  absl::Status Init();
  // Starts a worker process (on the monitor thread).
  void Spawn();
  void Monitor();
  // The monitor has work now: stop, or a worker to start.
  static bool MonitorDue(RemoteDevice* d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(d->mu_) {
    return d->stop_ || !d->deferred_.empty() ||
           (d->conn_ == nullptr && d->state_ == State::kBackingOff &&
            d->next_spawn_ <= absl::Now());
  }
  void ReadLoop(std::shared_ptr<Connection> conn);
  void OnMessage(const std::shared_ptr<Connection>& conn, std::string& frame);
  // `conn` (the current connection) is no longer current: retired, its
  // end time set; returns the replies it still owed, for the caller to fail.
  std::vector<ReplyFn> DetachLocked(const std::shared_ptr<Connection>& conn, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends `conn`'s worker (if it is still the current one) and starts over.
  // `kernel`: a kernel's fault or hang (not the worker's failure), with
  // the kernels it names and what they did (its `why` is ignored), and
  // `detail`, the worker's full text, for the log.
  void Reset(const std::shared_ptr<Connection>& conn, const std::string& why, bool kill,
             const ResetInfo* kernel = nullptr, const std::string& detail = "");

  // Sends `request` (prefixed by whatever the stream needs in this worker)
  // and calls `fn` with the reply, or with a failure if the request cannot
  // be sent or its worker ends first. `epoch` nonzero: the request names
  // device memory of that epoch; `work_epoch` nonzero: it needs the work
  // queued on its stream since that epoch (a Synchronize).
  // `pass_fd` (a MapRegion's memfd; the caller keeps and closes it) goes
  // on the worker's descriptor socket just before the request, under the
  // same lock, so that the worker finds it there when the request comes.
  void Call(Request& request, StreamId stream, uint64_t kernel, uint64_t epoch, ReplyFn fn,
            uint64_t work_epoch = 0, int pass_fd = -1) {
    Call(request, stream, absl::MakeConstSpan(&kernel, kernel != 0 ? 1 : 0), epoch, std::move(fn),
         work_epoch, pass_fd);
  }
  // The same for a request that names several kernels (a graph's).
  void Call(Request& request, StreamId stream, absl::Span<const uint64_t> kernels, uint64_t epoch,
            ReplyFn fn, uint64_t work_epoch = 0, int pass_fd = -1);
  // The requests that must go ahead of one on `stream` naming `kernel` in
  // the current worker: the stream's creation, the module's image and (when
  // `resolve`) the kernel's resolution.
  void PrepareLocked(StreamId stream, uint64_t kernel, bool resolve, std::vector<Request>* prefix)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status NotServingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static absl::Status StatusOf(const Reply& reply);
  // A reply handler that passes the reply's status to `done`.
  static ReplyFn StatusTo(Done done);
  // One that passes the reply's value, or its failure.
  static ReplyFn ValueTo(Callback<uint64_t> done);

  const WorkerOptions options_;
  port::DeviceProperties props_;
  DriverInfo driver_info_;
  int staging_fd_ = -1;
  uint8_t* staging_memory_ = nullptr;
  port::StagingPool staging_;

  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kStarting;
  std::shared_ptr<Connection> conn_ ABSL_GUARDED_BY(mu_);
  absl::Status start_status_ ABSL_GUARDED_BY(mu_);  // of the first start
  bool first_ready_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status down_ ABSL_GUARDED_BY(mu_);  // why not serving
  // New workers of this reset that the MPS server did not take yet.
  int not_ready_waits_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time not_ready_since_ ABSL_GUARDED_BY(mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t resets_ ABSL_GUARDED_BY(mu_) = 0;
  // The resets whose listener has run (the sessions they ended are closed):
  // what resets() tells, so that a reset seen counted is one a session's
  // next call hears of.
  uint64_t resets_told_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<ResetInfo> last_reset_ ABSL_GUARDED_BY(mu_);
  std::vector<ResetInfo> history_ ABSL_GUARDED_BY(mu_);  // the last 64
  absl::Time reset_at_ ABSL_GUARDED_BY(mu_);
  absl::Time ready_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int quick_failures_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time next_spawn_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, ReplyFn> pending_ ABSL_GUARDED_BY(mu_);
  // Streams with an answer area in the current worker: true once one of
  // their requests was refused here (its answers then all come this way).
  absl::flat_hash_map<StreamId, bool> answer_streams_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, StreamId> answer_areas_ ABSL_GUARDED_BY(mu_);  // area -> stream
  // Per worker: the streams created, the modules loaded, the kernels
  // resolved in it.
  absl::flat_hash_set<StreamId> live_streams_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> live_modules_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint64_t> live_kernels_ ABSL_GUARDED_BY(mu_);
  // For all workers: streams and their time limits, kernels and their ids.
  struct StreamSpec {
    absl::Duration time_limit;
    port::StreamOwner owner;
  };
  absl::flat_hash_map<StreamId, StreamSpec> streams_ ABSL_GUARDED_BY(mu_);
  // The compute parts last set, and whether this worker has them (a new
  // worker is sent them before its first stream).
  std::vector<port::ComputePart> parts_ ABSL_GUARDED_BY(mu_);
  bool parts_live_ ABSL_GUARDED_BY(mu_) = true;
  StreamId next_stream_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, KernelRecord> kernels_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint64_t> kernel_ids_ ABSL_GUARDED_BY(mu_);
  uint64_t next_kernel_ ABSL_GUARDED_BY(mu_) = 1;
  // Heartbeat: when the oldest unanswered ping was sent.
  absl::Time ping_sent_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool ping_out_ ABSL_GUARDED_BY(mu_) = false;
  // Memory queries: the last answer, and the ones still waiting for theirs
  // (each answered once, by the worker or from `memory_` when it is late).
  struct MemoryQuery {
    absl::Time asked;
    Callback<port::MemoryInfo> done;
  };
  port::MemoryInfo memory_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, MemoryQuery> memory_queries_ ABSL_GUARDED_BY(mu_);
  uint64_t next_memory_query_ ABSL_GUARDED_BY(mu_) = 1;
  // When the worker began not to answer within kAnswerWithin (a ping or a
  // memory query), or nullopt.
  std::optional<absl::Time> NotAnsweringSinceLocked(absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::function<void(const ResetInfo&)> listener_ ABSL_GUARDED_BY(mu_);
  std::function<void()> state_listener_ ABSL_GUARDED_BY(mu_);
  // Workers ended and not yet reaped (their reader threads).
  std::vector<std::shared_ptr<Connection>> retired_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Completions of calls that failed before reaching a worker. Callers may
  // hold locks their completions take (a session's), so these never run on
  // the caller's thread: the monitor thread runs them.
  std::vector<std::function<void()>> deferred_ ABSL_GUARDED_BY(mu_);
  void Defer(std::function<void()> fn);

  std::atomic<uint64_t> module_loads_total_{0};
  std::thread monitor_;
};

}  // namespace gpuexec::worker

#endif  // GPUEXEC_SERVER_WORKER_REMOTE_DEVICE_H_
