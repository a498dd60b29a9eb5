// gpuexec drain against a daemon of the suite's own, over its Unix socket
// as the daemon's own user (the test runs as that user): a drain refuses new
// sessions (a `run` fails saying so) and shows in the metrics, --wait
// returns once none is open, --resume serves again; bad flags are usage
// errors.

#include "tests/cli/cli_fixture.h"

namespace gpuexec::testing {
namespace {

using ::testing::HasSubstr;

class CliDrainTest : public CliTest {
 protected:
  Result Run() {
    return RunCli({"run", KernelPath(), "gx_fill_u32", "--grid=1", "--block=32", "out:64:-",
                   "u32:7", "u64:16"});
  }
};

TEST_F(CliDrainTest, ADrainRefusesNewSessionsUntilResumed) {
  ASSERT_EQ(Run().exit_code, 0);
  Result r = RunCli({"drain", "--deadline=30s"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("draining since "));
  EXPECT_THAT(r.out, HasSubstr("(the Drain call of unix:uid="));
  EXPECT_THAT(r.out, HasSubstr("0 session(s) open"));
  EXPECT_EQ(Metric("gpuexec_draining"), 1);

  r = Run();
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("UNAVAILABLE: daemon unix:"));
  EXPECT_THAT(r.err, HasSubstr("this daemon is draining and opens no new session"));
  ExpectOneErrorLine(r);
  // Nothing is open: --wait answers at once.
  r = RunCli({"drain", "--deadline=30s", "--wait"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("0 session(s) open"));

  r = RunCli({"drain", "--resume"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "not draining: new sessions are served (0 open)\n");
  EXPECT_EQ(Metric("gpuexec_draining"), 0);
  EXPECT_EQ(Run().exit_code, 0);
}

TEST_F(CliDrainTest, BadFlagsAreUsageErrors) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"drain", "--deadline=25h"},
        std::vector<std::string>{"drain", "--deadline=soon"},
        std::vector<std::string>{"drain", "--resume", "--wait"},
        std::vector<std::string>{"drain", "now"}}) {
    Result r = RunCli(args);
    EXPECT_EQ(r.exit_code, 2) << r;
    ExpectOneErrorLine(r);
  }
  EXPECT_EQ(Metric("gpuexec_draining"), 0) << "no bad line drained it";
}

}  // namespace
}  // namespace gpuexec::testing
