// The Prometheus text format as `gpuexec top` reads it (metrics_text.h):
// a valid exposition with every form it may take, each malformed form
// refused naming its line, and the bounds.

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/metrics_text.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gpuexec::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

TEST(MetricsTextTest, ReadsEveryFormOfAValidExposition) {
  const std::string text =
      "# HELP gpuexec_devices Devices the daemon serves.\n"
      "# TYPE gpuexec_devices gauge\n"
      "gpuexec_devices 2\n"
      "\n"
      "# a comment of no kind\n"
      "gpuexec_device_healthy{device=\"0\",name=\"simulated H200 (gpuexec)\"} 1\n"
      "m{a=\"back\\\\slash\",b=\"a \\\"quote\\\"\",c=\"two\\nlines\"} -1.5e3\n"
      "  m_spaced { a = \"1\" , b=\"\", } +2.25 1700000000000\r\n"
      "inf_up +Inf\n"
      "inf_down -Inf\n"
      "not_a_number NaN\n"
      "with:colon_7{le=\"0.005\"} 0\t-12\n"
      "last_without_newline .5";
  absl::StatusOr<std::vector<MetricSample>> samples = ParseMetricsText(text);
  ASSERT_TRUE(samples.ok()) << samples.status();
  ASSERT_EQ(samples->size(), 9u);
  const std::vector<MetricSample>& s = *samples;
  EXPECT_EQ(s[0].name, "gpuexec_devices");
  EXPECT_TRUE(s[0].labels.empty());
  EXPECT_EQ(s[0].value, 2);
  EXPECT_FALSE(s[0].timestamp_ms.has_value());
  EXPECT_THAT(s[1].labels,
              ElementsAre(Pair("device", "0"), Pair("name", "simulated H200 (gpuexec)")));
  ASSERT_NE(s[1].Label("name"), nullptr);
  EXPECT_EQ(*s[1].Label("name"), "simulated H200 (gpuexec)");
  EXPECT_EQ(s[1].Label("tenant"), nullptr);
  EXPECT_THAT(s[2].labels, ElementsAre(Pair("a", "back\\slash"), Pair("b", "a \"quote\""),
                                       Pair("c", "two\nlines")));
  EXPECT_EQ(s[2].value, -1500);
  EXPECT_EQ(s[3].name, "m_spaced");
  EXPECT_THAT(s[3].labels, ElementsAre(Pair("a", "1"), Pair("b", "")));
  EXPECT_EQ(s[3].value, 2.25);
  EXPECT_EQ(s[3].timestamp_ms, 1700000000000);
  EXPECT_EQ(s[4].value, std::numeric_limits<double>::infinity());
  EXPECT_EQ(s[5].value, -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(s[6].value));
  EXPECT_EQ(s[7].name, "with:colon_7");
  EXPECT_EQ(s[7].timestamp_ms, -12);
  EXPECT_EQ(s[8].value, 0.5);
}

TEST(MetricsTextTest, EachMalformedLineIsRefusedNamingIt) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"1abc 1", "expected a metric name at column 1"},
      {"{a=\"1\"} 1", "expected a metric name"},
      {"m", "expected a blank before the value"},
      {"m one", "expected a value (a number, +Inf, -Inf or NaN), not 'one'"},
      {"m inf", "not 'inf'"},
      {"m 0x10", "not '0x10'"},
      {"m 1 soon", "expected a timestamp in whole milliseconds"},
      {"m 1 2.5", "expected a timestamp in whole milliseconds"},
      {"m 1 2 3", "expected the end of the line after the timestamp"},
      {"m{a} 1", "expected '=' after a label name"},
      {"m{a=x} 1", "expected a quoted label value"},
      {"m{1a=\"x\"} 1", "expected a label name or '}'"},
      {"m{a=\"x\" b=\"y\"} 1", "expected ',' or '}' after a label value"},
      {"m{a=\"x} 1", "expected the closing '\"' of a label value"},
      {"m{a=\"x\\", "expected the closing '\"' of a label value"},
      {"m{a=\"\\t\"} 1", "expected one of the escapes"},
      {"m{a=\"1\",a=\"2\"} 1", "label 'a' given twice"},
      {"m{a=\"1\"}1", "expected a blank before the value"},
  };
  for (const auto& [line, message] : cases) {
    absl::StatusOr<std::vector<MetricSample>> r =
        ParseMetricsText(absl::StrCat("# TYPE m gauge\nok 1\n", line, "\n"));
    ASSERT_FALSE(r.ok()) << line;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << line;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("metrics line 3: ")) << line;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(message)) << line;
  }
}

TEST(MetricsTextTest, ARefusedLineIsQuotedShortAndEscaped) {
  const std::string line = absl::StrCat("m{a=\"\x1b[2J", std::string(500, 'x'), "\\q\"} 1");
  absl::StatusOr<std::vector<MetricSample>> r = ParseMetricsText(line);
  ASSERT_FALSE(r.ok());
  const std::string message(std::string(r.status().message()));
  EXPECT_THAT(message, HasSubstr("metrics line 1: "));
  EXPECT_THAT(message, HasSubstr("m{a=\\\"\\x1b[2Jxxx"));
  EXPECT_THAT(message, HasSubstr("'..."));
  EXPECT_EQ(message.find('\x1b'), std::string::npos);
  EXPECT_LT(message.size(), 250u);
}

TEST(MetricsTextTest, TheBoundsAreKept) {
  MetricsTextLimits limits;
  limits.max_samples = 3;
  limits.max_labels = 2;
  limits.max_line_bytes = 100;
  EXPECT_TRUE(ParseMetricsText("a 1\nb 2\n# a comment is no sample\nc 3\n", limits).ok());
  absl::StatusOr<std::vector<MetricSample>> r = ParseMetricsText("a 1\nb 2\nc 3\nd 4\n", limits);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("metrics line 4: more than 3 samples"));

  EXPECT_TRUE(ParseMetricsText("m{a=\"1\",b=\"2\"} 1", limits).ok());
  r = ParseMetricsText("m{a=\"1\",b=\"2\",c=\"3\"} 1", limits);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("metrics line 1: more than 2 labels on one sample"));

  r = ParseMetricsText(absl::StrCat("a 1\n# ", std::string(99, 'c'), "\n"), limits);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("metrics line 2: longer than 100 bytes"));

  // The defaults: 100,000 samples, 64 labels.
  std::string many;
  for (int i = 0; i < 100'001; ++i) absl::StrAppend(&many, "s ", i, "\n");
  r = ParseMetricsText(many);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("more than 100000 samples"));
  std::string labels = "m{";
  for (int i = 0; i < 65; ++i) absl::StrAppend(&labels, "l", i, "=\"v\",");
  r = ParseMetricsText(absl::StrCat(labels, "} 1"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("more than 64 labels"));
}

}  // namespace
}  // namespace gpuexec::cli
