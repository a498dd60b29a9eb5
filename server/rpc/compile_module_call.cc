// CompileModule: source compiled by the daemon's compile service
// (server/compile), then stored and loaded as any uploaded image is.

#include <atomic>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gpuexec/sha256.h"
#include "server/common/text.h"
#include "server/compile/compile_service.h"
#include "server/rpc/service_calls.h"

namespace gpuexec::rpc {
namespace calls {
namespace {

using CompileModule = Unary<v1::CompileModuleRequest, v1::CompileModuleResponse>;

// The request's text moved out of it: a call that waits for a compile
// another call started keeps no copy of the source and headers it sent.
compile::CompileInput TakeInput(v1::CompileModuleRequest* r) {
  compile::CompileInput in;
  in.source = std::move(*r->mutable_source());
  in.source_name = r->source_name();
  for (v1::CompileHeader& h : *r->mutable_headers()) {
    in.headers.push_back({h.name(), std::move(*h.mutable_content())});
  }
  r->clear_headers();
  r->clear_source();
  in.options.assign(r->options().begin(), r->options().end());
  in.name_expressions.assign(r->name_expressions().begin(), r->name_expressions().end());
  return in;
}

// Images in answers not yet delivered (return_image), all calls together:
// bounded, so that clients that never read their answers cannot make the
// daemon hold copies of cached images without end.
constexpr int64_t kMaxReturningBytes = int64_t{256} << 20;
std::atomic<int64_t> g_returning_bytes{0};

struct Returning {
  explicit Returning(int64_t b) : bytes(b) {}
  ~Returning() { g_returning_bytes.fetch_sub(bytes); }
  const int64_t bytes;
};

// The largest image an answer carries back (return_image): clients take
// answers of 64 MiB (client.h's max_message_bytes), with room for the log.
constexpr size_t kMaxReturnedImageBytes = size_t{48} << 20;

// The compiled image loaded into the call's session: by its SHA-256 alone
// first where the answer came from the cache (the daemon's store most
// likely holds it: no copy and no hashing of up to 64 MiB per hit), with
// its bytes otherwise or where the store no longer holds it.
void LoadCompiled(core::Engine* engine, CompileModule* call,
                  std::shared_ptr<const compile::CompiledModule> module, bool cached,
                  bool with_bytes) {
  const std::string& image = module->image;
  auto upload = engine->BeginModuleUpload(
      call->caller(), call->request().session(), module->sha256, image.size(),
      module->image_is_ptx ? core::ModuleKind::kPtx : core::ModuleKind::kCubin);
  if (!upload.ok()) return call->Finish(upload.status());
  if (with_bytes) {
    if (absl::Status added = (*upload)->AddChunk(image); !added.ok()) return call->Finish(added);
  }
  core::ModuleUpload* raw = upload->get();
  raw->Finish([engine, call, module, cached, with_bytes,
               upload = std::shared_ptr<core::ModuleUpload>(std::move(*upload))](
                  absl::StatusOr<core::ModuleResult> loaded) {
    if (!with_bytes && absl::IsNotFound(loaded.status())) {
      // Not held any more: again with the bytes, hashed off this thread.
      return call->env().uploads->Post(
          [engine, call, module, cached] { LoadCompiled(engine, call, module, cached, true); });
    }
    if (loaded.ok()) {
      v1::CompileModuleResponse* r = call->response();
      r->set_module(loaded->handle);
      r->set_sha256(loaded->sha256);
      r->set_cached(cached);
      r->set_log(module->log);
      r->set_log_bytes(module->log_bytes);
      for (const auto& [expression, lowered] : module->lowered_names) {
        v1::LoweredName* l = r->add_lowered_names();
        l->set_name_expression(expression);
        l->set_lowered_name(lowered);
      }
      for (const std::string& k : loaded->kernels) r->add_kernels(k);
      r->set_arch(module->arch);
      r->set_nvrtc_version(module->nvrtc_version);
      r->set_compile_time_us(static_cast<uint64_t>(absl::ToInt64Microseconds(module->took)));
      r->set_image_is_ptx(module->image_is_ptx);
      if (call->request().return_image()) r->set_image(module->image);
    }
    call->Finish(loaded.status());
  });
}

// A compile's answer: the image's room in the answer reserved where it is
// to be returned, then loaded.
void Answer(core::Engine* engine, CompileModule* call,
            std::shared_ptr<const compile::CompiledModule> module, bool cached) {
  const std::string& image = module->image;
  if (call->request().return_image()) {
    if (image.size() > kMaxReturnedImageBytes) {
      return call->Finish(absl::ResourceExhaustedError(absl::StrCat(
          "the compiled image is ", image.size(), " bytes, more than the ", kMaxReturnedImageBytes,
          " an answer carries back (return_image); compile it without return_image to load it "
          "into the session")));
    }
    const int64_t bytes = static_cast<int64_t>(image.size());
    if (g_returning_bytes.fetch_add(bytes) + bytes > kMaxReturningBytes) {
      g_returning_bytes.fetch_sub(bytes);
      return call->Finish(absl::ResourceExhaustedError(absl::StrCat(
          "the daemon's answers carry ", ByteSize(kMaxReturningBytes),
          " of compiled images their clients have not read yet, its limit; retry shortly, or "
          "compile without return_image")));
    }
    call->Hold(std::make_shared<Returning>(bytes));
  }
  LoadCompiled(engine, call, std::move(module), cached, /*with_bytes=*/!cached);
}

}  // namespace

void ListenCompileModule(const Env* env, grpc::ServerCompletionQueue* cq) {
  ListenUnary<CompileModule>(
      env, cq, &AsyncService::RequestCompileModule, [](core::Engine* engine, CompileModule* call) {
        if (call->env().compiles == nullptr) {
          return call->Finish(absl::FailedPreconditionError(absl::StrCat(
              "this daemon cannot compile kernels from source: ", call->env().compile_unavailable,
              "; compile elsewhere and send the cubin with LoadModule")));
        }
        auto cc = engine->SessionComputeCapability(call->caller(), call->request().session());
        if (!cc.ok()) return call->Finish(cc.status());
        // The checks and the key read every byte sent: off the polling
        // thread, which every other client's messages wait for.
        call->env().uploads->Post([engine, call, cc = *cc] {
          const core::Caller& caller = call->caller();
          const std::string& tenant = caller.tenant_name();
          // Without tenants (the implicit tenant itself, not one a tenants
          // file names "default"), each client host has its own count.
          const std::string principal =
              caller.tenant == core::DefaultTenant() ? core::PeerHost(caller.peer) : tenant;
          call->env().compiles->Compile(
              tenant, principal, TakeInput(call->mutable_request()), cc.first, cc.second,
              [engine, call](absl::StatusOr<compile::CompileAnswer> answer) {
                if (!answer.ok()) return call->Finish(answer.status());
                Answer(engine, call, answer->module, answer->cached);
              },
              caller.tenant != nullptr ? static_cast<int>(caller.tenant->limits.max_compiles) : 0);
        });
      });
}

}  // namespace calls
}  // namespace gpuexec::rpc
