#ifndef GPUEXEC_SERVER_COMPILE_NVRTC_H_
#define GPUEXEC_SERVER_COMPILE_NVRTC_H_

// NVRTC, opened at run time in the compile process (never in the front or a
// device worker): dlopen of the library the daemon was given (--nvrtc) or
// found, each entry point resolved by name, and one compile of a checked
// request (compile_request.h).
//
// NVRTC opens its builtins library (libnvrtc-builtins.so.MAJOR.MINOR) when
// it first compiles. Open() loads it first, from NVRTC's own directory, so
// that the compile finds it loaded once the sandbox shuts the file system.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "server/compile/compile_request.h"

namespace gpuexec::compile {

struct CompileResult {
  // 0 (NVRTC_SUCCESS) or the nvrtcResult of the call that failed.
  int result = 0;
  std::string result_name;  // "NVRTC_ERROR_COMPILATION"
  std::string failed_call;  // "nvrtcCompileProgram"
  std::string image;        // the cubin, or PTX where NVRTC made no cubin
  bool image_is_ptx = false;
  std::string log;
  std::vector<std::pair<std::string, std::string>> lowered_names;  // expression, lowered
};

class Nvrtc {
 public:
  // `path`: a file, or a name the dynamic loader looks up. The error says
  // what was tried and what to install.
  static absl::StatusOr<std::unique_ptr<Nvrtc>> Open(const std::string& path);
  ~Nvrtc();
  Nvrtc(const Nvrtc&) = delete;
  Nvrtc& operator=(const Nvrtc&) = delete;

  // "13.0"
  const std::string& version() const { return version_; }
  // Compute capabilities it compiles for, as 90 for 9.0.
  const std::vector<int>& archs() const { return archs_; }
  // The library's file and its builtins' (the sandbox lets these alone be
  // read).
  const std::vector<std::string>& files() const { return files_; }

  // Compiles `input` with `options` (the checked options, -arch included).
  CompileResult Compile(const CompileInput& input, const std::vector<std::string>& options) const;

 private:
  struct Api;
  Nvrtc() = default;
  void* handle_ = nullptr;
  void* builtins_ = nullptr;
  std::unique_ptr<Api> api_;
  std::string version_;
  std::vector<int> archs_;
  std::vector<std::string> files_;
};

// Where the daemon looks for NVRTC without --nvrtc: the names the dynamic
// loader knows (libnvrtc.so.13, .12, libnvrtc.so), then the toolkit's
// usual places.
std::vector<std::string> DefaultNvrtcCandidates();

}  // namespace gpuexec::compile

#endif  // GPUEXEC_SERVER_COMPILE_NVRTC_H_
