// Client input as messages and log lines quote it.

#include "server/common/text.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/common/log.h"

namespace gpuexec {
namespace {

using ::testing::HasSubstr;

TEST(QuotedTest, EscapesAndCuts) {
  EXPECT_EQ(Quoted("gx_saxpy"), "gx_saxpy");
  EXPECT_EQ(Quoted("a\nb\x01\"c"), "a\\nb\\x01\\\"c");
  EXPECT_EQ(Quoted(std::string(100, 'z'), 8), "zzzzzzzz...");
  EXPECT_EQ(Quoted(std::string(1 << 20, 'z')).size(), 64u + 3);
}

TEST(LogTest, AMessageIsOneLineWhateverItHolds) {
  ::testing::internal::CaptureStderr();
  log::Write(log::Level::kInfo, "kernel 'x\nI 2026-01-01T00:00:00.000Z forged' \r\x7f");
  log::Write(log::Level::kWarning, std::string(log::kMaxLogMessageBytes + 10, 'm'));
  const std::string out = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 2) << out;
  EXPECT_THAT(out, HasSubstr("kernel 'x\\x0aI 2026"));
  EXPECT_THAT(out, HasSubstr("\\x0d\\x7f"));
  EXPECT_THAT(out, HasSubstr("... (10 bytes more)"));
}

// A client failing commands by the thousand gets a line now and then, each
// saying how many it follows; a quiet spell refills the budget.
TEST(LogTest, TheLineBudgetLetsABurstThroughAndCountsTheRest) {
  log::LineBudget budget(/*per_second=*/10, /*burst=*/3);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  uint64_t left_out = 99;
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(budget.Take(t0, &left_out));
    EXPECT_EQ(left_out, 0u);
  }
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(budget.Take(t0, &left_out));
  EXPECT_EQ(budget.left_out_total(), 1000u);
  // A tenth of a second later: one more line, which says what it follows.
  EXPECT_TRUE(budget.Take(t0 + absl::Milliseconds(100), &left_out));
  EXPECT_EQ(left_out, 1000u);
  EXPECT_FALSE(budget.Take(t0 + absl::Milliseconds(100), &left_out));
  // A long quiet spell refills to the burst, no more.
  const absl::Time t1 = t0 + absl::Hours(1);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(budget.Take(t1, &left_out));
  EXPECT_FALSE(budget.Take(t1, &left_out));
  EXPECT_EQ(budget.left_out_total(), 1002u);
}

}  // namespace
}  // namespace gpuexec
