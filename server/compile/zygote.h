#ifndef GPUEXEC_SERVER_COMPILE_ZYGOTE_H_
#define GPUEXEC_SERVER_COMPILE_ZYGOTE_H_

// Starting compile processes (compile_main.h), cold or from the warm one.
//
// A cold compile process is the daemon's program started anew: it links
// the daemon's libraries, loads NVRTC (about 109 MB for CUDA 13) and its
// builtins, then compiles; on an H100 host that start cost about 80 ms of
// a 95 ms compile. The warm compile process ("zygote") does the loading
// once: started by the daemon as `PROGRAM __compile --warm --parent=PID`,
// it loads NVRTC, compiles a built-in kernel so NVRTC's one-time set-up is
// done, and then forks one compile process per compile. Each is made with
// CLONE_PARENT, so it is the daemon's child exactly as a cold one is: the
// daemon hands it its socket, kills it past the time limit, waits for it
// and reads its CPU time and memory. It confines itself (Landlock, seccomp,
// rlimits) before it reads the source, as a cold one does.
//
// The warm process never sees a source, a header or a client's option:
// only the directory and limits of each compile, from the daemon. A fork
// shares nothing with a sibling: each is a copy of the warm process as it
// was before any source arrived.
//
// It forks only while it has a single thread (a fork of a process with
// more keeps only the calling thread, with whatever locks the others
// held): if NVRTC's warm-up leaves a thread running it is started again
// without the warm-up, and if it still has more than one the daemon starts
// every compile process cold.

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/compile/compile_sandbox.h"

namespace gpuexec::compile {

// The environment a compile process gets: nothing of the daemon's but what
// finds libraries, and the test doubles' own knobs (GXFAKE_*); TMPDIR and
// HOME are `dir`.
std::vector<std::string> CompileEnvironment(const std::string& dir);

// Starts `program` with `args` and `env`, `socket` as its fd 3 and
// /dev/null as 0 to 2, the signals a compile may get at their defaults.
absl::StatusOr<pid_t> SpawnCompileProcess(const std::string& program,
                                          const std::vector<std::string>& args,
                                          const std::vector<std::string>& env, int socket);

class Zygote {
 public:
  struct Options {
    std::string program = "/proc/self/exe";
    // The NVRTC library the daemon's probe loaded.
    std::string nvrtc;
    bool warm_up = true;
    int warm_up_arch = 0;  // 90 for sm_90; 0: NVRTC's default
    absl::Duration timeout = absl::Seconds(30);
  };

  // Starts the warm process and waits until it has loaded NVRTC. An error
  // says why it cannot serve (no NVRTC, more than one thread).
  static absl::StatusOr<std::unique_ptr<Zygote>> Start(const Options& options);
  ~Zygote();  // kills and reaps it
  Zygote(const Zygote&) = delete;
  Zygote& operator=(const Zygote&) = delete;

  // A compile process forked from it, with `socket` as its fd 3, `dir` as
  // its directory and `limits`: its pid, a child of this process. Not for
  // two threads at once. An error means the warm process is broken: drop
  // it.
  absl::StatusOr<pid_t> Fork(const std::string& dir, const sandbox::Limits& limits, int socket);

  pid_t pid() const { return pid_; }
  int threads() const { return threads_; }

 private:
  Zygote(pid_t pid, int control, absl::Duration timeout)
      : pid_(pid), control_(control), timeout_(timeout) {}
  pid_t pid_;
  int control_;
  absl::Duration timeout_;
  int threads_ = 0;
};

}  // namespace gpuexec::compile

#endif  // GPUEXEC_SERVER_COMPILE_ZYGOTE_H_
