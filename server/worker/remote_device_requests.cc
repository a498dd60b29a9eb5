// The requests a device's worker answers, and how each is sent.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "server/common/log.h"
#include "server/common/trace.h"
#include "server/worker/channel.h"
#include "server/worker/convert.h"
#include "server/worker/remote_device.h"
#include "server/worker/remote_device_internal.h"
#include "server/worker/worker_main.h"
#include "worker.pb.h"

namespace gpuexec::worker {

using internal::PassRegionFd;
using internal::Releases;
using internal::WhatOf;

// ------------------------------------------------------------ requests

namespace {

Request PartsRequest(const std::vector<port::ComputePart>& parts) {
  Request r;
  auto* set = r.mutable_set_compute_parts();  // set even when empty: no parts
  for (const port::ComputePart& p : parts) {
    auto* part = set->add_parts();
    part->set_tenant(p.tenant);
    part->set_sms(p.sms);
  }
  return r;
}

}  // namespace

void RemoteDevice::Defer(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  deferred_.push_back(std::move(fn));
}

void RemoteDevice::PrepareLocked(StreamId stream, uint64_t kernel, bool resolve,
                                 std::vector<Request>* prefix) {
  // A stream already destroyed (a late Free after its session closed) is
  // not created again: the worker runs such a request on no stream.
  auto it = streams_.find(stream);
  if (stream != 0 && !live_streams_.contains(stream) && it != streams_.end()) {
    if (!parts_live_) {  // a new worker: the parts first
      Request r = PartsRequest(parts_);
      r.set_id(next_id_++);
      prefix->push_back(std::move(r));
      parts_live_ = true;
    }
    Request r;
    r.set_id(next_id_++);
    r.mutable_create_stream()->set_stream(stream);
    r.mutable_create_stream()->set_kernel_time_limit_ms(
        static_cast<uint64_t>(absl::ToInt64Milliseconds(it->second.time_limit)));
    r.mutable_create_stream()->set_tenant(it->second.owner.tenant);
    r.mutable_create_stream()->set_low_priority(it->second.owner.low_priority);
    r.mutable_create_stream()->set_shares_turns(it->second.owner.shares_turns);
    r.mutable_create_stream()->set_untimed(it->second.owner.untimed);
    r.mutable_create_stream()->set_operator_limit_ms(it->second.owner.operator_limit_ms);
    prefix->push_back(std::move(r));
    live_streams_.insert(stream);
  }
  if (kernel != 0 && !live_kernels_.contains(kernel)) {
    auto it = kernels_.find(kernel);
    if (it == kernels_.end()) return;  // the launch reports it
    KernelRecord& k = it->second;
    if (!live_modules_.contains(k.sha256)) {
      std::shared_ptr<const port::ModuleImage> image = k.image.lock();
      if (image == nullptr) return;
      Request r;
      r.set_id(next_id_++);
      auto* lm = r.mutable_load_module();
      lm->set_sha256(image->sha256);
      lm->set_image(image->bytes);
      lm->set_is_ptx(image->is_ptx);
      lm->set_what(
          absl::StrCat("module ", image->sha256.substr(0, 12), " (reloaded after a reset)"));
      prefix->push_back(std::move(r));
      live_modules_.insert(k.sha256);
    }
    live_kernels_.insert(kernel);
    if (!resolve) return;  // the request itself resolves it
    Request r;
    r.set_id(next_id_++);
    auto* g = r.mutable_get_kernel();
    g->set_kernel(kernel);
    g->set_sha256(k.sha256);
    g->set_name(k.name);
    g->set_what(absl::StrCat("module ", k.sha256.substr(0, 12)));
    prefix->push_back(std::move(r));
  }
}

void RemoteDevice::Call(Request& request, StreamId stream, absl::Span<const uint64_t> kernels,
                        uint64_t epoch, ReplyFn fn, uint64_t work_epoch, int pass_fd) {
  // A GetKernel request resolves its kernel itself; anything else that
  // names a kernel has it resolved ahead.
  const bool resolve = !request.has_get_kernel();
  std::vector<Request> prefix;
  std::shared_ptr<Connection> conn;
  absl::Status error;
  bool flush = false;
  {
    absl::MutexLock lock(&mu_);
    if ((epoch != 0 && epoch != epoch_) || (work_epoch != 0 && work_epoch != epoch_)) {
      error = absl::AbortedError(
          absl::StrCat("device ", options_.ordinal, " was reset since this call's work began"));
    } else if (conn_ == nullptr) {
      error = NotServingLocked();
    } else if (options_.queue_bytes != 0 && !Releases(request) &&
               conn_->channel->unsent_bytes() >= options_.queue_bytes) {
      error = absl::ResourceExhaustedError(absl::StrCat(
          "device ", options_.ordinal, "'s worker has not yet taken ",
          conn_->channel->unsent_bytes(), " bytes of requests, at or past --worker_queue_bytes=",
          options_.queue_bytes, ": it is busy or not answering; try again later"));
    } else if (pass_fd >= 0 && !(error = PassRegionFd(conn_->region_fd,
                                                      request.has_map_answer_area()
                                                          ? request.map_answer_area().area()
                                                          : request.map_region().region(),
                                                      pass_fd))
                                    .ok()) {
      // Refused below, before any request was queued.
    } else {
      conn = conn_;
      if ((request.has_launch() && request.launch().has_answer()) ||
          (request.has_synchronize() && request.synchronize().has_answer())) {
        // Only while nothing of the stream was refused here.
        auto a = answer_streams_.find(stream);
        if (a == answer_streams_.end() || a->second) {
          request.mutable_launch()->clear_answer();
          request.mutable_synchronize()->clear_answer();
        }
      }
      // The stream with the first kernel, then each other kernel named (a
      // graph's).
      PrepareLocked(stream, kernels.empty() ? 0 : kernels[0], resolve, &prefix);
      for (size_t i = 1; i < kernels.size(); ++i) {
        PrepareLocked(stream, kernels[i], resolve, &prefix);
      }
      const uint64_t id = next_id_++;
      request.set_id(id);
      pending_.emplace(id, std::move(fn));
      std::vector<const google::protobuf::MessageLite*> messages;
      messages.reserve(prefix.size() + 1);
      for (const Request& p : prefix) messages.push_back(&p);
      messages.push_back(&request);
      // The order of requests is fixed here, under the lock; the writing
      // happens outside it.
      flush = conn->channel->Enqueue(messages);
    }
    if (!error.ok()) {
      // A refusal the worker never sees: no later request of the stream
      // may have its success posted before this failure is answered.
      if (auto a = answer_streams_.find(stream); a != answer_streams_.end()) a->second = true;
    }
  }
  if (!error.ok()) {
    // Name what the call was about, as the worker's errors do.
    const std::string what = WhatOf(request);
    const uint64_t now = this->epoch();
    if (epoch != 0 && epoch != now) {
      error = LostError(epoch, "its device memory");
      if (!what.empty()) error = absl::AbortedError(absl::StrCat(what, ": ", error.message()));
    } else if (work_epoch != 0 && work_epoch != now) {
      error = LostError(work_epoch, "work queued on the session's stream");
    } else if (!what.empty()) {
      error = absl::Status(error.code(), absl::StrCat(what, ": ", error.message()));
    }
    Reply r;
    ToProto(error, r.mutable_status());
    Defer([fn = std::move(fn), r] { fn(r, 0); });
    return;
  }
  // A failed write means the worker is gone: its reader fails the call.
  GPUEXEC_TRACE(kFrontSend);
  if (flush) (void)conn->channel->Flush();
}

std::optional<absl::Time> RemoteDevice::NotAnsweringSinceLocked(absl::Time now) const {
  std::optional<absl::Time> since;
  if (ping_out_ && now - ping_sent_ > kAnswerWithin) since = ping_sent_;
  for (const auto& [id, q] : memory_queries_) {
    if (now - q.asked > kAnswerWithin && (!since.has_value() || q.asked < *since)) since = q.asked;
  }
  return since;
}

uint32_t RemoteDevice::pending_requests() const {
  absl::MutexLock lock(&mu_);
  return static_cast<uint32_t>(pending_.size());
}

uint64_t RemoteDevice::unsent_bytes() const {
  absl::MutexLock lock(&mu_);
  return conn_ == nullptr ? 0 : conn_->channel->unsent_bytes();
}

std::optional<absl::Time> RemoteDevice::not_answering_since() const {
  absl::MutexLock lock(&mu_);
  return NotAnsweringSinceLocked(absl::Now());
}

void RemoteDevice::QueryMemory(Callback<port::MemoryInfo> done) {
  // Asked by listings: they should not wait for a worker to start.
  if (absl::Status st = fault(); !st.ok()) return Defer([done, st] { done(st); });
  uint64_t id = 0;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (NotAnsweringSinceLocked(now).has_value()) {
      // Run by the monitor: the caller may hold a lock `done` takes.
      const port::MemoryInfo last = memory_;
      deferred_.push_back([done, last] { done(last); });
      return;
    }
    id = next_memory_query_++;
    memory_queries_.emplace(id, MemoryQuery{now, std::move(done)});
  }
  Request r;
  r.mutable_query_memory();
  Call(r, 0, 0, 0, [this, id](const Reply& reply, uint64_t) {
    Callback<port::MemoryInfo> waiting;
    const absl::Status st = StatusOf(reply);
    absl::StatusOr<port::MemoryInfo> answer =
        st.ok() ? absl::StatusOr<port::MemoryInfo>(
                      port::MemoryInfo{reply.memory().free(), reply.memory().total()})
                : absl::StatusOr<port::MemoryInfo>(st);
    {
      absl::MutexLock lock(&mu_);
      if (st.ok()) memory_ = *answer;
      auto it = memory_queries_.find(id);
      if (it == memory_queries_.end()) return;  // answered late, from memory_
      waiting = std::move(it->second.done);
      memory_queries_.erase(it);
    }
    waiting(std::move(answer));
  });
}

