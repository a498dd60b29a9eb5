// The gpuexec tool on CUDA C++ source (the fixture: cli_fixture.h):
// `compile`, and `run` of a FILE.cu, against a daemon that compiles with
// the NVRTC double (GPUEXEC_TEST_NVRTC names another: a real NVRTC for a
// real driver, whose tests are SKIPPED without one). The compile process
// needs Landlock: where the kernel has none, the daemon keeps compiling
// off and the tests are SKIPPED, saying so.

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cli/cli_fixture.h"

#ifndef GPUEXEC_TEST_FAKE_NVRTC
#error "GPUEXEC_TEST_FAKE_NVRTC must name the built libgpuexec_fakenvrtc.so"
#endif

namespace gpuexec::testing {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// client/cpp/examples/saxpy.cu's kernel.
constexpr char kSaxpy[] =
    "extern \"C\" __global__ void saxpy(float a, const float* x, float* y, unsigned long long n) "
    "{\n"
    "  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;\n"
    "  if (i < n) y[i] = a * x[i] + y[i];\n"
    "}\n";

// tests/kernels/gx_nvrtc_kernels.cu's: two extern "C" kernels the driver
// double models, and a template.
constexpr char kKernels[] = R"(extern "C" {
__global__ void gx_saxpy(float a, const float* x, float* y, unsigned long long n) {
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (; i < n; i += stride) y[i] = a * x[i] + y[i];
}
__global__ void gx_fill_u32(unsigned int* out, unsigned int value, unsigned long long n) {
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (; i < n; i += stride) out[i] = value;
}
}
template <typename T>
__global__ void gx_axpy(T a, const T* x, T* y, unsigned long long n) {
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
)";

constexpr char kAxpyDouble[] = "_Z7gx_axpyIdEvT_PKS0_PS0_y";

std::string Nvrtc() {
  const std::string nvrtc = Env("GPUEXEC_TEST_NVRTC");
  return nvrtc.empty() ? GPUEXEC_TEST_FAKE_NVRTC : nvrtc;
}

// A line that makes a source one the daemon has not compiled yet.
std::string Unique() {
  static int n = 0;
  return absl::StrCat("// gpuexec cli compile test ", getpid(), " ", absl::ToUnixNanos(absl::Now()),
                      " ", n++, "\n");
}

// The last line of `text` ("" when it has none).
std::string LastLine(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  return lines.empty() ? "" : lines.back();
}

class CliCompileTest : public CliTest {
 protected:
  static void SetUpTestSuite() { StartSuiteDaemon({absl::StrCat("--nvrtc=", Nvrtc())}, ""); }

  void SetUp() override {
    CliTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (!fake() && Env("GPUEXEC_TEST_NVRTC").empty()) {
      GTEST_SKIP() << "the NVRTC double's modules run on the driver double only; set "
                      "GPUEXEC_TEST_NVRTC to a real NVRTC";
    }
    // Whether the daemon compiles, asked once: a kernel without Landlock
    // keeps compiling off.
    static std::string* off = nullptr;
    if (off == nullptr) {
      off = new std::string;
      WriteFile(Path("probe.cu"), absl::StrCat(Unique(), kSaxpy));
      Result r = RunCli({"compile", Path("probe.cu")});
      if (r.exit_code != 0) *off = r.err;
    }
    if (absl::StrContains(*off, "Landlock")) GTEST_SKIP() << "compiling is off: " << *off;
    ASSERT_EQ(*off, "") << "the daemon does not compile";
  }

  // gpuexec ARGS... against a target no daemon serves: what fails there
  // fails before the daemon is called.
  static Result RunWithoutDaemon(const std::vector<std::string>& args) {
    std::vector<std::string> all = {absl::StrCat("--target=unix:", Path("nobody.sock"))};
    all.insert(all.end(), args.begin(), args.end());
    return RunRaw(all);
  }
};

