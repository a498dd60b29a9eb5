#include "server/core/args.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "gmock/gmock.h"
#include "gpuexec/half.h"
#include "gtest/gtest.h"

namespace gpuexec::core {
namespace {

using ::testing::HasSubstr;
using K = ArgValue::Kind;

// gx_types(int8 @0, int16 @2, uint32 @4, int64 @8, half @16, bf16 @18,
//          float @20, double @24, uint64_t* @32)
const std::vector<port::ParamInfo> kTypes = {{0, 1},  {2, 2},  {4, 4},  {8, 8}, {16, 2},
                                             {18, 2}, {20, 4}, {24, 8}, {32, 8}};

absl::StatusOr<ResolvedBuffer> NoBuffers(size_t, const ArgValue&) {
  return absl::NotFoundError("no buffers here");
}

template <typename T>
T At(const std::string& block, size_t offset) {
  T v;
  std::memcpy(&v, block.data() + offset, sizeof(T));
  return v;
}
template <typename T>
T At(const PackedArgs& packed, size_t offset) {
  return At<T>(packed.block, offset);
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
  auto resolve = [](size_t index, const ArgValue& a) -> absl::StatusOr<ResolvedBuffer> {
    EXPECT_EQ(index, 8u);
    EXPECT_EQ(a.buffer, 7u);
    return ResolvedBuffer{0x1000 + a.offset, 64};
  };
  auto block = PackArgs("gx_types", kTypes, 40, args, resolve);
  ASSERT_TRUE(block.ok()) << block.status();
  ASSERT_EQ(block->block.size(), 40u);
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
  EXPECT_EQ(block->block.substr(0, 16), raw);
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

// Tensor maps: a 2-D float32 tile of a 64 x 32 matrix whose rows are 256
// bytes apart (padded), 32 x 16 boxes.
TensorMapArg Matrix() {
  TensorMapArg m;
  m.data_type = 7;  // FLOAT32
  m.dims = {64, 32};
  m.strides = {256};
  m.box = {32, 16};
  return m;
}
constexpr uint64_t kMatrixBytes = 31 * 256 + 64 * 4;  // the last row ends here

absl::StatusOr<port::TensorMapEncoding> Check(const TensorMapArg& m, uint64_t room = kMatrixBytes,
                                              port::DevicePtr address = 0x10000) {
  return CheckTensorMap("tma", 2, m, address, room);
}

std::string Refusal(const TensorMapArg& m, uint64_t room = kMatrixBytes,
                    port::DevicePtr address = 0x10000) {
  auto e = Check(m, room, address);
  if (e.ok()) return "accepted";
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << e.status();
  EXPECT_THAT(std::string(e.status().message()),
              HasSubstr("tensor map for parameter 2 of kernel 'tma': "));
  return std::string(e.status().message());
}

TEST(TensorMap, PacksAsAZeroedParameterAndAnEncodingForTheDevice) {
  // gx_tensormap_copy(CUtensorMap map @0, float* out @128, int x @136, ...)
  const std::vector<port::ParamInfo> params = {{0, 128}, {128, 8}, {136, 4}};
  std::vector<ArgValue> args = {ArgValue::TensorMap(5, 32, Matrix()), ArgValue::Buffer(6, 0),
                                ArgValue::Signed(K::kI32, 3)};
  auto resolve = [](size_t index, const ArgValue& a) -> absl::StatusOr<ResolvedBuffer> {
    if (a.buffer == 5) return ResolvedBuffer{0x20000 + a.offset, kMatrixBytes};
    return ResolvedBuffer{0x90000, 4096};
  };
  auto packed = PackArgs("tma", params, 140, args, resolve);
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_EQ(packed->block.substr(0, 128), std::string(128, '\0'));
  EXPECT_EQ(At<uint64_t>(*packed, 128), 0x90000u);
  EXPECT_EQ(At<int32_t>(*packed, 136), 3);
  ASSERT_EQ(packed->tensor_maps.size(), 1u);
  const port::TensorMapEncoding& e = packed->tensor_maps[0];
  EXPECT_EQ(e.param_offset, 0u);
  EXPECT_EQ(e.param_index, 0u);
  EXPECT_EQ(e.address, 0x20020u);
  EXPECT_EQ(e.data_type, 7u);
  EXPECT_EQ(e.rank, 2u);
  EXPECT_EQ(e.dims[0], 64u);
  EXPECT_EQ(e.dims[1], 32u);
  EXPECT_EQ(e.strides[0], 256u);
  EXPECT_EQ(e.box[0], 32u);
  EXPECT_EQ(e.box[1], 16u);
  EXPECT_EQ(e.element_strides[0], 1u);
  EXPECT_EQ(e.element_strides[1], 1u);
}

TEST(TensorMap, ATensorMapIsOneHundredTwentyEightBytes) {
  const std::vector<port::ParamInfo> pointer = {{0, 8}};
  auto packed = PackArgs("tma", pointer, 8, {ArgValue::TensorMap(5, 0, Matrix())}, NoBuffers);
  EXPECT_EQ(packed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(packed.status().message()),
              HasSubstr("argument 0 is tensor map (128 bytes)"));
}

TEST(TensorMap, AnUnknownBufferIsNotFound) {
  const std::vector<port::ParamInfo> params = {{0, 128}};
  auto packed = PackArgs("tma", params, 128, {ArgValue::TensorMap(5, 0, Matrix())}, NoBuffers);
  EXPECT_EQ(packed.status().code(), absl::StatusCode::kNotFound);
}

TEST(TensorMap, TheSpanMustLieInTheBuffer) {
  EXPECT_TRUE(Check(Matrix()).ok());
  EXPECT_THAT(Refusal(Matrix(), kMatrixBytes - 1),
              HasSubstr("it spans 8192 bytes from the tensor's start; the buffer has 8191"));
  // Five dimensions of 2^32 with strides near 2^40 span more than 2^64
  // bytes; counted without overflow.
  TensorMapArg huge;
  huge.data_type = 0;
  huge.dims = {1ull << 32, 1ull << 32, 1ull << 32, 1ull << 32, 1ull << 32};
  huge.strides = {(1ull << 40) - 16, (1ull << 40) - 16, (1ull << 40) - 16, (1ull << 40) - 16};
  huge.box = {16, 1, 1, 1, 1};
  EXPECT_THAT(Refusal(huge, ~uint64_t{0}), HasSubstr("spans over 2^64 bytes"));
}

TEST(TensorMap, EveryDriverRuleIsRefusedByName) {
  auto with = [](auto change) {
    TensorMapArg m = Matrix();
    change(m);
    return Refusal(m);
  };
  EXPECT_THAT(with([](TensorMapArg& m) { m.data_type = -1; }), HasSubstr("data_type is not given"));
  EXPECT_THAT(with([](TensorMapArg& m) { m.data_type = 13; }),
              HasSubstr("data_type is not a known type"));
  EXPECT_THAT(with([](TensorMapArg& m) { m.interleave = 1; }),
              HasSubstr("interleave 1 is not offered; only INTERLEAVE_NONE (0)"));
  EXPECT_THAT(with([](TensorMapArg& m) { m.swizzle = 4; }), HasSubstr("swizzle 4"));
  EXPECT_THAT(with([](TensorMapArg& m) { m.l2_promotion = 4; }), HasSubstr("l2_promotion 4"));
  EXPECT_THAT(with([](TensorMapArg& m) { m.oob_fill = 2; }), HasSubstr("oob_fill 2"));
  EXPECT_THAT(with([](TensorMapArg& m) {
                m.dims.clear();
                m.strides.clear();
                m.box.clear();
              }),
              HasSubstr("rank 0 (entries of global_dims) is not 1 to 5"));
  EXPECT_THAT(with([](TensorMapArg& m) {
                m.dims.assign(6, 1);
                m.strides.assign(5, 16);
                m.box.assign(6, 4);
              }),
              HasSubstr("rank 6"));
  EXPECT_THAT(with([](TensorMapArg& m) { m.interleave = 2; }), HasSubstr("interleave 2"));
  EXPECT_THAT(with([](TensorMapArg& m) {
                m.strides = {256, 512};
              }),
              HasSubstr("global_strides has 2 entries; rank 2 needs 1"));
  EXPECT_THAT(with([](TensorMapArg& m) { m.box = {32}; }),
              HasSubstr("box_dims has 1 entries; rank 2 needs 2"));
  EXPECT_THAT(with([](TensorMapArg& m) { m.element_strides = {1}; }),
              HasSubstr("element_strides has 1 entries"));
  EXPECT_THAT(with([](TensorMapArg& m) { m.dims[1] = 0; }), HasSubstr("global_dims[1] is 0"));
  EXPECT_THAT(with([](TensorMapArg& m) { m.dims[0] = (1ull << 32) + 1; }),
              HasSubstr("global_dims[0] is 4294967297; 1 to 2^32"));
  EXPECT_THAT(with([](TensorMapArg& m) { m.strides[0] = 260; }),
              HasSubstr("global_strides[0] is 260; a multiple of 16 below 2^40"));
  EXPECT_THAT(with([](TensorMapArg& m) { m.strides[0] = 1ull << 40; }),
              HasSubstr("global_strides[0]"));
  EXPECT_THAT(with([](TensorMapArg& m) { m.box[1] = 0; }), HasSubstr("box_dims[1] is 0; 1 to 256"));
  EXPECT_THAT(with([](TensorMapArg& m) { m.box[1] = 257; }), HasSubstr("box_dims[1] is 257"));
  EXPECT_THAT(with([](TensorMapArg& m) {
                m.element_strides = {1, 9};
              }),
              HasSubstr("element_strides[1] is 9; 1 to 8"));
  EXPECT_THAT(with([](TensorMapArg& m) { m.box[0] = 6; }),
              HasSubstr("box_dims[0] (6) times the element size (4) is 24 bytes"));
  EXPECT_THAT(with([](TensorMapArg& m) { m.swizzle = 2; }),
              HasSubstr("box_dims[0] spans 128 bytes; swizzle 64B allows at most 64"));
  EXPECT_THAT(with([](TensorMapArg& m) {
                m.data_type = 3;  // INT32
                m.oob_fill = 1;
              }),
              HasSubstr("oob_fill NAN_REQUEST_ZERO_FMA needs a floating-point data_type"));
}

TEST(TensorMap, TheTensorMustBeAlignedAsTheDriverAsks) {
  EXPECT_THAT(Refusal(Matrix(), kMatrixBytes, 0x10008),
              HasSubstr("the tensor's address (buffer offset) is not 16-byte aligned"));
  EXPECT_TRUE(Check(Matrix(), kMatrixBytes, 0x10010).ok());
}

// Half precision, and the value of any half's bits.
double HalfValue(uint16_t h) {
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  const double v = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
  return (h & 0x8000) ? -v : v;
}

double BFloat16Value(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// From a double, every finite value is found again, and every midpoint
// between neighbours (and the doubles just either side of it) rounds once:
// to the even neighbour, to the upper, to the lower. Rounding through float
// first gets some of these wrong.
template <typename Round, typename Value>
void CheckRoundsOnce(Round round, Value value, uint16_t last_finite) {
  for (uint32_t h = 0; h <= last_finite; ++h) {
    const uint16_t b = static_cast<uint16_t>(h);
    ASSERT_EQ(round(value(b)), b) << "bits " << h;
    ASSERT_EQ(round(-value(b)), b | 0x8000) << "bits " << h;
    if (h == last_finite) break;
    const double lo = value(b), hi = value(static_cast<uint16_t>(b + 1));
    const double mid = lo + (hi - lo) / 2;
    ASSERT_EQ(round(mid), (h & 1) ? h + 1 : h) << "midpoint above bits " << h;
    ASSERT_EQ(round(std::nextafter(mid, hi)), h + 1) << "just above the midpoint of " << h;
    ASSERT_EQ(round(std::nextafter(mid, lo)), h) << "just below the midpoint of " << h;
  }
}

TEST(FloatConversion, DoublesRoundOnceToEveryHalf) {
  CheckRoundsOnce(RoundToHalf, HalfValue, 0x7bff);
  EXPECT_EQ(RoundToHalf(1.0 + std::ldexp(1, -11) + std::ldexp(1, -40)), 0x3c01);
  EXPECT_EQ(RoundToHalf(65520.0), 0x7c00);  // the midpoint past the largest: inf
  EXPECT_EQ(RoundToHalf(std::numeric_limits<double>::infinity()), 0x7c00);
  EXPECT_EQ(RoundToHalf(std::ldexp(1, -25)), 0x0000);  // half the smallest: to even
  EXPECT_EQ(RoundToHalf(std::numeric_limits<double>::quiet_NaN()) & 0x7e00, 0x7e00);
}

TEST(FloatConversion, DoublesRoundOnceToEveryBFloat16) {
  CheckRoundsOnce(RoundToBFloat16, BFloat16Value, 0x7f7f);
  EXPECT_EQ(RoundToBFloat16(1.0 + std::ldexp(1, -8) + std::ldexp(1, -40)), 0x3f81);
  EXPECT_EQ(RoundToBFloat16(std::numeric_limits<double>::infinity()), 0x7f80);
  EXPECT_EQ(RoundToBFloat16(1e39), 0x7f80);
  EXPECT_EQ(RoundToBFloat16(std::numeric_limits<double>::quiet_NaN()) & 0x7fc0, 0x7fc0);
}

TEST(PackArgs, HalfBitsPassAsGivenAndMustFitSixteenBits) {
  const std::vector<port::ParamInfo> two = {{0, 2}, {2, 2}};
  auto block = PackArgs("k", two, 4,
                        {ArgValue::HalfBits(K::kF16, 0x3c01), ArgValue::HalfBits(K::kBF16, 0x7fc1)},
                        NoBuffers);
  ASSERT_TRUE(block.ok()) << block.status();
  EXPECT_EQ(At<uint16_t>(*block, 0), 0x3c01);
  EXPECT_EQ(At<uint16_t>(*block, 2), 0x7fc1);
  auto refused =
      PackArgs("k", two, 4, {ArgValue::HalfBits(K::kF16, 0x10000), ArgValue::HalfBits(K::kBF16, 0)},
               NoBuffers);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("parameter 0 of kernel 'k': f16 bits 65536"));
}

TEST(FloatConversion, HalfRoundsToNearestEven) {
  EXPECT_EQ(RoundToHalf(0.0f), 0x0000);
  EXPECT_EQ(RoundToHalf(-0.0f), 0x8000);
  EXPECT_EQ(RoundToHalf(1.0f), 0x3C00);
  EXPECT_EQ(RoundToHalf(1.5f), 0x3E00);
  EXPECT_EQ(RoundToHalf(-2.0f), 0xC000);
  EXPECT_EQ(RoundToHalf(65504.0f), 0x7BFF);
  EXPECT_EQ(RoundToHalf(65536.0f), 0x7C00);            // overflow: inf
  EXPECT_EQ(RoundToHalf(5.9604645e-08f), 0x0001);      // smallest subnormal
  EXPECT_EQ(RoundToHalf(1.0f + 1.0f / 2048), 0x3C00);  // tie to even (down)
  EXPECT_EQ(RoundToHalf(1.0f + 3.0f / 2048), 0x3C02);  // tie to even (up)
  EXPECT_EQ(RoundToHalf(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(RoundToHalf(std::numeric_limits<float>::quiet_NaN()) & 0x7C00, 0x7C00);
}

TEST(FloatConversion, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(RoundToBFloat16(1.0f), 0x3F80);
  EXPECT_EQ(RoundToBFloat16(1.5f), 0x3FC0);
  EXPECT_EQ(RoundToBFloat16(-2.0f), 0xC000);
  EXPECT_EQ(RoundToBFloat16(1.0f + 1.0f / 256), 0x3F80);  // tie to even (down)
  EXPECT_EQ(RoundToBFloat16(1.0f + 3.0f / 256), 0x3F82);  // tie to even (up)
  EXPECT_EQ(RoundToBFloat16(std::numeric_limits<float>::quiet_NaN()) & 0x7F80, 0x7F80);
}

}  // namespace
}  // namespace gpuexec::core
