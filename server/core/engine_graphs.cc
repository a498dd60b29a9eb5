// Graphs: a session's launches, memsets and copies recorded between
// BeginGraph and EndGraph, each checked as when it runs, then built on the
// device as one CUDA graph and replayed with patched kernel arguments.
#include <map>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"
#include "server/core/engine.h"

namespace gpuexec::core {
namespace {

std::string GraphName(const Session& s, uint64_t handle) {
  return absl::StrCat("graph ", HandleName(handle), " of ", s.name());
}

}  // namespace

absl::Status Session::NotRecording(absl::string_view call) const {
  if (!recording.has_value()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(call, ": ", name(),
                   " is recording a graph, which takes launches, memsets and copies between "
                   "its buffers only; end it with EndGraph first"));
}

absl::Status Session::Refuse(absl::Status st) {
  if (!st.ok() && recording.has_value() && recording->refused.ok()) recording->refused = st;
  return st;
}

absl::Status Engine::BeginGraph(const Caller& caller, const std::string& token) {
  auto found = FindSession(caller, token);
  if (!found.ok()) return found.status();
  Session& s = **found;
  absl::MutexLock lock(&s.mu);
  if (s.closed) return s.ClosedError();
  if (s.recording.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "BeginGraph: ", s.name(), " is recording a graph already; end it with EndGraph first"));
  }
  if (s.graphs.size() + s.graphs_pending >= options_.max_graphs_per_session) {
    return absl::ResourceExhaustedError(
        absl::StrCat("BeginGraph: ", s.name(), " holds ", s.graphs.size() + s.graphs_pending,
                     " graphs, the most a session may (", options_.max_graphs_per_session,
                     "); free one with FreeGraph first"));
  }
  GPUEXEC_RETURN_IF_ERROR(s.CheckHandles(options_.max_handles_per_session, "a graph"));
  s.recording.emplace();
  return absl::OkStatus();
}

absl::Status Engine::RecordNodeLocked(Session& s, port::GraphNodeOp node,
                                      std::initializer_list<uint64_t> buffers, uint64_t epoch,
                                      uint64_t bytes) {
  Recording& rec = *s.recording;
  if (s.graph_bytes + bytes > kMaxSessionGraphBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the graphs of ", s.name(), " keep ", s.graph_bytes, " bytes of nodes in the daemon; ",
        bytes, " more would pass the limit of ", kMaxSessionGraphBytes,
        " bytes a session's graphs may keep: free a graph (FreeGraph) or record fewer nodes"));
  }
  // Checked, then charged: sessions of one tenant recording at once may
  // pass the bound by a node each.
  if (const uint64_t held = s.usage().graph_bytes.load();
      held + bytes > options_.tenant_graph_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the graphs of tenant '", s.usage().name, "' keep ", held,
        " bytes of nodes in the daemon; ", bytes, " more would pass the limit of ",
        options_.tenant_graph_bytes,
        " bytes a tenant's graphs may keep: free graphs (FreeGraph) or close sessions"));
  }
  if (rec.nodes.size() >= options_.max_graph_nodes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the graph ", s.name(), " is recording has ", rec.nodes.size(),
                     " nodes, the most a graph may have; end it with EndGraph and record another"));
  }
  if (epoch != 0 && rec.epoch != 0 && epoch != rec.epoch) {
    // The device was reset during the recording: its earlier nodes name
    // memory that is gone.
    return DeviceOf(s)->LostError(rec.epoch, "the graph being recorded");
  }
  if (epoch != 0) rec.epoch = epoch;
  s.ChargeGraphBytes(bytes);
  rec.bytes += bytes;
  node.what = absl::StrCat("node ", rec.nodes.size(), " (", node.what, ")");
  rec.nodes.push_back(std::move(node));
  rec.buffers.insert(buffers.begin(), buffers.end());
  return absl::OkStatus();
}

