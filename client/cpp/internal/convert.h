#ifndef GPUEXEC_CLIENT_CPP_INTERNAL_CONVERT_H_
#define GPUEXEC_CLIENT_CPP_INTERNAL_CONVERT_H_

// Conversions between the client's types and the protocol's, the calls'
// deadlines, and the status of an unusable object.

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gpuexec/client.h"
#include "gpuexec/grpc_status.h"
#include "gpuexec/sha256.h"
#include "gpuexec/v1/gpuexec.grpc.pb.h"
#include "gpuexec/wire.h"
#include "internal/channel_internal.h"
#include "internal/status_macros_internal.h"

namespace gpuexec {
namespace internal {

enum class CallKind { kControl, kData, kCleanup };

// Applies the per-call deadline of `kind` from the client options.
void SetDeadline(grpc::ClientContext* context, const ClientOptions& options, CallKind kind);

absl::Status Unusable(const char* what);

v1::Dim3 ToProto(const Dim3& d);

// The launch's shape and flags: grid, block, shared memory, cluster,
// cooperative, programmatic dependent launch, non-portable cluster and the
// cluster scheduling policy.
void ToProto(const LaunchConfig& config, v1::LaunchRequest* out);

v1::ClusterSchedulingPolicy ToProto(ClusterSchedulingPolicy policy);

// `map` over byte `offset` of buffer `buffer`.
void ToProto(const TensorMap& map, uint64_t buffer, uint64_t offset, v1::TensorMapArg* out);

DeviceInfo FromProto(const v1::Device& d);

v1::ModuleKind ToProto(ModuleKind kind);

}  // namespace internal
}  // namespace gpuexec

#endif  // GPUEXEC_CLIENT_CPP_INTERNAL_CONVERT_H_
