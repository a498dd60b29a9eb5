// Unit test of the NVRTC test double: the API, the compile and the images.
// It dlopen()s libgpuexec_fakenvrtc.so the way the compile process opens
// libnvrtc, drives it only through the dlsym'd entry points, and reads the
// images it writes with the libcuda double's own reader
// (tests/fake_cuda/image_reader.h). The mangled names and log lines
// expected here are NVRTC 13.0's, as it printed them for the same sources.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "server/compile/nvrtc_api.h"
#include "tests/fake_cuda/image_reader.h"
#include "tests/fake_nvrtc/fake_nvrtc_test_util.h"

namespace gxnvrtc_test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

const std::vector<ParamSlot> kSaxpyModel = {{0, 4}, {8, 8}, {16, 8}, {24, 8}};
const std::vector<ParamSlot> kFillU32Model = {{0, 8}, {8, 4}, {16, 8}};

TEST(FakeNvrtc, VersionIs13Unless_GXFAKE_NVRTC_VERSION) {
  int major = 0, minor = -1;
  unsetenv("GXFAKE_NVRTC_VERSION");
  ASSERT_EQ(Nvrtc().nvrtcVersion(&major, &minor), NVRTC_SUCCESS);
  EXPECT_EQ(major, 13);
  EXPECT_EQ(minor, 0);
  setenv("GXFAKE_NVRTC_VERSION", "12.4", 1);
  ASSERT_EQ(Nvrtc().nvrtcVersion(&major, &minor), NVRTC_SUCCESS);
  EXPECT_EQ(major, 12);
  EXPECT_EQ(minor, 4);
  setenv("GXFAKE_NVRTC_VERSION", "twelve", 1);
  ASSERT_EQ(Nvrtc().nvrtcVersion(&major, &minor), NVRTC_SUCCESS);
  EXPECT_EQ(major, 13);
  unsetenv("GXFAKE_NVRTC_VERSION");
  EXPECT_EQ(Nvrtc().nvrtcVersion(nullptr, &minor), NVRTC_ERROR_INVALID_INPUT);
}

TEST(FakeNvrtc, SupportedArchsAreCuda13s) {
  int n = 0;
  ASSERT_EQ(Nvrtc().nvrtcGetNumSupportedArchs(&n), NVRTC_SUCCESS);
  std::vector<int> archs(static_cast<size_t>(n));
  ASSERT_EQ(Nvrtc().nvrtcGetSupportedArchs(archs.data()), NVRTC_SUCCESS);
  EXPECT_THAT(archs, ElementsAre(75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121));
  EXPECT_EQ(Nvrtc().nvrtcGetNumSupportedArchs(nullptr), NVRTC_ERROR_INVALID_INPUT);
  EXPECT_EQ(Nvrtc().nvrtcGetSupportedArchs(nullptr), NVRTC_ERROR_INVALID_INPUT);
}

TEST(FakeNvrtc, ErrorStringsAreTheCodesNames) {
  EXPECT_STREQ(Nvrtc().nvrtcGetErrorString(NVRTC_SUCCESS), "NVRTC_SUCCESS");
  EXPECT_STREQ(Nvrtc().nvrtcGetErrorString(NVRTC_ERROR_COMPILATION), "NVRTC_ERROR_COMPILATION");
  EXPECT_STREQ(Nvrtc().nvrtcGetErrorString(NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID),
               "NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID");
  EXPECT_STREQ(Nvrtc().nvrtcGetErrorString(static_cast<nvrtcResult>(99)), "NVRTC_ERROR unknown");
  EXPECT_STREQ(Nvrtc().nvrtcGetErrorString(static_cast<nvrtcResult>(-1)), "NVRTC_ERROR unknown");
}

