// Client input as messages and log lines quote it.

#include "server/common/text.h"

#include <string>
#include <vector>

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

// Sizes as a person reads them, then the exact bytes.
TEST(ByteSizeTest, EachSizeReadsInItsUnitThenInBytes) {
  struct Case {
    uint64_t bytes;
    std::string text;
  };
  const std::vector<Case> cases = {
      {0, "0 bytes"},
      {1, "1 byte"},
      {1023, "1023 bytes"},
      {1024, "1 KiB (1024 bytes)"},
      {1536, "1.5 KiB (1536 bytes)"},
      {48 << 10, "48 KiB (49152 bytes)"},
      {(1 << 20) - 1, "1 MiB (1048575 bytes)"},
      {1398101, "1.33 MiB (1398101 bytes)"},
      {uint64_t{1} << 30, "1 GiB (1073741824 bytes)"},
      {(uint64_t{1} << 30) + 1, "1 GiB (1073741825 bytes)"},
      {uint64_t{4} << 30, "4 GiB (4294967296 bytes)"},
      {107374182400, "100 GiB (107374182400 bytes)"},
      {150000000000, "139.7 GiB (150000000000 bytes)"},
      {uint64_t{1} << 40, "1 TiB (1099511627776 bytes)"},
      {uint64_t{5} << 50, "5120 TiB (5629499534213120 bytes)"},
      {~uint64_t{0}, "16777216 TiB (18446744073709551615 bytes)"},
  };
  for (const Case& c : cases) EXPECT_EQ(ByteSize(c.bytes), c.text) << c.bytes;
}

// A typo finds its name; a different name finds none.
TEST(NearestNameTest, ATypoFindsItsNameAndOnlyATypoDoes) {
  struct Case {
    std::string name;
    std::vector<std::string> names;
    std::string nearest;  // empty: none
  };
  const std::vector<Case> cases = {
      {"saxpi", {"saxpy", "fill"}, "saxpy"},
      {"sxapy", {"saxpy", "fill"}, "saxpy"},  // two letters swapped
      {"saxp", {"saxpy", "fill"}, "saxpy"},   // one left out
      {"gx_saxpy_", {"gx_saxpy", "gx_fill"}, "gx_saxpy"},
      {"fil", {"saxpy", "fill"}, "fill"},
      {"saxpy", {"saxpy", "fill"}, ""},   // the name itself: no hint
      {"matmul", {"saxpy", "fill"}, ""},  // nothing near
      {"a", {"b"}, ""},                   // one letter off is the whole name
      {"_Z5saxpyifPfS_", {"_Z5saxpyifPKfPf", "_Z4fillPfi"}, "_Z5saxpyifPKfPf"},
      {"x", {}, ""},
      {"", {"saxpy"}, ""},
      {std::string(1000, 's'), {std::string(1000, 's') + "x"}, ""},  // too long to compare
  };
  for (const Case& c : cases) EXPECT_EQ(NearestName(c.name, c.names), c.nearest) << c.name;
}

// A module may hold thousands of kernels: only the first 256 names are
// compared (each at most 128 bytes), so a typo costs the front a bounded
// number of steps.
TEST(NearestNameTest, OnlyTheFirstNamesAreCompared) {
  std::vector<std::string> names(256, std::string(128, 'a'));
  names.push_back("saxpy");
  EXPECT_EQ(NearestName("saxpi", names), "");
  names.erase(names.begin());
  EXPECT_EQ(NearestName("saxpi", names), "saxpy");
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
