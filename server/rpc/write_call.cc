// Write: a client stream of chunks into a buffer, through the staging slots.
#include "server/rpc/service_calls.h"

namespace gpuexec::rpc {
namespace calls {
namespace {

// Write: each message's bytes go to pinned staging buffers. Request
// messages rotate through kMessages, so that gRPC goes on receiving while
// earlier ones wait for their copy or are copied out (on the copy pool): at
// most one read and one push are under way, and a message is read into only
// once its bytes are no longer needed.
// Served raw and parsed here, as Execute is (a message that does not parse
// must not look like the end of the data).
class WriteCall final : public ServerReadCall<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit WriteCall(const Env* env) : ServerReadCall(env->calls), env_(env) {}

 private:
  void Request(grpc::ServerCompletionQueue* cq, Tag* tag) override {
    env_->service->RequestWrite(&ctx_, &reader_, cq, cq, tag);
  }
  AsyncCall* Next() override { return new WriteCall(env_); }
  void OnStart() override {
    auto caller = Identify(env_, ctx_, &generation_);
    if (!caller.ok()) {
      {
        absl::MutexLock lock(&mu_);
        done_ = true;
      }
      return Finish(ToGrpcStatus(caller.status()));
    }
    caller_ = *std::move(caller);
    {
      absl::MutexLock lock(&mu_);
      reading_ = 0;
    }
    StartRead(&in_[0]);
  }

  void OnReadDone(bool ok) override {
    {
      absl::ReleasableMutexLock lock(&mu_);
      const int got = reading_;
      reading_ = -1;
      if (done_) return;  // the call already ended with an error
      absl::Status who = ok ? Reidentify(env_, ctx_, &caller_, &generation_) : absl::OkStatus();
      if (!who.ok()) {
        // As for a bad message: what was read before is written; then the
        // call fails.
        bad_ = who;
        eof_ = true;
      } else if (ok && !ParseSlices(got)) {
        // What was read before it is still written; then the call fails.
        bad_ = absl::InvalidArgumentError(
            "Write: a message is not a gpuexec.v1.WriteRequest; the bytes before it were "
            "written");
        eof_ = true;
      } else if (!ok) {
        eof_ = true;
      } else {
        if (sink_ == nullptr) {
          const WriteMessage& first = messages_[got];
          // Admitted for the bytes it holds at most with messages of a
          // chunk each, as the clients send them (a larger message grows
          // the reservation below).
          auto ticket =
              env_->budget->Admit(CallBudget::Kind::kData, "Write", caller_, first.session,
                                  kMaxHeldBytes + env_->engine->options().chunk_bytes);
          absl::StatusOr<std::shared_ptr<core::WriteSink>> sink =
              ticket.ok()
                  ? env_->engine->BeginWrite(caller_, first.session, first.buffer, first.offset)
                  : ticket.status();
          if (!sink.ok()) {
            done_ = true;
            lock.Release();
            return Finish(ToGrpcStatus(sink.status()));
          }
          ticket_ = std::move(ticket).value();
          sink_ = std::move(sink).value();
        }
        ready_.push_back(got);
        if (absl::Status room = ticket_->ReserveAtLeast(HeldBytesLocked()); !room.ok()) {
          // The message is dropped; what was read before it is written.
          ready_.pop_back();
          slices_[got].clear();
          messages_[got].data.Clear();
          bad_ = room;
          eof_ = true;
        }
      }
    }
    Pump();
  }

