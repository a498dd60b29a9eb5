// The gpuexec tool's argument syntax without a daemon: sizes, dimensions,
// typed arguments, Triton tensor descriptors, the launch flags, the command
// lines refused before any call, flag spellings, help and --version, what
// is read from a module image (kind, kernel names) and how results are
// written (--print, the progress line). (The Triton loader itself:
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

// ------------------------------------------------------------ flags and help

Parsed ParseWords(std::vector<std::string> words) {
  words.insert(words.begin(), "gpuexec");
  std::vector<const char*> argv;
  for (const std::string& w : words) argv.push_back(w.c_str());
  Parsed parsed;
  std::optional<Failure> failure =
      ParseCommandLine(static_cast<int>(argv.size()), argv.data(), &parsed);
  EXPECT_FALSE(failure.has_value()) << (failure ? failure->message : "");
  return parsed;
}

std::string UsageOf(std::vector<std::string> words) {
  words.insert(words.begin(), "gpuexec");
  std::vector<const char*> argv;
  for (const std::string& w : words) argv.push_back(w.c_str());
  Parsed parsed;
  std::optional<Failure> failure =
      ParseCommandLine(static_cast<int>(argv.size()), argv.data(), &parsed);
  EXPECT_TRUE(failure.has_value()) << words[1] << " parsed";
  if (!failure) return "";
  EXPECT_EQ(failure->exit_code, kExitUsage);
  return failure->message;
}

TEST(CommandLineTest, EveryLongFlagIsSpeltWithDashOrUnderscore) {
  const std::vector<std::pair<std::string, std::string>> spellings = {
      {"--tls_ca=a.pem", "tls_ca"},
      {"--tls-ca=a.pem", "tls_ca"},
      {"--tls_server_name=a.pem", "tls_server_name"},
      {"--tls-server-name=a.pem", "tls_server_name"},
      {"--token-file=a.pem", "token_file"},
      {"--min-cc=a.pem", "min_cc"},
  };
  for (const auto& [flag, name] : spellings) {
    Parsed p = ParseWords({flag, "devices"});
    EXPECT_EQ(p.cl.command, "devices") << flag;
    EXPECT_EQ(p.cl.flags[name], "a.pem") << flag;
    // After the command, and with the value as the next word.
    p = ParseWords({"devices", flag.substr(0, flag.find('=')), "a.pem"});
    EXPECT_EQ(p.cl.flags[name], "a.pem") << flag;
  }
  for (const char* flag : {"--cluster-policy=spread", "--cluster_policy=spread"}) {
    Parsed p = ParseWords({"run", "k.cubin", "k", flag, "i32:1"});
    EXPECT_EQ(p.cl.flags["cluster-policy"], "spread") << flag;
    EXPECT_THAT(p.cl.positional, ElementsAre("k.cubin", "k", "i32:1")) << flag;
  }
  for (const char* flag : {"--non-portable-cluster", "--non_portable_cluster"}) {
    Parsed p = ParseWords({"run", flag, "k.cubin"});
    EXPECT_EQ(p.cl.flags["non-portable-cluster"], "true") << flag;
  }
  // Boolean flags take no value but --flag=VALUE; "--" ends the flags.
  Parsed p = ParseWords({"run", "--pdl=false", "k.cubin", "k", "--", "--grid=1"});
  EXPECT_EQ(p.cl.flags["pdl"], "false");
  EXPECT_THAT(p.cl.positional, ElementsAre("k.cubin", "k", "--grid=1"));
  EXPECT_EQ(p.cl.flags.count("grid"), 0u);
  // A kernel may be named like a command.
  p = ParseWords({"run", "k.cubin", "load", "i32:-1", "--grid", "4,2"});
  EXPECT_EQ(p.cl.command, "run");
  EXPECT_THAT(p.cl.positional, ElementsAre("k.cubin", "load", "i32:-1"));
  EXPECT_EQ(p.cl.flags["grid"], "4,2");
}