TEST(FakeNvrtc, EveryEntryPointChecksItsArguments) {
  const Api& api = Nvrtc();
  nvrtcProgram p = nullptr;
  const char* text = "x";
  EXPECT_EQ(api.nvrtcCreateProgram(nullptr, "", "n", 0, nullptr, nullptr),
            NVRTC_ERROR_INVALID_PROGRAM);
  EXPECT_EQ(api.nvrtcCreateProgram(&p, nullptr, "n", 0, nullptr, nullptr),
            NVRTC_ERROR_INVALID_INPUT);
  EXPECT_EQ(api.nvrtcCreateProgram(&p, "", "n", -1, nullptr, nullptr), NVRTC_ERROR_INVALID_INPUT);
  EXPECT_EQ(api.nvrtcCreateProgram(&p, "", "n", 1, nullptr, &text), NVRTC_ERROR_INVALID_INPUT);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(api.nvrtcDestroyProgram(nullptr), NVRTC_ERROR_INVALID_PROGRAM);
  EXPECT_EQ(api.nvrtcDestroyProgram(&p), NVRTC_ERROR_INVALID_PROGRAM);
  size_t size = 0;
  char buffer[8];
  const char* name = nullptr;
  EXPECT_EQ(api.nvrtcCompileProgram(nullptr, 0, nullptr), NVRTC_ERROR_INVALID_PROGRAM);
  EXPECT_EQ(api.nvrtcGetPTXSize(nullptr, &size), NVRTC_ERROR_INVALID_PROGRAM);
  EXPECT_EQ(api.nvrtcGetPTX(nullptr, buffer), NVRTC_ERROR_INVALID_PROGRAM);
  EXPECT_EQ(api.nvrtcGetCUBINSize(nullptr, &size), NVRTC_ERROR_INVALID_PROGRAM);
  EXPECT_EQ(api.nvrtcGetCUBIN(nullptr, buffer), NVRTC_ERROR_INVALID_PROGRAM);
  EXPECT_EQ(api.nvrtcGetProgramLogSize(nullptr, &size), NVRTC_ERROR_INVALID_PROGRAM);
  EXPECT_EQ(api.nvrtcGetProgramLog(nullptr, buffer), NVRTC_ERROR_INVALID_PROGRAM);
  EXPECT_EQ(api.nvrtcAddNameExpression(nullptr, "k"), NVRTC_ERROR_INVALID_PROGRAM);
  EXPECT_EQ(api.nvrtcGetLoweredName(nullptr, "k", &name), NVRTC_ERROR_INVALID_PROGRAM);

  Program prog("");
  EXPECT_EQ(api.nvrtcCompileProgram(prog.get(), -1, nullptr), NVRTC_ERROR_INVALID_INPUT);
  EXPECT_EQ(api.nvrtcCompileProgram(prog.get(), 1, nullptr), NVRTC_ERROR_INVALID_INPUT);
  EXPECT_EQ(api.nvrtcGetPTXSize(prog.get(), nullptr), NVRTC_ERROR_INVALID_INPUT);
  EXPECT_EQ(api.nvrtcGetPTX(prog.get(), nullptr), NVRTC_ERROR_INVALID_INPUT);
  EXPECT_EQ(api.nvrtcGetCUBINSize(prog.get(), nullptr), NVRTC_ERROR_INVALID_INPUT);
  EXPECT_EQ(api.nvrtcGetCUBIN(prog.get(), nullptr), NVRTC_ERROR_INVALID_INPUT);
  EXPECT_EQ(api.nvrtcGetProgramLogSize(prog.get(), nullptr), NVRTC_ERROR_INVALID_INPUT);
  EXPECT_EQ(api.nvrtcGetProgramLog(prog.get(), nullptr), NVRTC_ERROR_INVALID_INPUT);
  EXPECT_EQ(api.nvrtcAddNameExpression(prog.get(), nullptr), NVRTC_ERROR_INVALID_INPUT);
  EXPECT_EQ(api.nvrtcGetLoweredName(prog.get(), nullptr, &name), NVRTC_ERROR_INVALID_INPUT);
  EXPECT_EQ(api.nvrtcGetLoweredName(prog.get(), "k", nullptr), NVRTC_ERROR_INVALID_INPUT);
}

TEST(FakeNvrtc, DestroySetsTheHandleToNull) {
  nvrtcProgram p = nullptr;
  ASSERT_EQ(Nvrtc().nvrtcCreateProgram(&p, "", nullptr, 0, nullptr, nullptr), NVRTC_SUCCESS);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(Nvrtc().nvrtcDestroyProgram(&p), NVRTC_SUCCESS);
  EXPECT_EQ(p, nullptr);
}

