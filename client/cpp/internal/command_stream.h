#ifndef GPUEXEC_CLIENT_CPP_INTERNAL_COMMAND_STREAM_H_
#define GPUEXEC_CLIENT_CPP_INTERNAL_COMMAND_STREAM_H_

// The Execute stream: launches and synchronizes of a session, many in
// flight on one call, with its sender and watchdog; and what a session's
// objects share.

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gpuexec/client.h"
#include "gpuexec/grpc_status.h"
#include "gpuexec/sha256.h"
#include "gpuexec/v1/gpuexec.grpc.pb.h"
#include "gpuexec/wire.h"
#include "internal/blocking_stream.h"
#include "internal/channel_internal.h"
#include "internal/client_state.h"
#include "internal/commands.h"
#include "internal/host_memory.h"
#include "internal/status_macros_internal.h"

namespace gpuexec {
namespace internal {

// The session's command stream (the Execute RPC), opened on first use.
// A caller that waits for an answer writes its command itself when the
// stream is idle, then reads the stream itself when no one else is reading
// and hands other callers their answers. Commands queued without waiting
// (LaunchAsync) go to a sender thread, started by the first of them, so
// that everything queued while a message is on the wire goes out together
// in the next one.
class CommandStream final : public Commands {
 public:
  // `daemon` (its target; may be empty) names the daemon in the errors of
  // a stream that ended.
  CommandStream(v1::GpuExec::Stub* stub, std::string token, absl::Duration spin_wait,
                std::string daemon = "")
      : stub_(stub), token_(std::move(token)), daemon_(std::move(daemon)), spin_wait_(spin_wait) {}
  ~CommandStream() override {
    Shutdown();
    if (watchdog_.joinable()) watchdog_.join();
    if (sender_.joinable()) sender_.join();
  }

  // Queues `command` and sends it. With `wait`, returns its result once it
  // comes, or DEADLINE_EXCEEDED after `timeout`: a gRPC stream cannot time
  // out one read, so the stream is reset then (work the daemon had received
  // goes on; the next command opens a new stream). Without `wait`, returns
  // once queued; its failure is reported later, by a waiting call made with
  // `report_deferred` (launches and synchronizes, as CUDA reports
  // asynchronous errors).
  absl::StatusOr<v1::CommandResult> Submit(v1::Command command, bool wait, absl::Duration timeout,
                                           bool report_deferred) override {
    absl::MutexLock lock(&mu_);
    if (!wait) {
      // A bounded queue: a caller that outruns the wire waits for it.
      mu_.Await(absl::Condition(
          +[](CommandStream* c) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return c->pending_.commands_size() < kMaxQueued || !c->broken_.ok() || c->shut_down_;
          },
          this));
    }
    if (spent_dirty_) {
      // The commands last sent are freed here, by the thread that made
      // them (freed by the sender thread, each would go back to this
      // thread's malloc arena under its lock: a profile of LaunchAsync put
      // most of its time in malloc and free). Their objects are reused.
      spent_.Clear();
      spent_dirty_ = false;
    }
    GPUEXEC_CLIENT_RETURN_IF_ERROR(OpenLocked());
    if (!broken_.ok()) return broken_;
    const uint64_t id = next_id_++;
    command.set_id(id);
    if (!wait) {
      last_unwaited_ = id;
      *pending_.add_commands() = std::move(command);
      StartSenderLocked();
      if (!writing_) send_cv_.Signal();
      return v1::CommandResult();
    }
    command.set_reply(true);
    awaited_.insert(id);
    *pending_.add_commands() = std::move(command);
    if (timeout != absl::InfiniteDuration()) WatchLocked(absl::Now() + timeout, id);
    if (last_unwaited_ > ordered_through_ && sender_.joinable()) {
      // The daemon may have stopped reading until the answers to earlier
      // commands are read: let the sender write while this caller reads.
      if (!writing_) send_cv_.Signal();
    } else {
      FlushLocked();
    }
    absl::StatusOr<v1::CommandResult> result = AwaitLocked(id);
    UnwatchLocked(id);
    if (timed_out_.erase(id) != 0) {
      return absl::DeadlineExceededError(absl::StrCat(
          "gpuexec client: no answer from the daemon within ", absl::FormatDuration(timeout),
          "; the session's command stream was reset (work the daemon had received goes on)"));
    }
    if (report_deferred && !deferred_.ok()) return std::exchange(deferred_, absl::OkStatus());
    return result;
  }

  // Makes calls outside the stream (Write, Read, ...) run after the commands
  // queued so far: a barrier round trip when some were queued without
  // waiting and are not known to have started.
  absl::Status Order(absl::Duration timeout) override {
    {
      absl::MutexLock lock(&mu_);
      if (rw_ == nullptr || last_unwaited_ <= ordered_through_) return absl::OkStatus();
    }
    return Submit(v1::Command(), /*wait=*/true, timeout, /*report_deferred=*/false).status();
  }

