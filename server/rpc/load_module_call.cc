// LoadModule: a module image streamed in chunks, hashed off the polling
// thread, checked and stored.
#include "server/rpc/service_calls.h"

namespace gpuexec::rpc {
namespace calls {
namespace {

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
            for (const std::string& k : r->kernels) response_.add_kernels(k);
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

}  // namespace

void ListenLoadModule(const GpuExecService::Env* env, grpc::ServerCompletionQueue* cq) {
  (new LoadModuleCall(env))->Listen(cq);
}

}  // namespace calls
}  // namespace gpuexec::rpc
