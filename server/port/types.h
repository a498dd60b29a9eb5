#ifndef GPUEXEC_SERVER_PORT_TYPES_H_
#define GPUEXEC_SERVER_PORT_TYPES_H_

// The vocabulary of a device that the daemon's front process and a device's
// worker share: ids, properties, kernels and launches as plain values. No
// driver handle appears here (the driver's declarations live in
// server/cuda only), so the front process can name everything it asks of
// a device without linking anything that could load the driver.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gpuexec::port {

using DevicePtr = uint64_t;

struct DeviceProperties {
  int ordinal = 0;
  std::string name;
  int cc_major = 0;
  int cc_minor = 0;
  uint64_t total_memory = 0;
  int multiprocessors = 0;
  int max_threads_per_block = 0;
  int max_block[3] = {0, 0, 0};
  int max_grid[3] = {0, 0, 0};
  int max_shared_per_block = 0;        // without opt-in (48 KiB)
  int max_shared_per_block_optin = 0;  // with opt-in
  bool cluster_launch = false;
  bool memory_pools = false;
};

struct MemoryInfo {
  uint64_t free = 0;
  uint64_t total = 0;
};

struct ParamInfo {
  uint64_t offset = 0;
  uint64_t size = 0;
};

struct FunctionAttributes {
  int num_registers = 0;
  int static_shared_bytes = 0;
  int const_bytes = 0;
  int local_bytes = 0;
  int max_threads_per_block = 0;
  int max_dynamic_shared_bytes = 0;
  int ptx_version = 0;
  int binary_version = 0;
};

struct LaunchGeometry {
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned cluster[3] = {0, 0, 0};  // all zero: no cluster
  unsigned shared_bytes = 0;
  // Launch attributes: the whole grid resident at once; programmatic
  // dependent launch (may start before the stream's previous kernel ends);
  // cluster sizes above 8 allowed; the cluster scheduling policy (0 default,
  // 1 spread, 2 load balancing: CUclusterSchedulingPolicy's values).
  bool cooperative = false;
  bool programmatic_dependent = false;
  bool non_portable_cluster = false;
  unsigned cluster_policy = 0;
};

// A tensor map (CUtensorMap, kTensorMapBytes) the device encodes into a
// launch's parameter block, checked by the core. The enumerations carry
// the driver's values (CUtensorMapDataType, ...Interleave, ...Swizzle,
// ...L2promotion, ...FloatOOBfill); dimensions run innermost first.
inline constexpr int kMaxTensorRank = 5;
inline constexpr uint64_t kTensorMapBytes = 128;
struct TensorMapEncoding {
  uint64_t param_offset = 0;  // where its 128 bytes go in the block
  uint32_t param_index = 0;   // for messages
  DevicePtr address = 0;
  uint32_t data_type = 0;
  uint32_t rank = 0;
  uint64_t dims[kMaxTensorRank] = {0, 0, 0, 0, 0};
  uint64_t strides[kMaxTensorRank - 1] = {0, 0, 0, 0};  // bytes, dims 1..rank-1
  uint32_t box[kMaxTensorRank] = {0, 0, 0, 0, 0};
  uint32_t element_strides[kMaxTensorRank] = {1, 1, 1, 1, 1};
  uint32_t interleave = 0;
  uint32_t swizzle = 0;
  uint32_t l2_promotion = 0;
  uint32_t oob_fill = 0;
};

// A tenant's part of a device's SMs (a compute share), by the SMs it keeps.
struct ComputePart {
  std::string tenant;
  uint32_t sms = 0;
  bool operator==(const ComputePart& o) const { return tenant == o.tenant && sms == o.sms; }
};

// Whose a stream is: the tenant whose part of the SMs it runs on, and
// whether its work yields to the others' (the tenant's priority is LOW).
struct StreamOwner {
  std::string tenant;
  bool low_priority = false;
  // A named tenant's stream: its work shares the tenant's turns in a
  // worker that tenants share (device::TurnKeys); false (the implicit
  // tenant's), the session takes turns of its own.
  bool shares_turns = false;
  // The session asked not to be timed on the GPU: its work is queued
  // without timing events, and a Synchronize reports the host's view of
  // the stream's busy time instead (the front accounts it and tells the
  // caller 0).
  bool untimed = false;
  // The operator's kernel time limit for the stream (the daemon's and its
  // tenant's, whichever is lower; 0: none), however much lower the session
  // asked for: what the limits of launches sharing a watch may add up to
  // (device::DeviceOptions::launches_per_watch).
  uint64_t operator_limit_ms = 0;
};

