// The gpuexec tool's argument syntax without a daemon: sizes, dimensions,
// typed arguments, Triton tensor descriptors, the launch flags, --print and
// the command lines refused before any call. (Flags and help:
// cli_command_line_test.cc; module images and output:
// cli_output_test.cc.) (The Triton loader itself:
// tests/unit/triton_test.cc.)

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "cli/command_line.h"
#include "cli/failure.h"
#include "cli/module_file.h"
#include "cli/output.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gpuexec::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

template <typename T>
T As(const std::string& bytes) {
  T value{};
  EXPECT_EQ(bytes.size(), sizeof(T));
  std::memcpy(&value, bytes.data(), std::min(bytes.size(), sizeof(T)));
  return value;
}

ArgSpec Parse(const std::string& text) {
  absl::StatusOr<ArgSpec> spec = ParseArg(text);
  EXPECT_TRUE(spec.ok()) << text << ": " << spec.status();
  return spec.ok() ? *spec : ArgSpec{};
}

std::string ErrorOf(const std::string& text) {
  absl::StatusOr<ArgSpec> spec = ParseArg(text);
  EXPECT_FALSE(spec.ok()) << text << " parsed";
  return std::string(spec.status().message());
}

TEST(ParseSizeTest, NumbersAndBinarySuffixes) {
  EXPECT_EQ(*ParseSize("0"), 0u);
  EXPECT_EQ(*ParseSize("4096"), 4096u);
  EXPECT_EQ(*ParseSize("4K"), 4096u);
  EXPECT_EQ(*ParseSize("4k"), 4096u);
  EXPECT_EQ(*ParseSize("4KiB"), 4096u);
  EXPECT_EQ(*ParseSize("4KB"), 4096u);
  EXPECT_EQ(*ParseSize("16M"), 16u << 20);
  EXPECT_EQ(*ParseSize("16MiB"), 16u << 20);
  EXPECT_EQ(*ParseSize("2G"), 2ull << 30);
  EXPECT_EQ(*ParseSize("2GiB"), 2ull << 30);
  EXPECT_EQ(*ParseSize("512B"), 512u);
  EXPECT_EQ(*ParseSize("0x10"), 16u);
  EXPECT_EQ(*ParseSize("0x1B"), 27u);  // hex digits, not a suffix
}

TEST(ParseSizeTest, RejectsWhatIsNotASize) {
  for (const char* text : {"", "K", "-1", "+1", "1.5M", "4X", "four", " 4", "99999999999T"}) {
    EXPECT_FALSE(ParseSize(text).ok()) << text;
  }
}

TEST(ParseDim3Test, MissingDimensionsAreOne) {
  Dim3 d = *ParseDim3("4");
  EXPECT_EQ(d.x, 4u);
  EXPECT_EQ(d.y, 1u);
  EXPECT_EQ(d.z, 1u);
  d = *ParseDim3("2,3");
  EXPECT_EQ(d.x, 2u);
  EXPECT_EQ(d.y, 3u);
  EXPECT_EQ(d.z, 1u);
  d = *ParseDim3("2,3,5");
  EXPECT_EQ(d.z, 5u);
}

TEST(ParseDim3Test, RejectsZeroAndExtraDimensions) {
  for (const char* text : {"", "0", "1,0", "1,2,3,4", "x", "4294967296", "1,,2"}) {
    EXPECT_FALSE(ParseDim3(text).ok()) << text;
  }
}

