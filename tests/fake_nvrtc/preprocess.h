#ifndef GPUEXEC_TESTS_FAKE_NVRTC_PREPROCESS_H_
#define GPUEXEC_TESTS_FAKE_NVRTC_PREPROCESS_H_

// The NVRTC double's preprocessor and tokenizer (see source_scan.h for
// what is modelled). Internal to tests/fake_nvrtc.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tests/fake_nvrtc/source_scan.h"

namespace gxnvrtc {

constexpr size_t kMaxEchoBytes = 256;  // of a source line in the log
constexpr size_t kMaxNameBytes = 128;  // of a name in the log

inline bool IsIdentStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
inline bool IsIdentChar(char c) { return IsIdentStart(c) || (c >= '0' && c <= '9'); }
inline bool IsBlank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; }

// One line of the flattened text and where it came from.
struct LineInfo {
  size_t start = 0;  // in Expanded::text
  int file = 0;      // 0: the program; i: headers[i - 1]
  int line = 0;
  const char* original = nullptr;  // the line as written, for the log
  size_t original_size = 0;
};

struct Expanded {
  std::string text;
  std::vector<LineInfo> lines;
};

// Tokens: identifiers and numbers, string and character literals, "::",
// and single punctuation characters.
struct Token {
  uint32_t pos = 0;
  uint32_t len = 0;
};

// The tokens of `text`, in order.
std::vector<Token> Tokenize(std::string_view text);

// Flattens the program's active lines (includes followed, conditionals
// applied, comments removed) into `out`. `file_names` gets the names the
// log uses: [0] the program, [i] header i - 1. Stops at a catastrophic
// error.
void Preprocess(const ScanInput& in, Diagnostics* diag, Expanded* out,
                std::vector<std::string>* file_names);

}  // namespace gxnvrtc

#endif  // GPUEXEC_TESTS_FAKE_NVRTC_PREPROCESS_H_
