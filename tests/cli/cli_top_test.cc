// gpuexec top end to end (the fixture: cli_fixture.h): a daemon with two
// tenants, team-a with a compute share of 32 SMs (one worker a device,
// --isolation=device, so the share is a green context), its metrics endpoint
// read by the tool while each tenant holds a session, in the order --sort
// gives; an endpoint nothing listens on; and the flags' usage errors. (On a
// terminal, with its keys: cli_top_tmux_test.py.)

#include <regex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gpuexec/client.h"
#include "gpuexec/sha256.h"
#include "gtest/gtest.h"
#include "tests/cli/cli_fixture.h"

namespace gpuexec::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::SizeIs;
using ::testing::StartsWith;

constexpr char kTokenA[] = "cli-top-token-of-team-a-0123456789";
constexpr char kTokenB[] = "cli-top-token-of-team-b-9876543210";

class CliTopTest : public CliTest {
 protected:
  static void SetUpTestSuite() {
    StartSuiteDaemon(
        {"--isolation=device", "--mps=off"},
        absl::StrCat("tenant {\n  name: \"team-a\"\n  token_sha256: \"", Sha256Hex(kTokenA),
                     "\"\n  compute_share { sms: 32 }\n}\n"
                     "tenant {\n  name: \"team-b\"\n  token_sha256: \"",
                     Sha256Hex(kTokenB), "\"\n}\n"));
  }

  static Client As(const char* token) {
    ClientOptions options;
    options.token = token;
    absl::StatusOr<Client> client = Client::Connect(Target(), options);
    EXPECT_TRUE(client.ok()) << client.status();
    return *std::move(client);
  }
};

// A table row's cells: columns are two blanks or more apart, a cell has one
// at most.
std::vector<std::string> Cells(const std::string& row) {
  std::vector<std::string> cells;
  for (absl::string_view c : absl::StrSplit(row, "  ", absl::SkipEmpty())) {
    cells.emplace_back(absl::StripAsciiWhitespace(c));
  }
  return cells;
}

// The line of `frame` that starts with `lead`; "" if none does.
std::string RowOf(const std::string& frame, const std::string& lead) {
  for (absl::string_view line : absl::StrSplit(frame, '\n')) {
    if (absl::StartsWith(line, lead)) return std::string(line);
  }
  return "";
}

