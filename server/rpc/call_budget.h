#ifndef GPUEXEC_SERVER_RPC_CALL_BUDGET_H_
#define GPUEXEC_SERVER_RPC_CALL_BUDGET_H_

// What one session and one tenant may make the front hold through their
// streaming calls: Read and Write calls in flight per session, Execute and
// LoadModule streams per session, and the bytes their Read and Write calls
// buffer, per tenant (the implicit tenant: per peer host, the unit its
// other limits count). Without these a tenant under a 16 MiB memory limit
// took the front past 1.6 GiB with 400 Read calls it never consumed.
//
// A call is admitted once, when it knows its session (a Read at its start,
// a Write at its first message, an Execute at its first message, a
// LoadModule at its header), and holds a Ticket for its life: a count of
// its kind against the session, and a reservation of the bytes it may
// buffer against its tenant. A Read reserves what it can hold at most (the
// messages in hand and the chunks fetched ahead); a Write reserves its held
// bytes (4 MiB) and grows the reservation for a message larger than that.
// Refusals are RESOURCE_EXHAUSTED naming the limit, its flag, the session
// or tenant, and what to do.
//
// Thread-safe; the budget's lock is innermost (nothing is taken under it).

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/core/tenant.h"

namespace gpuexec::rpc {

struct CallLimits {
  // Read and Write calls of one session in flight at once (0: no bound).
  uint32_t data_calls_per_session = 16;
  // Execute and LoadModule streams of one session open at once (0: no
  // bound).
  uint32_t streams_per_session = 16;
  // Bytes the Read and Write calls of one tenant (of the implicit tenant:
  // one peer host) may hold in the front at once (0: no bound).
  uint64_t tenant_transfer_bytes = 512ull << 20;
  // Commands one tenant's Execute streams may have outstanding in all
  // (started and not answered, or answered and not yet written); each
  // stream gets an equal share of it, at least kMinCommandShare (0: the
  // per-stream bound alone).
  uint32_t tenant_commands = 32768;
  // A LoadModule stream that sends nothing for this long is ended
  // (DEADLINE_EXCEEDED), and its upload budget given back (0: never).
  absl::Duration upload_idle = absl::Seconds(30);
};

// What every admitted call is counted as at least: the call's own objects
// and gRPC's for its stream.
inline constexpr uint64_t kCallOverheadBytes = 64 << 10;

class CallBudget {
 public:
  enum class Kind {
    kData,    // Read, Write
    kStream,  // Execute, LoadModule
  };

  // One admitted call's hold; given back when destroyed.
  class Ticket {
   public:
    ~Ticket();
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    // Grows the reservation to `bytes` (kCallOverheadBytes added) when it is
    // less; RESOURCE_EXHAUSTED, the reservation unchanged, when the tenant
    // has no room for the difference.
    absl::Status ReserveAtLeast(uint64_t bytes);
    uint64_t reserved() const;
    // Of an Execute stream: what it may have outstanding now, its equal
    // part of CallLimits::tenant_commands (at least kMinCommandShare), or
    // `stream_bound` when that is less. Lock-free: asked at every answer.
    int CommandShare(int stream_bound) const;

   private:
    friend class CallBudget;
    Ticket(CallBudget* budget, Kind kind, std::string session, std::string tenant,
           std::string method)
        : budget_(budget),
          kind_(kind),
          session_(std::move(session)),
          tenant_(std::move(tenant)),
          method_(std::move(method)) {}
    CallBudget* const budget_;
    const Kind kind_;
    const std::string session_;
    const std::string tenant_;
    const std::string method_;
    uint64_t reserved_ = 0;  // under budget_->mu_
    // Of an Execute stream: its tenant's count of Execute streams.
    std::shared_ptr<std::atomic<uint32_t>> executes_;
  };

  explicit CallBudget(CallLimits limits = {}) : limits_(limits) {}
  const CallLimits& limits() const { return limits_; }

  // Admits a call of `method` ("Read", ...) of `caller` on `session` (the
  // token as the client sent it), reserving `bytes` more than
  // kCallOverheadBytes against the caller's tenant (kData only).
  absl::StatusOr<std::unique_ptr<Ticket>> Admit(Kind kind, absl::string_view method,
                                                const core::Caller& caller,
                                                const std::string& session, uint64_t bytes = 0);

  // The share of CallLimits::tenant_commands one of `caller`'s Execute
  // streams may have outstanding now (its tenant's streams divide it);
  // `stream_bound` when that is less.
  int CommandShare(const core::Caller& caller, int stream_bound) const;

  // Figures, for tests and metrics: bytes reserved by `caller`'s tenant;
  // calls of `kind` in flight on `session`.
  uint64_t TenantBytes(const core::Caller& caller) const;
  uint32_t SessionCalls(Kind kind, const std::string& session) const;

  // "tenant 'team-a'", or of the implicit tenant "peer ipv4:127.0.0.1".
  static std::string TenantKey(const core::Caller& caller);

  // Streams an Execute stream's share never falls below.
  static constexpr int kMinCommandShare = 256;

 private:
  struct SessionCount {
    uint32_t data = 0;
    uint32_t streams = 0;
  };
  struct TenantCount {
    uint64_t bytes = 0;
    // Execute streams open (CommandShare); shared with their tickets.
    std::shared_ptr<std::atomic<uint32_t>> executes;
  };
  void Release(Ticket* ticket);
  absl::Status TenantRoomLocked(const std::string& tenant, absl::string_view method,
                                uint64_t more) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CallLimits limits_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, SessionCount> sessions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, TenantCount> tenants_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpuexec::rpc

#endif  // GPUEXEC_SERVER_RPC_CALL_BUDGET_H_
