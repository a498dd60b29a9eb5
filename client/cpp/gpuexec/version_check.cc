#include "gpuexec/version_check.h"

#include <cstdint>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "internal/connect_diagnosis.h"

namespace gpuexec {
namespace {

// Abseil here is not built on std::string_view.
absl::string_view View(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// MAJOR and MINOR of "MAJOR.MINOR" followed by nothing, or by '.', '-' or
// '+' and anything ("0.1.0", "0.2", "1.0.0-rc1"); nullopt otherwise.
std::optional<std::pair<uint32_t, uint32_t>> MajorMinor(std::string_view version) {
  const auto number = [&version](uint32_t* out) {
    size_t n = 0;
    while (n < version.size() && n < 9 && absl::ascii_isdigit(version[n])) ++n;
    if (n == 0 || !absl::SimpleAtoi(View(version.substr(0, n)), out)) return false;
    version.remove_prefix(n);
    return true;
  };
  uint32_t major = 0;
  uint32_t minor = 0;
  if (!number(&major) || version.empty() || version.front() != '.') return std::nullopt;
  version.remove_prefix(1);
  if (!number(&minor)) return std::nullopt;
  if (!version.empty() && version.front() != '.' && version.front() != '-' &&
      version.front() != '+') {
    return std::nullopt;
  }
  return std::make_pair(major, minor);
}

}  // namespace

std::string VersionWarning(std::string_view target, std::string_view daemon_version,
                           std::string_view client_version) {
  if (daemon_version.empty()) return "";
  const auto daemon = MajorMinor(daemon_version);
  const auto client = MajorMinor(client_version);
  if (daemon.has_value() && daemon == client) return "";
  const std::string who =
      target.empty() ? "the daemon"
                     : absl::StrCat("the daemon at ", internal::Printable(View(target), 256));
  const std::string runs =
      daemon.has_value()
          ? absl::StrCat("runs gpuexecd ", internal::Printable(View(daemon_version), 64))
          : absl::StrCat("reports version \"", internal::Printable(View(daemon_version), 32),
                         "\" (not MAJOR.MINOR.PATCH)");
  const std::string advice = daemon.has_value()
                                 ? absl::StrCat("use a client of release ", daemon->first, ".",
                                                daemon->second, ", or a daemon of this client's")
                                 : std::string("use a client of the daemon's release");
  return absl::StrCat(who, " ", runs, ", this client is ", View(client_version),
                      ": a call or field that one of them added since the other's release may "
                      "be refused or ignored; ",
                      advice);
}

}  // namespace gpuexec
