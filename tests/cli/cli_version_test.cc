// The tool against a daemon of another MAJOR.MINOR release: one warning line
// on stderr, "gpuexec: warning: ...", and the command runs as usual. The
// daemon plays that release through its test-only
// GPUEXECD_TEST_REPORTED_VERSION.

#include "absl/strings/str_cat.h"
#include "cli_fixture.h"
#include "gpuexec/version.h"

namespace gpuexec::testing {
namespace {

using ::testing::HasSubstr;

TEST_F(CliTest, ADaemonOfAnotherMinorIsOneWarningLineAndTheCommandRuns) {
  const std::string other = absl::StrCat(kVersionMajor, ".", kVersionMinor + 1, ".0");
  const std::string socket = Path("newer.sock");
  const std::string log = Path("newer.log");
  Process daemon({Env("GPUEXEC_TEST_DAEMON"), "--listen=", absl::StrCat("--unix_socket=", socket),
                  absl::StrCat("--driver=", Env("GPUEXEC_TEST_DRIVER"))},
                 Path("newer.out"), log, {absl::StrCat("GPUEXECD_TEST_REPORTED_VERSION=", other)});
  ASSERT_TRUE(WaitFor(
      [&] {
        return !daemon.running() ||
               absl::StrContains(ReadFile(log).value_or(""), "gpuexecd serving");
      },
      absl::Seconds(60)))
      << ReadFile(log).value_or("");
  ASSERT_TRUE(daemon.running()) << ReadFile(log).value_or("");

  const std::string target = absl::StrCat("unix:", socket);
  const std::string warning = absl::StrCat(
      "gpuexec: warning: the daemon at ", target, " runs gpuexecd ", other, ", this client is ",
      kVersion,
      ": a call or field that one of them added since the other's release may be refused or "
      "ignored; use a client of release ",
      kVersionMajor, ".", kVersionMinor + 1, ", or a daemon of this client's\n");

  Result devices = RunRaw({absl::StrCat("--target=", target), "devices"});
  EXPECT_EQ(devices.exit_code, 0) << devices;
  EXPECT_THAT(devices.out, HasSubstr("DEVICE")) << devices;
  EXPECT_EQ(devices.err, warning) << devices;

  // A command that opens a session (and may list devices too): still one.
  Result load = RunRaw({absl::StrCat("--target=", target), "load", KernelPath()});
  EXPECT_EQ(load.exit_code, 0) << load;
  EXPECT_EQ(load.err, warning) << load;

  // The suite's daemon is of this release: nothing is said.
  Result same = RunCli({"devices"});
  EXPECT_EQ(same.exit_code, 0) << same;
  EXPECT_EQ(same.err, "") << same;
}

}  // namespace
}  // namespace gpuexec::testing
