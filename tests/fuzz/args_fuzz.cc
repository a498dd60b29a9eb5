// Kernel argument packing (server/core/args.h) against random parameter
// layouts: the arguments come from a client, the layout from the device's
// worker, which computes param_bytes as the end of the last parameter
// (server/device/device_launch.cc); parameters may be unaligned and may overlap.
//
// Checked:
//   * PackArgs succeeds exactly when the argument count, every argument's
//     size, every integer's range and every buffer's resolution are right;
//   * a packed block is param_bytes long and holds each argument at its
//     parameter's offset, in little-endian order, later parameters over
//     earlier ones where they overlap;
//   * half and bfloat16 values round once from their double to nearest
//     even, as computed here independently with double arithmetic, and
//     their exact bits pass as given (refused past 16 bits).

#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "server/core/args.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using gpuexec::core::ArgValue;
using Kind = ArgValue::Kind;

constexpr Kind kKinds[] = {Kind::kBuffer, Kind::kNull, Kind::kI8,  Kind::kI16, Kind::kI32,
                           Kind::kI64,    Kind::kU8,   Kind::kU16, Kind::kU32, Kind::kU64,
                           Kind::kF16,    Kind::kBF16, Kind::kF32, Kind::kF64, Kind::kRaw};

uint64_t SizeOf(Kind k, size_t raw) {
  switch (k) {
    case Kind::kI8:
    case Kind::kU8:
      return 1;
    case Kind::kI16:
    case Kind::kU16:
    case Kind::kF16:
    case Kind::kBF16:
      return 2;
    case Kind::kI32:
    case Kind::kU32:
    case Kind::kF32:
      return 4;
    case Kind::kRaw:
      return raw;
    default:
      return 8;
  }
}

bool InRange(const ArgValue& a) {
  switch (a.kind) {
    case Kind::kI8:
      return a.i >= -128 && a.i <= 127;
    case Kind::kI16:
      return a.i >= -32768 && a.i <= 32767;
    case Kind::kI32:
      return a.i >= INT32_MIN && a.i <= INT32_MAX;
    case Kind::kU8:
      return a.u <= 0xff;
    case Kind::kU16:
      return a.u <= 0xffff;
    case Kind::kU32:
      return a.u <= 0xffffffffu;
    case Kind::kF16:
    case Kind::kBF16:
      return !a.exact_bits || a.u <= 0xffff;
    default:
      return true;
  }
}

// The resolver refuses some buffers, as an unknown handle is refused.
bool Resolves(const ArgValue& a) { return a.buffer % 7 != 3; }
uint64_t AddressOf(const ArgValue& a) { return (a.buffer << 12) + a.offset; }

// Rounds |x| (finite, >= 0) to a multiple of 2^quantum_exp, ties to even.
double RoundTo(double x, int quantum_exp) {
  return std::ldexp(std::nearbyint(std::ldexp(x, -quantum_exp)), quantum_exp);
}

uint16_t ReferenceHalf(double f) {
  const uint16_t sign = std::signbit(f) ? 0x8000u : 0;
  if (std::isnan(f)) return sign | 0x7e00u;
  if (std::isinf(f)) return sign | 0x7c00u;
  const double x = std::fabs(f);
  // Binary16: 10 fraction bits, exponents -14..15, subnormals in 2^-24.
  int e = x == 0 ? -14 : std::ilogb(x);
  if (e < -14) e = -14;
  const double r = RoundTo(x, e - 10);
  if (r >= 65536.0) return sign | 0x7c00u;
  if (r < std::ldexp(1.0, -14)) {
    return sign | static_cast<uint16_t>(std::ldexp(r, 24));  // subnormal (or the smallest normal)
  }
  const int re = std::ilogb(r);
  const uint16_t fraction = static_cast<uint16_t>(std::ldexp(r, 10 - re) - 1024);
  return sign | static_cast<uint16_t>((re + 15) << 10) | fraction;
}

uint16_t ReferenceBFloat16(double f) {
  const uint16_t sign = std::signbit(f) ? 0x8000u : 0;
  if (std::isnan(f)) return sign | 0x7fc0u;
  if (std::isinf(f)) return sign | 0x7f80u;
  const double x = std::fabs(f);
  // bfloat16: 7 fraction bits, float's exponents, subnormals in 2^-133.
  int e = x == 0 ? -126 : std::ilogb(x);
  if (e < -126) e = -126;
  const double r = RoundTo(x, e - 7);
  if (r >= std::ldexp(1.0, 128)) return sign | 0x7f80u;
  const float rf = static_cast<float>(r);  // exact: r has 8 significant bits
  uint32_t rbits;
  std::memcpy(&rbits, &rf, 4);
  FUZZ_CHECK((rbits & 0xffffu) == 0);
  return sign | static_cast<uint16_t>(rbits >> 16);
}

