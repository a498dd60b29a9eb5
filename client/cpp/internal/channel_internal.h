#ifndef GPUEXEC_CLIENT_CPP_INTERNAL_CHANNEL_INTERNAL_H_
#define GPUEXEC_CLIENT_CPP_INTERNAL_CHANNEL_INTERNAL_H_

// How the client's channels are made: its transport credentials (plain or
// TLS, with a client certificate) and its token, added to every call by an
// interceptor (gRPC's own call credentials are never sent over plain TCP,
// and a daemon on loopback or a Unix socket is reached that way).

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gpuexec/client.h"

namespace gpuexec::internal {

// Everything a channel of `options` needs, read and checked once.
struct ChannelRecipe {
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  std::string token;  // empty: none
};

absl::StatusOr<ChannelRecipe> MakeChannelRecipe(const std::string& target,
                                                const ClientOptions& options);

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, const ChannelRecipe& recipe,
                                           const grpc::ChannelArguments& args);

}  // namespace gpuexec::internal

#endif  // GPUEXEC_CLIENT_CPP_INTERNAL_CHANNEL_INTERNAL_H_
