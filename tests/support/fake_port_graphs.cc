// FakePort's graphs: the nodes as built, replayed in order on the port's
// thread by the same paths as a launch, a memset and a copy.
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tests/support/fake_port.h"

namespace gpuexec::testing {

absl::Status FakePort::RunMemoryNodeLocked(const port::GraphNodeOp& node) {
  if (const auto* m = std::get_if<port::GraphMemset>(&node.op)) {
    uint8_t* p = MemoryLocked(m->ptr, m->size);
    if (p == nullptr) return absl::InternalError(absl::StrCat(node.what, ": outside live memory"));
    std::memset(p, m->value, m->size);
    return absl::OkStatus();
  }
  const auto& c = std::get<port::GraphCopy>(node.op);
  uint8_t* d = MemoryLocked(c.dst, c.size);
  uint8_t* src = MemoryLocked(c.src, c.size);
  if (d == nullptr || src == nullptr) {
    return absl::InternalError(absl::StrCat(node.what, ": outside live memory"));
  }
  std::memmove(d, src, c.size);
  return absl::OkStatus();
}

void FakePort::BuildGraph(port::StreamId, port::GraphId graph, std::vector<port::GraphNodeOp> nodes,
                          uint64_t epoch, std::string what, port::Callback<port::GraphBuilt> done) {
  Post([this, graph, nodes = std::move(nodes), epoch, what = std::move(what),
        done = std::move(done)]() mutable {
    port::GraphBuilt built;
    {
      absl::MutexLock lock(&mu_);
      if (absl::Status st = EpochCheck(epoch, what); !st.ok()) return done(st);
      if (nodes.empty() || graphs_.contains(graph)) {
        return done(absl::InternalError(absl::StrCat(what, ": no nodes, or its id is taken")));
      }
      for (const port::GraphNodeOp& n : nodes) {
        const auto* op = std::get_if<port::LaunchOp>(&n.op);
        if (op != nullptr && !kernel_names_.contains(op->kernel)) {
          return done(absl::InternalError(absl::StrCat(n.what, ": kernel id unknown")));
        }
      }
      built.nodes = static_cast<uint32_t>(nodes.size());
      built.instantiate_ns = 1000;
      graphs_[graph] = Graph{epoch_, std::move(nodes)};
    }
    done(built);
  });
}

void FakePort::LaunchGraph(port::StreamId stream, port::GraphId graph,
                           std::vector<port::GraphPatchOp> patches, uint64_t epoch,
                           std::string what, port::Done done) {
  Post([this, stream, graph, patches = std::move(patches), epoch, what = std::move(what),
        done = std::move(done)]() mutable {
    std::vector<port::GraphNodeOp> nodes;
    // Answered outside the lock, as a worker's answers come: the engine's
    // callbacks take its own locks.
    absl::Status refused;
    {
      absl::MutexLock lock(&mu_);
      refused = EpochCheck(epoch, what);
      auto it = graphs_.find(graph);
      if (refused.ok() && it == graphs_.end()) {
        refused = absl::InternalError(absl::StrCat(what, ": unknown"));
      }
      for (size_t i = 0; refused.ok() && i < patches.size(); ++i) {
        port::GraphPatchOp& p = patches[i];
        auto* op = p.node < it->second.nodes.size()
                       ? std::get_if<port::LaunchOp>(&it->second.nodes[p.node].op)
                       : nullptr;
        if (op == nullptr || p.param_block.size() != op->param_block.size()) {
          refused = absl::InternalError(
              absl::StrCat(what, ": patch of node ", p.node, " is not a kernel node's"));
          break;
        }
        op->param_block = std::move(p.param_block);
        op->tensor_maps = std::move(p.tensor_maps);
      }
      if (refused.ok()) {
        ++graph_launches_;
        nodes = it->second.nodes;
      }
    }
    if (!refused.ok()) return done(refused);
    for (port::GraphNodeOp& n : nodes) {
      absl::Status st;
      if (auto* op = std::get_if<port::LaunchOp>(&n.op)) {
        st = RunLaunch(stream, *op, epoch);
      } else {
        absl::MutexLock lock(&mu_);
        st = EpochCheck(epoch, n.what);
        if (st.ok()) st = RunMemoryNodeLocked(n);
      }
      if (!st.ok()) return done(st);
    }
    done(absl::OkStatus());
  });
}

void FakePort::DestroyGraph(port::StreamId, port::GraphId graph, uint64_t epoch, port::Done done) {
  Post([this, graph, epoch, done = std::move(done)] {
    {
      absl::MutexLock lock(&mu_);
      // A graph of an earlier epoch went with the reset.
      if (epoch == 0 || epoch == epoch_) graphs_.erase(graph);
    }
    done(absl::OkStatus());
  });
}

size_t FakePort::live_graphs() const {
  absl::MutexLock lock(&mu_);
  return graphs_.size();
}

uint64_t FakePort::graph_launches() const {
  absl::MutexLock lock(&mu_);
  return graph_launches_;
}

}  // namespace gpuexec::testing
