#include "server/rpc/service.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gpuexec/grpc_status.h"
#include "gpuexec/wire.h"
#include "server/rpc/convert.h"
#include "server/rpc/observability.h"
#include "server/rpc/wire.h"

namespace gpuexec::rpc {
namespace {

using Env = GpuExecService::Env;
using AsyncService = GpuExecService::AsyncService;

// Who is calling, and the tenants file generation it was decided under.
absl::StatusOr<core::Caller> Identify(const Env* env, const grpc::ServerContext& ctx,
                                      uint64_t* generation) {
  *generation = env->identity->generation();
  return env->identity->Identify(ctx);
}

// A stream that started under an older tenants file identifies its caller
// again before it goes on: credentials revoked since end it, and the
// tenant's new limits apply to what it does next.
absl::Status Reidentify(const Env* env, const grpc::ServerContext& ctx, core::Caller* caller,
                        uint64_t* generation) {
  if (env->identity->generation() == *generation) return absl::OkStatus();
  auto now = Identify(env, ctx, generation);
  if (!now.ok()) {
    return absl::UnauthenticatedError(
        absl::StrCat("the call's credentials were revoked while it ran: ", now.status().message()));
  }
  if (now->tenant_name() != caller->tenant_name()) {
    return absl::UnauthenticatedError("the call's credentials name another tenant since it began");
  }
  *caller = *std::move(now);
  return absl::OkStatus();
}

// A unary method: `handler` runs when a call arrives; it fills the response
// and calls Finish, at once or from an engine completion.
template <class Req, class Resp>
class Unary final : public UnaryCall<Req, Resp> {
 public:
  using RequestFn = void (AsyncService::*)(grpc::ServerContext*, Req*,
                                           grpc::ServerAsyncResponseWriter<Resp>*,
                                           grpc::CompletionQueue*, grpc::ServerCompletionQueue*,
                                           void*);
  using Handler = void (*)(core::Engine*, Unary*);

  Unary(const Env* env, RequestFn request, Handler handler)
      : UnaryCall<Req, Resp>(env->calls), env_(env), request_fn_(request), handler_(handler) {}

  const Req& request() const { return this->request_; }
  const core::Caller& caller() const { return caller_; }
  Resp* response() { return &this->response_; }
  void Finish(const absl::Status& status) { UnaryCall<Req, Resp>::Finish(ToGrpcStatus(status)); }

 private:
  void Request(grpc::ServerCompletionQueue* cq, Tag* tag) override {
    (env_->service->*request_fn_)(&this->ctx_, &this->request_, &this->writer_, cq, cq, tag);
  }
  AsyncCall* Next() override { return new Unary(env_, request_fn_, handler_); }
  void OnStart() override {
    uint64_t generation = 0;
    auto caller = Identify(env_, this->ctx_, &generation);
    if (!caller.ok()) return Finish(caller.status());
    caller_ = *std::move(caller);
    handler_(env_->engine, this);
  }

