#ifndef GPUEXEC_SERVER_COMPILE_COMPILE_REQUEST_H_
#define GPUEXEC_SERVER_COMPILE_COMPILE_REQUEST_H_

// What a client asks the daemon to compile, checked before any compiler
// sees it: CUDA C++ source, the headers it may include (a name -> content
// map given by the client: nothing of the host's is reachable), options
// from an allow-list, and name expressions for templates ("saxpy<float>"),
// answered with their lowered names.
//
// The checks are text-level and conservative. The compile process's own
// confinement (compile_sandbox.h: no file of the host readable) is what
// keeps the host's files out; the checks here refuse early, with a clear
// status, what could only be an attempt to reach them: an `#include` (or
// `__has_include`) of an absolute path or one with a ".." component, or of
// anything but a literal name (`#include MACRO`). They read the text as
// the preprocessor does for this purpose: backslash-newlines spliced,
// comments removed, string and character literals skipped.
//
// Every refusal is INVALID_ARGUMENT (or RESOURCE_EXHAUSTED for a size past
// a limit), names the field ("header 3 'util.cuh'", "option 2", "source
// line 14") and quotes at most a short, escaped prefix of what was sent.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gpuexec::compile {

struct Header {
  std::string name;  // as the source includes it: "util.cuh", "detail/math.h"
  std::string content;
};

struct CompileInput {
  std::string source;
  // The name the compile log gives the source ("saxpy.cu"); empty:
  // "kernel.cu".
  std::string source_name;
  std::vector<Header> headers;
  std::vector<std::string> options;
  // C++ expressions naming __global__ functions to instantiate
  // ("saxpy<float>", "&scale<double, 4>"); each is answered with the
  // lowered name the module's function has.
  std::vector<std::string> name_expressions;
};

struct Limits {
  size_t max_source_bytes = size_t{1} << 20;
  size_t max_headers = 64;
  size_t max_header_bytes = size_t{4} << 20;  // all headers' contents together
  size_t max_options = 64;
  size_t max_option_bytes = 256;
  size_t max_name_expressions = 64;
  size_t max_name_expression_bytes = 256;
};

// The name the compile log gives the source: source_name, or "kernel.cu".
const std::string& SourceName(const CompileInput& input);

// The name a source or header may have: 1 to 128 bytes of letters, digits
// and "_-.+/", relative (no leading '/'), no empty, "." or ".." component.
bool IsPlainName(const std::string& name);

// Checks everything above; OK or the first refusal.
absl::Status Check(const CompileInput& input, const Limits& limits);

// The options the compiler gets: the client's (checked), then
// "-arch=sm_<major><minor>" for the device the module is for. `-arch` is
// never the client's: the daemon compiles for the device it runs on.
std::vector<std::string> CompileOptions(const CompileInput& input, int cc_major, int cc_minor);

// "sm_90" for 9.0.
std::string ArchName(int cc_major, int cc_minor);

// The SHA-256 (hex) of everything that shapes the compile's output: the
// source and its name, the headers (in name order), the options and name
// expressions (in order), the compiler's version and the architecture.
// Equal keys compile to the same module.
std::string CacheKey(const CompileInput& input, const std::string& compiler_version,
                     const std::string& arch);

}  // namespace gpuexec::compile

#endif  // GPUEXEC_SERVER_COMPILE_COMPILE_REQUEST_H_
