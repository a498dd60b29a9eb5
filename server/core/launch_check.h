#ifndef GPUEXEC_SERVER_CORE_LAUNCH_CHECK_H_
#define GPUEXEC_SERVER_CORE_LAUNCH_CHECK_H_

// The checks of a launch's shape against its kernel and device, before it
// reaches the driver: grid and block within the device's limits, threads
// per block within the kernel's, dynamic shared memory within what fits,
// thread block clusters where the device has them, launch attributes the
// device can honour. (Whether a cooperative grid fits the device at once
// depends on the kernel's occupancy: the device checks that.) Pure: no session, no
// device call. Every refusal is INVALID_ARGUMENT naming the dimension, the
// figure asked and the limit ("launch of kernel 'k': block.x is 2048;
// device 0 allows at most 1024").

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/port/types.h"

namespace gpuexec::core {

struct LaunchShape {
  uint32_t grid[3] = {1, 1, 1};
  uint32_t block[3] = {1, 1, 1};
  uint32_t cluster[3] = {0, 0, 0};  // all zero: no cluster
  uint64_t shared_bytes = 0;        // dynamic shared memory
  // Launch attributes (port::LaunchGeometry's).
  bool cooperative = false;
  bool programmatic_dependent = false;
  bool non_portable_cluster = false;
  uint32_t cluster_policy = 0;
};

// Blocks in a cluster: 8 portable, 16 with the non-portable opt-in.
inline constexpr uint64_t kPortableClusterBlocks = 8;
inline constexpr uint64_t kNonPortableClusterBlocks = 16;

// The geometry the driver is given for `shape`: a cluster dimension left 0
// beside one that is set counts as 1; no dimension set, no cluster.
port::LaunchGeometry GeometryOf(const LaunchShape& shape);

// `kernel_name` names the kernel in the message (quoted by the caller).
absl::Status CheckLaunchShape(const LaunchShape& shape, const port::FunctionAttributes& kernel,
                              const port::DeviceProperties& device, absl::string_view kernel_name);

}  // namespace gpuexec::core

#endif  // GPUEXEC_SERVER_CORE_LAUNCH_CHECK_H_
