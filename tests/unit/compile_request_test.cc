// The checks of a compile request (server/compile/compile_request.h): every
// refusal names its field, the includes that would leave the given headers
// are refused however they are spelt, and the cache key changes with
// everything that shapes the output and nothing else.

#include "server/compile/compile_request.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace gpuexec::compile {
namespace {

using ::testing::HasSubstr;

constexpr char kSaxpy[] =
    "extern \"C\" __global__ void saxpy(float a, const float* x, float* y, unsigned n) {\n"
    "  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) y[i] = a * x[i] + y[i];\n"
    "}\n";

CompileInput Saxpy() {
  CompileInput in;
  in.source = kSaxpy;
  in.source_name = "saxpy.cu";
  return in;
}

absl::Status CheckSource(const std::string& source) {
  CompileInput in = Saxpy();
  in.source = source;
  return Check(in, Limits());
}

TEST(CompileRequestTest, APlainRequestPasses) {
  CompileInput in = Saxpy();
  in.headers.push_back({"util.cuh", "#pragma once\n#include \"detail/math.h\"\n"});
  in.headers.push_back({"detail/math.h", "inline __device__ float sq(float x) { return x*x; }\n"});
  in.source = absl::StrCat("#include \"util.cuh\"\n#include <cuda_fp16.h>\n", kSaxpy);
  in.options = {"-std=c++17",       "-DBLOCK=256", "--use_fast_math", "-lineinfo",
                "-maxrregcount=64", "--ftz=true",  "-UNDEBUG"};
  in.name_expressions = {"saxpy<float>", "&scale<double, 4>"};
  EXPECT_TRUE(Check(in, Limits()).ok()) << Check(in, Limits());
}

TEST(CompileRequestTest, IncludesOutsideTheHeadersAreRefused) {
  for (const char* source : {
           "#include \"/etc/passwd\"\n",
           "#include </etc/passwd>\n",
           "  #  include \"../secret.h\"\n",
           "#include \"a/../../b.h\"\n",
           "#include_next \"/usr/include/stdio.h\"\n",
           "#inc\\\nlude \"/etc/shadow\"\n",            // spliced
           "#/* a comment */include \"/etc/hosts\"\n",  // a comment is one space
           "#include MACRO\n",
           "#define P \"/etc/passwd\"\n#include P\n",
           "#if __has_include(\"/etc/passwd\")\n#endif\n",
           "#elif __has_include_next(</root/.ssh/id_rsa>)\n",
           "#if __has_include(P)\n#endif\n",
           "%:include \"/etc/passwd\"\n",  // a digraph
           "  %: include </etc/passwd>\n",
           "#define H __has_include(\"/root/.ssh/id_rsa\")\n#if H\n#endif\n",
           "int x = 1e+R\"(\";\n#include \"/etc/passwd\"\n// )\"\n",  // a pp-number, no raw string
           "int v = x'/*';\n#include \"/etc/passwd\"\n// */\n",       // x then a char literal
           "const char* r = R\"0123456789abcdefgh(x)0123456789abcdefgh\";\n",
           "const char* r = R\"x y(z)x y\";\n",
           "import \"/etc/passwd\";\n",
           "export import </etc/passwd>;\n",
           "#line 1 \"/etc/passwd\"\n",
           "#embed \"/etc/passwd\"\n",
           "#if __has_embed(\"/etc/passwd\")\n#endif\n",
           "?\?=include \"/etc/passwd\"\n",              // a trigraph
           "#define X \\ \n#include \"/etc/passwd\"\n",  // backslash, blank, newline
           "int a;\r#include \"/etc/passwd\"\n",         // a bare carriage return
       }) {
    absl::Status s = CheckSource(absl::StrCat(kSaxpy, source));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << source;
    EXPECT_THAT(s.message(), HasSubstr("the source 'saxpy.cu' line ")) << source;
  }
  // A header is checked the same way, and named.
  CompileInput in = Saxpy();
  in.headers.push_back({"util.cuh", "\n#include \"/etc/passwd\"\n"});
  absl::Status s = Check(in, Limits());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("header 0 'util.cuh' line 2"));
  EXPECT_THAT(s.message(), HasSubstr("give the file in headers"));
}

