// What the gpuexec tool does with CUDA C++ source before and after the
// daemon compiles it, without a daemon: which files are source, what a
// compile sends (the files read, KERNEL added as a name expression, the
// name NVRTC's log gives the source) and how `run`'s KERNEL is found in a
// compiled module. (End to end: cli_compile_test.cc.)

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/cli.h"
#include "cli/command_line.h"
#include "cli/compile_command.h"
#include "cli/failure.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gpuexec::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

std::string Dir() {
  static const std::string* const dir = [] {
    auto* d = new std::string(absl::StrCat(::testing::TempDir(), "cli-compile-source-", getpid()));
    mkdir(d->c_str(), 0755);
    return d;
  }();
  return *dir;
}

std::string Write(const std::string& name, const std::string& text) {
  const std::string path = absl::StrCat(Dir(), "/", name);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

TEST(CompileSourceTest, AFileNamedDotCuIsSource) {
  EXPECT_TRUE(IsCudaSource("saxpy.cu"));
  EXPECT_TRUE(IsCudaSource("dir.d/k.cu"));
  for (const char* file : {"saxpy.cubin", "k.ptx", "k.cuh", "k.cu.bak", "cu", "k.CU"}) {
    EXPECT_FALSE(IsCudaSource(file)) << file;
  }
  EXPECT_FALSE(RefuseSourceAsModule("load", "k.cubin").has_value());
  std::optional<Failure> f = RefuseSourceAsModule("info", "k.cu");
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->exit_code, kExitUsage);
  EXPECT_THAT(f->message, HasSubstr("'gpuexec compile k.cu' compiles it"));
  f = RefuseSourceAsModule("load", "k.cuh");
  ASSERT_TRUE(f.has_value());
  EXPECT_THAT(f->message, HasSubstr("is a CUDA C++ header: give it with --include"));
}

TEST(CompileSourceTest, TheSpecHoldsTheFilesTheOptionsAndTheKernelsExpression) {
  mkdir(absl::StrCat(Dir(), "/inc").c_str(), 0755);
  const std::string source = Write("my kernels.cu", "#include \"util.cuh\"\n");
  const std::string header = Write("inc/util.cuh", "#define N 4\n");
  CommandLine cl;
  cl.command = "run";
  cl.repeated["include"] = {header};
  cl.repeated["nvrtc_option"] = {"-std=c++17", "-DN=4"};
  cl.repeated["name_expression"] = {"axpy<float>"};
  const std::string kernel = "axpy<double>";
  CompileSpec spec;
  std::optional<Failure> f = ReadSource(cl, "run", source, &kernel, &spec);
  ASSERT_FALSE(f.has_value()) << f->message;
  EXPECT_EQ(spec.source, "#include \"util.cuh\"\n");
  EXPECT_EQ(spec.name, "my_kernels.cu");  // a name the daemon takes
  EXPECT_THAT(spec.headers, ElementsAre(Pair("util.cuh", "#define N 4\n")));
  EXPECT_THAT(spec.options, ElementsAre("-std=c++17", "-DN=4"));
  EXPECT_THAT(spec.name_expressions, ElementsAre("axpy<float>", "axpy<double>"));

  // A KERNEL asked for already, or without template arguments, is not
  // added.
  for (const std::string k : {"axpy<float>", "saxpy"}) {
    CompileSpec again;
    ASSERT_FALSE(ReadSource(cl, "run", source, &k, &again).has_value());
    EXPECT_THAT(again.name_expressions, ElementsAre("axpy<float>")) << k;
  }
}

CompiledModule Compiled(std::vector<std::string> kernels,
                        std::vector<std::pair<std::string, std::string>> lowered = {}) {
  CompiledModule c;
  c.kernels = std::move(kernels);
  c.lowered_names = std::move(lowered);
  return c;
}

std::string Symbol(const CompiledModule& c, const std::string& kernel) {
  std::string symbol;
  std::optional<Failure> f = KernelSymbol(c, "k.cu", kernel, &symbol);
  EXPECT_FALSE(f.has_value()) << f->message;
  return symbol;
}

TEST(CompileSourceTest, KernelIsANameALoweredNameOrAnExpression) {
  const CompiledModule c =
      Compiled({"saxpy", "_Z7gx_axpyIdEvT_PKS0_PS0_y", "_Z5scalePfi", "_Z4halfPf", "_Z4halfPd"},
               {{"gx_axpy<double>", "_Z7gx_axpyIdEvT_PKS0_PS0_y"}});
  EXPECT_EQ(Symbol(c, "saxpy"), "saxpy");
  EXPECT_EQ(Symbol(c, "gx_axpy<double>"), "_Z7gx_axpyIdEvT_PKS0_PS0_y");
  EXPECT_EQ(Symbol(c, "_Z7gx_axpyIdEvT_PKS0_PS0_y"), "_Z7gx_axpyIdEvT_PKS0_PS0_y");
  EXPECT_EQ(Symbol(c, "gx_axpy"), "_Z7gx_axpyIdEvT_PKS0_PS0_y");  // the one of that name
  EXPECT_EQ(Symbol(c, "scale"), "_Z5scalePfi");                   // a C++ kernel
  EXPECT_EQ(Symbol(c, "scal"), "scal");  // none: the daemon's NOT_FOUND lists them
  EXPECT_EQ(Symbol(c, "nothing"), "nothing");
  std::string symbol;
  std::optional<Failure> f = KernelSymbol(c, "k.cu", "half", &symbol);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->exit_code, kExitFailure);
  EXPECT_EQ(f->message,
            "run half: k.cu has 2 kernels of that name (overloads or template instantiations): "
            "_Z4halfPf, _Z4halfPd; give one as KERNEL, by its lowered name or as NAME<TYPES>");
}

}  // namespace
}  // namespace gpuexec::cli