  const Env* env_;
  RequestFn request_fn_;
  Handler handler_;
  core::Caller caller_;
};

template <class Call>
void ListenUnary(const Env* env, grpc::ServerCompletionQueue* cq, typename Call::RequestFn request,
                 typename Call::Handler handler) {
  (new Call(env, request, handler))->Listen(cq);
}

// A completion that fills the call's response with `fill` and finishes it.
template <class T, class Call, class Fill>
std::function<void(absl::StatusOr<T>)> Reply(Call* call, Fill fill) {
  return [call, fill = std::move(fill)](absl::StatusOr<T> result) {
    if (result.ok()) fill(*result, call->response());
    call->Finish(result.status());
  };
}

template <class Call>
std::function<void(absl::Status)> ReplyStatus(Call* call) {
  return [call](absl::Status st) { call->Finish(st); };
}

// The messages of the methods served raw (Write, Read, Execute), parsed and
// serialized here: with the typed API a stream message that does not parse
// reads as the end of the stream.
template <class Message>
bool Parse(grpc::ByteBuffer* in, Message* message) {
  return grpc::SerializationTraits<Message>::Deserialize(in, message).ok();
}

// Replaces `out` (a buffer already sent, or new) with `message`.
template <class Message>
bool Serialize(const Message& message, grpc::ByteBuffer* out) {
  out->Clear();  // the serializer wants it empty
  bool own = false;
  return grpc::SerializationTraits<Message>::Serialize(message, out, &own).ok();
}

// The first of `n` message slots that is neither `busy` (on the wire or
// being copied) nor waiting in `queued`; -1 when all are taken.
int FreeSlot(int n, int busy, const std::deque<int>& queued) {
  for (int i = 0; i < n; ++i) {
    if (i != busy && std::find(queued.begin(), queued.end(), i) == queued.end()) return i;
  }
  return -1;
}

// LoadModule: a header, then chunks, then the engine loads the module.
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
    if (!caller.ok()) return Finish(ToGrpcStatus(caller.status()));
    caller_ = *std::move(caller);
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      if (upload_ == nullptr) {
        return Finish(ToGrpcStatus(
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
          }
          Finish(ToGrpcStatus(r.status()));
        });
      });
      return;
    }
    absl::Status st = Reidentify(env_, ctx_, &caller_, &generation_);
    if (!st.ok()) return Finish(ToGrpcStatus(st));
    if (upload_ == nullptr) {
      if (!request_.has_header()) {
        st = absl::InvalidArgumentError("LoadModule: the first message must be a header");
      } else {
        const v1::ModuleHeader& h = request_.header();
        auto upload = env_->engine->BeginModuleUpload(caller_, h.session(), h.sha256(), h.size(),
                                                      FromProto(h.kind()));
        if (upload.ok()) upload_ = std::move(upload).value();
        st = upload.status();
      }
    } else if (request_.has_header()) {
      st = absl::InvalidArgumentError("LoadModule: a second header arrived");
    } else {
      // The chunk is appended and hashed off the polling thread; the next
      // read starts once it is (request_ holds the chunk until then).
      return OffThePollingThread([this] {
        absl::Status added = upload_->AddChunk(request_.chunk());
        if (!added.ok()) return Finish(ToGrpcStatus(added));
        StartRead(&request_);
      });
    }
    if (!st.ok()) return Finish(ToGrpcStatus(st));
    StartRead(&request_);
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
};

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
          auto sink = env_->engine->BeginWrite(caller_, first.session, first.buffer, first.offset);
          if (!sink.ok()) {
            done_ = true;
            lock.Release();
            return Finish(ToGrpcStatus(sink.status()));
          }
          sink_ = std::move(sink).value();
        }
        ready_.push_back(got);
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
    if (!bad.ok()) return Finish(ToGrpcStatus(bad));
    if (sink == nullptr) {
      return Finish(ToGrpcStatus(
          absl::InvalidArgumentError("Write: the stream ended before its first message")));
    }
    sink->Finish([this](absl::StatusOr<uint64_t> n) {
      if (n.ok()) {
        v1::WriteResponse r;
        r.set_bytes_written(*n);
        (void)Serialize(r, &response_);
      }
      Finish(ToGrpcStatus(n.status()));
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
    {
      absl::MutexLock lock(&mu_);
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
    if (!st.ok()) return Finish(ToGrpcStatus(st));
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
  int reading_ ABSL_GUARDED_BY(mu_) = -1;       // the message a read fills
  int pushing_ ABSL_GUARDED_BY(mu_) = -1;       // the message being pushed
  std::deque<int> ready_ ABSL_GUARDED_BY(mu_);  // read, not yet pushed
  bool eof_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;  // Finish is called or about to be
};

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
      source_->Next([this, fetch](absl::StatusOr<core::ReadChunk> chunk) {
        if (!chunk.ok()) return Fetched(fetch, chunk.status());
        // Not here: the chunk comes on the device's reply reader (or on this
        // call's own Pump), and Fetched may start the message's write,
        // which gRPC carries out on the calling thread.
        env_->copies->Post([this, fetch, chunk = std::move(chunk).value()]() mutable {
          // The message is sent from the chunk's buffer itself, which
          // the message then holds.
          out_[fetch] = SerializeReadResponse(chunk.offset, chunk.bytes, std::move(chunk.hold));
          Fetched(fetch, absl::OkStatus());
        });
      });
    }
    if (finish) Finish(ToGrpcStatus(status));
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
    Pump();
  }

  const Env* env_;
  std::shared_ptr<core::ReadSource> source_;  // set before the first Pump
  static constexpr int kChunks = 3;
  grpc::ByteBuffer out_[kChunks];  // serialized chunks
  absl::Mutex mu_;
  int writing_ ABSL_GUARDED_BY(mu_) = -1;       // the message on the wire
  bool fetching_ ABSL_GUARDED_BY(mu_) = false;  // a Next under way
  std::deque<int> ready_ ABSL_GUARDED_BY(mu_);  // serialized, not yet sent
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

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
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
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
    for (const v1::Command& c : request_.commands()) Dispatch(c);
    absl::MutexLock lock(&mu_);
    ResumeOrParkLocked(/*after_read=*/true);
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

  void Dispatch(const v1::Command& c) {
    const uint64_t id = c.id();
    const bool reply = c.reply();
    switch (c.op_case()) {
      case v1::Command::kLaunch: {
        auto spec = FromProto(c.launch());
        if (!spec.ok()) return Complete(id, spec.status(), true, {}, "Launch");
        spec->session = session_;
        const bool sync = spec->synchronize;
        env_->engine->Launch(caller_, std::move(spec).value(),
                             [this, id, reply, sync](absl::StatusOr<uint64_t> ns) {
                               v1::CommandResult r;
                               if (ns.ok() && sync) r.set_gpu_time_ns(*ns);
                               Complete(id, ns.status(), reply || sync, std::move(r), "Launch");
                             });
        return;
      }
      case v1::Command::kSynchronize:
        env_->engine->Synchronize(caller_, session_, [this, id](absl::StatusOr<uint64_t> ns) {
          v1::CommandResult r;
          if (ns.ok()) r.set_gpu_time_ns(*ns);
          Complete(id, ns.status(), true, std::move(r), "Synchronize");
        });
        return;
      case v1::Command::kAllocate:
        env_->engine->Allocate(caller_, session_, c.allocate().size(),
                               [this, id](absl::StatusOr<core::BufferInfo> b) {
                                 v1::CommandResult r;
                                 if (b.ok()) {
                                   r.mutable_allocate()->set_buffer(b->handle);
                                   r.mutable_allocate()->set_size(b->size);
                                 }
                                 Complete(id, b.status(), true, std::move(r), "Allocate");
                               });
        return;
      case v1::Command::kFree:
        env_->engine->Free(
            caller_, session_, c.free().buffer(),
            [this, id, reply](absl::Status st) { Complete(id, st, reply, {}, "Free"); });
        return;
      case v1::Command::kMemset: {
        const v1::MemsetRequest& m = c.memset();
        env_->engine->Memset(
            caller_, session_, m.buffer(), m.offset(), m.size(), m.value(),
            [this, id, reply](absl::Status st) { Complete(id, st, reply, {}, "Memset"); });
        return;
      }
      case v1::Command::kCopyBuffer: {
        const v1::CopyBufferRequest& r = c.copy_buffer();
        env_->engine->CopyBuffer(
            caller_, session_, r.dst(), r.dst_offset(), r.src(), r.src_offset(), r.size(),
            [this, id, reply](absl::Status st) { Complete(id, st, reply, {}, "CopyBuffer"); });
        return;
      }
      case v1::Command::OP_NOT_SET:
        // A barrier: every earlier command has been started by now.
        return Complete(id, absl::OkStatus(), true, {}, "barrier");
    }
  }

  void Complete(uint64_t id, const absl::Status& status, bool answer, v1::CommandResult r,
                const char* op) {
    if (!status.ok()) LogFailure(op, peer_, status);
    // Runs on engine threads, outside any operation of the call: without a
    // hold of its own, the Finish below could complete and delete the call
    // before this thread has let go of mu_.
    Begin();
    {
      absl::MutexLock lock(&mu_);
      --in_flight_;
      if (!status.ok() || answer) {
        r.set_id(id);
        r.set_code(static_cast<int>(status.code()));
        if (!status.ok()) r.set_message(std::string(status.message()));
        if (!broken_) *pending_.add_results() = std::move(r);
      }
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
    StartWrite(&out_);
  }

  // Reads the next message unless too much is outstanding; a parked read
  // resumes when enough has drained.
  void ResumeOrParkLocked(bool after_read) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (reads_done_) return;
    const bool full = in_flight_ + pending_.results_size() >= kMaxOutstanding;
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
    Finish(end_);
  }

  const Env* env_;
  core::Caller caller_;      // set at the start; renewed by Reidentify
  uint64_t generation_ = 0;  // of the tenants file caller_ was decided under
  std::string peer_;
  std::string session_;         // set by the first message; read-only after
  grpc::ByteBuffer in_;         // the message read
  v1::ExecuteRequest request_;  // parsed from it

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