TEST_F(CliCompileTest, RunCompilesTheSourceAndRunsTheKernel) {
  WriteFile(Path("saxpy.cu"), absl::StrCat(Unique(), kSaxpy));
  constexpr uint64_t n = 4096;
  std::vector<float> x(n), y(n);
  for (uint64_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i);
    y[i] = 1.0f;
  }
  WriteFile(Path("saxpy-x.bin"), BytesOf(x));
  WriteFile(Path("saxpy-y.bin"), BytesOf(y));
  Result r = RunCli({"run", Path("saxpy.cu"), "saxpy", "--grid=16", "--block=256", "f32:2.0",
                     absl::StrCat("in:", Path("saxpy-x.bin")),
                     absl::StrCat("in:", Path("saxpy-y.bin"), ",save=", Path("saxpy-out.bin")),
                     absl::StrCat("u64:", n)});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, StartsWith("saxpy: grid (16,1,1) block (256,1,1) shared 0: GPU time "));
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("saved ", n * 4, " bytes of argument 2 to ")));
  EXPECT_EQ(r.err, "");  // no warnings
  const std::vector<float> out = ValuesOf<float>(ReadFile(Path("saxpy-out.bin")).value_or(""));
  ASSERT_EQ(out.size(), n);
  for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], 2.0f * i + 1.0f) << i;
}

// gpuexec compile -o: the daemon's image, kept and run as any cubin is.
TEST_F(CliCompileTest, CompileWritesTheImageThatRunsAsACubin) {
  WriteFile(Path("keep.cu"), absl::StrCat(Unique(), kSaxpy));
  Result r = RunCli({"compile", Path("keep.cu"), "-o", Path("keep.cubin")});
  ASSERT_EQ(r.exit_code, 0) << r;
  const std::string image = ReadFile(Path("keep.cubin")).value_or("");
  ASSERT_FALSE(image.empty());
  EXPECT_EQ(image.compare(0, 4,
                          "\x7f"
                          "ELF"),
            0)
      << "a cubin is an ELF file";
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("wrote ", image.size(), " bytes of cubin to ")));
  constexpr uint64_t n = 256;
  WriteFile(Path("keep-x.bin"), BytesOf(std::vector<float>(n, 3.0f)));
  r = RunCli({"run", Path("keep.cubin"), "saxpy", "--grid=1", "--block=256", "f32:2.0",
              absl::StrCat("in:", Path("keep-x.bin")),
              absl::StrCat("zeros:1K,save=", Path("keep-out.bin")), absl::StrCat("u64:", n)});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(ValuesOf<float>(ReadFile(Path("keep-out.bin")).value_or("")), ::testing::Each(6.0f));
  // --output (-o) names a file.
  r = RunWithoutDaemon({"compile", Path("keep.cu"), "--output="});
  EXPECT_EQ(r.exit_code, 2) << r;
}

TEST_F(CliCompileTest, CompileListsTheKernelsTheirParametersAndHowItWasCompiled) {
  WriteFile(Path("kernels.cu"), absl::StrCat(Unique(), kKernels));
  const std::vector<std::string> args = {"compile", Path("kernels.cu"),
                                         "--name_expression=gx_axpy<double>"};
  Result r = RunCli(args);
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.err, "");
  EXPECT_THAT(r.out, StartsWith(absl::StrCat("source ", Path("kernels.cu"), " (module ")));
  EXPECT_THAT(r.out, HasSubstr("\n  architecture                 sm_"));
  EXPECT_THAT(r.out, HasSubstr("\n  NVRTC version                1"));
  EXPECT_THAT(r.out, HasSubstr("\n  compiled                     now, in "));
  EXPECT_THAT(r.out, HasSubstr("\n  kernels                      3\n"));
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("\n\nNAME EXPRESSION              LOWERED NAME\n"
                                            "gx_axpy<double>              ",
                                            kAxpyDouble, "\n")));
  // Each kernel as `info FILE KERNEL` shows it.
  EXPECT_THAT(r.out, HasSubstr("\nkernel gx_fill_u32\n  registers per thread"));
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("\nkernel ", kAxpyDouble, " (gx_axpy<double>)\n")));
  EXPECT_THAT(r.out, HasSubstr("\nkernel gx_saxpy\n  registers per thread"));
  EXPECT_THAT(r.out, HasSubstr("  parameters                   4 (32 bytes)\n"
                               "PARAM  OFFSET  SIZE\n"
                               "0      0       4\n"
                               "1      8       8\n"
                               "2      16      8\n"
                               "3      24      8\n"));
  EXPECT_THAT(r.out, Not(HasSubstr("NVRTC's log")));

  // The daemon keeps it: the second time, nothing is compiled.
  Result again = RunCli(args);
  ASSERT_EQ(again.exit_code, 0) << again;
  EXPECT_THAT(again.out, HasSubstr("\n  compiled                     before (cached; it took "));
}