absl::Status Engine::RecordLaunchLocked(Session& s, LaunchSpec spec) {
  if (spec.synchronize) {
    return absl::FailedPreconditionError(
        absl::StrCat("a launch that waits for its kernel cannot be recorded: ", s.name(),
                     " is recording a graph; launch without waiting, and replay the graph with "
                     "LaunchGraph's synchronize"));
  }
  if (spec.programmatic_dependent) {
    return absl::InvalidArgumentError(
        absl::StrCat("a programmatic dependent launch cannot be recorded in a graph (", s.name(),
                     "): launch it without the attribute"));
  }
  uint64_t epoch = 0;
  std::vector<uint64_t> buffers;
  auto op = PackLaunch(s, spec, &epoch, &buffers);
  if (!op.ok()) return op.status();
  // What the node keeps here: its packed block, and its arguments for
  // patches.
  uint64_t bytes = 256 + 2 * op->param_block.size() + spec.args.size() * sizeof(ArgValue);
  for (const ArgValue& a : spec.args) bytes += a.raw.size();
  port::GraphNodeOp node;
  node.what = op->what;
  node.op = *std::move(op);
  const size_t index = s.recording->nodes.size();
  GPUEXEC_RETURN_IF_ERROR(RecordNodeLocked(s, std::move(node), {}, epoch, bytes));
  Recording& rec = *s.recording;
  rec.buffers.insert(buffers.begin(), buffers.end());
  rec.kernels.resize(index + 1);
  spec.synchronize = false;
  rec.kernels[index] = GraphKernel{std::move(spec), bytes};
  return absl::OkStatus();
}

absl::Status Engine::NotInGraph(const Session& s, uint64_t buffer) const {
  for (const auto& [handle, g] : s.graphs) {
    if (g.buffers.contains(buffer)) {
      return absl::FailedPreconditionError(
          absl::StrCat("buffer ", HandleName(buffer), " of ", s.name(), " is used by ",
                       GraphName(s, handle), "; free the graph first (FreeGraph)"));
    }
  }
  if (s.pending_graph_buffers.contains(buffer)) {
    return absl::FailedPreconditionError(
        absl::StrCat("buffer ", HandleName(buffer), " of ", s.name(),
                     " is used by a graph EndGraph is building; free the graph first (FreeGraph)"));
  }
  if (s.recording.has_value() && s.recording->buffers.contains(buffer)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "buffer ", HandleName(buffer), " of ", s.name(),
        " is used by the graph being recorded; end it with EndGraph, then free the graph first"));
  }
  return absl::OkStatus();
}

void Engine::EndGraph(const Caller& caller, const std::string& token, Callback<GraphInfo> done) {
  auto found = FindSession(caller, token);
  if (!found.ok()) return done(found.status());
  std::shared_ptr<Session> s = *found;
  absl::MutexLock lock(&s->mu);
  if (s->closed) return done(s->ClosedError());
  if (!s->recording.has_value()) {
    return done(absl::FailedPreconditionError(
        absl::StrCat("EndGraph: ", s->name(), " is not recording a graph; call BeginGraph first")));
  }
  Recording rec = *std::move(s->recording);
  s->recording.reset();
  if (!rec.refused.ok() || rec.nodes.empty()) s->ReleaseGraphBytes(rec.bytes);
  if (!rec.refused.ok()) {
    return done(absl::FailedPreconditionError(
        absl::StrCat("EndGraph: a command recorded into the graph of ", s->name(), " was refused (",
                     rec.refused.message(),
                     "), so the graph would lack it; no graph was made: record it again")));
  }
  if (rec.nodes.empty()) {
    return done(absl::InvalidArgumentError(
        absl::StrCat("EndGraph: the graph ", s->name(),
                     " recorded has no nodes; record launches, memsets or copies between "
                     "BeginGraph and EndGraph")));
  }
  port::DevicePort* dev = DeviceOf(*s);
  const uint64_t epoch = rec.epoch != 0 ? rec.epoch : dev->epoch();
  const port::GraphId id = next_graph_id_.fetch_add(1);
  ++s->handles_pending;
  ++s->graphs_pending;
  for (uint64_t b : rec.buffers) ++s->pending_graph_buffers[b];
  NoteWork(*s);
  GraphEntry entry;
  entry.id = id;
  entry.epoch = epoch;
  entry.nodes = static_cast<uint32_t>(rec.nodes.size());
  entry.kernels = std::move(rec.kernels);
  entry.kernels.resize(entry.nodes);
  entry.buffers = std::move(rec.buffers);
  entry.bytes = rec.bytes;
  dev->BuildGraph(
      s->stream(), id, std::move(rec.nodes), epoch, absl::StrCat("a graph of ", s->name()),
      [this, s, entry = std::move(entry), done](absl::StatusOr<port::GraphBuilt> built) mutable {
        absl::MutexLock lock(&s->mu);
        --s->handles_pending;
        --s->graphs_pending;
        for (uint64_t b : entry.buffers) {
          auto it = s->pending_graph_buffers.find(b);
          if (it != s->pending_graph_buffers.end() && --it->second == 0) {
            s->pending_graph_buffers.erase(it);
          }
        }
        if (!built.ok()) {
          if (!s->closed) s->ReleaseGraphBytes(entry.bytes);
          return done(absl::Status(built.status().code(),
                                   absl::StrCat("EndGraph: ", built.status().message())));
        }
        if (s->closed) {
          DeviceOf(*s)->DestroyGraph(s->stream(), entry.id, entry.epoch, [](absl::Status) {});
          return done(s->ClosedError());
        }
        // Its nodes hold its buffers' addresses: every one must still be the
        // session's (Free refuses them meanwhile; this is the second guard).
        for (uint64_t b : entry.buffers) {
          auto it = s->buffers.find(b);
          if (it == s->buffers.end() || it->second.lost) {
            s->ReleaseGraphBytes(entry.bytes);  // the session is open (checked above)
            DeviceOf(*s)->DestroyGraph(s->stream(), entry.id, entry.epoch, [](absl::Status) {});
            return done(absl::FailedPreconditionError(
                absl::StrCat("EndGraph: buffer ", HandleName(b), " of ", s->name(),
                             " went while the graph was built; no graph was made")));
          }
        }
        entry.handle = s->NewHandle();
        GraphInfo info{entry.handle, built->nodes, built->instantiate_ns};
        s->graphs.emplace(entry.handle, std::move(entry));
        s->Touch();
        done(info);
      });
}

