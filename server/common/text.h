#ifndef GPUEXEC_SERVER_COMMON_TEXT_H_
#define GPUEXEC_SERVER_COMMON_TEXT_H_

// Client input as messages and log lines quote it: never more than a short
// prefix, and nothing that could end a line or forge one.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace gpuexec {

// `text` escaped (C-style: \n, \x01, \", \\; bytes outside printable ASCII
// as \xNN) and cut to at most `max` bytes of the original, with "..." when
// cut.
std::string Quoted(absl::string_view text, size_t max = 64);

// A byte count as a person reads it, then exactly: "100 GiB (107374182400
// bytes)", "1.5 KiB (1536 bytes)", "1.33 MiB (1398101 bytes)" (KiB to TiB,
// at most two decimals); under 1 KiB just "512 bytes" ("1 byte").
std::string ByteSize(uint64_t bytes);

// The name among `names` nearest to `name` by edit distance (insertions,
// deletions, substitutions and swaps of two neighbours each cost 1), if it
// is near enough to be a typo: at most a third of the longer name's length
// (at least 1) and less than the name's length. Empty when none is. Only the
// first 256 names, and names of at most 128 bytes, are compared.
std::string NearestName(absl::string_view name, const std::vector<std::string>& names);

}  // namespace gpuexec

#endif  // GPUEXEC_SERVER_COMMON_TEXT_H_
