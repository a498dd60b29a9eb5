// Write and Read: streamed through the staging slots.
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
#include "server/core/image_check.h"
#include "server/core/launch_check.h"

namespace gpuexec::core {
namespace {

// On a worker several tenants share, the session's staging share joins its
// tenant's (or peer's) there (see StagingShare).
void JoinTenantStaging(Session& s, port::DevicePort* shared) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  if (s.port() != shared || s.staging.joined()) return;
  s.staging.Join(TenantStaging(&shared->staging(), s.strike_key));
}

}  // namespace

// ---------------------------------------------------------------- Write

absl::StatusOr<std::shared_ptr<WriteSink>> Engine::BeginWrite(const Caller& caller,
                                                              const std::string& token,
                                                              uint64_t buffer, uint64_t offset) {
  GPUEXEC_ASSIGN_OR_RETURN(std::shared_ptr<Session> s, FindSession(caller, token));
  absl::MutexLock lock(&s->mu);
  GPUEXEC_RETURN_IF_ERROR(s->NotRecording("Write"));
  GPUEXEC_ASSIGN_OR_RETURN(BufferEntry * b, FindBuffer(*s, buffer));
  GPUEXEC_RETURN_IF_ERROR(CheckRange(*s, *b, offset, 0, "Write"));
  JoinTenantStaging(*s, devices_[s->device()].get());
  std::shared_ptr<WriteSink> sink(new WriteSink(s, buffer, offset));
  sink->device_ = DeviceOf(*s);
  sink->traffic_ = &traffic_[s->device()];
  sink->base_ = b->ptr;
  sink->epoch_ = b->epoch;
  sink->buffer_size_ = b->size;
  sink->what_ = absl::StrCat("Write to ", s->Describe(*b));
  sink->use_ = std::make_unique<BufferUse>(s.get(), b);
  NoteWork(*s);
  sink->max_in_flight_ = std::max<int>(2, static_cast<int>(sink->device_->staging().size() / 4));
  // Staging buffers are taken only once the work queued before this Write
  // is done: none waits behind a long kernel while other sessions need it.
  // A reset that took the work names the session's own kernel to it.
  sink->device_->AfterQueued(s->stream(), b->epoch, sink->what_, [this, sink, s](absl::Status st) {
    sink->OpenGate(st.ok() ? st : FaultFor(std::move(st), *s));
  });
  return sink;
}

WriteSink::WriteSink(std::shared_ptr<Session> session, uint64_t buffer, uint64_t offset)
    : session_(std::move(session)), buffer_(buffer), next_offset_(offset) {}

void WriteSink::Push(ByteSpans data, Done more) {
  {
    absl::MutexLock lock(&session_->mu);
    session_->Touch();  // a long transfer keeps its session alive
  }
  absl::Status error;
  {
    absl::MutexLock lock(&mu_);
    error = error_;
  }
  if (error.ok() && data.size() > buffer_size_ - next_offset_) {
    BufferEntry b;
    b.handle = buffer_;
    b.size = buffer_size_;
    error = absl::OutOfRangeError(absl::StrCat("Write of ", ByteSize(data.size()),
                                               " more at offset ", next_offset_,
                                               " goes past the end of ", session_->Describe(b)));
  }
  if (!error.ok()) {
    // The call ends here and enqueues no more copies; those already queued
    // come before any Free in stream order, so the buffer can be freed now.
    // `more` may drop the last reference to this sink: no lock held.
    use_->Release();
    return more(error);
  }
  PushFrom(std::move(data), std::move(more));
}

void WriteSink::OpenGate(absl::Status status) {
  ByteSpans data;
  Done more;
  {
    absl::MutexLock lock(&mu_);
    gate_open_ = true;
    if (!status.ok() && error_.ok()) error_ = status;
    std::swap(more, parked_more_);
    data = std::move(parked_data_);
    parked_data_.Clear();
  }
  if (more) PushFrom(std::move(data), std::move(more));
}

