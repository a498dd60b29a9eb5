#include "server/tenants/tenants.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "gpuexec/config/v1/tenants.pb.h"
#include "gpuexec/sha256.h"
#include "server/common/text.h"

namespace gpuexec::tenants {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::TextFormat;

// The smallest kernel time limit a session may have (as the engine's).
constexpr uint64_t kMinKernelTimeLimitMs = 100;
constexpr size_t kMaxNameBytes = 64;
constexpr size_t kMaxCertificateNameBytes = 256;
constexpr uint32_t kMaxTenantCompiles = 32;

class FirstError final : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (!message_.empty()) return;
    line_ = line + 1;
    column_ = column + 1;
    message_ = message;
  }
  bool seen() const { return !message_.empty(); }
  std::string Describe(absl::string_view file) const {
    // Protobuf's message quotes the file's text: cut and escaped.
    return absl::StrCat(file, ":", line_, ":", column_, ": ", Quoted(message_, 200));
  }

 private:
  int line_ = 0;
  int column_ = 0;
  std::string message_;
};

bool ValidName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxNameBytes) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

std::array<uint8_t, 32> DigestBytes(absl::string_view hex) {
  std::array<uint8_t, 32> out{};
  const std::string raw = absl::HexStringToBytes(hex);
  std::copy_n(raw.begin(), std::min<size_t>(raw.size(), out.size()), out.begin());
  return out;
}

absl::Status Unauthenticated(Refusal reason, Refusal* why, absl::string_view message) {
  if (why != nullptr) *why = reason;
  return absl::UnauthenticatedError(message);
}

}  // namespace

const char* RefusalLabel(Refusal r) {
  switch (r) {
    case Refusal::kNoCredentials:
      return "no_credentials";
    case Refusal::kMalformedAuthorization:
      return "malformed_authorization";
    case Refusal::kUnknownToken:
      return "unknown_token";
    case Refusal::kUnknownCertificate:
      return "unknown_certificate";
    case Refusal::kUnknownPeer:
      return "unknown_peer";
    case Refusal::kConflictingCredentials:
      return "conflicting_credentials";
  }
  return "unknown";
}

std::string BearerToken(absl::string_view authorization) {
  constexpr absl::string_view kScheme = "bearer ";
  if (authorization.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(authorization.substr(0, kScheme.size()), kScheme)) {
    return "";
  }
  return std::string(absl::StripAsciiWhitespace(authorization.substr(kScheme.size())));
}

absl::StatusOr<std::shared_ptr<const Directory>> Directory::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("tenants file ", path, " cannot be read"));
  std::string text;
  text.resize(kMaxFileBytes + 1);
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("tenants file ", path, " is over ", kMaxFileBytes, " bytes"));
  }
  return Parse(text, path);
}

