#include "server/rpc/service.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gpuexec/grpc_status.h"
#include "gpuexec/wire.h"
#include "server/rpc/convert.h"
#include "server/rpc/observability.h"
#include "server/rpc/service_calls.h"
#include "server/rpc/wire.h"

namespace gpuexec::rpc {

using calls::ListenUnary;
using calls::Reply;
using calls::ReplyStatus;
using calls::Unary;

void GpuExecService::Listen(grpc::ServerCompletionQueue* cq) {
  const Env* env = &env_;
  using S = AsyncService;
  calls::ListenExecute(env, cq);
  calls::ListenWrite(env, cq);
  calls::ListenRead(env, cq);
  calls::ListenLoadModule(env, cq);
  calls::ListenCompileModule(env, cq);
  calls::ListenDrain(env, cq);

  using ListDevices = Unary<v1::ListDevicesRequest, v1::ListDevicesResponse>;
  ListenUnary<ListDevices>(
      env, cq, &S::RequestListDevices, [](core::Engine* engine, ListDevices* call) {
        engine->ListDevices(
            call->caller(),
            Reply<std::vector<core::DeviceStatus>>(
                call,
                [engine, address = call->env().advertise_address,
                 version = call->env().daemon_version, nvrtc = call->env().nvrtc_version,
                 unavailable = call->env().compile_unavailable](
                    const std::vector<core::DeviceStatus>& devices, v1::ListDevicesResponse* r) {
                  for (const auto& d : devices) ToProto(d, r->add_devices());
                  r->set_daemon_address(address);
                  r->set_daemon_version(version);
                  r->set_draining(engine->drain_state().Describe());
                  if (!nvrtc.empty()) {
                    r->set_nvrtc_version(nvrtc);
                  } else {
                    r->set_compile_unavailable(unavailable);
                  }
                }));
      });

  using OpenSession = Unary<v1::OpenSessionRequest, v1::OpenSessionResponse>;
  ListenUnary<OpenSession>(
      env, cq, &S::RequestOpenSession, [](core::Engine* engine, OpenSession* call) {
        const v1::OpenSessionRequest& request = call->request();
        core::SessionAsk ask;
        if (request.has_device()) ask.device = request.device();
        ask.lease_ms = request.lease_ms();
        ask.memory_limit = request.memory_limit_bytes();
        ask.kernel_time_limit_ms = request.kernel_time_limit_ms();
        ask.untimed = request.untimed();
        // Only a caller on the daemon's Unix socket is on its host, and
        // told where the host memory socket is.
        std::string shm_socket;
        uint32_t ring_version = 0;
        if (absl::StartsWith(call->caller().peer, "unix:")) {
          shm_socket = call->env().shm_socket;
          ring_version = call->env().command_ring_version;
        }
        engine->OpenSession(
            call->caller(), ask,
            Reply<core::SessionInfo>(
                call, [shm_socket, ring_version, version = call->env().daemon_version](
                          const core::SessionInfo& s, v1::OpenSessionResponse* r) {
                  ToProto(s, r);
                  r->set_shm_socket(shm_socket);
                  r->set_command_ring_version(ring_version);
                  r->set_daemon_version(version);
                }));
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

  using BeginGraph = Unary<v1::BeginGraphRequest, v1::BeginGraphResponse>;
  ListenUnary<BeginGraph>(
      env, cq, &S::RequestBeginGraph, [](core::Engine* engine, BeginGraph* call) {
        call->Finish(engine->BeginGraph(call->caller(), call->request().session()));
      });

  using EndGraph = Unary<v1::EndGraphRequest, v1::EndGraphResponse>;
  ListenUnary<EndGraph>(env, cq, &S::RequestEndGraph, [](core::Engine* engine, EndGraph* call) {
    engine->EndGraph(
        call->caller(), call->request().session(),
        Reply<core::GraphInfo>(call, [](const core::GraphInfo& g, v1::EndGraphResponse* r) {
          r->set_graph(g.handle);
          r->set_nodes(g.nodes);
          r->set_instantiate_ns(g.instantiate_ns);
        }));
  });

  using LaunchGraph = Unary<v1::LaunchGraphRequest, v1::LaunchGraphResponse>;
  ListenUnary<LaunchGraph>(
      env, cq, &S::RequestLaunchGraph, [](core::Engine* engine, LaunchGraph* call) {
        auto spec = FromProto(call->request());
        if (!spec.ok()) return call->Finish(spec.status());
        engine->LaunchGraph(call->caller(), std::move(spec).value(),
                            Reply<uint64_t>(call, [](uint64_t ns, v1::LaunchGraphResponse* r) {
                              r->set_gpu_time_ns(ns);
                            }));
      });

  using FreeGraph = Unary<v1::FreeGraphRequest, v1::FreeGraphResponse>;
  ListenUnary<FreeGraph>(env, cq, &S::RequestFreeGraph, [](core::Engine* engine, FreeGraph* call) {
    engine->FreeGraph(call->caller(), call->request().session(), call->request().graph(),
                      ReplyStatus(call));
  });
}

}  // namespace gpuexec::rpc
