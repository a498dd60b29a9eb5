// Drain: an operator's call (core/drain.h says what a drain does). Only a
// caller on the daemon's Unix socket whose uid is root's or the daemon's
// own may make it: the kernel names that uid (SO_PEERCRED), so no token or
// network peer can pass for an operator.

#include <unistd.h>

#include <cstdint>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/core/drain.h"
#include "server/core/tenant.h"
#include "server/rpc/service_calls.h"

namespace gpuexec::rpc::calls {
namespace {

using DrainCall = Unary<v1::DrainRequest, v1::DrainResponse>;

// The peer's uid when it calls on the Unix socket ("unix:uid=0,gid=0,pid=9").
bool UnixUid(const std::string& peer, uint64_t* uid) {
  constexpr absl::string_view kPrefix = "unix:uid=";
  if (!absl::StartsWith(peer, kPrefix)) return false;
  absl::string_view rest = absl::string_view(peer).substr(kPrefix.size());
  return absl::SimpleAtoi(rest.substr(0, rest.find(',')), uid);
}

absl::Status MayDrain(const core::Caller& caller) {
  const uint64_t own = ::geteuid();
  uint64_t uid = 0;
  if (UnixUid(caller.peer, &uid) && (uid == 0 || uid == own)) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("Drain is an operator's call: only root or the daemon's own user (uid ", own,
                   ") may make it, on the daemon's Unix socket; this call came from ",
                   core::PeerHost(caller.peer),
                   ". Run `gpuexec drain` on the daemon's host as that user, "
                   "or send gpuexecd SIGUSR1"));
}

void Fill(const core::DrainState& st, size_t sessions_open, v1::DrainResponse* r) {
  r->set_draining(st.draining);
  r->set_sessions_open(static_cast<uint32_t>(sessions_open));
  r->set_deadline_unix_ms(st.draining ? absl::ToUnixMillis(st.deadline) : 0);
  r->set_closed_at_deadline(static_cast<uint32_t>(st.closed_at_deadline));
  r->set_description(st.Describe());
}

void Serve(core::Engine* engine, DrainCall* call) {
  if (absl::Status st = MayDrain(call->caller()); !st.ok()) return call->Finish(st);
  const v1::DrainRequest& r = call->request();
  const uint64_t max_ms = absl::ToInt64Milliseconds(core::Drain::kMaxGrace);
  if (r.resume() && (r.deadline_ms() != 0 || r.wait())) {
    return call->Finish(absl::InvalidArgumentError(
        "Drain: resume ends a drain; it takes no deadline_ms and no wait"));
  }
  if (r.deadline_ms() > max_ms) {
    return call->Finish(absl::InvalidArgumentError(
        absl::StrCat("Drain: deadline_ms ", r.deadline_ms(), " is past the most a drain may last, ",
                     max_ms, " (24 h)")));
  }
  if (r.resume()) {
    Fill(engine->ResumeFromDrain(), engine->session_count(), call->response());
    return call->Finish(absl::OkStatus());
  }
  const absl::Duration grace =
      r.deadline_ms() != 0 ? absl::Milliseconds(r.deadline_ms()) : call->env().drain_deadline;
  const core::DrainState st = engine->StartDrain(
      grace, absl::StrCat("the Drain call of ", core::PeerHost(call->caller().peer)));
  if (!r.wait()) {
    Fill(st, engine->session_count(), call->response());
    return call->Finish(absl::OkStatus());
  }
  absl::Status waiting =
      engine->WhenDrained([call](const core::DrainState& now, size_t sessions_open) {
        Fill(now, sessions_open, call->response());
        call->Finish(absl::OkStatus());
      });
  if (!waiting.ok()) call->Finish(waiting);
}

}  // namespace

void ListenDrain(const GpuExecService::Env* env, grpc::ServerCompletionQueue* cq) {
  ListenUnary<DrainCall>(env, cq, &GpuExecService::AsyncService::RequestDrain, Serve);
}

}  // namespace gpuexec::rpc::calls