absl::StatusOr<std::shared_ptr<const Directory>> Directory::Parse(absl::string_view text,
                                                                  absl::string_view file) {
  config::v1::TenantsConfig config;
  TextFormat::Parser parser;
  FirstError errors;
  TextFormat::ParseInfoTree tree;
  parser.RecordErrorsTo(&errors);
  parser.WriteLocationsTo(&tree);
  if (!parser.ParseFromString(std::string(text), &config) || errors.seen()) {
    return absl::InvalidArgumentError(errors.Describe(file));
  }
  const auto* tenant_field = config::v1::TenantsConfig::descriptor()->FindFieldByName("tenant");
  const auto* desc = config::v1::Tenant::descriptor();
  std::shared_ptr<Directory> dir(new Directory);
  absl::flat_hash_map<std::string, size_t> names;
  absl::flat_hash_map<std::string, size_t> digests;
  // Dedicated devices: device -> the tenant it is given to.
  absl::flat_hash_map<uint32_t, size_t> dedicated;
  std::vector<std::shared_ptr<core::Tenant>> made;

  for (int i = 0; i < config.tenant_size(); ++i) {
    const config::v1::Tenant& t = config.tenant(i);
    const TextFormat::ParseInfoTree* nested = tree.GetTreeForNested(tenant_field, i);
    // "file:LINE: tenant 'a' FIELD: why", LINE of the field's value (of the
    // tenant when the field is absent).
    auto where = [&](absl::string_view field, int index) {
      int line = tree.GetLocation(tenant_field, i).line;
      const FieldDescriptor* f = desc->FindFieldByName(std::string(field));
      if (nested != nullptr && f != nullptr) {
        const int at = nested->GetLocation(f, f->is_repeated() ? index : -1).line;
        if (at >= 0) line = at;
      }
      return absl::StrCat(
          file, ":", line + 1, ": tenant ",
          t.name().empty() ? absl::StrCat("#", i + 1) : absl::StrCat("'", Quoted(t.name()), "'"),
          " ", field);
    };
    auto error = [&](absl::string_view field, int index, absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(where(field, index), ": ", why));
    };
    if (!ValidName(t.name())) {
      return error("name", -1,
                   absl::StrCat("must be 1-", kMaxNameBytes, " characters of A-Z a-z 0-9 . _ -"));
    }
    if (!names.emplace(t.name(), i).second) {
      return error("name", -1, "is used by an earlier tenant too");
    }
    if (t.token_sha256_size() == 0 && t.certificate_name_size() == 0 && t.uid_size() == 0 &&
        t.gid_size() == 0) {
      return error("name", -1,
                   "has no token_sha256, certificate_name, uid or gid: no caller could be it");
    }
    for (int k = 0; k < t.token_sha256_size(); ++k) {
      const std::string& d = t.token_sha256(k);
      if (!IsSha256Hex(d)) {
        return error("token_sha256", k,
                     "must be 64 lower-case hex digits, the SHA-256 of the token "
                     "(printf %s \"$TOKEN\" | sha256sum)");
      }
      if (!digests.emplace(d, i).second) {
        return error("token_sha256", k, "is listed twice (a token names one tenant)");
      }
      dir->tokens_.emplace_back(DigestBytes(d), static_cast<size_t>(i));
    }
    for (int k = 0; k < t.certificate_name_size(); ++k) {
      const std::string& n = t.certificate_name(k);
      if (n.empty() || n.size() > kMaxCertificateNameBytes) {
        return error("certificate_name", k,
                     absl::StrCat("must be 1-", kMaxCertificateNameBytes, " characters"));
      }
      if (!dir->certificate_names_.emplace(n, i).second) {
        return error("certificate_name", k, "is listed twice (a name names one tenant)");
      }
    }
    for (int k = 0; k < t.uid_size(); ++k) {
      if (!dir->uids_.emplace(t.uid(k), i).second) {
        return error("uid", k, absl::StrCat(t.uid(k), " is listed twice"));
      }
    }
    for (int k = 0; k < t.gid_size(); ++k) {
      if (!dir->gids_.emplace(t.gid(k), i).second) {
        return error("gid", k, absl::StrCat(t.gid(k), " is listed twice"));
      }
    }
    if (t.kernel_time_limit_ms() != 0 && t.kernel_time_limit_ms() < kMinKernelTimeLimitMs) {
      return error("kernel_time_limit_ms", -1,
                   absl::StrCat(t.kernel_time_limit_ms(), " is below the minimum of ",
                                kMinKernelTimeLimitMs, " ms"));
    }
    for (int k = 0; k < t.dedicated_devices_size(); ++k) {
      auto [it, added] = dedicated.emplace(t.dedicated_devices(k), static_cast<size_t>(i));
      if (!added) {
        return error("dedicated_devices", k,
                     absl::StrCat("device ", t.dedicated_devices(k), " is dedicated to tenant '",
                                  config.tenant(static_cast<int>(it->second)).name(),
                                  "' already (a device is given to one tenant at most)"));
      }
    }
    if (t.has_compute_share()) {
      const config::v1::ComputeShare& c = t.compute_share();
      if (c.amount_case() == config::v1::ComputeShare::kFraction &&
          !(c.fraction() > 0 && c.fraction() <= 1)) {
        return error("compute_share", -1,
                     absl::StrCat("the fraction ", c.fraction(), " is not in (0, 1]"));
      }
      if (c.amount_case() == config::v1::ComputeShare::kSms && c.sms() == 0) {
        return error("compute_share", -1, "0 SMs is no share; leave it out");
      }
      if (c.amount_case() == config::v1::ComputeShare::AMOUNT_NOT_SET) {
        return error("compute_share", -1, "says neither a fraction nor sms");
      }
    }
    auto tenant = std::make_shared<core::Tenant>();
    tenant->name = t.name();
    tenant->limits.devices.assign(t.devices().begin(), t.devices().end());
    if (!tenant->limits.devices.empty()) {
      for (uint32_t d : t.dedicated_devices()) {
        if (std::find(tenant->limits.devices.begin(), tenant->limits.devices.end(), d) ==
            tenant->limits.devices.end()) {
          tenant->limits.devices.push_back(d);
        }
      }
    }
    tenant->limits.memory_bytes = t.memory_limit_bytes();
    tenant->limits.max_sessions = t.max_sessions();
    tenant->limits.max_lease_ms = t.max_lease_ms();
    tenant->limits.kernel_time_limit_ms = t.kernel_time_limit_ms();
    tenant->limits.module_bytes = t.module_bytes();
    tenant->limits.host_memory = t.host_memory();
    tenant->limits.pinned_bytes = t.pinned_bytes();
    tenant->limits.max_command_rings = t.max_command_rings();
    // At most half the daemon's compile queue (64), so that no one tenant
    // can fill it for the others.
    if (t.max_compiles() > kMaxTenantCompiles) {
      return error("max_compiles", -1,
                   absl::StrCat("is ", t.max_compiles(), ", over ", kMaxTenantCompiles,
                                " (half the daemon's queue of compiles); give at most ",
                                kMaxTenantCompiles));
    }
    tenant->limits.max_compiles = t.max_compiles();
    tenant->limits.low_priority = t.priority() == config::v1::Tenant::LOW;
    if (t.has_compute_share()) {
      tenant->limits.compute_share.fraction = t.compute_share().fraction();
      tenant->limits.compute_share.sms = t.compute_share().sms();
      // Where a device that cannot honour it will say it was written.
      tenant->limits.compute_share.where = where("compute_share", -1);
    }
    made.push_back(std::move(tenant));
  }
  // Each tenant is kept off the devices dedicated to the others.
  for (const auto& [device, owner] : dedicated) {
    for (size_t i = 0; i < made.size(); ++i) {
      if (i != owner) made[i]->limits.excluded_devices.push_back(device);
    }
  }
  for (auto& t : made) {
    std::sort(t->limits.excluded_devices.begin(), t->limits.excluded_devices.end());
    dir->tenants_.push_back(std::move(t));
  }
  return std::shared_ptr<const Directory>(std::move(dir));
}