TEST(ParseArgTest, IntegersAreRangeChecked) {
  EXPECT_EQ(As<int8_t>(Parse("i8:-128").scalar.bytes), -128);
  EXPECT_EQ(As<uint8_t>(Parse("u8:255").scalar.bytes), 255);
  EXPECT_EQ(As<int16_t>(Parse("i16:-2").scalar.bytes), -2);
  EXPECT_EQ(As<int32_t>(Parse("i32:-1").scalar.bytes), -1);
  EXPECT_EQ(As<uint32_t>(Parse("u32:0xdeadbeef").scalar.bytes), 0xdeadbeefu);
  EXPECT_EQ(As<int64_t>(Parse("i64:-9223372036854775808").scalar.bytes), INT64_MIN);
  EXPECT_EQ(As<uint64_t>(Parse("u64:18446744073709551615").scalar.bytes), UINT64_MAX);
  EXPECT_EQ(Parse("u16:7").param_bytes(), 2u);
  EXPECT_EQ(Parse("u16:7").kind, ArgSpec::Kind::kScalar);

  EXPECT_THAT(ErrorOf("i8:128"), HasSubstr("out of range for i8"));
  EXPECT_THAT(ErrorOf("u8:256"), HasSubstr("out of range for u8"));
  EXPECT_THAT(ErrorOf("u32:-1"), HasSubstr("not a valid u32"));
  EXPECT_THAT(ErrorOf("u64:18446744073709551616"), HasSubstr("u64"));
  EXPECT_THAT(ErrorOf("i32:1.5"), HasSubstr("'i32:1.5'"));
  EXPECT_THAT(ErrorOf("i32:"), HasSubstr("i32"));
}

TEST(ParseArgTest, FloatsAndTheirHalfPrecisionBits) {
  EXPECT_EQ(As<float>(Parse("f32:2.5").scalar.bytes), 2.5f);
  EXPECT_EQ(As<double>(Parse("f64:-1e-3").scalar.bytes), -1e-3);
  EXPECT_EQ(As<uint16_t>(Parse("f16:1.0").scalar.bytes), 0x3c00);
  EXPECT_EQ(As<uint16_t>(Parse("f16:-2").scalar.bytes), 0xc000);
  EXPECT_EQ(As<uint16_t>(Parse("f16:65504").scalar.bytes), 0x7bff);    // largest half
  EXPECT_EQ(As<uint16_t>(Parse("f16:70000").scalar.bytes), 0x7c00);    // inf
  EXPECT_EQ(As<uint16_t>(Parse("f16:5.9604645e-8").scalar.bytes), 1);  // smallest subnormal
  EXPECT_EQ(As<uint16_t>(Parse("f16:1e-9").scalar.bytes), 0);
  EXPECT_EQ(As<uint16_t>(Parse("f16:1.00048828125").scalar.bytes), 0x3c00);  // tie: to even
  EXPECT_EQ(As<uint16_t>(Parse("f16:1.00146484375").scalar.bytes), 0x3c02);  // tie: to even
  EXPECT_EQ(As<uint16_t>(Parse("bf16:1.0").scalar.bytes), 0x3f80);
  EXPECT_EQ(As<uint16_t>(Parse("bf16:-2").scalar.bytes), 0xc000);
  EXPECT_EQ(As<uint16_t>(Parse("bf16:1.00390625").scalar.bytes), 0x3f80);  // tie: to even
  EXPECT_EQ(Parse("bf16:1").param_bytes(), 2u);
  EXPECT_THAT(ErrorOf("f32:abc"), HasSubstr("not a valid f32"));
}

TEST(ParseArgTest, BytesAndNull) {
  ArgSpec spec = Parse("bytes:01ff_10ab");
  EXPECT_EQ(spec.kind, ArgSpec::Kind::kBytes);
  EXPECT_EQ(spec.bytes, std::string("\x01\xff\x10\xab", 4));
  EXPECT_EQ(spec.param_bytes(), 4u);
  spec = Parse("bytes:@struct.bin");
  EXPECT_EQ(spec.bytes_file, "struct.bin");
  EXPECT_THAT(ErrorOf("bytes:abc"), HasSubstr("even"));
  EXPECT_THAT(ErrorOf("bytes:zz"), HasSubstr("hex"));
  spec = Parse("null");
  EXPECT_EQ(spec.kind, ArgSpec::Kind::kNull);
  EXPECT_EQ(spec.param_bytes(), 8u);
}

