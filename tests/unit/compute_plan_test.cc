// The daemon's side of compute shares, without a server: its flags, the
// plan of a tenants file on devices, and the mechanism a plan needs.

#include "server/rpc/compute_plan.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/tenants/tenants.h"

namespace gpuexec::rpc {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Isolation = core::EngineOptions::Isolation;

TEST(ComputePlanFlagsTest, TheDefaultShareIsAFractionOrACount) {
  EXPECT_TRUE(ParseShareFlag("").value().empty());
  EXPECT_EQ(ParseShareFlag("0.25").value().fraction, 0.25);
  EXPECT_EQ(ParseShareFlag("16sm").value().sms, 16u);
  EXPECT_EQ(ParseShareFlag("16sm").value().where, "--default_compute_share");
  for (const char* bad : {"0", "1.5", "-0.1", "x", "0sm", "sm", "16 SMs"}) {
    EXPECT_THAT(std::string(ParseShareFlag(bad).status().message()),
                HasSubstr("--default_compute_share must be a fraction"))
        << bad;
  }
  EXPECT_EQ(ParseMpsMode("").value(), MpsMode::kAuto);
  EXPECT_EQ(ParseMpsMode("external").value(), MpsMode::kExternal);
  EXPECT_EQ(ParseMpsMode("off").value(), MpsMode::kOff);
  EXPECT_FALSE(ParseMpsMode("on").ok());
}

TEST(ComputePlanTest, PlansTheTenantsThatMayUseEachDevice) {
  auto dir = tenants::Directory::Parse(
      "tenant { name: \"a\" uid: 1 devices: 0 compute_share { sms: 32 } }\n"
      "tenant { name: \"b\" uid: 2 compute_share { fraction: 0.5 } }\n"
      "tenant { name: \"c\" uid: 3 }\n",
      "t.textproto");
  ASSERT_TRUE(dir.ok()) << dir.status();
  auto plans = ComputePlan::Make(dir->get(), {{0, 132, 9, 0}, {1, 132, 9, 0}}, {});
  ASSERT_TRUE(plans.ok()) << plans.status();
  core::SharePlan plan;
  plan.Set(*plans);
  EXPECT_EQ(plan.PercentFor(0, "a"), 24u);  // 32 of 132
  EXPECT_EQ(plan.PercentFor(0, "b"), 48u);  // 64 of 132
  EXPECT_EQ(plan.PercentFor(0, "c"), 28u);  // the rest: 36 SMs
  EXPECT_EQ(plan.PercentFor(1, "c"), 52u);  // a may not use device 1
  EXPECT_EQ(plan.PercentFor(0, ""), 28u);   // the device's shared worker: the rest
  EXPECT_EQ(plan.PercentFor(2, "a"), 0u);   // no such device: no limit
  EXPECT_THAT(plan.Describe(),
              ElementsAre("device 0: tenant 'a' 32 SMs (24%), tenant 'b' 64 SMs (48%), the rest "
                          "36 SMs (28%)",
                          "device 1: tenant 'b' 64 SMs (48%), the rest 68 SMs (52%)"));
  EXPECT_TRUE(ComputePlan::CheckMechanism(*plans, Isolation::kTenant, true, false).ok());
  EXPECT_EQ(ComputePlan::CheckMechanism(*plans, Isolation::kTenant, false, true).code(),
            absl::StatusCode::kFailedPrecondition);
  // One worker a device: green contexts, where the driver has them (MPS
  // or not).
  EXPECT_TRUE(ComputePlan::CheckMechanism(*plans, Isolation::kDevice, false, true).ok());
  const absl::Status no_green =
      ComputePlan::CheckMechanism(*plans, Isolation::kDevice, true, false);
  EXPECT_EQ(no_green.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(no_green.message()),
              HasSubstr("tenant 'a' has a compute share of device 0, but with --isolation=device"));
  EXPECT_THAT(std::string(no_green.message()), HasSubstr("CUDA 12.5 or newer"));
}

TEST(ComputePlanTest, WithoutSharesNothingIsHeldAndAnyMechanismDoes) {
  auto plans = ComputePlan::Make(nullptr, {{0, 132, 9, 0}}, {});
  ASSERT_TRUE(plans.ok());
  core::SharePlan plan;
  plan.Set(*plans);
  EXPECT_EQ(plan.PercentFor(0, "anyone"), 0u);
  EXPECT_TRUE(plan.Describe().empty());
  EXPECT_TRUE(ComputePlan::CheckMechanism(*plans, Isolation::kDevice, false, false).ok());
}

}  // namespace
}  // namespace gpuexec::rpc
