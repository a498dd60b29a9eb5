#ifndef GPUEXEC_TESTS_SUPPORT_FAKE_PORT_H_
#define GPUEXEC_TESTS_SUPPORT_FAKE_PORT_H_

// A device port (server/port/device_port.h) in the test's own process, for
// testing the core without starting workers or loading a driver:
//   * Device memory is host memory: a DevicePtr is the address of a block
//     this port allocated, and every operation checks that its range lies
//     inside a live block (else INTERNAL, naming the operation: the core
//     must never let a bad pointer through).
//   * Kernels are host functions the test registers by name; a module image
//     is the test double's format ("GXFAKE1\n" and a kernel name per line),
//     and GetKernel finds only the kernels its image names.
//   * Completions run on the port's own thread, in the order the operations
//     were made, never on the caller's (as a worker's answers come).
//   * Reset() is a device reset: memory is gone, the epoch rises, the reset
//     listener hears of it, and operations that name memory of an earlier
//     epoch fail with LostError's status. A kernel that returns an error
//     resets the device so, naming the kernel as a worker does: by its
//     stream and id, with the CUresult its error names (the reason text
//     names no kernel).

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
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/port/device_port.h"

namespace gpuexec::testing {

class FakePort final : public port::DevicePort {
 public:
  struct Options {
    int ordinal = 0;
    uint64_t memory_bytes = 1ull << 30;
    uint64_t staging_bytes = 64 << 10;
    int staging_slots = 4;
    int cc_major = 9;  // compute capability 9.0 (an H200's)
  };
  // A kernel: reads its parameters from the packed block and may touch the
  // memory they point at (through `memory`, which checks the range).
  struct KernelContext {
    const port::LaunchOp& op;
    // Host address of [ptr, ptr + size) of live device memory, or null.
    std::function<uint8_t*(port::DevicePtr ptr, uint64_t size)> memory;
  };
  using KernelFn = std::function<absl::Status(const KernelContext&)>;

  explicit FakePort(const Options& options);
  ~FakePort() override;

  // Test controls. Thread-safe.
  void AddKernel(const std::string& name, std::vector<port::ParamInfo> params, KernelFn fn);
  // `name`(u32* out, u32 value, u64 n): out[i] = value for i < n; fails
  // out of bounds.
  void AddFillKernel(const std::string& name);
  void Reset(const std::string& why);
  // The next memory query finds the device faulted (as a worker finds that
  // another MPS client's fatal fault reached it): it resets with `why`.
  void FaultAtNextQuery(const std::string& why);
  // What the port saw.
  uint64_t memory_queries() const;
  uint64_t bytes_allocated() const;
  size_t live_allocations() const;
  size_t live_streams() const;
  std::vector<std::string> unloaded_modules() const;
  std::vector<port::LaunchOp> launches() const;
  // Runs on the port's thread once everything posted before it has run.
  void Drain();

  // The port.
  int ordinal() const override { return options_.ordinal; }
  const port::DeviceProperties& properties() const override { return props_; }
  bool healthy() const override { return true; }
  absl::Status fault() const override { return absl::OkStatus(); }
  uint64_t epoch() const override;
  uint64_t resets() const override;
  std::optional<port::ResetInfo> last_reset() const override;
  int worker_pid() const override { return 0; }
  uint32_t modules_loaded() const override;
  uint64_t module_loads_total() const override;
  port::StagingPool& staging() override { return staging_; }
  void SetListeners(std::function<void(const port::ResetInfo&)> on_reset,
                    std::function<void()> on_state) override;
  absl::Status LostError(uint64_t epoch, const std::string& what) const override;
  void QueryMemory(port::Callback<port::MemoryInfo> done) override;
  std::optional<absl::Time> not_answering_since() const override { return std::nullopt; }
  uint64_t unsent_bytes() const override { return 0; }
  // Operations posted to the port's thread that have not run yet.
  uint32_t pending_requests() const override;
  port::StreamId CreateStream(absl::Duration kernel_time_limit, port::StreamOwner owner) override;
  // Records the parts (compute_parts()); streams take no part of them here.
  void SetComputeParts(std::vector<port::ComputePart> parts, port::Done done) override;
  std::vector<port::ComputePart> compute_parts() const;
  // The tenant each stream was named for, by stream.
  // Whose each stream made so far was, in the order they were made.
  std::vector<port::StreamOwner> stream_owners() const;
  void DestroyStream(port::StreamId stream, port::Done done) override;
  void AfterQueued(port::StreamId stream, uint64_t epoch, std::string what,
                   port::Done done) override;
  void Allocate(port::StreamId stream, uint64_t size, std::string what,
                port::Callback<port::Allocation> done) override;
  void Free(port::StreamId stream, port::DevicePtr ptr, uint64_t epoch, std::string what,
            port::Done done) override;
  void Memset(port::StreamId stream, port::DevicePtr ptr, uint64_t epoch, uint8_t value,
              uint64_t size, std::string what, port::Done done) override;
  void Copy(port::StreamId stream, port::DevicePtr dst, port::DevicePtr src, uint64_t epoch,
            uint64_t size, std::string what, port::Done done) override;
  void CopyToDevice(port::StreamId stream, port::DevicePtr dst, uint64_t epoch,
                    port::StagingSlot slot, uint64_t size, std::string what,
                    port::Done done) override;
  void CopyToHost(port::StreamId stream, port::StagingSlot slot, port::DevicePtr src,
                  uint64_t epoch, uint64_t size, std::string what, port::Done done) override;
  void LoadModule(std::shared_ptr<const port::ModuleImage> image, std::string what,
                  port::Done done) override;
  void MapRegion(port::RegionId region, int fd, uint64_t bytes, std::string what,
                 port::Callback<uint64_t> done) override;
  void CopyRegion(port::StreamId stream, port::RegionId region, uint64_t offset,
                  port::DevicePtr ptr, uint64_t epoch, uint64_t size, bool to_device,
                  std::string what, port::Done done) override;
  void UnmapRegion(port::StreamId stream, port::RegionId region, uint64_t epoch,
                   port::Done done) override;
  // The test port posts no answer itself: every answer goes through the
  // front, as where a worker could not map the area.
  void MapAnswerArea(uint64_t, port::StreamId, int, uint64_t, uint64_t, port::Done done) override {
    done(absl::FailedPreconditionError("the test port posts no answers itself"));
  }
  void UnmapAnswerArea(uint64_t, port::Done done) override { done(absl::OkStatus()); }
  // Regions mapped now.
  size_t regions_mapped() const;
  void UnloadModule(const std::string& sha256) override;
  void GetKernel(std::shared_ptr<const port::ModuleImage> image, std::string name, std::string what,
                 port::Callback<port::KernelInfo> done) override;
  void Launch(port::StreamId stream, port::LaunchOp op, uint64_t epoch, port::Done done) override;
  void Synchronize(port::StreamId stream, uint64_t work_epoch,
                   port::Callback<uint64_t> gpu_ns) override;
  void LaunchAndSynchronize(port::StreamId stream, port::LaunchOp op, uint64_t epoch,
                            uint64_t work_epoch, port::LaunchedAndSynchronized done) override;
  // Graphs (fake_port_graphs.cc): a graph is its nodes as built; a replay
  // applies its patches to them, then runs them in order as a launch, a
  // memset and a copy run here. Graphs go with a reset.
  void BuildGraph(port::StreamId stream, port::GraphId graph, std::vector<port::GraphNodeOp> nodes,
                  uint64_t epoch, std::string what, port::Callback<port::GraphBuilt> done) override;
  void LaunchGraph(port::StreamId stream, port::GraphId graph,
                   std::vector<port::GraphPatchOp> patches, uint64_t epoch, std::string what,
                   port::Done done) override;
  void DestroyGraph(port::StreamId stream, port::GraphId graph, uint64_t epoch,
                    port::Done done) override;
  // Graphs built and not destroyed; replays run.
  size_t live_graphs() const;
  uint64_t graph_launches() const;

