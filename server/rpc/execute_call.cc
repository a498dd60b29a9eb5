// Execute: the command stream, many operations in flight on one call.
#include <grpcpp/alarm.h>

#include "server/common/trace.h"
#include "server/rpc/service_calls.h"

namespace gpuexec::rpc {
namespace calls {
namespace {

// Execute: a session's commands, dispatched to the engine in the order they
// arrive; results are sent as they complete, several to a message when they
// come faster than they can be written. The call ends only when the
// client has half-closed, no engine callback is outstanding and nothing is
// left to write, so no callback can outlive it.
//
// Served raw, parsed here: with the typed API a message that does not parse
// looks like the end of the stream, and the call would end OK with the
// client's commands silently dropped.
class ExecuteCall final : public ServerBidiCall<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit ExecuteCall(const Env* env) : ServerBidiCall(env->calls), env_(env) {}

 private:
  void Request(grpc::ServerCompletionQueue* cq, Tag* tag) override {
    env_->service->RequestExecute(&ctx_, &stream_, cq, cq, tag);
  }
  AsyncCall* Next() override { return new ExecuteCall(env_); }
  void OnStart() override {
    auto caller = Identify(env_, ctx_, &generation_);
    if (!caller.ok()) {
      absl::MutexLock lock(&mu_);
      reads_done_ = true;
      finished_ = true;
      Finish(ToGrpcStatus(caller.status()));
      return;
    }
    caller_ = *std::move(caller);
    peer_ = caller_.peer;
    failures_ = std::make_unique<CommandFailureLog>(peer_);
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    GPUEXEC_TRACE(kFrontRead);
    if (ok && !Parse(&in_, &request_)) {
      // Commands already started still finish; then the call ends with this.
      LogFailure("Execute", peer_, absl::InvalidArgumentError("unparsable message"));
      absl::MutexLock lock(&mu_);
      end_ = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "Execute: a message is not a gpuexec.v1.ExecuteRequest; the stream "
                          "ends after the commands before it");
      reads_done_ = true;
      MaybeFinishLocked();
      return;
    }
    if (!ok) {
      absl::MutexLock lock(&mu_);
      reads_done_ = true;
      MaybeFinishLocked();
      return;
    }
    if (absl::Status who = Reidentify(env_, ctx_, &caller_, &generation_); !who.ok()) {
      // Commands already started still finish; then the call ends with this.
      absl::MutexLock lock(&mu_);
      end_ = ToGrpcStatus(who);
      reads_done_ = true;
      MaybeFinishLocked();
      return;
    }
    if (session_.empty()) {
      absl::Status st;
      if (request_.session().empty()) {
        // As every other call answers a request that names no session.
        st = absl::NotFoundError("Execute: the first message names no session");
      } else {
        st = env_->engine->KeepAlive(caller_, request_.session()).status();
      }
      if (st.ok()) {
        auto ticket =
            env_->budget->Admit(CallBudget::Kind::kStream, "Execute", caller_, request_.session());
        if (ticket.ok()) ticket_ = std::move(ticket).value();
        st = ticket.status();
      }
      if (!st.ok()) {
        absl::MutexLock lock(&mu_);
        reads_done_ = true;
        finished_ = true;
        Finish(ToGrpcStatus(st));
        return;
      }
      session_ = request_.session();
    }
    if (request_.commands_size() > kMaxCommandsPerMessage) {
      // Commands already started still finish; then the call ends with this.
      absl::MutexLock lock(&mu_);
      end_ = grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("Execute: a message carries ", request_.commands_size(),
                       " commands; at most ", kMaxCommandsPerMessage, " (none of them was run)"));
      reads_done_ = true;
      MaybeFinishLocked();
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      in_flight_ += request_.commands_size();
    }
    next_command_ = 0;
    DispatchSome();
  }

  // Dispatches the message's next kDispatchTurn commands; then, if some
  // are left, queues the rest behind what the completion queue holds
  // already (other calls' messages, every tenant's), so that one stream's
  // large messages take turns with everyone else's calls on the polling
  // thread. The next read starts once the whole message is dispatched.
  void DispatchSome() {
    const int n = request_.commands_size();
    const int end = std::min(n, next_command_ + kDispatchTurn);
    for (; next_command_ < end; ++next_command_) Dispatch(request_.commands(next_command_));
    if (next_command_ < n) {
      Begin();
      turn_.Set(cq(), gpr_time_0(GPR_CLOCK_MONOTONIC), &next_turn_);
      return;
    }
    absl::MutexLock lock(&mu_);
    ResumeOrParkLocked(/*after_read=*/true);
  }

