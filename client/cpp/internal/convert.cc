#include "internal/convert.h"

namespace gpuexec {
namespace internal {

void SetDeadline(grpc::ClientContext* context, const ClientOptions& options, CallKind kind) {
  absl::Duration timeout = kind == CallKind::kControl ? options.control_timeout
                           : kind == CallKind::kData  ? options.data_timeout
                                                      : options.cleanup_timeout;
  if (timeout == absl::InfiniteDuration()) return;
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

absl::Status Unusable(const char* what) {
  return absl::FailedPreconditionError(absl::StrCat(
      "gpuexec client: ", what, " is empty (default-constructed or moved from); no call was made"));
}

v1::Dim3 ToProto(const Dim3& d) {
  v1::Dim3 out;
  out.set_x(d.x);
  out.set_y(d.y);
  out.set_z(d.z);
  return out;
}

DeviceInfo FromProto(const v1::Device& d) {
  DeviceInfo info;
  info.index = d.index();
  info.name = d.name();
  info.compute_capability_major = d.compute_capability_major();
  info.compute_capability_minor = d.compute_capability_minor();
  info.memory_total_bytes = d.memory_total_bytes();
  info.memory_free_bytes = d.memory_free_bytes();
  info.healthy = d.healthy();
  info.multiprocessor_count = d.multiprocessor_count();
  info.modules_loaded = d.modules_loaded();
  info.module_loads_total = d.module_loads_total();
  info.sessions = d.sessions();
  info.resets = d.resets();
  info.epoch = d.epoch();
  info.last_reset = d.last_reset();
  info.not_answering_since = d.not_answering_since();
  info.workers = d.workers();
  info.own_worker = d.own_worker();
  return info;
}

v1::ModuleKind ToProto(ModuleKind kind) {
  switch (kind) {
    case ModuleKind::kCubin:
      return v1::MODULE_KIND_CUBIN;
    case ModuleKind::kPtx:
      return v1::MODULE_KIND_PTX;
    case ModuleKind::kFatbin:
      return v1::MODULE_KIND_FATBIN;
  }
  return v1::MODULE_KIND_UNSPECIFIED;
}

}  // namespace internal
}  // namespace gpuexec