template <typename T>
void Put(std::string* block, uint64_t offset, T v) {
  std::memcpy(block->data() + offset, &v, sizeof v);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);

  // The layout: parameters of the sizes kernels have, or any up to 64
  // bytes (structs), anywhere in the first 4 KiB (the driver's limit).
  const size_t nparams = in.ConsumeIntegralInRange<size_t>(0, 24);
  std::vector<gpuexec::port::ParamInfo> params;
  uint64_t param_bytes = 0;
  uint64_t next = 0;
  for (size_t i = 0; i < nparams; ++i) {
    gpuexec::port::ParamInfo p;
    static constexpr uint64_t kSizes[] = {1, 2, 4, 8, 16, 0};
    p.size = kSizes[in.ConsumeIntegralInRange<size_t>(0, 5)];
    if (p.size == 0) p.size = in.ConsumeIntegralInRange<uint64_t>(0, 64);
    switch (in.ConsumeIntegralInRange<int>(0, 2)) {
      case 0:  // packed after the previous one, aligned to its size
        p.offset = p.size > 1 && p.size <= 8 ? (next + p.size - 1) / p.size * p.size : next;
        break;
      case 1:  // anywhere near
        p.offset = in.ConsumeIntegralInRange<uint64_t>(0, 256);
        break;
      default:
        p.offset = in.ConsumeIntegralInRange<uint64_t>(0, 4096);
        break;
    }
    next = p.offset + p.size;
    param_bytes = std::max(param_bytes, p.offset + p.size);  // as the worker computes it
    params.push_back(p);
  }

  // The arguments: mostly one per parameter and of its size.
  size_t nargs = params.size();
  if (in.ConsumeIntegralInRange<int>(0, 15) == 0) nargs = in.ConsumeIntegralInRange<size_t>(0, 25);
  std::vector<ArgValue> args;
  for (size_t i = 0; i < nargs; ++i) {
    ArgValue a;
    const uint64_t want = i < params.size() ? params[i].size : 8;
    if (in.ConsumeBool()) {
      a.kind = kKinds[in.ConsumeIntegralInRange<size_t>(0, std::size(kKinds) - 1)];
    } else {
      // A kind of the parameter's size (raw bytes otherwise).
      std::vector<Kind> fit;
      for (Kind k : kKinds) {
        if (k != Kind::kRaw && SizeOf(k, 0) == want) fit.push_back(k);
      }
      fit.push_back(Kind::kRaw);
      a.kind = fit[in.ConsumeIntegralInRange<size_t>(0, fit.size() - 1)];
    }
    a.buffer = in.ConsumeIntegral<uint64_t>();
    a.offset = in.ConsumeIntegralInRange<uint64_t>(0, 1 << 20);
    switch (in.ConsumeIntegralInRange<int>(0, 3)) {  // mostly small values, in range
      case 0:
        a.i = in.ConsumeIntegral<int64_t>();
        break;
      default:
        a.i = in.ConsumeIntegralInRange<int64_t>(-40000, 40000);
        break;
    }
    switch (in.ConsumeIntegralInRange<int>(0, 3)) {
      case 0:
        a.u = in.ConsumeIntegral<uint64_t>();
        break;
      default:
        a.u = in.ConsumeIntegralInRange<uint64_t>(0, 70000);
        break;
    }
    if (in.ConsumeBool()) {
      const uint64_t bits = in.ConsumeIntegral<uint64_t>();
      std::memcpy(&a.f, &bits, 8);
    } else {
      const uint32_t bits = in.ConsumeIntegral<uint32_t>();
      float f;
      std::memcpy(&f, &bits, 4);
      a.f = f;
    }
    if (a.kind == Kind::kF16 || a.kind == Kind::kBF16) a.exact_bits = in.ConsumeBool();
    if (a.kind == Kind::kRaw) {
      const size_t n = in.ConsumeBool() ? want : in.ConsumeIntegralInRange<size_t>(0, 64);
      a.raw = in.ConsumeBytesAsString(n);
      a.raw.resize(n, '\x5a');
    }
    args.push_back(a);
  }

  size_t resolved = 0;
  auto resolve = [&](size_t index,
                     const ArgValue& a) -> absl::StatusOr<gpuexec::core::ResolvedBuffer> {
    FUZZ_CHECK(index < args.size());
    FUZZ_CHECK(a.kind == Kind::kBuffer);
    ++resolved;
    if (!Resolves(a)) return absl::NotFoundError("buffer not found");
    return gpuexec::core::ResolvedBuffer{AddressOf(a), 1};
  };
  const absl::StatusOr<gpuexec::core::PackedArgs> packed =
      gpuexec::core::PackArgs("k", params, param_bytes, args, resolve);

  // The expected block, or the expected refusal.
  bool expect_ok = args.size() == params.size();
  std::string expected(param_bytes, '\0');
  for (size_t i = 0; expect_ok && i < args.size(); ++i) {
    const ArgValue& a = args[i];
    const uint64_t at = params[i].offset;
    if (SizeOf(a.kind, a.raw.size()) != params[i].size || !InRange(a) ||
        (a.kind == Kind::kBuffer && !Resolves(a))) {
      expect_ok = false;
      break;
    }
    FUZZ_CHECK(at + params[i].size <= expected.size());
    switch (a.kind) {
      case Kind::kBuffer:
        Put<uint64_t>(&expected, at, AddressOf(a));
        break;
      case Kind::kNull:
        Put<uint64_t>(&expected, at, 0);
        break;
      case Kind::kI8:
        Put<uint8_t>(&expected, at, static_cast<uint8_t>(a.i & 0xff));
        break;
      case Kind::kU8:
        Put<uint8_t>(&expected, at, static_cast<uint8_t>(a.u));
        break;
      case Kind::kI16:
        Put<uint16_t>(&expected, at, static_cast<uint16_t>(a.i & 0xffff));
        break;
      case Kind::kU16:
        Put<uint16_t>(&expected, at, static_cast<uint16_t>(a.u));
        break;
      case Kind::kI32:
        Put<uint32_t>(&expected, at, static_cast<uint32_t>(a.i & 0xffffffff));
        break;
      case Kind::kU32:
        Put<uint32_t>(&expected, at, static_cast<uint32_t>(a.u));
        break;
      case Kind::kI64:
        Put<uint64_t>(&expected, at, static_cast<uint64_t>(a.i));
        break;
      case Kind::kU64:
        Put<uint64_t>(&expected, at, a.u);
        break;
      case Kind::kF16:
        Put<uint16_t>(&expected, at,
                      a.exact_bits ? static_cast<uint16_t>(a.u) : ReferenceHalf(a.f));
        break;
      case Kind::kBF16:
        Put<uint16_t>(&expected, at,
                      a.exact_bits ? static_cast<uint16_t>(a.u) : ReferenceBFloat16(a.f));
        break;
      case Kind::kF32:
        Put<float>(&expected, at, static_cast<float>(a.f));
        break;
      case Kind::kF64:
        Put<double>(&expected, at, a.f);
        break;
      case Kind::kRaw:
        std::memcpy(expected.data() + at, a.raw.data(), a.raw.size());
        break;
      case Kind::kTensorMap:
        // Not among kKinds: a tensor map is packed as the device encodes it
        // (args_test.cc checks CheckTensorMap and its placement).
        FUZZ_CHECK(false);
        break;
    }
  }

  if (!packed.ok()) {
    if (expect_ok) std::fprintf(stderr, "refused: %s\n", packed.status().ToString().c_str());
    FUZZ_CHECK(!expect_ok);
    FUZZ_CHECK(packed.status().code() == absl::StatusCode::kInvalidArgument ||
               packed.status().code() == absl::StatusCode::kNotFound);
    FUZZ_CHECK(packed.status().message().size() < 512);
    return 0;
  }
  FUZZ_CHECK(expect_ok);
  FUZZ_CHECK(packed->tensor_maps.empty());
  const std::string& block = packed->block;
  FUZZ_CHECK(block.size() == param_bytes);
  if (block != expected) {
    for (size_t i = 0; i < expected.size(); ++i) {
      if (block[i] != expected[i]) {
        std::fprintf(stderr, "byte %zu: packed 0x%02x, expected 0x%02x\n", i,
                     static_cast<unsigned char>(block[i]), static_cast<unsigned char>(expected[i]));
        break;
      }
    }
    FUZZ_CHECK(block == expected);
  }
  return 0;
}