TEST(FakeNvrtc, BeforeACompileThereIsNoOutputAndAnEmptyLog) {
  Program prog("extern \"C\" __global__ void k(int x) {}\n");
  size_t size = 99;
  EXPECT_EQ(Nvrtc().nvrtcGetProgramLogSize(prog.get(), &size), NVRTC_SUCCESS);
  EXPECT_EQ(size, 1u);
  EXPECT_EQ(Nvrtc().nvrtcGetPTXSize(prog.get(), &size), NVRTC_SUCCESS);
  EXPECT_EQ(size, 1u);
  EXPECT_EQ(Nvrtc().nvrtcGetCUBINSize(prog.get(), &size), NVRTC_SUCCESS);
  EXPECT_EQ(size, 0u);
  EXPECT_EQ(prog.Lowered("k"), "error 9");  // NO_LOWERED_NAMES_BEFORE_COMPILATION
}

TEST(FakeNvrtc, TheTestKernelsCompileToModelsOfTheDriverDouble) {
  const std::string source = ReadFile(GXFAKE_NVRTC_KERNELS);
  ASSERT_THAT(source, HasSubstr("gx_saxpy"));
  Program prog(source, "gx_nvrtc_kernels.cu");
  ASSERT_EQ(prog.Add("gx_axpy<float>"), NVRTC_SUCCESS);
  ASSERT_EQ(prog.Add("&gx_axpy<double>"), NVRTC_SUCCESS);
  ASSERT_EQ(prog.Compile({"-arch=sm_90", "-std=c++17"}), NVRTC_SUCCESS) << prog.Log();
  EXPECT_EQ(prog.Log(), "");
  EXPECT_EQ(prog.Lowered("gx_axpy<float>"), "_Z7gx_axpyIfEvT_PKS0_PS0_y");
  EXPECT_EQ(prog.Lowered("&gx_axpy<double>"), "_Z7gx_axpyIdEvT_PKS0_PS0_y");

  const std::string cubin = prog.Cubin();
  ASSERT_GE(cubin.size(), 64u);
  EXPECT_EQ(gxfake::SniffImage(cubin.data()), gxfake::ImageFormat::kCubin);
  EXPECT_EQ(gxfake::DeclaredImageSize(cubin.data()), cubin.size());
  uint16_t machine = 0;
  uint32_t flags = 0;
  std::memcpy(&machine, cubin.data() + 0x12, 2);
  std::memcpy(&flags, cubin.data() + 0x30, 4);
  EXPECT_EQ(machine, 190);
  EXPECT_EQ(flags, 0x06005a04u);  // as NVRTC 13.0 writes sm_90
  const std::map<std::string, std::vector<ParamSlot>> want = {
      {"gx_saxpy", kSaxpyModel},
      {"gx_fill_u32", kFillU32Model},
      {"_Z7gx_axpyIfEvT_PKS0_PS0_y", kSaxpyModel},
      {"_Z7gx_axpyIdEvT_PKS0_PS0_y", {{0, 8}, {8, 8}, {16, 8}, {24, 8}}},
  };
  const std::vector<ImageKernel> kernels = Read(cubin);
  EXPECT_EQ(Layouts(kernels), want);
  for (const ImageKernel& k : kernels) EXPECT_EQ(k.registers, 32) << k.name;

  const std::string ptx = prog.Ptx();
  EXPECT_THAT(ptx, HasSubstr(".version 9.0\n.target sm_90\n.address_size 64\n"));
  EXPECT_EQ(gxfake::SniffImage(ptx.c_str()), gxfake::ImageFormat::kPtx);
  EXPECT_EQ(Layouts(Read(ptx)), want);
  EXPECT_THAT(ptx, HasSubstr(".visible .entry gx_saxpy(\n\t.param .f32 gx_saxpy_param_0,\n"
                             "\t.param .u64 gx_saxpy_param_1,"));
}

