#ifndef GPUEXEC_CLIENT_CPP_INTERNAL_SESSION_COMMANDS_H_
#define GPUEXEC_CLIENT_CPP_INTERNAL_SESSION_COMMANDS_H_

// A session's commands on its command ring where the daemon serves one,
// and on the Execute stream otherwise: the ring is registered at the
// session's first command; a registration the daemon refuses, a command
// the ring has no record for (ring_encode.h), and a ring the daemon
// closed all go to the stream, each told once to ClientOptions::on_debug.
// Whichever carries a command, it starts after the session's earlier ones:
// a switch between the two first waits for the other's to have started.

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "internal/command_ring.h"
#include "internal/command_stream.h"
#include "internal/commands.h"

namespace gpuexec {
namespace internal {

class SessionCommands final : public Commands {
 public:
  // `open_ring` registers the session's ring (called once, at the first
  // command); `debug` is told one line where the ring is not used.
  SessionCommands(std::unique_ptr<CommandStream> stream,
                  std::function<absl::StatusOr<std::unique_ptr<CommandRing>>()> open_ring,
                  std::function<void(const std::string&)> debug)
      : stream_(std::move(stream)), open_ring_(std::move(open_ring)), debug_(std::move(debug)) {}

  absl::StatusOr<v1::CommandResult> Submit(v1::Command command, bool wait, absl::Duration timeout,
                                           bool report_deferred) override;
  absl::Status Order(absl::Duration timeout) override;
  void Shutdown() override;

 private:
  // The ring to post on, registered at the first call; null where the
  // stream carries everything. A ring found broken is dropped here, with
  // what it had not reported kept for the next waiting call.
  std::shared_ptr<CommandRing> Ring();
  void Debug(const std::string& line);

  std::unique_ptr<CommandStream> stream_;
  std::function<absl::StatusOr<std::unique_ptr<CommandRing>>()> open_ring_;
  std::function<void(const std::string&)> debug_;
  absl::Mutex mu_;
  bool tried_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<CommandRing> ring_ ABSL_GUARDED_BY(mu_);
  // Commands went on the stream since the ring last carried one (the
  // ring's next waits for them to start), and the other way round.
  bool stream_since_ring_ ABSL_GUARDED_BY(mu_) = false;
  bool ring_since_stream_ ABSL_GUARDED_BY(mu_) = false;
  // A dropped ring's unreported failure.
  absl::Status deferred_ ABSL_GUARDED_BY(mu_);
};

}  // namespace internal
}  // namespace gpuexec

#endif  // GPUEXEC_CLIENT_CPP_INTERNAL_SESSION_COMMANDS_H_
