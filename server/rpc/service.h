#ifndef GPUEXEC_SERVER_RPC_SERVICE_H_
#define GPUEXEC_SERVER_RPC_SERVICE_H_

// The gRPC handlers of gpuexec.v1.GpuExec on the callback API: each turns
// its request into a core::Engine call and the engine's completion into the
// response and status. No handler thread waits on the GPU.

#include "gpuexec/v1/gpuexec.grpc.pb.h"
#include "server/core/engine.h"

namespace gpuexec::rpc {

class GpuExecService final : public v1::GpuExec::CallbackService {
 public:
  explicit GpuExecService(core::Engine* engine) : engine_(engine) {}

  grpc::ServerUnaryReactor* ListDevices(grpc::CallbackServerContext* ctx,
                                        const v1::ListDevicesRequest* request,
                                        v1::ListDevicesResponse* response) override;
  grpc::ServerUnaryReactor* OpenSession(grpc::CallbackServerContext* ctx,
                                        const v1::OpenSessionRequest* request,
                                        v1::OpenSessionResponse* response) override;
  grpc::ServerUnaryReactor* KeepAlive(grpc::CallbackServerContext* ctx,
                                      const v1::KeepAliveRequest* request,
                                      v1::KeepAliveResponse* response) override;
  grpc::ServerUnaryReactor* CloseSession(grpc::CallbackServerContext* ctx,
                                         const v1::CloseSessionRequest* request,
                                         v1::CloseSessionResponse* response) override;
  grpc::ServerReadReactor<v1::LoadModuleRequest>* LoadModule(
      grpc::CallbackServerContext* ctx, v1::LoadModuleResponse* response) override;
  grpc::ServerUnaryReactor* GetFunction(grpc::CallbackServerContext* ctx,
                                        const v1::GetFunctionRequest* request,
                                        v1::GetFunctionResponse* response) override;
  grpc::ServerUnaryReactor* Allocate(grpc::CallbackServerContext* ctx,
                                     const v1::AllocateRequest* request,
                                     v1::AllocateResponse* response) override;
  grpc::ServerUnaryReactor* Free(grpc::CallbackServerContext* ctx, const v1::FreeRequest* request,
                                 v1::FreeResponse* response) override;
  grpc::ServerUnaryReactor* Memset(grpc::CallbackServerContext* ctx,
                                   const v1::MemsetRequest* request,
                                   v1::MemsetResponse* response) override;
  grpc::ServerUnaryReactor* CopyBuffer(grpc::CallbackServerContext* ctx,
                                       const v1::CopyBufferRequest* request,
                                       v1::CopyBufferResponse* response) override;
  grpc::ServerReadReactor<v1::WriteRequest>* Write(grpc::CallbackServerContext* ctx,
                                                   v1::WriteResponse* response) override;
  grpc::ServerWriteReactor<v1::ReadResponse>* Read(grpc::CallbackServerContext* ctx,
                                                   const v1::ReadRequest* request) override;
  grpc::ServerUnaryReactor* Launch(grpc::CallbackServerContext* ctx,
                                   const v1::LaunchRequest* request,
                                   v1::LaunchResponse* response) override;
  grpc::ServerUnaryReactor* Synchronize(grpc::CallbackServerContext* ctx,
                                        const v1::SynchronizeRequest* request,
                                        v1::SynchronizeResponse* response) override;
  grpc::ServerBidiReactor<v1::ExecuteRequest, v1::ExecuteResponse>* Execute(
      grpc::CallbackServerContext* ctx) override;

 private:
  core::Engine* engine_;  // not owned; outlives the service
};

}  // namespace gpuexec::rpc

#endif  // GPUEXEC_SERVER_RPC_SERVICE_H_