void WriteSink::PushFrom(ByteSpans data, Done more) {
  {
    absl::ReleasableMutexLock lock(&mu_);
    if (data.empty() || !error_.ok()) {
      absl::Status error = error_;
      lock.Release();
      return more(error);
    }
    if (!gate_open_ || in_flight_ >= max_in_flight_) {
      // Resumed by the gate or by the next copy that completes.
      parked_data_ = std::move(data);
      parked_more_ = std::move(more);
      return;
    }
    ++in_flight_;
  }
  auto self = shared_from_this();
  session_->staging.Acquire(
      device_->staging(), [self, data = std::move(data), more](port::StagingSlot slot) {
        const size_t n = std::min<uint64_t>(data.size(), slot.capacity);
        data.CopyPrefix(slot.data, n);
        const uint64_t dst_offset = self->next_offset_;
        self->next_offset_ += n;
        bool closed;
        {
          // Under the session lock, so that the copy is queued before any free
          // that a concurrent close queues.
          absl::MutexLock slock(&self->session_->mu);
          closed = self->session_->closed;
          if (!closed) {
            self->device_->CopyToDevice(
                self->session_->stream(), self->base_ + dst_offset, self->epoch_, slot, n,
                self->what_, [self, slot, n](absl::Status st) {
                  self->session_->staging.Release(self->device_->staging(), slot);
                  if (st.ok()) {
                    self->traffic_->bytes_written.fetch_add(n);
                    self->session_->usage().traffic.bytes_written.fetch_add(n);
                    absl::MutexLock lock(&self->mu_);
                    self->written_ += n;
                  }
                  self->OnCopyDone(st);
                });
          }
        }
        if (closed) {
          self->session_->staging.Release(self->device_->staging(), slot);
          self->OnCopyDone(self->session_->ClosedError());
        }
        self->PushFrom(data.Suffix(n), more);
      });
}

void WriteSink::OnCopyDone(absl::Status status) {
  Callback<uint64_t> finish;
  absl::StatusOr<uint64_t> result;
  {
    absl::ReleasableMutexLock lock(&mu_);
    if (!status.ok() && error_.ok()) error_ = status;
    --in_flight_;
    if (parked_more_) {
      Done more = std::move(parked_more_);
      parked_more_ = nullptr;
      ByteSpans data = std::move(parked_data_);
      parked_data_.Clear();
      lock.Release();
      return PushFrom(std::move(data), std::move(more));
    }
    if (in_flight_ != 0 || !finish_) return;
    finish = std::move(finish_);
    finish_ = nullptr;
    result = ResultLocked();
  }
  // The buffer is free for other calls before the caller hears back.
  use_->Release();
  finish(result);
}

absl::StatusOr<uint64_t> WriteSink::ResultLocked() const {
  if (!error_.ok()) return error_;
  return written_;
}

void WriteSink::Finish(Callback<uint64_t> done) {
  absl::StatusOr<uint64_t> result;
  {
    absl::MutexLock lock(&mu_);
    if (in_flight_ != 0) {
      finish_ = std::move(done);
      return;
    }
    result = ResultLocked();
  }
  use_->Release();
  done(result);
}

// ---------------------------------------------------------------- Read

absl::StatusOr<std::shared_ptr<ReadSource>> Engine::BeginRead(const Caller& caller,
                                                              const std::string& token,
                                                              uint64_t buffer, uint64_t offset,
                                                              uint64_t size, uint32_t chunk) {
  GPUEXEC_ASSIGN_OR_RETURN(std::shared_ptr<Session> s, FindSession(caller, token));
  absl::MutexLock lock(&s->mu);
  GPUEXEC_RETURN_IF_ERROR(s->NotRecording("Read"));
  GPUEXEC_ASSIGN_OR_RETURN(BufferEntry * b, FindBuffer(*s, buffer));
  if (size == 0 && offset <= b->size) size = b->size - offset;
  GPUEXEC_RETURN_IF_ERROR(CheckRange(*s, *b, offset, size, "Read"));
  JoinTenantStaging(*s, devices_[s->device()].get());
  port::DevicePort* dev = DeviceOf(*s);
  if (chunk == 0) chunk = options_.chunk_bytes;
  chunk = static_cast<uint32_t>(std::min<uint64_t>(chunk, dev->staging().capacity()));
  std::shared_ptr<ReadSource> src(new ReadSource(s, buffer, offset, size, chunk));
  src->engine_ = this;
  src->device_ = dev;
  src->traffic_ = &traffic_[s->device()];
  src->chunks_ = read_chunks_;
  src->base_ = b->ptr;
  src->epoch_ = b->epoch;
  src->what_ = absl::StrCat("Read of ", s->Describe(*b));
  src->use_ = std::make_unique<BufferUse>(s.get(), b);
  // As for Write: no staging buffer waits behind work queued before.
  dev->AfterQueued(s->stream(), b->epoch, src->what_, [this, src, s](absl::Status st) {
    src->OpenGate(st.ok() ? st : FaultFor(std::move(st), *s));
  });
  return src;
}

ReadSource::ReadSource(std::shared_ptr<Session> session, uint64_t buffer, uint64_t offset,
                       uint64_t size, uint32_t chunk)
    : session_(std::move(session)),
      buffer_(buffer),
      end_(offset + size),
      chunk_(chunk),
      fetch_offset_(offset),
      deliver_offset_(offset) {}

