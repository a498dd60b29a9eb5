#ifndef GPUEXEC_CLIENT_CPP_INTERNAL_CLIENT_STATE_H_
#define GPUEXEC_CLIENT_CPP_INTERNAL_CLIENT_STATE_H_

// What every copy of a Client shares (its channel, stubs and options).

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
#include "internal/status_macros_internal.h"

namespace gpuexec {
namespace internal {

// An UNAVAILABLE status with the daemon it came from named (`daemon` is
// its target: a pool's sessions live on many); others as they are.
inline absl::Status NameDaemon(const std::string& daemon, absl::Status status) {
  if (status.code() != absl::StatusCode::kUnavailable || daemon.empty() ||
      absl::StrContains(status.message(), daemon)) {
    return status;
  }
  return absl::UnavailableError(absl::StrCat("daemon ", daemon, ": ", status.message()));
}

// What every copy of a Client shares.
struct ClientState {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::GpuExec::Stub> stub;
  ClientOptions options;
  // Set by Connect(): what the further connections of a transfer in parts
  // dial, and with which arguments. Empty: transfers go whole.
  std::string target;
  grpc::ChannelArguments args;
  ChannelRecipe recipe;
  // Set by the first answer that told the daemon's version (client.cc).
  std::atomic<bool> version_checked{false};

  // A reply's status, UNAVAILABLE naming this daemon.
  absl::Status Status(const grpc::Status& status) const {
    return NameDaemon(target, FromGrpcStatus(status));
  }

  // The channels of a transfer in up to `parts` parts: `channel`, then
  // connections of their own, opened the first time they are wanted and
  // kept for the client's life. A connection that is not up within a
  // second (a proxy that takes one connection per client, say) ends the
  // opening of more for good: the client's transfers then go in as many
  // parts as it has connections, or whole.
  std::vector<std::shared_ptr<grpc::Channel>> TransferChannels(size_t parts) {
    absl::MutexLock lock(&mu);
    while (transfer_channels.size() + 1 < parts && !cannot_open_more) {
      auto extra = MakeChannel(target, recipe, args);
      const absl::Duration wait = std::min(options.connect_timeout, absl::Seconds(1));
      if (!extra->WaitForConnected(absl::ToChronoTime(absl::Now() + wait))) {
        cannot_open_more = true;
        break;
      }
      transfer_channels.push_back(std::move(extra));
    }
    std::vector<std::shared_ptr<grpc::Channel>> out = {channel};
    const size_t extras = std::min(parts - 1, transfer_channels.size());
    out.insert(out.end(), transfer_channels.begin(), transfer_channels.begin() + extras);
    return out;
  }

 private:
  absl::Mutex mu;
  std::vector<std::shared_ptr<grpc::Channel>> transfer_channels ABSL_GUARDED_BY(mu);
  bool cannot_open_more ABSL_GUARDED_BY(mu) = false;
};

}  // namespace internal
}  // namespace gpuexec

#endif  // GPUEXEC_CLIENT_CPP_INTERNAL_CLIENT_STATE_H_