TEST(ParseArgTest, Buffers) {
  ArgSpec spec = Parse("in:x.bin");
  EXPECT_EQ(spec.kind, ArgSpec::Kind::kBuffer);
  EXPECT_EQ(spec.init, ArgSpec::Init::kFile);
  EXPECT_EQ(spec.in_file, "x.bin");
  EXPECT_EQ(spec.save_file, "");
  EXPECT_EQ(spec.param_bytes(), 8u);

  spec = Parse("zeros:4K");
  EXPECT_EQ(spec.init, ArgSpec::Init::kZeros);
  EXPECT_EQ(spec.buffer_bytes, 4096u);

  spec = Parse("fill:u32:7:1K");
  EXPECT_EQ(spec.init, ArgSpec::Init::kFill);
  EXPECT_EQ(spec.buffer_bytes, 4096u);
  EXPECT_EQ(As<uint32_t>(spec.fill_element), 7u);
  spec = Parse("fill:f16:1.0:3");
  EXPECT_EQ(spec.buffer_bytes, 6u);
  EXPECT_EQ(As<uint16_t>(spec.fill_element), 0x3c00);

  spec = Parse("out:1MiB:y.bin");
  EXPECT_EQ(spec.init, ArgSpec::Init::kZeros);
  EXPECT_EQ(spec.buffer_bytes, 1u << 20);
  EXPECT_EQ(spec.save_file, "y.bin");

  spec = Parse("inout:y.bin");
  EXPECT_EQ(spec.init, ArgSpec::Init::kFile);
  EXPECT_EQ(spec.in_file, "y.bin");
  EXPECT_EQ(spec.save_file, "y.bin");
  spec = Parse("inout:y.bin:y2.bin");
  EXPECT_EQ(spec.in_file, "y.bin");
  EXPECT_EQ(spec.save_file, "y2.bin");
}

TEST(ParseArgTest, ModifiersOfAnyBuffer) {
  ArgSpec spec = Parse("zeros:4K,save=out.bin,offset=256");
  EXPECT_EQ(spec.buffer_bytes, 4096u);
  EXPECT_EQ(spec.save_file, "out.bin");
  EXPECT_EQ(spec.offset, 256u);

  spec = Parse("in:a,b.bin,offset=1K");  // a comma in a file name
  EXPECT_EQ(spec.in_file, "a,b.bin");
  EXPECT_EQ(spec.offset, 1024u);

  spec = Parse("fill:u8:1:16,offset=15");
  EXPECT_EQ(spec.offset, 15u);
  EXPECT_THAT(ErrorOf("fill:u8:1:16,offset=16"), HasSubstr("past the end"));
  EXPECT_THAT(ErrorOf("zeros:4K,offset=1,offset=2"), HasSubstr("twice"));
  EXPECT_THAT(ErrorOf("out:4K:y.bin,save=z.bin"), HasSubstr("already names"));
}

TEST(ParseArgTest, MalformedBuffersSayWhatWasExpected) {
  EXPECT_THAT(ErrorOf("zeros:0"), HasSubstr("at least 1 byte"));
  EXPECT_THAT(ErrorOf("zeros:lots"), HasSubstr("not a size"));
  EXPECT_THAT(ErrorOf("in:"), HasSubstr("in:FILE"));
  EXPECT_THAT(ErrorOf("out:4K"), HasSubstr("out:SIZE:FILE"));
  EXPECT_THAT(ErrorOf("fill:u32:7"), HasSubstr("fill:TYPE:VALUE:COUNT"));
  EXPECT_THAT(ErrorOf("fill:q32:7:1"), HasSubstr("fill:TYPE:VALUE:COUNT"));
  EXPECT_THAT(ErrorOf("fill:u8:300:1"), HasSubstr("out of range"));
  EXPECT_THAT(ErrorOf("x.bin"), HasSubstr("TYPE:VALUE"));
  EXPECT_THAT(ErrorOf("float:1"), HasSubstr("unknown argument type 'float'"));
}

