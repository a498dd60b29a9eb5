// Read: a buffer streamed to the client in chunks, through the staging slots.
#include "server/rpc/service_calls.h"

namespace gpuexec::rpc {
namespace calls {

std::atomic<void (*)()> read_fetched_for_test{nullptr};

namespace {

// Read: chunks fetched ahead by the engine. Each is serialized on the copy
// pool while earlier ones are on the wire or wait for it (kChunks in hand
// at most), so the thread polling gRPC only sends. The method is served raw
// (grpc::ByteBuffer) for that: a typed Write would serialize on the calling
// thread.
class ReadCall final : public ServerWriteCall<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit ReadCall(const Env* env) : ServerWriteCall(env->calls), env_(env) {}

 private:
  void Request(grpc::ServerCompletionQueue* cq, Tag* tag) override {
    env_->service->RequestRead(&ctx_, &request_, &writer_, cq, cq, tag);
  }
  AsyncCall* Next() override { return new ReadCall(env_); }
  void OnStart() override {
    uint64_t generation = 0;
    auto caller = Identify(env_, ctx_, &generation);
    if (!caller.ok()) return Finish(ToGrpcStatus(caller.status()));
    v1::ReadRequest r;
    if (!Parse(&request_, &r)) {
      return Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "Read: the request is not a gpuexec.v1.ReadRequest"));
    }
    // Admitted for what it may hold at most: its messages in hand and the
    // chunks the engine fetches ahead, each a chunk (or the whole read,
    // when smaller).
    const core::EngineOptions& eo = env_->engine->options();
    uint64_t chunk =
        r.chunk_size() == 0 ? eo.chunk_bytes : std::min(r.chunk_size(), eo.chunk_bytes);
    if (r.size() != 0) chunk = std::min<uint64_t>(chunk, r.size());
    auto ticket = env_->budget->Admit(CallBudget::Kind::kData, "Read", *caller, r.session(),
                                      chunk * (kChunks + kFetchedAhead));
    if (!ticket.ok()) return Finish(ToGrpcStatus(ticket.status()));
    ticket_ = std::move(ticket).value();
    auto source = env_->engine->BeginRead(*caller, r.session(), r.buffer(), r.offset(), r.size(),
                                          r.chunk_size());
    if (!source.ok()) return Finish(ToGrpcStatus(source.status()));
    source_ = std::move(source).value();
    Pump();
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = -1;
      if (!ok && error_.ok()) error_ = absl::CancelledError("the client went away");
    }
    Pump();
  }

  // Starts what can start: a fetch into a free message, the write of a
  // ready one; finishes once everything was sent or an error stopped it.
  void Pump() {
    int fetch = -1, write = -1;
    bool finish = false;
    absl::Status status;
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      const bool failed = !error_.ok();
      // Only while no Next is under way may remaining() be read.
      if (!fetching_ && !failed && source_->remaining() > 0) {
        fetch = FreeSlot(kChunks, writing_, ready_);
        fetching_ = fetch >= 0;
      }
      if (writing_ < 0 && !ready_.empty() && !failed) {
        write = writing_ = ready_.front();
        ready_.pop_front();
      }
      if (writing_ < 0 && !fetching_ && (failed || (ready_.empty() && source_->remaining() == 0))) {
        finished_ = true;
        finish = true;
        status = error_;
      }
    }
    if (write >= 0) StartWrite(&out_[write]);
    if (fetch >= 0) {
      // The fetch is an operation of the call until Fetched has returned,
      // as Write's push is: else the call could finish (a client that went
      // away, a write that ended the read) and be deleted between
      // Fetched's unlock and its Pump (seen once in a soak: a SIGSEGV).
      Begin();
      source_->Next([this, fetch](absl::StatusOr<core::ReadChunk> chunk) {
        if (!chunk.ok()) {
          Fetched(fetch, chunk.status());
          return End();
        }
        // Not here: the chunk comes on the device's reply reader (or on this
        // call's own Pump), and Fetched may start the message's write,
        // which gRPC carries out on the calling thread.
        env_->copies->Post([this, fetch, chunk = std::move(chunk).value()]() mutable {
          // The message is sent from the chunk's buffer itself, which
          // the message then holds.
          out_[fetch] = SerializeReadResponse(chunk.offset, chunk.bytes, std::move(chunk.hold));
          Fetched(fetch, absl::OkStatus());
          End();
        });
      });
    }
    if (finish) {
      // Given back before the client hears the end, so that its next call
      // finds the room this one held.
      ticket_.reset();
      Finish(ToGrpcStatus(status));
    }
  }

  void Fetched(int slot, const absl::Status& st) {
    {
      absl::MutexLock lock(&mu_);
      fetching_ = false;
      if (st.ok()) {
        ready_.push_back(slot);
      } else if (error_.ok()) {
        error_ = st;
      }
    }
    if (auto hook = read_fetched_for_test.load(std::memory_order_relaxed)) hook();
    Pump();
  }

  const Env* env_;
  std::shared_ptr<core::ReadSource> source_;  // set before the first Pump
  // The call's hold on its session's and tenant's budgets.
  std::unique_ptr<CallBudget::Ticket> ticket_;
  static constexpr int kChunks = 3;
  // Chunks ReadSource fetches ahead of the one it delivers.
  static constexpr int kFetchedAhead = 2;
  grpc::ByteBuffer out_[kChunks];  // serialized chunks
  absl::Mutex mu_;
  int writing_ ABSL_GUARDED_BY(mu_) = -1;       // the message on the wire
  bool fetching_ ABSL_GUARDED_BY(mu_) = false;  // a Next under way
  std::deque<int> ready_ ABSL_GUARDED_BY(mu_);  // serialized, not yet sent
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

void ListenRead(const GpuExecService::Env* env, grpc::ServerCompletionQueue* cq) {
  (new ReadCall(env))->Listen(cq);
}

}  // namespace calls
}  // namespace gpuexec::rpc