  // Starts what can start: a read into a free message, a push of a message
  // read; finishes once the stream ended and everything was pushed.
  void Pump() {
    int read_into = -1, push = -1;
    bool finish = false;
    absl::Status bad;
    std::shared_ptr<core::WriteSink> sink;
    {
      absl::MutexLock lock(&mu_);
      if (done_) return;
      if (reading_ < 0 && !eof_ && HeldBytesLocked() < kMaxHeldBytes) {
        read_into = FreeSlot(kMessages, pushing_, ready_);
        reading_ = read_into;
      }
      if (pushing_ < 0 && !ready_.empty()) {
        push = pushing_ = ready_.front();
        ready_.pop_front();
      }
      if (eof_ && pushing_ < 0 && ready_.empty()) {
        finish = true;
        done_ = true;
        bad = bad_;
      }
      sink = sink_;
    }
    if (read_into >= 0) StartRead(&in_[read_into]);
    if (push >= 0) {
      // The copy into staging runs on the copy pool: this thread goes on
      // receiving the next message meanwhile. The push is an operation of
      // the call until Pushed has returned: without it, a client that went
      // away meanwhile could have the call finished and deleted under the
      // Pump that Pushed runs (seen once in a soak: a SIGSEGV in Pump).
      Begin();
      env_->copies->Post([this, sink, push] {
        sink->Push(messages_[push].data, [this](absl::Status st) {
          Pushed(st);
          End();
        });
      });
    }
    if (!finish) return;
    if (sink == nullptr) {
      return Finish(ToGrpcStatus(
          !bad.ok()
              ? bad
              : absl::InvalidArgumentError("Write: the stream ended before its first message")));
    }
    if (!bad.ok()) return FinishAfterCopies(sink, bad);
    sink->Finish([this](absl::StatusOr<uint64_t> n) {
      if (n.ok()) {
        v1::WriteResponse r;
        r.set_bytes_written(*n);
        (void)Serialize(r, &response_);
      }
      ticket_.reset();
      Finish(ToGrpcStatus(n.status()));
    });
  }

  // Ends the call with `error` once the copies it queued have finished and
  // the buffer is no longer marked in use, so that a Free the client sends
  // on hearing the error finds the buffer free. (Copies already queued come
  // before that Free in stream order either way.)
  void FinishAfterCopies(const std::shared_ptr<core::WriteSink>& sink, absl::Status error) {
    sink->Finish([this, error](absl::StatusOr<uint64_t>) {
      ticket_.reset();
      Finish(ToGrpcStatus(error));
    });
  }

  // Parses message `i` where it lies: its data stays in gRPC's slices,
  // which slices_[i] holds until the message is pushed.
  bool ParseSlices(int i) {
    if (!wire::Slices(&in_[i], &slices_[i])) return false;
    in_[i].Clear();
    return ParseWriteRequest(slices_[i], &messages_[i]);
  }

  void Pushed(absl::Status st) {
    std::shared_ptr<core::WriteSink> sink;
    {
      absl::MutexLock lock(&mu_);
      sink = sink_;
      if (pushing_ >= 0) {
        slices_[pushing_].clear();
        messages_[pushing_].data.Clear();
      }
      pushing_ = -1;
      if (st.ok() || done_) {
        st = absl::OkStatus();
      } else {
        // Copies already queued still finish (they own the sink); the call
        // ends now with the error.
        done_ = true;
      }
    }
    if (!st.ok()) return FinishAfterCopies(sink, st);
    Pump();
  }

  const Env* env_;
  core::Caller caller_;
  uint64_t generation_ = 0;
  // Bytes of the messages read and not yet copied out (being pushed or
  // waiting to be): no further message is read while they reach
  // kMaxHeldBytes, so a call holds at most that and two messages.
  uint64_t HeldBytesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    uint64_t held = pushing_ >= 0 ? messages_[pushing_].data.size() : 0;
    for (int i : ready_) held += messages_[i].data.size();
    return held;
  }
  static constexpr uint64_t kMaxHeldBytes = 4 << 20;
  // With two, receiving stopped whenever the message behind the one being
  // copied had arrived.
  static constexpr int kMessages = 4;
  grpc::ByteBuffer in_[kMessages];              // as read
  std::vector<grpc::Slice> slices_[kMessages];  // their bytes (ParseSlices)
  WriteMessage messages_[kMessages];            // parsed, pointing into slices_
  absl::Mutex mu_;
  absl::Status bad_ ABSL_GUARDED_BY(mu_);  // a message did not parse
  std::shared_ptr<core::WriteSink> sink_ ABSL_GUARDED_BY(mu_);
  // The call's hold on its session's and tenant's budgets; set with sink_,
  // dropped just before the call's status is sent.
  std::unique_ptr<CallBudget::Ticket> ticket_;
  int reading_ ABSL_GUARDED_BY(mu_) = -1;       // the message a read fills
  int pushing_ ABSL_GUARDED_BY(mu_) = -1;       // the message being pushed
  std::deque<int> ready_ ABSL_GUARDED_BY(mu_);  // read, not yet pushed
  bool eof_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;  // Finish is called or about to be
};

}  // namespace

void ListenWrite(const GpuExecService::Env* env, grpc::ServerCompletionQueue* cq) {
  (new WriteCall(env))->Listen(cq);
}

}  // namespace calls
}  // namespace gpuexec::rpc
