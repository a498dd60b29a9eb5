#ifndef GPUEXEC_SERVER_RPC_SERVICE_CALLS_H_
#define GPUEXEC_SERVER_RPC_SERVICE_CALLS_H_

// What the service's calls share (service.cc and the streaming calls, one
// file each: execute_call.cc, write_call.cc, read_call.cc,
// load_module_call.cc): identifying the caller, the unary call's shape,
// raw message parsing. Not for other users.

#include <algorithm>
#include <atomic>
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
#include "server/rpc/service.h"
#include "server/rpc/wire.h"

namespace gpuexec::rpc {
namespace calls {

using Env = GpuExecService::Env;
using AsyncService = GpuExecService::AsyncService;

// Who is calling, and the tenants file generation it was decided under.
inline absl::StatusOr<core::Caller> Identify(const Env* env, const grpc::ServerContext& ctx,
                                             uint64_t* generation) {
  *generation = env->identity->generation();
  return env->identity->Identify(ctx);
}

// A stream that started under an older tenants file identifies its caller
// again before it goes on: credentials revoked since end it, and the
// tenant's new limits apply to what it does next.
inline absl::Status Reidentify(const Env* env, const grpc::ServerContext& ctx, core::Caller* caller,
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
  Req* mutable_request() { return &this->request_; }
  const core::Caller& caller() const { return caller_; }
  // Keeps `hold` until the call is over (its answer delivered or dropped).
  void Hold(std::shared_ptr<void> hold) { hold_ = std::move(hold); }
  const Env& env() const { return *env_; }
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
  std::shared_ptr<void> hold_;
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
inline int FreeSlot(int n, int busy, const std::deque<int>& queued) {
  for (int i = 0; i < n; ++i) {
    if (i != busy && std::find(queued.begin(), queued.end(), i) == queued.end()) return i;
  }
  return -1;
}

// Each streaming method's first call, waiting for a client on `cq` (each
// call, once it has one, starts the next).
void ListenExecute(const GpuExecService::Env* env, grpc::ServerCompletionQueue* cq);
void ListenWrite(const GpuExecService::Env* env, grpc::ServerCompletionQueue* cq);
void ListenRead(const GpuExecService::Env* env, grpc::ServerCompletionQueue* cq);
void ListenLoadModule(const GpuExecService::Env* env, grpc::ServerCompletionQueue* cq);
void ListenCompileModule(const GpuExecService::Env* env, grpc::ServerCompletionQueue* cq);
// Drain, an operator's call (drain_call.cc).
void ListenDrain(const GpuExecService::Env* env, grpc::ServerCompletionQueue* cq);

// A test's seam: when set, run on the thread that delivers each of a
// Read's fetched chunks, after the call has taken it and before the call's
// next step; a test widens that window with it (a sleep) to show the call
// outlives it.
extern std::atomic<void (*)()> read_fetched_for_test;

}  // namespace calls
}  // namespace gpuexec::rpc

#endif  // GPUEXEC_SERVER_RPC_SERVICE_CALLS_H_
