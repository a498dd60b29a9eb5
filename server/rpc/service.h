#ifndef GPUEXEC_SERVER_RPC_SERVICE_H_
#define GPUEXEC_SERVER_RPC_SERVICE_H_

// The gRPC handlers of gpuexec.v1.GpuExec, served on completion queues (see
// async_call.h): each turns its request into a core::Engine call and the
// engine's completion into the response and status. No handler thread waits
// on the GPU.

#include <grpcpp/grpcpp.h>

#include <string>
#include <utility>

#include "gpuexec/v1/gpuexec.grpc.pb.h"
#include "gpuexec/version.h"
#include "server/compile/compile_service.h"
#include "server/core/engine.h"
#include "server/rpc/async_call.h"
#include "server/rpc/call_budget.h"
#include "server/rpc/copy_pool.h"
#include "server/rpc/identity.h"

namespace gpuexec::rpc {

class GpuExecService {
 public:
  // Every call is identified by `identity` before it reaches the engine.
  // `shm_socket`: the host memory socket's path, told to callers on the
  // daemon's Unix socket when they open a session (empty: none served).
  // `advertise_address`: what ListDevices reports as the daemon's own
  // address (empty: not given). `daemon_version`: what ListDevices and
  // OpenSession report as the daemon's version (empty: gpuexec::kVersion).
  // `limits`: what one session's and one tenant's streaming calls may hold
  // (call_budget.h). `command_ring_version`: the command ring layout served
  // on `shm_socket` (0: none), told with it. `copy_threads`: the threads
  // that copy Write data into staging and serialize and send Read chunks
  // (with TLS, a Read's encryption runs on them: give them as many as the
  // threads that decrypt).
  GpuExecService(core::Engine* engine, Identity* identity, std::string shm_socket = "",
                 std::string advertise_address = "", std::string daemon_version = "",
                 CallLimits limits = {}, uint32_t command_ring_version = 0, int copy_threads = 2)
      : budget_(limits),
        copies_(copy_threads),
        env_{&async_,
             engine,
             identity,
             &calls_,
             &copies_,
             &uploads_,
             &budget_,
             std::move(shm_socket),
             std::move(advertise_address),
             daemon_version.empty() ? std::string(kVersion) : std::move(daemon_version),
             command_ring_version} {}

  // Kernels from source: `compiles` (outlives the service's calls), or
  // null and why there is none. Before Listen.
  void SetCompiler(compile::CompileService* compiles, std::string unavailable) {
    env_.compiles = compiles;
    env_.nvrtc_version = compiles != nullptr ? compiles->compiler().nvrtc_version() : "";
    env_.compile_unavailable = std::move(unavailable);
  }

  // A Drain call's deadline when it names none (--drain_deadline). Before
  // Listen.
  void SetDrainDeadline(absl::Duration deadline) { env_.drain_deadline = deadline; }

  // To register with the server builder.
  grpc::Service* service() { return &async_; }
  // Listens for calls of every method on `cq` (after the server started).
  void Listen(grpc::ServerCompletionQueue* cq);
  // Blocks until every call has ended; after the server's Shutdown, while
  // its completion queues are still polled.
  void WaitForCalls() { calls_.WaitForZero(); }
  // What the streaming calls hold now (tests).
  const CallBudget& budget() const { return budget_; }
  // For the command rings, which are admitted as command streams.
  CallBudget* mutable_budget() { return &budget_; }

  // What every call of the service shares.
  // Write, Read and Execute are served raw (write_call.cc, read_call.cc,
  // execute_call.cc).
  using AsyncService = v1::GpuExec::WithRawMethod_Write<v1::GpuExec::WithRawMethod_Execute<
      v1::GpuExec::WithRawMethod_Read<v1::GpuExec::AsyncService>>>;

  struct Env {
    AsyncService* service;
    core::Engine* engine;
    Identity* identity;
    CallCounter* calls;
    CopyPool* copies;
    // Module uploads' hashing and checks: off the polling thread, and off
    // the copies' threads.
    CopyPool* uploads;
    // Streaming calls per session and their buffered bytes per tenant.
    CallBudget* budget;
    std::string shm_socket;
    std::string advertise_address;
    std::string daemon_version;
    uint32_t command_ring_version = 0;
    // Kernels from source (CompileModule): the daemon's compile service, or
    // null and why not.
    compile::CompileService* compiles = nullptr;
    std::string nvrtc_version{};
    std::string compile_unavailable = "the daemon was started without a compiler";
    // What a drain gives open sessions when its call names no deadline.
    absl::Duration drain_deadline = absl::Seconds(60);
  };

 private:
  AsyncService async_;
  CallCounter calls_;
  CallBudget budget_;
  CopyPool copies_;
  CopyPool uploads_{2};
  Env env_;
};

}  // namespace gpuexec::rpc

#endif  // GPUEXEC_SERVER_RPC_SERVICE_H_