// Streams and kernels are named by ids the front process chooses.
using StreamId = uint64_t;
using KernelId = uint64_t;
using RegionId = uint64_t;  // a host memory region, named by the core

template <typename T>
using Callback = std::function<void(absl::StatusOr<T>)>;
using Done = std::function<void(absl::Status)>;

// A module image as the device needs it: its id (SHA-256) and bytes.
struct ModuleImage {
  std::string sha256;
  std::string bytes;
  bool is_ptx = false;
  // The kernel names the bytes define (core::ListKernels), read once when
  // the image is stored: listed by LoadModule and by a GetFunction that
  // names none of them.
  std::vector<std::string> kernels;
};

struct KernelInfo {
  KernelId id = 0;
  std::vector<ParamInfo> params;
  FunctionAttributes attributes;
  // Bytes of the packed parameter block (end of the last parameter).
  uint64_t param_bytes = 0;
};

// Where a waiting command's success may be posted by the device itself: a
// command ring's answer area (gpuexec/command_ring.h, kAnswerArea), mapped
// with DevicePort::MapAnswerArea. The caller keeps it; `posted` is set
// before the command's callback runs.
struct DirectAnswer {
  uint64_t area = 0;     // MapAnswerArea's id
  uint64_t id = 0;       // the ring record's id,
  uint64_t seq = 0;      // seq
  uint16_t kind = 0;     // and kind
  bool untimed = false;  // posts 0 for the GPU time
  bool posted = false;   // the success was posted there: answer nothing
};

struct LaunchOp {
  KernelId kernel = 0;
  LaunchGeometry geometry;
  // The parameters packed at the offsets of KernelInfo::params.
  std::string param_block;
  // Tensor maps the device encodes into param_block before the launch.
  std::vector<TensorMapEncoding> tensor_maps;
  std::string what;  // names the function and session in errors
  // A LaunchAndSynchronize's: where its success may be posted (none: not).
  std::shared_ptr<DirectAnswer> answer;
};

// Graphs: a session's recorded launches, memsets and copies, built on the
// device as one CUDA graph and replayed in one launch. Ids are the front's,
// unique among a device's live graphs.
using GraphId = uint64_t;

// A kernel a reset names, as the device knows it: the stream it was
// launched on and its id, both the core's (the core knows whose they are).
struct ResetKernel {
  StreamId stream = 0;
  KernelId kernel = 0;
  // Set when the work was a graph's replay: the kernel is then its first
  // kernel node's, and the driver does not say which node ran.
  GraphId graph = 0;
};

struct GraphMemset {
  DevicePtr ptr = 0;
  uint8_t value = 0;
  uint64_t size = 0;
};

struct GraphCopy {
  DevicePtr dst = 0;
  DevicePtr src = 0;
  uint64_t size = 0;
};

// One node of a graph. Nodes run in the order recorded: each depends on the
// one before, as work on a stream does.
struct GraphNodeOp {
  std::variant<LaunchOp, GraphMemset, GraphCopy> op;
  std::string what;  // names the node's command in errors
};

struct GraphBuilt {
  uint32_t nodes = 0;
  uint64_t instantiate_ns = 0;  // building, instantiating and uploading it
};

// New arguments of a kernel node (its index among the graph's nodes), for
// the replay that carries it and every one after it: the whole parameter
// block packed anew, as LaunchOp::param_block, and its tensor maps.
struct GraphPatchOp {
  uint32_t node = 0;
  std::string param_block;
  std::vector<TensorMapEncoding> tensor_maps;
};

// A Launch and a Synchronize of its stream in one operation: the launch's
// failure, or what the Synchronize gives, and whether the launch was
// enqueued.
using LaunchedAndSynchronized = std::function<void(absl::StatusOr<uint64_t>, bool launched)>;

}  // namespace gpuexec::port

#endif  // GPUEXEC_SERVER_PORT_TYPES_H_