TEST(FakeNvrtc, EveryScalarTypeAndPointerIsLaidOutNaturally) {
  Program prog(
      "extern \"C\" __global__ void k(char a, short b, double c, bool d, long long e, int* f,\n"
      "    unsigned char g, const float* __restrict__ h, uint16_t i, int32_t j, size_t k2,\n"
      "    __half l, signed char m, unsigned long n, float o, int8_t p, const void* q) {}\n"
      "extern \"C\" __global__ void none() {}\n"
      "extern \"C\" __global__ void void_list(void) {}\n");
  ASSERT_EQ(prog.Compile({"--gpu-architecture=sm_80"}), NVRTC_SUCCESS) << prog.Log();
  const std::vector<ParamSlot> want = {{0, 1},  {2, 2},  {8, 8},  {16, 1}, {24, 8}, {32, 8},
                                       {40, 1}, {48, 8}, {56, 2}, {60, 4}, {64, 8}, {72, 2},
                                       {74, 1}, {80, 8}, {88, 4}, {92, 1}, {96, 8}};
  const std::map<std::string, std::vector<ParamSlot>> layouts = Layouts(Read(prog.Cubin()));
  EXPECT_EQ(layouts.at("k"), want);
  EXPECT_TRUE(layouts.at("none").empty());
  EXPECT_TRUE(layouts.at("void_list").empty());
  const std::string ptx = prog.Ptx();
  EXPECT_EQ(Layouts(Read(ptx)).at("k"), want);
  EXPECT_THAT(ptx, HasSubstr(".param .align 2 .b8 k_param_11[2]"));
  EXPECT_THAT(ptx, HasSubstr(".visible .entry none()\n"));
}

TEST(FakeNvrtc, ComputeArchGivesPtxOnlyAndTheDefaultIsCompute75) {
  Program prog("extern \"C\" __global__ void k(int x) {}\n");
  ASSERT_EQ(prog.Compile({"-arch=compute_90"}), NVRTC_SUCCESS);
  EXPECT_EQ(prog.Cubin(), "");
  EXPECT_THAT(prog.Ptx(), HasSubstr(".target sm_90\n"));
  ASSERT_EQ(prog.Compile({}), NVRTC_SUCCESS);
  EXPECT_EQ(prog.Cubin(), "");
  EXPECT_THAT(prog.Ptx(), HasSubstr(".target sm_75\n"));
  ASSERT_EQ(prog.Compile({"-arch", "sm_120"}), NVRTC_SUCCESS);
  const std::string cubin = prog.Cubin();
  ASSERT_GE(cubin.size(), 64u);
  EXPECT_EQ(static_cast<uint8_t>(cubin[0x31]), 120);
  EXPECT_EQ(Layouts(Read(cubin)).at("k"), (std::vector<ParamSlot>{{0, 4}}));
}

TEST(FakeNvrtc, AnEmptySourceIsAnEmptyModule) {
  Program prog("// nothing here\n", nullptr);
  ASSERT_EQ(prog.Compile({"-arch=sm_90"}), NVRTC_SUCCESS);
  EXPECT_EQ(prog.Log(), "");
  EXPECT_TRUE(Read(prog.Cubin()).empty());
  EXPECT_THAT(prog.Ptx(), Not(HasSubstr(".entry")));
}

TEST(FakeNvrtc, OptionsAreAcceptedOrRefusedAsNvrtcDoes) {
  Program prog("extern \"C\" __global__ void k(int x) {}\n");
  EXPECT_EQ(prog.Compile({"-arch=sm_90a", "-std=c++20", "-D", "FOO", "-DBAR=1", "-D=BAZ",
                          "--use_fast_math", "-lineinfo", "--maxrregcount=24", "-default-device",
                          "--device-debug", "-G", "-I/nowhere", "-I", "x", "-UFOO", "-maxrregcount",
                          "16"}),
            NVRTC_SUCCESS)
      << prog.Log();
  for (const ImageKernel& k : Read(prog.Cubin())) EXPECT_EQ(k.registers, 16);
  const std::string long_option = "--" + std::string(200, 'z');
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{"-arch=sm_91"}, "nvrtc: error: invalid value for --gpu-architecture (-arch)\n"},
      {{"-arch=sm_"}, "nvrtc: error: invalid value for --gpu-architecture (-arch)\n"},
      {{"-arch"}, "nvrtc: error: invalid value for --gpu-architecture (-arch)\n"},
      {{"--bogus-option"}, "nvrtc: error: unrecognized option --bogus-option found\n"},
      {{"bogus"}, "nvrtc: error: unrecognized option bogus found\n"},
      {{long_option},
       "nvrtc: error: unrecognized option " + long_option.substr(0, 64) + " found\n"},
      {{"-std=c++23"}, "nvrtc: error: invalid value for --std(-std)\n"},
      {{"--maxrregcount=abc"},
       "nvrtc: error: --maxrregcount (-maxrregcount) expects an integer value\n"},
  };
  for (const auto& [options, log] : refused) {
    EXPECT_EQ(prog.Compile(options), NVRTC_ERROR_INVALID_OPTION) << options[0];
    EXPECT_EQ(prog.Log(), log);
    EXPECT_EQ(prog.Cubin(), "");
  }
  EXPECT_EQ(prog.Compile({"-D"}), NVRTC_ERROR_COMPILATION);
  EXPECT_EQ(prog.Log(),
            "Command-line error: invalid macro definition: \n\n1 catastrophic error detected in "
            "the compilation of \"prog.cu\".\nCompilation terminated.\n");
}