void Engine::LaunchGraph(const Caller& caller, LaunchGraphSpec spec, Callback<uint64_t> gpu_ns) {
  auto found = FindSession(caller, spec.session);
  if (!found.ok()) return gpu_ns(found.status());
  std::shared_ptr<Session> s = *found;
  if (absl::Status st = CheckStrikes(*s); !st.ok()) return gpu_ns(st);
  {
    absl::MutexLock lock(&s->mu);
    if (s->closed) return gpu_ns(s->ClosedError());
    if (absl::Status st = s->NotRecording("LaunchGraph"); !st.ok()) return gpu_ns(st);
    auto it = s->graphs.find(spec.graph);
    if (it == s->graphs.end()) {
      return gpu_ns(absl::NotFoundError(absl::StrCat("LaunchGraph: ", GraphName(*s, spec.graph),
                                                     " not found; EndGraph made its handle")));
    }
    GraphEntry& g = it->second;
    const std::string name = GraphName(*s, g.handle);
    if (spec.patches.size() > kMaxGraphPatches) {
      return gpu_ns(absl::InvalidArgumentError(
          absl::StrCat("LaunchGraph of ", name, ": ", spec.patches.size(),
                       " patches, more than one replay may carry (", kMaxGraphPatches, ")")));
    }
    // Each patched node's arguments as they will be, checked and packed
    // before anything changes: a refused patch leaves the graph as it was.
    std::map<uint32_t, LaunchSpec> patched;
    uint64_t repacked = 0;
    for (size_t i = 0; i < spec.patches.size(); ++i) {
      GraphPatch& p = spec.patches[i];
      if (p.node >= g.nodes || !g.kernels[p.node].has_value()) {
        return gpu_ns(absl::InvalidArgumentError(
            absl::StrCat("LaunchGraph of ", name, ": patch ", i, " names node ", p.node,
                         p.node >= g.nodes
                             ? absl::StrCat(", past its ", g.nodes, " nodes")
                             : std::string(", a memset or copy: only kernel nodes take patches"))));
      }
      // Each patched node is copied and packed whole again: what one
      // replay may make the daemon repack is bounded, however few bytes
      // its patches are.
      if (patched.count(p.node) == 0) {
        repacked += g.kernels[p.node]->bytes;
        if (repacked > kMaxRepackedBytes) {
          return gpu_ns(absl::InvalidArgumentError(
              absl::StrCat("LaunchGraph of ", name, ": its patches name nodes that keep ", repacked,
                           " bytes or more, past what one replay may repack (", kMaxRepackedBytes,
                           "): patch fewer nodes, or nodes with fewer parameters, per replay")));
        }
      }
      auto [at, fresh] = patched.try_emplace(p.node, g.kernels[p.node]->spec);
      LaunchSpec& ls = at->second;
      if (p.argument >= ls.args.size()) {
        return gpu_ns(absl::InvalidArgumentError(
            absl::StrCat("LaunchGraph of ", name, ": patch ", i, " names argument ", p.argument,
                         " of node ", p.node, ", which has ", ls.args.size(), " arguments")));
      }
      ls.args[p.argument] = std::move(p.value);
    }
    std::vector<port::GraphPatchOp> ops;
    std::vector<uint64_t> buffers;
    for (auto& [node, ls] : patched) {
      uint64_t epoch = 0;
      auto op = PackLaunch(*s, ls, &epoch, &buffers);
      if (!op.ok()) {
        return gpu_ns(absl::Status(
            op.status().code(),
            absl::StrCat("LaunchGraph of ", name, ", node ", node, ": ", op.status().message())));
      }
      if (epoch != 0 && epoch != g.epoch) {
        return gpu_ns(DeviceOf(*s)->LostError(g.epoch, name));
      }
      ops.push_back(
          port::GraphPatchOp{node, std::move(op->param_block), std::move(op->tensor_maps)});
    }
    // A patch lasts: later replays keep it.
    for (auto& [node, ls] : patched) g.kernels[node]->spec = std::move(ls);
    g.buffers.insert(buffers.begin(), buffers.end());
    NoteWork(*s);
    TrafficCounters* traffic = &traffic_[s->device()];
    TrafficCounters* tenant_traffic = &s->usage().traffic;
    // With synchronize, the replay's failure (answered first, in stream
    // order) is the answer, else the Synchronize's.
    auto failed = std::make_shared<absl::Status>();
    const bool sync = spec.synchronize;
    // A replay's failure can be the reset one of its kernels caused: in
    // the session's words (QueuedWorkDone).
    DeviceOf(*s)->LaunchGraph(
        s->stream(), g.id, std::move(ops), g.epoch, absl::StrCat("a replay of ", name),
        QueuedWorkDone(s, g.epoch,
                       [gpu_ns, traffic, tenant_traffic, sync, failed](absl::Status st) {
                         if (!st.ok()) {
                           if (sync) {
                             *failed = st;
                             return;
                           }
                           return gpu_ns(st);
                         }
                         traffic->launches.fetch_add(1);
                         tenant_traffic->launches.fetch_add(1);
                         if (!sync) gpu_ns(uint64_t{0});
                       }));
    if (!sync) return;
    gpu_ns = [gpu_ns = std::move(gpu_ns), failed](absl::StatusOr<uint64_t> ns) {
      if (!failed->ok()) return gpu_ns(*failed);
      gpu_ns(std::move(ns));
    };
  }
  Synchronize(s, std::move(gpu_ns));
}