TEST_F(CliCompileTest, ATemplateKernelIsNamedByItsExpression) {
  WriteFile(Path("axpy.cu"), absl::StrCat(Unique(), kKernels));
  constexpr uint64_t n = 1000;
  std::vector<double> x(n), y(n);
  for (uint64_t i = 0; i < n; ++i) {
    x[i] = static_cast<double>(i);
    y[i] = 0.5;
  }
  WriteFile(Path("axpy-x.bin"), BytesOf(x));
  WriteFile(Path("axpy-y.bin"), BytesOf(y));
  const std::vector<std::string> buffers = {
      absl::StrCat("in:", Path("axpy-x.bin")),
      absl::StrCat("in:", Path("axpy-y.bin"), ",save=", Path("axpy-out.bin")),
      absl::StrCat("u64:", n)};
  auto run = [&](std::vector<std::string> head, const std::string& a) {
    head.insert(head.end(), {"--grid=4", "--block=256", a});
    head.insert(head.end(), buffers.begin(), buffers.end());
    return RunCli(head);
  };
  // The expression as KERNEL: compiled for it without --name_expression;
  // its lowered name's layout checks the arguments (a double, not a
  // float).
  Result r = run({"run", Path("axpy.cu"), "gx_axpy<double>"}, "f32:2");
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("run gx_axpy<double>: parameter 0 (offset 0) is 8 bytes; "
                               "argument 0 (f32:2) is 4 bytes"));
  ExpectOneErrorLine(r);
  // The plain name, of the one instantiation asked for.
  r = run({"run", Path("axpy.cu"), "gx_axpy", "--name_expression=gx_axpy<double>"}, "f32:2");
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("run gx_axpy: parameter 0 (offset 0) is 8 bytes"));
  // ... which is ambiguous with two.
  r = run({"run", Path("axpy.cu"), "gx_axpy", "--name_expression=gx_axpy<double>",
           "--name_expression=gx_axpy<float>"},
          "f64:2");
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat("has 2 kernels of that name (overloads or template "
                                            "instantiations): ")));
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat(kAxpyDouble, " (gx_axpy<double>)")));
  ExpectOneErrorLine(r);

  // Right arguments: the kernel runs where a model of it does (a real
  // driver); the driver double models no template kernel, and refuses the
  // launch itself.
  for (const std::string& kernel : {std::string("gx_axpy<double>"), std::string(kAxpyDouble)}) {
    std::vector<std::string> head = {"run", Path("axpy.cu"), kernel};
    if (kernel == kAxpyDouble) head.push_back("--name_expression=gx_axpy<double>");
    r = run(head, "f64:2");
    if (fake()) {
      EXPECT_EQ(r.exit_code, 1) << r;
      EXPECT_THAT(r.err, StartsWith(absl::StrCat("gpuexec: run ", kernel, ": ")));
      EXPECT_THAT(r.err, HasSubstr("cannot run this kernel"));
      ExpectOneErrorLine(r);
      continue;
    }
    ASSERT_EQ(r.exit_code, 0) << r;
    const std::vector<double> out = ValuesOf<double>(ReadFile(Path("axpy-out.bin")).value_or(""));
    ASSERT_EQ(out.size(), n);
    for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], 2.0 * i + 0.5) << i;
  }
}

