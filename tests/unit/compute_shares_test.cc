// The arithmetic of compute shares, alone: what a share in the tenants file
// comes to on a device of a given size, and the plans refused.

#include "server/core/compute_shares.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gpuexec::core {
namespace {

using ::testing::HasSubstr;

constexpr ShareDevice kH200{0, 132, 9, 0};

ComputeShare Fraction(double f, std::string where = "t.textproto:3: tenant 'a' compute_share") {
  ComputeShare s;
  s.fraction = f;
  s.where = std::move(where);
  return s;
}

ComputeShare Sms(uint32_t n, std::string where = "t.textproto:3: tenant 'a' compute_share") {
  ComputeShare s;
  s.sms = n;
  s.where = std::move(where);
  return s;
}

std::string Refusal(const absl::StatusOr<DeviceShares>& plan) {
  EXPECT_FALSE(plan.ok());
  return std::string(plan.status().message());
}

TEST(GranularityTest, FollowsTheDriversSplitRules) {
  EXPECT_EQ(GranularityOf(9, 0).min, 8u);
  EXPECT_EQ(GranularityOf(9, 0).step, 8u);
  EXPECT_EQ(GranularityOf(10, 0).step, 8u);
  EXPECT_EQ(GranularityOf(8, 6).min, 4u);
  EXPECT_EQ(GranularityOf(8, 6).step, 2u);
  EXPECT_EQ(GranularityOf(7, 5).min, 2u);
  EXPECT_EQ(GranularityOf(6, 1).step, 2u);
}

TEST(PlanSharesTest, AFractionComesToTheNearestStepAndTheRestTakesWhatIsLeft) {
  auto plan = PlanShares(kH200, {{"a", Fraction(0.1)}, {"b", {}}}, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->parts.size(), 1u);
  // 13.2 SMs: the nearest multiple of 8 is 16.
  EXPECT_EQ(plan->parts[0].tenant, "a");
  EXPECT_EQ(plan->parts[0].sms, 16u);
  EXPECT_EQ(plan->parts[0].percent, 12u);  // 16 / 132, rounded down
  EXPECT_EQ(plan->rest_sms, 116u);
  EXPECT_EQ(plan->rest_percent, 88u);
  EXPECT_EQ(plan->SmsOf("a"), 16u);
  EXPECT_EQ(plan->SmsOf("b"), 116u);
  EXPECT_EQ(plan->PercentOf("b"), 88u);
  EXPECT_EQ(plan->Find("b"), nullptr);
}

TEST(PlanSharesTest, ASmallFractionStillGetsAWholePart) {
  auto plan = PlanShares(kH200, {{"a", Fraction(0.01)}}, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->parts[0].sms, 8u);
  EXPECT_EQ(plan->parts[0].percent, 6u);
}

TEST(PlanSharesTest, CountsAreTakenAsTheyAre) {
  auto plan = PlanShares(kH200, {{"a", Sms(8)}, {"b", Sms(64)}, {"c", {}}}, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->parts[0].sms, 8u);
  EXPECT_EQ(plan->parts[1].sms, 64u);
  EXPECT_EQ(plan->rest_sms, 60u);
  // The percentages never come to more than the device.
  EXPECT_EQ(plan->parts[0].percent + plan->parts[1].percent + plan->rest_percent, 100u);
}

TEST(PlanSharesTest, PercentagesOfPartsThatFillTheDeviceStayWithinIt) {
  const ShareDevice d{1, 120, 9, 0};
  auto plan = PlanShares(d, {{"a", Sms(40)}, {"b", Sms(40)}, {"c", Sms(40)}}, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  uint32_t sum = 0;
  for (const auto& p : plan->parts) sum += p.percent;
  EXPECT_LE(sum, 100u);
  EXPECT_EQ(plan->rest_sms, 0u);
  EXPECT_EQ(plan->rest_percent, 0u);
}

TEST(PlanSharesTest, TheDefaultShareIsEachTenantsOwnWithoutOne) {
  auto plan = PlanShares(kH200, {{"a", Sms(16)}, {"b", {}}, {"c", {}}},
                         Fraction(0.25, "--default_compute_share"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->parts.size(), 3u);
  EXPECT_EQ(plan->SmsOf("b"), 32u);  // 33 SMs: 32 is the nearest step
  EXPECT_EQ(plan->SmsOf("c"), 32u);
  EXPECT_EQ(plan->rest_sms, 52u);
}

TEST(PlanSharesTest, WithoutSharesTheWholeDeviceIsTheRest) {
  auto plan = PlanShares(kH200, {{"a", {}}, {"b", {}}}, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->any());
  EXPECT_EQ(plan->rest_sms, 132u);
  EXPECT_EQ(plan->rest_percent, 100u);
}

TEST(PlanSharesTest, ACountOffTheStepIsRefusedNamingWhereItWasWritten) {
  EXPECT_THAT(Refusal(PlanShares(kH200, {{"a", Sms(12)}}, {})),
              HasSubstr("t.textproto:3: tenant 'a' compute_share: 12 SMs cannot be a part of its "
                        "own on device 0 (132 SMs, parts of at least 8 and a multiple of 8); give "
                        "a multiple of 8 of at least 8, or a fraction"));
  // On compute capability 8.x, 12 is a part (at least 4, a multiple of 2).
  EXPECT_TRUE(PlanShares({0, 108, 8, 0}, {{"a", Sms(12)}}, {}).ok());
  EXPECT_FALSE(PlanShares({0, 108, 8, 0}, {{"a", Sms(2)}}, {}).ok());
}

TEST(PlanSharesTest, SharesOverTheDeviceAreRefused) {
  EXPECT_THAT(Refusal(PlanShares(kH200, {{"a", Sms(136)}}, {})),
              HasSubstr("136 SMs is more than the device has on device 0"));
  EXPECT_THAT(Refusal(PlanShares(kH200,
                                 {{"a", Fraction(0.6)},
                                  {"b", Fraction(0.6, "t.textproto:9: tenant 'b' compute_share")}},
                                 {})),
              HasSubstr("t.textproto:9: tenant 'b' compute_share: the shares of device 0 come to "
                        "160 SMs with this one (of tenant 'b'), more than its 132"));
  EXPECT_THAT(Refusal(PlanShares(kH200, {{"a", Fraction(1.5)}}, {})),
              HasSubstr("is not in (0, 1]"));
}

TEST(PlanSharesTest, SharesThatLeaveTooLittleForTheOthersAreRefused) {
  // 128 of 132 SMs leave 4 to tenant b, less than one part.
  EXPECT_THAT(Refusal(PlanShares(kH200, {{"a", Sms(128)}, {"b", {}}}, {})),
              HasSubstr("t.textproto:3: tenant 'a' compute_share: the shares of device 0 leave 4 "
                        "of its 132 SMs to the tenants without a share (at least 8 are needed)"));
  // With nobody left without a share, the whole device may be shares.
  EXPECT_TRUE(PlanShares(kH200, {{"a", Sms(128)}}, {}).ok());
}

TEST(PlanSharesTest, AWholeFractionIsTheWholeStepsOfTheDevice) {
  // 132 SMs: 16.5 steps of 8 would round to 136; the device has 128 in whole steps.
  auto plan = PlanShares(kH200, {{"a", Fraction(1)}}, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->parts[0].sms, 128u);
  EXPECT_TRUE(PlanShares(kH200, {{"a", Fraction(0.99)}}, {}).ok());
}

// MPS holds each worker to a percentage, not to SMs of its own: tenants
// without a share are held to an equal part of the rest, so that together
// they cannot pass it.
TEST(PlanSharesTest, TenantsWithoutAShareSplitTheRestsPercentage) {
  auto plan = PlanShares(kH200, {{"a", Fraction(0.5)}, {"b", {}}, {"c", {}}}, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->parts[0].percent, 48u);  // 64 SMs
  EXPECT_EQ(plan->rest_percent, 52u);
  EXPECT_EQ(plan->PercentOf("b"), 26u);
  EXPECT_EQ(plan->PercentOf("c"), 26u);
  EXPECT_LE(plan->parts[0].percent + plan->PercentOf("b") + plan->PercentOf("c"), 100u);
  EXPECT_EQ(plan->SmsOf("b"), 68u);  // the rest, shared
  // Eight tenants in a rest of 6% cannot each have 1%.
  std::vector<ShareClaim> claims = {{"a", Sms(128)}};
  for (int i = 0; i < 8; ++i) claims.push_back({absl::StrCat("t", i), {}});
  EXPECT_FALSE(PlanShares({0, 136, 9, 0}, claims, {}).ok());
}

TEST(PlanSharesTest, DescribesAShare) { EXPECT_EQ(DescribeShare(16, 12), "16 SMs (12%)"); }

}  // namespace
}  // namespace gpuexec::core
