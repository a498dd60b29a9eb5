#ifndef GPUEXEC_SERVER_WORKER_CONVERT_H_
#define GPUEXEC_SERVER_WORKER_CONVERT_H_

// worker.proto messages <-> the port's types, for both ends.

#include "absl/status/status.h"
#include "server/port/types.h"
#include "worker.pb.h"

namespace gpuexec::worker {

void ToProto(const absl::Status& st, Status* out);
absl::Status FromProto(const Status& st);

void ToProto(const port::KernelInfo& k, KernelInfo* out);
port::KernelInfo FromProto(const KernelInfo& k, uint64_t id);

void ToProto(const port::DeviceProperties& p, DeviceProperties* out);
port::DeviceProperties FromProto(const DeviceProperties& p);

void ToProto(const port::LaunchGeometry& g, Geometry* out);
void FromProto(const Geometry& g, port::LaunchGeometry* out);

void ToProto(const port::TensorMapEncoding& m, TensorMap* out);
// Where a waiting command's success may go (`posted` stays the front's).
void ToProto(const port::DirectAnswer& a, DirectAnswer* out);
// INVALID_ARGUMENT when the entries do not make one rank of 1 to 5.
absl::Status FromProto(const TensorMap& m, port::TensorMapEncoding* out);

// A graph's nodes and patches. The parameter blocks move: `n` and `p` are
// taken apart. INVALID_ARGUMENT for a node of no kind or a tensor map that
// is not one.
void ToProto(port::GraphNodeOp& n, BuildGraph::Node* out);
absl::Status FromProto(BuildGraph::Node& n, port::GraphNodeOp* out);
void ToProto(port::GraphPatchOp& p, LaunchGraph::Patch* out);
absl::Status FromProto(LaunchGraph::Patch& p, port::GraphPatchOp* out);

}  // namespace gpuexec::worker

#endif  // GPUEXEC_SERVER_WORKER_CONVERT_H_