TEST_F(CliCompileTest, ACompileErrorPrintsTheLogThenOneLineAndExitsOne) {
  WriteFile(Path("broken.cu"), "extern \"C\" __global__ void f(widget* w) {}\n");
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"compile", Path("broken.cu")},
        std::vector<std::string>{"run", Path("broken.cu"), "f", "--grid=1", "--block=1", "null"}}) {
    Result r = RunCli(args);
    EXPECT_EQ(r.exit_code, 1) << r;
    EXPECT_EQ(r.out, "");
    // NVRTC's log, a line a line (the real NVRTC says more before it).
    EXPECT_THAT(r.err, StartsWith("broken.cu(1): error: "));
    EXPECT_THAT(r.err, HasSubstr("broken.cu(1): error: identifier \"widget\" is undefined\n"));
    EXPECT_THAT(LastLine(r.err),
                StartsWith(absl::StrCat("gpuexec: compile ", Path("broken.cu"),
                                        ": INVALID_ARGUMENT: the compile of 'broken.cu' failed")));
    EXPECT_THAT(LastLine(r.err), EndsWith("(above)"));
  }
  // A name expression that names no kernel: the same.
  WriteFile(Path("nothing.cu"), absl::StrCat(Unique(), kSaxpy));
  Result r = RunCli({"compile", Path("nothing.cu"), "--name_expression=nothing<int>"});
  EXPECT_EQ(r.exit_code, 1) << r;
  // NVRTC 13.0 spaces the expression out (" nothing < int >").
  EXPECT_THAT(r.err,
              ::testing::ContainsRegex("Input name expression was: \" ?nothing ?< ?int ?>\""));
  EXPECT_THAT(LastLine(r.err), HasSubstr("INVALID_ARGUMENT: the compile of 'nothing.cu' failed"));
}

