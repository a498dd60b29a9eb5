#ifndef GPUEXEC_CLIENT_CPP_GPUEXEC_TRITON_H_
#define GPUEXEC_CLIENT_CPP_GPUEXEC_TRITON_H_

// Launching Triton-compiled kernels (Triton 3.2 to 3.6). Triton writes,
// next to each kernel's cubin, a metadata JSON file (name, num_warps,
// num_ctas, shared, scratch sizes, tensor descriptors ...). That file, the
// program grid and the kernel's own arguments are all a launch needs:
//
//   auto meta = gpuexec::ReadTritonMetadataFile("add_kernel.json");
//   auto module = session->LoadModuleFile("add_kernel.cubin");
//   auto kernel = module->GetFunction(meta->name);
//   auto gpu_time = gpuexec::LaunchTritonAndWait(*session, *kernel, *meta, {blocks},
//       {gpuexec::Arg::Ptr(x), gpuexec::Arg::Ptr(y), gpuexec::Arg::Ptr(out),
//        gpuexec::Arg::I32(n)});
//
// A kernel that takes host tensor descriptors (Triton's TensorDescriptor)
// gets a TritonTensorDescriptor where Triton takes one:
//
//   gpuexec::TritonTensorDescriptor a{&a_buffer, 0, {M, K}, {K, 1}};
//   gpuexec::LaunchTritonAndWait(*session, *kernel, *meta, {sms},
//       {a, b, c, gpuexec::Arg::I32(M), gpuexec::Arg::I32(N), gpuexec::Arg::I32(K)});
//
// docs/triton.md is the specification, shared with the Python loader
// (gpuexec.triton) and tested on the same files (tests/data/triton/): how
// the metadata is read (values written as JSON or as strings holding them,
// as `json.dump(..., default=str)` writes them), how the launch is made
// (blocks of warp_size x num_warps threads, `shared` bytes of dynamic shared
// memory, each program a cluster of `cluster_dims` or (num_ctas, 1, 1)
// CTAs, cooperative and programmatic dependent launches as the metadata
// asks, and the trailing global and profile scratch pointers), and how each
// descriptor becomes a tensor map, its shape and its strides.
//
// Errors: a malformed file, and whatever gpuexec cannot launch, is
// INVALID_ARGUMENT naming the key ("tensordesc_meta[1].elem_type"); a
// descriptor that does not fit its entry is INVALID_ARGUMENT naming the
// descriptor and its argument. Nothing here calls the daemon but
// LaunchTritonAndWait.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "gpuexec/client.h"

namespace gpuexec {

// One entry of the metadata's `tensordesc_meta`: how the n-th host tensor
// descriptor argument is encoded.
struct TritonTensorDescMeta {
  // 0 to 3: none, 32B, 64B, 128B.
  TensorMapSwizzle swizzle = TensorMapSwizzle::kNone;
  // Bytes per element: 1, 2, 4 or 8.
  uint32_t elem_size = 0;
  // Triton's element type (0 to 12) and the driver's it stands for.
  uint32_t elem_type = 0;
  TensorMapDataType data_type = TensorMapDataType::kUint8;
  // The box, outermost first: 1 to 5 entries of 1 to 256.
  std::vector<uint32_t> block_size;
};

// The fields of Triton's metadata JSON that a launch needs.
struct TritonMetadata {
  std::string name;
  uint32_t num_warps = 0;
  // `warp_size`, else `target`'s, else 32.
  uint32_t warp_size = 32;
  uint32_t num_ctas = 1;
  // Triton 3.4 and 3.5 give the cluster shape itself.
  std::optional<Dim3> cluster_dims;
  // Dynamic shared memory, in bytes.
  uint32_t shared = 0;
  // Whether the metadata has the size at all: a kernel compiled by a Triton
  // that knows the key takes the matching trailing pointer parameter.
  bool has_global_scratch = false;
  uint64_t global_scratch_size = 0;  // per CTA
  uint64_t global_scratch_align = 1;
  bool has_profile_scratch = false;
  uint64_t profile_scratch_size = 0;  // per CTA
  uint64_t profile_scratch_align = 1;
  bool launch_cooperative_grid = false;
  bool launch_pdl = false;
  // One entry per host tensor descriptor parameter, in order.
  std::vector<TritonTensorDescMeta> tensordesc_meta;

