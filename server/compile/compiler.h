#ifndef GPUEXEC_SERVER_COMPILE_COMPILER_H_
#define GPUEXEC_SERVER_COMPILE_COMPILER_H_

// The daemon's side of compiling: a compile process (compile_main.h) per
// compile, started from the daemon's own executable, given one checked
// request, waited for at most the time limit and then killed. Its answer
// becomes a status that leads with the cause and names the limit or the
// source's fault:
//   INVALID_ARGUMENT     the source does not compile (the log, cut, says
//                        where), an option or name expression NVRTC refused
//   RESOURCE_EXHAUSTED   the compile's memory or CPU limit, the module's
//                        size limit, or too many compiles at once
//   DEADLINE_EXCEEDED    the compile ran past its wall-clock limit
//   INTERNAL             the compiler crashed on the source (the daemon and
//                        other compiles go on)
//   FAILED_PRECONDITION  no NVRTC could be loaded (Start), saying what to
//                        install
// Start probes once: the compile process loads NVRTC (the first of the
// candidates that loads), confines itself and reports the version, the
// architectures and whether Landlock shuts the file system. It then starts
// the warm compile process (zygote.h), from which compile processes are
// forked; where that cannot serve they are started cold.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/compile/compile_request.h"
#include "server/compile/compile_sandbox.h"
#include "server/compile/zygote.h"

namespace gpuexec::compile {

struct CompilerOptions {
  // The daemon's own executable, started as `PROGRAM __compile ...`.
  std::string program = "/proc/self/exe";
  // NVRTC: --nvrtc's file, or DefaultNvrtcCandidates() when empty.
  std::vector<std::string> nvrtc;
  sandbox::Limits limits;
  absl::Duration time_limit = absl::Seconds(60);
  uint64_t max_log_bytes = uint64_t{64} << 10;
  uint64_t max_image_bytes = uint64_t{64} << 20;
  // Compiles at once; past it a compile is refused at once.
  int max_running = 4;
  // Where each compile's private directory is made ("": $TMPDIR, else
  // /tmp).
  std::string tmp_root;
  // How the limits are named in messages ("--compile_memory_bytes").
  std::string memory_flag = "--compile_memory_bytes";
  std::string cpu_flag = "--compile_cpu_s";
  std::string time_flag = "--compile_time_limit_s";
  std::string running_flag = "--max_compiles";
  // Fork compile processes from a warm one (zygote.h); false: start each
  // cold.
  bool warm = true;
  // A forked process serves its caller's next compiles (zygote.h).
  bool reuse = true;
  // The architecture the warm process compiles its warm-up kernel for (90
  // for sm_90; 0: NVRTC's default).
  int warm_up_arch = 0;
};

struct Compiled {
  std::string image;
  bool image_is_ptx = false;
  std::string log;                                                 // cut to max_log_bytes
  uint64_t log_bytes = 0;                                          // before the cut
  std::vector<std::pair<std::string, std::string>> lowered_names;  // expression, lowered
  absl::Duration took;
};

// A compiler's log as text for a status or a response: at most `max`
// bytes of it, each byte outside printable ASCII (but newline and tab)
// escaped as \xNN, "..." where it was cut.
std::string PrintableLog(const std::string& log, size_t max);

class Compiler {
 public:
  static absl::StatusOr<std::unique_ptr<Compiler>> Start(CompilerOptions options);

  const std::string& nvrtc_version() const { return version_; }
  const std::string& nvrtc_path() const { return path_; }
  const std::vector<int>& archs() const { return archs_; }
  int running() const { return running_.load(); }
  // How compile processes start (zygote.h): the warm one, forks and cold
  // starts.
  const CompileStarter& starter() const { return *starter_; }

  // Compiles `input` (already passed Check) for a device of compute
  // capability `cc_major`.`cc_minor`. Blocks for the compile: call it off
  // any thread that serves other work.
  // `scope`: whose compile it is (the tenant); a compile process serves
  // one scope only (zygote.h).
  absl::StatusOr<Compiled> Compile(const CompileInput& input, int cc_major, int cc_minor,
                                   const std::string& scope = "");

 private:
  explicit Compiler(CompilerOptions options) : options_(std::move(options)) {}
  struct Outcome;
  absl::StatusOr<Outcome> RunProcess(const std::string& request, const std::string& scope);

  CompilerOptions options_;
  std::string version_;
  std::string path_;
  std::vector<int> archs_;
  std::atomic<int> running_{0};
  std::unique_ptr<CompileStarter> starter_;
};

}  // namespace gpuexec::compile

#endif  // GPUEXEC_SERVER_COMPILE_COMPILER_H_
