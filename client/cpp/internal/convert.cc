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

void ToProto(const LaunchConfig& config, v1::LaunchRequest* out) {
  *out->mutable_grid() = ToProto(config.grid);
  *out->mutable_block() = ToProto(config.block);
  out->set_shared_memory_bytes(config.shared_memory_bytes);
  if (config.cluster) *out->mutable_cluster() = ToProto(*config.cluster);
  out->set_cooperative(config.cooperative);
  out->set_programmatic_dependent_launch(config.programmatic_dependent_launch);
  out->set_non_portable_cluster(config.non_portable_cluster);
  out->set_cluster_scheduling_policy(ToProto(config.cluster_scheduling_policy));
}

v1::ClusterSchedulingPolicy ToProto(ClusterSchedulingPolicy policy) {
  switch (policy) {
    case ClusterSchedulingPolicy::kDefault:
      return v1::CLUSTER_SCHEDULING_POLICY_DEFAULT;
    case ClusterSchedulingPolicy::kSpread:
      return v1::CLUSTER_SCHEDULING_POLICY_SPREAD;
    case ClusterSchedulingPolicy::kLoadBalancing:
      return v1::CLUSTER_SCHEDULING_POLICY_LOAD_BALANCING;
  }
  return v1::CLUSTER_SCHEDULING_POLICY_DEFAULT;
}

void ToProto(const TensorMap& map, uint64_t buffer, uint64_t offset, v1::TensorMapArg* out) {
  out->mutable_global()->set_buffer(buffer);
  out->mutable_global()->set_offset(offset);
  // The protocol's data types are the driver's plus one (0 is unspecified).
  out->set_data_type(static_cast<v1::TensorMapArg::DataType>(static_cast<int>(map.data_type) + 1));
  for (uint64_t d : map.global_dims) out->add_global_dims(d);
  for (uint64_t s : map.global_strides) out->add_global_strides(s);
  for (uint32_t b : map.box_dims) out->add_box_dims(b);
  for (uint32_t e : map.element_strides) out->add_element_strides(e);
  // The enums below list the driver's values in the driver's order.
  out->set_interleave(static_cast<v1::TensorMapArg::Interleave>(map.interleave));
  out->set_swizzle(static_cast<v1::TensorMapArg::Swizzle>(map.swizzle));
  out->set_l2_promotion(static_cast<v1::TensorMapArg::L2Promotion>(map.l2_promotion));
  out->set_oob_fill(static_cast<v1::TensorMapArg::OobFill>(map.oob_fill));
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
  info.compute_share_sms = d.compute_share_sms();
  info.compute_share_own = d.compute_share_own();
  info.pending_requests = d.pending_requests();
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