 private:
  struct Kernel {
    std::vector<port::ParamInfo> params;
    KernelFn fn;
  };
  // Runs `op` on the port's thread, after everything posted before it.
  void Post(std::function<void()> op);
  void Loop();
  // The status of an operation on memory of `epoch` (named `what`).
  absl::Status EpochCheck(uint64_t epoch, const std::string& what) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint8_t* MemoryLocked(port::DevicePtr ptr, uint64_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RunLaunch(port::StreamId stream, port::LaunchOp& op, uint64_t epoch);
  // `kernel`: a kernel's fault, with the facts it names (its `why` is
  // ignored).
  void ResetLocked(const std::string& why, std::vector<std::function<void()>>* after,
                   const port::ResetInfo* kernel = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  port::DeviceProperties props_;
  port::StagingPool staging_;
  std::vector<std::unique_ptr<uint8_t[]>> staging_memory_;

  mutable absl::Mutex mu_;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t resets_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<port::ResetInfo> last_reset_ ABSL_GUARDED_BY(mu_);
  std::optional<std::string> fault_at_query_ ABSL_GUARDED_BY(mu_);
  uint64_t memory_queries_ ABSL_GUARDED_BY(mu_) = 0;
  // Live blocks by address, with their sizes.
  std::map<port::DevicePtr, std::unique_ptr<uint8_t[]>> blocks_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<port::DevicePtr, uint64_t> sizes_ ABSL_GUARDED_BY(mu_);
  uint64_t allocated_ ABSL_GUARDED_BY(mu_) = 0;
  port::StreamId next_stream_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<port::StreamId, bool> streams_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Kernel> kernels_ ABSL_GUARDED_BY(mu_);
  // Kernel ids handed out, by module and name.
  std::map<std::pair<std::string, std::string>, port::KernelId> kernel_ids_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<port::KernelId, std::string> kernel_names_ ABSL_GUARDED_BY(mu_);
  struct Graph {
    uint64_t epoch = 0;
    std::vector<port::GraphNodeOp> nodes;
  };
  absl::flat_hash_map<port::GraphId, Graph> graphs_ ABSL_GUARDED_BY(mu_);
  uint64_t graph_launches_ ABSL_GUARDED_BY(mu_) = 0;
  // Runs a memset or copy node (under mu_): INTERNAL outside live memory.
  absl::Status RunMemoryNodeLocked(const port::GraphNodeOp& node)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::flat_hash_map<std::string, bool> modules_ ABSL_GUARDED_BY(mu_);
  uint64_t module_loads_ ABSL_GUARDED_BY(mu_) = 0;
  // Mapped regions: address and size (a reset unmaps them).
  absl::flat_hash_map<port::RegionId, std::pair<uint8_t*, uint64_t>> regions_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> unloaded_ ABSL_GUARDED_BY(mu_);
  std::vector<port::LaunchOp> launches_ ABSL_GUARDED_BY(mu_);
  std::vector<port::ComputePart> parts_ ABSL_GUARDED_BY(mu_);
  std::vector<port::StreamOwner> stream_owners_ ABSL_GUARDED_BY(mu_);
  std::function<void(const port::ResetInfo&)> on_reset_ ABSL_GUARDED_BY(mu_);

  mutable absl::Mutex queue_mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(queue_mu_);
  bool stopping_ ABSL_GUARDED_BY(queue_mu_) = false;
  std::thread thread_;
};

}  // namespace gpuexec::testing

#endif  // GPUEXEC_TESTS_SUPPORT_FAKE_PORT_H_
