#include "internal/session_commands.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "internal/status_macros_internal.h"

namespace gpuexec {
namespace internal {

void SessionCommands::Debug(const std::string& line) {
  if (debug_) debug_(line);
}

std::shared_ptr<CommandRing> SessionCommands::Ring() {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return nullptr;
  if (!tried_) {
    tried_ = true;
    if (open_ring_) {
      auto ring = open_ring_();
      if (ring.ok()) {
        ring_ = std::move(ring).value();
        Debug(absl::StrCat("command ring: ring ", ring_->number(),
                           " carries this session's commands"));
      } else {
        Debug(
            absl::StrCat("command ring: ", ring.status().message(), "; using the Execute stream"));
      }
    }
  }
  if (ring_ != nullptr) {
    if (absl::Status why = ring_->broken(); !why.ok()) {
      if (absl::Status d = ring_->TakeDeferred(); !d.ok() && deferred_.ok()) deferred_ = d;
      Debug(absl::StrCat("command ring: ", why.message(), "; using the Execute stream"));
      ring_.reset();
    }
  }
  return ring_;
}

absl::StatusOr<v1::CommandResult> SessionCommands::Submit(v1::Command command, bool wait,
                                                          absl::Duration timeout,
                                                          bool report_deferred) {
  std::shared_ptr<CommandRing> ring = Ring();
  if (ring != nullptr) {
    bool order_stream = false;
    {
      absl::MutexLock lock(&mu_);
      order_stream = std::exchange(stream_since_ring_, false);
    }
    if (order_stream) GPUEXEC_CLIENT_RETURN_IF_ERROR(stream_->Order(timeout));
    bool not_carried = false;
    absl::StatusOr<v1::CommandResult> r =
        ring->Submit(command, wait, timeout, report_deferred, &not_carried);
    if (!not_carried) {
      {
        absl::MutexLock lock(&mu_);
        ring_since_stream_ = true;
      }
      // A ring that broke under this command: the next goes on the stream,
      // and this one's answer names why.
      if (!r.ok() && !ring->broken().ok()) Ring();
      return r;
    }
    // No record for it: on the stream, after the ring's earlier commands
    // started.
    GPUEXEC_CLIENT_RETURN_IF_ERROR(ring->Order(timeout));
  }
  absl::Status deferred;
  {
    absl::MutexLock lock(&mu_);
    ring_since_stream_ = false;
    stream_since_ring_ = true;
    if (report_deferred && wait) deferred = std::exchange(deferred_, absl::OkStatus());
  }
  if (ring != nullptr && report_deferred && wait && deferred.ok()) deferred = ring->TakeDeferred();
  absl::StatusOr<v1::CommandResult> r =
      stream_->Submit(std::move(command), wait, timeout, report_deferred);
  if (!deferred.ok() && r.ok()) return deferred;
  return r;
}

absl::Status SessionCommands::Order(absl::Duration timeout) {
  std::shared_ptr<CommandRing> ring;
  {
    absl::MutexLock lock(&mu_);
    ring = ring_;
  }
  if (ring != nullptr) {
    absl::Status st = ring->Order(timeout);
    // A ring that broke has nothing more to start; the stream is next.
    if (!st.ok() && ring->broken().ok()) return st;
  }
  return stream_->Order(timeout);
}

void SessionCommands::Shutdown() {
  std::shared_ptr<CommandRing> ring;
  {
    absl::MutexLock lock(&mu_);
    shut_down_ = true;
    ring = ring_;
  }
  if (ring != nullptr) ring->Shutdown();
  stream_->Shutdown();
}

}  // namespace internal
}  // namespace gpuexec