TEST(CommandLineTest, MalformedLinesSayWhatIsWrong) {
  EXPECT_EQ(UsageOf({"devices", "--bogus=1"}), "unknown flag '--bogus=1' (see 'gpuexec --help')");
  EXPECT_EQ(UsageOf({"frobnicate"}),
            "unknown command 'frobnicate' (commands: devices, load, info, run, help)");
  EXPECT_EQ(UsageOf({"devices", "extra"}), "devices takes no arguments");
  EXPECT_EQ(UsageOf({"info", "k.cubin", "--grid=1"}), "--grid applies to 'run' only");
  EXPECT_EQ(UsageOf({"--grid=1", "run"}), "--grid is a flag of 'run': give it after the command");
  EXPECT_EQ(UsageOf({"run", "--tls-ca=a", "--tls_ca=b"}), "flag --tls_ca given twice");
  EXPECT_EQ(UsageOf({"help", "nothing"}),
            "help: no command 'nothing' (commands: devices, load, info, run)");
}

TEST(CommandLineTest, VersionMatchesTheDaemonsForm) {
  Parsed p = ParseWords({"--version"});
  ASSERT_TRUE(p.print.has_value());
  EXPECT_EQ(*p.print, "gpuexec 0.1.0 (gpuexec.v1)\n");
}

TEST(CommandLineTest, HelpIsGeneratedForTheToolAndEachCommand) {
  Parsed main = ParseWords({"--help"});
  ASSERT_TRUE(main.print.has_value());
  EXPECT_THAT(*main.print, HasSubstr("Usage: gpuexec [GLOBAL FLAGS] COMMAND [ARGS...]"));
  // Every global flag, both spellings, and every command.
  for (const char* s : {"--target ADDR", "--tls-ca,--tls_ca FILE", "--min-cc,--min_cc MAJOR.MINOR",
                        "--version", "devices", "load", "info", "run", "help"}) {
    EXPECT_THAT(*main.print, HasSubstr(s));
  }
  Parsed run = ParseWords({"run", "--help"});
  ASSERT_TRUE(run.print.has_value());
  for (const char* s :
       {"Usage: gpuexec run FILE KERNEL", "--cluster-policy,--cluster_policy POLICY",
        "--non-portable-cluster,--non_portable_cluster", "--print TYPE[:N]", "out:SIZE:FILE",
        "arg2[0:4] = 4.5 4.5 4.5 4.5"}) {
    EXPECT_THAT(*run.print, HasSubstr(s));
  }
  EXPECT_THAT(*run.print, ::testing::Not(HasSubstr("--tls")));  // global: in the tool's help
  EXPECT_EQ(ParseWords({"help", "run"}).print, run.print);
  EXPECT_EQ(HelpText("run"), run.print);
  for (const char* command : {"devices", "load", "info", "help"}) {
    std::optional<std::string> text = HelpText(command);
    ASSERT_TRUE(text.has_value()) << command;
    EXPECT_THAT(*text, HasSubstr(absl::StrCat("Usage: gpuexec ", command))) << command;
    EXPECT_EQ(ParseWords({command, "-h"}).print, text) << command;
  }
  EXPECT_FALSE(HelpText("nothing").has_value());
}

