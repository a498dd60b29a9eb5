#include "server/worker/convert.h"

#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"

namespace gpuexec::worker {

void ToProto(const absl::Status& st, Status* out) {
  out->set_code(static_cast<int32_t>(st.code()));
  out->set_message(std::string(st.message()));
}

absl::Status FromProto(const Status& st) {
  return absl::Status(static_cast<absl::StatusCode>(st.code()), st.message());
}

void ToProto(const port::KernelInfo& k, KernelInfo* out) {
  for (const port::ParamInfo& p : k.params) {
    ParamInfo* q = out->add_params();
    q->set_offset(p.offset);
    q->set_size(p.size);
  }
  out->set_param_bytes(k.param_bytes);
  const port::FunctionAttributes& a = k.attributes;
  out->set_num_registers(a.num_registers);
  out->set_static_shared_bytes(a.static_shared_bytes);
  out->set_const_bytes(a.const_bytes);
  out->set_local_bytes(a.local_bytes);
  out->set_max_threads_per_block(a.max_threads_per_block);
  out->set_max_dynamic_shared_bytes(a.max_dynamic_shared_bytes);
  out->set_ptx_version(a.ptx_version);
  out->set_binary_version(a.binary_version);
}

port::KernelInfo FromProto(const KernelInfo& k, uint64_t id) {
  port::KernelInfo out;
  out.id = id;
  for (const ParamInfo& p : k.params()) out.params.push_back(port::ParamInfo{p.offset(), p.size()});
  out.param_bytes = k.param_bytes();
  port::FunctionAttributes& a = out.attributes;
  a.num_registers = k.num_registers();
  a.static_shared_bytes = k.static_shared_bytes();
  a.const_bytes = k.const_bytes();
  a.local_bytes = k.local_bytes();
  a.max_threads_per_block = k.max_threads_per_block();
  a.max_dynamic_shared_bytes = k.max_dynamic_shared_bytes();
  a.ptx_version = k.ptx_version();
  a.binary_version = k.binary_version();
  return out;
}

void ToProto(const port::DeviceProperties& p, DeviceProperties* out) {
  out->set_ordinal(p.ordinal);
  out->set_name(p.name);
  out->set_cc_major(p.cc_major);
  out->set_cc_minor(p.cc_minor);
  out->set_total_memory(p.total_memory);
  out->set_multiprocessors(p.multiprocessors);
  out->set_max_threads_per_block(p.max_threads_per_block);
  for (int i = 0; i < 3; ++i) {
    out->add_max_block(p.max_block[i]);
    out->add_max_grid(p.max_grid[i]);
  }
  out->set_max_shared_per_block(p.max_shared_per_block);
  out->set_max_shared_per_block_optin(p.max_shared_per_block_optin);
  out->set_cluster_launch(p.cluster_launch);
  out->set_memory_pools(p.memory_pools);
}

port::DeviceProperties FromProto(const DeviceProperties& p) {
  port::DeviceProperties out;
  out.ordinal = p.ordinal();
  out.name = p.name();
  out.cc_major = p.cc_major();
  out.cc_minor = p.cc_minor();
  out.total_memory = p.total_memory();
  out.multiprocessors = p.multiprocessors();
  out.max_threads_per_block = p.max_threads_per_block();
  for (int i = 0; i < 3 && i < p.max_block_size(); ++i) out.max_block[i] = p.max_block(i);
  for (int i = 0; i < 3 && i < p.max_grid_size(); ++i) out.max_grid[i] = p.max_grid(i);
  out.max_shared_per_block = p.max_shared_per_block();
  out.max_shared_per_block_optin = p.max_shared_per_block_optin();
  out.cluster_launch = p.cluster_launch();
  out.memory_pools = p.memory_pools();
  return out;
}

void ToProto(const port::LaunchGeometry& g, Geometry* out) {
  for (int i = 0; i < 3; ++i) {
    out->add_grid(g.grid[i]);
    out->add_block(g.block[i]);
    out->add_cluster(g.cluster[i]);
  }
  out->set_shared_bytes(g.shared_bytes);
  out->set_cooperative(g.cooperative);
  out->set_programmatic_dependent(g.programmatic_dependent);
  out->set_non_portable_cluster(g.non_portable_cluster);
  out->set_cluster_policy(g.cluster_policy);
}

void FromProto(const Geometry& g, port::LaunchGeometry* out) {
  for (int i = 0; i < 3; ++i) {
    if (i < g.grid_size()) out->grid[i] = g.grid(i);
    if (i < g.block_size()) out->block[i] = g.block(i);
    if (i < g.cluster_size()) out->cluster[i] = g.cluster(i);
  }
  out->shared_bytes = g.shared_bytes();
  out->cooperative = g.cooperative();
  out->programmatic_dependent = g.programmatic_dependent();
  out->non_portable_cluster = g.non_portable_cluster();
  out->cluster_policy = g.cluster_policy();
}

void ToProto(const port::DirectAnswer& a, DirectAnswer* out) {
  out->set_area(a.area);
  out->set_id(a.id);
  out->set_seq(a.seq);
  out->set_kind(a.kind);
  out->set_untimed(a.untimed);
}

void ToProto(const port::TensorMapEncoding& m, TensorMap* out) {
  out->set_param_offset(m.param_offset);
  out->set_param_index(m.param_index);
  out->set_address(m.address);
  out->set_data_type(m.data_type);
  for (uint32_t i = 0; i < m.rank && i < port::kMaxTensorRank; ++i) {
    out->add_dims(m.dims[i]);
    out->add_box(m.box[i]);
    out->add_element_strides(m.element_strides[i]);
    if (i > 0) out->add_strides(m.strides[i - 1]);
  }
  out->set_interleave(m.interleave);
  out->set_swizzle(m.swizzle);
  out->set_l2_promotion(m.l2_promotion);
  out->set_oob_fill(m.oob_fill);
}

absl::Status FromProto(const TensorMap& m, port::TensorMapEncoding* out) {
  const int rank = m.dims_size();
  if (rank < 1 || rank > port::kMaxTensorRank || m.box_size() != rank ||
      m.element_strides_size() != rank || m.strides_size() != rank - 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a tensor map of rank ", rank, " with ", m.box_size(), " box, ", m.element_strides_size(),
        " element stride and ", m.strides_size(), " stride entries"));
  }
  out->param_offset = m.param_offset();
  out->param_index = m.param_index();
  out->address = m.address();
  out->data_type = m.data_type();
  out->rank = static_cast<uint32_t>(rank);
  for (int i = 0; i < rank; ++i) {
    out->dims[i] = m.dims(i);
    out->box[i] = m.box(i);
    out->element_strides[i] = m.element_strides(i);
    if (i > 0) out->strides[i - 1] = m.strides(i - 1);
  }
  out->interleave = m.interleave();
  out->swizzle = m.swizzle();
  out->l2_promotion = m.l2_promotion();
  out->oob_fill = m.oob_fill();
  return absl::OkStatus();
}

