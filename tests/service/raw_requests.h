#ifndef GPUEXEC_TESTS_SERVICE_RAW_REQUESTS_H_
#define GPUEXEC_TESTS_SERVICE_RAW_REQUESTS_H_

// Requests sent on the generated stub, as the client library would never
// send them, for the hostile half of the service suite.

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gpuexec/client.h"
#include "gpuexec/grpc_status.h"
#include "gpuexec/v1/gpuexec.grpc.pb.h"

namespace gpuexec::testing {

inline void SetDeadline(grpc::ClientContext* context) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
}

inline absl::Status RawRead(v1::GpuExec::Stub& stub, const std::string& session, uint64_t buffer,
                            uint64_t offset, uint64_t size) {
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::ReadRequest request;
  request.set_session(session);
  request.set_buffer(buffer);
  request.set_offset(offset);
  request.set_size(size);
  auto reader = stub.Read(&context, request);
  v1::ReadResponse response;
  while (reader->Read(&response)) {
  }
  return FromGrpcStatus(reader->Finish());
}

inline absl::Status RawAllocate(v1::GpuExec::Stub& stub, const std::string& session,
                                uint64_t size) {
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::AllocateRequest request;
  request.set_session(session);
  request.set_size(size);
  v1::AllocateResponse response;
  return FromGrpcStatus(stub.Allocate(&context, request, &response));
}

inline absl::Status RawGetFunction(v1::GpuExec::Stub& stub, const std::string& session,
                                   uint64_t module, const std::string& name) {
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::GetFunctionRequest request;
  request.set_session(session);
  request.set_module(module);
  request.set_name(name);
  v1::GetFunctionResponse response;
  return FromGrpcStatus(stub.GetFunction(&context, request, &response));
}

// A launch of `function` with grid = block = 1 and `args`.
inline absl::Status RawLaunch(v1::GpuExec::Stub& stub, const std::string& session,
                              uint64_t function, std::vector<v1::Arg> args = {}) {
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::LaunchRequest request;
  request.set_session(session);
  request.set_function(function);
  for (v1::Dim3* d : {request.mutable_grid(), request.mutable_block()}) {
    d->set_x(1);
    d->set_y(1);
    d->set_z(1);
  }
  for (v1::Arg& arg : args) *request.add_args() = std::move(arg);
  request.set_synchronize(true);
  v1::LaunchResponse response;
  return FromGrpcStatus(stub.Launch(&context, request, &response));
}

// One LoadModule stream: `messages` in order, then WritesDone.
inline absl::Status RawLoadModule(v1::GpuExec::Stub& stub,
                                  const std::vector<v1::LoadModuleRequest>& messages,
                                  v1::LoadModuleResponse* response = nullptr) {
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::LoadModuleResponse ignored;
  auto writer = stub.LoadModule(&context, response != nullptr ? response : &ignored);
  for (const v1::LoadModuleRequest& message : messages) {
    if (!writer->Write(message)) break;
  }
  writer->WritesDone();
  return FromGrpcStatus(writer->Finish());
}

inline v1::LoadModuleRequest Header(const std::string& session, const std::string& sha256,
                                    uint64_t size, ModuleKind kind) {
  v1::LoadModuleRequest request;
  v1::ModuleHeader* header = request.mutable_header();
  header->set_session(session);
  header->set_sha256(sha256);
  header->set_size(size);
  header->set_kind(kind == ModuleKind::kPtx      ? v1::MODULE_KIND_PTX
                   : kind == ModuleKind::kFatbin ? v1::MODULE_KIND_FATBIN
                                                 : v1::MODULE_KIND_CUBIN);
  return request;
}

inline v1::LoadModuleRequest Chunk(std::string_view bytes) {
  v1::LoadModuleRequest request;
  request.set_chunk(std::string(bytes));
  return request;
}

// Header and the bytes in 4 KiB chunks.
inline std::vector<v1::LoadModuleRequest> Upload(v1::LoadModuleRequest header,
                                                 std::string_view bytes) {
  std::vector<v1::LoadModuleRequest> messages = {std::move(header)};
  for (size_t at = 0; at < bytes.size(); at += 4096) {
    messages.push_back(Chunk(bytes.substr(at, 4096)));
  }
  return messages;
}

inline v1::Arg BufferArg(uint64_t buffer, uint64_t offset = 0) {
  v1::Arg arg;
  arg.mutable_buffer()->set_buffer(buffer);
  arg.mutable_buffer()->set_offset(offset);
  return arg;
}

}  // namespace gpuexec::testing

#endif  // GPUEXEC_TESTS_SERVICE_RAW_REQUESTS_H_
