// The launch check as a table: each shape against an H200's limits and a
// kernel's attributes, and the message each refusal gives.
#include "server/core/launch_check.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/status_matchers.h"

namespace gpuexec::core {
namespace {

using ::gpuexec::testing::IsOk;
using ::gpuexec::testing::StatusIs;
using ::testing::HasSubstr;

port::DeviceProperties H200() {
  port::DeviceProperties p;
  p.ordinal = 0;
  p.max_grid[0] = 2147483647;
  p.max_grid[1] = 65535;
  p.max_grid[2] = 65535;
  p.max_block[0] = 1024;
  p.max_block[1] = 1024;
  p.max_block[2] = 64;
  p.max_threads_per_block = 1024;
  p.cluster_launch = true;
  return p;
}

port::FunctionAttributes Kernel(int max_threads = 1024, int max_dynamic_shared = 48 << 10) {
  port::FunctionAttributes k;
  k.max_threads_per_block = max_threads;
  k.max_dynamic_shared_bytes = max_dynamic_shared;
  k.static_shared_bytes = 1024;
  return k;
}

struct Case {
  std::string what;
  LaunchShape shape;
  port::FunctionAttributes kernel;
  bool cluster_launch;
  std::string refusal;  // empty: accepted
};

TEST(LaunchCheck, EachShapeIsAcceptedOrRefusedNamingItsLimit) {
  const std::vector<Case> cases = {
      {"one thread", {{1, 1, 1}, {1, 1, 1}, {0, 0, 0}, 0}, Kernel(), true, ""},
      {"the largest grid",
       {{2147483647, 65535, 65535}, {1, 1, 1}, {0, 0, 0}, 0},
       Kernel(),
       true,
       ""},
      {"a full block", {{1, 1, 1}, {32, 32, 1}, {0, 0, 0}, 0}, Kernel(), true, ""},
      {"a zero grid",
       {{0, 1, 1}, {1, 1, 1}, {0, 0, 0}, 0},
       Kernel(),
       true,
       "grid.x is 0; every grid dimension must be at least 1"},
      {"a zero block",
       {{1, 1, 1}, {1, 0, 1}, {0, 0, 0}, 0},
       Kernel(),
       true,
       "block.y is 0; every block dimension must be at least 1"},
      {"grid.y too large",
       {{1, 65536, 1}, {1, 1, 1}, {0, 0, 0}, 0},
       Kernel(),
       true,
       "grid.y is 65536; device 0 allows at most 65535"},
      {"block.z too large",
       {{1, 1, 1}, {1, 1, 65}, {0, 0, 0}, 0},
       Kernel(),
       true,
       "block.z is 65; device 0 allows at most 64"},
      {"too many threads",
       {{1, 1, 1}, {64, 32, 1}, {0, 0, 0}, 0},
       Kernel(),
       true,
       "block (64, 32, 1) has 2048 threads; this kernel allows at most 1024 per block"},
      {"past the kernel's own bound",
       {{1, 1, 1}, {512, 1, 1}, {0, 0, 0}, 0},
       Kernel(256),
       true,
       "has 512 threads; this kernel allows at most 256 per block"},
      {"shared memory that fits", {{1, 1, 1}, {1, 1, 1}, {0, 0, 0}, 48 << 10}, Kernel(), true, ""},
      {"shared memory past it",
       {{1, 1, 1}, {1, 1, 1}, {0, 0, 0}, (48 << 10) + 1},
       Kernel(),
       true,
       "49153 bytes of dynamic shared memory asked; at most 49152 fit beside its 1024 bytes"},
      {"a cluster", {{8, 1, 1}, {128, 1, 1}, {2, 1, 1}, 0}, Kernel(), true, ""},
      {"a cluster, unsupported",
       {{8, 1, 1}, {128, 1, 1}, {2, 1, 1}, 0},
       Kernel(),
       false,
       "device 0 does not support thread block clusters"},
      {"a grid not a multiple",
       {{7, 1, 1}, {128, 1, 1}, {2, 1, 1}, 0},
       Kernel(),
       true,
       "grid.x (7) is not a multiple of cluster.x (2)"},
      {"a cluster past 8",
       {{16, 2, 1}, {128, 1, 1}, {8, 2, 1}, 0},
       Kernel(),
       true,
       "a cluster of 16 blocks is over the portable maximum of 8"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    port::DeviceProperties p = H200();
    p.cluster_launch = c.cluster_launch;
    const absl::Status st = CheckLaunchShape(c.shape, c.kernel, p, "kernel 'k'");
    if (c.refusal.empty()) {
      EXPECT_THAT(st, IsOk());
    } else {
      EXPECT_THAT(
          st, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("launch of kernel 'k': ")));
      EXPECT_THAT(std::string(st.message()), HasSubstr(c.refusal));
    }
  }
}

}  // namespace
}  // namespace gpuexec::core
