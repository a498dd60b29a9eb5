#ifndef GPUEXEC_CLIENT_CPP_INTERNAL_COMMANDS_H_
#define GPUEXEC_CLIENT_CPP_INTERNAL_COMMANDS_H_

// What carries a session's commands (launches, synchronizes, allocations,
// frees, copies in stream order) to the daemon: the Execute stream
// (command_stream.h), or a command ring where the daemon serves one and
// the stream for what the ring does not carry (session_commands.h).

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gpuexec/v1/gpuexec.pb.h"

namespace gpuexec {
namespace internal {

class Commands {
 public:
  virtual ~Commands() = default;
  // Queues `command` and sends it. With `wait`, returns its result once it
  // comes, or DEADLINE_EXCEEDED after `timeout`; without, returns once
  // queued, and a failure is reported later, by a waiting call made with
  // `report_deferred` (launches and synchronizes, as CUDA reports
  // asynchronous errors).
  virtual absl::StatusOr<v1::CommandResult> Submit(v1::Command command, bool wait,
                                                   absl::Duration timeout,
                                                   bool report_deferred) = 0;
  // Makes calls outside the commands (Write, Read, ...) run after the
  // commands queued so far have started.
  virtual absl::Status Order(absl::Duration timeout) = 0;
  // Ends it; commands still queued are dropped.
  virtual void Shutdown() = 0;
};

}  // namespace internal
}  // namespace gpuexec

#endif  // GPUEXEC_CLIENT_CPP_INTERNAL_COMMANDS_H_
