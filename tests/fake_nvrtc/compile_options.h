#ifndef GPUEXEC_TESTS_FAKE_NVRTC_COMPILE_OPTIONS_H_
#define GPUEXEC_TESTS_FAKE_NVRTC_COMPILE_OPTIONS_H_

// nvrtcCompileProgram's options as the NVRTC double reads them. Accepted
// (an option's value in the same string after '=', or in the next string):
//   -arch / --gpu-architecture  sm_XY or compute_XY (optionally with an 'a'
//                               or 'f' suffix), XY among kSupportedArchs;
//                               default compute_75, as NVRTC's
//   -std / --std                c++03, c++11, c++14, c++17, c++20
//   -D / --define-macro         NAME or NAME=VALUE (also "-DNAME")
//   -U / --undefine-macro       NAME
//   -I / --include-path         a directory (the double reads no files)
//   --maxrregcount / -maxrregcount  an integer: what the cubin says of
//                               registers per thread when below 32
//   --use_fast_math -use_fast_math -lineinfo --generate-line-info
//   -default-device --device-debug -G   accepted, no effect
// Anything else is refused as NVRTC refuses it, with the same log line.

#include <string>
#include <utility>
#include <vector>

#include "server/compile/nvrtc_api.h"

namespace gxnvrtc {

// CUDA 13.0's NVRTC, as nvrtcGetSupportedArchs reports it.
inline constexpr int kSupportedArchs[] = {75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121};

struct CompileOptions {
  int arch = 75;
  bool real_arch = false;  // sm_XY: a cubin too; compute_XY: PTX only
  int max_registers = 0;   // 0: not given
  bool have_include_paths = false;
  // -D and -U in order: (name, value) to define, (name, nullopt-like "\x01") to undefine.
  std::vector<std::pair<std::string, std::string>> macros;
};

constexpr char kUndefine[] = "\x01";

// Parses `options`; on a refused option returns its result code and sets
// `log` to NVRTC's words for it (log ends with a newline).
nvrtcResult ParseCompileOptions(int count, const char* const* options, const std::string& program,
                                CompileOptions* out, std::string* log);

}  // namespace gxnvrtc

#endif  // GPUEXEC_TESTS_FAKE_NVRTC_COMPILE_OPTIONS_H_