TEST(FakeNvrtc, IncludesResolveOnlyToTheProgramsHeaders) {
  Program ok("#include \"a.h\"\n#include <dir/b.h>\n", "prog.cu",
             {{"a.h", "#pragma once\nextern \"C\" __global__ void from_a(float* p) {}\n"},
              {"dir/b.h", "#include \"a.h\"\nextern \"C\" __global__ void from_b(int n) {}\n"}});
  ASSERT_EQ(ok.Compile({"-arch=sm_90"}), NVRTC_SUCCESS) << ok.Log();
  EXPECT_EQ(Layouts(Read(ok.Cubin())), (std::map<std::string, std::vector<ParamSlot>>{
                                           {"from_a", {{0, 8}}}, {"from_b", {{0, 4}}}}));

  Program missing("\n#include \"nothere.h\"\n", "prog.cu", {{"NotHere.h", ""}});
  EXPECT_EQ(missing.Compile({"-arch=sm_90"}), NVRTC_ERROR_COMPILATION);
  EXPECT_EQ(missing.Log(),
            "prog.cu(2): catastrophic error: cannot open source file \"nothere.h\"\n"
            "  #include \"nothere.h\"\n                      ^\n\n"
            "1 catastrophic error detected in the compilation of \"prog.cu\".\n"
            "Compilation terminated.\n");

  Program angle("#include <cuda_fp16.h>\n");
  EXPECT_EQ(angle.Compile({}), NVRTC_ERROR_COMPILATION);
  EXPECT_THAT(angle.Log(), HasSubstr("prog.cu(1): catastrophic error: could not open source file "
                                     "\"cuda_fp16.h\" (no directories in search list)\n"));
  EXPECT_EQ(angle.Compile({"-I/usr/include"}), NVRTC_ERROR_COMPILATION);
  EXPECT_THAT(angle.Log(),
              HasSubstr("prog.cu(1): catastrophic error: cannot open source file \"cuda_fp16.h\""));

  const std::string hostile = std::string(300, 'n') + "\x01\xff.h";
  Program cut("#include \"" + hostile + "\"\n");
  EXPECT_EQ(cut.Compile({}), NVRTC_ERROR_COMPILATION);
  EXPECT_THAT(cut.Log(), HasSubstr("cannot open source file \"" + std::string(128, 'n') + "\"\n"));

  Program cycle("#include \"a.h\"\n", nullptr,
                {{"a.h", "#include \"b.h\"\n"}, {"b.h", "\n#include \"a.h\"\n"}});
  EXPECT_EQ(cycle.Compile({}), NVRTC_ERROR_COMPILATION);
  EXPECT_THAT(cycle.Log(), HasSubstr("b.h(2): catastrophic error: #include file \"a.h\" includes "
                                     "itself\n"));
  EXPECT_THAT(cycle.Log(), HasSubstr("in the compilation of \"default_program\".\n"));

  std::vector<std::pair<std::string, std::string>> chain;
  for (int i = 0; i < 40; ++i) {
    chain.emplace_back("h" + std::to_string(i), "#include \"h" + std::to_string(i + 1) + "\"\n");
  }
  Program deep("#include \"h0\"\n", "prog.cu", chain);
  EXPECT_EQ(deep.Compile({}), NVRTC_ERROR_COMPILATION);
  EXPECT_THAT(deep.Log(), HasSubstr("catastrophic error: #include file \"h32\" is nested more "
                                    "than 32 levels deep\n"));
}

