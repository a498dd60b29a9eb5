#include "server/core/args.h"

#include <cstring>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gpuexec::core {
namespace {

using ::testing::HasSubstr;
using K = ArgValue::Kind;

// gx_types(int8 @0, int16 @2, uint32 @4, int64 @8, half @16, bf16 @18,
//          float @20, double @24, uint64_t* @32)
const std::vector<port::ParamInfo> kTypes = {{0, 1},  {2, 2},  {4, 4},  {8, 8}, {16, 2},
                                             {18, 2}, {20, 4}, {24, 8}, {32, 8}};

absl::StatusOr<port::DevicePtr> NoBuffers(size_t, const ArgValue&) {
  return absl::NotFoundError("no buffers here");
}

template <typename T>
T At(const std::string& block, size_t offset) {
  T v;
  std::memcpy(&v, block.data() + offset, sizeof(T));
  return v;
}

TEST(PackArgs, PacksEveryKindAtItsOffset) {
  std::vector<ArgValue> args = {ArgValue::Signed(K::kI8, -3),
                                ArgValue::Signed(K::kI16, -300),
                                ArgValue::Unsigned(K::kU32, 70000),
                                ArgValue::Signed(K::kI64, -5000000000),
                                ArgValue::Float(K::kF16, 1.5),
                                ArgValue::Float(K::kBF16, 1.5),
                                ArgValue::Float(K::kF32, 2.25),
                                ArgValue::Float(K::kF64, -0.125),
                                ArgValue::Buffer(7, 16)};
  auto resolve = [](size_t index, const ArgValue& a) -> absl::StatusOr<port::DevicePtr> {
    EXPECT_EQ(index, 8u);
    EXPECT_EQ(a.buffer, 7u);
    return 0x1000 + a.offset;
  };
  auto block = PackArgs("gx_types", kTypes, 40, args, resolve);
  ASSERT_TRUE(block.ok()) << block.status();
  ASSERT_EQ(block->size(), 40u);
  EXPECT_EQ(At<int8_t>(*block, 0), -3);
  EXPECT_EQ(At<int16_t>(*block, 2), -300);
  EXPECT_EQ(At<uint32_t>(*block, 4), 70000u);
  EXPECT_EQ(At<int64_t>(*block, 8), -5000000000);
  EXPECT_EQ(At<uint16_t>(*block, 16), 0x3E00);
  EXPECT_EQ(At<uint16_t>(*block, 18), 0x3FC0);
  EXPECT_EQ(At<float>(*block, 20), 2.25f);
  EXPECT_EQ(At<double>(*block, 24), -0.125);
  EXPECT_EQ(At<uint64_t>(*block, 32), 0x1010u);
}

TEST(PackArgs, WrongCountNamesTheKernel) {
  auto block = PackArgs("gx_types", kTypes, 40, {ArgValue::Signed(K::kI8, 1)}, NoBuffers);
  ASSERT_EQ(block.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(block.status().message()), HasSubstr("takes 9 parameters"));
  EXPECT_THAT(std::string(block.status().message()), HasSubstr("passed 1"));
}

TEST(PackArgs, WrongSizeNamesTheParameter) {
  std::vector<port::ParamInfo> params = {{0, 4}, {8, 8}};
  auto block = PackArgs("k", params, 16, {ArgValue::Float(K::kF32, 1), ArgValue::Float(K::kF32, 2)},
                        NoBuffers);
  ASSERT_EQ(block.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(block.status().message()),
              HasSubstr("parameter 1 of kernel 'k' is 8 bytes"));
  EXPECT_THAT(std::string(block.status().message()), HasSubstr("f32 (4 bytes)"));
}

TEST(PackArgs, IntegerOutOfRangeIsRejected) {
  std::vector<port::ParamInfo> params = {{0, 1}};
  for (const ArgValue& a : {ArgValue::Signed(K::kI8, 128), ArgValue::Signed(K::kI8, -129),
                            ArgValue::Unsigned(K::kU8, 256)}) {
    auto block = PackArgs("k", params, 1, {a}, NoBuffers);
    ASSERT_EQ(block.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(block.status().message()), HasSubstr("out of range"));
  }
  std::vector<port::ParamInfo> p4 = {{0, 4}};
  EXPECT_FALSE(PackArgs("k", p4, 4, {ArgValue::Unsigned(K::kU32, 1ull << 32)}, NoBuffers).ok());
  EXPECT_TRUE(PackArgs("k", p4, 4, {ArgValue::Signed(K::kI32, -2147483648ll)}, NoBuffers).ok());
}

TEST(PackArgs, RawBytesAndNull) {
  std::vector<port::ParamInfo> params = {{0, 16}, {16, 8}};
  std::string raw(16, '\0');
  for (int i = 0; i < 16; ++i) raw[i] = static_cast<char>(i + 1);
  auto block = PackArgs("gx_struct", params, 24, {ArgValue::Raw(raw), ArgValue::Null()}, NoBuffers);
  ASSERT_TRUE(block.ok()) << block.status();
  EXPECT_EQ(block->substr(0, 16), raw);
  EXPECT_EQ(At<uint64_t>(*block, 16), 0u);
  // A raw argument of the wrong length is a size mismatch.
  EXPECT_FALSE(
      PackArgs("gx_struct", params, 24, {ArgValue::Raw("abc"), ArgValue::Null()}, NoBuffers).ok());
}

TEST(PackArgs, ResolverErrorsPassThrough) {
  std::vector<port::ParamInfo> params = {{0, 8}};
  auto block = PackArgs("k", params, 8, {ArgValue::Buffer(1, 0)}, NoBuffers);
  EXPECT_EQ(block.status().code(), absl::StatusCode::kNotFound);
}

// The layout comes from another process: one past its own block is refused
// before anything is written (found by args_fuzz with a forged worker reply).
TEST(PackArgs, ALayoutOutsideItsBlockIsRefusedNotWrittenPast) {
  std::vector<port::ParamInfo> past = {{64, 8}};
  auto block = PackArgs("k", past, 64, {ArgValue::Signed(K::kI64, 1)}, NoBuffers);
  EXPECT_EQ(block.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(block.status().message()), HasSubstr("outside its 64-byte"));
  std::vector<port::ParamInfo> far = {{4096, 8}};
  EXPECT_EQ(PackArgs("k", far, 8, {ArgValue::Signed(K::kI64, 1)}, NoBuffers).status().code(),
            absl::StatusCode::kInternal);
  std::vector<port::ParamInfo> wrap = {{8, UINT64_MAX}};
  EXPECT_EQ(PackArgs("k", wrap, 16, {ArgValue::Signed(K::kI64, 1)}, NoBuffers).status().code(),
            absl::StatusCode::kInternal);
  std::vector<port::ParamInfo> fine = {{0, 8}};
  EXPECT_EQ(PackArgs("k", fine, kMaxParamBlockBytes + 1, {ArgValue::Signed(K::kI64, 1)}, NoBuffers)
                .status()
                .code(),
            absl::StatusCode::kInternal);
}

TEST(FloatConversion, HalfRoundsToNearestEven) {
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalf(1.5f), 0x3E00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xC000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(65536.0f), 0x7C00);            // overflow: inf
  EXPECT_EQ(FloatToHalf(5.9604645e-08f), 0x0001);      // smallest subnormal
  EXPECT_EQ(FloatToHalf(1.0f + 1.0f / 2048), 0x3C00);  // tie to even (down)
  EXPECT_EQ(FloatToHalf(1.0f + 3.0f / 2048), 0x3C02);  // tie to even (up)
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::quiet_NaN()) & 0x7C00, 0x7C00);
}

TEST(FloatConversion, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBFloat16(1.5f), 0x3FC0);
  EXPECT_EQ(FloatToBFloat16(-2.0f), 0xC000);
  EXPECT_EQ(FloatToBFloat16(1.0f + 1.0f / 256), 0x3F80);  // tie to even (down)
  EXPECT_EQ(FloatToBFloat16(1.0f + 3.0f / 256), 0x3F82);  // tie to even (up)
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::quiet_NaN()) & 0x7F80, 0x7F80);
}

}  // namespace
}  // namespace gpuexec::core
