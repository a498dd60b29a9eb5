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
  p.cc_major = 9;
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
       "48 KiB (49153 bytes) of dynamic shared memory asked; at most 48 KiB (49152 bytes) fit "
       "beside its 1 KiB (1024 bytes)"},
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

// Launch attributes: a cluster past 8 with the opt-in, the scheduling
// policy, programmatic dependent launch by compute capability.
TEST(LaunchCheck, AttributesAreCheckedAgainstTheShapeAndDevice) {
  LaunchShape sixteen{{32, 1, 1}, {128, 1, 1}, {16, 1, 1}, 0};
  sixteen.non_portable_cluster = true;
  EXPECT_THAT(CheckLaunchShape(sixteen, Kernel(), H200(), "kernel 'k'"), IsOk());
  port::LaunchGeometry g = GeometryOf(sixteen);
  EXPECT_TRUE(g.non_portable_cluster);
  EXPECT_EQ(g.cluster[0], 16u);

  LaunchShape thirty_two{{32, 1, 1}, {128, 1, 1}, {32, 1, 1}, 0};
  thirty_two.non_portable_cluster = true;
  EXPECT_THAT(CheckLaunchShape(thirty_two, Kernel(), H200(), "kernel 'k'"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a cluster of 32 blocks is over the maximum of 16")));
  LaunchShape no_opt_in{{32, 1, 1}, {128, 1, 1}, {16, 1, 1}, 0};
  EXPECT_THAT(CheckLaunchShape(no_opt_in, Kernel(), H200(), "kernel 'k'"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("ask for non_portable_cluster to go up to 16")));

  LaunchShape spread{{8, 1, 1}, {128, 1, 1}, {2, 1, 1}, 0};
  spread.cluster_policy = 1;
  EXPECT_THAT(CheckLaunchShape(spread, Kernel(), H200(), "kernel 'k'"), IsOk());
  EXPECT_EQ(GeometryOf(spread).cluster_policy, 1u);
  spread.cluster_policy = 3;
  EXPECT_THAT(CheckLaunchShape(spread, Kernel(), H200(), "kernel 'k'"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cluster_scheduling_policy 3 is not one of 0 to 2")));
  LaunchShape policy_alone{{8, 1, 1}, {128, 1, 1}, {0, 0, 0}, 0};
  policy_alone.cluster_policy = 2;
  EXPECT_THAT(CheckLaunchShape(policy_alone, Kernel(), H200(), "kernel 'k'"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a cluster scheduling policy needs a cluster")));

  LaunchShape pdl{{8, 1, 1}, {128, 1, 1}, {0, 0, 0}, 0};
  pdl.programmatic_dependent = true;
  pdl.cooperative = true;
  EXPECT_THAT(CheckLaunchShape(pdl, Kernel(), H200(), "kernel 'k'"), IsOk());
  EXPECT_TRUE(GeometryOf(pdl).programmatic_dependent);
  EXPECT_TRUE(GeometryOf(pdl).cooperative);
  port::DeviceProperties ampere = H200();
  ampere.cc_major = 8;
  ampere.cc_minor = 0;
  EXPECT_THAT(CheckLaunchShape(pdl, Kernel(), ampere, "kernel 'k'"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("device 0 (compute capability 8.0) has no programmatic "
                                 "dependent launch; it needs 9.0 or later")));
}

}  // namespace
}  // namespace gpuexec::core