TEST(ParseArgTest, TensorDescriptors) {
  ArgSpec d = Parse("desc:1000x512:in:a.bin");
  EXPECT_EQ(d.kind, ArgSpec::Kind::kDescriptor);
  EXPECT_TRUE(d.is_buffer());
  EXPECT_EQ(d.init, ArgSpec::Init::kFile);
  EXPECT_EQ(d.in_file, "a.bin");
  EXPECT_THAT(d.shape, ElementsAre(1000, 512));
  EXPECT_TRUE(d.strides.empty());  // contiguous
  EXPECT_FALSE(d.padding_nan);
  EXPECT_EQ(d.offset, 0u);
  EXPECT_EQ(d.param_bytes(), 128u);
  EXPECT_THAT(d.param_sizes(), ElementsAre(128u, 4u, 4u, 8u, 8u));

  d = Parse("desc:64x64x2:zeros:1M,strides=1024x2x1,padding=nan,offset=4096,save=o.bin");
  EXPECT_EQ(d.kind, ArgSpec::Kind::kDescriptor);
  EXPECT_EQ(d.init, ArgSpec::Init::kZeros);
  EXPECT_EQ(d.buffer_bytes, 1u << 20);
  EXPECT_THAT(d.shape, ElementsAre(64, 64, 2));
  EXPECT_THAT(d.strides, ElementsAre(1024, 2, 1));
  EXPECT_TRUE(d.padding_nan);
  EXPECT_EQ(d.offset, 4096u);
  EXPECT_EQ(d.save_file, "o.bin");
  EXPECT_EQ(d.text, "desc:64x64x2:zeros:1M,strides=1024x2x1,padding=nan,offset=4096,save=o.bin");

  // Modifiers in any order, with any buffer.
  d = Parse("desc:8:fill:f16:1.0:8,padding=zero,strides=1");
  EXPECT_EQ(d.init, ArgSpec::Init::kFill);
  EXPECT_THAT(d.shape, ElementsAre(8));
  EXPECT_THAT(d.strides, ElementsAre(1));
  d = Parse("desc:4x4:out:32:y.bin");
  EXPECT_EQ(d.save_file, "y.bin");
  d = Parse("desc:4x4:inout:y.bin:y2.bin,offset=16");
  EXPECT_EQ(d.in_file, "y.bin");
  EXPECT_EQ(d.save_file, "y2.bin");
  EXPECT_EQ(d.offset, 16u);
}

TEST(ParseArgTest, MalformedDescriptorsSayWhatWasExpected) {
  EXPECT_THAT(ErrorOf("desc:1000x512"), HasSubstr("expected desc:SHAPE:BUFFER"));
  EXPECT_THAT(ErrorOf("desc:1000,512:in:a.bin"), HasSubstr("shape '1000,512'"));
  EXPECT_THAT(ErrorOf("desc:0x4:in:a.bin"), HasSubstr("shape '0x4'"));
  EXPECT_THAT(ErrorOf("desc:2147483648:in:a.bin"), HasSubstr("shape"));
  EXPECT_THAT(ErrorOf("desc:1x1x1x1x1x1:in:a.bin"), HasSubstr("6 dimensions; at most 5"));
  EXPECT_THAT(ErrorOf("desc:4x4:f32:1"), HasSubstr("a descriptor's buffer is"));
  EXPECT_THAT(ErrorOf("desc:4x4:null"), HasSubstr("a descriptor's buffer is"));
  EXPECT_THAT(ErrorOf("desc:4x4:in:a.bin,strides=4"),
              HasSubstr("strides= has 1 dimensions; the shape has 2"));
  EXPECT_THAT(ErrorOf("desc:4x4:in:a.bin,strides=4x0"), HasSubstr("strides '4x0'"));
  EXPECT_THAT(ErrorOf("desc:4x4:in:a.bin,padding=inf"), HasSubstr("padding= is zero or nan"));
  EXPECT_THAT(ErrorOf("desc:4x4:in:a.bin,padding=nan,padding=nan"), HasSubstr("twice"));
  EXPECT_THAT(ErrorOf("desc:4x4:zeros:64,offset=64"), HasSubstr("past the end"));
  // Descriptor modifiers belong to descriptors: elsewhere, part of a file name.
  EXPECT_EQ(Parse("in:a.bin,padding=nan").in_file, "a.bin,padding=nan");
}

TEST(LaunchFlagsTest, ClusterPoliciesAndBooleans) {
  EXPECT_EQ(*ParseClusterPolicy("default"), ClusterSchedulingPolicy::kDefault);
  EXPECT_EQ(*ParseClusterPolicy("spread"), ClusterSchedulingPolicy::kSpread);
  EXPECT_EQ(*ParseClusterPolicy("load_balancing"), ClusterSchedulingPolicy::kLoadBalancing);
  EXPECT_THAT(std::string(ParseClusterPolicy("SPREAD").status().message()),
              HasSubstr("default, spread, load_balancing"));
  EXPECT_TRUE(*ParseFlagBool(""));
  EXPECT_TRUE(*ParseFlagBool("true"));
  EXPECT_TRUE(*ParseFlagBool("1"));
  EXPECT_FALSE(*ParseFlagBool("false"));
  EXPECT_FALSE(*ParseFlagBool("0"));
  EXPECT_FALSE(ParseFlagBool("yes").ok());
}

