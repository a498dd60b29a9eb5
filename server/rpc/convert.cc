#include "server/rpc/convert.h"

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/common/text.h"
#include "server/core/args.h"

namespace gpuexec::rpc {

void ToProto(const core::DeviceStatus& in, v1::Device* out) {
  out->set_index(in.index);
  out->set_name(in.name);
  out->set_compute_capability_major(in.cc_major);
  out->set_compute_capability_minor(in.cc_minor);
  out->set_memory_total_bytes(in.memory_total);
  out->set_memory_free_bytes(in.memory_free);
  out->set_healthy(in.healthy);
  out->set_multiprocessor_count(in.multiprocessors);
  out->set_compute_share_sms(in.share_sms);
  out->set_compute_share_own(in.share_own);
  out->set_modules_loaded(in.modules_loaded);
  out->set_module_loads_total(in.module_loads_total);
  out->set_sessions(in.sessions);
  out->set_resets(in.resets);
  out->set_epoch(in.epoch);
  out->set_last_reset(in.last_reset);
  out->set_workers(in.workers);
  out->set_own_worker(in.own_worker);
  out->set_pending_requests(in.pending_requests);
  if (in.not_answering_since.has_value()) {
    out->set_not_answering_since(
        absl::FormatTime("%Y-%m-%d %H:%M:%E3S UTC", *in.not_answering_since, absl::UTCTimeZone()));
  }
}

void ToProto(const core::SessionInfo& in, v1::OpenSessionResponse* out) {
  out->set_session(in.token);
  out->set_device(in.device);
  out->set_lease_ms(in.lease_ms);
  out->set_memory_limit_bytes(in.memory_limit);
  out->set_memory_limit_capped(in.memory_capped);
  out->set_kernel_time_limit_ms(in.kernel_time_limit_ms);
  out->set_untimed(in.untimed);
}

void ToProto(const core::FunctionResult& in, v1::GetFunctionResponse* out) {
  out->set_function(in.handle);
  for (const port::ParamInfo& p : in.kernel.params) {
    v1::ParamInfo* q = out->add_params();
    q->set_offset(p.offset);
    q->set_size(p.size);
  }
  const port::FunctionAttributes& a = in.kernel.attributes;
  v1::FunctionAttributes* attrs = out->mutable_attributes();
  attrs->set_num_registers(a.num_registers);
  attrs->set_static_shared_bytes(a.static_shared_bytes);
  attrs->set_const_bytes(a.const_bytes);
  attrs->set_local_bytes(a.local_bytes);
  attrs->set_max_threads_per_block(a.max_threads_per_block);
  attrs->set_max_dynamic_shared_bytes(a.max_dynamic_shared_bytes);
  attrs->set_ptx_version(a.ptx_version);
  attrs->set_binary_version(a.binary_version);
}

core::ModuleKind FromProto(v1::ModuleKind kind) {
  switch (kind) {
    case v1::MODULE_KIND_CUBIN:
      return core::ModuleKind::kCubin;
    case v1::MODULE_KIND_PTX:
      return core::ModuleKind::kPtx;
    case v1::MODULE_KIND_FATBIN:
      return core::ModuleKind::kFatbin;
    default:
      return core::ModuleKind::kUnspecified;
  }
}

absl::StatusOr<core::ArgValue> FromProto(const v1::Arg& arg, size_t index) {
  using K = core::ArgValue::Kind;
  switch (arg.value_case()) {
    case v1::Arg::kBuffer:
      return core::ArgValue::Buffer(arg.buffer().buffer(), arg.buffer().offset());
    case v1::Arg::kI8:
      return core::ArgValue::Signed(K::kI8, arg.i8());
    case v1::Arg::kI16:
      return core::ArgValue::Signed(K::kI16, arg.i16());
    case v1::Arg::kI32:
      return core::ArgValue::Signed(K::kI32, arg.i32());
    case v1::Arg::kI64:
      return core::ArgValue::Signed(K::kI64, arg.i64());
    case v1::Arg::kU8:
      return core::ArgValue::Unsigned(K::kU8, arg.u8());
    case v1::Arg::kU16:
      return core::ArgValue::Unsigned(K::kU16, arg.u16());
    case v1::Arg::kU32:
      return core::ArgValue::Unsigned(K::kU32, arg.u32());
    case v1::Arg::kU64:
      return core::ArgValue::Unsigned(K::kU64, arg.u64());
    case v1::Arg::kF16:
      return core::ArgValue::Float(K::kF16, arg.f16());
    case v1::Arg::kBf16:
      return core::ArgValue::Float(K::kBF16, arg.bf16());
    case v1::Arg::kF16Value:
      return core::ArgValue::Float(K::kF16, arg.f16_value());
    case v1::Arg::kBf16Value:
      return core::ArgValue::Float(K::kBF16, arg.bf16_value());
    case v1::Arg::kF16Bits:
      return core::ArgValue::HalfBits(K::kF16, arg.f16_bits());
    case v1::Arg::kBf16Bits:
      return core::ArgValue::HalfBits(K::kBF16, arg.bf16_bits());
    case v1::Arg::kF32:
      return core::ArgValue::Float(K::kF32, arg.f32());
    case v1::Arg::kF64:
      return core::ArgValue::Float(K::kF64, arg.f64());
    case v1::Arg::kRaw:
      return core::ArgValue::Raw(arg.raw());
    case v1::Arg::kNullPointer:
      return core::ArgValue::Null();
    case v1::Arg::kTensorMap: {
      const v1::TensorMapArg& t = arg.tensor_map();
      core::TensorMapArg m;
      // The driver's values are the API's less one; unspecified is -1, and
      // an unknown value (an open enumeration's number) -2.
      const int type = static_cast<int>(t.data_type());
      m.data_type = type == 0 ? -1 : (type > 0 && type <= 13 ? type - 1 : -2);
      // The rank is bounded by the core's check (the message size bounds
      // these copies).
      m.dims.assign(t.global_dims().begin(), t.global_dims().end());
      m.strides.assign(t.global_strides().begin(), t.global_strides().end());
      m.box.assign(t.box_dims().begin(), t.box_dims().end());
      m.element_strides.assign(t.element_strides().begin(), t.element_strides().end());
      // Open enumerations: an unknown value arrives as a number, checked by
      // the core.
      m.interleave = static_cast<uint32_t>(t.interleave());
      m.swizzle = static_cast<uint32_t>(t.swizzle());
      m.l2_promotion = static_cast<uint32_t>(t.l2_promotion());
      m.oob_fill = static_cast<uint32_t>(t.oob_fill());
      return core::ArgValue::TensorMap(t.global().buffer(), t.global().offset(), std::move(m));
    }
    case v1::Arg::VALUE_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat("argument ", index, " carries no value"));
}

absl::StatusOr<core::LaunchSpec> FromProto(const v1::LaunchRequest& r) {
  if (r.args_size() > core::kMaxLaunchArgs) {
    return absl::InvalidArgumentError(
        absl::StrCat("Launch of function ", core::HandleName(r.function()), " of session ",
                     Quoted(r.session().substr(0, 8)), ": ", r.args_size(), " arguments, at most ",
                     core::kMaxLaunchArgs,
                     " (a kernel's parameters fit in 32764 bytes); pass one argument per "
                     "parameter of the kernel, and larger data in a buffer"));
  }
  core::LaunchSpec spec;
  spec.session = r.session();
  spec.function = r.function();
  // y and z of 0 read as 1 (proto3 cannot tell unset from 0); x of 0 is an
  // error the engine names.
  auto one_if_zero = [](uint32_t v) { return v == 0 ? 1u : v; };
  spec.grid = {r.grid().x(), one_if_zero(r.grid().y()), one_if_zero(r.grid().z())};
  spec.block = {r.block().x(), one_if_zero(r.block().y()), one_if_zero(r.block().z())};
  spec.cluster = {r.cluster().x(), r.cluster().y(), r.cluster().z()};
  spec.shared_bytes = r.shared_memory_bytes();
  spec.synchronize = r.synchronize();
  spec.cooperative = r.cooperative();
  spec.programmatic_dependent = r.programmatic_dependent_launch();
  spec.non_portable_cluster = r.non_portable_cluster();
  // An unknown policy arrives as its number; the core names it.
  spec.cluster_policy = static_cast<uint32_t>(r.cluster_scheduling_policy());
  spec.args.reserve(r.args_size());
  for (int i = 0; i < r.args_size(); ++i) {
    auto a = FromProto(r.args(i), static_cast<size_t>(i));
    if (!a.ok()) return a.status();
    spec.args.push_back(std::move(a).value());
  }
  return spec;
}

absl::StatusOr<core::LaunchGraphSpec> FromProto(const v1::LaunchGraphRequest& r) {
  if (static_cast<size_t>(r.patches_size()) > core::kMaxGraphPatches) {
    return absl::InvalidArgumentError(
        absl::StrCat("LaunchGraph of graph ", core::HandleName(r.graph()), ": ", r.patches_size(),
                     " patches, more than one replay may carry (", core::kMaxGraphPatches, ")"));
  }
  core::LaunchGraphSpec spec;
  spec.session = r.session();
  spec.graph = r.graph();
  spec.synchronize = r.synchronize();
  spec.patches.reserve(r.patches_size());
  for (int i = 0; i < r.patches_size(); ++i) {
    const v1::GraphPatch& p = r.patches(i);
    auto value = FromProto(p.value(), p.argument());
    if (!value.ok()) {
      return absl::Status(value.status().code(),
                          absl::StrCat("LaunchGraph: patch ", i, " (node ", p.node(),
                                       "): ", value.status().message()));
    }
    spec.patches.push_back(core::GraphPatch{p.node(), p.argument(), std::move(value).value()});
  }
  return spec;
}

absl::StatusOr<core::Command> FromProto(const v1::Command& c) {
  core::Command out;
  out.id = c.id();
  out.reply = c.reply();
  switch (c.op_case()) {
    case v1::Command::kLaunch: {
      auto spec = FromProto(c.launch());
      if (!spec.ok()) return spec.status();
      out.op = *std::move(spec);
      break;
    }
    case v1::Command::kSynchronize:
      out.op = core::Command::Synchronize{};
      break;
    case v1::Command::kAllocate:
      out.op = core::Command::Allocate{c.allocate().size()};
      break;
    case v1::Command::kFree:
      out.op = core::Command::Free{c.free().buffer()};
      break;
    case v1::Command::kMemset: {
      const v1::MemsetRequest& m = c.memset();
      out.op = core::Command::Memset{m.buffer(), m.offset(), m.size(), m.value()};
      break;
    }
    case v1::Command::kCopyBuffer: {
      const v1::CopyBufferRequest& r = c.copy_buffer();
      out.op =
          core::Command::CopyBuffer{r.dst(), r.dst_offset(), r.src(), r.src_offset(), r.size()};
      break;
    }
    case v1::Command::kRegionCopy: {
      const v1::RegionCopyRequest& r = c.region_copy();
      if (r.direction() != v1::RegionCopyRequest::TO_BUFFER &&
          r.direction() != v1::RegionCopyRequest::TO_REGION) {
        return absl::InvalidArgumentError("RegionCopy: direction must be TO_BUFFER or TO_REGION");
      }
      core::RegionCopySpec spec;
      spec.region = r.region();
      spec.region_offset = r.region_offset();
      spec.buffer = r.buffer();
      spec.buffer_offset = r.buffer_offset();
      spec.size = r.size();
      spec.to_buffer = r.direction() == v1::RegionCopyRequest::TO_BUFFER;
      out.op = spec;
      break;
    }
    case v1::Command::kReleaseRegion:
      out.op = core::Command::ReleaseRegion{c.release_region().region()};
      break;
    case v1::Command::kLaunchGraph: {
      auto spec = FromProto(c.launch_graph());
      if (!spec.ok()) return spec.status();
      out.op = *std::move(spec);
      break;
    }
    case v1::Command::kBeginGraph:
      out.op = core::Command::BeginGraph{};
      break;
    case v1::Command::kEndGraph:
      out.op = core::Command::EndGraph{};
      break;
    case v1::Command::OP_NOT_SET:
      out.op = core::Command::Barrier{};
      break;
  }
  return out;
}

const char* CommandName(const v1::Command& c) {
  switch (c.op_case()) {
    case v1::Command::kLaunch:
      return "Launch";
    case v1::Command::kSynchronize:
      return "Synchronize";
    case v1::Command::kAllocate:
      return "Allocate";
    case v1::Command::kFree:
      return "Free";
    case v1::Command::kMemset:
      return "Memset";
    case v1::Command::kCopyBuffer:
      return "CopyBuffer";
    case v1::Command::kRegionCopy:
      return "RegionCopy";
    case v1::Command::kReleaseRegion:
      return "ReleaseRegion";
    case v1::Command::kLaunchGraph:
      return "LaunchGraph";
    case v1::Command::kBeginGraph:
      return "BeginGraph";
    case v1::Command::kEndGraph:
      return "EndGraph";
    case v1::Command::OP_NOT_SET:
      break;
  }
  return "barrier";
}

void ToProto(const core::CommandResult& in, v1::CommandResult* out) {
  out->set_id(in.id);
  out->set_code(static_cast<int>(in.status.code()));
  if (!in.status.ok()) out->set_message(std::string(in.status.message()));
  if (in.status.ok() && in.gpu_time_ns != 0) out->set_gpu_time_ns(in.gpu_time_ns);
  if (in.allocated.has_value()) {
    out->mutable_allocate()->set_buffer(in.allocated->handle);
    out->mutable_allocate()->set_size(in.allocated->size);
  }
  if (in.graph.has_value()) {
    out->mutable_end_graph()->set_graph(in.graph->handle);
    out->mutable_end_graph()->set_nodes(in.graph->nodes);
    out->mutable_end_graph()->set_instantiate_ns(in.graph->instantiate_ns);
  }
}

}  // namespace gpuexec::rpc
