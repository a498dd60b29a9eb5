// Client::Drain: an operator's call, apart from the session calls.

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "gpuexec/client.h"
#include "gpuexec/v1/gpuexec.grpc.pb.h"
#include "internal/client_state.h"
#include "internal/convert.h"
#include "internal/status_macros_internal.h"

namespace gpuexec {

absl::StatusOr<DrainStatus> Client::Drain(const DrainOptions& options) const {
  if (state_ == nullptr) return internal::Unusable("the client");
  if (options.deadline < absl::ZeroDuration() || options.deadline > absl::Hours(24)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpuexec client: a drain's deadline is 0 (the daemon's) to 24h, not ",
                     absl::FormatDuration(options.deadline)));
  }
  grpc::ClientContext context;
  absl::Duration timeout = options.call_timeout;
  if (timeout <= absl::ZeroDuration()) {
    timeout = !options.wait
                  ? state_->options.control_timeout
                  : (options.deadline > absl::ZeroDuration() ? options.deadline : absl::Hours(24)) +
                        absl::Minutes(1);
  }
  if (timeout != absl::InfiniteDuration()) {
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  }
  v1::DrainRequest request;
  request.set_deadline_ms(static_cast<uint64_t>(absl::ToInt64Milliseconds(options.deadline)));
  request.set_wait(options.wait);
  request.set_resume(options.resume);
  v1::DrainResponse response;
  GPUEXEC_CLIENT_RETURN_IF_ERROR(state_->Status(state_->stub->Drain(&context, request, &response)));
  DrainStatus out;
  out.draining = response.draining();
  out.sessions_open = response.sessions_open();
  if (response.deadline_unix_ms() != 0)
    out.deadline = absl::FromUnixMillis(response.deadline_unix_ms());
  out.closed_at_deadline = response.closed_at_deadline();
  out.description = response.description().substr(0, 512);
  std::replace_if(
      out.description.begin(), out.description.end(), [](char c) { return c < ' ' || c == 0x7f; },
      '?');
  return out;
}

}  // namespace gpuexec
