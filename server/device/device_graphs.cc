// A device's CUDA graphs: built node by node on a stream's behalf (a
// kernel, a memset or a copy each, after the one before), instantiated and
// uploaded; replayed as one launch, with kernel nodes patched first; freed
// once the stream has passed the work queued before. Each lives in its
// stream's state and goes with the stream.
#include <chrono>
#include <utility>
#include <variant>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"
#include "server/device/device.h"
#include "server/device/device_internal.h"

namespace gpuexec::device {

using internal::kSmallOpBytes;
using internal::ParamPointers;

void Device::BuildGraph(StreamId stream, GraphId graph, std::vector<port::GraphNodeOp> nodes,
                        std::string what, Callback<port::GraphBuilt> done) {
  size_t bytes = kSmallOpBytes + what.size();
  for (const port::GraphNodeOp& n : nodes) {
    const auto* op = std::get_if<LaunchOp>(&n.op);
    bytes += kSmallOpBytes + n.what.size() + (op != nullptr ? op->param_block.size() : 0);
  }
  OnStream(
      stream, OpKind::kOther, bytes,
      [this, stream, graph, nodes = std::move(nodes), what = std::move(what), done]() mutable {
        auto ready = ReadyStream(stream);
        if (!ready.ok()) return done(ready.status());
        done(BuildOn(**ready, graph, nodes, what));
      },
      [done](absl::Status st) { done(st); });
}

absl::StatusOr<port::GraphBuilt> Device::BuildOn(StreamState& s, GraphId graph,
                                                 std::vector<port::GraphNodeOp>& nodes,
                                                 const std::string& what) {
  if (!driver_->has_graphs()) {
    // The driver's own words say what it lacks and what to do.
    const absl::Status lacks = driver_->CreateGraph(what).status();
    return absl::FailedPreconditionError(absl::StrCat(
        "device ", props_.ordinal, "'s driver has no CUDA graphs (CUDA 12.0 or newer needed): ",
        what, " cannot be built: ", lacks.message()));
  }
  if (s.part != nullptr) {
    // A kernel node runs in its function's context, and whether a replay
    // on a green context's stream stays on that part's SMs is not known:
    // refused rather than let a graph leave a compute share.
    return absl::FailedPreconditionError(absl::StrCat(
        what,
        " cannot be built: its session's stream runs on a compute share (a green context "
        "of device ",
        props_.ordinal,
        "), where graphs are not served yet; launch the "
        "kernels one by one"));
  }
  // The front checked both.
  if (nodes.empty())
    return absl::InternalError(absl::StrCat(what, ": graph ", graph, " has no nodes"));
  if (s.graphs.contains(graph)) {
    return absl::InternalError(absl::StrCat(what, ": the session's stream on device ",
                                            props_.ordinal, " has a graph ", graph, " already"));
  }
  const auto began = std::chrono::steady_clock::now();
  auto g = std::make_shared<GraphState>();
  auto made = driver_->CreateGraph(what);
  if (!made.ok()) return Check(made.status());
  g->graph = std::move(made).value();
  cuda::GraphNode after = nullptr;
  for (size_t i = 0; i < nodes.size(); ++i) {
    port::GraphNodeOp& n = nodes[i];
    absl::StatusOr<cuda::GraphNode> added;
    if (auto* op = std::get_if<LaunchOp>(&n.op)) {
      // The node's name is the one its errors give.
      if (!n.what.empty()) op->what = n.what;
      GPUEXEC_ASSIGN_OR_RETURN(KernelEntry * k, PrepareKernel(*op));
      GraphState::KernelNode node{nullptr, k->function, op->geometry, k->info.params,
                                  std::move(op->param_block)};
      absl::InlinedVector<void*, 16> params = ParamPointers(node.layout, node.params);
      added = driver_->AddKernelNode(g->graph, after, node.function, node.geometry,
                                     params.empty() ? nullptr : params.data(), op->what);
      if (added.ok()) {
        node.node = *added;
        g->kernels.emplace(static_cast<uint32_t>(i), std::move(node));
        if (g->kernel == 0) g->kernel = op->kernel;
      }
    } else if (const auto* m = std::get_if<port::GraphMemset>(&n.op)) {
      // Of no bytes, nothing to do, as on a stream (the driver refuses an
      // empty node).
      if (m->size == 0) continue;
      added = driver_->AddMemsetNode(g->graph, after, m->ptr, m->value, m->size, n.what);
    } else {
      const auto& c = std::get<port::GraphCopy>(n.op);
      if (c.size == 0) continue;
      added = driver_->AddCopyNode(g->graph, after, c.dst, c.src, c.size, n.what);
    }
    if (!added.ok()) return Check(added.status());
    after = *added;
  }
  auto exec = driver_->Instantiate(g->graph, what);
  if (!exec.ok()) return Check(exec.status());
  g->exec = std::move(exec).value();
  GPUEXEC_RETURN_IF_ERROR(Check(driver_->Upload(g->exec, s.stream.get(), what)));
  // Queued on the stream, untimed: a Synchronize waits for it.
  s.work_end_passed = s.work_end != nullptr;
  const auto took = std::chrono::steady_clock::now() - began;
  s.graphs.emplace(graph, std::move(g));
  return port::GraphBuilt{
      static_cast<uint32_t>(nodes.size()),
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(took).count())};
}

