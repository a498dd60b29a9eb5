#ifndef GPUEXEC_SERVER_CORE_ARGS_H_
#define GPUEXEC_SERVER_CORE_ARGS_H_

// Kernel arguments: typed values from the client, checked against the
// kernel's real parameter layout and packed at its offsets. Pure functions,
// no driver and no gRPC.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/port/types.h"

namespace gpuexec::core {

// A tensor map as the client describes it (TensorMapArg in the API): a
// buffer and offset, and cuTensorMapEncodeTiled's fields with the driver's
// enumeration values. Checked and resolved by PackArgs.
struct TensorMapArg {
  int data_type = -1;             // CUtensorMapDataType; -1: not given
  std::vector<uint64_t> dims;     // innermost first
  std::vector<uint64_t> strides;  // bytes, dims 1..rank-1
  std::vector<uint32_t> box;
  std::vector<uint32_t> element_strides;  // empty: all 1
  uint32_t interleave = 0;
  uint32_t swizzle = 0;
  uint32_t l2_promotion = 0;
  uint32_t oob_fill = 0;
};

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
    kTensorMap,
  };
  Kind kind = Kind::kNull;
  uint64_t buffer = 0;  // kBuffer, kTensorMap: handle
  uint64_t offset = 0;  // kBuffer, kTensorMap: byte offset
  int64_t i = 0;        // signed kinds
  uint64_t u = 0;       // unsigned kinds
  double f = 0;         // floating kinds
  std::string raw;      // kRaw
  // kF16, kBF16: `u` holds the parameter's bits as given (not `f`).
  bool exact_bits = false;
  std::shared_ptr<const TensorMapArg> tensor_map;  // kTensorMap

  static ArgValue Buffer(uint64_t handle, uint64_t offset);
  static ArgValue Signed(Kind kind, int64_t v);
  static ArgValue Unsigned(Kind kind, uint64_t v);
  static ArgValue Float(Kind kind, double v);
  // A half or bfloat16 parameter's bits (checked to fit 16 bits at packing).
  static ArgValue HalfBits(Kind kind, uint64_t bits);
  static ArgValue Raw(std::string bytes);
  static ArgValue TensorMap(uint64_t handle, uint64_t offset, TensorMapArg map);
  static ArgValue Null();
};

// "i32", "buffer", ... for messages.
const char* KindName(ArgValue::Kind kind);
// Bytes the kind occupies in a parameter block (raw: its length).
uint64_t ArgSize(const ArgValue& arg);

// A buffer argument resolved: the device address of its offset and the
// bytes of the buffer from there to its end.
struct ResolvedBuffer {
  port::DevicePtr address = 0;
  uint64_t room = 0;
};
// Resolves a buffer (or tensor map) argument for parameter `index`;
// returns NOT_FOUND / INVALID_ARGUMENT naming the parameter.
using BufferResolver =
    std::function<absl::StatusOr<ResolvedBuffer>(size_t index, const ArgValue& arg)>;

// Checks a tensor map against the driver's rules (rank, sizes, alignment,
// strides, box, enumerations) and against its buffer: every byte the map
// spans lies within `room` bytes of `address`. INVALID_ARGUMENT naming
// parameter `index` of `kernel`, the field and the limit.
absl::StatusOr<port::TensorMapEncoding> CheckTensorMap(const std::string& kernel, size_t index,
                                                       const TensorMapArg& map,
                                                       port::DevicePtr address, uint64_t room);
// Bytes of one element of a tensor map data type (0 for an unknown type).
uint64_t TensorElementBytes(int data_type);

// A packed parameter block and the tensor maps to encode into it.
struct PackedArgs {
  std::string block;
  std::vector<port::TensorMapEncoding> tensor_maps;
};

// The largest kernel parameter block (CUDA 12.1+ on Volta and later: 32764
// bytes).
inline constexpr uint64_t kMaxParamBlockBytes = 32764;

// The most arguments a launch may pass, whatever carries it: a kernel's
// parameters take at least a byte each of a parameter block the driver
// bounds at kMaxParamBlockBytes, and no real kernel comes near. Each
// transport checks it before it converts any argument, so that a request of
// millions of arguments costs its parse only.
inline constexpr int kMaxLaunchArgs = 4096;

// Checks `args` against `params` (count, each size, integer ranges, tensor
// maps) and returns the packed parameter block (a tensor map's bytes left
// zero, for the device to encode). `kernel` names the kernel in errors. A
// layout that does not fit `param_bytes` (at most kMaxParamBlockBytes) is
// INTERNAL: it came from a worker gone wrong, and nothing is written.
absl::StatusOr<PackedArgs> PackArgs(const std::string& kernel,
                                    const std::vector<port::ParamInfo>& params,
                                    uint64_t param_bytes, const std::vector<ArgValue>& args,
                                    const BufferResolver& resolve);

// A launch as the client asked for it (Engine::Launch checks it).
struct Dim3 {
  uint32_t x = 1, y = 1, z = 1;
};

struct LaunchSpec {
  std::string session;
  uint64_t function = 0;
  Dim3 grid;
  Dim3 block;
  Dim3 cluster{0, 0, 0};  // all zero: no cluster
  uint32_t shared_bytes = 0;
  std::vector<ArgValue> args;
  bool synchronize = false;
  bool cooperative = false;
  bool programmatic_dependent = false;
  bool non_portable_cluster = false;
  uint32_t cluster_policy = 0;
  // With synchronize: a command ring's answer area the device may post the
  // success in itself (Engine::MapAnswerArea); `posted` says if it did.
  std::shared_ptr<port::DirectAnswer> answer;
};

}  // namespace gpuexec::core

#endif  // GPUEXEC_SERVER_CORE_ARGS_H_
