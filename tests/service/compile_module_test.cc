// CompileModule end to end: CUDA C++ sent by a client, compiled by the
// daemon's compile process (NVRTC: the double in CI, GPUEXEC_TEST_NVRTC
// elsewhere), loaded into the session and run. The same source compiles
// once whichever session asks; every refusal is its own status; a compile
// bomb is stopped at the limit while another session's kernels run on.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gpuexec/client.h"
#include "server/compile/compile_sandbox.h"
#include "server/rpc/server.h"
#include "tests/service/service_test_fixture.h"

namespace gpuexec::testing {
namespace {

using ::testing::HasSubstr;

std::string Nvrtc() {
  const char* nvrtc = std::getenv("GPUEXEC_TEST_NVRTC");
  return nvrtc != nullptr ? nvrtc : GPUEXEC_TEST_DEFAULT_NVRTC;
}

// GPUEXEC_TEST_NVRTC_KERNELS names the source where the tree is not (a
// GPU host's bundle).
std::string KernelSource() {
  const char* path = std::getenv("GPUEXEC_TEST_NVRTC_KERNELS");
  std::optional<std::string> source = ReadFile(path != nullptr ? path : GPUEXEC_NVRTC_KERNELS);
  return source.value_or("");
}

class CompileModuleTest : public ::testing::Test {
 protected:
  void Start(ServerOptions options = Compiling()) {
    // Without Landlock the compile process refuses to run (compiler.h).
    if (options.compile && compile::sandbox::LandlockAbi() == 0) {
      GTEST_SKIP() << "the kernel has no Landlock: kernels from source are off here";
    }
    absl::StatusOr<std::unique_ptr<Server>> server = StartServer(std::move(options));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    if (server_->device_count() == 0) GTEST_SKIP() << "no usable device";
    client_ = std::make_unique<Client>(*Client::Connect(TargetOf(*server_)));
  }
  static ServerOptions Compiling() {
    ServerOptions o;
    o.compile = true;
    o.nvrtc = Nvrtc();
    return o;
  }
  absl::StatusOr<Session> Open() { return client_->OpenSession({kDevice}); }
  static CompileSpec Spec(std::string source, std::string name = "gx_nvrtc_kernels.cu") {
    CompileSpec spec;
    spec.source = std::move(source);
    spec.name = std::move(name);
    return spec;
  }

  std::unique_ptr<Server> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(CompileModuleTest, SourceIsCompiledLoadedAndRun) {
  ASSERT_NO_FATAL_FAILURE(Start());
  if (IsSkipped()) return;
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(CompiledModule compiled, session.CompileModule(Spec(KernelSource())));
  EXPECT_FALSE(compiled.cached);
  EXPECT_THAT(compiled.kernels, ::testing::Contains("gx_saxpy"));
  EXPECT_THAT(compiled.arch, ::testing::StartsWith("sm_"));
  EXPECT_FALSE(compiled.nvrtc_version.empty());
  GX_ASSERT_OK_AND_ASSIGN(Function saxpy, compiled.module.GetFunction("gx_saxpy"));
  constexpr uint64_t n = 1000;
  std::vector<float> x(n), y(n);
  for (uint64_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i);
    y[i] = 1.0f;
  }
  GX_ASSERT_OK_AND_ASSIGN(Buffer dx, session.Allocate(n * 4));
  GX_ASSERT_OK_AND_ASSIGN(Buffer dy, session.Allocate(n * 4));
  GX_ASSERT_OK(dx.Write(x));
  GX_ASSERT_OK(dy.Write(y));
  LaunchConfig config;
  config.grid = {4, 1, 1};
  config.block = {256, 1, 1};
  GX_ASSERT_OK(
      session
          .LaunchAndWait(saxpy, config, {Arg::F32(2.0f), Arg::Ptr(dx), Arg::Ptr(dy), Arg::U64(n)})
          .status());
  GX_ASSERT_OK_AND_ASSIGN(std::vector<float> out, dy.ReadAs<float>(n));
  for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], 2.0f * i + 1.0f) << i;
}

