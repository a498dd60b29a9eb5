#include "server/rpc/health.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/text.h"
#include "server/core/tenant.h"

namespace gpuexec::rpc {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

HealthService::ServingStatus HealthService::StatusLocked(const std::string& name) const {
  auto it = status_.find(name);
  return it == status_.end() ? HealthCheckResponse::SERVICE_UNKNOWN : it->second;
}

// The longest service name asked about: the names this daemon serves are
// short, and a Watch keeps its request for as long as it is open.
constexpr size_t kMaxServiceName = 256;

grpc::Status NameTooLong(absl::string_view call, absl::string_view name) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      absl::StrCat("health: ", call, " of a service name of ", name.size(),
                                   " bytes refused: at most ", kMaxServiceName,
                                   " ('', 'gpuexec.v1.GpuExec', 'device/N', 'liveness')"));
}

// A Check call: the status now; NOT_FOUND for a name never set.
class HealthService::Check final : public UnaryCall<HealthCheckRequest, HealthCheckResponse> {
 public:
  explicit Check(HealthService* health) : UnaryCall(&health->calls_), health_(health) {}

 private:
  void Request(grpc::ServerCompletionQueue* cq, Tag* tag) override {
    health_->async_.RequestCheck(&ctx_, &request_, &writer_, cq, cq, tag);
  }
  AsyncCall* Next() override { return new Check(health_); }
  void OnStart() override {
    if (request_.service().size() > kMaxServiceName) {
      const grpc::Status refused = NameTooLong("Check", request_.service());
      request_.clear_service();
      return Finish(refused);
    }
    ServingStatus status;
    {
      absl::MutexLock lock(&health_->mu_);
      status = health_->StatusLocked(request_.service());
    }
    if (status == HealthCheckResponse::SERVICE_UNKNOWN) {
      return Finish(grpc::Status(
          grpc::StatusCode::NOT_FOUND,
          absl::StrCat("health: no service named '", Quoted(request_.service()), "'")));
    }
    response_.set_status(status);
    Finish(grpc::Status::OK);
  }

  HealthService* health_;
};

// A Watch call: the status now, then each change. A client that goes away
// is noticed at the next write (a change, or shutdown).
class HealthService::Watch final : public ServerWriteCall<HealthCheckRequest, HealthCheckResponse> {
 public:
  explicit Watch(HealthService* health) : ServerWriteCall(&health->calls_), health_(health) {}

  // `status` for this watch's name; called with the service's mutex held.
  void Update(ServingStatus status) {
    absl::MutexLock lock(&mu_);
    if (status == last_ && !pending_) return;
    next_ = status;
    pending_ = true;
    WriteLocked();
  }
  // Ends the call once nothing is being written.
  void Close() {
    absl::MutexLock lock(&mu_);
    ending_ = true;
    WriteLocked();
  }
  const std::string& name() const { return request_.service(); }

 private:
  void Request(grpc::ServerCompletionQueue* cq, Tag* tag) override {
    // Delivered once the call has started and then ended, however it ends:
    // a cancelled watch gives its place back at once.
    ctx_.AsyncNotifyWhenDone(&call_done_);
    health_->async_.RequestWatch(&ctx_, &request_, &writer_, cq, cq, tag);
  }
  AsyncCall* Next() override { return new Watch(health_); }
  void OnStart() override {
    Begin();  // call_done_'s, which comes for every call that started
    absl::MutexLock lock(&health_->mu_);
    peer_ = core::PeerHost(ctx_.peer());
    std::optional<grpc::Status> refused;
    if (health_->shut_down_) {
      refused = grpc::Status(grpc::StatusCode::UNAVAILABLE, "health: shutting down");
    } else if (name().size() > kMaxServiceName) {
      refused = NameTooLong("Watch", name());
      request_.clear_service();
    } else if (health_->max_watches_ > 0 &&
               static_cast<int>(health_->watches_.size()) >= health_->max_watches_) {
      refused = grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat("health: Watch of '", Quoted(name(), 64),
                       "' refused: ", health_->max_watches_,
                       " watches are open already, the daemon's limit "
                       "(--health_max_watches); use Check, or try again once watches end"));
    } else if (auto it = health_->watches_per_peer_.find(peer_);
               health_->max_watches_per_peer_ > 0 && it != health_->watches_per_peer_.end() &&
               it->second >= health_->max_watches_per_peer_) {
      refused = grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat("health: Watch of '", Quoted(name(), 64), "' refused: peer ",
                       Quoted(peer_, 64), " has ", it->second,
                       " watches open, the limit of one peer (--health_max_watches_per_peer); "
                       "watch each name once, or end watches no longer needed"));
    }
    if (refused.has_value()) {
      peer_.clear();
      absl::MutexLock own(&mu_);
      finished_ = true;
      return Finish(*refused);
    }
    health_->watches_.push_back(this);
    ++health_->watches_per_peer_[peer_];
    Update(health_->StatusLocked(name()));
  }
  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) ending_ = failed_ = true;
    WriteLocked();
  }
  void OnDone() override {
    {
      absl::MutexLock lock(&health_->mu_);
      ForgetLocked();
    }
    delete this;
  }
  // The call has ended (the client cancelled it or went away, or it
  // finished): it no longer counts against its peer, and it is ended here
  // if it was still open.
  void OnCallDone(bool) {
    absl::MutexLock lock(&health_->mu_);
    ForgetLocked();
    Close();
  }
  void ForgetLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(health_->mu_) {
    auto& w = health_->watches_;
    const auto gone = std::remove(w.begin(), w.end(), this);
    if (gone == w.end()) return;
    w.erase(gone, w.end());
    auto it = health_->watches_per_peer_.find(peer_);
    if (it != health_->watches_per_peer_.end() && --it->second <= 0) {
      health_->watches_per_peer_.erase(it);
    }
  }

  void WriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finished_) return;
    // A change still goes out before the end (the NOT_SERVING of shutdown),
    // unless the client is gone.
    if (pending_ && !failed_) {
      pending_ = false;
      last_ = next_;
      response_.set_status(next_);
      writing_ = true;
      return StartWrite(&response_);
    }
    if (ending_) {
      finished_ = true;
      Finish(grpc::Status::OK);
    }
  }

  HealthService* health_;
  OpTag<Watch> call_done_{this, &Watch::OnCallDone};
  std::string peer_;  // the peer host counted for it, once admitted
  absl::Mutex mu_;
  HealthCheckResponse response_ ABSL_GUARDED_BY(mu_);
  ServingStatus last_ ABSL_GUARDED_BY(mu_) = HealthCheckResponse::UNKNOWN;
  ServingStatus next_ ABSL_GUARDED_BY(mu_) = HealthCheckResponse::UNKNOWN;
  bool pending_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool ending_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;  // a write failed: the client is gone
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

void HealthService::Listen(grpc::ServerCompletionQueue* cq) {
  (new Check(this))->Listen(cq);
  (new Watch(this))->Listen(cq);
}

void HealthService::SetServingStatus(const std::string& name, bool serving) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  const ServingStatus s = serving ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
  status_[name] = s;
  for (Watch* w : watches_) {
    if (w->name() == name) w->Update(s);
  }
}

void HealthService::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  for (auto& [name, s] : status_) s = HealthCheckResponse::NOT_SERVING;
  for (Watch* w : watches_) {
    w->Update(HealthCheckResponse::NOT_SERVING);
    w->Close();
  }
  shut_down_ = true;
}

}  // namespace gpuexec::rpc
