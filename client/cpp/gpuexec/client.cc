#include "gpuexec/client.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gpuexec/grpc_status.h"
#include "gpuexec/sha256.h"
#include "gpuexec/v1/gpuexec.grpc.pb.h"
#include "gpuexec/wire.h"
#include "internal/channel_internal.h"
#include "internal/command_stream.h"
#include "internal/connect_internal.h"
#include "internal/convert.h"
#include "internal/session_commands.h"
#include "internal/status_macros_internal.h"
#include "internal/transfer.h"

namespace gpuexec {

using internal::CallKind;
using internal::ClientState;
using internal::CommandStream;
using internal::FromProto;
using internal::InParts;
using internal::LoadModuleCall;
using internal::PartGroup;
using internal::ReadCall;
using internal::SessionState;
using internal::SetDeadline;
using internal::ToProto;
using internal::Unusable;
using internal::WriteCall;

// ---------------------------------------------------------------- Arg

Arg Arg::Ptr(const Buffer& buffer, uint64_t offset) {
  Arg arg(Kind::kBuffer);
  arg.uint_ = buffer.handle();
  arg.offset_ = offset;
  return arg;
}

Arg Arg::Null() { return Arg(Kind::kNull); }

Arg Arg::TensorMap(const Buffer& buffer, uint64_t offset, const gpuexec::TensorMap& map) {
  Arg arg(Kind::kTensorMap);
  arg.uint_ = buffer.handle();
  arg.offset_ = offset;
  arg.tensor_map_ = std::make_shared<const gpuexec::TensorMap>(map);
  return arg;
}

Arg Arg::Raw(std::string_view bytes) {
  Arg arg(Kind::kRaw);
  arg.raw_ = std::string(bytes);
  return arg;
}

Arg Arg::Raw(absl::Span<const uint8_t> bytes) {
  return Raw(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

Arg Arg::Int(Kind kind, int64_t v) {
  Arg arg(kind);
  arg.int_ = v;
  return arg;
}

Arg Arg::Uint(Kind kind, uint64_t v) {
  Arg arg(kind);
  arg.uint_ = v;
  return arg;
}

Arg Arg::Float(Kind kind, double v) {
  Arg arg(kind);
  arg.float_ = v;
  return arg;
}

void Arg::ToProto(v1::Arg* out) const {
  switch (kind_) {
    case Kind::kBuffer:
      out->mutable_buffer()->set_buffer(uint_);
      out->mutable_buffer()->set_offset(offset_);
      break;
    case Kind::kNull:
      out->set_null_pointer(true);
      break;
    case Kind::kI8:
      out->set_i8(static_cast<int32_t>(int_));
      break;
    case Kind::kI16:
      out->set_i16(static_cast<int32_t>(int_));
      break;
    case Kind::kI32:
      out->set_i32(static_cast<int32_t>(int_));
      break;
    case Kind::kI64:
      out->set_i64(int_);
      break;
    case Kind::kU8:
      out->set_u8(static_cast<uint32_t>(uint_));
      break;
    case Kind::kU16:
      out->set_u16(static_cast<uint32_t>(uint_));
      break;
    case Kind::kU32:
      out->set_u32(static_cast<uint32_t>(uint_));
      break;
    case Kind::kU64:
      out->set_u64(uint_);
      break;
    case Kind::kF16:
      out->set_f16_value(float_);
      break;
    case Kind::kBF16:
      out->set_bf16_value(float_);
      break;
    case Kind::kF16Bits:
      out->set_f16_bits(static_cast<uint32_t>(uint_));
      break;
    case Kind::kBF16Bits:
      out->set_bf16_bits(static_cast<uint32_t>(uint_));
      break;
    case Kind::kF32:
      out->set_f32(static_cast<float>(float_));
      break;
    case Kind::kF64:
      out->set_f64(float_);
      break;
    case Kind::kTensorMap:
      internal::ToProto(*tensor_map_, uint_, offset_, out->mutable_tensor_map());
      break;
    case Kind::kRaw:
      out->set_raw(raw_);
      break;
  }
}

// ---------------------------------------------------------------- Module

absl::StatusOr<Function> Module::GetFunction(std::string_view name) const {
  if (!session_) return Unusable("Module");
  grpc::ClientContext context;
  SetDeadline(&context, session_->options(), CallKind::kControl);
  v1::GetFunctionRequest request;
  request.set_session(session_->token);
  request.set_module(handle_);
  request.set_name(std::string(name));
  v1::GetFunctionResponse response;
  GPUEXEC_CLIENT_RETURN_IF_ERROR(
      session_->Status(session_->stub().GetFunction(&context, request, &response)));
  Function function;
  function.handle_ = response.function();
  function.name_ = std::string(name);
  for (const v1::ParamInfo& p : response.params()) {
    function.params_.push_back(ParamInfo{p.offset(), p.size()});
  }
  const v1::FunctionAttributes& a = response.attributes();
  FunctionAttributes& attributes = function.attributes_;
  attributes.num_registers = a.num_registers();
  attributes.static_shared_bytes = a.static_shared_bytes();
  attributes.const_bytes = a.const_bytes();
  attributes.local_bytes = a.local_bytes();
  attributes.max_threads_per_block = a.max_threads_per_block();
  attributes.max_dynamic_shared_bytes = a.max_dynamic_shared_bytes();
  attributes.ptx_version = a.ptx_version();
  attributes.binary_version = a.binary_version();
  return function;
}

// ---------------------------------------------------------------- Buffer

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

uint64_t Arg::size_bytes() const {
  switch (kind_) {
    case Kind::kI8:
    case Kind::kU8:
      return 1;
    case Kind::kI16:
    case Kind::kU16:
    case Kind::kF16:
    case Kind::kBF16:
    case Kind::kF16Bits:
    case Kind::kBF16Bits:
      return 2;
    case Kind::kI32:
    case Kind::kU32:
    case Kind::kF32:
      return 4;
    case Kind::kRaw:
      return raw_.size();
    case Kind::kTensorMap:
      return 128;  // sizeof(CUtensorMap)
    default:
      return 8;
  }
}

namespace {

// The checks a client can make without the daemon: the count, and each
// argument's size against its parameter's (as the daemon checks them).
absl::Status CheckArgs(const Function& function, absl::Span<const Arg> args) {
  const std::vector<ParamInfo>& params = function.params();
  if (args.size() != params.size()) {
    return absl::InvalidArgumentError(absl::StrCat("kernel '", function.name(), "' takes ",
                                                   params.size(), " parameters; the launch passed ",
                                                   args.size(), " arguments"));
  }
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].size_bytes() != params[i].size) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", i, " of kernel '", function.name(), "' is ", params[i].size,
                       " bytes at offset ", params[i].offset, "; argument ", i, " is ",
                       args[i].size_bytes(), " bytes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------- Session

Session::~Session() { CloseQuietly(); }

Session& Session::operator=(Session&& other) noexcept {
  if (this != &other) {
    CloseQuietly();
    state_ = std::move(other.state_);
  }
  return *this;
}

const std::string& Session::token() const {
  static const std::string* const kEmpty = new std::string();
  return state_ ? state_->token : *kEmpty;
}

uint32_t Session::device() const { return state_ ? state_->device : 0; }

const std::string& Session::daemon() const {
  static const std::string* const kEmpty = new std::string();
  return state_ ? state_->client->target : *kEmpty;
}

absl::Duration Session::lease() const {
  return state_ ? absl::Milliseconds(state_->lease_ms.load()) : absl::ZeroDuration();
}

uint64_t Session::memory_limit_bytes() const { return state_ ? state_->memory_limit_bytes : 0; }

absl::Duration Session::kernel_time_limit() const {
  return state_ ? absl::Milliseconds(state_->kernel_time_limit_ms) : absl::ZeroDuration();
}

bool Session::gpu_time() const { return state_ == nullptr || !state_->untimed; }

absl::Status Session::CheckUsable() const {
  return state_ ? absl::OkStatus() : Unusable("Session");
}

void Session::CloseQuietly() {
  if (!state_ || state_->closed.exchange(true)) return;
  state_->commands->Shutdown();
  grpc::ClientContext context;
  SetDeadline(&context, state_->options(), CallKind::kCleanup);
  v1::CloseSessionRequest request;
  request.set_session(state_->token);
  v1::CloseSessionResponse response;
  state_->stub().CloseSession(&context, request, &response).ok();
}

absl::Status Session::Close() {
  GPUEXEC_CLIENT_RETURN_IF_ERROR(CheckUsable());
  // Whatever the outcome, the destructors stop cleaning up: on success the
  // daemon freed everything; on failure retrying from a destructor would
  // not do better.
  state_->closed.store(true);
  // Commands queued before Close() start before the session goes.
  state_->commands->Order(state_->options().control_timeout).ok();
  state_->commands->Shutdown();
  grpc::ClientContext context;
  SetDeadline(&context, state_->options(), CallKind::kControl);
  v1::CloseSessionRequest request;
  request.set_session(state_->token);
  v1::CloseSessionResponse response;
  return state_->Status(state_->stub().CloseSession(&context, request, &response));
}

absl::StatusOr<absl::Duration> Session::KeepAlive() {
  GPUEXEC_CLIENT_RETURN_IF_ERROR(CheckUsable());
  grpc::ClientContext context;
  SetDeadline(&context, state_->options(), CallKind::kControl);
  v1::KeepAliveRequest request;
  request.set_session(state_->token);
  v1::KeepAliveResponse response;
  GPUEXEC_CLIENT_RETURN_IF_ERROR(
      state_->Status(state_->stub().KeepAlive(&context, request, &response)));
  state_->lease_ms.store(response.lease_ms());
  return absl::Milliseconds(response.lease_ms());
}

absl::StatusOr<Buffer> Session::Allocate(uint64_t size) {
  GPUEXEC_CLIENT_RETURN_IF_ERROR(CheckUsable());
  if (!state_->closed.load()) {
    v1::Command command;
    command.mutable_allocate()->set_size(size);
    GPUEXEC_CLIENT_ASSIGN_OR_RETURN(v1::CommandResult result,
                                    state_->commands->Submit(std::move(command), /*wait=*/true,
                                                             state_->options().control_timeout,
                                                             /*report_deferred=*/false));
    return Buffer(state_, result.allocate().buffer(), result.allocate().size());
  }
  grpc::ClientContext context;
  SetDeadline(&context, state_->options(), CallKind::kControl);
  v1::AllocateRequest request;
  request.set_session(state_->token);
  request.set_size(size);
  v1::AllocateResponse response;
  GPUEXEC_CLIENT_RETURN_IF_ERROR(
      state_->Status(state_->stub().Allocate(&context, request, &response)));
  return Buffer(state_, response.buffer(), response.size());
}

absl::StatusOr<Module> Session::LoadModule(std::string_view image, ModuleKind kind) {
  GPUEXEC_CLIENT_RETURN_IF_ERROR(CheckUsable());
  v1::LoadModuleRequest header;
  v1::ModuleHeader* h = header.mutable_header();
  h->set_session(state_->token);
  h->set_sha256(Sha256Hex(image));
  h->set_size(image.size());
  h->set_kind(ToProto(kind));
  // The cheap way first: NOT_FOUND means the daemon lacks the image.
  v1::LoadModuleResponse response;
  absl::Status status = LoadModuleCall(*state_, header, image,
                                       /*header_only=*/true, &response);
  if (absl::IsNotFound(status)) {
    response.Clear();
    status = LoadModuleCall(*state_, header, image, /*header_only=*/false, &response);
  }
  GPUEXEC_CLIENT_RETURN_IF_ERROR(status);
  Module module;
  module.session_ = state_;
  module.handle_ = response.module();
  module.sha256_ = h->sha256();
  module.uploaded_ = response.uploaded();
  module.kind_ = kind;
  if (!response.sha256().empty() && response.sha256() != module.sha256_) {
    return absl::DataLossError(absl::StrCat("gpuexec client: the daemon loaded module ",
                                            response.sha256(), " for image ", module.sha256_));
  }
  return module;
}

absl::StatusOr<Module> Session::LoadModuleFile(const std::string& path) {
  GPUEXEC_CLIENT_RETURN_IF_ERROR(CheckUsable());
  ModuleKind kind;
  if (absl::EndsWith(path, ".cubin")) {
    kind = ModuleKind::kCubin;
  } else if (absl::EndsWith(path, ".ptx")) {
    kind = ModuleKind::kPtx;
  } else if (absl::EndsWith(path, ".fatbin")) {
    kind = ModuleKind::kFatbin;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("gpuexec client: cannot tell the module kind of ", path,
                     " (expected .cubin, .ptx or .fatbin); use LoadModule()"));
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return absl::NotFoundError(absl::StrCat("gpuexec client: cannot open module file ", path));
  }
  std::string image((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (file.bad()) {
    return absl::DataLossError(absl::StrCat("gpuexec client: cannot read module file ", path));
  }
  return LoadModule(image, kind);
}

absl::StatusOr<uint64_t> Session::DoLaunch(const Function& function, const LaunchConfig& config,
                                           absl::Span<const Arg> args, LaunchMode mode) {
  GPUEXEC_CLIENT_RETURN_IF_ERROR(CheckUsable());
  v1::Command command;
  v1::LaunchRequest& request = *command.mutable_launch();
  request.set_function(function.handle());
  ToProto(config, &request);
  for (const Arg& arg : args) arg.ToProto(request.add_args());
  request.set_synchronize(mode == LaunchMode::kWait);
  if (!state_->closed.load()) {
    if (mode == LaunchMode::kQueue) {
      // What the client can check itself is checked now, so that the
      // common mistakes still fail here rather than at the next wait.
      GPUEXEC_CLIENT_RETURN_IF_ERROR(CheckArgs(function, args));
    }
    GPUEXEC_CLIENT_ASSIGN_OR_RETURN(
        v1::CommandResult result,
        state_->commands->Submit(std::move(command), /*wait=*/mode != LaunchMode::kQueue,
                                 state_->options().data_timeout,
                                 /*report_deferred=*/true));
    return result.gpu_time_ns();
  }
  // After Close(): the daemon's own answer (the session is gone).
  grpc::ClientContext context;
  SetDeadline(&context, state_->options(), CallKind::kData);
  request.set_session(state_->token);
  v1::LaunchResponse response;
  GPUEXEC_CLIENT_RETURN_IF_ERROR(
      state_->Status(state_->stub().Launch(&context, request, &response)));
  return response.gpu_time_ns();
}

absl::Status Session::Launch(const Function& function, const LaunchConfig& config,
                             absl::Span<const Arg> args) {
  return DoLaunch(function, config, args, LaunchMode::kEnqueued).status();
}

absl::Status Session::LaunchAsync(const Function& function, const LaunchConfig& config,
                                  absl::Span<const Arg> args) {
  return DoLaunch(function, config, args, LaunchMode::kQueue).status();
}

absl::StatusOr<absl::Duration> Session::LaunchAndWait(const Function& function,
                                                      const LaunchConfig& config,
                                                      absl::Span<const Arg> args) {
  GPUEXEC_CLIENT_ASSIGN_OR_RETURN(uint64_t ns, DoLaunch(function, config, args, LaunchMode::kWait));
  return absl::Nanoseconds(ns);
}

absl::StatusOr<absl::Duration> Session::Synchronize() {
  GPUEXEC_CLIENT_RETURN_IF_ERROR(CheckUsable());
  if (!state_->closed.load()) {
    v1::Command command;
    command.mutable_synchronize();
    GPUEXEC_CLIENT_ASSIGN_OR_RETURN(
        v1::CommandResult result,
        state_->commands->Submit(std::move(command), /*wait=*/true, state_->options().data_timeout,
                                 /*report_deferred=*/true));
    return absl::Nanoseconds(result.gpu_time_ns());
  }
  grpc::ClientContext context;
  SetDeadline(&context, state_->options(), CallKind::kData);
  v1::SynchronizeRequest request;
  request.set_session(state_->token);
  v1::SynchronizeResponse response;
  GPUEXEC_CLIENT_RETURN_IF_ERROR(
      state_->Status(state_->stub().Synchronize(&context, request, &response)));
  return absl::Nanoseconds(response.gpu_time_ns());
}

// ---------------------------------------------------------------- Client

namespace {

// Once per Client (its copies share the state): the daemon's version, from
// the first answer that carries one, against this library's.
void CheckDaemonVersion(ClientState& state, const std::string& daemon_version) {
  if (daemon_version.empty() || state.version_checked.exchange(true)) return;
  if (!state.options.on_warning) return;
  const std::string warning = VersionWarning(state.target, daemon_version);
  if (!warning.empty()) state.options.on_warning(warning);
}

}  // namespace

absl::StatusOr<Client> Client::Connect(const std::string& target, const ClientOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  // A connection of its own, not one shared with other channels to the
  // same target.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Every call of this client is safe to fail rather than to repeat, and
  // the retry machinery keeps a copy of each message sent (gpuexec_bench:
  // streams of 1 MiB messages were up to 1.5x faster without it).
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  if (options.chunk_bytes == 0 || options.chunk_bytes > (16u << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpuexec client: chunk_bytes ", options.chunk_bytes, " is not in 1..16 MiB"));
  }
  auto recipe = internal::MakeChannelRecipe(target, options);
  if (!recipe.ok()) return recipe.status();
  if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  std::shared_ptr<grpc::Channel> channel = internal::MakeChannel(target, *recipe, args);
  if (absl::Status connected = internal::WaitForDaemon(*channel, target, options);
      !connected.ok()) {
    return connected;
  }
  Client client(std::move(channel), options);
  client.state_->target = target;
  client.state_->args = args;
  client.state_->recipe = *std::move(recipe);
  return client;
}

Client::Client(std::shared_ptr<grpc::Channel> channel, const ClientOptions& options)
    : state_(std::make_shared<internal::ClientState>()) {
  state_->stub = v1::GpuExec::NewStub(channel);
  state_->channel = std::move(channel);
  state_->options = options;
}

const std::shared_ptr<grpc::Channel>& Client::channel() const { return state_->channel; }

const ClientOptions& Client::options() const { return state_->options; }

absl::StatusOr<std::vector<DeviceInfo>> Client::ListDevices() const {
  grpc::ClientContext context;
  SetDeadline(&context, state_->options, CallKind::kControl);
  v1::ListDevicesRequest request;
  v1::ListDevicesResponse response;
  GPUEXEC_CLIENT_RETURN_IF_ERROR(
      state_->Status(state_->stub->ListDevices(&context, request, &response)));
  CheckDaemonVersion(*state_, response.daemon_version());
  // A host has a few devices: an answer of thousands is not one to keep.
  constexpr int kMaxDevices = 4096;
  if (response.devices_size() > kMaxDevices) {
    return absl::DataLossError(absl::StrCat("gpuexec client: the daemon at ", state_->target,
                                            " answered ", response.devices_size(),
                                            " devices; at most ", kMaxDevices));
  }
  // An address is short and printable; anything else is ignored.
  std::string address = response.daemon_address();
  if (address.size() > 261 ||
      !std::all_of(address.begin(), address.end(), [](char c) { return c > ' ' && c < 0x7f; })) {
    address.clear();
  }
  std::string draining = response.draining().substr(0, 512);
  std::replace_if(
      draining.begin(), draining.end(), [](char c) { return c < ' ' || c == 0x7f; }, '?');
  std::vector<DeviceInfo> devices;
  devices.reserve(response.devices_size());
  for (const v1::Device& d : response.devices()) {
    devices.push_back(FromProto(d));
    devices.back().daemon_address = address;
    devices.back().daemon_draining = draining;
  }
  return devices;
}

absl::StatusOr<Session> Client::OpenSession(const SessionOptions& options) const {
  grpc::ClientContext context;
  SetDeadline(&context, state_->options, CallKind::kControl);
  v1::OpenSessionRequest request;
  if (options.device) request.set_device(*options.device);
  request.set_lease_ms(
      static_cast<uint64_t>(std::max<int64_t>(0, absl::ToInt64Milliseconds(options.lease))));
  request.set_memory_limit_bytes(options.memory_limit_bytes);
  request.set_kernel_time_limit_ms(static_cast<uint64_t>(
      std::max<int64_t>(0, absl::ToInt64Milliseconds(options.kernel_time_limit))));
  request.set_untimed(!options.gpu_time);
  v1::OpenSessionResponse response;
  GPUEXEC_CLIENT_RETURN_IF_ERROR(
      state_->Status(state_->stub->OpenSession(&context, request, &response)));
  CheckDaemonVersion(*state_, response.daemon_version());
  auto state = std::make_shared<internal::SessionState>();
  state->client = state_;
  state->token = response.session();
  state->device = response.device();
  state->memory_limit_bytes = response.memory_limit_bytes();
  state->kernel_time_limit_ms = response.kernel_time_limit_ms();
  state->untimed = response.untimed();
  state->lease_ms.store(response.lease_ms());
  state->shm_socket =
      !state_->options.shm_socket.empty() ? state_->options.shm_socket : response.shm_socket();
  auto stream = std::make_unique<internal::CommandStream>(
      state_->stub.get(), state->token, state_->options.spin_wait, state_->target);
  std::function<absl::StatusOr<std::unique_ptr<internal::CommandRing>>()> open_ring;
  const char* env = std::getenv("GPUEXEC_COMMAND_RING");
  if (state_->options.command_ring && response.command_ring_version() >= 1 &&
      !state->shm_socket.empty() && (env == nullptr || std::string(env) != "0")) {
    internal::CommandRing::Options ro;
    ro.socket_path = state->shm_socket;
    ro.token = state->token;
    ro.spin_wait = state_->options.spin_wait;
    ro.timeout = state_->options.control_timeout;
    open_ring = [ro] { return internal::CommandRing::Open(ro); };
  }
  state->commands = std::make_unique<internal::SessionCommands>(
      std::move(stream), std::move(open_ring), state_->options.on_debug);
  return Session(std::move(state));
}

}  // namespace gpuexec
