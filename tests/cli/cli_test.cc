// The gpuexec tool end to end (the fixture: cli_fixture.h): help and usage,
// devices, load, info and run.

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gpuexec/sha256.h"
#include "gtest/gtest.h"
#include "tests/cli/cli_fixture.h"

namespace gpuexec::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// ------------------------------------------------------------ help and usage

TEST_F(CliTest, HelpExplainsTheCommandsAndArguments) {
  Result r = RunRaw({"--help"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("Usage: gpuexec"));
  EXPECT_THAT(r.out, HasSubstr("gpuexec run saxpy.cubin saxpy --grid=4096 --block=256"));
  EXPECT_EQ(r.err, "");

  r = RunRaw({"help", "run"});
  EXPECT_EQ(r.exit_code, 0) << r;
  for (const char* s : {"in:FILE", "zeros:SIZE", "fill:TYPE:VALUE:COUNT", "out:SIZE:FILE",
                        "inout:FILE", "bytes:HEX", "null", "--triton=META.json", "f32:2.5"}) {
    EXPECT_THAT(r.out, HasSubstr(s));
  }
  Result same = RunRaw({"run", "--help"});
  EXPECT_EQ(same.exit_code, 0) << same;
  EXPECT_EQ(same.out, r.out);
}

TEST_F(CliTest, UsageErrorsExitTwoWithOneLine) {
  const std::string k = KernelPath();
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"frobnicate"}, "unknown command 'frobnicate'"},
      {{"devices", "--bogus=1"}, "unknown flag '--bogus=1'"},
      {{"devices", "extra"}, "devices takes no arguments"},
      {{"devices", "--grid=1"}, "--grid applies to 'run' only"},
      {{"load"}, "load takes one FILE"},
      {{"info", k, "gx_saxpy", "extra"}, "info takes FILE, or FILE KERNEL"},
      {{"help", "nothing"}, "no command 'nothing'"},
      {{"run", k, "gx_saxpy", "--block=256"}, "--grid is required"},
      {{"run", k, "gx_saxpy", "--grid=1"}, "--block is required"},
      {{"run", k, "gx_saxpy", "--grid=0", "--block=1"}, "--grid"},
      {{"run", k, "gx_saxpy", "--grid=1", "--block=1", "f32:two"}, "argument 0 'f32:two'"},
      {{"run", k, "gx_saxpy", "--grid=1", "--block=1", "f32:2", "x.bin"}, "argument 1 'x.bin'"},
      {{"run", k, "gx_saxpy", "--grid=1", "--block=1", "--shared=lots"}, "--shared"},
      {{"run", "--triton=m.json", k, "--grid=1", "--block=32"}, "--block comes from the Triton"},
      {{"--timeout=soon", "devices"}, "--timeout"},
      {{"--device=first", "load", k}, "--device"},
      {{"--memory=lots", "load", k}, "--memory: 'lots' is not a size"},
      {{"--min_cc=nine", "load", k}, "--min_cc: 'nine' is not a compute capability"},
      {{"--min_cc=9.0", "load", k}, "--min_cc places a session in a pool"},
      {{"--target=pool://127.0.0.1:1", "--device=0", "load", k}, "a pool target places"},
      {{"--target=pool://127.0.0.1", "devices"}, "is not HOST:PORT"},
  };
  for (const auto& [args, message] : cases) {
    // A case that names its own target runs as given.
    Result r = absl::StartsWith(args[0], "--target=") ? RunRaw(args) : RunCli(args);
    EXPECT_EQ(r.exit_code, 2) << absl::StrJoin(args, " ") << "\n" << r;
    EXPECT_THAT(r.err, HasSubstr(message)) << absl::StrJoin(args, " ");
    ExpectOneErrorLine(r);
  }
  Result r = RunRaw({});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("Usage: gpuexec"));
}

TEST_F(CliTest, AnUnreachableDaemonIsOneLineAndExitOne) {
  Result r =
      RunRaw({absl::StrCat("--target=unix:", Path("nobody-here.sock")), "--timeout=2s", "devices"});
  EXPECT_EQ(r.exit_code, 1) << r;
  // The client library's own line, the target named once, with the remedy.
  EXPECT_THAT(r.err, StartsWith(absl::StrCat("gpuexec: cannot connect to unix:",
                                             Path("nobody-here.sock"), ": no socket there: ")));
  EXPECT_THAT(r.err, HasSubstr("is gpuexecd running? (--target, $GPUEXEC_TARGET)"));
  EXPECT_THAT(r.err,
              Not(HasSubstr("connect to unix:" + Path("nobody-here.sock") + ": UNAVAILABLE")));
  ExpectOneErrorLine(r);
}

