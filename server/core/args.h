#ifndef GPUEXEC_SERVER_CORE_ARGS_H_
#define GPUEXEC_SERVER_CORE_ARGS_H_

// Kernel arguments: typed values from the client, checked against the
// kernel's real parameter layout and packed at its offsets. Pure functions,
// no driver and no gRPC.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/port/types.h"

namespace gpuexec::core {

struct ArgValue {
  enum class Kind {
    kBuffer,
    kNull,
    kI8,
    kI16,
    kI32,
    kI64,
    kU8,
    kU16,
    kU32,
    kU64,
    kF16,
    kBF16,
    kF32,
    kF64,
    kRaw,
  };
  Kind kind = Kind::kNull;
  uint64_t buffer = 0;  // kBuffer: handle
  uint64_t offset = 0;  // kBuffer: byte offset
  int64_t i = 0;        // signed kinds
  uint64_t u = 0;       // unsigned kinds
  double f = 0;         // floating kinds
  std::string raw;      // kRaw
  // kF16, kBF16: `u` holds the parameter's bits as given (not `f`).
  bool exact_bits = false;

  static ArgValue Buffer(uint64_t handle, uint64_t offset);
  static ArgValue Signed(Kind kind, int64_t v);
  static ArgValue Unsigned(Kind kind, uint64_t v);
  static ArgValue Float(Kind kind, double v);
  // A half or bfloat16 parameter's bits (checked to fit 16 bits at packing).
  static ArgValue HalfBits(Kind kind, uint64_t bits);
  static ArgValue Raw(std::string bytes);
  static ArgValue Null();
};

// "i32", "buffer", ... for messages.
const char* KindName(ArgValue::Kind kind);
// Bytes the kind occupies in a parameter block (raw: its length).
uint64_t ArgSize(const ArgValue& arg);

// Resolves a buffer argument to a device address for parameter `index`;
// returns NOT_FOUND / INVALID_ARGUMENT naming the parameter.
using BufferResolver =
    std::function<absl::StatusOr<port::DevicePtr>(size_t index, const ArgValue& arg)>;

// The largest kernel parameter block (CUDA 12.1+ on Volta and later: 32764
// bytes).
inline constexpr uint64_t kMaxParamBlockBytes = 32764;

// Checks `args` against `params` (count, each size, integer ranges) and
// returns the packed parameter block. `kernel` names the kernel in errors.
// A layout that does not fit `param_bytes` (at most kMaxParamBlockBytes) is
// INTERNAL: it came from a worker gone wrong, and nothing is written.
absl::StatusOr<std::string> PackArgs(const std::string& kernel,
                                     const std::vector<port::ParamInfo>& params,
                                     uint64_t param_bytes, const std::vector<ArgValue>& args,
                                     const BufferResolver& resolve);

}  // namespace gpuexec::core

#endif  // GPUEXEC_SERVER_CORE_ARGS_H_
