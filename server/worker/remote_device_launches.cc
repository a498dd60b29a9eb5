// RemoteDevice's requests that run work on a stream: launches (with their
// waiting form), synchronizes and graphs. A success a command ring's client
// waits for may be posted to its answer area by the worker itself
// (port::DirectAnswer), which the reply then says.
#include <memory>
#include <utility>
#include <variant>
#include <vector>

#include "server/worker/convert.h"
#include "server/worker/remote_device.h"
#include "worker.pb.h"

namespace gpuexec::worker {

namespace {

Request LaunchRequest(port::StreamId stream, port::LaunchOp& op) {
  Request r;
  auto* l = r.mutable_launch();
  l->set_stream(stream);
  l->set_kernel(op.kernel);
  ToProto(op.geometry, l->mutable_geometry());
  l->set_params(std::move(op.param_block));
  l->set_what(std::move(op.what));
  for (const port::TensorMapEncoding& m : op.tensor_maps) ToProto(m, l->add_tensor_maps());
  return r;
}

}  // namespace

void RemoteDevice::Launch(StreamId stream, port::LaunchOp op, uint64_t epoch, Done done) {
  Request r = LaunchRequest(stream, op);
  Call(r, stream, op.kernel, epoch, StatusTo(std::move(done)));
}

void RemoteDevice::LaunchAndSynchronize(StreamId stream, port::LaunchOp op, uint64_t epoch,
                                        uint64_t work_epoch, port::LaunchedAndSynchronized done) {
  Request r = LaunchRequest(stream, op);
  r.mutable_launch()->set_synchronize(true);
  if (op.answer != nullptr) ToProto(*op.answer, r.mutable_launch()->mutable_answer());
  Call(
      r, stream, op.kernel, epoch,
      [done = std::move(done), answer = std::move(op.answer)](const Reply& reply, uint64_t) {
        absl::Status st = StatusOf(reply);
        if (!st.ok()) return done(st, reply.launched());
        if (answer != nullptr) answer->posted = reply.posted();
        done(reply.value(), true);
      },
      work_epoch);
}

void RemoteDevice::Synchronize(StreamId stream, uint64_t work_epoch, Callback<uint64_t> gpu_ns) {
  Request r;
  r.mutable_synchronize()->set_stream(stream);
  Call(r, stream, 0, 0, ValueTo(std::move(gpu_ns)), work_epoch);
}

void RemoteDevice::SynchronizeAnswering(StreamId stream, uint64_t work_epoch,
                                        std::shared_ptr<port::DirectAnswer> answer,
                                        Callback<uint64_t> gpu_ns) {
  if (answer == nullptr) return Synchronize(stream, work_epoch, std::move(gpu_ns));
  Request r;
  r.mutable_synchronize()->set_stream(stream);
  ToProto(*answer, r.mutable_synchronize()->mutable_answer());
  Call(
      r, stream, 0, 0,
      [gpu_ns = std::move(gpu_ns), answer = std::move(answer)](const Reply& reply, uint64_t) {
        absl::Status st = StatusOf(reply);
        if (!st.ok()) return gpu_ns(st);
        answer->posted = reply.posted();
        gpu_ns(reply.value());
      },
      work_epoch);
}

void RemoteDevice::BuildGraph(StreamId stream, port::GraphId graph,
                              std::vector<port::GraphNodeOp> nodes, uint64_t epoch,
                              std::string what, Callback<port::GraphBuilt> done) {
  Request r;
  auto* b = r.mutable_build_graph();
  b->set_stream(stream);
  b->set_graph(graph);
  b->set_what(std::move(what));
  // Each kernel is loaded and resolved in the worker ahead of the build.
  std::vector<uint64_t> kernels;
  b->mutable_nodes()->Reserve(static_cast<int>(nodes.size()));
  for (port::GraphNodeOp& n : nodes) {
    if (const auto* op = std::get_if<port::LaunchOp>(&n.op)) kernels.push_back(op->kernel);
    ToProto(n, b->add_nodes());
  }
  Call(r, stream, kernels, epoch, [done = std::move(done)](const Reply& reply, uint64_t) {
    absl::Status st = StatusOf(reply);
    if (!st.ok()) return done(st);
    done(port::GraphBuilt{reply.graph_built().nodes(), reply.graph_built().instantiate_ns()});
  });
}

void RemoteDevice::LaunchGraph(StreamId stream, port::GraphId graph,
                               std::vector<port::GraphPatchOp> patches, uint64_t epoch,
                               std::string what, Done done) {
  Request r;
  auto* l = r.mutable_launch_graph();
  l->set_stream(stream);
  l->set_graph(graph);
  l->set_what(std::move(what));
  l->mutable_patches()->Reserve(static_cast<int>(patches.size()));
  for (port::GraphPatchOp& p : patches) ToProto(p, l->add_patches());
  Call(r, stream, 0, epoch, StatusTo(std::move(done)));
}

void RemoteDevice::DestroyGraph(StreamId stream, port::GraphId graph, uint64_t epoch, Done done) {
  // A graph of an earlier worker went with its process.
  if (epoch != this->epoch()) return Defer([done] { done(absl::OkStatus()); });
  Request r;
  r.mutable_destroy_graph()->set_stream(stream);
  r.mutable_destroy_graph()->set_graph(graph);
  Call(r, 0, 0, epoch, StatusTo(std::move(done)));
}

}  // namespace gpuexec::worker