// ------------------------------------------------------------ command lines

struct Outcome {
  int exit_code;
  std::string err;
};

// Runs the tool on a command line that must fail before it connects to a
// daemon (the target is one nothing listens on, for safety).
Outcome RunCli(std::vector<std::string> words) {
  words.insert(words.begin(),
               {"gpuexec", "--target=unix:/nonexistent/gpuexec.sock", "--timeout=1s"});
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  ::testing::internal::CaptureStderr();
  ::testing::internal::CaptureStdout();
  const int code = Main(static_cast<int>(argv.size()), argv.data());
  ::testing::internal::GetCapturedStdout();
  return Outcome{code, ::testing::internal::GetCapturedStderr()};
}

std::string TritonFile(const std::string& name) {
  return absl::StrCat(GPUEXEC_TRITON_DATA_DIR, "/", name);
}

TEST(CommandLineTest, LaunchFlagsAreCheckedBeforeAnyCall) {
  const std::vector<std::string> run = {"run", "k.cubin", "k", "--grid=1", "--block=32"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> words = run;
    words.insert(words.end(), extra.begin(), extra.end());
    return RunCli(words);
  };
  Outcome r = with({"--cluster-policy=spread"});
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("--cluster-policy applies to a cluster; give --cluster"));
  r = with({"--non-portable-cluster"});
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("--non-portable-cluster applies to a cluster"));
  r = with({"--cluster=2", "--cluster-policy=wide"});
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("--cluster-policy: 'wide' is not a cluster policy"));
  r = with({"--cooperative=maybe"});
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("--cooperative: 'maybe' is not true or false"));
  r = with({"--pdl", "--pdl"});
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("--pdl given twice"));
  // A boolean flag takes no value: the word after it stays an argument.
  r = with({"--pdl", "desc:4x4:zeros:64"});
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("a tensor descriptor is for a Triton kernel (--triton)"));
  r = RunCli({"info", "k.cubin", "k", "--cooperative"});
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("--cooperative applies to 'run' only"));
  // Well-formed flags get as far as connecting.
  r = with({"--cluster=2,1,1", "--cluster-policy=load_balancing", "--non-portable-cluster",
            "--cooperative", "--pdl=true"});
  EXPECT_EQ(r.exit_code, kExitFailure);
  EXPECT_THAT(r.err, HasSubstr("connect to"));
}

TEST(CommandLineTest, TritonTakesItsLaunchFromTheMetadata) {
  const std::string meta = absl::StrCat("--triton=", TritonFile("sm90_3_5.json"));
  for (const char* flag : {"--cooperative", "--pdl", "--non-portable-cluster",
                           "--cluster-policy=spread", "--cluster=2", "--block=32"}) {
    const Outcome r = RunCli({"run", meta, "k.cubin", "--grid=1", flag});
    EXPECT_EQ(r.exit_code, kExitUsage) << flag;
    EXPECT_THAT(r.err, HasSubstr("comes from the Triton metadata; drop it with --triton")) << flag;
  }
}

