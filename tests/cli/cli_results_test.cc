// The gpuexec tool end to end (the fixture: cli_fixture.h): --version,
// module kinds and kernel names from the bytes, results on stdout and
// --print, the progress line on a terminal, Ctrl-C.

#include <fcntl.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cli/cli_fixture.h"

namespace gpuexec::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// ------------------------------------------------------------ version, kinds, kernels, results

TEST_F(CliTest, VersionIsTheToolsAndTheProtocols) {
  Result r = RunRaw({"--version"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "gpuexec 0.1.0 (gpuexec.v1)\n");
  EXPECT_EQ(r.err, "");
}

// The kind comes from the bytes: a module named anything loads, and runs.
TEST_F(CliTest, AModuleOfAnyNameLoadsAsWhatItsBytesSay) {
  WriteFile(Path("kern.bin"), ReadFile(KernelPath()).value_or(""));
  Result r = RunCli({"load", Path("kern.bin")});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("kern.bin"));
  r = RunCli({"run", Path("kern.bin"), "gx_fill_u32", "--grid=1", "--block=32",
              absl::StrCat("out:64:", Path("kern-out.bin")), "u32:3", "u64:16"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(ValuesOf<uint32_t>(ReadFile(Path("kern-out.bin")).value_or("")),
            std::vector<uint32_t>(16, 3u));
}

// 'info FILE' reads the kernel names from the file, without a daemon (the
// target here is one nobody serves).
TEST_F(CliTest, InfoOfAFileListsItsKernels) {
  WriteFile(Path("two.ptx"),
            ".version 8.0\n.target sm_90\n.address_size 64\n"
            ".visible .entry gx_first(\n\t.param .u64 p\n)\n{\n\tret;\n}\n"
            ".visible .entry gx_second()\n{\n\tret;\n}\n");
  const std::string nobody = absl::StrCat("--target=unix:", Path("nobody-here.sock"));
  Result r = RunRaw({nobody, "info", Path("two.ptx")});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "gx_first\ngx_second\n");
  EXPECT_EQ(r.err, "");
  if (!fake()) {
    // The real cubin: gx_saxpy among its kernels.
    r = RunRaw({nobody, "info", KernelPath()});
    EXPECT_EQ(r.exit_code, 0) << r;
    EXPECT_THAT(r.out, HasSubstr("gx_saxpy\n"));
  }
  WriteFile(Path("none.ptx"), ".version 8.0\n.target sm_90\n");
  r = RunRaw({nobody, "info", Path("none.ptx")});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("none.ptx: no kernels found in this PTX; if it is one, name a "
                               "kernel: gpuexec info FILE KERNEL"));
  ExpectOneErrorLine(r);
}

