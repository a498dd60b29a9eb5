#ifndef GPUEXEC_SERVER_COMMON_ENVIRONMENT_H_
#define GPUEXEC_SERVER_COMMON_ENVIRONMENT_H_

// The environment of a process the daemon starts (a device worker, the MPS
// control daemon): the daemon's own, with settings of the child's in place
// of any the daemon has.

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace gpuexec {

// `inherited` (NAME=value entries, null-ended) less the names `own` sets
// and the names that start with `drop_prefix` (when not empty), then `own`.
inline std::vector<std::string> ChildEnvironment(char* const* inherited,
                                                 const std::vector<std::string>& own,
                                                 absl::string_view drop_prefix = "") {
  auto name = [](absl::string_view entry) { return entry.substr(0, entry.find('=') + 1); };
  std::vector<std::string> env;
  for (char* const* e = inherited; e != nullptr && *e != nullptr; ++e) {
    const absl::string_view entry(*e);
    if (!drop_prefix.empty() && entry.substr(0, drop_prefix.size()) == drop_prefix) continue;
    if (std::any_of(own.begin(), own.end(),
                    [&](const std::string& o) { return name(o) == name(entry); })) {
      continue;
    }
    env.emplace_back(entry);
  }
  env.insert(env.end(), own.begin(), own.end());
  return env;
}

}  // namespace gpuexec

#endif  // GPUEXEC_SERVER_COMMON_ENVIRONMENT_H_
