// The tenants file parser and the question it answers
// (server/tenants/tenants.h): Directory::Parse on any text, then Identify
// with credentials drawn from what the file lists.
//
// Input: the text of a tenants file. Lines "# token: <token>" (comments to
// the parser) give bearer tokens to present. Checked:
//   * Parse never crashes; a refusal names the file;
//   * a parsed directory holds the file's tenants, in order;
//   * Identify never crashes; each uid, gid, certificate name and token
//     (whose digest is listed) of a tenant names that tenant, alone or with
//     another credential of the same tenant; credentials of two tenants are
//     refused as conflicting; a refusal is UNAUTHENTICATED with its reason
//     set, and says nothing of the tenants or the token;
//   * IdentifyWithoutFile on a certificate name never crashes and gives a
//     bounded tenant name.

#include <google/protobuf/stubs/common.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "gpuexec/config/v1/tenants.pb.h"
#include "gpuexec/sha256.h"
#include "server/tenants/tenants.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

namespace t = gpuexec::tenants;

constexpr absl::string_view kFile = "tenants.textproto";
constexpr t::Refusal kUnset = static_cast<t::Refusal>(-1);

struct Fixture {
  const t::Directory* dir;
  const gpuexec::config::v1::TenantsConfig* config;
  std::vector<std::string> tokens;
};

// 14 or more of the characters of a tenant's name ([A-Za-z0-9._-]).
bool NameLike(absl::string_view s) {
  return s.size() >= 14 && std::all_of(s.begin(), s.end(), [](char c) {
           return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' ||
                  c == '-';
         });
}

// Identify's answer: the index of the tenant, or -1 with `why`.
int Ask(const Fixture& f, const t::Credentials& c, t::Refusal* why) {
  *why = kUnset;
  auto got = f.dir->Identify(c, why);
  if (!got.ok()) {
    FUZZ_CHECK(got.status().code() == absl::StatusCode::kUnauthenticated);
    FUZZ_CHECK(*why != kUnset);
    FUZZ_CHECK(absl::string_view(t::RefusalLabel(*why)) != "unknown");
    const absl::string_view message = got.status().message();
    FUZZ_CHECK(message.size() < 256);
    // No run of 14 name characters is a word of the messages: a tenant's
    // name (or a token) of that length found in one came from the file.
    for (const auto& tenant : f.config->tenant()) {
      if (NameLike(tenant.name())) FUZZ_CHECK(!absl::StrContains(message, tenant.name()));
    }
    if (c.authorization.has_value()) {
      const std::string token = t::BearerToken(*c.authorization);
      if (NameLike(token)) FUZZ_CHECK(!absl::StrContains(message, token));
    }
    return -1;
  }
  FUZZ_CHECK(*got != nullptr);
  FUZZ_CHECK(f.dir->Find((*got)->name) == *got);
  for (int i = 0; i < f.config->tenant_size(); ++i) {
    if (f.config->tenant(i).name() == (*got)->name) return i;
  }
  FUZZ_CHECK(false);
  return -1;
}

t::Credentials Peer(uint32_t uid, uint32_t gid) {
  t::Credentials c;
  c.unix_peer = t::PeerCredentials{uid, gid, 1};
  return c;
}