TEST_F(CliTopTest, ShowsTheDeviceAndEachTenantWithItsShareAndRates) {
  // team-a runs a kernel and keeps its session; team-b only opens one.
  Client a = As(kTokenA);
  Client b = As(kTokenB);
  absl::StatusOr<Session> sa = a.OpenSession({0});
  ASSERT_TRUE(sa.ok()) << sa.status();
  absl::StatusOr<Session> sb = b.OpenSession({0});
  ASSERT_TRUE(sb.ok()) << sb.status();
  absl::StatusOr<Module> module = sa->LoadModuleFile(KernelPath());
  ASSERT_TRUE(module.ok()) << module.status();
  absl::StatusOr<Function> spin = module->GetFunction("gx_spin");
  ASSERT_TRUE(spin.ok()) << spin.status();
  LaunchConfig config;
  config.grid = {1, 1, 1};
  config.block = {1, 1, 1};
  absl::StatusOr<absl::Duration> ran = sa->LaunchAndWait(*spin, config, {Arg::U64(2'000'000)});
  ASSERT_TRUE(ran.ok()) << ran.status();

  Result r = RunRaw(
      {"top", absl::StrCat("--metrics=", MetricsAddress()), "--frames=2", "--interval=200ms"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.err, "");
  // Not a terminal: no escapes, the frames one after the other, a blank
  // line between them.
  EXPECT_EQ(r.out.find('\033'), std::string::npos) << r;
  const std::string header = absl::StrCat("gpuexec top  ", MetricsAddress(), "  ");
  ASSERT_THAT(r.out, StartsWith(header));
  const size_t second_at = r.out.find(absl::StrCat("\n\n", header));
  ASSERT_NE(second_at, std::string::npos) << r;
  const std::string first = r.out.substr(0, second_at + 1);
  const std::string second = r.out.substr(second_at + 2);
  EXPECT_THAT(RowOf(first, "gpuexec top"),
              ::testing::EndsWith("  every 200ms  sort: GPU %, highest first"));
  // The daemon's refusals (none of its counters names a tenant; the
  // fixture's own calls without a token are among them), the rates from
  // the second frame on.
  EXPECT_TRUE(
      std::regex_match(RowOf(first, "REFUSED"),
                       std::regex("REFUSED  calls [0-9]+  credentials [0-9]+  cool-down 0")))
      << first;
  EXPECT_TRUE(std::regex_match(
      RowOf(second, "REFUSED"),
      std::regex("REFUSED  calls [0-9]+ \\([0-9.]+/s\\)  credentials [0-9]+ \\([0-9.]+/s\\)  "
                 "cool-down 0 \\(0\\.0/s\\)")))
      << second;
  EXPECT_EQ(second.find(absl::StrCat("\n\n", header)), std::string::npos) << "two frames only";

  for (const std::string& frame : {first, second}) {
    std::vector<std::string> device = Cells(RowOf(frame, "0 "));
    // DEVICE NAME HEALTH MEMORY SESSIONS WORKERS BUFFERS RESETS REST-SMS
    ASSERT_THAT(device, SizeIs(9)) << frame;
    EXPECT_EQ(device[2], "healthy") << frame;
    EXPECT_THAT(device[3], HasSubstr(" / ")) << frame;
    EXPECT_EQ(device[4], "2") << frame;  // a session of each tenant
    EXPECT_EQ(device[7], "0") << frame;
    // The double's 132 SMs less team-a's 32.
    if (fake()) {
      EXPECT_EQ(device[8], "100") << frame;
    }
    EXPECT_NE(device[8], "-") << frame;

    // TENANT SESSIONS WORKERS MEMORY SHARE GPU% LAUNCHES/S
    std::vector<std::string> team_a = Cells(RowOf(frame, "team-a "));
    ASSERT_THAT(team_a, SizeIs(7)) << frame;
    EXPECT_EQ(team_a[1], "1") << frame;
    EXPECT_EQ(team_a[4], "0:32") << frame;
    std::vector<std::string> team_b = Cells(RowOf(frame, "team-b "));
    ASSERT_THAT(team_b, SizeIs(7)) << frame;
    EXPECT_EQ(team_b[1], "1") << frame;
    EXPECT_EQ(team_b[4], "-") << frame;
  }
  // Rates need two scrapes: "-" first, then figures.
  EXPECT_EQ(Cells(RowOf(first, "team-a "))[5], "-") << first;
  EXPECT_EQ(Cells(RowOf(first, "team-a "))[6], "-") << first;
  const std::regex rate("[0-9]+\\.[0-9]");
  EXPECT_TRUE(std::regex_match(Cells(RowOf(second, "team-a "))[5], rate)) << second;
  EXPECT_TRUE(std::regex_match(Cells(RowOf(second, "team-a "))[6], rate)) << second;
  EXPECT_TRUE(std::regex_match(Cells(RowOf(second, "team-b "))[5], rate)) << second;
}

TEST_F(CliTopTest, SortGivesTheTenantsOrderAndTheHeaderSaysIt) {
  // Each tenant has a series once it opened a session (the test above, or
  // here).
  for (const char* token : {kTokenA, kTokenB}) {
    Client c = As(token);
    absl::StatusOr<Session> s = c.OpenSession({0});
    ASSERT_TRUE(s.ok()) << s.status();
  }
  Result r =
      RunRaw({"top", absl::StrCat("--metrics=", MetricsAddress()), "--frames=1", "--sort=name"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(RowOf(r.out, "gpuexec top"), ::testing::EndsWith("  sort: tenant, a to z"));
  const size_t a = r.out.find("\nteam-a "), b = r.out.find("\nteam-b ");
  ASSERT_NE(a, std::string::npos) << r;
  ASSERT_NE(b, std::string::npos) << r;
  EXPECT_LT(a, b) << r;
  // Not on a terminal: no line of keys.
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("keys:")));
}

TEST_F(CliTopTest, TheEndpointComesFromTheEnvironmentToo) {
  Result r = RunRaw({"top", "--frames=1"},
                    {absl::StrCat("GPUEXEC_METRICS=http://", MetricsAddress(), "/metrics")});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, StartsWith(absl::StrCat("gpuexec top  ", MetricsAddress(), "  ")));
  EXPECT_THAT(r.out, HasSubstr("\nDEVICE  NAME"));
  EXPECT_THAT(r.out, HasSubstr("\nTENANT  SESSIONS"));
}