TEST(CompileRequestTest, IncludesInCommentsAndLiteralsAreText) {
  for (const char* source : {
           "// #include \"/etc/passwd\"\n",
           "/*\n#include \"/etc/passwd\"\n*/\n",
           "const char* s = \"#include </etc/passwd>\";\n",
           "const char* r = R\"x(\n#include \"/etc/passwd\"\n)x\";\n",
           "int big = 1'000'000; char c = '#';\n",
           "#ifdef __has_include\n#endif\n",
           "int big = 0x1'0000; double d = 1.5e+3'0;\n",
           "#pragma unroll\n#pragma once\n#line 40\n",
           "const char* u = u8\"x\"; char16_t c = u'y'; wchar_t w = L'z';\n",
       }) {
    EXPECT_TRUE(CheckSource(absl::StrCat(kSaxpy, source)).ok()) << source;
  }
}

TEST(CompileRequestTest, ABomOrALongTokenIsReadInOnePass) {
  EXPECT_THAT(CheckSource(absl::StrCat("\xEF\xBB\xBF", kSaxpy)).message(),
              HasSubstr("byte-order mark"));
  // One megabyte-long identifier, and quotes after long words: each byte is
  // looked at a bounded number of times (a quadratic reading took minutes).
  Limits limits;
  limits.max_source_bytes = 4 << 20;
  CompileInput in = Saxpy();
  in.source = std::string(1 << 20, 'a');
  EXPECT_TRUE(Check(in, limits).ok());
  in.source.clear();
  for (int i = 0; i < 20000; ++i) absl::StrAppend(&in.source, std::string(100, 'b'), "'c'\n");
  EXPECT_TRUE(Check(in, limits).ok());
}

// A number of a million digit separators on one line (1'1'1'...): each
// quote is read in the number's run so far, not by scanning it again, and
// the run is still a number (an #include after it is seen and refused).
TEST(CompileRequestTest, DigitSeparatorsAreReadInOnePass) {
  std::string number = "1";
  for (int i = 0; i < 500000; ++i) number += "'1";
  EXPECT_TRUE(CheckSource(absl::StrCat("const int x = ", number, ";\n", kSaxpy)).ok());
  EXPECT_THAT(
      CheckSource(absl::StrCat("const int x = ", number, ";\n#include \"/etc/passwd\"\n", kSaxpy))
          .message(),
      HasSubstr("#include"));
  // Exponent signs in the run: 0x1p+1'0 and 1e-1'0 stay numbers.
  EXPECT_THAT(
      CheckSource(absl::StrCat("double y = 0x1p+1'0 + 1e-1'0;\n#include \"/etc/x\"\n", kSaxpy))
          .message(),
      HasSubstr("#include"));
}

TEST(CompileRequestTest, OptionsOutsideTheAllowListAreRefusedNamingThem) {
  struct Case {
    const char* option;
    const char* says;
  } cases[] = {
      {"-arch=sm_80", "the architecture is the device's own"},
      {"--gpu-architecture=compute_90", "the architecture is the device's own"},
      {"-I/usr/include", "nothing of the daemon's file system can be included"},
      {"--include-path=/etc", "nothing of the daemon's file system can be included"},
      {"--pre-include=/etc/passwd", "nothing of the daemon's file system can be included"},
      {"-std=gnu++17", "c++11, c++14, c++17 or c++20"},
      {"-DX=1\n#include \"/etc/passwd\"", "printable ASCII on one line"},
      {"-D1X", "a C identifier"},
      {"-DP=__has_include(\"/etc/passwd\")", "a C identifier"},
      {"-maxrregcount=4096", "16 to 255"},
      {"--ftz=yes", "true or false"},
      {"--time=/tmp/x", "is not allowed; the options allowed: -std="},
      {"-rdc=true", "is not allowed"},
  };
  for (const Case& c : cases) {
    CompileInput in = Saxpy();
    in.options = {"-std=c++17", c.option};
    absl::Status s = Check(in, Limits());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.option;
    EXPECT_THAT(s.message(), HasSubstr("option 1 ")) << c.option;
    EXPECT_THAT(s.message(), HasSubstr(c.says)) << c.option;
  }
}

TEST(CompileRequestTest, SizesAndCountsPastTheLimitsAreRefusedNamingTheLimit) {
  Limits limits;
  limits.max_source_bytes = 1000;
  CompileInput in = Saxpy();
  in.source = std::string(1001, ' ');
  absl::Status s = Check(in, limits);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("over the limit of 1000 bytes"));

  in = Saxpy();
  for (int i = 0; i < 65; ++i) in.headers.push_back({absl::StrCat("h", i, ".h"), ""});
  EXPECT_THAT(Check(in, Limits()).message(), HasSubstr("65 headers sent, over the limit of 64"));

  in = Saxpy();
  limits = Limits();
  limits.max_header_bytes = 100;
  in.headers = {{"a.h", std::string(60, ' ')}, {"b.h", std::string(60, ' ')}};
  s = Check(in, limits);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("header 1 'b.h'"));

  in = Saxpy();
  in.options.assign(65, "-w");
  EXPECT_THAT(Check(in, Limits()).message(), HasSubstr("65 options sent, over the limit of 64"));
  in = Saxpy();
  in.name_expressions.assign(65, "f<int>");
  EXPECT_THAT(Check(in, Limits()).message(), HasSubstr("over the limit of 64"));
  in = Saxpy();
  in.name_expressions = {"f<int>", "g<int>\n#include \"/etc/passwd\""};
  EXPECT_THAT(Check(in, Limits()).message(), HasSubstr("name expression 1"));
}