TEST(CommandLineTest, VersionAndHelpExitZeroOnStdout) {
  std::vector<std::string> words = {"gpuexec", "--version"};
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  ::testing::internal::CaptureStdout();
  const int code = Main(static_cast<int>(argv.size()), argv.data());
  EXPECT_EQ(::testing::internal::GetCapturedStdout(), "gpuexec 0.1.0 (gpuexec.v1)\n");
  EXPECT_EQ(code, kExitOk);
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

template <typename T>
std::vector<uint8_t> Raw(const std::vector<T>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(T));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

TEST(FormatElementsTest, EachTypeExactly) {
  EXPECT_EQ(FormatElements("y", Raw<float>({4, 4, 4, 4}), {ScalarType::kF32, 4}),
            "y[0:4] = 4 4 4 4");
  EXPECT_EQ(FormatElements("arg2", Raw<float>({0.1f, -2.5f, 1e30f, INFINITY}), {ScalarType::kF32}),
            "arg2[0:4] = 0.1 -2.5 1e+30 inf");
  EXPECT_EQ(FormatElements("a", Raw<double>({0.1, NAN}), {ScalarType::kF64}), "a[0:2] = 0.1 nan");
  // f16 1.0, -2.0, the smallest subnormal; bf16 1.0, 3.0.
  EXPECT_EQ(FormatElements("h", Raw<uint16_t>({0x3c00, 0xc000, 0x0001}), {ScalarType::kF16}),
            "h[0:3] = 1 -2 5.9604645e-08");
  EXPECT_EQ(FormatElements("b", Raw<uint16_t>({0x3f80, 0x4040}), {ScalarType::kBF16}),
            "b[0:2] = 1 3");
  EXPECT_EQ(FormatElements("i", Raw<int8_t>({-1, 127, -128}), {ScalarType::kI8}),
            "i[0:3] = -1 127 -128");
  EXPECT_EQ(FormatElements("u", Raw<uint64_t>({18446744073709551615ull}), {ScalarType::kU64}),
            "u[0:1] = 18446744073709551615");
  // First N only; a shorter buffer shows what it has, no partial element.
  EXPECT_EQ(FormatElements("n", Raw<uint32_t>({1, 2, 3, 4, 5}), {ScalarType::kU32, 2}),
            "n[0:2] = 1 2");
  EXPECT_EQ(FormatElements("s", Raw<uint8_t>({1, 2, 3, 4, 5, 6}), {ScalarType::kU32, 8}),
            "s[0:1] = 67305985");
  EXPECT_EQ(FormatElements("e", Raw<uint8_t>({1, 2}), {ScalarType::kU32, 8}), "e[0:0] =");
}

TEST(ProgressTest, BytesDoneTotalAndRate) {
  EXPECT_EQ(
      ProgressLine("read argument 1 (out:1G:y.bin)", 64ull << 20, 256ull << 20, absl::Seconds(2)),
      "read argument 1 (out:1G:y.bin): 64.0 MiB / 256.0 MiB, 32.0 MiB/s");
  EXPECT_EQ(ProgressLine("fill", 0, 1ull << 30, absl::ZeroDuration()), "fill: 0 B / 1.0 GiB");
  // Not a terminal here: nothing is shown.
  Progress p("fill", 1ull << 30);
  EXPECT_FALSE(p.shown());
}

// ------------------------------------------------------------ module images

// A little-endian ELF64 file with the sections `names` (and its section
// name table), as a cubin lays them out.
std::string Elf(const std::vector<std::string>& names) {
  std::string strtab(1, '\0');
  std::vector<uint32_t> at;
  for (const std::string& n : names) {
    at.push_back(static_cast<uint32_t>(strtab.size()));
    strtab += n + '\0';
  }
  const uint32_t strtab_name = static_cast<uint32_t>(strtab.size());
  strtab += std::string(".shstrtab") + '\0';
  std::string elf(64, '\0');
  elf.replace(0, 4,
              "\x7f"
              "ELF");
  elf[4] = 2;  // 64-bit
  elf[5] = 1;  // little-endian
  elf[6] = 1;
  auto put = [&](size_t offset, uint64_t value, size_t n) {
    for (size_t i = 0; i < n; ++i) elf[offset + i] = static_cast<char>(value >> (8 * i));
  };
  const uint64_t strtab_offset = elf.size();
  elf += strtab;
  elf.resize((elf.size() + 7) / 8 * 8, '\0');
  const uint64_t shoff = elf.size();
  const uint64_t shnum = names.size() + 2;  // the null section, the names
  put(0x28, shoff, 8);
  put(0x3A, 64, 2);
  put(0x3C, shnum, 2);
  put(0x3E, shnum - 1, 2);
  elf.resize(shoff + shnum * 64, '\0');
  for (size_t i = 0; i < names.size(); ++i) {
    put(shoff + (i + 1) * 64, at[i], 4);
    put(shoff + (i + 1) * 64 + 4, 1, 4);  // PROGBITS
  }
  const uint64_t last = shoff + (shnum - 1) * 64;
  put(last, strtab_name, 4);
  put(last + 4, 3, 4);  // STRTAB
  put(last + 0x18, strtab_offset, 8);
  put(last + 0x20, strtab.size(), 8);
  return elf;
}

TEST(ModuleFileTest, TheKindComesFromTheBytes) {
  EXPECT_EQ(ModuleKindOf(Elf({".text.k"})), ModuleKind::kCubin);
  EXPECT_EQ(ModuleKindOf(std::string("\x50\xed\x55\xba\x01\x00", 6)), ModuleKind::kFatbin);
  EXPECT_EQ(ModuleKindOf(std::string("\xb1\x43\x62\x46\x01\x00", 6)), ModuleKind::kFatbin);
  EXPECT_EQ(ModuleKindOf("//\n// Generated by NVIDIA NVVM Compiler\n.version 8.0\n"),
            ModuleKind::kPtx);
  EXPECT_EQ(ModuleKindOf("\x7f"), ModuleKind::kPtx);
  EXPECT_EQ(ModuleKindOf(""), ModuleKind::kPtx);
  EXPECT_STREQ(ModuleKindName(ModuleKind::kFatbin), "fatbin");
}

TEST(ModuleFileTest, KernelNamesOfACubin) {
  const std::string cubin =
      Elf({".text.gx_saxpy", ".rela.text.gx_saxpy", ".nv.info.gx_saxpy", ".text.gx_fill_u32",
           ".text.", ".text.gx_saxpy", ".nv.shared.gx_fill_u32"});
  EXPECT_THAT(*KernelNames(cubin), ElementsAre("gx_saxpy", "gx_fill_u32"));
  EXPECT_THAT(*KernelNames(Elf({".nv.info"})), ::testing::IsEmpty());
  // Cut short: the section headers are past the end.
  absl::StatusOr<std::vector<std::string>> cut = KernelNames(cubin.substr(0, 100));
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(cut.status().message()), HasSubstr("section headers lie outside"));
  std::string elf32 = cubin;
  elf32[4] = 1;
  EXPECT_THAT(std::string(KernelNames(elf32).status().message()), HasSubstr("not a 64-bit ELF"));
  // A name table pointing past the end.
  std::string bad_table = cubin;
  bad_table[bad_table.size() - 64 + 0x1f] = '\x7f';
  EXPECT_FALSE(KernelNames(bad_table).ok());
}

