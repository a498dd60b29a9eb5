// What a frame of `gpuexec top` shows (top_frame.h), from expositions of
// the daemon's form: the device and tenant rows, the rates between two
// scrapes and their order, each sort and its header, "-" where there is no
// figure yet, a restarted daemon's counters, the refusals and draining
// lines, hostile label values, and the frame of a failed scrape.

#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "cli/metrics_text.h"
#include "cli/top_frame.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gpuexec::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

const absl::Time kT0 = absl::FromUnixSeconds(1'800'000'000);

TopScrape ScrapeAt(const std::string& text, absl::Time at) {
  absl::StatusOr<std::vector<MetricSample>> samples = ParseMetricsText(text);
  EXPECT_TRUE(samples.ok()) << samples.status();
  return ScrapeOf(samples.value_or(std::vector<MetricSample>{}), at);
}

// The daemon's series for one device with compute shares, and two tenants
// whose counters are given.
std::string Exposition(const std::string& a_gpu, const std::string& a_launches,
                       const std::string& b_gpu, const std::string& b_launches) {
  return "# TYPE gpuexec_devices gauge\n"
         "gpuexec_devices 1\n"
         "gpuexec_device_healthy{device=\"0\",name=\"simulated H200 (gpuexec)\"} 1\n"
         "gpuexec_device_answering{device=\"0\"} 1\n"
         "gpuexec_device_memory_total_bytes{device=\"0\"} 17179869184\n"
         "gpuexec_device_memory_used_bytes{device=\"0\"} 1073741824\n"
         "gpuexec_device_sessions{device=\"0\"} 3\n"
         "gpuexec_device_buffers{device=\"0\"} 4\n"
         "gpuexec_device_resets_total{device=\"0\"} 1\n"
         "gpuexec_device_workers{device=\"0\"} 2\n"
         "gpuexec_kernel_launches_total{device=\"0\"} 99\n"
         "gpuexec_sessions_closed_total{reason=\"client\"} 5\n"
         "gpuexec_tenant_sessions{tenant=\"team-a\"} 2\n"
         "gpuexec_tenant_sessions{tenant=\"team-b\"} 1\n"
         "gpuexec_tenant_workers{tenant=\"team-a\"} 0\n"
         "gpuexec_tenant_workers{tenant=\"team-b\"} 0\n"
         "gpuexec_tenant_memory_held_bytes{tenant=\"team-a\"} 2097152\n"
         "gpuexec_tenant_memory_held_bytes{tenant=\"team-b\"} 0\n"
         "gpuexec_tenant_launches_total{tenant=\"team-a\"} " +
         a_launches + "\ngpuexec_tenant_launches_total{tenant=\"team-b\"} " + b_launches +
         "\ngpuexec_tenant_gpu_seconds_total{tenant=\"team-a\"} " + a_gpu +
         "\ngpuexec_tenant_gpu_seconds_total{tenant=\"team-b\"} " + b_gpu +
         "\ngpuexec_tenant_compute_share_sms{tenant=\"team-a\",device=\"0\"} 32\n"
         "gpuexec_device_compute_share_rest_sms{device=\"0\"} 100\n";
}

TopHeader Header(absl::Time now) {
  return TopHeader{"127.0.0.1:9464", now, absl::Seconds(2), absl::UTCTimeZone(), TopSort{}, false};
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

TEST(TopFrameTest, TheFirstFrameShowsDevicesAndTenantsWithoutRates) {
  const TopScrape s = ScrapeAt(Exposition("10", "100", "20", "200"), kT0);
  ASSERT_EQ(s.devices.size(), 1u);
  EXPECT_EQ(s.devices[0].name, "simulated H200 (gpuexec)");
  ASSERT_EQ(s.tenants.size(), 2u);
  EXPECT_THAT(s.tenants[0].share_sms, ElementsAre(std::pair<const std::string, double>("0", 32)));
  const std::string frame = TopFrame(Header(kT0), s, nullptr);
  EXPECT_THAT(
      Lines(frame),
      ElementsAre(
          "gpuexec top  127.0.0.1:9464  2027-01-15 08:00:00  every 2s  sort: GPU %, highest first",
          "DEVICE  NAME                      HEALTH   MEMORY USED / TOTAL  SESSIONS  WORKERS  "
          "BUFFERS  RESETS  REST SMS",
          "0       simulated H200 (gpuexec)  healthy   1.0 GiB / 16.0 GiB         3        2  "
          "      4       1       100",
          "TENANT  SESSIONS  WORKERS   MEMORY  SHARE DEV:SMS  GPU %  LAUNCHES/S",
          "team-a         2        0  2.0 MiB  0:32               -           -",
          "team-b         1        0      0 B  -                  -           -"));
}

TEST(TopFrameTest, RatesComeFromTwoScrapesAndTheBusiestTenantLeads) {
  const TopScrape first = ScrapeAt(Exposition("10", "100", "20", "200"), kT0);
  // 2 s later: team-b used 0.5 s of GPU (25%) and launched 10 (5/s); team-a
  // 1.5 s (75%) and 40 (20/s).
  const TopScrape second =
      ScrapeAt(Exposition("11.5", "140", "20.5", "210"), kT0 + absl::Seconds(2));
  const std::vector<std::string> lines =
      Lines(TopFrame(Header(kT0 + absl::Seconds(2)), second, &first));
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_EQ(lines[4], "team-a         2        0  2.0 MiB  0:32            75.0        20.0");
  EXPECT_EQ(lines[5], "team-b         1        0      0 B  -               25.0         5.0");
  // Reversed, team-b leads.
  const TopScrape third =
      ScrapeAt(Exposition("11.5", "140", "22.5", "210"), kT0 + absl::Seconds(4));
  EXPECT_THAT(Lines(TopFrame(Header(kT0), third, &second))[4], ::testing::StartsWith("team-b"));
}

// The tenants' names in the frame's order.
std::vector<std::string> TenantOrder(const std::string& frame) {
  std::vector<std::string> names;
  bool tenants = false;
  for (const std::string& line : Lines(frame)) {
    if (line.rfind("TENANT ", 0) == 0) {
      tenants = true;
    } else if (tenants && line.rfind("keys:", 0) != 0) {
      names.push_back(line.substr(0, line.find(' ')));
    }
  }
  return names;
}

TEST(TopFrameTest, EachColumnSortsItsWayAndTheHeaderSaysWhich) {
  // team-a: 2 sessions, 2 MiB, 1 worker, GPU 75%, 20 launches/s; team-b: 1,
  // 0 B, 3 workers, 25%, 30/s; team-c: no figures but its sessions, 5.
  auto text = [](const char* a_gpu, const char* a_launches, const char* b_gpu,
                 const char* b_launches) {
    std::string t = Exposition(a_gpu, a_launches, b_gpu, b_launches);
    t += "gpuexec_tenant_sessions{tenant=\"team-c\"} 5\n";
    t += "gpuexec_tenant_workers{tenant=\"team-b\"} 3\n";
    return t;
  };
  const TopScrape first = ScrapeAt(text("10", "100", "20", "200"), kT0);
  const TopScrape second = ScrapeAt(text("11.5", "140", "20.5", "260"), kT0 + absl::Seconds(2));
  struct Case {
    TopSort sort;
    std::string shown;
    std::vector<std::string> order;
  };
  const std::vector<Case> cases = {
      {{TopColumn::kGpu, false}, "GPU %, highest first", {"team-a", "team-b", "team-c"}},
      {{TopColumn::kGpu, true}, "GPU %, lowest first", {"team-b", "team-a", "team-c"}},
      {{TopColumn::kMemory, false}, "memory, highest first", {"team-a", "team-b", "team-c"}},
      {{TopColumn::kMemory, true}, "memory, lowest first", {"team-b", "team-a", "team-c"}},
      {{TopColumn::kSessions, false}, "sessions, highest first", {"team-c", "team-a", "team-b"}},
      {{TopColumn::kSessions, true}, "sessions, lowest first", {"team-b", "team-a", "team-c"}},
      {{TopColumn::kWorkers, false}, "workers, highest first", {"team-b", "team-a", "team-c"}},
      {{TopColumn::kLaunches, false}, "launches/s, highest first", {"team-b", "team-a", "team-c"}},
      {{TopColumn::kLaunches, true}, "launches/s, lowest first", {"team-a", "team-b", "team-c"}},
      {{TopColumn::kName, false}, "tenant, a to z", {"team-a", "team-b", "team-c"}},
      {{TopColumn::kName, true}, "tenant, z to a", {"team-c", "team-b", "team-a"}},
  };
  for (const Case& c : cases) {
    TopHeader header = Header(kT0);
    header.sort = c.sort;
    const std::string frame = TopFrame(header, second, &first);
    EXPECT_EQ(Lines(frame)[0],
              "gpuexec top  127.0.0.1:9464  2027-01-15 08:00:00  every 2s  sort: " + c.shown);
    EXPECT_EQ(TenantOrder(frame), c.order) << c.shown << "\n" << frame;
  }
  // The first frame has no rates: by name, whichever way.
  TopHeader header = Header(kT0);
  header.sort = {TopColumn::kLaunches, true};
  EXPECT_THAT(TenantOrder(TopFrame(header, first, nullptr)),
              ElementsAre("team-a", "team-b", "team-c"));
}

TEST(TopFrameTest, SortColumnsHaveANameAndAKey) {
  EXPECT_EQ(TopColumnNames(), "gpu, memory, sessions, workers, launches, name");
  const std::vector<std::pair<std::string, char>> names = {{"gpu", 'g'},      {"memory", 'm'},
                                                           {"sessions", 's'}, {"workers", 'w'},
                                                           {"launches", 'l'}, {"name", 'n'}};
  for (const auto& [name, key] : names) {
    ASSERT_TRUE(TopColumnNamed(name).has_value()) << name;
    EXPECT_EQ(TopColumnNamed(name), TopColumnOfKey(key)) << name;
  }
  EXPECT_EQ(TopColumnNamed("GPU"), std::nullopt);
  EXPECT_EQ(TopColumnNamed(""), std::nullopt);
  EXPECT_EQ(TopColumnOfKey('q'), std::nullopt);
  EXPECT_EQ(TopColumnOfKey('r'), std::nullopt);
  EXPECT_EQ(TopColumnOfKey('G'), std::nullopt);
}

TEST(TopFrameTest, RefusalsAndDrainingAreLinesUnderTheHeader) {
  auto text = [](const char* denied, const char* unknown_token, const char* strikes,
                 const char* draining) {
    return Exposition("10", "100", "20", "200") +
           "grpc_server_handled_total{grpc_service=\"gpuexec.v1.GpuExec\",grpc_method="
           "\"OpenSession\",grpc_type=\"unary\",grpc_code=\"OK\"} 50\n"
           "grpc_server_handled_total{grpc_service=\"gpuexec.v1.GpuExec\",grpc_method="
           "\"OpenSession\",grpc_type=\"unary\",grpc_code=\"PERMISSION_DENIED\"} " +
           denied +
           "\n"
           "grpc_server_handled_total{grpc_service=\"gpuexec.v1.GpuExec\",grpc_method="
           "\"ListDevices\",grpc_type=\"unary\",grpc_code=\"UNAUTHENTICATED\"} " +
           unknown_token +
           "\n"
           "grpc_server_handled_total{grpc_service=\"gpuexec.v1.GpuExec\",grpc_method="
           "\"Execute\",grpc_type=\"bidi_stream\",grpc_code=\"NOT_FOUND\"} 7\n"
           "gpuexec_auth_refused_total{reason=\"no_credentials\"} 0\n"
           "gpuexec_auth_refused_total{reason=\"unknown_token\"} " +
           unknown_token + "\ngpuexec_strike_refusals_total " + strikes + "\n" + draining;
  };
  const TopScrape first = ScrapeAt(text("2", "1", "0", ""), kT0);
  EXPECT_EQ(first.refusals.calls, 3);
  EXPECT_EQ(first.refusals.credentials, 1);
  EXPECT_EQ(first.refusals.cool_down, 0);
  EXPECT_EQ(first.draining, std::nullopt);
  std::vector<std::string> lines = Lines(TopFrame(Header(kT0), first, nullptr));
  EXPECT_EQ(lines[1], "REFUSED  calls 3  credentials 1  cool-down 0");
  EXPECT_THAT(lines[2], ::testing::StartsWith("DEVICE"));

  // 2 s later: 4 more refused calls, 2 of them for credentials, and 1
  // launch in a cool-down; the daemon drains.
  const TopScrape second =
      ScrapeAt(text("4", "3", "1", "gpuexec_draining 1\n"), kT0 + absl::Seconds(2));
  lines = Lines(TopFrame(Header(kT0), second, &first));
  EXPECT_EQ(lines[1],
            "DRAINING: the daemon opens no new sessions; open ones go on until the drain's "
            "deadline");
  EXPECT_EQ(lines[2], "REFUSED  calls 7 (2.0/s)  credentials 3 (1.0/s)  cool-down 1 (0.5/s)");

  // Draining at 0, and a daemon without refusal counters: no lines.
  lines = Lines(TopFrame(Header(kT0),
                         ScrapeAt(Exposition("1", "1", "1", "1") + "gpuexec_draining 0\n", kT0),
                         nullptr));
  EXPECT_THAT(lines[1], ::testing::StartsWith("DEVICE"));
}

TEST(TopFrameTest, WithKeysTheFrameEndsNamingThem) {
  TopHeader header = Header(kT0);
  header.keys = true;
  const std::string keys =
      "keys: g GPU %, m memory, s sessions, w workers, l launches/s, n tenant, r reverse, q quit";
  EXPECT_EQ(Lines(TopFrame(header, ScrapeAt(Exposition("1", "1", "1", "1"), kT0), nullptr)).back(),
            keys);
  EXPECT_EQ(Lines(TopFailedFrame(header, "Connection refused", kT0)).back(), keys);
}

TEST(TopFrameTest, ACounterThatWentDownIsNoRateAndANewTenantCountsFromZero) {
  const TopScrape before = ScrapeAt(Exposition("10", "100", "20", "200"), kT0);
  // The daemon restarted: team-a's counters began again.
  std::string text = Exposition("1", "4", "21", "200");
  text +=
      "gpuexec_tenant_sessions{tenant=\"team-c\"} 1\n"
      "gpuexec_tenant_gpu_seconds_total{tenant=\"team-c\"} 0.2\n"
      "gpuexec_tenant_launches_total{tenant=\"team-c\"} 2\n";
  const TopScrape after = ScrapeAt(text, kT0 + absl::Seconds(1));
  const std::vector<std::string> lines = Lines(TopFrame(Header(kT0), after, &before));
  ASSERT_EQ(lines.size(), 7u);
  EXPECT_THAT(lines[4], ::testing::StartsWith("team-b"));
  EXPECT_THAT(lines[4], ::testing::EndsWith("100.0         0.0"));
  EXPECT_THAT(lines[5], ::testing::StartsWith("team-c"));
  EXPECT_THAT(lines[5], ::testing::EndsWith("20.0         2.0"));
  EXPECT_THAT(lines[6], ::testing::StartsWith("team-a"));
  EXPECT_THAT(lines[6], ::testing::EndsWith("-           -"));
}

TEST(TopFrameTest, WithoutSharesAndWithoutTenantsTheFrameSaysSo) {
  const TopScrape s = ScrapeAt(
      "gpuexec_device_healthy{device=\"1\",name=\"GPU b\"} 0\n"
      "gpuexec_device_answering{device=\"1\"} 1\n"
      "gpuexec_device_healthy{device=\"10\",name=\"GPU c\"} 1\n"
      "gpuexec_device_answering{device=\"10\"} 0\n"
      "gpuexec_device_buffers{device=\"2\"} 0\n",
      kT0);
  const std::string frame = TopFrame(Header(kT0), s, nullptr);
  const std::vector<std::string> lines = Lines(frame);
  ASSERT_EQ(lines.size(), 6u);
  // Numerically ordered; restarting, silent, and a device the scrape has
  // only the engine's figures of.
  EXPECT_EQ(lines[2],
            "1       GPU b  restarting                ? / ?         ?        ?        ?       ?"
            "         -");
  EXPECT_EQ(lines[3],
            "2       ?      ?                         ? / ?         ?        ?        0       ?"
            "         -");
  EXPECT_EQ(lines[4],
            "10      GPU c  silent                    ? / ?         ?        ?        ?       ?"
            "         -");
  EXPECT_EQ(lines[5], "no tenants yet (a tenant shows once it opens a session)");

  const std::string empty = TopFrame(Header(kT0), ScrapeAt("up 1\n", kT0), nullptr);
  EXPECT_THAT(empty, HasSubstr("no devices in this exposition (is it gpuexecd's"));
}

TEST(TopFrameTest, LabelValuesArePrintedEscapedAndShort) {
  const TopScrape s = ScrapeAt(
      "gpuexec_tenant_sessions{tenant=\"\x1b]0;owned\x07\\nforged line\"} 1\n"
      "gpuexec_tenant_sessions{tenant=\"" +
          std::string(300, 'L') +
          "\"} 1\n"
          "gpuexec_device_healthy{device=\"0\",name=\"\x1b[2J\"} 1\n",
      kT0);
  const std::string frame = TopFrame(Header(kT0), s, nullptr);
  EXPECT_EQ(frame.find('\x1b'), std::string::npos);
  EXPECT_EQ(frame.find('\x07'), std::string::npos);
  EXPECT_THAT(frame, HasSubstr("\\x1b]0;owned\\x07\\x0aforged line"));
  EXPECT_THAT(frame, HasSubstr("\\x1b[2J"));
  EXPECT_THAT(frame, HasSubstr(std::string(40, 'L') + "..."));
  EXPECT_THAT(frame, Not(HasSubstr(std::string(41, 'L'))));
}

TEST(TopFrameTest, AFailedScrapeIsALineOfTheFrame) {
  const std::string frame =
      TopFailedFrame(Header(kT0 + absl::Seconds(7)), "Connection refused", kT0 + absl::Seconds(3));
  EXPECT_THAT(Lines(frame),
              ElementsAre("gpuexec top  127.0.0.1:9464  2027-01-15 08:00:07  every 2s  "
                          "sort: GPU %, highest first",
                          "scrape failed: Connection refused",
                          "(the last answer came at 08:00:03; trying again every 2s)"));
}

}  // namespace
}  // namespace gpuexec::cli
