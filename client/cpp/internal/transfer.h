#ifndef GPUEXEC_CLIENT_CPP_INTERNAL_TRANSFER_H_
#define GPUEXEC_CLIENT_CPP_INTERNAL_TRANSFER_H_

// Module uploads, and Writes and Reads in parts over several connections
// at once.

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
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
#include "gpuexec/client.h"
#include "gpuexec/grpc_status.h"
#include "gpuexec/sha256.h"
#include "gpuexec/v1/gpuexec.grpc.pb.h"
#include "gpuexec/wire.h"
#include "internal/channel_internal.h"
#include "internal/command_stream.h"
#include "internal/convert.h"
#include "internal/status_macros_internal.h"

namespace gpuexec {
namespace internal {

// One LoadModule call: the header, then `image` in chunks unless
// `header_only`.
absl::Status LoadModuleCall(const SessionState& session, const v1::LoadModuleRequest& header,
                            std::string_view image, bool header_only,
                            v1::LoadModuleResponse* response);

// The calls of one transfer in parts (see InParts). A part that fails
// cancels the others; the transfer then reports that failure, not the
// cancellations it caused.
class PartGroup {
 public:
  // A part's call joins with its context before it starts, and leaves with
  // its outcome before the context goes.
  void Join(grpc::ClientContext* context) {
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) context->TryCancel();
    contexts_.insert(context);
  }
  void Leave(grpc::ClientContext* context, const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    contexts_.erase(context);
    if (status.ok() || !error_.ok()) return;
    error_ = status;
    for (grpc::ClientContext* c : contexts_) c->TryCancel();
  }
  absl::Status error() const {
    absl::MutexLock lock(&mu_);
    return error_;
  }

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_set<grpc::ClientContext*> contexts_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

// Runs a transfer of `size` bytes at `offset` of a buffer of `buffer_size`
// bytes as calls of `part(channel, at, n, group)`, each for bytes
// [at, at + n) of the transfer: one call on the client's channel, or up to
// ClientOptions::transfer_streams calls at once, on connections of their
// own, in parts of whole chunks. `group` is null for a single call.
using TransferPart = std::function<absl::Status(const std::shared_ptr<grpc::Channel>& channel,
                                                uint64_t at, uint64_t n, PartGroup* group)>;

absl::Status InParts(const SessionState& session, uint64_t buffer_size, uint64_t offset,
                     uint64_t size, const TransferPart& part);

// Runs `call` under a data call's context, which is a member of `group`
// (if any) while the call runs.
absl::Status InGroup(const SessionState& session, PartGroup* group,
                     const std::function<absl::Status(grpc::ClientContext&)>& call);

using ReadSink = std::function<absl::Status(uint64_t at, std::string_view data)>;

// ReadCall's call, under `context`.
absl::Status ReadWithin(grpc::ClientContext& context, const SessionState& session,
                        const std::shared_ptr<grpc::Channel>& channel, uint64_t buffer,
                        uint64_t offset, uint64_t size, const ReadSink& sink);

// Streams Read chunks of [offset, offset + size) to `sink` (size 0: to the
// end), checking that they arrive in order and without gaps.
absl::Status ReadCall(const SessionState& session, const std::shared_ptr<grpc::Channel>& channel,
                      uint64_t buffer, uint64_t offset, uint64_t size, PartGroup* group,
                      const ReadSink& sink);

// One Write call: `data` to [offset, offset + data.size()) of `buffer`.
absl::Status WriteCall(const SessionState& session, const std::shared_ptr<grpc::Channel>& channel,
                       uint64_t buffer, uint64_t offset, absl::Span<const uint8_t> data,
                       PartGroup* group);

}  // namespace internal
}  // namespace gpuexec

#endif  // GPUEXEC_CLIENT_CPP_INTERNAL_TRANSFER_H_
