#ifndef GPUEXEC_SERVER_CORE_TRANSFERS_H_
#define GPUEXEC_SERVER_CORE_TRANSFERS_H_

// The engine's streamed transfers, each owned by the call that streams it:
// a module's upload, a Write through pinned staging buffers, a Read's
// chunks fetched ahead. Made by the Engine (engine.h), which they call back.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "gpuexec/sha256.h"
#include "server/core/byte_spans.h"
#include "server/core/chunk_pool.h"
#include "server/core/engine_types.h"
#include "server/core/session.h"

namespace gpuexec::core {

class Engine;

// One LoadModule upload: chunks in, then Finish. Owned by the rpc call.
class ModuleUpload {
 public:
  // Gives back the bytes it counted against the upload budget.
  ~ModuleUpload();
  absl::Status AddChunk(absl::string_view chunk);
  void Finish(Callback<ModuleResult> done);

 private:
  friend class Engine;
  ModuleUpload(Engine* engine, std::shared_ptr<Session> session, TenantLimits limits,
               std::string sha256, uint64_t size, ModuleKind kind);
  Engine* engine_;
  std::shared_ptr<Session> session_;
  TenantLimits limits_;  // of the caller that began it
  std::string sha256_;
  uint64_t size_;
  ModuleKind kind_;
  std::string bytes_;
  uint64_t charged_ = 0;  // against the upload budget
  Sha256 hasher_;
};

// One Write: host bytes streamed through pinned staging buffers to a buffer.
// Shared by the rpc call and the copies in flight.
class WriteSink : public std::enable_shared_from_this<WriteSink> {
 public:
  // Copies `data` into staging buffers and enqueues their copies; calls
  // `more` once `data` is no longer needed (the caller may then reuse it),
  // with the first error seen so far.
  void Push(ByteSpans data, Done more);
  // Calls `done` when every copy enqueued has finished: the bytes written,
  // or the first error.
  void Finish(Callback<uint64_t> done);

 private:
  friend class Engine;
  WriteSink(std::shared_ptr<Session> session, uint64_t buffer, uint64_t offset);
  void OpenGate(absl::Status status);
  void PushFrom(ByteSpans data, Done more);
  void OnCopyDone(absl::Status status);
  // The bytes written so far, or the first error.
  absl::StatusOr<uint64_t> ResultLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::shared_ptr<Session> session_;
  port::DevicePort* device_ = nullptr;
  TrafficCounters* traffic_ = nullptr;
  const uint64_t buffer_;
  port::DevicePtr base_ = 0;
  uint64_t epoch_ = 0;  // of the buffer's memory
  uint64_t buffer_size_ = 0;
  std::string what_;
  uint64_t next_offset_;  // where the next pushed byte lands
  uint64_t written_ = 0;
  std::unique_ptr<BufferUse> use_;

  int max_in_flight_ = 2;  // staging buffers one Write may hold

  absl::Mutex mu_;
  bool gate_open_ ABSL_GUARDED_BY(mu_) = false;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  Callback<uint64_t> finish_ ABSL_GUARDED_BY(mu_);
  // A push waiting for the gate or for a staging buffer to come back.
  ByteSpans parked_data_ ABSL_GUARDED_BY(mu_);
  Done parked_more_ ABSL_GUARDED_BY(mu_);
};

// A chunk of a Read: `bytes` stay valid while a copy of `hold` is kept.
struct ReadChunk {
  uint64_t offset = 0;
  absl::string_view bytes;
  std::shared_ptr<const void> hold;
};

// One Read: device bytes streamed to the caller in chunks, in order, with a
// few chunks fetched ahead.
class ReadSource : public std::enable_shared_from_this<ReadSource> {
 public:
  uint64_t remaining() const;
  // Calls `done` with the next chunk; at most one Next at a time. Call only
  // while remaining() > 0.
  void Next(std::function<void(absl::StatusOr<ReadChunk>)> done);

 private:
  friend class Engine;
  ReadSource(std::shared_ptr<Session> session, uint64_t buffer, uint64_t offset, uint64_t size,
             uint32_t chunk);
  void OpenGate(absl::Status status);
  void FetchAhead();
  void Fetch(uint64_t offset, uint64_t n);
  void Ready(uint64_t offset, absl::StatusOr<ReadChunk> chunk);
  void Deliver();

  std::shared_ptr<Session> session_;
  Engine* engine_ = nullptr;  // a failed copy's words (FaultFor)
  port::DevicePort* device_ = nullptr;
  TrafficCounters* traffic_ = nullptr;
  const uint64_t buffer_;
  port::DevicePtr base_ = 0;
  uint64_t epoch_ = 0;  // of the buffer's memory
  std::string what_;
  const uint64_t end_;
  const uint32_t chunk_;
  std::shared_ptr<ChunkPool> chunks_;  // what chunks are copied into
  std::unique_ptr<BufferUse> use_;

  mutable absl::Mutex mu_;
  bool gate_open_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t fetch_offset_ ABSL_GUARDED_BY(mu_);    // next offset to fetch
  uint64_t deliver_offset_ ABSL_GUARDED_BY(mu_);  // next offset to hand out
  int fetching_ ABSL_GUARDED_BY(mu_) = 0;
  // A few chunks at most, by offset.
  std::map<uint64_t, absl::StatusOr<ReadChunk>> ready_ ABSL_GUARDED_BY(mu_);
  std::function<void(absl::StatusOr<ReadChunk>)> waiter_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpuexec::core

#endif  // GPUEXEC_SERVER_CORE_TRANSFERS_H_