// A daemon with tenants: the token comes from --token_file or
// $GPUEXEC_TOKEN, and without it the daemon's refusal is the one line.
TEST_F(CliTest, ATokenFromAFileOrTheEnvironmentNamesTheTenant) {
  const std::string token = "cli-test-token-0123456789";
  const std::string tenants = Path("cli-tenants.textproto");
  std::ofstream(tenants) << "tenant { name: \"cli\" token_sha256: \"" << Sha256Hex(token)
                         << "\" }\n";
  std::ofstream(Path("cli-token")) << token << "\n";
  const std::string log = Path("cli-tenants-daemon.log");
  Process daemon({Env("GPUEXEC_TEST_DAEMON"), "--listen=127.0.0.1:0", "--tenants=" + tenants,
                  absl::StrCat("--driver=", Env("GPUEXEC_TEST_DRIVER"))},
                 Path("cli-tenants-daemon.out"), log);
  std::string port;
  ASSERT_TRUE(WaitFor(
      [&] {
        const std::string text = ReadFile(log).value_or("");
        const size_t at = text.find("serving gpuexec.v1 on 127.0.0.1:");
        if (at == std::string::npos) return false;
        port = text.substr(at + 32, text.find(' ', at + 32) - at - 32);
        return true;
      },
      absl::Seconds(60)))
      << ReadFile(log).value_or("");
  const std::string target = absl::StrCat("--target=127.0.0.1:", port);

  Result none = RunRaw({target, "devices"});
  EXPECT_EQ(none.exit_code, 1) << none;
  EXPECT_THAT(none.err, HasSubstr("UNAUTHENTICATED: no credentials"));
  ExpectOneErrorLine(none);

  Result from_file = RunRaw({target, "--token_file=" + Path("cli-token"), "devices"});
  EXPECT_EQ(from_file.exit_code, 0) << from_file;
  EXPECT_THAT(from_file.out, StartsWith("DEVICE NAME"));

  Result from_env = RunRaw({target, "devices"}, {"GPUEXEC_TOKEN=" + token});
  EXPECT_EQ(from_env.exit_code, 0) << from_env;

  Result wrong = RunRaw({target, "devices"}, {"GPUEXEC_TOKEN=not-it"});
  EXPECT_EQ(wrong.exit_code, 1) << wrong;
  EXPECT_THAT(wrong.err, HasSubstr("unknown or revoked bearer token"));
  ExpectOneErrorLine(wrong);

  // Never in clear text to another host.
  Result remote = RunRaw({"--target=192.0.2.1:50051", "devices"}, {"GPUEXEC_TOKEN=" + token});
  EXPECT_EQ(remote.exit_code, 1) << remote;
  EXPECT_THAT(remote.err, HasSubstr("FAILED_PRECONDITION"));
  ExpectOneErrorLine(remote);

  Result missing = RunRaw({target, "--token_file=" + Path("no-such-token"), "devices"});
  EXPECT_EQ(missing.exit_code, 1) << missing;
  EXPECT_THAT(missing.err, HasSubstr("--token_file: cannot read"));
}

// ------------------------------------------------------------ devices, load, info

TEST_F(CliTest, DevicesListsTheDaemonsDevices) {
  Result r = RunCli({"devices"});
  ASSERT_EQ(r.exit_code, 0) << r;
  std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_GE(lines.size(), 2u) << r;
  EXPECT_THAT(lines[0], StartsWith("DEVICE NAME"));
  std::vector<std::string> first = absl::StrSplit(lines[1], ' ', absl::SkipEmpty());
  EXPECT_EQ(first[0], "0") << lines[1];
  EXPECT_THAT(lines[1], HasSubstr("healthy"));
  EXPECT_THAT(lines[1], HasSubstr("GiB"));
  if (fake()) {
    EXPECT_THAT(lines[1], HasSubstr("9.0"));
  }
  EXPECT_EQ(r.err, "");
}