TEST(CommandLineTest, DescriptorsAreCountedAgainstTheMetadata) {
  const std::string meta = absl::StrCat("--triton=", TritonFile("sm90_3_5.json"));
  Outcome r = RunCli({"run", meta, "k.cubin", "--grid=1", "desc:64x64:zeros:8K", "i32:1"});
  EXPECT_EQ(r.exit_code, kExitFailure);
  EXPECT_THAT(r.err,
              HasSubstr("the kernel takes 2 tensor descriptors (desc:SHAPE:BUFFER); 1 given"));
  r = RunCli({"run", meta, "k.cubin", "--grid=1", "desc:64x64:zeros:8K", "desc:64:zeros:8K"});
  EXPECT_EQ(r.exit_code, kExitFailure);
  EXPECT_THAT(r.err, HasSubstr("argument 1 (desc:64:zeros:8K) has 1 dimensions; "
                               "tensordesc_meta[1] has rank 2"));
  r = RunCli({"run", meta, "k.cubin", "--grid=1", "desc:64x64:zeros:8K", "desc:64x64:zeros:8K",
              "desc:64x64:zeros:8K"});
  EXPECT_EQ(r.exit_code, kExitFailure);
  EXPECT_THAT(r.err, HasSubstr("argument 2 (desc:64x64:zeros:8K) is tensor descriptor 2; "
                               "the kernel takes 2"));
  const std::string plain = absl::StrCat("--triton=", TritonFile("sm80_3_2.json"));
  r = RunCli({"run", plain, "k.cubin", "--grid=1", "desc:64x64:zeros:8K"});
  EXPECT_EQ(r.exit_code, kExitFailure);
  EXPECT_THAT(r.err, HasSubstr("is tensor descriptor 0; the kernel takes 0"));
  // Matching descriptors get as far as connecting.
  r = RunCli({"run", meta, "k.cubin", "--grid=1", "desc:64x64:zeros:8K",
              "desc:64x64:zeros:8K,padding=nan"});
  EXPECT_EQ(r.exit_code, kExitFailure);
  EXPECT_THAT(r.err, HasSubstr("connect to"));
  // A metadata file refused by the loader: one line naming the key.
  r = RunCli(
      {"run", absl::StrCat("--triton=", TritonFile("bad_elem_type.json")), "k.cubin", "--grid=1"});
  EXPECT_EQ(r.exit_code, kExitFailure);
  EXPECT_THAT(r.err, HasSubstr("tensordesc_meta[0].elem_type"));
}

// ------------------------------------------------------------ results on stdout, --print

TEST(ParseArgTest, AnOutputToStdout) {
  ArgSpec s = Parse("out:4MiB:-");
  EXPECT_EQ(s.buffer_bytes, 4u << 20);
  EXPECT_EQ(s.save_file, "-");
  EXPECT_EQ(Parse("zeros:64,save=-").save_file, "-");
  const Outcome r = RunCli({"run", "k.cubin", "k", "--grid=1", "--block=1", "out:4:-", "out:8:-"});
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_THAT(r.err,
              HasSubstr("argument 1 (out:8:-) also goes to stdout ('-'); one buffer at most"));
}

TEST(ParsePrintTest, TypeAndCount) {
  PrintSpec p = *ParsePrint("f32");
  EXPECT_EQ(p.type, ScalarType::kF32);
  EXPECT_EQ(p.count, 8u);
  p = *ParsePrint("u16:100");
  EXPECT_EQ(p.type, ScalarType::kU16);
  EXPECT_EQ(p.count, 100u);
  for (const char* bad : {"", "f33", "f32:", "f32:0", "f32:x", "f32:-1", "f32:2000000", ":4"}) {
    EXPECT_FALSE(ParsePrint(bad).ok()) << bad;
  }
  EXPECT_THAT(std::string(ParsePrint("f33").status().message()),
              HasSubstr("expected TYPE[:N], TYPE one of i8 i16"));
  const Outcome r = RunCli({"run", "k.cubin", "k", "--grid=1", "--block=1", "--print=float"});
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("run: --print: 'float': expected TYPE[:N]"));
}

// A daemon's message, or a kernel name read from a file, reaches the
// terminal with every byte that is not printable ASCII escaped.
TEST(PrintableTest, ControlAndHighBytesAreEscapedAndTheTextCut) {
  EXPECT_EQ(Printable("kernel 'saxpy'"), "kernel 'saxpy'");
  EXPECT_EQ(Printable("a\x1b]0;owned\x07\n\xe2\x80\xae"),
            "a\\x1b]0;owned\\x07\\x0a\\xe2\\x80\\xae");
  EXPECT_EQ(Printable(std::string(10, 'x'), 4), "xxxx...");
  const Failure f = Failed("run k", absl::AbortedError("\x1b[2Jgone"));
  EXPECT_EQ(f.message, "run k: ABORTED: \\x1b[2Jgone");
}

}  // namespace
}  // namespace gpuexec::cli
