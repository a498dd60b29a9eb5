// LoadModule: a module image streamed in chunks, hashed off the polling
// thread, checked and stored.
#include <grpcpp/alarm.h>

#include "server/common/text.h"
#include "server/rpc/service_calls.h"

namespace gpuexec::rpc {
namespace calls {
namespace {

// LoadModule: a header, then chunks, then the engine loads the module.
//
// An upload that sends nothing for CallLimits::upload_idle while the daemon
// waits for its next message is ended (DEADLINE_EXCEEDED), and the bytes it
// held of the upload budget are given back: two stalled uploads once held
// the whole budget for as long as their clients liked. An alarm on the
// call's completion queue looks at the call's last message; it is
// cancelled as the call finishes, so it never keeps a finished call.
class LoadModuleCall final : public ServerReadCall<v1::LoadModuleRequest, v1::LoadModuleResponse> {
 public:
  explicit LoadModuleCall(const Env* env) : ServerReadCall(env->calls), env_(env) {}

 private:
  void Request(grpc::ServerCompletionQueue* cq, Tag* tag) override {
    env_->service->RequestLoadModule(&ctx_, &reader_, cq, cq, tag);
  }
  AsyncCall* Next() override { return new LoadModuleCall(env_); }
  void OnStart() override {
    auto caller = Identify(env_, ctx_, &generation_);
    if (!caller.ok()) return EndWith(ToGrpcStatus(caller.status()));
    caller_ = *std::move(caller);
    idle_ = env_->budget->limits().upload_idle;
    {
      absl::MutexLock lock(&mu_);
      if (idle_ > absl::ZeroDuration()) {
        Begin();
        idle_alarm_.Set(cq(), absl::ToChronoTime(absl::Now() + idle_), &idle_check_);
      }
    }
    Read();
  }

  void OnReadDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      reading_ = false;
      last_message_ = absl::Now();
      if (ended_) return;  // ended while the read waited (an idle upload)
    }
    if (!ok) {
      if (upload_ == nullptr) {
        return EndWith(ToGrpcStatus(
            absl::InvalidArgumentError("LoadModule: the stream ended before its header")));
      }
      // The digest, the image's checks and the store: off the polling
      // thread, which every other client's messages wait for.
      OffThePollingThread([this] {
        upload_->Finish([this](absl::StatusOr<core::ModuleResult> r) {
          if (r.ok()) {
            response_.set_module(r->handle);
            response_.set_sha256(r->sha256);
            response_.set_uploaded(r->uploaded);
            for (const std::string& k : r->kernels) response_.add_kernels(k);
          }
          EndWith(ToGrpcStatus(r.status()));
        });
      });
      return;
    }
    absl::Status st = Reidentify(env_, ctx_, &caller_, &generation_);
    if (!st.ok()) return EndWith(ToGrpcStatus(st));
    if (upload_ == nullptr) {
      if (!request_.has_header()) {
        st = absl::InvalidArgumentError("LoadModule: the first message must be a header");
      } else {
        const v1::ModuleHeader& h = request_.header();
        auto ticket =
            env_->budget->Admit(CallBudget::Kind::kStream, "LoadModule", caller_, h.session());
        if (ticket.ok()) {
          ticket_ = std::move(ticket).value();
          auto upload = env_->engine->BeginModuleUpload(caller_, h.session(), h.sha256(), h.size(),
                                                        FromProto(h.kind()));
          if (upload.ok()) {
            upload_ = std::move(upload).value();
            what_ = absl::StrCat("module ", Quoted(h.sha256().substr(0, 12)), " of session ",
                                 Quoted(h.session().substr(0, 8)), " (", ByteSize(h.size()),
                                 " announced)");
          }
          st = upload.status();
        } else {
          st = ticket.status();
        }
      }
    } else if (request_.has_header()) {
      st = absl::InvalidArgumentError("LoadModule: a second header arrived");
    } else {
      // The chunk is appended and hashed off the polling thread; the next
      // read starts once it is (request_ holds the chunk until then).
      return OffThePollingThread([this] {
        absl::Status added = upload_->AddChunk(request_.chunk());
        if (!added.ok()) return EndWith(ToGrpcStatus(added));
        received_ += request_.chunk().size();
        Read();
      });
    }
    if (!st.ok()) return EndWith(ToGrpcStatus(st));
    Read();
  }

  void Read() {
    {
      absl::MutexLock lock(&mu_);
      reading_ = true;
    }
    StartRead(&request_);
  }

  // The idle alarm: ends the call if it has waited for the client's next
  // message for idle_, else looks again when it would have.
  void IdleCheck(bool ok) {
    if (!ok) return;  // cancelled: the call finished (or the server stops)
    absl::ReleasableMutexLock lock(&mu_);
    if (ended_) return;
    const absl::Time now = absl::Now();
    if (!reading_ || now - last_message_ < idle_) {
      // Busy with a chunk, or a message came since: look again later.
      const absl::Time next = (reading_ ? last_message_ : now) + idle_;
      Begin();
      idle_alarm_.Set(cq(), absl::ToChronoTime(next), &idle_check_);
      return;
    }
    ended_ = true;
    lock.Release();
    // The read still waiting completes (not ok) once the call has ended;
    // OnReadDone then sees ended_.
    const std::string what = upload_ != nullptr ? what_ : std::string("the module (no header yet)");
    const absl::Status idle = absl::DeadlineExceededError(absl::StrCat(
        "LoadModule of ", what, ": nothing arrived for ", absl::FormatDuration(idle_),
        " (--upload_idle_s); the ", ByteSize(received_),
        " received are dropped and their room in the upload budget given back. Send the "
        "image again, without pausing"));
    LogFailure("LoadModule", caller_.peer, idle);
    upload_.reset();  // gives back its bytes of the upload budget now
    ticket_.reset();
    Finish(ToGrpcStatus(idle));
  }

  // Finishes the call (once): the idle alarm is cancelled, the session's
  // stream count given back before the client hears the end.
  void EndWith(const grpc::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (ended_) return;
      ended_ = true;
    }
    idle_alarm_.Cancel();
    ticket_.reset();
    Finish(status);
  }

  // Runs `fn` on the uploads pool, as an operation of the call (it cannot
  // end under it).
  void OffThePollingThread(std::function<void()> fn) {
    Begin();
    env_->uploads->Post([this, fn = std::move(fn)] {
      fn();
      End();
    });
  }

  const Env* env_;
  core::Caller caller_;
  uint64_t generation_ = 0;
  v1::LoadModuleRequest request_;
  std::unique_ptr<core::ModuleUpload> upload_;
  std::unique_ptr<CallBudget::Ticket> ticket_;
  std::string what_;  // "module e961e7a761c5 of session 3f2a91c0 (...)"
  uint64_t received_ = 0;
  absl::Duration idle_;
  grpc::Alarm idle_alarm_;
  OpTag<LoadModuleCall> idle_check_{this, &LoadModuleCall::IdleCheck};
  absl::Mutex mu_;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;  // waiting for the client's next message
  absl::Time last_message_ ABSL_GUARDED_BY(mu_) = absl::Now();
  bool ended_ ABSL_GUARDED_BY(mu_) = false;  // Finish called or about to be
};

}  // namespace

void ListenLoadModule(const GpuExecService::Env* env, grpc::ServerCompletionQueue* cq) {
  (new LoadModuleCall(env))->Listen(cq);
}

}  // namespace calls
}  // namespace gpuexec::rpc
