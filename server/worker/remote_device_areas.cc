// RemoteDevice's command-ring answer areas (gpuexec/command_ring.h,
// kAnswerArea): the worker maps one for a stream and posts the stream's
// waiting successes there itself (worker/answer_areas.h says when it may).
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "server/worker/remote_device.h"
#include "worker.pb.h"

namespace gpuexec::worker {

void RemoteDevice::MapAnswerArea(uint64_t area, StreamId stream, int fd, uint64_t offset,
                                 uint64_t bytes, Done done) {
  Request r;
  auto* m = r.mutable_map_answer_area();
  m->set_area(area);
  m->set_stream(stream);
  m->set_offset(offset);
  m->set_bytes(bytes);
  {
    // From here on, the stream's launches may carry their answers: the
    // worker takes this request before theirs.
    absl::MutexLock lock(&mu_);
    if (conn_ != nullptr) {
      answer_streams_[stream] = false;
      answer_areas_[area] = stream;
    }
  }
  Call(r, stream, 0, 0, StatusTo(std::move(done)), 0, fd);
}

void RemoteDevice::UnmapAnswerArea(uint64_t area, Done done) {
  {
    absl::MutexLock lock(&mu_);
    if (auto it = answer_areas_.find(area); it != answer_areas_.end()) {
      answer_streams_.erase(it->second);
      answer_areas_.erase(it);
    }
  }
  Request r;
  r.mutable_unmap_answer_area()->set_area(area);
  Call(r, 0, 0, 0, StatusTo(std::move(done)));
}

}  // namespace gpuexec::worker
