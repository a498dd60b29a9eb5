#include "server/common/cores.h"

#include "gtest/gtest.h"

namespace gpuexec {
namespace {

TEST(Cores, AQuotaRoundsUpToWholeCores) {
  EXPECT_EQ(CoresOfQuota("200000 100000"), 2u);
  EXPECT_EQ(CoresOfQuota("150000 100000"), 2u);
  EXPECT_EQ(CoresOfQuota("50000 100000"), 1u);
  EXPECT_EQ(CoresOfQuota("800000 100000\n"), 8u);
}

TEST(Cores, NoQuotaOrAnUnreadableOneIsNoLimit) {
  EXPECT_EQ(CoresOfQuota("max 100000"), 0u);
  EXPECT_EQ(CoresOfQuota(""), 0u);
  EXPECT_EQ(CoresOfQuota("-1 100000"), 0u);
  EXPECT_EQ(CoresOfQuota("100000 0"), 0u);
}

TEST(Cores, UsableCoresIsWithinTheHosts) {
  const unsigned cores = UsableCores();
  EXPECT_GE(cores, 1u);
  EXPECT_LE(cores, std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace
}  // namespace gpuexec
