#include "server/worker/answer_areas.h"

#include "absl/strings/str_cat.h"
#include "gpuexec/command_ring.h"

namespace gpuexec::worker {

absl::Status AnswerAreas::Map(uint64_t area, uint64_t stream, int fd, uint64_t offset,
                              uint64_t bytes) {
  if (stream == 0) return absl::InvalidArgumentError("an answer area names no stream");
  absl::StatusOr<std::unique_ptr<shm::AnswerArea>> writer = shm::AnswerArea::Map(fd, offset, bytes);
  if (!writer.ok()) return writer.status();
  absl::MutexLock lock(&mu_);
  if (areas_.contains(area) || area_of_stream_.contains(stream)) {
    return absl::AlreadyExistsError(
        absl::StrCat("answer area ", area, " or one of stream ", stream, " is mapped already"));
  }
  Area& a = areas_[area];
  a.stream = stream;
  a.writer = *std::move(writer);
  area_of_stream_[stream] = area;
  any_.store(true, std::memory_order_relaxed);
  return absl::OkStatus();
}

void AnswerAreas::UnmapStream(uint64_t stream) {
  if (!any_.load(std::memory_order_relaxed)) return;
  uint64_t area;
  {
    absl::MutexLock lock(&mu_);
    auto it = area_of_stream_.find(stream);
    if (it == area_of_stream_.end()) return;
    area = it->second;
  }
  Unmap(area);
}

void AnswerAreas::Unmap(uint64_t area) {
  std::shared_ptr<shm::AnswerArea> gone;  // unmapped outside the lock
  absl::MutexLock lock(&mu_);
  auto it = areas_.find(area);
  if (it == areas_.end()) return;
  for (uint64_t id : it->second.pending) pending_area_.erase(id);
  area_of_stream_.erase(it->second.stream);
  gone = std::move(it->second.writer);
  areas_.erase(it);
  if (areas_.empty()) any_.store(false, std::memory_order_relaxed);
}

uint64_t AnswerAreas::StreamOf(const Request& r) {
  switch (r.op_case()) {
    case Request::kDestroyStream:
      return r.destroy_stream().stream();
    case Request::kAfterQueued:
      return r.after_queued().stream();
    case Request::kAllocate:
      return r.allocate().stream();
    case Request::kFree:
      return r.free().stream();
    case Request::kMemset:
      return r.memset().stream();
    case Request::kCopy:
      return r.copy().stream();
    case Request::kCopyToDevice:
      return r.copy_to_device().stream();
    case Request::kCopyToHost:
      return r.copy_to_host().stream();
    case Request::kLaunch:
      return r.launch().stream();
    case Request::kSynchronize:
      return r.synchronize().stream();
    case Request::kCopyRegion:
      return r.copy_region().stream();
    case Request::kUnmapRegion:
      return r.unmap_region().stream();
    case Request::kBuildGraph:
      return r.build_graph().stream();
    case Request::kLaunchGraph:
      return r.launch_graph().stream();
    case Request::kDestroyGraph:
      return r.destroy_graph().stream();
    default:
      return 0;
  }
}

void AnswerAreas::Track(const Request& r) {
  if (!any_.load(std::memory_order_relaxed)) return;
  const uint64_t stream = StreamOf(r);
  if (stream == 0) return;
  absl::MutexLock lock(&mu_);
  auto s = area_of_stream_.find(stream);
  if (s == area_of_stream_.end()) return;
  areas_[s->second].pending.insert(r.id());
  pending_area_[r.id()] = s->second;
}

void AnswerAreas::Settle(uint64_t id, bool failed) {
  if (!any_.load(std::memory_order_relaxed)) return;
  absl::MutexLock lock(&mu_);
  auto p = pending_area_.find(id);
  if (p == pending_area_.end()) return;
  auto a = areas_.find(p->second);
  pending_area_.erase(p);
  if (a == areas_.end()) return;
  a->second.pending.erase(id);
  if (failed) a->second.stopped = true;
}

bool AnswerAreas::Post(const DirectAnswer& answer, uint64_t stream, uint64_t id, uint64_t gpu_ns) {
  if (!any_.load(std::memory_order_relaxed)) return false;
  std::shared_ptr<shm::AnswerArea> posted;
  {
    absl::MutexLock lock(&mu_);
    posted = PostLocked(answer, stream, id, gpu_ns);
  }
  // The system call, if any, outside the lock every request takes.
  if (posted != nullptr) posted->WakeClientIfParked();
  return posted != nullptr;
}

std::shared_ptr<shm::AnswerArea> AnswerAreas::PostLocked(const DirectAnswer& answer,
                                                         uint64_t stream, uint64_t id,
                                                         uint64_t gpu_ns) {
  auto a = areas_.find(answer.area());
  if (a == areas_.end()) return nullptr;
  Area& area = a->second;
  if (area.stopped || area.stream != stream) return nullptr;
  // Anything of the stream sent before this and not yet answered could
  // still fail, and must be read first.
  if (!area.pending.empty() && *area.pending.begin() < id) return nullptr;
  const uint16_t kind = static_cast<uint16_t>(answer.kind());
  if (kind != ring::kLaunch && kind != ring::kSynchronize && kind != ring::kLaunchGraph) {
    return nullptr;
  }
  switch (area.writer->Post(kind, answer.id(), answer.seq(), answer.untimed() ? 0 : gpu_ns)) {
    case shm::AnswerArea::Posted::kPosted:
      return area.writer;
    case shm::AnswerArea::Posted::kNoRoom:
      return nullptr;
    case shm::AnswerArea::Posted::kBroken:
      area.stopped = true;  // the client's head lied: the front answers all
      return nullptr;
  }
  return nullptr;
}

}  // namespace gpuexec::worker