TEST_F(CliCompileTest, WarningsGoToStderrOnRunAndIntoCompilesReport) {
  if (!fake()) GTEST_SKIP() << "the warning is the NVRTC double's marker";
  WriteFile(Path("warn.cu"), absl::StrCat(Unique(), kSaxpy, "// GXFAKE_COMPILE_WARN\n"));
  const std::string warning = "warn.cu(6): warning #177-D: variable \"x\" was declared but never";
  Result r = RunCli({"compile", Path("warn.cu")});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.err, "");
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("\nNVRTC's log:\n", warning)));

  WriteFile(Path("warn-y.bin"), BytesOf(std::vector<float>(256, 1.0f)));
  r = RunCli({"run", Path("warn.cu"), "saxpy", "--grid=1", "--block=256", "f32:1", "zeros:1K",
              absl::StrCat("inout:", Path("warn-y.bin")), "u64:256"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(
      r.err, StartsWith(absl::StrCat("gpuexec: NVRTC's log of ", Path("warn.cu"), ":\n", warning)));
  EXPECT_THAT(r.out, StartsWith("saxpy: grid (1,1,1)"));
}

TEST_F(CliCompileTest, HeadersAreSentUnderTheirBaseNames) {
  mkdir(Path("inc").c_str(), 0755);
  WriteFile(Path("inc/fill.cuh"),
            "extern \"C\" __global__ void gx_fill_u32(unsigned int* out, unsigned int value,\n"
            "                                         unsigned long long n) {\n"
            "  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;\n"
            "  if (i < n) out[i] = value;\n"
            "}\n");
  WriteFile(Path("fill.cu"), absl::StrCat(Unique(), "#include \"fill.cuh\"\n"));
  Result r = RunCli({"run", Path("fill.cu"), "gx_fill_u32",
                     absl::StrCat("--include=", Path("inc/fill.cuh")), "--grid=4", "--block=256",
                     absl::StrCat("out:4K:", Path("fill.bin")), "u32:7", "u64:1024"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(ReadFile(Path("fill.bin")), BytesOf(std::vector<uint32_t>(1024, 7)));

  // Without it, the compile says what it could not open.
  r = RunCli({"compile", Path("fill.cu")});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("\"fill.cuh\""));
  EXPECT_THAT(LastLine(r.err), HasSubstr("INVALID_ARGUMENT: the compile of 'fill.cu' failed"));
}

TEST_F(CliCompileTest, OptionsReachTheCompilerFromTheDaemonsAllowList) {
  WriteFile(Path("opt.cu"), absl::StrCat(Unique(), "#ifdef GX_WITH_FILL\n", kKernels, "#endif\n"));
  Result r = RunCli({"compile", Path("opt.cu"), "--nvrtc_option=-std=c++17", "--nvrtc-option",
                     "-DGX_WITH_FILL=1"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("\nkernel gx_fill_u32\n"));
  r = RunCli({"compile", Path("opt.cu")});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("\n  kernels                      0 (no __global__ function"));
  // The daemon's refusal of an option it does not allow, as it says it.
  r = RunCli({"compile", Path("opt.cu"), "--nvrtc_option=-I/etc"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT: option 0 '-I/etc': nothing of the daemon's"));
  ExpectOneErrorLine(r);
}

TEST_F(CliCompileTest, FilesAndFlagsAreCheckedBeforeTheDaemonIsCalled) {
  WriteFile(Path("ok.cu"), kSaxpy);
  WriteFile(Path("empty.cu"), "");
  WriteFile(Path("big.cu"), std::string((1 << 20) + 1, ' '));
  mkdir(Path("h1").c_str(), 0755);
  mkdir(Path("h2").c_str(), 0755);
  mkdir(Path("dir.cu").c_str(), 0755);
  WriteFile(Path("h1/big.cuh"), std::string(3 << 20, ' '));
  WriteFile(Path("h2/more.cuh"), std::string(2 << 20, ' '));
  WriteFile(Path("h2/big.cuh"), "");
  const std::string ok = Path("ok.cu");
  std::vector<std::string> many_options = {"compile", ok};
  std::vector<std::string> many_includes = {"compile", ok};
  for (int i = 0; i < 65; ++i) {
    many_options.push_back("--nvrtc_option=-DX=1");
    many_includes.push_back(absl::StrCat("--include=", Path("h2/more.cuh")));
  }
  struct Case {
    std::vector<std::string> args;
    int exit_code;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"compile", Path("missing.cu")},
       1,
       absl::StrCat("compile: source ", Path("missing.cu"),
                    ": cannot read it: No such file or directory")},
      {{"run", Path("missing.cu"), "saxpy", "--grid=1", "--block=1"},
       1,
       absl::StrCat("run: source ", Path("missing.cu"), ": cannot read it: No such file")},
      {{"compile", Path("dir.cu")}, 1, "dir.cu: it is a directory"},
      {{"compile", Path("empty.cu")}, 1, "empty.cu is empty"},
      {{"compile", Path("big.cu")},
       1,
       "big.cu: it is 1048577 bytes, over the daemon's limit of 1048576 bytes (1.0 MiB) for a "
       "source"},
      {{"compile", ok, absl::StrCat("--include=", Path("nope.cuh"))},
       1,
       absl::StrCat("compile: --include=", Path("nope.cuh"),
                    ": cannot read it: No such file or directory")},
      {{"compile", ok, absl::StrCat("--include=", Path("h1/big.cuh")),
        absl::StrCat("--include=", Path("h2/more.cuh"))},
       1,
       "more.cuh: it is 2097152 bytes: with the 3145728 bytes of those before it, over the "
       "daemon's limit of 4194304 bytes (4.0 MiB) for the headers together"},
      {{"compile", ok, absl::StrCat("--include=", Path("h1/big.cuh")),
        absl::StrCat("--include=", Path("h2/big.cuh"))},
       2,
       "are both sent as 'big.cuh', the name the source includes"},
      {{"compile", ok, absl::StrCat("--include=", Path("h1"), "/")}, 2, "the header's name ''"},
      {many_options, 2, "65 --nvrtc_option flags, over the daemon's limit of 64"},
      {many_includes, 2, "65 --include flags, over the daemon's limit of 64 headers"},
      {{"compile", ok, "--nvrtc_option=std=c++17"}, 2, "is not an option (they start with '-'"},
      {{"compile", ok, "--nvrtc_option", ""}, 2, "an option is 1 to 256 bytes"},
      {{"compile", ok, "--name_expression", ""}, 2, "name expression '': 1 to 256 bytes"},
      {{"compile", ok, "--include", ""}, 2, "--include names no file"},
      {{"compile"}, 2, "compile takes one FILE"},
      {{"compile", ok, ok}, 2, "compile takes one FILE"},
      {{"compile", Path("h2/more.cuh")}, 2, "is a CUDA C++ header: give it with --include"},
      {{"load", ok}, 2, "is CUDA C++ source, not a module: 'gpuexec compile "},
      {{"info", ok, "saxpy"}, 2, "is CUDA C++ source, not a module"},
      {{"run", "k.cubin", "k", "--grid=1", "--block=1", "--include=a.cuh"},
       2,
       "run: --include is for CUDA C++ source, a FILE named *.cu; k.cubin is loaded as a module"},
      {{"run", "--triton=m.json", ok, "--grid=1"}, 2, "--triton takes the module Triton wrote"},
      {{"load", "k.cubin", "--include=a.cuh"}, 2, "--include applies to 'compile' and 'run' only"},
      {{"--include=a.cuh", "compile", ok},
       2,
       "--include is a flag of 'compile' and 'run': give it after the command"},
  };
  for (const Case& c : cases) {
    Result r = RunWithoutDaemon(c.args);
    EXPECT_EQ(r.exit_code, c.exit_code) << absl::StrJoin(c.args, " ").substr(0, 300) << "\n" << r;
    EXPECT_THAT(r.err, HasSubstr(c.says)) << absl::StrJoin(c.args, " ").substr(0, 300);
    ExpectOneErrorLine(r);
  }
  if (geteuid() != 0) {  // root reads any file
    WriteFile(Path("secret.cu"), kSaxpy);
    chmod(Path("secret.cu").c_str(), 0);
    Result r = RunWithoutDaemon({"compile", Path("secret.cu")});
    EXPECT_EQ(r.exit_code, 1) << r;
    EXPECT_THAT(r.err, HasSubstr("secret.cu: cannot read it: Permission denied"));
  }
}

TEST_F(CliCompileTest, ADaemonThatDoesNotCompileSaysWhatToDoInstead) {
  const std::string socket = Path("no-compile.sock");
  Process daemon({Env("GPUEXEC_TEST_DAEMON"), "--listen=", absl::StrCat("--unix_socket=", socket),
                  "--compile=false", absl::StrCat("--driver=", Env("GPUEXEC_TEST_DRIVER"))},
                 Path("no-compile.out"), Path("no-compile.log"));
  ASSERT_TRUE(WaitFor(
      [&] {
        return absl::StrContains(ReadFile(Path("no-compile.log")).value_or(""), "gpuexecd serving");
      },
      absl::Seconds(60)))
      << ReadFile(Path("no-compile.log")).value_or("");
  WriteFile(Path("off.cu"), kSaxpy);
  Result r = RunRaw({absl::StrCat("--target=unix:", socket), "compile", Path("off.cu")});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("FAILED_PRECONDITION: this daemon cannot compile kernels from "
                               "source: it was started without compiling (gpuexecd "
                               "--compile=false)"));
  EXPECT_THAT(r.err, HasSubstr("(with nvcc: 'nvcc -cubin -arch=sm_XY -o FILE.cubin FILE.cu', "
                               "then 'gpuexec run FILE.cubin ...')"));
  ExpectOneErrorLine(r);
}

}  // namespace
}  // namespace gpuexec::testing