TEST(FakeNvrtc, ConditionalsAndDefinesSelectTheKernels) {
  const std::string source =
      "#define LOCAL 2\n"
      "#ifdef WIDE\n"
      "extern \"C\" __global__ void k(double x) {}\n"
      "#elif defined(NARROW) && LOCAL == 2\n"
      "extern \"C\" __global__ void k(char x) {}\n"
      "#else\n"
      "extern \"C\" __global__ void k(int x) {}\n"
      "#error never\n"
      "#endif\n"
      "#if 0\n#error not this one\n#endif\n"
      "#ifndef __CUDACC_RTC__\n#error predefined\n#endif\n"
      "#if __CUDA_ARCH__ >= 800\nextern \"C\" __global__ void ampere() {}\n#endif\n";
  Program prog(source);
  ASSERT_EQ(prog.Compile({"-DWIDE", "-arch=sm_90"}), NVRTC_SUCCESS) << prog.Log();
  EXPECT_EQ(Layouts(Read(prog.Cubin())).at("k"), (std::vector<ParamSlot>{{0, 8}}));
  EXPECT_EQ(Layouts(Read(prog.Cubin())).count("ampere"), 1u);
  ASSERT_EQ(prog.Compile({"-D", "NARROW", "-arch=sm_75"}), NVRTC_SUCCESS) << prog.Log();
  EXPECT_EQ(Layouts(Read(prog.Cubin())).at("k"), (std::vector<ParamSlot>{{0, 1}}));
  EXPECT_EQ(Layouts(Read(prog.Cubin())).count("ampere"), 0u);
  EXPECT_EQ(prog.Compile({"-arch=sm_90"}), NVRTC_ERROR_COMPILATION);
  EXPECT_EQ(prog.Log(),
            "prog.cu(8): catastrophic error: #error directive: never\n"
            "  #error never\n   ^\n\n"
            "1 catastrophic error detected in the compilation of \"prog.cu\".\n"
            "Compilation terminated.\n");
  EXPECT_EQ(prog.Cubin(), "");
  EXPECT_EQ(prog.Ptx(), "");
}

TEST(FakeNvrtc, AnUnknownParameterTypeIsAnErrorNamingItsLine) {
  Program prog(
      "extern \"C\" __global__ void k(foo_t x, bar_t y) {}\n__global__ void z(baz w) {}\n");
  EXPECT_EQ(prog.Compile({"-arch=sm_90"}), NVRTC_ERROR_COMPILATION);
  EXPECT_EQ(prog.Log(),
            "prog.cu(1): error: identifier \"foo_t\" is undefined\n"
            "  extern \"C\" __global__ void k(foo_t x, bar_t y) {}\n"
            "                               ^\n\n"
            "prog.cu(1): error: identifier \"bar_t\" is undefined\n"
            "  extern \"C\" __global__ void k(foo_t x, bar_t y) {}\n"
            "                                        ^\n\n"
            "prog.cu(2): error: identifier \"baz\" is undefined\n"
            "  __global__ void z(baz w) {}\n"
            "                    ^\n\n"
            "3 errors detected in the compilation of \"prog.cu\".\n");
  EXPECT_EQ(prog.Cubin(), "");
}

