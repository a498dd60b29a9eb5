#include "server/rpc/service.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gpuexec/grpc_status.h"
#include "server/rpc/convert.h"
#include "server/rpc/observability.h"

namespace gpuexec::rpc {
namespace {

using grpc::CallbackServerContext;
using grpc::ServerUnaryReactor;

// The default reactor, finished with `status`.
ServerUnaryReactor* FinishWith(CallbackServerContext* ctx, const absl::Status& status) {
  ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// A completion that fills the response with `fill` and finishes the call.
template <typename T, typename Fill>
std::function<void(absl::StatusOr<T>)> Reply(ServerUnaryReactor* reactor, Fill fill) {
  return [reactor, fill = std::move(fill)](absl::StatusOr<T> result) {
    if (result.ok()) fill(*result);
    reactor->Finish(ToGrpcStatus(result.status()));
  };
}

std::function<void(absl::Status)> ReplyStatus(ServerUnaryReactor* reactor) {
  return [reactor](absl::Status st) { reactor->Finish(ToGrpcStatus(st)); };
}

// LoadModule: a header, then chunks, then the engine loads the module.
class LoadModuleReactor final : public grpc::ServerReadReactor<v1::LoadModuleRequest> {
 public:
  LoadModuleReactor(core::Engine* engine, v1::LoadModuleResponse* response)
      : engine_(engine), response_(response) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      if (upload_ == nullptr) {
        return Finish(ToGrpcStatus(
            absl::InvalidArgumentError("LoadModule: the stream ended before its header")));
      }
      upload_->Finish([this](absl::StatusOr<core::ModuleResult> r) {
        if (r.ok()) {
          response_->set_module(r->handle);
          response_->set_sha256(r->sha256);
          response_->set_uploaded(r->uploaded);
        }
        Finish(ToGrpcStatus(r.status()));
      });
      return;
    }
    absl::Status st;
    if (upload_ == nullptr) {
      if (!request_.has_header()) {
        st = absl::InvalidArgumentError("LoadModule: the first message must be a header");
      } else {
        const v1::ModuleHeader& h = request_.header();
        auto upload =
            engine_->BeginModuleUpload(h.session(), h.sha256(), h.size(), FromProto(h.kind()));
        if (upload.ok()) upload_ = std::move(upload).value();
        st = upload.status();
      }
    } else if (request_.has_header()) {
      st = absl::InvalidArgumentError("LoadModule: a second header arrived");
    } else {
      st = upload_->AddChunk(request_.chunk());
    }
    if (!st.ok()) return Finish(ToGrpcStatus(st));
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  core::Engine* engine_;
  v1::LoadModuleResponse* response_;
  v1::LoadModuleRequest request_;
  std::unique_ptr<core::ModuleUpload> upload_;
};

// Write: each message's bytes go to pinned staging buffers. Two request
// messages alternate, so that gRPC receives the next one while this one's
// bytes are copied out: at most one read and one push are under way, and a
// message is read into only once its bytes are no longer needed.
class WriteReactor final : public grpc::ServerReadReactor<v1::WriteRequest> {
 public:
  WriteReactor(core::Engine* engine, v1::WriteResponse* response)
      : engine_(engine), response_(response) {
    {
      absl::MutexLock lock(&mu_);
      reading_ = 0;
    }
    StartRead(&requests_[0]);
  }

