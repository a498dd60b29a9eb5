#ifndef GPUEXEC_SERVER_COMMON_TEXT_H_
#define GPUEXEC_SERVER_COMMON_TEXT_H_

// Client input as messages and log lines quote it: never more than a short
// prefix, and nothing that could end a line or forge one.

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace gpuexec {

// `text` escaped (C-style: \n, \x01, \", \\; bytes outside printable ASCII
// as \xNN) and cut to at most `max` bytes of the original, with "..." when
// cut.
std::string Quoted(absl::string_view text, size_t max = 64);

}  // namespace gpuexec

#endif  // GPUEXEC_SERVER_COMMON_TEXT_H_
