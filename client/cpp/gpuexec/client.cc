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

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gpuexec/command_ring.h"
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
using internal::LoadModuleCall;
using internal::SessionState;
using internal::SetDeadline;
using internal::ToProto;
using internal::Unusable;

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
  state_->commands->Order(state_->options().control_timeout).IgnoreError();
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
    // 256 answers: more than the waiting commands a session's threads have
    // out at once.
    if (response.command_ring_version() >= ring::kAnswerAreaVersion) ro.answer_bytes = 16 << 10;
    open_ring = [ro] { return internal::CommandRing::Open(ro); };
  }
  state->commands = std::make_unique<internal::SessionCommands>(
      std::move(stream), std::move(open_ring), state_->options.on_debug);
  return Session(std::move(state));
}

}  // namespace gpuexec
