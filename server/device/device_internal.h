#ifndef GPUEXEC_SERVER_DEVICE_DEVICE_INTERNAL_H_
#define GPUEXEC_SERVER_DEVICE_DEVICE_INTERNAL_H_

// The Device's private state shared by its files (device.cc: its life and
// faults; device_streams.cc: streams, events and held work;
// device_watches.cc: the watches of launches and their runs;
// device_memory.cc: memory, regions and copies; device_launch.cc: modules,
// kernels and launches; device_graphs.cc: graphs). Only those files
// include it.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/device/device.h"

namespace gpuexec::device {

// A graph built on a stream (device_graphs.cc): the driver's graph and its
// instantiation, and each kernel node as last set, for the patches of
// later replays.
struct Device::GraphState {
  cuda::Graph graph;
  cuda::GraphExec exec;
  struct KernelNode {
    cuda::GraphNode node = nullptr;
    cuda::Function function = nullptr;
    port::LaunchGeometry geometry;
    std::vector<port::ParamInfo> layout;  // the kernel's
    std::string params;                   // the block it was last set from
  };
  absl::flat_hash_map<uint32_t, KernelNode> kernels;  // by node index
  // What a replay's watch and a fault name: its first kernel.
  KernelId kernel = 0;
};

struct Device::StreamState {
  // The green context the stream belongs to (null: the primary context);
  // declared first so that it outlives the stream.
  std::shared_ptr<cuda::GreenContext> part;
  cuda::Stream stream;
  // The last kernel launched on the stream since its last completed
  // Synchronize, and when: what a fault report names.
  // (Shared with the launch's watch: one copy of the name per launch.)
  std::shared_ptr<const std::string> last_launch;
  KernelId last_kernel = 0;
  GraphId last_graph = 0;  // set when the last launch was a graph's replay
  absl::Time last_launch_at;
  // Recorded before the first work after the last Synchronize; null when
  // no work was enqueued since.
  std::shared_ptr<cuda::Event> timing_start;
  // A stream whose session asked for no GPU time (port::StreamOwner::
  // untimed) records no timing events; its Synchronize reports the host's
  // view instead (Device::UntimedNs), on a steady clock: `busy_since`, when
  // its first work since the last Synchronize was queued (unset: none);
  // `work_count`, the work queued so far; `done_seen_at`, when the watches
  // saw done the launch that was the `done_seen_work`-th work; and
  // `charged_until`, where the last charged interval ended (pipelined
  // Synchronizes never charge a moment twice).
  using SteadyTime = std::chrono::steady_clock::time_point;
  bool untimed = false;
  std::optional<SteadyTime> busy_since;
  uint64_t work_count = 0;
  uint64_t done_seen_work = 0;
  SteadyTime done_seen_at;
  SteadyTime charged_until;
  // A timing event recorded right after the latest work since the last
  // Synchronize (a launch's watch, or its own), where a Synchronize's time
  // ends: the GPU time of the work, not of the wait for a Synchronize that
  // came later. Null when none was recorded after it. `work_end_passed`:
  // something untimed (an allocation's clearing, a free) was queued after
  // it, so a Synchronize waits on an event of its own.
  std::shared_ptr<cuda::Event> work_end;
  bool work_end_passed = false;
  // A timed stream's async launches in a run (Device::InRun: one after
  // another, nothing else between) record no timing event each (a timed
  // record costs the driver about 1 us more than a plain one): the end of
  // the run is due instead, and recorded once after its last launch,
  // before anything else runs on the executor and once nothing more is
  // posted to it (Device::SettleDueEnd). Their watches' events are plain.
  bool end_due = false;
  // The kernel time limit (zero: none) and the launches watched for it, in
  // stream order: each with an event recorded after it. The first one's
  // clock starts when the launch before it is seen done. `operator_limit`:
  // the operator's limit for it (port::StreamOwner::operator_limit_ms),
  // what launches sharing a watch may add up to.
  absl::Duration time_limit;
  absl::Duration operator_limit;
  struct Watch {
    // Its own event, or the Synchronize's end recorded right after it.
    std::shared_ptr<cuda::Event> done;
    std::shared_ptr<const std::string> what;
    // For a launch with nothing watched ahead of it: recorded just before
    // it, so that its clock starts when it can start (not while copies or
    // unwatched work ahead of it run). The stream's timing start when that
    // was recorded right before it.
    std::shared_ptr<cuda::Event> start;
    KernelId kernel = 0;
    GraphId graph = 0;
    uint64_t work = 0;  // the stream's work_count when it was queued
    // The launches it covers: this one and those of its run queued right
    // before it (DeviceOptions::launches_per_watch); its time limit is
    // theirs together.
    uint32_t launches = 1;
  };
  std::deque<Watch> watches;
  // Launches of a run queued after the newest watch and covered by none
  // yet (Device::Cover covers them once the run ends, or the next watch
  // does), and the start event of the first of them, if it had one.
  uint32_t uncovered = 0;
  std::shared_ptr<cuda::Event> uncovered_start;
  // Launches queued and not yet seen done: those the watches cover, and
  // the uncovered (what max_queued_launches bounds).
  size_t queued = 0;
  absl::Time head_since;
  absl::Time last_hung_report = absl::InfinitePast();
  // Operations that arrived behind a launch held by the bound on queued
  // launches (that launch first), in the order they arrived.
  struct Held {
    OpKind kind;
    size_t bytes;
    std::function<void()> op;
    std::function<void(absl::Status)> refuse;
  };
  std::deque<Held> held;
  // Its graphs, gone with it (shared with a DestroyGraph that waits for
  // the stream).
  absl::flat_hash_map<GraphId, std::shared_ptr<GraphState>> graphs;
};

struct Device::KernelEntry {
  cuda::Function function = nullptr;
  KernelInfo info;
  // The dynamic shared memory the kernel is opted in to so far.
  int dynamic_shared_limit = 0;
  // Opted in to clusters of more than 8 blocks.
  bool non_portable_clusters = false;
  // Blocks resident at once, by block, shared memory and cluster shape (the
  // most a cooperative launch may have); a few shapes, so bounded.
  absl::flat_hash_map<std::tuple<uint64_t, uint32_t, uint32_t, uint32_t, uint32_t>, uint64_t>
      co_resident;
};

struct Device::LoadedModule {
  cuda::Module module;
  absl::flat_hash_map<std::string, std::unique_ptr<KernelEntry>> kernels;
};

// A completion handed to the driver with cuLaunchHostFunc. Owned by the
// driver until the trampoline runs; if a fault fails it first, the
// trampoline only frees it.
struct Device::HostTask {
  Device* device;
  std::function<void(absl::Status)> fn;
};

// Every public operation of a Device runs its body on the executor.
// (A due end is recorded first: see StreamState::end_due.)
#define GPUEXEC_ON_EXECUTOR(...)       \
  executor_.Post([=, this]() mutable { \
    SettleDueEnd();                    \
    __VA_ARGS__                        \
  })

namespace internal {
// What a held operation is counted as, beside its parameters and name.
inline constexpr size_t kSmallOpBytes = 256;

// Where each parameter of `layout` lies in `block`, as the driver takes a
// launch's parameters.
inline absl::InlinedVector<void*, 16> ParamPointers(const std::vector<port::ParamInfo>& layout,
                                                    std::string& block) {
  absl::InlinedVector<void*, 16> params(layout.size());
  for (size_t i = 0; i < params.size(); ++i) params[i] = block.data() + layout[i].offset;
  return params;
}
}  // namespace internal

}  // namespace gpuexec::device

#endif  // GPUEXEC_SERVER_DEVICE_DEVICE_INTERNAL_H_