void GpuExecService::Listen(grpc::ServerCompletionQueue* cq) {
  const Env* env = &env_;
  using S = AsyncService;
  (new ExecuteCall(env))->Listen(cq);
  (new WriteCall(env))->Listen(cq);
  (new ReadCall(env))->Listen(cq);
  (new LoadModuleCall(env))->Listen(cq);

  using ListDevices = Unary<v1::ListDevicesRequest, v1::ListDevicesResponse>;
  ListenUnary<ListDevices>(
      env, cq, &S::RequestListDevices, [](core::Engine* engine, ListDevices* call) {
        engine->ListDevices(call->caller(),
                            Reply<std::vector<core::DeviceStatus>>(
                                call, [](const std::vector<core::DeviceStatus>& devices,
                                         v1::ListDevicesResponse* r) {
                                  for (const auto& d : devices) ToProto(d, r->add_devices());
                                }));
      });

  using OpenSession = Unary<v1::OpenSessionRequest, v1::OpenSessionResponse>;
  ListenUnary<OpenSession>(
      env, cq, &S::RequestOpenSession, [](core::Engine* engine, OpenSession* call) {
        const v1::OpenSessionRequest& request = call->request();
        std::optional<uint32_t> device;
        if (request.has_device()) device = request.device();
        engine->OpenSession(
            call->caller(), device, request.lease_ms(), request.memory_limit_bytes(),
            request.kernel_time_limit_ms(),
            Reply<core::SessionInfo>(call, [](const core::SessionInfo& s,
                                              v1::OpenSessionResponse* r) { ToProto(s, r); }));
      });

  using KeepAlive = Unary<v1::KeepAliveRequest, v1::KeepAliveResponse>;
  ListenUnary<KeepAlive>(env, cq, &S::RequestKeepAlive, [](core::Engine* engine, KeepAlive* call) {
    auto lease = engine->KeepAlive(call->caller(), call->request().session());
    if (lease.ok()) call->response()->set_lease_ms(*lease);
    call->Finish(lease.status());
  });

  using CloseSession = Unary<v1::CloseSessionRequest, v1::CloseSessionResponse>;
  ListenUnary<CloseSession>(
      env, cq, &S::RequestCloseSession, [](core::Engine* engine, CloseSession* call) {
        engine->CloseSession(call->caller(), call->request().session(), ReplyStatus(call));
      });

  using GetFunction = Unary<v1::GetFunctionRequest, v1::GetFunctionResponse>;
  ListenUnary<GetFunction>(
      env, cq, &S::RequestGetFunction, [](core::Engine* engine, GetFunction* call) {
        const v1::GetFunctionRequest& request = call->request();
        engine->GetFunction(
            call->caller(), request.session(), request.module(), request.name(),
            Reply<core::FunctionResult>(call, [](const core::FunctionResult& f,
                                                 v1::GetFunctionResponse* r) { ToProto(f, r); }));
      });

  using Allocate = Unary<v1::AllocateRequest, v1::AllocateResponse>;
  ListenUnary<Allocate>(env, cq, &S::RequestAllocate, [](core::Engine* engine, Allocate* call) {
    engine->Allocate(
        call->caller(), call->request().session(), call->request().size(),
        Reply<core::BufferInfo>(call, [](const core::BufferInfo& b, v1::AllocateResponse* r) {
          r->set_buffer(b.handle);
          r->set_size(b.size);
        }));
  });

  using Free = Unary<v1::FreeRequest, v1::FreeResponse>;
  ListenUnary<Free>(env, cq, &S::RequestFree, [](core::Engine* engine, Free* call) {
    engine->Free(call->caller(), call->request().session(), call->request().buffer(),
                 ReplyStatus(call));
  });

  using Memset = Unary<v1::MemsetRequest, v1::MemsetResponse>;
  ListenUnary<Memset>(env, cq, &S::RequestMemset, [](core::Engine* engine, Memset* call) {
    const v1::MemsetRequest& r = call->request();
    engine->Memset(call->caller(), r.session(), r.buffer(), r.offset(), r.size(), r.value(),
                   ReplyStatus(call));
  });

  using CopyBuffer = Unary<v1::CopyBufferRequest, v1::CopyBufferResponse>;
  ListenUnary<CopyBuffer>(
      env, cq, &S::RequestCopyBuffer, [](core::Engine* engine, CopyBuffer* call) {
        const v1::CopyBufferRequest& r = call->request();
        engine->CopyBuffer(call->caller(), r.session(), r.dst(), r.dst_offset(), r.src(),
                           r.src_offset(), r.size(), ReplyStatus(call));
      });

  using Launch = Unary<v1::LaunchRequest, v1::LaunchResponse>;
  ListenUnary<Launch>(env, cq, &S::RequestLaunch, [](core::Engine* engine, Launch* call) {
    auto spec = FromProto(call->request());
    if (!spec.ok()) return call->Finish(spec.status());
    engine->Launch(
        call->caller(), std::move(spec).value(),
        Reply<uint64_t>(call, [](uint64_t ns, v1::LaunchResponse* r) { r->set_gpu_time_ns(ns); }));
  });

  using Synchronize = Unary<v1::SynchronizeRequest, v1::SynchronizeResponse>;
  ListenUnary<Synchronize>(
      env, cq, &S::RequestSynchronize, [](core::Engine* engine, Synchronize* call) {
        engine->Synchronize(call->caller(), call->request().session(),
                            Reply<uint64_t>(call, [](uint64_t ns, v1::SynchronizeResponse* r) {
                              r->set_gpu_time_ns(ns);
                            }));
      });
}

}  // namespace gpuexec::rpc
