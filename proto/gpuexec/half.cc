#include "gpuexec/half.h"

#include <cstring>

namespace gpuexec {

uint16_t RoundToHalf(double d) {
  uint64_t x;
  std::memcpy(&x, &d, 8);
  const uint32_t sign = static_cast<uint32_t>(x >> 48) & 0x8000u;
  const uint32_t exp = static_cast<uint32_t>(x >> 52) & 0x7ffu;
  uint64_t mant = x & ((uint64_t{1} << 52) - 1);
  if (exp == 0x7ff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0));
  const int e = static_cast<int>(exp) - 1023 + 15;
  if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);
  if (e <= 0) {
    // Below 2^-25 (half the smallest subnormal) everything rounds to zero.
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= uint64_t{1} << 52;
    const int shift = 43 - e;
    uint64_t half = mant >> shift;
    const uint64_t rem = mant & ((uint64_t{1} << shift) - 1);
    const uint64_t halfway = uint64_t{1} << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint64_t half = (static_cast<uint64_t>(e) << 10) | (mant >> 42);
  const uint64_t rem = mant & ((uint64_t{1} << 42) - 1);
  const uint64_t halfway = uint64_t{1} << 41;
  if (rem > halfway || (rem == halfway && (half & 1u))) ++half;  // may carry into exp: fine
  return static_cast<uint16_t>(sign | half);
}

uint16_t RoundToBFloat16(double d) {
  uint64_t x;
  std::memcpy(&x, &d, 8);
  const uint32_t sign = static_cast<uint32_t>(x >> 48) & 0x8000u;
  const uint32_t exp = static_cast<uint32_t>(x >> 52) & 0x7ffu;
  uint64_t mant = x & ((uint64_t{1} << 52) - 1);
  if (exp == 0x7ff) return static_cast<uint16_t>(sign | (mant ? 0x7fc0u : 0x7f80u));
  const int e = static_cast<int>(exp) - 1023 + 127;
  if (e >= 0xff) return static_cast<uint16_t>(sign | 0x7f80u);
  if (e <= 0) {
    // Below 2^-134 (half the smallest subnormal) everything rounds to zero.
    if (e < -7) return static_cast<uint16_t>(sign);
    mant |= uint64_t{1} << 52;
    const int shift = 46 - e;
    uint64_t b = mant >> shift;
    const uint64_t rem = mant & ((uint64_t{1} << shift) - 1);
    const uint64_t halfway = uint64_t{1} << (shift - 1);
    if (rem > halfway || (rem == halfway && (b & 1u))) ++b;
    return static_cast<uint16_t>(sign | b);
  }
  uint64_t b = (static_cast<uint64_t>(e) << 7) | (mant >> 45);
  const uint64_t rem = mant & ((uint64_t{1} << 45) - 1);
  const uint64_t halfway = uint64_t{1} << 44;
  if (rem > halfway || (rem == halfway && (b & 1u))) ++b;  // may carry into exp: fine
  return static_cast<uint16_t>(sign | b);
}

}  // namespace gpuexec
