#ifndef GPUEXEC_CLIENT_CPP_CLI_ARGS_H_
#define GPUEXEC_CLIENT_CPP_CLI_ARGS_H_

// The command line's typed kernel arguments, sizes and dimensions: parsing
// only (no files are read here, no daemon is called).
//
//   f32:2.5  i32:-1  u64:0x10  f16:1.0  bf16:0.5     scalars
//   bytes:00ff10ab  bytes:@struct.bin                 by-value bytes
//   null                                              a null pointer
//   in:x.bin  zeros:4M  fill:f32:1.0:1M               buffers
//   out:4M:y.bin  inout:y.bin[:y2.bin]                buffers saved after the run
//   out:4M:-                                          ... to stdout
//   BUFFER,offset=256  BUFFER,save=FILE               modifiers of any buffer
//   desc:1000x512:BUFFER[,strides=512x1][,padding=nan]
//                                                     a Triton host tensor descriptor
//                                                     over BUFFER (--triton only)
//
// A descriptor's shape and strides (in elements) run outermost first,
// separated by 'x'; the strides default to the contiguous ones, padding to
// zero; its block and element type come from the kernel's metadata. Its
// buffer takes any buffer spec and modifier (offset= is the byte offset of
// the tensor's first element).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gpuexec/client.h"

namespace gpuexec::cli {

// "4096", "0x1000", "4K" / "4KiB", "16M" / "16MiB", "1G" / "1GiB" (powers of
// 1024; a trailing "B" is allowed: "4KB", "512B").
absl::StatusOr<uint64_t> ParseSize(absl::string_view text);

// "X", "X,Y" or "X,Y,Z"; missing dimensions are 1. Each at least 1.
absl::StatusOr<Dim3> ParseDim3(absl::string_view text);

enum class ScalarType { kI8, kI16, kI32, kI64, kU8, kU16, kU32, kU64, kF16, kBF16, kF32, kF64 };

// "i8" ... "f64"; false if `name` is none of them.
bool ParseScalarType(absl::string_view name, ScalarType* type);
uint64_t ScalarSize(ScalarType type);

// A scalar value parsed as `type`: its little-endian bytes as the kernel
// sees them (f16 and bf16 rounded to nearest even) and the client Arg.
struct Scalar {
  ScalarType type = ScalarType::kI32;
  std::string bytes;
  Arg arg = Arg::Null();
};
// Integers in decimal or 0x hex, range-checked for the type; floats as
// strtod reads them ("1e-3", "inf", "nan").
absl::StatusOr<Scalar> ParseScalar(ScalarType type, absl::string_view value);

// "default", "spread" or "load_balancing".
absl::StatusOr<ClusterSchedulingPolicy> ParseClusterPolicy(absl::string_view text);

// A duration flag's value: "30s", "500ms", "2m", "1h30m", or a number of
// seconds ("2.5"); more than zero. INVALID_ARGUMENT "'X' is not a duration
// (30s, 500ms, 2m)".
absl::StatusOr<absl::Duration> ParseDurationFlag(absl::string_view text);

// A boolean flag's value: "" (the flag alone), "true", "false", "1", "0".
absl::StatusOr<bool> ParseFlagBool(absl::string_view text);

// One kernel argument as given on the command line.
struct ArgSpec {
  // kDescriptor: a buffer (the buffer fields below) and the descriptor's.
  enum class Kind { kScalar, kBytes, kNull, kBuffer, kDescriptor };
  // How a buffer's contents start.
  enum class Init { kZeros, kFile, kFill };

  std::string text;  // as given
  Kind kind = Kind::kNull;

  // kScalar.
  Scalar scalar;
  // kBytes: the bytes, or the file to read them from.
  std::string bytes;
  std::string bytes_file;

  // kBuffer, kDescriptor.
  Init init = Init::kZeros;
  uint64_t buffer_bytes = 0;  // kZeros, kFill (kFile: the file's size)
  std::string in_file;        // kFile
  std::string fill_element;   // kFill: one element's bytes
  uint64_t offset = 0;        // the kernel gets the buffer's address + offset
  std::string save_file;      // written with the buffer's bytes after the run

  // kDescriptor, outermost first; no strides: contiguous.
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  bool padding_nan = false;

  bool is_buffer() const { return kind == Kind::kBuffer || kind == Kind::kDescriptor; }
  // Bytes of the parameter this argument fills, once known (bytes from a
  // file: after reading it); a descriptor: its tensor map's 128.
  uint64_t param_bytes() const;
  // The bytes of each parameter it fills: param_bytes(), or a descriptor's
  // tensor map (128), then 4 per dimension (its shape), then 8 per
  // dimension (its strides).
  std::vector<uint64_t> param_sizes() const;
};

absl::StatusOr<ArgSpec> ParseArg(absl::string_view text);

// --print=TYPE[:N]: the first `count` elements of each buffer saved, read
// as `type`.
struct PrintSpec {
  ScalarType type = ScalarType::kU8;
  uint64_t count = 8;
};
// "f32", "u32:16"; N at least 1 and at most 2^20.
absl::StatusOr<PrintSpec> ParsePrint(absl::string_view text);
const char* ScalarTypeName(ScalarType type);

}  // namespace gpuexec::cli

#endif  // GPUEXEC_CLIENT_CPP_CLI_ARGS_H_
