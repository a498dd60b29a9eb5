// Graphs: Session::BeginGraph / EndGraph and a Graph's replays. The
// recorded commands and the replays travel on the session's commands (the
// Execute stream; a command ring carries the recorded ones), BeginGraph,
// EndGraph and Free are unary, each after the commands sent before it started.
#include <utility>

#include "gpuexec/client.h"
#include "gpuexec/v1/gpuexec.grpc.pb.h"
#include "internal/command_stream.h"
#include "internal/convert.h"
#include "internal/status_macros_internal.h"

namespace gpuexec {

using internal::CallKind;
using internal::SetDeadline;
using internal::Unusable;

absl::Status Session::BeginGraph() {
  GPUEXEC_CLIENT_RETURN_IF_ERROR(CheckUsable());
  // The commands sent before it run; those after it are recorded.
  GPUEXEC_CLIENT_RETURN_IF_ERROR(state_->Order());
  grpc::ClientContext context;
  SetDeadline(&context, state_->options(), CallKind::kControl);
  v1::BeginGraphRequest request;
  request.set_session(state_->token);
  v1::BeginGraphResponse response;
  return state_->Status(state_->stub().BeginGraph(&context, request, &response));
}

absl::StatusOr<Graph> Session::EndGraph() {
  GPUEXEC_CLIENT_RETURN_IF_ERROR(CheckUsable());
  // Every recorded command has reached the daemon. A refusal among them
  // (reported here, as a launch's error is at the next call that waits)
  // also makes the daemon's EndGraph fail, naming it: its answer is kept.
  absl::Status recorded = absl::OkStatus();
  if (!state_->closed.load()) {
    recorded = state_->commands
                   ->Submit(v1::Command(), /*wait=*/true, state_->options().data_timeout,
                            /*report_deferred=*/true)
                   .status();
  }
  grpc::ClientContext context;
  SetDeadline(&context, state_->options(), CallKind::kData);
  v1::EndGraphRequest request;
  request.set_session(state_->token);
  v1::EndGraphResponse response;
  GPUEXEC_CLIENT_RETURN_IF_ERROR(
      state_->Status(state_->stub().EndGraph(&context, request, &response)));
  Graph graph;
  graph.session_ = state_;
  graph.handle_ = response.graph();
  graph.nodes_ = response.nodes();
  graph.instantiate_time_ = absl::Nanoseconds(response.instantiate_ns());
  if (!recorded.ok()) {
    (void)graph.Free();
    return recorded;
  }
  return graph;
}

absl::StatusOr<uint64_t> Graph::Replay(absl::Span<const GraphPatch> patches,
                                       ReplayMode mode) const {
  if (!session_) return Unusable("Graph");
  v1::Command command;
  v1::LaunchGraphRequest& request = *command.mutable_launch_graph();
  request.set_graph(handle_);
  request.set_synchronize(mode == ReplayMode::kWait);
  for (const GraphPatch& p : patches) {
    v1::GraphPatch* out = request.add_patches();
    out->set_node(p.node);
    out->set_argument(p.argument);
    p.value.ToProto(out->mutable_value());
  }
  if (!session_->closed.load()) {
    // On the session's commands, in order with its launches.
    GPUEXEC_CLIENT_ASSIGN_OR_RETURN(
        v1::CommandResult result,
        session_->commands->Submit(std::move(command), /*wait=*/mode != ReplayMode::kQueue,
                                   session_->options().data_timeout, /*report_deferred=*/true));
    return result.gpu_time_ns();
  }
  // After Close(): the daemon's own answer (the session is gone).
  grpc::ClientContext context;
  SetDeadline(&context, session_->options(), CallKind::kData);
  request.set_session(session_->token);
  v1::LaunchGraphResponse response;
  GPUEXEC_CLIENT_RETURN_IF_ERROR(
      session_->Status(session_->stub().LaunchGraph(&context, request, &response)));
  return response.gpu_time_ns();
}

absl::Status Graph::Launch(absl::Span<const GraphPatch> patches) const {
  return Replay(patches, ReplayMode::kEnqueued).status();
}

absl::Status Graph::LaunchAsync(absl::Span<const GraphPatch> patches) const {
  return Replay(patches, ReplayMode::kQueue).status();
}

absl::StatusOr<absl::Duration> Graph::LaunchAndWait(absl::Span<const GraphPatch> patches) const {
  GPUEXEC_CLIENT_ASSIGN_OR_RETURN(uint64_t ns, Replay(patches, ReplayMode::kWait));
  return absl::Nanoseconds(ns);
}

absl::Status Graph::Free() {
  if (!session_) return Unusable("Graph");
  GPUEXEC_CLIENT_RETURN_IF_ERROR(session_->Order());
  grpc::ClientContext context;
  SetDeadline(&context, session_->options(), CallKind::kControl);
  v1::FreeGraphRequest request;
  request.set_session(session_->token);
  request.set_graph(handle_);
  v1::FreeGraphResponse response;
  absl::Status st = session_->Status(session_->stub().FreeGraph(&context, request, &response));
  if (st.ok()) session_.reset();
  return st;
}

}  // namespace gpuexec