// A pool of three daemons on 127.0.0.1-3, each on the test double with its
// own device memory: `devices` lists every daemon's; `run` places its
// session where its --memory is free and says where on stderr; a daemon
// killed is listed as not answering and the next run goes elsewhere.
TEST_F(CliTest, APoolTargetPlacesTheSessionAndListsEveryDaemon) {
  if (!fake()) GTEST_SKIP() << "the pool test runs on the test double";
  const int port = FreePort();
  ASSERT_GT(port, 0);
  auto at = [&](int host) { return absl::StrCat("127.0.0.", host, ":", port); };
  const char* memory[] = {"268435456", "2147483648", "4294967296"};  // 256 MiB, 2 GiB, 4 GiB
  std::vector<std::unique_ptr<Process>> daemons;
  for (int host = 1; host <= 3; ++host) {
    const std::string log = Path(absl::StrCat("pool-", host, ".log"));
    daemons.push_back(std::make_unique<Process>(
        std::vector<std::string>{Env("GPUEXEC_TEST_DAEMON"), absl::StrCat("--listen=", at(host)),
                                 absl::StrCat("--driver=", Env("GPUEXEC_TEST_DRIVER"))},
        Path(absl::StrCat("pool-", host, ".out")), log,
        std::vector<std::string>{absl::StrCat("GXFAKE_MEMORY_BYTES=", memory[host - 1])}));
    ASSERT_TRUE(
        WaitFor([&] { return absl::StrContains(ReadFile(log).value_or(""), "gpuexecd serving"); },
                absl::Seconds(60)))
        << ReadFile(log).value_or("");
  }
  const std::string pool = absl::StrCat("--target=pool://", at(1), ",", at(2), ",", at(3));

  Result r = RunRaw({pool, "devices"});
  ASSERT_EQ(r.exit_code, 0) << r;
  std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u) << r;
  EXPECT_THAT(lines[0], StartsWith("DAEMON"));
  for (int host = 1; host <= 3; ++host) {
    EXPECT_THAT(lines[host], StartsWith(at(host))) << r;
    EXPECT_THAT(lines[host], HasSubstr("healthy"));
  }

  // 3 GiB fits on the third daemon only.
  constexpr uint64_t n = 4096;
  std::vector<float> x(n, 1.0f), y(n, 2.0f);
  WriteFile(Path("pool-x.bin"), BytesOf(x));
  WriteFile(Path("pool-y.bin"), BytesOf(y));
  const std::vector<std::string> saxpy = {
      "run",
      KernelPath(),
      "gx_saxpy",
      "--grid=16",
      "--block=256",
      "f32:3",
      absl::StrCat("in:", Path("pool-x.bin")),
      absl::StrCat("inout:", Path("pool-y.bin"), ":", Path("pool-y-out.bin")),
      absl::StrCat("u64:", n)};
  std::vector<std::string> args = {pool, "--memory=3G"};
  args.insert(args.end(), saxpy.begin(), saxpy.end());
  r = RunRaw(args);
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.err, absl::StrCat("gpuexec: session on daemon ", at(3), ", device 0\n"));
  EXPECT_EQ(ReadFile(Path("pool-y-out.bin")), BytesOf(std::vector<float>(n, 5.0f)));

  // No device of compute capability 10.0 anywhere: refused, saying why.
  r = RunRaw({pool, "--min_cc=10.0", "load", KernelPath()});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("FAILED_PRECONDITION"));
  EXPECT_THAT(r.err, HasSubstr("3 below compute capability 10.0"));
  ExpectOneErrorLine(r);

  // The third daemon dies: listed as not answering; 1 GiB now goes to the
  // second, the only other with that much.
  daemons[2]->Kill();
  r = RunRaw({pool, "--timeout=2s", "devices"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("daemon ", at(3), ": UNAVAILABLE")));
  args = {pool, "--memory=1G"};
  args.insert(args.end(), saxpy.begin(), saxpy.end());
  r = RunRaw(args);
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.err, absl::StrCat("gpuexec: session on daemon ", at(2), ", device 0\n"));

  // None answers: the listing fails.
  daemons.clear();
  r = RunRaw({pool, "--timeout=1s", "devices"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("none of its 3 daemon(s) answered"));
}

TEST_F(CliTest, TheTargetComesFromTheEnvironmentToo) {
  Result r = RunRaw({"devices"}, {absl::StrCat("GPUEXEC_TARGET=", Target())});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, StartsWith("DEVICE NAME"));
}