namespace {

absl::Status TensorMapsFrom(const google::protobuf::RepeatedPtrField<TensorMap>& in,
                            std::vector<port::TensorMapEncoding>* out) {
  out->reserve(in.size());
  for (const TensorMap& m : in) {
    port::TensorMapEncoding e;
    GPUEXEC_RETURN_IF_ERROR(FromProto(m, &e));
    out->push_back(e);
  }
  return absl::OkStatus();
}

}  // namespace

void ToProto(port::GraphNodeOp& n, BuildGraph::Node* out) {
  if (auto* op = std::get_if<port::LaunchOp>(&n.op)) {
    auto* k = out->mutable_kernel();
    k->set_kernel(op->kernel);
    ToProto(op->geometry, k->mutable_geometry());
    k->set_params(std::move(op->param_block));
    for (const port::TensorMapEncoding& m : op->tensor_maps) ToProto(m, k->add_tensor_maps());
    k->set_what(std::move(n.what.empty() ? op->what : n.what));
  } else if (auto* m = std::get_if<port::GraphMemset>(&n.op)) {
    auto* o = out->mutable_memset();
    o->set_ptr(m->ptr);
    o->set_value(m->value);
    o->set_size(m->size);
    o->set_what(std::move(n.what));
  } else {
    const auto& c = std::get<port::GraphCopy>(n.op);
    auto* o = out->mutable_copy();
    o->set_dst(c.dst);
    o->set_src(c.src);
    o->set_size(c.size);
    o->set_what(std::move(n.what));
  }
}

absl::Status FromProto(BuildGraph::Node& n, port::GraphNodeOp* out) {
  switch (n.op_case()) {
    case BuildGraph::Node::kKernel: {
      BuildGraph::Kernel* k = n.mutable_kernel();
      port::LaunchOp op;
      op.kernel = k->kernel();
      FromProto(k->geometry(), &op.geometry);
      op.param_block = std::move(*k->mutable_params());
      GPUEXEC_RETURN_IF_ERROR(TensorMapsFrom(k->tensor_maps(), &op.tensor_maps));
      op.what = k->what();
      out->what = std::move(*k->mutable_what());
      out->op = std::move(op);
      return absl::OkStatus();
    }
    case BuildGraph::Node::kMemset: {
      const BuildGraph::Memset& m = n.memset();
      out->op = port::GraphMemset{m.ptr(), static_cast<uint8_t>(m.value()), m.size()};
      out->what = std::move(*n.mutable_memset()->mutable_what());
      return absl::OkStatus();
    }
    case BuildGraph::Node::kCopy: {
      const BuildGraph::Copy& c = n.copy();
      out->op = port::GraphCopy{c.dst(), c.src(), c.size()};
      out->what = std::move(*n.mutable_copy()->mutable_what());
      return absl::OkStatus();
    }
    case BuildGraph::Node::OP_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("a node of no kind (neither kernel, memset nor copy)");
}

void ToProto(port::GraphPatchOp& p, LaunchGraph::Patch* out) {
  out->set_node(p.node);
  out->set_params(std::move(p.param_block));
  for (const port::TensorMapEncoding& m : p.tensor_maps) ToProto(m, out->add_tensor_maps());
}

absl::Status FromProto(LaunchGraph::Patch& p, port::GraphPatchOp* out) {
  out->node = p.node();
  out->param_block = std::move(*p.mutable_params());
  return TensorMapsFrom(p.tensor_maps(), &out->tensor_maps);
}

}  // namespace gpuexec::worker
