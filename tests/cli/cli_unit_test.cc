// The gpuexec tool's argument syntax and the Triton metadata, without a
// daemon: sizes, dimensions, typed arguments and the Triton launch plan.

#include <cstdint>
#include <cstring>
#include <string>

#include "cli/args.h"
#include "gmock/gmock.h"
#include "gpuexec/triton.h"
#include "gtest/gtest.h"

namespace gpuexec::cli {
namespace {

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

}  // namespace
}  // namespace gpuexec::cli

// ------------------------------------------------------------ Triton

namespace gpuexec {
namespace {

using ::testing::HasSubstr;

// Metadata as Triton 3.4 writes it (abridged: unknown fields are ignored).
constexpr char kTriton34[] = R"json({
  "hash": "9a1c0e7d", "target": {"backend": "cuda", "arch": 90, "warp_size": 32},
  "num_warps": 8, "num_ctas": 2, "num_stages": 3, "maxnreg": null,
  "cluster_dims": null, "ptx_version": null, "enable_fp_fusion": true,
  "launch_cooperative_grid": false, "launch_pdl": false,
  "supported_fp8_dtypes": ["fp8e5", "fp8e4nv"], "default_dot_input_precision": "tf32",
  "shared": 16384, "tmem_size": 0, "global_scratch_size": 64, "global_scratch_align": 16,
  "profile_scratch_size": 0, "profile_scratch_align": 1, "name": "add_kernel"
})json";

TEST(TritonMetadataTest, ParsesTheLaunchFields) {
  absl::StatusOr<TritonMetadata> meta = ParseTritonMetadata(kTriton34);
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->name, "add_kernel");
  EXPECT_EQ(meta->num_warps, 8u);
  EXPECT_EQ(meta->num_ctas, 2u);
  EXPECT_EQ(meta->shared, 16384u);
  EXPECT_TRUE(meta->has_global_scratch);
  EXPECT_EQ(meta->global_scratch_size, 64u);
  EXPECT_EQ(meta->global_scratch_align, 16u);
  EXPECT_TRUE(meta->has_profile_scratch);
  EXPECT_EQ(meta->profile_scratch_size, 0u);
  EXPECT_FALSE(meta->cluster_dims.has_value());
  EXPECT_FALSE(meta->launch_cooperative_grid);
}

TEST(TritonMetadataTest, PlanFollowsTritonsLauncher) {
  absl::StatusOr<TritonMetadata> meta = ParseTritonMetadata(kTriton34);
  ASSERT_TRUE(meta.ok()) << meta.status();
  absl::StatusOr<TritonLaunchPlan> plan = PlanTritonLaunch(*meta, Dim3{3, 2, 1});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->config.block.x, 256u);  // 32 x num_warps
  EXPECT_EQ(plan->config.block.y, 1u);
  EXPECT_EQ(plan->config.block.z, 1u);
  EXPECT_EQ(plan->config.grid.x, 6u);  // programs x num_ctas
  EXPECT_EQ(plan->config.grid.y, 2u);
  EXPECT_EQ(plan->config.grid.z, 1u);
  EXPECT_EQ(plan->config.shared_memory_bytes, 16384u);
  ASSERT_TRUE(plan->config.cluster.has_value());
  EXPECT_EQ(plan->config.cluster->x, 2u);
  EXPECT_EQ(plan->config.cluster->y, 1u);
  EXPECT_EQ(plan->config.cluster->z, 1u);
  ASSERT_EQ(plan->scratch.size(), 2u);
  EXPECT_EQ(plan->scratch[0].what, "global scratch");
  EXPECT_EQ(plan->scratch[0].bytes, 64u * 12);  // per CTA x 12 CTAs
  EXPECT_EQ(plan->scratch[0].align, 16u);
  EXPECT_EQ(plan->scratch[1].what, "profile scratch");
  EXPECT_EQ(plan->scratch[1].bytes, 0u);  // a null pointer
}