TEST_F(CliTest, LoadTwiceUploadsOnceThenItIsCached) {
  // An image no one has loaded: the kernel file plus a unique tail (the
  // double ignores names it does not know; PTX takes a comment).
  std::string image = ReadFile(KernelPath()).value_or("");
  std::string path;
  if (fake()) {
    absl::StrAppend(&image, "gx_cli_test_image_", getpid(), "_", absl::ToUnixNanos(absl::Now()),
                    "\n");
    path = Path("unique.cubin");
  } else {
    image =
        ReadFile(absl::StrCat(KernelPath().substr(0, KernelPath().size() - 5), "ptx")).value_or("");
    absl::StrAppend(&image, "\n// gpuexec cli test ", getpid(), " ", absl::ToUnixNanos(absl::Now()),
                    "\n");
    path = Path("unique.ptx");
  }
  WriteFile(path, image);
  const std::string sha = Sha256Hex(image);

  Result first = RunCli({"load", path});
  ASSERT_EQ(first.exit_code, 0) << first;
  EXPECT_EQ(first.out, absl::StrCat(sha, "  ", path, "  uploaded\n"));
  Result second = RunCli({"load", path});
  ASSERT_EQ(second.exit_code, 0) << second;
  EXPECT_EQ(second.out, absl::StrCat(sha, "  ", path, "  cached\n"));
}

TEST_F(CliTest, LoadOfAMissingFileFails) {
  Result r = RunCli({"load", Path("missing.cubin")});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("missing.cubin"));
  ExpectOneErrorLine(r);
}

TEST_F(CliTest, InfoShowsTheParameterLayout) {
  Result r = RunCli({"info", KernelPath(), "gx_saxpy"});
  ASSERT_EQ(r.exit_code, 0) << r;
  std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  auto header = std::find(lines.begin(), lines.end(), "PARAM  OFFSET  SIZE");
  ASSERT_NE(header, lines.end()) << r;
  std::vector<std::vector<uint64_t>> rows;
  for (auto it = header + 1; it != lines.end(); ++it) {
    std::vector<std::string> fields = absl::StrSplit(*it, ' ', absl::SkipEmpty());
    ASSERT_EQ(fields.size(), 3u) << *it;
    std::vector<uint64_t> row(3);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(absl::SimpleAtoi(fields[i], &row[i])) << *it;
    rows.push_back(row);
  }
  const std::vector<std::vector<uint64_t>> expected = {
      {0, 0, 4}, {1, 8, 8}, {2, 16, 8}, {3, 24, 8}};
  EXPECT_EQ(rows, expected) << r;
  EXPECT_THAT(r.out, HasSubstr("parameters                   4 (32 bytes)"));
  EXPECT_THAT(r.out, HasSubstr("max threads per block"));
  EXPECT_THAT(r.out, HasSubstr("registers per thread"));
  EXPECT_THAT(r.out, HasSubstr("static shared memory"));
}

TEST_F(CliTest, InfoOfAnUnknownKernelIsTheDaemonsNotFound) {
  Result r = RunCli({"info", KernelPath(), "gx_no_such_kernel"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("gx_no_such_kernel"));
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));
  ExpectOneErrorLine(r);
}

// ------------------------------------------------------------ run

TEST_F(CliTest, RunSaxpyWritesTheOutputFile) {
  constexpr uint64_t n = 5000;  // not a multiple of the block
  const float a = 2.5f;
  std::vector<float> x(n), y(n);
  for (uint64_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i) * 0.5f;
    y[i] = 1.0f - static_cast<float>(i);
  }
  WriteFile(Path("x.bin"), BytesOf(x));
  WriteFile(Path("y.bin"), BytesOf(y));
  std::remove(Path("y_out.bin").c_str());

  Result r = RunCli({"run", KernelPath(), "gx_saxpy", "--grid", "8", "--block", "256", "f32:2.5",
                     absl::StrCat("in:", Path("x.bin")),
                     absl::StrCat("inout:", Path("y.bin"), ":", Path("y_out.bin")),
                     absl::StrCat("u64:", n)});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, StartsWith("gx_saxpy: grid (8,1,1) block (256,1,1) shared 0: GPU time "));
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("saved ", n * 4, " bytes of argument 2 to ",
                                            Path("y_out.bin"))));
  EXPECT_EQ(r.err, "");

  std::optional<std::string> out = ReadFile(Path("y_out.bin"));
  ASSERT_TRUE(out.has_value());
  ASSERT_EQ(out->size(), n * sizeof(float));
  std::vector<float> result = ValuesOf<float>(*out);
  uint64_t wrong = 0;
  for (uint64_t i = 0; i < n; ++i) {
    // The GPU may fuse a*x+y into one rounding.
    if (result[i] != a * x[i] + y[i] && result[i] != std::fma(a, x[i], y[i])) ++wrong;
  }
  EXPECT_EQ(wrong, 0u) << "y[1] = " << result[1] << ", expected " << a * x[1] + y[1];
  EXPECT_EQ(ReadFile(Path("y.bin")), BytesOf(y)) << "the input file must be left alone";
}