  // Ends the stream; commands still queued are dropped.
  void Shutdown() override {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    watch_cv_.SignalAll();
    send_cv_.SignalAll();
    if (broken_.ok())
      broken_ = absl::FailedPreconditionError("gpuexec client: the session is closed");
    if (rw_ == nullptr) return;
    context_->TryCancel();
    mu_.Await(absl::Condition(
        +[](CommandStream* s)
             ABSL_NO_THREAD_SAFETY_ANALYSIS { return !s->writing_ && !s->reading_; },
        this));
    if (!finished_) rw_->Finish().ok();
    rw_.reset();
  }

 private:
  // Commands queued without waiting, at most (also bounds a message: a
  // launch's parameters are at most 32 KiB).
  static constexpr int kMaxQueued = 1024;

  absl::Status OpenLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (shut_down_) return broken_;
    if (rw_ != nullptr && !broken_.ok() && !writing_ && !reading_ && awaited_.empty()) {
      // A broken stream is replaced once no one uses it any more. What it
      // still held is dropped; BreakLocked recorded the loss.
      if (!finished_) rw_->Finish().ok();
      rw_.reset();
      results_.clear();
      pending_.Clear();
      last_unwaited_ = ordered_through_ = 0;
      broken_ = absl::OkStatus();
    }
    if (rw_ != nullptr) return absl::OkStatus();
    context_ = std::make_unique<grpc::ClientContext>();
    finished_ = false;
    rw_ = Stream::Open(
        [this](grpc::ClientContext* context, grpc::CompletionQueue* cq) {
          return stub_->PrepareAsyncExecute(context, cq);
        },
        context_.get(), spin_wait_);
    if (rw_ == nullptr) {
      return absl::UnavailableError("gpuexec client: cannot open the command stream");
    }
    pending_.set_session(token_);
    return absl::OkStatus();
  }

