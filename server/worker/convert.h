#ifndef GPUEXEC_SERVER_WORKER_CONVERT_H_
#define GPUEXEC_SERVER_WORKER_CONVERT_H_

// worker.proto messages <-> the device layer's types, for both ends.

#include "absl/status/status.h"
#include "server/cuda/driver.h"
#include "server/device/device.h"
#include "worker.pb.h"

namespace gpuexec::worker {

void ToProto(const absl::Status& st, Status* out);
absl::Status FromProto(const Status& st);

void ToProto(const device::KernelInfo& k, KernelInfo* out);
device::KernelInfo FromProto(const KernelInfo& k, uint64_t id);

void ToProto(const cuda::DeviceProperties& p, DeviceProperties* out);
cuda::DeviceProperties FromProto(const DeviceProperties& p);

void ToProto(const cuda::LaunchGeometry& g, Geometry* out);
void FromProto(const Geometry& g, cuda::LaunchGeometry* out);

}  // namespace gpuexec::worker

#endif  // GPUEXEC_SERVER_WORKER_CONVERT_H_
