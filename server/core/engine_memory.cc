// Allocate, Free, Memset and device-to-device copies.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/common/log.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"
#include "server/core/engine.h"
#include "server/core/engine_internal.h"
#include "server/core/image_check.h"
#include "server/core/launch_check.h"

namespace gpuexec::core {

using internal::Reserve;
using internal::TenantLimitError;

// ---------------------------------------------------------------- memory

void Engine::Allocate(const Caller& caller, const std::string& token, uint64_t size,
                      Callback<BufferInfo> done) {
  auto found = FindSession(caller, token);
  if (!found.ok()) return done(found.status());
  std::shared_ptr<Session> s = *found;
  if (size == 0) return done(absl::InvalidArgumentError("Allocate: size must be positive"));
  absl::MutexLock lock(&s->mu);
  if (s->closed) return done(s->ClosedError());
  if (auto st = s->CheckHandles(options_.max_handles_per_session,
                                absl::StrCat("a buffer of ", ByteSize(size)));
      !st.ok()) {
    return done(st);
  }
  if (size > ~0ull - kAllocationGranularity) {
    return done(absl::ResourceExhaustedError(
        absl::StrCat("Allocate of ", ByteSize(size), " for ", s->name(),
                     ": more than any device has; allocate what the data needs")));
  }
  // The limits count what the device's pool takes: whole granules.
  const uint64_t charged = ChargedBytes(size);
  const std::string amount = charged == size
                                 ? ByteSize(size)
                                 : absl::StrCat(ByteSize(size), " (counted as ", ByteSize(charged),
                                                ": allocations count in whole ",
                                                kAllocationGranularity, "-byte granules)");
  {
    if (s->memory_limit() != 0 && charged > s->memory_limit() - s->memory_used) {
      // A limit the daemon lowered says so: the client asked for more.
      return done(absl::ResourceExhaustedError(
          absl::StrCat("session memory limit: ", s->name(), " holds ", ByteSize(s->memory_used),
                       " of its ", ByteSize(s->memory_limit()), "; ", amount, " more do not fit",
                       s->memory_capped.empty() ? "" : absl::StrCat(" (", s->memory_capped, ")"),
                       "; free buffers, or open a session with a larger memory limit")));
    }
    // The tenant's limit, reserved as the daemon's is (its sessions
    // allocate concurrently).
    const uint64_t tenant_limit = caller.tenant != nullptr ? caller.tenant->limits.memory_bytes : 0;
    std::atomic<uint64_t>& tenant_used = s->usage().memory;
    if (auto held = Reserve(tenant_used, tenant_limit, charged); held.has_value()) {
      return done(absl::ResourceExhaustedError(TenantLimitError(
          caller, absl::StrCat("memory limit: its sessions hold ", ByteSize(*held), " of its ",
                               ByteSize(tenant_limit), "; ", amount, " more for ", s->name(),
                               " do not fit (its memory_limit_bytes in the tenants file)"))));
    }
    if (auto held = Reserve(daemon_memory_used_, options_.daemon_memory_bytes, charged);
        held.has_value()) {
      tenant_used.fetch_sub(charged);
      return done(absl::ResourceExhaustedError(
          absl::StrCat("daemon memory limit: sessions hold ", ByteSize(*held), " of the daemon's ",
                       ByteSize(options_.daemon_memory_bytes), "; ", amount, " more for ",
                       s->name(), " do not fit (--daemon_memory_limit)")));
    }
    s->memory_used += charged;  // reserved; given back if the device says no
  }
  ++s->handles_pending;
  const std::string what =
      absl::StrCat("a buffer of ", ByteSize(size), " for ", s->name(), " on device ", s->device());
  port::DevicePort* dev = DeviceOf(*s);
  // Posted under the session's lock, so that it is queued before the
  // stream's destruction that a concurrent close queues.
  dev->Allocate(
      s->stream(), size, what,
      [this, s, size, charged, dev, what, done](absl::StatusOr<port::Allocation> p) {
        absl::MutexLock lock(&s->mu);
        --s->handles_pending;
        if (!p.ok()) {
          // A close in between already gave the whole session's memory back.
          if (!s->closed) ReleaseMemory(*s, charged);
          absl::Status st = p.status();
          if (st.code() == absl::StatusCode::kResourceExhausted) {
            st = absl::ResourceExhaustedError(absl::StrCat("device memory: ", st.message()));
          }
          return done(st);
        }
        if (s->closed) {
          // Closed while the allocation was in flight (its memory was already
          // given back by Close): free it again at once.
          dev->Free(s->stream(), p->ptr, p->epoch, what, [](absl::Status) {});
          return done(s->ClosedError());
        }
        BufferEntry b;
        b.handle = s->NewHandle();
        b.ptr = p->ptr;
        b.epoch = p->epoch;
        b.size = size;
        s->buffers.emplace(b.handle, b);
        done(BufferInfo{b.handle, size});
      });
}

void Engine::Free(const Caller& caller, const std::string& token, uint64_t buffer, Done done) {
  auto found = FindSession(caller, token);
  if (!found.ok()) return done(found.status());
  std::shared_ptr<Session> s = *found;
  absl::MutexLock lock(&s->mu);
  if (s->closed) return done(s->ClosedError());
  if (auto it = s->buffers.find(buffer); it != s->buffers.end()) {
    // Freeing a buffer lost with its device's memory just forgets it.
    if (!CheckAlive(*s, it->second).ok()) {
      s->buffers.erase(it);
      return done(absl::OkStatus());
    }
  }
  auto b = FindBuffer(*s, buffer);
  if (!b.ok()) return done(b.status());
  if ((*b)->streams_in_use > 0) {
    return done(absl::FailedPreconditionError(
        absl::StrCat(s->Describe(**b), " is in use by a Write or Read in progress")));
  }
  if (absl::Status st = NotInGraph(*s, buffer); !st.ok()) return done(st);
  BufferEntry entry = **b;
  s->buffers.erase(buffer);
  ReleaseMemory(*s, entry.charged());
  // Answered now, like cuMemFreeAsync: the handle is gone and its bytes are
  // the session's again; the memory itself goes back in stream order, after
  // the work queued before. Its failure can only be the device's, which
  // takes the memory with it (and reports itself to the session's next
  // operation).
  DeviceOf(*s)->Free(s->stream(), entry.ptr, entry.epoch, s->Describe(entry), [](absl::Status) {});
  done(absl::OkStatus());
}

void Engine::Memset(const Caller& caller, const std::string& token, uint64_t buffer,
                    uint64_t offset, uint64_t size, uint32_t value, Done done) {
  auto found = FindSession(caller, token);
  if (!found.ok()) return done(found.status());
  std::shared_ptr<Session> s = *found;
  absl::MutexLock lock(&s->mu);
  if (value > 255) {
    return done(s->Refuse(absl::InvalidArgumentError(
        absl::StrCat("Memset: value ", value, " is not a byte (0..255)"))));
  }
  auto b = FindBuffer(*s, buffer);
  if (!b.ok()) return done(s->Refuse(b.status()));
  if (size == 0 && offset <= (*b)->size) size = (*b)->size - offset;
  if (auto st = CheckRange(*s, **b, offset, size, "Memset"); !st.ok()) {
    return done(s->Refuse(st));
  }
  if (size == 0) return done(absl::OkStatus());
  if (s->recording.has_value()) {
    return done(s->Refuse(RecordNodeLocked(
        *s,
        port::GraphNodeOp{port::GraphMemset{(*b)->ptr + offset, static_cast<uint8_t>(value), size},
                          absl::StrCat("Memset of ", s->Describe(**b))},
        {buffer}, (*b)->epoch)));
  }
  NoteWork(*s);
  DeviceOf(*s)->Memset(s->stream(), (*b)->ptr + offset, (*b)->epoch, static_cast<uint8_t>(value),
                       size, absl::StrCat("Memset of ", s->Describe(**b)), std::move(done));
}

void Engine::CopyBuffer(const Caller& caller, const std::string& token, uint64_t dst,
                        uint64_t dst_offset, uint64_t src, uint64_t src_offset, uint64_t size,
                        Done done) {
  auto found = FindSession(caller, token);
  if (!found.ok()) return done(found.status());
  std::shared_ptr<Session> s = *found;
  absl::MutexLock lock(&s->mu);
  auto d = FindBuffer(*s, dst);
  if (!d.ok()) return done(s->Refuse(d.status()));
  auto from = FindBuffer(*s, src);
  if (!from.ok()) return done(s->Refuse(from.status()));
  if (auto st = CheckRange(*s, **d, dst_offset, size, "CopyBuffer destination"); !st.ok())
    return done(s->Refuse(st));
  if (auto st = CheckRange(*s, **from, src_offset, size, "CopyBuffer source"); !st.ok())
    return done(s->Refuse(st));
  if (size == 0) return done(absl::OkStatus());
  if (s->recording.has_value()) {
    return done(s->Refuse(RecordNodeLocked(
        *s,
        port::GraphNodeOp{
            port::GraphCopy{(*d)->ptr + dst_offset, (*from)->ptr + src_offset, size},
            absl::StrCat("CopyBuffer from ", s->Describe(**from), " to ", s->Describe(**d))},
        {dst, src}, (*d)->epoch)));
  }
  NoteWork(*s);
  DeviceOf(*s)->Copy(
      s->stream(), (*d)->ptr + dst_offset, (*from)->ptr + src_offset, (*d)->epoch, size,
      absl::StrCat("CopyBuffer from ", s->Describe(**from), " to ", s->Describe(**d)),
      std::move(done));
}

}  // namespace gpuexec::core