void Device::LaunchGraph(StreamId stream, GraphId graph, std::vector<port::GraphPatchOp> patches,
                         std::string what, Done done) {
  size_t bytes = kSmallOpBytes + what.size();
  for (const port::GraphPatchOp& p : patches) {
    bytes += p.param_block.size() + p.tensor_maps.size() * sizeof(port::TensorMapEncoding);
  }
  OnStream(
      stream, OpKind::kLaunch, bytes,
      [this, stream, graph, patches = std::move(patches), what = std::move(what), done]() mutable {
        auto ready = ReadyStream(stream);
        absl::Status st =
            ready.ok() ? ReplayOn(stream, **ready, graph, patches, what) : ready.status();
        EndRunOnFailure(stream, st);
        done(st);
      },
      done);
}

absl::Status Device::ReplayOn(StreamId stream, StreamState& s, GraphId graph,
                              std::vector<port::GraphPatchOp>& patches, std::string& what) {
  auto it = s.graphs.find(graph);
  if (it == s.graphs.end()) {
    return absl::InternalError(absl::StrCat(what, ": graph ", graph,
                                            " is not built on the session's stream on device ",
                                            props_.ordinal));
  }
  GraphState& g = *it->second;
  // Every patch is checked before any is applied.
  for (const port::GraphPatchOp& p : patches) {
    auto k = g.kernels.find(p.node);
    if (k == g.kernels.end() || p.param_block.size() != k->second.params.size()) {
      return absl::InternalError(
          absl::StrCat(what, ": a patch of node ", p.node, " with ", p.param_block.size(),
                       " bytes of parameters is not one of a kernel node of graph ", graph));
    }
  }
  for (port::GraphPatchOp& p : patches) {
    GraphState::KernelNode& k = g.kernels.find(p.node)->second;
    const std::string node_what = absl::StrCat("kernel node ", p.node, " of ", what);
    GPUEXEC_RETURN_IF_ERROR(EncodeTensorMaps(p.tensor_maps, p.param_block, node_what));
    absl::InlinedVector<void*, 16> params = ParamPointers(k.layout, p.param_block);
    GPUEXEC_RETURN_IF_ERROR(
        Check(driver_->SetKernelNodeParams(g.exec, k.node, k.function, k.geometry,
                                           params.empty() ? nullptr : params.data(), node_what)));
    // The driver copied them; the block stays as the node's current one.
    k.params = std::move(p.param_block);
  }
  return LaunchWatched(
      stream, s, what, g.kernel, graph,
      [&](CUstream_st* on, const std::string& name) {
        return driver_->LaunchGraph(g.exec, on, name);
      },
      nullptr);
}

void Device::DestroyGraph(StreamId stream, GraphId graph, Done done) {
  OnStream(
      stream, OpKind::kRelease, kSmallOpBytes,
      [this, stream, graph, done]() mutable {
        auto it = streams_.find(stream);
        if (it == streams_.end()) return done(absl::OkStatus());  // gone with its stream
        auto found = it->second->graphs.find(graph);
        if (found == it->second->graphs.end()) return done(absl::OkStatus());
        std::shared_ptr<GraphState> g = std::move(found->second);
        it->second->graphs.erase(found);
        if (!healthy()) {
          g.reset();
          return done(absl::OkStatus());
        }
        // Destroyed on the executor once the stream has passed the replays
        // queued before: the completion comes on a driver thread, where no
        // driver call may be made.
        absl::Status st = WhenDone(
            *it->second,
            [this, g = std::move(g), done](absl::Status) mutable {
              executor_.Post([this, g = std::move(g), done]() mutable {
                SettleDueEnd();  // (StreamState::end_due)
                g.reset();
                done(absl::OkStatus());
              });
            },
            absl::StrCat("freeing graph ", graph, " on device ", props_.ordinal));
        if (!st.ok()) done(absl::OkStatus());
      },
      done);
}

}  // namespace gpuexec::device