TEST_F(CompileModuleTest, TheSameSourceCompilesOnceForEverySession) {
  ASSERT_NO_FATAL_FAILURE(Start());
  if (IsSkipped()) return;
  GX_ASSERT_OK_AND_ASSIGN(Session first, Open());
  GX_ASSERT_OK_AND_ASSIGN(Session second, Open());
  GX_ASSERT_OK_AND_ASSIGN(CompiledModule a, first.CompileModule(Spec(KernelSource())));
  GX_ASSERT_OK_AND_ASSIGN(CompiledModule b, second.CompileModule(Spec(KernelSource())));
  EXPECT_FALSE(a.cached);
  EXPECT_TRUE(b.cached);
  EXPECT_EQ(a.module.sha256(), b.module.sha256());
  GX_ASSERT_OK(b.module.GetFunction("gx_fill_u32").status());
}

TEST_F(CompileModuleTest, TheImageComesBackOnlyWhenAskedAndLoadsElsewhere) {
  ASSERT_NO_FATAL_FAILURE(Start());
  if (IsSkipped()) return;
  GX_ASSERT_OK_AND_ASSIGN(Session first, Open());
  GX_ASSERT_OK_AND_ASSIGN(CompiledModule plain, first.CompileModule(Spec(KernelSource())));
  EXPECT_TRUE(plain.image.empty());
  CompileSpec spec = Spec(KernelSource());
  spec.return_image = true;
  GX_ASSERT_OK_AND_ASSIGN(CompiledModule with_image, first.CompileModule(spec));
  EXPECT_TRUE(with_image.cached);
  ASSERT_FALSE(with_image.image.empty());
  EXPECT_FALSE(with_image.image_is_ptx);
  EXPECT_EQ(with_image.image.compare(0, 4,
                                     "\x7f"
                                     "ELF"),
            0)
      << "a cubin is an ELF file";
  // The image is the module's: loaded into another session by LoadModule,
  // it is the same module and its kernels run.
  GX_ASSERT_OK_AND_ASSIGN(Session second, Open());
  GX_ASSERT_OK_AND_ASSIGN(Module loaded, second.LoadModule(with_image.image, ModuleKind::kCubin));
  EXPECT_EQ(loaded.sha256(), with_image.module.sha256());
  GX_ASSERT_OK_AND_ASSIGN(Function fill, loaded.GetFunction("gx_fill_u32"));
  GX_ASSERT_OK_AND_ASSIGN(Buffer out, second.Allocate(64 * 4));
  LaunchConfig config;
  config.block = {64, 1, 1};
  GX_ASSERT_OK(
      second.LaunchAndWait(fill, config, {Arg::Ptr(out), Arg::U32(42), Arg::U64(64)}).status());
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> values, out.ReadAs<uint32_t>(64));
  EXPECT_THAT(values, ::testing::Each(42u));
}

TEST_F(CompileModuleTest, NameExpressionsGiveTheNamesGetFunctionTakes) {
  ASSERT_NO_FATAL_FAILURE(Start());
  if (IsSkipped()) return;
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  CompileSpec spec = Spec(KernelSource());
  spec.name_expressions = {"gx_axpy<float>", "gx_axpy<double>"};
  GX_ASSERT_OK_AND_ASSIGN(CompiledModule compiled, session.CompileModule(spec));
  ASSERT_EQ(compiled.lowered_names.size(), 2u);
  const std::string lowered = compiled.LoweredName("gx_axpy<double>");
  EXPECT_EQ(lowered, "_Z7gx_axpyIdEvT_PKS0_PS0_y");
  GX_ASSERT_OK_AND_ASSIGN(Function f, compiled.module.GetFunction(lowered));
  EXPECT_EQ(f.params().size(), 4u);
}

