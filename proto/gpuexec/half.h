#ifndef GPUEXEC_HALF_H_
#define GPUEXEC_HALF_H_

// IEEE binary16 and bfloat16 bits from a double, rounded once to the
// nearest representable value (ties to even), never through float first
// (1 + 2^-11 + 2^-40 is 0x3c01, where rounding to float first gives
// 1.0). Infinities and overflow give infinity; NaN a quiet NaN. Shared by
// the daemon (packing f16/bf16 parameters) and the clients.

#include <cstdint>

namespace gpuexec {

uint16_t RoundToHalf(double d);
uint16_t RoundToBFloat16(double d);

}  // namespace gpuexec

#endif  // GPUEXEC_HALF_H_