port::StreamId RemoteDevice::CreateStream(absl::Duration kernel_time_limit,
                                          port::StreamOwner owner) {
  absl::MutexLock lock(&mu_);
  const StreamId id = next_stream_++;
  streams_.emplace(id, StreamSpec{kernel_time_limit, std::move(owner)});
  return id;
}

void RemoteDevice::SetComputeParts(std::vector<port::ComputePart> parts, Done done) {
  Request r = PartsRequest(parts);
  std::vector<port::ComputePart> before;
  {
    absl::MutexLock lock(&mu_);
    if (conn_ == nullptr) {
      // No worker now: the next one is cut by these before its first
      // stream (and refuses its streams if it cannot be).
      parts_ = std::move(parts);
      parts_live_ = parts_.empty();
      deferred_.push_back([done] { done(absl::OkStatus()); });
      return;
    }
    before = std::exchange(parts_, std::move(parts));
  }
  // A worker that refuses them keeps its parts, and so does this side;
  // they are sent again before the next stream, in case it has none.
  Call(r, 0, 0, 0, StatusTo([this, before = std::move(before), done](absl::Status s) mutable {
         if (!s.ok()) {
           absl::MutexLock lock(&mu_);
           parts_ = std::move(before);
           parts_live_ = false;
         }
         done(std::move(s));
       }));
}

