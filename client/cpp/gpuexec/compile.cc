// Session::CompileModule: source compiled by the daemon (client.h).

#include <grpcpp/grpcpp.h>

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gpuexec/client.h"
#include "gpuexec/v1/gpuexec.grpc.pb.h"
#include "internal/command_stream.h"
#include "internal/convert.h"
#include "internal/status_macros_internal.h"

namespace gpuexec {

std::string CompiledModule::LoweredName(std::string_view name_expression) const {
  for (const auto& [expression, lowered] : lowered_names) {
    if (expression == name_expression) return lowered;
  }
  return "";
}

absl::StatusOr<CompiledModule> Session::CompileModule(const CompileSpec& spec) {
  GPUEXEC_CLIENT_RETURN_IF_ERROR(CheckUsable());
  v1::CompileModuleRequest request;
  request.set_session(state_->token);
  request.set_source(spec.source);
  request.set_source_name(spec.name);
  for (const auto& [name, content] : spec.headers) {
    v1::CompileHeader* h = request.add_headers();
    h->set_name(name);
    h->set_content(content);
  }
  for (const std::string& o : spec.options) request.add_options(o);
  for (const std::string& e : spec.name_expressions) request.add_name_expressions(e);
  request.set_return_image(spec.return_image);
  grpc::ClientContext context;
  internal::SetDeadline(&context, state_->options(), internal::CallKind::kData);
  v1::CompileModuleResponse response;
  GPUEXEC_CLIENT_RETURN_IF_ERROR(
      state_->Status(state_->stub().CompileModule(&context, request, &response)));
  CompiledModule out;
  out.module.session_ = state_;
  out.module.handle_ = response.module();
  out.module.sha256_ = response.sha256();
  out.module.uploaded_ = !response.cached();
  out.module.kind_ = response.image_is_ptx() ? ModuleKind::kPtx : ModuleKind::kCubin;
  out.cached = response.cached();
  out.log = response.log();
  out.log_bytes = response.log_bytes();
  for (const v1::LoweredName& l : response.lowered_names()) {
    out.lowered_names.emplace_back(l.name_expression(), l.lowered_name());
  }
  out.kernels.assign(response.kernels().begin(), response.kernels().end());
  out.arch = response.arch();
  out.nvrtc_version = response.nvrtc_version();
  out.compile_time = absl::Microseconds(response.compile_time_us());
  out.image = std::move(*response.mutable_image());
  out.image_is_ptx = response.image_is_ptx();
  return out;
}

}  // namespace gpuexec