TEST_F(CompileModuleTest, EachRefusalSaysWhy) {
  ASSERT_NO_FATAL_FAILURE(Start());
  if (IsSkipped()) return;
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  struct Case {
    CompileSpec spec;
    absl::StatusCode code;
    const char* says;
  };
  CompileSpec include = Spec(absl::StrCat("#include \"/etc/passwd\"\n", KernelSource()));
  CompileSpec parent = Spec(absl::StrCat("#include \"../secret.h\"\n", KernelSource()));
  CompileSpec arch = Spec(KernelSource());
  arch.options = {"-arch=sm_80"};
  CompileSpec unknown = Spec(KernelSource());
  unknown.options = {"--time=/tmp/t"};
  CompileSpec broken = Spec("extern \"C\" __global__ void f(widget* w) {}\n", "broken.cu");
  CompileSpec huge = Spec(std::string((1 << 20) + 1, ' '));
  const Case cases[] = {
      {include, absl::StatusCode::kInvalidArgument, "nothing of the daemon's file system"},
      {parent, absl::StatusCode::kInvalidArgument, "with a '..' component"},
      {arch, absl::StatusCode::kInvalidArgument, "the architecture is the device's own"},
      {unknown, absl::StatusCode::kInvalidArgument, "is not allowed; the options allowed"},
      {broken, absl::StatusCode::kInvalidArgument, "broken.cu(1): error"},
      {huge, absl::StatusCode::kResourceExhausted, "over the limit of 1 MiB"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<CompiledModule> out = session.CompileModule(c.spec);
    ASSERT_FALSE(out.ok()) << c.says;
    EXPECT_EQ(out.status().code(), c.code) << out.status();
    EXPECT_THAT(out.status().message(), HasSubstr(c.says));
  }
  // The session serves on.
  GX_ASSERT_OK(session.CompileModule(Spec(KernelSource())).status());
}

TEST_F(CompileModuleTest, ADaemonThatDoesNotCompileSaysSo) {
  ServerOptions o;
  o.compile = false;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  if (IsSkipped()) return;
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  absl::StatusOr<CompiledModule> out = session.CompileModule(Spec(KernelSource()));
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(out.status().message(),
              HasSubstr("this daemon cannot compile kernels from source: it was started without "
                        "compiling (gpuexecd --compile=false); compile elsewhere"));
}

// A source that keeps the compiler busy: the double's marker, or for the
// real NVRTC a type 2^30 leaves wide that an error message must spell out
// (at 2^24 it took NVRTC 13.0 5 s and a 128 MiB log).
std::string BombSource() {
  if (Nvrtc() == GPUEXEC_TEST_DEFAULT_NVRTC) {
    return absl::StrCat("// GXFAKE_COMPILE_SPIN\n", KernelSource());
  }
  return R"(template <class A, class B> struct P {};
template <int N, class T> struct G { typedef typename G<N - 1, P<T, T> >::type type; };
template <class T> struct G<0, T> { typedef T type; };
__global__ void bomb(int* out) { G<30, int>::type t; *out = t; }
)";
}

TEST_F(CompileModuleTest, ACompileBombIsStoppedWhileOtherSessionsRunOn) {
  ServerOptions o = Compiling();
  o.compile_time_limit_s = 1;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  if (IsSkipped()) return;
  GX_ASSERT_OK_AND_ASSIGN(Session bomber, Open());
  GX_ASSERT_OK_AND_ASSIGN(Session bystander, Open());
  GX_ASSERT_OK_AND_ASSIGN(CompiledModule fill, bystander.CompileModule(Spec(KernelSource())));
  GX_ASSERT_OK_AND_ASSIGN(Function f, fill.module.GetFunction("gx_fill_u32"));
  GX_ASSERT_OK_AND_ASSIGN(Buffer out, bystander.Allocate(4096));
  std::atomic<bool> bombing{true};
  std::atomic<int> launches{0};
  std::thread runs([&] {
    LaunchConfig config;
    config.grid = {1, 1, 1};
    config.block = {128, 1, 1};
    while (bombing.load()) {
      ASSERT_TRUE(
          bystander.LaunchAndWait(f, config, {Arg::Ptr(out), Arg::U32(7), Arg::U64(1024)}).ok());
      launches.fetch_add(1);
    }
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<CompiledModule> bomb = bomber.CompileModule(Spec(BombSource(), "bomb.cu"));
  const absl::Duration took = absl::Now() - start;
  bombing = false;
  runs.join();
  ASSERT_FALSE(bomb.ok());
  EXPECT_EQ(bomb.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(bomb.status().message(),
              HasSubstr("the compile of 'bomb.cu' ran past its time limit of 1s "
                        "(--compile_time_limit_s)"));
  EXPECT_LT(took, absl::Seconds(10));
  EXPECT_GT(launches.load(), 0);
  // The bomber's session serves on.
  GX_ASSERT_OK(bomber.CompileModule(Spec(KernelSource())).status());
}

}  // namespace
}  // namespace gpuexec::testing
