#include <grpcpp/support/client_interceptor.h>

#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gpuexec/address.h"
#include "internal/channel_internal.h"

namespace gpuexec::internal {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpuexec client: cannot read ", what, " ", path));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Adds the token to every call's initial metadata.
class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(const std::string* value) : value_(value) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", *value_);
    }
    methods->Proceed();
  }

 private:
  const std::string* value_;  // owned by the factory
};

class TokenInterceptorFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(const std::string& token) : value_("Bearer " + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(&value_);
  }

 private:
  const std::string value_;
};

}  // namespace

absl::StatusOr<ChannelRecipe> MakeChannelRecipe(const std::string& target, const ClientOptions& o) {
  ChannelRecipe recipe;
  recipe.token = o.token;
  const bool tls = o.tls || !o.tls_root_ca_file.empty() || !o.tls_cert_file.empty();
  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "gpuexec client: a client certificate needs both its file and its key's");
  }
  if (!tls) {
    if (!o.token.empty() && !o.allow_token_over_plain_tcp && !IsLoopbackAddress(target)) {
      return absl::FailedPreconditionError(
          absl::StrCat("gpuexec client: refusing to send the token over plain TCP to ", target,
                       ", where anyone on the path could read it: use TLS (a root CA), or allow it "
                       "explicitly"));
    }
    recipe.credentials = grpc::InsecureChannelCredentials();
    return recipe;
  }
  grpc::SslCredentialsOptions ssl;
  if (!o.tls_root_ca_file.empty()) {
    auto ca = ReadPem(o.tls_root_ca_file, "root CA");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *std::move(ca);
  }
  if (!o.tls_cert_file.empty()) {
    auto cert = ReadPem(o.tls_cert_file, "client certificate");
    if (!cert.ok()) return cert.status();
    auto key = ReadPem(o.tls_key_file, "client key");
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *std::move(cert);
    ssl.pem_private_key = *std::move(key);
  }
  recipe.credentials = grpc::SslCredentials(ssl);
  return recipe;
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, const ChannelRecipe& recipe,
                                           const grpc::ChannelArguments& args) {
  if (recipe.token.empty()) return grpc::CreateCustomChannel(target, recipe.credentials, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> token;
  token.push_back(std::make_unique<TokenInterceptorFactory>(recipe.token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, recipe.credentials, args,
                                                                 std::move(token));
}

}  // namespace gpuexec::internal
