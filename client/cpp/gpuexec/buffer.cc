// Buffer: a daemon allocation's copies (through gRPC, host memory regions
// or the session's command stream), memset, copy and free.

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpuexec/client.h"
#include "gpuexec/v1/gpuexec.grpc.pb.h"
#include "internal/client_state.h"
#include "internal/command_stream.h"
#include "internal/convert.h"
#include "internal/host_memory.h"
#include "internal/status_macros_internal.h"
#include "internal/transfer.h"

namespace gpuexec {

using internal::CallKind;
using internal::InParts;
using internal::PartGroup;
using internal::ReadCall;
using internal::SessionState;
using internal::SetDeadline;
using internal::Unusable;
using internal::WriteCall;

Buffer::~Buffer() { FreeQuietly(); }

Buffer::Buffer(Buffer&& other) noexcept
    : session_(std::move(other.session_)),
      handle_(other.handle_),
      size_(other.size_),
      owned_(std::exchange(other.owned_, false)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    FreeQuietly();
    session_ = std::move(other.session_);
    handle_ = other.handle_;
    size_ = other.size_;
    owned_ = std::exchange(other.owned_, false);
  }
  return *this;
}

void Buffer::FreeQuietly() {
  if (!session_ || !owned_ || session_->closed.load()) return;
  owned_ = false;
  // In stream order after the session's work, in one round trip (the
  // daemon answers a Free at once); a failure is dropped.
  v1::Command command;
  command.mutable_free()->set_buffer(handle_);
  if (session_->commands
          ->Submit(std::move(command), /*wait=*/true, session_->options().cleanup_timeout,
                   /*report_deferred=*/false)
          .status()
          .code() != absl::StatusCode::kUnavailable) {
    return;
  }
  // The stream could not carry it: a call of its own.
  grpc::ClientContext context;
  SetDeadline(&context, session_->options(), CallKind::kCleanup);
  v1::FreeRequest request;
  request.set_session(session_->token);
  request.set_buffer(handle_);
  v1::FreeResponse response;
  session_->stub().Free(&context, request, &response).ok();
}

absl::Status Buffer::Free() { return DoFree(/*wait=*/true); }

absl::Status Buffer::FreeAsync() { return DoFree(/*wait=*/false); }

absl::Status Buffer::DoFree(bool wait) {
  if (!session_) return Unusable("Buffer");
  owned_ = false;
  if (!session_->closed.load()) {
    // In stream order after the session's launches, as cuMemFreeAsync.
    v1::Command command;
    command.mutable_free()->set_buffer(handle_);
    return session_->commands
        ->Submit(std::move(command), wait, session_->options().control_timeout,
                 /*report_deferred=*/false)
        .status();
  }
  grpc::ClientContext context;
  SetDeadline(&context, session_->options(), CallKind::kControl);
  v1::FreeRequest request;
  request.set_session(session_->token);
  request.set_buffer(handle_);
  v1::FreeResponse response;
  return session_->Status(session_->stub().Free(&context, request, &response));
}

uint64_t Buffer::Release() {
  owned_ = false;
  return handle_;
}

namespace {

// A copy between a buffer and a region, made by the daemon, in order on
// the session's command stream; returns once it has finished.
absl::Status RegionCopy(SessionState& session, uint64_t buffer, uint64_t buffer_offset,
                        internal::RegionHit hit, uint64_t size,
                        v1::RegionCopyRequest::Direction direction) {
  v1::Command command;
  v1::RegionCopyRequest* c = command.mutable_region_copy();
  c->set_region(hit.region);
  c->set_region_offset(hit.offset);
  c->set_buffer(buffer);
  c->set_buffer_offset(buffer_offset);
  c->set_size(size);
  c->set_direction(direction);
  return session.commands
      ->Submit(std::move(command), /*wait=*/true, session.options().data_timeout,
               /*report_deferred=*/false)
      .status();
}

}  // namespace

absl::Status Buffer::Write(uint64_t offset, absl::Span<const uint8_t> data) {
  if (!session_) return Unusable("Buffer");
  // After Close() the ordinary call gets the daemon's answer; on the
  // command stream a copy needs no barrier before it.
  if (!session_->closed.load()) {
    if (std::optional<internal::RegionHit> hit = session_->regions.Find(data.data(), data.size())) {
      return RegionCopy(*session_, handle_, offset, *hit, data.size(),
                        v1::RegionCopyRequest::TO_BUFFER);
    }
  }
  GPUEXEC_CLIENT_RETURN_IF_ERROR(session_->Order());
  return InParts(*session_, size_, offset, data.size(),
                 [&](const std::shared_ptr<grpc::Channel>& channel, uint64_t at, uint64_t n,
                     PartGroup* group) {
                   return WriteCall(*session_, channel, handle_, offset + at, data.subspan(at, n),
                                    group);
                 });
}