void Probe(const Fixture& f) {
  const auto& config = *f.config;
  std::set<uint32_t> uids, gids;
  for (const auto& tenant : config.tenant()) {
    uids.insert(tenant.uid().begin(), tenant.uid().end());
    gids.insert(tenant.gid().begin(), tenant.gid().end());
  }
  uint32_t free_uid = 0, free_gid = 0;
  while (uids.count(free_uid) != 0) ++free_uid;
  while (gids.count(free_gid) != 0) ++free_gid;
  t::Refusal why;

  FUZZ_CHECK(Ask(f, t::Credentials(), &why) == -1 && why == t::Refusal::kNoCredentials);
  FUZZ_CHECK(Ask(f, Peer(free_uid, free_gid), &why) == -1 && why == t::Refusal::kUnknownPeer);

  // One credential of tenant i, as any call could present it.
  std::vector<std::vector<t::Credentials>> of(config.tenant_size());
  for (int i = 0; i < config.tenant_size(); ++i) {
    const auto& tenant = config.tenant(i);
    for (uint32_t uid : tenant.uid()) of[i].push_back(Peer(uid, free_gid));
    for (uint32_t gid : tenant.gid()) of[i].push_back(Peer(free_uid, gid));
    for (const std::string& name : tenant.certificate_name()) {
      t::Credentials c;
      c.certificate_names = {name};
      of[i].push_back(c);
    }
  }
  for (const std::string& token : f.tokens) {
    const std::string digest = gpuexec::Sha256Hex(token);
    int owner = -1;
    for (int i = 0; i < config.tenant_size(); ++i) {
      for (const std::string& d : config.tenant(i).token_sha256()) {
        if (d == digest) owner = i;
      }
    }
    if (token.empty()) continue;
    t::Credentials c;
    c.authorization = "Bearer " + token;
    if (owner >= 0) {
      of[owner].push_back(c);
    } else {
      FUZZ_CHECK(Ask(f, c, &why) == -1);
      FUZZ_CHECK(why == t::Refusal::kUnknownToken || why == t::Refusal::kMalformedAuthorization);
    }
  }
  for (int i = 0; i < config.tenant_size(); ++i) {
    for (const t::Credentials& c : of[i]) {
      const int got = Ask(f, c, &why);
      FUZZ_CHECK(got == i);
    }
  }

  // Two credentials of different kinds (a peer, a token, a certificate), of
  // the same tenant or of two; the first few of each tenant.
  auto kind = [](const t::Credentials& c) {
    return c.unix_peer.has_value() ? 0 : c.authorization.has_value() ? 1 : 2;
  };
  auto both = [](const t::Credentials& a, const t::Credentials& b) {
    t::Credentials c = a;
    if (b.authorization.has_value()) c.authorization = b.authorization;
    if (!b.certificate_names.empty()) c.certificate_names = b.certificate_names;
    if (b.unix_peer.has_value()) c.unix_peer = b.unix_peer;
    return c;
  };
  constexpr size_t kFew = 6;
  const size_t tenants = std::min<size_t>(of.size(), kFew);
  for (size_t i = 0; i < tenants; ++i) {
    for (size_t j = 0; j < tenants; ++j) {
      for (size_t x = 0; x < std::min(of[i].size(), kFew); ++x) {
        for (size_t y = 0; y < std::min(of[j].size(), kFew); ++y) {
          const t::Credentials& a = of[i][x];
          const t::Credentials& b = of[j][y];
          if (kind(a) == kind(b)) continue;  // one would replace the other
          const int got = Ask(f, both(a, b), &why);
          if (i == j) {
            FUZZ_CHECK(got == static_cast<int>(i));
          } else {
            FUZZ_CHECK(got == -1 && why == t::Refusal::kConflictingCredentials);
          }
        }
      }
    }
  }

  // Malformed authorization values.
  for (const char* value : {"", "Bearer", "Bearer ", "Bearer \t ", "Basic abc", "bearer\tx"}) {
    t::Credentials c;
    c.authorization = value;
    FUZZ_CHECK(Ask(f, c, &why) == -1 && why == t::Refusal::kMalformedAuthorization);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);

  std::vector<std::string> tokens;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripLeadingAsciiWhitespace(line);
    if (absl::ConsumePrefix(&line, "# token:")) {
      tokens.emplace_back(absl::StripAsciiWhitespace(line));
    }
  }
  // Certificate names as a call without a tenants file would present them.
  for (const std::string& name : tokens) {
    t::Credentials c;
    c.certificate_names = {name};
    auto got = t::IdentifyWithoutFile(c);
    if (got.ok()) {
      FUZZ_CHECK(absl::StartsWith((*got)->name, "cert:") || (*got)->name == "default");
      FUZZ_CHECK((*got)->name.size() <= 5 + 4 * 256 + 3);
    } else {
      FUZZ_CHECK(got.status().code() == absl::StatusCode::kUnauthenticated);
    }
  }

  auto dir = t::Directory::Parse(text, kFile);
  if (!dir.ok()) {
    FUZZ_CHECK(dir.status().code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(absl::StartsWith(dir.status().message(), absl::StrCat(kFile, ":")));
    return 0;
  }
  FUZZ_CHECK(*dir != nullptr);
  gpuexec::config::v1::TenantsConfig config;
  FUZZ_CHECK(google::protobuf::TextFormat::ParseFromString(std::string(text), &config));
  FUZZ_CHECK((*dir)->size() == static_cast<size_t>(config.tenant_size()));
  const std::vector<std::string> names = (*dir)->names();
  for (int i = 0; i < config.tenant_size(); ++i) {
    FUZZ_CHECK(names[i] == config.tenant(i).name());
    const auto tenant = (*dir)->Find(names[i]);
    FUZZ_CHECK(tenant != nullptr);
    FUZZ_CHECK(tenant->limits.memory_bytes == config.tenant(i).memory_limit_bytes());
    FUZZ_CHECK(tenant->limits.max_sessions == config.tenant(i).max_sessions());
    FUZZ_CHECK(tenant->limits.devices.size() ==
               static_cast<size_t>(config.tenant(i).devices_size()));
  }
  Probe(Fixture{dir->get(), &config, tokens});
  return 0;
}
