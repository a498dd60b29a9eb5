#ifndef GPUEXEC_SERVER_TENANTS_TENANTS_H_
#define GPUEXEC_SERVER_TENANTS_TENANTS_H_

// The tenants file and the one question it answers: which tenant do these
// credentials name? No gRPC here: the rpc layer gathers the credentials
// from the transport (a bearer token, a verified client certificate's
// names, the Unix socket peer's uid and gid) and asks a Directory.
//
// A Directory is immutable once parsed; a reload parses a new one and the
// daemon swaps it in whole, so a call sees one file or the other.
//
// Tokens: the file holds only their SHA-256 digests. Identify hashes the
// token once and compares the digest with every digest of the file in time
// that does not depend on where (or whether) it matches.

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/core/tenant.h"

namespace gpuexec::tenants {

// The largest tenants file read (its own limit, so a mistaken path to a big
// file fails at once).
inline constexpr size_t kMaxFileBytes = 1 << 20;

struct PeerCredentials {
  uint32_t uid = 0;
  uint32_t gid = 0;
  int32_t pid = 0;
};

// What a call's transport established about its caller.
struct Credentials {
  // The `authorization` metadata, if sent ("Bearer <token>").
  std::optional<std::string> authorization;
  // A verified client certificate's subject alternative names (DNS, URI),
  // or its common name when it has none. Empty: no certificate.
  std::vector<std::string> certificate_names;
  // The Unix socket's peer, for calls that came over it.
  std::optional<PeerCredentials> unix_peer;
};

// Why credentials were refused (a metrics label: a fixed set, never a
// value the caller sent).
enum class Refusal {
  kNoCredentials,
  kMalformedAuthorization,
  kUnknownToken,
  kUnknownCertificate,
  kUnknownPeer,
  kConflictingCredentials,
};
const char* RefusalLabel(Refusal r);
inline constexpr Refusal kAllRefusals[] = {
    Refusal::kNoCredentials, Refusal::kMalformedAuthorization,
    Refusal::kUnknownToken,  Refusal::kUnknownCertificate,
    Refusal::kUnknownPeer,   Refusal::kConflictingCredentials};

class Directory {
 public:
  // Parses and checks a tenants file's text. Errors name the file, the line
  // and the field: "tenants.textproto:12: tenant 'a' token_sha256: ...".
  static absl::StatusOr<std::shared_ptr<const Directory>> Parse(absl::string_view text,
                                                                absl::string_view file_name);
  // Reads and parses `path`.
  static absl::StatusOr<std::shared_ptr<const Directory>> Load(const std::string& path);

  size_t size() const { return tenants_.size(); }
  std::vector<std::string> names() const;
  // Tenants with a token and no certificate name, in the file's order: a
  // daemon that requires client certificates (--tls_client_ca) lets them
  // in over TCP only with a certificate, which then names no tenant of
  // theirs unless the file lists its name.
  std::vector<std::string> TokenOnlyNames() const;
  // The tenant called `name`, or null.
  std::shared_ptr<const core::Tenant> Find(absl::string_view name) const;

  // The tenant the credentials name, or UNAUTHENTICATED saying what was
  // wrong without telling which tenants exist (`*why` says which case).
  absl::StatusOr<std::shared_ptr<const core::Tenant>> Identify(const Credentials& credentials,
                                                               Refusal* why) const;

 private:
  Directory() = default;

  std::vector<std::shared_ptr<const core::Tenant>> tenants_;
  // Every token digest of the file, and the index of its tenant.
  std::vector<std::pair<std::array<uint8_t, 32>, size_t>> tokens_;
  absl::flat_hash_map<std::string, size_t> certificate_names_;
  absl::flat_hash_map<uint32_t, size_t> uids_;
  absl::flat_hash_map<uint32_t, size_t> gids_;
};

// Identify for a daemon without a tenants file: everyone is the default
// tenant, except that a verified client certificate (mutual TLS) names a
// tenant of its own, "cert:<its first name>", without limits of its own.
absl::StatusOr<std::shared_ptr<const core::Tenant>> IdentifyWithoutFile(
    const Credentials& credentials);

// The bearer token of an `authorization` value ("Bearer <token>", the
// scheme in any case), or empty if it is not one.
std::string BearerToken(absl::string_view authorization);

}  // namespace gpuexec::tenants

#endif  // GPUEXEC_SERVER_TENANTS_TENANTS_H_