void RemoteDevice::DestroyStream(StreamId stream, Done done) {
  bool live;
  {
    absl::MutexLock lock(&mu_);
    streams_.erase(stream);
    live = live_streams_.erase(stream) > 0;
  }
  if (!live) return Defer([done] { done(absl::OkStatus()); });  // never created in this worker
  Request r;
  r.mutable_destroy_stream()->set_stream(stream);
  Call(r, 0, 0, 0, StatusTo(std::move(done)));
}

void RemoteDevice::AfterQueued(StreamId stream, uint64_t epoch, std::string what, Done done) {
  Request r;
  r.mutable_after_queued()->set_stream(stream);
  r.mutable_after_queued()->set_what(std::move(what));
  Call(r, stream, 0, epoch, StatusTo(std::move(done)));
}

void RemoteDevice::Allocate(StreamId stream, uint64_t size, std::string what,
                            Callback<Allocation> done) {
  Request r;
  r.mutable_allocate()->set_stream(stream);
  r.mutable_allocate()->set_size(size);
  r.mutable_allocate()->set_what(std::move(what));
  Call(r, stream, 0, 0, [done](const Reply& reply, uint64_t epoch) {
    absl::Status st = StatusOf(reply);
    if (!st.ok()) return done(st);
    done(Allocation{reply.value(), epoch});
  });
}