TEST(FakeNvrtc, LoweredNamesAreNvrtc13sManglings) {
  Program prog(
      "template <typename T> __global__ void saxpy(T a, const T* x, T* y, unsigned n) { }\n"
      "template <typename T> __global__ void k2(T a, T* b, const T* c, int* d, const int* e, T f,"
      " const int* const g, T* const h) {}\n"
      "template <typename T, typename U> __global__ void k3(T a, U* b, const U* c, T* d) {}\n"
      "template <class T> __global__ void plain(T a, T* b, T* c) {}\n"
      "__global__ void m(int a) {}\n"
      "__global__ void m(const float* a, __half h) {}\n"
      "extern \"C\" __global__ void c_kernel(int a) {}\n");
  const std::vector<std::pair<const char*, const char*>> want = {
      {"saxpy<float>", "_Z5saxpyIfEvT_PKS0_PS0_j"},
      {"&saxpy<double>", "_Z5saxpyIdEvT_PKS0_PS0_j"},
      {"saxpy<long long>", "_Z5saxpyIxEvT_PKS0_PS0_j"},
      {"k2<int>", "_Z2k2IiEvT_PS0_PKS0_PiPKiS0_S6_S1_"},
      {"k2<unsigned char>", "_Z2k2IhEvT_PS0_PKS0_PiPKiS0_S6_S1_"},
      {"k2<bool>", "_Z2k2IbEvT_PS0_PKS0_PiPKiS0_S6_S1_"},
      {"k2<signed char>", "_Z2k2IaEvT_PS0_PKS0_PiPKiS0_S6_S1_"},
      {"k2<char>", "_Z2k2IcEvT_PS0_PKS0_PiPKiS0_S6_S1_"},
      {"k2<unsigned long>", "_Z2k2ImEvT_PS0_PKS0_PiPKiS0_S6_S1_"},
      {"k2<long>", "_Z2k2IlEvT_PS0_PKS0_PiPKiS0_S6_S1_"},
      {"k2<short>", "_Z2k2IsEvT_PS0_PKS0_PiPKiS0_S6_S1_"},
      {"k2<unsigned short>", "_Z2k2ItEvT_PS0_PKS0_PiPKiS0_S6_S1_"},
      {"k2<unsigned long long>", "_Z2k2IyEvT_PS0_PKS0_PiPKiS0_S6_S1_"},
      {"k3<int,float>", "_Z2k3IifEvT_PT0_PKS1_PS0_"},
      {"k3<float, float>", "_Z2k3IffEvT_PT0_PKS1_PS0_"},
      {"plain<float>", "_Z5plainIfEvT_PS0_S1_"},
      {"m", "_Z1mi"},
      {"c_kernel", "c_kernel"},
  };
  for (const auto& [expression, lowered] : want) ASSERT_EQ(prog.Add(expression), NVRTC_SUCCESS);
  ASSERT_EQ(prog.Compile({"-arch=sm_90"}), NVRTC_SUCCESS) << prog.Log();
  for (const auto& [expression, lowered] : want) {
    EXPECT_EQ(prog.Lowered(expression), lowered) << expression;
  }
  const std::map<std::string, std::vector<ParamSlot>> layouts = Layouts(Read(prog.Cubin()));
  EXPECT_EQ(layouts.at("_Z5saxpyIdEvT_PKS0_PS0_j"),
            (std::vector<ParamSlot>{{0, 8}, {8, 8}, {16, 8}, {24, 4}}));
  EXPECT_EQ(layouts.at("_Z2k3IifEvT_PT0_PKS1_PS0_"),
            (std::vector<ParamSlot>{{0, 4}, {8, 8}, {16, 8}, {24, 8}}));
  EXPECT_EQ(layouts.at("_Z1mi"), (std::vector<ParamSlot>{{0, 4}}));
  EXPECT_EQ(layouts.at("_Z1mPKf6__half"), (std::vector<ParamSlot>{{0, 8}, {8, 2}}));
  EXPECT_EQ(layouts.count("c_kernel"), 1u);
  // Every instantiation, both overloads of m, and c_kernel.
  EXPECT_EQ(layouts.size(), want.size() + 1);
  EXPECT_EQ(prog.Lowered("saxpy<int>"), "error 10");  // NAME_EXPRESSION_NOT_VALID
  EXPECT_EQ(prog.Add("saxpy<int>"), NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION);
}

TEST(FakeNvrtc, AnExpressionNamingNoKernelFailsTheCompile) {
  Program prog("template <typename T> __global__ void t(T a) {}\n");
  ASSERT_EQ(prog.Add("t<float>"), NVRTC_SUCCESS);
  ASSERT_EQ(prog.Add("nothere<int>"), NVRTC_SUCCESS);
  EXPECT_EQ(prog.Compile({"-arch=sm_90"}), NVRTC_ERROR_COMPILATION);
  EXPECT_THAT(prog.Log(),
              HasSubstr("__nv_name_map(3): error: identifier \"nothere\" is undefined"));
  EXPECT_THAT(prog.Log(), HasSubstr("Input name expression was: \"nothere<int>\""));
  EXPECT_THAT(prog.Log(), HasSubstr("2 errors detected in the compilation of \"prog.cu\".\n"));
  EXPECT_EQ(prog.Lowered("t<float>"), "error 9");  // no lowered names after a failed compile

  Program unknown_arg("template <typename T> __global__ void t(T a) {}\n");
  ASSERT_EQ(unknown_arg.Add("t<widget>"), NVRTC_SUCCESS);
  EXPECT_EQ(unknown_arg.Compile({}), NVRTC_ERROR_COMPILATION);
  EXPECT_THAT(unknown_arg.Log(), HasSubstr("identifier \"widget\" is undefined"));
}

}  // namespace
}  // namespace gxnvrtc_test