  void OnReadDone(bool ok) override {
    {
      absl::ReleasableMutexLock lock(&mu_);
      const int got = reading_;
      reading_ = -1;
      if (done_) return;  // the call already ended with an error
      if (!ok) {
        eof_ = true;
      } else {
        if (sink_ == nullptr) {
          const v1::WriteRequest& first = requests_[got];
          auto sink = engine_->BeginWrite(first.session(), first.buffer(), first.offset());
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

  void OnDone() override { delete this; }

 private:
  // Starts what can start: a read into a free message, a push of a message
  // read; finishes once the stream ended and everything was pushed.
  void Pump() {
    int read_into = -1, push = -1;
    bool finish = false;
    std::shared_ptr<core::WriteSink> sink;
    {
      absl::MutexLock lock(&mu_);
      if (done_) return;
      if (reading_ < 0 && !eof_) {
        for (int i = 0; i < 2; ++i) {
          const bool queued = std::find(ready_.begin(), ready_.end(), i) != ready_.end();
          if (i != pushing_ && !queued) {
            read_into = reading_ = i;
            break;
          }
        }
      }
      if (pushing_ < 0 && !ready_.empty()) {
        push = pushing_ = ready_.front();
        ready_.pop_front();
      }
      if (eof_ && pushing_ < 0 && ready_.empty()) {
        finish = true;
        done_ = true;
      }
      sink = sink_;
    }
    if (read_into >= 0) StartRead(&requests_[read_into]);
    if (push >= 0) {
      sink->Push(requests_[push].data(), [this](absl::Status st) { Pushed(st); });
    }
    if (!finish) return;
    if (sink == nullptr) {
      return Finish(ToGrpcStatus(
          absl::InvalidArgumentError("Write: the stream ended before its first message")));
    }
    sink->Finish([this](absl::StatusOr<uint64_t> n) {
      if (n.ok()) response_->set_bytes_written(*n);
      Finish(ToGrpcStatus(n.status()));
    });
  }

  void Pushed(absl::Status st) {
    {
      absl::MutexLock lock(&mu_);
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

  core::Engine* engine_;
  v1::WriteResponse* response_;
  v1::WriteRequest requests_[2];
  absl::Mutex mu_;
  std::shared_ptr<core::WriteSink> sink_ ABSL_GUARDED_BY(mu_);
  int reading_ ABSL_GUARDED_BY(mu_) = -1;       // the message a read fills
  int pushing_ ABSL_GUARDED_BY(mu_) = -1;       // the message being pushed
  std::deque<int> ready_ ABSL_GUARDED_BY(mu_);  // read, not yet pushed
  bool eof_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;  // Finish is called or about to be
};

// Read: chunks fetched ahead by the engine, written one at a time.
class ReadReactor final : public grpc::ServerWriteReactor<v1::ReadResponse> {
 public:
  ReadReactor(core::Engine* engine, const v1::ReadRequest* r) {
    auto source =
        engine->BeginRead(r->session(), r->buffer(), r->offset(), r->size(), r->chunk_size());
    if (!source.ok()) {
      Finish(ToGrpcStatus(source.status()));
      return;
    }
    source_ = std::move(source).value();
    NextChunk();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
    NextChunk();
  }

  void OnDone() override { delete this; }

 private:
  void NextChunk() {
    if (source_->remaining() == 0) return Finish(grpc::Status::OK);
    source_->Next([this](absl::StatusOr<std::pair<uint64_t, std::string>> chunk) {
      if (!chunk.ok()) return Finish(ToGrpcStatus(chunk.status()));
      response_.set_offset(chunk->first);
      *response_.mutable_data() = std::move(chunk->second);
      StartWrite(&response_);
    });
  }

  std::shared_ptr<core::ReadSource> source_;
  v1::ReadResponse response_;
};

// Execute: a session's commands, dispatched to the engine in the order they
// arrive; results are sent as they complete, several to a message when they
// come faster than they can be written. The reactor ends only when the
// client has half-closed, no engine callback is outstanding and nothing is
// left to write, so no callback can outlive it.
class ExecuteReactor final
    : public grpc::ServerBidiReactor<v1::ExecuteRequest, v1::ExecuteResponse> {
 public:
  ExecuteReactor(core::Engine* engine, std::string peer) : engine_(engine), peer_(std::move(peer)) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      absl::MutexLock lock(&mu_);
      reads_done_ = true;
      MaybeFinishLocked();
      return;
    }
    if (session_.empty()) {
      absl::Status st;
      if (request_.session().empty()) {
        st = absl::InvalidArgumentError("Execute: the first message must name the session");
      } else {
        st = engine_->KeepAlive(request_.session()).status();
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
    if (!ok) broken_ = true;  // the client is gone; keep draining callbacks
    WriteLocked();
    ResumeOrParkLocked(/*after_read=*/false);
    MaybeFinishLocked();
  }

  void OnDone() override { delete this; }

 private:
  // Commands started and not yet answered, or results not yet written,
  // beyond which the reactor stops reading until they drain.
  static constexpr int kMaxOutstanding = 8192;

  void Dispatch(const v1::Command& c) {
    const uint64_t id = c.id();
    const bool reply = c.reply();
    switch (c.op_case()) {
      case v1::Command::kLaunch: {
        auto spec = FromProto(c.launch());
        if (!spec.ok()) return Complete(id, spec.status(), true, {}, "Launch");
        spec->session = session_;
        const bool sync = spec->synchronize;
        engine_->Launch(std::move(spec).value(),
                        [this, id, reply, sync](absl::StatusOr<uint64_t> ns) {
                          v1::CommandResult r;
                          if (ns.ok() && sync) r.set_gpu_time_ns(*ns);
                          Complete(id, ns.status(), reply || sync, std::move(r), "Launch");
                        });
        return;
      }
      case v1::Command::kSynchronize:
        engine_->Synchronize(session_, [this, id](absl::StatusOr<uint64_t> ns) {
          v1::CommandResult r;
          if (ns.ok()) r.set_gpu_time_ns(*ns);
          Complete(id, ns.status(), true, std::move(r), "Synchronize");
        });
        return;
      case v1::Command::kAllocate:
        engine_->Allocate(session_, c.allocate().size(),
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
        engine_->Free(session_, c.free().buffer(),
                      [this, id, reply](absl::Status st) { Complete(id, st, reply, {}, "Free"); });
        return;
      case v1::Command::kMemset: {
        const v1::MemsetRequest& m = c.memset();
        engine_->Memset(
            session_, m.buffer(), m.offset(), m.size(), m.value(),
            [this, id, reply](absl::Status st) { Complete(id, st, reply, {}, "Memset"); });
        return;
      }
      case v1::Command::kCopyBuffer: {
        const v1::CopyBufferRequest& r = c.copy_buffer();
        engine_->CopyBuffer(
            session_, r.dst(), r.dst_offset(), r.src(), r.src_offset(), r.size(),
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

  void WriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || broken_ || pending_.results_size() == 0) return;
    response_.Clear();
    response_.Swap(&pending_);
    writing_ = true;
    StartWrite(&response_);
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
        StartRead(&request_);
      }
    } else if (parked_ && !full) {
      parked_ = false;
      StartRead(&request_);
    }
  }

  void MaybeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || !reads_done_ || in_flight_ != 0 || writing_) return;
    if (!broken_ && pending_.results_size() != 0) return;
    finished_ = true;
    Finish(grpc::Status::OK);
  }

  core::Engine* engine_;
  const std::string peer_;
  std::string session_;  // set by the first message; read-only after
  v1::ExecuteRequest request_;

  absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool parked_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  v1::ExecuteResponse pending_ ABSL_GUARDED_BY(mu_);   // results not yet written
  v1::ExecuteResponse response_ ABSL_GUARDED_BY(mu_);  // the one being written
};

}  // namespace

grpc::ServerBidiReactor<v1::ExecuteRequest, v1::ExecuteResponse>* GpuExecService::Execute(
    CallbackServerContext* ctx) {
  return new ExecuteReactor(engine_, ctx->peer());
}

ServerUnaryReactor* GpuExecService::ListDevices(CallbackServerContext* ctx,
                                                const v1::ListDevicesRequest*,
                                                v1::ListDevicesResponse* response) {
  ServerUnaryReactor* reactor = ctx->DefaultReactor();
  engine_->ListDevices(Reply<std::vector<core::DeviceStatus>>(
      reactor, [response](const std::vector<core::DeviceStatus>& devices) {
        for (const auto& d : devices) ToProto(d, response->add_devices());
      }));
  return reactor;
}

ServerUnaryReactor* GpuExecService::OpenSession(CallbackServerContext* ctx,
                                                const v1::OpenSessionRequest* request,
                                                v1::OpenSessionResponse* response) {
  ServerUnaryReactor* reactor = ctx->DefaultReactor();
  std::optional<uint32_t> device;
  if (request->has_device()) device = request->device();
  engine_->OpenSession(device, request->lease_ms(), request->memory_limit_bytes(),
                       request->kernel_time_limit_ms(),
                       Reply<core::SessionInfo>(reactor, [response](const core::SessionInfo& s) {
                         ToProto(s, response);
                       }));
  return reactor;
}

ServerUnaryReactor* GpuExecService::KeepAlive(CallbackServerContext* ctx,
                                              const v1::KeepAliveRequest* request,
                                              v1::KeepAliveResponse* response) {
  auto lease = engine_->KeepAlive(request->session());
  if (lease.ok()) response->set_lease_ms(*lease);
  return FinishWith(ctx, lease.status());
}

ServerUnaryReactor* GpuExecService::CloseSession(CallbackServerContext* ctx,
                                                 const v1::CloseSessionRequest* request,
                                                 v1::CloseSessionResponse*) {
  ServerUnaryReactor* reactor = ctx->DefaultReactor();
  engine_->CloseSession(request->session(), ReplyStatus(reactor));
  return reactor;
}

grpc::ServerReadReactor<v1::LoadModuleRequest>* GpuExecService::LoadModule(
    CallbackServerContext*, v1::LoadModuleResponse* response) {
  return new LoadModuleReactor(engine_, response);
}

ServerUnaryReactor* GpuExecService::GetFunction(CallbackServerContext* ctx,
                                                const v1::GetFunctionRequest* request,
                                                v1::GetFunctionResponse* response) {
  ServerUnaryReactor* reactor = ctx->DefaultReactor();
  engine_->GetFunction(
      request->session(), request->module(), request->name(),
      Reply<core::FunctionResult>(
          reactor, [response](const core::FunctionResult& f) { ToProto(f, response); }));
  return reactor;
}

ServerUnaryReactor* GpuExecService::Allocate(CallbackServerContext* ctx,
                                             const v1::AllocateRequest* request,
                                             v1::AllocateResponse* response) {
  ServerUnaryReactor* reactor = ctx->DefaultReactor();
  engine_->Allocate(request->session(), request->size(),
                    Reply<core::BufferInfo>(reactor, [response](const core::BufferInfo& b) {
                      response->set_buffer(b.handle);
                      response->set_size(b.size);
                    }));
  return reactor;
}

ServerUnaryReactor* GpuExecService::Free(CallbackServerContext* ctx, const v1::FreeRequest* request,
                                         v1::FreeResponse*) {
  ServerUnaryReactor* reactor = ctx->DefaultReactor();
  engine_->Free(request->session(), request->buffer(), ReplyStatus(reactor));
  return reactor;
}

ServerUnaryReactor* GpuExecService::Memset(CallbackServerContext* ctx,
                                           const v1::MemsetRequest* request, v1::MemsetResponse*) {
  ServerUnaryReactor* reactor = ctx->DefaultReactor();
  engine_->Memset(request->session(), request->buffer(), request->offset(), request->size(),
                  request->value(), ReplyStatus(reactor));
  return reactor;
}

ServerUnaryReactor* GpuExecService::CopyBuffer(CallbackServerContext* ctx,
                                               const v1::CopyBufferRequest* r,
                                               v1::CopyBufferResponse*) {
  ServerUnaryReactor* reactor = ctx->DefaultReactor();
  engine_->CopyBuffer(r->session(), r->dst(), r->dst_offset(), r->src(), r->src_offset(), r->size(),
                      ReplyStatus(reactor));
  return reactor;
}

grpc::ServerReadReactor<v1::WriteRequest>* GpuExecService::Write(CallbackServerContext*,
                                                                 v1::WriteResponse* response) {
  return new WriteReactor(engine_, response);
}

grpc::ServerWriteReactor<v1::ReadResponse>* GpuExecService::Read(CallbackServerContext*,
                                                                 const v1::ReadRequest* request) {
  return new ReadReactor(engine_, request);
}

ServerUnaryReactor* GpuExecService::Launch(CallbackServerContext* ctx,
                                           const v1::LaunchRequest* request,
                                           v1::LaunchResponse* response) {
  auto spec = FromProto(*request);
  if (!spec.ok()) return FinishWith(ctx, spec.status());
  ServerUnaryReactor* reactor = ctx->DefaultReactor();
  engine_->Launch(std::move(spec).value(), Reply<uint64_t>(reactor, [response](uint64_t ns) {
                    response->set_gpu_time_ns(ns);
                  }));
  return reactor;
}

ServerUnaryReactor* GpuExecService::Synchronize(CallbackServerContext* ctx,
                                                const v1::SynchronizeRequest* request,
                                                v1::SynchronizeResponse* response) {
  ServerUnaryReactor* reactor = ctx->DefaultReactor();
  engine_->Synchronize(request->session(), Reply<uint64_t>(reactor, [response](uint64_t ns) {
                         response->set_gpu_time_ns(ns);
                       }));
  return reactor;
}

}  // namespace gpuexec::rpc
