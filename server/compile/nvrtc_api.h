#ifndef GPUEXEC_SERVER_COMPILE_NVRTC_API_H_
#define GPUEXEC_SERVER_COMPILE_NVRTC_API_H_

// The part of NVRTC (the CUDA runtime compilation library) that gpuexec
// uses, declared by the project itself so that the build needs no CUDA
// toolkit: the result codes, the program handle and one function-pointer
// type per entry point (PFN_<name>). Nothing here declares a function:
// libnvrtc is only ever reached through dlsym, in the compile process.
//
// The names, values and signatures are NVRTC's ABI (CUDA 12 and 13, 64-bit
// Linux; the entry points are unversioned C symbols). The enum lists only
// the codes gpuexec names; NVRTC may return others.
// tests/unit/nvrtc_api_test.cc checks every declaration here against a
// toolkit's nvrtc.h where one is found at configure time.
//
// Only server/compile and the NVRTC double (tests/fake_nvrtc) include this
// header (scripts/check_layering.py).

#include <cstddef>

#ifdef GPUEXEC_NVRTC_API_NAMESPACE
namespace GPUEXEC_NVRTC_API_NAMESPACE {
#endif

enum nvrtcResult {
  NVRTC_SUCCESS = 0,
  NVRTC_ERROR_OUT_OF_MEMORY = 1,
  NVRTC_ERROR_PROGRAM_CREATION_FAILURE = 2,
  NVRTC_ERROR_INVALID_INPUT = 3,
  NVRTC_ERROR_INVALID_PROGRAM = 4,
  NVRTC_ERROR_INVALID_OPTION = 5,
  NVRTC_ERROR_COMPILATION = 6,
  NVRTC_ERROR_BUILTIN_OPERATION_FAILURE = 7,
  NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION = 8,
  NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION = 9,
  NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID = 10,
  NVRTC_ERROR_INTERNAL_ERROR = 11,
};

// An opaque program; only pointers cross the ABI.
struct _nvrtcProgram;  // NOLINT(bugprone-reserved-identifier): NVRTC's name
using nvrtcProgram = _nvrtcProgram*;

using PFN_nvrtcGetErrorString = const char* (*)(nvrtcResult result);
using PFN_nvrtcVersion = nvrtcResult (*)(int* major, int* minor);
using PFN_nvrtcGetNumSupportedArchs = nvrtcResult (*)(int* num_archs);
using PFN_nvrtcGetSupportedArchs = nvrtcResult (*)(int* supported_archs);
using PFN_nvrtcCreateProgram = nvrtcResult (*)(nvrtcProgram* prog, const char* src,
                                               const char* name, int num_headers,
                                               const char* const* headers,
                                               const char* const* include_names);
using PFN_nvrtcDestroyProgram = nvrtcResult (*)(nvrtcProgram* prog);
using PFN_nvrtcCompileProgram = nvrtcResult (*)(nvrtcProgram prog, int num_options,
                                                const char* const* options);
using PFN_nvrtcGetPTXSize = nvrtcResult (*)(nvrtcProgram prog, size_t* ptx_size);
using PFN_nvrtcGetPTX = nvrtcResult (*)(nvrtcProgram prog, char* ptx);
using PFN_nvrtcGetCUBINSize = nvrtcResult (*)(nvrtcProgram prog, size_t* cubin_size);
using PFN_nvrtcGetCUBIN = nvrtcResult (*)(nvrtcProgram prog, char* cubin);
using PFN_nvrtcGetProgramLogSize = nvrtcResult (*)(nvrtcProgram prog, size_t* log_size);
using PFN_nvrtcGetProgramLog = nvrtcResult (*)(nvrtcProgram prog, char* log);
using PFN_nvrtcAddNameExpression = nvrtcResult (*)(nvrtcProgram prog,
                                                   const char* const name_expression);
using PFN_nvrtcGetLoweredName = nvrtcResult (*)(nvrtcProgram prog,
                                                const char* const name_expression,
                                                const char** lowered_name);

// Every entry point the compile process resolves: X(name).
#define GPUEXEC_NVRTC_ENTRY_POINTS(X) \
  X(nvrtcGetErrorString)              \
  X(nvrtcVersion)                     \
  X(nvrtcGetNumSupportedArchs)        \
  X(nvrtcGetSupportedArchs)           \
  X(nvrtcCreateProgram)               \
  X(nvrtcDestroyProgram)              \
  X(nvrtcCompileProgram)              \
  X(nvrtcGetPTXSize)                  \
  X(nvrtcGetPTX)                      \
  X(nvrtcGetCUBINSize)                \
  X(nvrtcGetCUBIN)                    \
  X(nvrtcGetProgramLogSize)           \
  X(nvrtcGetProgramLog)               \
  X(nvrtcAddNameExpression)           \
  X(nvrtcGetLoweredName)

#ifdef GPUEXEC_NVRTC_API_NAMESPACE
}  // namespace GPUEXEC_NVRTC_API_NAMESPACE
#endif

#endif  // GPUEXEC_SERVER_COMPILE_NVRTC_API_H_