// out:SIZE:- puts the buffer's bytes alone on stdout; --print shows the
// first elements of each buffer saved.
TEST_F(CliTest, ResultsOnStdoutAndPrinted) {
  Result r = RunCli({"run", KernelPath(), "gx_fill_u32", "--grid=1024", "--block=1024",
                     "out:4MiB:-", "u32:7", "u64:1048576"});
  ASSERT_EQ(r.exit_code, 0) << r.exit_code << r.err;
  EXPECT_EQ(r.out.size(), 4u << 20);
  EXPECT_EQ(ValuesOf<uint32_t>(r.out), std::vector<uint32_t>(1 << 20, 7u));
  EXPECT_THAT(r.err,
              StartsWith("gx_fill_u32: grid (1024,1,1) block (1024,1,1) shared 0: GPU time"));
  EXPECT_THAT(r.err, HasSubstr("saved 4194304 bytes of argument 0 to stdout\n"));

  r = RunCli({"run", KernelPath(), "gx_fill_u32", "--grid=1", "--block=32", "--print=u32:4",
              absl::StrCat("out:64:", Path("printed.bin")), "u32:9", "u64:16"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("\narg0[0:4] = 9 9 9 9\nsaved 64 bytes of argument 0 to "));
  EXPECT_EQ(r.err, "");

  // f32 by default 8 elements; the buffer on stdout, the lines on stderr.
  std::vector<float> x = {1.5f, -2.0f, 0.1f, 1e-3f};
  WriteFile(Path("px.bin"), BytesOf(x));
  WriteFile(Path("py.bin"), BytesOf(std::vector<float>(4, 1.0f)));
  r = RunCli({"run", KernelPath(), "gx_saxpy", "--grid=1", "--block=32", "--print=f32", "f32:2",
              absl::StrCat("in:", Path("px.bin")), absl::StrCat("inout:", Path("py.bin"), ":-"),
              "u64:4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("\narg2[0:4] = 4 -3 1.2 1.002\n"));
  EXPECT_EQ(ValuesOf<float>(r.out), (std::vector<float>{4.0f, -3.0f, 2 * 0.1f + 1, 2 * 1e-3f + 1}));
}

// ------------------------------------------------------------ progress

// gpuexec ARGS... with stderr on a terminal (a pseudo-terminal read here)
// and stdout in a file (or on the terminal too, with an empty `out_path`):
// its exit status and what the terminal got.
Result RunOnATerminal(const std::vector<std::string>& args, const std::string& out_path) {
  Result r;
  int master = -1, slave = -1;
  if (openpty(&master, &slave, nullptr, nullptr, nullptr) != 0) return r;
  const pid_t pid = fork();
  if (pid == 0) {
    close(master);
    const int out =
        out_path.empty() ? slave : open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out < 0) _exit(126);
    dup2(out, STDOUT_FILENO);
    dup2(slave, STDERR_FILENO);
    std::vector<std::string> argv = {Env("GPUEXEC_CLI")};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> c_args;
    for (std::string& a : argv) c_args.push_back(a.data());
    c_args.push_back(nullptr);
    execv(c_args[0], c_args.data());
    _exit(127);
  }
  close(slave);
  char buffer[4096];
  for (ssize_t n; (n = read(master, buffer, sizeof(buffer))) > 0;) r.err.append(buffer, n);
  close(master);
  int status = 0;
  waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (!out_path.empty()) r.out = ReadFile(out_path).value_or("");
  return r;
}

// A copy of 64 MiB shows its progress on a terminal, overwritten in place
// and cleared at the end; elsewhere nothing.
TEST_F(CliTest, RepeatRunsTheKernelNTimesAsLaunchesOrAsOneGraph) {
  for (const bool graph : {false, true}) {
    SCOPED_TRACE(graph ? "--graph" : "launches");
    const std::string out = Path(graph ? "graph.bin" : "launches.bin");
    std::vector<std::string> args = {"run",      KernelPath(),  "gx_fill_u32",
                                     "--grid=2", "--block=128", "--repeat=50"};
    if (graph) args.push_back("--graph");
    for (std::string a :
         {absl::StrCat("out:4K:", out), std::string("u32:0xdeadbeef"), std::string("u64:1000")}) {
      args.push_back(a);
    }
    Result r = RunCli(args);
    ASSERT_EQ(r.exit_code, 0) << r;
    EXPECT_THAT(r.out, ::testing::ContainsRegex(
                           graph ? "shared 0: 50 runs as one graph \\(built in [0-9.]+ "
                                   "ms\\), replayed once, GPU time [0-9.]+ ms"
                                 : "shared 0: 50 launches, GPU time [0-9.]+ ms"));
    EXPECT_THAT(r.out, ::testing::ContainsRegex("us each\\); [0-9.]+ us each end to end\n"));
    std::vector<uint32_t> values = ValuesOf<uint32_t>(ReadFile(out).value_or(""));
    ASSERT_EQ(values.size(), 1024u);
    for (uint64_t i = 0; i < values.size(); ++i) {
      ASSERT_EQ(values[i], i < 1000 ? 0xdeadbeefu : 0u) << "element " << i;
    }
  }
  const std::vector<std::string> fill = {"run",        KernelPath(), "gx_fill_u32", "--grid=1",
                                         "--block=32", "zeros:4K",   "u32:1",       "u64:1"};
  auto with = [&](std::vector<std::string> flags) {
    std::vector<std::string> all = fill;
    all.insert(all.begin() + 1, flags.begin(), flags.end());
    return RunCli(all);
  };
  Result zero = with({"--repeat=0"});
  EXPECT_EQ(zero.exit_code, 2) << zero;
  EXPECT_THAT(zero.err, HasSubstr("--repeat takes a count from 1 to 1000000, not '0'"));
  Result big = with({"--repeat=5000", "--graph"});
  EXPECT_EQ(big.exit_code, 2) << big;
  EXPECT_THAT(big.err, HasSubstr("one graph of at most 4096 nodes (the daemon's limit); 5000"));
}

TEST_F(CliTest, ALargeCopyShowsProgressOnATerminalOnly) {
  WriteFile(Path("progress.bin"), std::string(64 << 20, '\0'));
  const std::vector<std::string> args = {
      absl::StrCat("--target=", Target()),
      "run",
      KernelPath(),
      "gx_fill_u32",
      "--grid=1",
      "--block=32",
      absl::StrCat("inout:", Path("progress.bin"), ":", Path("progress-out.bin")),
      "u32:5",
      "u64:16"};
  Result r = RunOnATerminal(args, Path("progress.out"));
  ASSERT_EQ(r.exit_code, 0) << r;
  const std::string what =
      absl::StrCat("inout:", Path("progress.bin"), ":", Path("progress-out.bin"));
  // Each update rewrites the line; the last of each copy is the whole.
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat("\r\033[Kfill argument 0 (", what,
                                            "): 64.0 MiB / 64.0 MiB, ")));
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat("\r\033[Kread argument 0 (", what,
                                            "): 64.0 MiB / 64.0 MiB, ")));
  EXPECT_THAT(r.err, ::testing::EndsWith("B/s\r\033[K")) << "the line is not cleared";
  EXPECT_THAT(r.out, StartsWith("gx_fill_u32: grid (1,1,1)"));

  Result plain = RunRaw(args);
  ASSERT_EQ(plain.exit_code, 0) << plain;
  EXPECT_EQ(plain.err, "");
}