TEST(CompileRequestTest, NamesAndTextAreChecked) {
  CompileInput in = Saxpy();
  in.source_name = "../saxpy.cu";
  EXPECT_THAT(Check(in, Limits()).message(), HasSubstr("not a plain relative name"));
  for (const char* name : {"/abs.h", "a/../b.h", "./a.h", "a//b.h", "", "a b.h", "a\\b.h"}) {
    in = Saxpy();
    in.headers = {{name, ""}};
    EXPECT_EQ(Check(in, Limits()).code(), absl::StatusCode::kInvalidArgument) << name;
  }
  in = Saxpy();
  in.headers = {{"a.h", ""}, {"a.h", ""}};
  EXPECT_THAT(Check(in, Limits()).message(), HasSubstr("header 1 'a.h' is given twice"));
  in = Saxpy();
  in.source = std::string("__global__ void f() {}") + '\0' + " #include \"/etc/passwd\"";
  EXPECT_THAT(Check(in, Limits()).message(), HasSubstr("NUL byte at offset 22"));
  in.source = "";
  EXPECT_THAT(Check(in, Limits()).message(), HasSubstr("the source is empty"));
}

TEST(CompileRequestTest, TheRefusalQuotesAShortEscapedPrefix) {
  CompileInput in = Saxpy();
  in.options = {std::string("-\x1b[31m") + std::string(200, 'x')};
  absl::Status s = Check(in, Limits());
  EXPECT_THAT(s.message(), HasSubstr("\\x1b"));
  EXPECT_LT(s.message().size(), 600u);
}

TEST(CompileRequestTest, TheArchitectureIsTheDevicesOwn) {
  CompileInput in = Saxpy();
  in.options = {"-std=c++17"};
  EXPECT_EQ(CompileOptions(in, 9, 0), (std::vector<std::string>{"-std=c++17", "-arch=sm_90"}));
  EXPECT_EQ(ArchName(12, 1), "sm_121");
}

TEST(CompileRequestTest, TheCacheKeyFollowsEverythingThatShapesTheOutput) {
  const CompileInput base = [] {
    CompileInput in = Saxpy();
    in.headers = {{"a.h", "A"}, {"b.h", "B"}};
    in.options = {"-std=c++17"};
    in.name_expressions = {"f<int>"};
    return in;
  }();
  const std::string key = CacheKey(base, "13.0", "sm_90");
  EXPECT_EQ(key.size(), 64u);
  EXPECT_EQ(CacheKey(base, "13.0", "sm_90"), key);
  // Header order does not matter; everything else does.
  CompileInput reordered = base;
  std::swap(reordered.headers[0], reordered.headers[1]);
  EXPECT_EQ(CacheKey(reordered, "13.0", "sm_90"), key);
  EXPECT_NE(CacheKey(base, "13.1", "sm_90"), key);
  EXPECT_NE(CacheKey(base, "13.0", "sm_100"), key);
  CompileInput changed = base;
  changed.source += " ";
  EXPECT_NE(CacheKey(changed, "13.0", "sm_90"), key);
  changed = base;
  changed.headers[0].content = "A ";
  EXPECT_NE(CacheKey(changed, "13.0", "sm_90"), key);
  changed = base;
  changed.options.push_back("-lineinfo");
  EXPECT_NE(CacheKey(changed, "13.0", "sm_90"), key);
  changed = base;
  changed.name_expressions = {"f<long>"};
  EXPECT_NE(CacheKey(changed, "13.0", "sm_90"), key);
  // Fields cannot run into each other: "ab" + "c" is not "a" + "bc".
  changed = base;
  changed.headers = {{"a.h", "AB"}, {"b.h", ""}};
  CompileInput other = base;
  other.headers = {{"a.h", "A"}, {"b.h", "B"}};
  EXPECT_NE(CacheKey(changed, "13.0", "sm_90"), CacheKey(other, "13.0", "sm_90"));
}

}  // namespace
}  // namespace gpuexec::compile
