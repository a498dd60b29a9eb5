#ifndef GPUEXEC_GRPC_STATUS_H_
#define GPUEXEC_GRPC_STATUS_H_

// The one place where absl::Status and grpc::Status meet. Both share the
// canonical code numbering; the conversion keeps code and message unchanged
// in both directions.

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace gpuexec {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

grpc::StatusCode ToGrpcCode(absl::StatusCode code);
absl::StatusCode FromGrpcCode(grpc::StatusCode code);

}  // namespace gpuexec

#endif  // GPUEXEC_GRPC_STATUS_H_