  void NextTurn(bool ok) {
    if (ok) return DispatchSome();
    // The server is shutting down: the rest of the message is not run.
    absl::MutexLock lock(&mu_);
    in_flight_ -= request_.commands_size() - next_command_;
    next_command_ = request_.commands_size();
    reads_done_ = true;
    MaybeFinishLocked();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      // The client is gone; keep draining callbacks. What was not written
      // never will be: dropping it un-parks a read held back by it, which
      // then fails and ends the call once the callbacks have drained.
      broken_ = true;
      pending_.Clear();
    }
    WriteLocked();
    ResumeOrParkLocked(/*after_read=*/false);
    MaybeFinishLocked();
  }

  // Commands started and not yet answered, or results not yet written,
  // beyond which the call stops reading until they drain.
  static constexpr int kMaxOutstanding = 8192;
  // Commands one message may carry (the C++ client sends at most 1024).
  static constexpr int kMaxCommandsPerMessage = 4096;
  // Commands dispatched in one turn of the polling thread: a message of
  // the C++ client's goes in one.
  static constexpr int kDispatchTurn = 1024;

  // Converts a command and runs it as every transport does
  // (core::RunCommand); a command that does not convert is refused at its
  // index.
  void Dispatch(const v1::Command& c) {
    auto command = FromProto(c);
    if (!command.ok()) {
      core::CommandResult r;
      r.id = c.id();
      r.status = command.status();
      r.answer = true;
      r.op = CommandName(c);
      return Complete(std::move(r));
    }
    core::RunCommand(*env_->engine, caller_, session_, *std::move(command),
                     [this](core::CommandResult r) { Complete(std::move(r)); });
  }

  void Complete(core::CommandResult result) {
    GPUEXEC_TRACE(kFrontComplete);
    if (!result.status.ok()) failures_->Failed(result.op, result.status);
    // Runs on engine threads, outside any operation of the call: without a
    // hold of its own, the Finish below could complete and delete the call
    // before this thread has let go of mu_.
    Begin();
    {
      absl::MutexLock lock(&mu_);
      --in_flight_;
      if (result.answer && !broken_) ToProto(result, pending_.add_results());
      WriteLocked();
      ResumeOrParkLocked(/*after_read=*/false);
      MaybeFinishLocked();
    }
    End();
  }

  void WriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || broken_ || pending_.results_size() == 0) return;
    response_.Clear();
    response_.Swap(&pending_);
    writing_ = true;
    if (!Serialize(response_, &out_)) {
      writing_ = false;
      broken_ = true;  // cannot happen for a message this process built
      return;
    }
    GPUEXEC_TRACE(kFrontWrite);
    StartWrite(&out_);
  }

  // Reads the next message unless too much is outstanding; a parked read
  // resumes when enough has drained.
  void ResumeOrParkLocked(bool after_read) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (reads_done_) return;
    // The stream's bound, or its share of its tenant's when that is less.
    const int bound = ticket_ != nullptr ? ticket_->CommandShare(kMaxOutstanding) : kMaxOutstanding;
    const bool full = in_flight_ + pending_.results_size() >= bound;
    if (after_read) {
      if (full) {
        parked_ = true;
      } else {
        StartRead(&in_);
      }
    } else if (parked_ && !full) {
      parked_ = false;
      StartRead(&in_);
    }
  }

  void MaybeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || !reads_done_ || in_flight_ != 0 || writing_) return;
    if (!broken_ && pending_.results_size() != 0) return;
    finished_ = true;
    ticket_.reset();  // given back before the client hears the end
    Finish(end_);
  }

  const Env* env_;
  core::Caller caller_;      // set at the start; renewed by Reidentify
  uint64_t generation_ = 0;  // of the tenants file caller_ was decided under
  std::string peer_;
  // Set with peer_, before any command runs.
  std::unique_ptr<CommandFailureLog> failures_;
  std::string session_;         // set by the first message; read-only after
  grpc::ByteBuffer in_;         // the message read
  v1::ExecuteRequest request_;  // parsed from it
  int next_command_ = 0;        // of request_: the next to dispatch
  // The next turn of a message's dispatch (DispatchSome).
  grpc::Alarm turn_;
  OpTag<ExecuteCall> next_turn_{this, &ExecuteCall::NextTurn};
  // The stream's hold on its session's budget (set with session_; given
  // back as the call finishes).
  std::unique_ptr<CallBudget::Ticket> ticket_;

  absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool parked_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  v1::ExecuteResponse pending_ ABSL_GUARDED_BY(mu_);   // results not yet written
  v1::ExecuteResponse response_ ABSL_GUARDED_BY(mu_);  // the one being written
  grpc::ByteBuffer out_ ABSL_GUARDED_BY(mu_);          // ... serialized
  grpc::Status end_ ABSL_GUARDED_BY(mu_);              // the status the call ends with
};

}  // namespace

void ListenExecute(const GpuExecService::Env* env, grpc::ServerCompletionQueue* cq) {
  (new ExecuteCall(env))->Listen(cq);
}

}  // namespace calls
}  // namespace gpuexec::rpc