void RemoteDevice::Free(StreamId stream, DevicePtr ptr, uint64_t epoch, std::string what,
                        Done done) {
  // Memory of an earlier worker went with it.
  if (epoch != this->epoch()) return Defer([done] { done(absl::OkStatus()); });
  Request r;
  r.mutable_free()->set_stream(stream);
  r.mutable_free()->set_ptr(ptr);
  r.mutable_free()->set_what(std::move(what));
  Call(r, stream, 0, epoch, StatusTo(std::move(done)));
}

void RemoteDevice::Memset(StreamId stream, DevicePtr ptr, uint64_t epoch, uint8_t value,
                          uint64_t size, std::string what, Done done) {
  Request r;
  auto* m = r.mutable_memset();
  m->set_stream(stream);
  m->set_ptr(ptr);
  m->set_value(value);
  m->set_size(size);
  m->set_what(std::move(what));
  Call(r, stream, 0, epoch, StatusTo(std::move(done)));
}

void RemoteDevice::Copy(StreamId stream, DevicePtr dst, DevicePtr src, uint64_t epoch,
                        uint64_t size, std::string what, Done done) {
  Request r;
  auto* c = r.mutable_copy();
  c->set_stream(stream);
  c->set_dst(dst);
  c->set_src(src);
  c->set_size(size);
  c->set_what(std::move(what));
  Call(r, stream, 0, epoch, StatusTo(std::move(done)));
}

void RemoteDevice::CopyToDevice(StreamId stream, DevicePtr dst, uint64_t epoch,
                                port::StagingSlot slot, uint64_t size, std::string what,
                                Done done) {
  Request r;
  auto* c = r.mutable_copy_to_device();
  c->set_stream(stream);
  c->set_dst(dst);
  c->set_slot(static_cast<uint32_t>(slot.index));
  c->set_size(size);
  c->set_what(std::move(what));
  Call(r, stream, 0, epoch, StatusTo(std::move(done)));
}

void RemoteDevice::CopyToHost(StreamId stream, port::StagingSlot slot, DevicePtr src,
                              uint64_t epoch, uint64_t size, std::string what, Done done) {
  Request r;
  auto* c = r.mutable_copy_to_host();
  c->set_stream(stream);
  c->set_slot(static_cast<uint32_t>(slot.index));
  c->set_src(src);
  c->set_size(size);
  c->set_what(std::move(what));
  Call(r, stream, 0, epoch, StatusTo(std::move(done)));
}

void RemoteDevice::MapRegion(port::RegionId region, int fd, uint64_t bytes, std::string what,
                             port::Callback<uint64_t> done) {
  Request r;
  auto* m = r.mutable_map_region();
  m->set_region(region);
  m->set_bytes(bytes);
  m->set_what(std::move(what));
  Call(
      r, 0, 0, 0,
      [done](const Reply& reply, uint64_t epoch) {
        absl::Status st = StatusOf(reply);
        if (!st.ok()) return done(st);
        done(epoch);
      },
      0, fd);
  close(fd);  // the worker has its own copy, or none was sent
}

void RemoteDevice::CopyRegion(StreamId stream, port::RegionId region, uint64_t offset,
                              DevicePtr ptr, uint64_t epoch, uint64_t size, bool to_device,
                              std::string what, Done done) {
  Request r;
  auto* c = r.mutable_copy_region();
  c->set_stream(stream);
  c->set_region(region);
  c->set_offset(offset);
  c->set_ptr(ptr);
  c->set_size(size);
  c->set_to_device(to_device);
  c->set_what(std::move(what));
  Call(r, stream, 0, epoch, StatusTo(std::move(done)));
}