TEST_F(CliTopTest, AnEndpointNothingListensOnIsOneLineSayingWhatToDo) {
  const std::string address = absl::StrCat("127.0.0.1:", FreePort());
  Result r = RunRaw({"top", "--metrics=" + address, "--frames=1"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, absl::StrCat("gpuexec: top: cannot reach the metrics endpoint at ", address,
                                ": Connection refused; start gpuexecd with --metrics_listen=",
                                address, ", or give --metrics=HOST:PORT\n"));
}

TEST_F(CliTopTest, AnAnswerThatIsNotTheMetricsSaysSo) {
  Result r = RunRaw(
      {"top", absl::StrCat("--metrics=http://", MetricsAddress(), "/nothing"), "--frames=1"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_EQ(r.err, absl::StrCat("gpuexec: top: the metrics endpoint at ", MetricsAddress(),
                                "/nothing answered HTTP 404 Not Found for /nothing; give "
                                "--metrics the address of gpuexecd's --metrics_listen\n"));
}

TEST_F(CliTopTest, BadFlagValuesAreUsageErrors) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"top", "--interval=1ms"}, "--interval: 1ms is outside 100ms to 1h"},
      {{"top", "--interval=2h"}, "--interval: 2h is outside 100ms to 1h"},
      {{"top", "--interval=soon"}, "--interval: 'soon' is not a duration (30s, 500ms, 2m)"},
      {{"top", "--frames=0"}, "--frames: '0' is not a count from 1 to 1000000"},
      {{"top", "--frames=many"}, "--frames: 'many' is not a count from 1 to 1000000"},
      {{"top", "--frames=1000001"}, "--frames: '1000001' is not a count from 1 to 1000000"},
      {{"top", "--metrics=::1:9464"}, "an IPv6 address goes in brackets, [::1]:9464"},
      {{"top", "--metrics=localhost"}, "--metrics: 'localhost' is not HOST:PORT"},
      {{"top", "--timeout=never"}, "--timeout: 'never' is not a duration"},
      {{"top", "--sort=cpu"},
       "--sort: 'cpu' is not one of gpu, memory, sessions, workers, launches, name"},
      {{"devices", "--sort=name"}, "--sort applies to 'top' only"},
      {{"top", "extra"}, "top takes no arguments"},
      {{"devices", "--frames=1"}, "--frames applies to 'top' only"},
      {{"--interval=1s", "top"}, "--interval is a flag of 'top': give it after the command"},
  };
  for (const auto& [args, message] : cases) {
    Result r = RunRaw(args);
    EXPECT_EQ(r.exit_code, 2) << absl::StrJoin(args, " ") << "\n" << r;
    EXPECT_THAT(r.err, HasSubstr(message)) << absl::StrJoin(args, " ");
    ExpectOneErrorLine(r);
  }
}

}  // namespace
}  // namespace gpuexec::testing
