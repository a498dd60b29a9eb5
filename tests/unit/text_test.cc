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

}  // namespace
}  // namespace gpuexec
