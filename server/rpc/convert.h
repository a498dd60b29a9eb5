#ifndef GPUEXEC_SERVER_RPC_CONVERT_H_
#define GPUEXEC_SERVER_RPC_CONVERT_H_

// Every conversion between the wire types (gpuexec.v1 protos) and the
// core's plain types, in one place.

#include "absl/status/statusor.h"
#include "gpuexec/v1/gpuexec.pb.h"
#include "server/core/commands.h"
#include "server/core/engine.h"

namespace gpuexec::rpc {

void ToProto(const core::DeviceStatus& in, v1::Device* out);
void ToProto(const core::SessionInfo& in, v1::OpenSessionResponse* out);
void ToProto(const core::FunctionResult& in, v1::GetFunctionResponse* out);
core::ModuleKind FromProto(v1::ModuleKind kind);
// INVALID_ARGUMENT naming the argument when it carries no value.
absl::StatusOr<core::ArgValue> FromProto(const v1::Arg& arg, size_t index);

// INVALID_ARGUMENT for more than core::kMaxLaunchArgs arguments, before any
// is converted.
absl::StatusOr<core::LaunchSpec> FromProto(const v1::LaunchRequest& request);
// INVALID_ARGUMENT for more than core::kMaxGraphPatches patches, or a patch
// whose value is malformed (naming it).
absl::StatusOr<core::LaunchGraphSpec> FromProto(const v1::LaunchGraphRequest& request);

// A command of the Execute stream; INVALID_ARGUMENT for a launch that does
// not convert or a RegionCopy with no direction.
absl::StatusOr<core::Command> FromProto(const v1::Command& command);
// The name of a command's kind, as core::CommandName gives it.
const char* CommandName(const v1::Command& command);
// The result as the stream carries it (the caller has decided it is
// answered).
void ToProto(const core::CommandResult& in, v1::CommandResult* out);

}  // namespace gpuexec::rpc

#endif  // GPUEXEC_SERVER_RPC_CONVERT_H_