void Engine::FreeGraph(const Caller& caller, const std::string& token, uint64_t graph, Done done) {
  auto found = FindSession(caller, token);
  if (!found.ok()) return done(found.status());
  std::shared_ptr<Session> s = *found;
  absl::MutexLock lock(&s->mu);
  if (s->closed) return done(s->ClosedError());
  auto it = s->graphs.find(graph);
  if (it == s->graphs.end()) {
    return done(absl::NotFoundError(absl::StrCat("FreeGraph: ", GraphName(*s, graph),
                                                 " not found (freed already, or never made)")));
  }
  const GraphEntry g = std::move(it->second);
  s->graphs.erase(it);
  s->ReleaseGraphBytes(g.bytes);
  // Answered now, as Free is: the graph goes in stream order.
  DeviceOf(*s)->DestroyGraph(s->stream(), g.id, g.epoch, [](absl::Status) {});
  done(absl::OkStatus());
}

void Engine::DropGraphsLocked(Session& s) {
  for (const auto& [handle, g] : s.graphs) {
    DeviceOf(s)->DestroyGraph(s.stream(), g.id, g.epoch, [](absl::Status) {});
  }
  s.graphs.clear();
  s.recording.reset();
  s.ReleaseGraphBytes(s.graph_bytes);
}

}  // namespace gpuexec::core