TEST(ModuleFileTest, KernelNamesOfPtx) {
  const std::string ptx = R"(//
.version 8.0
.target sm_90
.address_size 64
	// .globl	gx_saxpy
.visible .entry gx_saxpy(
	.param .f32 gx_saxpy_param_0
)
.entry	gx_spin (.param .u64 p)
.func helper(
.visible .entryway not_a_kernel(
.weak .entry $gx_weird.1
)";
  EXPECT_THAT(*KernelNames(ptx), ElementsAre("gx_saxpy", "gx_spin", "$gx_weird.1"));
  EXPECT_THAT(*KernelNames("GXFAKE1\ngx_saxpy\n"), ::testing::IsEmpty());
}

TEST(ModuleFileTest, KernelNamesOfTheCubinsInAFatbin) {
  std::string fatbin("\x50\xed\x55\xba\x01\x00\x10\x00", 8);
  fatbin += std::string(56, '\0') + Elf({".text.gx_a"}) + std::string(8, '\0') +
            Elf({".text.gx_b", ".text.gx_a"});
  EXPECT_EQ(ModuleKindOf(fatbin), ModuleKind::kFatbin);
  EXPECT_THAT(*KernelNames(fatbin), ElementsAre("gx_a", "gx_b"));
  const std::string compressed = std::string("\x50\xed\x55\xba\x01\x00\x10\x00", 8) + "zzzz";
  EXPECT_EQ(KernelNames(compressed).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace gpuexec::cli