// A daemon on this host that serves host memory: files of a megabyte and
// more go through shared memory, not through the Write and Read streams.
TEST_F(CliTest, RunMovesLargeFilesThroughHostMemory) {
  constexpr uint64_t n = 1 << 19;  // 2 MiB of floats
  std::vector<float> x(n), y(n);
  for (uint64_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i % 1000);
    y[i] = 3.0f;
  }
  WriteFile(Path("big_x.bin"), BytesOf(x));
  WriteFile(Path("big_y.bin"), BytesOf(y));
  const int64_t written = Metric("gpuexec_write_bytes_total");
  const int64_t read = Metric("gpuexec_read_bytes_total");
  ASSERT_GE(written, 0) << "the daemon's metrics endpoint is not reached";
  Result r = RunCli({"run", KernelPath(), "gx_saxpy", "--grid", absl::StrCat(n / 256), "--block",
                     "256", "f32:2", absl::StrCat("in:", Path("big_x.bin")),
                     absl::StrCat("inout:", Path("big_y.bin"), ":", Path("big_out.bin")),
                     absl::StrCat("u64:", n)});
  ASSERT_EQ(r.exit_code, 0) << r;
  std::optional<std::string> out = ReadFile(Path("big_out.bin"));
  ASSERT_TRUE(out.has_value());
  ASSERT_EQ(out->size(), n * sizeof(float));
  const std::vector<float> result = ValuesOf<float>(*out);
  for (uint64_t i = 0; i < n; ++i) {
    ASSERT_EQ(result[i], 2.0f * x[i] + 3.0f) << "element " << i;
  }
  EXPECT_EQ(Metric("gpuexec_write_bytes_total"), written) << "an input went through Write";
  EXPECT_EQ(Metric("gpuexec_read_bytes_total"), read) << "the output went through Read";
  EXPECT_EQ(Metric("gpuexec_pinned_bytes"), 0) << "the regions outlived the run";
}

TEST_F(CliTest, RunFillIntoAnOutFile) {
  constexpr uint64_t n = 1000;
  Result r = RunCli({"run", KernelPath(), "gx_fill_u32", "--grid=2", "--block=128",
                     absl::StrCat("out:4K:", Path("fill.bin")), "u32:0xdeadbeef",
                     absl::StrCat("u64:", n)});
  ASSERT_EQ(r.exit_code, 0) << r;
  std::optional<std::string> out = ReadFile(Path("fill.bin"));
  ASSERT_TRUE(out.has_value());
  ASSERT_EQ(out->size(), 4096u);
  std::vector<uint32_t> values = ValuesOf<uint32_t>(*out);
  for (uint64_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(values[i], i < n ? 0xdeadbeefu : 0u) << "element " << i;
  }
}

TEST_F(CliTest, RunWithAFilledBufferAnOffsetAndSave) {
  // 64 elements of 7; the kernel writes 16 elements from element 8 on.
  Result r = RunCli({"run", KernelPath(), "gx_fill_u32", "--grid=1", "--block=32",
                     absl::StrCat("fill:u32:7:64,offset=32,save=", Path("offset.bin")), "u32:9",
                     "u64:16"});
  ASSERT_EQ(r.exit_code, 0) << r;
  std::vector<uint32_t> values = ValuesOf<uint32_t>(ReadFile(Path("offset.bin")).value_or(""));
  ASSERT_EQ(values.size(), 64u);
  for (uint64_t i = 0; i < 64; ++i) {
    ASSERT_EQ(values[i], (i >= 8 && i < 24) ? 9u : 7u) << "element " << i;
  }
}

TEST_F(CliTest, RunPassesEveryScalarTypeBitExact) {
  Result r = RunCli({"run", KernelPath(), "gx_types", "--grid=1", "--block=1", "i8:-1", "i16:-2",
                     "u32:3", "i64:-4", "f16:1.5", "bf16:-2", "f32:0.25", "f64:-0.5",
                     absl::StrCat("out:64:", Path("types.bin"))});
  ASSERT_EQ(r.exit_code, 0) << r;
  std::vector<uint64_t> bits = ValuesOf<uint64_t>(ReadFile(Path("types.bin")).value_or(""));
  const std::vector<uint64_t> expected = {
      0xff,   0xfffe, 3,          static_cast<uint64_t>(int64_t{-4}),
      0x3e00, 0xc000, 0x3e800000, 0xbfe0000000000000ull};
  EXPECT_EQ(bits, expected);
}

