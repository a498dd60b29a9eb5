#include "server/rpc/call_budget.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/text.h"

namespace gpuexec::rpc {
namespace {

// "session 3f2a91c0", as the engine names a session (the token's first 8
// characters), escaped: the token is the client's until the engine has
// found it.
std::string SessionName(const std::string& token) {
  return absl::StrCat("session ", Quoted(token.substr(0, 8)));
}

}  // namespace

std::string CallBudget::TenantKey(const core::Caller& caller) {
  if (caller.tenant_name() == core::kDefaultTenant) {
    return absl::StrCat("peer ", Quoted(core::PeerHost(caller.peer), 96));
  }
  return absl::StrCat("tenant '", Quoted(caller.tenant_name()), "'");
}

absl::Status CallBudget::TenantRoomLocked(const std::string& tenant, absl::string_view method,
                                          uint64_t more) const {
  const uint64_t limit = limits_.tenant_transfer_bytes;
  if (limit == 0) return absl::OkStatus();
  auto it = tenants_.find(tenant);
  const uint64_t held = it == tenants_.end() ? 0 : it->second.bytes;
  if (more <= limit && held <= limit - more) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      method, ": ", tenant, " has Read and Write calls in flight that may hold ", ByteSize(held),
      " in the daemon, of its ", ByteSize(limit), " (--tenant_transfer_bytes); this one needs ",
      ByteSize(more),
      " more. Wait for its other transfers to end, read what they send, or make fewer at once"));
}

absl::StatusOr<std::unique_ptr<CallBudget::Ticket>> CallBudget::Admit(Kind kind,
                                                                      absl::string_view method,
                                                                      const core::Caller& caller,
                                                                      const std::string& session,
                                                                      uint64_t bytes) {
  std::string tenant = TenantKey(caller);
  const uint64_t reserve = kind == Kind::kData ? kCallOverheadBytes + bytes : 0;
  absl::MutexLock lock(&mu_);
  SessionCount& count = sessions_[session];
  uint32_t& n = kind == Kind::kData ? count.data : count.streams;
  const uint32_t limit =
      kind == Kind::kData ? limits_.data_calls_per_session : limits_.streams_per_session;
  absl::Status refused;
  if (limit != 0 && n >= limit) {
    refused = absl::ResourceExhaustedError(
        kind == Kind::kData
            ? absl::StrCat(method, ": ", SessionName(session), " has ", n,
                           " Read and Write calls in flight, at most ", limit,
                           " (--max_data_calls_per_session); wait for one to end (or read what "
                           "it sends) before starting another")
            : absl::StrCat(method, ": ", SessionName(session), " has ", n,
                           " Execute and LoadModule streams open, at most ", limit,
                           " (--max_streams_per_session); end one before opening another (one "
                           "Execute stream carries any number of commands)"));
  } else if (kind == Kind::kData) {
    refused = TenantRoomLocked(tenant, method, reserve);
  }
  if (!refused.ok()) {
    if (count.data == 0 && count.streams == 0) sessions_.erase(session);
    return refused;
  }
  ++n;
  TenantCount& t = tenants_[tenant];
  t.bytes += reserve;
  std::unique_ptr<Ticket> ticket(
      new Ticket(this, kind, session, std::move(tenant), std::string(method)));
  ticket->reserved_ = reserve;
  // A command ring is a stream of commands too: it takes its part of the
  // tenant's commands in flight.
  if (kind == Kind::kStream && (method == "Execute" || method == "CommandRing")) {
    if (t.executes == nullptr) t.executes = std::make_shared<std::atomic<uint32_t>>(0);
    t.executes->fetch_add(1, std::memory_order_relaxed);
    ticket->executes_ = t.executes;
  }
  return ticket;
}

absl::Status CallBudget::Ticket::ReserveAtLeast(uint64_t bytes) {
  if (kind_ != Kind::kData) return absl::OkStatus();
  bytes += kCallOverheadBytes;
  absl::MutexLock lock(&budget_->mu_);
  if (bytes <= reserved_) return absl::OkStatus();
  const uint64_t more = bytes - reserved_;
  absl::Status room = budget_->TenantRoomLocked(tenant_, method_, more);
  if (!room.ok()) return room;
  budget_->tenants_[tenant_].bytes += more;
  reserved_ = bytes;
  return absl::OkStatus();
}

uint64_t CallBudget::Ticket::reserved() const {
  absl::MutexLock lock(&budget_->mu_);
  return reserved_;
}

CallBudget::Ticket::~Ticket() { budget_->Release(this); }

void CallBudget::Release(Ticket* ticket) {
  absl::MutexLock lock(&mu_);
  if (auto it = sessions_.find(ticket->session_); it != sessions_.end()) {
    uint32_t& n = ticket->kind_ == Kind::kData ? it->second.data : it->second.streams;
    if (n > 0) --n;
    if (it->second.data == 0 && it->second.streams == 0) sessions_.erase(it);
  }
  if (auto it = tenants_.find(ticket->tenant_); it != tenants_.end()) {
    TenantCount& t = it->second;
    t.bytes -= std::min(t.bytes, ticket->reserved_);
    if (ticket->executes_ != nullptr) ticket->executes_->fetch_sub(1, std::memory_order_relaxed);
    if (t.bytes == 0 && (t.executes == nullptr || t.executes->load() == 0)) tenants_.erase(it);
  }
}

namespace {

int Share(uint32_t tenant_commands, uint32_t streams, int stream_bound) {
  if (tenant_commands == 0) return stream_bound;
  const int share =
      std::max<int>(CallBudget::kMinCommandShare,
                    static_cast<int>(tenant_commands / std::max<uint32_t>(1, streams)));
  return std::min(stream_bound, share);
}

}  // namespace

int CallBudget::Ticket::CommandShare(int stream_bound) const {
  if (executes_ == nullptr) return stream_bound;
  return Share(budget_->limits_.tenant_commands, executes_->load(std::memory_order_relaxed),
               stream_bound);
}

int CallBudget::CommandShare(const core::Caller& caller, int stream_bound) const {
  const std::string tenant = TenantKey(caller);
  uint32_t streams = 0;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = tenants_.find(tenant); it != tenants_.end() && it->second.executes != nullptr) {
      streams = it->second.executes->load();
    }
  }
  return Share(limits_.tenant_commands, streams, stream_bound);
}

uint64_t CallBudget::TenantBytes(const core::Caller& caller) const {
  absl::MutexLock lock(&mu_);
  auto it = tenants_.find(TenantKey(caller));
  return it == tenants_.end() ? 0 : it->second.bytes;
}

uint32_t CallBudget::SessionCalls(Kind kind, const std::string& session) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return 0;
  return kind == Kind::kData ? it->second.data : it->second.streams;
}

}  // namespace gpuexec::rpc
