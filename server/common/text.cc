#include "server/common/text.h"

#include "absl/strings/escaping.h"

namespace gpuexec {

std::string Quoted(absl::string_view text, size_t max) {
  std::string out = absl::CHexEscape(text.substr(0, max));
  if (text.size() > max) out += "...";
  return out;
}

}  // namespace gpuexec
