// Host memory regions: a same-host client's memfd, checked here, mapped and
// page-locked by the session's device process, copied to and from buffers
// in stream order, and unmapped after the copies queued before its release.
//
// Accounting: a region's bytes count against its session, its tenant and
// the daemon from the moment its registration is accepted (before the
// device maps it) until the device has unpinned it: after a release or the
// session's end, that is once the copies queued before have finished and
// the device's process has unmapped it (a tenant cannot pin more than its
// limit by releasing regions while its stream is busy); after the device's
// reset, at once (the process took the mapping with it).
#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/log.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"
#include "server/core/engine.h"
#include "server/core/engine_internal.h"
#include "server/shm/region_fd.h"

namespace gpuexec::core {

using internal::Reserve;
using internal::TenantLimitError;

namespace {

// Closes a descriptor unless it was handed on.
class FdGuard {
 public:
  explicit FdGuard(int fd) : fd_(fd) {}
  ~FdGuard() {
    if (fd_ >= 0) close(fd_);
  }
  FdGuard(const FdGuard&) = delete;
  FdGuard& operator=(const FdGuard&) = delete;
  int release() { return std::exchange(fd_, -1); }
  int get() const { return fd_; }

 private:
  int fd_;
};

constexpr uint64_t kRegionGranule = 4096;

absl::Status RegionNotFound(const Session& s, uint64_t handle) {
  return absl::NotFoundError(
      absl::StrCat("host memory region ", HandleName(handle), " not found in ", s.name()));
}

}  // namespace

void Engine::RegisterRegion(const Caller& caller, const std::string& token, int fd, uint64_t bytes,
                            Callback<RegionInfo> done) {
  FdGuard guard(fd);
  if (!options_.host_memory || options_.daemon_pinned_bytes == 0) {
    return done(absl::FailedPreconditionError(
        "host memory regions are off on this daemon (it serves them with --shm_socket)"));
  }
  auto found = FindSession(caller, token);
  if (!found.ok()) return done(found.status());
  std::shared_ptr<Session> s = *found;
  if (caller.tenant != nullptr && !caller.tenant->limits.host_memory) {
    return done(absl::PermissionDeniedError(TenantLimitError(
        caller,
        "may not register host memory regions (its entry in the tenants file does not "
        "allow host_memory)")));
  }
  if (bytes == 0 || bytes % kRegionGranule != 0) {
    return done(absl::InvalidArgumentError(
        absl::StrCat("RegisterRegion: a region's size must be a positive multiple of ",
                     kRegionGranule, " bytes, not ", bytes)));
  }
  if (absl::Status st =
          shm::CheckRegionFd(guard.get(), bytes, {.max_bytes = options_.daemon_pinned_bytes});
      !st.ok()) {
    return done(absl::Status(st.code(), absl::StrCat("RegisterRegion: ", st.message())));
  }
  const uint64_t session_limit = options_.max_session_pinned_bytes != 0
                                     ? options_.max_session_pinned_bytes
                                     : options_.daemon_pinned_bytes;
  uint64_t id = 0;
  std::string what;
  {
    absl::MutexLock lock(&s->mu);
    if (s->closed) return done(s->ClosedError());
    if (options_.max_regions_per_session != 0 &&
        s->regions.size() + s->regions_pending >= options_.max_regions_per_session) {
      return done(absl::ResourceExhaustedError(absl::StrCat(
          "regions per session: ", s->name(), " holds ", s->regions.size() + s->regions_pending,
          " host memory regions, the daemon's limit")));
    }
    if (bytes > session_limit - std::min(session_limit, s->pinned_used)) {
      return done(absl::ResourceExhaustedError(absl::StrCat(
          "session pinned memory limit: ", s->name(), " holds ", ByteSize(s->pinned_used),
          " of its ", ByteSize(session_limit), " page-locked; ", ByteSize(bytes),
          " more do not fit (--max_session_pinned_bytes)")));
    }
    const uint64_t tenant_limit = caller.tenant != nullptr ? caller.tenant->limits.pinned_bytes : 0;
    std::atomic<uint64_t>& tenant_used = s->usage().pinned;
    if (auto held = Reserve(tenant_used, tenant_limit, bytes); held.has_value()) {
      return done(absl::ResourceExhaustedError(TenantLimitError(
          caller, absl::StrCat("pinned memory limit: its sessions' regions hold ", ByteSize(*held),
                               " of its ", ByteSize(tenant_limit), "; ", ByteSize(bytes),
                               " more for ", s->name(), " do not fit"))));
    }
    if (auto held = Reserve(daemon_pinned_used_, options_.daemon_pinned_bytes, bytes);
        held.has_value()) {
      tenant_used.fetch_sub(bytes);
      return done(absl::ResourceExhaustedError(absl::StrCat(
          "daemon pinned memory limit: regions hold ", ByteSize(*held), " of the daemon's ",
          ByteSize(options_.daemon_pinned_bytes), "; ", ByteSize(bytes), " more for ", s->name(),
          " do not fit (--pinned_memory_limit)")));
    }
    s->pinned_used += bytes;
    ++s->regions_pending;
    id = next_region_id_.fetch_add(1);
    what = absl::StrCat("a host memory region of ", ByteSize(bytes), " for ", s->name(),
                        " on device ", s->device());
  }
  port::DevicePort* dev = DeviceOf(*s);
  dev->MapRegion(
      id, guard.release(), bytes, what,
      [this, s, id, bytes, dev, done = std::move(done)](absl::StatusOr<uint64_t> epoch) mutable {
        absl::MutexLock lock(&s->mu);
        --s->regions_pending;
        if (!epoch.ok()) {
          ReleasePinned(*s, bytes);
          absl::Status st = epoch.status();
          if (st.code() == absl::StatusCode::kResourceExhausted) {
            st = absl::ResourceExhaustedError(absl::StrCat("page-locked memory: ", st.message()));
          }
          return done(st);
        }
        if (s->closed) {
          UnpinLater(s, id, bytes, *epoch);
          return done(s->ClosedError());
        }
        RegionEntry r;
        r.handle = s->NewHandle();
        r.id = id;
        r.bytes = bytes;
        r.epoch = *epoch;
        // Mapped by a worker that was reset before this answer: gone too.
        r.lost = *epoch != dev->epoch();
        if (r.lost) ReleasePinned(*s, bytes);
        s->regions.emplace(r.handle, r);
        done(RegionInfo{r.handle, bytes});
      });
}

absl::StatusOr<RegionEntry*> Engine::FindRegion(Session& s, uint64_t handle) {
  if (s.closed) return s.ClosedError();
  auto it = s.regions.find(handle);
  if (it == s.regions.end()) return RegionNotFound(s, handle);
  RegionEntry& r = it->second;
  port::DevicePort* dev = DeviceOf(s);
  if (!r.lost && r.epoch != dev->epoch()) {
    r.lost = true;
    ReleasePinned(s, r.bytes);
  }
  if (r.lost) return dev->LostError(r.epoch, s.Describe(r));
  return &r;
}

void Engine::RegionCopy(const Caller& caller, const std::string& token, const RegionCopySpec& copy,
                        Done done) {
  auto found = FindSession(caller, token);
  if (!found.ok()) return done(found.status());
  std::shared_ptr<Session> s = *found;
  absl::MutexLock lock(&s->mu);
  if (absl::Status st = s->NotRecording("RegionCopy"); !st.ok()) return done(st);
  auto r = FindRegion(*s, copy.region);
  if (!r.ok()) return done(r.status());
  auto b = FindBuffer(*s, copy.buffer);
  if (!b.ok()) return done(b.status());
  const RegionEntry& region = **r;
  const BufferEntry& buffer = **b;
  if (copy.region_offset > region.bytes || copy.size > region.bytes - copy.region_offset) {
    return done(absl::OutOfRangeError(absl::StrCat("RegionCopy of ", ByteSize(copy.size),
                                                   " at offset ", copy.region_offset,
                                                   " goes past the end of ", s->Describe(region))));
  }
  if (auto st = CheckRange(*s, buffer, copy.buffer_offset, copy.size, "RegionCopy"); !st.ok()) {
    return done(st);
  }
  if (copy.size == 0) return done(absl::OkStatus());
  NoteWork(*s);
  DeviceOf(*s)->CopyRegion(
      s->stream(), region.id, copy.region_offset, buffer.ptr + copy.buffer_offset, buffer.epoch,
      copy.size, copy.to_buffer,
      copy.to_buffer
          ? absl::StrCat("RegionCopy from ", s->Describe(region), " to ", s->Describe(buffer))
          : absl::StrCat("RegionCopy from ", s->Describe(buffer), " to ", s->Describe(region)),
      std::move(done));
}

void Engine::ReleaseRegion(const Caller& caller, const std::string& token, uint64_t region,
                           Done done) {
  auto found = FindSession(caller, token);
  if (!found.ok()) return done(found.status());
  std::shared_ptr<Session> s = *found;
  absl::MutexLock lock(&s->mu);
  if (s->closed) return done(s->ClosedError());
  auto it = s->regions.find(region);
  if (it == s->regions.end()) return done(RegionNotFound(*s, region));
  const RegionEntry r = it->second;
  s->regions.erase(it);
  // One lost with its device's process was given back then.
  if (!r.lost) UnpinLater(s, r.id, r.bytes, r.epoch);
  done(absl::OkStatus());
}

void Engine::UnpinLater(const std::shared_ptr<Session>& s, port::RegionId id, uint64_t bytes,
                        uint64_t epoch) {
  // Whatever the answer: an unmapping that fails does so because the
  // device's process is gone, and the pages with it.
  DeviceOf(*s)->UnmapRegion(s->stream(), id, epoch, [this, s, bytes](absl::Status) {
    absl::MutexLock lock(&s->mu);
    ReleasePinned(*s, bytes);
  });
}

void Engine::ReleasePinned(Session& s, uint64_t bytes) {
  s.pinned_used -= bytes;
  s.usage().pinned.fetch_sub(bytes);
  daemon_pinned_used_.fetch_sub(bytes);
}

void Engine::DropRegions(const std::shared_ptr<Session>& s) {
  // Registrations still under way give theirs back when answered.
  for (auto& [handle, r] : s->regions) {
    if (!r.lost) UnpinLater(s, r.id, r.bytes, r.epoch);
  }
  s->regions.clear();
}

absl::StatusOr<Engine::AnswerAreaLease> Engine::MapAnswerArea(const Caller& caller,
                                                              const std::string& token, int fd,
                                                              uint64_t offset, uint64_t bytes) {
  GPUEXEC_ASSIGN_OR_RETURN(std::shared_ptr<Session> s, FindSession(caller, token));
  port::DevicePort* dev = DeviceOf(*s);
  const uint64_t area = next_answer_area_.fetch_add(1) | (uint64_t{1} << 63);
  dev->MapAnswerArea(area, s->stream(), fd, offset, bytes, [area](absl::Status st) {
    if (!st.ok()) log::Debug("answer area ", area, " not mapped: ", st.message());
  });
  AnswerAreaLease lease;
  lease.area = area;
  lease.unmap = [dev, area] { dev->UnmapAnswerArea(area, [](absl::Status) {}); };
  return lease;
}

}  // namespace gpuexec::core