absl::StatusOr<std::vector<uint8_t>> Buffer::Read(uint64_t offset, uint64_t size) const {
  if (!session_) return Unusable("Buffer");
  GPUEXEC_CLIENT_RETURN_IF_ERROR(session_->Order());
  std::vector<uint8_t> out;
  // Reserve only what the buffer can hold; the daemon judges the range. It
  // may not send more than that (nor than asked): a daemon that does is
  // refused, not followed until memory runs out.
  const uint64_t expected = size != 0 ? size : size_ - std::min(offset, size_);
  const bool in_range = offset <= size_ && expected <= size_ - offset;
  const uint64_t limit = in_range ? expected : size;
  if (in_range) out.reserve(expected);
  GPUEXEC_CLIENT_RETURN_IF_ERROR(ReadCall(
      *session_, session_->client->channel, handle_, offset, size, /*group=*/nullptr,
      [&](uint64_t, std::string_view data) {
        if (data.size() > limit - out.size()) {
          return absl::DataLossError(absl::StrCat("gpuexec client: Read of buffer ", handle_,
                                                  " at offset ", offset, " returned more than the ",
                                                  limit, " bytes the buffer holds there"));
        }
        out.insert(out.end(), data.begin(), data.end());
        return absl::OkStatus();
      }));
  return out;
}

absl::Status Buffer::ReadInto(uint64_t offset, absl::Span<uint8_t> out) const {
  if (!session_) return Unusable("Buffer");
  // On the command stream a copy needs no barrier before it.
  if (!session_->closed.load()) {
    if (std::optional<internal::RegionHit> hit = session_->regions.Find(out.data(), out.size())) {
      return RegionCopy(*session_, handle_, offset, *hit, out.size(),
                        v1::RegionCopyRequest::TO_REGION);
    }
  }
  GPUEXEC_CLIENT_RETURN_IF_ERROR(session_->Order());
  // Size 0 would mean "to the end" on the wire.
  if (out.empty()) return absl::OkStatus();
  return InParts(*session_, size_, offset, out.size(),
                 [&](const std::shared_ptr<grpc::Channel>& channel, uint64_t at, uint64_t n,
                     PartGroup* group) {
                   return ReadCall(
                       *session_, channel, handle_, offset + at, n, group,
                       [&, at, n](uint64_t got, std::string_view data) {
                         if (got + data.size() > n) {
                           return absl::DataLossError(absl::StrCat(
                               "gpuexec client: Read of buffer ", handle_, " at offset ",
                               offset + at, " returned more than the ", n, " bytes asked for"));
                         }
                         std::memcpy(out.data() + at + got, data.data(), data.size());
                         return absl::OkStatus();
                       });
                 });
}

absl::Status Buffer::Memset(uint8_t value, uint64_t offset, uint64_t size) {
  if (!session_) return Unusable("Buffer");
  if (!session_->closed.load()) {
    v1::Command command;
    v1::MemsetRequest* m = command.mutable_memset();
    m->set_buffer(handle_);
    m->set_offset(offset);
    m->set_size(size);
    m->set_value(value);
    return session_->commands
        ->Submit(std::move(command), /*wait=*/true, session_->options().data_timeout,
                 /*report_deferred=*/false)
        .status();
  }
  grpc::ClientContext context;
  SetDeadline(&context, session_->options(), CallKind::kData);
  v1::MemsetRequest request;
  request.set_session(session_->token);
  request.set_buffer(handle_);
  request.set_offset(offset);
  request.set_size(size);
  request.set_value(value);
  v1::MemsetResponse response;
  return session_->Status(session_->stub().Memset(&context, request, &response));
}

absl::Status Buffer::CopyFrom(const Buffer& src, uint64_t src_offset, uint64_t dst_offset,
                              uint64_t size) {
  if (!session_) return Unusable("Buffer");
  if (!session_->closed.load()) {
    v1::Command command;
    v1::CopyBufferRequest* c = command.mutable_copy_buffer();
    c->set_dst(handle_);
    c->set_dst_offset(dst_offset);
    c->set_src(src.handle_);
    c->set_src_offset(src_offset);
    c->set_size(size);
    return session_->commands
        ->Submit(std::move(command), /*wait=*/true, session_->options().data_timeout,
                 /*report_deferred=*/false)
        .status();
  }
  grpc::ClientContext context;
  SetDeadline(&context, session_->options(), CallKind::kData);
  v1::CopyBufferRequest request;
  request.set_session(session_->token);
  request.set_dst(handle_);
  request.set_dst_offset(dst_offset);
  request.set_src(src.handle_);
  request.set_src_offset(src_offset);
  request.set_size(size);
  v1::CopyBufferResponse response;
  return session_->Status(session_->stub().CopyBuffer(&context, request, &response));
}

}  // namespace gpuexec
