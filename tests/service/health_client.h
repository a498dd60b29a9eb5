#ifndef GPUEXEC_TESTS_SERVICE_HEALTH_CLIENT_H_
#define GPUEXEC_TESTS_SERVICE_HEALTH_CLIENT_H_

// Asks a server's grpc.health.v1 service about `service`.

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <string>

#include "grpc/health/v1/health.grpc.pb.h"

namespace gpuexec::testing {

using HealthStatus = grpc::health::v1::HealthCheckResponse;

// The status reported, or UNKNOWN when the call itself failed.
inline HealthStatus::ServingStatus Health(const std::string& target, const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  HealthStatus response;
  return stub->Check(&ctx, request, &response).ok() ? response.status() : HealthStatus::UNKNOWN;
}

}  // namespace gpuexec::testing

#endif  // GPUEXEC_TESTS_SERVICE_HEALTH_CLIENT_H_
