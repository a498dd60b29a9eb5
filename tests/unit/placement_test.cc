#include "internal/placement.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/random/random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/status_matchers.h"

namespace gpuexec::internal {
namespace {

using ::gpuexec::testing::StatusIs;
using ::testing::HasSubstr;

constexpr uint64_t kGiB = uint64_t{1} << 30;

DeviceLoad Device(size_t daemon, uint64_t free_gib, uint32_t sessions = 0, bool healthy = true,
                  uint32_t cc_major = 9) {
  DeviceLoad d;
  d.daemon = daemon;
  d.healthy = healthy;
  d.memory_free_bytes = free_gib * kGiB;
  d.memory_total_bytes = 141 * kGiB;
  d.sessions = sessions;
  d.cc_major = cc_major;
  return d;
}

TEST(SampleDaemons, DrawsDistinctDaemonsUniformly) {
  absl::BitGen bits;
  std::map<size_t, int> drawn;
  for (int round = 0; round < 30000; ++round) {
    std::vector<size_t> s = SampleDaemons(10, 3, bits);
    ASSERT_EQ(s.size(), 3u);
    ASSERT_EQ(std::set<size_t>(s.begin(), s.end()).size(), 3u) << "a daemon drawn twice";
    for (size_t i : s) {
      ASSERT_LT(i, 10u);
      ++drawn[i];
    }
  }
  // 9000 draws each expected; a uniform sampler stays well within 5%.
  for (const auto& [daemon, n] : drawn) {
    EXPECT_NEAR(n, 9000, 450) << "daemon " << daemon;
  }
  std::vector<size_t> all = SampleDaemons(2, 3, bits);
  EXPECT_EQ(std::set<size_t>(all.begin(), all.end()), (std::set<size_t>{0, 1}));
  EXPECT_TRUE(SampleDaemons(0, 3, bits).empty());
}

TEST(ChooseDevice, TheMostFreeMemoryWinsThenTheFewestSessions) {
  const std::vector<DeviceLoad> devices = {Device(0, 40, 1), Device(1, 90, 5), Device(2, 90, 2),
                                           Device(3, 60, 0)};
  auto best = ChooseDevice(devices, {}, "4 daemons");
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(*best, 2u);
}

TEST(ChooseDevice, OnATieTheLessBusyDeviceWins) {
  std::vector<DeviceLoad> devices = {Device(0, 90, 2), Device(1, 90, 2), Device(2, 90, 2)};
  devices[0].pending_requests = 40;
  devices[1].pending_requests = 3;
  devices[2].pending_requests = 17;
  auto best = ChooseDevice(devices, {}, "3 daemons");
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(*best, 1u);
}

TEST(ChooseDevice, MoreFreeMemoryThanTheDeviceHasIsPassedOver) {
  std::vector<DeviceLoad> devices = {Device(0, 500), Device(1, 20)};  // of 141 GiB
  auto best = ChooseDevice(devices, {}, "2 daemons");
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(*best, 1u);
}

TEST(ChooseDevice, ATotalNoGpuHasIsPassedOver) {
  // A daemon claiming 2^63 bytes free of 2^63 would win every placement.
  std::vector<DeviceLoad> devices = {Device(0, 20), Device(1, 30)};
  devices[0].memory_free_bytes = devices[0].memory_total_bytes = uint64_t{1} << 63;
  auto best = ChooseDevice(devices, {}, "2 daemons");
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(*best, 1u);
}

TEST(ChooseDevice, UnhealthyAndOlderDevicesArePassedOver) {
  const std::vector<DeviceLoad> devices = {Device(0, 120, 0, /*healthy=*/false),
                                           Device(1, 100, 0, true, /*cc_major=*/8),
                                           Device(2, 20, 9)};
  PlacementNeeds needs;
  needs.min_cc_major = 9;
  auto best = ChooseDevice(devices, needs, "3 daemons");
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(*best, 2u);
}

TEST(ChooseDevice, ALargeSessionGoesWhereItsMemoryIsFree) {
  const std::vector<DeviceLoad> devices = {Device(0, 10, 0), Device(1, 70, 30)};
  PlacementNeeds needs;
  needs.memory_bytes = 64 * kGiB;
  auto best = ChooseDevice(devices, needs, "2 daemons");
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(*best, 1u);
}

TEST(ChooseDevice, NoFitSaysWhy) {
  PlacementNeeds big;
  big.memory_bytes = 100 * kGiB;
  EXPECT_THAT(ChooseDevice({Device(0, 10), Device(1, 70), Device(2, 120, 0, false)}, big,
                           "3 daemons of pool://gpus:50051"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("no device with 107374182400 bytes free among 3 device(s) of 3 "
                                 "daemons of pool://gpus:50051 (the most free: 75161927680 "
                                 "bytes; 1 not healthy")));
  PlacementNeeds hopper;
  hopper.min_cc_major = 9;
  EXPECT_THAT(
      ChooseDevice({Device(0, 10, 0, false), Device(1, 70, 0, true, 8)}, hopper, "2 daemons"),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("no usable device among 2 device(s) of 2 daemons: 1 not "
                         "healthy, 1 below compute capability 9.0")));
  EXPECT_THAT(ChooseDevice({}, {}, "0 daemons"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("no usable device among 0 device(s)")));
}

}  // namespace
}  // namespace gpuexec::internal
