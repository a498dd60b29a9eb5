#ifndef GPUEXEC_CLIENT_CPP_GPUEXEC_KERNEL_ARGS_H_
#define GPUEXEC_CLIENT_CPP_GPUEXEC_KERNEL_ARGS_H_

// How a kernel is launched: its grid and block, the launch's attributes,
// a kernel's parameters and attributes as the daemon reports them, and the
// typed arguments a launch carries (gpuexec/client.h includes this
// header).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/types/span.h"

namespace gpuexec {

namespace v1 {
class Arg;  // generated from gpuexec.proto
}  // namespace v1

class Buffer;

struct Dim3 {
  uint32_t x = 1;
  uint32_t y = 1;
  uint32_t z = 1;
};

// How a cluster's blocks are placed on the multiprocessors.
enum class ClusterSchedulingPolicy {
  kDefault,
  // Spread over the multiprocessors.
  kSpread,
  // Balanced over them by the hardware.
  kLoadBalancing,
};

struct LaunchConfig {
  Dim3 grid;
  Dim3 block;
  // Dynamic shared memory; the daemon opts in above 48 KiB.
  uint32_t shared_memory_bytes = 0;
  // Thread block cluster dimensions; unset means no cluster. At most 8
  // blocks, or 16 with `non_portable_cluster`.
  std::optional<Dim3> cluster;
  // Every block of the grid resident at once, so that the kernel may
  // synchronize the whole grid; the daemon refuses a grid larger than the
  // device holds at once (INVALID_ARGUMENT naming both figures).
  bool cooperative = false;
  // Programmatic dependent launch (compute capability 9.0 on): the kernel
  // may start before the session's previous kernel ends, once that one
  // triggers it; it waits (griddepcontrol.wait) before reading its output.
  bool programmatic_dependent_launch = false;
  // Allows a cluster of more than the portable 8 blocks (up to 16).
  bool non_portable_cluster = false;
  // Only with a cluster.
  ClusterSchedulingPolicy cluster_scheduling_policy = ClusterSchedulingPolicy::kDefault;
};

// A TMA tensor map's element type. The values are the driver's
// (CUtensorMapDataType).
enum class TensorMapDataType {
  kUint8 = 0,
  kUint16 = 1,
  kUint32 = 2,
  kInt32 = 3,
  kUint64 = 4,
  kInt64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBFloat16 = 9,
  kFloat32Ftz = 10,
  kTFloat32 = 11,
  kTFloat32Ftz = 12,
};
// The daemon offers kNone only (it refuses the interleaved layouts).
enum class TensorMapInterleave { kNone, k16B, k32B };
enum class TensorMapSwizzle { kNone, k32B, k64B, k128B };
enum class TensorMapL2Promotion { kNone, k64B, k128B, k256B };
enum class TensorMapOobFill {
  kZero,
  // Out-of-bounds floating-point elements read as a NaN that FMA treats as
  // zero.
  kNanRequestZeroFma,
};

// A TMA tensor map (the fields of cuTensorMapEncodeTiled but the address),
// for Arg::TensorMap. Dimensions run innermost (contiguous) first, as in the
// driver's API. The daemon checks them against the driver's rules and the
// buffer's size (INVALID_ARGUMENT naming the field) and encodes the map on
// the buffer's device at each launch.
struct TensorMap {
  TensorMapDataType data_type = TensorMapDataType::kFloat32;
  // Elements along each dimension; the rank (1 to 5) is their count.
  std::vector<uint64_t> global_dims;
  // Bytes between consecutive elements of dimensions 1 .. rank-1 (rank - 1
  // entries, multiples of 16).
  std::vector<uint64_t> global_strides;
  // The box one TMA operation moves: rank entries of 1 to 256.
  std::vector<uint32_t> box_dims;
  // Rank entries of 1 to 8; empty: all 1.
  std::vector<uint32_t> element_strides;
  TensorMapInterleave interleave = TensorMapInterleave::kNone;
  TensorMapSwizzle swizzle = TensorMapSwizzle::kNone;
  TensorMapL2Promotion l2_promotion = TensorMapL2Promotion::kNone;
  TensorMapOobFill oob_fill = TensorMapOobFill::kZero;
};

// A kernel parameter as the driver lays it out.
struct ParamInfo {
  uint64_t offset = 0;
  uint64_t size = 0;
  friend bool operator==(const ParamInfo& a, const ParamInfo& b) {
    return a.offset == b.offset && a.size == b.size;
  }
  friend bool operator!=(const ParamInfo& a, const ParamInfo& b) { return !(a == b); }
};

struct FunctionAttributes {
  uint32_t num_registers = 0;
  uint64_t static_shared_bytes = 0;
  uint64_t const_bytes = 0;
  uint64_t local_bytes = 0;
  uint32_t max_threads_per_block = 0;
  uint64_t max_dynamic_shared_bytes = 0;
  uint32_t ptx_version = 0;
  uint32_t binary_version = 0;
};

// One typed kernel argument. The daemon checks it against the parameter at
// its position (size) and packs it at the parameter's offset.
class Arg {
 public:
  // The device address of `buffer` plus `offset`. Records the handle only:
  // the Buffer need not outlive the Arg, but must exist at launch.
  static Arg Ptr(const Buffer& buffer, uint64_t offset = 0);
  // A null device pointer (8 bytes of zero).
  static Arg Null();
  static Arg I8(int8_t v) { return Int(Kind::kI8, v); }
  static Arg I16(int16_t v) { return Int(Kind::kI16, v); }
  static Arg I32(int32_t v) { return Int(Kind::kI32, v); }
  static Arg I64(int64_t v) { return Int(Kind::kI64, v); }
  static Arg U8(uint8_t v) { return Uint(Kind::kU8, v); }
  static Arg U16(uint16_t v) { return Uint(Kind::kU16, v); }
  static Arg U32(uint32_t v) { return Uint(Kind::kU32, v); }
  static Arg U64(uint64_t v) { return Uint(Kind::kU64, v); }
  // The daemon rounds the value, as a double, once to IEEE half /
  // bfloat16 (to nearest even).
  static Arg F16(double v) { return Float(Kind::kF16, v); }
  static Arg BF16(double v) { return Float(Kind::kBF16, v); }
  // A half / bfloat16 parameter's exact bits, passed as they are.
  static Arg F16Bits(uint16_t bits) { return Uint(Kind::kF16Bits, bits); }
  static Arg BF16Bits(uint16_t bits) { return Uint(Kind::kBF16Bits, bits); }
  static Arg F32(float v) { return Float(Kind::kF32, v); }
  static Arg F64(double v) { return Float(Kind::kF64, v); }
  // A tensor map over `buffer` from byte `offset` (16-byte aligned): a
  // 128-byte by-value parameter (a `const __grid_constant__ CUtensorMap`)
  // that the daemon encodes with the buffer's device address. Records the
  // handle only, as Ptr does.
  static Arg TensorMap(const Buffer& buffer, uint64_t offset, const gpuexec::TensorMap& map);
  // By-value bytes (a struct); copied. Not for a CUtensorMap: it holds a
  // device address, which clients never see (use TensorMap).
  static Arg Raw(std::string_view bytes);
  static Arg Raw(absl::Span<const uint8_t> bytes);
  // The bytes of `value`, padding included.
  template <typename T>
  static Arg Struct(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>, "Arg::Struct needs a trivially copyable type");
    return Raw(std::string_view(reinterpret_cast<const char*>(&value), sizeof(T)));
  }

  // The wire form.
  void ToProto(v1::Arg* out) const;
  // Bytes it fills in the kernel's parameter block (8 for a pointer, 128
  // for a tensor map).
  uint64_t size_bytes() const;

 private:
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
    kF16Bits,
    kBF16Bits,
    kF32,
    kF64,
    kRaw,
    kTensorMap,
  };
  explicit Arg(Kind kind) : kind_(kind) {}
  static Arg Int(Kind kind, int64_t v);
  static Arg Uint(Kind kind, uint64_t v);
  static Arg Float(Kind kind, double v);

  Kind kind_;
  int64_t int_ = 0;
  uint64_t uint_ = 0;  // also the buffer handle
  uint64_t offset_ = 0;
  double float_ = 0;
  std::string raw_;
  // kTensorMap: shared by copies, so that an Arg stays cheap to copy.
  std::shared_ptr<const gpuexec::TensorMap> tensor_map_;
};

}  // namespace gpuexec

#endif  // GPUEXEC_CLIENT_CPP_GPUEXEC_KERNEL_ARGS_H_