void RemoteDevice::UnmapRegion(StreamId stream, port::RegionId region, uint64_t epoch, Done done) {
  // A region of an earlier worker went with its process.
  if (epoch != this->epoch()) return Defer([done] { done(absl::OkStatus()); });
  Request r;
  r.mutable_unmap_region()->set_stream(stream);
  r.mutable_unmap_region()->set_region(region);
  Call(r, 0, 0, epoch, StatusTo(std::move(done)));
}

void RemoteDevice::LoadModule(std::shared_ptr<const port::ModuleImage> image, std::string what,
                              Done done) {
  bool loaded;
  {
    absl::MutexLock lock(&mu_);
    loaded = live_modules_.contains(image->sha256) && conn_ != nullptr;
  }
  if (loaded) return Defer([done] { done(absl::OkStatus()); });
  Request r;
  auto* lm = r.mutable_load_module();
  lm->set_sha256(image->sha256);
  lm->set_image(image->bytes);
  lm->set_is_ptx(image->is_ptx);
  lm->set_what(std::move(what));
  Call(r, 0, 0, 0, [this, done, sha = image->sha256](const Reply& reply, uint64_t epoch) {
    absl::Status st = StatusOf(reply);
    if (st.ok()) {
      module_loads_total_.fetch_add(reply.value());
      absl::MutexLock lock(&mu_);
      if (epoch == epoch_) live_modules_.insert(sha);
    }
    done(st);
  });
}

void RemoteDevice::UnloadModule(const std::string& sha256) {
  bool live;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = kernels_.begin(); it != kernels_.end();) {
      if (it->second.sha256 == sha256) {
        kernel_ids_.erase(absl::StrCat(sha256, "/", it->second.name));
        live_kernels_.erase(it->first);
        kernels_.erase(it++);
      } else {
        ++it;
      }
    }
    live = live_modules_.erase(sha256) > 0;
  }
  if (!live) return;
  Request r;
  r.mutable_unload_module()->set_sha256(sha256);
  Call(r, 0, 0, 0, [](const Reply&, uint64_t) {});
}

void RemoteDevice::GetKernel(std::shared_ptr<const port::ModuleImage> image, std::string name,
                             std::string what, Callback<port::KernelInfo> done) {
  uint64_t id;
  std::optional<port::KernelInfo> known;
  {
    absl::MutexLock lock(&mu_);
    const std::string key = absl::StrCat(image->sha256, "/", name);
    auto it = kernel_ids_.find(key);
    if (it == kernel_ids_.end()) {
      id = next_kernel_++;
      kernel_ids_.emplace(key, id);
      kernels_.emplace(id, KernelRecord{image->sha256, name, image, std::nullopt});
    } else {
      id = it->second;
    }
    KernelRecord& k = kernels_[id];
    k.image = image;
    if (k.info.has_value() && live_kernels_.contains(id) && conn_ != nullptr) known = k.info;
  }
  if (known.has_value()) return Defer([done, info = *known] { done(info); });
  Request r;
  auto* g = r.mutable_get_kernel();
  g->set_kernel(id);
  g->set_sha256(image->sha256);
  g->set_name(name);
  g->set_what(std::move(what));
  Call(r, 0, id, 0, [this, id, done](const Reply& reply, uint64_t epoch) {
    absl::Status st = StatusOf(reply);
    if (!st.ok()) {
      {
        absl::MutexLock lock(&mu_);
        if (epoch == epoch_) live_kernels_.erase(id);
        // A name that never resolved leaves no record (a caller trying
        // names by the million must not grow this map).
        auto it = kernels_.find(id);
        if (it != kernels_.end() && !it->second.info.has_value()) {
          kernel_ids_.erase(absl::StrCat(it->second.sha256, "/", it->second.name));
          kernels_.erase(it);
        }
      }
      return done(st);
    }
    port::KernelInfo info = FromProto(reply.kernel(), id);
    {
      absl::MutexLock lock(&mu_);
      auto it = kernels_.find(id);
      if (it != kernels_.end()) it->second.info = info;
      if (epoch == epoch_) live_kernels_.insert(id);
    }
    done(info);
  });
}

}  // namespace gpuexec::worker