TEST(TritonMetadataTest, OneCtaAndNoScratchFieldsMeansAPlainLaunch) {
  // Triton before 3.2: no scratch parameters at all.
  absl::StatusOr<TritonMetadata> meta =
      ParseTritonMetadata(R"({"name": "k", "num_warps": 4, "num_ctas": 1, "shared": 0})");
  ASSERT_TRUE(meta.ok()) << meta.status();
  absl::StatusOr<TritonLaunchPlan> plan = PlanTritonLaunch(*meta, Dim3{5, 1, 1});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->config.block.x, 128u);
  EXPECT_EQ(plan->config.grid.x, 5u);
  EXPECT_FALSE(plan->config.cluster.has_value());
  EXPECT_TRUE(plan->scratch.empty());

  // Triton 3.2/3.3: the global scratch pointer only.
  meta = ParseTritonMetadata(R"({"name": "k", "global_scratch_size": 0,
                                 "global_scratch_align": 1})");
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->num_warps, 4u);  // Triton's default
  plan = PlanTritonLaunch(*meta, Dim3{5, 1, 1});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->scratch.size(), 1u);
  EXPECT_EQ(plan->scratch[0].bytes, 0u);
}

TEST(TritonMetadataTest, OlderClusterDims) {
  absl::StatusOr<TritonMetadata> meta =
      ParseTritonMetadata(R"({"name": "k", "num_ctas": 2, "cluster_dims": [2, 1, 1]})");
  ASSERT_TRUE(meta.ok()) << meta.status();
  ASSERT_TRUE(meta->cluster_dims.has_value());
  absl::StatusOr<TritonLaunchPlan> plan = PlanTritonLaunch(*meta, Dim3{4, 1, 1});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->config.grid.x, 8u);
  ASSERT_TRUE(plan->config.cluster.has_value());
  EXPECT_EQ(plan->config.cluster->x, 2u);
}

TEST(TritonMetadataTest, MalformedMetadataNamesTheField) {
  auto error = [](const char* json) {
    absl::StatusOr<TritonMetadata> meta = ParseTritonMetadata(json);
    EXPECT_FALSE(meta.ok()) << json;
    EXPECT_EQ(meta.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(meta.status().message());
  };
  EXPECT_THAT(error("not json"), HasSubstr("not a JSON object"));
  EXPECT_THAT(error("[1, 2]"), HasSubstr("not a JSON object"));
  EXPECT_THAT(error(R"({"num_warps": 4})"), HasSubstr("'name' is missing"));
  EXPECT_THAT(error(R"({"name": 7})"), HasSubstr("'name'"));
  EXPECT_THAT(error(R"({"name": "k", "num_warps": "4"})"),
              HasSubstr("'num_warps' is not a number"));
  EXPECT_THAT(error(R"({"name": "k", "num_warps": 0})"), HasSubstr("'num_warps'"));
  EXPECT_THAT(error(R"({"name": "k", "shared": -1})"), HasSubstr("'shared'"));
  EXPECT_THAT(error(R"({"name": "k", "shared": 1.5})"), HasSubstr("whole number"));
  EXPECT_THAT(error(R"({"name": "k", "cluster_dims": [2, 1]})"), HasSubstr("'cluster_dims'"));
  EXPECT_THAT(error(R"({"name": "k", "launch_cooperative_grid": 1})"),
              HasSubstr("'launch_cooperative_grid'"));
}

TEST(TritonMetadataTest, WhatGpuexecCannotLaunchIsRefused) {
  absl::StatusOr<TritonMetadata> meta =
      ParseTritonMetadata(R"({"name": "k", "launch_cooperative_grid": true})");
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_THAT(std::string(PlanTritonLaunch(*meta, Dim3{1, 1, 1}).status().message()),
              HasSubstr("cooperative"));

  meta = ParseTritonMetadata(
      R"({"name": "k", "global_scratch_size": 8, "global_scratch_align": 512})");
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_THAT(std::string(PlanTritonLaunch(*meta, Dim3{1, 1, 1}).status().message()),
              HasSubstr("alignment 512"));

  meta = ParseTritonMetadata(R"({"name": "k", "global_scratch_size": 8,
                                 "global_scratch_align": 3})");
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_THAT(std::string(PlanTritonLaunch(*meta, Dim3{1, 1, 1}).status().message()),
              HasSubstr("power of two"));

  meta = ParseTritonMetadata(R"({"name": "k", "num_ctas": 16})");
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_FALSE(PlanTritonLaunch(*meta, Dim3{0x10000000, 1, 1}).ok());  // grid.x overflows
}

TEST(TritonMetadataTest, AMissingFileIsNotFound) {
  EXPECT_EQ(ReadTritonMetadataFile("/nonexistent/gpuexec/meta.json").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace gpuexec
