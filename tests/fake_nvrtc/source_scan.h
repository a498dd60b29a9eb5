#ifndef GPUEXEC_TESTS_FAKE_NVRTC_SOURCE_SCAN_H_
#define GPUEXEC_TESTS_FAKE_NVRTC_SOURCE_SCAN_H_

// How the NVRTC double reads CUDA C++ source: a small preprocessor (the
// program's own headers only, #define/#undef, #if/#ifdef/#ifndef/#elif/
// #else/#endif, #error, #pragma once) and a scanner that finds the kernels
// (`__global__ void NAME(PARAMS)`, extern "C" or C++, templates included)
// and reads each parameter's type. Everything it says about the source goes
// into a Diagnostics in the words and layout of NVRTC's own log.
//
// The source is untrusted (the daemon's compile process runs the double on
// client text): every loop is bounded by the input or by a stated limit
// (kMaxIncludeDepth, kMaxExpandedBytes, kMaxKernels, kMaxParams), and no
// function recurses without a depth bound. Pure functions, no global state.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace gxnvrtc {

constexpr int kMaxIncludeDepth = 32;
constexpr size_t kMaxExpandedBytes = size_t{8} << 20;  // after #include
constexpr size_t kMaxKernels = 4096;                   // as image_reader reads
constexpr size_t kMaxParams = 4096;
constexpr size_t kMaxParamBytes = 32764;  // NVRTC's limit since CUDA 12.1

// The scalar types the double lays out (and __half, __nv_bfloat16, which
// the real compiler knows only from cuda_fp16.h / cuda_bf16.h).
enum class Builtin : uint8_t {
  kVoid,
  kBool,
  kChar,
  kSChar,
  kUChar,
  kShort,
  kUShort,
  kInt,
  kUInt,
  kLong,
  kULong,
  kLongLong,
  kULongLong,
  kFloat,
  kDouble,
  kHalf,
  kBFloat16,
};

// A parameter's or template argument's type: an innermost type (a builtin,
// or template parameter `template_index`) under zero or more pointers.
// const_levels[0] is the innermost type's const, const_levels[k] that of
// the k-th pointer; the last entry is the top-level const, which the
// mangling drops. volatile and __restrict__ are read and ignored.
struct TypeRef {
  Builtin builtin = Builtin::kInt;
  int template_index = -1;
  std::vector<bool> const_levels = {false};
  size_t pointers() const { return const_levels.size() - 1; }
};

// Bytes (and alignment) of a parameter of type `t`; its PTX type, or
// nullptr for a 2-byte class (__half), which PTX passes as `.b8 [2]`.
size_t TypeBytes(const TypeRef& t);
const char* PtxType(const TypeRef& t);

// A __global__ function definition (declarations alone are not kernels).
struct KernelDecl {
  std::string name;
  bool extern_c = false;
  std::vector<std::string> template_params;  // empty: not a template
  std::vector<TypeRef> params;
  bool is_template() const { return !template_params.empty(); }
};

// NVRTC's log: "file(line): error: message", the source line and a caret,
// a blank line; a summary at the end. Lines echoed and names quoted are cut
// and their non-printable bytes escaped.
class Diagnostics {
 public:
  struct Where {
    std::string file;
    int line = 0;
    std::string text;  // the source line
    size_t column = 0;
  };
  void Error(const Where& at, const std::string& message);
  // A catastrophic error ends the compilation (see Log()).
  void Catastrophic(const Where& at, const std::string& message);
  // "warning #<number>: <message>" (number as NVRTC numbers it: "177-D").
  void Warning(const Where& at, const std::string& number, const std::string& message);
  // A line with no location ("__nv_name_map(2): error: ...").
  void ErrorLine(const std::string& line);
  int errors() const { return errors_; }
  bool catastrophic() const { return catastrophic_; }
  // The whole log, the summary included (`program` names the program).
  std::string Log(const std::string& program) const;

 private:
  void Add(const Where& at, const std::string& kind, const std::string& message);
  std::string text_;
  int errors_ = 0;
  bool catastrophic_ = false;
  bool warned_ = false;
};

// `text` cut to `limit` bytes with non-printable bytes written as \xNN.
std::string Printable(const std::string& text, size_t limit);

struct ScanInput {
  std::string program;  // the program's name, as the log names it
  const std::string* source = nullptr;
  const std::vector<std::pair<std::string, std::string>>* headers = nullptr;  // name, text
  std::map<std::string, std::string> defines;  // predefined and -D (name -> value)
  bool have_include_paths = false;             // -I given: changes one message
};

// Preprocesses and scans `in`; kernels in source order. Problems go to
// `diag`; on a catastrophic error the scan stops there.
std::vector<KernelDecl> ScanSource(const ScanInput& in, Diagnostics* diag);

// Parses a type ("float", "const unsigned int*") from a name expression's
// template argument list; false when the double cannot read it, with
// `bad` set to the first token it did not know.
bool ParseTypeText(const std::string& text, TypeRef* out, std::string* bad);

}  // namespace gxnvrtc

#endif  // GPUEXEC_TESTS_FAKE_NVRTC_SOURCE_SCAN_H_
