#ifndef GPUEXEC_SERVER_PORT_DEVICE_PORT_H_
#define GPUEXEC_SERVER_PORT_DEVICE_PORT_H_

// One GPU as the daemon's core sees it: operations in, completions out,
// over ids the core chooses, with no driver handle anywhere. The daemon's
// implementation is the proxy of a device's worker process
// (worker::RemoteDevice); tests give the core a port of their own.
//
// Device memory does not outlive a reset of the device. Each reset raises
// the port's epoch; an allocation answers with the epoch it belongs to, and
// every operation that names device memory carries the epoch its caller
// checked, so that a stale pointer never reaches the device again: such an
// operation fails with LostError's status.
//
// Completions run on no particular thread, with no lock of the port held;
// they must be cheap and must not wait on the port.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/port/staging.h"
#include "server/port/types.h"

namespace gpuexec::port {

// What the first device to start found of the driver.
struct DriverInfo {
  int driver_version = 0;
  int device_count = 0;
  bool test_double = false;
  // The driver can cut a device's SMs into green contexts (CUDA 12.5+).
  bool green_contexts = false;
};

// A reset. `why` names no kernel and no session (every session the reset
// reaches may read it); which kernels it names, and what they did, come as
// facts of their own, for the core to charge and to tell each reader its
// own part.
struct ResetInfo {
  int device = 0;
  uint64_t epoch = 0;  // the new epoch
  absl::Time at;
  std::string why;
  // A kernel's fault or hang (not the worker's own failure).
  bool kernel_caused = false;
  // A fault: every kernel in flight then (the driver does not say which
  // one faulted); a hang: the one that ran past its limit.
  std::vector<ResetKernel> kernels;
  bool hang = false;
  std::string result;     // a fault's CUresult name, where known
  uint64_t limit_ms = 0;  // a hang's time limit
  uint64_t ran_ms = 0;    // and how long it had run
  // The launches that limit was for, added (a run's launches watched
  // together); the hung kernel may be any of them.
  uint32_t launches = 1;
};

struct Allocation {
  DevicePtr ptr = 0;
  uint64_t epoch = 0;
};

class DevicePort {
 public:
  virtual ~DevicePort() = default;

  virtual int ordinal() const = 0;
  virtual const DeviceProperties& properties() const = 0;
  // Serving now (false while it restarts).
  virtual bool healthy() const = 0;
  // Why the device is not serving (OK when it is).
  virtual absl::Status fault() const = 0;
  virtual uint64_t epoch() const = 0;
  virtual uint64_t resets() const = 0;
  virtual std::optional<ResetInfo> last_reset() const = 0;
  // The process serving the device (0 while there is none, or no process).
  virtual int worker_pid() const = 0;
  virtual uint32_t modules_loaded() const = 0;
  virtual uint64_t module_loads_total() const = 0;
  // The staging buffers every host<->device copy of the device streams
  // through.
  virtual StagingPool& staging() = 0;
  // `on_reset` after each reset, `on_state` whenever the device starts or
  // stops serving.
  virtual void SetListeners(std::function<void(const ResetInfo&)> on_reset,
                            std::function<void()> on_state) = 0;
  // The error for device memory of `epoch` once the device was reset.
  virtual absl::Status LostError(uint64_t epoch, const std::string& what) const = 0;

  // The device's memory; never waits long on a device that does not answer
  // (it answers with the last figures then; not_answering_since says since
  // when).
  virtual void QueryMemory(Callback<MemoryInfo> done) = 0;
  virtual std::optional<absl::Time> not_answering_since() const = 0;
  // Request bytes the device has not taken yet.
  virtual uint64_t unsent_bytes() const = 0;
  // Requests sent to the device and not yet answered.
  virtual uint32_t pending_requests() const = 0;