uint64_t ReadSource::remaining() const {
  absl::MutexLock lock(&mu_);
  return end_ - deliver_offset_;
}

void ReadSource::Next(std::function<void(absl::StatusOr<ReadChunk>)> done) {
  // `done` can run within this call (a chunk ready at once), and its caller
  // may then let go of this source: it lives until the call returns.
  auto self = shared_from_this();
  {
    absl::MutexLock lock(&session_->mu);
    session_->Touch();  // a long transfer keeps its session alive
  }
  {
    absl::MutexLock lock(&mu_);
    waiter_ = std::move(done);
  }
  FetchAhead();
  Deliver();
}

void ReadSource::OpenGate(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    gate_open_ = true;
    if (!status.ok()) {
      // Everything queued before failed: so does this Read.
      ready_.emplace(deliver_offset_, status);
      fetch_offset_ = end_;
      ++fetching_;
    }
  }
  FetchAhead();
  Deliver();
}

void ReadSource::FetchAhead() {
  // Two chunks ahead of the one being delivered keep the copy engine busy
  // while the network drains the last one.
  constexpr int kAhead = 2;
  std::vector<std::pair<uint64_t, uint64_t>> fetches;
  {
    absl::MutexLock lock(&mu_);
    if (!gate_open_) return;
    while (fetching_ < kAhead && fetch_offset_ < end_) {
      const uint64_t n = std::min<uint64_t>(chunk_, end_ - fetch_offset_);
      fetches.emplace_back(fetch_offset_, n);
      fetch_offset_ += n;
      ++fetching_;
    }
  }
  for (const auto& [offset, n] : fetches) Fetch(offset, n);
}

void ReadSource::Fetch(uint64_t offset, uint64_t n) {
  auto self = shared_from_this();
  session_->staging.Acquire(device_->staging(), [self, offset, n](port::StagingSlot slot) {
    bool closed;
    {
      // Under the session lock, so that the copy is queued before any free
      // that a concurrent close queues.
      absl::MutexLock slock(&self->session_->mu);
      closed = self->session_->closed;
      if (!closed) {
        self->device_->CopyToHost(
            self->session_->stream(), slot, self->base_ + offset, self->epoch_, n, self->what_,
            [self, slot, offset, n](absl::Status st) {
              if (!st.ok()) {
                self->session_->staging.Release(self->device_->staging(), slot);
                // A fault found by this copy (the gate opened before it):
                // in the words of the session's kernel that caused it.
                return self->Ready(offset, self->engine_->FaultFor(std::move(st), *self->session_));
              }
              // Copied out at once, so that the staging buffer goes back
              // now: a chunk waits here for the caller for as long as its
              // client takes to read, and a stalled Read must not hold
              // buffers every session of the device copies through.
              std::shared_ptr<char> bytes = self->chunks_->Take(n);
              std::memcpy(bytes.get(), slot.data, n);
              self->session_->staging.Release(self->device_->staging(), slot);
              ReadChunk chunk;
              chunk.offset = offset;
              chunk.bytes = absl::string_view(bytes.get(), n);
              chunk.hold = std::move(bytes);
              self->Ready(offset, std::move(chunk));
            });
      }
    }
    if (closed) {
      self->session_->staging.Release(self->device_->staging(), slot);
      self->Ready(offset, self->session_->ClosedError());
    }
  });
}

void ReadSource::Ready(uint64_t offset, absl::StatusOr<ReadChunk> chunk) {
  if (chunk.ok()) {
    traffic_->bytes_read.fetch_add(chunk->bytes.size());
    session_->usage().traffic.bytes_read.fetch_add(chunk->bytes.size());
  }
  {
    absl::MutexLock lock(&mu_);
    ready_.emplace(offset, std::move(chunk));
  }
  Deliver();
}

void ReadSource::Deliver() {
  std::function<void(absl::StatusOr<ReadChunk>)> waiter;
  absl::StatusOr<ReadChunk> result;
  bool last;
  {
    absl::MutexLock lock(&mu_);
    if (!waiter_) return;
    auto it = ready_.find(deliver_offset_);
    if (it == ready_.end()) return;
    if (it->second.ok()) {
      deliver_offset_ += it->second->bytes.size();
      result = std::move(it->second);
    } else {
      result = it->second.status();
      deliver_offset_ = end_;  // nothing more after an error
    }
    ready_.erase(it);
    --fetching_;
    waiter = std::move(waiter_);
    waiter_ = nullptr;
    last = deliver_offset_ == end_;
  }
  // The buffer is free for other calls before the caller hears the end.
  if (last) use_->Release();
  waiter(std::move(result));
}

}  // namespace gpuexec::core
