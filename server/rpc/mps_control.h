#ifndef GPUEXEC_SERVER_RPC_MPS_CONTROL_H_
#define GPUEXEC_SERVER_RPC_MPS_CONTROL_H_

// The daemon's own MPS control daemon (gpuexecd --mps=own): NVIDIA's
// nvidia-cuda-mps-control run in the foreground as the daemon's child, its
// pipe and log directories private to the daemon (a fresh directory of
// mode 0700), started before the first worker and stopped after the last
// (a "quit" through its pipe; SIGKILL if it has not gone within 10 s).
// Its workers reach it through CUDA_MPS_PIPE_DIRECTORY in their
// environment; nothing else on the host shares it.

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gpuexec::rpc {

class MpsControl {
 public:
  // Runs `program` (a path, or a name looked up on PATH) with -f, its
  // directories in a new one under `parent` (empty: $TMPDIR or /tmp), and
  // waits up to `timeout` for its control pipe. Fails naming the program
  // and what it said (its log's last lines) if it exits or never serves.
  static absl::StatusOr<std::unique_ptr<MpsControl>> Start(
      const std::string& program, const std::string& parent = "",
      absl::Duration timeout = absl::Seconds(10));
  ~MpsControl();
  MpsControl(const MpsControl&) = delete;
  MpsControl& operator=(const MpsControl&) = delete;

  const std::string& pipe_directory() const { return pipes_; }
  const std::string& log_directory() const { return logs_; }
  pid_t pid() const { return pid_; }
  // Whether it still serves (its process lives and its control pipe is
  // there); logs once when it ended.
  bool Serving() const;

 private:
  MpsControl(std::string program, std::string root, pid_t pid);
  // Runs the program once with `line` on its stdin (a command to the one
  // serving), waiting up to `timeout`.
  absl::Status Command(const std::string& line, absl::Duration timeout) const;

  std::string program_;
  std::string root_;
  std::string pipes_;
  std::string logs_;
  pid_t pid_ = -1;
  mutable absl::Mutex mu_;
  mutable bool ended_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace gpuexec::rpc

#endif  // GPUEXEC_SERVER_RPC_MPS_CONTROL_H_
