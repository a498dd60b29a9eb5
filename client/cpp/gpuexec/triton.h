#ifndef GPUEXEC_CLIENT_CPP_GPUEXEC_TRITON_H_
#define GPUEXEC_CLIENT_CPP_GPUEXEC_TRITON_H_

// Launching Triton-compiled kernels. Triton writes, next to each kernel's
// cubin, a metadata JSON file (name, num_warps, num_ctas, shared, scratch
// sizes ...). That file, the program grid and the kernel's own arguments
// are all a launch needs:
//
//   auto meta = gpuexec::ReadTritonMetadataFile("add_kernel.json");
//   auto module = session->LoadModuleFile("add_kernel.cubin");
//   auto kernel = module->GetFunction(meta->name);
//   auto gpu_time = gpuexec::LaunchTritonAndWait(*session, *kernel, *meta, {blocks},
//       {gpuexec::Arg::Ptr(x), gpuexec::Arg::Ptr(y), gpuexec::Arg::Ptr(out),
//        gpuexec::Arg::I32(n)});
//
// The launch follows Triton's own launcher (3.x): blocks of 32 * num_warps
// threads, `shared` bytes of dynamic shared memory, each program made of
// num_ctas CTAs (grid.x times num_ctas, in clusters of (num_ctas, 1, 1)), and
// the trailing pointer parameters Triton adds to the kernel's signature: the
// global scratch buffer when the metadata has `global_scratch_size`, then
// the profile scratch buffer when it has `profile_scratch_size`. Each scratch
// buffer holds its per-CTA size times the CTAs of the grid; a size of 0
// passes a null pointer.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "gpuexec/client.h"

namespace gpuexec {

// The fields of Triton's metadata JSON that a launch needs.
struct TritonMetadata {
  std::string name;
  uint32_t num_warps = 4;
  uint32_t num_ctas = 1;
  // Dynamic shared memory, in bytes.
  uint32_t shared = 0;
  // Whether the metadata has the field at all: a kernel compiled by a Triton
  // that knows the field takes the matching trailing pointer parameter.
  bool has_global_scratch = false;
  uint64_t global_scratch_size = 0;  // per CTA
  uint64_t global_scratch_align = 1;
  bool has_profile_scratch = false;
  uint64_t profile_scratch_size = 0;  // per CTA
  uint64_t profile_scratch_align = 1;
  // Older Triton (before 3.3) gives the cluster shape explicitly.
  std::optional<Dim3> cluster_dims;
  // A launch that needs the whole grid resident at once (grid-wide sync):
  // gpuexec has no cooperative launch, so planning one fails.
  bool launch_cooperative_grid = false;
};

// Parses the metadata JSON. Unknown fields are ignored; a missing or
// malformed `name`, or a field of the wrong type or range, is
// INVALID_ARGUMENT naming the field.
absl::StatusOr<TritonMetadata> ParseTritonMetadata(std::string_view json);
// Reads and parses a metadata file (NOT_FOUND if it cannot be read).
absl::StatusOr<TritonMetadata> ReadTritonMetadataFile(const std::string& path);

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

// The launch of `meta`'s kernel on `grid` programs. INVALID_ARGUMENT when the
// metadata asks for what gpuexec cannot do (a cooperative launch, a scratch
// alignment over 256 bytes) or the grid overflows.
absl::StatusOr<TritonLaunchPlan> PlanTritonLaunch(const TritonMetadata& meta, const Dim3& grid);

// Allocates the plan's scratch buffers in `session`, appends them to `args`,
// launches `function` and waits; returns the GPU time. The scratch buffers
// are freed before it returns.
absl::StatusOr<absl::Duration> LaunchTritonAndWait(Session& session, const Function& function,
                                                   const TritonMetadata& meta, const Dim3& grid,
                                                   absl::Span<const Arg> args);

}  // namespace gpuexec

#endif  // GPUEXEC_CLIENT_CPP_GPUEXEC_TRITON_H_