TEST_F(CliTest, RunPassesRawBytesForAStruct) {
  const std::string q("\x01\x00\x00\x00\x02\x00\x00\x00\x00\x00\xc0\x3f\x04\x00\x00\x00", 16);
  WriteFile(Path("quad.bin"), q);
  Result r = RunCli({"run", KernelPath(), "gx_struct", "--grid=1", "--block=1",
                     "bytes:01000000_02000000_0000c03f_04000000",
                     absl::StrCat("out:16:", Path("struct1.bin"))});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(ReadFile(Path("struct1.bin")), q);
  r = RunCli({"run", KernelPath(), "gx_struct", "--grid=1", "--block=1",
              absl::StrCat("bytes:@", Path("quad.bin")),
              absl::StrCat("out:16:", Path("struct2.bin"))});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(ReadFile(Path("struct2.bin")), q);
}

TEST_F(CliTest, RunWithDynamicSharedMemory) {
  Result r = RunCli({"run", KernelPath(), "gx_bigshared", "--grid=3", "--block=128", "--shared=64K",
                     absl::StrCat("out:12:", Path("shared.bin")), "u32:16384"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("shared 65536"));
  std::vector<uint32_t> sums = ValuesOf<uint32_t>(ReadFile(Path("shared.bin")).value_or(""));
  ASSERT_EQ(sums.size(), 3u);
  for (uint32_t b = 0; b < 3; ++b) {
    uint32_t sum = 0;
    for (uint32_t k = 0; k < 16384; ++k) sum += k ^ b;
    EXPECT_EQ(sums[b], sum) << "block " << b;
  }
}

TEST_F(CliTest, WrongArgumentCountNamesTheParameter) {
  Result few = RunCli(
      {"run", KernelPath(), "gx_saxpy", "--grid=1", "--block=32", "f32:1", "zeros:64", "zeros:64"});
  EXPECT_EQ(few.exit_code, 1) << few;
  EXPECT_THAT(few.err, HasSubstr("parameter 3 (offset 24, 8 bytes) has no argument"));
  ExpectOneErrorLine(few);

  Result many = RunCli({"run", KernelPath(), "gx_saxpy", "--grid=1", "--block=32", "f32:1",
                        "zeros:64", "zeros:64", "u64:16", "u64:1"});
  EXPECT_EQ(many.exit_code, 1) << many;
  EXPECT_THAT(many.err, HasSubstr("argument 4 (u64:1) has no parameter"));
  ExpectOneErrorLine(many);

  Result size = RunCli({"run", KernelPath(), "gx_saxpy", "--grid=1", "--block=32", "f32:1", "f32:2",
                        "zeros:64", "u64:16"});
  EXPECT_EQ(size.exit_code, 1) << size;
  EXPECT_THAT(size.err, HasSubstr("parameter 1 (offset 8) is 8 bytes; argument 1 (f32:2) is 4"));
  ExpectOneErrorLine(size);
}

TEST_F(CliTest, RunErrorsFromTheDaemonAreOneLine) {
  Result unknown = RunCli({"run", KernelPath(), "gx_nope", "--grid=1", "--block=1"});
  EXPECT_EQ(unknown.exit_code, 1) << unknown;
  EXPECT_THAT(unknown.err, HasSubstr("NOT_FOUND"));
  EXPECT_THAT(unknown.err, HasSubstr("gx_nope"));
  ExpectOneErrorLine(unknown);

  Result block = RunCli({"run", KernelPath(), "gx_fill_u32", "--grid=1", "--block=4096", "zeros:64",
                         "u32:1", "u64:16"});
  EXPECT_EQ(block.exit_code, 1) << block;
  EXPECT_THAT(block.err, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(block.err, HasSubstr("gx_fill_u32"));
  ExpectOneErrorLine(block);

  Result missing = RunCli({"run", KernelPath(), "gx_fill_u32", "--grid=1", "--block=1",
                           absl::StrCat("in:", Path("no-such-input.bin")), "u32:1", "u64:1"});
  EXPECT_EQ(missing.exit_code, 1) << missing;
  EXPECT_THAT(missing.err, HasSubstr("no-such-input.bin"));
  ExpectOneErrorLine(missing);
}

}  // namespace
}  // namespace gpuexec::testing
