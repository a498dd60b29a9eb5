#include "server/core/launch_check.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/common/text.h"

namespace gpuexec::core {

port::LaunchGeometry GeometryOf(const LaunchShape& shape) {
  port::LaunchGeometry g;
  const bool clustered = shape.cluster[0] != 0 || shape.cluster[1] != 0 || shape.cluster[2] != 0;
  for (int i = 0; i < 3; ++i) {
    g.grid[i] = shape.grid[i];
    g.block[i] = shape.block[i];
    g.cluster[i] = clustered ? (shape.cluster[i] == 0 ? 1 : shape.cluster[i]) : 0;
  }
  g.shared_bytes = static_cast<uint32_t>(shape.shared_bytes);
  g.cooperative = shape.cooperative;
  g.programmatic_dependent = shape.programmatic_dependent;
  g.non_portable_cluster = shape.non_portable_cluster;
  g.cluster_policy = shape.cluster_policy;
  return g;
}

absl::Status CheckLaunchShape(const LaunchShape& shape, const port::FunctionAttributes& kernel,
                              const port::DeviceProperties& p, absl::string_view kernel_name) {
  auto bad = [&](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("launch of ", kernel_name, ": ", parts...));
  };
  const uint32_t* grid = shape.grid;
  const uint32_t* block = shape.block;
  static constexpr const char* kAxis[] = {"x", "y", "z"};
  for (int i = 0; i < 3; ++i) {
    if (grid[i] == 0)
      return bad("grid.", kAxis[i], " is 0; every grid dimension must be at least 1");
    if (block[i] == 0) {
      return bad("block.", kAxis[i], " is 0; every block dimension must be at least 1");
    }
    if (grid[i] > static_cast<uint32_t>(p.max_grid[i])) {
      return bad("grid.", kAxis[i], " is ", grid[i], "; device ", p.ordinal, " allows at most ",
                 p.max_grid[i]);
    }
    if (block[i] > static_cast<uint32_t>(p.max_block[i])) {
      return bad("block.", kAxis[i], " is ", block[i], "; device ", p.ordinal, " allows at most ",
                 p.max_block[i]);
    }
  }
  const uint64_t threads = uint64_t{block[0]} * block[1] * block[2];
  const int max_threads = kernel.max_threads_per_block > 0
                              ? std::min(kernel.max_threads_per_block, p.max_threads_per_block)
                              : p.max_threads_per_block;
  if (threads > static_cast<uint64_t>(max_threads)) {
    return bad("block (", block[0], ", ", block[1], ", ", block[2], ") has ", threads,
               " threads; this kernel allows at most ", max_threads, " per block");
  }
  if (shape.shared_bytes > static_cast<uint64_t>(kernel.max_dynamic_shared_bytes)) {
    return bad(ByteSize(shape.shared_bytes), " of dynamic shared memory asked; at most ",
               ByteSize(kernel.max_dynamic_shared_bytes), " fit beside its ",
               ByteSize(kernel.static_shared_bytes), " of static shared memory on device ",
               p.ordinal);
  }
  const port::LaunchGeometry geometry = GeometryOf(shape);
  if (geometry.cluster[0] != 0) {  // a cluster: every dimension at least 1
    if (!p.cluster_launch) {
      return bad("device ", p.ordinal, " does not support thread block clusters");
    }
    uint64_t size = 1;
    for (int i = 0; i < 3; ++i) {
      const uint32_t c = geometry.cluster[i];
      if (grid[i] % c != 0) {
        return bad("grid.", kAxis[i], " (", grid[i], ") is not a multiple of cluster.", kAxis[i],
                   " (", c, ")");
      }
      size *= c;
    }
    if (size > kPortableClusterBlocks && !shape.non_portable_cluster) {
      return bad("a cluster of ", size, " blocks is over the portable maximum of ",
                 kPortableClusterBlocks, "; ask for non_portable_cluster to go up to ",
                 kNonPortableClusterBlocks);
    }
    if (size > kNonPortableClusterBlocks) {
      return bad("a cluster of ", size, " blocks is over the maximum of ",
                 kNonPortableClusterBlocks);
    }
  }
  if (shape.cluster_policy > 2) {
    return bad("cluster_scheduling_policy ", shape.cluster_policy, " is not one of 0 to 2");
  }
  if (shape.cluster_policy != 0 && geometry.cluster[0] == 0) {
    return bad("a cluster scheduling policy needs a cluster");
  }
  if (shape.programmatic_dependent && p.cc_major < 9) {
    return bad("device ", p.ordinal, " (compute capability ", p.cc_major, ".", p.cc_minor,
               ") has no programmatic dependent launch; it needs 9.0 or later");
  }
  return absl::OkStatus();
}

}  // namespace gpuexec::core