std::vector<std::string> Directory::names() const {
  std::vector<std::string> out;
  for (const auto& t : tenants_) out.push_back(t->name);
  return out;
}

std::vector<std::string> Directory::TokenOnlyNames() const {
  std::vector<bool> token(tenants_.size()), certificate(tenants_.size());
  for (const auto& entry : tokens_) token[entry.second] = true;
  for (const auto& entry : certificate_names_) certificate[entry.second] = true;
  std::vector<std::string> out;
  for (size_t i = 0; i < tenants_.size(); ++i) {
    if (token[i] && !certificate[i]) out.push_back(tenants_[i]->name);
  }
  return out;
}

std::shared_ptr<const core::Tenant> Directory::Find(absl::string_view name) const {
  for (const auto& t : tenants_) {
    if (t->name == name) return t;
  }
  return nullptr;
}

absl::StatusOr<std::shared_ptr<const core::Tenant>> Directory::Identify(const Credentials& c,
                                                                        Refusal* why) const {
  constexpr size_t kNone = SIZE_MAX;
  size_t by_token = kNone, by_certificate = kNone, by_peer = kNone;
  if (c.authorization.has_value()) {
    const std::string token = BearerToken(*c.authorization);
    if (token.empty()) {
      return Unauthenticated(Refusal::kMalformedAuthorization, why,
                             "the authorization metadata is not 'Bearer <token>'");
    }
    const std::array<uint8_t, 32> digest = DigestBytes(Sha256Hex(token));
    // Every digest is compared in full: the time taken says nothing about
    // which one, if any, matched.
    for (const auto& [known, index] : tokens_) {
      by_token = DigestsEqual(known.data(), digest.data(), digest.size()) ? index : by_token;
    }
    if (by_token == kNone) {
      return Unauthenticated(Refusal::kUnknownToken, why, "unknown or revoked bearer token");
    }
  }
  if (!c.certificate_names.empty()) {
    for (const std::string& n : c.certificate_names) {
      auto it = certificate_names_.find(n);
      if (it == certificate_names_.end()) continue;
      if (by_certificate != kNone && by_certificate != it->second) {
        return Unauthenticated(Refusal::kConflictingCredentials, why,
                               "the client certificate's names name more than one tenant");
      }
      by_certificate = it->second;
    }
    // A certificate signed by the daemon's CA that names no tenant is only
    // refused when nothing else names one.
  }
  if (c.unix_peer.has_value()) {
    if (auto it = uids_.find(c.unix_peer->uid); it != uids_.end()) {
      by_peer = it->second;
    } else if (auto git = gids_.find(c.unix_peer->gid); git != gids_.end()) {
      by_peer = git->second;
    }
  }
  size_t chosen = kNone;
  for (size_t named : {by_token, by_certificate, by_peer}) {
    if (named == kNone) continue;
    if (chosen != kNone && chosen != named) {
      return Unauthenticated(Refusal::kConflictingCredentials, why,
                             "the call's credentials name different tenants");
    }
    chosen = named;
  }
  if (chosen != kNone) return tenants_[chosen];
  if (!c.certificate_names.empty()) {
    return Unauthenticated(Refusal::kUnknownCertificate, why,
                           "the client certificate names no tenant of this daemon");
  }
  if (c.unix_peer.has_value()) {
    return Unauthenticated(Refusal::kUnknownPeer, why,
                           absl::StrCat("uid ", c.unix_peer->uid, " (gid ", c.unix_peer->gid,
                                        ") names no tenant of this daemon"));
  }
  return Unauthenticated(Refusal::kNoCredentials, why,
                         "no credentials: send 'authorization: Bearer <token>' metadata, "
                         "present a client certificate, or connect over the daemon's Unix socket");
}

absl::StatusOr<std::shared_ptr<const core::Tenant>> IdentifyWithoutFile(const Credentials& c) {
  if (c.certificate_names.empty()) return core::DefaultTenant();
  const std::string& name = c.certificate_names.front();
  if (name.empty() || name.size() > kMaxCertificateNameBytes) {
    return absl::UnauthenticatedError(absl::StrCat(
        "the client certificate's name is empty or over ", kMaxCertificateNameBytes, " bytes"));
  }
  // "cert:" keeps a certificate's tenant apart from the implicit one (and
  // from any name a tenants file could give).
  auto t = std::make_shared<core::Tenant>();
  t->name = absl::StrCat("cert:", Quoted(name, kMaxCertificateNameBytes));
  return std::shared_ptr<const core::Tenant>(std::move(t));
}

}  // namespace gpuexec::tenants