  // Cuts the device's SMs into `parts` and a rest (green contexts) for the
  // streams named after it: a stream of a tenant with a part runs on its
  // part's SMs alone, any other on the rest's. Streams named before keep
  // what they had; a device that restarts cuts itself by the parts last
  // set. Empty: no parts (every stream may use every SM). `done` once the
  // device has cut itself, or with why it cannot (and keeps what it had).
  virtual void SetComputeParts(std::vector<ComputePart> parts, Done done) = 0;
  // Names a stream of `owner`; it is made on the device when first used.
  virtual StreamId CreateStream(absl::Duration kernel_time_limit, StreamOwner owner) = 0;
  virtual void DestroyStream(StreamId stream, Done done) = 0;
  // `done` once everything queued on `stream` has finished; `epoch`: of
  // the buffer the caller will copy (0: none).
  virtual void AfterQueued(StreamId stream, uint64_t epoch, std::string what, Done done) = 0;
  // Allocates zero-filled memory in stream order.
  virtual void Allocate(StreamId stream, uint64_t size, std::string what,
                        Callback<Allocation> done) = 0;
  virtual void Free(StreamId stream, DevicePtr ptr, uint64_t epoch, std::string what,
                    Done done) = 0;
  virtual void Memset(StreamId stream, DevicePtr ptr, uint64_t epoch, uint8_t value, uint64_t size,
                      std::string what, Done done) = 0;
  virtual void Copy(StreamId stream, DevicePtr dst, DevicePtr src, uint64_t epoch, uint64_t size,
                    std::string what, Done done) = 0;
  // `done` when the copy has finished (the slot may be reused then).
  virtual void CopyToDevice(StreamId stream, DevicePtr dst, uint64_t epoch, StagingSlot slot,
                            uint64_t size, std::string what, Done done) = 0;
  // `done` when the bytes are in the slot.
  virtual void CopyToHost(StreamId stream, StagingSlot slot, DevicePtr src, uint64_t epoch,
                          uint64_t size, std::string what, Done done) = 0;
  // Host memory regions: a same-host client's memfd, mapped by the device's
  // process and page-locked once. `fd` is taken (closed on every path; the
  // caller checked it: a sealed memfd of `bytes`). The id is the caller's,
  // unique among the device's live regions; `done` with the epoch the
  // region belongs to (it goes with a reset, as device memory does).
  virtual void MapRegion(RegionId region, int fd, uint64_t bytes, std::string what,
                         Callback<uint64_t> done) = 0;
  // Copies `size` bytes between `offset` of a mapped region and device
  // memory at `ptr`, in stream order; `done` once the copy has finished.
  // `epoch`: of the region and of the memory at `ptr` alike.
  virtual void CopyRegion(StreamId stream, RegionId region, uint64_t offset, DevicePtr ptr,
                          uint64_t epoch, uint64_t size, bool to_device, std::string what,
                          Done done) = 0;
  // Unpins and unmaps the region once the work queued on `stream` before it
  // has finished (a region of an earlier epoch is gone already).
  virtual void UnmapRegion(StreamId stream, RegionId region, uint64_t epoch, Done done) = 0;
  // Maps a command ring's answer area (`bytes` at `offset` of the ring's
  // memfd `fd`, which the caller checked and keeps) where the device may
  // post the successes of `stream`'s waiting commands (LaunchOp::answer).
  // `area` is the caller's id, unique among the device's live areas. A
  // failure only means no answer is posted there. Gone with a reset.
  virtual void MapAnswerArea(uint64_t area, StreamId stream, int fd, uint64_t offset,
                             uint64_t bytes, Done done) = 0;
  virtual void UnmapAnswerArea(uint64_t area, Done done) = 0;
  virtual void LoadModule(std::shared_ptr<const ModuleImage> image, std::string what,
                          Done done) = 0;
  virtual void UnloadModule(const std::string& sha256) = 0;
  // The kernel's id is the same for every caller.
  virtual void GetKernel(std::shared_ptr<const ModuleImage> image, std::string name,
                         std::string what, Callback<KernelInfo> done) = 0;
  // `epoch`: of the buffers in the parameters (0 when none).
  virtual void Launch(StreamId stream, LaunchOp op, uint64_t epoch, Done done) = 0;
  // `work_epoch`: of the oldest work queued on the stream since its last
  // Synchronize (0: none); ABORTED with the reset's reason if the device
  // was reset since.
  virtual void Synchronize(StreamId stream, uint64_t work_epoch, Callback<uint64_t> gpu_ns) = 0;
  // The same, where the device may post the success in a command ring's
  // answer area itself (`answer->posted` is set before `gpu_ns` runs). A
  // device that posts none answers as Synchronize.
  virtual void SynchronizeAnswering(StreamId stream, uint64_t work_epoch,
                                    std::shared_ptr<DirectAnswer> answer,
                                    Callback<uint64_t> gpu_ns) {
    (void)answer;
    Synchronize(stream, work_epoch, std::move(gpu_ns));
  }
  virtual void LaunchAndSynchronize(StreamId stream, LaunchOp op, uint64_t epoch,
                                    uint64_t work_epoch, LaunchedAndSynchronized done) = 0;
  // Builds graph `graph` of `stream` from `nodes` (none empty; the kernels
  // loaded), instantiates it and uploads it to `stream`, in stream order
  // with the work queued before. `epoch`: of the buffers the nodes use.
  // FAILED_PRECONDITION where the driver has no graphs.
  virtual void BuildGraph(StreamId stream, GraphId graph, std::vector<GraphNodeOp> nodes,
                          uint64_t epoch, std::string what, Callback<GraphBuilt> done) = 0;
  // Applies `patches` to the graph's kernel nodes, then launches it on
  // `stream` after the work queued before; the time limit, the watchdog and
  // the GPU time treat the replay as one launch. `done` once enqueued.
  virtual void LaunchGraph(StreamId stream, GraphId graph, std::vector<GraphPatchOp> patches,
                           uint64_t epoch, std::string what, Done done) = 0;
  // Frees the graph once the work queued on `stream` before has finished
  // (a graph of an earlier epoch is gone already).
  virtual void DestroyGraph(StreamId stream, GraphId graph, uint64_t epoch, Done done) = 0;
};

// Opens device `ordinal` for the sessions of `tenant` alone (empty: for any
// session); the first one opened also fills `info` (whenever the driver
// loaded, even if the device did not open). The daemon's starts a worker
// process each time: separate ports of one device are separate address
// spaces, and a fault in one resets that one only.
using DevicePortFactory = std::function<absl::StatusOr<std::unique_ptr<DevicePort>>(
    int ordinal, const std::string& tenant, DriverInfo* info)>;

}  // namespace gpuexec::port

#endif  // GPUEXEC_SERVER_PORT_DEVICE_PORT_H_