// Bytes are not written to a terminal.
TEST_F(CliTest, ABufferIsNotWrittenToATerminal) {
  Result r =
      RunOnATerminal({absl::StrCat("--target=", Target()), "run", KernelPath(), "gx_fill_u32",
                      "--grid=1", "--block=32", "out:64:-", "u32:1", "u64:16"},
                     "");
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("gpuexec: run: argument 0 (out:64:-) goes to stdout ('-'), a "
                               "terminal: pipe it"));
}

// ------------------------------------------------------------ Ctrl-C

// The suite daemon's device 0 sessions, as `devices` lists them; -1 if it
// cannot be read.
int DeviceSessions(const Result& devices) {
  std::vector<std::string> lines = absl::StrSplit(devices.out, '\n', absl::SkipEmpty());
  if (devices.exit_code != 0 || lines.size() < 2) return -1;
  const size_t at = lines[0].find("SESSIONS");
  if (at == std::string::npos || at < 1 || lines[1].size() < at + 8) return -1;
  int sessions = -1;
  // The column is right-aligned in 8 characters, as its header is.
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(lines[1].substr(at, 8)), &sessions)) return -1;
  return sessions;
}

TEST_F(CliTest, CtrlCOrSigtermClosesTheSessionAtOnce) {
  for (int signal : {SIGINT, SIGTERM}) {
    SCOPED_TRACE(signal == SIGINT ? "SIGINT" : "SIGTERM");
    ASSERT_EQ(DeviceSessions(RunCli({"devices"})), 0);
    // A kernel of 10 s: longer than the test, well short of the daemon's
    // kernel time limit (60 s), whose watchdog would reset the device under
    // the tests that follow while it spins on after its session closed.
    Process cli({Env("GPUEXEC_CLI"), absl::StrCat("--target=", Target()), "run", KernelPath(),
                 "gx_spin", "--grid=1", "--block=1", "u64:10000000000"},
                Path("spin.out"), Path("spin.err"));
    ASSERT_TRUE(WaitFor([&] { return !cli.running() || DeviceSessions(RunCli({"devices"})) == 1; },
                        absl::Seconds(30)));
    ASSERT_TRUE(cli.running()) << ReadFile(Path("spin.err")).value_or("");

    const absl::Time sent = absl::Now();
    ASSERT_EQ(kill(cli.pid(), signal), 0);
    const int code = cli.Wait(absl::Seconds(1));
    EXPECT_LT(absl::Now() - sent, absl::Seconds(1));
    EXPECT_EQ(code, 130);
    EXPECT_EQ(ReadFile(Path("spin.err")).value_or(""),
              absl::StrCat("gpuexec: ", signal == SIGINT ? "interrupted" : "terminated",
                           ": closing the session\n"));
    EXPECT_EQ(ReadFile(Path("spin.out")).value_or(""), "");
    int sessions = -1;
    EXPECT_TRUE(WaitFor([&] { return (sessions = DeviceSessions(RunCli({"devices"}))) == 0; },
                        absl::Seconds(1) - (absl::Now() - sent)))
        << sessions << " sessions";
  }
}

}  // namespace
}  // namespace gpuexec::testing