  void FlushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (!writing_ && broken_.ok() && pending_.commands_size() > 0) {
      v1::ExecuteRequest message;
      message.Swap(&pending_);
      // The next commands go into the objects of commands sent before.
      if (!spent_dirty_) pending_.Swap(&spent_);
      writing_ = true;
      // rw_ stays while writing_ is set (it is reset only when neither a
      // write nor a read is under way).
      Stream* const rw = rw_.get();
      mu_.Unlock();
      const bool ok = rw->Write(message);
      mu_.Lock();
      writing_ = false;
      if (!spent_dirty_) {
        spent_.Swap(&message);
        spent_dirty_ = true;
      }
      if (!ok) {
        BreakLocked(
            absl::UnavailableError("gpuexec client: the session's command stream ended (the daemon "
                                   "went away or ended it)"));
      }
    }
  }

  void StartSenderLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (sender_.joinable()) return;
    sender_ = std::thread([this] {
      absl::MutexLock lock(&mu_);
      while (!shut_down_) {
        if (!writing_ && broken_.ok() && pending_.commands_size() > 0) {
          FlushLocked();
        } else if (spent_dirty_) {
          // Commands sent and left for a caller to clear: after a burst
          // with nothing queued since, they are freed here instead of
          // being kept (up to kMaxQueued launches with their parameters).
          if (send_cv_.WaitWithTimeout(&mu_, absl::Milliseconds(50)) && spent_dirty_ &&
              pending_.commands_size() == 0) {
            v1::ExecuteRequest().Swap(&spent_);
            spent_dirty_ = false;
          }
        } else {
          send_cv_.Wait(&mu_);
        }
      }
    });
  }

  absl::StatusOr<v1::CommandResult> AwaitLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (;;) {
      auto it = results_.find(id);
      if (it != results_.end()) {
        v1::CommandResult r = std::move(it->second);
        results_.erase(it);
        awaited_.erase(id);
        // The daemon runs commands in order: all before this one started.
        ordered_through_ = std::max(ordered_through_, id);
        if (r.code() != 0) {
          return absl::Status(static_cast<absl::StatusCode>(r.code()), r.message());
        }
        return r;
      }
      if (!broken_.ok()) {
        awaited_.erase(id);
        return broken_;
      }
      if (reading_) {
        struct Waiting {
          CommandStream* stream;
          uint64_t id;
        } waiting{this, id};
        mu_.Await(absl::Condition(
            +[](Waiting* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
              return !w->stream->reading_ || w->stream->results_.contains(w->id) ||
                     !w->stream->broken_.ok();
            },
            &waiting));
        continue;
      }
      reading_ = true;
      v1::ExecuteResponse response;
      Stream* const rw = rw_.get();  // stays while reading_ is set
      mu_.Unlock();
      const bool ok = rw->Read(&response);
      mu_.Lock();
      reading_ = false;
      if (!ok) {
        // The daemon ended the stream; its status says why (an unknown or
        // expired session, say) once no write is under way.
        absl::Status why = absl::UnavailableError(
            "gpuexec client: the session's command stream ended (the daemon went away or ended "
            "it)");
        if (!writing_ && !finished_) {
          finished_ = true;
          absl::Status st = FromGrpcStatus(rw_->Finish());
          if (!st.ok()) why = st;
        }
        BreakLocked(why);
        continue;
      }
      for (v1::CommandResult& r : *response.mutable_results()) {
        if (awaited_.contains(r.id())) {
          const uint64_t rid = r.id();
          results_[rid] = std::move(r);
        } else if (r.code() != 0 && deferred_.ok()) {
          deferred_ = absl::Status(static_cast<absl::StatusCode>(r.code()), r.message());
        }
      }
    }
  }

  void BreakLocked(absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!broken_.ok()) return;
    why = NameDaemon(daemon_, why);
    broken_ = why;
    if (last_unwaited_ > ordered_through_ && deferred_.ok()) {
      deferred_ = absl::AbortedError(absl::StrCat(
          "gpuexec client: launches queued without waiting may not have run: ", why.message()));
    }
  }

  // Cancels the stream at `deadline` if command `id` is still unanswered
  // then (one watchdog thread per stream, started by the first timed wait).
  void WatchLocked(absl::Time deadline, uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // The watchdog sleeps until the earliest deadline: wake it only for an
    // earlier one (with one timeout for all calls, almost never), which
    // keeps its wake-up and its turn at the lock off each call's path.
    const bool earliest = std::none_of(watches_.begin(), watches_.end(),
                                       [deadline](const auto& w) { return w.first <= deadline; });
    watches_.push_back({deadline, id});
    if (earliest) watch_cv_.SignalAll();
    if (watchdog_.joinable()) return;
    watchdog_ = std::thread([this] {
      absl::MutexLock lock(&mu_);
      while (!shut_down_) {
        if (watches_.empty()) {
          watch_cv_.Wait(&mu_);
          continue;
        }
        auto first = std::min_element(watches_.begin(), watches_.end());
        if (absl::Now() < first->first) {
          watch_cv_.WaitWithDeadline(&mu_, first->first);
          continue;
        }
        const uint64_t id = first->second;
        watches_.erase(first);
        if (awaited_.contains(id) && rw_ != nullptr && !finished_) {
          timed_out_.insert(id);
          context_->TryCancel();
        }
      }
    });
  }

  void UnwatchLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    watches_.erase(std::remove_if(watches_.begin(), watches_.end(),
                                  [id](const auto& w) { return w.second == id; }),
                   watches_.end());
  }

  using Stream = BlockingStream<v1::ExecuteRequest, v1::ExecuteResponse>;
  v1::GpuExec::Stub* const stub_;
  const std::string token_;
  const std::string daemon_;
  const absl::Duration spin_wait_;
  absl::Mutex mu_;
  std::unique_ptr<grpc::ClientContext> context_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Stream> rw_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // rw_->Finish() was called
  v1::ExecuteRequest pending_ ABSL_GUARDED_BY(mu_);
  // Commands sent, handed back for Submit to clear (spent_dirty_), then
  // cleared objects for the next commands.
  v1::ExecuteRequest spent_ ABSL_GUARDED_BY(mu_);
  bool spent_dirty_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  // The last command queued without waiting, and the last command the
  // daemon is known to have started every command up to.
  uint64_t last_unwaited_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t ordered_through_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_set<uint64_t> awaited_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, v1::CommandResult> results_ ABSL_GUARDED_BY(mu_);
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  // The first failure of a command queued without waiting, not yet reported.
  absl::Status deferred_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<absl::Time, uint64_t>> watches_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint64_t> timed_out_ ABSL_GUARDED_BY(mu_);
  absl::CondVar watch_cv_;
  std::thread watchdog_;
  absl::CondVar send_cv_;
  std::thread sender_;
};

// What a Session and everything made from it share; outlives the Session
// object as long as a Buffer or Module refers to it.
struct SessionState {
  std::shared_ptr<ClientState> client;
  std::string token;
  uint32_t device = 0;
  uint64_t memory_limit_bytes = 0;
  uint64_t kernel_time_limit_ms = 0;
  bool untimed = false;  // the daemon granted SessionOptions::gpu_time = false
  std::atomic<uint64_t> lease_ms{0};
  // Set once Close() ran (or was attempted): destructors of the session's
  // objects then skip their cleanup calls.
  std::atomic<bool> closed{false};
  // Launches, synchronizes and the other commands: the Execute stream,
  // opened on first use, or a command ring with the stream beside it.
  std::unique_ptr<Commands> commands;
  // The daemon's host memory socket (ClientOptions::shm_socket, else what
  // OpenSession's answer named; empty: none known).
  std::string shm_socket;
  // The session's live HostMemory ranges, which Write and ReadInto consult.
  HostRegions regions;

  // Calls outside the command stream that touch the GPU (copies, frees)
  // first make sure the commands sent before them have started.
  absl::Status Order() const { return commands->Order(client->options.control_timeout); }

  v1::GpuExec::Stub& stub() const { return *client->stub; }
  const ClientOptions& options() const { return client->options; }
  // A reply's status, UNAVAILABLE naming the session's daemon.
  absl::Status Status(const grpc::Status& status) const { return client->Status(status); }
};

}  // namespace internal
}  // namespace gpuexec

#endif  // GPUEXEC_CLIENT_CPP_INTERNAL_COMMAND_STREAM_H_