  // CTAs per program: `cluster_dims` when its product is over 1, else
  // (num_ctas, 1, 1).
  Dim3 ClusterShape() const;
};

// Reads the metadata JSON as docs/triton.md says. Unknown keys are ignored;
// a missing `name` or `num_warps`, or a key of the wrong type or out of
// range, is INVALID_ARGUMENT naming the key.
absl::StatusOr<TritonMetadata> ParseTritonMetadata(std::string_view json);
// Reads and parses a metadata file (NOT_FOUND if it cannot be read; a
// parse error is prefixed with the path).
absl::StatusOr<TritonMetadata> ReadTritonMetadataFile(const std::string& path);

// A host tensor descriptor (Triton's TensorDescriptor) over a buffer: the
// loader turns it into the tensor map, shape and strides the kernel takes,
// using the metadata's tensordesc_meta entry of the same rank in order.
struct TritonTensorDescriptor {
  // Not owned: must outlive the call it is passed to. The launch records
  // its handle, as Arg::Ptr does.
  const Buffer* buffer = nullptr;
  // Bytes from the buffer's start to the tensor's first element (16-byte
  // aligned). The daemon checks that every element lies in the buffer.
  uint64_t byte_offset = 0;
  // Elements along each dimension, outermost first; each 1 to 2^31-1.
  std::vector<int64_t> shape;
  // Elements between consecutive indices of each dimension, outermost
  // first; the last is 1. Empty: contiguous (row-major) strides.
  std::vector<int64_t> strides;
  enum class Padding { kZero, kNan };
  // What out-of-bounds loads read.
  Padding padding = Padding::kZero;
  // Checked against the entry when given. Empty / 0: the entry's.
  std::vector<int64_t> block_shape;
  uint32_t element_size = 0;
};

// A Triton kernel's argument: a plain one, or a host tensor descriptor.
using TritonArg = std::variant<Arg, TritonTensorDescriptor>;

// The kernel's own parameters for `args` (the scratch pointers excluded):
// each descriptor, the n-th with tensordesc_meta's n-th entry, becomes
// Arg::TensorMap (dimensions, box and strides reversed to innermost first,
// strides in bytes, element strides 1, no interleave, the entry's swizzle,
// L2 promotion 128B, out-of-bounds fill NaN for Padding::kNan), then its
// shape as I32s and its strides as I64s. INVALID_ARGUMENT naming the
// descriptor when it does not fit its entry, when the kernel takes no
// descriptors, or when the count of descriptors is not the entries'.
absl::StatusOr<std::vector<Arg>> ExpandTritonArgs(const TritonMetadata& meta,
                                                  absl::Span<const TritonArg> args);

// A pointer parameter that Triton appends after the kernel's own.
struct TritonScratch {
  std::string what;    // "global scratch" or "profile scratch"
  uint64_t bytes = 0;  // 0: pass a null pointer
  uint64_t align = 1;
};

// How to launch a Triton kernel on a grid of programs.
struct TritonLaunchPlan {
  LaunchConfig config;
  // In parameter order, after the kernel's own arguments.
  std::vector<TritonScratch> scratch;
};

// The launch of `meta`'s kernel on `grid` programs: its configuration
// (grid times the cluster shape; a cluster of over one block with the
// SPREAD policy, non-portable over 8 blocks; cooperative and programmatic
// dependent launch from the metadata) and its scratch buffers (size times
// the grid's CTAs, rounded up to the alignment). INVALID_ARGUMENT for an
// empty grid or one that overflows.
absl::StatusOr<TritonLaunchPlan> PlanTritonLaunch(const TritonMetadata& meta, const Dim3& grid);

// The launch's whole argument list: `args` expanded, then the plan's
// scratch pointers, each scratch buffer allocated in `session` and kept in
// `scratch` (the caller frees them after the launches; a failed allocation
// names the scratch).
absl::StatusOr<std::vector<Arg>> TritonLaunchArgs(Session& session, const TritonMetadata& meta,
                                                  const TritonLaunchPlan& plan,
                                                  absl::Span<const TritonArg> args,
                                                  std::vector<Buffer>* scratch);

// Expands `args`, allocates the plan's scratch buffers in `session`, appends
// them, launches `function` and waits; returns the GPU time. The scratch
// buffers are freed before it returns.
absl::StatusOr<absl::Duration> LaunchTritonAndWait(Session& session, const Function& function,
                                                   const TritonMetadata& meta, const Dim3& grid,
                                                   absl::Span<const TritonArg> args);

}  // namespace gpuexec

#endif  // GPUEXEC_CLIENT_CPP_GPUEXEC_TRITON_H_
